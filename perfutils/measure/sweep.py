"""Sweeps: measure every configuration of a grid, one CSV row each, resumable after a kill.

:func:`run_sweep` validates the config (:mod:`perfutils.measure.sweep_config`), skips the configurations the
study's file already holds, measures the others one by one (by default with a
:class:`~perfutils.measure.measurer.GpuMeasurer`) and appends each row as soon as it is measured
(:class:`~perfutils.data.store.ResultStore`). A configuration that raises becomes an error row and the sweep
goes on; a CUDA error that leaves the context unusable stops it (run it again to resume); so does Ctrl-C, with
every row measured so far kept. ``python -m perfutils sweep --config <yaml>`` runs one from the command line.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import pandas as pd

from .measurer import GpuMeasurer, print_now
from ..data.metadata import collect_metadata
from ..data.schema import STATUSES, data_path, error_text
from ..data.store import ResultStore
from .sweep_config import SweepPoint, known_names, load_config, points_and_skipped

__all__ = ["run_sweep"]

# Messages of CUDA errors after which the context is unusable: every later launch would fail too.
_FATAL_CUDA = (
    "illegal memory access",
    "unspecified launch failure",
    "device-side assert",
    "misaligned address",
    "illegal instruction",
    "cuda error: an illegal",
)


def _is_fatal_cuda_error(exc: BaseException) -> bool:
    if type(exc).__name__ == "AcceleratorError":
        return True
    message = str(exc).lower()
    return any(pattern in message for pattern in _FATAL_CUDA)


def _progress_line(index: int, total: int, point: SweepPoint, row: Mapping[str, Any], seconds: float) -> str:
    head = f"[{index}/{total}] {point.key}:"
    status = row.get("status")
    if status == "error":
        return f"{head} error {str(row.get('error', ''))[:160]} [{seconds:.1f} s]"
    parts = [str(status)]
    ms = row.get("ms_median")
    if isinstance(ms, (int, float)):
        parts.append(f"{ms:.4f} ms")
    if isinstance(row.get("gbps"), (int, float)):
        parts.append(f"{row['gbps']:.0f} GB/s")
    if isinstance(row.get("pct_of_copy"), (int, float)):
        parts.append(f"{row['pct_of_copy']:.1f}% of copy")
    if isinstance(row.get("max_rel_err"), (int, float)):
        parts.append(f"err {row['max_rel_err']:.1e}")
    if isinstance(row.get("compile_ms"), (int, float)):
        parts.append(f"first call {row['compile_ms']:.0f} ms")
    return f"{head} {', '.join(parts)} [{seconds:.1f} s]"


def run_sweep(
    config: Any,
    store: ResultStore | None = None,
    *,
    measure: Callable[[SweepPoint], Mapping[str, Any]] | None = None,
    metadata: Mapping[str, Any] | None = None,
    dry_run: bool = False,
    allow_mixed: bool = False,
    overwrite: bool = False,
    log: Callable[[str], Any] = print_now,
) -> pd.DataFrame:
    """Measure every configuration of ``config`` not yet in the store; return the study's records.

    Args:
        config: dict, YAML path or SweepSpec (validated before anything runs).
        store: where rows go; default ``<out>/<gpu-slug>/<study>.csv``.
        measure: ``measure(point) -> dict`` of measured columns including ``status``; default a
            :class:`GpuMeasurer`. An exception from it becomes a ``status="error"`` row and the
            sweep goes on (KeyboardInterrupt stops it; rows already measured stay recorded).
        metadata: this session's sidecar metadata (default: ``collect_metadata``).
        dry_run: return the planned configurations (with a ``done`` column when ``store`` is
            given) and measure nothing.
        allow_mixed, overwrite: passed to the default store (see :class:`ResultStore`).
        log: receives one progress line per configuration (``print`` works under papermill).
    """
    known = known_names()
    spec = load_config(config, known=known)
    points, skipped = points_and_skipped(spec, known)
    if skipped:
        log(f"{spec.study}: skipping invalid (loss, target_format) pairs {skipped}")
    if dry_run:
        plan = pd.DataFrame([{**p.as_dict(), "config_key": p.key} for p in points])
        if store is not None:
            done = store.done_keys(retry_errors=spec.retry_errors)
            plan["done"] = plan["config_key"].isin(done)
        return plan

    if store is not None and not isinstance(store, ResultStore):
        raise TypeError(f"run_sweep: store must be a ResultStore or None, got {type(store).__name__}")
    if measure is None:
        measure = GpuMeasurer(spec, log=log)
    elif not callable(measure):
        raise TypeError(f"run_sweep: measure must be a callable taking a SweepPoint, got {type(measure).__name__}")
    copy_gbps = getattr(measure, "copy_gbps", None) or spec.copy_gbps
    if store is None:
        if metadata is None:
            metadata = collect_metadata(spec.parameters, copy_gbps)
        store = ResultStore(data_path(spec.out, metadata.get("gpu_name"), spec.study), metadata, allow_mixed=allow_mixed, overwrite=overwrite)
    elif store.metadata is None:
        if metadata is None:
            metadata = collect_metadata(spec.parameters, copy_gbps)
        store.metadata = dict(metadata)

    store.check_compatible()  # refuse a foreign file before spending GPU time
    done = store.done_keys(retry_errors=spec.retry_errors)
    todo = [p for p in points if p.key not in done]
    log(f"{spec.study}: {len(points)} configurations, {len(points) - len(todo)} already in {store.path}, {len(todo)} to run")

    for index, point in enumerate(todo, start=1):
        started = time.perf_counter()
        fatal: BaseException | None = None
        try:
            fields = measure(point)
        except KeyboardInterrupt:
            log(f"interrupted during {point.key}; {index - 1} new rows are in {store.path}; run again to resume")
            raise
        except Exception as exc:  # compile error, out of resources, OOM...: a row, not a crash
            fields = {"status": "error", "error": error_text(exc)}
            if _is_fatal_cuda_error(exc):
                fatal = exc
        if not isinstance(fields, Mapping) or fields.get("status") not in STATUSES:
            raise TypeError(
                f"run_sweep: measure({point.key}) must return a dict with 'status' in {STATUSES}, got {fields!r}"
            )
        if fields.get("status") == "error" and fatal is None:
            # Outside the except block: the traceback (and the tensors its frames hold) is gone,
            # so empty_cache can really return the memory.
            recover = getattr(measure, "recover", None)
            if callable(recover):
                recover()
        # The grid point is the truth for the configuration columns; measured values fill the rest.
        row = {**fields, **point.as_dict(), "config_key": point.key}
        store.append([row])
        log(_progress_line(index, len(todo), point, row, time.perf_counter() - started))
        if fatal is not None:
            raise RuntimeError(
                f"the CUDA context is unusable after {point.key} ({error_text(fatal, 300)}); it is recorded as an "
                f"error row. Run the sweep again in a new process to resume with the remaining configurations."
            ) from fatal
    return store.load()
