"""Public entry points: the loss with its gradient, the autograd loss, and kernel-only plans.

    loss, grad = entropy_loss_forward_backward(logits, target, loss=..., target_format=...)   # one fused call
    loss = entropy_loss(logits, target, ...); loss.backward()                                  # torch.autograd
    plan = prepare(logits, target, ...); plan.run()                                            # kernel-only timing

The first two go through the PyTorch operators of :mod:`kernels.ops` (``torch.ops.fused_loss.*``), so they
trace into ``torch.compile`` graphs with no graph break and replay inside CUDA graphs. Nothing in a default call
synchronizes with the device: the rows that enter the mean are counted, and labels range-checked, on the device
inside the loss kernel (``row_math.call_scales``); ``validate=True`` checks labels on the host first (one sync, a
ValueError).
"""

from __future__ import annotations

import json

import torch

from . import ops, vocab_parallel
from .autograd import gradient_for, keep_for_backward
from .autotune import VARIANTS, plan_problem
from .launch import Plan
from .ops import CallOptions, call_options
from .problem import build_problem, check_block_size, check_num_warps


def prepare(
    logits: torch.Tensor,
    target: torch.Tensor,
    *,
    loss: str = "cross_entropy",
    target_format: str = "labels",
    variant: str = "auto",
    block_size: int | None = None,
    num_warps: int | None = None,
    grad_output=1.0,
    ignore_index: int = -100,
    loss_mask: torch.Tensor | None = None,
    validate: bool = False,
    group=None,
    tp_design: str = "auto",
    **variant_options,
) -> Plan:
    """Check the arguments and build the launches of one call without running them.

    ``Plan.run()`` returns (loss, grad) and can be called again: timing it measures the kernels alone (a
    kernel-only number; users call :func:`entropy_loss_forward_backward` or :func:`entropy_loss`). Variant
    options: two_pass takes stats_/grad_ block_size and num_warps; split_row takes ``split``, ``cooperative``,
    ``schedule``, ``maxnreg``, ``keep_last``, ``prefetch``, ``read_ahead`` and ``fast_math`` (see
    :func:`kernels.split_row.plan_split_row`); fused takes ``keep_last`` and ``resident`` (see
    :func:`kernels.fused.plan_fused`).
    ``auto`` and ``split_row`` called without block_size, num_warps and options
    take their configuration from the GPU's tuning table (``kernels.autotune``). ``group``: see
    :func:`entropy_loss_forward_backward` (a :class:`kernels.vocab_parallel_plans.VocabParallelPlan`; collective).
    """
    vocab_parallel.check_call(group, variant, tp_design)
    if group is not None:
        return vocab_parallel.prepare(logits, target, group=group, loss=loss, target_format=target_format,
                                      tp_design=tp_design, block_size=block_size, num_warps=num_warps,
                                      grad_output=grad_output, ignore_index=ignore_index, loss_mask=loss_mask,
                                      validate=validate, **variant_options)
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {', '.join(map(repr, VARIANTS))}, got {variant!r}")
    if not isinstance(validate, bool):
        raise TypeError(f"validate must be a bool, got {type(validate).__name__}")
    problem = build_problem(logits, target, loss=loss, target_format=target_format, grad_output=grad_output,
                            ignore_index=ignore_index, loss_mask=loss_mask)
    if validate:
        problem.check_labels_on_host()
    return plan_problem(problem, variant, block_size, num_warps, variant_options)


_CHECKED_OPTIONS: dict[tuple, str] = {}


def _check_options(logits, target, loss_mask, variant, block_size, num_warps, ignore_index, validate,
                   variant_options) -> str:
    """What the operators' schema needs to hold before the call (their kernels check the rest): tensors where
    tensors go, plain ints and bools; variant options travel as a JSON string (sorted keys). Options seen before
    are looked up, not checked again (host time per call)."""
    for name, value in (("logits", logits), ("target", target)):
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if loss_mask is not None and not isinstance(loss_mask, torch.Tensor):
        raise TypeError(f"loss_mask must be a bool torch.Tensor or None, got {type(loss_mask).__name__}")
    # each value beside its type: equal values of other types (-100.0, True for 1) must be checked, not looked up
    # (a flat tuple, no generator: this runs on every call)
    key = (variant, block_size, num_warps, ignore_index, validate, type(variant), type(block_size), type(num_warps),
           type(ignore_index), type(validate))
    if variant_options:
        key += tuple((name, value, type(value)) for name, value in variant_options.items())
    try:
        return _CHECKED_OPTIONS[key]
    except (KeyError, TypeError):  # TypeError: an unhashable option value, checked below
        pass
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {', '.join(map(repr, VARIANTS))}, got {variant!r}")
    if block_size is not None:
        check_block_size(block_size)
    if num_warps is not None:
        check_num_warps(num_warps)
    if not isinstance(ignore_index, int) or isinstance(ignore_index, bool):
        raise TypeError(f"ignore_index must be an int, got {type(ignore_index).__name__}")
    if not isinstance(validate, bool):
        raise TypeError(f"validate must be a bool, got {type(validate).__name__}")
    try:
        text = json.dumps(variant_options, sort_keys=True) if variant_options else ""
    except TypeError:
        raise TypeError(f"variant options must be JSON values (bool, int, str, None), got {variant_options!r}") from None
    try:
        _CHECKED_OPTIONS[key] = text
    except TypeError:  # an unhashable option value: checked on every call
        pass
    return text


