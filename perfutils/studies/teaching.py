"""Measure the teaching kernels of notebooks 06 (Triton basics) and 07 (fusion) on the GPU, and record them.

Each study writes ``<out>/<gpu-slug>/<study>.csv`` + ``.json`` through a :class:`~perfutils.measure.session.Session`
(one row per configuration, resumable, never overwriting unless ``overwrite=True``)::

    python -m perfutils teaching --out data/   # triton_basics.csv and fusion.csv, < 3 min on an H100

Timing is ``triton.testing.do_bench`` (median, p20, p80; L2 flushed before each call) through
:func:`perfutils.measure.timing.bench`; the first call (JIT compilation, autotuning) is timed separately and
excluded; every measured configuration is checked against a float64 PyTorch reference first. The kernels are in
:mod:`perfutils.lab_kernels.teaching`; the figures of these files in :mod:`perfutils.plots.teaching`.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import pandas as pd
import torch

from perfutils.lab_kernels.teaching.activations import (ACTIVATIONS, activation_code, activation_eager,
                                                        activation_reference, activation_torch_op, launch_activation)
from perfutils.lab_kernels.teaching.checks import check_power_of_two
from perfutils.lab_kernels.teaching.evonorm import evonorm_b0_torch, evonorm_config, launch_evonorm
from perfutils.lab_kernels.teaching.softmax import (naive_softmax, naive_softmax_bytes, softmax_bytes, softmax_config,
                                                    softmax_kernel)
from perfutils.lab_kernels.teaching.vector_add import (ADD_TILE_CONFIGS, add_kernel_autotuned, launch_add,
                                                       launch_add_autotuned, mask_stats)

from ..model.compiled_kernel import kernel_stats
from ..data import records
from ..data.schema import config_key, error_text
from ..measure.session import CudaBackend, Session, run_studies
from ..measure.timing import rel_err

__all__ = ["BASICS_STUDY", "FUSION_STUDY", "PRODUCER_COMMAND", "measure_basics", "measure_fusion", "run_all_gpu",
           "load_study", "main"]

BASICS_STUDY = "triton_basics"
FUSION_STUDY = "fusion"
PRODUCER_COMMAND = "python -m perfutils teaching --out data/"  # run on the GPU whose data is wanted


def load_study(data_dir: str | os.PathLike, gpu: str, study: str, producer: str = PRODUCER_COMMAND) -> pd.DataFrame:
    """Load ``<data_dir>/<slug of gpu>/<study>.csv`` (:func:`perfutils.data.records.load_study`); a missing file's
    message names ``producer``, by default this module's command."""
    return records.load_study(data_dir, gpu, study, producer)


def _randn(shape, *, device: str, seed: int, dtype=torch.float32) -> torch.Tensor:
    generator = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(shape, generator=generator, device=device, dtype=dtype)


def _timed_row(backend, run: Callable[[], Any], check: Callable[[Any], float], *, bytes_min: int, copy_gbps: float,
               tolerance: float, holder: dict | None = None, peak: bool = False, wall: bool = False,
               kernels: bool = False) -> dict[str, Any]:
    """First call (compile, excluded from timing) -> correctness -> do_bench -> optional extras."""
    result, compile_ms = backend.first_call(run)
    err = float(check(result))
    del result
    timing = backend.bench(run)
    ms = float(timing.ms_median)
    gbps = bytes_min / (ms * 1e-3) / 1e9 if ms > 0 else None
    status = "ok" if err <= tolerance else "wrong"
    row: dict[str, Any] = {
        "ms_median": ms,
        "ms_p20": float(timing.ms_p20),
        "ms_p80": float(timing.ms_p80),
        "bytes_min": int(bytes_min),
        "gbps": gbps,
        "pct_of_copy": 100.0 * gbps / copy_gbps if gbps is not None else None,
        "max_rel_err": err,
        "status": status,
        "error": None if status == "ok" else f"max_rel_err {err:.3g} above tolerance {tolerance:g}",
        "compile_ms": compile_ms,
    }
    row.update(kernel_stats(holder.get("compiled") if holder else None, getattr(backend, "cc", None)))
    if peak:
        row["peak_mem_bytes"] = backend.peak_bytes(run)
    if wall:
        row["wall_ms"] = backend.wall_ms(run)
    if kernels:
        try:
            row["n_kernels"] = backend.count_kernels(run)
        except Exception as exc:  # the profiler is a nicety here; never lose the timing for it
            row["n_kernels"] = None
            row["stats_error"] = (str(row.get("stats_error") or "") + f" n_kernels: {error_text(exc, 200)}").strip()
    return row


