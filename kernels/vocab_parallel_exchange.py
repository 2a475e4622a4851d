"""The fast vocab-parallel design ("symmetric"): each logit read once from DRAM per rank, the row summaries exchanged
between the ranks' kernels directly, through memory every rank can write (:mod:`kernels.peer_memory`).

This is split_row's lagged schedule (``kernels.split_row``) stretched over GPUs. A rank's slice of a row is cut
into NUM_CHUNKS chunks of BLOCK_SIZE columns; a persistent grid of n_slots * NUM_CHUNKS co-resident programs walks
the rows, program (slot, chunk) taking chunk ``chunk`` of rows slot, slot + n_slots, ... In step k a program

* reads its chunk of row r_k from DRAM (asking L2 to keep it), summarises it (``row_math``) and writes the summary
  into the exchange buffer of *every* rank, its own included (lane rank * NUM_CHUNKS + chunk of row r_k);
* finishes row r_(k - LAG): polls its own buffer until all TP * NUM_CHUNKS summaries of that row have arrived,
  combines them in lane order (so every rank computes bit-identical row losses), re-reads its chunk of that row
  from L2 and writes the gradient.

Its arithmetic is split_row's lagged kernel's fast math (``FAST_MATH``: statistics from the raw tiles, approximate row
scalars, the gradient with grad_scale folded into the row's scalars): 10-25% fewer instructions a step than the
base-2 form, offline for sm_90 (``data/<gpu>/exchange_steps.csv``).

DRAM sees each input byte once and each gradient byte once (4 B/element for cross-entropy from labels in bf16, 6
for the target-distribution losses: the minimum); what crosses NVLink is WIDTH words of 8 bytes per chunk, row
and peer (24 or 40 bytes per 4096 columns), and what a program polls is its row's TP * NUM_CHUNKS * WIDTH words
from its own L2.

The exchange needs no atomics, fences or reset between calls. Every word is an int64: the fp32 value in the low
half and the call's tag in the high half (``tag``), written by one 8-byte store, which NVLink and the GPU never
split. A reader takes a word only when its tag is this call's. The tag is the calls completed on the buffer plus 1,
a device-side counter that the epilogue kernel advances (so CUDA graphs replay correctly), and calls alternate
between two halves of the buffer: a rank can run at most one call ahead of a peer (it needs the peer's summaries
of a call to finish that call), so a fast rank never overwrites words a slow one has still to read.

No wait is unbounded. A program polls for at most ``wait_limit`` (nanoseconds of the GPU's global timer when
compiled; polls under the interpreter); past it, the row's loss and gradient become NaN, the program stops waiting
for later rows, the state's timeout flag is set, and the epilogue's device-side assert reports the timeout. A grid
never exceeds what the GPU holds at once (the planner sizes it like split_row's), and the two ranks' programs walk
the rows in the same order, so the only waits are on a peer that is late, or gone.
"""

import triton
import triton.language as tl

from .row_math import (
    CE_LABELS,
    base2,
    finish_program,
    gradient_from_summary,
    gradient_scales,
    label_in_tile,
    load_raw_tiles,
    load_scales,
    lse_difference,
    row_loss,
    row_losses_ptr,
    row_validity,
    scaled_gradient,
    slot_and_chunk,
    tile_statistics,
    tile_statistics_raw,
    widen,
)
from .vocab_parallel_gather import combine_summaries, owned_label_logit

LAG_STEPS = 2  # a row is finished this many steps after it was read (split_row's lagged schedule measured 2 best)


@triton.jit
def tag(value, epoch):
    """An exchange word: the fp32 ``value``'s bits in the low half, the call's ``epoch`` (int32) in the high half."""
    return value.to(tl.uint32, bitcast=True).to(tl.int64) | (epoch.to(tl.int64) << 32)


@triton.jit
def untag(word, epoch):
    """(value, present): the fp32 value of an exchange word and whether it was written by call ``epoch``."""
    return word.to(tl.int32).to(tl.float32, bitcast=True), (word >> 32).to(tl.int32) == epoch


