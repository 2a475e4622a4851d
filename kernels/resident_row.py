"""Cross-entropy from labels with the whole row read once and kept in registers as 32-bit pairs of bf16 logits.

The fused kernel at 32000 columns walks its row in two 16384-column tiles and reads the first again (from L2) to write
its gradient; one 32768-column tile of fp32 values and exponentials took 127 registers a thread at 16 warps and
spilled. Here a program loads its row as int32 words, two bf16 logits each (at 32000 columns and 16 warps, 32 words:
32 registers a thread), and never converts the tile as a whole: the max, the sum of exponentials and the gradient
each widen a word's halves on the fly (a shift for the low half, a mask for the high one), and the gradient's
halves go back into one word (``cvt.rn.bf16x2.f32``, round to nearest even like
``Tensor.to``). DRAM traffic is the minimum, one read and one write per element, and nothing is read twice, as in
quack's kernel (Dao-AILab/quack, ``quack/cross_entropy.py``: at 32K columns a cluster of two CTAs, each holding half
the row in registers and exchanging the row's max and sum through distributed shared memory).

Only for bf16 rows whose words are 16-byte aligned (:func:`resident_fits`): base, row stride and vocab multiples of 8
elements, the row at most ``MAX_RESIDENT_COLS`` wide.
"""

import torch
import triton
import triton.language as tl

from .launch import Launch, Plan
from .problem import Problem, allocate_outputs, check_block_size, check_num_warps, finisher, next_power_of_2
from .row_math import (
    CE_LABELS,
    GPU_APPROXIMATIONS,
    LOG2E,
    call_scales,
    exponent_shift,
    finish_program,
    gradient_scales,
    label_logit,
    row_loss,
    row_losses_ptr,
    row_validity,
)

MAX_RESIDENT_COLS = 32768  # 16K words a row: 32 registers a thread at 16 warps (more spills, or one program per SM)
NEG_INF_PAIR = tl.constexpr(-8323200)  # int32 0xff80ff80: two bf16 -inf (the padding lanes of a row's last words)


@triton.jit
def low_half(words):
    """The low bf16 of each 32-bit word as fp32 (its bits shifted to the top)."""
    return (words << 16).to(tl.float32, bitcast=True)


@triton.jit
def high_half(words):
    """The high bf16 of each 32-bit word as fp32 (the low bits cleared)."""
    return (words & -65536).to(tl.float32, bitcast=True)


# The sum and the gradient widen the words again inside one asm statement each, on the GPU, each with byte permutes of
# its own (selectors that read the zero operand's bytes 4 or 5): with one spelling, ptxas keeps the first widening's
# fp32 tile live across the reductions instead of the words, twice the registers (offline sm_90).
def _exponentials_asm(zero_byte: int) -> str:
    low = f"0x10{zero_byte}{zero_byte}"  # bytes (0, 0, a0, a1): a << 16
    high = f"0x32{zero_byte}{zero_byte}"  # bytes (0, 0, a2, a3): a & 0xffff0000
    return (f"prmt.b32 lo, $1, 0, {low}; prmt.b32 hi, $1, 0, {high}; fma.rn.f32 a, lo, 0f3FB8AA3B, $2; "
            "fma.rn.f32 b, hi, 0f3FB8AA3B, $2; ex2.approx.ftz.f32 a, a; ex2.approx.ftz.f32 b, b; ")  # log2(e)


EXPONENTIAL_SUM_ASM = tl.constexpr("{ .reg .b32 lo, hi; .reg .f32 a, b; " + _exponentials_asm(4) +
                                   "add.f32 $0, a, b; }")
GRADIENT_ASM = tl.constexpr("{ .reg .b32 lo, hi; .reg .f32 a, b; .reg .b32 packed; " + _exponentials_asm(5) +
                            "cvt.rn.bf16x2.f32 packed, b, a; xor.b32 $0, packed, $3; }")
PAIR_MAX_ASM = tl.constexpr("max.bf16x2 $0, $1, $2;")


@triton.jit
def pair_exponential_sum(words, shift):
    """exp2(low * log2(e) - shift) + exp2(high * log2(e) - shift) of each word."""
    if GPU_APPROXIMATIONS:
        return tl.inline_asm_elementwise(EXPONENTIAL_SUM_ASM, "=r,r,r",
                                         [words, tl.zeros_like(words).to(tl.float32) - shift], dtype=tl.float32,
                                         is_pure=True, pack=1)
    else:
        return tl.exp2(low_half(words) * LOG2E - shift) + tl.exp2(high_half(words) * LOG2E - shift)


