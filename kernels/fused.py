"""Variant "fused": one program per row, the design of Fast-LLM issue #497.

Forward: an online softmax over column tiles of BLOCK_SIZE (one pass over the row). Backward: a
second loop re-reads each tile and writes its gradient. When the whole row fits in one tile the
tile stays in registers and nothing is re-read — which is exactly why a 32K-wide tile of two
softmaxes (reverse KL) needs so many registers per thread.

Bytes per element (bf16): labels CE 2 (read) + 2 (write) with one tile, +2 per re-read tile pass;
distribution losses 4 + 2 with one tile, +4 when re-read.
"""

import triton
import triton.language as tl

from .launch import Launch, Plan
from .resident_row import plan_resident_row
from .problem import (MIN_BLOCK_SIZE, Problem, allocate_outputs, check_block_size, check_keep_last, check_num_warps,
                      finisher, next_power_of_2)
from .row_math import (
    body_offset,
    call_scales,
    combine_statistics,
    finish_program,
    gradient_from_summary,
    gradient_scales,
    label_in_tile,
    load_edge,
    label_logit,
    load_raw_tiles,
    load_tiles,
    lse_difference,
    row_loss,
    row_statistics,
    rescale,
    row_losses_ptr,
    row_peel,
    row_validity,
    scaled_gradient,
    tile_gradient,
    tile_statistics,
    widen,
)


