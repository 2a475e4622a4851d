"""What a GPU launch's ``CompiledKernel`` says about itself: registers, stack (spill) bytes, shared memory, warps.

Triton 3.6 fills ``n_regs``/``n_spills`` when it loads the cubin (first launch) from ``cuFuncGetAttribute``;
``CompiledKernel.n_spills`` is ``LOCAL_SIZE_BYTES / 4`` (C integer division): the per-thread local-memory
size (the stack frame) in 4-byte words, *not* bytes and *not* the number of spill instructions.
:func:`counts_from_compiled` multiplies it back by 4.
"""

from __future__ import annotations

from typing import Any

__all__ = ["counts_from_compiled", "metadata_get"]


def metadata_get(metadata: Any, key: str, default: Any = None) -> Any:
    if isinstance(metadata, dict):
        return metadata.get(key, default)
    return getattr(metadata, key, default)


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
    shared = metadata_get(metadata, "shared", None)
    num_warps = metadata_get(metadata, "num_warps", None)
    return {
        "n_regs": int(n_regs) if n_regs is not None else None,
        "spill_bytes": 4 * int(n_spills) if n_spills is not None else None,
        "shared_bytes": int(shared) if shared is not None else None,
        "num_warps": int(num_warps) if num_warps is not None else None,
    }
