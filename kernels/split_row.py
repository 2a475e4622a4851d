"""Variant "split_row": every row is read from DRAM exactly once, even when it is too wide for one program.

A row of ``n_cols`` is cut into ``NUM_CHUNKS`` chunks of ``BLOCK_SIZE`` columns, one program per
chunk. Each program loads its chunk and summarises it (max, sum of exponentials, the loss's
weighted sum: see ``row_math``); the row's summaries combine into its loss and gradient. Forms:

* cooperative, schedule "lagged" (``split_row_lagged_kernel``, the default on a GPU): a persistent
  grid; a program publishes its chunk's summary without waiting and finishes the row LAG_STEPS
  steps later, reading the chunk a second time from L2. DRAM traffic is the minimum (one read,
  one write per element); the exchange is off the critical path.
* cooperative, schedule "wait" (``split_row_cooperative_kernel``): the textbook version: publish,
  bump the row's arrival counter, spin until all chunks have arrived, write the gradient from the
  exponentials still in registers. Every program waits for its row's slowest chunk.
* multi-launch (``split_row_kernel`` with PHASE_STATS, then PHASE_GRAD): the same math with the kernel
  boundary as the barrier; the gradient launch re-reads its chunk. It is what the Triton
  interpreter runs (it executes programs one after another, so a spin-wait would hang there) and
  the fallback when a cooperative grid would not be co-resident.

A cooperative grid is never larger than what the GPU holds at once (:mod:`kernels.occupancy` on the
exact compiled kernel): a program waiting for a chunk whose program was never scheduled would wait
forever. Rows that fit in one chunk need no exchange and use the single-tile fused kernel; with
``split=False`` every row gets one program that walks its chunks (the fused kernel's tile loop),
which the H100 measured faster than splitting for cross-entropy from labels up to 64K columns. Both are the fused
kernel, and their plans say so (``Plan.variant`` "fused"); the search spells the second ``fused`` itself, as
recorded tables still spell it this way (``kernels.autotune.canonical_variant``).
"""

import torch
import triton
import triton.language as tl

from .fused import fused_launch, keeps_last_tile
from .launch import Launch, Plan, interpreting
from .occupancy import occupancy_of_compiled
from .problem import (MIN_BLOCK_SIZE, Problem, allocate_outputs, check_block_size, check_keep_last, check_maxnreg,
                      check_num_warps, finisher, next_power_of_2, workspace_size)
from .row_math import (
    CE_LABELS,
    CE_LOGITS,
    FORWARD_KL,
    WS_GEN,
    base2,
    body_offset,
    call_scales,
    combine_statistics,
    edge_columns,
    load_edge,
    row_peel,
    slot_and_chunk,
    combine_partials,
    gradient_from_summary,
    label_in_tile,
    label_logit,
    load_partials,
    finish_program,
    load_raw_tiles,
    load_tiles,
    lse_difference,
    rescale,
    row_loss,
    row_losses_ptr,
    row_validity,
    store_partials,
    tile_gradient,
    tile_statistics,
    tile_statistics_raw,
    widen,
    gradient_scales,
    gradient_shifts,
    folded_gradient,
    scaled_gradient,
)

# Globals read inside @triton.jit must be tl.constexpr; the host uses their .value.
PHASE_STATS = tl.constexpr(0)
PHASE_GRAD = tl.constexpr(1)

N_PARTIALS = tl.constexpr(5)  # m_x, s_x, m_t, s_t, acc

# Cooperative schedules: "wait" exchanges summaries then writes the gradient from registers;
# "lagged" finishes each row one step later, re-reading its chunk from L2 (split_row_lagged_kernel).
SCHEDULES = ("wait", "lagged")
# An fp32 NaN with a payload no arithmetic produces (NVIDIA GPUs return the canonical 0x7FFFFFFF):
# marks a summary word that has not been written yet (split_row_lagged_kernel).
EMPTY_BITS = tl.constexpr(0x7FBADBAD)
EMPTY_BLOCK = tl.constexpr(128)  # rows re-emptied per step (empty_summaries)
MAX_READ_AHEAD = 3  # plan_split_row's read_ahead: each step read ahead is one more copy of its tiles in shared memory
LAG_STEPS = tl.constexpr(2)  # "lagged": a row is finished this many steps after it was read (1 measured slower)


