"""A prologue launch, for the kernels that read their scales from the workspace (the vocab-parallel designs, the
case study's #497 kernels) and for an empty batch: what those kernels need to know before they write anything.

Program 0 counts the rows that enter the mean (label != ignore_index, loss_mask set), checks every label
against [0, n_cols) and writes the two scales those kernels multiply by, 1 / n_valid and grad_output / n_valid
(grad_output read from the device when the caller passed a tensor), zeroes the finish counters
(``row_math.finish_program``) and the loss. Everything stays on the device: no host sync.

The variants' own kernels (fused, two_pass, split_row, resident_row) need no prologue: they work their scales out
themselves (``row_math.call_scales``), one launch per call. The label check is the same in both: an out-of-range
label makes both scales NaN, so the loss and the whole gradient are NaN (never a finite wrong number), and trips a
device-side assert, as PyTorch's own ``cross_entropy`` does: the CUDA context then reports "device-side assert
triggered" at the next synchronization, and the process must restart. ``validate=True`` checks on the host before
launching instead (a ValueError naming the labels, one sync).
"""

import torch
import triton
import triton.language as tl

from .launch import Launch
from .problem import Problem
from .row_math import WS_DONE, WS_GRAD_SCALE, WS_LOSS_SCALE, assert_labels_in_range, count_rows, mean_scales


@triton.jit(debug=True)  # debug: keep the device_assert (Triton drops asserts otherwise)
def loss_prologue_kernel(
    labels_ptr,  # (n_rows,) integer labels, or a dummy
    mask_ptr,  # (n_rows,) uint8 row mask, or a dummy
    grad_output_ptr,  # 0-d grad_output on the device, or a dummy
    ws_ptr,  # fp32 workspace (kernels.problem: counters, scales, row losses)
    loss_ptr,  # 0-d fp32 loss: 0 until the loss kernel's last program writes it (stays 0 for an empty batch)
    n_rows,
    n_cols,
    ignore_index,
    grad_output,  # grad_output when given as a number
    LOSS: tl.constexpr,
    HAS_MASK: tl.constexpr,
    GRAD_OUTPUT_IN_MEMORY: tl.constexpr,
):
    n_counted, n_bad = count_rows(labels_ptr, mask_ptr, n_rows, n_cols, ignore_index, LOSS, HAS_MASK)
    loss_scale, grad_scale = mean_scales(n_counted, n_bad > 0, grad_output_ptr, grad_output, GRAD_OUTPUT_IN_MEMORY)
    tl.store(ws_ptr + WS_LOSS_SCALE, loss_scale)
    tl.store(ws_ptr + WS_GRAD_SCALE, grad_scale)
    header = tl.arange(0, 128)
    tl.store(ws_ptr + header, tl.zeros([128], dtype=tl.float32), mask=header <= WS_DONE)
    tl.store(loss_ptr, 0.0)
    assert_labels_in_range(n_bad)


def prologue_launch(problem: Problem, workspace: torch.Tensor, loss: torch.Tensor) -> Launch:
    """The prologue of one call (one program)."""
    scale_args, scale_constexprs = problem.scale_args()
    return Launch(
        name="prologue",
        fn=loss_prologue_kernel,
        grid=(1,),
        args=dict(
            labels_ptr=problem.labels if problem.labels is not None else workspace,
            mask_ptr=problem.mask if problem.mask is not None else workspace,
            ws_ptr=workspace,
            loss_ptr=loss,
            n_rows=problem.n_rows,
            n_cols=problem.n_cols,
            ignore_index=problem.ignore_index,
            **scale_args,
        ),
        constexprs=dict(LOSS=problem.loss_code, HAS_MASK=problem.mask is not None, **scale_constexprs),
        num_warps=4,
    )
