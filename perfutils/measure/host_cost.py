"""What a call costs the host, and how often it waits for the GPU: the columns a study adds beside the GPU time.

* ``host_us_per_call``: wall-clock microseconds per call on a tiny problem of the same loss, dtype and vocab
  (:data:`HOST_ROWS` rows): after a warm-up (20 calls, then batches for 0.2 s: from 2026-11-24 on; before, 20
  calls only, 7 batches of 300), ``calls`` calls back to back with no synchronization, timed until
  the last call returns (the time the caller's thread spends: Python, argument checks, launches), then one
  ``torch.cuda.synchronize()`` outside the timing; the median over ``repeats`` such batches (``host_us_min``: the
  fastest batch). Until 2026-11-23 the synchronize was inside the timing, so a batch also waited for the GPU's
  last kernels; a provider that queues more launches than the driver's queue holds (~1000 per batch) still waits
  for the GPU. It does not depend on the token count, so a process measures it once per (provider, loss,
  dtype, vocab) and every row of that combination records the same value.
* ``syncs_per_call``: device-to-host synchronizations during one repeated call at the measured shape, counted
  as the warnings PyTorch emits under ``torch.cuda.set_sync_debug_mode("warn")`` (``.item()``, blocking copies,
  ``nonzero``... anything PyTorch synchronizes for; a raw ``cudaDeviceSynchronize`` from a C extension is not
  seen), each printed to stderr with where it was raised. The previous mode is restored.

:class:`CallCosts` is the measurer's ``extra`` (see :class:`perfutils.measure.measurer.GpuMeasurer`).
"""

from __future__ import annotations

import statistics
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

from .providers import KERNEL_ONLY

__all__ = ["HOST_ROWS", "SYNC_WARNING", "CallCosts", "count_syncs", "time_host_calls", "tiny_inputs",
           "trace_host_batches"]

HOST_ROWS = 8
# PyTorch's message at a sync: "called a synchronizing CUDA operation". Not just "synchronizing": turning the debug
# mode on warns once per process that it "does not yet detect all synchronizing operations", which once counted as
# a sync of the first configuration of every process.
SYNC_WARNING = "called a synchronizing"


def time_host_calls(run: Callable[[], Any], sync: Callable[[], Any], *, calls: int = 100, repeats: int = 5,
                    warmup: int = 10, warmup_s: float = 0.0, clock: Callable[[], float] = time.perf_counter
                    ) -> list[float]:
    """Microseconds per call of ``calls`` back-to-back ``run()`` s until the last returns, for each of ``repeats``
    batches, after ``warmup`` runs (first calls compile, search, allocate) and then batches of ``calls`` runs for at
    least ``warmup_s`` seconds (a host core that idled while the GPU worked runs slower until its clock is up again),
    each followed by a sync; each timed batch is followed by one ``sync()`` that is not timed."""
    for name, value in (("calls", calls), ("repeats", repeats)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"time_host_calls: {name} must be a positive int, got {value!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"time_host_calls: warmup must be a non-negative int, got {warmup!r}")
    if isinstance(warmup_s, bool) or not isinstance(warmup_s, (int, float)) or not warmup_s >= 0:
        raise ValueError(f"time_host_calls: warmup_s must be a non-negative number of seconds, got {warmup_s!r}")
    for _ in range(warmup):
        run()
    sync()
    end = clock() + warmup_s
    while clock() < end:
        for _ in range(calls):
            run()
        sync()
    per_call = []
    for _ in range(repeats):
        start = clock()
        for _ in range(calls):
            run()
        per_call.append((clock() - start) / calls * 1e6)
        sync()
    return per_call


def trace_host_batches(run: Callable[[], Any], sync: Callable[[], Any], *, calls: int = 300, batches: int = 40,
                       warmup: int = 20, clock: Callable[[], float] = time.perf_counter) -> list[dict[str, float]]:
    """Where host µs vary (a diagnostic, not a measurement the studies record): per batch of ``calls`` runs after a
    cold start (``warmup`` runs and a sync, no time-based warm-up), its µs per call, the seconds since the first
    batch started and the garbage collections of each generation Python ran during it."""
    import gc

    for _ in range(warmup):
        run()
    sync()
    trace, origin = [], clock()
    for _ in range(batches):
        before = [generation["collections"] for generation in gc.get_stats()]
        start = clock()
        for _ in range(calls):
            run()
        elapsed = clock() - start
        after = [generation["collections"] for generation in gc.get_stats()]
        trace.append({"t_s": start - origin, "us_per_call": elapsed / calls * 1e6,
                      **{f"gc{index}": b - a for index, (a, b) in enumerate(zip(before, after))}})
        sync()
    return trace


def count_syncs(run: Callable[[], Any]) -> int:
    """Synchronizations PyTorch reports during one ``run()`` (CUDA only; see the module docstring)."""
    import torch

    previous = torch.cuda.get_sync_debug_mode()
    result = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            result = run()
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    del result
    syncs = [warning for warning in caught if SYNC_WARNING in str(warning.message).lower()]
    for warning in syncs:  # where it happened, for the stage's log (the count alone does not say which call synced)
        print(f"sync during the counted call: {warning.filename}:{warning.lineno}: {str(warning.message)[:200]}",
              file=sys.stderr, flush=True)
    return len(syncs)


def tiny_inputs(loss: str, target_format: str, dtype: Any, vocab: int, *, rows: int = HOST_ROWS, device: Any = "cuda",
                seed: int = 0, ignore_index: int = -100) -> tuple[Any, Any]:
    """(logits, target) of ``rows`` random rows (labels in [0, vocab), one row ignored when rows > 1)."""
    import torch

    generator = torch.Generator(device=device).manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=generator, device=device).mul_(2).to(dtype)
    if target_format == "labels":
        target = torch.randint(0, vocab, (rows,), generator=generator, device=device)
        if rows > 1:
            target[-1] = ignore_index
    else:
        target = torch.randn(rows, vocab, generator=generator, device=device).mul_(2).to(dtype)
    return logits, target


