"""Ablation kernels for the case study of notebook 02: from the #497 kernel's structure to ``kernels.fused``.

They exist for the case study only. Fast-LLM issue #497 measured its Triton reverse-KL kernel (commit
27f4747e, ``fast_llm/functional/triton/entropy_loss.py``,
``triton_reverse_kl_forward_backward_kernel_from_distribution``) ~3x slower than ``torch.compile``; on our
H100 it is 6.7x slower than this project's fused kernel with the same 32K tile and 16 warps. The real
kernel is *run* from a Fast-LLM checkout (:mod:`perfutils.fast_llm`); nothing of it is copied here. This
module re-implements its structure from scratch, in one kernel whose ``tl.constexpr`` switches remove the
differences one at a time:

============================  ==========================================================================
switch (True = as in #497)    what it changes
============================  ==========================================================================
``SHAPE_CONSTEXPR`` (a)       the row length and row strides are ``tl.constexpr``; the tiles are walked by
                              a fully unrolled ``tl.static_range``, the backward last tile first, reusing
                              the forward's last tile. False: run-time ``n_cols`` and strides, the row kept
                              in registers when it fits one tile (fused's ``SINGLE_TILE``), else run-time
                              loops that re-read every tile for the gradient.
``NATURAL_EXP`` (b)           ``tl.exp`` / ``tl.log`` on natural-unit logits (each ``tl.exp`` is a multiply
                              by log2(e) plus ``ex2``). False: ``exp2`` / ``log2`` on logits scaled by
                              log2(e) once, at the load (``row_math.base2``).
``SPLIT_REDUCTIONS`` (c)      five row reductions per tile, each its own cross-warp exchange (max x, sum
                              exp x, max t, sum exp t, and the weighted sum masked with
                              ``where(col < n_cols)``). False: two tuple reductions (``tl.reduce`` of the
                              max pair and of the sum triple, ``row_math.tile_statistics``).
``RECOMPUTE_GRAD`` (c)        the backward recomputes softmax(x) = exp(x - m) / s per element (a second
                              exponential and a division) and both log-probabilities from the kept raw
                              tiles. False: the gradient from the forward's exponentials
                              (``row_math.tile_gradient``: multiply by 1/s, one ``x - t``), or one ``exp2``
                              per re-read element.
============================  ==========================================================================

Launch options complete the picture: ``num_warps`` (d; #497 picks 16 for its 32K tile, like fused) and
``num_stages`` (#497 launches with Triton's default, 3; the project's kernels with 1).

Every step runs like ``kernels.fused`` around the row math: a prologue launch (``kernels.prologue``) writes the
scales 1 / n_rows and grad_output / n_rows into the workspace, and the kernel's programs reduce the row losses into
the loss themselves (``row_math.finish_program``). #497 itself took its scale as an argument and summed its row
losses with a separate PyTorch reduction; those host-side differences are left out of the walk, which is about the
kernel's body.

:data:`STEPS` orders the switches so that step 0 is the #497 structure and each step removes one
difference; the last step is ``kernels.fused`` itself (variant ``fused``; since ae031fd its rows of several tiles
are summarised and differentiated from the raw tiles, a few instructions an element fewer than step5's base-2 tiles:
the recorded walk, ``case_497.csv``, predates that). :data:`SOLO` flips one switch
of step 0 at a time. The variants are named ``case497.<name>`` and built by :func:`prepare` (reverse KL
from target logits only), behind the ``prepare(...) -> plan`` interface of the measurement harness.

Correct on rows of finite logits (the tests run every switch combination against float64 on irregular
shapes); like #497, the ``SPLIT_REDUCTIONS`` / ``RECOMPUTE_GRAD`` forms do not guard rows with ``-inf``
logits, which the project's kernels do.
"""

from __future__ import annotations

from dataclasses import dataclass

import triton
import triton.language as tl

from kernels.launch import Launch, Plan
from kernels.problem import (MIN_BLOCK_SIZE, Problem, allocate_outputs, build_problem, check_block_size,
                             check_num_warps, finisher, next_power_of_2)
