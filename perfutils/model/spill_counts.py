"""A one-step kernel's spill traffic, counted: the bytes a thread stores to and loads from local memory, read from the
exact kernel's offline sm_90 compile (ptxas's spill stores and loads), for the spilling kernels a GPU folder compiled
offline (``registers_offline.csv``, ``case_497_registers_offline.csv``).

Without a count, :mod:`perfutils.model.predict` estimates the traffic as the stack times a fitted number of passes,
which the #497 family's counts put 1.1 to 1.9 passes each way (stores and loads of 2.2 to 3.9 times the stack).
In a kernel whose tile is the whole row no spill instruction sits in a loop, so the static count is the traffic
exactly (Nsight Compute measured 12.5 GB of local traffic for the #497 kernel, the count says 12.8 GB:
``case_497_ncu.csv``); where the tile loops over the row the count does not say which spills repeat, so only
one-step passes take it (:func:`perfutils.model.predict.with_spill_counts`).

A key is what decides the compiled code as these files record it: loss, target format, dtype, vocabulary, tile, warps
and the stack ptxas gave (the same key never recorded two different counts). The counts hold for every sm_90 GPU, and
the studies record them once, in the H100's folder (``SM90_FOLDER``), which an sm_90 folder without its own reads.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import json

import pandas as pd

FILES = ("registers_offline.csv", "case_497_registers_offline.csv")
SM90_FOLDER = "h100-sxm-80gb"  # where the offline sm_90 compiles are recorded (perfutils.studies.case_497.TARGET_GPU)


def spill_key(loss: str, target_format: str, dtype: str, vocab: int, block_size: int, num_warps: int,
              spill_bytes: int) -> tuple:
    """The key of one compiled kernel's spills."""
    return (str(loss), str(target_format), str(dtype), int(vocab), int(block_size), int(num_warps), int(spill_bytes))


def load_spill_counts(folder) -> dict[tuple, float]:
    """``{key: a thread's spill stores + loads in bytes}`` of the folder's offline compiles that spill; a folder of an
    sm_90 GPU without its own takes ``SM90_FOLDER``'s beside it (empty without any)."""
    folder = offline_folder(folder)
    stamps = tuple((folder / name).stat().st_mtime_ns if (folder / name).is_file() else 0 for name in FILES)
    return dict(_load(str(folder), stamps))


def offline_folder(folder) -> Path:
    """The folder whose offline compiles count ``folder``'s kernels: its own, or for an sm_90 GPU without any,
    ``SM90_FOLDER`` beside it."""
    folder = Path(folder).resolve()
    if not any((folder / name).is_file() for name in FILES) and _is_sm90(folder):
        return folder.parent / SM90_FOLDER
    return folder


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
        for r in frame.itertuples(index=False):
            key = spill_key(r.loss, r.target_format, r.dtype, r.vocab, r.block_size, r.num_warps, r.spill_bytes)
            counts[key] = float(r.spill_store_bytes) + float(r.spill_load_bytes)
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
