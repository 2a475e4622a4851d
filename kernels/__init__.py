"""Fused Triton loss kernels: cross-entropy (labels or target logits), forward KL and reverse KL.

    loss, grad = kernels.entropy_loss_forward_backward(logits, target, loss=..., target_format=..., variant=...)
    loss = kernels.entropy_loss(logits, target, ...)           # torch.autograd
    plan = kernels.prepare(logits, target, ...)                # kernel-only: plan.run() -> (loss, grad)
    kernels.reference.entropy_loss(logits, target, ...)        # float64 reference

With ``group=`` (a torch.distributed process group) the vocabulary is split over the group's ranks, each passing
its slice of the logits (:mod:`kernels.vocab_parallel`: designs "all_gather" and "symmetric").

The first two call the PyTorch operators ``torch.ops.fused_loss.*`` (:mod:`kernels.ops`): no host sync, traceable
by torch.compile, capturable in CUDA graphs. Variants: "fused" (one program per row, #497 design), "two_pass"
(stats then gradient, Option B), "split_row" (each row read once, split over co-resident programs) and "auto"
(from the tuning table).
"""

from . import reference
from .api import VARIANTS, entropy_loss, entropy_loss_forward_backward, prepare
from .launch import Launch, Plan
from .problem import LOSSES, TARGET_FORMATS

__all__ = [
    "LOSSES",
    "TARGET_FORMATS",
    "VARIANTS",
    "Launch",
    "Plan",
    "entropy_loss",
    "entropy_loss_forward_backward",
    "prepare",
    "reference",
]
