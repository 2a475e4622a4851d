"""Measure a GPU's ceilings: what a kernel can actually reach, timed with ``triton.testing.do_bench``.

Each ceiling is a micro-benchmark kernel of :mod:`perfutils.lab_kernels.microbench` (plus ``torch`` copy as a reference),
timed with median and 20th/80th percentiles, L2 flushed before every run:

=================  ==========================================================================
dram_copy_torch    ``dst.copy_(src)``, 1 GiB fp32; bytes = read + written
dram_copy_triton   the same copy as a Triton kernel
dram_read          read a 1 GiB buffer and reduce it, one fp32 partial sum written per program
l2_read            re-read a 16 MiB buffer (fits in L2) ``passes`` times inside one kernel
fp32_fma           four independent FMA chains per element in registers (FMA = 2 flops)
exp2               four independent ``exp2`` chains per element (MUFU.EX2 throughput)
=================  ==========================================================================

The result is a tidy DataFrame (:func:`measure_ceilings`, written by :func:`write_ceilings`) that
:func:`perfutils.model.roofline.ceilings_from_records` turns into ``Ceilings``. Importing this module needs no
GPU; measuring does.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import torch
import triton

from perfutils.lab_kernels.microbench import (FMA_CHAINS, check_positive_int, launch_copy, launch_exp2, launch_fma,
                                              launch_l2_read, launch_read_sum, read_sum_programs)

from ..model.occupancy import occupancy_of_compiled
from ..data.store import write_table

__all__ = ["COLUMNS", "measure_ceilings", "write_ceilings", "measure_copy_torch", "measure_copy_triton", "measure_read",
           "measure_l2_read", "measure_fp32_fma", "measure_exp2"]

COLUMNS = ["ceiling", "value", "unit", "ms_median", "ms_p20", "ms_p80", "bytes", "ops", "params",
           "gpu_name"]


_QUANTILES = [0.5, 0.2, 0.8]


def _bench(fn, warmup_ms: float, rep_ms: float) -> tuple[float, float, float]:
    """(median, p20, p80) in ms. With ``quantiles`` do_bench returns them and ignores
    ``return_mode``; it is passed anyway so the intent (median) reads at the call."""
    median, p20, p80 = triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms,
                                               quantiles=_QUANTILES, return_mode="median")
    return float(median), float(p20), float(p80)


def _row(ceiling: str, unit: str, timing, nbytes: int, ops: int, params: dict, gpu: str) -> dict:
    median, p20, p80 = timing
    seconds = median * 1e-3
    if unit == "GB/s":
        value = nbytes / seconds / 1e9
    else:  # TFLOP/s or Tops/s
        value = ops / seconds / 1e12
    return {"ceiling": ceiling, "value": value, "unit": unit, "ms_median": median, "ms_p20": p20,
            "ms_p80": p80, "bytes": int(nbytes), "ops": int(ops),
            "params": json.dumps(params, sort_keys=True), "gpu_name": gpu}


def _resident_programs(compiled, sm_count: int, fallback_per_sm: int) -> int:
    """Programs that fill every SM exactly once (one wave), from the compiled kernel's
    registers and shared memory; ``fallback_per_sm`` x SMs if Triton's attributes are missing."""
    try:
        return occupancy_of_compiled(compiled).blocks_per_sm * sm_count
    except (ValueError, TypeError, AttributeError):
        return fallback_per_sm * sm_count


def _cuda_device(device) -> torch.device:
    if not torch.cuda.is_available():
        raise RuntimeError("measure_ceilings needs a CUDA GPU: torch.cuda.is_available() is False "
                           "(replay committed ceilings with perfutils.model.roofline.ceilings_from_records)")
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"device: expected a CUDA device, got {device}")
    return device


def measure_copy_torch(device, *, nbytes: int, warmup_ms: float, rep_ms: float, gpu: str) -> dict:
    n = nbytes // 4
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    timing = _bench(lambda: dst.copy_(src), warmup_ms, rep_ms)
    return _row("dram_copy_torch", "GB/s", timing, 2 * n * 4, 0,
                {"n_elements": n, "dtype": "float32"}, gpu)


