"""Exact theoretical occupancy: a Python port of NVIDIA's occupancy calculator, and the per-SM limits it needs.

The product needs it to size persistent grids (``kernels.split_row``: a cooperative grid never larger than what the
GPU holds at once) and to offer register caps that fit one more program per SM (``kernels.autotune``); the lab's
occupancy explorer and studies use the same code through :mod:`perfutils.model.occupancy`.

The per-SM limits (``SMLimits``, one entry per compute capability). Sources: CUDA C++ Programming Guide, "Features
and Technical Specifications", table "Technical Specifications per Compute Capability"; and the values the occupancy
header hard-codes per architecture (``/usr/local/cuda/include/cuda_occupancy.h``: ``cudaOccSMemAllocationGranularity``,
``cudaOccRegAllocationGranularity``, ``cudaOccSubPartitionsPerMultiprocessor``, ``cudaOccMaxBlocksPerMultiprocessor``,
``cudaOccAlignUpShmemSizeVoltaPlus``, ``cudaOccMaxBlocksPerSMBlockBarrierLimit``,
``cudaOccMaxVirtualResourceCountPerSM``). The byte counts match what ``cudaGetDeviceProperties`` reports (e.g. H100:
sharedMemPerMultiprocessor = 233472 = 228 KiB, sharedMemPerBlockOptin = 232448 = 227 KiB,
reservedSharedMemPerBlock = 1024).

Theoretical occupancy: a Python port of NVIDIA's occupancy calculator.

The algorithm is ``cudaOccMaxActiveBlocksPerMultiprocessor`` from ``cuda_occupancy.h`` (CUDA 13.0
toolkit, header version 12.1), restricted to the branches reachable on compute capability 7.5 and
8.0 - 10.0. Each helper below names the header function it ports. Things the simple
"registers / (regs x threads)" formula misses and this port keeps:

* registers are allocated per *warp*, rounded up to 256 (``cudaOccRegAllocationGranularity``),
  and per SM sub-partition (quadrant): an SM holds ``4 x floor(16384 / regs_per_warp)`` warps, so
  256 threads x 33 registers gives 6 blocks on sm_90, not 7;
* a block's register request is checked as if its warps were rounded up to a multiple of 4;
* the driver reserves 1 KiB of shared memory per block (since Ampere), and shared memory is
  allocated in 128-byte units;
* the shared-memory carveout (the part of the unified L1/shared array given to shared memory)
  is rounded up to a supported size, and a block larger than the preferred carveout raises the
  carveout rather than failing;
* a block above 48 KiB of shared memory can only launch if the kernel opted in (Triton does so
  itself; see ``occupancy_of_counts``);
* the 32 (or 16/24) blocks-per-SM limit, block barriers (cc >= 9), virtual resources (cc >= 10).

Partitioned global caching (sm_52/sm_6x only) is never enabled on these architectures, so the
partitioned branches of the header are not ported. "Unlimited" limits (no registers, no shared
memory) are ``math.inf`` where the header uses INT_MAX.
"""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass, field

KIB = 1024
MIB = 1024 * 1024


