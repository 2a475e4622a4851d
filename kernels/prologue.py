"""The prologue launch of every loss call: what the loss kernels need to know before they write anything.

Program 0 counts the rows that enter the mean (label != ignore_index, loss_mask set), checks every label
against [0, n_cols) and writes the two scales the loss kernels multiply by, 1 / n_valid and
grad_output / n_valid (grad_output read from the device when the caller passed a tensor), and zeroes the
finish counters (``row_math.finish_program``). The other programs fill a variant's exchange buffer with its
"empty" sentinel (split_row's lagged schedule). Everything stays on the device: no host sync.

An out-of-range label makes both scales NaN, so the loss and the whole gradient are NaN (never a finite wrong
number), and trips a device-side assert, as PyTorch's own ``cross_entropy`` does: the CUDA context then
reports "device-side assert triggered" at the next synchronization, and the process must restart.
``validate=True`` checks on the host before launching instead (a ValueError naming the labels, one sync).
"""

import torch
import triton
import triton.language as tl

from .launch import Launch
from .problem import Problem
from .row_math import CE_LABELS, WS_DONE, WS_GRAD_SCALE, WS_LOSS_SCALE

COUNT_BLOCK = 1024  # rows counted per step by program 0
FILL_BLOCK = 4096  # words filled per step by a fill program
FILL_PROGRAMS_MAX = 128


@triton.jit(debug=True)  # debug: keep the device_assert (Triton drops asserts otherwise)
def loss_prologue_kernel(
    labels_ptr,  # (n_rows,) integer labels, or a dummy
    mask_ptr,  # (n_rows,) uint8 row mask, or a dummy
    grad_output_ptr,  # 0-d grad_output on the device, or a dummy
    ws_ptr,  # fp32 workspace (kernels.problem: counters, scales, row losses, then fill_offset.. fill_offset+fill_count)
    loss_ptr,  # 0-d fp32 loss: 0 until the loss kernel's last program writes it (stays 0 for an empty batch)
    n_rows,
    n_cols,
    ignore_index,
    grad_output,  # grad_output when given as a number
    fill_offset,
    fill_count,
    FILL_BITS: tl.constexpr,  # the int32 pattern the fill writes
    LOSS: tl.constexpr,
    HAS_MASK: tl.constexpr,
    GRAD_OUTPUT_IN_MEMORY: tl.constexpr,
    COUNT_BLOCK: tl.constexpr,
    FILL_BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    if pid == 0:
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
        n_valid = tl.maximum(tl.sum(counted, axis=0), 1).to(tl.float32)
        n_bad = tl.sum(bad, axis=0)
        if GRAD_OUTPUT_IN_MEMORY:
            grad_output = tl.load(grad_output_ptr).to(tl.float32)
        poison = tl.where(n_bad > 0, float("nan"), 0.0)  # NaN + x is NaN; 0 + x is x
        tl.store(ws_ptr + WS_LOSS_SCALE, 1.0 / n_valid + poison)
        tl.store(ws_ptr + WS_GRAD_SCALE, grad_output / n_valid + poison)
        header = tl.arange(0, 128)
        tl.store(ws_ptr + header, tl.zeros([128], dtype=tl.float32), mask=header <= WS_DONE)
        tl.store(loss_ptr, 0.0)
        tl.device_assert(n_bad == 0, "target (labels) out of range: every label must lie in [0, n_cols) or equal "
                         "ignore_index")
    else:
        words = ws_ptr.to(tl.pointer_type(tl.int32), bitcast=True) + fill_offset
        lanes = tl.arange(0, FILL_BLOCK)
        pattern = tl.full([FILL_BLOCK], FILL_BITS, dtype=tl.int32)
        step = (tl.num_programs(0) - 1) * FILL_BLOCK
        for begin in range((pid - 1) * FILL_BLOCK, fill_count, step):
            tl.store(words + begin + lanes, pattern, mask=lanes < fill_count - begin)


def prologue_launch(problem: Problem, workspace: torch.Tensor, loss: torch.Tensor, fill_offset: int = 0, fill_count: int = 0,
                    fill_bits: int = 0) -> Launch:
    """The prologue of one call; ``fill_*``: the words of the workspace to set to ``fill_bits`` (none by default)."""
    fill_programs = min(FILL_PROGRAMS_MAX, triton.cdiv(fill_count, FILL_BLOCK))
    grad_tensor = problem.grad_output_tensor
    return Launch(
        name="prologue",
        fn=loss_prologue_kernel,
        grid=(1 + fill_programs,),
        args=dict(
            labels_ptr=problem.labels if problem.labels is not None else workspace,
            mask_ptr=problem.mask if problem.mask is not None else workspace,
            grad_output_ptr=grad_tensor if grad_tensor is not None else workspace,
            ws_ptr=workspace,
            loss_ptr=loss,
            n_rows=problem.n_rows,
            n_cols=problem.n_cols,
            ignore_index=problem.ignore_index,
            grad_output=float(problem.grad_output) if problem.grad_output is not None else 0.0,
            fill_offset=fill_offset,
            fill_count=fill_count,
        ),
        constexprs=dict(
            FILL_BITS=fill_bits,
            LOSS=problem.loss_code,
            HAS_MASK=problem.mask is not None,
            GRAD_OUTPUT_IN_MEMORY=grad_tensor is not None,
            COUNT_BLOCK=COUNT_BLOCK,
            FILL_BLOCK=FILL_BLOCK,
        ),
        num_warps=4,
    )