def measure_copy_triton(device, *, nbytes: int, warmup_ms: float, rep_ms: float, gpu: str,
                        block_size: int = 4096, num_warps: int = 8) -> dict:
    n = nbytes // 4
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    launch_copy(src, dst, block_size=block_size, num_warps=num_warps)
    if not torch.equal(src, dst):
        raise RuntimeError("copy_kernel did not copy its input")
    timing = _bench(lambda: launch_copy(src, dst, block_size=block_size, num_warps=num_warps),
                    warmup_ms, rep_ms)
    return _row("dram_copy_triton", "GB/s", timing, 2 * n * 4, 0,
                {"n_elements": n, "dtype": "float32", "block_size": block_size,
                 "num_warps": num_warps}, gpu)


def measure_read(device, *, nbytes: int, warmup_ms: float, rep_ms: float, gpu: str,
                 tiles: int = 8, block_size: int = 4096, num_warps: int = 8) -> dict:
    n = nbytes // 4
    src = torch.rand(n, device=device) + 0.5  # positive: the sum check is well conditioned
    programs = read_sum_programs(n, tiles=tiles, block_size=block_size)
    partial = torch.empty(programs, device=device)

    def run():
        launch_read_sum(src, partial, tiles=tiles, block_size=block_size, num_warps=num_warps)

    run()
    expected = src.double().sum()
    if not torch.allclose(partial.double().sum(), expected, rtol=1e-4):
        raise RuntimeError("read_sum_kernel's partial sums do not add up to the input's sum")
    timing = _bench(run, warmup_ms, rep_ms)
    return _row("dram_read", "GB/s", timing, n * 4 + programs * 4, 0,
                {"n_elements": n, "dtype": "float32", "tiles": tiles, "block_size": block_size,
                 "num_warps": num_warps, "programs": programs}, gpu)


def measure_l2_read(device, *, nbytes: int, passes: int, warmup_ms: float, rep_ms: float,
                    gpu: str, sm_count: int, block_size: int = 2048, num_warps: int = 4) -> dict:
    n = nbytes // 4 // block_size * block_size
    src = torch.rand(n, device=device) + 0.5
    out = torch.empty(sm_count, device=device)
    compiled = launch_l2_read(src, out, passes=1, block_size=block_size, num_warps=num_warps)
    programs = _resident_programs(compiled, sm_count, fallback_per_sm=8)
    out = torch.empty(programs, device=device)

    def run():
        launch_l2_read(src, out, passes=passes, block_size=block_size, num_warps=num_warps)

    timing = _bench(run, warmup_ms, rep_ms)
    # L2 traffic: every program reads one block per pass (the first touch after do_bench's L2
    # flush comes from DRAM: nbytes once, negligible against passes x the buffer).
    read_bytes = programs * passes * block_size * 4
    return _row("l2_read", "GB/s", timing, read_bytes + programs * 4, 0,
                {"buffer_bytes": n * 4, "passes": passes, "block_size": block_size,
                 "num_warps": num_warps, "programs": programs}, gpu)


def _measure_chains(name: str, unit: str, launch, ops_per_step: int, device, *, iters: int, warmup_ms: float,
                    rep_ms: float, gpu: str, sm_count: int, block_size: int, unroll: int, num_warps: int,
                    **constants) -> dict:
    """FMA_CHAINS dependent chains per element of ``launch`` (one program per resident slot), timed."""
    x = torch.rand(sm_count * block_size, device=device)
    out = torch.empty_like(x)
    compiled = launch(x, out, iters=1, block_size=block_size, unroll=unroll, num_warps=num_warps, **constants)
    programs = _resident_programs(compiled, sm_count, fallback_per_sm=8)
    x = torch.rand(programs * block_size, device=device)
    out = torch.empty_like(x)
    timing = _bench(lambda: launch(x, out, iters=iters, block_size=block_size, unroll=unroll, num_warps=num_warps,
                                   **constants), warmup_ms, rep_ms)
    ops = ops_per_step * FMA_CHAINS * unroll * iters * x.numel()
    return _row(name, unit, timing, 2 * x.numel() * 4, ops,
                {"iters": iters, "unroll": unroll, "chains": FMA_CHAINS, "block_size": block_size,
                 "num_warps": num_warps, "programs": programs}, gpu)