from kernels.prologue import prologue_launch
from kernels.row_math import (
    LN2,
    REVERSE_KL,
    base2,
    combine_statistics,
    finish_program,
    load_raw,
    load_scales,
    lse_difference,
    max_pair,
    row_loss,
    row_losses_ptr,
    sum_triple,
    tile_gradient,
    tile_statistics,
)

# ---------------------------------------------------------------------------------------------------------------
# Device helpers
# ---------------------------------------------------------------------------------------------------------------


@triton.jit
def exp_of(x, NATURAL_EXP: tl.constexpr):
    """exp(x) of natural-unit values (``tl.exp``) or 2**x of base-2 scaled ones (``tl.exp2``)."""
    if NATURAL_EXP:
        return tl.exp(x)
    else:
        return tl.exp2(x)


@triton.jit
def log_of(x, NATURAL_EXP: tl.constexpr):
    if NATURAL_EXP:
        return tl.log(x)
    else:
        return tl.log2(x)


@triton.jit
def load_values(ptr, cols, n_cols, NATURAL_EXP: tl.constexpr):
    """A tile as fp32 natural logits, or scaled by log2(e) (``row_math.base2``); -inf outside the row."""
    raw = load_raw(ptr, cols, n_cols, "")
    if NATURAL_EXP:
        return raw.to(tl.float32)
    else:
        return base2(raw)


@triton.jit
def online_softmax_step(ptr, cols, n_cols, m, s, FIRST: tl.constexpr, NATURAL_EXP: tl.constexpr):
    """Load one tile and fold it into a running (max, sum of exponentials), #497's per-tensor step: returns
    the tile, its exponentials against the new max, and the new max and sum (two row reductions)."""
    v = load_values(ptr, cols, n_cols, NATURAL_EXP)
    if FIRST:
        new_m = tl.max(v, 0)
        e = exp_of(v - new_m, NATURAL_EXP)
        new_s = tl.sum(e, 0)
    else:
        new_m = tl.maximum(tl.max(v, 0), m)
        e = exp_of(v - new_m, NATURAL_EXP)
        new_s = tl.sum(e, 0) + s * exp_of(m - new_m, NATURAL_EXP)
    return v, e, new_m, new_s


@triton.jit
def split_tile_update(x_ptr, t_ptr, cols, n_cols, m_x, s_x, m_t, s_t, acc, FIRST: tl.constexpr,
                      NATURAL_EXP: tl.constexpr):
    """#497's online update for one tile, in its order: x's step, then t's step, then the weighted sum
    sum(e_x * (x - t)) masked by column: five row reductions, each its own cross-warp exchange; later tiles
    rescale the running sums to the new maxima. Returns the tiles, the new (m_x, s_x, m_t, s_t, acc) and
    exp(x - m_x) against the *running* max."""
    x, e_x, new_m_x, new_s_x = online_softmax_step(x_ptr, cols, n_cols, m_x, s_x, FIRST, NATURAL_EXP)
    t, _, new_m_t, new_s_t = online_softmax_step(t_ptr, cols, n_cols, m_t, s_t, FIRST, NATURAL_EXP)
    tile_acc = tl.sum(tl.where(cols < n_cols, e_x * (x - t), 0.0), 0)
    if FIRST:
        new_acc = tile_acc
    else:
        new_acc = acc * exp_of(m_x - new_m_x, NATURAL_EXP) + tile_acc
    return x, t, new_m_x, new_s_x, new_m_t, new_s_t, new_acc, e_x


