"""Vector add (notebook 06): the first Triton kernel, a boundary mask, and the tile-size / autotuner study.

``add_kernel`` adds two flat tensors, one program per ``BLOCK_SIZE`` elements, the last tile masked;
``add_kernel_autotuned`` is the same kernel under ``triton.autotune`` over :data:`ADD_TILE_CONFIGS`.
:func:`mask_stats` counts the lanes the mask switches off.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from .checks import check_power_of_two, check_vector_pair

__all__ = ["add_kernel", "add_kernel_autotuned", "ADD_TILE_CONFIGS", "add", "add_autotuned", "launch_add",
           "launch_add_autotuned", "mask_stats"]


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    """out[i] = x[i] + y[i] for i < n_elements; program p handles [p*BLOCK_SIZE, (p+1)*BLOCK_SIZE)."""
    pid = tl.program_id(axis=0)  # which tile this program owns (grid = cdiv(n, BLOCK_SIZE))
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)  # BLOCK_SIZE element indices, one per lane
    mask = offsets < n_elements  # False on the lanes of the last tile that fall past the end
    x = tl.load(x_ptr + offsets, mask=mask)  # masked lanes read nothing
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + y, mask=mask)  # ...and write nothing


# The tile-size study: every BLOCK_SIZE from 256 to 4096 with 1-8 warps (20 configurations). The
# same list is what the autotuner below chooses from.
ADD_TILE_CONFIGS: tuple[tuple[int, int], ...] = tuple(
    (block, warps) for block in (256, 512, 1024, 2048, 4096) for warps in (1, 2, 4, 8)
)

# triton.autotune benchmarks every config the first time it sees a new value of the key
# (here n_elements) and reuses the fastest one afterwards; ``best_config`` records the choice.
add_kernel_autotuned = triton.autotune(
    configs=[triton.Config({"BLOCK_SIZE": block}, num_warps=warps) for block, warps in ADD_TILE_CONFIGS],
    key=["n_elements"],
)(add_kernel)


def launch_add(x, y, out, block_size: int, num_warps: int):
    """Launch :func:`add_kernel` over ``x.numel()`` elements; returns what the launch returns (a compiled kernel)."""
    n = x.numel()
    grid = (triton.cdiv(n, block_size),)
    return add_kernel[grid](x, y, out, n, BLOCK_SIZE=block_size, num_warps=num_warps)


def add(x: torch.Tensor, y: torch.Tensor, out: torch.Tensor | None = None, *, block_size: int = 1024,
        num_warps: int = 4) -> torch.Tensor:
    """``x + y`` with :func:`add_kernel` (any shape, contiguous; one program per BLOCK_SIZE elements)."""
    check_vector_pair(x, y, out)
    check_power_of_two("block_size", block_size, 16, 65536)
    check_power_of_two("num_warps", num_warps, 1, 32)
    out = torch.empty_like(x) if out is None else out
    if x.numel():
        launch_add(x, y, out, block_size, num_warps)
    return out


def launch_add_autotuned(x, y, out):
    """Launch :data:`add_kernel_autotuned` (its grid follows the BLOCK_SIZE the autotuner picks)."""
    n = x.numel()
    return add_kernel_autotuned[lambda meta: (triton.cdiv(n, meta["BLOCK_SIZE"]),)](x, y, out, n)


def add_autotuned(x: torch.Tensor, y: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``x + y`` with the autotuned kernel (GPU only: the autotuner times configs with CUDA events)."""
    check_vector_pair(x, y, out)
    out = torch.empty_like(x) if out is None else out
    if x.numel():
        launch_add_autotuned(x, y, out)
    return out


def mask_stats(n_elements: int, block_size: int) -> dict[str, Any]:
    """How a 1-D problem of ``n_elements`` splits into tiles of ``block_size`` lanes.

    Returns programs (the grid), full_programs, lanes_in_last (active lanes of the last tile),
    idle_lanes (lanes masked off) and idle_fraction (idle lanes / all launched lanes).
    """
    if isinstance(n_elements, bool) or not isinstance(n_elements, int) or n_elements <= 0:
        raise ValueError(f"n_elements must be a positive int, got {n_elements!r}")
    check_power_of_two("block_size", block_size, 1, 1 << 20)
    programs = -(-n_elements // block_size)
    lanes = programs * block_size
    last = n_elements - (programs - 1) * block_size
    return {
        "n_elements": n_elements,
        "block_size": block_size,
        "programs": programs,
        "full_programs": n_elements // block_size,
        "lanes_in_last": last,
        "idle_lanes": lanes - n_elements,
        "idle_fraction": (lanes - n_elements) / lanes,
    }