@dataclass(frozen=True)
class SMLimits:
    """Per-SM and per-block resource limits of one compute capability.

    Field names follow the quantities of the occupancy calculator; the matching
    ``cudaOccDeviceProp`` field (where there is one) is given in the comment.
    """

    cc: tuple[int, int]
    warp_size: int  # warpSize
    max_threads_per_block: int  # maxThreadsPerBlock
    max_threads_per_sm: int  # maxThreadsPerMultiprocessor
    max_blocks_per_sm: int  # header: cudaOccMaxBlocksPerMultiprocessor
    registers_per_sm: int  # regsPerMultiprocessor (32-bit registers)
    max_registers_per_block: int  # regsPerBlock
    max_registers_per_thread: int  # guide: 255 (ptxas never allocates more)
    register_allocation_unit: int  # header: registers per warp are rounded up to this
    sub_partitions: int  # header: cudaOccSubPartitionsPerMultiprocessor (SM quadrants)
    warp_allocation_granularity: int  # spreadsheet calculator's name for the same rounding
    shared_bytes_per_sm: int  # sharedMemPerMultiprocessor (largest carveout)
    shared_bytes_per_block: int  # sharedMemPerBlock: default per-block limit (48 KiB)
    shared_bytes_per_block_optin: int  # sharedMemPerBlockOptin
    reserved_shared_bytes_per_block: int  # reservedSharedMemPerBlock (driver's 1 KiB since Ampere)
    shared_allocation_granularity: int  # header: cudaOccSMemAllocationGranularity
    carveout_bytes: tuple[int, ...]  # header: cudaOccAlignUpShmemSizeVoltaPlus, ascending
    barriers_per_block_slot: int  # header: barriers available = this x max blocks per SM
    virtual_resources_per_sm: int  # header: cudaOccMaxVirtualResourceCountPerSM (0 = none)

    @property
    def max_warps_per_sm(self) -> int:
        return self.max_threads_per_sm // self.warp_size

    @property
    def name(self) -> str:
        return f"sm_{self.cc[0]}{self.cc[1]}"


# Carveout sizes (shared-memory part of the unified L1/shared array) the hardware supports.
# Guide, "Shared Memory" sections per architecture; the header's align-up table is the same list.
_CARVEOUTS_GA100_GH100 = (0, 8 * KIB, 16 * KIB, 32 * KIB, 64 * KIB, 100 * KIB, 132 * KIB, 164 * KIB)
_CARVEOUTS_HOPPER_BLACKWELL = _CARVEOUTS_GA100_GH100 + (196 * KIB, 228 * KIB)
_CARVEOUTS_GA10X_AD10X = (0, 8 * KIB, 16 * KIB, 32 * KIB, 64 * KIB, 100 * KIB)
_CARVEOUTS_TURING = (32 * KIB, 64 * KIB)


def _limits(cc, *, max_threads_per_sm, max_blocks_per_sm, shared_kib_per_sm, optin_kib,
            carveouts, barriers_per_block_slot, virtual_resources=0, reserved=1 * KIB,
            smem_granularity=128) -> SMLimits:
    # Everything not passed is common to every architecture from Turing to Blackwell
    # (guide table: 1024 threads/block, 64 K registers per SM and per block, 255 regs/thread).
    return SMLimits(
        cc=cc,
        warp_size=32,
        max_threads_per_block=1024,
        max_threads_per_sm=max_threads_per_sm,
        max_blocks_per_sm=max_blocks_per_sm,
        registers_per_sm=64 * KIB,
        max_registers_per_block=64 * KIB,
        max_registers_per_thread=255,
        register_allocation_unit=256,
        sub_partitions=4,
        warp_allocation_granularity=4,
        shared_bytes_per_sm=shared_kib_per_sm * KIB,
        shared_bytes_per_block=48 * KIB,
        shared_bytes_per_block_optin=optin_kib * KIB,
        reserved_shared_bytes_per_block=reserved,
        shared_allocation_granularity=smem_granularity,
        carveout_bytes=carveouts,
        barriers_per_block_slot=barriers_per_block_slot,
        virtual_resources_per_sm=virtual_resources,
    )