@triton.jit
def combined_tile_update(x_ptr, t_ptr, cols, n_cols, m_x, s_x, m_t, s_t, acc, FIRST: tl.constexpr,
                         NATURAL_EXP: tl.constexpr):
    """The project's form: both tiles loaded, one reduction of the max pair, one of the sum triple, then
    (after the first tile) an exact merge with the running summary; base-2 values go through ``row_math``
    unchanged. Returns the tiles, the new summary and the exponentials against the *tile's* max."""
    x = load_values(x_ptr, cols, n_cols, NATURAL_EXP)
    t = load_values(t_ptr, cols, n_cols, NATURAL_EXP)
    if NATURAL_EXP:
        tile_m_x, tile_m_t = tl.reduce((x, t), 0, max_pair)
        e_x = tl.exp(x - tile_m_x)
        e_t = tl.exp(t - tile_m_t)
        weighted = tl.where(e_x > 0, e_x * (x - t), 0.0)
        tile_s_x, tile_s_t, tile_acc = tl.reduce((e_x, e_t, weighted), 0, sum_triple)
        if FIRST:
            return x, t, tile_m_x, tile_s_x, tile_m_t, tile_s_t, tile_acc, e_x
        else:
            new_m_x = tl.maximum(m_x, tile_m_x)
            new_m_t = tl.maximum(m_t, tile_m_t)
            r_x = tl.exp(m_x - new_m_x)
            t_x = tl.exp(tile_m_x - new_m_x)
            new_s_t = s_t * tl.exp(m_t - new_m_t) + tile_s_t * tl.exp(tile_m_t - new_m_t)
            return x, t, new_m_x, s_x * r_x + tile_s_x * t_x, new_m_t, new_s_t, acc * r_x + tile_acc * t_x, e_x
    else:
        tile_m_x, tile_s_x, tile_m_t, tile_s_t, tile_acc, e_x, _ = tile_statistics(x, t, REVERSE_KL)
        if FIRST:
            return x, t, tile_m_x, tile_s_x, tile_m_t, tile_s_t, tile_acc, e_x
        else:
            new_m_x, new_s_x, new_m_t, new_s_t, new_acc = combine_statistics(
                m_x, s_x, m_t, s_t, acc, tile_m_x, tile_s_x, tile_m_t, tile_s_t, tile_acc, REVERSE_KL
            )
            return x, t, new_m_x, new_s_x, new_m_t, new_s_t, new_acc, e_x


@triton.jit
def tile_update(x_ptr, t_ptr, cols, n_cols, m_x, s_x, m_t, s_t, acc, FIRST: tl.constexpr, NATURAL_EXP: tl.constexpr,
                SPLIT_REDUCTIONS: tl.constexpr):
    """Load one tile of x and t and fold it into the running summary; returns (x, t, summary..., e_x)."""
    if SPLIT_REDUCTIONS:
        return split_tile_update(x_ptr, t_ptr, cols, n_cols, m_x, s_x, m_t, s_t, acc, FIRST, NATURAL_EXP)
    else:
        return combined_tile_update(x_ptr, t_ptr, cols, n_cols, m_x, s_x, m_t, s_t, acc, FIRST, NATURAL_EXP)


@triton.jit
def reverse_kl(m_x, s_x, m_t, s_t, acc, NATURAL_EXP: tl.constexpr):
    """KL(q || p) of a row's summary, in nats: acc / s_x - lse_x + lse_t."""
    if NATURAL_EXP:
        return acc / s_x - tl.log(s_x) - m_x + tl.log(s_t) + m_t
    else:
        return row_loss(m_x, s_x, m_t, s_t, acc, 0.0, REVERSE_KL)


@triton.jit
def recomputed_gradient(x, t, m_x, s_x, m_t, s_t, kl, grad_scale, NATURAL_EXP: tl.constexpr):
    """#497's backward for one tile: softmax(x) recomputed from the raw tile (a second exponential and a
    division per element) times log q - log p - KL, with both log-probabilities formed per element."""
    log_p = t - m_t - log_of(s_t, NATURAL_EXP)
    q = exp_of(x - m_x, NATURAL_EXP) / s_x
    log_q = x - m_x - log_of(s_x, NATURAL_EXP)
    if NATURAL_EXP:
        return grad_scale * (log_q - log_p - kl) * q
    else:
        return grad_scale * ((log_q - log_p) * LN2 - kl) * q


