"""Reading data files: strict parsing and validation, the frames every plot and notebook takes.

:func:`load_records` never returns an empty or partial frame for a broken file: it raises
:class:`~perfutils.data.schema.DataFileError` naming the file and the problem (or FileNotFoundError saying how
to produce it), and attaches the JSON sidecar as ``df.attrs["metadata"]``. :func:`check_single_gpu` keeps two
GPUs' numbers off one axis; :func:`load_study` is what a notebook replays. The strict CSV and JSON readers
(:func:`read_csv_table`, :func:`read_json`) are also what :mod:`perfutils.data.store` checks a file with
before it appends.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from .schema import (COLUMNS, ID_COLUMNS, NON_EMPTY, SCHEMA_VERSION, STATUSES, DataFileError, IncompatibleDataError,
                     data_path, gpu_slug)

__all__ = [
    "exploration_records",
    "exploration_days",
    "load_records",
    "load_metadata",
    "load_study",
    "check_single_gpu",
    "read_csv_table",
    "read_json",
    "sidecar_path",
    "sidecar_gpus",
    "csv_path",
]

# Column types the reader enforces (any other column is an optional extra, typed by its values).
_STRING_COLUMNS = ("loss", "target_format", "variant", "dtype", "limiter", "status", "error") + ID_COLUMNS
# Integers that are always present (int64) and ones that may be missing (nullable Int64).
_INT_COLUMNS = ("tokens", "vocab")
_NULLABLE_INT_COLUMNS = ("block_size", "num_warps", "bytes_min", "n_regs", "spill_bytes", "shared_bytes", "blocks_per_sm")
_FLOAT_COLUMNS = ("ms_median", "ms_p20", "ms_p80", "gbps", "pct_of_copy", "occupancy", "max_rel_err")

_HOW_TO_PRODUCE = (
    "measure it on a GPU with `python -m perfutils sweep --config notebooks/params/<study>.yaml`, "
    "which writes data/<gpu-slug>/<study>.csv and its .json sidecar"
)


def sidecar_path(csv_path: Path) -> Path:
    """The JSON sidecar of a data file: the same path with ``.json``."""
    return csv_path.with_suffix(".json")


def read_csv_table(path: Path) -> tuple[list[str], list[list[str]], bytes]:
    """Parse a CSV strictly into (header, rows of strings, raw bytes), or raise DataFileError."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise FileNotFoundError(f"data file {path} does not exist; {_HOW_TO_PRODUCE}") from None
    if not raw.strip():
        raise DataFileError(f"data file {path} is empty (0 rows, no header); it may have been truncated. {_HOW_TO_PRODUCE}")
    if not raw.endswith(b"\n"):
        raise DataFileError(f"data file {path} does not end with a newline: its last row is cut off (truncated file?)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataFileError(f"data file {path} is not UTF-8 text ({exc})") from None
    try:
        table = list(csv.reader(io.StringIO(text, newline=""), strict=True))
    except csv.Error as exc:
        raise DataFileError(f"data file {path} is not valid CSV: {exc}") from None
    header, rows = table[0], table[1:]
    if len(set(header)) != len(header) or any(not name for name in header):
        raise DataFileError(f"data file {path} has an empty or repeated column name in its header {header}")
    for number, row in enumerate(rows, start=2):
        if len(row) != len(header):
            raise DataFileError(
                f"data file {path}: row {number} has {len(row)} fields but the header has {len(header)} (corrupt or truncated row)"
            )
    return header, rows, raw


def read_json(path: Path) -> dict[str, Any]:
    """A sidecar's JSON object, or FileNotFoundError / DataFileError naming the file."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"metadata sidecar {path} does not exist; {_HOW_TO_PRODUCE}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataFileError(f"metadata sidecar {path} is not valid JSON ({exc}); truncated or hand-edited?") from None
    if not isinstance(data, dict):
        raise DataFileError(f"metadata sidecar {path} must hold a JSON object, found {type(data).__name__}")
    return data


def sidecar_gpus(meta: Mapping[str, Any]) -> set[str]:
    """Every GPU a sidecar names: the first session's and each later session's."""
    names = {meta.get("gpu_name")}
    names.update(session.get("gpu_name") for session in meta.get("sessions", []) if isinstance(session, Mapping))
    return {name for name in names if isinstance(name, str) and name}


def csv_path(path: str | os.PathLike) -> Path:
    """The ``.csv`` of a data file given as its CSV or its JSON sidecar."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    path = Path(path)
    if path.suffix == ".json":
        path = path.with_suffix(".csv")
    if path.suffix != ".csv":
        raise ValueError(f"expected a .csv data file (or its .json sidecar), got {str(path)!r}")
    return path


def load_metadata(path: str | os.PathLike) -> dict[str, Any]:
    """The JSON sidecar of a data file (pass the CSV or the JSON path)."""
    return read_json(sidecar_path(csv_path(path)))


def load_records(path: str | os.PathLike, *, require_metadata: bool = True) -> pd.DataFrame:
    """Read and validate a data file; the sidecar is attached as ``df.attrs["metadata"]``.

    Raises FileNotFoundError (saying how to produce the file) or :class:`DataFileError` (naming
    the file and the problem) — never returns an empty or partial frame for a broken file.
    """
    path = csv_path(path)
    header, rows, _ = read_csv_table(path)
    missing = [name for name in COLUMNS if name not in header]
    if missing:
        raise DataFileError(f"data file {path} lacks required columns {missing} (schema version {SCHEMA_VERSION})")
    if not rows:
        raise DataFileError(f"data file {path} has a header but no rows (truncated, or nothing was measured)")
    frame = pd.DataFrame(rows, columns=header, dtype=object)
    for name in NON_EMPTY:
        blank = frame.index[frame[name] == ""]
        if len(blank):
            raise DataFileError(f"data file {path}: column {name!r} is empty in row {int(blank[0]) + 2}")
    bad_status = frame.index[~frame["status"].isin(STATUSES)]
    if len(bad_status):
        row = int(bad_status[0])
        raise DataFileError(f"data file {path}: row {row + 2} has status {frame.at[row, 'status']!r}; expected one of {STATUSES}")
    for name in header:
        if name in _STRING_COLUMNS:
            frame[name] = frame[name].where(frame[name] != "", None)
            continue
        as_numbers = pd.to_numeric(frame[name].replace("", None), errors="coerce")
        unparsable = frame.index[as_numbers.isna() & (frame[name] != "")]
        if name in _INT_COLUMNS + _NULLABLE_INT_COLUMNS + _FLOAT_COLUMNS:
            if len(unparsable):
                row = int(unparsable[0])
                raise DataFileError(f"data file {path}: column {name!r} holds {frame.at[row, name]!r} in row {row + 2}, not a number")
            if name in _INT_COLUMNS or name in _NULLABLE_INT_COLUMNS:
                whole = as_numbers.dropna()
                if (whole != whole.round()).any():
                    raise DataFileError(f"data file {path}: column {name!r} holds non-integer values")
                frame[name] = as_numbers.astype("int64" if name in _INT_COLUMNS else "Int64")
            else:
                frame[name] = as_numbers.astype("float64")
        elif len(unparsable) == 0 and as_numbers.notna().any():
            frame[name] = as_numbers  # numeric extra column (compile_ms, peak_mem_bytes...)
        elif frame[name].isin(("True", "False", "")).all() and (frame[name] != "").any():
            frame[name] = frame[name].map({"True": True, "False": False, "": None}).astype("boolean")  # flags
        else:
            frame[name] = frame[name].where(frame[name] != "", None)  # text extra column (passes JSON...)
    ok_without_time = frame.index[(frame["status"] == "ok") & frame["ms_median"].isna()]
    if len(ok_without_time):
        raise DataFileError(f"data file {path}: row {int(ok_without_time[0]) + 2} has status 'ok' but no ms_median")
    metadata_path = sidecar_path(path)
    if metadata_path.exists() or require_metadata:
        frame.attrs["metadata"] = read_json(metadata_path)
    frame.attrs["path"] = str(path)
    return frame


def check_single_gpu(df: pd.DataFrame, *, allow_mixed: bool = False) -> str:
    """Return the one GPU a frame was measured on; raise if it mixes GPUs (unless ``allow_mixed``).

    Plots call this so that numbers from two GPUs never share an axis by accident. With
    ``allow_mixed=True`` the names are joined with " + ".
    """
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"check_single_gpu: df must be a pandas DataFrame, got {type(df).__name__}")
    if "gpu_name" not in df.columns:
        raise DataFileError("check_single_gpu: the frame has no 'gpu_name' column (not loaded with load_records?)")
    names = sorted(df["gpu_name"].dropna().astype(str).unique())
    if not names:
        raise DataFileError("check_single_gpu: the frame has no gpu_name values (empty frame?)")
    if len(names) > 1 and not allow_mixed:
        counts = df["gpu_name"].value_counts()
        listing = ", ".join(f"{name!r} ({counts[name]} rows)" for name in names)
        raise IncompatibleDataError(
            f"the data mixes GPUs: {listing}. Filter to one gpu_name, or pass allow_mixed=True to compare them on purpose"
        )
    return " + ".join(names)