def measure_fp32_fma(device, *, iters: int, warmup_ms: float, rep_ms: float, gpu: str,
                     sm_count: int, block_size: int = 1024, unroll: int = 8,
                     num_warps: int = 4) -> dict:
    # mul < 1 and a small add keep every chain finite and away from denormals; an FMA is two flops.
    return _measure_chains("fp32_fma", "TFLOP/s", launch_fma, 2, device, iters=iters, warmup_ms=warmup_ms,
                           rep_ms=rep_ms, gpu=gpu, sm_count=sm_count, block_size=block_size, unroll=unroll,
                           num_warps=num_warps, mul=0.999, add=0.001)


def measure_exp2(device, *, iters: int, warmup_ms: float, rep_ms: float, gpu: str,
                 sm_count: int, block_size: int = 1024, unroll: int = 8,
                 num_warps: int = 4) -> dict:
    return _measure_chains("exp2", "Tops/s", launch_exp2, 1, device, iters=iters, warmup_ms=warmup_ms, rep_ms=rep_ms,
                           gpu=gpu, sm_count=sm_count, block_size=block_size, unroll=unroll, num_warps=num_warps)


def measure_ceilings(device="cuda", *, copy_bytes: int = 1 << 30, l2_bytes: int | None = None,
                     l2_passes: int = 512, fma_iters: int = 1024, exp2_iters: int = 128,
                     warmup_ms: float = 25, rep_ms: float = 100) -> pd.DataFrame:
    """Measure every ceiling on ``device``; one row per ceiling (columns ``COLUMNS``).

    ``copy_bytes`` sizes the DRAM buffers (default 1 GiB, far above any L2). ``l2_bytes`` defaults
    to 16 MiB or half the L2, whichever is smaller. The iteration counts give ~1 ms per run on an
    H100. Raises RuntimeError without CUDA.
    """
    device = _cuda_device(device)
    for name, value in (("copy_bytes", copy_bytes), ("l2_passes", l2_passes),
                        ("fma_iters", fma_iters), ("exp2_iters", exp2_iters)):
        check_positive_int(name, value)
    props = torch.cuda.get_device_properties(device)
    gpu = props.name
    sm_count = props.multi_processor_count
    if l2_bytes is None:
        l2_bytes = min(16 << 20, getattr(props, "L2_cache_size", 32 << 20) // 2)
    check_positive_int("l2_bytes", l2_bytes)
    common = dict(warmup_ms=warmup_ms, rep_ms=rep_ms, gpu=gpu)
    with torch.cuda.device(device):
        rows = [
            measure_copy_torch(device, nbytes=copy_bytes, **common),
            measure_copy_triton(device, nbytes=copy_bytes, **common),
            measure_read(device, nbytes=copy_bytes, **common),
            measure_l2_read(device, nbytes=l2_bytes, passes=l2_passes, sm_count=sm_count,
                            **common),
            measure_fp32_fma(device, iters=fma_iters, sm_count=sm_count, **common),
            measure_exp2(device, iters=exp2_iters, sm_count=sm_count, **common),
        ]
    return pd.DataFrame(rows, columns=COLUMNS)


def write_ceilings(df: pd.DataFrame, path, metadata: dict | None = None) -> Path:
    """Write the ceilings table to ``path`` (CSV) and a JSON sidecar beside it, atomically.

    The sidecar holds ``gpu_name`` (taken from the table) plus ``metadata``; ``ceilings_from_records``
    reads both.
    """
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"df: expected a DataFrame, got {type(df).__name__}")
    missing = set(COLUMNS) - set(df.columns)
    if missing:
        raise ValueError(f"df: missing columns {sorted(missing)}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    gpus = sorted({str(g) for g in df["gpu_name"].dropna()})
    if len(gpus) > 1:
        raise ValueError(f"df: ceilings of several GPUs in one table: {gpus}")
    sidecar = {"gpu_name": gpus[0] if gpus else None, **(metadata or {})}
    write_table(df, path, sidecar, overwrite=True)
    return path
