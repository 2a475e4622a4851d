"""The backward that kernels.entropy_loss (one GPU and vocab-parallel) share: a gradient computed with the forward,
handed out once, recomputed for a second use of the graph.

The loss kernels compute the gradient for grad_output = 1 in the forward pass (no second read of the logits), so
the first backward only scales it by the incoming gradient, in place (a launch that does nothing when that is 1),
and returns it. From then on that tensor is the caller's (autograd may have made it ``x.grad``, a hook may hold
it): the function drops its reference and never touches it again. A second backward through the same graph
(``retain_graph=True``, ``autograd.grad`` before ``backward``) recomputes the gradient from the inputs with the
incoming gradient read on the device: the same gradient PyTorch's own loss gives, in a tensor of its own.

The inputs are kept as PyTorch keeps a graph's saved tensors: until a backward that does not retain the graph (a
second backward then raises PyTorch's error), and an in-place change of the logits or target between the forward
and a second backward raises PyTorch's version-counter error. They are kept on the function's context rather than
with ``save_for_backward``, which cost the autograd step tens of microseconds of host time on the H100 machine
(``scripts/explore_autograd_host.py``); whether the graph is retained is asked of the engine, and where this
PyTorch cannot say, the inputs stay until the graph is freed.
"""

from __future__ import annotations

import torch

from . import ops

_keep_graph = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", None)  # private: may be absent


def keep_for_backward(ctx, grad: torch.Tensor, logits: torch.Tensor, target: torch.Tensor,
                      loss_mask: torch.Tensor | None, call) -> None:
    """In a forward: the gradient to hand out once, and the inputs and ``call`` (the forward's
    :class:`kernels.ops.CallOptions`) a second backward recomputes it from."""
    ctx.grad = grad
    ctx.call = call
    ctx.inputs = (logits, target, loss_mask)
    if not torch.compiler.is_compiling():  # a traced graph's inputs are not changed behind its back
        ctx.versions = (logits._version, target._version)


def gradient_for(ctx, grad_loss: torch.Tensor) -> torch.Tensor:
    """In a backward: d(grad_loss * loss)/d logits. A second use of the graph calls the forward's operator again
    (``ops.call_forward_backward`` with the forward's options, the incoming gradient as grad_output) for a fresh
    gradient."""
    traced = torch.compiler.is_compiling()
    if torch.is_grad_enabled() and not traced:  # backward(create_graph=True)
        raise RuntimeError(f"{_public_name(ctx)} has no second derivative (its backward is a precomputed "
                           "gradient): double backward / create_graph=True through it is not supported; use "
                           "kernels.reference.entropy_loss for higher-order gradients")
    grad = ctx.grad
    inputs = ctx.inputs
    if not traced and _keep_graph is not None and not _keep_graph():
        ctx.inputs = None  # this backward frees the graph: nothing may use it again
    if grad is not None:  # the first backward: the gradient becomes the caller's
        ctx.grad = None
        ops.call_scale_gradient_(grad, grad_loss)
        return grad
    if inputs is None:
        raise RuntimeError(f"Trying to backward through the graph a second time (through {_public_name(ctx)}), but its "
                           "inputs have already been freed. Specify retain_graph=True if you need to backward through "
                           "the graph a second time or if you need to access saved tensors after calling backward.")
    logits, target, loss_mask = inputs
    versions = getattr(ctx, "versions", None)
    if versions is not None and versions != (logits._version, target._version):
        raise RuntimeError(f"one of the variables needed for gradient computation has been modified by an inplace "
                           f"operation: the logits or target of {_public_name(ctx)} changed between its forward and "
                           f"this second backward (versions {versions} then {(logits._version, target._version)})")
    call = ctx.call._replace(compute_grad=True)
    return ops.call_forward_backward(logits, target, loss_mask, grad_loss.reshape(()), 0.0, call)[1]


def _public_name(ctx) -> str:
    """The public call a backward belongs to, for its error messages."""
    return "kernels.entropy_loss" if ctx.call.group is None else "kernels.entropy_loss(group=...)"
