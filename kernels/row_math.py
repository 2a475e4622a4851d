"""Row-softmax statistics shared by every variant, as small @triton.jit helpers.

All math runs in fp32 on *base-2 scaled* logits (``x2 = x * log2(e)``) so each exponential is one
``exp2`` (a single MUFU instruction on NVIDIA GPUs) with ``log2(e)`` folded into the load.

A row (or a tile or a chunk of it) is summarised by five numbers:

    m_x, s_x   max of x2 and sum of exp2(x2 - m_x)
    m_t, s_t   the same for the target logits t2 (target-distribution losses only)
    acc        the loss's weighted sum, scaled like the distribution it is weighted by:
                 cross-entropy from logits  sum exp2(t2 - m_t) * x2
                 forward KL                 sum exp2(t2 - m_t) * (t2 - x2)
                 reverse KL                 sum exp2(x2 - m_x) * (x2 - t2)

Summaries of disjoint parts combine exactly (online softmax), which is what lets a row be split
over tiles (fused, two_pass) or over programs (split_row).

-inf logits are allowed (masked vocabulary entries): a part whose max is -inf has s = 0 and
contributes nothing; an element with zero probability contributes 0 to ``acc`` (0·log 0 := 0).
A row whose every logit is -inf ends with s = 0 and gives NaN, like PyTorch; NaN inputs propagate.
"""

import triton
import triton.language as tl
from triton.language.extra import libdevice

from . import problem as _layout
from .launch import interpreting

# Loss codes, the LOSS constexpr of every kernel (kernels.problem.LOSS_CODES, as constexprs the kernels can compare).
CE_LABELS = tl.constexpr(_layout.LOSS_CODES[("cross_entropy", "labels")])
CE_LOGITS = tl.constexpr(_layout.LOSS_CODES[("cross_entropy", "logits")])
FORWARD_KL = tl.constexpr(_layout.LOSS_CODES[("forward_kl", "logits")])
REVERSE_KL = tl.constexpr(_layout.LOSS_CODES[("reverse_kl", "logits")])

# Workspace layout (kernels.problem): finish counters, the loss, the scales, the row losses.
WS_GROUPS = tl.constexpr(_layout.WS_GROUPS)
WS_DONE = tl.constexpr(_layout.WS_DONE)
WS_COUNT = tl.constexpr(_layout.WS_COUNT)
WS_GEN = tl.constexpr(_layout.WS_GEN)
WS_LOSS_SCALE = tl.constexpr(_layout.WS_LOSS_SCALE)
WS_GRAD_SCALE = tl.constexpr(_layout.WS_GRAD_SCALE)
WS_ROWS = tl.constexpr(_layout.WS_ROWS)
SUM_BLOCK = tl.constexpr(1024)  # row losses summed per step by the last program
COUNT_BLOCK = tl.constexpr(1024)  # rows counted per step (count_rows); >= a program's threads (call_scales)

# The Triton interpreter (TRITON_INTERPRET=1, the CPU tests) has no libdevice: FAST math keeps the exact log2 there.
GPU_APPROXIMATIONS = tl.constexpr(not interpreting())

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)
FLOAT32_MAX = tl.constexpr(3.4028234663852886e38)


@triton.jit
def exponent_shift(m):
    """The shift used in exp2(x2 - shift): the max itself, or 0 when the max is -inf (avoids -inf - -inf)."""
    return tl.where(m == float("-inf"), 0.0, m)


@triton.jit
def rescale(m_from, m_to):
    """Factor that moves a sum of exponentials taken relative to m_from onto m_to (0 for an empty part)."""
    return tl.where(m_from == float("-inf"), 0.0, tl.exp2(m_from - m_to))


@triton.jit
def max_pair(a_max, b_max, a2_max, b2_max):
    """Combine function of one ``tl.reduce`` over two tiles: both maxima at once."""
    return tl.maximum(a_max, a2_max), tl.maximum(b_max, b2_max)


@triton.jit
def sum_triple(a, b, c, a2, b2, c2):
    """Combine function of one ``tl.reduce`` over three tiles: three sums at once."""
    return a + a2, b + b2, c + c2


@triton.jit
def widen(x):
    """A tile as fp32. bf16 in a compiled kernel: one instruction per element (the low half of each 32-bit pair shifted
    up, the high half masked), where ptxas's own conversion takes two for the high half (a byte permute, then a
    shift)."""
    if x.dtype == tl.bfloat16 and GPU_APPROXIMATIONS:
        return tl.inline_asm_elementwise("{ shl.b32 $0, $2, 16; and.b32 $1, $2, 0xffff0000; }", "=r,=r,r", [x],
                                         dtype=tl.float32, is_pure=True, pack=2)
    else:
        return x.to(tl.float32)


