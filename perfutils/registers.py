"""Registers, spills and shared memory of Triton kernels: compiled offline for sm_90, read from a GPU run, estimated.

Three ways to get a kernel's register story, from most to least exact:

1. :func:`compile_offline` / :func:`compile_launch` compile a kernel for H100 (sm_90a) on a machine with no GPU,
   with the same argument specialization a real launch would make, and read the numbers out of the cubin
   (registers per thread, stack frame, spill stores/loads, shared memory) plus the PTX and SASS to teach from.
2. :func:`counts_from_compiled` reads the numbers Triton attached to the ``CompiledKernel`` of a real GPU launch.
3. :func:`estimate_registers` / :func:`predict_spill` give the back-of-envelope number for row-reduction
   kernels ("2 live fp32 tiles of BLOCK_SIZE / (32 * num_warps) values each, plus ~28 for addresses").

Triton 3.6 facts this module relies on (read from its source, ``triton/runtime/jit.py``,
``triton/backends/compiler.py``, ``triton/backends/nvidia/driver.c``):

* Pointers are typed ``*<dtype>`` (``*bf16``, ``*fp32``, ``*i64``, ``*u1`` for ``torch.bool``) and get the
  ``tt.divisibility = 16`` attribute when ``data_ptr() % 16 == 0``.
* Python ints are ``i32`` when they fit in [-2**31, 2**31), ``u64`` from 2**63 upwards, ``i64`` otherwise;
  multiples of 16 get ``tt.divisibility = 16``; an int equal to 1 becomes a compile-time constant (signature
  ``"constexpr"``), so ``stride == 1`` compiles a different kernel from ``stride == 7``. ``do_not_specialize``
  turns both off; ``do_not_specialize_on_alignment`` turns off the divisibility only.
* Python floats are ``fp32`` (never specialized), bools ``u1``, ``None`` a constexpr.
* ``CompiledKernel.n_spills`` is ``cuFuncGetAttribute(CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES) / 4`` (C integer
  division): the per-thread local-memory size (the stack frame) in 4-byte words, *not* bytes and *not* the
  number of spill instructions. ``counts_from_compiled`` multiplies it back by 4.

How the numbers are read: ``cuobjdump -res-usage`` (the copy bundled in Triton's wheel,
``triton/backends/nvidia/bin``, else PATH or /usr/local/cuda/bin) gives REG/STACK/SHARED/LOCAL; without it the
cubin's ``.nv.info`` ELF section is parsed directly (:func:`parse_cubin_resources`). Spill store/load bytes come
from ptxas's ``-v`` log: captured from Triton's own ptxas run, or by re-running the same ptxas on the PTX when
the kernel came from Triton's on-disk cache. SASS comes from ``nvdisasm -c`` (else ``cuobjdump -sass``).

Where the compile runs: in a separate process (:mod:`perfutils.compile_worker`) that imports the kernel's module
with the interpreter off. Running kernels under ``TRITON_INTERPRET=1`` patches ``triton.language``, and Triton
3.6 leaves part of it patched after a device-function call, which broke later in-process compiles (only when the
kernel was not already in Triton's on-disk cache). The worker never ran the interpreter, so a compile sees plain
``JITFunction`` objects and the PTX and cubin are those of a GPU machine's compile. Compiles are serialized.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import io
import math
import os
import re
import shutil
import struct
import subprocess
import tempfile
import threading
import types
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "OfflineCompile",
    "Specialization",
    "SpillPrediction",
    "EffectiveRegisters",
    "compile_offline",
    "compile_launch",
    "specialize",
    "local_memory_excerpt",
    "counts_from_compiled",
    "register_cap",
    "values_per_thread",
    "estimate_registers",
    "predict_spill",
    "effective_registers",
    "clear_cache",
    "find_cuda_tool",
    "parse_cubin_resources",
]

# Hardware constants of sm_90 (H100) that bound registers per thread.
REGISTERS_PER_SM = 65536  # 64 Ki 32-bit registers per SM (and the most one block may use)
MAX_REGISTERS_PER_THREAD = 255  # the ISA encodes R0..R254 (R255 is RZ, the zero register)
REGISTER_ALLOCATION_UNIT = 8  # per-thread counts are allocated in steps of 8 (256 registers per warp)
WARP_SIZE = 32

DEFAULT_TARGET = ("cuda", 90, 32)
DEFAULT_OVERHEAD = 28  # pointers, offsets, masks, loop counters, reduction scratch: 24-32 in practice


# ---------------------------------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------------------------------


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


@dataclass(frozen=True)
class Specialization:
    """The compile-time view of one call: ``signature`` (name -> Triton type or ``"constexpr"``),
    ``constexprs`` (name -> value, including ints specialized to 1) and the names given
    ``tt.divisibility = 16``."""

    signature: dict[str, str]
    constexprs: dict[str, Any]
    divisible_by_16: tuple[str, ...]

    def key(self) -> tuple:
        """Hashable form for caches."""
        return (
            tuple(self.signature.items()),
            tuple((name, type(value).__name__, repr(value)) for name, value in self.constexprs.items()),
            self.divisible_by_16,
        )


# ---------------------------------------------------------------------------------------------------------------
# Finding NVIDIA tools (Triton ships ptxas, cuobjdump and nvdisasm in its wheel)
# ---------------------------------------------------------------------------------------------------------------


def _triton_bin_dir() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    return path if os.path.isdir(path) else None


def find_cuda_tool(name: str) -> str | None:
    """Path of ``ptxas``/``cuobjdump``/``nvdisasm``: Triton's choice, its bundled copy, PATH, /usr/local/cuda."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty str, got {name!r}")
    candidates: list[str] = []
    # Triton's own resolution first, so we use the very ptxas that produced the cubin (TRITON_PTXAS_PATH etc.).
    try:
        from triton import knobs

        tool = getattr(knobs.nvidia, name.replace("-", "_"))
        candidates.append(tool.path)
    except Exception:  # older Triton without knobs, or no such knob
        pass
    bundled = _triton_bin_dir()
    if bundled:
        candidates.append(os.path.join(bundled, name))
    on_path = shutil.which(name)
    if on_path:
        candidates.append(on_path)
    candidates.append(os.path.join("/usr/local/cuda/bin", name))
    for path in candidates:
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


