"""An exploration for issue 39: the programs of a row in one thread-block cluster, exchanging the row's summaries
through distributed shared memory instead of global memory.

The product's lagged split-row kernel publishes each chunk's summary to global memory and polls its row's summaries
with strong loads from L2 a step later; those reads are most of what its step waits for beyond its own loads (runs
AE-AH, ``data/h200/logs/explore_summaries_2026-11-29.txt``), and the step keeps four tiles in registers (this row's
chunk and the old row's, read again from L2). Here the ``NUM_CHUNKS`` programs of a row are one cluster (Hopper:
up to 8 CTAs portably, 16 allowed on H100/H200). Each step a program loads its chunk of the row into registers,
summarises it, writes the summary into its own shared memory, arrives at the cluster barrier, waits, reads its
peers' summaries through ``ld.shared::cluster`` and writes the gradient from the tiles it still holds: each input
byte is read once (no second read from L2), two tiles live, no polling. With ``PREFETCH`` the next row's chunk is
requested between the barrier's arrive and its wait, so loads stay in flight while the cluster waits.

Triton 3.6 has no language for another CTA's shared memory, so this is inline PTX on a region the launcher adds at
the end of the kernel's dynamic shared memory (Triton's own scratch, ``global_smem``, starts at 0; the region's
address is ``global_smem + %dynamic_smem_size - RESERVED``), and the kernel, compiled as an ordinary one-CTA
kernel, is launched with a cluster dimension through Triton's own launcher (``num_ctas`` in its metadata). GPU only:
the interpreter has no clusters.

Exploration only: no bad-row semantics checks beyond the product's math, no ignore_index or mask, every row counts,
contiguous rows. The loss is written per row and summed by the caller.
"""

from __future__ import annotations

import ctypes

import torch
import triton
import triton.language as tl

from kernels.problem import LOSS_CODES
from kernels.row_math import (
    CE_LABELS,
    combine_partials,
    gradient_scales,
    label_in_tile,
    label_logit,
    lse_difference,
    row_loss,
    scaled_gradient,
    slot_and_chunk,
    tile_statistics_raw,
    widen,
)

RESERVED = 96  # bytes at the end of dynamic shared memory: three summaries (rotating steps) of 8 words each
MAX_PORTABLE_CLUSTER = 8

_REGION_ASM = tl.constexpr("{ .reg .u32 size; mov.u32 size, %dynamic_smem_size; mov.u32 $0, global_smem; "
                           f"add.u32 $0, $0, size; sub.u32 $0, $0, {RESERVED}; }}")  # $1: unused
_PUBLISH_ASM = tl.constexpr("{ st.shared.v4.f32 [$1], {$2, $3, $4, $5}; st.shared.f32 [$1+16], $6; mov.u32 $0, 0; }")
_ARRIVE_ASM = tl.constexpr("{ barrier.cluster.arrive.release.aligned; mov.u32 $0, 0; }")
_WAIT_ASM = tl.constexpr("{ barrier.cluster.wait.acquire.aligned; mov.u32 $0, 0; }")
_READ_ASM = tl.constexpr("{ .reg .u32 a; mapa.shared::cluster.u32 a, $5, $6; "
                         "ld.shared::cluster.v4.f32 {$0, $1, $2, $3}, [a]; ld.shared::cluster.f32 $4, [a+16]; }")


