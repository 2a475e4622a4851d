"""The baseline vocab-parallel design ("all_gather"): local statistics, one collective, a gradient kernel.

Each rank holds the columns [col_offset, col_offset + n_cols) of every row (its slice of the vocabulary).

1. ``gather_stats_kernel`` (one program per row) streams the rank's slice of the row once and writes the slice's
   summary (``row_math``: m_x, s_x and, for the target-distribution losses, m_t, s_t, acc; for cross-entropy from
   labels, the label's logit when this rank owns the label's column, else 0) to ``send``: WIDTH floats per row.
2. The host all-gathers ``send`` into ``recv`` (tp, n_rows, WIDTH): one collective of WIDTH * 4 bytes per row and
   rank. Why gather and not all-reduce: a summary combines by a max and then a sum rescaled to that max, so an
   all-reduce needs two rounds (max, then sum; Fast-LLM's path does three to five); the gathered summaries of all
   ranks are combined exactly by every rank (``row_math.combine_partials``), in rank order, so every rank gets
   bit-identical row losses and the same mean.
3. ``gather_grad_kernel`` (one program per row) combines the tp summaries, writes the row's loss and reads the
   slice a second time to write its gradient; the last program sums the row losses (``row_math.finish_program``).

DRAM bytes per rank (bf16): cross-entropy from labels reads the slice twice and writes it once, 6 B/element against
the minimum of 4; the target-distribution losses read two slices twice, 10 B/element against 6.
"""

import triton
import triton.language as tl

from .row_math import (
    CE_LABELS,
    combine_partials,
    finish_program,
    gradient_from_summary,
    load_scales,
    load_tiles,
    lse_difference,
    row_loss,
    row_losses_ptr,
    row_statistics,
    row_validity,
)


@triton.jit
def owned_label_logit(x_row, label, col_offset, n_cols, LOSS: tl.constexpr):
    """x[label] (fp32, natural units) when this slice holds the label's column, else 0 (cross-entropy from labels;
    0 for the other losses). Summed over the ranks' slices it is the label's logit."""
    x_label = 0.0
    if LOSS == CE_LABELS:
        local = label - col_offset
        owned = (local >= 0) & (local < n_cols)
        x_label = tl.load(x_row + tl.where(owned, local, 0), mask=owned, other=0.0).to(tl.float32)
    return x_label


@triton.jit
def store_summary(ptr, stride, m_x, s_x, m_t, s_t, acc, x_label, LOSS: tl.constexpr):
    """A slice's summary at ptr, ptr + stride, ...: (m_x, s_x, x_label) for cross-entropy from labels, else
    (m_x, s_x, m_t, s_t, acc). summary_width(loss code) words."""
    tl.store(ptr + 0 * stride, m_x)
    tl.store(ptr + 1 * stride, s_x)
    if LOSS == CE_LABELS:
        tl.store(ptr + 2 * stride, x_label)
    else:
        tl.store(ptr + 2 * stride, m_t)
        tl.store(ptr + 3 * stride, s_t)
        tl.store(ptr + 4 * stride, acc)


@triton.jit
def combine_summaries(m_x, s_x, m_t, s_t, acc, x_label, used, LOSS: tl.constexpr):
    """Merge a vector of summaries (one lane per slice, rank order; lanes not ``used`` count as empty) into the
    row's: (m_x, s_x, m_t, s_t, acc, x_label). Same lanes in the same order give bit-identical results."""
    m_x = tl.where(used, m_x, float("-inf"))
    s_x = tl.where(used, s_x, 0.0)
    m_t = tl.where(used, m_t, float("-inf"))
    s_t = tl.where(used, s_t, 0.0)
    acc = tl.where(used, acc, 0.0)
    big_m_x, big_s_x, big_m_t, big_s_t, big_acc = combine_partials(m_x, s_x, m_t, s_t, acc, LOSS)
    big_x_label = tl.sum(tl.where(used, x_label, 0.0), axis=0)
    return big_m_x, big_s_x, big_m_t, big_s_t, big_acc, big_x_label


