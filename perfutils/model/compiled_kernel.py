"""What a GPU launch's ``CompiledKernel`` says about itself: registers, stack (spill) bytes, shared memory, warps.

Triton 3.6 fills ``n_regs``/``n_spills`` when it loads the cubin (first launch) from ``cuFuncGetAttribute``;
``CompiledKernel.n_spills`` is ``LOCAL_SIZE_BYTES / 4`` (C integer division): the per-thread local-memory
size (the stack frame) in 4-byte words, *not* bytes and *not* the number of spill instructions.
:func:`counts_from_compiled` multiplies it back by 4. :func:`kernel_stats` adds the theoretical occupancy
(:mod:`perfutils.model.occupancy`) and never raises: a launch's timing must not be lost for its statistics.
"""

from __future__ import annotations

from typing import Any

from .occupancy import occupancy_of_compiled

__all__ = ["counts_from_compiled", "kernel_stats", "metadata_get"]


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


def kernel_stats(compiled: Any, cc: tuple[int, int] | None = None) -> dict[str, Any]:
    """Registers, spills, shared memory and theoretical occupancy of a launched Triton kernel.

    ``compiled`` is what ``kernel[grid](...)`` returned on a GPU (a ``CompiledKernel``); under the
    interpreter it is None and every value is None.
    """
    stats: dict[str, Any] = {"n_regs": None, "spill_bytes": None, "shared_bytes": None,
                             "occupancy": None, "blocks_per_sm": None, "limiter": None}
    if compiled is None or getattr(compiled, "metadata", None) is None:
        return stats
    problems = []
    try:
        counts = counts_from_compiled(compiled)
        stats.update({k: counts.get(k) for k in ("n_regs", "spill_bytes", "shared_bytes")})
    except Exception as exc:  # a missing attribute in another Triton version must not lose the timing
        problems.append(f"registers: {type(exc).__name__}: {exc}")
    try:
        occ = occupancy_of_compiled(compiled, cc)
        stats.update(occupancy=float(occ.occupancy), blocks_per_sm=int(occ.blocks_per_sm), limiter=occ.limiter or None)
    except Exception as exc:
        problems.append(f"occupancy: {type(exc).__name__}: {exc}")
    if problems:
        stats["stats_error"] = "; ".join(problems)[:500]
    return stats
