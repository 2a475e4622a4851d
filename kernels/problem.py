"""Argument checking: turn a user's call into a validated, flattened :class:`Problem` before any launch.

Every check raises ``ValueError`` or ``TypeError`` naming the argument and what was expected.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

LOSSES = ("cross_entropy", "forward_kl", "reverse_kl")
TARGET_FORMATS = ("labels", "logits")
LOGITS_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
NUM_WARPS_CHOICES = (1, 2, 4, 8, 16, 32)
MIN_BLOCK_SIZE = 16
MAX_BLOCK_SIZE = 65536  # one program's tile; larger tiles cannot be held by 1024 threads

# Kernel loss codes (see row_math): (loss, target_format) -> LOSS constexpr.
LOSS_CODES = {
    ("cross_entropy", "labels"): 0,
    ("cross_entropy", "logits"): 1,
    ("forward_kl", "logits"): 2,
    ("reverse_kl", "logits"): 3,
}


@dataclass
class Problem:
    """A loss call, flattened to (n_rows, n_cols) and checked."""

    loss: str
    target_format: str
    loss_code: int
    logits: torch.Tensor  # (n_rows, n_cols), last dim contiguous, any row stride
    target: torch.Tensor | None  # (n_rows, n_cols) target logits
    labels: torch.Tensor | None  # (n_rows,) integer labels
    mask: torch.Tensor | None  # (n_rows,) uint8 row mask
    ignore_index: int
    n_valid: int  # rows that count in the mean
    grad_output: float | None  # None: forward only
    out_shape: tuple[int, ...]

    @property
    def n_rows(self) -> int:
        return self.logits.shape[0]

    @property
    def n_cols(self) -> int:
        return self.logits.shape[1]

    @property
    def compute_grad(self) -> bool:
        return self.grad_output is not None

    @property
    def loss_scale(self) -> float:
        return 1.0 / max(self.n_valid, 1)

    @property
    def grad_scale(self) -> float:
        return (self.grad_output or 0.0) / max(self.n_valid, 1)

    def input_args(self) -> dict:
        """The input arguments every kernel takes; tensors a loss does not read point at the logits."""
        return dict(
            logits_ptr=self.logits,
            target_ptr=self.target if self.target is not None else self.logits,
            labels_ptr=self.labels if self.labels is not None else self.logits,
            mask_ptr=self.mask if self.mask is not None else self.logits,
            n_cols=self.n_cols,
            logits_stride=self.logits.stride(0),
            target_stride=self.target.stride(0) if self.target is not None else 0,
        )

    def loss_args(self, loss_rows: torch.Tensor, grad: torch.Tensor | None) -> dict:
        """input_args plus the outputs and scales of a kernel that writes row losses and the gradient."""
        return dict(
            self.input_args(),
            grad_ptr=grad if grad is not None else self.logits,
            loss_rows_ptr=loss_rows,
            ignore_index=self.ignore_index,
            grad_scale=self.grad_scale,
            loss_scale=self.loss_scale,
        )

    def loss_constexprs(self) -> dict:
        return dict(LOSS=self.loss_code, HAS_MASK=self.mask is not None, COMPUTE_GRAD=self.compute_grad)


def next_power_of_2(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(n, 1))))


def check_block_size(value, name: str = "block_size", maximum: int = MAX_BLOCK_SIZE) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int power of two, got {type(value).__name__} {value!r}")
    if value < MIN_BLOCK_SIZE or value > maximum or value & (value - 1):
        raise ValueError(f"{name} must be a power of two in [{MIN_BLOCK_SIZE}, {maximum}], got {value}")
    return value


def check_num_warps(value, name: str = "num_warps") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value not in NUM_WARPS_CHOICES:
        raise ValueError(f"{name} must be one of {NUM_WARPS_CHOICES}, got {value!r}")
    return value


def check_maxnreg(value) -> int | None:
    """A per-thread register cap for ptxas (None: no cap); sm_90 threads have at most 255 registers."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 16 <= value <= 255):
        raise ValueError(f"maxnreg must be None or an int in [16, 255] (registers per thread), got {value!r}")
    return value


def _check_choice(value, name: str, choices) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")
    return value


def _as_rows(tensor: torch.Tensor, n_cols: int) -> torch.Tensor:
    """View as (rows, n_cols) with unit column stride, keeping any row stride; copy only when impossible."""
    if tensor.stride(-1) != 1:
        tensor = tensor.contiguous()
    try:
        return tensor.view(-1, n_cols)
    except RuntimeError:  # batch dims that cannot be collapsed into one stride
        return tensor.reshape(-1, n_cols).contiguous()


def _grad_output_value(grad_output) -> float | None:
    if grad_output is None:
        return None
    if isinstance(grad_output, torch.Tensor):
        if grad_output.numel() != 1:
            raise ValueError(f"grad_output must be a scalar (0-d tensor or float), got shape {tuple(grad_output.shape)}")
        return float(grad_output.item())
    if isinstance(grad_output, bool) or not isinstance(grad_output, (int, float)):
        raise TypeError(f"grad_output must be a float, a 0-d tensor or None, got {type(grad_output).__name__}")
    return float(grad_output)


