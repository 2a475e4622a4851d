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
MAX_ROWS = 1 << 24  # the finish counters are fp32 (exact below 2**24 programs)

# Workspace layout (fp32), shared with row_math's kernels: the finish counters, the loss, the scales, the row losses.
WS_GROUPS = 64  # programs finish in WS_GROUPS interleaved groups, one counter each (spreads the atomics)
WS_DONE = 64  # groups finished
WS_COUNT = 65  # int32: rows that enter the mean + 1, -1 for an out-of-range label, 0 while nobody has counted
WS_LOSS_SCALE = 66  # 1 / n_valid (NaN when a label is out of range): kernels.prologue writes it
WS_GRAD_SCALE = 67  # grad_output / n_valid (NaN likewise)
WS_GEN = 68  # int32: calls finished on this workspace (split_row's lagged exchange alternates halves by its parity)
WS_ROWS = 128  # row losses (already scaled) from here

# Kernel loss codes (see row_math): (loss, target_format) -> LOSS constexpr.
LOSS_CODES = {
    ("cross_entropy", "labels"): 0,
    ("cross_entropy", "logits"): 1,
    ("forward_kl", "logits"): 2,
    ("reverse_kl", "logits"): 3,
}


@dataclass
class Problem:
    """A loss call, flattened to (n_rows, n_cols) and checked. Holds no device value: building it never syncs."""

    loss: str
    target_format: str
    loss_code: int
    logits: torch.Tensor  # (n_rows, n_cols), last dim contiguous, any row stride
    target: torch.Tensor | None  # (n_rows, n_cols) target logits
    labels: torch.Tensor | None  # (n_rows,) integer labels
    mask: torch.Tensor | None  # (n_rows,) uint8 row mask
    ignore_index: int
    grad_output: float | None  # None: forward only (or given as a tensor, below)
    grad_output_tensor: torch.Tensor | None  # a 0-d tensor grad_output, read on the device
    out_shape: tuple[int, ...]

    @property
    def n_rows(self) -> int:
        return self.logits.shape[0]

    @property
    def n_cols(self) -> int:
        return self.logits.shape[1]

    @property
    def compute_grad(self) -> bool:
        return self.grad_output is not None or self.grad_output_tensor is not None

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

    def loss_args(self, workspace: torch.Tensor, loss: torch.Tensor, grad: torch.Tensor | None) -> dict:
        """input_args plus the outputs of a kernel that writes row losses, the loss and the gradient. The row
        losses and the scales (1/n_valid, grad_output/n_valid) live in ``workspace`` (see row_math)."""
        return dict(
            self.input_args(),
            grad_ptr=grad if grad is not None else self.logits,
            ws_ptr=workspace,
            loss_ptr=loss,
            n_rows=self.n_rows,
            ignore_index=self.ignore_index,
        )

    def loss_constexprs(self) -> dict:
        return dict(LOSS=self.loss_code, HAS_MASK=self.mask is not None, COMPUTE_GRAD=self.compute_grad)

    def scale_args(self) -> tuple[dict, dict]:
        """(arguments, constexprs) of a kernel that works out its own scales (``row_math.call_scales``): grad_output as
        a number (a per-call value: templates pass it each call) or on the device."""
        grad_tensor = self.grad_output_tensor
        return (dict(grad_output_ptr=grad_tensor if grad_tensor is not None else self.logits,
                     grad_output=float(self.grad_output) if self.grad_output is not None else 0.0),
                dict(GRAD_OUTPUT_IN_MEMORY=grad_tensor is not None))

    def rows_aligned(self) -> bool:
        """Whether every row of logits, target and gradient starts on a 16-byte boundary (bases, row strides and the
        gradient's rows, ``n_cols`` wide): what 16-byte loads of whole rows need, and part of a search's shape class."""
        tensors = [self.logits] + ([self.target] if self.target is not None else [])
        return (all(t.data_ptr() % 16 == 0 and t.stride(0) * t.element_size() % 16 == 0 for t in tensors)
                and self.n_cols * self.logits.element_size() % 16 == 0)

    def peel_constexprs(self) -> dict:
        """PEEL/VEC for kernels that split rows into a 16-byte body and a scalar head/tail (row_math.row_peel):
        on when Triton cannot prove 16-byte alignment itself (n_cols or a row stride not a multiple of 16) and every
        row of logits, target and gradient starts at the same offset within 16 bytes (equal strides modulo a
        16-byte vector), so one split serves them all; bases must be 16-byte aligned for it to pay."""
        vec = 16 // self.logits.element_size()
        strides = [self.logits.stride(0), self.n_cols] + ([self.target.stride(0)] if self.target is not None else [])
        tensors = [self.logits] + ([self.target] if self.target is not None else [])
        misaligned = any(value % 16 for value in strides)
        congruent = len({value % vec for value in strides}) == 1
        aligned_bases = all(t.data_ptr() % 16 == 0 for t in tensors) and (
            self.target is None or self.target.element_size() == self.logits.element_size())
        return dict(PEEL=bool(misaligned and congruent and aligned_bases and self.n_cols >= vec), VEC=vec)

    def check_labels_on_host(self) -> None:
        """The opt-in validation (``validate=True``): a ValueError for labels outside [0, n_cols) that are not
        ignore_index, before any launch. Costs one device->host sync; the default path checks on the device."""
        if self.labels is None or not self.n_rows:
            return
        labels = self.labels
        bad = ((labels < 0) | (labels >= self.n_cols)) & (labels != self.ignore_index)
        count = int(bad.sum())
        if count:
            examples = labels[bad][:5].tolist()
            raise ValueError(
                f"target (labels) must lie in [0, {self.n_cols}) or equal ignore_index={self.ignore_index}; "
                f"{count} do not, e.g. {examples}"
            )


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


