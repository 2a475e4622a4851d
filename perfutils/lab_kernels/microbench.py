"""Micro-benchmark kernels that measure a GPU's ceilings: what a kernel can actually reach.

=================  ==========================================================================
copy_kernel        ``dst[:] = src[:]``: the DRAM copy ceiling (bytes = read + written)
read_sum_kernel    read a buffer and reduce it, one fp32 partial sum written per program (DRAM read)
l2_read_kernel     re-read a buffer that fits in L2 ``passes`` times inside one kernel; the block each
                   program reads moves every pass so no load can be hoisted
fma_kernel         four independent FMA chains per element in registers (FMA = 2 flops)
exp2_kernel        four independent ``exp2`` chains per element (MUFU.EX2 throughput)
copy_to_kernel     ``copy_kernel`` whose destination is an address read from a table (a peer GPU's buffer)
summary_words      the vocab-parallel exchange's stores alone: 8-byte words at the addresses its ``publish`` uses
ping_pong_kernel   one word bounced between two processes' buffers: the round trip of a store and a poll
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

__all__ = ["copy_kernel", "read_sum_kernel", "l2_read_kernel", "fma_kernel", "exp2_kernel", "copy_to_kernel",
           "summary_words_kernel", "ping_pong_kernel", "FMA_CHAINS", "launch_copy", "read_sum_programs",
           "launch_read_sum", "launch_l2_read", "launch_fma", "launch_exp2", "launch_copy_to", "launch_summary_words",
           "summary_word_offsets", "launch_ping_pong", "check_positive_int"]


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


@triton.jit
def copy_to_kernel(
    src_ptr,  # (n_elements,) int64 input
    table_ptr,  # int64 addresses; the destination is the buffer at table[target]
    target,
    n_elements,
    BLOCK_SIZE: tl.constexpr,
):
    """copy_kernel into a buffer known by its address, as the vocab-parallel exchange addresses its peers' buffers
    (kernels.peer_memory's table): on a GPU the stores cross NVLink when the address is a peer's."""
    dst_ptr = tl.load(table_ptr + target).to(tl.pointer_type(tl.int64))
    pid = tl.program_id(0).to(tl.int64)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    tl.store(dst_ptr + offsets, tl.load(src_ptr + offsets, mask=mask), mask=mask)


@triton.jit
def summary_words_kernel(
    table_ptr,  # int64 addresses; the words go to the buffer at table[target]
    target,
    n_rows,
    n_slots,  # programs = n_slots * NUM_CHUNKS, each walking rows slot, slot + n_slots, ...
    first_value,  # word (row, k) holds first_value + row * WIDTH + k (so a check can tell every word was written)
    NUM_CHUNKS: tl.constexpr,
    LANES: tl.constexpr,  # words between a summary's entries (tp x chunks in the exchange)
    WIDTH: tl.constexpr,  # words per summary: 3 (cross-entropy from labels) or 5
):
    """The exchange's stores without its loads or math: program (slot, chunk) writes, for each of its rows, WIDTH
    scalar 8-byte words at ``row * WIDTH * LANES + chunk + k * LANES`` (kernels.vocab_parallel_exchange.publish)."""
    dst_ptr = tl.load(table_ptr + target).to(tl.pointer_type(tl.int64))
    pid = tl.program_id(0)
    slot = pid // NUM_CHUNKS
    chunk = pid % NUM_CHUNKS
    for row in range(slot.to(tl.int64), n_rows, n_slots):
        words = dst_ptr + row * (WIDTH * LANES) + chunk
        for k in tl.static_range(WIDTH):
            tl.store(words + k * LANES, first_value + row * WIDTH + k)


@triton.jit
def ping_pong_kernel(
    table_ptr,  # int64 addresses of both processes' buffers; word 0 of each is the ball
    rank,  # this process (0 serves first)
    out_ptr,  # (2,) int64 out: rounds whose answer arrived, polls spent
    first_value,  # the ball's value before this launch (both processes pass the same; it only grows)
    rounds,
    poll_limit,  # polls after which every wait gives up (a peer that never runs cannot hang the launch)
):
    """``rounds`` round trips of one word: rank 0 stores round i's value into rank 1's buffer and polls its own
    until the answer arrives; rank 1 polls its own and answers into rank 0's. The stores are plain and the polls
    volatile, as the exchange's (kernels.vocab_parallel_exchange). Run one program of one warp on each side."""
    own = tl.load(table_ptr + rank).to(tl.pointer_type(tl.int64))
    other = tl.load(table_ptr + 1 - rank).to(tl.pointer_type(tl.int64))
    polls = tl.full([], 0, tl.int64)
    arrived = tl.full([], 0, tl.int64)
    for i in range(rounds):
        value = first_value + i + 1
        if rank == 0:
            tl.store(other, value)
        seen = tl.load(own, volatile=True)
        while (seen < value) & (polls < poll_limit):
            seen = tl.load(own, volatile=True)
            polls += 1
        arrived += (seen >= value).to(tl.int64)
        if rank != 0:
            tl.store(other, value)
    tl.store(out_ptr, arrived)
    tl.store(out_ptr + 1, polls)


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


def launch_copy_to(src, table, target: int, *, block_size: int = 4096, num_warps: int = 8):
    """The buffer at ``table[target]`` (int64 words, at least ``src.numel()``) gets ``src`` (``copy_to_kernel``)."""
    _check_tensor("src", src, dtype=torch.int64)
    _check_tensor("table", table, dtype=torch.int64)
    grid = (triton.cdiv(src.numel(), block_size),)
    return copy_to_kernel[grid](src, table, int(target), src.numel(), BLOCK_SIZE=block_size, num_warps=num_warps)


def summary_word_offsets(n_rows: int, num_chunks: int, lanes: int, width: int):
    """The word offsets ``summary_words_kernel`` writes and the values it writes there, less ``first_value``
    (LongTensors): what a check of a launch compares."""
    rows = torch.arange(n_rows).view(-1, 1, 1)
    chunks = torch.arange(num_chunks).view(1, -1, 1)
    k = torch.arange(width).view(1, 1, -1)
    offsets = rows * (width * lanes) + chunks + k * lanes
    return offsets.flatten(), (rows * width + k + 0 * chunks).flatten()


def launch_summary_words(table, target: int, *, n_rows: int, n_slots: int, num_chunks: int, lanes: int, width: int,
                         first_value: int = 0, num_warps: int = 4):
    """``summary_words_kernel`` on ``n_slots * num_chunks`` programs (the exchange's grid)."""
    _check_tensor("table", table, dtype=torch.int64)
    for name, value in (("n_rows", n_rows), ("n_slots", n_slots), ("num_chunks", num_chunks), ("lanes", lanes),
                        ("width", width)):
        check_positive_int(name, value)
    if lanes < num_chunks:
        raise ValueError(f"lanes ({lanes}) must be at least num_chunks ({num_chunks})")
    return summary_words_kernel[(n_slots * num_chunks,)](table, int(target), n_rows, n_slots, int(first_value),
                                                         NUM_CHUNKS=num_chunks, LANES=lanes, WIDTH=width,
                                                         num_warps=num_warps)


def launch_ping_pong(table, rank: int, out, *, rounds: int, first_value: int, poll_limit: int):
    """``ping_pong_kernel`` on one program of one warp; ``out`` (2 int64) gets the rounds answered and the polls."""
    _check_tensor("table", table, dtype=torch.int64, numel=2)
    _check_tensor("out", out, dtype=torch.int64, numel=2)
    check_positive_int("rounds", rounds)
    check_positive_int("poll_limit", poll_limit)
    if rank not in (0, 1):
        raise ValueError(f"rank: expected 0 or 1, got {rank!r}")
    return ping_pong_kernel[(1,)](table, rank, out, int(first_value), rounds, poll_limit, num_warps=1)


FMA_CHAINS = 4  # independent chains per element in fma_kernel / exp2_kernel
