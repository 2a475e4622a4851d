"""Device capacity tables (per compute capability) and datasheet specs (per GPU model).

Two different kinds of facts live here:

* ``SMLimits`` — the per-SM resource limits NVIDIA's occupancy calculator needs, one entry per
  compute capability. Sources: CUDA C++ Programming Guide, "Features and Technical
  Specifications", table "Technical Specifications per Compute Capability"; and the values the
  occupancy header hard-codes per architecture (``/usr/local/cuda/include/cuda_occupancy.h``:
  ``cudaOccSMemAllocationGranularity``, ``cudaOccRegAllocationGranularity``,
  ``cudaOccSubPartitionsPerMultiprocessor``, ``cudaOccMaxBlocksPerMultiprocessor``,
  ``cudaOccAlignUpShmemSizeVoltaPlus``, ``cudaOccMaxBlocksPerSMBlockBarrierLimit``,
  ``cudaOccMaxVirtualResourceCountPerSM``). The byte counts match what
  ``cudaGetDeviceProperties`` reports (e.g. H100: sharedMemPerMultiprocessor = 233472 = 228 KiB,
  sharedMemPerBlockOptin = 232448 = 227 KiB, reservedSharedMemPerBlock = 1024).

* ``DeviceSpec`` — marketing/datasheet numbers for a GPU model (SM count, L2, DRAM bandwidth,
  FP32 rate, clocks). Sources are cited next to each entry. Datasheet bandwidth is a peak that a
  real copy never reaches; the project reports % of *measured* copy bandwidth (see
  ``perfutils.measure.ceilings``) and uses these numbers only as a fallback and for context.

* :func:`check_num_warps` — the warps a block may have (a power of two, at most 1024 threads).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

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


# --------------------------------------------------------------------------------------------
# Datasheet specs
# --------------------------------------------------------------------------------------------

# Special-function-unit throughput (MUFU: exp2, log2, rcp, rsqrt, sin, cos) in results per clock
# per SM. CUDA C++ Programming Guide, "Arithmetic Instructions" throughput table: 16 for cc 7.5,
# 8.x and 9.0. The cc 10.0 column of the table gives the same 16 as far as I could check.
MUFU_OPS_PER_SM_PER_CLK = 16


@dataclass(frozen=True)
class DeviceSpec:
    """Datasheet numbers of one GPU model (peaks, not achievable rates)."""

    name: str
    cc: tuple[int, int]
    sm_count: int
    l2_bytes: int
    dram_gbps: float  # peak DRAM bandwidth, GB/s (1e9 bytes/s)
    fp32_tflops: float  # non-tensor FP32 (FMA = 2 flops), dense
    boost_clock_mhz: float
    sfu_ops_per_sm_per_clk: int | None = MUFU_OPS_PER_SM_PER_CLK
    source: str = ""

    @property
    def exp2_tops(self) -> float | None:
        """Peak transcendental rate (1e12 MUFU results/s) at boost clock, or None if unknown."""
        if self.sfu_ops_per_sm_per_clk is None:
            return None
        return self.sfu_ops_per_sm_per_clk * self.sm_count * self.boost_clock_mhz * 1e6 / 1e12

    @property
    def limits(self) -> SMLimits:
        return sm_limits(self.cc)


# The FP32 numbers cross-check as SMs x FP32 lanes/SM x 2 x boost clock
# (H100/H200: 128 lanes, A100: 64, L4: 128, T4: 64, B200: 128).
DEVICE_SPECS: dict[str, DeviceSpec] = {
    spec.name: spec
    for spec in (
        # NVIDIA H100 Tensor Core GPU datasheet (SXM5 80 GB): 3.35 TB/s, 67 TFLOPS FP32;
        # 132 SMs and 50 MB L2 from the Hopper architecture whitepaper; boost 1980 MHz.
        DeviceSpec("H100 SXM", (9, 0), 132, 50 * MIB, 3350.0, 67.0, 1980.0,
                   source="NVIDIA H100 datasheet; Hopper whitepaper"),
        # Same datasheet, PCIe 80 GB: 2 TB/s, 51 TFLOPS FP32; 114 SMs; boost 1755 MHz.
        DeviceSpec("H100 PCIe", (9, 0), 114, 50 * MIB, 2000.0, 51.0, 1755.0,
                   source="NVIDIA H100 datasheet; Hopper whitepaper"),
        # NVIDIA H200 datasheet (SXM): 4.8 TB/s HBM3e, 67 TFLOPS FP32; same GH100 die as H100 SXM.
        DeviceSpec("H200", (9, 0), 132, 50 * MIB, 4800.0, 67.0, 1980.0,
                   source="NVIDIA H200 datasheet"),
        # NVIDIA A100 datasheet (SXM 80 GB): 2039 GB/s, 19.5 TFLOPS FP32; 108 SMs, 40 MB L2
        # (Ampere whitepaper); boost 1410 MHz.
        DeviceSpec("A100 SXM 80GB", (8, 0), 108, 40 * MIB, 2039.0, 19.5, 1410.0,
                   source="NVIDIA A100 datasheet; Ampere whitepaper"),
        # NVIDIA L4 datasheet: 300 GB/s GDDR6, 30.3 TFLOPS FP32; 58 SMs, 48 MB L2; boost 2040 MHz.
        DeviceSpec("L4", (8, 9), 58, 48 * MIB, 300.0, 30.3, 2040.0,
                   source="NVIDIA L4 datasheet; Ada whitepaper"),
        # NVIDIA T4 datasheet: 320 GB/s GDDR6, 8.1 TFLOPS FP32; 40 SMs, 4 MB L2; boost 1590 MHz.
        DeviceSpec("T4", (7, 5), 40, 4 * MIB, 320.0, 8.1, 1590.0,
                   source="NVIDIA T4 datasheet; Turing whitepaper"),
        # B200 (HGX/DGX B200 spec pages: 8 TB/s HBM3e per GPU). The per-GPU FP32 rate, clock and
        # L2 size are less firmly documented: 148 SMs x 128 lanes x 2 x 1.98 GHz = 75 TFLOPS;
        # 126 MiB L2 is what cudaGetDeviceProperties reports. Treat as approximate.
        DeviceSpec("B200", (10, 0), 148, 126 * MIB, 8000.0, 75.0, 1980.0,
                   source="NVIDIA HGX B200 spec page (bandwidth); FP32/clock/L2 approximate"),
    )
}

# (pattern over a normalized device string, spec name). Order matters: the more specific
# patterns (PCIe, NVL) come before the generic ones.
_NAME_RULES: tuple[tuple[str, str], ...] = (
    (r"\bh100\b.*\bpcie\b", "H100 PCIe"),
    (r"\bh100\b.*\b(sxm|sxm5|hbm3)\b", "H100 SXM"),
    (r"^h100$|^h100 80gb$", "H100 SXM"),
    (r"\bh200\b(?!.*\bnvl\b)", "H200"),
    (r"\ba100\b.*\bsxm4?\b.*\b80gb\b|^a100 sxm 80gb$", "A100 SXM 80GB"),
    (r"^l4$", "L4"),
    (r"^t4$", "T4"),
    (r"\bb200\b", "B200"),
)


def _normalize_device_name(name: str) -> str:
    text = name.lower().replace("-", " ").replace("_", " ")
    text = re.sub(r"\b(nvidia|tesla|geforce)\b", " ", text)
    return re.sub(r"\s+", " ", text).strip()


def lookup_device(name: str) -> DeviceSpec:
    """Datasheet spec for a device string from ``torch.cuda.get_device_name()`` or a spec name.

    ``"NVIDIA H100 80GB HBM3"`` -> H100 SXM, ``"NVIDIA H100 PCIe"`` -> H100 PCIe,
    ``"NVIDIA A100-SXM4-80GB"`` -> A100 SXM 80GB, ``"Tesla T4"`` -> T4, ``"NVIDIA L4"`` -> L4.
    Unknown or ambiguous names (an A100 40GB, an H100 NVL) raise ValueError rather than
    silently getting another model's numbers.
    """
    if not isinstance(name, str):
        raise TypeError(f"name: expected a device name string, got {type(name).__name__}")
    if name in DEVICE_SPECS:
        return DEVICE_SPECS[name]
    text = _normalize_device_name(name)
    for pattern, spec_name in _NAME_RULES:
        if re.search(pattern, text):
            return DEVICE_SPECS[spec_name]
    raise ValueError(f"name: no datasheet spec matches device {name!r}; known models: "
                     f"{', '.join(DEVICE_SPECS)}")


def check_num_warps(num_warps, name: str = "num_warps") -> int:
    """``num_warps`` if it is a block's warp count: an int power of two in [1, 32] (at most 1024 threads)."""
    if not isinstance(num_warps, int) or isinstance(num_warps, bool):
        raise TypeError(f"{name} must be an int, got {type(num_warps).__name__}")
    if num_warps < 1 or num_warps > 32 or num_warps & (num_warps - 1):
        raise ValueError(f"{name} must be a power of two in [1, 32] (at most 1024 threads a block), got {num_warps}")
    return num_warps