def _positive_ints(name: str, values: Iterable[Any]) -> list[int]:
    values = list(values)
    if not values or any(isinstance(v, bool) or not isinstance(v, int) or v <= 0 for v in values):
        raise ValueError(f"{name} must be a non-empty list of positive ints, got {values!r}")
    return values


def _config(loss: str, variant: str, tokens: int, vocab: int, block_size: int | None, num_warps: int | None,
            dtype: str = "fp32") -> dict[str, Any]:
    return {"loss": loss, "target_format": "none", "variant": variant, "dtype": dtype, "tokens": tokens,
            "vocab": vocab, "block_size": block_size, "num_warps": num_warps}


# ================================================================================================
# 06 - measurement
# ================================================================================================

DEFAULT_ADD_SIZES = tuple(2**k for k in range(12, 29))  # 4 Ki .. 256 Mi fp32 elements (3 GiB at the top)
DEFAULT_IRREGULAR_SIZES = (98_765, 987_654, 9_876_543, 98_765_432)
DEFAULT_TILE_SIZES = (2**16, 2**20, 2**24, 2**27)
DEFAULT_SOFTMAX_ROWS = 4096
DEFAULT_SOFTMAX_COLS = (128, 256, 512, 781, 1024, 2048, 3000, 4096, 6144, 8192, 12288, 16384)
TOLERANCE_ADD = 1e-6  # fp32 add is exact up to one rounding
TOLERANCE_SOFTMAX = 1e-5