@triton.jit
def _region(anything):
    """The shared-memory address (32-bit) of this CTA's summary region (see the module docstring); ``anything``: an
    int32 operand inline_asm_elementwise needs, unused."""
    return tl.inline_asm_elementwise(_REGION_ASM, "=r,r", [anything], dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def _publish(slot_address, m_x, s_x, m_t, s_t, acc):
    """This chunk's summary into its own shared memory (every thread stores the same words)."""
    return tl.inline_asm_elementwise(_PUBLISH_ASM, "=r,r,f,f,f,f,f", [slot_address, m_x, s_x, m_t, s_t, acc],
                                     dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _arrive(after):
    return tl.inline_asm_elementwise(_ARRIVE_ASM, "=r,r", [after], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _wait(after):
    return tl.inline_asm_elementwise(_WAIT_ASM, "=r,r", [after], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _read_peers(slot_address, ranks):
    """Each rank's summary (m_x, s_x, m_t, s_t, acc) from that CTA's shared memory, one lane a rank."""
    return tl.inline_asm_elementwise(_READ_ASM, "=f,=f,=f,=f,=f,r,r", [slot_address + 0 * ranks, ranks],
                                     dtype=(tl.float32, tl.float32, tl.float32, tl.float32, tl.float32),
                                     is_pure=False, pack=1)


# The gradient widens the tiles again after the wait (``token``, its result, is an operand): with widen's spelling
# LLVM reuses the first widening, and without the operand it hoists it above the barrier; either way both fp32 tiles
# stay live across the exchange (127 and 167 registers, forward KL 4096/4 offline).
_WIDEN_AGAIN_ASM = tl.constexpr("{ prmt.b32 $0, $2, $3, 0x1044; prmt.b32 $1, $2, $3, 0x3244; }")  # $3: zeros


@triton.jit
def _widen_again(x, token):
    if x.dtype == tl.bfloat16:
        return tl.inline_asm_elementwise(_WIDEN_AGAIN_ASM, "=r,=r,r,r", [x, tl.zeros_like(x) + token.to(x.dtype)],
                                         dtype=tl.float32, is_pure=True, pack=2)
    else:
        return x.to(tl.float32) + token.to(tl.float32)


@triton.jit
def _load_chunk(logits_ptr, target_ptr, row, start, cols, width, LOSS: tl.constexpr, EVICTION: tl.constexpr):
    """A program's chunk of ``row``: its first ``width`` columns from ``start`` (nothing read when ``width`` <= 0)."""
    in_row = cols < width
    x = tl.load(logits_ptr + start + cols, mask=in_row, other=float("-inf"), eviction_policy=EVICTION)
    t = x
    if LOSS != CE_LABELS:
        t = tl.load(target_ptr + start + cols, mask=in_row, other=float("-inf"), eviction_policy=EVICTION)
    return x, t


@triton.jit
def _finish_row(x, t, token, summary_address, peers, rank_used, logits_ptr, labels_ptr, grad_ptr, row_loss_ptr, row,
                chunk, start, cols, n_cols, grad_scale, own, LOSS: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                READ: tl.constexpr = True):
    """Once the cluster's barrier is passed (``token``): the row's summaries from every peer, its loss (chunk 0
    writes it) and this chunk's gradient from the raw tiles ``x``, ``t``. READ false (an ablation, wrong results):
    ``own`` summary in every lane instead of the peers'."""
    if READ:
        all_m_x, all_s_x, all_m_t, all_s_t, all_acc = _read_peers(summary_address + token, peers)
    else:
        zero = tl.zeros_like(peers).to(tl.float32)
        all_m_x, all_s_x, all_m_t, all_s_t, all_acc = (zero + own[0], zero + own[1], zero + own[2], zero + own[3],
                                                       zero + own[4])
    all_m_x = tl.where(rank_used, all_m_x, float("-inf"))
    all_s_x = tl.where(rank_used, all_s_x, 0.0)
    all_m_t = tl.where(rank_used, all_m_t, float("-inf"))
    all_s_t = tl.where(rank_used, all_s_t, 0.0)
    all_acc = tl.where(rank_used, all_acc, 0.0)
    big_m_x, big_s_x, big_m_t, big_s_t, big_acc = combine_partials(all_m_x, all_s_x, all_m_t, all_s_t, all_acc, LOSS)
    label = 0
    if LOSS == CE_LABELS:
        label = tl.load(labels_ptr + row).to(tl.int64)
    x_label = label_logit(logits_ptr + row * n_cols, label, n_cols, LOSS)
    loss = row_loss(big_m_x, big_s_x, big_m_t, big_s_t, big_acc, x_label, LOSS, 2)
    tl.store(row_loss_ptr + row, loss, mask=chunk == 0)
    lse_diff2 = lse_difference(big_m_x, big_s_x, big_m_t, big_s_t, 2)
    q_scale, p_scale, offset = gradient_scales(big_s_x, big_s_t, lse_diff2, loss, grad_scale, LOSS, 2)
    grad = scaled_gradient(_widen_again(x, token), _widen_again(t, token), big_m_x, big_m_t, q_scale, p_scale,
                           offset, cols, label_in_tile(label, start, BLOCK_SIZE), LOSS)
    tl.store(grad_ptr + row * n_cols + start + cols, grad.to(grad_ptr.dtype.element_ty), mask=cols < n_cols - start)


@triton.jit
def cluster_row_kernel(logits_ptr, target_ptr, labels_ptr, grad_ptr, row_loss_ptr, n_rows, n_cols, n_slots,
                       grad_scale, LOSS: tl.constexpr, NUM_CHUNKS: tl.constexpr, CHUNKS_POW2: tl.constexpr,
                       BLOCK_SIZE: tl.constexpr, PREFETCH: tl.constexpr, LAGGED: tl.constexpr,
                       ABLATE: tl.constexpr = 0):
    """Program (slot, chunk) takes chunk ``chunk`` of rows slot, slot + n_slots, ...; the cluster is a slot's chunks.

    Plain (LAGGED false): each step loads, summarises, publishes, passes the barrier and writes the row's gradient
    from the tiles it holds; PREFETCH requests the next row's chunk between the barrier's arrive and its wait.
    LAGGED: the product's lag of one step on the cluster: step k loads row k's chunk (DRAM, kept in L2) and row
    k - 1's again (L2), publishes row k's summary, waits for the barrier of row k - 1 (which its peers arrived at a
    step ago), finishes row k - 1 and arrives for row k. Three summary slots: a slot is written again only after
    every peer has passed the barrier that follows its last read.

    ABLATE (lagged only; timing, wrong results): 1 no barrier in the loop, 2 no read of the peers' summaries (each
    program's own instead), 3 neither. The launch stays a cluster launch, with the barriers before and after the
    loop."""
    slot, chunk = slot_and_chunk(NUM_CHUNKS, CHUNKS_POW2)
    start = chunk * BLOCK_SIZE
    width = n_cols - start
    cols = tl.arange(0, BLOCK_SIZE)
    ranks = tl.arange(0, CHUNKS_POW2)
    rank_used = ranks < NUM_CHUNKS
    peers = tl.where(rank_used, ranks, 0)
    region = _region(chunk)
    if LAGGED:
        trips = tl.cdiv(n_rows - slot, n_slots)  # the same for every program of the cluster
        done = _arrive(chunk) * 0  # a first phase with nothing published, so that every step waits once
        if ABLATE % 2 == 1:  # no barrier in the loop: pass one here, so that every peer runs before its memory is read
            done = _arrive(_wait(done))
        for step in range(0, trips + 1):
            row = (slot + step * n_slots).to(tl.int64)
            cur_width = tl.where(step < trips, width, 0)
            old_width = tl.where(step > 0, width, 0)
            x, t = _load_chunk(logits_ptr + row * n_cols, target_ptr + row * n_cols, row, start, cols, cur_width,
                               LOSS, "evict_last")
            old = row - n_slots
            x_old, t_old = _load_chunk(logits_ptr + old * n_cols, target_ptr + old * n_cols, old, start, cols,
                                       old_width, LOSS, "evict_first")
            m_x, s_x, m_t, s_t, acc = tile_statistics_raw(widen(x), widen(t), LOSS)
            if step < trips:
                _publish(region + (step % 3) * 32, m_x, s_x, m_t, s_t, acc)
            if ABLATE % 2 == 0:
                token = _wait(done)
            else:
                token = done
            if step > 0:
                _finish_row(x_old, t_old, token, region + ((step - 1) % 3) * 32, peers, rank_used, logits_ptr,
                            labels_ptr, grad_ptr, row_loss_ptr, old, chunk, start, cols, n_cols, grad_scale,
                            (m_x, s_x, m_t, s_t, acc), LOSS, BLOCK_SIZE, ABLATE < 2)
            if ABLATE % 2 == 0:
                done = _arrive(token)
        _wait(done)
    else:
        parity = 0
        row = slot.to(tl.int64)
        if PREFETCH:
            first = tl.minimum(row, n_rows - 1)
            x_next, t_next = _load_chunk(logits_ptr + first * n_cols, target_ptr + first * n_cols, first, start, cols,
                                         width, LOSS, "")
        for row in range(slot.to(tl.int64), n_rows, n_slots):
            if PREFETCH:
                x, t = x_next, t_next
            else:
                x, t = _load_chunk(logits_ptr + row * n_cols, target_ptr + row * n_cols, row, start, cols, width,
                                   LOSS, "")
            m_x, s_x, m_t, s_t, acc = tile_statistics_raw(widen(x), widen(t), LOSS)
            summary_address = region + parity * 32
            done = _arrive(_publish(summary_address, m_x, s_x, m_t, s_t, acc))
            if PREFETCH:  # the next row's chunk is in flight while the cluster waits
                ahead = tl.minimum(row + n_slots, n_rows - 1)
                x_next, t_next = _load_chunk(logits_ptr + ahead * n_cols, target_ptr + ahead * n_cols, ahead, start,
                                             cols, width, LOSS, "")
            _finish_row(x, t, _wait(done), summary_address, peers, rank_used, logits_ptr, labels_ptr, grad_ptr,
                        row_loss_ptr, row, chunk, start, cols, n_cols, grad_scale, (m_x, s_x, m_t, s_t, acc), LOSS,
                        BLOCK_SIZE)
            parity = 1 - parity
        # nobody leaves while a peer may still read its shared memory
        _wait(_arrive(parity))


def cluster_size(n_cols: int, block: int) -> int:
    """The CTAs of a row's cluster: its chunks of ``block`` columns; 2-8, or 16 (non-portable, H100 and H200)."""
    chunks = triton.cdiv(n_cols, block)
    if not (2 <= chunks <= MAX_PORTABLE_CLUSTER or chunks == 16):
        raise ValueError(f"{n_cols} columns in chunks of {block} make {chunks} chunks; a cluster takes 2-8 or 16")
    return chunks


class _LaunchAttribute(ctypes.Structure):  # CUlaunchAttribute with the cluster dimension as its value
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("x", ctypes.c_uint), ("y", ctypes.c_uint),
                ("z", ctypes.c_uint), ("rest", ctypes.c_char * 52)]


class _LaunchConfig(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_LaunchAttribute)), ("num_attrs", ctypes.c_uint)]


_CLUSTER_DIMENSION = 4  # CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
_NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14  # CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED


def max_active_clusters(function: int, num_warps: int, chunks: int, shared: int) -> int:
    """How many clusters of ``chunks`` CTAs the GPU runs at once (cuOccupancyMaxActiveClusters): a cluster's CTAs
    share one GPC, so this is less than SMs times CTAs an SM over ``chunks`` where GPCs do not divide evenly."""
    cuda = ctypes.CDLL("libcuda.so.1")
    if chunks > MAX_PORTABLE_CLUSTER:
        cuda.cuFuncSetAttribute(ctypes.c_void_p(function), _NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)
    attribute = _LaunchAttribute(id=_CLUSTER_DIMENSION, x=chunks, y=1, z=1)
    config = _LaunchConfig(grid=(ctypes.c_uint * 3)(chunks, 1, 1), block=(ctypes.c_uint * 3)(32 * num_warps, 1, 1),
                           shared=shared, stream=None, attrs=ctypes.pointer(attribute), num_attrs=1)
    count = ctypes.c_int(0)
    status = cuda.cuOccupancyMaxActiveClusters(ctypes.byref(count), ctypes.c_void_p(function), ctypes.byref(config))
    if status != 0:
        raise RuntimeError(f"cuOccupancyMaxActiveClusters failed with CUresult {status}")
    return count.value


_launchers: dict = {}  # signature -> (compiled kernel, clusters, shared bytes): compiled and sized once
last_launch: dict = {}  # the last call's clusters, CTAs a cluster, registers and shared bytes (for the logs)


def prepare_cluster_row(logits: torch.Tensor, target: torch.Tensor, *, loss: str = "forward_kl",
                        target_format: str = "logits", block: int = 4096, num_warps: int = 4,
                        programs_per_sm: int | None = None, prefetch: bool = False, lagged: bool = False,
                        ablate: int = 0, maxnreg: int | None = None, grad_output: float = 1.0):
    """A launch of :func:`cluster_row_kernel` for these tensors, compiled and sized, with its gradient and row-loss
    buffers: a callable that launches it and returns (row losses, gradient), kernel-only like a prepared plan of the
    product (exploration, GPU only). ``programs_per_sm``: None for as many clusters as the GPU holds at once
    (:func:`max_active_clusters`)."""
    key = (loss, target_format)
    if key not in LOSS_CODES:
        raise ValueError(f"(loss, target_format) must be one of {sorted(LOSS_CODES)}, got {key}")
    if ablate not in (0, 1, 2, 3) or (ablate and not lagged):
        raise ValueError(f"ablate must be 0-3 and needs lagged=True, got {ablate!r} (lagged={lagged})")
    if not logits.is_cuda or logits.dim() != 2 or not logits.is_contiguous() or not target.is_contiguous():
        raise ValueError("the cluster exploration takes contiguous 2-D CUDA logits and a contiguous target")
    n_rows, n_cols = logits.shape
    chunks = cluster_size(n_cols, block)
    grad = torch.empty_like(logits)
    row_loss = torch.empty(n_rows, dtype=torch.float32, device=logits.device)
    is_labels = target_format == "labels"
    # n_slots is set below, once the kernel's occupancy is known; 7 compiles it for any count (no specialization)
    args = [logits, logits if is_labels else target, target if is_labels else logits, grad, row_loss, n_rows, n_cols,
            7, grad_output / n_rows]
    constexprs = dict(LOSS=LOSS_CODES[key], NUM_CHUNKS=chunks, CHUNKS_POW2=triton.next_power_of_2(chunks),
                      BLOCK_SIZE=block, PREFETCH=bool(prefetch), LAGGED=bool(lagged), ABLATE=int(ablate))
    signature = (logits.dtype, is_labels, n_rows % 16 == 0, n_cols % 16 == 0, num_warps, maxnreg, programs_per_sm,
                 tuple(sorted(constexprs.items())))
    if signature not in _launchers:
        options = {} if maxnreg is None else {"maxnreg": maxnreg}
        compiled = cluster_row_kernel.warmup(*args, **constexprs, num_warps=num_warps, grid=(1,), **options)
        compiled.run  # noqa: B018 - loads the kernel: its function and n_regs are known from here
        shared = -(-compiled.metadata.shared // 16) * 16 + RESERVED
        if programs_per_sm is None:  # every cluster the GPU holds at once
            clusters = max_active_clusters(compiled.function, num_warps, chunks, shared)
        else:
            clusters = programs_per_sm * torch.cuda.get_device_properties(logits.device).multi_processor_count // chunks
        _launchers[signature] = (compiled, clusters, shared)
    compiled, clusters, shared = _launchers[signature]
    n_slots = max(1, min(n_rows, clusters))
    args[7] = n_slots
    last_launch.update(clusters=n_slots, ctas=chunks, regs=compiled.n_regs, shared=shared)
    values = args + list(constexprs.values())  # the launcher takes the constexprs too, in the kernel's order
    stream = torch.cuda.current_stream(logits.device).cuda_stream
    middle = (compiled.function, 0, 0, None, None, (num_warps, chunks, shared), None, None, None)

    def run():
        # Triton's launcher: a grid of n_slots clusters of `chunks` CTAs (its num_ctas), `shared` bytes each
        compiled.run.launch(n_slots, 1, 1, stream, *middle, *values)
        return row_loss, grad

    return run


def cluster_row_loss(logits: torch.Tensor, target: torch.Tensor, *, grad_output: float = 1.0, **options):
    """(mean loss, gradient) of a contiguous 2-D call through :func:`cluster_row_kernel`: a launch prepared with
    ``options`` (:func:`prepare_cluster_row`) and the mean of its row losses, a call with its allocations."""
    row_loss, grad = prepare_cluster_row(logits, target, grad_output=grad_output, **options)()
    return row_loss.sum() / logits.shape[0] * grad_output, grad
