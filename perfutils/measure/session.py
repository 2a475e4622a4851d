"""Recording a hand-written study on the GPU: the measurement back end and the session that writes its rows.

The notebooks' own studies (06 and 07: :mod:`perfutils.studies.teaching`; 08: :mod:`perfutils.studies.profiling`)
are lists of configurations measured one by one rather than a sweep grid. They share two pieces:

* :class:`CudaBackend` — the GPU side: do_bench timing, first-call (compile) time, peak memory, a host-loop time
  per call, the kernels one call launches (torch.profiler). Tests substitute a fake with the same methods.
* :class:`Session` — one study's data file (:class:`~perfutils.data.store.ResultStore`): what is already
  recorded (resume), the copy bandwidth, one row per configuration, one progress line each.
"""

from __future__ import annotations

import contextlib
import gc
import math
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from ..data.metadata import collect_metadata
from .profiler import kernel_table
from ..data.schema import config_key, data_path, error_text
from ..data.store import ResultStore
from .timing import BenchResult, bench, copy_bandwidth_gbps, first_call_ms, peak_memory_above

__all__ = ["CudaBackend", "Session"]


class CudaBackend:
    """The GPU side of a measurement: timing, compile time, peak memory, host loop, kernel counts.

    ``warmup_ms``/``rep_ms`` go to ``triton.testing.do_bench`` (via :func:`perfutils.measure.timing.bench`);
    ``producer`` is the command that records the study, named when no GPU is available.
    """

    device = "cuda"

    def __init__(self, *, warmup_ms: float = 10.0, rep_ms: float = 50.0, wall_budget_ms: float = 20.0,
                 producer: str | None = None) -> None:
        if not torch.cuda.is_available():
            how = f" (produce it with `{producer}` on the GPU)" if producer else ""
            raise RuntimeError(
                "these measurements need a CUDA GPU and none is available; on a CPU the notebooks replay "
                f"the committed data instead{how}"
            )
        self.warmup_ms = warmup_ms
        self.rep_ms = rep_ms
        self.wall_budget_ms = wall_budget_ms
        self.cc = tuple(torch.cuda.get_device_capability())

    def first_call(self, fn: Callable[[], Any]) -> tuple[Any, float]:
        return first_call_ms(fn)

    def bench(self, fn: Callable[[], Any]) -> BenchResult:
        return bench(fn, warmup_ms=self.warmup_ms, rep_ms=self.rep_ms)

    def peak_bytes(self, fn: Callable[[], Any]) -> int:
        return peak_memory_above(fn)

    def wall_ms(self, fn: Callable[[], Any]) -> float:
        """Milliseconds per call of back-to-back calls timed on the host (no L2 flush, no per-call sync).

        Unlike do_bench's device-side events this includes the host's launch cost whenever the host,
        not the GPU, is the slower side - the regime of small tensors.
        """
        fn()
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        estimate = max(time.perf_counter() - start, 1e-6) * 1e3
        calls = int(min(1000, max(3, self.wall_budget_ms / estimate)))
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - start) * 1e3 / calls

    def copy_gbps(self) -> float:
        return copy_bandwidth_gbps()

    def device_events(self, fn: Callable[[], Any], steps: int = 1) -> list[Any]:
        """``torch.profiler`` key averages of ``steps`` calls of ``fn`` (CPU and CUDA activities)."""
        from torch.profiler import ProfilerActivity, profile

        fn()  # warm: compilation and caches stay out of the profile
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                fn()
            torch.cuda.synchronize()
        return list(prof.key_averages())

    def count_kernels(self, fn: Callable[[], Any]) -> int | None:
        """GPU kernels one call of ``fn`` launches (memsets and copies not counted), from the profiler."""
        table = kernel_table(self.device_events(fn, steps=1), steps=1)
        if table.empty:
            return None
        kernels = table[table["kind"] == "kernel"]
        return int(round(kernels["calls_per_step"].sum()))

    def release(self) -> None:
        gc.collect()
        torch.cuda.empty_cache()


def _is_fatal(exc: BaseException) -> bool:
    """CUDA errors after which the context is unusable: stop instead of recording garbage."""
    text = str(exc).lower()
    return any(s in text for s in ("illegal memory access", "unspecified launch failure", "misaligned address",
                                   "device-side assert", "illegal instruction"))


def _fmt(value: Any, spec: str) -> str:
    return format(value, spec) if isinstance(value, (int, float)) and not (isinstance(value, float) and math.isnan(value)) else "-"