@triton.jit
def publish(peers_ptr, offset, stride, epoch, m_x, s_x, m_t, s_t, acc, x_label, TP: tl.constexpr,
            LOSS: tl.constexpr):
    """Write one chunk's summary at word ``offset`` (words ``stride`` apart) of every rank's exchange buffer."""
    for peer in tl.static_range(TP):
        ptr = tl.load(peers_ptr + peer).to(tl.pointer_type(tl.int64)) + offset
        tl.store(ptr + 0 * stride, tag(m_x, epoch))
        tl.store(ptr + 1 * stride, tag(s_x, epoch))
        if LOSS == CE_LABELS:
            tl.store(ptr + 2 * stride, tag(x_label, epoch))
        else:
            tl.store(ptr + 2 * stride, tag(m_t, epoch))
            tl.store(ptr + 3 * stride, tag(s_t, epoch))
            tl.store(ptr + 4 * stride, tag(acc, epoch))


@triton.jit
def read_lanes(ptr, stride, lanes, used, epoch, LOSS: tl.constexpr):
    """One row's summaries in this rank's buffer, every lane: values and whether any used lane is still missing.
    volatile: from L2, where the peers' NVLink stores land (L1 is not coherent with them)."""
    m_x, ok = untag(tl.load(ptr + 0 * stride + lanes, mask=used, other=0, volatile=True), epoch)
    s_x, ok_s_x = untag(tl.load(ptr + 1 * stride + lanes, mask=used, other=0, volatile=True), epoch)
    ok = ok & ok_s_x
    if LOSS == CE_LABELS:
        x_label, ok_label = untag(tl.load(ptr + 2 * stride + lanes, mask=used, other=0, volatile=True), epoch)
        ok = ok & ok_label
        m_t, s_t, acc = m_x, s_x, s_x
    else:
        m_t, ok_m_t = untag(tl.load(ptr + 2 * stride + lanes, mask=used, other=0, volatile=True), epoch)
        s_t, ok_s_t = untag(tl.load(ptr + 3 * stride + lanes, mask=used, other=0, volatile=True), epoch)
        acc, ok_acc = untag(tl.load(ptr + 4 * stride + lanes, mask=used, other=0, volatile=True), epoch)
        ok = ok & ok_m_t & ok_s_t & ok_acc
        x_label = s_x * 0.0
    missing = tl.max((used & ~ok).to(tl.int32), axis=0) > 0
    return m_x, s_x, m_t, s_t, acc, x_label, missing


@triton.jit
def wait_for_lanes(ptr, stride, lanes, used, epoch, wanted, wait_limit, LOSS: tl.constexpr, TIMER: tl.constexpr):
    """read_lanes, polled until no lane is missing (only when ``wanted``) or ``wait_limit`` is spent: nanoseconds
    of the global timer with TIMER, polls without (the interpreter has no timer). Returns the lanes and whether the
    wait timed out."""
    m_x, s_x, m_t, s_t, acc, x_label, missing = read_lanes(ptr, stride, lanes, used, epoch, LOSS)
    if wanted:
        spent = tl.full([], 0, tl.int64)
        if TIMER:
            began = tl.extra.cuda.globaltimer()
        while missing & (spent < wait_limit):
            m_x, s_x, m_t, s_t, acc, x_label, missing = read_lanes(ptr, stride, lanes, used, epoch, LOSS)
            if TIMER:
                spent = tl.extra.cuda.globaltimer() - began
            else:
                spent += 1
    return m_x, s_x, m_t, s_t, acc, x_label, missing & wanted


