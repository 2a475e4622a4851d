"""Tidy measurement files: one CSV row per measured configuration plus a JSON metadata sidecar.

Layout: ``data/<gpu-slug>/<study>.csv`` with ``data/<gpu-slug>/<study>.json`` beside it.

Guarantees (the reasons this module exists rather than ``DataFrame.to_csv``):

* **Atomic appends.** Every append writes the whole new file to a temporary file in the same
  directory, fsyncs it and ``os.replace``-s it over the old one, so a kill at any moment leaves
  either the old file or the new one, never half a row.
* **Nothing measured is lost or rewritten.** Existing rows are copied byte for byte (values are
  never re-parsed and re-formatted); a configuration that already has a final measurement cannot
  be recorded again; ``overwrite=True`` moves the old files aside instead of deleting them.
* **No silent mixing.** Appending rows from another GPU, or to a file with another schema, is
  refused with a message naming both, unless ``allow_mixed=True``.
* **Loud loading.** ``load_records`` never returns an empty or partial frame for a broken file: it
  raises :class:`DataFileError` naming the file and the problem.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import numbers
import os
import re
import tempfile
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

__all__ = [
    "SCHEMA_VERSION",
    "MEASURED_COLUMNS",
    "ID_COLUMNS",
    "COLUMNS",
    "CONFIG_COLUMNS",
    "STATUSES",
    "DataFileError",
    "IncompatibleDataError",
    "ResultStore",
    "config_key",
    "gpu_slug",
    "data_path",
    "load_records",
    "load_metadata",
    "load_study",
    "check_single_gpu",
    "utc_now",
    "write_table",
]

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
_NON_EMPTY = ("loss", "target_format", "variant", "dtype", "tokens", "vocab", "status") + ID_COLUMNS
_STRING_COLUMNS = ("loss", "target_format", "variant", "dtype", "limiter", "status", "error") + ID_COLUMNS
# Integers that are always present (int64) and ones that may be missing (nullable Int64).
_INT_COLUMNS = ("tokens", "vocab")
_NULLABLE_INT_COLUMNS = ("block_size", "num_warps", "bytes_min", "n_regs", "spill_bytes", "shared_bytes", "blocks_per_sm")
_FLOAT_COLUMNS = ("ms_median", "ms_p20", "ms_p80", "gbps", "pct_of_copy", "occupancy", "max_rel_err")

_HOW_TO_PRODUCE = (
    "measure it on a GPU with `python -m perfutils sweep --config notebooks/params/<study>.yaml`, "
    "which writes data/<gpu-slug>/<study>.csv and its .json sidecar"
)


class DataFileError(ValueError):
    """A data file (CSV or JSON sidecar) is missing pieces, truncated or otherwise unreadable."""


class IncompatibleDataError(ValueError):
    """Rows would be mixed with data from another GPU or another schema."""


# --------------------------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------------------------


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


_SLUG_DROP = {"nvidia", "tesla", "corporation"}


def gpu_slug(name: str | None) -> str:
    """A short, stable directory name for a GPU model.

    ``"NVIDIA H100 80GB HBM3"`` -> ``"h100-sxm-80gb"`` (HBM3 without "PCIe"/"NVL" is the SXM part),
    ``"NVIDIA H100 PCIe"`` -> ``"h100-pcie"``, ``"NVIDIA A100-SXM4-80GB"`` -> ``"a100-sxm4-80gb"``,
    ``None``/``"cpu"`` -> ``"cpu"``. Deterministic: the same name always gives the same slug.
    """
    if name is None:
        return "cpu"
    if not isinstance(name, str):
        raise TypeError(f"gpu_slug: name must be a str or None, got {type(name).__name__}")
    words = [w for w in re.split(r"[^a-z0-9]+", name.lower()) if w and w not in _SLUG_DROP]
    if not words:
        raise ValueError(f"gpu_slug: cannot make a slug from GPU name {name!r}")
    memory = [w for w in words if re.fullmatch(r"\d+gb", w)]
    memory_kinds = {w for w in words if re.fullmatch(r"hbm\d*e?|gddr\d*x?", w)}
    form = [w for w in words if re.fullmatch(r"sxm\d*|pcie|nvl", w)]
    model = [w for w in words if w not in memory and w not in memory_kinds and w not in form]
    if not form and any(kind.startswith("hbm") for kind in memory_kinds):
        # "H100 80GB HBM3" is how the SXM module reports itself (the PCIe card says "PCIe").
        form = ["sxm"]
    return "-".join(model + form + memory) or "cpu"


def data_path(data_dir: str | os.PathLike, gpu_name: str | None, study: str) -> Path:
    """``<data_dir>/<gpu-slug>/<study>.csv``."""
    if not isinstance(study, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", study):
        raise ValueError(f"data_path: study must be a non-empty name of letters, digits, '_', '.', '-', got {study!r}")
    return Path(data_dir) / gpu_slug(gpu_name) / f"{study}.csv"


def _sidecar_path(csv_path: Path) -> Path:
    return csv_path.with_suffix(".json")


def _format_cell(column: str, value: Any) -> str:
    """One value as CSV text; missing values are the empty string."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, str):
        return value
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        value = float(value)
        if math.isnan(value):
            return ""
        return repr(value)  # shortest text that reads back as exactly this float
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value, sort_keys=True, default=str)
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 0) == 0:
        return _format_cell(column, value.item())  # numpy / torch scalars
    raise TypeError(
        f"column {column!r}: cannot record a value of type {type(value).__name__} ({value!r}); "
        "expected str, int, float, bool, None, or a dict/list (stored as JSON)"
    )


