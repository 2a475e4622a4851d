"""Occupancy for the lab: the exact calculator (:mod:`kernels.occupancy`, where the product uses it to size its
persistent grids) re-exported, plus what only the lab needs: the curves of NVIDIA's occupancy spreadsheet
(notebook 04's explorer) and the driver's own count on a GPU (the ground truth the port is checked against).
"""

from __future__ import annotations

import pandas as pd

from kernels.occupancy import (  # noqa: F401 - the calculator, re-exported for the lab
    LIMITER_NAMES,
    TRITON_OPT_IN_THRESHOLD,
    UNLIMITED,
    Occupancy,
    kernel_counts,
    max_coresident_programs,
    occupancy,
    occupancy_of_compiled,
    occupancy_of_counts,
    register_cap_for_fewer_blocks,
    register_caps_for_more_blocks,
    sm_limits,
)

# ------------------------------------------------------------------------------------------
# Curves, as in NVIDIA's occupancy calculator spreadsheet
# ------------------------------------------------------------------------------------------

def _curve(values, name: str, make, current) -> pd.DataFrame:
    rows = []
    for value in values:
        occ = make(value)
        rows.append({name: value, "blocks_per_sm": occ.blocks_per_sm,
                     "active_warps": occ.active_warps, "occupancy": occ.occupancy,
                     "limiter": occ.limiter, "current": value == current})
    return pd.DataFrame(rows)


def occupancy_curves(cc=(9, 0), *, threads_per_block: int, registers_per_thread: int,
                     shared_bytes: int = 0) -> dict[str, pd.DataFrame]:
    """Occupancy as each of registers/thread, threads/block, shared bytes/block varies alone.

    Returns ``{"registers": df, "threads": df, "shared_memory": df}``; each DataFrame has the
    varied column (``registers_per_thread``, ``threads_per_block``, ``shared_bytes``) plus
    ``blocks_per_sm, active_warps, occupancy, limiter, current`` (``current`` marks the given
    configuration). Shared memory above 48 KiB opts in as Triton does.
    """
    limits = sm_limits(cc)

    def at(threads, regs, shared):
        return occupancy(limits.cc, threads_per_block=threads, registers_per_thread=regs,
                         dynamic_shared_bytes=shared, opt_in=shared > TRITON_OPT_IN_THRESHOLD)

    at(threads_per_block, registers_per_thread, shared_bytes)  # validate the current point once
    shared_values = sorted(set(range(0, limits.shared_bytes_per_block_optin + 1, 1024)) | {shared_bytes})
    return {
        "registers": _curve(range(0, limits.max_registers_per_thread + 1), "registers_per_thread",
                            lambda r: at(threads_per_block, r, shared_bytes),
                            registers_per_thread),
        "threads": _curve(range(limits.warp_size, limits.max_threads_per_block + 1,
                                limits.warp_size), "threads_per_block",
                          lambda t: at(t, registers_per_thread, shared_bytes), threads_per_block),
        "shared_memory": _curve(shared_values, "shared_bytes",
                                lambda s: at(threads_per_block, registers_per_thread, s),
                                shared_bytes),
    }


def driver_blocks_per_sm(kernel) -> int:
    """Blocks/SM the CUDA driver reports for a loaded Triton kernel (GPU only): the ground truth the
    port is checked against. ``kernel`` is a CompiledKernel that has run (its ``function`` is loaded)."""
    from cuda.bindings import driver

    _, shared, num_warps, _ = kernel_counts(kernel)
    error, blocks = driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(
        driver.CUfunction(int(kernel.function)), 32 * num_warps, shared)
    if error != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuOccupancyMaxActiveBlocksPerMultiprocessor failed: {error}")
    return int(blocks)
