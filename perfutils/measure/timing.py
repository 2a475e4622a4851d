"""GPU timing, compile time, peak memory and relative error — the numbers every sweep row needs.

Timing uses ``triton.testing.do_bench``. Checked against Triton 3.6.0's source:

* signature ``do_bench(fn, warmup=25, rep=100, grad_to_none=None, quantiles=None, return_mode="mean")``;
  ``warmup`` and ``rep`` are *milliseconds* of GPU time, converted to call counts from a 5-call estimate;
* when ``quantiles`` is given it returns that list and **ignores** ``return_mode``; we pass
  ``quantiles=[0.5, 0.2, 0.8]`` (median, p20, p80), so ``return_mode`` would not matter;
* it **always** flushes L2: before every timed call it zeroes a 256 MiB buffer (larger than H100's
  50 MiB L2) outside the CUDA-event interval. So ``flush_l2=True`` is do_bench itself, and
  ``flush_l2=False`` uses our own event loop that skips the flush (warm-L2 timings, for contrast).
"""

from __future__ import annotations

import math
import numbers
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

__all__ = ["BenchResult", "bench", "first_call_ms", "settle", "peak_memory_above", "rel_err", "copy_bandwidth_gbps"]

_QUANTILES = [0.5, 0.2, 0.8]


@dataclass(frozen=True)
class BenchResult:
    """Milliseconds per call: median and the 20th/80th percentiles."""

    ms_median: float
    ms_p20: float
    ms_p80: float

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def _require_cuda(what: str) -> Any:
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError(
            f"{what} needs a CUDA GPU and none is available: timings are only taken on a GPU "
            "(on a CPU, replay the committed data/ instead)"
        )
    return torch


def _check_callable(fn: Any, where: str) -> None:
    if not callable(fn):
        raise TypeError(f"{where}: fn must be a callable taking no arguments, got {type(fn).__name__}")


def _positive_ms(value: Any, name: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{where}: {name} must be a positive number of milliseconds, got {value!r}")
    return float(value)


def bench(fn: Callable[[], Any], *, warmup_ms: float = 25, rep_ms: float = 100, flush_l2: bool = True) -> BenchResult:
    """Time ``fn()`` on the GPU: median, p20 and p80 of per-call times in ms (warm-up excluded).

    ``flush_l2=True`` (default) clears L2 before every timed call, so inputs come from DRAM as in
    a training step. Raises RuntimeError when CUDA is unavailable.
    """
    _check_callable(fn, "bench")
    warmup_ms = _positive_ms(warmup_ms, "warmup_ms", "bench")
    rep_ms = _positive_ms(rep_ms, "rep_ms", "bench")
    if not isinstance(flush_l2, bool):
        raise TypeError(f"bench: flush_l2 must be a bool, got {flush_l2!r}")
    torch = _require_cuda("bench")
    if flush_l2:
        import triton.testing

        median, p20, p80 = triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, quantiles=_QUANTILES)
        return BenchResult(float(median), float(p20), float(p80))
    return _bench_warm_l2(torch, fn, warmup_ms, rep_ms)


def _bench_warm_l2(torch: Any, fn: Callable[[], Any], warmup_ms: float, rep_ms: float) -> BenchResult:
    """do_bench's loop without the L2 flush: data reused between calls may stay in L2."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        fn()
    end.record()
    torch.cuda.synchronize()
    estimate_ms = max(start.elapsed_time(end) / 5, 1e-6)
    n_warmup = max(1, int(warmup_ms / estimate_ms))
    n_repeat = max(1, int(rep_ms / estimate_ms))
    for _ in range(n_warmup):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n_repeat)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n_repeat)]
    for begin, finish in zip(starts, ends):
        begin.record()
        fn()
        finish.record()
    torch.cuda.synchronize()
    times = [begin.elapsed_time(finish) for begin, finish in zip(starts, ends)]
    median, p20, p80 = (_quantile(times, q) for q in _QUANTILES)
    return BenchResult(median, p20, p80)


def _quantile(values: list[float], q: float) -> float:
    """Linear-interpolation quantile (what do_bench uses)."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return float(ordered[0])
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return float(ordered[low] + (ordered[high] - ordered[low]) * (position - low))


def first_call_ms(fn: Callable[[], Any]) -> tuple[Any, float]:
    """Run ``fn()`` once and return (its result, wall milliseconds including JIT compilation).

    The first call of a Triton kernel compiles it (or loads it from the cache); synchronising
    before and after makes the wall time cover the GPU work too. Works without CUDA (no sync).
    """
    _check_callable(fn, "first_call_ms")
    import torch

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    start = time.perf_counter()
    result = fn()
    sync()
    return result, (time.perf_counter() - start) * 1e3


def settle(ms: float) -> None:
    """Leave the GPU idle for ``ms`` milliseconds once its queued work is done, so that a timing does not start in
    the power state a long burst of work left (see :data:`perfutils.measure.measurer.SETTLE_AFTER_MS`)."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()
    time.sleep(ms / 1e3)


def peak_memory_above(fn: Callable[[], Any]) -> int:
    """Peak CUDA memory allocated while ``fn()`` runs, minus what is allocated just before the call (the inputs):
    the outputs plus workspace the call needs. ``fn``'s result is dropped afterwards."""
    _check_callable(fn, "peak_memory_above")
    torch = _require_cuda("peak_memory_above")
    torch.cuda.synchronize()
    baseline_bytes = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    result = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    del result
    return int(peak - baseline_bytes)


def rel_err(a: Any, b: Any) -> float:
    """``||a - b||_2 / ||b||_2`` in float64, with ``b`` the reference.

    NaN or inf anywhere in ``a`` or ``b`` gives ``inf`` (never passes a tolerance). If ``b`` is all
    zeros the result is 0 when ``a`` is too and ``inf`` otherwise. Shapes must match exactly.
    """
    import torch

    for name, value in (("a", a), ("b", b)):
        if not isinstance(value, (torch.Tensor, numbers.Number)) and not hasattr(value, "__array__"):
            raise TypeError(f"rel_err: {name} must be a tensor, array or number, got {type(value).__name__}")
    a64 = torch.as_tensor(a).detach().to(torch.float64)
    b64 = torch.as_tensor(b).detach().to(device=a64.device, dtype=torch.float64)
    if a64.shape != b64.shape:
        raise ValueError(f"rel_err: shapes differ: a {tuple(a64.shape)} vs b (reference) {tuple(b64.shape)}")
    if not (bool(torch.isfinite(a64).all()) and bool(torch.isfinite(b64).all())):
        return math.inf
    diff = float(torch.linalg.vector_norm(a64 - b64))
    scale = float(torch.linalg.vector_norm(b64))
    if scale == 0.0:
        return 0.0 if diff == 0.0 else math.inf
    return diff / scale


def copy_bandwidth_gbps() -> float:
    """Measured device-to-device copy bandwidth in GB/s (1e9 B/s) of 1 GiB (far larger than L2), counting read +
    write: the ceiling the project reports against (% of copy), not the datasheet number."""
    torch = _require_cuda("copy_bandwidth_gbps")
    nbytes = 1 << 30
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    result = bench(lambda: dst.copy_(src), warmup_ms=25, rep_ms=200)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / (result.ms_median * 1e-3) / 1e9
