"""A kernel's spill traffic, counted: the bytes a thread stores to and loads from local memory, read from the exact
kernel's offline sm_90 compile, for the spilling kernels a GPU folder compiled offline (``FILES``).

Without a count, :mod:`perfutils.model.predict` estimates the traffic as the stack times a fitted number of passes a
step, which the #497 family's counts put 1.1 to 1.9 passes each way (stores and loads of 2.2 to 3.9 times the stack),
and which overcounts a kernel whose spills sit outside its loop. The count is ptxas's spill stores and loads; where the
compile also split them by where they sit in the SASS (``spill_once_bytes`` outside every loop, ``spill_loop_bytes``
inside the loops, a trip's: :func:`perfutils.model.cubin.local_memory_bytes`), a kernel whose loops walk the row's
tiles moves ``once + per trip x tiles`` (:func:`perfutils.model.predict.with_spill_counts`); without the split only a
kernel whose tile is its row takes the count, since then no spill repeats (Nsight Compute measured 12.5 GB of local
traffic for the #497 kernel, the count says 12.8 GB: ``case_497_ncu.csv``).

A key is what decides the compiled code as these files record it: loss, target format, dtype, vocabulary, tile, warps
and the stack ptxas gave (the same key never recorded two different counts). The counts hold for every sm_90 GPU: the
studies record them in the H100's folder (``SM90_FOLDER``), which every sm_90 folder reads beneath its own (a GPU
whose rows ran newer code keeps the compiles of that code: ``case-497 offline --gpu``).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd

FILES = ("registers_offline.csv", "case_497_registers_offline.csv", "fast_llm_registers_offline.csv")
SM90_FOLDER = "h100-sxm-80gb"  # where the offline sm_90 compiles are recorded (perfutils.studies.case_497.TARGET_GPU)


class SpillCount(NamedTuple):
    """A thread's spill bytes (stores + loads): ``once`` outside the loops and ``per_trip`` inside them where
    ``split`` (else ``once`` is the whole kernel's and ``per_trip`` 0)."""

    once: float
    per_trip: float
    split: bool


def resident_stack_bytes(stack_bytes, num_warps, blocks_per_sm, sm_count: int):
    """The per-thread stack of every thread resident on the GPU at once: stack x 32 x warps x blocks/SM x SMs
    (what the L2 would have to hold for the spills never to reach DRAM)."""
    if isinstance(sm_count, bool) or not isinstance(sm_count, (int, np.integer)) or sm_count <= 0:
        raise ValueError(f"sm_count must be a positive int, got {sm_count!r}")
    return stack_bytes * 32 * num_warps * blocks_per_sm * sm_count


def spill_key(loss: str, target_format: str, dtype: str, vocab: int, block_size: int, num_warps: int,
              spill_bytes: int) -> tuple:
    """The key of one compiled kernel's spills."""
    return (str(loss), str(target_format), str(dtype), int(vocab), int(block_size), int(num_warps), int(spill_bytes))


def load_spill_counts(folder) -> dict[tuple, SpillCount]:
    """``{key: SpillCount}`` of the offline compiles that spill: ``SM90_FOLDER``'s for an sm_90 folder, then the
    folder's own over them (empty without any)."""
    folder = Path(folder).resolve()
    folders = [folder]
    if _is_sm90(folder) and folder.name != SM90_FOLDER:
        folders.insert(0, folder.parent / SM90_FOLDER)
    counts: dict = {}
    for each in folders:
        stamps = tuple((each / name).stat().st_mtime_ns if (each / name).is_file() else 0 for name in FILES)
        counts.update(_load(str(each), stamps))
    return counts


def offline_file(folder, name: str) -> Path:
    """An offline compiles file (one of ``FILES``) for ``folder``'s kernels: the folder's own, or for an sm_90 GPU
    without it, ``SM90_FOLDER``'s beside it."""
    folder = Path(folder).resolve()
    if not (folder / name).is_file() and _is_sm90(folder):
        return folder.parent / SM90_FOLDER / name
    return folder / name


@lru_cache(maxsize=8)
def _load(folder: str, stamps: tuple) -> tuple:  # stamps: the files' mtimes, so that a rewritten file is read again
    counts = {}
    for name in FILES:
        path = Path(folder) / name
        if not path.is_file():
            continue
        frame = pd.read_csv(path, low_memory=False)
        if "status" in frame.columns:
            frame = frame[frame["status"].fillna("ok") == "ok"]
        needed = ["spill_bytes", "spill_store_bytes", "spill_load_bytes", "block_size"]
        if any(c not in frame.columns for c in needed):
            continue
        frame = frame.dropna(subset=needed)
        frame = frame[frame["spill_bytes"] > 0]
        has_split = {"spill_once_bytes", "spill_loop_bytes"} <= set(frame.columns)
        for r in frame.to_dict("records"):
            key = spill_key(r["loss"], r["target_format"], r["dtype"], r["vocab"], r["block_size"], r["num_warps"],
                            r["spill_bytes"])
            if has_split and pd.notna(r["spill_once_bytes"]) and pd.notna(r["spill_loop_bytes"]):
                counts[key] = SpillCount(float(r["spill_once_bytes"]), float(r["spill_loop_bytes"]), True)
            else:
                counts[key] = SpillCount(float(r["spill_store_bytes"]) + float(r["spill_load_bytes"]), 0.0, False)
    return tuple(counts.items())


def _is_sm90(folder: Path) -> bool:
    """Whether the folder's sidecars name compute capability 9.0."""
    for sidecar in sorted(folder.glob("*.json")):
        try:
            capability = json.loads(sidecar.read_text()).get("compute_capability")
        except (json.JSONDecodeError, AttributeError, OSError):
            continue
        if capability:
            return list(capability)[:2] == [9, 0]
    return False