@triton.jit
def kept_gradient(e_x, x, t, cols, m_x, s_x, m_t, s_t, kl, grad_scale, NATURAL_EXP: tl.constexpr):
    """The project's backward for one tile from exponentials e_x = exp(x - m_x) against the row max:
    q = e_x * (1 / s_x), one x - t, the row constants folded (``row_math.tile_gradient``)."""
    if NATURAL_EXP:
        lse_diff = m_x + tl.log(s_x) - m_t - tl.log(s_t)
        grad = tl.where(e_x > 0, e_x * (1.0 / s_x) * ((x - t) - lse_diff - kl), 0.0)
    else:
        lse_diff2 = lse_difference(m_x, s_x, m_t, s_t)
        grad = tile_gradient(e_x, 1.0 / s_x, e_x, 1.0 / s_t, x - t, cols, -1, lse_diff2, kl, REVERSE_KL)
    return grad * grad_scale


@triton.jit
def tile_grad(e_x, x, t, cols, m_x, s_x, m_t, s_t, kl, grad_scale, NATURAL_EXP: tl.constexpr,
              RECOMPUTE_GRAD: tl.constexpr):
    if RECOMPUTE_GRAD:
        return recomputed_gradient(x, t, m_x, s_x, m_t, s_t, kl, grad_scale, NATURAL_EXP)
    else:
        return kept_gradient(e_x, x, t, cols, m_x, s_x, m_t, s_t, kl, grad_scale, NATURAL_EXP)


# ---------------------------------------------------------------------------------------------------------------
# Row bodies: the #497 structure (constexpr shape, unrolled) and the project's (run-time shape)
# ---------------------------------------------------------------------------------------------------------------


@triton.jit
def unrolled_row(x_row, t_row, g_row, loss_row_ptr, grad_scale, loss_scale, cols, N_COLS: tl.constexpr,
                 BLOCK_SIZE: tl.constexpr, NATURAL_EXP: tl.constexpr, SPLIT_REDUCTIONS: tl.constexpr,
                 RECOMPUTE_GRAD: tl.constexpr):
    """#497's walk: tl.static_range over the constexpr row, then the backward from the last tile down,
    reusing the last tile (and, where they are against the row max, its exponentials) from the forward."""
    m_x = 0.0
    s_x = 0.0
    m_t = 0.0
    s_t = 0.0
    acc = 0.0
    for start in tl.static_range(0, N_COLS, BLOCK_SIZE):
        x, t, m_x, s_x, m_t, s_t, acc, e_x = tile_update(x_row + start, t_row + start, cols, N_COLS - start, m_x, s_x,
                                                         m_t, s_t, acc, start == 0, NATURAL_EXP, SPLIT_REDUCTIONS)
    kl = reverse_kl(m_x, s_x, m_t, s_t, acc, NATURAL_EXP)
    tl.store(loss_row_ptr, kl * loss_scale)

    LAST: tl.constexpr = (N_COLS - 1) // BLOCK_SIZE * BLOCK_SIZE
    # The last tile's exponentials are against the row max when the split update made them (it rescales
    # as it goes) or when the row is one tile; the combined update's are against the tile's own max.
    REUSE_EXP: tl.constexpr = SPLIT_REDUCTIONS or LAST == 0
    for start in tl.static_range(LAST, -1, -BLOCK_SIZE):
        if start != LAST:
            x = load_values(x_row + start, cols, N_COLS - start, NATURAL_EXP)
            t = load_values(t_row + start, cols, N_COLS - start, NATURAL_EXP)
        if not RECOMPUTE_GRAD:
            if start != LAST or not REUSE_EXP:
                e_x = exp_of(x - m_x, NATURAL_EXP)
        grad = tile_grad(e_x, x, t, cols, m_x, s_x, m_t, s_t, kl, grad_scale, NATURAL_EXP, RECOMPUTE_GRAD)
        tl.store(g_row + start + cols, grad.to(g_row.dtype.element_ty), mask=cols < N_COLS - start)