def load_study(data_dir: str | os.PathLike, gpu: str, study: str, producer: str) -> pd.DataFrame:
    """Load ``<data_dir>/<slug of gpu>/<study>.csv``, or fail naming the file and ``producer``, the command that makes it."""
    path = data_path(data_dir, gpu, study)
    if not path.exists():
        raise FileNotFoundError(
            f"{path} does not exist, so there is nothing to replay. Produce it on the GPU with `{producer}` "
            f"(writes {gpu_slug(gpu)}/{study}.csv and .json under the --out directory), or run this notebook with "
            "MODE='measure' on a GPU."
        )
    return load_records(path)


def _log_text(log: str | os.PathLike) -> str:
    """An exploration log's text, or with ``LOG::HEADER`` the part under that ``## ...`` header line, up to the next."""
    path, _, section = str(log).partition("::")
    text = Path(path).read_text()
    if section:
        marker = f"\n{section}\n"
        if marker not in text:
            raise DataFileError(f"{path}: no header line {section!r}")
        text = text[text.index(marker) + 1:]
        text = text[:text.find("\n## ")] if "\n## " in text else text
    return text


def exploration_days(log: str | os.PathLike) -> str | None:
    """The days an exploration log (or ``LOG::HEADER``, its section) was run, from the UTC times its ``#`` lines
    stamp (``2026-11-29T01:22Z``): one day, "first to last", or None where it stamps none."""
    import re

    days = sorted(set(re.findall(r"^#.*?\b(20\d\d-\d\d-\d\d)T\d\d:\d\d", _log_text(log), re.MULTILINE)))
    return None if not days else days[0] if len(days) == 1 else f"{days[0]} to {days[-1]}"


def exploration_records(log: str | os.PathLike) -> list[dict[str, Any]]:
    """The JSON records of an exploration's timing log (``scripts/explore_lagged.py time-...``, kept under
    ``data/<gpu>/logs``): one dict per line that is a JSON object opening with ``{"lag":``, ``{"tree":`` or ``{"loss":``
    (runs Z and later print no lag). ``LOG::HEADER`` reads only the
    records under that ``## ...`` header line of a log that holds several passes, up to the next header. The log's own
    ``#`` header says what was measured, on which GPU, with which code."""
    import re

    text = _log_text(log)
    return [json.loads(found) for found in re.findall(r'^\{"(?:tree|lag|loss)": [^{}\n]*\}$', text, re.MULTILINE)]

