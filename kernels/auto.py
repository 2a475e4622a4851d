"""Variant "auto": the fastest measured variant and configuration for a shape, from a committed tuning table.

The table (``data/<gpu-slug>/tuning.csv``, written by ``perfutils`` from H100 sweeps) holds, per
(loss, target_format, dtype, vocab), the best (variant, block_size, num_warps). A shape that is not
in the table takes the entry of the nearest recorded vocab of the same loss when the GPU matches,
otherwise a heuristic: split_row with chunks of up to 8K columns and 8 warps.
"""

from __future__ import annotations

import csv
import functools
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .problem import Problem

DATA_DIR = Path(__file__).resolve().parent.parent / "data"


@dataclass
class Choice:
    variant: str
    block_size: int | None
    num_warps: int | None
    options: dict = field(default_factory=dict)
    source: str = "heuristic"


def _dtype_name(dtype: torch.dtype) -> str:
    return {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}[dtype]


@functools.lru_cache(maxsize=None)
def load_tuning_table(gpu_name: str) -> tuple[dict, ...]:
    """Rows of the tuning table recorded on this GPU (empty if none is committed)."""
    from perfutils.records import gpu_slug

    path = DATA_DIR / gpu_slug(gpu_name) / "tuning.csv"
    if not path.exists():
        return ()
    with open(path, newline="") as handle:
        return tuple(csv.DictReader(handle))


def choose_config(problem: Problem, *, block_size=None, num_warps=None, **options) -> Choice:
    device = problem.logits.device
    if device.type == "cuda" and block_size is None and num_warps is None and not options:
        rows = [
            row
            for row in load_tuning_table(torch.cuda.get_device_name(device))
            if row["loss"] == problem.loss
            and row["target_format"] == problem.target_format
            and row["dtype"] == _dtype_name(problem.logits.dtype)
        ]
        if rows:
            best = min(rows, key=lambda row: abs(math.log2(int(row["vocab"])) - math.log2(problem.n_cols)))
            block = int(best["block_size"])
            # A tuned chunk wider than this row would only add masked lanes.
            block = min(block, max(16, 1 << math.ceil(math.log2(problem.n_cols))))
            return Choice(best["variant"], block, int(best["num_warps"]), {}, source="tuning table")
    return Choice("split_row", block_size, num_warps, options)
