"""What a data file holds and where it lives: the columns, the statuses, a row's key, the GPU's folder.

Layout: ``data/<gpu-slug>/<study>.csv`` (one row per measured configuration) with ``data/<gpu-slug>/<study>.json``
(the metadata sidecar) beside it; :func:`data_path` builds it from the GPU's name (:func:`gpu_slug`). Every study
records :data:`COLUMNS` (schema version :data:`SCHEMA_VERSION`); :func:`config_key` identifies a configuration
(sweeps resume by it); :func:`error_text` and :func:`utc_now` write the ``error`` and ``timestamp_utc`` cells.
Files are written by :mod:`perfutils.data.store` and read by :mod:`perfutils.data.records`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from kernels.device_names import gpu_slug

__all__ = [
    "SCHEMA_VERSION",
    "CONFIG_COLUMNS",
    "MEASURED_COLUMNS",
    "ID_COLUMNS",
    "COLUMNS",
    "STATUSES",
    "NON_EMPTY",
    "DataFileError",
    "IncompatibleDataError",
    "error_text",
    "utc_now",
    "config_key",
    "gpu_slug",
    "data_path",
    "ISSUE_COMMIT",
    "DTYPES",
    "DTYPE_BYTES",
    "torch_dtype",
]

# Fast-LLM at the parent of its fix 46ffbdd1, the kernel of issue #497: its rows' variant is fast_llm_27f4747e.
ISSUE_COMMIT = "27f4747e"

# Bump when a required column is added, removed or changes meaning.
SCHEMA_VERSION = 1

# The configuration that identifies a measurement (also the parts of config_key, in this order).
CONFIG_COLUMNS = ("loss", "target_format", "variant", "dtype", "tokens", "vocab", "block_size", "num_warps")

# GUIDE.md "Data": the columns every study records, in this order.
MEASURED_COLUMNS = CONFIG_COLUMNS + (
    "ms_median",
    "ms_p20",
    "ms_p80",
    "bytes_min",
    "gbps",
    "pct_of_copy",
    "n_regs",
    "spill_bytes",
    "shared_bytes",
    "occupancy",
    "blocks_per_sm",
    "limiter",
    "max_rel_err",
    "status",
    "error",
)

# Where and when a row was measured, and its resume key.
ID_COLUMNS = ("study", "gpu_name", "timestamp_utc", "config_key")

# Required columns of schema version 1; any other column is an optional extra (e.g. compile_ms).
COLUMNS = MEASURED_COLUMNS + ID_COLUMNS

# ok: correct within tolerance; wrong: ran but error above tolerance; error: raised (compile error,
# out of resources, OOM...). All three are final outcomes of a configuration.
STATUSES = ("ok", "wrong", "error")

# Columns that must be non-empty in every row.
NON_EMPTY = ("loss", "target_format", "variant", "dtype", "tokens", "vocab", "status") + ID_COLUMNS


class DataFileError(ValueError):
    """A data file (CSV or JSON sidecar) is missing pieces, truncated or otherwise unreadable."""


class IncompatibleDataError(ValueError):
    """Rows would be mixed with data from another GPU or another schema."""


def error_text(exc: BaseException, limit: int = 2000) -> str:
    """``Type: message`` on one line for an ``error`` column (multi-line compiler output joined with " | ").

    Over ``limit`` characters it keeps the head and the tail: a compiler's message starts with where
    the error is and ends with what it is, and the cause must survive the cut.
    """
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = f"{type(exc).__name__}: {' | '.join(lines)}" if lines else type(exc).__name__
    if len(text) <= limit:
        return text
    head = max(limit // 3, 1)
    return text[:head] + " ... " + text[len(text) - (limit - head - 5):]


def utc_now() -> str:
    """The current UTC time as ISO 8601 with a ``Z`` suffix, to the second."""
    return datetime.now(timezone.utc).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def config_key(config: Mapping[str, Any]) -> str:
    """A stable, human-readable key for one configuration, e.g. ``loss=cross_entropy;...;num_warps=8``.

    Built from :data:`CONFIG_COLUMNS` in that order (``None`` is written ``auto``: the kernel picks);
    any further keys of ``config`` that are not columns are ignored. Used to resume sweeps.
    """
    if not isinstance(config, Mapping):
        raise TypeError(f"config_key: config must be a mapping of {CONFIG_COLUMNS}, got {type(config).__name__}")
    missing = [name for name in CONFIG_COLUMNS if name not in config]
    if missing:
        raise ValueError(f"config_key: config lacks {missing}; expected all of {list(CONFIG_COLUMNS)}")
    parts = []
    for name in CONFIG_COLUMNS:
        value = config[name]
        text = "auto" if value is None else str(value)
        if any(ch in text for ch in ";=\n"):
            raise ValueError(f"config_key: value of {name!r} must not contain ';', '=' or newlines, got {text!r}")
        parts.append(f"{name}={text}")
    return ";".join(parts)


def data_path(data_dir: str | os.PathLike, gpu_name: str | None, study: str) -> Path:
    """``<data_dir>/<gpu-slug>/<study>.csv``."""
    if not isinstance(study, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", study):
        raise ValueError(f"data_path: study must be a non-empty name of letters, digits, '_', '.', '-', got {study!r}")
    return Path(data_dir) / gpu_slug(gpu_name) / f"{study}.csv"


DTYPES = ("bf16", "fp16", "fp32")  # the ``dtype`` column's names
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


def torch_dtype(name: str) -> Any:
    """The torch dtype of a canonical dtype name (``bf16``, ``fp16``, ``fp32``)."""
    import torch

    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; expected one of {list(DTYPES)}")
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]