@triton.jit(debug=True)  # debug: keeps call_scales' device_assert (Launch.options turns Triton's overflow checks off)
def fused_loss_kernel(
    logits_ptr,  # (n_rows, n_cols) logits, row stride logits_stride
    target_ptr,  # (n_rows, n_cols) target logits, or a dummy for labels
    labels_ptr,  # (n_rows,) integer labels, or a dummy
    mask_ptr,  # (n_rows,) bool row mask, or a dummy
    grad_ptr,  # (n_rows, n_cols) gradient out, contiguous, logits' dtype
    ws_ptr,  # fp32 workspace: row count, row losses, finish counters (kernels.problem)
    loss_ptr,  # 0-d fp32 loss out (the mean over the rows that count)
    n_rows,
    n_cols,
    logits_stride,
    target_stride,
    ignore_index,
    grad_output_ptr,  # 0-d grad_output on the device, or a dummy
    grad_output,  # grad_output as a number (GRAD_OUTPUT_IN_MEMORY false)
    LOSS: tl.constexpr,
    HAS_MASK: tl.constexpr,
    COMPUTE_GRAD: tl.constexpr,
    GRAD_OUTPUT_IN_MEMORY: tl.constexpr,
    SINGLE_TILE: tl.constexpr,  # the row fits in one tile: no loop, no re-read
    BLOCK_SIZE: tl.constexpr,
    PEEL: tl.constexpr = False,  # rows not 16-byte aligned: 16-byte body plus a scalar head/tail tile (row_peel)
    VEC: tl.constexpr = 8,  # elements per 16 bytes
    KEEP_LAST: tl.constexpr = False,  # several tiles: the last one is read last and kept in registers (see below)
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_SIZE)
    x_row = logits_ptr + row * logits_stride
    t_row = target_ptr + row * target_stride
    g_row = grad_ptr + row * n_cols
    head, body = row_peel(row * logits_stride, n_cols, PEEL, VEC)
    x_body = logits_ptr + body_offset(row * logits_stride, head, PEEL, VEC)
    t_body = target_ptr + body_offset(row * target_stride, head, PEEL, VEC)
    g_body = grad_ptr + body_offset(row * n_cols, head, PEEL, VEC)
    loss_rows_ptr = row_losses_ptr(ws_ptr)
    loss_scale, grad_scale = call_scales(ws_ptr, labels_ptr, mask_ptr, grad_output_ptr, grad_output, n_rows, n_cols,
                                         ignore_index, LOSS, HAS_MASK, GRAD_OUTPUT_IN_MEMORY)

    valid, label = row_validity(labels_ptr, mask_ptr, row, ignore_index, LOSS, HAS_MASK)
    if valid:
        x_label = label_logit(x_row, label, n_cols, LOSS)
        if SINGLE_TILE:
            # The whole row is one tile: keep it (and its exponentials) in registers.
            x2, t2 = load_tiles(x_body, t_body, cols, body, LOSS)
            m_x, s_x, m_t, s_t, acc, e_x, e_t = tile_statistics(x2, t2, LOSS)
            if PEEL:
                ex2, et2, ecols, evalid = load_edge(x_row, t_row, head, body, n_cols, valid, LOSS, VEC)
                em_x, es_x, em_t, es_t, eacc, _e_x, _e_t = tile_statistics(ex2, et2, LOSS)
                r_m_x, r_s_x, r_m_t, r_s_t, r_acc = combine_statistics(m_x, s_x, m_t, s_t, acc, em_x, es_x, em_t,
                                                                       es_t, eacc, LOSS)
            else:
                r_m_x, r_s_x, r_m_t, r_s_t, r_acc = m_x, s_x, m_t, s_t, acc
            loss = row_loss(r_m_x, r_s_x, r_m_t, r_s_t, r_acc, x_label, LOSS)
            tl.store(loss_rows_ptr + row, loss * loss_scale)
            if COMPUTE_GRAD:
                lse_diff2 = lse_difference(r_m_x, r_s_x, r_m_t, r_s_t)
                if PEEL:  # the tile's exponentials were taken against its own maxima: move them onto the row's
                    q_factor = rescale(m_x, r_m_x) / r_s_x
                    p_factor = rescale(m_t, r_m_t) / r_s_t
                else:
                    q_factor = 1.0 / s_x
                    p_factor = 1.0 / s_t
                grad = tile_gradient(e_x, q_factor, e_t, p_factor, x2 - t2, cols, label_in_tile(label, head, BLOCK_SIZE),
                                     lse_diff2, loss, LOSS)
                tl.store(g_body + cols, (grad * grad_scale).to(grad_ptr.dtype.element_ty), mask=cols < body)
                if PEEL:
                    egrad = gradient_from_summary(ex2, et2, r_m_x, r_s_x, r_m_t, r_s_t, lse_diff2, ecols, label, loss,
                                                  LOSS)
                    tl.store(g_row + ecols, (egrad * grad_scale).to(grad_ptr.dtype.element_ty), mask=evalid)
        else:
            # Pass 1: online statistics over the tiles. KEEP_LAST: over all but the last tile, which is then read
            # and kept (its exponentials too), so pass 2 re-reads one tile fewer (2 tiles: half the L2 re-reads).
            last = ((body - 1) // BLOCK_SIZE) * BLOCK_SIZE if KEEP_LAST else body
            m_x, s_x, m_t, s_t, acc = row_statistics(x_body, t_body, cols, last, LOSS, BLOCK_SIZE)
            if KEEP_LAST:
                k_x2, k_t2 = load_tiles(x_body + last, t_body + last, cols, body - last, LOSS)
                km_x, ks_x, km_t, ks_t, kacc, ke_x, ke_t = tile_statistics(k_x2, k_t2, LOSS)
                m_x, s_x, m_t, s_t, acc = combine_statistics(m_x, s_x, m_t, s_t, acc, km_x, ks_x, km_t, ks_t, kacc,
                                                             LOSS)
            if PEEL:
                ex2, et2, ecols, evalid = load_edge(x_row, t_row, head, body, n_cols, valid, LOSS, VEC)
                em_x, es_x, em_t, es_t, eacc, _e_x, _e_t = tile_statistics(ex2, et2, LOSS)
                m_x, s_x, m_t, s_t, acc = combine_statistics(m_x, s_x, m_t, s_t, acc, em_x, es_x, em_t, es_t, eacc,
                                                             LOSS)
            loss = row_loss(m_x, s_x, m_t, s_t, acc, x_label, LOSS)
            tl.store(loss_rows_ptr + row, loss * loss_scale)
            if COMPUTE_GRAD:
                # Pass 2: re-read every tile and write its gradient, from the raw tile with grad_scale folded into
                # the row's scalars (row_math.scaled_gradient: fewer instructions an element, no more registers).
                lse_diff2 = lse_difference(m_x, s_x, m_t, s_t)
                if KEEP_LAST:  # the kept tile first, from registers; then the others, the most recently read first
                    grad = tile_gradient(ke_x, rescale(km_x, m_x) / s_x, ke_t, rescale(km_t, m_t) / s_t, k_x2 - k_t2,
                                         cols, label_in_tile(label, last + head, BLOCK_SIZE), lse_diff2, loss, LOSS)
                    tl.store(g_body + last + cols, (grad * grad_scale).to(grad_ptr.dtype.element_ty),
                             mask=cols < body - last)
                q_scale, p_scale, offset = gradient_scales(s_x, s_t, lse_diff2, loss, grad_scale, LOSS)
                for step in range(0, last, BLOCK_SIZE):
                    start = last - BLOCK_SIZE - step if KEEP_LAST else step
                    x, t = load_raw_tiles(x_body + start, t_body + start, cols, body - start, LOSS, "")
                    grad = scaled_gradient(widen(x), widen(t), m_x, m_t, q_scale, p_scale, offset, cols,
                                           label_in_tile(label, start + head, BLOCK_SIZE), LOSS)
                    tl.store(g_body + start + cols, grad.to(grad_ptr.dtype.element_ty), mask=cols < body - start)
                if PEEL:
                    egrad = gradient_from_summary(ex2, et2, m_x, s_x, m_t, s_t, lse_diff2, ecols, label, loss, LOSS)
                    tl.store(g_row + ecols, (egrad * grad_scale).to(grad_ptr.dtype.element_ty), mask=evalid)
    else:
        tl.store(loss_rows_ptr + row, 0.0)
        if COMPUTE_GRAD:
            zeros = tl.zeros([BLOCK_SIZE], dtype=grad_ptr.dtype.element_ty)
            for start in range(0, body, BLOCK_SIZE):
                tl.store(g_body + start + cols, zeros, mask=cols < body - start)
            if PEEL:
                edge = tl.arange(0, 2 * VEC)
                ecols = tl.where(edge < head, edge, body + edge)
                tl.store(g_row + ecols, tl.zeros([2 * VEC], dtype=grad_ptr.dtype.element_ty), mask=ecols < n_cols)
    finish_program(ws_ptr, loss_ptr, n_rows)


def default_fused_config(n_cols: int) -> tuple[int, int]:
    """The #497-era defaults: a tile as wide as the row up to 32K, warps growing with the tile (16 at 32K)."""
    block_size = min(max(next_power_of_2(n_cols), MIN_BLOCK_SIZE), 32768)
    return block_size, min(16, max(4, block_size // 2048))


def plan_fused(problem: Problem, block_size: int | None = None, num_warps: int | None = None, *,
               keep_last: bool = False, resident: bool = False) -> Plan:
    """keep_last: a row of several tiles keeps its last tile in registers from pass 1 to pass 2 (one re-read fewer;
    more registers). The #497-era kernel re-reads every tile.
    resident: the earlier spelling of the variant ``resident_row`` (:func:`kernels.resident_row.plan_resident_row`),
    whose plan it returns: that kernel runs, not this one."""
    if not isinstance(resident, bool):
        raise TypeError(f"resident must be True or False, got {resident!r}")
    if resident:
        if keep_last:
            raise ValueError("keep_last=True and resident=True: a resident row is one tile, there is nothing to keep")
        return plan_resident_row(problem, block_size, num_warps)
    default_block, default_warps = default_fused_config(problem.n_cols)
    block_size = check_block_size(block_size) if block_size is not None else default_block
    num_warps = check_num_warps(num_warps) if num_warps is not None else default_warps
    workspace, loss, grad = allocate_outputs(problem)
    launch = fused_launch(problem, block_size, num_warps, workspace, loss, grad, keep_last=check_keep_last(keep_last))
    return Plan(
        variant="fused",
        launches=[launch],
        finish=finisher(problem, loss, grad),
        config={"block_size": block_size, "num_warps": num_warps, "num_tiles": triton.cdiv(problem.n_cols, block_size),
                **keeps_last_tile(launch)},
        buffers=[workspace, grad, loss],
    )


def keeps_last_tile(launch: Launch) -> dict:
    """``{"keep_last": True}`` for a plan's config when its fused launch keeps a tile (rows of several tiles)."""
    return {"keep_last": True} if launch.constexprs.get("KEEP_LAST") else {}


def fused_launch(problem: Problem, block_size: int, num_warps: int, workspace, loss, grad, *,
                 keep_last: bool = False) -> Launch:
    """The fused kernel's launch (also used by split_row for rows that fit in one chunk)."""
    scale_args, scale_constexprs = problem.scale_args()
    single_tile = problem.n_cols <= block_size
    return Launch(
        name="fused",
        fn=fused_loss_kernel,
        grid=(problem.n_rows,),
        args=dict(problem.loss_args(workspace, loss, grad), **scale_args),
        constexprs=dict(problem.loss_constexprs(), **scale_constexprs, SINGLE_TILE=single_tile, BLOCK_SIZE=block_size,
                        **problem.peel_constexprs(), **({"KEEP_LAST": True} if keep_last and not single_tile else {})),
        num_warps=num_warps,
    )