def _csv_line(fields: list[str]) -> str:
    """One RFC 4180 line ending in "\\n".

    Written by hand because csv.writer with a "\\n" terminator leaves a lone "\\r" unquoted,
    which readers then take for a line break (a corrupt row from an innocent error message).
    """
    quoted = []
    for text in fields:
        if any(ch in text for ch in ',"\r\n') or text != text.strip():
            text = '"' + text.replace('"', '""') + '"'
        quoted.append(text)
    return ",".join(quoted) + "\n"


@contextlib.contextmanager
def _directory_lock(directory: Path):
    """Serialise writers of one data directory (two sweeps writing the same study)."""
    try:
        import fcntl
    except ImportError:  # not POSIX: atomic replace still protects readers
        yield
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a crash leaves either the old file or the new one."""
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp_name)
        raise
    # Make the rename itself durable.
    with contextlib.suppress(OSError):
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def write_table(df: pd.DataFrame, path: str | os.PathLike, metadata: Mapping[str, Any], *, overwrite: bool = False) -> Path:
    """Write a derived table (not a sweep: no per-row schema) and its JSON sidecar, each atomically.

    Refuses to replace an existing file unless ``overwrite=True``.
    """
    path = _csv_path(path)
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} exists: not overwriting recorded data (pass overwrite=True to replace it)")
    path.parent.mkdir(parents=True, exist_ok=True)
    _atomic_write(path, df.to_csv(index=False).encode())
    _atomic_write(_sidecar_path(path), json.dumps(dict(metadata), indent=2, sort_keys=True, default=str).encode())
    return path


def _read_csv_table(path: Path) -> tuple[list[str], list[list[str]], bytes]:
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


def _read_json(path: Path) -> dict[str, Any]:
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


def _sidecar_gpus(meta: Mapping[str, Any]) -> set[str]:
    names = {meta.get("gpu_name")}
    names.update(session.get("gpu_name") for session in meta.get("sessions", []) if isinstance(session, Mapping))
    return {name for name in names if isinstance(name, str) and name}


# --------------------------------------------------------------------------------------------
# The store
# --------------------------------------------------------------------------------------------


class ResultStore:
    """One study's CSV plus JSON sidecar, appended to row by row.

    Args:
        path_csv: the CSV path (the sidecar is the same path with ``.json``).
        metadata: this session's metadata (``perfutils.metadata.collect_metadata``); written to the
            sidecar on the first append. ``None``: collected when first needed.
        allow_mixed: accept rows whose GPU or schema differs from what the file already holds.
        overwrite: start a new file; existing CSV/JSON are renamed to ``<stem>.replaced-<UTC>.*``
            (kept, never deleted) on the first append.
    """

    def __init__(
        self,
        path_csv: str | os.PathLike,
        metadata: Mapping[str, Any] | None = None,
        *,
        allow_mixed: bool = False,
        overwrite: bool = False,
    ) -> None:
        if not isinstance(path_csv, (str, os.PathLike)):
            raise TypeError(f"ResultStore: path_csv must be a path, got {type(path_csv).__name__}")
        path = Path(path_csv)
        if path.suffix != ".csv":
            raise ValueError(f"ResultStore: path_csv must end in .csv, got {str(path)!r}")
        if metadata is not None and not isinstance(metadata, Mapping):
            raise TypeError(f"ResultStore: metadata must be a mapping or None, got {type(metadata).__name__}")
        for name, flag in (("allow_mixed", allow_mixed), ("overwrite", overwrite)):
            if not isinstance(flag, bool):
                raise TypeError(f"ResultStore: {name} must be a bool, got {flag!r}")
        self.path = path
        self.metadata_path = _sidecar_path(path)
        self.metadata = dict(metadata) if metadata is not None else None
        self.allow_mixed = allow_mixed
        self.overwrite = overwrite
        self.replaced: list[Path] = []  # where overwrite=True moved old files
        self._session_recorded = False  # this session's metadata is in the sidecar
        self._overwrite_done = False  # old files already moved aside (once per store)

    def __repr__(self) -> str:
        return f"ResultStore({str(self.path)!r})"

    @property
    def study(self) -> str:
        return self.path.stem

    @property
    def gpu_name(self) -> str:
        return str(self._session_metadata().get("gpu_name") or "cpu")

    def _session_metadata(self) -> dict[str, Any]:
        if self.metadata is None:
            from .metadata import collect_metadata

            self.metadata = collect_metadata({}, None)
        return self.metadata

    def exists(self) -> bool:
        return self.path.exists()

    # ---- reading -------------------------------------------------------------------------

    def load(self) -> pd.DataFrame:
        return load_records(self.path, require_metadata=False)

    def done_keys(self, *, retry_errors: bool = False) -> set[str]:
        """Config keys that already have a final row (``ok``, ``wrong`` or ``error``).

        ``retry_errors=True`` leaves out keys whose only rows are errors, so a sweep retries them
        (e.g. an OOM caused by another process); the old error row stays in the file.
        A corrupt file raises :class:`DataFileError` rather than resuming from a guess.
        """
        if not self.path.exists() or (self.overwrite and not self._overwrite_done):
            return set()  # overwrite: the old file is moved aside at the first append, so nothing is done
        header, rows, _ = _read_csv_table(self.path)
        for name in ("config_key", "status"):
            if name not in header:
                raise DataFileError(f"data file {self.path} has no {name!r} column; cannot tell which configurations are done")
        key_at, status_at = header.index("config_key"), header.index("status")
        statuses: dict[str, set[str]] = {}
        for row in rows:
            statuses.setdefault(row[key_at], set()).add(row[status_at])
        if retry_errors:
            return {key for key, seen in statuses.items() if seen - {"error"}}
        return {key for key, seen in statuses.items() if seen & set(STATUSES)}

    # ---- compatibility -------------------------------------------------------------------

    def check_compatible(self) -> None:
        """Raise :class:`IncompatibleDataError` if this session may not append to the existing file.

        Called by every append; sweeps call it up front so nothing is measured in vain.
        """
        if (self.overwrite and not self._overwrite_done) or self.allow_mixed or not self.path.exists():
            return
        header, rows, _ = _read_csv_table(self.path)
        meta = _read_json(self.metadata_path) if self.metadata_path.exists() else {}
        self._check_schema(header, meta)
        self._check_gpu(header, rows, meta, {self.gpu_name})

    def _check_schema(self, header: list[str], meta: Mapping[str, Any]) -> None:
        missing = [name for name in COLUMNS if name not in header]
        version = meta.get("schema_version", SCHEMA_VERSION if not missing else "unknown")
        if missing or version != SCHEMA_VERSION:
            detail = f"missing columns {missing}" if missing else f"columns {header}"
            raise IncompatibleDataError(
                f"refusing to append to {self.path}: it holds schema version {version} ({detail}), "
                f"but this code writes schema version {SCHEMA_VERSION} with columns {list(COLUMNS)}. "
                "Write to another path, pass overwrite=True to start a new file (the old one is kept as "
                "<stem>.replaced-<time>.csv), or allow_mixed=True to append anyway."
            )

    def _check_gpu(self, header: list[str], rows: list[list[str]], meta: Mapping[str, Any], new_gpus: set[str]) -> None:
        existing = _sidecar_gpus(meta)
        if "gpu_name" in header:
            at = header.index("gpu_name")
            existing.update(row[at] for row in rows if row[at])
        foreign = sorted(new_gpus - existing) if existing else []
        if foreign:
            raise IncompatibleDataError(
                f"refusing to append rows measured on {', '.join(map(repr, foreign))} to {self.path}, which holds "
                f"data from {', '.join(map(repr, sorted(existing)))}. Use the directory of that GPU "
                f"(data/{gpu_slug(foreign[0])}/), or pass allow_mixed=True to mix GPUs in one file on purpose."
            )

    # ---- writing -------------------------------------------------------------------------

    def append(self, rows: Iterable[Mapping[str, Any]] | pd.DataFrame) -> int:
        """Atomically add ``rows`` (dicts or a DataFrame) to the CSV; returns how many were added.

        Each row needs the configuration columns and ``status``; ``study``, ``gpu_name`` and
        ``timestamp_utc`` are filled in when absent; any other key becomes an extra column (older
        rows get it empty). A row for a configuration that already has an ``ok``/``wrong`` row is
        refused (ValueError): a measurement is never shadowed by another.
        """
        new_rows = self._normalise_rows(rows)
        if not new_rows:
            return 0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with _directory_lock(self.path.parent):
            if self.overwrite and not self._overwrite_done:
                self._move_old_files_aside()
                self._overwrite_done = True
            if self.path.exists():
                header, old_rows, raw = _read_csv_table(self.path)  # corrupt file: refuse, never clobber
                meta = _read_json(self.metadata_path) if self.metadata_path.exists() else {}
                if not self.allow_mixed:
                    self._check_schema(header, meta)
                    self._check_gpu(header, old_rows, meta, {row["gpu_name"] for row in new_rows})
                self._check_duplicates(header, old_rows, new_rows)
            else:
                header, old_rows, raw, meta = [], [], b"", {}
                self._check_duplicates(list(COLUMNS), [], new_rows)
            self._write_sidecar(meta, new_rows)
            self._write_csv(header, old_rows, raw, new_rows)
        return len(new_rows)

    def _normalise_rows(self, rows: Iterable[Mapping[str, Any]] | pd.DataFrame) -> list[dict[str, str]]:
        if isinstance(rows, pd.DataFrame):
            rows = rows.to_dict("records")
        elif isinstance(rows, Mapping) or isinstance(rows, (str, bytes)):
            raise TypeError("ResultStore.append: rows must be an iterable of dicts or a DataFrame, not a single row")
        normalised = []
        for index, row in enumerate(rows):
            if not isinstance(row, Mapping):
                raise TypeError(f"ResultStore.append: row {index} must be a mapping, got {type(row).__name__}")
            cells = {str(name): _format_cell(str(name), value) for name, value in row.items()}
            if not cells.get("study"):
                cells["study"] = self.study
            if not cells.get("gpu_name"):
                cells["gpu_name"] = self.gpu_name
            if not cells.get("timestamp_utc"):
                cells["timestamp_utc"] = utc_now()
            if not cells.get("config_key") and all(name in row for name in CONFIG_COLUMNS):
                cells["config_key"] = config_key(row)
            if cells["study"] != self.study:
                raise ValueError(f"ResultStore.append: row {index} has study {cells['study']!r} but {self.path} holds study {self.study!r}")
            empty = [name for name in _NON_EMPTY if not cells.get(name)]
            if empty:
                raise ValueError(f"ResultStore.append: row {index} lacks required values {empty} (config key {cells.get('config_key')!r})")
            if cells["status"] not in STATUSES:
                raise ValueError(f"ResultStore.append: row {index} has status {cells['status']!r}; expected one of {STATUSES}")
            if cells["status"] == "error" and not cells.get("error"):
                raise ValueError(f"ResultStore.append: row {index} has status 'error' but no error message")
            if cells["gpu_name"] != self.gpu_name and not self.allow_mixed:
                raise IncompatibleDataError(
                    f"ResultStore.append: row {index} was measured on {cells['gpu_name']!r} but this session runs on "
                    f"{self.gpu_name!r}; pass allow_mixed=True to record it anyway"
                )
            normalised.append(cells)
        return normalised

    def _check_duplicates(self, header: list[str], old_rows: list[list[str]], new_rows: list[dict[str, str]]) -> None:
        measured: set[str] = set()
        if "config_key" in header and "status" in header:
            key_at, status_at = header.index("config_key"), header.index("status")
            measured = {row[key_at] for row in old_rows if row[status_at] in ("ok", "wrong")}
        batch: set[str] = set()
        for row in new_rows:
            key = row["config_key"]
            if key in measured:
                raise ValueError(
                    f"ResultStore.append: {self.path} already has a measurement for {key!r}; refusing to record it "
                    "twice (skip done_keys(), or start a new file with overwrite=True)"
                )
            if key in batch:
                raise ValueError(f"ResultStore.append: configuration {key!r} appears twice in one append")
            batch.add(key)

    def _move_old_files_aside(self) -> None:
        stamp = utc_now().replace(":", "").replace("-", "")
        for old in (self.path, self.metadata_path):
            if old.exists():
                target = old.with_name(f"{old.stem}.replaced-{stamp}{old.suffix}")
                os.replace(old, target)
                self.replaced.append(target)

    def _write_sidecar(self, meta: dict[str, Any], new_rows: list[dict[str, str]]) -> None:
        if self._session_recorded and self.metadata_path.exists():
            return
        session = dict(self._session_metadata())
        session.setdefault("gpu_name", self.gpu_name)
        session.setdefault("gpu_slug", gpu_slug(session.get("gpu_name")))
        if not meta:
            meta = {"schema_version": SCHEMA_VERSION, "columns": list(COLUMNS), "study": self.study, **session, "sessions": []}
        else:
            # Later sessions (a resumed sweep) are recorded after the first; the first stays on top.
            meta = dict(meta)
            meta.setdefault("sessions", [])
            meta["sessions"] = list(meta["sessions"]) + [session]
        gpus = _sidecar_gpus(meta) | {row["gpu_name"] for row in new_rows}
        if len(gpus) > 1:
            meta["mixed_gpus"] = sorted(gpus)
        text = json.dumps(meta, indent=2, sort_keys=False, default=str) + "\n"
        _atomic_write(self.metadata_path, text.encode("utf-8"))
        self._session_recorded = True

    def _write_csv(self, header: list[str], old_rows: list[list[str]], raw: bytes, new_rows: list[dict[str, str]]) -> None:
        columns = list(header) if header else list(COLUMNS)
        for row in new_rows:
            columns.extend(name for name in row if name not in columns)
        for name in COLUMNS:  # allow_mixed onto an older schema: add the missing required columns
            if name not in columns:
                columns.append(name)
        lines = []
        if columns == header:
            prefix = raw  # unchanged header: keep the old bytes exactly
        else:
            lines.append(_csv_line(columns))
            lines.extend(_csv_line(row + [""] * (len(columns) - len(row))) for row in old_rows)
            prefix = b""
        lines.extend(_csv_line([row.get(name, "") for name in columns]) for row in new_rows)
        _atomic_write(self.path, prefix + "".join(lines).encode("utf-8"))


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------


def _csv_path(path: str | os.PathLike) -> Path:
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
    return _read_json(_sidecar_path(_csv_path(path)))


def load_records(path: str | os.PathLike, *, require_metadata: bool = True) -> pd.DataFrame:
    """Read and validate a data file; the sidecar is attached as ``df.attrs["metadata"]``.

    Raises FileNotFoundError (saying how to produce the file) or :class:`DataFileError` (naming
    the file and the problem) — never returns an empty or partial frame for a broken file.
    """
    path = _csv_path(path)
    header, rows, _ = _read_csv_table(path)
    missing = [name for name in COLUMNS if name not in header]
    if missing:
        raise DataFileError(f"data file {path} lacks required columns {missing} (schema version {SCHEMA_VERSION})")
    if not rows:
        raise DataFileError(f"data file {path} has a header but no rows (truncated, or nothing was measured)")
    frame = pd.DataFrame(rows, columns=header, dtype=object)
    for name in _NON_EMPTY:
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
    metadata_path = _sidecar_path(path)
    if metadata_path.exists() or require_metadata:
        frame.attrs["metadata"] = _read_json(metadata_path)
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
