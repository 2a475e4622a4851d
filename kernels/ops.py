"""The losses as PyTorch operators (namespace ``fused_loss``), so torch.compile and CUDA graphs take them whole.

    torch.ops.fused_loss.forward_backward(logits, target, loss_mask, grad_output_tensor, grad_output,
        compute_grad, loss, target_format, ignore_index, variant, block_size, num_warps, options, validate)
        -> (loss, grad)
    torch.ops.fused_loss.scale_gradient_(grad, scale) -> ()     # grad *= scale, skipped on the device when 1
    torch.ops.fused_loss.vocab_parallel_forward_backward(..., tp_design, group_name, ...) -> (loss, grad)
        # the vocabulary split over a process group's ranks (kernels.vocab_parallel)

``forward_backward`` returns the gradient for the given grad_output (an empty tensor when compute_grad is
false); ``kernels.entropy_loss`` builds autograd on top of the two. They are registered with
``torch.library.Library`` (define + impl per device) rather than ``torch.library.custom_op``, whose Python wrapper
costs a call twice the host time of a ``Library`` operator on the H100 machine (``host_overhead.csv``). A fake
(meta) implementation gives torch.compile the output shapes and runs the argument checks at trace time.
"""

from __future__ import annotations

import functools
import json
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .dispatch import TEMPLATES, TemplateCache, call_key, make_template
from .launch import Launch, can_launch_directly
from . import vocab_parallel
from .autotune import plan_problem
from .problem import build_problem

NAMESPACE = "fused_loss"

_LIBRARY = torch.library.Library(NAMESPACE, "DEF")
_LIBRARY.define(
    "forward_backward(Tensor logits, Tensor target, Tensor? loss_mask, Tensor? grad_output_tensor, float grad_output, "
    "bool compute_grad, str loss, str target_format, int ignore_index, str variant, int? block_size, "
    "int? num_warps, str options, bool validate) -> (Tensor, Tensor)"
)
_LIBRARY.define("scale_gradient_(Tensor(a!) grad, Tensor scale) -> ()")
_LIBRARY.define(
    "vocab_parallel_forward_backward(Tensor logits, Tensor target, Tensor? loss_mask, Tensor? grad_output_tensor, "
    "float grad_output, bool compute_grad, str loss, str target_format, int ignore_index, str tp_design, "
    "str group_name, int? block_size, int? num_warps, str options, bool validate) -> (Tensor, Tensor)"
)


class CallOptions(NamedTuple):
    """A loss call's arguments besides its tensors and the grad_output number, as the public calls pass them on: one
    record from :mod:`kernels.api` to the operators' implementations and the autograd backward, and the options part
    of a call template's key (:func:`kernels.dispatch.call_key`). The operator schemas take them flat (torch.library
    has no record type): ``*call`` at that boundary, :meth:`from_schema` back. Vocab-parallel calls set ``group`` and
    ``tp_design`` (their schema names the group, ``variant`` is always "auto")."""

    compute_grad: bool
    loss: str
    target_format: str
    ignore_index: int
    variant: str
    block_size: int | None
    num_warps: int | None
    options: str  # variant options as sorted JSON ("" for none)
    validate: bool
    tp_design: str = "auto"
    group: object = None  # a torch.distributed ProcessGroup: the vocabulary split over its ranks

    def problem(self, logits, target, loss_mask, grad_output_tensor, grad_output: float):
        """The checked :class:`~kernels.problem.Problem` of this call."""
        grad_value = (grad_output_tensor if grad_output_tensor is not None
                      else (grad_output if self.compute_grad else None))
        return build_problem(logits, target, loss=self.loss, target_format=self.target_format, grad_output=grad_value,
                             ignore_index=self.ignore_index, loss_mask=loss_mask)

    def variant_options(self) -> dict:
        return json.loads(self.options) if self.options else {}


# CallOptions from one tuple of all its fields, with no Python frame (NamedTuple's __new__ is one): for the hot path.
call_options = functools.partial(tuple.__new__, CallOptions)


def _forward_backward(logits, target, loss_mask, grad_output_tensor, grad_output, *call):
    """The operator's implementation: its flat schema arguments back into a :class:`CallOptions`."""
    return run_forward_backward(logits, target, loss_mask, grad_output_tensor, grad_output, CallOptions(*call))


