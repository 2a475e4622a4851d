"""Row-wise softmax (notebook 06): one program per row, the whole row kept in registers, one read and one write.

``softmax_kernel`` beside :func:`naive_softmax` (five PyTorch ops, each a round trip through DRAM) and the
traffic of each (:func:`softmax_bytes`, :func:`naive_softmax_bytes`), as in Triton's fused-softmax tutorial.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .checks import check_power_of_two

__all__ = ["softmax_kernel", "softmax_config", "softmax", "naive_softmax", "softmax_bytes", "naive_softmax_bytes"]


@triton.jit
def softmax_kernel(out_ptr, in_ptr, in_row_stride, out_row_stride, n_cols, BLOCK_SIZE: tl.constexpr):
    """softmax of one row per program; BLOCK_SIZE >= n_cols so the whole row lives in registers."""
    row = tl.program_id(axis=0)  # grid = (n_rows,)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols  # BLOCK_SIZE is a power of two; the row usually is not
    # Masked lanes read -inf: they cannot win the max and exp(-inf) = 0 adds nothing to the sum.
    x = tl.load(in_ptr + row * in_row_stride + cols, mask=mask, other=-float("inf")).to(tl.float32)
    x = x - tl.max(x, axis=0)  # subtract the row max: exp never overflows (softmax is shift-invariant)
    numerator = tl.exp(x)
    denominator = tl.sum(numerator, axis=0)
    y = numerator / denominator
    tl.store(out_ptr + row * out_row_stride + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def softmax_config(n_cols: int) -> tuple[int, int]:
    """(BLOCK_SIZE, num_warps) for :func:`softmax`: the next power of two >= n_cols, and enough warps
    that each thread holds at most 32 values (so the row fits in registers without spilling)."""
    if isinstance(n_cols, bool) or not isinstance(n_cols, int) or n_cols <= 0:
        raise ValueError(f"n_cols must be a positive int, got {n_cols!r}")
    block = triton.next_power_of_2(n_cols)
    if block > 16384:
        raise ValueError(f"n_cols={n_cols}: this one-row-per-program teaching kernel supports rows up to 16384 columns")
    num_warps = min(16, max(4, block // (32 * 32)))
    return block, num_warps


def softmax(x: torch.Tensor, *, num_warps: int | None = None) -> torch.Tensor:
    """Row-wise softmax of a 2-D tensor with :func:`softmax_kernel` (rows may be strided)."""
    if not isinstance(x, torch.Tensor) or x.ndim != 2:
        raise ValueError(f"x must be a 2-D torch.Tensor, got {getattr(x, 'shape', type(x).__name__)}")
    if x.stride(1) != 1:
        raise ValueError("x must have contiguous rows (stride 1 along the last dimension)")
    n_rows, n_cols = x.shape
    block, default_warps = softmax_config(n_cols)
    num_warps = default_warps if num_warps is None else check_power_of_two("num_warps", num_warps, 1, 32)
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    if n_rows:
        softmax_kernel[(n_rows,)](out, x, x.stride(0), out.stride(0), n_cols, BLOCK_SIZE=block, num_warps=num_warps)
    return out


def naive_softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax over rows written as five separate PyTorch ops (each one a kernel reading/writing DRAM).

    Traffic in elements for an M x N input: max reads MN, writes M; the subtraction reads MN + M,
    writes MN; exp reads MN, writes MN; the sum reads MN, writes M; the division reads MN + M,
    writes MN. In all 5MN + 2M read and 3MN + 2M written, against MN + MN for one fused pass.
    """
    row_max = x.max(dim=1, keepdim=True).values
    shifted = x - row_max
    numerator = torch.exp(shifted)
    denominator = numerator.sum(dim=1, keepdim=True)
    return numerator / denominator


def softmax_bytes(n_rows: int, n_cols: int, element_bytes: int = 4) -> int:
    """Minimal DRAM traffic of a softmax: read the input once, write the output once."""
    return 2 * n_rows * n_cols * element_bytes


def naive_softmax_bytes(n_rows: int, n_cols: int, element_bytes: int = 4) -> int:
    """Traffic of :func:`naive_softmax` (see its docstring): (8MN + 4M) elements."""
    return (8 * n_rows * n_cols + 4 * n_rows) * element_bytes
