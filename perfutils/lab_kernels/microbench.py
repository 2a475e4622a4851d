"""Micro-benchmark kernels that measure a GPU's ceilings: what a kernel can actually reach.

=================  ==========================================================================
copy_kernel        ``dst[:] = src[:]``: the DRAM copy ceiling (bytes = read + written)
read_sum_kernel    read a buffer and reduce it, one fp32 partial sum written per program (DRAM read)
l2_read_kernel     re-read a buffer that fits in L2 ``passes`` times inside one kernel; the block each
                   program reads moves every pass so no load can be hoisted
fma_kernel         four independent FMA chains per element in registers (FMA = 2 flops)
exp2_kernel        four independent ``exp2`` chains per element (MUFU.EX2 throughput)
=================  ==========================================================================

Each kernel has a ``launch_*`` helper that checks its arguments; they work on GPU tensors, and on CPU
tensors under ``TRITON_INTERPRET=1``, which is how the tests check every kernel computes what it claims
(a benchmark that silently does less work reports a fake ceiling). Timed by
:mod:`perfutils.studies.ceilings`, turned into roofs by :mod:`perfutils.model.roofline`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["copy_kernel", "read_sum_kernel", "l2_read_kernel", "fma_kernel", "exp2_kernel", "FMA_CHAINS",
           "launch_copy", "read_sum_programs", "launch_read_sum", "launch_l2_read", "launch_fma", "launch_exp2",
           "check_positive_int"]


# ------------------------------------------------------------------------------------------
# Kernels
# ------------------------------------------------------------------------------------------

@triton.jit
def copy_kernel(
    src_ptr,  # (n_elements,) input
    dst_ptr,  # (n_elements,) output, same dtype
    n_elements,
    BLOCK_SIZE: tl.constexpr,  # elements per program
):
    pid = tl.program_id(0).to(tl.int64)  # int64: buffers can exceed 2**31 elements
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    tl.store(dst_ptr + offsets, tl.load(src_ptr + offsets, mask=mask), mask=mask)


@triton.jit
def read_sum_kernel(
    src_ptr,  # (n_elements,) input, read once
    partial_ptr,  # (n_programs,) fp32 out: sum of this program's chunk
    n_elements,
    TILES: tl.constexpr,  # tiles of BLOCK_SIZE per program: a chunk of TILES * BLOCK_SIZE
    BLOCK_SIZE: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    chunk_start = pid * (TILES * BLOCK_SIZE)
    acc = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
    for tile in tl.static_range(TILES):
        offsets = chunk_start + tile * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
        acc += tl.load(src_ptr + offsets, mask=offsets < n_elements, other=0.0).to(tl.float32)
    # One value per program keeps the written bytes negligible (1 per TILES * BLOCK_SIZE read).
    tl.store(partial_ptr + pid, tl.sum(acc, axis=0))


@triton.jit
def l2_read_kernel(
    src_ptr,  # (n_blocks * BLOCK_SIZE,) fp32 input, small enough to stay in L2
    out_ptr,  # (n_programs,) fp32 out: sum of everything this program read
    n_blocks,
    passes,  # runtime loop bound: the compiler cannot unroll or hoist across passes
    BLOCK_SIZE: tl.constexpr,
):
    pid = tl.program_id(0)
    n_programs = tl.num_programs(0)
    acc = tl.zeros([BLOCK_SIZE], dtype=tl.float32)
    for p in range(passes):
        # The block read moves with the pass index, so every pass is a fresh load of other
        # addresses (all still L2 hits after the first touch).
        block = (pid + p * n_programs) % n_blocks
        offsets = block * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
        acc += tl.load(src_ptr + offsets)
    tl.store(out_ptr + pid, tl.sum(acc, axis=0))


@triton.jit
def fma_kernel(
    x_ptr,  # (n_programs * BLOCK_SIZE,) fp32 initial values
    out_ptr,  # (n_programs * BLOCK_SIZE,) fp32 out: sum of the four chains
    iters,  # runtime loop bound
    mul,  # fp32 runtime scalars: a <- a * mul + add
    add,
    BLOCK_SIZE: tl.constexpr,
    UNROLL: tl.constexpr,  # FMAs per chain per loop iteration (amortizes the loop branch)
):
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    a0 = tl.load(x_ptr + offsets)
    # Four independent chains per element (plus the elements each thread holds) give the
    # schedulers enough independent FMAs to hide the FMA latency.
    a1 = a0 + 1.0
    a2 = a0 + 2.0
    a3 = a0 + 3.0
    for _ in range(iters):
        for _u in tl.static_range(UNROLL):
            a0 = tl.fma(a0, mul, add)
            a1 = tl.fma(a1, mul, add)
            a2 = tl.fma(a2, mul, add)
            a3 = tl.fma(a3, mul, add)
    tl.store(out_ptr + offsets, a0 + a1 + a2 + a3)  # stored, so nothing is dead code


@triton.jit
def exp2_kernel(
    x_ptr,  # (n_programs * BLOCK_SIZE,) fp32 initial values
    out_ptr,  # (n_programs * BLOCK_SIZE,) fp32 out: sum of the four chains
    iters,  # runtime loop bound
    scale,  # fp32 runtime scalar: a <- exp2(a * scale); -1 keeps values in (0, 1]
    BLOCK_SIZE: tl.constexpr,
    UNROLL: tl.constexpr,
):
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    a0 = tl.load(x_ptr + offsets)
    a1 = a0 + 0.25
    a2 = a0 + 0.5
    a3 = a0 + 0.75
    for _ in range(iters):
        for _u in tl.static_range(UNROLL):
            a0 = tl.exp2(a0 * scale)
            a1 = tl.exp2(a1 * scale)
            a2 = tl.exp2(a2 * scale)
            a3 = tl.exp2(a3 * scale)
    tl.store(out_ptr + offsets, a0 + a1 + a2 + a3)


# ------------------------------------------------------------------------------------------
# Launchers (work on GPU tensors, and on CPU tensors under TRITON_INTERPRET=1)
# ------------------------------------------------------------------------------------------

def _check_tensor(name: str, t, *, dtype=None, numel: int | None = None):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if not t.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor")
    if dtype is not None and t.dtype != dtype:
        raise ValueError(f"{name}: expected dtype {dtype}, got {t.dtype}")
    if numel is not None and t.numel() != numel:
        raise ValueError(f"{name}: expected {numel} elements, got {t.numel()}")


def check_positive_int(name: str, value) -> int:
    """``value`` if it is a positive int (not a bool); ValueError naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name}: expected a positive integer, got {value!r}")
    return value