def _cuda_sync() -> None:
    import torch

    torch.cuda.synchronize()


class CallCosts:
    """``extra(point, plan)`` for :class:`~perfutils.measure.measurer.GpuMeasurer`: ``syncs_per_call`` of the
    timed plan, ``host_us_per_call`` / ``host_us_min`` of the same provider on a tiny problem (measured once per
    process and (provider, loss, target format, dtype, vocab)), the settings used, and ``kernel_only``.

    ``prepare`` builds the tiny problem's plan (default :func:`perfutils.measure.providers.prepare`); ``sync`` and
    ``count`` default to CUDA's synchronize and :func:`count_syncs` on a CUDA device, and to a no-op and "not
    counted" (None) elsewhere (tests pass fakes)."""

    def __init__(self, prepare: Callable[..., Any] | None = None, *, device: str = "cuda", rows: int = HOST_ROWS,
                 calls: int = 200, repeats: int = 11, warmup: int = 20, warmup_s: float = 0.2,
                 sync: Callable[[], Any] | None = None,
                 count: Callable[[Callable[[], Any]], int | None] | None = None) -> None:
        if prepare is None:
            from .providers import prepare
        self.prepare = prepare
        self.device = device
        self.rows, self.calls, self.repeats, self.warmup, self.warmup_s = rows, calls, repeats, warmup, warmup_s
        cuda = str(device).startswith("cuda")
        self.sync = sync or (_cuda_sync if cuda else (lambda: None))
        self.count = count or (count_syncs if cuda else (lambda run: None))
        self._host: dict[tuple, tuple[float, float]] = {}

    def host_us(self, variant: str, loss: str, target_format: str, dtype: str, vocab: int) -> tuple[float, float]:
        """(median, fastest) microseconds per call of ``variant`` on the tiny problem."""
        key = (variant, loss, target_format, dtype, vocab)
        if key not in self._host:
            from ..data.schema import torch_dtype

            logits, target = tiny_inputs(loss, target_format, torch_dtype(dtype), vocab, rows=self.rows,
                                         device=self.device)
            plan = self.prepare(logits, target, loss=loss, target_format=target_format, variant=variant,
                                block_size=None, num_warps=None)
            times = time_host_calls(plan.run, self.sync, calls=self.calls, repeats=self.repeats, warmup=self.warmup,
                                    warmup_s=self.warmup_s)
            self._host[key] = (statistics.median(times), min(times))
            del plan, logits, target
        return self._host[key]

    def __call__(self, point: Any, plan: Any) -> dict[str, Any]:
        syncs = self.count(plan.run)
        median, fastest = self.host_us(point.variant, point.loss, point.target_format, point.dtype, point.vocab)
        return {
            "syncs_per_call": syncs,
            "host_us_per_call": median,
            "host_us_min": fastest,
            "host_rows": self.rows,
            "host_calls": self.calls,
            "host_repeats": self.repeats,
            "kernel_only": point.variant in KERNEL_ONLY,
        }
