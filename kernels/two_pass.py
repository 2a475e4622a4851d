"""Variant "two_pass": Option B of Fast-LLM issue #497 — statistics to memory, then a gradient kernel.

Launch 1 (``two_pass_stats_kernel``, one program per row) runs the online softmax over column tiles
and stores each row's loss and the two log-sum-exps it needs later. Launch 2
(``two_pass_grad_kernel``, a 2-D grid of rows × column tiles) reloads those per-row numbers, re-reads
its tile of logits (and target) and writes the gradient. Each launch has its own block size and warps.

Every element is read twice from DRAM: labels CE moves 6 B/elem in bf16, the distribution losses 10.
In exchange each program holds only one tile, and the gradient grid has many small programs.
"""

import triton
import triton.language as tl

from .launch import Launch, Plan
from .problem import (MIN_BLOCK_SIZE, Problem, allocate_outputs, check_block_size, check_num_warps, finisher,
                      next_power_of_2, workspace_size)
from .row_math import (CE_LABELS, WS_GRAD_SCALE, call_scales, finish_program, label_logit, load_scales, load_tiles,
                       row_loss, row_losses_ptr, row_statistics, row_validity, tile_gradient)


@triton.jit(debug=True)  # keeps call_scales' device_assert (see fused_loss_kernel)
def two_pass_stats_kernel(
    logits_ptr,
    target_ptr,
    labels_ptr,
    mask_ptr,
    ws_ptr,  # fp32 workspace: row count, row losses, finish counters (kernels.problem)
    loss_ptr,  # 0-d fp32 loss out
    n_rows,
    n_cols,
    logits_stride,
    target_stride,
    ignore_index,
    stats_offset,  # (n_rows, 4) fp32 at ws_ptr + stats_offset: lse2_x, lse2_t, row loss (natural units), valid flag
    grad_output_ptr,  # 0-d grad_output on the device, or a dummy
    grad_output,  # grad_output as a number (GRAD_OUTPUT_IN_MEMORY false)
    LOSS: tl.constexpr,
    HAS_MASK: tl.constexpr,
    GRAD_OUTPUT_IN_MEMORY: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    row_stats_ptr = ws_ptr + stats_offset
    cols = tl.arange(0, BLOCK_SIZE)
    x_row = logits_ptr + row * logits_stride
    t_row = target_ptr + row * target_stride
    loss_scale, grad_scale = call_scales(ws_ptr, labels_ptr, mask_ptr, grad_output_ptr, grad_output, n_rows, n_cols,
                                         ignore_index, LOSS, HAS_MASK, GRAD_OUTPUT_IN_MEMORY)
    if row == 0:  # for the gradient launch (finish_program leaves this word alone)
        tl.store(ws_ptr + WS_GRAD_SCALE, grad_scale)

    valid, label = row_validity(labels_ptr, mask_ptr, row, ignore_index, LOSS, HAS_MASK)

    lse2_x = 0.0
    lse2_t = 0.0
    loss = 0.0
    if valid:
        x_label = label_logit(x_row, label, n_cols, LOSS)
        m_x, s_x, m_t, s_t, acc = row_statistics(x_row, t_row, cols, n_cols, LOSS, BLOCK_SIZE)
        loss = row_loss(m_x, s_x, m_t, s_t, acc, x_label, LOSS)
        lse2_x = m_x + tl.log2(s_x)
        lse2_t = m_t + tl.log2(s_t)
    tl.store(row_losses_ptr(ws_ptr) + row, loss * loss_scale)
    tl.store(row_stats_ptr + row * 4 + 0, lse2_x)
    tl.store(row_stats_ptr + row * 4 + 1, lse2_t)
    tl.store(row_stats_ptr + row * 4 + 2, loss)
    tl.store(row_stats_ptr + row * 4 + 3, valid.to(tl.float32))
    finish_program(ws_ptr, loss_ptr, n_rows)


@triton.jit
def two_pass_grad_kernel(
    logits_ptr,
    target_ptr,
    labels_ptr,
    mask_ptr,  # unused: a row's validity comes from row_stats (shared argument convention)
    grad_ptr,
    ws_ptr,  # fp32 workspace: grad_output / n_valid (from the stats launch), the row stats at ws_ptr + stats_offset
    n_cols,
    logits_stride,
    target_stride,
    stats_offset,
    LOSS: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    start = tl.program_id(1).to(tl.int64) * BLOCK_SIZE
    cols = tl.arange(0, BLOCK_SIZE)
    in_row = cols < n_cols - start
    g_tile = grad_ptr + row * n_cols + start
    row_stats_ptr = ws_ptr + stats_offset
    valid = tl.load(row_stats_ptr + row * 4 + 3) != 0.0
    _loss_scale, grad_scale = load_scales(ws_ptr)
    if valid:
        lse2_x = tl.load(row_stats_ptr + row * 4 + 0)
        lse2_t = tl.load(row_stats_ptr + row * 4 + 1)
        kl = tl.load(row_stats_ptr + row * 4 + 2)
        label = -1
        if LOSS == CE_LABELS:
            label = tl.load(labels_ptr + row).to(tl.int64)
        x2, t2 = load_tiles(
            logits_ptr + row * logits_stride + start, target_ptr + row * target_stride + start, cols, n_cols - start, LOSS
        )
        # softmax straight from the stored log-sum-exp: exp2(x2 - lse2) needs no max or sum here.
        e_x = tl.exp2(x2 - lse2_x)
        e_t = tl.exp2(t2 - lse2_t)
        grad = tile_gradient(e_x, 1.0, e_t, 1.0, x2 - t2, cols + start, label, lse2_x - lse2_t, kl, LOSS)
        tl.store(g_tile + cols, (grad * grad_scale).to(grad_ptr.dtype.element_ty), mask=in_row)
    else:
        tl.store(g_tile + cols, tl.zeros([BLOCK_SIZE], dtype=grad_ptr.dtype.element_ty), mask=in_row)


def default_two_pass_config(n_cols: int) -> tuple[int, int]:
    """Moderate tiles for both launches: the stats loop streams the row, the grad grid needs no big tile."""
    block_size = min(max(next_power_of_2(n_cols), MIN_BLOCK_SIZE), 8192)
    return block_size, min(8, max(4, block_size // 1024))


def plan_two_pass(
    problem: Problem,
    block_size: int | None = None,
    num_warps: int | None = None,
    *,
    stats_block_size: int | None = None,
    stats_num_warps: int | None = None,
    grad_block_size: int | None = None,
    grad_num_warps: int | None = None,
) -> Plan:
    default_block, default_warps = default_two_pass_config(problem.n_cols)
    block_size = check_block_size(block_size) if block_size is not None else default_block
    num_warps = check_num_warps(num_warps) if num_warps is not None else default_warps
    stats_block = check_block_size(stats_block_size, "stats_block_size") if stats_block_size else block_size
    grad_block = check_block_size(grad_block_size, "grad_block_size") if grad_block_size else block_size
    stats_warps = check_num_warps(stats_num_warps, "stats_num_warps") if stats_num_warps else num_warps
    grad_warps = check_num_warps(grad_num_warps, "grad_num_warps") if grad_num_warps else num_warps

    stats_offset = workspace_size(problem.n_rows)
    workspace, loss, grad = allocate_outputs(problem, extra_floats=4 * problem.n_rows)
    scale_args, scale_constexprs = problem.scale_args()
    launches = [
        Launch(
            name="two_pass.stats",
            fn=two_pass_stats_kernel,
            grid=(problem.n_rows,),
            args=dict(
                problem.input_args(),
                ws_ptr=workspace,
                loss_ptr=loss,
                n_rows=problem.n_rows,
                ignore_index=problem.ignore_index,
                stats_offset=stats_offset,
                **scale_args,
            ),
            constexprs=dict(LOSS=problem.loss_code, HAS_MASK=problem.mask is not None, **scale_constexprs,
                            BLOCK_SIZE=stats_block),
            num_warps=stats_warps,
        )
    ]
    if problem.compute_grad:
        launches.append(
            Launch(
                name="two_pass.grad",
                fn=two_pass_grad_kernel,
                grid=(problem.n_rows, triton.cdiv(problem.n_cols, grad_block)),
                args=dict(problem.input_args(), grad_ptr=grad, ws_ptr=workspace, stats_offset=stats_offset),
                constexprs=dict(LOSS=problem.loss_code, BLOCK_SIZE=grad_block),
                num_warps=grad_warps,
            )
        )
    return Plan(
        variant="two_pass",
        launches=launches,
        finish=finisher(problem, loss, grad),
        config={
            "block_size": stats_block,
            "num_warps": stats_warps,
            "grad_block_size": grad_block,
            "grad_num_warps": grad_warps,
        },
        buffers=[workspace, grad, loss],
    )