def run_forward_backward(logits, target, loss_mask, grad_output_tensor, grad_output: float, call: CallOptions):
    key = call_key(logits, target, loss_mask, grad_output_tensor, call)
    template = TEMPLATES.get(key)
    if template:  # a repeated call: fill the slots of the stored launches
        if call.validate:  # templates exist on CUDA only; the CPU path checks every call below
            call.problem(logits, target, loss_mask, grad_output_tensor, grad_output).check_labels_on_host()
        result, grad = template.run(logits, target, loss_mask, grad_output_tensor, float(grad_output))
        return result, (grad if grad is not None else logits.new_empty(0))
    # First call of this key (or a key that cannot have a template): check, plan, run, keep the template.
    problem = call.problem(logits, target, loss_mask, grad_output_tensor, grad_output)
    if call.validate or not logits.is_cuda:  # on the CPU (the interpreter) the check costs no device sync
        problem.check_labels_on_host()
    plan = plan_problem(problem, call.variant, call.block_size, call.num_warps, call.variant_options())
    result, grad = plan.run()
    if template is False and not _capturing(logits):
        TEMPLATES.put(key, make_template(problem, plan, (logits, target, loss_mask, grad_output_tensor)))
    return result, (grad if grad is not None else logits.new_empty(0))


def _capturing(tensor: torch.Tensor) -> bool:
    return tensor.is_cuda and torch.cuda.is_current_stream_capturing()


_LIBRARY.impl("forward_backward", _forward_backward, "CUDA")
_LIBRARY.impl("forward_backward", _forward_backward, "CPU")


@torch.library.register_fake(f"{NAMESPACE}::forward_backward")
def _forward_backward_fake(logits, target, loss_mask, grad_output_tensor, grad_output, *call):
    return fake_result(logits, target, loss_mask, grad_output_tensor, grad_output, CallOptions(*call))


def fake_result(logits, target, loss_mask, grad_output_tensor, grad_output, call: CallOptions):
    """A fake (meta) implementation's result, after the same argument checks as a real call (metadata only), so a
    bad call fails when torch.compile traces it."""
    call.problem(logits, target, loss_mask, grad_output_tensor, grad_output)
    grad = logits.new_empty(logits.shape) if call.compute_grad else logits.new_empty(0)
    return logits.new_empty((), dtype=torch.float32), grad


def _vocab_parallel_call(compute_grad, loss, target_format, ignore_index, tp_design, group_name, block_size, num_warps,
                         options, validate, resolve: bool = True) -> CallOptions:
    """The vocab-parallel operator's flat schema arguments as a :class:`CallOptions` (the group resolved by name)."""
    from torch.distributed import distributed_c10d

    group = distributed_c10d._resolve_process_group(group_name) if resolve else None
    return CallOptions(compute_grad, loss, target_format, ignore_index, "auto", block_size, num_warps, options,
                       validate, tp_design, group)


def _vocab_parallel_forward_backward(logits, target, loss_mask, grad_output_tensor, grad_output, *call):
    return vocab_parallel.forward_backward(logits, target, loss_mask, grad_output_tensor, grad_output,
                                           _vocab_parallel_call(*call))


_LIBRARY.impl("vocab_parallel_forward_backward", _vocab_parallel_forward_backward, "CUDA")
_LIBRARY.impl("vocab_parallel_forward_backward", _vocab_parallel_forward_backward, "CPU")


@torch.library.register_fake(f"{NAMESPACE}::vocab_parallel_forward_backward")
def _vocab_parallel_forward_backward_fake(logits, target, loss_mask, grad_output_tensor, grad_output, *call):
    return fake_result(logits, target, loss_mask, grad_output_tensor, grad_output,
                       _vocab_parallel_call(*call, resolve=False))


