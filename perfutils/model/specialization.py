"""What a Triton launch decides from its argument values before it compiles: the kernel's specialization.

:func:`specialize` returns the signature (``*bf16``, ``i32``, ``constexpr``...), the constants and the
arguments given ``tt.divisibility = 16`` that a real ``fn[grid](**args, **constexprs)`` would compile with,
without compiling and without a GPU. Triton 3.6 rules it relies on (read from ``triton/runtime/jit.py``,
``triton/backends/nvidia/driver.c``):

* Pointers are typed ``*<dtype>`` (``*bf16``, ``*fp32``, ``*i64``, ``*u1`` for ``torch.bool``) and get the
  ``tt.divisibility = 16`` attribute when ``data_ptr() % 16 == 0``.
* Python ints are ``i32`` when they fit in [-2**31, 2**31), ``u64`` from 2**63 upwards, ``i64`` otherwise;
  multiples of 16 get ``tt.divisibility = 16``; an int equal to 1 becomes a compile-time constant (signature
  ``"constexpr"``), so ``stride == 1`` compiles a different kernel from ``stride == 7``. ``do_not_specialize``
  turns both off; ``do_not_specialize_on_alignment`` turns off the divisibility only.
* Python floats are ``fp32`` (never specialized), bools ``u1``, ``None`` a constexpr.

Triton's own C++ specializer is used when present; a Python mirror of its rules gives clearer errors and
serves older versions. ``fn`` may be a ``JITFunction`` or, under ``TRITON_INTERPRET=1``, an
``InterpretedFunction``.
"""

from __future__ import annotations

import functools
import inspect
import types
from dataclasses import dataclass
from typing import Any

__all__ = ["DEFAULT_TARGET", "Specialization", "specialize", "split_arguments", "is_jit_function", "raw_python_function"]

DEFAULT_TARGET = ("cuda", 90, 32)  # (backend, compute capability, warp size): H100


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
# The kernel behind a JITFunction (or an InterpretedFunction under TRITON_INTERPRET=1)
# ---------------------------------------------------------------------------------------------------------------


def _is_interpreted(obj: Any) -> bool:
    # Duck-typed so that importing the interpreter (numpy-heavy) is never needed just to check.
    return type(obj).__name__ == "InterpretedFunction" and callable(getattr(obj, "fn", None))


def is_jit_function(obj: Any) -> bool:
    try:
        from triton.runtime.jit import JITFunction
    except ImportError:
        return False
    return isinstance(obj, JITFunction)


def raw_python_function(fn: Any) -> types.FunctionType:
    """The undecorated Python function behind a JITFunction or InterpretedFunction."""
    if is_jit_function(fn) or _is_interpreted(fn):
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
    function only to read its signature; nothing is compiled in this process (see :mod:`perfutils.model.compile_worker`)."""
    if is_jit_function(fn):
        return fn
    raw = raw_python_function(fn)
    cached = _signature_views.get(id(fn))
    if cached is not None and cached[0] is fn:
        return cached[1]
    from triton.runtime.jit import JITFunction

    accepted = inspect.signature(JITFunction.__init__).parameters
    kwargs = {k: v for k, v in (getattr(fn, "kwargs", {}) or {}).items() if k in accepted}
    view = JITFunction(raw, **kwargs)
    _signature_views[id(fn)] = (fn, view)
    return view


def split_arguments(fn: Any, values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(run-time arguments, ``tl.constexpr`` arguments) of ``fn`` among ``values`` (by parameter name, in the
    kernel's order; names that are not parameters are left out): the two dicts :func:`specialize` takes, for a
    launch recorded as one dict of arguments. ``fn`` may be a JITFunction or an InterpretedFunction."""
    runtime, constexprs = {}, {}
    for param in _parameters_of(fn).params:
        if param.name in values:
            (constexprs if param.is_constexpr else runtime)[param.name] = values[param.name]
    return runtime, constexprs


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