def measure_basics(out_dir: str | os.PathLike = "data", *, sizes: Sequence[int] = DEFAULT_ADD_SIZES,
                   irregular_sizes: Sequence[int] = DEFAULT_IRREGULAR_SIZES,
                   tile_sizes: Sequence[int] = DEFAULT_TILE_SIZES,
                   tile_configs: Sequence[tuple[int, int]] = ADD_TILE_CONFIGS,
                   autotune: bool = True,
                   softmax_rows: int = DEFAULT_SOFTMAX_ROWS, softmax_cols: Sequence[int] = DEFAULT_SOFTMAX_COLS,
                   overwrite: bool = False, copy_gbps: float | None = None, seed: int = 0,
                   backend: Any = None, metadata: Mapping[str, Any] | None = None,
                   log: Callable[[str], Any] = print) -> Path:
    """Measure notebook 06's kernels and record ``<out_dir>/<gpu-slug>/triton_basics.csv``.

    Rows (column ``loss`` holds the experiment, ``variant`` the provider, ``vocab`` the elements or
    columns, ``tokens`` the rows):

    * ``vector_add`` / ``vector_add_irregular``: triton (BLOCK_SIZE 1024, 4 warps) and torch
      (``torch.add``) over ``sizes`` (powers of two) and ``irregular_sizes``;
    * ``add_tile``: every (BLOCK_SIZE, num_warps) of ``tile_configs`` at each of ``tile_sizes``;
    * ``add_autotune``: ``triton.autotune`` over the same configs at each of ``tile_sizes`` (its pick
      in block_size/num_warps; the tuning time in ``autotune_ms``);
    * ``softmax``: triton, torch (``torch.softmax``) and torch_naive (:func:`naive_softmax`) on
      ``softmax_rows`` x each of ``softmax_cols``.

    Bytes: add 12 B/element, softmax 8 B/element (fp32, the minimum); ``gbps`` = bytes / median time.
    Triton rows carry n_regs, spill_bytes, shared_bytes, occupancy, blocks_per_sm, limiter from the
    compiled kernel. Returns the CSV path.
    """
    sizes = _positive_ints("sizes", sizes)
    irregular_sizes = _positive_ints("irregular_sizes", irregular_sizes) if irregular_sizes else []
    tile_sizes = _positive_ints("tile_sizes", tile_sizes) if tile_sizes else []
    softmax_cols = _positive_ints("softmax_cols", softmax_cols) if softmax_cols else []
    for block, warps in tile_configs:
        check_power_of_two("tile block size", block, 16, 65536)
        check_power_of_two("tile num_warps", warps, 1, 32)
    for cols in softmax_cols:
        softmax_config(cols)
    backend = backend or CudaBackend(producer=PRODUCER_COMMAND)
    device = backend.device
    parameters = {"sizes": sizes, "irregular_sizes": irregular_sizes, "tile_sizes": tile_sizes,
                  "tile_configs": [list(c) for c in tile_configs], "autotune": autotune,
                  "softmax_rows": softmax_rows, "softmax_cols": softmax_cols, "seed": seed, "dtype": "fp32",
                  "warmup_ms": getattr(backend, "warmup_ms", None), "rep_ms": getattr(backend, "rep_ms", None)}
    session = Session(BASICS_STUDY, out_dir, backend, parameters=parameters, copy_gbps=copy_gbps,
                      metadata=metadata, overwrite=overwrite, log=log)
    copy = session.copy_gbps

    def add_inputs(n: int):
        x = _randn(n, device=device, seed=seed * 7919 + 1)
        y = _randn(n, device=device, seed=seed * 7919 + 2)
        reference = x.to(torch.float64) + y.to(torch.float64)
        return x, y, torch.empty_like(x), reference

    def triton_add(x, y, out, block, warps, holder):
        def run():
            holder["compiled"] = launch_add(x, y, out, block, warps)
            return out
        return run

    # ---- vector add: triton vs torch over sizes, regular and irregular ----------------------------
    for experiment, size_list in (("vector_add", sizes), ("vector_add_irregular", irregular_sizes)):
        for n in size_list:
            keys = [config_key(_config(experiment, v, 1, n, b, w)) for v, b, w in (("triton", 1024, 4), ("torch", None, None))]
            if all(k in session.done for k in keys):
                continue
            x, y, out, reference = add_inputs(n)
            check = lambda result: rel_err(result, reference)  # noqa: E731
            extra = {"n_elements": n, **{f"mask_{k}": v for k, v in mask_stats(n, 1024).items()
                                         if k in ("programs", "idle_lanes")}}
            holder: dict[str, Any] = {}
            session.record(_config(experiment, "triton", 1, n, 1024, 4),
                           lambda: _timed_row(backend, triton_add(x, y, out, 1024, 4, holder), check,
                                              bytes_min=12 * n, copy_gbps=copy, tolerance=TOLERANCE_ADD, holder=holder),
                           extra)
            session.record(_config(experiment, "torch", 1, n, None, None),
                           lambda: _timed_row(backend, lambda: torch.add(x, y, out=out), check,
                                              bytes_min=12 * n, copy_gbps=copy, tolerance=TOLERANCE_ADD),
                           extra)
            del x, y, out, reference
            backend.release()

    # ---- tile size x warps, then the autotuner over the same configurations ----------------------
    for n in tile_sizes:
        x = y = out = reference = None
        for block, warps in tile_configs:
            if config_key(_config("add_tile", "triton", 1, n, block, warps)) in session.done:
                continue
            if x is None:
                x, y, out, reference = add_inputs(n)
            holder = {}
            session.record(_config("add_tile", "triton", 1, n, block, warps),
                           lambda: _timed_row(backend, triton_add(x, y, out, block, warps, holder),
                                              lambda result: rel_err(result, reference), bytes_min=12 * n,
                                              copy_gbps=copy, tolerance=TOLERANCE_ADD, holder=holder),
                           {"n_elements": n})
        auto_key = config_key(_config("add_autotune", "triton_autotune", 1, n, None, None))
        if autotune and auto_key not in session.done:
            if x is None:
                x, y, out, reference = add_inputs(n)
            holder = {}

            def run_autotuned(x=x, y=y, out=out, holder=holder):
                holder["compiled"] = launch_add_autotuned(x, y, out)
                return out

            def measure_autotune(run=run_autotuned, reference=reference, n=n, holder=holder):
                row = _timed_row(backend, run, lambda result: rel_err(result, reference), bytes_min=12 * n,
                                 copy_gbps=copy, tolerance=TOLERANCE_ADD, holder=holder)
                best = getattr(add_kernel_autotuned, "best_config", None)
                row["autotune_ms"] = row.pop("compile_ms")  # the first call benchmarks every config
                if best is not None:
                    row["block_size"] = int(best.kwargs["BLOCK_SIZE"])
                    row["num_warps"] = int(best.num_warps)
                return row

            session.record(_config("add_autotune", "triton_autotune", 1, n, None, None), measure_autotune,
                           {"n_elements": n}, key=auto_key)
        del x, y, out, reference
        backend.release()

    # ---- softmax: fused triton vs torch vs the naive five-op version -----------------------------
    m = softmax_rows
    for n_cols in softmax_cols:
        block, warps = softmax_config(n_cols)
        configs = [("triton", block, warps), ("torch", None, None), ("torch_naive", None, None)]
        if all(config_key(_config("softmax", v, m, n_cols, b, w)) in session.done for v, b, w in configs):
            continue
        x = _randn((m, n_cols), device=device, seed=seed * 7919 + 3)
        reference = torch.softmax(x.to(torch.float64), dim=1)
        check = lambda result: rel_err(result, reference)  # noqa: E731
        out = torch.empty_like(x)
        holder = {}

        def run_triton(x=x, out=out, block=block, warps=warps, holder=holder):
            holder["compiled"] = softmax_kernel[(x.shape[0],)](out, x, x.stride(0), out.stride(0), x.shape[1],
                                                               BLOCK_SIZE=block, num_warps=warps)
            return out

        extra = {"n_elements": m * n_cols, "naive_bytes": naive_softmax_bytes(m, n_cols)}
        runs = {"triton": (run_triton, holder), "torch": (lambda x=x: torch.softmax(x, dim=1), None),
                "torch_naive": (lambda x=x: naive_softmax(x), None)}
        for variant, b, w in configs:
            run, h = runs[variant]
            session.record(_config("softmax", variant, m, n_cols, b, w),
                           lambda run=run, h=h: _timed_row(backend, run, check, bytes_min=softmax_bytes(m, n_cols),
                                                           copy_gbps=copy, tolerance=TOLERANCE_SOFTMAX, holder=h),
                           extra)
        del x, out, reference, runs, holder, run_triton
        backend.release()
    return session.finish()


