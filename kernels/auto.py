"""Variant "auto", and split_row's default configuration: the committed tuning table, and auto's first-call search.

The table (``data/<gpu-slug>/tuning.csv``, written by ``perfutils.measure.tuning`` from H100 sweeps) holds, per
(loss, target_format, dtype, vocab) and project variant, that variant's best (block_size, num_warps, options).
``split_row`` called without a configuration runs its own entry (the nearest recorded vocab of the same loss).
``auto`` on a GPU runs the first-call search of :mod:`kernels.autotune`, seeded with the table's fastest entry;
where the search cannot run (CUDA-graph capture, ``FUSED_LOSS_AUTOTUNE=0``) it takes that entry, and without a
table a heuristic (split_row with its default chunks).
"""

from __future__ import annotations

import csv
import functools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .device_names import gpu_slug
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
def load_tuning_table(gpu_name: str, data_dir: Path = DATA_DIR) -> tuple[dict, ...]:
    """Rows of the tuning table recorded on this GPU under ``data_dir`` (empty if there is none)."""
    path = Path(data_dir) / gpu_slug(gpu_name) / "tuning.csv"
    if not path.exists():
        return ()
    with open(path, newline="") as handle:
        return tuple(csv.DictReader(handle))


def table_choice(rows, loss: str, target_format: str, dtype: str, n_cols: int, variant: str | None = None) -> Choice | None:
    """The table's entry for this shape (the nearest recorded vocab), fastest variant or ``variant``'s own."""
    rows = [
        row for row in rows
        if row["loss"] == loss and row["target_format"] == target_format and row["dtype"] == dtype
        and (variant is None or row["variant"] == variant)
    ]
    if not rows:
        return None
    nearest = min({int(row["vocab"]) for row in rows}, key=lambda vocab: abs(math.log2(vocab) - math.log2(n_cols)))
    best = min((row for row in rows if int(row["vocab"]) == nearest), key=lambda row: float(row["ms_median"]))
    # A tuned chunk wider than this row would only add masked lanes.
    block = min(int(best["block_size"]), max(16, 1 << math.ceil(math.log2(n_cols))))
    options = json.loads(best.get("options") or "{}")
    return Choice(best["variant"], block, int(best["num_warps"]), options, source="tuning table")


def table_entry(problem: Problem, variant: str | None = None) -> Choice | None:
    """The committed table's entry for a problem on its CUDA device (:func:`table_choice`): the fastest variant's, or
    ``variant``'s own; the first-call search's seed."""
    return table_choice(load_tuning_table(torch.cuda.get_device_name(problem.logits.device)), problem.loss,
                        problem.target_format, _dtype_name(problem.logits.dtype), problem.n_cols, variant)


def choose_config(problem: Problem, planners: dict, *, variant: str = "auto", block_size=None, num_warps=None,
                  **options) -> Choice:
    """What ``variant`` runs for this problem when the caller gave no configuration (block size, warps or options):
    for ``auto`` on a GPU the first-call search of :mod:`kernels.autotune` (seeded with the tuning table's entry),
    for ``split_row`` its own table entry; otherwise the caller's settings (auto: split_row's)."""
    device = problem.logits.device
    if device.type == "cuda" and block_size is None and num_warps is None and not options:
        choice = table_entry(problem, None if variant == "auto" else variant)
        if variant == "auto":
            from . import autotune

            searched = autotune.choose(problem, choice, planners)
            if searched is not None:
                found_variant, found_block, found_warps, found_options, source = searched
                return Choice(found_variant, found_block, found_warps, dict(found_options), source=source)
        if choice is not None:
            return choice
    return Choice("split_row" if variant == "auto" else variant, block_size, num_warps, options)
