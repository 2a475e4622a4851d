"""Float64 PyTorch references of the losses (the ground truth of tests and benchmark checks).

Semantics shared with the kernels: the loss is the mean over the rows that count (label !=
ignore_index and loss_mask True), 0 when none counts; a zero-probability entry contributes 0
(0·log 0 := 0), so -inf logits are masked vocabulary entries; a row of all -inf gives NaN.
"""

from __future__ import annotations

import torch


def _where_positive(weight: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """weight * value where weight > 0, else 0 — with no NaN leaking through autograd from 0·inf."""
    positive = weight > 0
    return torch.where(positive, weight * torch.where(positive, value, torch.zeros_like(value)), 0.0)


def row_losses(logits, target, *, loss="cross_entropy", target_format="labels", ignore_index=-100):
    """Per-row losses in float64 (ignored rows give 0), shape logits.shape[:-1]."""
    x = logits.double()
    log_q = torch.log_softmax(x, dim=-1)
    if target_format == "labels":
        keep = target != ignore_index
        safe = torch.where(keep, target, torch.zeros_like(target)).long()
        picked = log_q.gather(-1, safe.unsqueeze(-1)).squeeze(-1)
        return torch.where(keep, -picked, 0.0)
    t = target.double()
    log_p = torch.log_softmax(t, dim=-1)
    p, q = log_p.exp(), log_q.exp()
    if loss == "cross_entropy":
        return -_where_positive(p, log_q).sum(-1)
    if loss == "forward_kl":
        return _where_positive(p, log_p - log_q).sum(-1)
    if loss == "reverse_kl":
        return _where_positive(q, log_q - log_p).sum(-1)
    raise ValueError(f"unknown loss {loss!r}")


def entropy_loss(logits, target, *, loss="cross_entropy", target_format="labels", ignore_index=-100, loss_mask=None):
    """Mean loss over the rows that count, float64, differentiable with respect to ``logits``."""
    per_row = row_losses(logits, target, loss=loss, target_format=target_format, ignore_index=ignore_index)
    keep = torch.ones_like(per_row, dtype=torch.bool)
    if target_format == "labels":
        keep &= target != ignore_index
    if loss_mask is not None:
        keep &= loss_mask
    per_row = torch.where(keep, per_row, 0.0)
    return per_row.sum() / keep.sum().clamp(min=1)


def entropy_loss_in_blocks(logits, target, *, loss="cross_entropy", target_format="labels", ignore_index=-100,
                           rows_per_block: int = 256) -> float:
    """:func:`entropy_loss` (no loss_mask) of 2-D inputs, a block of rows at a time: the same mean without a float64
    copy of the whole tensor (16384 x 152064 logits would take 20 GB), for checking large measured shapes."""
    total, counted = 0.0, 0
    for start in range(0, logits.shape[0], rows_per_block):
        rows = slice(start, start + rows_per_block)
        per_row = row_losses(logits[rows], target[rows], loss=loss, target_format=target_format,
                             ignore_index=ignore_index)  # ignored label rows give 0
        total += float(per_row.sum())
        counted += int((target[rows] != ignore_index).sum()) if target_format == "labels" else per_row.numel()
    return total / max(counted, 1)


def entropy_loss_forward_backward(logits, target, *, grad_output=1.0, **options):
    """(loss, grad) in float64 through autograd; grad is None when grad_output is None."""
    x = logits.detach().double().requires_grad_(grad_output is not None)
    loss = entropy_loss(x, target, **options)
    if grad_output is None:
        return loss.detach(), None
    (grad,) = torch.autograd.grad(loss * float(grad_output), x)
    return loss.detach(), grad
