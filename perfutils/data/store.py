"""Writing data files: :class:`ResultStore` appends a study's rows; :func:`write_table` writes a derived table.

Guarantees (the reasons this module exists rather than ``DataFrame.to_csv``):

* **Atomic appends.** Every append writes the whole new file to a temporary file in the same
  directory, fsyncs it and ``os.replace``-s it over the old one, so a kill at any moment leaves
  either the old file or the new one, never half a row.
* **Nothing measured is lost or rewritten.** Existing rows are copied byte for byte (values are
  never re-parsed and re-formatted); a configuration that already has a final measurement cannot
  be recorded again; ``overwrite=True`` moves the old files aside instead of deleting them.
* **No silent mixing.** Appending rows from another GPU, or to a file with another schema, is
  refused with a message naming both, unless ``allow_mixed=True``.

Reading is :mod:`perfutils.data.records`; the columns and keys are :mod:`perfutils.data.schema`.
"""

from __future__ import annotations

import contextlib
import json
import math
import numbers
import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from .metadata import collect_metadata
from .records import csv_path, load_records, read_csv_table, read_json, sidecar_gpus, sidecar_path
from .schema import (COLUMNS, CONFIG_COLUMNS, NON_EMPTY, SCHEMA_VERSION, STATUSES, DataFileError, IncompatibleDataError,
                     config_key, gpu_slug, utc_now)

__all__ = ["ResultStore", "keep_aside", "write_table"]

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


def replaced_stamp(*paths: Path) -> str:
    """The UTC time in the name of recorded files kept aside (``<stem>.replaced-<stamp>.*``), now; with a suffix
    (-2, -3, ...) when a copy of one of ``paths`` already has that name (two in one second must not overwrite)."""
    stamp = utc_now().replace(":", "").replace("-", "")
    candidate, count = stamp, 1
    while any(replaced_path(Path(path), candidate).exists() for path in paths):
        count += 1
        candidate = f"{stamp}-{count}"
    return candidate


def replaced_path(path: Path, stamp: str) -> Path:
    """Where a recorded file is kept when a newer recording replaces it (never deleted)."""
    return path.with_name(f"{path.stem}.replaced-{stamp}{path.suffix}")


def keep_aside(path: str | os.PathLike) -> Path | None:
    """A recorded table and its sidecar, if there, moved to ``<stem>.replaced-<UTC>.*`` before a newer one replaces
    them (never lost). Returns where the table went (None: there was none)."""
    path = csv_path(path)
    if not path.is_file():
        return None
    stamp = replaced_stamp(path, sidecar_path(path))
    for old in (path, sidecar_path(path)):
        if old.is_file():
            old.rename(replaced_path(old, stamp))
    return replaced_path(path, stamp)


def write_table(df: pd.DataFrame, path: str | os.PathLike, metadata: Mapping[str, Any], *, overwrite: bool = False,
                keep_old: bool = True) -> Path:
    """Write a table that is not a sweep (no per-row schema: ceilings, a study's summary, a derived table) and its
    JSON sidecar, each atomically.

    Refuses to replace an existing file unless ``overwrite=True``; then the old file and sidecar move aside to
    ``<stem>.replaced-<UTC>.*`` (:func:`keep_aside`), unless ``keep_old=False`` (the caller carries every old row into
    the new table).
    """
    path = csv_path(path)
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} exists: not overwriting recorded data (pass overwrite=True to replace it)")
    if keep_old:
        keep_aside(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _atomic_write(path, df.to_csv(index=False).encode())
    _atomic_write(sidecar_path(path), json.dumps(dict(metadata), indent=2, sort_keys=True, default=str).encode())
    return path


# --------------------------------------------------------------------------------------------
# The store
# --------------------------------------------------------------------------------------------


class ResultStore:
    """One study's CSV plus JSON sidecar, appended to row by row.

    Args:
        path_csv: the CSV path (the sidecar is the same path with ``.json``).
        metadata: this session's metadata (``perfutils.data.metadata.collect_metadata``); written to the
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
        self.metadata_path = sidecar_path(path)
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
        header, rows, _ = read_csv_table(self.path)
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
        header, rows, _ = read_csv_table(self.path)
        meta = read_json(self.metadata_path) if self.metadata_path.exists() else {}
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
        existing = sidecar_gpus(meta)
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
                header, old_rows, raw = read_csv_table(self.path)  # corrupt file: refuse, never clobber
                meta = read_json(self.metadata_path) if self.metadata_path.exists() else {}
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
            empty = [name for name in NON_EMPTY if not cells.get(name)]
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
        stamp = replaced_stamp(self.path, self.metadata_path)
        for old in (self.path, self.metadata_path):
            if old.exists():
                target = replaced_path(old, stamp)
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
        gpus = sidecar_gpus(meta) | {row["gpu_name"] for row in new_rows}
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


def forget_rows(path, variants: Iterable[str], tokens: Iterable[int] | None = None, *, dtype: str | None = None,
                vocabs: Iterable[int] | None = None, losses: Iterable[str] | None = None, log=print) -> Path | None:
    """Take the rows of ``variants`` (and of ``tokens``, ``dtype``, ``vocabs``, ``losses`` as "loss/target_format";
    each: all when None) out of a recorded study so its resumable runner measures them again, after a change to what
    they measure. Nothing is lost: the whole file and its sidecar are first kept as ``<stem>.replaced-<UTC>.*``
    (:func:`keep_aside`), and the sidecar records what was taken out and where it is kept. Returns the kept CSV (None
    when no row matched: nothing is written)."""
    from .records import load_metadata
    from .schema import utc_now

    path = Path(path)
    variants = list(variants)
    frame = pd.read_csv(path)
    drop = frame["variant"].isin(variants)
    if tokens is not None:
        drop &= frame["tokens"].isin(list(tokens))
    if dtype is not None:
        drop &= frame["dtype"] == dtype
    if vocabs is not None:
        drop &= frame["vocab"].isin(list(vocabs))
    if losses is not None:
        losses = sorted(losses)
        drop &= (frame["loss"] + "/" + frame["target_format"]).isin(losses)
    if not drop.any():
        log(f"{path}: no rows of {variants} match; nothing written")
        return None
    meta = load_metadata(path)
    kept = keep_aside(path)
    meta.setdefault("forgotten", []).append({
        "time_utc": utc_now(), "rows": int(drop.sum()), "variants": variants,
        "tokens": sorted(int(t) for t in frame.loc[drop, "tokens"].unique()), "dtype": dtype,
        **({"losses": losses} if losses is not None else {}),
        "vocabs": sorted(int(v) for v in frame.loc[drop, "vocab"].unique()), "kept_in": kept.name})
    write_table(frame[~drop], path, meta)
    log(f"{path}: {int(drop.sum())} rows of {variants} taken out to be measured again (the whole file kept in "
        f"{kept.name})")
    return kept