@functools.lru_cache(maxsize=None)
def _tool_version(path: str) -> str | None:
    try:
        text = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"V(\d+\.\d+\.\d+)", text)
    if match:
        return match.group(1)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else None


def pin_bundled_ptxas() -> str | None:
    """Make every compile of this process use Triton's bundled ptxas, unless TRITON_PTXAS_PATH is set.

    torch.compile (Inductor) sets TRITON_PTXAS_PATH to torch's own ptxas the first time it compiles,
    when the variable is unset; kernels compiled before and after it in one process then come from
    different ptxas versions. Seen on the H100 (torch 2.11: ptxas 13.0 vs Triton 3.6's 12.8): the
    split_row reverse-KL kernel, 4096-column chunks, 4 warps, took 123 registers instead of 151.
    Measurements pin one ptxas and record it (``ptxas_in_use``).
    """
    if os.environ.get("TRITON_PTXAS_PATH"):
        return os.environ["TRITON_PTXAS_PATH"]
    bundled = _triton_bin_dir()
    path = os.path.join(bundled, "ptxas") if bundled else None
    if path and os.path.isfile(path) and os.access(path, os.X_OK):
        os.environ["TRITON_PTXAS_PATH"] = path
        return path
    return None


def ptxas_in_use() -> dict:
    """The ptxas Triton compiles with now (path and version), for measurement metadata."""
    path = find_cuda_tool("ptxas")
    return {"ptxas_path": path, "ptxas_version": _tool_version(path) if path else None}


def _ptxas_path(arch: int) -> str | None:
    # Triton picks a separate ptxas for Blackwell; mirror that choice when the helper exists.
    try:
        from triton.backends.nvidia.compiler import get_ptxas

        path = get_ptxas(arch).path
        if path and os.path.isfile(path):
            return path
    except Exception:
        pass
    return find_cuda_tool("ptxas")


def _sm_arch(arch: int) -> str:
    try:
        from triton.backends.nvidia.compiler import sm_arch_from_capability

        return sm_arch_from_capability(arch)
    except Exception:
        return f"sm_{arch}{'a' if arch >= 90 else ''}"


# ---------------------------------------------------------------------------------------------------------------
# The kernel behind a JITFunction (or an InterpretedFunction under TRITON_INTERPRET=1)
# ---------------------------------------------------------------------------------------------------------------


def _is_interpreted(obj: Any) -> bool:
    # Duck-typed so that importing the interpreter (numpy-heavy) is never needed just to check.
    return type(obj).__name__ == "InterpretedFunction" and callable(getattr(obj, "fn", None))


def _is_jit_function(obj: Any) -> bool:
    try:
        from triton.runtime.jit import JITFunction
    except ImportError:
        return False
    return isinstance(obj, JITFunction)


def _raw_python_function(fn: Any) -> types.FunctionType:
    """The undecorated Python function behind a JITFunction or InterpretedFunction."""
    if _is_jit_function(fn) or _is_interpreted(fn):
        raw = fn.fn
        if isinstance(raw, types.FunctionType):
            return raw
    raise TypeError(
        f"fn must be a @triton.jit function (JITFunction, or InterpretedFunction under TRITON_INTERPRET=1), "
        f"got {type(fn).__name__}"
    )


_signature_views: dict[int, tuple[Any, Any]] = {}  # id(fn) -> (fn, JITFunction used only for its parameters)


def _parameters_of(fn: Any) -> Any:
    """A JITFunction for ``fn``'s parameter list (constexpr flags, do_not_specialize, annotations).

    Under the interpreter ``fn`` is an InterpretedFunction: a JITFunction is built around the same Python
    function only to read its signature; nothing is compiled in this process (see :mod:`compile_worker`)."""
    if _is_jit_function(fn):
        return fn
    raw = _raw_python_function(fn)
    cached = _signature_views.get(id(fn))
    if cached is not None and cached[0] is fn:
        return cached[1]
    from triton.runtime.jit import JITFunction

    accepted = inspect.signature(JITFunction.__init__).parameters
    kwargs = {k: v for k, v in (getattr(fn, "kwargs", {}) or {}).items() if k in accepted}
    view = JITFunction(raw, **kwargs)
    _signature_views[id(fn)] = (fn, view)
    return view


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