# ================================================================================================
# 07 - measurement
# ================================================================================================

DEFAULT_FUSION_SIZES = tuple(2**k for k in range(10, 29, 2))  # 1 Ki .. 256 Mi elements
DEFAULT_EVONORM_BATCHES = (1, 4, 16, 64, 256, 1024, 4096, 8192)  # x (32 channels x 32 x 32): 2^15 .. 2^28 elements
EVONORM_SHAPE = {"channels": 32, "groups": 8, "height": 32, "width": 32}
EVONORM_EPS = 1e-5
TOLERANCE_ACTIVATION = 1e-5
TOLERANCE_EVONORM = 1e-4


def _evonorm_params(channels: int, device: str, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator(device=device).manual_seed(seed)
    v = 1.0 + 0.1 * torch.randn(channels, generator=generator, device=device)
    gamma = 1.0 + 0.1 * torch.randn(channels, generator=generator, device=device)
    beta = 0.1 * torch.randn(channels, generator=generator, device=device)
    return v, gamma, beta


def measure_fusion(out_dir: str | os.PathLike = "data", *, sizes: Sequence[int] = DEFAULT_FUSION_SIZES,
                   activations: Sequence[str] = tuple(ACTIVATIONS),
                   evonorm_batches: Sequence[int] = DEFAULT_EVONORM_BATCHES,
                   evonorm_shape: Mapping[str, int] = EVONORM_SHAPE,
                   overwrite: bool = False, copy_gbps: float | None = None, seed: int = 0,
                   backend: Any = None, metadata: Mapping[str, Any] | None = None,
                   log: Callable[[str], Any] = print) -> Path:
    """Measure notebook 07's unfused vs fused kernels and record ``<out_dir>/<gpu-slug>/fusion.csv``.

    For each activation (``loss`` column) and size (``vocab`` = elements, fp32): variants ``eager``
    (:func:`activation_eager`), ``torch_op`` (:func:`activation_torch_op`) and ``triton``
    (:func:`activation`, BLOCK_SIZE 1024, 4 warps). For ``evonorm_b0``: ``eager``
    (:func:`evonorm_b0_torch`) and ``triton`` (:func:`evonorm_b0`) over ``evonorm_batches`` samples
    (``tokens``) of ``evonorm_shape``. Each row: do_bench median/p20/p80, GB/s of the minimal traffic
    (read x + write y: 8 B/element), ``wall_ms`` (host loop, launch cost included),
    ``peak_mem_bytes`` (peak allocated above the inputs during one call), ``n_kernels`` (kernels one
    call launches, from torch.profiler), compile time and the checks against float64.
    """
    sizes = _positive_ints("sizes", sizes)
    for name in activations:
        activation_code(name)
    evonorm_batches = _positive_ints("evonorm_batches", evonorm_batches) if evonorm_batches else []
    shape = dict(EVONORM_SHAPE, **dict(evonorm_shape))
    channels, groups = int(shape["channels"]), int(shape["groups"])
    spatial = int(shape["height"]) * int(shape["width"])
    if evonorm_batches:
        if channels % groups:
            raise ValueError(f"evonorm_shape: groups={groups} must divide channels={channels}")
        evonorm_config(channels, groups, spatial, None)
    backend = backend or CudaBackend(producer=PRODUCER_COMMAND)
    device = backend.device
    parameters = {"sizes": sizes, "activations": list(activations), "evonorm_batches": evonorm_batches,
                  "evonorm_shape": shape, "evonorm_eps": EVONORM_EPS, "seed": seed, "dtype": "fp32",
                  "triton_block_size": 1024, "triton_num_warps": 4,
                  "warmup_ms": getattr(backend, "warmup_ms", None), "rep_ms": getattr(backend, "rep_ms", None)}
    session = Session(FUSION_STUDY, out_dir, backend, parameters=parameters, copy_gbps=copy_gbps,
                      metadata=metadata, overwrite=overwrite, log=log)
    copy = session.copy_gbps
    counted: dict[tuple[str, str], int | None] = {}  # kernels per call do not depend on the size: count once

    def measure(run, check, bytes_min, tolerance, holder, count_key):
        row = _timed_row(backend, run, check, bytes_min=bytes_min, copy_gbps=copy, tolerance=tolerance,
                         holder=holder, peak=True, wall=True, kernels=count_key not in counted)
        if count_key in counted:
            row["n_kernels"] = counted[count_key]
        else:
            counted[count_key] = row.get("n_kernels")
        return row

    for name in activations:
        for n in sizes:
            configs = {"eager": (None, None), "torch_op": (None, None), "triton": (1024, 4)}
            if all(config_key(_config(name, v, 1, n, b, w)) in session.done for v, (b, w) in configs.items()):
                continue
            x = _randn(n, device=device, seed=seed * 7919 + 11)
            reference = activation_reference(x, name)
            check = lambda result: rel_err(result, reference)  # noqa: E731
            holder: dict[str, Any] = {}

            # Like the PyTorch variants, the Triton one allocates its output on every call, so that
            # time and peak memory compare like with like.
            def run_triton_alloc(x=x, name=name, holder=holder):
                result = torch.empty_like(x)
                holder["compiled"] = launch_activation(x, result, name, 1024, 4)
                return result

            runs = {"eager": (lambda x=x, name=name: activation_eager(x, name), None),
                    "torch_op": (lambda x=x, name=name: activation_torch_op(x, name), None),
                    "triton": (run_triton_alloc, holder)}
            for variant, (b, w) in configs.items():
                run, h = runs[variant]
                session.record(_config(name, variant, 1, n, b, w),
                               lambda run=run, h=h, variant=variant: measure(run, check, 8 * n, TOLERANCE_ACTIVATION,
                                                                             h, (name, variant)),
                               {"n_elements": n})
            del x, reference, runs, holder, run_triton_alloc
            backend.release()

    if evonorm_batches:
        v, gamma, beta = _evonorm_params(channels, device, seed * 7919 + 13)
        v64, gamma64, beta64 = (p.to(torch.float64) for p in (v, gamma, beta))
        _, block_c, block_l, warps = evonorm_config(channels, groups, spatial, None)
        for batch in evonorm_batches:
            n = batch * channels * spatial
            configs = {"eager": (None, None), "triton": (block_c * block_l, warps)}
            if all(config_key(_config("evonorm_b0", v_, batch, channels * spatial, b, w)) in session.done
                   for v_, (b, w) in configs.items()):
                continue
            x = _randn((batch, channels, int(shape["height"]), int(shape["width"])), device=device, seed=seed * 7919 + 17)
            reference = evonorm_b0_torch(x.to(torch.float64), v64, gamma64, beta64, groups=groups, eps=EVONORM_EPS)
            check = lambda result: rel_err(result, reference)  # noqa: E731
            holder = {}

            def run_triton(x=x, holder=holder):
                result = torch.empty_like(x)
                holder["compiled"] = launch_evonorm(x, result, v, gamma, beta, groups, EVONORM_EPS, None)
                return result

            runs = {"eager": (lambda x=x: evonorm_b0_torch(x, v, gamma, beta, groups=groups, eps=EVONORM_EPS), None),
                    "triton": (run_triton, holder)}
            extra = {"n_elements": n, "channels": channels, "groups": groups, "spatial": spatial}
            for variant, (b, w) in configs.items():
                run, h = runs[variant]
                session.record(_config("evonorm_b0", variant, batch, channels * spatial, b, w),
                               lambda run=run, h=h, variant=variant: measure(run, check, 8 * n, TOLERANCE_EVONORM, h,
                                                                             ("evonorm_b0", variant)),
                               extra)
            del x, reference, runs, holder, run_triton
            backend.release()
    return session.finish()


def run_all_gpu(out_dir: str | os.PathLike = "data", *, overwrite: bool = False, only: Sequence[str] = ("basics", "fusion"),
                log: Callable[[str], Any] = print) -> list[Path]:
    """Everything notebooks 06 and 07 replay: ``triton_basics.csv`` and ``fusion.csv`` under ``out_dir``."""
    measures = {"basics": measure_basics, "fusion": measure_fusion}
    return run_studies([functools.partial(measures[name], out_dir, overwrite=overwrite) for name in measures
                        if name in only], PRODUCER_COMMAND, log)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m perfutils teaching",
        description="Measure notebooks 06/07's kernels on this GPU: <out>/<gpu-slug>/triton_basics.csv and fusion.csv.",
    )
    parser.add_argument("--out", default="data", help="data directory (default: data)")
    parser.add_argument("--only", nargs="+", choices=("basics", "fusion"), default=("basics", "fusion"),
                        help="which studies to measure (default: both)")
    parser.add_argument("--overwrite", action="store_true",
                        help="start new files (old ones are renamed <study>.replaced-<time>.csv, never deleted)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: no CUDA GPU is available; these measurements only run on a GPU", file=sys.stderr)
        return 2
    run_all_gpu(args.out, overwrite=args.overwrite, only=tuple(args.only))
    return 0

