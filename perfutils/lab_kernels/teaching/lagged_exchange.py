"""The lagged exchange at teaching size (notebook 12, step 7): cross-entropy from labels with each row split into
chunks held by different programs, which exchange their chunks' summaries and never wait for a row still being read.

``lagged_exchange_kernel`` is the idea of ``kernels.split_row.split_row_lagged_kernel`` without the product's
machinery (two halves of summaries that alternate between calls so nothing is refilled, a NaN payload arithmetic
never produces, peeled rows, masks and ignored rows, other losses, fast math). Program (slot, chunk) walks the rows
slot, slot + n_slots, ...; in step k it

1. reads its chunk of row r_k = slot + k * n_slots from DRAM, and publishes the chunk's max and sum of exponentials;
2. finishes row r_(k - LAG): every program of that row published its summary LAG steps ago, so the summaries are
   there (or nearly: ``WAIT`` polls until they are); it combines them into the row's max and sum, reads its chunk of
   that row a second time (from L2 now: the grid read it a moment ago) and writes the chunk's gradient.

DRAM sees each logit once; no program waits for a row it is still reading. The summaries start as NaN (the wrapper
fills them each call), and a summary is published when it is not NaN any more.

On a GPU the kernel runs once, persistent (``WAIT``: the programs poll each other, so they must all be resident at
once); Triton's interpreter runs a grid's programs one after another, which a poll would hang, so on a CPU the same
kernel runs one launch per step (``first_step``, ``last_step``): a launch finishes rows whose summaries earlier
launches published. Checked against ``kernels.reference`` (float64) in tests/test_teaching.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.launch import interpreting
from kernels.occupancy import occupancy_of_compiled

from .checks import check_power_of_two

__all__ = ["lagged_exchange_kernel", "lagged_cross_entropy", "most_slots", "resident_programs"]


@triton.jit
def lagged_exchange_kernel(logits_ptr, labels_ptr, grad_ptr, row_loss_ptr, summaries_ptr, n_rows, n_cols, n_slots,
                           first_step, last_step, grad_scale, NUM_CHUNKS: tl.constexpr, CHUNKS_POW2: tl.constexpr,
                           BLOCK: tl.constexpr, LAG: tl.constexpr, WAIT: tl.constexpr):
    slot = tl.program_id(0) // NUM_CHUNKS
    chunk = tl.program_id(0) % NUM_CHUNKS
    cols = chunk * BLOCK + tl.arange(0, BLOCK)
    in_row = cols < n_cols
    lanes = tl.arange(0, CHUNKS_POW2)
    for step in range(first_step, last_step):
        # 1. This step's row, read from DRAM: summarise my chunk and publish it. Nobody waits for it now.
        row = slot + step * n_slots
        if row < n_rows:
            x = tl.load(logits_ptr + row * n_cols + cols, mask=in_row, other=-float("inf")).to(tl.float32)
            chunk_max = tl.max(x, axis=0)
            chunk_sum = tl.sum(tl.exp(x - chunk_max), axis=0)
            tl.store(summaries_ptr + (row * NUM_CHUNKS + chunk) * 2, chunk_max)
            tl.store(summaries_ptr + (row * NUM_CHUNKS + chunk) * 2 + 1, chunk_sum)
        # 2. The row read LAG steps ago: its chunks' summaries were published meanwhile.
        old = row - LAG * n_slots
        if (old >= 0) & (old < n_rows):
            words = summaries_ptr + (old * NUM_CHUNKS + lanes) * 2
            used = lanes < NUM_CHUNKS
            maxes = tl.load(words, mask=used, other=-float("inf"), volatile=True)  # volatile: from L2, not a copy
            sums = tl.load(words + 1, mask=used, other=0.0, volatile=True)
            if WAIT:  # a peer that fell behind: poll until no summary is NaN (unpublished)
                while tl.max(((maxes != maxes) | (sums != sums)).to(tl.int32), axis=0) > 0:
                    maxes = tl.load(words, mask=used, other=-float("inf"), volatile=True)
                    sums = tl.load(words + 1, mask=used, other=0.0, volatile=True)
            row_max = tl.max(maxes, axis=0)
            row_sum = tl.sum(sums * tl.exp(maxes - row_max), axis=0)
            label = tl.load(labels_ptr + old).to(tl.int32)
            x = tl.load(logits_ptr + old * n_cols + cols, mask=in_row, other=-float("inf")).to(tl.float32)  # L2
            probability = tl.exp(x - row_max) / row_sum
            grad = (probability - tl.where(cols == label, 1.0, 0.0)) * grad_scale
            tl.store(grad_ptr + old * n_cols + cols, grad.to(grad_ptr.dtype.element_ty), mask=in_row)
            if chunk == 0:  # one program of the row writes its loss
                x_label = tl.load(logits_ptr + old * n_cols + label).to(tl.float32)
                tl.store(row_loss_ptr + old, row_max + tl.log(row_sum) - x_label)


def lagged_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, *, block: int = 2048, num_warps: int = 4,
                         lag: int = 2, slots: int | None = None, persistent: bool | None = None):
    """(mean cross-entropy, its gradient) of contiguous 2-D ``logits`` and int ``labels`` through
    :func:`lagged_exchange_kernel`: rows cut into chunks of ``block`` columns, ``slots`` rows in flight (default:
    as many as the GPU holds at once, :func:`most_slots`; on a CPU 3). ``persistent`` (default: on a GPU, not under
    the interpreter): one launch whose programs poll each other, else one launch per step."""
    if logits.dim() != 2 or not logits.is_contiguous():
        raise ValueError(f"logits must be a contiguous 2-D tensor, got shape {tuple(logits.shape)}")
    if labels.shape != logits.shape[:1] or labels.dtype not in (torch.int32, torch.int64):
        raise ValueError("labels must be one int per row of logits")
    check_power_of_two("block", block, 16, 16384)
    check_power_of_two("num_warps", num_warps, 1, 32)
    if not isinstance(lag, int) or isinstance(lag, bool) or lag < 1:
        raise ValueError(f"lag must be an int >= 1 (steps between a row's read and its finish), got {lag!r}")
    if slots is not None and (not isinstance(slots, int) or isinstance(slots, bool) or slots < 1):
        raise ValueError(f"slots must be an int >= 1 (rows in flight) or None, got {slots!r}")
    persistent = logits.is_cuda and not interpreting() if persistent is None else persistent
    n_rows, n_cols = logits.shape
    num_chunks = triton.cdiv(n_cols, block)
    grad = torch.empty_like(logits)
    row_loss = torch.empty(n_rows, dtype=torch.float32, device=logits.device)
    summaries = torch.full((n_rows, num_chunks, 2), float("nan"), dtype=torch.float32, device=logits.device)
    args = dict(logits_ptr=logits, labels_ptr=labels, grad_ptr=grad, row_loss_ptr=row_loss, summaries_ptr=summaries,
                n_rows=n_rows, n_cols=n_cols, grad_scale=1.0 / n_rows, NUM_CHUNKS=num_chunks,
                CHUNKS_POW2=triton.next_power_of_2(num_chunks), BLOCK=block, LAG=lag, WAIT=persistent,
                num_warps=num_warps)
    if slots is None:  # on a GPU every row in flight that the GPU holds at once, else 3
        slots = most_slots(args, lag) if persistent else 3
        if slots < 1:
            raise ValueError(f"the GPU cannot hold one row's {num_chunks} programs at once: use a wider block")
    elif persistent and slots * num_chunks > resident_programs(args, slots, triton.cdiv(n_rows, slots) + lag):
        raise ValueError(f"a persistent launch polls its peers, so all {slots * num_chunks} programs must be "
                         "resident at once: fewer slots or a wider block")
    steps = triton.cdiv(n_rows, slots) + lag  # the last LAG steps only finish rows
    launches = [(0, steps)] if persistent else [(step, step + 1) for step in range(steps)]
    for first, last in launches:
        lagged_exchange_kernel[(slots * num_chunks,)](n_slots=slots, first_step=first, last_step=last, **args)
    return row_loss.mean(), grad


def most_slots(args: dict, lag: int) -> int:
    """The most rows in flight whose programs the GPU holds all at once (0 when one row's chunks do not fit)."""
    chunks, n_rows = args["NUM_CHUNKS"], args["n_rows"]
    slots = resident_programs(args, 1, n_rows + lag) // chunks
    while slots > 1 and slots * chunks > resident_programs(args, slots, triton.cdiv(n_rows, slots) + lag):
        slots -= 1  # another specialization of the launch's integers took more registers
    return slots


def resident_programs(args: dict, slots: int, steps: int) -> int:
    """How many programs of the persistent launch with these arguments, ``slots`` and ``steps`` the GPU holds at once
    (its registers and shared memory, by the product's occupancy calculation): the kernel is compiled for these very
    arguments, as Triton specializes integers (== 1, multiples of 16) and that can change its registers."""
    device = args["logits_ptr"].device
    compiled = lagged_exchange_kernel.warmup(**args, n_slots=slots, first_step=0, last_step=steps, grid=(1,))
    props = torch.cuda.get_device_properties(device)
    return occupancy_of_compiled(compiled, (props.major, props.minor)).blocks_per_sm * props.multi_processor_count
