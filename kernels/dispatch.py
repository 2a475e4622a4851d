"""The host side of a call, made cheap: everything that depends only on shapes, strides, dtypes, device and options
is worked out once per such key, and a repeated call does a lookup, two allocations and its launch (one for every
variant but two_pass: the loss kernels count the rows of the mean themselves, ``row_math.call_scales``).

The first call of a key checks the arguments, chooses the variant and configuration, sizes split_row's persistent
grid (occupancy of the compiled kernel) and builds its :class:`~kernels.launch.Plan` through the planners. That
plan becomes a :class:`CallTemplate`: per launch, the compiled kernel and its positional arguments, with the
per-call tensors (logits, target, labels, mask, grad_output, gradient, workspace) left as slots. Later calls fill
the slots and launch the compiled kernels directly (``CompiledKernel.run``, a third of the host time of a
``JITFunction.run`` launch, which re-binds and re-specializes every argument: ``host_overhead.csv``); on Triton 3.6
they call the launcher's C function itself (:func:`_c_launch`), which skips a Python frame per launch.

The direct launch needs Triton's compiled-kernel launcher (``run(grid0, grid1, grid2, stream, function,
packed_metadata, launch_metadata, enter_hook, exit_hook, *args)``, Triton 3.3 to 3.9); on any other Triton, under
the interpreter, with launch hooks installed (profilers) or for a plan with a per-run reset, calls go through
``JITFunction`` launches as before: slower, same results.

Where the first call found that the kernels read the caller's logits, target, mask and grad_output as they are
(no copy for an unusual layout), later calls pass their data pointers (integers) and make no views of them.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from .launch import Plan
from .problem import Problem, as_flat, as_rows, initialize_workspace

# The per-call values a template takes, in the order CallTemplate.run passes them; tensors by identity, and the
# grad_output number by parameter name.
ROLES = ("logits", "target", "labels", "mask", "grad_output", "grad", "workspace", "loss", "grad_output_value")
GRAD_OUTPUT_VALUE = ROLES.index("grad_output_value")


def _triton_version() -> tuple[int, int] | None:
    import triton

    try:
        major, minor = (int(part) for part in triton.__version__.split(".")[:2])
    except ValueError:
        return None
    return major, minor


_TRITON_VERSION = _triton_version()


def _triton_supports_direct_launch() -> bool:
    return _TRITON_VERSION is not None and (3, 3) <= _TRITON_VERSION < (3, 10)


def _launch_hooks_installed() -> bool:
    """Whether a profiler (e.g. proton) hooks Triton launches: then calls keep Triton's own launch path."""
    try:
        from triton import knobs
    except ImportError:
        return True

    def active(hook) -> bool:  # Triton 3.6 keeps an always-present chain of hooks, empty by default
        return hook is not None and bool(getattr(hook, "calls", True))

    return active(knobs.runtime.launch_enter_hook) or active(knobs.runtime.launch_exit_hook)


def _c_launch(launcher) -> Callable | None:
    """The C function behind Triton 3.6's ``CudaLauncher`` when calling it directly is the same launch: the Python
    ``__call__`` only allocates scratch buffers (none for these kernels) and passes two flags from the compiled
    metadata. None on any other Triton (its launcher's arguments are not checked here) or when scratch is needed."""
    if _TRITON_VERSION != (3, 6):
        return None
    try:
        from triton.backends.nvidia.driver import CudaLauncher
    except ImportError:
        return None
    if type(launcher) is not CudaLauncher:
        return None
    needed = ("launch", "global_scratch_size", "profile_scratch_size", "launch_cooperative_grid", "launch_pdl")
    if not all(hasattr(launcher, name) for name in needed):
        return None
    if launcher.global_scratch_size or launcher.profile_scratch_size:
        return None
    return launcher.launch