@triton.jit
def looped_row(x_row, t_row, g_row, loss_row_ptr, n_cols, grad_scale, loss_scale, cols, BLOCK_SIZE: tl.constexpr,
               SINGLE_TILE: tl.constexpr, NATURAL_EXP: tl.constexpr, SPLIT_REDUCTIONS: tl.constexpr,
               RECOMPUTE_GRAD: tl.constexpr):
    """The project's walk (``kernels.fused``): one tile kept in registers when the row fits, else a run-time
    loop for the statistics and a second one that re-reads every tile for the gradient."""
    x, t, m_x, s_x, m_t, s_t, acc, e_x = tile_update(x_row, t_row, cols, n_cols, 0.0, 0.0, 0.0, 0.0, 0.0, True,
                                                     NATURAL_EXP, SPLIT_REDUCTIONS)
    if not SINGLE_TILE:
        for start in range(BLOCK_SIZE, n_cols, BLOCK_SIZE):
            _, _, m_x, s_x, m_t, s_t, acc, _ = tile_update(x_row + start, t_row + start, cols, n_cols - start, m_x, s_x,
                                                           m_t, s_t, acc, False, NATURAL_EXP, SPLIT_REDUCTIONS)
    kl = reverse_kl(m_x, s_x, m_t, s_t, acc, NATURAL_EXP)
    tl.store(loss_row_ptr, kl * loss_scale)
    if SINGLE_TILE:
        grad = tile_grad(e_x, x, t, cols, m_x, s_x, m_t, s_t, kl, grad_scale, NATURAL_EXP, RECOMPUTE_GRAD)
        tl.store(g_row + cols, grad.to(g_row.dtype.element_ty), mask=cols < n_cols)
    else:
        for start in range(0, n_cols, BLOCK_SIZE):
            tile_x = load_values(x_row + start, cols, n_cols - start, NATURAL_EXP)
            tile_t = load_values(t_row + start, cols, n_cols - start, NATURAL_EXP)
            tile_e_x = tile_x
            if not RECOMPUTE_GRAD:
                tile_e_x = exp_of(tile_x - m_x, NATURAL_EXP)
            grad = tile_grad(tile_e_x, tile_x, tile_t, cols + start, m_x, s_x, m_t, s_t, kl, grad_scale, NATURAL_EXP,
                             RECOMPUTE_GRAD)
            tl.store(g_row + start + cols, grad.to(g_row.dtype.element_ty), mask=cols < n_cols - start)


@triton.jit
def ablation_reverse_kl_kernel(
    logits_ptr,  # (n_rows, n_cols) logits
    target_ptr,  # (n_rows, n_cols) target logits
    grad_ptr,  # (n_rows, n_cols) gradient out, contiguous, logits' dtype
    ws_ptr,  # fp32 workspace (kernels.problem): the scales in (written by the prologue), row losses out
    loss_ptr,  # 0-d fp32 loss out (the mean over rows), summed by the last program (row_math.finish_program)
    n_rows,
    n_cols,  # run-time row length (SHAPE_CONSTEXPR=False)
    logits_stride,
    target_stride,
    N_COLS: tl.constexpr,  # the same three as constants (SHAPE_CONSTEXPR=True; None otherwise)
    LOGITS_STRIDE: tl.constexpr,
    TARGET_STRIDE: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    SINGLE_TILE: tl.constexpr,  # n_cols <= BLOCK_SIZE (SHAPE_CONSTEXPR=False)
    SHAPE_CONSTEXPR: tl.constexpr,
    NATURAL_EXP: tl.constexpr,
    SPLIT_REDUCTIONS: tl.constexpr,
    RECOMPUTE_GRAD: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_SIZE)
    loss_scale, grad_scale = load_scales(ws_ptr)  # 1 / n_rows, grad_output / n_rows
    loss_row_ptr = row_losses_ptr(ws_ptr) + row
    if SHAPE_CONSTEXPR:
        unrolled_row(logits_ptr + row * LOGITS_STRIDE, target_ptr + row * TARGET_STRIDE, grad_ptr + row * N_COLS,
                     loss_row_ptr, grad_scale, loss_scale, cols, N_COLS, BLOCK_SIZE, NATURAL_EXP,
                     SPLIT_REDUCTIONS, RECOMPUTE_GRAD)
    else:
        looped_row(logits_ptr + row * logits_stride, target_ptr + row * target_stride, grad_ptr + row * n_cols,
                   loss_row_ptr, n_cols, grad_scale, loss_scale, cols, BLOCK_SIZE, SINGLE_TILE, NATURAL_EXP,
                   SPLIT_REDUCTIONS, RECOMPUTE_GRAD)
    finish_program(ws_ptr, loss_ptr, n_rows)