# ---------------------------------------------------------------------------------------------------------------
# Specialization (what the launcher decides from the argument values)
# ---------------------------------------------------------------------------------------------------------------

_TORCH_TO_TRITON = {
    "bool": "u1", "uint8": "u8", "int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64",
    "uint16": "u16", "uint32": "u32", "uint64": "u64",
    "float16": "fp16", "half": "fp16", "bfloat16": "bf16", "float32": "fp32", "float": "fp32",
    "float64": "fp64", "double": "fp64",
    "float8_e4m3fn": "fp8e4nv", "float8_e5m2": "fp8e5", "float8_e4m3fnuz": "fp8e4b8", "float8_e5m2fnuz": "fp8e5b16",
}


def _python_specialize_value(value: Any, name: str, specialize: bool, align: bool,
                             is_const: bool = False) -> tuple[str, Any]:
    """Triton 3.6's ``specialize_impl`` rules in Python: returns (type, attr) where attr is "D" for
    divisible-by-16, "" for nothing, None for 'not specializable', or the constant for a constexpr."""
    if value is None:
        return "constexpr", None
    if isinstance(value, bool):  # before int: bool is an int subclass
        return "u1", None
    if isinstance(value, int) or type(value).__name__ in ("int8", "int16", "int32", "int64", "uint8", "uint16",
                                                           "uint32", "uint64"):
        ivalue = int(value)
        if specialize and ivalue == 1:
            return "constexpr", 1
        if -(2 ** 31) <= ivalue < 2 ** 31:
            ty = "i32"
        elif 2 ** 63 <= ivalue < 2 ** 64:
            ty = "u64"
        elif -(2 ** 63) <= ivalue < 2 ** 63:
            ty = "i64"
        else:
            raise ValueError(f"argument {name!r}: integer {ivalue} does not fit in 64 bits")
        if not specialize:
            return ty, None
        return ty, "D" if (align and ivalue % 16 == 0) else ""
    if isinstance(value, float) or type(value).__name__ in ("float16", "float32", "float64"):
        return "fp32", None
    if hasattr(value, "data_ptr") and hasattr(value, "dtype"):
        dtype_name = str(value.dtype).split(".")[-1]
        if dtype_name not in _TORCH_TO_TRITON:
            raise TypeError(f"argument {name!r}: unsupported tensor dtype {value.dtype}")
        ty = ("*k" if is_const else "*") + _TORCH_TO_TRITON[dtype_name]
        if not specialize:
            return ty, None
        return ty, "D" if (align and value.data_ptr() % 16 == 0) else ""
    raise TypeError(f"argument {name!r}: cannot pass {type(value).__name__} to a Triton kernel at run time "
                    f"(tensors, ints, floats, bools and None are supported; put other values in constexprs)")


@functools.lru_cache(maxsize=None)
def _native_specializer(backend_name: str):
    """Triton's own C++ specializer (3.4+), used when present so we match the launcher exactly."""
    try:
        from triton._C.libtriton import native_specialize_impl
        from triton.backends.compiler import GPUTarget
        from triton.compiler.compiler import make_backend

        backend_cls = type(make_backend(GPUTarget(*DEFAULT_TARGET))) if backend_name == "cuda" else None
    except Exception:
        return None
    if backend_cls is None:
        return None
    return functools.partial(native_specialize_impl, backend_cls)


def _specialize_value(value: Any, name: str, specialize: bool, align: bool, is_const: bool) -> tuple[str, Any]:
    # Plain Python values that Triton rejects get our clearer error first.
    result = _python_specialize_value(value, name, specialize, align, is_const)
    native = _native_specializer("cuda")
    if native is not None:
        try:
            return tuple(native(value, is_const, specialize, align))
        except Exception:
            pass  # fall back to the Python mirror (identical on 3.6; tests check it)
    return result


def specialize(fn: Any, args: dict[str, Any], constexprs: dict[str, Any] | None = None) -> Specialization:
    """The signature, constants and divisibility attributes a real ``fn[grid](**args, **constexprs)`` would
    compile, without compiling. ``fn`` may be a JITFunction or an InterpretedFunction."""
    if not isinstance(args, dict):
        raise TypeError(f"args must be a dict of run-time arguments by parameter name, got {type(args).__name__}")
    if constexprs is None:
        constexprs = {}
    if not isinstance(constexprs, dict):
        raise TypeError(f"constexprs must be a dict of tl.constexpr arguments by name, got {type(constexprs).__name__}")
    jit_fn = _parameters_of(fn)
    both = set(args) & set(constexprs)
    if both:
        raise ValueError(f"args and constexprs both give {sorted(both)}")
    values = {**args, **constexprs}
    params = list(jit_fn.params)
    names = [p.name for p in params]
    unknown = sorted(set(values) - set(names))
    if unknown:
        raise ValueError(f"args/constexprs name parameters {unknown} that {jit_fn.fn.__qualname__} does not have "
                         f"(it has {names})")

    signature: dict[str, str] = {}
    constants: dict[str, Any] = {}
    divisible: list[str] = []
    for param in params:
        if param.name in values:
            value = values[param.name]
        elif param.has_default:
            value = param.default
        else:
            raise ValueError(f"missing value for parameter {param.name!r} of {jit_fn.fn.__qualname__} "
                             f"(give it in args or constexprs)")
        if param.is_constexpr:
            signature[param.name] = "constexpr"
            constants[param.name] = value
            continue
        specialize_it = not param.do_not_specialize
        align = not param.do_not_specialize_on_alignment
        annotated = getattr(param, "annotation_type", "") or ""
        if annotated and (annotated == "u1" or annotated[:2] in ("fp", "bf")):
            specialize_it = False  # Triton never specializes annotated float/bool parameters
        ty, attr = _specialize_value(value, param.name, specialize_it, align, bool(getattr(param, "is_const", False)))
        if annotated:
            # An annotation fixes the type; only a string attribute (divisibility) survives from the value.
            ty, attr = annotated, (attr if specialize_it and isinstance(attr, str) else None)
        signature[param.name] = ty
        if ty == "constexpr":
            constants[param.name] = attr
        elif attr == "D":
            divisible.append(param.name)
    return Specialization(signature=signature, constexprs=constants, divisible_by_16=tuple(divisible))