@triton.jit
def base2(x):
    """fp32 base-2 scaled values x * log2(e) of a tile in its input dtype."""
    return widen(x) * LOG2E


@triton.jit
def load_raw(ptr, cols, n_cols, EVICTION: tl.constexpr, FILL: tl.constexpr = True):
    """A tile in its input dtype, -inf outside the row (everywhere when n_cols <= 0: nothing is read).
    EVICTION: the L2 policy of the load ("" default, "evict_first", "evict_last"). FILL=False: lanes outside the row
    are left undefined, for a tile whose outside lanes are never used (a gradient tile, its store masked the same
    way): no register is set to -inf before each masked load (one instruction per 32-bit register)."""
    if FILL:
        return tl.load(ptr + cols, mask=cols < n_cols, other=float("-inf"), eviction_policy=EVICTION)
    else:
        return tl.load(ptr + cols, mask=cols < n_cols, eviction_policy=EVICTION)


@triton.jit
def load_raw_tiles(x_ptr, t_ptr, cols, n_cols, LOSS: tl.constexpr, EVICTION: tl.constexpr, FILL: tl.constexpr = True):
    """The logits tile and, for the target-distribution losses, the target tile (else the logits
    again), in the input dtype (see load_raw)."""
    x = load_raw(x_ptr, cols, n_cols, EVICTION, FILL)
    t = x
    if LOSS != CE_LABELS:
        t = load_raw(t_ptr, cols, n_cols, EVICTION, FILL)
    return x, t


@triton.jit
def load_tiles(x_ptr, t_ptr, cols, n_cols, LOSS: tl.constexpr):
    """The logits tile and, for the target-distribution losses, the target tile (else the logits again),
    as fp32 base-2 scaled values (x2, t2)."""
    x2 = base2(load_raw(x_ptr, cols, n_cols, ""))
    t2 = x2
    if LOSS != CE_LABELS:
        t2 = base2(load_raw(t_ptr, cols, n_cols, ""))
    return x2, t2