def build_problem(
    logits,
    target,
    *,
    loss: str,
    target_format: str,
    grad_output,
    ignore_index: int,
    loss_mask,
    check_labels: bool = True,
) -> Problem:
    _check_choice(loss, "loss", LOSSES)
    _check_choice(target_format, "target_format", TARGET_FORMATS)
    if (loss, target_format) not in LOSS_CODES:
        raise ValueError(
            f"loss={loss!r} needs target_format='logits' (a KL divergence compares two distributions); "
            f"got target_format={target_format!r}"
        )
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"logits must be a torch.Tensor, got {type(logits).__name__}")
    if logits.dtype not in LOGITS_DTYPES:
        raise TypeError(f"logits must be bfloat16, float16 or float32, got {logits.dtype}")
    if logits.dim() < 1:
        raise ValueError("logits must have a vocabulary dimension (shape (*batch, vocab)), got a 0-d tensor")
    n_cols = logits.shape[-1]
    if n_cols < 1:
        raise ValueError(f"logits must have a non-empty vocabulary dimension, got shape {tuple(logits.shape)}")
    batch_shape = tuple(logits.shape[:-1])
    if not isinstance(ignore_index, int) or isinstance(ignore_index, bool):
        raise TypeError(f"ignore_index must be an int, got {type(ignore_index).__name__}")

    if not isinstance(target, torch.Tensor):
        raise TypeError(f"target must be a torch.Tensor, got {type(target).__name__}")
    if target.device != logits.device:
        raise ValueError(f"target is on {target.device} but logits are on {logits.device}; put them on one device")

    labels = target_logits = None
    if target_format == "labels":
        if target.dtype.is_floating_point or target.dtype.is_complex or target.dtype == torch.bool:
            raise TypeError(f"target (labels) must be an integer tensor, got {target.dtype}")
        if tuple(target.shape) != batch_shape:
            raise ValueError(
                f"target (labels) must have shape {batch_shape} (logits' shape without the vocab dim), "
                f"got {tuple(target.shape)}"
            )
        labels = target.reshape(-1)
    else:
        if target.dtype not in LOGITS_DTYPES:
            raise TypeError(f"target (logits) must be bfloat16, float16 or float32, got {target.dtype}")
        if target.shape != logits.shape:
            raise ValueError(
                f"target (logits) must have the shape of logits {tuple(logits.shape)}, got {tuple(target.shape)}"
            )
        target_logits = _as_rows(target, n_cols)

    mask = None
    if loss_mask is not None:
        if not isinstance(loss_mask, torch.Tensor):
            raise TypeError(f"loss_mask must be a bool torch.Tensor or None, got {type(loss_mask).__name__}")
        if loss_mask.dtype != torch.bool:
            raise TypeError(f"loss_mask must have dtype torch.bool, got {loss_mask.dtype}")
        if tuple(loss_mask.shape) != batch_shape:
            raise ValueError(f"loss_mask must have shape {batch_shape} (one flag per row), got {tuple(loss_mask.shape)}")
        if loss_mask.device != logits.device:
            raise ValueError(f"loss_mask is on {loss_mask.device} but logits are on {logits.device}")
        mask = loss_mask.reshape(-1).contiguous().view(torch.uint8)

    grad_value = _grad_output_value(grad_output)
    rows = _as_rows(logits, n_cols)
    n_rows = rows.shape[0]

    # Count the rows that enter the mean (and check label range) with one device->host sync.
    n_valid = n_rows
    if n_rows and (labels is not None or mask is not None):
        keep = torch.ones(n_rows, dtype=torch.bool, device=rows.device)
        checks = []
        if labels is not None:
            labels = labels.contiguous()
            keep &= labels != ignore_index
            if check_labels:
                checks.append((((labels < 0) | (labels >= n_cols)) & keep).sum())
        if mask is not None:
            keep &= mask.bool()
        counts = torch.stack([keep.sum(), *checks]).tolist()
        n_valid = int(counts[0])
        if len(counts) > 1 and counts[1]:
            bad = labels[((labels < 0) | (labels >= n_cols)) & (labels != ignore_index)][:5].tolist()
            raise ValueError(
                f"target (labels) must lie in [0, {n_cols}) or equal ignore_index={ignore_index}; "
                f"{counts[1]} do not, e.g. {bad}"
            )

    return Problem(
        loss=loss,
        target_format=target_format,
        loss_code=LOSS_CODES[(loss, target_format)],
        logits=rows,
        target=target_logits,
        labels=labels,
        mask=mask,
        ignore_index=ignore_index,
        n_valid=n_valid,
        grad_output=grad_value,
        out_shape=tuple(logits.shape),
    )


def allocate_outputs(problem: Problem) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-row losses (fp32, already divided by n_valid) and the gradient (logits' dtype, contiguous)."""
    device = problem.logits.device
    loss_rows = torch.empty(problem.n_rows, dtype=torch.float32, device=device)
    grad = None
    if problem.compute_grad:
        grad = torch.empty((problem.n_rows, problem.n_cols), dtype=problem.logits.dtype, device=device)
    return loss_rows, grad


def finisher(problem: Problem, loss_rows: torch.Tensor, grad: torch.Tensor | None):
    """The host step after the launches: sum the scaled row losses, give the gradient the logits' shape."""

    def finish():
        loss = loss_rows.sum()
        return loss, (grad.view(problem.out_shape) if grad is not None else None)

    return finish
