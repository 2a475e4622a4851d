"""The host side of a call, made cheap: everything that depends only on shapes, strides, dtypes, device and options
is worked out once per such key, and a repeated call does a lookup, two allocations and its launch (one for every
variant but two_pass: the loss kernels count the rows of the mean themselves, ``row_math.call_scales``).

The first call of a key checks the arguments, chooses the variant and configuration, sizes split_row's persistent
grid (occupancy of the compiled kernel) and builds its :class:`~kernels.launch.Plan` through the planners. That
plan becomes a :class:`CallTemplate`: its launches in their direct form (:meth:`kernels.launch.Launch.direct`: the
compiled kernel and its positional arguments), with the per-call tensors (logits, target, labels, mask, grad_output,
gradient, workspace) left as slots, and the workspace kept per stream. Later calls fill the slots and launch the
compiled kernels directly. Where the direct form cannot run (another Triton, the interpreter, launch hooks installed
by a profiler: :func:`kernels.launch.can_launch_directly`) or for a plan with a per-run reset, calls go through
``JITFunction`` launches as before: slower, same results.

Where the first call found that the kernels read the caller's logits, target, mask and grad_output as they are
(no copy for an unusual layout), later calls pass their data pointers (integers) and make no views of them.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from .launch import DirectLaunch, Plan, can_launch_directly
from .problem import Problem, as_flat, as_rows, initialize_workspace

# The per-call values a template takes, in the order CallTemplate.run passes them; tensors by identity, and the
# grad_output number by parameter name.
ROLES = ("logits", "target", "labels", "mask", "grad_output", "grad", "workspace", "loss", "grad_output_value")
GRAD_OUTPUT_VALUE = ROLES.index("grad_output_value")


@dataclass
class CallTemplate:
    """A plan with its per-call tensors taken out: what a repeated call runs.

    The gradient and the loss are new tensors every call. The workspace (row count, counters, row losses, exchange
    buffers: nothing a caller sees) is kept per CUDA stream and reused, since calls on one stream run in order and
    the kernels leave it as the next call expects it (``row_math.finish_program``); a new one is initialized once
    (``workspace_fills``). Under CUDA-graph capture a call takes a fresh one from the graph's pool, initialized in
    the graph (its replays re-initialize it); so does a call whose allocations go to torch.compile's CUDA-graph pool
    (:func:`in_graph_pool`). A lock keeps one call's launches together when threads share a stream.
    ``passthrough``: the first call's kernels read the caller's logits, target, mask and grad_output tensors
    themselves (no copy), so later calls with the same key pass their data pointers without making views
    (:func:`call_tensors` otherwise)."""

    launches: list[DirectLaunch]
    workspace_shape: tuple[int, ...]
    has_grad: bool
    grad_dtype: torch.dtype
    out_shape: tuple[int, ...]
    device: torch.device
    target_format: str
    passthrough: bool
    workspace_fills: tuple = ()
    workspaces: dict = field(default_factory=dict)  # raw stream handle -> workspace
    lock: threading.Lock = field(default_factory=threading.Lock)
    loss_like: torch.Tensor = field(init=False, repr=False)  # empty tensors of the loss's and the gradient's dtype
    grad_like: torch.Tensor = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.loss_like = torch.empty(0, dtype=torch.float32, device=self.device)
        self.grad_like = torch.empty(0, dtype=self.grad_dtype, device=self.device)

    def run(self, logits: torch.Tensor, target: torch.Tensor, loss_mask, grad_output_tensor, grad_output_value: float
            ) -> tuple[torch.Tensor, torch.Tensor | None]:
        # The kernels' tensors: the caller's own, or copies (held in this frame until the launches are queued: freed
        # earlier, the loss or the gradient allocated below could take their memory).
        tensors = ((logits, target, target, loss_mask, grad_output_tensor) if self.passthrough
                   else call_tensors(logits, target, self.target_format, loss_mask, grad_output_tensor))
        pointers = [t.data_ptr() if t is not None else None for t in tensors]
        stream = torch._C._cuda_getCurrentRawStream(self.device.index)
        # new_empty of a kept tensor: the dtype and device come with it, fewer arguments to parse than torch.empty
        loss = self.loss_like.new_empty(())
        # allocated in the caller's shape: the kernels write it as contiguous (rows, n_cols), the same layout
        grad = self.grad_like.new_empty(self.out_shape) if self.has_grad else None
        with self.lock:
            workspace = None if torch._C._cuda_isCurrentStreamCapturing() else self.workspaces.get(stream)
            if workspace is None:
                workspace = self.new_workspace()
                if not in_graph_pool(self.device.index, stream):
                    self.workspaces[stream] = workspace
            pointers += [grad.data_ptr() if grad is not None else None, workspace.data_ptr(), loss.data_ptr(),
                         grad_output_value]
            for launch in self.launches:
                launch(pointers, stream)
        return loss, grad

    def new_workspace(self) -> torch.Tensor:
        return initialize_workspace(torch.empty(self.workspace_shape, dtype=torch.float32, device=self.device),
                                    self.workspace_fills)


def in_graph_pool(device_index: int, stream: int) -> bool:
    """Whether allocations on this raw stream go to a CUDA graph's memory pool: under capture, or on the stream of
    torch.compile's CUDA graphs (mode="reduce-overhead"), which warm a compiled function up (and run it eagerly when
    they must) there. A tensor kept past the call in that pool is memory the graphs reuse: inductor stops with
    "tensor(s) in the cudagraph pool not tracked as outputs" (a first call under reduce-overhead did). Such calls
    take a fresh workspace, like a capture."""
    if torch._C._cuda_isCurrentStreamCapturing():
        return True
    trees = sys.modules.get("torch._inductor.cudagraph_trees")  # loaded once reduce-overhead has compiled something
    if trees is None:
        return False
    # torch's internals (2.x): the device's tree manager, None before its first graph, and the stream it runs on
    manager = trees.get_manager(device_index, create_if_none_exists=False)
    return getattr(getattr(manager, "stream", None), "cuda_stream", None) == stream


def make_template(problem: Problem, plan: Plan, given: tuple | None = None) -> CallTemplate | None:
    """The template of a plan that has run once (its launches hold their compiled kernels), or None when calls of
    this key must keep going through JITFunction launches (see the module docstring). ``given``: the caller's
    (logits, target, loss_mask, grad_output_tensor), to find whether the kernels read them without a copy."""
    if not can_launch_directly(problem.logits.device) or plan.reset is not None or not plan.all_launches:
        return None
    workspace, grad, loss = plan.buffers[:3]
    by_identity = {}
    for role, tensor in zip(ROLES, (problem.logits, problem.target, problem.labels, problem.mask,
                                    problem.grad_output_tensor, grad, workspace, loss)):
        if tensor is not None:
            by_identity.setdefault(id(tensor), ROLES.index(role))
    launches = []
    for launch in plan.all_launches:
        direct = launch.direct(by_identity, {"grad_output": GRAD_OUTPUT_VALUE})
        if direct is None:
            return None
        launches.append(direct)
    return CallTemplate(
        launches=launches,
        workspace_shape=tuple(workspace.shape),
        has_grad=grad is not None,
        grad_dtype=problem.logits.dtype,
        out_shape=problem.out_shape,
        device=problem.logits.device,
        target_format=problem.target_format,
        passthrough=given is not None and reads_given_tensors(problem, *given),
        workspace_fills=plan.workspace_fills,
    )


def reads_given_tensors(problem: Problem, logits, target, loss_mask, grad_output_tensor) -> bool:
    """Whether the problem's tensors start where the caller's do (views, not copies made for the kernels)."""
    pairs = [(problem.logits, logits),
             (problem.labels if problem.target_format == "labels" else problem.target, target),
             (problem.mask, loss_mask), (problem.grad_output_tensor, grad_output_tensor)]
    return all((mine is None) == (theirs is None) and (mine is None or mine.data_ptr() == theirs.data_ptr())
               for mine, theirs in pairs)


class TemplateCache:
    """Call templates (or other per-key values: launches, the vocab-parallel call's checked hosts) by key, least
    recently used first out; a key that cannot have one maps to None (its calls plan every time). Bounded: a workload
    whose shapes change every call (token counts that vary per step) keeps at most ``max_entries`` templates and
    their workspaces."""

    def __init__(self, max_entries: int = 256) -> None:
        self._entries: OrderedDict[tuple, CallTemplate | None] = OrderedDict()
        self._lock = threading.Lock()
        self.max_entries = max_entries

    def get(self, key: tuple, default=False):
        entry = self._entries.get(key, default)
        if entry is not default and len(self._entries) > self.max_entries // 2:
            with self._lock:
                if key in self._entries:
                    self._entries.move_to_end(key)
        return entry

    def put(self, key: tuple, template: CallTemplate | None) -> None:
        with self._lock:
            self._entries[key] = template
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


TEMPLATES = TemplateCache()


def call_tensors(logits: torch.Tensor, target: torch.Tensor, target_format: str, loss_mask, grad_output_tensor
                 ) -> tuple:
    """A repeated call's tensors as a template takes them: (rows, target rows, labels, mask, grad_output): the same
    views (or copies, for layouts the kernels cannot take) as the first call's checks made (the key guarantees the
    same shapes and strides)."""
    n_cols = logits.shape[-1]
    rows = as_rows(logits, n_cols)
    if target_format == "labels":
        labels, target_rows = as_flat(target), None
    else:
        labels, target_rows = None, as_rows(target, n_cols)
    mask = as_flat(loss_mask).view(torch.uint8) if loss_mask is not None else None
    grad_tensor = grad_output_tensor.reshape(()) if grad_output_tensor is not None else None
    return rows, target_rows, labels, mask, grad_tensor


def call_key(logits: torch.Tensor, target: torch.Tensor, loss_mask, grad_output_tensor, options: tuple) -> tuple:
    """What a template depends on: tensors' metadata, 16-byte alignment (Triton specializes on it) and options."""
    key = (logits.shape, logits.stride(), logits.dtype, logits.device, logits.data_ptr() % 16 == 0,
           target.shape, target.stride(), target.dtype, target.device, target.data_ptr() % 16 == 0, options)
    if loss_mask is not None:  # the dtype too: the template reads a bool mask's bytes, and checks it only once
        key += (loss_mask.shape, loss_mask.stride(), loss_mask.dtype, loss_mask.device, loss_mask.data_ptr() % 16 == 0)
    if grad_output_tensor is not None:
        key += (grad_output_tensor.shape, grad_output_tensor.dtype, grad_output_tensor.device,
                grad_output_tensor.data_ptr() % 16 == 0)
    return key
