"""Teaching kernels for notebooks 06 (Triton basics) and 07 (fusion), their GPU measurements and plots.

The kernels are deliberately small and commented line by line; the notebooks display their source
(``kernel_source``) instead of defining them. Everything here is written for this project.

* 06: ``add_kernel`` (vector add with a boundary mask), ``add_kernel_autotuned`` (the same kernel
  wrapped in ``triton.autotune``), ``softmax_kernel`` (one program per row, the row kept on chip).
* 07: ``activation_kernel`` (ReLU / sigmoid / swish in one pass) and ``evonorm_b0_kernel`` (a
  normalisation + activation fused into one pass, defined in :func:`evonorm_b0_torch`).

Measurements (GPU only; each writes ``<out>/<gpu-slug>/<study>.csv`` + ``.json`` through
:class:`perfutils.records.ResultStore`, one row per configuration, resumable, never overwriting
unless ``overwrite=True``)::

    python -m perfutils.teaching --out data/        # triton_basics.csv and fusion.csv, < 3 min on an H100

Timing is ``triton.testing.do_bench`` (median, p20, p80; L2 flushed before each call) through
:func:`perfutils.timing.bench`; the first call (JIT compilation, autotuning) is timed separately and
excluded; every measured configuration is checked against a float64 PyTorch reference first.
"""

from __future__ import annotations

import argparse
import gc
import inspect
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import pandas as pd
import torch
import triton
import triton.language as tl

from .records import ResultStore, check_single_gpu, config_key, data_path, error_text, gpu_slug, load_records
from .timing import BenchResult, rel_err

__all__ = [
    "add_kernel",
    "add_kernel_autotuned",
    "softmax_kernel",
    "activation_kernel",
    "evonorm_b0_kernel",
    "ADD_TILE_CONFIGS",
    "ACTIVATIONS",
    "add",
    "add_autotuned",
    "mask_stats",
    "softmax",
    "softmax_config",
    "naive_softmax",
    "softmax_bytes",
    "naive_softmax_bytes",
    "activation",
    "activation_eager",
    "activation_torch_op",
    "activation_reference",
    "activation_byte_model",
    "evonorm_b0",
    "evonorm_b0_torch",
    "kernel_source",
    "kernel_stats",
    "CudaBackend",
    "measure_basics",
    "measure_fusion",
    "run_all_gpu",
    "resolve_path",
    "resolve_mode",
    "load_study",
    "plot_vector_add",
    "plot_tile_sweep",
    "plot_tile_occupancy",
    "plot_softmax",
    "plot_fusion_latency",
    "plot_fusion_throughput",
    "plot_fusion_memory",
]

BASICS_STUDY = "triton_basics"
FUSION_STUDY = "fusion"
PRODUCER_COMMAND = "python -m perfutils.teaching --out data/"  # run on the GPU whose data is wanted

# ================================================================================================
# 06 - vector add
# ================================================================================================


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    """out[i] = x[i] + y[i] for i < n_elements; program p handles [p*BLOCK_SIZE, (p+1)*BLOCK_SIZE)."""
    pid = tl.program_id(axis=0)  # which tile this program owns (grid = cdiv(n, BLOCK_SIZE))
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)  # BLOCK_SIZE element indices, one per lane
    mask = offsets < n_elements  # False on the lanes of the last tile that fall past the end
    x = tl.load(x_ptr + offsets, mask=mask)  # masked lanes read nothing
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + y, mask=mask)  # ...and write nothing


# The tile-size study: every BLOCK_SIZE from 256 to 4096 with 1-8 warps (20 configurations). The
# same list is what the autotuner below chooses from.
ADD_TILE_CONFIGS: tuple[tuple[int, int], ...] = tuple(
    (block, warps) for block in (256, 512, 1024, 2048, 4096) for warps in (1, 2, 4, 8)
)

# triton.autotune benchmarks every config the first time it sees a new value of the key
# (here n_elements) and reuses the fastest one afterwards; ``best_config`` records the choice.
add_kernel_autotuned = triton.autotune(
    configs=[triton.Config({"BLOCK_SIZE": block}, num_warps=warps) for block, warps in ADD_TILE_CONFIGS],
    key=["n_elements"],
)(add_kernel)


def _check_vector_pair(x: torch.Tensor, y: torch.Tensor, out: torch.Tensor | None) -> None:
    for name, t in (("x", x), ("y", y)) + ((("out", out),) if out is not None else ()):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous (the kernel indexes it as a flat array)")
    for name, t in (("y", y), ("out", out)):
        if t is not None and (t.shape != x.shape or t.dtype != x.dtype or t.device != x.device):
            raise ValueError(
                f"{name} must match x in shape, dtype and device: x {tuple(x.shape)} {x.dtype} {x.device}, "
                f"{name} {tuple(t.shape)} {t.dtype} {t.device}"
            )
    if x.numel() >= 2**31:
        raise ValueError(f"x has {x.numel()} elements; these teaching kernels use 32-bit offsets (< 2**31)")