# ---------------------------------------------------------------------------------------------------------------
# Steps and host side
# ---------------------------------------------------------------------------------------------------------------

SWITCHES = ("SHAPE_CONSTEXPR", "NATURAL_EXP", "SPLIT_REDUCTIONS", "RECOMPUTE_GRAD")
PREFIX = "case497."
NUM_STAGES_497 = 3  # Triton's default for CUDA: #497's launch passes none
NUM_STAGES_PROJECT = 1  # kernels.launch.Launch's default


@dataclass(frozen=True)
class Step:
    """One kernel of the walk: the switches that are still as in #497, and what the step removed."""

    name: str
    switches: frozenset  # names in SWITCHES that are True
    num_stages: int
    removes: str  # the difference this step removes, relative to the previous one ("" for step 0)

    @property
    def variant(self) -> str:
        return PREFIX + self.name

    def constexprs(self) -> dict:
        return {name: name in self.switches for name in SWITCHES}


_ALL = frozenset(SWITCHES)
# Step k removes one difference from step k - 1; "fused" (kernels.fused, the project's kernel) ends the walk.
STEPS = (
    Step("step0", _ALL, NUM_STAGES_497, ""),
    Step("step1", _ALL - {"RECOMPUTE_GRAD"}, NUM_STAGES_497,
         "(c) backward from the forward's exponentials: no second exp, no per-element division"),
    Step("step2", _ALL - {"RECOMPUTE_GRAD", "SPLIT_REDUCTIONS"}, NUM_STAGES_497,
         "(c) two tuple reductions instead of five separate ones"),
    Step("step3", frozenset({"SHAPE_CONSTEXPR"}), NUM_STAGES_497, "(b) exp2/log2 on base-2 scaled logits"),
    Step("step4", frozenset(), NUM_STAGES_497, "(a) run-time n_cols and strides, no unrolled tile walk"),
    Step("step5", frozenset(), NUM_STAGES_PROJECT, "(e) num_stages 1 (the project's launches)"),
)
FINAL_VARIANT = "fused"  # after step5: kernels.fused itself (its row-validity branch, its argument list)
FINAL_REMOVES = "(e) kernels.fused itself: its run-time row-validity branch and argument list"
# Step 0 with one difference removed, to read each effect without the others (RECOMPUTE_GRAD alone is step1).
SOLO = tuple(
    Step(f"solo_{short}", _ALL - {switch}, NUM_STAGES_497, f"only: {switch} off")
    for short, switch in (("shape", "SHAPE_CONSTEXPR"), ("exp", "NATURAL_EXP"), ("reduce", "SPLIT_REDUCTIONS"))
)
STEPS_BY_VARIANT = {step.variant: step for step in (*STEPS, *SOLO)}
VARIANTS = tuple(STEPS_BY_VARIANT)


def default_config(n_cols: int) -> tuple[int, int]:
    """#497's defaults: a tile as wide as the row up to 32K, 16 warps from 8K-wide tiles on."""
    block_size = min(max(next_power_of_2(n_cols), MIN_BLOCK_SIZE), 32768)
    return block_size, 4 if block_size < 2048 else (8 if block_size < 8192 else 16)


