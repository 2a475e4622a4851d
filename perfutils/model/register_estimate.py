"""How many registers a row-reduction kernel wants, and whether ptxas will have to spill: the back-of-envelope model.

"2 live fp32 tiles of BLOCK_SIZE / (32 * num_warps) values each, plus ~28 for addresses", capped at what
sm_90 gives a thread of a block of ``num_warps`` warps (:func:`register_cap`). No compiler and no GPU: the
compiler's own numbers come from :mod:`perfutils.model.offline_compile` (offline) and
:mod:`perfutils.model.compiled_kernel` (a GPU launch).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .hardware import check_num_warps

__all__ = [
    "REGISTERS_PER_SM",
    "MAX_REGISTERS_PER_THREAD",
    "REGISTER_ALLOCATION_UNIT",
    "WARP_SIZE",
    "DEFAULT_OVERHEAD",
    "SpillPrediction",
    "EffectiveRegisters",
    "register_cap",
    "values_per_thread",
    "estimate_registers",
    "predict_spill",
    "effective_registers",
]

# Hardware constants of sm_90 (H100) that bound registers per thread.
REGISTERS_PER_SM = 65536  # 64 Ki 32-bit registers per SM (and the most one block may use)
MAX_REGISTERS_PER_THREAD = 255  # the ISA encodes R0..R254 (R255 is RZ, the zero register)
REGISTER_ALLOCATION_UNIT = 8  # per-thread counts are allocated in steps of 8 (256 registers per warp)
WARP_SIZE = 32
DEFAULT_OVERHEAD = 28  # pointers, offsets, masks, loop counters, reduction scratch: 24-32 in practice


def register_cap(num_warps: int) -> int:
    """Most registers per thread ptxas may use for a block of ``num_warps`` warps on sm_90.

    ``min(255, 65536 / (32 * num_warps))`` rounded down to the allocation unit of 8:
    255 up to 8 warps, 128 at 16 warps, 64 at 32 warps (the whole register file for one block)."""
    check_num_warps(num_warps)
    per_thread = REGISTERS_PER_SM // (WARP_SIZE * num_warps)
    per_thread -= per_thread % REGISTER_ALLOCATION_UNIT
    return min(MAX_REGISTERS_PER_THREAD, per_thread)


def values_per_thread(block_size: int, num_warps: int) -> int:
    """Elements of one ``BLOCK_SIZE`` tile each thread holds (at least 1: small tiles are replicated)."""
    _check_block_size(block_size)
    check_num_warps(num_warps)
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