@triton.jit
def pair_gradient(words, offset, sign_bits):
    """Each word's two softmax gradients, exp2(x * log2(e) + offset), rounded to bf16 (to nearest, even on ties, like
    ``Tensor.to``) and packed back into one word (the low half's in the low bits), their signs flipped where
    ``sign_bits`` (0 or int32 0x80008000: a negative grad_output) says."""
    if GPU_APPROXIMATIONS:
        return tl.inline_asm_elementwise(GRADIENT_ASM, "=r,r,r,r",
                                         [words, tl.zeros_like(words).to(tl.float32) + offset,
                                          tl.zeros_like(words) + sign_bits], dtype=tl.int32, is_pure=True, pack=1)
    else:
        low_bits = tl.exp2(low_half(words) * LOG2E + offset).to(tl.bfloat16).to(tl.int16, bitcast=True).to(tl.int32)
        high_bits = tl.exp2(high_half(words) * LOG2E + offset).to(tl.bfloat16).to(tl.int16, bitcast=True).to(tl.int32)
        return ((high_bits << 16) | (low_bits & 65535)) ^ sign_bits


@triton.jit
def pair_max(a, b):
    """The larger bf16 of each half of two words (packed ``max.bf16x2``: one instruction for two logits)."""
    if GPU_APPROXIMATIONS:
        return tl.inline_asm_elementwise(PAIR_MAX_ASM, "=r,r,r", [a, b], dtype=tl.int32, is_pure=True, pack=1)
    else:
        low = tl.maximum(low_half(a), low_half(b)).to(tl.int32, bitcast=True)
        high = tl.maximum(high_half(a), high_half(b)).to(tl.int32, bitcast=True)
        return (high & -65536) | ((low >> 16) & 65535)