# ---------------------------------------------------------------------------------------------------------------
# Building Triton's source object across versions
# ---------------------------------------------------------------------------------------------------------------


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


def _normalize_target(target: Any) -> Any:
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


def _check_num_warps(num_warps: Any, name: str = "num_warps") -> int:
    if not isinstance(num_warps, int) or isinstance(num_warps, bool):
        raise TypeError(f"{name} must be an int, got {type(num_warps).__name__}")
    if num_warps < 1 or num_warps > 32 or num_warps & (num_warps - 1):
        raise ValueError(f"{name} must be a power of two in [1, 32] (at most 1024 threads a block), got {num_warps}")
    return num_warps


# ---------------------------------------------------------------------------------------------------------------
# Reading registers out of the cubin
# ---------------------------------------------------------------------------------------------------------------

_RES_USAGE = re.compile(r"REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)")
_PTXAS_REGS = re.compile(r"Used (\d+) registers")
_PTXAS_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")


def _parse_res_usage(text: str, kernel: str) -> dict[str, int] | None:
    """Parse ``cuobjdump -res-usage``; picks the ``Function <kernel>:`` block (the entry kernel)."""
    blocks = re.split(r"^\s*Function\s+", text, flags=re.MULTILINE)
    found = None
    for block in blocks[1:]:
        fname, _, rest = block.partition(":")
        match = _RES_USAGE.search(rest)
        if match is None:
            continue
        numbers = dict(zip(("n_regs", "stack", "shared", "local"), map(int, match.groups())))
        if fname.strip() == kernel:
            return numbers
        found = found or numbers
    return found


def _parse_ptxas_log(text: str) -> dict[str, int] | None:
    """Parse ``ptxas -v``: registers, stack frame and static spill store/load bytes of the last function."""
    regs = _PTXAS_REGS.findall(text)
    frames = _PTXAS_FRAME.findall(text)
    if not regs or not frames:
        return None
    stack, stores, loads = map(int, frames[-1])
    return {"n_regs": int(regs[-1]), "stack": stack, "spill_stores": stores, "spill_loads": loads}


# ELF .nv.info attributes (from the EIATTR enumeration the CUDA tools print with `cuobjdump -elf`).
_EIATTR_FRAME_SIZE = 0x11
_EIATTR_REGCOUNT = 0x2F
_EIFMT_SVAL = 0x04