def _grad_output_args(grad_output) -> tuple[float, torch.Tensor | None, bool]:
    if type(grad_output) is float:  # the default, first
        return grad_output, None, True
    if grad_output is None:
        return 0.0, None, False
    if isinstance(grad_output, torch.Tensor):
        return 0.0, grad_output, True
    if isinstance(grad_output, bool) or not isinstance(grad_output, (int, float)):
        raise TypeError(f"grad_output must be a float, a 0-d tensor or None, got {type(grad_output).__name__}")
    return float(grad_output), None, True


def entropy_loss_forward_backward(
    logits: torch.Tensor,
    target: torch.Tensor,
    *,
    loss: str = "cross_entropy",
    target_format: str = "labels",
    variant: str = "auto",
    block_size: int | None = None,
    num_warps: int | None = None,
    grad_output=1.0,
    ignore_index: int = -100,
    loss_mask: torch.Tensor | None = None,
    validate: bool = False,
    group=None,
    tp_design: str = "auto",
    **variant_options,
):
    """Loss (0-d fp32 tensor) and its gradient with respect to ``logits`` (None when grad_output is None).

    loss: "cross_entropy" | "forward_kl" | "reverse_kl"; target_format: "labels" | "logits". The loss is the
    mean over rows that count (label != ignore_index, loss_mask True); when none counts the loss is 0 and the
    gradient zeros. The gradient is d(grad_output * loss)/d logits; grad_output may be a float or a one-element
    tensor (read on the device). An out-of-range label gives a NaN loss and gradient and a device-side assert
    (see ``kernels.row_math.call_scales``); ``validate=True`` raises a ValueError on the host first (one sync).

    ``group`` (a ``torch.distributed`` process group; None: one device holds the whole vocabulary): the vocabulary
    is split over the group's ranks, each passing its contiguous slice ``logits[..., V / tp]`` (and the same slice of
    target logits) with the global labels; every rank gets the same loss and the gradient of its slice (see
    :mod:`kernels.vocab_parallel`; ``tp_design`` "auto" | "all_gather" | "symmetric"; variant must be "auto").
    """
    options = _check_options(logits, target, loss_mask, variant, block_size, num_warps, ignore_index, validate,
                             variant_options)
    value, tensor, compute_grad = _grad_output_args(grad_output)
    vocab_parallel.check_call(group, variant, tp_design)
    result, grad = ops.call_forward_backward(logits, target, loss_mask, tensor, value, call_options((
        compute_grad, loss, target_format, ignore_index, variant, block_size, num_warps, options, validate, tp_design,
        group)))
    return result, (grad if compute_grad else None)


class _EntropyLoss(torch.autograd.Function):
    """Forward computes the loss and, when logits require grad, the gradient for grad_output = 1 in the same
    kernel (on one GPU, or on this rank's slice of the vocabulary when ``call`` has a group); backward hands that
    gradient out once, scaled in place by the incoming gradient, and recomputes it for a second use of the graph
    (:mod:`kernels.autograd`)."""

    @staticmethod
    def forward(ctx, logits, target, loss_mask, call):
        if not ctx.needs_input_grad[0]:  # ``call`` comes with compute_grad=True
            call = CallOptions(False, *call[1:])
        result, grad = ops.call_forward_backward(logits, target, loss_mask, None, 1.0, call)
        keep_for_backward(ctx, grad, logits, target, loss_mask, call)
        return result

    @staticmethod
    def backward(ctx, grad_loss):
        return gradient_for(ctx, grad_loss), None, None, None


def entropy_loss(
    logits: torch.Tensor,
    target: torch.Tensor,
    *,
    loss: str = "cross_entropy",
    target_format: str = "labels",
    variant: str = "auto",
    block_size: int | None = None,
    num_warps: int | None = None,
    ignore_index: int = -100,
    loss_mask: torch.Tensor | None = None,
    validate: bool = False,
    group=None,
    tp_design: str = "auto",
    **variant_options,
) -> torch.Tensor:
    """Differentiable loss (torch.autograd); same options as :func:`entropy_loss_forward_backward` except
    grad_output, which autograd supplies. Differentiates with respect to ``logits`` only: target logits that
    require grad are refused (detach the teacher, or use :mod:`kernels.reference`)."""
    if "grad_output" in variant_options:
        raise TypeError("entropy_loss takes no grad_output: autograd supplies it; use entropy_loss_forward_backward")
    options = _check_options(logits, target, loss_mask, variant, block_size, num_warps, ignore_index, validate,
                             variant_options)
    if isinstance(target, torch.Tensor) and target.requires_grad and torch.is_grad_enabled():
        raise ValueError(
            "target requires grad, but kernels.entropy_loss differentiates only with respect to logits: a learnable "
            "target would silently get no gradient. Detach it (target.detach()) or use kernels.reference.entropy_loss"
        )
    vocab_parallel.check_call(group, variant, tp_design)  # group: the vocabulary split over its ranks
    return _EntropyLoss.apply(logits, target, loss_mask, CallOptions(
        True, loss, target_format, ignore_index, variant, block_size, num_warps, options, validate, tp_design, group))