def check_keep_last(value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"keep_last must be True or False, got {value!r}")
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


def as_rows(tensor: torch.Tensor, n_cols: int) -> torch.Tensor:
    """View as (rows, n_cols) with unit column stride, keeping any row stride; copy only when impossible."""
    if tensor.dim() == 2 and tensor.stride(1) == 1:
        return tensor
    if tensor.stride(-1) != 1:
        tensor = tensor.contiguous()
    try:
        return tensor.view(-1, n_cols)
    except RuntimeError:  # batch dims that cannot be collapsed into one stride
        return tensor.reshape(-1, n_cols).contiguous()


def as_flat(tensor: torch.Tensor) -> torch.Tensor:
    """A per-row tensor (labels, mask) as one contiguous dimension (a copy only when it is strided)."""
    flat = tensor.reshape(-1)
    return flat if flat.is_contiguous() else flat.contiguous()


def _grad_output(grad_output, device: torch.device) -> tuple[float | None, torch.Tensor | None]:
    """(value, None) for a number, (None, tensor) for a one-element tensor (read by the kernels: no sync)."""
    if grad_output is None:
        return None, None
    if isinstance(grad_output, torch.Tensor):
        if grad_output.numel() != 1:
            raise ValueError(f"grad_output must be a scalar (0-d tensor or float), got shape {tuple(grad_output.shape)}")
        if grad_output.device != device:
            raise ValueError(f"grad_output is on {grad_output.device} but logits are on {device}")
        if not grad_output.dtype.is_floating_point:
            raise TypeError(f"grad_output must be a floating-point tensor, got {grad_output.dtype}")
        return None, grad_output.reshape(())
    if isinstance(grad_output, bool) or not isinstance(grad_output, (int, float)):
        raise TypeError(f"grad_output must be a float, a 0-d tensor or None, got {type(grad_output).__name__}")
    return float(grad_output), None


def build_problem(
    logits,
    target,
    *,
    loss: str,
    target_format: str,
    grad_output,
    ignore_index: int,
    loss_mask,
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
        labels = as_flat(target)
    else:
        if target.dtype not in LOGITS_DTYPES:
            raise TypeError(f"target (logits) must be bfloat16, float16 or float32, got {target.dtype}")
        if target.shape != logits.shape:
            raise ValueError(
                f"target (logits) must have the shape of logits {tuple(logits.shape)}, got {tuple(target.shape)}"
            )
        target_logits = as_rows(target, n_cols)

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
        mask = as_flat(loss_mask).view(torch.uint8)

    grad_value, grad_tensor = _grad_output(grad_output, logits.device)
    rows = as_rows(logits, n_cols)
    if rows.shape[0] >= MAX_ROWS:
        raise ValueError(f"logits have {rows.shape[0]} rows; at most {MAX_ROWS - 1} are supported in one call "
                         "(the kernels' finish counters are fp32): split the batch")
    # The rows that count, and the labels' range, are checked on the device (row_math.call_scales): no sync here.
    return Problem(
        loss=loss,
        target_format=target_format,
        loss_code=LOSS_CODES[(loss, target_format)],
        logits=rows,
        target=target_logits,
        labels=labels,
        mask=mask,
        ignore_index=ignore_index,
        grad_output=grad_value,
        grad_output_tensor=grad_tensor,
        out_shape=tuple(logits.shape),
    )


def allocate_outputs(problem: Problem, extra_floats: int = 0,
                     fills=()) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The workspace (fp32: header, row losses, then ``extra_floats`` for the variant; see :func:`workspace_size`),
    in the state the loss kernels expect before their first call (:func:`initialize_workspace` with ``fills``),
    the loss (0-d fp32) and the gradient (logits' dtype, contiguous). The kernels leave the workspace in that state
    again when they finish (``row_math.finish_program``), so a plan runs again as is."""
    device = problem.logits.device
    workspace = initialize_workspace(torch.empty(workspace_size(problem.n_rows) + extra_floats, dtype=torch.float32,
                                                 device=device), fills)
    loss = torch.empty((), dtype=torch.float32, device=device)
    grad = None
    if problem.compute_grad:
        grad = torch.empty((problem.n_rows, problem.n_cols), dtype=problem.logits.dtype, device=device)
    return workspace, loss, grad


def initialize_workspace(workspace: torch.Tensor, fills=()) -> torch.Tensor:
    """Put a workspace in the state the loss kernels expect before its first call: zeroed, then each (offset, count,
    int32 bits) range of ``fills`` set to that bit pattern (split_row's EMPTY_BITS). The kernels leave it in that
    state again (a lagged exchange with the other half emptied), so this runs once per workspace."""
    workspace.zero_()
    words = workspace.view(torch.int32)
    for offset, count, bits in fills:
        words[offset:offset + count].fill_(bits)
    return workspace


def workspace_size(n_rows: int) -> int:
    """Floats before a variant's own workspace: the header (WS_ROWS) and the row losses, rounded to 32."""
    return WS_ROWS + -(-n_rows // 32) * 32


def finisher(problem: Problem, loss: torch.Tensor, grad: torch.Tensor | None):
    """(loss, grad) once the launches have run (the last program of the loss kernel wrote the loss)."""
    out_shape = problem.out_shape

    def finish():
        return loss, (grad.view(out_shape) if grad is not None else None)

    return finish