@triton.jit
def gather_stats_kernel(
    logits_ptr,  # (n_rows, n_cols): this rank's slice, row stride logits_stride
    target_ptr,  # (n_rows, n_cols) target logits' slice, or a dummy
    labels_ptr,  # (n_rows,) global labels, or a dummy
    mask_ptr,  # (n_rows,) uint8 row mask, or a dummy
    send_ptr,  # (n_rows, WIDTH) fp32 summaries out
    n_cols,
    logits_stride,
    target_stride,
    ignore_index,
    col_offset,  # the slice's first global column (rank * n_cols)
    LOSS: tl.constexpr,
    HAS_MASK: tl.constexpr,
    WIDTH: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_SIZE)
    x_row = logits_ptr + row * logits_stride
    t_row = target_ptr + row * target_stride
    valid, label = row_validity(labels_ptr, mask_ptr, row, ignore_index, LOSS, HAS_MASK)
    if valid:
        m_x, s_x, m_t, s_t, acc = row_statistics(x_row, t_row, cols, n_cols, LOSS, BLOCK_SIZE)
        x_label = owned_label_logit(x_row, label, col_offset, n_cols, LOSS)
        store_summary(send_ptr + row * WIDTH, 1, m_x, s_x, m_t, s_t, acc, x_label, LOSS)
    else:  # never combined when every rank agrees the row does not count; NaN (not a stale word) if one does
        nan = float("nan")
        store_summary(send_ptr + row * WIDTH, 1, nan, nan, nan, nan, nan, nan, LOSS)


@triton.jit
def load_gathered(recv_ptr, rank_stride, lanes, used, LOSS: tl.constexpr):
    """One row's summaries from every rank (lane = rank) as written by store_summary, rank_stride apart."""
    ptr = recv_ptr + lanes * rank_stride
    m_x = tl.load(ptr + 0, mask=used, other=float("-inf"))
    s_x = tl.load(ptr + 1, mask=used, other=0.0)
    if LOSS == CE_LABELS:
        x_label = tl.load(ptr + 2, mask=used, other=0.0)
        m_t, s_t, acc = m_x, s_x, s_x
    else:
        m_t = tl.load(ptr + 2, mask=used, other=float("-inf"))
        s_t = tl.load(ptr + 3, mask=used, other=0.0)
        acc = tl.load(ptr + 4, mask=used, other=0.0)
        x_label = s_x * 0.0
    return m_x, s_x, m_t, s_t, acc, x_label


@triton.jit
def gather_grad_kernel(
    logits_ptr,
    target_ptr,
    labels_ptr,
    mask_ptr,
    grad_ptr,  # (n_rows, n_cols) contiguous gradient of this rank's slice out
    ws_ptr,  # fp32 workspace: scales in, row losses out (kernels.problem)
    loss_ptr,  # 0-d fp32 loss out
    recv_ptr,  # (TP, n_rows, WIDTH) fp32: every rank's summaries
    n_rows,
    n_cols,
    logits_stride,
    target_stride,
    ignore_index,
    col_offset,
    LOSS: tl.constexpr,
    HAS_MASK: tl.constexpr,
    COMPUTE_GRAD: tl.constexpr,
    TP: tl.constexpr,
    TP_POW2: tl.constexpr,
    WIDTH: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_SIZE)
    x_row = logits_ptr + row * logits_stride
    t_row = target_ptr + row * target_stride
    g_row = grad_ptr + row * n_cols
    lanes = tl.arange(0, TP_POW2)
    used = lanes < TP
    loss_scale, grad_scale = load_scales(ws_ptr)
    valid, label = row_validity(labels_ptr, mask_ptr, row, ignore_index, LOSS, HAS_MASK)
    if valid:
        m_x, s_x, m_t, s_t, acc, x_label = load_gathered(recv_ptr + row * WIDTH, n_rows * WIDTH, lanes, used, LOSS)
        m_x, s_x, m_t, s_t, acc, x_label = combine_summaries(m_x, s_x, m_t, s_t, acc, x_label, used, LOSS)
        loss = row_loss(m_x, s_x, m_t, s_t, acc, x_label, LOSS)
        tl.store(row_losses_ptr(ws_ptr) + row, loss * loss_scale)
        if COMPUTE_GRAD:
            lse_diff2 = lse_difference(m_x, s_x, m_t, s_t)
            for start in range(0, n_cols, BLOCK_SIZE):  # the slice's second read
                x2, t2 = load_tiles(x_row + start, t_row + start, cols, n_cols - start, LOSS)
                grad = gradient_from_summary(x2, t2, m_x, s_x, m_t, s_t, lse_diff2, cols + start, label - col_offset,
                                             loss, LOSS)
                tl.store(g_row + start + cols, (grad * grad_scale).to(grad_ptr.dtype.element_ty),
                         mask=cols < n_cols - start)
    else:
        tl.store(row_losses_ptr(ws_ptr) + row, 0.0)
        if COMPUTE_GRAD:
            zeros = tl.zeros([BLOCK_SIZE], dtype=grad_ptr.dtype.element_ty)
            for start in range(0, n_cols, BLOCK_SIZE):
                tl.store(g_row + start + cols, zeros, mask=cols < n_cols - start)
    finish_program(ws_ptr, loss_ptr, n_rows)
