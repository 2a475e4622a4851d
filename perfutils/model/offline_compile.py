"""Registers, spills and shared memory of a Triton kernel for H100 (sm_90), compiled on a machine with no GPU.

:func:`compile_offline` (or :func:`compile_launch` for a ``kernels.launch.Launch``) takes a ``@triton.jit``
function and the arguments of a launch, works out the specialization a real launch would compile
(:mod:`perfutils.model.specialization`), and compiles it in a separate process
(:mod:`perfutils.model.compile_worker`) that imports the kernel's module with the interpreter off: running
kernels under ``TRITON_INTERPRET=1`` patches ``triton.language``, and Triton 3.6 leaves part of it patched after
a device-function call, which broke later in-process compiles (only when the kernel was not already in
Triton's on-disk cache). Results are :class:`~perfutils.model.triton_compile.OfflineCompile` objects, cached in
this process; compiles are serialized.

Three ways to get a kernel's register story, from most to least exact: this module (the compiler's numbers
without a GPU, plus PTX and SASS), :func:`perfutils.model.compiled_kernel.counts_from_compiled` (the numbers of a
real GPU launch) and :mod:`perfutils.model.register_estimate` (the back-of-envelope estimate).
"""

from __future__ import annotations

import threading
from typing import Any

from .compile_worker import WORKER, KernelLocator
from .cuda_tools import sass_from_cubin
from .hardware import check_num_warps
from .specialization import DEFAULT_TARGET, is_jit_function, raw_python_function, specialize
from .triton_compile import OfflineCompile, compile_in_this_process, normalize_target

__all__ = ["compile_offline", "compile_launch", "clear_cache"]

_cache: dict[tuple, OfflineCompile] = {}
_compile_lock = threading.Lock()


def clear_cache() -> None:
    """Forget in-process results (Triton's own on-disk cache still makes recompiles fast)."""
    with _compile_lock:
        _cache.clear()


def compile_offline(fn: Any, args: dict[str, Any], constexprs: dict[str, Any] | None = None, num_warps: int = 4,
                    num_stages: int = 1, target: Any = DEFAULT_TARGET, *, with_sass: bool = True,
                    maxnreg: int | None = None, in_process: bool = False) -> OfflineCompile:
    """Compile ``fn`` for ``target`` (default H100, sm_90) without a GPU and read its resource usage.

    ``args`` are the run-time arguments by name (tensors on any device, ints, floats): only their dtypes,
    magnitudes and 16-byte alignment matter, exactly as for a real launch. ``constexprs`` are the
    ``tl.constexpr`` arguments. The compile runs in a separate process (:mod:`perfutils.model.compile_worker`)
    that imports ``fn``'s module afresh with the interpreter off, so it works whatever this process did
    before (kernels run under ``TRITON_INTERPRET=1`` included). ``fn`` must be defined at module level in
    an importable module or file. Results are cached in-process.

    ``in_process=True`` compiles ``fn`` as this process holds it instead, for a kernel the worker cannot import
    the same way (a peer's checkout loaded from a folder that is not on ``sys.path``, module globals set by the
    caller: :mod:`perfutils.peers.fast_llm`). ``fn`` must then be a JITFunction and this process must not have
    run kernels under ``TRITON_INTERPRET=1`` (see :mod:`perfutils.model.compile_worker` for why).
    """
    check_num_warps(num_warps)
    if not isinstance(num_stages, int) or isinstance(num_stages, bool):
        raise TypeError(f"num_stages must be an int, got {type(num_stages).__name__}")
    if num_stages < 1:
        raise ValueError(f"num_stages must be >= 1, got {num_stages}")
    if not isinstance(with_sass, bool):
        raise TypeError(f"with_sass must be a bool, got {type(with_sass).__name__}")
    if maxnreg is not None and (not isinstance(maxnreg, int) or isinstance(maxnreg, bool) or not 16 <= maxnreg <= 255):
        raise ValueError(f"maxnreg must be None or an int in [16, 255] (registers per thread), got {maxnreg!r}")
    if in_process and not is_jit_function(fn):
        raise RuntimeError(f"in_process=True compiles a JITFunction, got a {type(fn).__name__}: this process runs "
                           "kernels under TRITON_INTERPRET=1; compile in a process without it")
    gpu_target = normalize_target(target)
    spec = specialize(fn, args, constexprs)
    raw = raw_python_function(fn)
    target_key = (gpu_target.backend, gpu_target.arch, gpu_target.warp_size)
    key = (raw, spec.key(), num_warps, num_stages, maxnreg, target_key, in_process)
    with _compile_lock:
        hit = _cache.get(key)
        if hit is not None:
            if with_sass and hit.sass is None:  # first compiled without SASS: disassemble the stored cubin
                hit.sass = sass_from_cubin(hit.cubin, hit.name)
            return hit
        options = dict(num_warps=num_warps, num_stages=num_stages, target=target_key, with_sass=with_sass,
                       maxnreg=maxnreg, debug=bool(getattr(fn, "debug", None)))
        if in_process:
            options["target"] = gpu_target
            result = compile_in_this_process(fn, spec, **options)
        else:
            result = WORKER.compile(KernelLocator.of(raw), spec, options)
        _cache[key] = result
        return result


def compile_launch(launch: Any, target: Any = DEFAULT_TARGET, *, with_sass: bool = True) -> OfflineCompile:
    """:func:`compile_offline` for a ``kernels.launch.Launch`` (its fn, args, constexprs, warps, stages, maxnreg)."""
    missing = [a for a in ("fn", "args", "constexprs", "num_warps") if not hasattr(launch, a)]
    if missing:
        raise TypeError(f"launch must be a kernels.launch.Launch (missing {missing}), got {type(launch).__name__}")
    return compile_offline(launch.fn, launch.args, launch.constexprs, launch.num_warps,
                           getattr(launch, "num_stages", 1), target, with_sass=with_sass,
                           maxnreg=getattr(launch, "maxnreg", None))