@triton.jit
def scale_gradient_kernel(grad_ptr, scale_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    """grad *= scale in place, persistent over the tensor; every program returns at once when scale == 1."""
    scale = tl.load(scale_ptr).to(tl.float32)
    if scale != 1.0:
        offsets = tl.arange(0, BLOCK_SIZE)
        for start in range(tl.program_id(0).to(tl.int64) * BLOCK_SIZE, n_elements, tl.num_programs(0) * BLOCK_SIZE):
            in_range = offsets < n_elements - start
            values = tl.load(grad_ptr + start + offsets, mask=in_range)
            tl.store(grad_ptr + start + offsets, (values.to(tl.float32) * scale).to(values.dtype), mask=in_range)


SCALE_BLOCK = 4096
SCALE_PROGRAMS_PER_SM = 4
# (numel, dtypes, device, alignment) -> direct launch; least recently used out (token counts that vary per step)
_SCALE_LAUNCHES = TemplateCache()


def _scale_gradient_(grad: torch.Tensor, scale: torch.Tensor) -> None:
    if grad.numel() == 0:
        return
    if not grad.is_contiguous():
        raise ValueError("scale_gradient_ needs a contiguous gradient (kernels' gradients are)")
    if scale.dim():  # a backward's incoming gradient of a 0-d loss is 0-d already: no view made per call
        scale = scale.reshape(())
    key = (grad.numel(), grad.dtype, grad.device, grad.data_ptr() % 16 == 0, scale.dtype, scale.device,
           scale.data_ptr() % 16 == 0)
    direct = _SCALE_LAUNCHES.get(key, None)
    if direct is not None:
        direct([grad, scale], torch._C._cuda_getCurrentRawStream(grad.device.index))
        return
    sms = torch.cuda.get_device_properties(grad.device).multi_processor_count if grad.is_cuda else 1
    programs = max(1, min(triton.cdiv(grad.numel(), SCALE_BLOCK), SCALE_PROGRAMS_PER_SM * sms))
    launch = Launch("scale_gradient", scale_gradient_kernel, (programs,),
                    dict(grad_ptr=grad, scale_ptr=scale, n_elements=grad.numel()), dict(BLOCK_SIZE=SCALE_BLOCK),
                    num_warps=4)
    launch()
    if can_launch_directly(grad.device):
        _SCALE_LAUNCHES.put(key, launch.direct({id(grad): 0, id(scale): 1}))


_LIBRARY.impl("scale_gradient_", _scale_gradient_, "CUDA")
_LIBRARY.impl("scale_gradient_", _scale_gradient_, "CPU")


@torch.library.register_fake(f"{NAMESPACE}::scale_gradient_")
def _scale_gradient_fake(grad, scale):
    return None


forward_backward = torch.ops.fused_loss.forward_backward.default
scale_gradient_ = torch.ops.fused_loss.scale_gradient_.default
vocab_parallel_forward_backward = torch.ops.fused_loss.vocab_parallel_forward_backward.default


try:  # looked up once: plain_eager runs on every call
    from torch.utils._python_dispatch import _get_current_dispatch_mode
except ImportError:  # this torch does not say: always take the operator
    _get_current_dispatch_mode = None


def _no_python_modes() -> bool:
    if _get_current_dispatch_mode is None:
        return False
    return _get_current_dispatch_mode() is None and not torch._C._is_torch_function_mode_enabled()


def plain_eager(*tensors) -> bool:
    """No torch.compile trace, no dispatch or function mode, no tensor subclass: the operators' implementations may
    be called directly (:func:`call_forward_backward`)."""
    for tensor in tensors:  # a loop, not all(generator): this runs on every call
        if tensor is not None and type(tensor) is not torch.Tensor:
            return False
    return not torch.compiler.is_compiling() and _no_python_modes()


def call_scale_gradient_(grad: torch.Tensor, scale: torch.Tensor) -> None:
    """``scale_gradient_`` as the autograd backward calls it (directly in plain eager mode, like below)."""
    (_scale_gradient_ if plain_eager(grad, scale) else scale_gradient_)(grad, scale)


def call_forward_backward(logits, target, loss_mask, grad_output_tensor, grad_output: float, call: CallOptions):
    """``forward_backward`` (or ``vocab_parallel_forward_backward`` for a call with a group) as the public functions
    call it, with their :class:`CallOptions`. In plain eager mode (no torch.compile trace, no
    dispatch or function mode, no tensor subclass) the operator's implementation is called directly: the
    dispatcher's call of an operator with these 14 arguments costs about as much host time as one kernel launch
    (``host_overhead.csv``); everything else (tracing, FakeTensor, torch.export, profilers' modes) goes through
    the operator."""
    if call.group is not None:
        if plain_eager(logits, target, loss_mask, grad_output_tensor):
            return vocab_parallel.forward_backward(logits, target, loss_mask, grad_output_tensor, grad_output, call)
        return vocab_parallel_forward_backward(
            logits, target, loss_mask, grad_output_tensor, grad_output, call.compute_grad, call.loss,
            call.target_format, call.ignore_index, call.tp_design, call.group.group_name, call.block_size,
            call.num_warps, call.options, call.validate)
    if plain_eager(logits, target, loss_mask, grad_output_tensor):
        return run_forward_backward(logits, target, loss_mask, grad_output_tensor, grad_output, call)
    return forward_backward(logits, target, loss_mask, grad_output_tensor, grad_output, *call[:9])