@dataclass
class _TemplateLaunch:
    compiled: Any  # triton CompiledKernel
    grid: tuple[int, int, int]
    values: list  # every parameter's value in order (constexprs included), per-call tensors as None
    slots: list[tuple[int, int]]  # (position in values, index into the call's tensors)
    launcher: Callable = field(init=False, repr=False)  # called as launcher(*grid, stream, *middle, *values)
    middle: tuple = field(init=False, repr=False)

    def __post_init__(self) -> None:
        compiled = self.compiled
        run = compiled.run
        launch = _c_launch(run)
        if launch is not None:  # CudaLauncher.__call__'s own call of it, with no scratch buffers
            self.launcher = launch
            self.middle = (compiled.function, run.launch_cooperative_grid, run.launch_pdl, None, None,
                           compiled.packed_metadata, None, None, None)
        else:
            self.launcher = run
            self.middle = (compiled.function, compiled.packed_metadata, None, None, None)

    def __call__(self, tensors: list, stream: int) -> None:
        """Launch with the call's values: tensors or their data pointers (integers), by slot."""
        values = self.values.copy()
        for position, role in self.slots:
            values[position] = tensors[role]
        grid = self.grid
        self.launcher(grid[0], grid[1], grid[2], stream, *self.middle, *values)


@dataclass
class CallTemplate:
    """A plan with its per-call tensors taken out: what a repeated call runs.

    The gradient and the loss are new tensors every call. The workspace (row count, counters, row losses, exchange
    buffers: nothing a caller sees) is kept per CUDA stream and reused, since calls on one stream run in order and
    the kernels leave it as the next call expects it (``row_math.finish_program``); a new one is initialized once
    (``workspace_fills``). Under CUDA-graph capture a call takes a fresh one from the graph's pool, initialized in
    the graph (its replays re-initialize it). A lock
    keeps one call's launches together when threads share a stream. ``passthrough``: the first call's kernels read
    the caller's logits, target, mask and grad_output tensors themselves (no copy), so later calls with the same
    key pass their data pointers without making views (:func:`call_tensors` otherwise)."""

    launches: list[_TemplateLaunch]
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
            if torch._C._cuda_isCurrentStreamCapturing():
                workspace = self.new_workspace()
            else:
                workspace = self.workspaces.get(stream)
                if workspace is None:
                    workspace = self.workspaces[stream] = self.new_workspace()
            pointers += [grad.data_ptr() if grad is not None else None, workspace.data_ptr(), loss.data_ptr(),
                         grad_output_value]
            for launch in self.launches:
                launch(pointers, stream)
        return loss, grad

    def new_workspace(self) -> torch.Tensor:
        return initialize_workspace(torch.empty(self.workspace_shape, dtype=torch.float32, device=self.device),
                                    self.workspace_fills)


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
        template_launch = direct_launch(launch, by_identity, {"grad_output": GRAD_OUTPUT_VALUE})
        if template_launch is None:
            return None
        launches.append(template_launch)
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


def direct_launch(launch, by_identity: dict[int, int], scalar_slots: dict[str, int] | None = None
                  ) -> _TemplateLaunch | None:
    """A launch that has run once (``launch.compiled`` set) as a direct launch: tensors found in ``by_identity``
    (id -> index into the call's values) and the parameters named in ``scalar_slots`` become per-call slots.
    None when the compiled kernel lacks the launcher this module uses, or a tensor argument has no slot."""
    compiled = launch.compiled
    if compiled is None or not all(hasattr(compiled, name) for name in ("run", "function", "packed_metadata")):
        return None
    scalar_slots = scalar_slots or {}
    given = {**launch.args, **launch.constexprs}
    values, slots = [], []
    for position, name in enumerate(launch.fn.arg_names):
        value = given.get(name)
        if name in scalar_slots:
            slots.append((position, scalar_slots[name]))
            value = None
        elif isinstance(value, torch.Tensor):
            role = by_identity.get(id(value))
            if role is None:  # a tensor the template does not know how to renew per call
                return None
            slots.append((position, role))
            value = None
        values.append(value)
    grid = tuple(launch.grid) + (1,) * (3 - len(launch.grid))
    return _TemplateLaunch(compiled, grid, values, slots)


def can_launch_directly(device: torch.device) -> bool:
    return device.type == "cuda" and _triton_supports_direct_launch() and not _launch_hooks_installed()


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
