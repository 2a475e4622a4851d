"""One Triton compile for sm_90 on a machine without a GPU, and the resources read out of its cubin.

:func:`compile_in_this_process` builds Triton's ``ASTSource`` for a :class:`~perfutils.model.specialization.
Specialization`, compiles it to PTX and a cubin for the target (default H100, sm_90a), and returns an
:class:`OfflineCompile`: registers per thread, stack frame, spill store/load bytes, shared memory, plus the PTX
and SASS. How the numbers are read: ``cuobjdump -res-usage`` (the copy bundled in Triton's wheel, else PATH or
/usr/local/cuda/bin) gives REG/STACK/SHARED/LOCAL; without it the cubin's ``.nv.info`` ELF section is parsed
directly. Spill store/load bytes come from ptxas's ``-v`` log: captured from Triton's own ptxas run, or by
re-running the same ptxas on the PTX when the kernel came from Triton's on-disk cache. SASS comes from
``nvdisasm -c`` (else ``cuobjdump -sass``).

This runs in the compile worker (:mod:`perfutils.model.compile_worker`), a process where the interpreter never
ran; call :func:`perfutils.model.offline_compile.compile_offline` instead of this module.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import os
import struct
import subprocess
import tempfile
from dataclasses import dataclass, field
from typing import Any

from kernels.launch import debug_compile_options

from ..data.metadata import find_cuda_tool, tool_version
from .compiled_kernel import metadata_get
from .cubin import parse_cubin_resources, parse_ptxas_log, parse_res_usage
from .cuda_tools import disassemble, ptxas_path, rerun_ptxas, run_tool
from .specialization import Specialization, is_jit_function

__all__ = ["OfflineCompile", "compile_in_this_process", "normalize_target"]


@dataclass
class OfflineCompile:
    """What ptxas produced for one kernel specialization, compiled without a GPU.

    ``stack_bytes`` is the per-thread stack frame (spilled registers live there); it is what the driver
    reports as ``LOCAL_SIZE_BYTES`` and what ``counts_from_compiled(...)["spill_bytes"]`` measures on a GPU.
    ``spill_store_bytes`` / ``spill_load_bytes`` are ptxas's *static* byte counts of spill instructions
    (code size, not traffic: a spill in a loop runs many times).
    """

    n_regs: int
    stack_bytes: int
    spill_store_bytes: int | None
    spill_load_bytes: int | None
    shared_bytes: int
    num_warps: int
    ptx: str
    sass: str | None
    triton_version: str
    ptxas_version: str | None
    target: tuple[str, int, int]
    name: str = ""
    num_stages: int = 1
    signature: dict[str, str] = field(default_factory=dict)
    local_bytes: int = 0  # explicit .local arrays (not spills); usually 0 for Triton kernels
    tool: str = ""  # how n_regs/stack were read: "cuobjdump", "elf" or "ptxas"
    ptxas_log: str | None = field(default=None, repr=False)
    cubin: bytes = field(default=b"", repr=False)  # the ELF ptxas produced, to save or inspect further

    @property
    def spill_bytes(self) -> int:
        """Per-thread local memory in bytes, comparable with ``counts_from_compiled(...)["spill_bytes"]``."""
        return self.stack_bytes + self.local_bytes

    @property
    def spills(self) -> bool:
        return self.spill_bytes > 0 or bool(self.spill_store_bytes) or bool(self.spill_load_bytes)

    def counts(self) -> dict[str, int]:
        """The same keys as :func:`counts_from_compiled`, for one code path over offline and GPU numbers."""
        return {
            "n_regs": self.n_regs,
            "spill_bytes": self.spill_bytes,
            "shared_bytes": self.shared_bytes,
            "num_warps": self.num_warps,
        }


@contextlib.contextmanager
def _compiler_mode(capture_ptxas_log: bool):
    """Make sure the interpreter is off (the compiler checks it) and ask Triton to print the ptxas log."""
    try:
        from triton import knobs
    except ImportError:
        knobs = None
    if knobs is None:
        previous = os.environ.get("TRITON_INTERPRET")
        os.environ["TRITON_INTERPRET"] = "0"
        try:
            yield
        finally:
            if previous is None:
                os.environ.pop("TRITON_INTERPRET", None)
            else:
                os.environ["TRITON_INTERPRET"] = previous
        return
    with knobs.runtime.scope(), knobs.nvidia.scope():
        knobs.runtime.interpret = False
        if capture_ptxas_log and "dump_ptxas_log" in vars(type(knobs.nvidia)):
            knobs.nvidia.dump_ptxas_log = True  # Triton then prints ptxas -v output, which we capture
        yield


def _triton_version() -> str:
    import triton

    return getattr(triton, "__version__", "unknown")


def _make_ast_source(jit_fn: Any, spec: Specialization, target: Any) -> Any:
    """``ASTSource`` for the specialization; written for Triton 3.6, with fallbacks for 3.2-3.9 layouts."""
    from triton.compiler import ASTSource

    names = list(jit_fn.arg_names)
    init_params = inspect.signature(ASTSource.__init__).parameters
    if "constexprs" in init_params:
        # Triton >= 3.3: signature has "constexpr" entries; constants and attrs keyed by (arg index,) paths.
        try:
            from triton.compiler.compiler import make_backend

            divisibility = make_backend(target).parse_attr("D")
        except Exception:
            divisibility = [["tt.divisibility", 16]]
        constexprs = {(names.index(k),): v for k, v in spec.constexprs.items()}
        attrs = {(names.index(k),): divisibility for k in spec.divisible_by_16}
        return ASTSource(jit_fn, signature=dict(spec.signature), constexprs=constexprs, attrs=attrs)
    if "constants" in init_params:
        # Triton 3.2: an AttrsDescriptor built from {arg index: 16 (divisible) or 1 (equal to one)} hints.
        try:
            try:
                from triton.backends.compiler import AttrsDescriptor
            except ImportError:
                from triton.compiler.compiler import AttrsDescriptor
            hints = {names.index(k): 16 for k in spec.divisible_by_16}
            hints.update({names.index(k): 1 for k, v in spec.constexprs.items()
                          if v == 1 and not _param(jit_fn, k).is_constexpr})
            attrs = AttrsDescriptor.from_hints(hints)
            constants = {(names.index(k),): v for k, v in spec.constexprs.items()}
            return ASTSource(jit_fn, signature=dict(spec.signature), constants=constants, attrs=attrs)
        except Exception as exc:
            raise RuntimeError(f"compile_offline does not know how to build an ASTSource on Triton "
                               f"{_triton_version()} (written for 3.6): {exc}") from exc
    raise RuntimeError(f"compile_offline does not know ASTSource{inspect.signature(ASTSource.__init__)} of Triton "
                       f"{_triton_version()} (written for 3.6)")


def _param(jit_fn: Any, name: str) -> Any:
    return next(p for p in jit_fn.params if p.name == name)


def normalize_target(target: Any) -> Any:
    from triton.backends.compiler import GPUTarget

    if isinstance(target, GPUTarget):
        backend, arch, warp_size = target.backend, target.arch, target.warp_size
    elif isinstance(target, (tuple, list)) and len(target) == 3:
        backend, arch, warp_size = target
    else:
        raise TypeError(f"target must be a GPUTarget or a (backend, arch, warp_size) tuple, got {target!r}")
    if backend != "cuda":
        raise ValueError(f"target backend must be 'cuda' (register reading uses NVIDIA tools), got {backend!r}")
    if not isinstance(arch, int) or isinstance(arch, bool) or arch < 50:
        raise ValueError(f"target arch must be an int compute capability like 90, got {arch!r}")
    if warp_size != 32:
        raise ValueError(f"target warp_size must be 32 for CUDA, got {warp_size!r}")
    return GPUTarget(backend, arch, warp_size)


def compile_in_this_process(jit_fn: Any, spec: Specialization, *, num_warps: int, num_stages: int, target: Any,
                            with_sass: bool, maxnreg: int | None, debug: bool = False) -> OfflineCompile:
    """The compile itself, for the worker process (where the interpreter never ran)."""
    if not is_jit_function(jit_fn):
        raise RuntimeError(f"{getattr(jit_fn, '__name__', jit_fn)!r} is a {type(jit_fn).__name__}, not a Triton "
                           "JITFunction, in the compile worker (its module may force TRITON_INTERPRET=1 on a Triton "
                           "without knobs)")
    return _compile_uncached(jit_fn, spec, num_warps, num_stages, normalize_target(target), with_sass, maxnreg,
                             debug)


def _compile_uncached(jit_fn: Any, spec: Specialization, num_warps: int, num_stages: int, target: Any,
                      with_sass: bool, maxnreg: int | None = None, debug: bool = False) -> OfflineCompile:
    import triton

    options: dict[str, Any] = {"num_warps": num_warps, "num_stages": num_stages}
    if maxnreg is not None:
        options["maxnreg"] = maxnreg
    if debug or getattr(jit_fn, "debug", None):
        options["debug"] = True  # a real launch passes the decorator's debug flag too
        options.update(debug_compile_options(jit_fn))  # and kernels.launch's options for such kernels
    log = io.StringIO()
    with _compiler_mode(capture_ptxas_log=True):
        src = _make_ast_source(jit_fn, spec, target)
        try:
            with contextlib.redirect_stdout(log):
                kernel = triton.compile(src, target=target, options=options)
        except Exception as exc:
            raise RuntimeError(f"offline compile of {jit_fn.fn.__qualname__} for sm_{target.arch} failed on "
                               f"Triton {_triton_version()}: {exc}") from exc
    metadata = kernel.metadata
    name = metadata_get(metadata, "name", jit_fn.fn.__name__)
    cubin = kernel.asm["cubin"]
    ptx = kernel.asm.get("ptx", "") if hasattr(kernel.asm, "get") else kernel.asm["ptx"]
    fp_fusion = bool(metadata_get(metadata, "enable_fp_fusion", True))

    ptxas_log = log.getvalue() or None
    ptxas_numbers = parse_ptxas_log(ptxas_log, name) if ptxas_log else None
    if ptxas_numbers is None:  # came from Triton's disk cache: ptxas did not run in this process
        ptxas_log = rerun_ptxas(ptx, target.arch, fp_fusion, metadata_get(metadata, "ptx_options", None))
        ptxas_numbers = parse_ptxas_log(ptxas_log, name) if ptxas_log else None

    tool, res, sass = "", None, None
    with tempfile.TemporaryDirectory(prefix="perfutils_cubin_") as tmp:
        cubin_path = os.path.join(tmp, f"{name}.cubin")
        with open(cubin_path, "wb") as handle:
            handle.write(cubin)
        cuobjdump = find_cuda_tool("cuobjdump")
        if cuobjdump:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                done = run_tool([cuobjdump, "-res-usage", cubin_path])
                if done.returncode == 0:
                    res = parse_res_usage(done.stdout, name)
                    tool = "cuobjdump" if res else ""
        if with_sass:
            sass = disassemble(cubin_path)
    if res is None:
        with contextlib.suppress(ValueError, struct.error, IndexError):
            res = {**parse_cubin_resources(cubin, name), "shared": 0, "local": 0}
            tool = "elf"
    if res is None and ptxas_numbers is not None:
        res = {"n_regs": ptxas_numbers["n_regs"], "stack": ptxas_numbers["stack"], "shared": 0, "local": 0}
        tool = "ptxas"
    if res is None:
        raise RuntimeError(f"could not read registers of {name}: no cuobjdump, unreadable .nv.info and no ptxas log")

    ptxas = ptxas_path(target.arch)
    return OfflineCompile(
        n_regs=res["n_regs"],
        stack_bytes=res["stack"],
        spill_store_bytes=ptxas_numbers["spill_stores"] if ptxas_numbers else None,
        spill_load_bytes=ptxas_numbers["spill_loads"] if ptxas_numbers else None,
        # Triton's shared memory is dynamic (metadata.shared, passed at launch) plus any static .shared.
        shared_bytes=int(metadata_get(metadata, "shared", 0) or 0) + res["shared"],
        num_warps=int(metadata_get(metadata, "num_warps", 0) or 0),  # warp specialization may change it
        ptx=ptx,
        sass=sass,
        triton_version=_triton_version(),
        ptxas_version=tool_version(ptxas) if ptxas else None,
        target=(target.backend, target.arch, target.warp_size),
        name=name,
        num_stages=num_stages,
        signature=dict(spec.signature),
        local_bytes=res["local"],
        tool=tool,
        ptxas_log=ptxas_log,
        cubin=bytes(cubin),
    )
