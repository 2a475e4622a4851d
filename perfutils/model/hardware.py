"""Device capacity tables (per compute capability) and datasheet specs (per GPU model).

Two different kinds of facts live here:

* ``SMLimits`` — the per-SM resource limits NVIDIA's occupancy calculator needs, one entry per
  compute capability: they live with the calculator in :mod:`kernels.occupancy` (the product sizes its grids
  with them) and are re-exported here.

* ``DeviceSpec`` — marketing/datasheet numbers for a GPU model (SM count, L2, DRAM bandwidth,
  FP32 rate, clocks). Sources are cited next to each entry. Datasheet bandwidth is a peak that a
  real copy never reaches; the project reports % of *measured* copy bandwidth (see
  ``perfutils.studies.ceilings``) and uses these numbers only as a fallback and for context.

* :func:`check_num_warps` — the warps a block may have (a power of two, at most 1024 threads).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kernels.occupancy import MIB, SM_LIMITS, SMLimits, normalize_cc, sm_limits  # noqa: F401 - re-exported

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