def parse_cubin_resources(cubin: bytes, kernel: str | None = None) -> dict[str, int]:
    """Registers and stack frame from a cubin's ``.nv.info`` section, with no NVIDIA tool at all.

    ``.nv.info`` holds (format, attribute, payload) records; REGCOUNT and FRAME_SIZE carry
    (symbol index, value) pairs, where the symbol index names the kernel in ``.symtab``."""
    if not isinstance(cubin, (bytes, bytearray)):
        raise TypeError(f"cubin must be bytes, got {type(cubin).__name__}")
    if cubin[:4] != b"\x7fELF" or cubin[4] != 2 or cubin[5] != 1:
        raise ValueError("cubin is not a 64-bit little-endian ELF file")
    (shoff,) = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize) for i in range(shnum)]

    def cstring(table_offset: int, offset: int) -> str:
        start = table_offset + offset
        return cubin[start:cubin.index(b"\0", start)].decode("ascii", "replace")

    names = [cstring(sections[shstrndx][4], s[0]) for s in sections]
    symbols: dict[int, str] = {}
    for s in sections:
        if s[1] == 2:  # SHT_SYMTAB: 24-byte Elf64_Sym records, names in the linked string table
            strtab_offset = sections[s[6]][4]
            for index in range(s[5] // 24):
                (st_name,) = struct.unpack_from("<I", cubin, s[4] + index * 24)
                symbols[index] = cstring(strtab_offset, st_name)
    values: dict[int, dict[int, int]] = {}  # attribute -> {symbol index: value}
    for s, name in zip(sections, names):
        if name != ".nv.info":
            continue
        data = cubin[s[4]:s[4] + s[5]]
        pos = 0
        while pos + 4 <= len(data):
            fmt, attr = data[pos], data[pos + 1]
            if fmt == _EIFMT_SVAL:
                (size,) = struct.unpack_from("<H", data, pos + 2)
                payload = data[pos + 4:pos + 4 + size]
                if attr in (_EIATTR_REGCOUNT, _EIATTR_FRAME_SIZE) and size >= 8:
                    sym, value = struct.unpack_from("<II", payload)
                    values.setdefault(attr, {})[sym] = value
                pos += 4 + size
            else:  # NVAL/BVAL/HVAL: value packed in the 2 bytes after the header
                pos += 4
    regs = values.get(_EIATTR_REGCOUNT, {})
    if not regs:
        raise ValueError("cubin has no EIATTR_REGCOUNT record in .nv.info")
    wanted = next((i for i, n in symbols.items() if n == kernel), None) if kernel else None
    sym = wanted if wanted in regs else next(iter(regs))
    return {"n_regs": regs[sym], "stack": values.get(_EIATTR_FRAME_SIZE, {}).get(sym, 0)}


def _run_tool(cmd: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def _rerun_ptxas(ptx: str, arch: int, fp_fusion: bool, extra_options: str | None = None) -> str | None:
    """``ptxas -v`` with Triton's flags, for the spill store/load counts when Triton's log was not captured
    (a kernel taken from Triton's on-disk cache never runs ptxas)."""
    ptxas = _ptxas_path(arch)
    if ptxas is None:
        return None
    with tempfile.TemporaryDirectory(prefix="perfutils_ptxas_") as tmp:
        src = os.path.join(tmp, "kernel.ptx")
        with open(src, "w") as handle:
            handle.write(ptx)
        extra = extra_options.split() if extra_options else []  # PTXAS_OPTIONS / ptx_options, as Triton passes
        cmd = [ptxas, "-lineinfo", *([] if fp_fusion else ["--fmad=false"]), "-v", *extra,
               f"--gpu-name={_sm_arch(arch)}", src, "-o", os.path.join(tmp, "kernel.cubin")]
        try:
            done = _run_tool(cmd)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout + done.stderr if done.returncode == 0 else None


_ENCODING_COMMENT = re.compile(r"\s*/\*\s*0x[0-9a-f]{16}\s*\*/\s*$")


def _disassemble(cubin_path: str) -> str | None:
    """SASS text: nvdisasm (clean) or cuobjdump -sass with the hex encodings stripped."""
    nvdisasm = find_cuda_tool("nvdisasm")
    if nvdisasm:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            done = _run_tool([nvdisasm, "-c", cubin_path])
            if done.returncode == 0 and done.stdout.strip():
                return done.stdout
    cuobjdump = find_cuda_tool("cuobjdump")
    if cuobjdump:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            done = _run_tool([cuobjdump, "-sass", cubin_path])
            if done.returncode == 0 and done.stdout.strip():
                lines = (_ENCODING_COMMENT.sub("", line) for line in done.stdout.splitlines())
                return "\n".join(line for line in lines if line.strip()) + "\n"
    return None


def _sass_from_cubin(cubin: bytes, name: str) -> str | None:
    with tempfile.TemporaryDirectory(prefix="perfutils_cubin_") as tmp:
        path = os.path.join(tmp, f"{name or 'kernel'}.cubin")
        with open(path, "wb") as handle:
            handle.write(cubin)
        return _disassemble(path)


def _metadata_get(metadata: Any, key: str, default: Any = None) -> Any:
    if isinstance(metadata, dict):
        return metadata.get(key, default)
    return getattr(metadata, key, default)


# ---------------------------------------------------------------------------------------------------------------
# compile_offline
# ---------------------------------------------------------------------------------------------------------------

_cache: dict[tuple, OfflineCompile] = {}
_compile_lock = threading.Lock()


def clear_cache() -> None:
    """Forget in-process results (Triton's own on-disk cache still makes recompiles fast)."""
    with _compile_lock:
        _cache.clear()


def compile_offline(fn: Any, args: dict[str, Any], constexprs: dict[str, Any] | None = None, num_warps: int = 4,
                    num_stages: int = 1, target: Any = DEFAULT_TARGET, *, with_sass: bool = True,
                    maxnreg: int | None = None) -> OfflineCompile:
    """Compile ``fn`` for ``target`` (default H100, sm_90) without a GPU and read its resource usage.

    ``args`` are the run-time arguments by name (tensors on any device, ints, floats): only their dtypes,
    magnitudes and 16-byte alignment matter, exactly as for a real launch. ``constexprs`` are the
    ``tl.constexpr`` arguments. The compile runs in a separate process (:mod:`perfutils.compile_worker`)
    that imports ``fn``'s module afresh with the interpreter off, so it works whatever this process did
    before (kernels run under ``TRITON_INTERPRET=1`` included). ``fn`` must be defined at module level in
    an importable module or file. Results are cached in-process.
    """
    from .compile_worker import WORKER, KernelLocator

    _check_num_warps(num_warps)
    if not isinstance(num_stages, int) or isinstance(num_stages, bool):
        raise TypeError(f"num_stages must be an int, got {type(num_stages).__name__}")
    if num_stages < 1:
        raise ValueError(f"num_stages must be >= 1, got {num_stages}")
    if not isinstance(with_sass, bool):
        raise TypeError(f"with_sass must be a bool, got {type(with_sass).__name__}")
    if maxnreg is not None and (not isinstance(maxnreg, int) or isinstance(maxnreg, bool) or not 16 <= maxnreg <= 255):
        raise ValueError(f"maxnreg must be None or an int in [16, 255] (registers per thread), got {maxnreg!r}")
    gpu_target = _normalize_target(target)
    spec = specialize(fn, args, constexprs)
    raw = _raw_python_function(fn)
    target_key = (gpu_target.backend, gpu_target.arch, gpu_target.warp_size)
    key = (raw, spec.key(), num_warps, num_stages, maxnreg, target_key)
    with _compile_lock:
        hit = _cache.get(key)
        if hit is not None:
            if with_sass and hit.sass is None:  # first compiled without SASS: disassemble the stored cubin
                hit.sass = _sass_from_cubin(hit.cubin, hit.name)
            return hit
        options = dict(num_warps=num_warps, num_stages=num_stages, target=target_key, with_sass=with_sass,
                       maxnreg=maxnreg, debug=bool(getattr(fn, "debug", None)))
        result = WORKER.compile(KernelLocator.of(raw), spec, options)
        _cache[key] = result
        return result


def compile_in_this_process(jit_fn: Any, spec: Specialization, *, num_warps: int, num_stages: int, target: Any,
                            with_sass: bool, maxnreg: int | None, debug: bool = False) -> OfflineCompile:
    """The compile itself, for the worker process (where the interpreter never ran)."""
    if not _is_jit_function(jit_fn):
        raise RuntimeError(f"{getattr(jit_fn, '__name__', jit_fn)!r} is a {type(jit_fn).__name__}, not a Triton "
                           "JITFunction, in the compile worker (its module may force TRITON_INTERPRET=1 on a Triton "
                           "without knobs)")
    return _compile_uncached(jit_fn, spec, num_warps, num_stages, _normalize_target(target), with_sass, maxnreg,
                             debug)


def _compile_uncached(jit_fn: Any, spec: Specialization, num_warps: int, num_stages: int, target: Any,
                      with_sass: bool, maxnreg: int | None = None, debug: bool = False) -> OfflineCompile:
    import triton

    options: dict[str, Any] = {"num_warps": num_warps, "num_stages": num_stages}
    if maxnreg is not None:
        options["maxnreg"] = maxnreg
    if debug or getattr(jit_fn, "debug", None):
        options["debug"] = True  # a real launch passes the decorator's debug flag too
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
    name = _metadata_get(metadata, "name", jit_fn.fn.__name__)
    cubin = kernel.asm["cubin"]
    ptx = kernel.asm.get("ptx", "") if hasattr(kernel.asm, "get") else kernel.asm["ptx"]
    fp_fusion = bool(_metadata_get(metadata, "enable_fp_fusion", True))

    ptxas_log = log.getvalue() or None
    ptxas_numbers = _parse_ptxas_log(ptxas_log) if ptxas_log else None
    if ptxas_numbers is None:  # came from Triton's disk cache: ptxas did not run in this process
        ptxas_log = _rerun_ptxas(ptx, target.arch, fp_fusion, _metadata_get(metadata, "ptx_options", None))
        ptxas_numbers = _parse_ptxas_log(ptxas_log) if ptxas_log else None

    tool, res, sass = "", None, None
    with tempfile.TemporaryDirectory(prefix="perfutils_cubin_") as tmp:
        cubin_path = os.path.join(tmp, f"{name}.cubin")
        with open(cubin_path, "wb") as handle:
            handle.write(cubin)
        cuobjdump = find_cuda_tool("cuobjdump")
        if cuobjdump:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                done = _run_tool([cuobjdump, "-res-usage", cubin_path])
                if done.returncode == 0:
                    res = _parse_res_usage(done.stdout, name)
                    tool = "cuobjdump" if res else ""
        if with_sass:
            sass = _disassemble(cubin_path)
    if res is None:
        with contextlib.suppress(ValueError, struct.error, IndexError):
            res = {**parse_cubin_resources(cubin, name), "shared": 0, "local": 0}
            tool = "elf"
    if res is None and ptxas_numbers is not None:
        res = {"n_regs": ptxas_numbers["n_regs"], "stack": ptxas_numbers["stack"], "shared": 0, "local": 0}
        tool = "ptxas"
    if res is None:
        raise RuntimeError(f"could not read registers of {name}: no cuobjdump, unreadable .nv.info and no ptxas log")

    ptxas_path = _ptxas_path(target.arch)
    return OfflineCompile(
        n_regs=res["n_regs"],
        stack_bytes=res["stack"],
        spill_store_bytes=ptxas_numbers["spill_stores"] if ptxas_numbers else None,
        spill_load_bytes=ptxas_numbers["spill_loads"] if ptxas_numbers else None,
        # Triton's shared memory is dynamic (metadata.shared, passed at launch) plus any static .shared.
        shared_bytes=int(_metadata_get(metadata, "shared", 0) or 0) + res["shared"],
        num_warps=int(_metadata_get(metadata, "num_warps", 0) or 0),  # warp specialization may change it
        ptx=ptx,
        sass=sass,
        triton_version=_triton_version(),
        ptxas_version=_tool_version(ptxas_path) if ptxas_path else None,
        target=(target.backend, target.arch, target.warp_size),
        name=name,
        num_stages=num_stages,
        signature=dict(spec.signature),
        local_bytes=res["local"],
        tool=tool,
        ptxas_log=ptxas_log,
        cubin=bytes(cubin),
    )


def compile_launch(launch: Any, target: Any = DEFAULT_TARGET, *, with_sass: bool = True) -> OfflineCompile:
    """:func:`compile_offline` for a ``kernels.launch.Launch`` (its fn, args, constexprs, warps, stages, maxnreg)."""
    missing = [a for a in ("fn", "args", "constexprs", "num_warps") if not hasattr(launch, a)]
    if missing:
        raise TypeError(f"launch must be a kernels.launch.Launch (missing {missing}), got {type(launch).__name__}")
    return compile_offline(launch.fn, launch.args, launch.constexprs, launch.num_warps,
                           getattr(launch, "num_stages", 1), target, with_sass=with_sass,
                           maxnreg=getattr(launch, "maxnreg", None))


# ---------------------------------------------------------------------------------------------------------------
# Teaching excerpts
# ---------------------------------------------------------------------------------------------------------------

_LOCAL_MEMORY = re.compile(r"\b(?:ld|st)\.local\b|\b(?:LDL|STL)(?:\.[A-Z0-9]+)*\b")


def local_memory_excerpt(ptx_or_sass: str, context: int = 3, max_sites: int | None = 8) -> str:
    """Lines around local-memory instructions (``ld.local``/``st.local`` in PTX, ``LDL``/``STL`` in SASS).

    Windows of ``context`` lines either side are merged when they overlap; at most ``max_sites`` windows are
    shown (None: all), separated by ``...``. Returns "" when there is no local memory traffic. Note that
    Triton's PTX rarely has any: spills are ptxas's decision, so look at the SASS."""
    if not isinstance(ptx_or_sass, str):
        raise TypeError(f"ptx_or_sass must be a str, got {type(ptx_or_sass).__name__}")
    if not isinstance(context, int) or isinstance(context, bool):
        raise TypeError(f"context must be an int, got {type(context).__name__}")
    if context < 0:
        raise ValueError(f"context must be >= 0, got {context}")
    if max_sites is not None and (not isinstance(max_sites, int) or isinstance(max_sites, bool)):
        raise TypeError(f"max_sites must be an int or None, got {type(max_sites).__name__}")
    if max_sites is not None and max_sites < 1:
        raise ValueError(f"max_sites must be >= 1 or None, got {max_sites}")
    lines = ptx_or_sass.splitlines()
    hits = [i for i, line in enumerate(lines) if _LOCAL_MEMORY.search(line)]
    windows: list[list[int]] = []
    shown = 0  # local-memory instructions inside the windows kept
    for i in hits:
        lo, hi = max(0, i - context), min(len(lines) - 1, i + context)
        if windows and lo <= windows[-1][1] + 1:
            windows[-1][1] = hi
        elif max_sites is not None and len(windows) == max_sites:
            break
        else:
            windows.append([lo, hi])
        shown += 1
    text = "\n...\n".join("\n".join(lines[lo:hi + 1]) for lo, hi in windows)
    if shown < len(hits):
        text += f"\n... ({len(hits)} local-memory instructions in all, {shown} shown)"
    return text


# ---------------------------------------------------------------------------------------------------------------
# Numbers from a real GPU launch
# ---------------------------------------------------------------------------------------------------------------


def counts_from_compiled(compiled_kernel: Any) -> dict[str, int | None]:
    """``n_regs``, ``spill_bytes``, ``shared_bytes``, ``num_warps`` of the ``CompiledKernel`` a GPU launch returned.

    Triton 3.6 fills ``n_regs``/``n_spills`` when it loads the cubin (first launch) from
    ``cuFuncGetAttribute``: ``n_spills = LOCAL_SIZE_BYTES / 4``, i.e. the per-thread stack frame in 4-byte
    words. We report ``spill_bytes = 4 * n_spills`` (bytes per thread; equals ``OfflineCompile.spill_bytes``).
    Values Triton has not filled in (kernel never loaded) come back as None.
    """
    if compiled_kernel is None:
        raise ValueError("compiled_kernel is None: the launch has not run on a GPU (under TRITON_INTERPRET there is "
                         "no CompiledKernel; use compile_offline instead)")
    metadata = getattr(compiled_kernel, "metadata", None)
    if metadata is None:
        raise TypeError(f"compiled_kernel must be a triton CompiledKernel (with .metadata), got "
                        f"{type(compiled_kernel).__name__}")
    n_regs = getattr(compiled_kernel, "n_regs", None)
    n_spills = getattr(compiled_kernel, "n_spills", None)
    shared = _metadata_get(metadata, "shared", None)
    num_warps = _metadata_get(metadata, "num_warps", None)
    return {
        "n_regs": int(n_regs) if n_regs is not None else None,
        "spill_bytes": 4 * int(n_spills) if n_spills is not None else None,
        "shared_bytes": int(shared) if shared is not None else None,
        "num_warps": int(num_warps) if num_warps is not None else None,
    }


# ---------------------------------------------------------------------------------------------------------------
# Analytic estimate for row-reduction kernels
# ---------------------------------------------------------------------------------------------------------------


def register_cap(num_warps: int) -> int:
    """Most registers per thread ptxas may use for a block of ``num_warps`` warps on sm_90.

    ``min(255, 65536 / (32 * num_warps))`` rounded down to the allocation unit of 8:
    255 up to 8 warps, 128 at 16 warps, 64 at 32 warps (the whole register file for one block)."""
    _check_num_warps(num_warps)
    per_thread = REGISTERS_PER_SM // (WARP_SIZE * num_warps)
    per_thread -= per_thread % REGISTER_ALLOCATION_UNIT
    return min(MAX_REGISTERS_PER_THREAD, per_thread)


def values_per_thread(block_size: int, num_warps: int) -> int:
    """Elements of one ``BLOCK_SIZE`` tile each thread holds (at least 1: small tiles are replicated)."""
    _check_block_size(block_size)
    _check_num_warps(num_warps)
    return max(1, math.ceil(block_size / (WARP_SIZE * num_warps)))


def _check_block_size(block_size: Any) -> None:
    if not isinstance(block_size, int) or isinstance(block_size, bool):
        raise TypeError(f"block_size must be an int, got {type(block_size).__name__}")
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")


def _check_number(value: Any, name: str, minimum: float = 0) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if not math.isfinite(value) or value < minimum:
        raise ValueError(f"{name} must be finite and >= {minimum}, got {value}")


def estimate_registers(block_size: int, num_warps: int, live_fp32_tiles: float = 2,
                       overhead: int = DEFAULT_OVERHEAD) -> int:
    """Registers per thread a row-reduction kernel wants: ``live_fp32_tiles * values_per_thread + overhead``.

    ``live_fp32_tiles`` counts the BLOCK_SIZE-wide fp32 tensors alive at the same time (e.g. logits and
    exp(logits - max) in a one-pass softmax: 2). bf16 tiles count as half a tile once packed, but Triton
    usually upcasts them early, so count them as fp32. This is a *demand*; ptxas caps it at
    :func:`register_cap` and spills the rest."""
    _check_number(live_fp32_tiles, "live_fp32_tiles")
    _check_number(overhead, "overhead")
    return math.ceil(live_fp32_tiles * values_per_thread(block_size, num_warps) + overhead)


@dataclass(frozen=True)
class SpillPrediction:
    estimate: int  # registers per thread the kernel wants
    cap: int  # registers per thread it may have
    values_per_thread: int
    spills: bool  # predicted to spill
    excess_registers: int  # estimate - cap when it spills, else 0
    excess_bytes: int  # 4 * excess_registers: predicted stack frame per thread, a lower bound

    @property
    def headroom(self) -> int:
        """Registers left before spilling (negative when it spills)."""
        return self.cap - self.estimate


def predict_spill(block_size: int, num_warps: int, live_fp32_tiles: float = 2,
                  overhead: int = DEFAULT_OVERHEAD) -> SpillPrediction:
    """Whether :func:`estimate_registers` exceeds :func:`register_cap`, and by how much."""
    estimate = estimate_registers(block_size, num_warps, live_fp32_tiles, overhead)
    cap = register_cap(num_warps)
    excess = max(0, estimate - cap)
    return SpillPrediction(estimate=estimate, cap=cap, values_per_thread=values_per_thread(block_size, num_warps),
                           spills=excess > 0, excess_registers=excess, excess_bytes=4 * excess)


@dataclass(frozen=True)
class EffectiveRegisters:
    n_regs: int
    stack_bytes: int
    spilled_words: int  # 4-byte values living in local memory per thread
    demand: int  # n_regs + spilled_words: what the kernel would have liked
    spills: bool
    occupancy_from_n_regs_is_optimistic: bool
    note: str


def effective_registers(n_regs: int, stack_bytes: int) -> EffectiveRegisters:
    """Flag readings where ``n_regs`` understates what the kernel needs.

    When ptxas spills heavily it may report *fewer* registers than the analytic estimate (a 16384-wide fp32
    row on 1 warp compiles to 64 registers and a ~4.6 KB stack on sm_90 with ptxas 12.8). Occupancy computed
    from ``n_regs`` then looks high while every spilled value round-trips through L1/L2 as local memory, so
    the kernel achieves far less than that occupancy suggests. ``demand = n_regs + stack_bytes / 4`` is the
    register count the kernel would have needed to keep everything on chip."""
    for value, name in ((n_regs, "n_regs"), (stack_bytes, "stack_bytes")):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not 0 < n_regs <= 256:
        raise ValueError(f"n_regs must be in (0, 256], got {n_regs}")
    if stack_bytes < 0:
        raise ValueError(f"stack_bytes must be >= 0, got {stack_bytes}")
    words = math.ceil(stack_bytes / 4)
    spills = stack_bytes > 0
    note = ("no local memory: occupancy from n_regs is what the kernel gets" if not spills else
            f"{stack_bytes} B/thread of local memory ({words} values): the kernel wanted ~{n_regs + words} "
            f"registers; occupancy from n_regs={n_regs} overstates its real throughput")
    return EffectiveRegisters(n_regs=n_regs, stack_bytes=stack_bytes, spilled_words=words, demand=n_regs + words,
                              spills=spills, occupancy_from_n_regs_is_optimistic=spills, note=note)