def _check_power_of_two(name: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or value > high or value & (value - 1):
        raise ValueError(f"{name} must be a power of two in [{low}, {high}], got {value!r}")
    return value


def _launch_add(x, y, out, block_size: int, num_warps: int):
    n = x.numel()
    grid = (triton.cdiv(n, block_size),)
    return add_kernel[grid](x, y, out, n, BLOCK_SIZE=block_size, num_warps=num_warps)


def add(x: torch.Tensor, y: torch.Tensor, out: torch.Tensor | None = None, *, block_size: int = 1024,
        num_warps: int = 4) -> torch.Tensor:
    """``x + y`` with :func:`add_kernel` (any shape, contiguous; one program per BLOCK_SIZE elements)."""
    _check_vector_pair(x, y, out)
    _check_power_of_two("block_size", block_size, 16, 65536)
    _check_power_of_two("num_warps", num_warps, 1, 32)
    out = torch.empty_like(x) if out is None else out
    if x.numel():
        _launch_add(x, y, out, block_size, num_warps)
    return out


def _launch_add_autotuned(x, y, out):
    n = x.numel()
    return add_kernel_autotuned[lambda meta: (triton.cdiv(n, meta["BLOCK_SIZE"]),)](x, y, out, n)


def add_autotuned(x: torch.Tensor, y: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``x + y`` with the autotuned kernel (GPU only: the autotuner times configs with CUDA events)."""
    _check_vector_pair(x, y, out)
    out = torch.empty_like(x) if out is None else out
    if x.numel():
        _launch_add_autotuned(x, y, out)
    return out


def mask_stats(n_elements: int, block_size: int) -> dict[str, Any]:
    """How a 1-D problem of ``n_elements`` splits into tiles of ``block_size`` lanes.

    Returns programs (the grid), full_programs, lanes_in_last (active lanes of the last tile),
    idle_lanes (lanes masked off) and idle_fraction (idle lanes / all launched lanes).
    """
    if isinstance(n_elements, bool) or not isinstance(n_elements, int) or n_elements <= 0:
        raise ValueError(f"n_elements must be a positive int, got {n_elements!r}")
    _check_power_of_two("block_size", block_size, 1, 1 << 20)
    programs = -(-n_elements // block_size)
    lanes = programs * block_size
    last = n_elements - (programs - 1) * block_size
    return {
        "n_elements": n_elements,
        "block_size": block_size,
        "programs": programs,
        "full_programs": n_elements // block_size,
        "lanes_in_last": last,
        "idle_lanes": lanes - n_elements,
        "idle_fraction": (lanes - n_elements) / lanes,
    }


# ================================================================================================
# 06 - fused row-wise softmax
# ================================================================================================


@triton.jit
def softmax_kernel(out_ptr, in_ptr, in_row_stride, out_row_stride, n_cols, BLOCK_SIZE: tl.constexpr):
    """softmax of one row per program; BLOCK_SIZE >= n_cols so the whole row lives in registers."""
    row = tl.program_id(axis=0)  # grid = (n_rows,)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols  # BLOCK_SIZE is a power of two; the row usually is not
    # Masked lanes read -inf: they cannot win the max and exp(-inf) = 0 adds nothing to the sum.
    x = tl.load(in_ptr + row * in_row_stride + cols, mask=mask, other=-float("inf")).to(tl.float32)
    x = x - tl.max(x, axis=0)  # subtract the row max: exp never overflows (softmax is shift-invariant)
    numerator = tl.exp(x)
    denominator = tl.sum(numerator, axis=0)
    y = numerator / denominator
    tl.store(out_ptr + row * out_row_stride + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def softmax_config(n_cols: int) -> tuple[int, int]:
    """(BLOCK_SIZE, num_warps) for :func:`softmax`: the next power of two >= n_cols, and enough warps
    that each thread holds at most 32 values (so the row fits in registers without spilling)."""
    if isinstance(n_cols, bool) or not isinstance(n_cols, int) or n_cols <= 0:
        raise ValueError(f"n_cols must be a positive int, got {n_cols!r}")
    block = triton.next_power_of_2(n_cols)
    if block > 16384:
        raise ValueError(f"n_cols={n_cols}: this one-row-per-program teaching kernel supports rows up to 16384 columns")
    num_warps = min(16, max(4, block // (32 * 32)))
    return block, num_warps


def softmax(x: torch.Tensor, *, num_warps: int | None = None) -> torch.Tensor:
    """Row-wise softmax of a 2-D tensor with :func:`softmax_kernel` (rows may be strided)."""
    if not isinstance(x, torch.Tensor) or x.ndim != 2:
        raise ValueError(f"x must be a 2-D torch.Tensor, got {getattr(x, 'shape', type(x).__name__)}")
    if x.stride(1) != 1:
        raise ValueError("x must have contiguous rows (stride 1 along the last dimension)")
    n_rows, n_cols = x.shape
    block, default_warps = softmax_config(n_cols)
    num_warps = default_warps if num_warps is None else _check_power_of_two("num_warps", num_warps, 1, 32)
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    if n_rows:
        softmax_kernel[(n_rows,)](out, x, x.stride(0), out.stride(0), n_cols, BLOCK_SIZE=block, num_warps=num_warps)
    return out


def naive_softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax over rows written as five separate PyTorch ops (each one a kernel reading/writing DRAM).

    Traffic in elements for an M x N input: max reads MN, writes M; the subtraction reads MN + M,
    writes MN; exp reads MN, writes MN; the sum reads MN, writes M; the division reads MN + M,
    writes MN. In all 5MN + 2M read and 3MN + 2M written, against MN + MN for one fused pass.
    """
    row_max = x.max(dim=1, keepdim=True).values
    shifted = x - row_max
    numerator = torch.exp(shifted)
    denominator = numerator.sum(dim=1, keepdim=True)
    return numerator / denominator


def softmax_bytes(n_rows: int, n_cols: int, element_bytes: int = 4) -> int:
    """Minimal DRAM traffic of a softmax: read the input once, write the output once."""
    return 2 * n_rows * n_cols * element_bytes


def naive_softmax_bytes(n_rows: int, n_cols: int, element_bytes: int = 4) -> int:
    """Traffic of :func:`naive_softmax` (see its docstring): (8MN + 4M) elements."""
    return (8 * n_rows * n_cols + 4 * n_rows) * element_bytes


# ================================================================================================
# 07 - element-wise activations
# ================================================================================================

ACTIVATIONS = {"relu": 0, "sigmoid": 1, "swish": 2}


@triton.jit
def activation_kernel(x_ptr, out_ptr, n_elements, ACTIVATION: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """out = f(x) in one pass: f is ReLU (0), sigmoid (1) or swish x*sigmoid(x) (2), chosen at compile time."""
    pid = tl.program_id(axis=0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask).to(tl.float32)  # compute in fp32 whatever the storage type
    if ACTIVATION == 0:  # a constexpr test: the compiler keeps only the chosen branch
        y = tl.maximum(x, 0.0)
    elif ACTIVATION == 1:
        y = 1.0 / (1.0 + tl.exp(-x))
    else:
        y = x / (1.0 + tl.exp(-x))  # x * sigmoid(x) without a second temporary
    tl.store(out_ptr + offsets, y.to(out_ptr.dtype.element_ty), mask=mask)


def _activation_code(name: str) -> int:
    if name not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {list(ACTIVATIONS)}, got {name!r}")
    return ACTIVATIONS[name]


def _launch_activation(x, out, name: str, block_size: int, num_warps: int):
    n = x.numel()
    return activation_kernel[(triton.cdiv(n, block_size),)](
        x, out, n, ACTIVATION=_activation_code(name), BLOCK_SIZE=block_size, num_warps=num_warps
    )


def activation(x: torch.Tensor, name: str, *, out: torch.Tensor | None = None, block_size: int = 1024,
               num_warps: int = 4) -> torch.Tensor:
    """Fused Triton activation ``name`` (relu | sigmoid | swish) of a contiguous tensor."""
    _activation_code(name)
    _check_vector_pair(x, x, out)
    _check_power_of_two("block_size", block_size, 16, 65536)
    _check_power_of_two("num_warps", num_warps, 1, 32)
    out = torch.empty_like(x) if out is None else out
    if x.numel():
        _launch_activation(x, out, name, block_size, num_warps)
    return out


def activation_eager(x: torch.Tensor, name: str) -> torch.Tensor:
    """The activation as written from its formula with elementary PyTorch ops (one kernel per op).

    relu = clamp_min(x, 0) (already one op); sigmoid = reciprocal(exp(-x) + 1) (neg, exp, add,
    reciprocal: 4 kernels); swish = x * sigmoid(x) (2 kernels).
    """
    code = _activation_code(name)
    if code == 0:
        return torch.clamp_min(x, 0.0)
    if code == 1:
        return torch.reciprocal(torch.add(torch.exp(torch.neg(x)), 1.0))
    return torch.mul(x, torch.sigmoid(x))


def activation_torch_op(x: torch.Tensor, name: str) -> torch.Tensor:
    """PyTorch's own single-kernel op: torch.relu, torch.sigmoid, torch.nn.functional.silu."""
    code = _activation_code(name)
    if code == 0:
        return torch.relu(x)
    if code == 1:
        return torch.sigmoid(x)
    return torch.nn.functional.silu(x)


def activation_reference(x: torch.Tensor, name: str) -> torch.Tensor:
    """The activation in float64 (the ground truth of the checks)."""
    code = _activation_code(name)
    x64 = x.detach().to(torch.float64)
    if code == 0:
        return torch.clamp_min(x64, 0.0)
    sigmoid = 1.0 / (1.0 + torch.exp(-x64))
    return sigmoid if code == 1 else x64 * sigmoid


# (kernels, bytes per element moved, temporaries alive at the peak incl. the output) for fp32 data:
# each elementary op reads its operands and writes one full-size result.
_EAGER_MODEL = {
    "relu": (1, 8, 1),  # clamp_min: read 4, write 4
    "sigmoid": (4, 32, 2),  # neg, exp, add, reciprocal: 4 x (read 4 + write 4); two buffers alive at once
    "swish": (2, 20, 2),  # sigmoid (read 4, write 4) + mul (read 8, write 4); sigmoid(x) and the output alive
}


def activation_byte_model(element_bytes: int = 4) -> pd.DataFrame:
    """Predicted kernels, DRAM bytes per element and peak extra memory (in output sizes) per provider.

    ``eager`` follows :func:`activation_eager`; ``torch_op`` and ``triton`` are one pass (read x,
    write y) with only the output allocated.
    """
    rows = []
    scale = element_bytes / 4
    for name, (kernels, bytes_per_element, buffers) in _EAGER_MODEL.items():
        rows.append({"activation": name, "variant": "eager", "kernels": kernels,
                     "bytes_per_element": bytes_per_element * scale, "peak_buffers": buffers})
        for variant in ("torch_op", "triton"):
            rows.append({"activation": name, "variant": variant, "kernels": 1,
                         "bytes_per_element": 2 * element_bytes, "peak_buffers": 1})
    return pd.DataFrame(rows)


# ================================================================================================
# 07 - a fused normalisation + activation (EvoNorm-B0 style, batch-independent)
# ================================================================================================


@triton.jit
def evonorm_b0_kernel(x_ptr, out_ptr, v_ptr, gamma_ptr, beta_ptr, C, L, eps,
                      CPG: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_L: tl.constexpr):
    """One program per (sample n, group g): the group's CPG channels x L positions are one register tile.

    x is (N, C, L) contiguous with C = G * CPG. The program reads the tile once, computes each
    channel's variance over L and the group's variance over CPG*L (two-pass, in fp32), and writes
    y = x / max(sqrt(var_group + eps), v*x + sqrt(var_instance + eps)) * gamma + beta.
    """
    pid = tl.program_id(axis=0)
    groups = C // CPG
    n = pid // groups
    g = pid % groups
    c_local = tl.arange(0, BLOCK_C)  # channel within the group (BLOCK_C = next power of two >= CPG)
    positions = tl.arange(0, BLOCK_L)  # position along L (BLOCK_L = next power of two >= L)
    c_mask = c_local < CPG
    mask = c_mask[:, None] & (positions < L)[None, :]
    channels = g * CPG + c_local
    # 64-bit base offset: N * C * L may exceed 2**31 for large batches.
    offsets = n.to(tl.int64) * C * L + channels[:, None] * L + positions[None, :]
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)

    # Instance statistics: per channel, over L positions (rows of the tile).
    mean_instance = tl.sum(x, axis=1) / L
    centred = tl.where(mask, x - mean_instance[:, None], 0.0)  # masked lanes must not count
    var_instance = tl.sum(centred * centred, axis=1) / L
    # Group statistics: over the whole tile (CPG * L values).
    mean_group = tl.sum(tl.sum(x, axis=1), axis=0) / (CPG * L)
    centred_g = tl.where(mask, x - mean_group, 0.0)
    var_group = tl.sum(tl.sum(centred_g * centred_g, axis=1), axis=0) / (CPG * L)

    v = tl.load(v_ptr + channels, mask=c_mask, other=0.0).to(tl.float32)
    gamma = tl.load(gamma_ptr + channels, mask=c_mask, other=0.0).to(tl.float32)
    beta = tl.load(beta_ptr + channels, mask=c_mask, other=0.0).to(tl.float32)
    denominator = tl.maximum(tl.sqrt(var_group + eps), v[:, None] * x + tl.sqrt(var_instance + eps)[:, None])
    y = x / denominator * gamma[:, None] + beta[:, None]
    tl.store(out_ptr + offsets, y.to(out_ptr.dtype.element_ty), mask=mask)


MAX_EVONORM_TILE = 16384  # values of one (sample, group) tile kept in registers


def _check_evonorm(x, v, gamma, beta, groups: int) -> tuple[int, int, int]:
    if not isinstance(x, torch.Tensor) or x.ndim < 3:
        raise ValueError(f"x must be a tensor (N, C, spatial...) with at least 3 dims, got {getattr(x, 'shape', type(x).__name__)}")
    n, c = x.shape[:2]
    if isinstance(groups, bool) or not isinstance(groups, int) or groups <= 0 or c % groups:
        raise ValueError(f"groups must be a positive int dividing C={c}, got {groups!r}")
    for name, p in (("v", v), ("gamma", gamma), ("beta", beta)):
        if not isinstance(p, torch.Tensor) or tuple(p.shape) != (c,):
            raise ValueError(f"{name} must be a tensor of shape ({c},), got {getattr(p, 'shape', type(p).__name__)}")
    spatial = math.prod(x.shape[2:])
    return n, c, spatial


def evonorm_b0_torch(x: torch.Tensor, v: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, *,
                     groups: int, eps: float = 1e-5) -> torch.Tensor:
    """Reference definition, in eager PyTorch (one kernel per op; pass float64 tensors for ground truth).

    For x of shape (N, C, *spatial) with C channels in ``groups`` groups::

        var_instance[n, c] = Var over spatial of x[n, c]                 (biased, as in InstanceNorm)
        var_group[n, g]    = Var over (channels of g) x spatial of x[n]  (biased, as in GroupNorm)
        y = x / max(sqrt(var_group + eps), v * x + sqrt(var_instance + eps)) * gamma + beta

    This is EvoNorm-B0 (Liu et al., "Evolving Normalization-Activation Layers", NeurIPS 2020,
    arXiv:2004.02967) with its batch variance replaced by the group variance, so the layer does not
    depend on the batch (the same substitution EvoNorm-S0 makes). v, gamma, beta have shape (C,).
    """
    n, c, _ = _check_evonorm(x, v, gamma, beta, groups)
    spatial_dims = tuple(range(2, x.ndim))
    var_instance = x.var(dim=spatial_dims, correction=0, keepdim=True)  # (N, C, 1, ...)
    var_group = x.reshape(n, groups, -1).var(dim=2, correction=0, keepdim=True)  # (N, G, 1)
    var_group = var_group.repeat_interleave(c // groups, dim=1).reshape(var_instance.shape)  # (N, C, 1, ...)
    shape = (1, c) + (1,) * (x.ndim - 2)
    denominator = torch.maximum(torch.sqrt(var_group + eps), v.reshape(shape) * x + torch.sqrt(var_instance + eps))
    return x / denominator * gamma.reshape(shape) + beta.reshape(shape)


def _evonorm_config(c: int, groups: int, spatial: int, num_warps: int | None) -> tuple[int, int, int, int]:
    cpg = c // groups
    block_c = triton.next_power_of_2(cpg)
    block_l = triton.next_power_of_2(spatial)
    tile = block_c * block_l
    if tile > MAX_EVONORM_TILE:
        raise ValueError(
            f"a group tile of {cpg} channels x {spatial} positions (padded {block_c} x {block_l} = {tile}) exceeds "
            f"{MAX_EVONORM_TILE} values: this one-pass teaching kernel keeps the whole group in registers"
        )
    if num_warps is None:
        num_warps = min(16, max(1, tile // 512))  # about 16 fp32 values per thread
    return cpg, block_c, block_l, _check_power_of_two("num_warps", num_warps, 1, 32)


def _launch_evonorm(x, out, v, gamma, beta, groups: int, eps: float, num_warps: int | None):
    n, c, spatial = _check_evonorm(x, v, gamma, beta, groups)
    cpg, block_c, block_l, warps = _evonorm_config(c, groups, spatial, num_warps)
    return evonorm_b0_kernel[(n * groups,)](
        x, out, v, gamma, beta, c, spatial, float(eps), CPG=cpg, BLOCK_C=block_c, BLOCK_L=block_l, num_warps=warps
    )


def evonorm_b0(x: torch.Tensor, v: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, *, groups: int,
               eps: float = 1e-5, num_warps: int | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`evonorm_b0_torch` in one Triton pass (x contiguous; one program per sample and group)."""
    n, c, spatial = _check_evonorm(x, v, gamma, beta, groups)
    if not x.is_contiguous() or not all(p.is_contiguous() for p in (v, gamma, beta)):
        raise ValueError("x, v, gamma and beta must be contiguous")
    _evonorm_config(c, groups, spatial, num_warps)  # validate before allocating
    out = torch.empty_like(x) if out is None else out
    if n:
        _launch_evonorm(x, out, v, gamma, beta, groups, eps, num_warps)
    return out


# ================================================================================================
# Helpers for notebooks
# ================================================================================================


def kernel_source(kernel: Any) -> str:
    """The Python source of a ``@triton.jit`` kernel (or of any function), for display in a notebook."""
    fn = getattr(kernel, "fn", kernel)
    while hasattr(fn, "fn") and not inspect.isfunction(fn):  # Autotuner -> JITFunction -> function
        fn = fn.fn
    return inspect.getsource(fn)


def find_repo_root(start: str | os.PathLike | None = None) -> Path | None:
    """The nearest directory at or above ``start`` (default: cwd) holding a pyproject.toml."""
    here = Path(start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "pyproject.toml").is_file():
            return folder
    return None


def resolve_path(path: str | os.PathLike) -> Path:
    """A notebook path parameter: absolute as given; relative, under cwd if it exists there, else under
    the repository root (papermill runs from the root, nbval from ``notebooks/``)."""
    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise ValueError(f"path must be a non-empty str, got {path!r}")
    candidate = Path(path)
    if candidate.is_absolute() or candidate.exists():
        return candidate
    root = find_repo_root()
    return (root / candidate) if root is not None else candidate


def resolve_mode(mode: str) -> str:
    """``auto`` -> ``measure`` when CUDA is available, else ``replay``; ``measure`` needs CUDA."""
    if mode not in ("auto", "measure", "replay"):
        raise ValueError(f"MODE must be 'auto', 'measure' or 'replay', got {mode!r}")
    cuda = torch.cuda.is_available()
    if mode == "measure" and not cuda:
        raise RuntimeError("MODE='measure' needs a CUDA GPU and none is available; use MODE='replay' (or 'auto')")
    if mode == "auto":
        return "measure" if cuda else "replay"
    return mode


def load_study(data_dir: str | os.PathLike, gpu: str, study: str, producer: str = PRODUCER_COMMAND) -> pd.DataFrame:
    """Load ``<data_dir>/<slug of gpu>/<study>.csv``, or fail naming the file and the command that makes it."""
    path = data_path(data_dir, gpu, study)
    if not path.exists():
        raise FileNotFoundError(
            f"{path} does not exist, so there is nothing to replay. Produce it on the GPU with `{producer}` "
            f"(writes {gpu_slug(gpu)}/{study}.csv and .json under the --out directory), or run this notebook with "
            "MODE='measure' on a GPU."
        )
    return load_records(path)


def kernel_stats(compiled: Any, cc: tuple[int, int] | None = None) -> dict[str, Any]:
    """Registers, spills, shared memory and theoretical occupancy of a launched Triton kernel.

    ``compiled`` is what ``kernel[grid](...)`` returned on a GPU (a ``CompiledKernel``); under the
    interpreter it is None and every value is None.
    """
    stats: dict[str, Any] = {"n_regs": None, "spill_bytes": None, "shared_bytes": None,
                             "occupancy": None, "blocks_per_sm": None, "limiter": None}
    if compiled is None or getattr(compiled, "metadata", None) is None:
        return stats
    problems = []
    try:
        from .model.compiled_kernel import counts_from_compiled

        counts = counts_from_compiled(compiled)
        stats.update({k: counts.get(k) for k in ("n_regs", "spill_bytes", "shared_bytes")})
    except Exception as exc:  # a missing attribute in another Triton version must not lose the timing
        problems.append(f"registers: {type(exc).__name__}: {exc}")
    try:
        from .model.occupancy import occupancy_of_compiled

        occ = occupancy_of_compiled(compiled, cc)
        stats.update(occupancy=float(occ.occupancy), blocks_per_sm=int(occ.blocks_per_sm), limiter=occ.limiter or None)
    except Exception as exc:
        problems.append(f"occupancy: {type(exc).__name__}: {exc}")
    if problems:
        stats["stats_error"] = "; ".join(problems)[:500]
    return stats


# ================================================================================================
# Measurement back end (GPU). Tests substitute a fake with the same methods.
# ================================================================================================


class CudaBackend:
    """The GPU side of a measurement: timing, compile time, peak memory, host loop, kernel counts.

    ``warmup_ms``/``rep_ms`` go to ``triton.testing.do_bench`` (via :func:`perfutils.timing.bench`).
    """

    device = "cuda"

    def __init__(self, *, warmup_ms: float = 10.0, rep_ms: float = 50.0, wall_budget_ms: float = 20.0) -> None:
        if not torch.cuda.is_available():
            raise RuntimeError(
                "these measurements need a CUDA GPU and none is available; on a CPU the notebooks replay "
                f"the committed data instead (produce it with `{PRODUCER_COMMAND}` on the GPU)"
            )
        self.warmup_ms = warmup_ms
        self.rep_ms = rep_ms
        self.wall_budget_ms = wall_budget_ms
        self.cc = tuple(torch.cuda.get_device_capability())

    def first_call(self, fn: Callable[[], Any]) -> tuple[Any, float]:
        from .timing import first_call_ms

        return first_call_ms(fn)

    def bench(self, fn: Callable[[], Any]) -> BenchResult:
        from .timing import bench

        return bench(fn, warmup_ms=self.warmup_ms, rep_ms=self.rep_ms)

    def peak_bytes(self, fn: Callable[[], Any]) -> int:
        from .timing import peak_memory_above

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
        from .timing import copy_bandwidth_gbps

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
        from .profiling import kernel_table

        table = kernel_table(self.device_events(fn, steps=1), steps=1)
        if table.empty:
            return None
        kernels = table[table["kind"] == "kernel"]
        return int(round(kernels["calls_per_step"].sum()))

    def release(self) -> None:
        gc.collect()
        torch.cuda.empty_cache()


def _randn(shape, *, device: str, seed: int, dtype=torch.float32) -> torch.Tensor:
    generator = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(shape, generator=generator, device=device, dtype=dtype)


def _is_fatal(exc: BaseException) -> bool:
    """CUDA errors after which the context is unusable: stop instead of recording garbage."""
    text = str(exc).lower()
    return any(s in text for s in ("illegal memory access", "unspecified launch failure", "misaligned address",
                                   "device-side assert", "illegal instruction"))


def _fmt(value: Any, spec: str) -> str:
    return format(value, spec) if isinstance(value, (int, float)) and not (isinstance(value, float) and math.isnan(value)) else "-"


class _Session:
    """One study being recorded: the store, what is already done, the copy bandwidth, progress lines."""

    def __init__(self, study: str, out_dir, backend, *, parameters: Mapping[str, Any], copy_gbps: float | None,
                 metadata: Mapping[str, Any] | None, overwrite: bool, log: Callable[[str], Any]) -> None:
        from .metadata import collect_metadata

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
        try:
            result = dict(measure())
        except Exception as exc:
            if _is_fatal(exc):
                raise
            result = {"status": "error", "error": error_text(exc, 600)}
            try:
                self.backend.release()
            except Exception:
                pass
        row = {**config, **(extra or {}), **result, "config_key": key}
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
        try:
            rows = [dict(row) for row in measure()]
        except Exception as exc:
            if _is_fatal(exc):
                raise
            rows = [{**config, "status": "error", "error": error_text(exc, 600), "config_key": key}]
            try:
                self.backend.release()
            except Exception:
                pass
        self.store.append(rows)
        self.done.update(row["config_key"] for row in rows)
        self.done.add(key)
        self.count += len(rows)
        first = rows[0]
        state = f"ERROR {first['error'][:160]}" if first["status"] == "error" else \
            f"{_fmt(first.get('ms_median'), '.4f')} ms, {len(rows)} rows, {first['status']}"
        self.log(f"[{self.study}] {config.get('variant')}: {state} ({time.perf_counter() - began:.1f}s)")
        return rows

    def finish(self) -> Path:
        self.log(f"[{self.study}] {self.count} new rows in {time.perf_counter() - self.started:.0f}s -> {self.path}")
        return self.path


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
        _check_power_of_two("tile block size", block, 16, 65536)
        _check_power_of_two("tile num_warps", warps, 1, 32)
    for cols in softmax_cols:
        softmax_config(cols)
    backend = backend or CudaBackend()
    device = backend.device
    parameters = {"sizes": sizes, "irregular_sizes": irregular_sizes, "tile_sizes": tile_sizes,
                  "tile_configs": [list(c) for c in tile_configs], "autotune": autotune,
                  "softmax_rows": softmax_rows, "softmax_cols": softmax_cols, "seed": seed, "dtype": "fp32",
                  "warmup_ms": getattr(backend, "warmup_ms", None), "rep_ms": getattr(backend, "rep_ms", None)}
    session = _Session(BASICS_STUDY, out_dir, backend, parameters=parameters, copy_gbps=copy_gbps,
                       metadata=metadata, overwrite=overwrite, log=log)
    copy = session.copy_gbps

    def add_inputs(n: int):
        x = _randn(n, device=device, seed=seed * 7919 + 1)
        y = _randn(n, device=device, seed=seed * 7919 + 2)
        reference = x.to(torch.float64) + y.to(torch.float64)
        return x, y, torch.empty_like(x), reference

    def triton_add(x, y, out, block, warps, holder):
        def run():
            holder["compiled"] = _launch_add(x, y, out, block, warps)
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
                holder["compiled"] = _launch_add_autotuned(x, y, out)
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
FUSION_VARIANTS = ("eager", "torch_op", "triton")


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
        _activation_code(name)
    evonorm_batches = _positive_ints("evonorm_batches", evonorm_batches) if evonorm_batches else []
    shape = dict(EVONORM_SHAPE, **dict(evonorm_shape))
    channels, groups = int(shape["channels"]), int(shape["groups"])
    spatial = int(shape["height"]) * int(shape["width"])
    if evonorm_batches:
        if channels % groups:
            raise ValueError(f"evonorm_shape: groups={groups} must divide channels={channels}")
        _evonorm_config(channels, groups, spatial, None)
    backend = backend or CudaBackend()
    device = backend.device
    parameters = {"sizes": sizes, "activations": list(activations), "evonorm_batches": evonorm_batches,
                  "evonorm_shape": shape, "evonorm_eps": EVONORM_EPS, "seed": seed, "dtype": "fp32",
                  "triton_block_size": 1024, "triton_num_warps": 4,
                  "warmup_ms": getattr(backend, "warmup_ms", None), "rep_ms": getattr(backend, "rep_ms", None)}
    session = _Session(FUSION_STUDY, out_dir, backend, parameters=parameters, copy_gbps=copy_gbps,
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
                holder["compiled"] = _launch_activation(x, result, name, 1024, 4)
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
        _, block_c, block_l, warps = _evonorm_config(channels, groups, spatial, None)
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
                holder["compiled"] = _launch_evonorm(x, result, v, gamma, beta, groups, EVONORM_EPS, None)
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
    started = time.perf_counter()
    backend = CudaBackend()
    copy = float(backend.copy_gbps())
    log(f"GPU: {torch.cuda.get_device_name()}; copy bandwidth {copy:.0f} GB/s")
    written = []
    if "basics" in only:
        written.append(measure_basics(out_dir, overwrite=overwrite, copy_gbps=copy, backend=backend, log=log))
    if "fusion" in only:
        written.append(measure_fusion(out_dir, overwrite=overwrite, copy_gbps=copy, backend=backend, log=log))
    log(f"done in {time.perf_counter() - started:.0f}s: " + ", ".join(map(str, written)))
    return written


# ================================================================================================
# Summaries the notebooks print (numbers come from the data, never from the prose)
# ================================================================================================


def bandwidth_summary(df: pd.DataFrame, experiment: str, *, x: str = "vocab", fraction: float = 0.8) -> pd.DataFrame:
    """Per variant of ``experiment``: best GB/s, its % of copy, where it is reached, and the smallest
    ``x`` from which the variant stays at >= ``fraction`` of its best."""
    part = _require(df, (experiment,), "bandwidth_summary")
    rows = []
    for variant, group in part.groupby("variant", sort=True):
        group = group.sort_values(x)
        best = group.loc[group["gbps"].idxmax()]
        good = group["gbps"] >= fraction * best["gbps"]
        # the first x after which every point is good (a later dip resets it)
        bad_positions = [i for i, flag in enumerate(good.tolist()) if not flag]
        from_index = bad_positions[-1] + 1 if bad_positions else 0
        rows.append({"variant": variant, "best_gbps": float(best["gbps"]), "best_pct_of_copy": float(best["pct_of_copy"]),
                     f"{x}_at_best": int(best[x]),
                     f"{x}_from_{int(fraction * 100)}pct": int(group[x].iloc[from_index]) if from_index < len(group) else None})
    return pd.DataFrame(rows)


def irregular_vs_regular(df: pd.DataFrame) -> pd.DataFrame:
    """GB/s at each irregular size next to the power-of-two curve interpolated (in log2 n) at that size."""
    import numpy as np

    regular = _require(df, ("vector_add",), "irregular_vs_regular")
    irregular = _require(df, ("vector_add_irregular",), "irregular_vs_regular")
    rows = []
    for (variant, n), group in irregular.groupby(["variant", "vocab"], sort=True):
        curve = regular[regular["variant"] == variant].sort_values("vocab")
        if len(curve) < 2 or not curve["vocab"].min() <= n <= curve["vocab"].max():
            continue
        expected = float(np.interp(math.log2(n), np.log2(curve["vocab"].astype(float)), curve["gbps"]))
        measured = float(group["gbps"].iloc[0])
        rows.append({"variant": variant, "n": int(n), "gbps": measured, "gbps_power_of_two_curve": expected,
                     "ratio": measured / expected, "idle_lanes_of_1024": mask_stats(int(n), 1024)["idle_lanes"]})
    return pd.DataFrame(rows)


def tile_summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per size of the tile study: the fastest (BLOCK_SIZE, num_warps), the slowest, and the autotuner's
    pick with its GB/s as a fraction of the best measured in the sweep."""
    part = _require(df, ("add_tile",), "tile_summary")
    picks = _ok(df[df["loss"] == "add_autotune"])
    rows = []
    for n, group in part.groupby("vocab", sort=True):
        best = group.loc[group["gbps"].idxmax()]
        worst = group.loc[group["gbps"].idxmin()]
        row = {"n": int(n), "best": f"{int(best['block_size'])}/{int(best['num_warps'])}", "best_gbps": float(best["gbps"]),
               "worst": f"{int(worst['block_size'])}/{int(worst['num_warps'])}", "worst_gbps": float(worst["gbps"])}
        pick = picks[picks["vocab"] == n]
        if not pick.empty and pd.notna(pick["block_size"].iloc[0]):
            row["autotune"] = f"{int(pick['block_size'].iloc[0])}/{int(pick['num_warps'].iloc[0])}"
            row["autotune_gbps"] = float(pick["gbps"].iloc[0])
            row["autotune_vs_best"] = row["autotune_gbps"] / row["best_gbps"]
            if "autotune_ms" in pick and pd.notna(pick["autotune_ms"].iloc[0]):
                row["autotune_ms"] = float(pick["autotune_ms"].iloc[0])
        rows.append(row)
    return pd.DataFrame(rows)


def speedups(df: pd.DataFrame, experiment: str, *, baseline: str, x: str = "vocab") -> pd.DataFrame:
    """Time of each variant divided by the ``baseline`` variant's, per ``x`` (wide table for display)."""
    part = _require(df, (experiment,), "speedups")
    table = part.pivot_table(index=x, columns="variant", values="ms_median")
    if baseline not in table:
        raise ValueError(f"speedups: no {baseline!r} rows for {experiment!r}")
    return table.div(table[baseline], axis=0).drop(columns=[baseline]).add_suffix(f"_time_over_{baseline}")


def flat_region(df: pd.DataFrame, *, factor: float = 1.5) -> pd.DataFrame:
    """Per op and variant: the smallest time measured, the largest size still within ``factor`` of it
    (where fixed launch cost dominates), and that time per launched kernel."""
    part = _require(df, list(ACTIVATIONS) + ["evonorm_b0"], "flat_region")
    rows = []
    for (op, variant), group in part.groupby(["loss", "variant"], sort=False):
        group = group.sort_values("n_elements")
        floor = float(group["ms_median"].min())
        flat = group[group["ms_median"] <= factor * floor]
        kernels = group["n_kernels"].dropna() if "n_kernels" in group else pd.Series(dtype=float)
        row = {"op": op, "variant": variant, "min_us": floor * 1e3, "flat_up_to_n": int(flat["n_elements"].max()),
               "n_kernels": int(kernels.iloc[0]) if len(kernels) else None}
        row["us_per_kernel"] = row["min_us"] / row["n_kernels"] if row["n_kernels"] else None
        if "wall_ms" in group and group["wall_ms"].notna().any():
            row["host_loop_min_us"] = float(group["wall_ms"].min()) * 1e3
        rows.append(row)
    order = {op: i for i, op in enumerate(_fusion_ops(part))}
    return pd.DataFrame(rows).sort_values(["op", "variant"], key=lambda s: s.map(order) if s.name == "op" else s) \
        .reset_index(drop=True)


def fusion_at_largest(df: pd.DataFrame) -> pd.DataFrame:
    """At each op's largest size: time, GB/s, % of copy, peak memory (x output) per variant, the time
    relative to Triton's, and the byte model's prediction of that ratio (activations only)."""
    part = _require(df, list(ACTIVATIONS) + ["evonorm_b0"], "fusion_at_largest")
    largest = part[part["n_elements"] == part.groupby("loss")["n_elements"].transform("max")].copy()
    model = activation_byte_model().set_index(["activation", "variant"])
    rows = []
    for _, row in largest.iterrows():
        triton_rows = largest[(largest["loss"] == row["loss"]) & (largest["variant"] == "triton")]
        triton_ms = float(triton_rows["ms_median"].iloc[0]) if len(triton_rows) else float("nan")
        key = (row["loss"], row["variant"])
        predicted = model.loc[key, "bytes_per_element"] / 8 if key in model.index else None
        peak = row.get("peak_mem_bytes")
        rows.append({"op": row["loss"], "variant": row["variant"], "n": int(row["n_elements"]),
                     "ms": float(row["ms_median"]), "gbps": float(row["gbps"]), "pct_of_copy": float(row["pct_of_copy"]),
                     "time_over_triton": float(row["ms_median"]) / triton_ms,
                     "predicted_time_over_triton": predicted,
                     "peak_x_output": float(peak) / (int(row["n_elements"]) * 4) if pd.notna(peak) else None})
    order = {op: i for i, op in enumerate(_fusion_ops(part))}
    return pd.DataFrame(rows).sort_values(["op", "variant"], key=lambda s: s.map(order) if s.name == "op" else s) \
        .reset_index(drop=True)


# ================================================================================================
# Figures (DataFrame in, matplotlib figure out)
# ================================================================================================

_VARIANT_ORDER = ("triton", "triton_autotune", "torch", "torch_op", "eager", "torch_naive")


def _figure_context(df: pd.DataFrame) -> tuple[str, float | None]:
    """(caption text, copy GB/s) of a loaded frame, from its rows and metadata sidecar."""
    from .figures import caption

    gpu = check_single_gpu(df)
    meta = df.attrs.get("metadata") or {}
    date = meta.get("timestamp_utc") or (str(df["timestamp_utc"].dropna().min()) if "timestamp_utc" in df else None)
    copy = meta.get("copy_gbps")
    return caption(gpu, date), (float(copy) if isinstance(copy, (int, float)) else None)


def _ok(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["status"] == "ok"]


def _require(df: pd.DataFrame, losses: Iterable[str], what: str) -> pd.DataFrame:
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"{what}: expected a DataFrame, got {type(df).__name__}")
    losses = list(losses)
    part = _ok(df[df["loss"].isin(losses)])
    if part.empty:
        raise ValueError(f"{what}: the data has no successful rows for {losses} (columns 'loss' and 'status')")
    return part


def _copy_line(ax, copy: float | None) -> None:
    if copy:
        ax.set_ylim(top=max(ax.get_ylim()[1], 1.12 * copy))
        ax.axhline(copy, color="0.3", linestyle=":", linewidth=1)
        ax.annotate(f"copy {copy:.0f} GB/s", xy=(0.01, copy), xycoords=("axes fraction", "data"),
                    xytext=(0, 3), textcoords="offset points", fontsize=8, color="0.3")


def _palette(variants: Iterable[str]) -> dict[str, Any]:
    import matplotlib.pyplot as plt

    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    return {v: colors[i % len(colors)] for i, v in enumerate(_VARIANT_ORDER + tuple(sorted(set(variants) - set(_VARIANT_ORDER))))}


def plot_vector_add(df: pd.DataFrame):
    """GB/s of vector add vs elements (log2 x), per variant; irregular sizes as hollow markers."""
    import matplotlib.pyplot as plt

    part = _require(df, ("vector_add", "vector_add_irregular"), "plot_vector_add")
    text, copy = _figure_context(df)
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    colors = _palette(part["variant"])
    for variant, rows in part.groupby("variant", sort=True):
        regular = rows[rows["loss"] == "vector_add"].sort_values("vocab")
        irregular = rows[rows["loss"] == "vector_add_irregular"].sort_values("vocab")
        if not regular.empty:
            ax.plot(regular["vocab"], regular["gbps"], marker="o", markersize=4, color=colors[variant], label=variant)
        if not irregular.empty:
            ax.plot(irregular["vocab"], irregular["gbps"], linestyle="none", marker="D", markerfacecolor="none",
                    color=colors[variant], label=f"{variant}, irregular n")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("elements n (fp32; 12 B moved per element)")
    ax.set_ylabel("bandwidth (GB/s, 1e9 B/s)")
    _copy_line(ax, copy)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    ax.set_title(f"Vector add: useful bandwidth vs size\n{text}", fontsize=10)
    fig.tight_layout()
    return fig


def plot_tile_sweep(df: pd.DataFrame):
    """Heatmaps of GB/s over BLOCK_SIZE x num_warps, one panel per size; the autotuner's pick boxed."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    part = _require(df, ("add_tile",), "plot_tile_sweep")
    picks = _ok(df[df["loss"] == "add_autotune"])
    text, _ = _figure_context(df)
    sizes = sorted(part["vocab"].unique())
    fig, axes = plt.subplots(1, len(sizes), figsize=(3.3 * len(sizes) + 0.8, 3.6), squeeze=False)
    for ax, n in zip(axes[0], sizes):
        grid = part[part["vocab"] == n].pivot_table(index="block_size", columns="num_warps", values="gbps")
        grid = grid.sort_index()
        sns.heatmap(grid, ax=ax, annot=True, fmt=".0f", cmap="viridis", cbar=False, annot_kws={"fontsize": 7})
        pick = picks[picks["vocab"] == n]
        if not pick.empty and pd.notna(pick["block_size"].iloc[0]):
            block, warps = int(pick["block_size"].iloc[0]), int(pick["num_warps"].iloc[0])
            if block in grid.index and warps in grid.columns:
                r, c = list(grid.index).index(block), list(grid.columns).index(warps)
                ax.add_patch(plt.Rectangle((c, r), 1, 1, fill=False, edgecolor="red", linewidth=2))
        ax.set_title(f"n = 2^{int(round(math.log2(n)))}" if n & (n - 1) == 0 else f"n = {n:,}", fontsize=9)
        ax.set_xlabel("num_warps")
        ax.set_ylabel("BLOCK_SIZE (elements per program)")
    fig.suptitle(f"Vector add GB/s by tile size and warps (red box: triton.autotune's pick)\n{text}", fontsize=10)
    fig.tight_layout()
    return fig


def plot_tile_occupancy(df: pd.DataFrame):
    """Theoretical occupancy (%, annotated with registers/thread) over BLOCK_SIZE x num_warps."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    part = _require(df, ("add_tile",), "plot_tile_occupancy")
    part = part.dropna(subset=["occupancy"])
    if part.empty:
        raise ValueError("plot_tile_occupancy: no add_tile row has an occupancy (measured under the interpreter?)")
    text, _ = _figure_context(df)
    n = max(part["vocab"])  # occupancy depends on the compiled kernel only, not on n
    rows = part[part["vocab"] == n]
    occ = rows.pivot_table(index="block_size", columns="num_warps", values="occupancy").sort_index() * 100
    regs = rows.pivot_table(index="block_size", columns="num_warps", values="n_regs").sort_index()
    labels = occ.copy().astype(object)
    for i in occ.index:
        for j in occ.columns:
            r = regs.at[i, j] if (i in regs.index and j in regs.columns) else float("nan")
            labels.at[i, j] = f"{occ.at[i, j]:.0f}%\n{int(r)} regs" if pd.notna(r) else f"{occ.at[i, j]:.0f}%"
    fig, ax = plt.subplots(figsize=(5.2, 3.8))
    sns.heatmap(occ, ax=ax, annot=labels.values, fmt="", cmap="magma", vmin=0, vmax=100, annot_kws={"fontsize": 7},
                cbar_kws={"label": "theoretical occupancy (%)"})
    ax.set_xlabel("num_warps")
    ax.set_ylabel("BLOCK_SIZE (elements per program)")
    ax.set_title(f"add_kernel: occupancy from the compiled kernel\n{text}", fontsize=10)
    fig.tight_layout()
    return fig


def plot_softmax(df: pd.DataFrame):
    """GB/s (minimal bytes: read + write once) of the three softmax variants vs row length."""
    import matplotlib.pyplot as plt

    part = _require(df, ("softmax",), "plot_softmax")
    text, copy = _figure_context(df)
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    colors = _palette(part["variant"])
    for variant, rows in part.groupby("variant", sort=True):
        rows = rows.sort_values("vocab")
        ax.plot(rows["vocab"], rows["gbps"], marker="o", markersize=4, color=colors[variant], label=variant)
    ax.set_xscale("log", base=2)
    ax.set_xlabel(f"row length N (columns; {int(part['tokens'].iloc[0])} rows, fp32)")
    ax.set_ylabel("bandwidth of 2·M·N·4 B (GB/s)")
    _copy_line(ax, copy)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    ax.set_title(f"Row softmax: fused Triton vs torch vs naive\n{text}", fontsize=10)
    fig.tight_layout()
    return fig


def _figure_legend(fig, axes) -> None:
    """One legend for all panels (each label once), right of the panels."""
    handles: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    if handles:
        fig.legend(list(handles.values()), list(handles.keys()), loc="center left", bbox_to_anchor=(1.0, 0.5),
                   fontsize=7, frameon=False)


def _fusion_ops(part: pd.DataFrame) -> list[str]:
    order = list(ACTIVATIONS) + ["evonorm_b0"]
    return [op for op in order if op in set(part["loss"])] + sorted(set(part["loss"]) - set(order))


def plot_fusion_latency(df: pd.DataFrame):
    """Latency vs elements, log-log, one panel per op: do_bench median (solid, p20-p80 band) and the
    host-loop time per call (dashed). The flat left part is the fixed cost of a launch."""
    import matplotlib.pyplot as plt

    part = _require(df, list(ACTIVATIONS) + ["evonorm_b0"], "plot_fusion_latency")
    text, _ = _figure_context(df)
    ops = _fusion_ops(part)
    fig, axes = plt.subplots(1, len(ops), figsize=(3.6 * len(ops) + 0.5, 3.8), squeeze=False, sharey=True)
    colors = _palette(part["variant"])
    for ax, op in zip(axes[0], ops):
        for variant, rows in part[part["loss"] == op].groupby("variant", sort=True):
            rows = rows.sort_values("n_elements")
            us = rows["ms_median"] * 1e3
            ax.plot(rows["n_elements"], us, marker="o", markersize=3, color=colors[variant], label=f"{variant} (GPU)")
            ax.fill_between(rows["n_elements"], rows["ms_p20"] * 1e3, rows["ms_p80"] * 1e3, color=colors[variant], alpha=0.2)
            if "wall_ms" in rows and rows["wall_ms"].notna().any():
                ax.plot(rows["n_elements"], rows["wall_ms"] * 1e3, linestyle="--", linewidth=1, color=colors[variant],
                        label=f"{variant} (host loop)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(op, fontsize=9)
        ax.set_xlabel("elements (fp32)")
    axes[0][0].set_ylabel("time per call (µs)")
    _figure_legend(fig, axes[0])
    fig.suptitle(f"Latency vs size: the flat region is launch cost, the slope-1 region is bandwidth\n{text}", fontsize=10)
    fig.tight_layout()
    return fig


def plot_fusion_throughput(df: pd.DataFrame):
    """GB/s of the minimal traffic (read x + write y) vs elements, one panel per op, copy line."""
    import matplotlib.pyplot as plt

    part = _require(df, list(ACTIVATIONS) + ["evonorm_b0"], "plot_fusion_throughput")
    text, copy = _figure_context(df)
    ops = _fusion_ops(part)
    fig, axes = plt.subplots(1, len(ops), figsize=(3.6 * len(ops) + 0.5, 3.8), squeeze=False, sharey=True)
    colors = _palette(part["variant"])
    for ax, op in zip(axes[0], ops):
        for variant, rows in part[part["loss"] == op].groupby("variant", sort=True):
            rows = rows.sort_values("n_elements")
            ax.plot(rows["n_elements"], rows["gbps"], marker="o", markersize=3, color=colors[variant], label=variant)
        ax.set_xscale("log", base=2)
        _copy_line(ax, copy)
        ax.set_ylim(bottom=0)
        ax.set_title(op, fontsize=9)
        ax.set_xlabel("elements (fp32)")
    axes[0][0].set_ylabel("useful bandwidth, 8 B/element (GB/s)")
    _figure_legend(fig, axes[0])
    fig.suptitle(f"Throughput vs size: fused vs unfused\n{text}", fontsize=10)
    fig.tight_layout()
    return fig


def plot_fusion_memory(df: pd.DataFrame):
    """Peak memory allocated during one call, above the inputs, in units of the output's size, at the
    largest size measured of each op."""
    import matplotlib.pyplot as plt

    part = _require(df, list(ACTIVATIONS) + ["evonorm_b0"], "plot_fusion_memory")
    if "peak_mem_bytes" not in part or part["peak_mem_bytes"].isna().all():
        raise ValueError("plot_fusion_memory: the data has no peak_mem_bytes")
    text, _ = _figure_context(df)
    ops = _fusion_ops(part)
    largest = part[part["n_elements"] == part.groupby("loss")["n_elements"].transform("max")].copy()
    largest["ratio"] = largest["peak_mem_bytes"] / (largest["n_elements"] * 4)
    variants = [v for v in _VARIANT_ORDER if v in set(largest["variant"])]
    colors = _palette(largest["variant"])
    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    width = 0.8 / max(len(variants), 1)
    for i, variant in enumerate(variants):
        values = [largest[(largest["loss"] == op) & (largest["variant"] == variant)]["ratio"] for op in ops]
        heights = [float(v.iloc[0]) if len(v) else 0.0 for v in values]
        positions = [k + (i - (len(variants) - 1) / 2) * width for k in range(len(ops))]
        ax.bar(positions, heights, width=width, color=colors[variant], label=variant)
    ax.set_xticks(range(len(ops)))
    ax.set_xticklabels([f"{op}\n(n = 2^{math.log2(int(largest[largest['loss'] == op]['n_elements'].iloc[0])):.0f})"
                        for op in ops], fontsize=8)
    ax.set_xlabel("operation (largest size measured)")
    ax.set_ylabel("peak allocated above inputs\n(× output size)")
    ax.axhline(1.0, color="0.3", linestyle=":", linewidth=1)
    ax.legend(fontsize=8)
    ax.set_title(f"Peak memory of one call (1 = just the output)\n{text}", fontsize=10)
    fig.tight_layout()
    return fig


# ================================================================================================
# Command line
# ================================================================================================


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m perfutils.teaching",
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


if __name__ == "__main__":
    sys.exit(main())