def step_of(variant: str) -> Step:
    try:
        return STEPS_BY_VARIANT[variant]
    except KeyError:
        raise ValueError(f"unknown ablation variant {variant!r}; expected one of {list(VARIANTS)}") from None


def ablation_launch(step: Step, problem: Problem, workspace, loss, grad, *, block_size: int,
                    num_warps: int) -> Launch:
    """The launch of one step on a checked reverse-KL problem (``kernels.problem.build_problem``; any row stride)
    with its outputs (``kernels.problem.allocate_outputs``). It reads the scales the prologue writes into the
    workspace, so it runs after :func:`kernels.prologue.prologue_launch` (:func:`plan_step` puts both in a plan)."""
    if (problem.loss, problem.target_format) != ("reverse_kl", "logits") or not problem.compute_grad:
        raise ValueError("the ablation kernels compute reverse KL from target logits with its gradient")
    logits, target = problem.logits, problem.target
    n_rows, n_cols = logits.shape
    shape_constexpr = "SHAPE_CONSTEXPR" in step.switches
    return Launch(
        name=step.variant,
        fn=ablation_reverse_kl_kernel,
        grid=(n_rows,),
        args=dict(
            logits_ptr=logits, target_ptr=target, grad_ptr=grad, ws_ptr=workspace, loss_ptr=loss, n_rows=n_rows,
            n_cols=n_cols, logits_stride=logits.stride(0), target_stride=target.stride(0),
        ),
        constexprs=dict(
            N_COLS=n_cols if shape_constexpr else None,
            LOGITS_STRIDE=logits.stride(0) if shape_constexpr else None,
            TARGET_STRIDE=target.stride(0) if shape_constexpr else None,
            BLOCK_SIZE=block_size,
            SINGLE_TILE=n_cols <= block_size,
            **step.constexprs(),
        ),
        num_warps=num_warps,
        num_stages=step.num_stages,
    )


def plan_step(step: Step, problem: Problem, block_size: int | None = None, num_warps: int | None = None) -> Plan:
    """The plan of one step: the prologue (row count, scales, counters: ``kernels.prologue``), then the step's
    kernel, which reduces the loss itself, like ``kernels.fused``. ``block_size``/``num_warps`` None: #497's."""
    default_block, default_warps = default_config(problem.n_cols)
    block_size = check_block_size(block_size) if block_size is not None else default_block
    num_warps = check_num_warps(num_warps) if num_warps is not None else default_warps
    workspace, loss, grad = allocate_outputs(problem)
    launch = ablation_launch(step, problem, workspace, loss, grad, block_size=block_size, num_warps=num_warps)
    return Plan(
        variant=step.variant,
        launches=[launch] if problem.n_rows else [],
        finish=finisher(problem, loss, grad),
        config={"block_size": block_size, "num_warps": num_warps, "num_stages": step.num_stages,
                **step.constexprs()},
        buffers=[workspace, grad, loss],
        prologue=prologue_launch(problem, workspace, loss),
    )


def prepare(logits, target, *, loss="reverse_kl", target_format="logits", variant="case497.step0",
            block_size=None, num_warps=None, grad_output=1.0, ignore_index=-100, loss_mask=None, **options) -> Plan:
    """``Plan`` of one ablation step (reverse KL from target logits, mean over rows); ``run()`` -> (loss, grad)."""
    step = step_of(variant)
    if options:
        raise TypeError(f"ablation variant {variant!r} takes no option(s) {sorted(options)}")
    if (loss, target_format) != ("reverse_kl", "logits"):
        raise ValueError(f"the ablation kernels compute reverse KL from target logits, got {loss!r}/{target_format!r}")
    if loss_mask is not None or grad_output is None:
        raise ValueError("the ablation kernels take no loss_mask and always compute the gradient (grad_output)")
    problem = build_problem(logits, target, loss=loss, target_format=target_format, grad_output=grad_output,
                            ignore_index=ignore_index, loss_mask=None)
    return plan_step(step, problem, block_size, num_warps)
