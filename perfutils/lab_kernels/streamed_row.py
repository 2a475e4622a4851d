"""An exploration for issue 39: one program streams whole rows through Hopper's TMA, read twice (DRAM, then L2).

The product's split-row kernels hold a chunk of the row in registers and exchange row statistics between the
programs that share the row; their step's fixed part (summaries, publishing, the poll) and their register footprint
cap the bytes in flight (run Z, ``data/h200/logs/ncu_kept_2026-11-28.txt``). This kernel tries the other way the
issue names: loads that land in shared memory. Each program owns whole rows and walks them in one flat loop of
``2 * chunks`` steps a row: the first ``chunks`` steps read the row from DRAM and keep online summaries (max and
sum of exponentials, and the cross term a distribution loss needs); the next ``chunks`` read the same bytes again,
from L2 while the row is recent, and write the gradient. Loads go through a tensor descriptor over the flattened
logits (coordinates in elements, so rows of any length work) and ``tl.range(num_stages=STAGES)`` lets Triton keep
``STAGES - 1`` chunks in flight in shared memory, across row and pass boundaries, since the loop is flat.

Measured on an H200 (run AA, ``data/h200/logs/explore_streamed_2026-11-28.txt``): slower than the public call at
every cell tried, 55-68% of copy against 67-82%; two passes convert and exponentiate every element twice, and the
distribution losses' second read misses L2. :func:`resident_tma_kernel` keeps the product's one pass (a row in one
tile) and adds only the next rows' loads through TMA (run AB, ``explore_resident_tma_2026-11-28.txt``): 25-46% of
copy, one program an SM leaving all its warps in the same phase of one row. Both are kept as the record of that
direction, not as product candidates.

Exploration only: no bad-row semantics (NaN, all -inf rows), no ignore_index or mask, every row counts, and the
flat descriptor limits a call to fewer than 2**31 elements. The loss is written per row and summed by the caller.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

LOSSES = {"cross_entropy/labels": 0, "forward_kl/logits": 1, "reverse_kl/logits": 2, "cross_entropy/logits": 3}
LOG2E = tl.constexpr(1.4426950408889634)  # exp(v) = exp2(v * LOG2E)


@triton.jit
def _chunk_summaries(x, t, in_row, x_max, x_sum, t_max, t_sum, cross, LOSS: tl.constexpr):
    """Online summaries after one more chunk: maxima, sums of exponentials under them, and the cross term
    (forward KL: sum e^(t-mt) (t-x); reverse KL: sum e^(x-mx) (x-t); CE from logits: sum e^(t-mt) x)."""
    new_x_max = tl.maximum(x_max, tl.max(x, axis=0))
    x_exp = tl.exp2((x - new_x_max) * LOG2E)
    x_rescale = tl.exp2((x_max - new_x_max) * LOG2E)
    x_sum = x_sum * x_rescale + tl.sum(x_exp, axis=0)
    if LOSS == 0:
        return new_x_max, x_sum, t_max, t_sum, cross
    new_t_max = tl.maximum(t_max, tl.max(t, axis=0))
    t_exp = tl.exp2((t - new_t_max) * LOG2E)
    t_rescale = tl.exp2((t_max - new_t_max) * LOG2E)
    t_sum = t_sum * t_rescale + tl.sum(t_exp, axis=0)
    if LOSS == 1:
        cross = cross * t_rescale + tl.sum(tl.where(in_row, t_exp * (t - x), 0.0), axis=0)
    elif LOSS == 2:
        cross = cross * x_rescale + tl.sum(tl.where(in_row, x_exp * (x - t), 0.0), axis=0)
    else:
        cross = cross * t_rescale + tl.sum(tl.where(in_row, t_exp * x, 0.0), axis=0)
    return new_x_max, x_sum, new_t_max, t_sum, cross


@triton.jit
def _distribution_loss(x_lse, t_lse, x_sum, t_sum, cross, LOSS: tl.constexpr):
    """A row's loss from its summaries (:func:`_chunk_summaries`' cross term; x_lse, t_lse: log-sum-exps)."""
    if LOSS == 1:  # forward KL: sum p (log p - log q)
        return cross / t_sum - t_lse + x_lse
    elif LOSS == 2:  # reverse KL: sum q (log q - log p)
        return cross / x_sum - x_lse + t_lse
    else:  # cross-entropy from target logits: -sum p log q
        return x_lse - cross / t_sum


@triton.jit
def streamed_row_kernel(logits_ptr, target_ptr, labels_ptr, grad_ptr, row_loss_ptr, n_rows, n_cols, grad_scale,
                        LOSS: tl.constexpr, BLOCK: tl.constexpr, STAGES: tl.constexpr):
    pid = tl.program_id(0)
    n_programs = tl.num_programs(0)
    x_desc = tl.make_tensor_descriptor(logits_ptr, shape=[n_rows * n_cols], strides=[1], block_shape=[BLOCK])
    if LOSS != 0:
        t_desc = tl.make_tensor_descriptor(target_ptr, shape=[n_rows * n_cols], strides=[1], block_shape=[BLOCK])
    chunks = tl.cdiv(n_cols, BLOCK)
    my_rows = tl.cdiv(n_rows - pid, n_programs)
    offsets = tl.arange(0, BLOCK)
    x_max = -float("inf")
    x_sum = 0.0
    t_max = -float("inf")
    t_sum = 0.0
    cross = 0.0
    scale_x = 0.0
    scale_t = 0.0
    shift = 0.0
    label = 0
    for step in tl.range(0, my_rows * 2 * chunks, num_stages=STAGES):
        local_row = step // (2 * chunks)
        k = step - local_row * 2 * chunks
        second_pass = k >= chunks
        chunk = tl.where(second_pass, k - chunks, k)
        row = pid + local_row * n_programs
        column = chunk * BLOCK
        start = row * n_cols + column
        in_row = offsets < n_cols - column
        x = tl.where(in_row, x_desc.load([start]).to(tl.float32), -float("inf"))
        if LOSS != 0:
            t = tl.where(in_row, t_desc.load([start]).to(tl.float32), -float("inf"))
        else:
            t = x
        if k == 0:  # a new row: forget the last one's summaries
            x_max = -float("inf")
            x_sum = 0.0
            t_max = -float("inf")
            t_sum = 0.0
            cross = 0.0
        if not second_pass:
            x_max, x_sum, t_max, t_sum, cross = _chunk_summaries(x, t, in_row, x_max, x_sum, t_max, t_sum, cross,
                                                                 LOSS)
            if k == chunks - 1:  # the row's summaries are complete: its loss, and the gradient's scalars
                x_lse = x_max + tl.log(x_sum)
                if LOSS == 0:
                    label = tl.load(labels_ptr + row).to(tl.int32)
                    loss = x_lse - tl.load(logits_ptr + row.to(tl.int64) * n_cols + label).to(tl.float32)
                else:
                    t_lse = t_max + tl.log(t_sum)
                    loss = _distribution_loss(x_lse, t_lse, x_sum, t_sum, cross, LOSS)
                tl.store(row_loss_ptr + row, loss)
                scale_x = grad_scale / x_sum
                scale_t = grad_scale / t_sum
                if LOSS == 2:  # d/dx_j = q_j ((x_j - t_j) - (x_lse - t_lse) - KL)
                    shift = x_lse - t_lse + loss
        else:
            x_prob = tl.exp2((x - x_max) * LOG2E)
            if LOSS == 0:
                grad = x_prob * scale_x - tl.where(column + offsets == label, grad_scale, 0.0)
            elif LOSS == 2:
                grad = x_prob * scale_x * ((x - t) - shift)
            else:
                grad = x_prob * scale_x - tl.exp2((t - t_max) * LOG2E) * scale_t
            tl.store(grad_ptr + row.to(tl.int64) * n_cols + column + offsets, grad.to(grad_ptr.dtype.element_ty),
                     mask=in_row)


def _scratch(size: int, alignment: int, stream):
    return torch.empty(size, dtype=torch.int8, device="cuda")


_allocator_set = False


def streamed_row_loss(logits: torch.Tensor, target: torch.Tensor, *, loss: str = "cross_entropy",
                      target_format: str = "labels", block: int = 4096, stages: int = 4, num_warps: int = 8,
                      programs_per_sm: int = 1, grad_output: float = 1.0):
    """(mean loss, gradient) of a contiguous 2-D call through :func:`streamed_row_kernel` (exploration)."""
    return _launch(streamed_row_kernel, logits, target, loss, target_format, block, stages, num_warps,
                   programs_per_sm, grad_output)


def _launch(kernel, logits, target, loss, target_format, block, stages, num_warps, programs_per_sm, grad_output):
    global _allocator_set
    key = f"{loss}/{target_format}"
    if key not in LOSSES:
        raise ValueError(f"loss/target_format must be one of {sorted(LOSSES)}, got {key}")
    if logits.dim() != 2 or not logits.is_contiguous() or not target.is_contiguous():
        raise ValueError("the TMA explorations take contiguous 2-D logits and a contiguous target")
    if logits.numel() >= 2**31:
        raise ValueError("a descriptor's coordinates address fewer than 2**31 elements")
    if logits.shape[1] * logits.element_size() % 16:  # on an H200 such a launch ends in an illegal instruction (run AA)
        raise ValueError(f"rows of {logits.shape[1]} {logits.dtype} columns do not start 16-byte aligned, which a TMA "
                         "box needs")
    n_rows, n_cols = logits.shape
    if logits.is_cuda and not _allocator_set:
        triton.set_allocator(_scratch)  # device-side descriptors live in a global scratch buffer
        _allocator_set = True
    sms = torch.cuda.get_device_properties(logits.device).multi_processor_count if logits.is_cuda else 1
    grad = torch.empty_like(logits)
    row_loss = torch.empty(n_rows, dtype=torch.float32, device=logits.device)
    programs = max(1, min(n_rows, programs_per_sm * sms))
    is_labels = LOSSES[key] == 0
    kernel[(programs,)](
        logits, logits if is_labels else target, target if is_labels else logits, grad, row_loss, n_rows, n_cols,
        grad_output / n_rows, LOSS=LOSSES[key], BLOCK=block, STAGES=stages, num_warps=num_warps)
    return row_loss.sum() / n_rows * grad_output, grad


@triton.jit
def resident_tma_kernel(logits_ptr, target_ptr, labels_ptr, grad_ptr, row_loss_ptr, n_rows, n_cols, grad_scale,
                        LOSS: tl.constexpr, BLOCK: tl.constexpr, STAGES: tl.constexpr):
    """The resident row made persistent: a program walks rows, each whole row read into registers in one tile, and
    the next ``STAGES - 1`` rows' loads already landing in shared memory through TMA while it works on this one."""
    pid = tl.program_id(0)
    x_desc = tl.make_tensor_descriptor(logits_ptr, shape=[n_rows, n_cols], strides=[n_cols, 1], block_shape=[1, BLOCK])
    if LOSS != 0:
        t_desc = tl.make_tensor_descriptor(target_ptr, shape=[n_rows, n_cols], strides=[n_cols, 1],
                                           block_shape=[1, BLOCK])
    offsets = tl.arange(0, BLOCK)
    in_row = offsets < n_cols
    for row in tl.range(pid, n_rows, tl.num_programs(0), num_stages=STAGES):
        x = tl.where(in_row, tl.reshape(x_desc.load([row, 0]), [BLOCK]).to(tl.float32), -float("inf"))
        if LOSS != 0:
            t = tl.where(in_row, tl.reshape(t_desc.load([row, 0]), [BLOCK]).to(tl.float32), -float("inf"))
        else:
            t = x
        x_max, x_sum, t_max, t_sum, cross = _chunk_summaries(x, t, in_row, -float("inf"), 0.0, -float("inf"), 0.0,
                                                             0.0, LOSS)
        x_lse = x_max + tl.log(x_sum)
        x_prob = tl.exp2((x - x_max) * LOG2E) * (grad_scale / x_sum)
        if LOSS == 0:
            label = tl.load(labels_ptr + row).to(tl.int32)
            loss = x_lse - tl.sum(tl.where(offsets == label, x, 0.0), axis=0)
            grad = x_prob - tl.where(offsets == label, grad_scale, 0.0)
        else:
            t_lse = t_max + tl.log(t_sum)
            loss = _distribution_loss(x_lse, t_lse, x_sum, t_sum, cross, LOSS)
            if LOSS == 2:  # d/dx_j = q_j ((x_j - t_j) - (x_lse - t_lse) - KL)
                grad = x_prob * ((x - t) - (x_lse - t_lse + loss))
            else:
                grad = x_prob - tl.exp2((t - t_max) * LOG2E) * (grad_scale / t_sum)
        tl.store(row_loss_ptr + row, loss)
        tl.store(grad_ptr + row * n_cols + offsets, grad.to(grad_ptr.dtype.element_ty), mask=in_row)


def resident_tma_loss(logits: torch.Tensor, target: torch.Tensor, *, loss: str = "cross_entropy",
                      target_format: str = "labels", stages: int = 2, num_warps: int = 16, programs_per_sm: int = 1,
                      grad_output: float = 1.0):
    """(mean loss, gradient) of a contiguous 2-D call through :func:`resident_tma_kernel` (exploration): the row in
    one tile (``BLOCK`` the next power of two of its width)."""
    return _launch(resident_tma_kernel, logits, target, loss, target_format, triton.next_power_of_2(logits.shape[1]),
                   stages, num_warps, programs_per_sm, grad_output)
