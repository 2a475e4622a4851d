"""A kernel launch described as data, so tools can inspect it before or after it runs.

Every variant's host wrapper builds a list of :class:`Launch` objects and then runs them. The same
objects let `perfutils` compile a launch offline for sm_90 (registers, spills) and read the
`CompiledKernel` that a real GPU launch returned (``launch.compiled``).
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