@triton.jit
def exchange_kernel(
    logits_ptr,  # (n_rows, n_cols): this rank's slice
    target_ptr,  # (n_rows, n_cols) target logits' slice, or a dummy
    labels_ptr,  # (n_rows,) global labels, or a dummy
    mask_ptr,  # (n_rows,) uint8 row mask, or a dummy
    grad_ptr,  # (n_rows, n_cols) contiguous gradient of the slice out
    ws_ptr,  # fp32 workspace: scales in, row losses out (kernels.problem)
    loss_ptr,  # 0-d fp32 loss out
    peers_ptr,  # (TP,) int64: every rank's exchange buffer (int64 words), as this process addresses it
    state_ptr,  # (2,) int32 on this rank: calls completed (this call's epoch is it + 1), timeout flag
    n_rows,
    n_cols,
    n_slots,  # rows in flight: programs = n_slots * NUM_CHUNKS
    logits_stride,
    target_stride,
    ignore_index,
    col_offset,  # the slice's first global column (rank * n_cols)
    rank,
    half_words,  # words in each half of the exchange buffer (>= n_rows * WIDTH * TP * NUM_CHUNKS)
    wait_limit,  # the longest wait for one row's summaries: ns with TIMER, polls without
    LOSS: tl.constexpr,
    HAS_MASK: tl.constexpr,
    COMPUTE_GRAD: tl.constexpr,
    TP: tl.constexpr,
    NUM_CHUNKS: tl.constexpr,
    LANES_POW2: tl.constexpr,  # next power of two >= TP * NUM_CHUNKS
    WIDTH: tl.constexpr,  # words per summary: 3 for cross-entropy from labels, 5 otherwise
    BLOCK_SIZE: tl.constexpr,
    LAG: tl.constexpr,
    POLL_FIRST: tl.constexpr,  # poll before issuing the step's reads (fewer registers) or with them in flight
    TIMER: tl.constexpr,
    FAST_MATH: tl.constexpr = True,  # split_row's lagged kernel's: raw-tile statistics, approximate row scalars,
):  # the gradient from raw tiles with grad_scale folded into the row's scalars (row_math.gradient_scales)
    DISTRIBUTION_FAST: tl.constexpr = FAST_MATH and LOSS != CE_LABELS
    slot, chunk = slot_and_chunk(NUM_CHUNKS, LANES_POW2)  # LANES_POW2 >= TP * NUM_CHUNKS >= NUM_CHUNKS
    start = chunk.to(tl.int64) * BLOCK_SIZE
    cols = tl.arange(0, BLOCK_SIZE)
    width = n_cols - start
    in_row = cols < width
    LANES = TP * NUM_CHUNKS
    ROW_WORDS = WIDTH * LANES  # a row's words: WIDTH vectors of LANES lanes
    lanes = tl.arange(0, LANES_POW2)
    used = lanes < LANES
    my_lane = rank * NUM_CHUNKS + chunk
    loss_rows_ptr = row_losses_ptr(ws_ptr)
    loss_scale, grad_scale = load_scales(ws_ptr)
    epoch = tl.load(state_ptr) + 1
    half = (epoch & 1).to(tl.int64) * half_words
    own = tl.load(peers_ptr + rank).to(tl.pointer_type(tl.int64)) + half
    gave_up = slot < 0  # a run-time false: set at the first timeout, after which this program waits no more

    behind = LAG * n_slots  # rows between the one read from DRAM and the one finished
    row = slot.to(tl.int64)
    cur_valid, _unused = row_validity(labels_ptr, mask_ptr, tl.minimum(row, n_rows - 1), ignore_index, LOSS, HAS_MASK)
    cur_valid = cur_valid & (row < n_rows)
    for row in range(slot.to(tl.int64), n_rows + behind, n_slots):
        nxt = row + n_slots  # the next step's row validity, a step ahead (it decides whether that row is read)
        nxt_valid, _unused = row_validity(labels_ptr, mask_ptr, tl.minimum(nxt, n_rows - 1), ignore_index, LOSS,
                                          HAS_MASK)
        nxt_valid = nxt_valid & (nxt < n_rows)
        cur = tl.minimum(row, n_rows - 1)
        old = tl.maximum(row - behind, 0)
        old_valid, label = row_validity(labels_ptr, mask_ptr, old, ignore_index, LOSS, HAS_MASK)
        old_valid = old_valid & (row >= behind)
        summaries = own + old * ROW_WORDS
        wanted = old_valid & ~gave_up

        if POLL_FIRST:
            m_x, s_x, m_t, s_t, acc, x_label, timed_out = wait_for_lanes(summaries, LANES, lanes, used, epoch, wanted,
                                                                         wait_limit, LOSS, TIMER)
        # This row's chunk (DRAM, kept in L2 for its second read); the old row's chunk (L2, last use)
        x_cur_row = logits_ptr + cur * logits_stride
        x_cur, t_cur = load_raw_tiles(x_cur_row + start, target_ptr + cur * target_stride + start, cols,
                                      tl.where(cur_valid, width, 0), LOSS, "evict_last")
        old_width = tl.where(old_valid, width, 0)
        if not COMPUTE_GRAD:
            old_width = 0 * old_width
        x_old, t_old = load_raw_tiles(logits_ptr + old * logits_stride + start,
                                      target_ptr + old * target_stride + start, cols, old_width, LOSS, "evict_first")
        if not POLL_FIRST:
            m_x, s_x, m_t, s_t, acc, x_label, timed_out = wait_for_lanes(summaries, LANES, lanes, used, epoch, wanted,
                                                                         wait_limit, LOSS, TIMER)
        if timed_out:
            tl.store(state_ptr + 1, 1)
        gave_up = gave_up | timed_out

        if old_valid:
            r_m_x, r_s_x, r_m_t, r_s_t, r_acc, r_label = combine_summaries(m_x, s_x, m_t, s_t, acc, x_label, used, LOSS)
            poison = tl.where(~wanted | timed_out, float("nan"), 0.0)  # no summaries: NaN, never a guess
            row_fast = FAST_MATH + DISTRIBUTION_FAST  # 2: subnormals flushed too (row_math.log2_of)
            loss = row_loss(r_m_x, r_s_x, r_m_t, r_s_t, r_acc, r_label, LOSS, row_fast) + poison
            tl.store(loss_rows_ptr + old, loss * loss_scale, mask=chunk == 0)
            if COMPUTE_GRAD:
                lse_diff2 = lse_difference(r_m_x, r_s_x, r_m_t, r_s_t, row_fast)
                old_label = label_in_tile(label - col_offset, start, BLOCK_SIZE)
                if FAST_MATH:
                    q_scale, p_scale, offset = gradient_scales(r_s_x, r_s_t, lse_diff2, loss, grad_scale, LOSS,
                                                               row_fast)
                    grad = scaled_gradient(widen(x_old), widen(t_old), r_m_x, r_m_t, q_scale, p_scale, offset, cols,
                                           old_label, LOSS)
                else:
                    grad = gradient_from_summary(base2(x_old), base2(t_old), r_m_x, r_s_x, r_m_t, r_s_t, lse_diff2,
                                                 cols, old_label, loss, LOSS) * grad_scale
                tl.store(grad_ptr + old * n_cols + start + cols, grad.to(grad_ptr.dtype.element_ty),
                         mask=in_row, eviction_policy="evict_first")
        elif row >= behind:  # a row that does not count: zero loss and gradient
            tl.store(loss_rows_ptr + old, 0.0, mask=chunk == 0)
            if COMPUTE_GRAD:
                tl.store(grad_ptr + old * n_cols + start + cols,
                         tl.zeros([BLOCK_SIZE], dtype=grad_ptr.dtype.element_ty), mask=in_row)

        if cur_valid:  # summarise this row's chunk and send it to every rank
            if FAST_MATH:
                c_m_x, c_s_x, c_m_t, c_s_t, c_acc = tile_statistics_raw(widen(x_cur), widen(t_cur), LOSS)
            else:
                c_m_x, c_s_x, c_m_t, c_s_t, c_acc, _e_x, _e_t = tile_statistics(base2(x_cur), base2(t_cur), LOSS)
            _valid, cur_label = row_validity(labels_ptr, mask_ptr, cur, ignore_index, LOSS, HAS_MASK)
            c_label = owned_label_logit(x_cur_row + start, cur_label, col_offset + start,
                                        tl.minimum(width, BLOCK_SIZE), LOSS)
            publish(peers_ptr, half + cur * ROW_WORDS + my_lane, LANES, epoch, c_m_x, c_s_x, c_m_t, c_s_t, c_acc,
                    c_label, TP, LOSS)
        cur_valid = nxt_valid
    finish_program(ws_ptr, loss_ptr, n_rows)


TIMEOUT_MESSAGE = ("vocab-parallel exchange timed out: a peer rank's row summaries did not arrive (every rank of the "
                   "group must make the same loss call, with the same shapes and options, in the same order; the loss "
                   "and gradient of this call are NaN)")


@triton.jit(debug=True)  # debug: keep the device_assert
def exchange_epilogue_kernel(state_ptr, MESSAGE: tl.constexpr):
    """After a call: count it (the next call's tag) and report a timeout of the exchange. (The interpreter ignores
    device asserts: on the CPU the host reads the flag after this launch, see check_timeout.)"""
    calls = tl.load(state_ptr)
    calls = tl.where(calls >= 0x3FFFFFFF, 0, calls) + 1  # wraps (on every rank alike) long before int32 would
    timed_out = tl.load(state_ptr + 1)
    tl.store(state_ptr, calls)
    tl.device_assert(timed_out == 0, MESSAGE)


def check_timeout(state) -> None:
    """The host's reading of the timeout flag (CPU tensors only: free there, a sync on a GPU)."""
    if int(state[1]):
        raise RuntimeError(TIMEOUT_MESSAGE)
