"""The occupancy port against NVIDIA's own header, plus hand-checked cases.

The header check compiles a tiny driver around ``cuda_occupancy.h`` (it is plain C/C++, no CUDA
compiler needed), feeds it every random configuration through stdin in one run, and compares
blocks per SM, each per-resource limit, the limiting-factor bitmask and the allocated registers /
shared bytes with the Python port.
"""

from __future__ import annotations

import glob
import math
import os
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from perfutils.model import occupancy as occ_mod
from perfutils.model.hardware import SM_LIMITS, sm_limits
from perfutils.model.occupancy import (
    max_coresident_programs,
    occupancy,
    occupancy_curves,
    occupancy_of_compiled,
    occupancy_of_counts,
)

KIB = 1024
INT_MAX = 2**31 - 1
CONFIGS_PER_CC = 12_000
HEADER_CCS = [(8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (7, 5)]

# cudaOccLimitingFactor bits
_FLAG_NAMES = {0x01: "warps", 0x02: "registers", 0x04: "shared_memory", 0x08: "blocks",
               0x10: "barriers", 0x20: "virtual_resources"}

_DRIVER_SOURCE = r"""
#include <stdio.h>
#include <string.h>
#include "cuda_occupancy.h"

/* One configuration per input line (device properties, then function attributes and state);
   one result line per configuration. Valid C and C++. */
int main(void) {
    int major, minor, maxTPB, maxTPSM, regsPerBlock, regsPerSM, warpSize, numSms;
    long long smemPerBlock, smemPerSM, optin, reserved, staticSmem, dyn, maxDyn;
    int threads, regs, optinCfg, carveout, cacheCfg, barriers, virt;
    while (scanf("%d %d %d %d %d %d %d %lld %lld %d %lld %lld %d %d %lld %lld %d %lld %d %d %d %d",
                 &major, &minor, &maxTPB, &maxTPSM, &regsPerBlock, &regsPerSM, &warpSize,
                 &smemPerBlock, &smemPerSM, &numSms, &optin, &reserved,
                 &threads, &regs, &staticSmem, &dyn, &optinCfg, &maxDyn, &carveout, &cacheCfg,
                 &barriers, &virt) == 22) {
        cudaOccDeviceProp p;
        cudaOccFuncAttributes a;
        cudaOccDeviceState s;
        cudaOccResult r;
        int err;
        p.computeMajor = major; p.computeMinor = minor;
        p.maxThreadsPerBlock = maxTPB; p.maxThreadsPerMultiprocessor = maxTPSM;
        p.regsPerBlock = regsPerBlock; p.regsPerMultiprocessor = regsPerSM; p.warpSize = warpSize;
        p.sharedMemPerBlock = (size_t)smemPerBlock; p.sharedMemPerMultiprocessor = (size_t)smemPerSM;
        p.numSms = numSms; p.sharedMemPerBlockOptin = (size_t)optin;
        p.reservedSharedMemPerBlock = (size_t)reserved;
        a.maxThreadsPerBlock = maxTPB; a.numRegs = regs; a.sharedSizeBytes = (size_t)staticSmem;
        a.partitionedGCConfig = PARTITIONED_GC_OFF;
        a.shmemLimitConfig = optinCfg ? FUNC_SHMEM_LIMIT_OPTIN : FUNC_SHMEM_LIMIT_DEFAULT;
        a.maxDynamicSharedSizeBytes = (size_t)maxDyn;
        a.numBlockBarriers = barriers; a.virtualResourceCount = virt;
        s.cacheConfig = (cudaOccCacheConfig)cacheCfg; s.carveoutConfig = carveout;
        memset(&r, 0, sizeof(r));
        err = (int)cudaOccMaxActiveBlocksPerMultiprocessor(&r, &p, &a, &s, threads, (size_t)dyn);
        printf("%d %d %u %d %d %d %d %d %d %d %lld\n", err, r.activeBlocksPerMultiprocessor,
               r.limitingFactors, r.blockLimitRegs, r.blockLimitSharedMem, r.blockLimitWarps,
               r.blockLimitBlocks, r.blockLimitBarriers, r.blockLimitVirtual,
               r.allocatedRegistersPerBlock, (long long)r.allocatedSharedMemPerBlock);
    }
    return 0;
}
"""


def _find_header() -> Path | None:
    roots = [os.environ.get(var) for var in ("CUDA_HOME", "CUDA_PATH", "CUDA_ROOT")]
    roots += ["/usr/local/cuda"] + sorted(glob.glob("/usr/local/cuda*"), reverse=True)
    roots += ["/opt/cuda", "/usr"]
    for root in roots:
        if root and (Path(root) / "include" / "cuda_occupancy.h").is_file():
            return Path(root) / "include" / "cuda_occupancy.h"
    return None


def _find_compiler() -> tuple[str, str] | None:
    # The driver is valid C and C++; prefer C++ since the header's C++ parts are its main use.
    for name, suffix in (("g++", ".cpp"), ("c++", ".cpp"), ("clang++", ".cpp"),
                         ("gcc", ".c"), ("cc", ".c"), ("clang", ".c")):
        path = shutil.which(name)
        if path:
            return path, suffix
    return None


@pytest.fixture(scope="module")
def header_driver(tmp_path_factory):
    header = _find_header()
    if header is None:
        pytest.skip("cuda_occupancy.h not found (looked in $CUDA_HOME, $CUDA_PATH, "
                    "/usr/local/cuda*/include, /opt/cuda/include, /usr/include)")
    compiler = _find_compiler()
    if compiler is None:
        pytest.skip("no C or C++ compiler (g++, c++, clang++, gcc, cc, clang) on PATH")
    cxx, suffix = compiler
    workdir = tmp_path_factory.mktemp("occ_driver")
    source = workdir / f"driver{suffix}"
    source.write_text(_DRIVER_SOURCE)
    binary = workdir / "driver"
    subprocess.run([cxx, "-O1", "-I", str(header.parent), str(source), "-o", str(binary)],
                   check=True, capture_output=True, text=True, timeout=60)

    def run(lines: list[str]) -> list[list[int]]:
        done = subprocess.run([str(binary)], input="\n".join(lines) + "\n", check=True,
                              capture_output=True, text=True, timeout=60)
        return [[int(v) for v in line.split()] for line in done.stdout.splitlines()]

    return run


def _random_configs(cc, rng: np.random.Generator, n: int) -> list[dict]:
    """Configurations biased towards the edges: warp multiples, typical register counts,
    shared sizes around 48 KiB and around the opt-in maximum (drawn vectorized, for speed)."""
    optin = sm_limits(cc).shared_bytes_per_block_optin

    def either(p_first, first, second):
        return np.where(rng.random(n) < p_first, first, second)

    threads = either(0.5, rng.integers(1, 33, n) * 32, rng.integers(1, 1025, n))
    typical_regs = np.array([0, 16, 24, 32, 33, 40, 48, 64, 65, 72, 96, 128, 168, 255])
    regs = either(0.5, rng.integers(0, 256, n), rng.choice(typical_regs, n))
    static = either(0.8, 0, rng.integers(0, 48 * KIB + 1, n))
    kind = rng.random(n)
    dynamic = np.select([kind < 0.25, kind < 0.6, kind < 0.8],
                        [0, rng.integers(0, 64 * KIB, n), rng.integers(40 * KIB, 56 * KIB, n)],
                        rng.integers(0, optin + 4 * KIB, n))
    opt_in = rng.random(n) < 0.5
    explicit_max = rng.random(n) >= 0.8
    max_dynamic = rng.integers(0, optin + 1, n)
    carveout = either(0.6, -1, rng.integers(0, 101, n))
    cache = rng.integers(0, 4, n)
    barriers = rng.choice([0, 1, 1, 1, 2], n)
    virtual = either(0.8, 0, rng.integers(1, 200, n))
    return [dict(threads_per_block=int(threads[i]), registers_per_thread=int(regs[i]),
                 static_shared_bytes=int(static[i]), dynamic_shared_bytes=int(dynamic[i]),
                 opt_in=bool(opt_in[i]),
                 max_dynamic_shared_bytes=int(max_dynamic[i]) if explicit_max[i] else None,
                 carveout=int(carveout[i]), cache_config=int(cache[i]),
                 block_barriers=int(barriers[i]), virtual_resources=int(virtual[i]))
            for i in range(n)]


def _driver_line(cc, config: dict) -> str:
    """cudaOccDeviceProp filled from our tables, then the function attributes and state."""
    lim = sm_limits(cc)
    if config["max_dynamic_shared_bytes"] is None:
        cap = lim.shared_bytes_per_block_optin if config["opt_in"] else lim.shared_bytes_per_block
        max_dynamic = max(0, cap - config["static_shared_bytes"])
    else:
        max_dynamic = config["max_dynamic_shared_bytes"]
    values = [cc[0], cc[1], lim.max_threads_per_block, lim.max_threads_per_sm,
              lim.max_registers_per_block, lim.registers_per_sm, lim.warp_size,
              lim.shared_bytes_per_block, lim.shared_bytes_per_sm, 132,
              lim.shared_bytes_per_block_optin, lim.reserved_shared_bytes_per_block,
              config["threads_per_block"], config["registers_per_thread"],
              config["static_shared_bytes"], config["dynamic_shared_bytes"],
              int(config["opt_in"]), max_dynamic, config["carveout"], config["cache_config"],
              config["block_barriers"], config["virtual_resources"]]
    return " ".join(str(v) for v in values)


def _from_c(value: int) -> float:
    return math.inf if value == INT_MAX else value


@pytest.fixture(scope="module")
def header_comparison(header_driver):
    """All configurations of all compute capabilities through one driver run."""
    rng = np.random.default_rng(20240611)
    cases = [(cc, config) for cc in HEADER_CCS for config in _random_configs(cc, rng, CONFIGS_PER_CC)]
    results = header_driver([_driver_line(cc, config) for cc, config in cases])
    assert len(results) == len(cases)
    return cases, results


@pytest.mark.parametrize("cc", HEADER_CCS, ids=lambda cc: f"sm_{cc[0]}{cc[1]}")
def test_matches_cuda_occupancy_header(header_comparison, cc):
    cases, results = header_comparison
    mismatches = []
    checked = 0
    for (case_cc, config), result in zip(cases, results):
        if case_cc != cc:
            continue
        err, blocks, flags, lim_regs, lim_smem, lim_warps, lim_blocks, lim_bars, lim_virtual, \
            alloc_regs, alloc_smem = result
        assert err == 0, f"header rejected {config}: error {err}"
        ours = occupancy(cc, **config)
        expected = {
            "blocks_per_sm": blocks,
            "limiters": frozenset(name for bit, name in _FLAG_NAMES.items() if flags & bit),
            "registers": _from_c(lim_regs),
            "shared_memory": _from_c(lim_smem),
            "warps": _from_c(lim_warps),
            "blocks": _from_c(lim_blocks),
            "barriers": _from_c(lim_bars),
            "virtual_resources": _from_c(lim_virtual),
            "allocated_registers": alloc_regs,
            "allocated_shared": alloc_smem,
        }
        got = {
            "blocks_per_sm": ours.blocks_per_sm,
            "limiters": ours.limiters,
            **{name: ours.limits[name] for name in ("registers", "shared_memory", "warps",
                                                     "blocks", "barriers", "virtual_resources")},
            "allocated_registers": ours.allocated_registers_per_block,
            "allocated_shared": ours.allocated_shared_bytes_per_block,
        }
        checked += 1
        if got != expected:
            mismatches.append((config, expected, got))
    assert checked >= 10_000
    assert not mismatches, f"{len(mismatches)} mismatches, first: {mismatches[0]}"


# ------------------------------------------------------------------------------------------
# Hand-checked cases (arithmetic in the comments)
# ------------------------------------------------------------------------------------------

def test_register_granularity_and_sub_partitions_sm90():
    # 33 regs x 32 lanes = 1056 -> 1280 per warp; 16384 regs per quadrant / 1280 = 12 warps,
    # x 4 quadrants = 48 warps = 6 blocks of 8 warps (the naive 65536 / (33 x 256) says 7).
    occ = occupancy((9, 0), threads_per_block=256, registers_per_thread=33)
    assert occ.blocks_per_sm == 6
    assert occ.limiters == {"registers"}
    assert occ.active_warps == 48
    assert occ.occupancy == pytest.approx(48 / 64)
    assert occ.allocated_registers_per_block == 1280 * 8


def test_255_registers_128_threads():
    # 255 x 32 = 8160 -> 8192 per warp; 2 warps per quadrant = 8 warps per SM = 2 blocks of 4.
    occ = occupancy((9, 0), threads_per_block=128, registers_per_thread=255)
    assert occ.blocks_per_sm == 2
    assert occ.limiters == {"registers"}
    assert occ.occupancy == pytest.approx(8 / 64)


def test_1024_threads():
    # 64 regs: 2048 per warp, 8 warps per quadrant = 32 warps = one 1024-thread block.
    occ = occupancy((9, 0), threads_per_block=1024, registers_per_thread=64)
    assert (occ.blocks_per_sm, occ.limiters) == (1, {"registers"})
    # 65 regs: 2080 -> 2304 per warp x 32 warps = 73728 > 65536 registers per block.
    occ = occupancy((9, 0), threads_per_block=1024, registers_per_thread=65)
    assert (occ.blocks_per_sm, occ.limiters) == (0, {"registers"})


def test_sub_partition_rounding_of_the_per_block_check():
    # 40 threads = 2 warps, rounded to 4 for the hardware check: 4 x 16384 = 65536 still fits
    # at 255 regs (8192/warp -> 4 x 8192 = 32768 assumed); 1000 threads at 64 regs is 32 warps.
    occ = occupancy((9, 0), threads_per_block=40, registers_per_thread=255)
    assert occ.blocks_per_sm == 4  # 8 warps / 2 warps per block
    # 7 warps x 72 regs: 2304/warp, 7 -> 8 warps assumed = 18432 (fits); 7 warps per quadrant
    # x 4 = 28 warps / 7 = 4 blocks.
    occ = occupancy((9, 0), threads_per_block=224, registers_per_thread=72)
    assert occ.blocks_per_sm == 4


def test_warps_and_blocks_limits():
    assert occupancy((9, 0), threads_per_block=256, registers_per_thread=0).limiters == {"warps"}
    occ = occupancy((9, 0), threads_per_block=32, registers_per_thread=16)
    assert (occ.blocks_per_sm, occ.limiters) == (32, {"blocks"})
    # sm_86: 48 warps per SM, 16 blocks: 512 threads -> 3 blocks by warps.
    occ = occupancy((8, 6), threads_per_block=512, registers_per_thread=32)
    assert (occ.blocks_per_sm, occ.limiters, occ.max_warps_per_sm) == (3, {"warps"}, 48)
    occ = occupancy((8, 9), threads_per_block=32, registers_per_thread=16)
    assert occ.blocks_per_sm == 24


def test_shared_memory_default_limit_without_opt_in():
    # 48 KiB + the reserved 1 KiB is exactly the default per-block limit (+ reserved): 4 fit in
    # 228 KiB. One byte more cannot launch without opting in.
    occ = occupancy((9, 0), threads_per_block=128, registers_per_thread=32,
                    dynamic_shared_bytes=48 * KIB)
    assert occ.blocks_per_sm == 4
    assert occ.allocated_shared_bytes_per_block == 49 * KIB
    occ = occupancy((9, 0), threads_per_block=128, registers_per_thread=32,
                    dynamic_shared_bytes=48 * KIB + 1)
    assert (occ.blocks_per_sm, occ.limiters) == (0, {"shared_memory"})
    assert occ.occupancy == 0


def test_shared_memory_opt_in():
    occ = occupancy((9, 0), threads_per_block=128, registers_per_thread=32,
                    dynamic_shared_bytes=100 * KIB, opt_in=True)
    assert (occ.blocks_per_sm, occ.limiters) == (2, {"shared_memory"})  # 228 // 101
    occ = occupancy((9, 0), threads_per_block=128, registers_per_thread=32,
                    dynamic_shared_bytes=227 * KIB, opt_in=True)
    assert occ.blocks_per_sm == 1
    occ = occupancy((9, 0), threads_per_block=128, registers_per_thread=32,
                    dynamic_shared_bytes=227 * KIB + 1, opt_in=True)
    assert occ.blocks_per_sm == 0
    # A100 opt-in maximum is 163 KiB.
    occ = occupancy((8, 0), threads_per_block=128, registers_per_thread=32,
                    dynamic_shared_bytes=163 * KIB, opt_in=True)
    assert occ.blocks_per_sm == 1


def test_reserved_shared_memory_per_block():
    # 4 x 57 KiB = 228 KiB would fit exactly, but each block also holds the driver's 1 KiB:
    # 228 // 58 = 3.
    occ = occupancy((9, 0), threads_per_block=128, registers_per_thread=32,
                    dynamic_shared_bytes=57 * KIB, opt_in=True)
    assert occ.blocks_per_sm == 3
    occ = occupancy((9, 0), threads_per_block=128, registers_per_thread=32,
                    dynamic_shared_bytes=56 * KIB, opt_in=True)
    assert occ.blocks_per_sm == 4
    # No shared memory at all still costs 1 KiB per block; 128 granularity applies on top.
    occ = occupancy((9, 0), threads_per_block=32, registers_per_thread=16,
                    dynamic_shared_bytes=1)
    assert occ.allocated_shared_bytes_per_block == 1024 + 128


def test_carveout_preference():
    # 25 % of 228 KiB = 57 KiB -> the 64 KiB carveout; 21 KiB blocks: 3 instead of 10.
    common = dict(threads_per_block=128, registers_per_thread=32, dynamic_shared_bytes=20 * KIB)
    assert occupancy((9, 0), **common).blocks_per_sm == 10
    occ = occupancy((9, 0), carveout=25, **common)
    assert (occ.blocks_per_sm, occ.shared_bytes_per_sm) == (3, 64 * KIB)
    # Prefer-L1 (carveout 0) with a block bigger than the carveout: the carveout grows to hold
    # one block (32 KiB holds one 21 KiB block).
    occ = occupancy((9, 0), cache_config="l1", **common)
    assert (occ.blocks_per_sm, occ.shared_bytes_per_sm) == (1, 32 * KIB)


def test_invalid_inputs():
    with pytest.raises(ValueError, match="threads_per_block"):
        occupancy((9, 0), threads_per_block=0, registers_per_thread=32)
    with pytest.raises(ValueError, match="threads_per_block"):
        occupancy((9, 0), threads_per_block=1025, registers_per_thread=32)
    with pytest.raises(ValueError, match="registers_per_thread"):
        occupancy((9, 0), threads_per_block=128, registers_per_thread=256)
    with pytest.raises(ValueError, match="cc"):
        occupancy((7, 0), threads_per_block=128, registers_per_thread=32)
    with pytest.raises(ValueError, match="carveout"):
        occupancy((9, 0), threads_per_block=128, registers_per_thread=32, carveout=101)
    with pytest.raises(ValueError, match="dynamic_shared_bytes"):
        occupancy((9, 0), threads_per_block=128, registers_per_thread=32, dynamic_shared_bytes=-1)
    with pytest.raises(TypeError, match="threads_per_block"):
        occupancy((9, 0), threads_per_block=128.0, registers_per_thread=32)
    with pytest.raises(TypeError, match="opt_in"):
        occupancy((9, 0), threads_per_block=128, registers_per_thread=32, opt_in="yes")
    with pytest.raises(ValueError, match="cache_config"):
        occupancy((9, 0), threads_per_block=128, registers_per_thread=32, cache_config="big")


def test_cc_spellings():
    a = occupancy("9.0", threads_per_block=256, registers_per_thread=33)
    b = occupancy("sm_90", threads_per_block=256, registers_per_thread=33)
    assert a.blocks_per_sm == b.blocks_per_sm == 6
    assert a.limiter == "registers"


def test_triton_counts_opt_in_automatically():
    # Above 48 KiB Triton opts in itself, so a 64 KiB kernel launches (3 per SM on sm_90).
    occ = occupancy_of_counts(n_regs=32, shared_bytes=64 * KIB, num_warps=4, cc=(9, 0))
    assert occ.blocks_per_sm == 3
    assert occ.threads_per_block == 128


def test_occupancy_of_compiled_reads_triton_attributes():
    kernel = SimpleNamespace(n_regs=33, metadata=SimpleNamespace(
        shared=0, num_warps=8, target=SimpleNamespace(backend="cuda", arch=90, warp_size=32)))
    assert occupancy_of_compiled(kernel).blocks_per_sm == 6
    # sm_86: 48 warps per SM; 12 warps per quadrant still caps at 48 -> 6 blocks of 8 warps.
    assert occupancy_of_compiled(kernel, cc=(8, 6)).blocks_per_sm == 6
    with pytest.raises(ValueError, match="kernel"):
        occupancy_of_compiled(SimpleNamespace(n_regs=33))


def test_max_coresident_programs():
    assert max_coresident_programs(33, 0, 8, sm_count=132, cc=(9, 0)) == 6 * 132
    assert max_coresident_programs(32, 100 * KIB, 4, sm_count=132, cc=(9, 0)) == 2 * 132
    with pytest.raises(ValueError, match="cannot launch"):
        max_coresident_programs(255, 0, 32, sm_count=132, cc=(9, 0))
    with pytest.raises(ValueError, match="sm_count"):
        max_coresident_programs(32, 0, 4, sm_count=0, cc=(9, 0))


def test_occupancy_curves():
    curves = occupancy_curves((9, 0), threads_per_block=256, registers_per_thread=33)
    regs = curves["registers"]
    assert len(regs) == 256 and regs["current"].sum() == 1
    assert regs.loc[regs["registers_per_thread"] == 33, "blocks_per_sm"].item() == 6
    assert regs["occupancy"].is_monotonic_decreasing
    threads = curves["threads"]
    assert threads["threads_per_block"].tolist() == list(range(32, 1025, 32))
    shared = curves["shared_memory"]
    assert shared["shared_bytes"].max() == 227 * KIB
    assert shared["occupancy"].is_monotonic_decreasing
    assert set(curves) == {"registers", "threads", "shared_memory"}


def test_tables_cover_the_brief():
    for cc in [(8, 0), (8, 6), (8, 9), (9, 0), (10, 0)]:
        lim = SM_LIMITS[cc]
        assert lim.reserved_shared_bytes_per_block == 1024
        assert lim.register_allocation_unit == 256
        assert lim.max_registers_per_thread == 255
        assert lim.shared_bytes_per_block == 48 * KIB
        assert lim.carveout_bytes[-1] == lim.shared_bytes_per_sm
        assert lim.shared_bytes_per_block_optin == lim.shared_bytes_per_sm - KIB
    assert occ_mod.UNLIMITED == math.inf


def test_register_caps_for_more_blocks():
    """sm_90, 4 warps, no shared memory: 128 registers fit 4 blocks an SM, 96 fit 5, 80 fit 6 (the lagged split_row
    kernel's count with 13 and with 16 chunks a row); a kernel not limited by registers gets no cap."""
    from perfutils.model.occupancy import occupancy_of_counts, register_caps_for_more_blocks

    assert register_caps_for_more_blocks(128, 0, 4) == [(96, 5), (80, 6)]
    assert register_caps_for_more_blocks(141, 0, 4, steps=1) == [(128, 4)]
    for cap, blocks in register_caps_for_more_blocks(251, 1024, 8, steps=3):
        assert occupancy_of_counts(cap, 1024, 8).blocks_per_sm == blocks
        assert occupancy_of_counts(cap + 8, 1024, 8).blocks_per_sm < blocks  # the largest cap of its level
    assert register_caps_for_more_blocks(32, 0, 4) == []  # 16 blocks of 128 threads: threads limit, not registers


def test_register_cap_for_fewer_blocks():
    """sm_90, 4 warps: a kernel at 96 registers (5 blocks) may take up to 128 with 4 blocks, one at 128 up to 168 with
    3; each cap is the largest of its level; nothing when fewer than two blocks would remain, when registers do not
    limit the kernel, or when its count already is the level's largest."""
    from perfutils.model.occupancy import occupancy_of_counts, register_cap_for_fewer_blocks

    assert register_cap_for_fewer_blocks(96, 0, 4) == (128, 4)
    assert register_cap_for_fewer_blocks(90, 0, 4) == (128, 4)
    assert register_cap_for_fewer_blocks(128, 0, 4) == (168, 3)
    assert register_cap_for_fewer_blocks(80, 0, 8) == (128, 2)
    assert register_cap_for_fewer_blocks(96, 0, 8) is None  # 2 blocks of 256 threads: one would remain
    assert register_cap_for_fewer_blocks(96, 0, 8, min_blocks=1) == (248, 1)
    assert register_cap_for_fewer_blocks(32, 0, 4) is None  # threads limit, not registers
    for n_regs, shared, warps in ((72, 0, 4), (100, 20000, 4), (60, 0, 2)):
        found = register_cap_for_fewer_blocks(n_regs, shared, warps)
        if found is None:
            continue
        cap, blocks = found
        assert cap > n_regs and blocks == occupancy_of_counts(n_regs, shared, warps).blocks_per_sm - 1
        assert occupancy_of_counts(cap, shared, warps).blocks_per_sm == blocks
        assert cap + 8 > 255 or occupancy_of_counts(cap + 8, shared, warps).blocks_per_sm < blocks