@triton.jit
def row_peel(row_offset, n_cols, PEEL: tl.constexpr, VEC: tl.constexpr):
    """(head, body) of a row that starts ``row_offset`` elements after a 16-byte-aligned base.

    With PEEL, the first ``head`` (< VEC) columns come before the row's first 16-byte boundary and the next
    ``body`` columns are whole 16-byte vectors (``body`` a multiple of VEC, declared so to the compiler); the
    last ``n_cols - head - body`` (< VEC) columns are the tail. Head and tail go through one small scalar tile
    (:func:`load_edge`), the body through 16-byte loads and stores. A vocab like 50257 (a bf16 row of 100,514
    bytes) otherwise makes every access scalar: Triton proves 16-byte alignment only for values divisible by 16.
    Without PEEL: (0, n_cols), the code as before."""
    if PEEL:
        head = ((VEC - row_offset % VEC) % VEC).to(tl.int32)
        head = tl.minimum(head, n_cols)
        body = tl.multiple_of(((n_cols - head) // VEC) * VEC, VEC)
    else:
        head = 0
        body = n_cols
    return head, body


@triton.jit
def body_offset(row_offset, head, PEEL: tl.constexpr, VEC: tl.constexpr):
    """Element offset of a row's body: a multiple of VEC with PEEL (16-byte aligned), for the compiler too."""
    offset = row_offset + head
    if PEEL:
        offset = tl.multiple_of(offset, VEC)
    return offset


@triton.jit
def edge_columns(head, body, n_cols, VEC: tl.constexpr):
    """The columns of a row's head and tail tile (:func:`load_edge`) and which of its lanes are in the row."""
    lanes = tl.arange(0, 2 * VEC)
    cols = tl.where(lanes < head, lanes, body + lanes)
    return cols, cols < n_cols


@triton.jit
def load_edge(x_row, t_row, head, body, n_cols, take, LOSS: tl.constexpr, VEC: tl.constexpr):
    """A row's head and tail columns (see :func:`row_peel`) as one tile of 2 * VEC lanes: (x2, t2, cols, valid);
    nothing is read where ``take`` is false (a scalar: lets a caller issue the loads early, unconditionally)."""
    cols, in_row = edge_columns(head, body, n_cols, VEC)
    valid = in_row & take
    x2 = base2(tl.load(x_row + cols, mask=valid, other=float("-inf")))
    t2 = x2
    if LOSS != CE_LABELS:
        t2 = base2(tl.load(t_row + cols, mask=valid, other=float("-inf")))
    return x2, t2, cols, valid


@triton.jit
def label_in_tile(label, tile_start, TILE: tl.constexpr):
    """The label as a lane of a tile of TILE columns that starts at column ``tile_start`` (a peeled row's head
    included), int32, -1 when the label is not in the tile: what :func:`tile_gradient` compares with the tile's own
    lanes. The row's columns (lanes + start + head) against the int64 label cost a 64-bit add and compare per element:
    labels CE ran 6-7 points of copy bandwidth slower (logs/explore_peel_2026-11-26.txt)."""
    lane = label - tile_start
    return tl.where((lane >= 0) & (lane < TILE), lane, -1).to(tl.int32)


@triton.jit
def row_validity(labels_ptr, mask_ptr, row, ignore_index, LOSS: tl.constexpr, HAS_MASK: tl.constexpr):
    """(valid, label): whether the row enters the loss (label != ignore_index, mask set) and its label."""
    valid = row >= 0  # a run-time "true", so `valid` is always a tensor
    label = -1
    if LOSS == CE_LABELS:
        label = tl.load(labels_ptr + row).to(tl.int64)
        valid = label != ignore_index
    if HAS_MASK:
        valid = valid & (tl.load(mask_ptr + row) != 0)
    return valid, label


@triton.jit
def label_logit(x_row, label, n_cols, LOSS: tl.constexpr):
    """x[label] as fp32 for cross-entropy from labels (0 for the other losses, which do not use it).
    A label outside [0, n_cols) reads nothing and gives NaN (the scales are NaN too: :func:`call_scales`)."""
    x_label = 0.0
    if LOSS == CE_LABELS:
        x_label = tl.load(x_row + label, mask=(label >= 0) & (label < n_cols), other=float("nan")).to(tl.float32)
    return x_label


@triton.jit
def row_losses_ptr(ws_ptr):
    """Where the (scaled) row losses live in the workspace."""
    return ws_ptr + WS_ROWS


@triton.jit
def load_scales(ws_ptr):
    """(1 / n_valid, grad_output / n_valid), written by the prologue (kernels.prologue: the vocab-parallel and
    case-study kernels; the variants' kernels work them out themselves, :func:`call_scales`)."""
    return tl.load(ws_ptr + WS_LOSS_SCALE), tl.load(ws_ptr + WS_GRAD_SCALE)


@triton.jit
def count_rows(labels_ptr, mask_ptr, n_rows, n_cols, ignore_index, LOSS: tl.constexpr, HAS_MASK: tl.constexpr):
    """(rows that enter the mean, labels out of range): labels != ignore_index and in [0, n_cols), mask set."""
    offsets = tl.arange(0, COUNT_BLOCK)
    counted = tl.zeros([COUNT_BLOCK], dtype=tl.int32)
    bad = tl.zeros([COUNT_BLOCK], dtype=tl.int32)
    for start in range(0, n_rows, COUNT_BLOCK):
        rows = start + offsets
        keep = rows < n_rows
        if LOSS == CE_LABELS:
            label = tl.load(labels_ptr + rows, mask=keep, other=ignore_index)
            labelled = keep & (label != ignore_index)
            bad += (labelled & ((label < 0) | (label >= n_cols))).to(tl.int32)
            keep = labelled
        if HAS_MASK:
            keep = keep & (tl.load(mask_ptr + rows, mask=rows < n_rows, other=0) != 0)
        counted += keep.to(tl.int32)
    return tl.sum(counted, axis=0), tl.sum(bad, axis=0)


# noinline: a call, not a branch, at the top of the loss kernels. Inlined, its branch made ptxas give the lagged
# kernel twice the registers (64 -> 127 for labels CE at 131072 columns, sm_90 offline compile): half the occupancy.
@triton.jit(noinline=True)
def call_scales(ws_ptr, labels_ptr, mask_ptr, grad_output_ptr, grad_output, n_rows, n_cols, ignore_index,
                LOSS: tl.constexpr, HAS_MASK: tl.constexpr, GRAD_OUTPUT_IN_MEMORY: tl.constexpr):
    """(1 / n_valid, grad_output / n_valid) for this call, worked out inside the loss kernel (no prologue launch).

    Without labels or a mask every row counts: n_valid = n_rows, nothing to read. Otherwise the count is shared
    through one int32 word of the workspace (WS_COUNT: n_valid + 1, -1 for an out-of-range label, 0 until known):
    a program that finds it 0 counts the rows itself (a few KB of labels, from L2 after the first reader) and
    publishes; a program that finds it set reads it. Every counter finds the same number, so the race is benign
    and no program ever waits for another (safe on any grid, under the interpreter too). The word is one value
    written whole: no fence needed. The last program zeroes it for the next call (:func:`finish_program`).

    An out-of-range label makes both scales NaN (loss and gradient NaN, never a finite wrong number) and trips a
    device-side assert in the programs that counted (the kernel is compiled with debug=True for it)."""
    n_counted = n_rows
    bad = n_rows < 0  # a run-time "false"
    if LOSS == CE_LABELS or HAS_MASK:
        word_ptr = ws_ptr.to(tl.pointer_type(tl.int32), bitcast=True) + WS_COUNT
        # Every thread loads the word, and another program may publish it meanwhile: a plain scalar load could leave
        # some warps at 0 and others past it, splitting the branch (and its reductions' barriers) inside a program.
        # The max over one load per lane is one value for the whole program.
        word = tl.max(tl.load(word_ptr + tl.zeros([COUNT_BLOCK], dtype=tl.int32), volatile=True), axis=0)
        if word == 0:
            n_valid, n_bad = count_rows(labels_ptr, mask_ptr, n_rows, n_cols, ignore_index, LOSS, HAS_MASK)
            word = tl.where(n_bad > 0, -1, n_valid + 1)
            tl.store(word_ptr, word)
            assert_labels_in_range(n_bad)
        n_counted = word - 1
        bad = word < 0
    return mean_scales(n_counted, bad, grad_output_ptr, grad_output, GRAD_OUTPUT_IN_MEMORY)


@triton.jit
def mean_scales(n_counted, bad, grad_output_ptr, grad_output, GRAD_OUTPUT_IN_MEMORY: tl.constexpr):
    """(1 / n, grad_output / n) with n = max(n_counted, 1) (an empty mean: loss 0, gradient 0); both NaN when
    ``bad`` (an out-of-range label). grad_output is read from the device when the caller gave a tensor."""
    if GRAD_OUTPUT_IN_MEMORY:
        grad_output = tl.load(grad_output_ptr).to(tl.float32)
    poison = tl.where(bad, float("nan"), 0.0)  # NaN + x is NaN; 0 + x is x
    n_valid = tl.maximum(n_counted, 1).to(tl.float32)
    return 1.0 / n_valid + poison, grad_output / n_valid + poison


@triton.jit
def assert_labels_in_range(n_bad):
    """The device-side assert of an out-of-range label (kept only in kernels compiled with debug=True)."""
    tl.device_assert(n_bad == 0, "target (labels) out of range: every label must lie in [0, n_cols) or equal "
                     "ignore_index")


@triton.jit
def finish_program(ws_ptr, loss_ptr, n_rows):
    """Every program of the kernel that writes row losses calls this once, after its last row-loss store.

    Programs count themselves in WS_GROUPS interleaved groups (one fp32 counter each: same-address atomics
    serialize, so one counter for 16K programs cost ~20 us on the H100); the program that completes a group
    counts it in WS_DONE, and the one that completes the last group sums the row losses into the loss, in a
    fixed order (deterministic). Release/acquire atomics order the row-loss stores before the sum; the sum
    reads with volatile loads (L1 is not coherent across SMs). That program then re-zeroes the header."""
    pid = tl.program_id(0) + tl.program_id(1) * tl.num_programs(0)
    n_programs = tl.num_programs(0) * tl.num_programs(1)
    group = pid % WS_GROUPS
    group_size = (n_programs - group + WS_GROUPS - 1) // WS_GROUPS
    before = tl.atomic_add(ws_ptr + group, 1.0, sem="acq_rel")
    if before.to(tl.int32) == group_size - 1:
        groups_done = tl.atomic_add(ws_ptr + WS_DONE, 1.0, sem="acq_rel")
        if groups_done.to(tl.int32) == tl.minimum(n_programs, WS_GROUPS) - 1:
            offsets = tl.arange(0, SUM_BLOCK)
            total = tl.zeros([SUM_BLOCK], dtype=tl.float32)
            rows = ws_ptr + WS_ROWS
            for start in range(0, n_rows, SUM_BLOCK):
                total += tl.load(rows + start + offsets, mask=offsets < n_rows - start, other=0.0, volatile=True)
            tl.store(loss_ptr, tl.sum(total, axis=0))
            # Every other program has finished: leave the header as the next call expects it (counters and the
            # row count zeroed, one more call finished), so no launch has to re-initialize it.
            header = tl.arange(0, 128)
            tl.store(ws_ptr + header, tl.zeros([128], dtype=tl.float32), mask=header <= WS_COUNT)
            gen_ptr = ws_ptr.to(tl.pointer_type(tl.int32), bitcast=True) + WS_GEN
            tl.store(gen_ptr, tl.load(gen_ptr, volatile=True) + 1)


@triton.jit
def tile_statistics(x2, t2, LOSS: tl.constexpr):
    """Summarise one tile; also return the tile's exponentials so callers can keep them (no recompute).

    Returns (m_x, s_x, m_t, s_t, acc, e_x, e_t); the target entries are dummies for CE_LABELS.
    Max and sums each go through a single reduction (one cross-warp exchange each, not five).
    """
    if LOSS == CE_LABELS:
        m_x = tl.max(x2, axis=0)
        e_x = tl.exp2(x2 - exponent_shift(m_x))
        s_x = tl.sum(e_x, axis=0)
        zero = tl.sum(tl.zeros_like(x2), axis=0)
        return m_x, s_x, zero, zero, zero, e_x, e_x
    else:
        m_x, m_t = tl.reduce((x2, t2), 0, max_pair)
        e_x = tl.exp2(x2 - exponent_shift(m_x))
        e_t = tl.exp2(t2 - exponent_shift(m_t))
        s_x, s_t, acc = tl.reduce((e_x, e_t, weighted_terms(e_x, e_t, x2, t2, LOSS)), 0, sum_triple)
        return m_x, s_x, m_t, s_t, acc, e_x, e_t


@triton.jit
def weighted_terms(e_x, e_t, x, t, LOSS: tl.constexpr):
    """The terms of a tile's weighted sum (``acc``, see the module docstring) in the units of ``x`` and ``t``; 0 where
    the weighting probability is 0 (0 * log 0 := 0: no NaN from -inf logits)."""
    if LOSS == CE_LOGITS:
        weighted = tl.where(e_t > 0, e_t * x, 0.0)
    elif LOSS == FORWARD_KL:
        weighted = tl.where(e_t > 0, e_t * (t - x), 0.0)
    else:
        weighted = tl.where(e_x > 0, e_x * (x - t), 0.0)
    return weighted


@triton.jit
def weighted_terms_fused(e_x, e_t, x, t, LOSS: tl.constexpr):
    """:func:`weighted_terms` with the zero taken before the multiply (the weight times 0 where it is 0), so the
    multiply and the sum's add fuse into one instruction. (Its own function: as a flag of weighted_terms, with the
    weight and term picked first, the lagged forward-KL kernel compiled to 34 more instructions a step.)"""
    if LOSS == CE_LOGITS:
        weighted = e_t * tl.where(e_t > 0, x, 0.0)
    elif GPU_APPROXIMATIONS:
        # The KLs' difference is -inf or NaN (-inf - -inf) exactly where the weight is 0 (a bad row apart, which its
        # sums make NaN): the GPU's max.f32 returns -FLOAT32_MAX there (it drops a NaN), so the product is 0 with
        # one instruction instead of a compare and a select. (The interpreter's maximum keeps NaN: the select below.)
        if LOSS == FORWARD_KL:
            weighted = e_t * tl.maximum(t - x, -FLOAT32_MAX)
        else:
            weighted = e_x * tl.maximum(x - t, -FLOAT32_MAX)
    elif LOSS == FORWARD_KL:
        weighted = e_t * tl.where(e_t > 0, t - x, 0.0)
    else:
        weighted = e_x * tl.where(e_x > 0, x - t, 0.0)
    return weighted


@triton.jit
def tile_statistics_raw(x, t, LOSS: tl.constexpr):
    """:func:`tile_statistics` of ``base2(x)``, ``base2(t)`` from the fp32 tiles themselves (no exponentials kept):
    the maxima taken before the log2(e) scale (the same numbers: rounding is monotonic), each exponential one fused
    multiply-add (x * log2(e) - m), the weighted sum scaled once. Two multiplies an element fewer."""
    if LOSS == CE_LABELS:
        m_x = tl.max(x, axis=0) * LOG2E
        s_x = tl.sum(tl.exp2(x * LOG2E - exponent_shift(m_x)), axis=0)
        return m_x, s_x, m_x, s_x, s_x
    else:
        m_x, m_t = tl.reduce((x, t), 0, max_pair)
        m_x = m_x * LOG2E
        m_t = m_t * LOG2E
        e_x = tl.exp2(x * LOG2E - exponent_shift(m_x))
        e_t = tl.exp2(t * LOG2E - exponent_shift(m_t))
        s_x, s_t, acc = tl.reduce((e_x, e_t, weighted_terms_fused(e_x, e_t, x, t, LOSS)), 0, sum_triple)
        return m_x, s_x, m_t, s_t, acc * LOG2E


@triton.jit
def combine_statistics(m_x, s_x, m_t, s_t, acc, m_x2, s_x2, m_t2, s_t2, acc2, LOSS: tl.constexpr):
    """Merge two summaries (scalars) into one, exactly."""
    new_m_x = tl.maximum(m_x, m_x2)
    a_x = rescale(m_x, new_m_x)
    b_x = rescale(m_x2, new_m_x)
    new_s_x = s_x * a_x + s_x2 * b_x
    new_m_t = tl.maximum(m_t, m_t2)
    a_t = rescale(m_t, new_m_t)
    b_t = rescale(m_t2, new_m_t)
    new_s_t = s_t * a_t + s_t2 * b_t
    if LOSS == REVERSE_KL:
        new_acc = acc * a_x + acc2 * b_x
    else:
        new_acc = acc * a_t + acc2 * b_t
    return new_m_x, new_s_x, new_m_t, new_s_t, new_acc


@triton.jit
def row_statistics(x_row, t_row, cols, n_cols, LOSS: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """Summary of a whole row, streamed in tiles of BLOCK_SIZE columns (online softmax, one pass; each tile through
    :func:`tile_statistics_raw`)."""
    x, t = load_raw_tiles(x_row, t_row, cols, n_cols, LOSS, "")
    m_x, s_x, m_t, s_t, acc = tile_statistics_raw(widen(x), widen(t), LOSS)
    for start in range(BLOCK_SIZE, n_cols, BLOCK_SIZE):
        x, t = load_raw_tiles(x_row + start, t_row + start, cols, n_cols - start, LOSS, "")
        tm_x, ts_x, tm_t, ts_t, tacc = tile_statistics_raw(widen(x), widen(t), LOSS)
        m_x, s_x, m_t, s_t, acc = combine_statistics(m_x, s_x, m_t, s_t, acc, tm_x, ts_x, tm_t, ts_t, tacc, LOSS)
    return m_x, s_x, m_t, s_t, acc


@triton.jit
def store_partials(ptr, stride, m_x, s_x, m_t, s_t, acc, LOSS: tl.constexpr):
    """Publish one chunk's summary: the five numbers at ptr, ptr + stride, ... (one row of partials). Cross-entropy
    from labels publishes only the two it uses (m_x, s_x): the other words are never read (:func:`load_partials`)."""
    tl.store(ptr + 0 * stride, m_x)
    tl.store(ptr + 1 * stride, s_x)
    if LOSS != CE_LABELS:
        tl.store(ptr + 2 * stride, m_t)
        tl.store(ptr + 3 * stride, s_t)
        tl.store(ptr + 4 * stride, acc)


@triton.jit
def load_partials(ptr, stride, lanes, lane_used, LOSS: tl.constexpr):
    """All chunk summaries of a row (unused lanes: an empty part). volatile: bypass L1, which is not
    coherent with other SMs' stores. Cross-entropy from labels reads only m_x and s_x (the rest are returned as
    stand-ins that :func:`combine_partials` ignores): fewer words polled per step."""
    m_x = tl.load(ptr + 0 * stride + lanes, mask=lane_used, other=float("-inf"), volatile=True)
    s_x = tl.load(ptr + 1 * stride + lanes, mask=lane_used, other=0.0, volatile=True)
    if LOSS == CE_LABELS:
        return m_x, s_x, m_x, s_x, s_x
    m_t = tl.load(ptr + 2 * stride + lanes, mask=lane_used, other=float("-inf"), volatile=True)
    s_t = tl.load(ptr + 3 * stride + lanes, mask=lane_used, other=0.0, volatile=True)
    acc = tl.load(ptr + 4 * stride + lanes, mask=lane_used, other=0.0, volatile=True)
    return m_x, s_x, m_t, s_t, acc


@triton.jit
def combine_partials(m_x, s_x, m_t, s_t, acc, LOSS: tl.constexpr):
    """Merge a vector of summaries (one per chunk; unused lanes m=-inf, s=acc=0) into scalars."""
    if LOSS == CE_LABELS:
        big_m_x = tl.max(m_x, axis=0)
        big_s_x = tl.sum(s_x * rescale(m_x, big_m_x), axis=0)
        return big_m_x, big_s_x, big_m_x, big_s_x, big_s_x
    else:
        big_m_x, big_m_t = tl.reduce((m_x, m_t), 0, max_pair)
        r_x = rescale(m_x, big_m_x)
        r_t = rescale(m_t, big_m_t)
        if LOSS == REVERSE_KL:
            acc_scaled = acc * r_x
        else:
            acc_scaled = acc * r_t
        big_s_x, big_s_t, big_acc = tl.reduce((s_x * r_x, s_t * r_t, acc_scaled), 0, sum_triple)
        return big_m_x, big_s_x, big_m_t, big_s_t, big_acc


@triton.jit
def row_loss(m_x, s_x, m_t, s_t, acc, x_label, LOSS: tl.constexpr, FAST: tl.constexpr = False):
    """The row's loss in natural units from its combined summary (x_label: the label's logit, CE_LABELS).
    FAST: see :func:`log2_of`."""
    lse2_x = m_x + log2_of(s_x, FAST)
    if LOSS == CE_LABELS:
        loss = lse2_x * LN2 - x_label
    elif LOSS == CE_LOGITS:
        loss = (lse2_x - divide(acc, s_t, FAST)) * LN2
    elif LOSS == FORWARD_KL:
        lse2_t = m_t + log2_of(s_t, FAST)
        loss = (divide(acc, s_t, FAST) - lse2_t + lse2_x) * LN2
    else:
        lse2_t = m_t + log2_of(s_t, FAST)
        loss = (divide(acc, s_x, FAST) - lse2_x + lse2_t) * LN2
    return loss


@triton.jit
def lse_difference(m_x, s_x, m_t, s_t, FAST: tl.constexpr = False):
    """lse2_x - lse2_t of a row's combined summary (reverse KL's gradient needs it)."""
    return m_x + log2_of(s_x, FAST) - m_t - log2_of(s_t, FAST)


@triton.jit
def log2_of(s, FAST: tl.constexpr):
    """log2 of a row's sum of exponentials (>= 1 unless the row is empty); FAST: the GPU's approximate log2 (one
    MUFU.LG2, relative error about 2**-22) instead of libdevice's exact one (a polynomial of some 25 instructions),
    compiled kernels only (the interpreter takes the exact one); FAST=2: the same with subnormals flushed to zero."""
    if FAST == 2 and GPU_APPROXIMATIONS:
        # ftz: without it ptxas scales a subnormal input around the MUFU (compares, selects, multiplies); s is 0 or >= 1
        return tl.inline_asm_elementwise("lg2.approx.ftz.f32 $0, $1;", "=r,r", [s], dtype=tl.float32, is_pure=True,
                                         pack=1)
    elif FAST and GPU_APPROXIMATIONS:
        return libdevice.fast_log2f(s)
    else:
        return tl.log2(s)


@triton.jit
def divide(a, b, FAST: tl.constexpr):
    """a / b; FAST: the approximate division (div.full, 2 ulp) instead of the IEEE one; FAST=2: subnormals flushed
    (compiled kernels only)."""
    if FAST == 2 and GPU_APPROXIMATIONS:
        # ftz: no range scaling of the operands around the reciprocal (the quotients here are never subnormal)
        return tl.inline_asm_elementwise("div.full.ftz.f32 $0, $1, $2;", "=r,r,r", [a, b], dtype=tl.float32,
                                         is_pure=True, pack=1)
    elif FAST:
        return tl.fdiv(a, b)
    else:
        return a / b


@triton.jit
def gradient_from_summary(x2, t2, m_x, s_x, m_t, s_t, lse_diff2, cols, label, loss, LOSS: tl.constexpr,
                          FAST: tl.constexpr = False):
    """d loss_row / d x for a tile read (again) once its row's combined summary is known, before the
    grad_output/n_rows scale: the exponentials are recomputed against the row's maxima.
    lse_diff2 = lse_difference(...) of the same summary (a loop over tiles computes it once). FAST: :func:`divide`."""
    e_x = tl.exp2(x2 - m_x)
    e_t = tl.exp2(t2 - m_t)
    return tile_gradient(e_x, divide(1.0, s_x, FAST), e_t, divide(1.0, s_t, FAST), x2 - t2, cols, label, lse_diff2,
                         loss, LOSS)


@triton.jit
def gradient_scales(s_x, s_t, lse_diff2, loss, grad_scale, LOSS: tl.constexpr, FAST: tl.constexpr = False):
    """The row scalars of :func:`scaled_gradient` from its combined summary: (q_scale, p_scale, offset), the softmaxes'
    normalisations with grad_scale (grad_output / n_valid) folded in, so that no element is multiplied by it."""
    q_scale = divide(grad_scale, s_x, FAST)
    if LOSS == CE_LABELS:
        p_scale = grad_scale  # the one-hot target's weight
    else:
        p_scale = divide(grad_scale, s_t, FAST)
    offset = 0.0
    if LOSS == REVERSE_KL:
        offset = q_scale * (lse_diff2 * LN2 + loss)
    return q_scale, p_scale, offset


@triton.jit
def scaled_gradient(x, t, m_x, m_t, q_scale, p_scale, offset, lanes, label, LOSS: tl.constexpr):
    """grad_scale * d loss_row / d x for one tile of fp32 logits ``x`` and targets ``t`` in natural units (the
    same values as :func:`gradient_from_summary` times grad_scale; scalars from :func:`gradient_scales`). Each
    exponential is one fused multiply-add and exp2; reverse KL's factor one more: four to six instructions an element
    fewer than the base-2 tiles, the separate normalisation and the grad_scale multiply."""
    e_x = tl.exp2(x * LOG2E - m_x)
    if LOSS == CE_LABELS:
        grad = e_x * q_scale - tl.where(lanes == label, p_scale, 0.0)
    elif LOSS == REVERSE_KL:
        # where x is -inf, e_x is 0 and x - t is -inf or NaN: a finite stand-in keeps the gradient there at 0 (0·log 0
        # := 0), and a bad row (NaN, +inf, all -inf: NaN scales) still gets NaN in every lane, like the other losses.
        # Not a select of the result: a per-row NaN in a where made ptxas halve fused's registers (128 -> 64).
        d = x - t
        grad = e_x * (q_scale * tl.where(d > -1e20, d, -1e20) - offset)
    else:
        grad = e_x * q_scale - tl.exp2(t * LOG2E - m_t) * p_scale
    return grad


@triton.jit
def gradient_shifts(m_x, s_x, m_t, s_t, grad_scale, FAST: tl.constexpr = False):
    """The row scalars of :func:`folded_gradient`: each softmax's shift with its normalisation and |grad_scale| moved
    into the exponent, exp2(x2 - m) * |grad_scale| / s = exp2(x2 - (m - log2 |grad_scale| + log2 s))."""
    log2_scale = log2_of(tl.abs(grad_scale), FAST)
    return m_x - log2_scale + log2_of(s_x, FAST), m_t - log2_scale + log2_of(s_t, FAST)


@triton.jit
def folded_gradient(a, b, shift_a, shift_b):
    """|grad_scale| * (softmax(a) - softmax(b)) for one tile of fp32 logits and targets in natural units (forward KL
    and cross-entropy from target logits; shifts from :func:`gradient_shifts`): each softmax one fused multiply-add
    and exp2, and one subtraction, where :func:`scaled_gradient` also multiplies each by its scale. A negative
    grad_scale is the same difference the other way round: the caller reads the targets' tile as ``a`` and the
    logits' as ``b`` (their pointers swapped by a scalar select, their shifts too), so that no element pays for the
    sign."""
    return tl.exp2(a * LOG2E - shift_a) - tl.exp2(b * LOG2E - shift_b)


@triton.jit
def tile_gradient(e_x, q_factor, e_t, p_factor, d2, cols, label, lse_diff2, kl, LOSS: tl.constexpr):
    """d loss_row / d x for one tile, before the grad_output/n_rows scale.

    q = e_x * q_factor is softmax(x); p = e_t * p_factor is softmax(t). For reverse KL,
    d2 = x2 - t2 (one live tile instead of two), lse_diff2 = lse2_x - lse2_t and kl is the row's loss.
    """
    q = e_x * q_factor
    if LOSS == CE_LABELS:
        grad = q - tl.where(cols == label, 1.0, 0.0)
    elif LOSS == REVERSE_KL:  # + 0 * kl: NaN in every lane of a bad row; see scaled_gradient
        grad = tl.where(e_x > 0, q * ((d2 - lse_diff2) * LN2 - kl), 0.0) + kl * 0.0
    else:
        grad = q - e_t * p_factor
    return grad


@triton.jit
def slot_and_chunk(NUM_CHUNKS: tl.constexpr, CHUNKS_POW2: tl.constexpr):
    """This program's row slot and chunk: pid // NUM_CHUNKS, pid % NUM_CHUNKS (CHUNKS_POW2: a power of two >=
    NUM_CHUNKS), for kernels whose programs each take one chunk of a row.

    The mask is a no-op (chunk < NUM_CHUNKS <= CHUNKS_POW2) that must reach the PTX: ptxas (Triton 3.6, sm_90) keeps
    the program id and everything derived from it (rows, row pointers) in uniform registers only when it can see
    that chunk is small. With a plain pid % NUM_CHUNKS (a multiply-high and a subtraction unless NUM_CHUNKS is a
    power of two) it moved them all to per-thread registers: the lagged kernel took 128 registers instead of 80
    (labels CE, 13 chunks of 4096 columns, 4 warps). LLVM drops the mask of pid % NUM_CHUNKS (it knows the bound)
    but keeps that of pid - slot * NUM_CHUNKS."""
    pid = tl.program_id(0)
    slot = pid // NUM_CHUNKS
    chunk = (pid - slot * NUM_CHUNKS) & (CHUNKS_POW2 - 1)
    return slot, chunk
