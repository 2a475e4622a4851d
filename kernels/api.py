"""Public entry points: pick a variant, check the arguments, run, return (loss, grad)."""

from __future__ import annotations

import torch

from .fused import plan_fused
from .launch import Plan
from .problem import build_problem
from .split_row import plan_split_row
from .two_pass import plan_two_pass

PLANNERS = {"fused": plan_fused, "two_pass": plan_two_pass, "split_row": plan_split_row}
VARIANTS = ("auto", *PLANNERS)


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
    check_labels: bool = True,
    **variant_options,
) -> Plan:
    """Check the arguments and build the launches of one call without running them.

    ``Plan.run()`` returns (loss, grad) and can be called again (benchmarks time it). Variant
    options: two_pass takes stats_/grad_ block_size and num_warps; split_row takes ``split``,
    ``cooperative``, ``schedule`` and ``maxnreg``. ``auto`` and ``split_row`` called without block_size,
    num_warps and options take their configuration from the GPU's tuning table (``kernels.auto``).
    """
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {', '.join(map(repr, VARIANTS))}, got {variant!r}")
    problem = build_problem(
        logits,
        target,
        loss=loss,
        target_format=target_format,
        grad_output=grad_output,
        ignore_index=ignore_index,
        loss_mask=loss_mask,
        check_labels=check_labels,
    )
    if variant in ("auto", "split_row"):
        from .auto import choose_config

        choice = choose_config(problem, variant=variant, block_size=block_size, num_warps=num_warps,
                               **variant_options)
        variant, block_size, num_warps, variant_options = (
            choice.variant, choice.block_size, choice.num_warps, choice.options
        )
    planner = PLANNERS[variant]
    try:
        plan = planner(problem, block_size, num_warps, **variant_options)
    except TypeError as error:
        if "unexpected keyword" in str(error):
            raise TypeError(f"variant {variant!r} does not take option(s) {sorted(variant_options)}") from None
        raise
    if problem.n_rows == 0:  # empty batch: nothing to launch
        plan.launches = []
        plan.reset = None
    return plan


def entropy_loss_forward_backward(logits, target, **options):
    """Loss (0-d fp32 tensor) and its gradient with respect to ``logits`` (None when grad_output is None).

    loss: "cross_entropy" | "forward_kl" | "reverse_kl"; target_format: "labels" | "logits".
    The loss is the mean over rows that count (label != ignore_index, loss_mask True); when none
    counts the loss is 0 and the gradient zeros. The gradient is d(grad_output * loss)/d logits.
    """
    return prepare(logits, target, **options).run()


class _EntropyLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, loss_mask, options):
        loss, grad = entropy_loss_forward_backward(
            logits, target, loss_mask=loss_mask, grad_output=1.0 if logits.requires_grad else None, **options
        )
        ctx.save_for_backward(grad if grad is not None else logits.new_empty(0))
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        (grad,) = ctx.saved_tensors
        # The gradient was computed in the forward with grad_output=1: scale it now.
        return grad * grad_loss.to(grad.dtype), None, None, None


def entropy_loss(logits, target, *, loss_mask=None, **options):
    """Differentiable loss (torch.autograd); same options as :func:`entropy_loss_forward_backward`."""
    if "grad_output" in options:
        raise TypeError("entropy_loss takes no grad_output: autograd supplies it; use entropy_loss_forward_backward")
    return _EntropyLoss.apply(logits, target, loss_mask, options)