SM_LIMITS: dict[tuple[int, int], SMLimits] = {
    # Turing (T4). Not in the brief's list but the T4 spec below needs it; no reserved shared
    # memory before Ampere, 256-byte shared allocation granularity.
    (7, 5): _limits((7, 5), max_threads_per_sm=1024, max_blocks_per_sm=16, shared_kib_per_sm=64,
                    optin_kib=64, carveouts=_CARVEOUTS_TURING, barriers_per_block_slot=2,
                    reserved=0, smem_granularity=256),
    # GA100 (A100).
    (8, 0): _limits((8, 0), max_threads_per_sm=2048, max_blocks_per_sm=32, shared_kib_per_sm=164,
                    optin_kib=163, carveouts=_CARVEOUTS_GA100_GH100, barriers_per_block_slot=2),
    # GA10x (RTX 30, A10, A40).
    (8, 6): _limits((8, 6), max_threads_per_sm=1536, max_blocks_per_sm=16, shared_kib_per_sm=100,
                    optin_kib=99, carveouts=_CARVEOUTS_GA10X_AD10X, barriers_per_block_slot=1),
    # AD10x (L4, L40, RTX 40).
    (8, 9): _limits((8, 9), max_threads_per_sm=1536, max_blocks_per_sm=24, shared_kib_per_sm=100,
                    optin_kib=99, carveouts=_CARVEOUTS_GA10X_AD10X, barriers_per_block_slot=1),
    # GH100 (H100, H200).
    (9, 0): _limits((9, 0), max_threads_per_sm=2048, max_blocks_per_sm=32, shared_kib_per_sm=228,
                    optin_kib=227, carveouts=_CARVEOUTS_HOPPER_BLACKWELL, barriers_per_block_slot=2),
    # GB100 (B200). The header counts 128 "virtual resources" per SM from cc 10 on; kernels that
    # use none (everything Triton emits for these losses) are not limited by it.
    (10, 0): _limits((10, 0), max_threads_per_sm=2048, max_blocks_per_sm=32, shared_kib_per_sm=228,
                     optin_kib=227, carveouts=_CARVEOUTS_HOPPER_BLACKWELL,
                     barriers_per_block_slot=2, virtual_resources=128),
}


def sm_limits(cc) -> SMLimits:
    """The ``SMLimits`` of compute capability ``cc`` (a ``(major, minor)`` pair, "9.0" or 9.0)."""
    key = normalize_cc(cc)
    if key not in SM_LIMITS:
        known = ", ".join(f"{a}.{b}" for a, b in SM_LIMITS)
        raise ValueError(f"cc: no capacity table for compute capability {key[0]}.{key[1]}; "
                         f"known: {known}")
    return SM_LIMITS[key]


def normalize_cc(cc) -> tuple[int, int]:
    """Accept (9, 0), [9, 0], "9.0", "sm_90", 9.0 and return (9, 0)."""
    if isinstance(cc, (tuple, list)) and len(cc) == 2 and all(isinstance(v, int) for v in cc):
        return (int(cc[0]), int(cc[1]))
    if isinstance(cc, float):
        cc = f"{cc:.1f}"
    if isinstance(cc, str):
        text = cc.strip().lower()
        match = re.fullmatch(r"(\d+)\.(\d)", text) or re.fullmatch(r"sm_?(\d+?)(\d)a?", text)
        if match:
            return (int(match.group(1)), int(match.group(2)))
    raise ValueError(f"cc: expected a compute capability like (9, 0) or '9.0', got {cc!r}")


UNLIMITED = math.inf

# cudaOccCacheConfig: the legacy cache preference, only consulted when carveout == -1.
CACHE_CONFIGS = {"none": 0, "shared": 1, "l1": 2, "equal": 3}
_CARVEOUT_DEFAULT = -1
_CARVEOUT_MAX_SHARED = 100
_CARVEOUT_MAX_L1 = 0
_CARVEOUT_HALF = 50

LIMITER_NAMES = ("warps", "registers", "shared_memory", "blocks", "barriers", "virtual_resources")


@dataclass(frozen=True)
class Occupancy:
    """Result of one occupancy calculation (per SM)."""

    cc: tuple[int, int]
    threads_per_block: int
    registers_per_thread: int
    shared_bytes_per_block: int  # static + dynamic as requested (without the reserved 1 KiB)
    warps_per_block: int
    blocks_per_sm: int
    active_warps: int
    max_warps_per_sm: int
    occupancy: float  # active_warps / max_warps_per_sm
    limiters: frozenset[str]  # every limit equal to blocks_per_sm
    limits: dict[str, float] = field(compare=False)  # blocks/SM allowed by each resource
    allocated_registers_per_block: int = 0
    allocated_shared_bytes_per_block: int = 0  # incl. reserved, rounded to the granularity
    shared_bytes_per_sm: int = 0  # carveout the calculation settled on

    @property
    def limiter(self) -> str:
        """The limiters as one stable string ("registers", "registers+warps"), for CSV columns."""
        return "+".join(name for name in LIMITER_NAMES if name in self.limiters)

    @property
    def active_threads(self) -> int:
        return self.blocks_per_sm * self.threads_per_block