@triton.jit
def words_max(words, WORDS: tl.constexpr):
    """The largest logit of a tile of words, in fp32: two rounds of :func:`pair_max` over neighbouring words (each
    thread's 16-byte vectors hold four), then the fp32 max of the halves of what is left. A quarter of the
    widenings and maxima of widening every word."""
    half = pair_max(*tl.split(tl.reshape(words, [WORDS // 2, 2])))
    quarter = pair_max(*tl.split(tl.reshape(half, [WORDS // 4, 2])))
    return tl.max(tl.maximum(low_half(quarter), high_half(quarter)), axis=0)


@triton.jit(debug=True)  # debug: keeps call_scales' device_assert (Launch.options turns Triton's overflow checks off)
def resident_row_kernel(
    logits_ptr,  # (n_rows, n_cols) bf16 logits, row stride logits_stride (both multiples of 8)
    labels_ptr,  # (n_rows,) integer labels
    mask_ptr,  # (n_rows,) bool row mask, or a dummy
    grad_ptr,  # (n_rows, n_cols) bf16 gradient out, contiguous
    ws_ptr,  # fp32 workspace: row count, row losses, finish counters (kernels.problem)
    loss_ptr,  # 0-d fp32 loss out (the mean over the rows that count)
    n_rows,
    n_cols,
    n_words,  # n_cols // 2: its own argument so that Triton sees it divisible by 16 (16-byte masked accesses)
    logits_stride,
    ignore_index,
    grad_output_ptr,  # 0-d grad_output on the device, or a dummy
    grad_output,  # grad_output as a number (GRAD_OUTPUT_IN_MEMORY false)
    HAS_MASK: tl.constexpr,
    COMPUTE_GRAD: tl.constexpr,
    GRAD_OUTPUT_IN_MEMORY: tl.constexpr,
    WORDS: tl.constexpr,  # a power of two >= n_words
):
    row = tl.program_id(0).to(tl.int64)
    lanes = tl.arange(0, WORDS)
    in_row = lanes < n_words
    x_row = logits_ptr + row * logits_stride
    x_words = x_row.to(tl.pointer_type(tl.int32), bitcast=True)
    g_words = (grad_ptr + row * n_cols).to(tl.pointer_type(tl.int32), bitcast=True)
    loss_scale, grad_scale = call_scales(ws_ptr, labels_ptr, mask_ptr, grad_output_ptr, grad_output, n_rows, n_cols,
                                         ignore_index, CE_LABELS, HAS_MASK, GRAD_OUTPUT_IN_MEMORY)
    valid, label = row_validity(labels_ptr, mask_ptr, row, ignore_index, CE_LABELS, HAS_MASK)
    if valid:
        x_label = label_logit(x_row, label, n_cols, CE_LABELS)
        words = tl.load(x_words + lanes, mask=in_row, other=NEG_INF_PAIR)
        # The maxima before the log2(e) scale (the same numbers: rounding is monotonic), as row_math.tile_statistics_raw
        m_x = words_max(words, WORDS) * LOG2E
        shift = exponent_shift(m_x)
        s_x = tl.sum(pair_exponential_sum(words, shift), axis=0)
        loss = row_loss(m_x, s_x, m_x, s_x, s_x, x_label, CE_LABELS)
        tl.store(row_losses_ptr(ws_ptr) + row, loss * loss_scale)
        if COMPUTE_GRAD:
            q_scale, p_scale, _offset = gradient_scales(s_x, s_x, 0.0, loss, grad_scale, CE_LABELS)
            # q_scale goes into the exponent (its sign into the packed bits): the exponentials' argument then depends on
            # the sum, which keeps ptxas from computing it for the whole tile before the sum's reduction (64 more
            # registers a thread at 16 warps).
            offset = tl.log2(tl.abs(q_scale)) - m_x
            sign_bits = tl.where(q_scale < 0, -2147450880, 0)  # int32 0x80008000: both halves' sign bits
            tl.store(g_words + lanes, pair_gradient(words, offset, sign_bits), mask=in_row)
            # The label's column, written again once every thread's store is done (the barrier orders them): one
            # store a row instead of a compare and two selects a word.
            if (label >= 0) & (label < n_cols):
                tl.debug_barrier()
                at_label = tl.exp2(x_label * LOG2E + offset) * tl.where(q_scale < 0, -1.0, 1.0) - p_scale
                tl.store(grad_ptr + row * n_cols + label, at_label.to(grad_ptr.dtype.element_ty))
    else:
        tl.store(row_losses_ptr(ws_ptr) + row, 0.0)
        if COMPUTE_GRAD:
            tl.store(g_words + lanes, tl.zeros([WORDS], dtype=tl.int32), mask=in_row)
    finish_program(ws_ptr, loss_ptr, n_rows)


def resident_misfit(problem: Problem) -> str | None:
    """Why the resident kernel cannot take this problem (None when it can)."""
    logits = problem.logits
    if problem.target_format != "labels":
        return "it computes cross-entropy from labels only"
    if logits.dtype != torch.bfloat16:
        return f"it reads bf16 logits only, got {logits.dtype}"
    if problem.n_cols > MAX_RESIDENT_COLS:
        return f"rows of at most {MAX_RESIDENT_COLS} columns fit in its registers, got {problem.n_cols}"
    if not problem.rows_aligned():
        return ("its rows must be 16-byte aligned (vocab and row stride multiples of 8 elements, a 16-byte aligned "
                f"base); got vocab {problem.n_cols}, stride {logits.stride(0)}, base offset {logits.data_ptr() % 16}")
    return None


def resident_fits(problem: Problem) -> bool:
    return resident_misfit(problem) is None


def default_resident_warps(n_cols: int) -> int:
    """16 warps up to 32768 columns: 32 words (64 logits) a thread at the widest, two programs per SM."""
    return min(16, max(4, next_power_of_2(n_cols) // 2048))


def resident_launch(problem: Problem, num_warps: int, workspace, loss, grad) -> Launch:
    misfit = resident_misfit(problem)
    if misfit is not None:
        raise ValueError(f"resident_row cannot run this problem: {misfit}")
    scale_args, scale_constexprs = problem.scale_args()
    args = problem.loss_args(workspace, loss, grad)
    del args["target_ptr"], args["target_stride"]  # labels: no target logits
    return Launch(
        name="fused.resident",
        fn=resident_row_kernel,
        grid=(problem.n_rows,),
        args=dict(args, n_words=problem.n_cols // 2, **scale_args),
        constexprs=dict(HAS_MASK=problem.mask is not None, COMPUTE_GRAD=problem.compute_grad, **scale_constexprs,
                        WORDS=next_power_of_2(problem.n_cols // 2)),
        num_warps=num_warps,
        maxnreg=two_program_cap(num_warps),
    )


def two_program_cap(num_warps: int) -> int | None:
    """The register cap that fits two programs per SM (65536 registers), for 16 warps or fewer (None above: 32 warps
    would need 32 registers a thread, under the words' own 16 and what the math needs). Without it ptxas gave the
    8-warp kernel 151 registers at 32000 columns (one program per SM; 126 under the cap, no spill; offline sm_90), and
    on an H200 it ran 1.4x the time of the 16-warp one (logs/explore_resident_2026-11-26.txt)."""
    cap = 65536 // (2 * 32 * num_warps) // 8 * 8
    return min(cap, 255) if cap >= 64 else None


def plan_resident_row(problem: Problem, block_size: int | None = None, num_warps: int | None = None) -> Plan:
    """The variant ``resident_row`` (also spelled ``fused`` with ``resident=True``): cross-entropy from labels, bf16,
    16-byte aligned rows of at most 32768 columns, the whole row read once and kept in registers as pairs of logits.
    ``block_size``, if given, must hold the row. A ValueError for a problem it cannot take."""
    if block_size is not None and check_block_size(block_size) < problem.n_cols:
        raise ValueError(f"resident_row reads the whole row as one tile: block_size {block_size} < vocab "
                         f"{problem.n_cols}")
    num_warps = check_num_warps(num_warps) if num_warps is not None else default_resident_warps(problem.n_cols)
    workspace, loss, grad = allocate_outputs(problem)
    launch = resident_launch(problem, num_warps, workspace, loss, grad)
    return Plan(
        variant="resident_row",
        launches=[launch],
        finish=finisher(problem, loss, grad),
        config={"block_size": 2 * launch.constexprs["WORDS"], "num_warps": num_warps, "num_tiles": 1,
                "resident": True},
        buffers=[workspace, grad, loss],
    )