class Session:
    """One study being recorded: the store, what is already done, the copy bandwidth, progress lines.

    :meth:`record` measures one configuration (skipped when the file already has it) and appends its row;
    :meth:`record_rows` does the same for a measurement that yields several rows. A failure becomes an
    error row, except a CUDA error after which the context is unusable, which stops the study.
    """

    def __init__(self, study: str, out_dir, backend, *, parameters: Mapping[str, Any], copy_gbps: float | None,
                 metadata: Mapping[str, Any] | None, overwrite: bool, log: Callable[[str], Any]) -> None:
        self.backend = backend
        self.log = log
        if copy_gbps is None:
            copy_gbps = float(backend.copy_gbps())
            log(f"[{study}] measured copy bandwidth: {copy_gbps:.0f} GB/s")
        self.copy_gbps = float(copy_gbps)
        meta = collect_metadata(dict(parameters), self.copy_gbps)
        if metadata:
            meta.update(dict(metadata))  # tests: pretend to be another GPU
        self.path = data_path(out_dir, meta.get("gpu_name"), study)
        self.store = ResultStore(self.path, meta, overwrite=overwrite)
        self.store.check_compatible()  # refuse before measuring anything
        self.done = self.store.done_keys(retry_errors=True)
        if self.done:
            log(f"[{study}] {self.path} already holds {len(self.done)} configurations: they are kept and skipped "
                "(pass overwrite=True / --overwrite to start a new file; the old one is kept aside)")
        self.study = study
        self.count = 0
        self.started = time.perf_counter()

    def record(self, config: Mapping[str, Any], measure: Callable[[], Mapping[str, Any]],
               extra: Mapping[str, Any] | None = None, *, key: str | None = None) -> dict[str, Any] | None:
        key = key or config_key(config)
        if key in self.done:
            return None
        began = time.perf_counter()
        result: dict = {}
        error = self._failure(lambda: result.update(measure()))
        row = {**config, **(extra or {}), **(error or result), "config_key": key}
        self.store.append([row])
        self.done.add(key)
        self.count += 1
        seconds = time.perf_counter() - began
        what = " ".join(f"{k}={config[k]}" for k in ("loss", "variant", "tokens", "vocab", "block_size", "num_warps")
                        if config.get(k) is not None)
        if row["status"] == "error":
            self.log(f"[{self.study}] {what}: ERROR {row['error'][:160]} ({seconds:.1f}s)")
        else:
            self.log(f"[{self.study}] {what}: {_fmt(row.get('ms_median'), '.4f')} ms, {_fmt(row.get('gbps'), '.0f')} GB/s "
                     f"({_fmt(row.get('pct_of_copy'), '.0f')}% of copy), err {_fmt(row.get('max_rel_err'), '.1e')}, "
                     f"{row['status']} ({seconds:.1f}s)")
        return row

    def record_rows(self, key: str, config: Mapping[str, Any],
                    measure: Callable[[], Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
        """Like :meth:`record` for a measurement that yields several rows (appended in one atomic write).

        ``key`` identifies the whole group for resuming; each row brings its own ``config_key``.
        A failure records one error row under ``key``.
        """
        if key in self.done:
            return []
        began = time.perf_counter()
        rows: list = []
        error = self._failure(lambda: rows.extend(dict(row) for row in measure()))
        rows = [{**config, **error, "config_key": key}] if error else rows
        self.store.append(rows)
        self.done.update(row["config_key"] for row in rows)
        self.done.add(key)
        self.count += len(rows)
        first = rows[0]
        state = f"ERROR {first['error'][:160]}" if first["status"] == "error" else \
            f"{_fmt(first.get('ms_median'), '.4f')} ms, {len(rows)} rows, {first['status']}"
        self.log(f"[{self.study}] {config.get('variant')}: {state} ({time.perf_counter() - began:.1f}s)")
        return rows

    def _failure(self, run: Callable[[], Any]) -> dict[str, Any] | None:
        """Run ``run``; None if it succeeded, else the error columns (after releasing the backend's memory). A CUDA
        error after which the context is unusable is raised instead."""
        try:
            run()
            return None
        except Exception as exc:
            if _is_fatal(exc):
                raise
            with contextlib.suppress(Exception):
                self.backend.release()
            return {"status": "error", "error": error_text(exc, 600)}

    def finish(self) -> Path:
        self.log(f"[{self.study}] {self.count} new rows in {time.perf_counter() - self.started:.0f}s -> {self.path}")
        return self.path


def run_studies(measures: Sequence[Callable[..., Path | None]], producer: str,
                log: Callable[[str], Any] = print) -> list[Path]:
    """Run each ``measure(copy_gbps=, backend=, log=)`` on this GPU with one backend and one copy bandwidth; the
    files they wrote (a measurement that records nothing returns None)."""
    started = time.perf_counter()
    backend = CudaBackend(producer=producer)
    copy = float(backend.copy_gbps())
    log(f"GPU: {torch.cuda.get_device_name()}; copy bandwidth {copy:.0f} GB/s")
    written = [path for measure in measures if (path := measure(copy_gbps=copy, backend=backend, log=log)) is not None]
    log(f"done in {time.perf_counter() - started:.0f}s: " + ", ".join(map(str, written)))
    return written