# ------------------------------------------------------------------------------------------
# Input checking
# ------------------------------------------------------------------------------------------

def _check_int(name: str, value, low: int, high: float = math.inf) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}: expected an integer, got {type(value).__name__} {value!r}")
    value = int(value)
    if not low <= value <= high:
        upper = "" if high == math.inf else f" and <= {high}"
        raise ValueError(f"{name}: expected an integer >= {low}{upper}, got {value}")
    return value


def _cache_config_code(cache_config) -> int:
    if isinstance(cache_config, str) and cache_config.lower() in CACHE_CONFIGS:
        return CACHE_CONFIGS[cache_config.lower()]
    if isinstance(cache_config, numbers.Integral) and not isinstance(cache_config, bool) \
            and int(cache_config) in CACHE_CONFIGS.values():
        return int(cache_config)
    raise ValueError(f"cache_config: expected one of {sorted(CACHE_CONFIGS)} (or 0-3), "
                     f"got {cache_config!r}")


# ------------------------------------------------------------------------------------------
# Per-resource limits, each a port of one header function
# ------------------------------------------------------------------------------------------

def _round_up(x: int, unit: int) -> int:
    return -(-x // unit) * unit


def align_up_carveout(size: int, limits: SMLimits) -> int:
    """Smallest supported carveout >= size (``cudaOccAlignUpShmemSizeVoltaPlus``)."""
    for carveout in limits.carveout_bytes:
        if size <= carveout:
            return carveout
    raise ValueError(f"size: {size} bytes exceeds the largest shared-memory carveout "
                     f"({limits.carveout_bytes[-1]} bytes) of {limits.name}")


def preferred_shared_bytes_per_sm(limits: SMLimits, carveout: int = -1,
                                  cache_config="none") -> int:
    """Shared memory per SM the user's preference asks for (``cudaOccSMemPreferenceVoltaPlus``).

    ``carveout`` is the percentage of the maximum (``cudaFuncAttributePreferredSharedMemoryCarveout``),
    -1 for no preference; with -1 the legacy ``cache_config`` decides; with neither, the
    header assumes the full shared memory per SM.
    """
    carveout = _check_int("carveout", carveout, _CARVEOUT_DEFAULT, _CARVEOUT_MAX_SHARED)
    cache_code = _cache_config_code(cache_config)
    preference = carveout
    if preference == _CARVEOUT_DEFAULT:
        preference = {CACHE_CONFIGS["l1"]: _CARVEOUT_MAX_L1,
                      CACHE_CONFIGS["shared"]: _CARVEOUT_MAX_SHARED,
                      CACHE_CONFIGS["equal"]: _CARVEOUT_HALF}.get(cache_code, _CARVEOUT_DEFAULT)
    if preference == _CARVEOUT_DEFAULT:
        size = limits.shared_bytes_per_sm
    else:
        size = preference * limits.shared_bytes_per_sm // 100  # integer division as in C
    return align_up_carveout(size, limits)


def shared_limit_per_block(limits: SMLimits, opt_in: bool, max_shared_usage: int) -> int:
    """Largest shared allocation one block may have (``cudaOccSMemPerBlock``).

    With the opt-in config the larger limit applies only when the kernel's maximum usage
    (static + reserved + maximum dynamic) exceeds the default 48 KiB. Since Ampere the
    driver's reserved bytes are added on top, because the allocation being checked includes them.
    """
    limit = limits.shared_bytes_per_block
    if opt_in and max_shared_usage > limits.shared_bytes_per_block:
        limit = limits.shared_bytes_per_block_optin
    if limits.cc[0] >= 8:
        limit += limits.reserved_shared_bytes_per_block
    return limit


def warps_limit(limits: SMLimits, threads_per_block: int) -> int:
    """Blocks per SM allowed by warp slots (``cudaOccMaxBlocksPerSMWarpsLimit``)."""
    if threads_per_block > limits.max_threads_per_block:
        return 0
    warps_per_block = -(-threads_per_block // limits.warp_size)
    return limits.max_warps_per_sm // warps_per_block


def registers_limit(limits: SMLimits, threads_per_block: int,
                    registers_per_thread: int) -> tuple[float, int]:
    """Blocks per SM allowed by the register file (``cudaOccMaxBlocksPerSMRegsLimit``).

    Returns (block limit, registers allocated per block).
    """
    warps_per_block = -(-threads_per_block // limits.warp_size)
    regs_per_warp = _round_up(registers_per_thread * limits.warp_size,
                              limits.register_allocation_unit)
    regs_per_block = regs_per_warp * warps_per_block
    # The hardware's launch check assumes the block's warps are spread over all sub-partitions,
    # i.e. rounds the warp count up to a multiple of the sub-partition count.
    regs_assumed_per_block = regs_per_warp * _round_up(warps_per_block, limits.sub_partitions)
    # The header's per-thread bound is 256 from Volta on; we reject > 255 earlier, so this check
    # only matters for a hand-built SMLimits.
    header_max_regs_per_thread = 256
    if (limits.max_registers_per_block < regs_assumed_per_block
            or limits.max_registers_per_block < regs_per_block
            or registers_per_thread > header_max_regs_per_thread):
        return 0, regs_per_block
    if regs_per_warp == 0:
        return UNLIMITED, regs_per_block
    # Registers live in the sub-partitions: whole warps per quadrant, times the quadrants.
    regs_per_sub_partition = limits.registers_per_sm // limits.sub_partitions
    warps_per_sub_partition = regs_per_sub_partition // regs_per_warp
    return warps_per_sub_partition * limits.sub_partitions // warps_per_block, regs_per_block


def shared_memory_limit(limits: SMLimits, *, static_shared_bytes: int, dynamic_shared_bytes: int,
                        opt_in: bool, max_dynamic_shared_bytes: int, carveout: int = -1,
                        cache_config="none") -> tuple[float, int, int]:
    """Blocks per SM allowed by shared memory (``cudaOccMaxBlocksPerSMSmemLimit``).

    Returns (block limit, bytes allocated per block, shared bytes per SM used).
    """
    preference = preferred_shared_bytes_per_sm(limits, carveout, cache_config)
    static_total = static_shared_bytes + limits.reserved_shared_bytes_per_block
    allocated = _round_up(static_total + dynamic_shared_bytes, limits.shared_allocation_granularity)
    max_usage = static_total + max_dynamic_shared_bytes

    # An opted-in kernel must not launch with more dynamic memory than its attribute allows.
    dynamic_exceeded = opt_in and dynamic_shared_bytes > max_dynamic_shared_bytes
    total_exceeded = allocated > shared_limit_per_block(limits, opt_in, max_usage)
    if dynamic_exceeded or total_exceeded:
        return 0, allocated, preference

    # The preference is honoured when at least one block fits in it; otherwise the driver picks
    # the smallest carveout that holds one block.
    if preference >= allocated:
        per_sm = preference
    else:
        per_sm = align_up_carveout(allocated, limits)
    if allocated == 0:
        return UNLIMITED, allocated, per_sm
    return per_sm // allocated, allocated, per_sm


def barriers_limit(limits: SMLimits, blocks_limit: int, block_barriers: int) -> float:
    """Blocks per SM allowed by named-barrier slots (``cudaOccMaxBlocksPerSMBlockBarrierLimit``).

    The header applies it from Hopper on; every CUDA block uses one barrier (``bar.sync 0``).
    """
    if limits.cc[0] < 9 or block_barriers <= 0:
        return UNLIMITED
    return limits.barriers_per_block_slot * blocks_limit // block_barriers


def virtual_resources_limit(limits: SMLimits, virtual_resources: int) -> float:
    """Blocks per SM allowed by virtual resources (``cudaOccMaxBlocksPerSMVirtualResource``)."""
    if limits.virtual_resources_per_sm <= 0 or virtual_resources <= 0:
        return UNLIMITED
    return limits.virtual_resources_per_sm // virtual_resources


# ------------------------------------------------------------------------------------------
# Public API
# ------------------------------------------------------------------------------------------

def occupancy(cc=(9, 0), *, threads_per_block: int, registers_per_thread: int,
              dynamic_shared_bytes: int = 0, static_shared_bytes: int = 0, opt_in: bool = False,
              carveout: int = -1, cache_config="none", max_dynamic_shared_bytes: int | None = None,
              block_barriers: int = 1, virtual_resources: int = 0) -> Occupancy:
    """Theoretical occupancy of one kernel launch configuration on compute capability ``cc``.

    Args:
        cc: compute capability, ``(9, 0)`` or ``"9.0"``.
        threads_per_block: 1 - 1024 (Triton: ``num_warps * 32``).
        registers_per_thread: 0 - 255, as reported by ptxas / ``CompiledKernel.n_regs``.
        dynamic_shared_bytes, static_shared_bytes: per block, without the driver's reserved bytes.
        opt_in: the kernel raised its dynamic shared-memory limit above 48 KiB
            (``cudaFuncAttributeMaxDynamicSharedMemorySize``). Without it a block needing more than
            48 KiB cannot launch and ``blocks_per_sm`` is 0 with limiter ``"shared_memory"``.
        carveout: preferred shared-memory carveout in percent, -1 = no preference.
        cache_config: legacy preference ("none", "shared", "l1", "equal"), used when carveout is -1.
        max_dynamic_shared_bytes: the opt-in attribute value; default, like Triton,
            ``shared_bytes_per_block_optin - static_shared_bytes`` (opt-in) or the 48 KiB default.
        block_barriers: barriers per block (1 for every ordinary kernel, as the runtime reports).
        virtual_resources: virtual resources per block (cc >= 10; 0 for ordinary kernels).
    """
    limits = sm_limits(cc)
    threads = _check_int("threads_per_block", threads_per_block, 1, limits.max_threads_per_block)
    regs = _check_int("registers_per_thread", registers_per_thread, 0,
                      limits.max_registers_per_thread)
    dynamic = _check_int("dynamic_shared_bytes", dynamic_shared_bytes, 0)
    static = _check_int("static_shared_bytes", static_shared_bytes, 0)
    if not isinstance(opt_in, bool):
        raise TypeError(f"opt_in: expected a bool, got {type(opt_in).__name__}")
    barriers = _check_int("block_barriers", block_barriers, 0)
    virtual = _check_int("virtual_resources", virtual_resources, 0)
    if max_dynamic_shared_bytes is None:
        cap = limits.shared_bytes_per_block_optin if opt_in else limits.shared_bytes_per_block
        max_dynamic = max(0, cap - static)
    else:
        max_dynamic = _check_int("max_dynamic_shared_bytes", max_dynamic_shared_bytes, 0)

    limit_regs, regs_allocated = registers_limit(limits, threads, regs)
    limit_warps = warps_limit(limits, threads)
    limit_blocks = limits.max_blocks_per_sm
    limit_smem, smem_allocated, smem_per_sm = shared_memory_limit(
        limits, static_shared_bytes=static, dynamic_shared_bytes=dynamic, opt_in=opt_in,
        max_dynamic_shared_bytes=max_dynamic, carveout=carveout, cache_config=cache_config)
    limit_virtual = virtual_resources_limit(limits, virtual)
    blocks = min(limit_regs, limit_smem, limit_warps, limit_blocks, limit_virtual)
    limit_barriers = barriers_limit(limits, limit_blocks, barriers)
    blocks = int(min(blocks, limit_barriers))

    per_limit = {
        "warps": limit_warps,
        "registers": limit_regs,
        "shared_memory": limit_smem,
        "blocks": limit_blocks,
        "barriers": limit_barriers,
        "virtual_resources": limit_virtual,
    }
    # The header also flags every limit equal to the minimum. (It computes those flags before
    # folding in the barrier limit; the two differ only if barriers alone lower the minimum,
    # which needs 3+ barriers per block: here the flags describe the final minimum.)
    limiters = frozenset(name for name, value in per_limit.items() if value == blocks)
    warps_per_block = -(-threads // limits.warp_size)
    active_warps = blocks * warps_per_block
    return Occupancy(
        cc=limits.cc,
        threads_per_block=threads,
        registers_per_thread=regs,
        shared_bytes_per_block=static + dynamic,
        warps_per_block=warps_per_block,
        blocks_per_sm=blocks,
        active_warps=active_warps,
        max_warps_per_sm=limits.max_warps_per_sm,
        occupancy=active_warps / limits.max_warps_per_sm,
        limiters=limiters,
        limits=per_limit,
        allocated_registers_per_block=regs_allocated,
        allocated_shared_bytes_per_block=smem_allocated,
        shared_bytes_per_sm=smem_per_sm,
    )


# Triton launches every kernel with all of its shared memory as *dynamic* shared memory and, when
# it needs more than 48 KiB, opts in (cuFuncSetAttribute MAX_DYNAMIC_SHARED_SIZE_BYTES =
# optin - static) and sets CU_FUNC_CACHE_PREFER_SHARED (triton/backends/nvidia/driver.c).
TRITON_OPT_IN_THRESHOLD = 48 * 1024


def occupancy_of_counts(n_regs: int, shared_bytes: int, num_warps: int, cc=(9, 0)) -> Occupancy:
    """Occupancy of a Triton kernel from its register count, shared bytes and ``num_warps``."""
    limits = sm_limits(cc)
    n_regs = _check_int("n_regs", n_regs, 0, limits.max_registers_per_thread)
    num_warps = _check_int("num_warps", num_warps, 1,
                           limits.max_threads_per_block // limits.warp_size)
    shared_bytes = _check_int("shared_bytes", shared_bytes, 0)
    opt_in = shared_bytes > TRITON_OPT_IN_THRESHOLD and \
        limits.shared_bytes_per_block_optin > TRITON_OPT_IN_THRESHOLD
    return occupancy(cc, threads_per_block=num_warps * limits.warp_size,
                     registers_per_thread=n_regs, dynamic_shared_bytes=shared_bytes,
                     opt_in=opt_in, cache_config="shared" if opt_in else "none")


def kernel_counts(kernel) -> tuple[int, int, int, tuple[int, int] | None]:
    """(n_regs, shared bytes, num_warps, target cc or None) read defensively from a CompiledKernel."""
    n_regs = getattr(kernel, "n_regs", None)
    if n_regs is None:
        # Triton loads the binary (and learns n_regs from the driver) lazily; the public `run`
        # attribute triggers the load. That needs a GPU.
        try:
            getattr(kernel, "run")
        except Exception as exc:  # noqa: BLE001 - surface any loader failure as bad input
            raise ValueError(f"kernel: register count unavailable ({exc}); pass a Triton "
                             "CompiledKernel that was launched on a GPU") from exc
        n_regs = getattr(kernel, "n_regs", None)
    metadata = getattr(kernel, "metadata", None)
    shared = getattr(metadata, "shared", getattr(kernel, "shared", None))
    num_warps = getattr(metadata, "num_warps", getattr(kernel, "num_warps", None))
    if n_regs is None or shared is None or num_warps is None:
        raise ValueError("kernel: expected a Triton CompiledKernel with n_regs, metadata.shared "
                         f"and metadata.num_warps; got {type(kernel).__name__}")
    target_cc = None
    arch = getattr(getattr(metadata, "target", None), "arch", None)
    if isinstance(arch, int) and arch >= 70:  # CUDA targets store e.g. 90 for sm_90
        target_cc = (arch // 10, arch % 10)
    return int(n_regs), int(shared), int(num_warps), target_cc


def occupancy_of_compiled(kernel, cc=None) -> Occupancy:
    """Occupancy of a Triton ``CompiledKernel`` (what ``kernel[grid](...)`` returns).

    ``cc`` defaults to the kernel's compile target, else (9, 0).
    """
    n_regs, shared, num_warps, target_cc = kernel_counts(kernel)
    return occupancy_of_counts(n_regs, shared, num_warps, cc or target_cc or (9, 0))


def register_caps_for_more_blocks(n_regs: int, shared_bytes: int, num_warps: int, cc=(9, 0), *,
                                  steps: int = 2) -> list[tuple[int, int]]:
    """``(cap, blocks_per_sm)`` for the next ``steps`` occupancy levels a register cap (``maxnreg``) could reach:
    the largest registers per thread at which one, two, ... more blocks of the kernel fit on an SM. Empty when
    registers do not limit it. ptxas's own count is not always the least it needs: the lagged split_row kernel
    took 128 registers with 13 chunks a row and 80 with 16 (same code, sm_90), so a cap can buy programs free.
    Whether it spills is only known by compiling it."""
    current = occupancy_of_counts(n_regs, shared_bytes, num_warps, cc)
    if "registers" not in current.limiters:
        return []
    caps = []
    blocks = current.blocks_per_sm
    for cap in range(_round_up(n_regs, 8) - 8, 23, -8):
        occ = occupancy_of_counts(cap, shared_bytes, num_warps, cc)
        if occ.blocks_per_sm > blocks:
            caps.append((cap, occ.blocks_per_sm))
            blocks = occ.blocks_per_sm
            if len(caps) == steps or "registers" not in occ.limiters:
                break
    return caps


def register_cap_for_fewer_blocks(n_regs: int, shared_bytes: int, num_warps: int, cc=(9, 0), *,
                                  min_blocks: int = 2) -> tuple[int, int] | None:
    """``(cap, blocks_per_sm)``: the most registers per thread a cap can give the kernel while one block fewer fits on
    an SM, or None (registers do not limit it, no cap above its count changes the occupancy, or fewer than
    ``min_blocks`` would fit). ptxas without a cap does not always take the registers the occupancy it reaches
    allows: with the fast math the lagged reverse-KL kernel took 96 registers (5 blocks of 4 warps), and under a
    128-register cap 127, running faster (4096 x 32000, ``data/h100-sxm-80gb/logs/explore_fast_2026-11-26.txt``)."""
    limits = sm_limits(cc)
    current = occupancy_of_counts(n_regs, shared_bytes, num_warps, cc)
    if "registers" not in current.limiters or current.blocks_per_sm - 1 < max(1, min_blocks):
        return None
    own = _round_up(n_regs, 8)
    for cap in range(limits.max_registers_per_thread // 8 * 8, own, -8):
        occ = occupancy_of_counts(cap, shared_bytes, num_warps, cc)
        if occ.blocks_per_sm >= current.blocks_per_sm - 1:
            return cap, occ.blocks_per_sm
    return None


def register_caps_of_compiled(kernel, cc=None, *, steps: int = 2, fewer: bool = False) -> list[tuple[int, int]]:
    """:func:`register_caps_for_more_blocks` of a launched Triton ``CompiledKernel``; with ``fewer``, followed by its
    :func:`register_cap_for_fewer_blocks` when there is one."""
    n_regs, shared, num_warps, target_cc = kernel_counts(kernel)
    cc = cc or target_cc or (9, 0)
    caps = register_caps_for_more_blocks(n_regs, shared, num_warps, cc, steps=steps)
    below = register_cap_for_fewer_blocks(n_regs, shared, num_warps, cc) if fewer else None
    return caps + ([below] if below is not None else [])


def max_coresident_programs(n_regs: int, shared_bytes: int, num_warps: int, sm_count: int,
                            cc=(9, 0)) -> int:
    """How many programs of a Triton kernel can be resident at once: blocks/SM x SM count.

    A persistent kernel sized with this never has a program waiting for another to finish.
    Raises ValueError when not even one block fits on an SM (the launch would fail).
    """
    sm_count = _check_int("sm_count", sm_count, 1)
    occ = occupancy_of_counts(n_regs, shared_bytes, num_warps, cc)
    if occ.blocks_per_sm == 0:
        raise ValueError(f"n_regs/shared_bytes/num_warps: a block with {n_regs} registers/thread, "
                         f"{shared_bytes} shared bytes and {num_warps} warps cannot launch on "
                         f"sm_{occ.cc[0]}{occ.cc[1]} (limited by {occ.limiter})")
    return occ.blocks_per_sm * sm_count
