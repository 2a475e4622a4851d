"""Argument checks the teaching kernels share: flat contiguous tensors that match, and powers of two."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["check_vector_pair", "check_power_of_two"]


def check_vector_pair(x: torch.Tensor, y: torch.Tensor, out: torch.Tensor | None) -> None:
    """x, y (and out, when given) are contiguous tensors of one shape, dtype and device, with < 2**31 elements."""
    for name, t in (("x", x), ("y", y)) + ((("out", out),) if out is not None else ()):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous (the kernel indexes it as a flat array)")
    for name, t in (("y", y), ("out", out)):
        if t is not None and (t.shape != x.shape or t.dtype != x.dtype or t.device != x.device):
            raise ValueError(
                f"{name} must match x in shape, dtype and device: x {tuple(x.shape)} {x.dtype} {x.device}, "
                f"{name} {tuple(t.shape)} {t.dtype} {t.device}"
            )
    if x.numel() >= 2**31:
        raise ValueError(f"x has {x.numel()} elements; these teaching kernels use 32-bit offsets (< 2**31)")


def check_power_of_two(name: str, value: Any, low: int, high: int) -> int:
    """``value`` if it is an int power of two in [low, high]; ValueError naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low or value > high or value & (value - 1):
        raise ValueError(f"{name} must be a power of two in [{low}, {high}], got {value!r}")
    return value
