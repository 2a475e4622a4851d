"""A split-row plan's step, counted: what one thread issues each step of the lagged kernel, read from the exact
kernel's offline sm_90 SASS, for every lagged split-row configuration a GPU folder recorded.

:mod:`perfutils.model.predict` estimates a step from a constant number of instructions per element, which holds no
per-step part: the row's summaries, its scalars, publishing and the poll cost 340-370 instructions a step whatever the
chunk (data/h200/logs/ncu_kept_2026-11-28.txt), so the estimate is high for wide chunks and low for narrow ones, and
its fitted constant had absorbed a wait the model does not hold. With this file the model takes each recorded plan's
own count instead (``KernelPass.instructions_per_step``) and holds that wait as a term of its own
(``ModelConstants.exchange_round_trip_ns``).

    python -m perfutils step-counts data/h100-sxm-80gb   # no GPU: writes data/h100-sxm-80gb/split_row_steps.csv

This module reads the file (the keys, the counts); :mod:`perfutils.model.offline_counts` compiles and writes it.
Beside it, ``exchange_steps.csv`` counts the step of the vocab-parallel symmetric design's kernel
(``kernels.vocab_parallel_exchange.exchange_kernel``) for every two-GPU configuration the folder recorded
(:func:`exchange_key`, :func:`load_exchange_counts`): each rank runs it on its slice instead of the lagged kernel.

A key is what decides the kernel's code: the loss, the logits' dtype, the vocabulary (its chunks, and whether rows are
16-byte aligned), the chunk, the warps and the lagged kernel's options. The counts are the same for every GPU of
sm_90; each folder keeps the keys its own records need. A key's code also depends on the version of the kernels:
each row names the kernel sources it compiled (``kernel_sources``, :func:`load_counted_sources`), so that a page can
say which recorded rows ran the kernels their counts are of.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

STUDY = "split_row_steps"
KEY_COLUMNS = ("loss", "target_format", "dtype", "vocab", "block_size", "num_warps", "maxnreg", "prefetch",
               "read_ahead", "fast_math")
EXCHANGE_STUDY = "exchange_steps"
EXCHANGE_KEY_COLUMNS = ("loss", "target_format", "dtype", "vocab", "block_size", "num_warps", "tp", "lag")


def step_key(loss: str, target_format: str, dtype: str, vocab: int, block_size: int, num_warps: int,
             options: dict | None = None) -> tuple:
    """The key of one lagged split-row kernel (``options``: a plan's, of which maxnreg, prefetch, read_ahead and
    fast_math change the code; the others are ignored)."""
    options = options or {}
    maxnreg = options.get("maxnreg")
    maxnreg = 0 if maxnreg is None or (isinstance(maxnreg, float) and math.isnan(maxnreg)) else int(maxnreg)
    return (str(loss), str(target_format), str(dtype), int(vocab), int(block_size), int(num_warps), maxnreg,
            bool(options.get("prefetch", False)), int(options.get("read_ahead", 0) or 0),
            bool(options.get("fast_math", True)))


def exchange_key(loss: str, target_format: str, dtype: str, vocab: int, block_size: int, num_warps: int, tp: int,
                 lag: int) -> tuple:
    """The key of one rank's exchange kernel: ``vocab`` is the rank's slice (its columns), ``tp`` the ranks."""
    return (str(loss), str(target_format), str(dtype), int(vocab), int(block_size), int(num_warps), int(tp), int(lag))


def normal_exchange_key(key) -> tuple:
    """An exchange key read back from its counts file, as :func:`exchange_key` gives it."""
    return exchange_key(*key)


def exchange_key_of_row(row: dict) -> tuple | None:
    """The exchange key of a recorded two-GPU symmetric-design row (``tensor_parallel.csv``: its ``config``, the plan
    each rank ran on its slice of ``vocab / tp`` columns); None where the row did not record its plan."""
    import json

    from kernels.vocab_parallel_exchange import LAG_STEPS

    config = json.loads(row["config"]) if isinstance(row.get("config"), str) else {}
    if not (config.get("block_size") and config.get("num_warps")):
        return None
    tp = int(row.get("tp") or 2)
    return exchange_key(row["loss"], row["target_format"], row["dtype"], int(row["vocab"]) // tp,
                        config["block_size"], config["num_warps"], tp, config.get("lag", LAG_STEPS))


def counts_path(folder, study: str = STUDY) -> Path:
    """The folder's counts file (``study``: :data:`STUDY` or :data:`EXCHANGE_STUDY`)."""
    return Path(folder) / f"{study}.csv"


def normal_key(key) -> tuple:
    """A key read back from the counts file (numpy numbers, 0 for no register cap) as :func:`step_key` gives it."""
    return step_key(key[0], key[1], key[2], key[3], key[4], key[5],
                    {"maxnreg": key[6] or None, "prefetch": key[7] in (True, "True", 1), "read_ahead": key[8],
                     "fast_math": key[9] not in (False, "False", 0)})


def _counted(folder, column: str, study: str = STUDY) -> dict[tuple, object]:
    """``{key: column}`` over a counts file's compiled rows where ``column`` is recorded (empty without the file or
    the column)."""
    path = counts_path(folder, study)
    if not path.is_file():
        return {}
    frame = pd.read_csv(path)
    if column not in frame:
        return {}
    frame = frame[(frame["status"] == "ok") & frame[column].notna()]
    columns, normal = KEYS[study]
    return {normal(tuple(r[:-1])): r[-1] for r in frame[[*columns, column]].itertuples(index=False, name=None)}


# Each counts file's key columns and how a key read back from it is made whole again.
KEYS = {STUDY: (KEY_COLUMNS, normal_key), EXCHANGE_STUDY: (EXCHANGE_KEY_COLUMNS, normal_exchange_key)}


def load_counted_sources(folder) -> dict[tuple, str]:
    """``{key: the digest of the kernel sources its count compiled}`` (``kernel_sources``; keys counted before the
    column was recorded are left out)."""
    return {key: str(value) for key, value in _counted(folder, "kernel_sources").items()}


def load_exchange_sources(folder) -> dict[tuple, str]:
    """:func:`load_counted_sources` of the folder's exchange counts (``exchange_steps.csv``)."""
    return {key: str(value) for key, value in _counted(folder, "kernel_sources", EXCHANGE_STUDY).items()}


def load_step_counts(folder) -> dict[tuple, float]:
    """``{key: a thread's instructions a step}`` of the folder's counts file (empty without one)."""
    return {key: float(value) for key, value in _counted(folder, "step").items()}


def load_exchange_counts(folder) -> dict[tuple, float]:
    """``{exchange_key: a thread's instructions a step}`` of the folder's exchange counts (empty without them)."""
    return {key: float(value) for key, value in _counted(folder, "step", EXCHANGE_STUDY).items()}