def launch_copy(src, dst, *, block_size: int = 4096, num_warps: int = 8):
    """dst[:] = src[:] with ``copy_kernel``. Returns what Triton's launch returns."""
    _check_tensor("src", src)
    _check_tensor("dst", dst, dtype=src.dtype, numel=src.numel())
    grid = (triton.cdiv(src.numel(), block_size),)
    return copy_kernel[grid](src, dst, src.numel(), BLOCK_SIZE=block_size, num_warps=num_warps)


def read_sum_programs(n_elements: int, *, tiles: int = 8, block_size: int = 4096) -> int:
    """Number of programs (= partial sums) ``launch_read_sum`` uses for ``n_elements``."""
    return triton.cdiv(n_elements, tiles * block_size)


def launch_read_sum(src, partial, *, tiles: int = 8, block_size: int = 4096, num_warps: int = 8):
    """partial[i] = sum of chunk i of src (``read_sum_kernel``); partial.sum() == src.sum()."""
    _check_tensor("src", src)
    programs = read_sum_programs(src.numel(), tiles=tiles, block_size=block_size)
    _check_tensor("partial", partial, dtype=torch.float32, numel=programs)
    return read_sum_kernel[(programs,)](src, partial, src.numel(), TILES=tiles,
                                        BLOCK_SIZE=block_size, num_warps=num_warps)


def launch_l2_read(src, out, *, passes: int, block_size: int = 2048, num_warps: int = 4):
    """out[p] = sum over passes i of block (p + i * programs) % n_blocks of src.

    ``out`` has one element per program; ``src.numel()`` must be a multiple of ``block_size``.
    """
    _check_tensor("src", src, dtype=torch.float32)
    _check_tensor("out", out, dtype=torch.float32)
    check_positive_int("passes", passes)
    if src.numel() % block_size:
        raise ValueError(f"src: {src.numel()} elements is not a multiple of block_size {block_size}")
    return l2_read_kernel[(out.numel(),)](src, out, src.numel() // block_size, passes,
                                          BLOCK_SIZE=block_size, num_warps=num_warps)


def launch_fma(x, out, *, iters: int, mul: float, add: float, block_size: int = 1024,
               unroll: int = 8, num_warps: int = 4):
    """Four chains a <- a * mul + add, ``iters * unroll`` times each, from a = x + j (j = 0..3)."""
    _check_tensor("x", x, dtype=torch.float32)
    _check_tensor("out", out, dtype=torch.float32, numel=x.numel())
    check_positive_int("iters", iters)
    if x.numel() % block_size:
        raise ValueError(f"x: {x.numel()} elements is not a multiple of block_size {block_size}")
    return fma_kernel[(x.numel() // block_size,)](x, out, iters, float(mul), float(add),
                                                  BLOCK_SIZE=block_size, UNROLL=unroll,
                                                  num_warps=num_warps)


def launch_exp2(x, out, *, iters: int, scale: float = -1.0, block_size: int = 1024,
                unroll: int = 8, num_warps: int = 4):
    """Four chains a <- exp2(a * scale), ``iters * unroll`` times each, from a = x + j / 4."""
    _check_tensor("x", x, dtype=torch.float32)
    _check_tensor("out", out, dtype=torch.float32, numel=x.numel())
    check_positive_int("iters", iters)
    if x.numel() % block_size:
        raise ValueError(f"x: {x.numel()} elements is not a multiple of block_size {block_size}")
    return exp2_kernel[(x.numel() // block_size,)](x, out, iters, float(scale),
                                                   BLOCK_SIZE=block_size, UNROLL=unroll,
                                                   num_warps=num_warps)


FMA_CHAINS = 4  # independent chains per element in fma_kernel / exp2_kernel
