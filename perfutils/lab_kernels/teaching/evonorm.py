"""A normalisation + activation fused into one pass (notebook 07): EvoNorm-B0 with a group variance.

``evonorm_b0_kernel`` reads each (sample, group) tile once, computes the instance and group variances in
registers and writes the result; :func:`evonorm_b0_torch` is the definition in eager PyTorch (one kernel per op).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .checks import check_power_of_two

__all__ = ["evonorm_b0_kernel", "MAX_EVONORM_TILE", "evonorm_b0_torch", "evonorm_config", "launch_evonorm",
           "evonorm_b0"]


@triton.jit
def evonorm_b0_kernel(x_ptr, out_ptr, v_ptr, gamma_ptr, beta_ptr, C, L, eps,
                      CPG: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_L: tl.constexpr):
    """One program per (sample n, group g): the group's CPG channels x L positions are one register tile.

    x is (N, C, L) contiguous with C = G * CPG. The program reads the tile once, computes each
    channel's variance over L and the group's variance over CPG*L (two-pass, in fp32), and writes
    y = x / max(sqrt(var_group + eps), v*x + sqrt(var_instance + eps)) * gamma + beta.
    """
    pid = tl.program_id(axis=0)
    groups = C // CPG
    n = pid // groups
    g = pid % groups
    c_local = tl.arange(0, BLOCK_C)  # channel within the group (BLOCK_C = next power of two >= CPG)
    positions = tl.arange(0, BLOCK_L)  # position along L (BLOCK_L = next power of two >= L)
    c_mask = c_local < CPG
    mask = c_mask[:, None] & (positions < L)[None, :]
    channels = g * CPG + c_local
    # 64-bit base offset: N * C * L may exceed 2**31 for large batches.
    offsets = n.to(tl.int64) * C * L + channels[:, None] * L + positions[None, :]
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)

    # Instance statistics: per channel, over L positions (rows of the tile).
    mean_instance = tl.sum(x, axis=1) / L
    centred = tl.where(mask, x - mean_instance[:, None], 0.0)  # masked lanes must not count
    var_instance = tl.sum(centred * centred, axis=1) / L
    # Group statistics: over the whole tile (CPG * L values).
    mean_group = tl.sum(tl.sum(x, axis=1), axis=0) / (CPG * L)
    centred_g = tl.where(mask, x - mean_group, 0.0)
    var_group = tl.sum(tl.sum(centred_g * centred_g, axis=1), axis=0) / (CPG * L)

    v = tl.load(v_ptr + channels, mask=c_mask, other=0.0).to(tl.float32)
    gamma = tl.load(gamma_ptr + channels, mask=c_mask, other=0.0).to(tl.float32)
    beta = tl.load(beta_ptr + channels, mask=c_mask, other=0.0).to(tl.float32)
    denominator = tl.maximum(tl.sqrt(var_group + eps), v[:, None] * x + tl.sqrt(var_instance + eps)[:, None])
    y = x / denominator * gamma[:, None] + beta[:, None]
    tl.store(out_ptr + offsets, y.to(out_ptr.dtype.element_ty), mask=mask)


MAX_EVONORM_TILE = 16384  # values of one (sample, group) tile kept in registers


def _check_evonorm(x, v, gamma, beta, groups: int) -> tuple[int, int, int]:
    if not isinstance(x, torch.Tensor) or x.ndim < 3:
        raise ValueError(f"x must be a tensor (N, C, spatial...) with at least 3 dims, got {getattr(x, 'shape', type(x).__name__)}")
    n, c = x.shape[:2]
    if isinstance(groups, bool) or not isinstance(groups, int) or groups <= 0 or c % groups:
        raise ValueError(f"groups must be a positive int dividing C={c}, got {groups!r}")
    for name, p in (("v", v), ("gamma", gamma), ("beta", beta)):
        if not isinstance(p, torch.Tensor) or tuple(p.shape) != (c,):
            raise ValueError(f"{name} must be a tensor of shape ({c},), got {getattr(p, 'shape', type(p).__name__)}")
    spatial = math.prod(x.shape[2:])
    return n, c, spatial


def evonorm_b0_torch(x: torch.Tensor, v: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, *,
                     groups: int, eps: float = 1e-5) -> torch.Tensor:
    """Reference definition, in eager PyTorch (one kernel per op; pass float64 tensors for ground truth).

    For x of shape (N, C, *spatial) with C channels in ``groups`` groups::

        var_instance[n, c] = Var over spatial of x[n, c]                 (biased, as in InstanceNorm)
        var_group[n, g]    = Var over (channels of g) x spatial of x[n]  (biased, as in GroupNorm)
        y = x / max(sqrt(var_group + eps), v * x + sqrt(var_instance + eps)) * gamma + beta

    This is EvoNorm-B0 (Liu et al., "Evolving Normalization-Activation Layers", NeurIPS 2020,
    arXiv:2004.02967) with its batch variance replaced by the group variance, so the layer does not
    depend on the batch (the same substitution EvoNorm-S0 makes). v, gamma, beta have shape (C,).
    """
    n, c, _ = _check_evonorm(x, v, gamma, beta, groups)
    spatial_dims = tuple(range(2, x.ndim))
    var_instance = x.var(dim=spatial_dims, correction=0, keepdim=True)  # (N, C, 1, ...)
    var_group = x.reshape(n, groups, -1).var(dim=2, correction=0, keepdim=True)  # (N, G, 1)
    var_group = var_group.repeat_interleave(c // groups, dim=1).reshape(var_instance.shape)  # (N, C, 1, ...)
    shape = (1, c) + (1,) * (x.ndim - 2)
    denominator = torch.maximum(torch.sqrt(var_group + eps), v.reshape(shape) * x + torch.sqrt(var_instance + eps))
    return x / denominator * gamma.reshape(shape) + beta.reshape(shape)


def evonorm_config(c: int, groups: int, spatial: int, num_warps: int | None) -> tuple[int, int, int, int]:
    """(channels per group, BLOCK_C, BLOCK_L, num_warps) for C=``c`` channels in ``groups`` groups of ``spatial``
    positions; ValueError when a group's tile does not fit :data:`MAX_EVONORM_TILE`."""
    cpg = c // groups
    block_c = triton.next_power_of_2(cpg)
    block_l = triton.next_power_of_2(spatial)
    tile = block_c * block_l
    if tile > MAX_EVONORM_TILE:
        raise ValueError(
            f"a group tile of {cpg} channels x {spatial} positions (padded {block_c} x {block_l} = {tile}) exceeds "
            f"{MAX_EVONORM_TILE} values: this one-pass teaching kernel keeps the whole group in registers"
        )
    if num_warps is None:
        num_warps = min(16, max(1, tile // 512))  # about 16 fp32 values per thread
    return cpg, block_c, block_l, check_power_of_two("num_warps", num_warps, 1, 32)


def launch_evonorm(x, out, v, gamma, beta, groups: int, eps: float, num_warps: int | None):
    """Launch :func:`evonorm_b0_kernel`, one program per (sample, group); returns what the launch returns."""
    n, c, spatial = _check_evonorm(x, v, gamma, beta, groups)
    cpg, block_c, block_l, warps = evonorm_config(c, groups, spatial, num_warps)
    return evonorm_b0_kernel[(n * groups,)](
        x, out, v, gamma, beta, c, spatial, float(eps), CPG=cpg, BLOCK_C=block_c, BLOCK_L=block_l, num_warps=warps
    )


def evonorm_b0(x: torch.Tensor, v: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, *, groups: int,
               eps: float = 1e-5, num_warps: int | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`evonorm_b0_torch` in one Triton pass (x contiguous; one program per sample and group)."""
    n, c, spatial = _check_evonorm(x, v, gamma, beta, groups)
    if not x.is_contiguous() or not all(p.is_contiguous() for p in (v, gamma, beta)):
        raise ValueError("x, v, gamma and beta must be contiguous")
    evonorm_config(c, groups, spatial, num_warps)  # validate before allocating
    out = torch.empty_like(x) if out is None else out
    if n:
        launch_evonorm(x, out, v, gamma, beta, groups, eps, num_warps)
    return out
