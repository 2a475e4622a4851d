"""A kernel launch described as data (:class:`Launch`), so tools can inspect it before or after it runs, and its
direct form (:meth:`Launch.direct`) that repeated calls launch.

Every variant's host wrapper builds a list of launches and then runs them. The same objects let the lab compile a
launch offline for sm_90 (``perfutils.model.offline_compile``: registers, spills) and read the `CompiledKernel` that
a real GPU launch returned (``launch.compiled``). A :class:`DirectLaunch` calls that compiled kernel with the launch's
positional arguments, per-call ones as slots: a third of the host time of a ``JITFunction`` launch, which re-binds and
re-specializes every argument (``host_overhead.csv``); on Triton 3.6 it calls the launcher's C function itself
(:func:`_c_launch`), skipping a Python frame. It needs Triton's compiled-kernel launcher (``run(grid0, grid1, grid2,
stream, function, packed_metadata, launch_metadata, enter_hook, exit_hook, *args)``, Triton 3.3 to 3.9), no
interpreter and no launch hooks (profilers): :func:`can_launch_directly`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable

import torch


def interpreting() -> bool:
    """Whether Triton kernels run under the interpreter (``TRITON_INTERPRET=1``: one program at a time, on CPU
    tensors, no libdevice) rather than compiled."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _has_sanitize_overflow() -> bool:
    """Whether this Triton has the ``sanitize_overflow`` compile option (an unknown option is an error at launch)."""
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except ImportError:
        return False
    return "sanitize_overflow" in getattr(CUDAOptions, "__dataclass_fields__", {})


_HAS_SANITIZE_OVERFLOW = _has_sanitize_overflow()


def debug_compile_options(fn: Any) -> dict[str, Any]:
    """Compile options of a kernel jitted with debug=True (to keep a ``device_assert``): no integer-overflow checks,
    which Triton adds to every int32 add, sub and mul in debug mode and the loss kernels must not pay."""
    return {"sanitize_overflow": False} if getattr(fn, "debug", None) and _HAS_SANITIZE_OVERFLOW else {}


def check_on_gpu(args: dict[str, Any]) -> None:
    """A compiled launch needs CUDA tensors: say so (Triton alone says "0 active drivers") and what to do."""
    for name, value in args.items():
        if isinstance(value, torch.Tensor) and value.device.type == "cpu":
            raise RuntimeError(
                f"the tensors are on the CPU (the kernel argument {name!r} is), but the loss kernels are compiled "
                "for a CUDA GPU: move the logits and target to a CUDA device (logits.cuda()), or set TRITON_INTERPRET=1 in the environment "
                "before importing kernels to run them on the CPU under Triton's interpreter (a slow reference path, "
                "for tests and small shapes)")


@dataclass
class Launch:
    """One `fn[grid](**args, **constexprs, num_warps=..., num_stages=..., [maxnreg=...])` call."""

    name: str  # e.g. "fused", "two_pass.stats", "two_pass.grad", "split_row.coop"
    fn: Any  # the @triton.jit function
    grid: tuple[int, ...]
    args: dict[str, Any]  # run-time arguments, by parameter name (tensors, ints, floats)
    constexprs: dict[str, Any]  # tl.constexpr arguments, by parameter name
    num_warps: int
    num_stages: int = 1
    maxnreg: int | None = None  # ptxas register cap per thread (None: the compiler's choice)
    compiled: Any = field(default=None, repr=False)  # CompiledKernel of the last GPU run (None under the interpreter)

    @property
    def options(self) -> dict[str, Any]:
        """Compile options of this launch (``maxnreg`` only when set: a launch without it compiles as before; see
        :func:`debug_compile_options` for kernels jitted with debug=True)."""
        options = {"num_warps": self.num_warps, "num_stages": self.num_stages, **debug_compile_options(self.fn)}
        if self.maxnreg is not None:
            options["maxnreg"] = self.maxnreg
        return options

    def __call__(self) -> Any:
        if self.compiled is None and not interpreting():  # a first launch: a clear error for CPU tensors
            check_on_gpu(self.args)
        result = self.fn[self.grid](**self.args, **self.constexprs, **self.options)
        if result is not None and hasattr(result, "metadata"):
            self.compiled = result
        return result

    @property
    def block_size(self) -> int | None:
        return self.constexprs.get("BLOCK_SIZE")

    def direct(self, by_identity: dict[int, int], scalar_slots: dict[str, int] | None = None) -> DirectLaunch | None:
        """This launch, once it has run (``compiled`` set), in its direct form: tensors found in ``by_identity`` (id ->
        index into the call's values) and the parameters named in ``scalar_slots`` become per-call slots. None when the
        compiled kernel lacks the launcher the direct form uses, or a tensor argument has no slot."""
        compiled = self.compiled
        if compiled is None or not all(hasattr(compiled, name) for name in ("run", "function", "packed_metadata")):
            return None
        scalar_slots = scalar_slots or {}
        given = {**self.args, **self.constexprs}
        values, slots = [], []
        for position, name in enumerate(self.fn.arg_names):
            value = given.get(name)
            if name in scalar_slots:
                slots.append((position, scalar_slots[name]))
                value = None
            elif isinstance(value, torch.Tensor):
                role = by_identity.get(id(value))
                if role is None:  # a tensor the caller does not know how to renew per call
                    return None
                slots.append((position, role))
                value = None
            values.append(value)
        grid = tuple(self.grid) + (1,) * (3 - len(self.grid))
        return DirectLaunch(compiled, grid, values, slots)


def _triton_version() -> tuple[int, int] | None:
    import triton

    major, minor, *_ = triton.__version__.split(".") + ["", ""]
    return (int(major), int(minor)) if major.isdigit() and minor.isdigit() else None


_TRITON_VERSION = _triton_version()


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
class DirectLaunch:
    """A launch's compiled kernel with its arguments in order, per-call ones as slots (:meth:`Launch.direct`)."""

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


def can_launch_directly(device: torch.device) -> bool:
    """Whether launches on ``device`` can take their direct form (see the module docstring)."""
    return (device.type == "cuda" and _TRITON_VERSION is not None and (3, 3) <= _TRITON_VERSION < (3, 10)
            and not _launch_hooks_installed())


@dataclass
class Plan:
    """All launches of one loss call plus the host-side step that turns their outputs into (loss, grad)."""

    variant: str
    launches: list[Launch]
    finish: Callable[[], tuple[Any, Any]]  # returns (loss, grad) once the launches have run
    config: dict[str, Any] = field(default_factory=dict)  # resolved block sizes, warps, chunk counts, grid
    reset: Callable[[], None] | None = None  # re-arms per-call state (e.g. split_row's row counters) before a run

    buffers: list = field(default_factory=list, repr=False)  # tensors allocated when the plan was built
    prologue: Launch | None = None  # runs before ``launches`` (kernels.prologue): only kernels that read their scales
    workspace_fills: tuple = ()  # the workspace's start besides zeros (kernels.problem.initialize_workspace)

    @property
    def buffer_bytes(self) -> int:
        """Bytes the plan allocated when it was built (gradient, row losses, workspaces).

        ``run()`` reuses them, so memory measured around ``run()`` alone misses them: add these.
        """
        return sum(t.untyped_storage().nbytes() for t in self.buffers if t is not None)

    @property
    def all_launches(self) -> list[Launch]:
        """Every launch of a run, in order: the prologue, then the loss kernels (``launches``)."""
        return ([self.prologue] if self.prologue is not None else []) + self.launches

    def run(self) -> tuple[Any, Any]:
        if self.reset is not None:
            self.reset()
        for launch in self.all_launches:
            launch()
        return self.finish()