@triton.jit(debug=True)  # keeps call_scales' device_assert (see fused_loss_kernel)
def split_row_kernel(
    logits_ptr,  # (n_rows, n_cols), row stride logits_stride
    target_ptr,  # (n_rows, n_cols) target logits, or a dummy
    labels_ptr,  # (n_rows,) labels, or a dummy
    mask_ptr,  # (n_rows,) bool row mask, or a dummy
    grad_ptr,  # (n_rows, n_cols) contiguous gradient out
    ws_ptr,  # fp32 workspace: scales in, row losses out (kernels.problem); chunk summaries
    loss_ptr,  # 0-d fp32 loss out
    counters_ptr,  # (n_rows,) int32 arrival counters, zero before the launch ("wait" schedule only)
    n_rows,
    n_cols,
    n_slots,  # rows handled at once: programs = n_slots * NUM_CHUNKS
    logits_stride,
    target_stride,
    ignore_index,
    partials_offset,  # the (n_rows, 5, NUM_CHUNKS) fp32 chunk summaries start at ws_ptr + partials_offset
    grad_output_ptr,  # 0-d grad_output on the device, or a dummy
    grad_output,  # grad_output as a number (GRAD_OUTPUT_IN_MEMORY false)
    LOSS: tl.constexpr,
    HAS_MASK: tl.constexpr,
    COMPUTE_GRAD: tl.constexpr,
    GRAD_OUTPUT_IN_MEMORY: tl.constexpr,
    PHASE: tl.constexpr,
    NUM_CHUNKS: tl.constexpr,
    CHUNKS_POW2: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    slot, chunk = slot_and_chunk(NUM_CHUNKS, CHUNKS_POW2)
    start = chunk.to(tl.int64) * BLOCK_SIZE
    cols = tl.arange(0, BLOCK_SIZE)
    in_row = cols < n_cols - start
    lanes = tl.arange(0, CHUNKS_POW2)
    lane_used = lanes < NUM_CHUNKS
    loss_rows_ptr = row_losses_ptr(ws_ptr)
    partials_ptr = ws_ptr + partials_offset
    loss_scale = 0.0
    grad_scale = 0.0
    if PHASE == PHASE_GRAD:  # the statistics launch writes no loss or gradient
        loss_scale, grad_scale = call_scales(ws_ptr, labels_ptr, mask_ptr, grad_output_ptr, grad_output, n_rows, n_cols,
                                             ignore_index, LOSS, HAS_MASK, GRAD_OUTPUT_IN_MEMORY)

    # int64 rows: row * stride can pass 2**31 (32K rows x 128K vocab)
    for row in range(slot.to(tl.int64), n_rows, n_slots):
        x_row = logits_ptr + row * logits_stride
        t_row = target_ptr + row * target_stride
        g_tile = grad_ptr + row * n_cols + start
        partials = partials_ptr + row * (N_PARTIALS * NUM_CHUNKS)

        valid, label = row_validity(labels_ptr, mask_ptr, row, ignore_index, LOSS, HAS_MASK)

        if valid:
            if PHASE == PHASE_STATS:
                x2, t2 = load_tiles(x_row + start, t_row + start, cols, n_cols - start, LOSS)
                m_x, s_x, m_t, s_t, acc, e_x, e_t = tile_statistics(x2, t2, LOSS)
                store_partials(partials + chunk, NUM_CHUNKS, m_x, s_x, m_t, s_t, acc, LOSS)
            if PHASE == PHASE_GRAD:
                all_m_x, all_s_x, all_m_t, all_s_t, all_acc = load_partials(partials, NUM_CHUNKS, lanes, lane_used, LOSS)
                big_m_x, big_s_x, big_m_t, big_s_t, big_acc = combine_partials(
                    all_m_x, all_s_x, all_m_t, all_s_t, all_acc, LOSS
                )
                x_label = label_logit(x_row, label, n_cols, LOSS)
                loss = row_loss(big_m_x, big_s_x, big_m_t, big_s_t, big_acc, x_label, LOSS)
                tl.store(loss_rows_ptr + row, loss * loss_scale, mask=chunk == 0)
                if COMPUTE_GRAD:
                    lse_diff2 = lse_difference(big_m_x, big_s_x, big_m_t, big_s_t)
                    # The kernel boundary was the barrier: re-read the chunk (the cooperative form keeps it).
                    x2, t2 = load_tiles(x_row + start, t_row + start, cols, n_cols - start, LOSS)
                    grad = gradient_from_summary(x2, t2, big_m_x, big_s_x, big_m_t, big_s_t, lse_diff2, cols,
                                                 label_in_tile(label, start, BLOCK_SIZE), loss, LOSS)
                    tl.store(g_tile + cols, (grad * grad_scale).to(grad_ptr.dtype.element_ty), mask=in_row)
        else:
            if PHASE == PHASE_GRAD:
                tl.store(loss_rows_ptr + row, 0.0, mask=chunk == 0)
                if COMPUTE_GRAD:
                    tl.store(g_tile + cols, tl.zeros([BLOCK_SIZE], dtype=grad_ptr.dtype.element_ty), mask=in_row)
    if PHASE == PHASE_GRAD:
        finish_program(ws_ptr, loss_ptr, n_rows)


@triton.jit(debug=True)  # keeps call_scales' device_assert (see fused_loss_kernel)
def split_row_cooperative_kernel(
    logits_ptr,
    target_ptr,
    labels_ptr,
    mask_ptr,
    grad_ptr,
    ws_ptr,
    loss_ptr,
    counters_ptr,
    n_rows,
    n_cols,
    n_slots,
    logits_stride,
    target_stride,
    ignore_index,
    partials_offset,
    grad_output_ptr,
    grad_output,
    LOSS: tl.constexpr,
    HAS_MASK: tl.constexpr,
    COMPUTE_GRAD: tl.constexpr,
    GRAD_OUTPUT_IN_MEMORY: tl.constexpr,
    NUM_CHUNKS: tl.constexpr,
    CHUNKS_POW2: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    """The one-read form (same arguments as split_row_kernel, no PHASE). Persistent: program
    (slot, chunk) handles chunk `chunk` of rows slot, slot + n_slots, ...

    (Loading the next row's chunk before this row's exchange was measured on the H100 and did not
    pay: it raised registers per thread and cut the programs that fit; see the notes in README.)
    """
    slot, chunk = slot_and_chunk(NUM_CHUNKS, CHUNKS_POW2)
    start = chunk.to(tl.int64) * BLOCK_SIZE
    cols = tl.arange(0, BLOCK_SIZE)
    in_row = cols < n_cols - start
    lanes = tl.arange(0, CHUNKS_POW2)
    lane_used = lanes < NUM_CHUNKS
    loss_rows_ptr = row_losses_ptr(ws_ptr)
    partials_ptr = ws_ptr + partials_offset
    loss_scale, grad_scale = call_scales(ws_ptr, labels_ptr, mask_ptr, grad_output_ptr, grad_output, n_rows, n_cols,
                                         ignore_index, LOSS, HAS_MASK, GRAD_OUTPUT_IN_MEMORY)

    for row in range(slot.to(tl.int64), n_rows, n_slots):
        x_row = logits_ptr + row * logits_stride
        g_tile = grad_ptr + row * n_cols + start
        partials = partials_ptr + row * (N_PARTIALS * NUM_CHUNKS)

        valid, label = row_validity(labels_ptr, mask_ptr, row, ignore_index, LOSS, HAS_MASK)

        if valid:
            x2, t2 = load_tiles(x_row + start, target_ptr + row * target_stride + start, cols, n_cols - start, LOSS)
            m_x, s_x, m_t, s_t, acc, e_x, e_t = tile_statistics(x2, t2, LOSS)
            store_partials(partials + chunk, NUM_CHUNKS, m_x, s_x, m_t, s_t, acc, LOSS)
            # Release our summary, then wait (acquire) until every chunk of the row has arrived.
            arrived = tl.atomic_add(counters_ptr + row, 1, sem="acq_rel") + 1
            while arrived < NUM_CHUNKS:
                arrived = tl.atomic_add(counters_ptr + row, 0, sem="acquire")
            all_m_x, all_s_x, all_m_t, all_s_t, all_acc = load_partials(partials, NUM_CHUNKS, lanes, lane_used, LOSS)
            big_m_x, big_s_x, big_m_t, big_s_t, big_acc = combine_partials(
                all_m_x, all_s_x, all_m_t, all_s_t, all_acc, LOSS
            )
            x_label = label_logit(x_row, label, n_cols, LOSS)
            loss = row_loss(big_m_x, big_s_x, big_m_t, big_s_t, big_acc, x_label, LOSS)
            tl.store(loss_rows_ptr + row, loss * loss_scale, mask=chunk == 0)
            if COMPUTE_GRAD:
                # The exponentials are still in registers: only a per-chunk factor changes.
                lse_diff2 = lse_difference(big_m_x, big_s_x, big_m_t, big_s_t)
                q_factor = rescale(m_x, big_m_x) / big_s_x
                p_factor = rescale(m_t, big_m_t) / big_s_t
                grad = tile_gradient(e_x, q_factor, e_t, p_factor, x2 - t2, cols,
                                     label_in_tile(label, start, BLOCK_SIZE), lse_diff2, loss, LOSS)
                tl.store(g_tile + cols, (grad * grad_scale).to(grad_ptr.dtype.element_ty), mask=in_row)
        else:
            tl.store(loss_rows_ptr + row, 0.0, mask=chunk == 0)
            if COMPUTE_GRAD:
                tl.store(g_tile + cols, tl.zeros([BLOCK_SIZE], dtype=grad_ptr.dtype.element_ty), mask=in_row)
    finish_program(ws_ptr, loss_ptr, n_rows)


@triton.jit(debug=True)  # keeps call_scales' device_assert (see fused_loss_kernel)
def split_row_lagged_kernel(
    logits_ptr,
    target_ptr,
    labels_ptr,
    mask_ptr,
    grad_ptr,
    ws_ptr,  # summaries at ws_ptr + partials_offset: two halves of (n_rows, 5, NUM_CHUNKS) fp32 (see WS_GEN below)
    loss_ptr,
    counters_ptr,  # unused (shared argument convention)
    n_rows,
    n_cols,
    n_slots,
    logits_stride,
    target_stride,
    ignore_index,
    partials_offset,
    grad_output_ptr,
    grad_output,
    LOSS: tl.constexpr,
    HAS_MASK: tl.constexpr,
    COMPUTE_GRAD: tl.constexpr,
    GRAD_OUTPUT_IN_MEMORY: tl.constexpr,
    NUM_CHUNKS: tl.constexpr,
    CHUNKS_POW2: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    POLL_FIRST: tl.constexpr,  # poll the summaries before issuing the reads (fewer registers, see plan_split_row)
    PEEL: tl.constexpr = False,  # rows not 16-byte aligned: chunks cover the 16-byte body; the last chunk also
    VEC: tl.constexpr = 8,  # the head and tail columns (row_math.row_peel); VEC elements per 16 bytes
    PREFETCH: tl.constexpr = False,  # issue the next step's DRAM reads before this step's math (see below)
    READ_AHEAD: tl.constexpr = 0,  # steps whose reads are in flight through shared memory (see the loop)
    FAST_MATH: tl.constexpr = True,  # fewer instructions a step (see below)
):
    """The one-DRAM-read form with the exchange taken off the critical path (same arguments as
    split_row_kernel, no PHASE). Persistent: program (slot, chunk) walks rows slot, slot + n_slots, ...

    In step k a program reads its chunk of row r_k from DRAM and summarises it, and finishes row
    r_(k-LAG_STEPS): it reads that chunk a second time, from L2 (the grid's reads of LAG_STEPS + 1
    steps are a few MB of the 50 MB L2; the first read asks L2 to keep it, the second to drop it),
    combines the row's summaries, which its peers published LAG_STEPS steps ago, and writes the
    gradient. DRAM sees each input byte once; nobody waits for a row that is still being read, so
    the wait of the "wait" schedule leaves the critical path; only scalars live from step to step.

    The summaries need no atomics or fences: every word starts as EMPTY_BITS (a NaN payload that
    arithmetic never produces: it yields the canonical NaN), and a reader polls its row's words
    (volatile: from L2) until none is empty. Each word is written once, so a word that is not empty
    holds its final value. The summaries live in two halves that alternate between calls: each call
    re-empties its own words of the half the next call polls (no refill launch).

    PREFETCH: a program's DRAM reads are otherwise idle while it does a step's math (the next step's reads are issued
    only when it is done), which a plain streaming kernel of the same bytes never is. With PREFETCH the chunk of step
    k + 1 is requested at the start of step k and arrives while step k summarises its own chunk (already in
    registers) and finishes the old row: one more tile in registers, reads always in flight.

    FAST_MATH: the chunk's statistics from its raw tile (row_math.tile_statistics_raw: two multiplies an element
    fewer) and the row's scalars with the approximate log2 and division (row_math.log2_of, divide): 6% fewer
    instructions (forward KL, offline sm_90), +0.1 to +2.3 points of copy bandwidth at 24 of 25 cells measured
    (logs/explore_fast_2026-11-26.txt); errors far below fp32's 1e-5. Also the gradient from the raw tiles with
    grad_scale folded into the row's scalars (row_math.gradient_scales, scaled_gradient; 0.96-0.99x the time through
    the public call, logs/ab_code_trees_2026-11-26.txt). For forward KL and cross-entropy from logits the gradient's
    scales go into its exponents instead (row_math.folded_gradient: one subtraction an element where the scaled form
    takes a multiply and a fused multiply-add) and the chunk's start is 32-bit (one compare per mask); the KLs'
    weighted sum clamps instead of selecting (row_math.weighted_terms_fused): 4-12% fewer instructions a step
    (forward KL), 0.90-0.99x its time through the public call on an H200
    (data/h200/logs/ab_code_trees_folded_2026-11-29.txt).
    """
    # Forward KL and cross-entropy from logits: the gradient's scales in its exponents (row_math.folded_gradient),
    # when the two tensors share a dtype (a negative grad_scale swaps their pointers).
    SAME_DTYPE: tl.constexpr = logits_ptr.dtype.element_ty == target_ptr.dtype.element_ty
    FOLDED: tl.constexpr = FAST_MATH and (LOSS == FORWARD_KL or LOSS == CE_LOGITS) and SAME_DTYPE
    slot, chunk = slot_and_chunk(NUM_CHUNKS, CHUNKS_POW2)
    start = chunk.to(tl.int64) * BLOCK_SIZE
    if FOLDED:  # 32 bits: each mask's compare one instruction, not two (the other losses measured no faster with it,
        start = chunk * BLOCK_SIZE  # and reverse KL's step spilled under the search's register caps)
    cols = tl.arange(0, BLOCK_SIZE)
    lanes = tl.arange(0, CHUNKS_POW2)
    lane_used = lanes < NUM_CHUNKS
    loss_rows_ptr = row_losses_ptr(ws_ptr)
    # Two halves of summaries alternate between calls (the parity of WS_GEN, calls finished on this workspace): this
    # call polls one, which its previous call left all EMPTY_BITS, and sets its own words of the other back to
    # EMPTY_BITS for the next call (the grid and rows are the same each call), so no launch has to refill them.
    half_words = n_rows * (N_PARTIALS * NUM_CHUNKS)
    parity = tl.load(ws_ptr.to(tl.pointer_type(tl.int32), bitcast=True) + WS_GEN) & 1
    partials_ptr = ws_ptr + partials_offset + parity * half_words
    loss_scale, grad_scale = call_scales(ws_ptr, labels_ptr, mask_ptr, grad_output_ptr, grad_output, n_rows, n_cols,
                                         ignore_index, LOSS, HAS_MASK, GRAD_OUTPUT_IN_MEMORY)

    # The distribution losses' fast math also leaves the second read's outside lanes unfilled and flushes subnormals
    # in the row's scalars (labels CE measured 0.6% slower with both: logs/ab_code_trees_ftz_2026-11-26.txt).
    DISTRIBUTION_FAST: tl.constexpr = FAST_MATH and LOSS != CE_LABELS
    flip = grad_scale < 0  # FOLDED: the tiles of the gradient read the other way round
    behind = LAG_STEPS * n_slots  # rows between the one read from DRAM and the one finished
    row = slot.to(tl.int64)
    cur_valid, _unused = row_validity(labels_ptr, mask_ptr, tl.minimum(row, n_rows - 1), ignore_index, LOSS, HAS_MASK)
    cur_valid = cur_valid & (row < n_rows)
    if PREFETCH:  # the first step's chunk
        first = tl.minimum(row, n_rows - 1)
        head_first, body_first = row_peel(first * logits_stride, n_cols, PEEL, VEC)
        x_next, t_next = load_chunk(logits_ptr, target_ptr, first, head_first, body_first, cur_valid, start, cols,
                                    logits_stride, target_stride, LOSS, PEEL, VEC)
    # READ_AHEAD: Triton's software pipeliner issues the loads of the next READ_AHEAD steps as asynchronous copies to
    # shared memory (cp.async), so reads stay in flight through a step's math without holding registers.
    for row in tl.range(slot.to(tl.int64), n_rows + behind, n_slots, num_stages=READ_AHEAD + 1):
        # Validity of the next step's row, loaded a step ahead (it decides whether that row is read).
        # (Only the flag is carried: Triton 3.6 dropped a carried label, see the README's notes.)
        nxt = row + n_slots
        nxt_valid, _unused = row_validity(labels_ptr, mask_ptr, tl.minimum(nxt, n_rows - 1), ignore_index, LOSS,
                                          HAS_MASK)
        nxt_valid = nxt_valid & (nxt < n_rows)
        cur = tl.minimum(row, n_rows - 1)
        old = tl.maximum(row - behind, 0)
        old_valid, label = row_validity(labels_ptr, mask_ptr, old, ignore_index, LOSS, HAS_MASK)
        old_valid = old_valid & (row >= behind)
        summaries = partials_ptr + old * (N_PARTIALS * NUM_CHUNKS)

        if POLL_FIRST:
            all_m_x, all_s_x, all_m_t, all_s_t, all_acc = wait_for_summaries(summaries, old_valid, NUM_CHUNKS, lanes,
                                                                              lane_used, LOSS)
        # This row's chunk (DRAM; kept in L2 for its second read), the old row's chunk (L2, last use).
        # Chunks cover each row's 16-byte body (the whole row without PEEL).
        head_cur, body_cur = row_peel(cur * logits_stride, n_cols, PEEL, VEC)
        head_old, body_old = row_peel(old * logits_stride, n_cols, PEEL, VEC)
        # PEEL: the last chunk's program also takes each row's head and tail columns. Their reads are issued with the
        # chunks' (masked off in the other programs), so their latency overlaps the chunks' instead of coming after
        # them: a program that waited for them would publish late, and every program of its rows waits for it.
        ex_cur, et_cur = edge_tiles(logits_ptr + cur * logits_stride, target_ptr + cur * target_stride, head_cur,
                                    body_cur, n_cols, cur_valid & (chunk == NUM_CHUNKS - 1), LOSS, PEEL, VEC)
        if PREFETCH:  # this step's chunk arrived during the last step; request the next step's
            x_cur, t_cur = x_next, t_next
            ahead = tl.minimum(nxt, n_rows - 1)
            head_ahead, body_ahead = row_peel(ahead * logits_stride, n_cols, PEEL, VEC)
            x_next, t_next = load_chunk(logits_ptr, target_ptr, ahead, head_ahead, body_ahead, nxt_valid, start, cols,
                                        logits_stride, target_stride, LOSS, PEEL, VEC)
            if cur_valid:  # summarise while the old row's chunk comes from L2
                summarise_chunk(x_cur, t_cur, ex_cur, et_cur, partials_ptr, cur, chunk, LOSS, NUM_CHUNKS, PEEL,
                                FAST_MATH)
        else:
            x_cur, t_cur = load_chunk(logits_ptr, target_ptr, cur, head_cur, body_cur, cur_valid, start, cols,
                                      logits_stride, target_stride, LOSS, PEEL, VEC)
        x_old_row = logits_ptr + old * logits_stride
        old_width = tl.where(old_valid, body_old - start, 0)
        if not COMPUTE_GRAD:
            old_width = 0 * old_width
        x_old_ptr = logits_ptr + body_offset(old * logits_stride, head_old, PEEL, VEC) + start
        t_old_ptr = target_ptr + body_offset(old * target_stride, head_old, PEEL, VEC) + start
        if FOLDED:  # a negative grad_scale: the tiles read the other way round (see folded_gradient)
            x_old_ptr, t_old_ptr = tl.where(flip, t_old_ptr, x_old_ptr), tl.where(flip, x_old_ptr, t_old_ptr)
        x_old, t_old = load_raw_tiles(x_old_ptr, t_old_ptr, cols, old_width, LOSS, "evict_first",
                                      not DISTRIBUTION_FAST)
        g_old = grad_ptr + body_offset(old * n_cols, head_old, PEEL, VEC) + start
        old_edge = old_valid & (chunk == NUM_CHUNKS - 1) & COMPUTE_GRAD
        ex_old, et_old = edge_tiles(x_old_row, target_ptr + old * target_stride, head_old, body_old, n_cols, old_edge,
                                    LOSS, PEEL, VEC)
        in_old = cols < body_old - start
        x_label = label_logit(x_old_row, tl.where(old_valid, label, 0), n_cols, LOSS)
        if not POLL_FIRST:  # poll with every read in flight
            all_m_x, all_s_x, all_m_t, all_s_t, all_acc = wait_for_summaries(summaries, old_valid, NUM_CHUNKS, lanes,
                                                                              lane_used, LOSS)

        if old_valid:
            big_m_x, big_s_x, big_m_t, big_s_t, big_acc = combine_partials(
                all_m_x, all_s_x, all_m_t, all_s_t, all_acc, LOSS
            )
            row_fast = FAST_MATH + DISTRIBUTION_FAST  # 2: subnormals flushed too (row_math.log2_of)
            loss = row_loss(big_m_x, big_s_x, big_m_t, big_s_t, big_acc, x_label, LOSS, row_fast)
            tl.store(loss_rows_ptr + old, loss * loss_scale, mask=chunk == 0)
            if COMPUTE_GRAD:
                lse_diff2 = lse_difference(big_m_x, big_s_x, big_m_t, big_s_t, row_fast)
                old_label = label_in_tile(label, start + head_old, BLOCK_SIZE)
                if FOLDED:  # the scales in the exponents
                    shift_x, shift_t = gradient_shifts(big_m_x, big_s_x, big_m_t, big_s_t, grad_scale, row_fast)
                    grad = folded_gradient(widen(x_old), widen(t_old), tl.where(flip, shift_t, shift_x),
                                           tl.where(flip, shift_x, shift_t))
                elif FAST_MATH:  # grad_scale folded into the row's scalars, the tiles in natural units
                    q_scale, p_scale, offset = gradient_scales(big_s_x, big_s_t, lse_diff2, loss, grad_scale, LOSS,
                                                               row_fast)
                    grad = scaled_gradient(widen(x_old), widen(t_old), big_m_x, big_m_t, q_scale, p_scale, offset,
                                           cols, old_label, LOSS)
                else:
                    grad = gradient_from_summary(base2(x_old), base2(t_old), big_m_x, big_s_x, big_m_t, big_s_t,
                                                 lse_diff2, cols, old_label, loss, LOSS) * grad_scale
                tl.store(g_old + cols, grad.to(grad_ptr.dtype.element_ty), mask=in_old, eviction_policy="evict_first")
                if PEEL:
                    if chunk == NUM_CHUNKS - 1:  # the row's head and tail columns (read with the chunks, above)
                        ecols, evalid = edge_columns(head_old, body_old, n_cols, VEC)
                        egrad = gradient_from_summary(ex_old, et_old, big_m_x, big_s_x, big_m_t, big_s_t, lse_diff2,
                                                      ecols, label, loss, LOSS)
                        tl.store(grad_ptr + old * n_cols + ecols, (egrad * grad_scale).to(grad_ptr.dtype.element_ty),
                                 mask=evalid)
        elif row >= behind:  # a skipped old row: zero loss and gradient
            tl.store(loss_rows_ptr + old, 0.0, mask=chunk == 0)
            if COMPUTE_GRAD:
                tl.store(g_old + cols, tl.zeros([BLOCK_SIZE], dtype=grad_ptr.dtype.element_ty), mask=in_old)
                if PEEL:
                    ecols, evalid = edge_columns(head_old, body_old, n_cols, VEC)
                    tl.store(grad_ptr + old * n_cols + ecols, tl.zeros([2 * VEC], dtype=grad_ptr.dtype.element_ty),
                             mask=evalid & (chunk == NUM_CHUNKS - 1))

        if not PREFETCH:
            if cur_valid:
                summarise_chunk(x_cur, t_cur, ex_cur, et_cur, partials_ptr, cur, chunk, LOSS, NUM_CHUNKS, PEEL,
                                FAST_MATH)
        cur_valid = nxt_valid
    # This program's words of the other half back to EMPTY_BITS for the next call (after the loop: in it, the
    # stores cost the lagged kernel registers).
    empty_summaries(ws_ptr + partials_offset + (1 - parity) * half_words, slot, chunk, n_rows, n_slots, NUM_CHUNKS,
                    2 if LOSS == CE_LABELS else N_PARTIALS)
    finish_program(ws_ptr, loss_ptr, n_rows)


@triton.jit
def load_chunk(logits_ptr, target_ptr, row, head, body, valid, start, cols, logits_stride, target_stride,
               LOSS: tl.constexpr, PEEL: tl.constexpr, VEC: tl.constexpr):
    """A program's chunk of ``row`` (its ``head`` and ``body``: row_math.row_peel; nothing read when not ``valid``)
    from DRAM, kept in L2 for its second read."""
    return load_raw_tiles(logits_ptr + body_offset(row * logits_stride, head, PEEL, VEC) + start,
                          target_ptr + body_offset(row * target_stride, head, PEEL, VEC) + start,
                          cols, tl.where(valid, body - start, 0), LOSS, "evict_last")


@triton.jit
def edge_tiles(x_row, t_row, head, body, n_cols, take, LOSS: tl.constexpr, PEEL: tl.constexpr, VEC: tl.constexpr):
    """With PEEL, a row's head and tail columns as base-2 tiles (row_math.load_edge; nothing read where ``take`` is
    false); without, placeholders that are never used."""
    ex2 = 0.0
    et2 = 0.0
    if PEEL:
        ex2, et2, _cols, _valid = load_edge(x_row, t_row, head, body, n_cols, take, LOSS, VEC)
    return ex2, et2


@triton.jit
def summarise_chunk(x, t, ex2, et2, partials_ptr, row, chunk, LOSS: tl.constexpr, NUM_CHUNKS: tl.constexpr,
                    PEEL: tl.constexpr, FAST_MATH: tl.constexpr = False):
    """Summarise a row's chunk and publish it (plain stores: see EMPTY_BITS); with PEEL the last chunk's summary also
    covers the row's head and tail columns (``ex2``, ``et2``: edge_tiles, read by the caller with the chunk).
    FAST_MATH: row_math.tile_statistics_raw."""
    if FAST_MATH:
        m_x, s_x, m_t, s_t, acc = tile_statistics_raw(widen(x), widen(t), LOSS)
    else:
        m_x, s_x, m_t, s_t, acc, _e_x, _e_t = tile_statistics(base2(x), base2(t), LOSS)
    if PEEL:
        if chunk == NUM_CHUNKS - 1:
            em_x, es_x, em_t, es_t, eacc, _edge_e_x, _edge_e_t = tile_statistics(ex2, et2, LOSS)
            m_x, s_x, m_t, s_t, acc = combine_statistics(m_x, s_x, m_t, s_t, acc, em_x, es_x, em_t, es_t, eacc, LOSS)
    store_partials(partials_ptr + row * (N_PARTIALS * NUM_CHUNKS) + chunk, NUM_CHUNKS, m_x, s_x, m_t, s_t, acc, LOSS)


@triton.jit(noinline=True)
def empty_summaries(half_ptr, slot, chunk, n_rows, n_slots, NUM_CHUNKS: tl.constexpr, WORDS: tl.constexpr):
    """Set the summary words program (slot, chunk) publishes (its chunk of rows slot, slot + n_slots, ...) to
    EMPTY_BITS in one half of the lagged exchange: the first WORDS of each summary (the others are never written)."""
    steps = tl.arange(0, EMPTY_BLOCK).to(tl.int64)
    empty = tl.full([EMPTY_BLOCK], EMPTY_BITS, dtype=tl.int32).to(tl.float32, bitcast=True)
    for first in range(slot.to(tl.int64), n_rows, n_slots * EMPTY_BLOCK):
        rows = first + steps * n_slots
        words = half_ptr + rows * (N_PARTIALS * NUM_CHUNKS) + chunk
        for k in tl.static_range(WORDS):
            tl.store(words + k * NUM_CHUNKS, empty, mask=rows < n_rows)


@triton.jit
def wait_for_summaries(summaries, valid, NUM_CHUNKS: tl.constexpr, lanes, lane_used, LOSS: tl.constexpr):
    """A row's chunk summaries, polled until every one has been written (not polled for a skipped row)."""
    m_x, s_x, m_t, s_t, acc = load_partials(summaries, NUM_CHUNKS, lanes, lane_used, LOSS)
    if valid:
        while summaries_missing(m_x, s_x, m_t, s_t, acc, lane_used):
            m_x, s_x, m_t, s_t, acc = load_partials(summaries, NUM_CHUNKS, lanes, lane_used, LOSS)
    return m_x, s_x, m_t, s_t, acc


@triton.jit
def is_empty(value):
    return value.to(tl.int32, bitcast=True) == EMPTY_BITS


@triton.jit
def summaries_missing(m_x, s_x, m_t, s_t, acc, lane_used):
    """Whether any used lane of a row's summaries is still EMPTY_BITS (its chunk has not published)."""
    empty = is_empty(m_x) | is_empty(s_x) | is_empty(m_t) | is_empty(s_t) | is_empty(acc)
    return tl.max((empty & lane_used).to(tl.int32), axis=0) > 0


def summary_lanes(num_chunks: int) -> int:
    """Lanes of the vector a program loads a row's chunk summaries into (CHUNKS_POW2): a power of two, at least one
    warp's 32. With 16 lanes ptxas gave the lagged kernel 128 registers instead of 80 (labels CE, 16 chunks of 4096
    columns, 4 warps, sm_90 offline compile: 4 programs per SM instead of 6)."""
    return max(32, next_power_of_2(num_chunks))


def default_split_row_config(n_cols: int) -> tuple[int, int]:
    """Chunks of up to 4K columns with 4 warps (32 values per thread per live tile): the best split_row
    configuration for most shapes of the H100 sweep (data/h100-sxm-80gb/split_row_tuning.csv)."""
    block_size = min(max(next_power_of_2(n_cols), MIN_BLOCK_SIZE), 4096)
    return block_size, 4


def max_resident_programs(launch: Launch) -> int:
    """How many programs of this exact launch the GPU holds at once (0 off a GPU: never cooperative).

    Fetches the kernel Triton would launch for these arguments (``warmup`` compiles it once, then
    hits Triton's cache), reads its registers and shared memory, and applies NVIDIA's occupancy
    algorithm (:mod:`kernels.occupancy`) times the number of SMs. It must be this exact kernel: Triton
    specializes integer arguments (== 1, multiples of 16), and the variants differ in registers.
    """
    device = launch.args["logits_ptr"].device
    if device.type != "cuda":
        return 0
    with torch.cuda.device(device):
        kernel = launch.fn.warmup(**launch.args, **launch.constexprs, grid=launch.grid, **launch.options)
        props = torch.cuda.get_device_properties(device)
    occ = occupancy_of_compiled(kernel, (props.major, props.minor))
    return occ.blocks_per_sm * props.multi_processor_count


def cooperative_slots(coop: Launch, n_rows: int, num_chunks: int) -> tuple[int, int]:
    """(rows in flight, resident programs of the kernel launched with that many); 0 rows: cannot run.

    Triton compiles ``n_slots`` into one of three kernels (== 1, a multiple of 16, anything else)
    that may differ in registers, so the chosen grid is checked against the occupancy of the kernel
    of its own class; when it does not fit, one row fewer moves it back to the class already sized.
    """

    def resident(n_slots: int) -> int:
        coop.args["n_slots"] = n_slots
        return max_resident_programs(coop)

    fit = resident(3)  # the "any other value" kernel
    slots = min(n_rows, fit // num_chunks)
    if slots >= 16 and slots % 16 == 0:
        fit_16 = resident(slots)
        if slots * num_chunks <= fit_16:
            fit = fit_16
        else:
            slots -= 1
    elif slots == 1:
        fit = resident(1)
        slots = 1 if fit >= num_chunks else 0
    coop.args["n_slots"] = max(slots, 1)
    return slots, fit


def split_buffers(problem: Problem, num_chunks: int, schedule: str, *, lagged: bool) -> tuple[list, tuple]:
    """``([workspace, grad, loss, counters], workspace fills)`` of a split plan: the workspace holds the chunks'
    summaries after the call's own words, twice for the lagged schedule (two halves, the first starting
    EMPTY_BITS: split_row_lagged_kernel); arrival counters only for the "wait" schedule (None otherwise: the other
    kernels get a placeholder pointer)."""
    partials_offset = workspace_size(problem.n_rows)
    partials_words = problem.n_rows * N_PARTIALS.value * num_chunks
    fills = ((partials_offset, partials_words, EMPTY_BITS.value),) if lagged else ()
    workspace, loss, grad = allocate_outputs(problem, extra_floats=partials_words * (2 if lagged else 1), fills=fills)
    counters = (torch.zeros(problem.n_rows, dtype=torch.int32, device=problem.logits.device)
                if schedule == "wait" else None)
    return [workspace, grad, loss, counters], fills


def split_launch(problem: Problem, block_size: int, num_warps: int, buffers: list, *, phase, n_slots: int,
                 schedule: str = "lagged", prefetch: bool = False, read_ahead: int = 0, fast_math: bool = True,
                 maxnreg: int | None = None) -> Launch:
    """One launch of a split plan over ``buffers`` (:func:`split_buffers`): a phase of the multi-launch kernel
    (``phase`` PHASE_STATS or PHASE_GRAD, a grid of ``n_slots`` rows x chunks), or with ``phase`` None the
    cooperative kernel of ``schedule`` (``n_slots`` rows in flight)."""
    workspace, grad, loss, counters = buffers
    num_chunks = triton.cdiv(problem.n_cols, block_size)
    scale_args, scale_constexprs = problem.scale_args()
    if phase is not None:
        fn, kernel_constexprs = split_row_kernel, {"PHASE": phase.value}
        name = "split_row.stats" if phase.value == PHASE_STATS.value else "split_row.grad"
    elif schedule == "wait":
        fn, kernel_constexprs, name = split_row_cooperative_kernel, {}, "split_row.cooperative"
    else:
        # Measured on the H100 (data/h100-sxm-80gb/split_row_schedules.csv): polling first keeps
        # labels CE's registers down; the target-distribution losses gain from polling last.
        fn, kernel_constexprs = split_row_lagged_kernel, {"POLL_FIRST": problem.loss_code == CE_LABELS.value,
                                                          **problem.peel_constexprs()}
        name = "split_row.lagged"
        if prefetch:  # only when asked: the default launch keeps its constexprs (and its compiled kernel)
            kernel_constexprs["PREFETCH"] = True
        if read_ahead:
            kernel_constexprs["READ_AHEAD"] = read_ahead
        if not fast_math:  # only when asked: the default launch keeps its constexprs
            kernel_constexprs["FAST_MATH"] = False
    return Launch(
        name=name,
        fn=fn,
        grid=(n_slots * num_chunks,),
        args=dict(
            problem.loss_args(workspace, loss, grad),
            counters_ptr=counters if counters is not None else workspace,
            n_slots=n_slots,
            partials_offset=workspace_size(problem.n_rows),
            **scale_args,
        ),
        constexprs=dict(
            problem.loss_constexprs(),
            **scale_constexprs,
            **kernel_constexprs,
            NUM_CHUNKS=num_chunks,
            CHUNKS_POW2=summary_lanes(num_chunks),
            BLOCK_SIZE=block_size,
        ),
        num_warps=num_warps,
        maxnreg=maxnreg,
    )


def cooperative_launch(problem: Problem, block_size: int | None = None, num_warps: int | None = None, *,
                       schedule: str = "lagged", n_slots: int = 1, maxnreg: int | None = None, prefetch: bool = False,
                       read_ahead: int = 0, fast_math: bool = True) -> Launch:
    """The cooperative kernel a GPU runs for this problem (what :func:`plan_split_row` launches there), built on any
    device, with ``n_slots`` rows in flight (a GPU plan sizes them to what the device holds): for offline compiles
    and counts, where a CPU plan is the multi-launch form. A ValueError for a row of one chunk (no exchange)."""
    default_block, default_warps = default_split_row_config(problem.n_cols)
    block_size = check_block_size(block_size) if block_size is not None else default_block
    num_warps = check_num_warps(num_warps) if num_warps is not None else default_warps
    if schedule not in ("lagged", "wait"):
        raise ValueError(f"schedule must be 'lagged' or 'wait' for a cooperative launch, got {schedule!r}")
    num_chunks = triton.cdiv(problem.n_cols, block_size)
    if num_chunks < 2:
        raise ValueError(f"a row of {problem.n_cols} columns is one chunk of {block_size}: nothing is exchanged")
    buffers, _fills = split_buffers(problem, num_chunks, schedule, lagged=schedule == "lagged")
    return split_launch(problem, block_size, num_warps, buffers, phase=None, n_slots=n_slots, schedule=schedule,
                        prefetch=prefetch, read_ahead=read_ahead, fast_math=fast_math, maxnreg=check_maxnreg(maxnreg))


def plan_split_row(
    problem: Problem,
    block_size: int | None = None,
    num_warps: int | None = None,
    *,
    split: bool = True,
    cooperative: bool | None = None,
    schedule: str = "lagged",
    maxnreg: int | None = None,
    keep_last: bool = False,
    prefetch: bool = False,
    read_ahead: int = 0,
    fast_math: bool = True,
) -> Plan:
    """Plan the split-row variant.

    split: True cuts each row into chunks of ``block_size`` spread over programs that exchange
    summaries; False gives each row one program that walks its chunks twice (the fused kernel's tile
    loop: the second walk finds the row in L2, as the same program read it a moment before), so
    nothing is exchanged. Which one is faster depends on the loss and vocab: the tuning table says.
    cooperative: None picks the one-read cooperative kernel when it is safe (a GPU, not the
    interpreter, and a grid that fits on the device at once), else the two-launch form; True
    demands the cooperative kernel and raises if it cannot run safely; False forces two launches.
    schedule: the cooperative kernel's, "lagged" (default) or "wait" (see the module docstring).
    maxnreg: a per-thread register cap for the split kernels (ptxas spills above it). More programs
    fit per SM, which the H100 sweep found slower at every cap tried (split_row_register_caps.csv).
    keep_last: with split=False, a program keeps its row's last chunk in registers from the first walk to the
    second (see kernels.fused.plan_fused); no effect on split rows.
    prefetch: the lagged kernel requests each step's chunk one step early (``PREFETCH`` of split_row_lagged_kernel);
    only with the lagged schedule.
    read_ahead: steps of the lagged kernel whose reads are in flight ahead of the step being computed, through shared
    memory (``READ_AHEAD`` of split_row_lagged_kernel: Triton's software pipeliner turns the step loop's loads into
    asynchronous copies, ``read_ahead + 1`` stages); 0 (default) reads each step's chunks when the step starts. Costs
    shared memory, not registers: (read_ahead + 1) x the step's tiles per program. Only with the lagged schedule.
    fast_math: the lagged kernel's ``FAST_MATH`` (default True; False: the exact log2 and division, the statistics
    from base-2 scaled tiles, as before 2026-11-26). No effect on the other kernels.
    """
    default_block, default_warps = default_split_row_config(problem.n_cols)
    block_size = check_block_size(block_size) if block_size is not None else default_block
    num_warps = check_num_warps(num_warps) if num_warps is not None else default_warps
    if cooperative is not None and not isinstance(cooperative, bool):  # 1 == True: `in (True, False)` lets 1 through
        raise TypeError(f"cooperative must be None, True or False, got {cooperative!r}")
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    if not isinstance(split, bool):
        raise TypeError(f"split must be True or False, got {split!r}")
    if cooperative and not split:
        raise ValueError("cooperative=True needs split=True: with split=False each row has one program and "
                         "nothing to exchange")
    maxnreg = check_maxnreg(maxnreg)
    keep_last = check_keep_last(keep_last)
    if not isinstance(prefetch, bool):
        raise TypeError(f"prefetch must be True or False, got {prefetch!r}")
    if prefetch and (schedule != "lagged" or not split or cooperative is False):
        raise ValueError("prefetch=True is an option of the lagged cooperative kernel: it needs split=True, "
                         "schedule='lagged' and cooperative not False")
    if not isinstance(read_ahead, int) or isinstance(read_ahead, bool) or not 0 <= read_ahead <= MAX_READ_AHEAD:
        raise ValueError(f"read_ahead must be an int in [0, {MAX_READ_AHEAD}] (steps read ahead), got {read_ahead!r}")
    if not isinstance(fast_math, bool):
        raise TypeError(f"fast_math must be True or False, got {fast_math!r}")
    if read_ahead and (schedule != "lagged" or not split or cooperative is False):
        raise ValueError("read_ahead is an option of the lagged cooperative kernel: it needs split=True, "
                         "schedule='lagged' and cooperative not False")
    num_chunks = triton.cdiv(problem.n_cols, block_size)
    config = {"block_size": block_size, "num_warps": num_warps, "num_chunks": num_chunks}

    if num_chunks == 1 or not split:  # one program per row: nothing to exchange
        workspace, loss, grad = allocate_outputs(problem)
        launch = fused_launch(problem, block_size, num_warps, workspace, loss, grad, keep_last=keep_last)
        return Plan("fused", [launch], finisher(problem, loss, grad),  # the fused kernel runs: the plan says so
                    {**config, "mode": "single" if num_chunks == 1 else "row", **keeps_last_tile(launch)},
                    buffers=[workspace, grad, loss])

    device = problem.logits.device
    want_cooperative = cooperative is not False and device.type == "cuda" and not interpreting()
    if cooperative and not want_cooperative:
        raise ValueError(
            "cooperative=True needs a CUDA device and compiled kernels (not TRITON_INTERPRET=1): its programs "
            "wait for each other, which the interpreter (one program at a time) cannot run"
        )
    buffers, fills = split_buffers(problem, num_chunks, schedule, lagged=want_cooperative and schedule == "lagged")
    workspace, grad, loss, counters = buffers

    def launch(phase: tl.constexpr | None, n_slots: int) -> Launch:
        return split_launch(problem, block_size, num_warps, buffers, phase=phase, n_slots=n_slots, schedule=schedule,
                            prefetch=prefetch, read_ahead=read_ahead, fast_math=fast_math, maxnreg=maxnreg)

    if want_cooperative and problem.n_rows:
        coop = launch(None, 1)
        n_slots, resident = cooperative_slots(coop, problem.n_rows, num_chunks)
        if n_slots >= 1:
            coop.grid = (n_slots * num_chunks,)
            return Plan(
                "split_row",
                [coop],
                finisher(problem, loss, grad),
                {**config, "mode": "cooperative", "schedule": schedule, **({"prefetch": True} if prefetch else {}),
                 **({"read_ahead": read_ahead} if read_ahead else {}),
                 "programs": n_slots * num_chunks, "resident_programs": resident},
                reset=counters.zero_ if schedule == "wait" else None,
                buffers=buffers,
                workspace_fills=fills,
            )
        if cooperative:
            raise ValueError(
                f"cooperative split_row cannot run: a row needs {num_chunks} programs at once but the device holds "
                f"only {resident} of this kernel; use a larger block_size or cooperative=None"
            )
    launches = [launch(PHASE_STATS, problem.n_rows), launch(PHASE_GRAD, problem.n_rows)]
    return Plan("split_row", launches, finisher(problem, loss, grad), {**config, "mode": "multi_launch"},
                buffers=buffers)
