"""Offline sm_90 compiles (no GPU), Triton's argument specialization, and the analytic register estimate.

The kernel under test is a one-pass row softmax defined here. It calls a @triton.jit helper, tl.max (inside
the helper) and the tensor method ``.sum``. Compiles run in perfutils' compile worker, a separate process that
imports this module afresh; under TRITON_INTERPRET=1 the same kernel also runs here on CPU tensors, which is how
the offline compile once broke (the interpreter left ``triton.language.core`` patched). Runs with and without
TRITON_INTERPRET=1; the few compiles (~1-5 s each) are shared through module fixtures and the in-process cache.
"""

from __future__ import annotations

import collections
import os
import re
from types import SimpleNamespace

import pytest
import torch
import triton
import triton.language as tl

from perfutils.model import compiled_kernel, cubin, offline_compile, register_estimate, specialization, triton_compile


@triton.jit
def _row_max(x):
    return tl.max(x, axis=0)


@triton.jit
def row_softmax_kernel(out_ptr, in_ptr, row_stride, n_cols, BLOCK_SIZE: tl.constexpr):
    # One program per row: load the row (bf16 -> fp32), subtract its max, exponentiate, normalise.
    row = tl.program_id(0)
    offsets = tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_cols
    x = tl.load(in_ptr + row * row_stride + offsets, mask=mask, other=-float("inf")).to(tl.float32)
    x = x - _row_max(x)
    numerator = tl.exp(x)
    y = numerator / numerator.sum(axis=0)  # tensor-method form: also a @jit library function
    tl.store(out_ptr + row * row_stride + offsets, y, mask=mask)


N_COLS = 1000  # row_stride = 1000: not a multiple of 16, so not specialized; not 1, so not a constant


def softmax_args(n_cols: int = N_COLS, rows: int = 4) -> dict:
    # Only dtypes, alignment and integer magnitudes matter offline; CPU tensors are fine.
    x = torch.randn(rows, n_cols).to(torch.bfloat16)
    return {"out_ptr": torch.empty(rows, n_cols), "in_ptr": x, "row_stride": n_cols, "n_cols": n_cols}


def compile_softmax(block_size: int, num_warps: int, **kwargs) -> triton_compile.OfflineCompile:
    return offline_compile.compile_offline(row_softmax_kernel, softmax_args(), {"BLOCK_SIZE": block_size}, num_warps,
                                           **kwargs)


@pytest.fixture(scope="module")
def small():
    return compile_softmax(1024, 4)


@pytest.fixture(scope="module")
def small_one_warp():
    return compile_softmax(1024, 1)


@pytest.fixture(scope="module")
def huge():
    # 16384 fp32 values per row on 32 threads: 512 values per thread, far over the 255-register cap.
    return compile_softmax(16384, 1)


# ---------------------------------------------------------------------------------------------------------------
# Offline compiles
# ---------------------------------------------------------------------------------------------------------------


def test_small_kernel_resources(small):
    assert 0 < small.n_regs <= 256
    assert small.stack_bytes >= 0 and small.shared_bytes >= 0
    assert small.stack_bytes == 0 and small.spill_store_bytes == 0 and not small.spills  # 8 values per thread
    assert small.num_warps == 4 and small.num_stages == 1
    assert small.target == ("cuda", 90, 32)
    assert small.name == "row_softmax_kernel"
    assert ".target sm_90" in small.ptx and "row_softmax_kernel" in small.ptx
    assert small.sass is not None and "row_softmax_kernel" in small.sass
    assert small.triton_version == triton.__version__
    assert small.ptxas_version
    assert small.tool in ("cuobjdump", "elf", "ptxas")
    assert small.signature == {"out_ptr": "*fp32", "in_ptr": "*bf16", "row_stride": "i32", "n_cols": "i32",
                               "BLOCK_SIZE": "constexpr"}
    assert small.counts() == {"n_regs": small.n_regs, "spill_bytes": 0, "shared_bytes": small.shared_bytes,
                              "num_warps": 4}
    assert cubin.local_memory_excerpt(small.sass) == ""


def test_num_warps_changes_register_count(small, small_one_warp):
    # Same row on 4x fewer threads: 32 instead of 8 fp32 values per thread.
    assert small_one_warp.num_warps == 1
    assert small_one_warp.n_regs > small.n_regs


def test_huge_block_on_one_warp_spills(huge):
    assert 0 < huge.n_regs <= 255
    assert huge.stack_bytes > 0 and huge.spill_bytes >= huge.stack_bytes
    assert huge.spill_store_bytes > 0 and huge.spill_load_bytes > 0
    assert huge.spills
    excerpt = cubin.local_memory_excerpt(huge.sass, context=2, max_sites=3)
    assert excerpt and ("STL" in excerpt or "LDL" in excerpt)
    assert "local-memory instructions in all" in excerpt  # thousands of sites, three windows shown
    # The analytic model agrees that this configuration spills.
    assert register_estimate.predict_spill(16384, 1).spills
    flagged = register_estimate.effective_registers(huge.n_regs, huge.stack_bytes)
    assert flagged.spills and flagged.occupancy_from_n_regs_is_optimistic
    assert flagged.demand > huge.n_regs


def test_elf_reader_matches_tool(small, huge):
    for result in (small, huge):
        assert cubin.parse_cubin_resources(result.cubin, result.name) == {"n_regs": result.n_regs,
                                                                          "stack": result.stack_bytes}


def test_cache_returns_same_object(small):
    assert compile_softmax(1024, 4) is small


def test_compile_launch_uses_launch_fields(small):
    from kernels.launch import Launch

    launch = Launch(name="softmax", fn=row_softmax_kernel, grid=(4,), args=softmax_args(),
                    constexprs={"BLOCK_SIZE": 1024}, num_warps=4)
    assert offline_compile.compile_launch(launch) is small


def test_register_cap_reaches_ptxas(small_one_warp):
    """maxnreg caps the registers (what Launch.maxnreg passes)."""
    capped = compile_softmax(1024, 1, maxnreg=32)
    assert small_one_warp.n_regs > 32 and capped.n_regs <= 32
    assert capped.spills  # 32 fp32 values per thread do not fit in 32 registers
    from kernels.launch import Launch

    launch = Launch(name="softmax", fn=row_softmax_kernel, grid=(4,), args=softmax_args(),
                    constexprs={"BLOCK_SIZE": 1024}, num_warps=1, maxnreg=32)
    assert offline_compile.compile_launch(launch) is capped


def test_int_equal_to_one_compiles_as_constant():
    args = softmax_args(n_cols=16)
    args["row_stride"] = 1  # Triton 3.6 turns an int argument equal to 1 into a compile-time constant
    result = offline_compile.compile_offline(row_softmax_kernel, args, {"BLOCK_SIZE": 16}, num_warps=1, with_sass=False)
    assert result.signature["row_stride"] == "constexpr"
    assert result.signature["n_cols"] == "i32"
    assert 0 < result.n_regs <= 255 and result.sass is None
    # Asking again with SASS reuses the cached compile and disassembles its cubin.
    again = offline_compile.compile_offline(row_softmax_kernel, args, {"BLOCK_SIZE": 16}, num_warps=1)
    assert again is result and again.sass is not None and ".text.row_softmax_kernel" in again.sass


def test_interpreter_setting_restored_and_still_runs(small):
    before = os.environ.get("TRITON_INTERPRET")
    compile_softmax(1024, 4)
    offline_compile.clear_cache()
    compile_softmax(1024, 4)
    assert os.environ.get("TRITON_INTERPRET") == before
    if before == "1":
        # Compiling must not disturb the interpreter: the same kernel object still runs on CPU tensors.
        args = softmax_args(n_cols=100, rows=3)
        row_softmax_kernel[(3,)](**args, BLOCK_SIZE=128)
        expected = torch.softmax(args["in_ptr"].float(), dim=-1)
        torch.testing.assert_close(args["out_ptr"], expected, rtol=1e-5, atol=1e-6)


def test_offline_compile_after_the_interpreter_ran_a_kernel(tmp_path, monkeypatch):
    """The fresh-machine failure: a kernel run under the interpreter (its helper calls tl.max, whose device-function
    call leaves triton.language.core patched in Triton 3.6), then a compile that is in no Triton cache."""
    import triton.language.core as core

    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the interpreter is off here (a GPU machine): nothing to leave patched")
    original_program_id = core.program_id
    args = softmax_args(n_cols=100, rows=3)
    row_softmax_kernel[(3,)](**args, BLOCK_SIZE=128)
    torch.testing.assert_close(args["out_ptr"], torch.softmax(args["in_ptr"].float(), dim=-1), rtol=1e-5, atol=1e-6)
    interpreter_left_patches = core.program_id is not original_program_id  # Triton 3.6 does; a fixed Triton may not
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "empty-cache"))  # read by the worker for this job
    offline_compile.clear_cache()
    result = compile_softmax(256, 2)
    assert 0 < result.n_regs <= 255 and result.num_warps == 2
    assert any((tmp_path / "empty-cache").rglob("*.cubin")), "the compile did not run (it came from another cache)"
    if interpreter_left_patches:
        assert core.program_id is not original_program_id  # the worker compiled; this process was left as it was


def test_compile_offline_rejects_bad_input():
    with pytest.raises(TypeError, match="fn"):
        offline_compile.compile_offline(lambda x: x, {}, {}, 4)
    with pytest.raises(TypeError, match="args"):
        offline_compile.compile_offline(row_softmax_kernel, [1, 2], {}, 4)
    with pytest.raises(ValueError, match="bogus"):
        offline_compile.compile_offline(row_softmax_kernel, {**softmax_args(), "bogus": 1}, {"BLOCK_SIZE": 16}, 4)
    with pytest.raises(ValueError, match="BLOCK_SIZE"):
        offline_compile.compile_offline(row_softmax_kernel, softmax_args(), {}, 4)
    with pytest.raises(ValueError, match="num_warps"):
        offline_compile.compile_offline(row_softmax_kernel, softmax_args(), {"BLOCK_SIZE": 16}, 3)
    with pytest.raises(TypeError, match="num_stages"):
        offline_compile.compile_offline(row_softmax_kernel, softmax_args(), {"BLOCK_SIZE": 16}, 4, num_stages=1.5)
    with pytest.raises(ValueError, match="backend"):
        offline_compile.compile_offline(row_softmax_kernel, softmax_args(), {"BLOCK_SIZE": 16}, 4,
                                        target=("hip", 90, 32))
    with pytest.raises(TypeError, match="in_ptr"):
        offline_compile.compile_offline(row_softmax_kernel, {**softmax_args(), "in_ptr": "text"}, {"BLOCK_SIZE": 16}, 4)
    with pytest.raises(TypeError, match="launch"):
        offline_compile.compile_launch(object())
    for bad in (8, 256, "64"):
        with pytest.raises(ValueError, match="maxnreg"):
            offline_compile.compile_offline(row_softmax_kernel, softmax_args(), {"BLOCK_SIZE": 16}, 4, maxnreg=bad)


# ---------------------------------------------------------------------------------------------------------------
# Specialization rules (Triton 3.6)
# ---------------------------------------------------------------------------------------------------------------


def test_specialize_types_divisibility_and_constants():
    x = torch.empty(4, 64, dtype=torch.bfloat16)
    spec = specialization.specialize(row_softmax_kernel,
                                     {"out_ptr": torch.empty(4, 64), "in_ptr": x[:, 1:], "row_stride": 1,
                                      "n_cols": 2 ** 31},
                                     {"BLOCK_SIZE": 64})
    assert spec.signature == {"out_ptr": "*fp32", "in_ptr": "*bf16", "row_stride": "constexpr", "n_cols": "i64",
                              "BLOCK_SIZE": "constexpr"}
    assert spec.constexprs == {"row_stride": 1, "BLOCK_SIZE": 64}
    # in_ptr starts 2 bytes into the allocation: not 16-byte aligned; 2**31 is a multiple of 16.
    assert spec.divisible_by_16 == ("out_ptr", "n_cols")


@pytest.mark.parametrize("value", [0, 1, 16, 17, -16, 2 ** 31 - 1, 2 ** 31, -(2 ** 31), -(2 ** 31) - 1, 2 ** 63,
                                   1.0, 2.5, True, False, None])
@pytest.mark.parametrize("specialize_it", [True, False])
def test_python_rules_match_triton_native_for_scalars(value, specialize_it):
    native = specialization._native_specializer("cuda")
    if native is None:
        pytest.skip(f"Triton {triton.__version__} has no native_specialize_impl")
    expected = tuple(native(value, False, specialize_it, True))
    assert specialization._python_specialize_value(value, "v", specialize_it, True) == expected


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
                                   torch.bool, torch.uint8, torch.float64])
def test_python_rules_match_triton_native_for_tensors(dtype):
    native = specialization._native_specializer("cuda")
    if native is None:
        pytest.skip(f"Triton {triton.__version__} has no native_specialize_impl")
    t = torch.zeros(64, dtype=dtype)
    for view in (t, t[1:]):
        assert specialization._python_specialize_value(view, "t", True, True) == tuple(native(view, False, True, True))


# ---------------------------------------------------------------------------------------------------------------
# Parsers and excerpts on canned text
# ---------------------------------------------------------------------------------------------------------------


def test_parse_tool_outputs():
    res = (" Function other:\n  REG:10 STACK:0 SHARED:0 LOCAL:0 CONSTANT[0]:500\n"
           " Function k:\n  REG:64 STACK:4624 SHARED:16 LOCAL:8 CONSTANT[0]:568 TEXTURE:0\n")
    assert cubin.parse_res_usage(res, "k") == {"n_regs": 64, "stack": 4624, "shared": 16, "local": 8}
    log = ("ptxas info    : Function properties for k\n"
           "    200 bytes stack frame, 298 bytes spill stores, 344 bytes spill loads\n"
           "ptxas info    : Used 255 registers, used 0 barriers, 200 bytes cumulative stack size\n")
    assert cubin.parse_ptxas_log(log) == {"n_regs": 255, "stack": 200, "spill_stores": 298, "spill_loads": 344}
    assert cubin.parse_ptxas_log("nothing here") is None
    # A kernel that calls a noinline function (the loss kernels' call_scales): ptxas prints the callee's block last.
    two = ("ptxas info    : Compiling entry function 'k' for 'sm_90a'\n"
           "ptxas info    : Function properties for k\n"
           "    624 bytes stack frame, 664 bytes spill stores, 676 bytes spill loads\n"
           "ptxas info    : Used 128 registers, used 1 barriers, 624 bytes cumulative stack size\n"
           "ptxas info    : Function properties for helper_fn\n"
           "    0 bytes stack frame, 4 bytes spill stores, 0 bytes spill loads\n")
    assert cubin.parse_ptxas_log(two, "k") == {"n_regs": 128, "stack": 624, "spill_stores": 664, "spill_loads": 676}


def test_sass_instruction_mix_counts_opcodes_and_64_bit_compares():
    sass = "\n".join([
        "        /*0000*/                   LDG.E.128 R4, desc[UR4][R2.64] ;",
        "        /*0010*/                   ISETP.NE.U32.AND P1, PT, R5, UR30, PT ;",
        "        /*0020*/                   ISETP.NE.U32.AND.EX P1, PT, R60, UR31, PT, P1 ;",
        "        /*0030*/               @P6 LOP3.LUT R2, R2, 0x40, RZ, 0xfc, !PT ;",
        "        /*0040*/                   STG.E.128 desc[UR4][R2.64], R4 ;",
        "        .L_x_1:",
        "        /*0050*/                   EXIT ;"])
    mix = cubin.sass_instruction_mix(sass)
    assert (mix["instructions"], mix["compares_64"], mix["memory"]) == (6, 1, 2)
    assert (mix["ISETP"], mix["LOP3"], mix["EXIT"]) == (2, 1, 1)
    with pytest.raises(TypeError, match="sass"):
        cubin.sass_instruction_mix(None)


def test_label_test_in_the_tile_frame_is_cheaper():
    """perfutils.lab_kernels.teaching.label_index compiled for sm_90: the label as an int32 lane of the tile needs fewer registers,
    instructions and 64-bit compares than the row's int64 column compared per element, with or without a peeled
    head (notebook 05)."""
    from perfutils.model.offline_counts import LABEL_FRAMES, label_index_costs

    costs = label_index_costs(n_cols=50257)
    for head, both in costs.groupby("peeled head"):
        row, lane = (both[both["label test"] == LABEL_FRAMES[frame]].iloc[0] for frame in (False, True))
        assert lane["instructions"] < row["instructions"] and lane["compares_64"] < row["compares_64"], head
        assert lane["n_regs"] <= row["n_regs"], head


def test_split_row_labels_kernels_test_the_label_in_the_tile_frame():
    """split_row's multi-launch gradient kernel and its "wait" cooperative kernel (labels CE, 4096-column chunks of
    4 warps: 32 columns a thread) compiled for sm_90: the label is compared with the tile's int32 lanes
    (row_math.label_in_tile), so fewer 64-bit compares than a thread's 32 columns (52 with the row's int64 column)."""
    import kernels
    from kernels import split_row
    from kernels.launch import Launch

    logits = torch.zeros(64, 50304, dtype=torch.bfloat16)
    plan = kernels.prepare(logits, torch.zeros(64, dtype=torch.int64), loss="cross_entropy", target_format="labels",
                           variant="split_row", block_size=4096, num_warps=4, cooperative=False)
    grad = plan.launches[1]
    wait = Launch("split_row.cooperative", split_row.split_row_cooperative_kernel, grad.grid, dict(grad.args),
                  {name: value for name, value in grad.constexprs.items() if name != "PHASE"}, num_warps=4)
    for launch in (grad, wait):
        mix = cubin.sass_instruction_mix(offline_compile.compile_launch(launch, with_sass=True).sass)
        assert mix["compares_64"] < 32, (launch.name, mix["compares_64"])


def test_local_memory_excerpt_on_ptx():
    ptx = "\n".join([f"  add.f32 %f{i}, %f{i}, %f{i};" for i in range(10)]
                    + ["  st.local.f32 [%rd1], %f1;"]
                    + [f"  mul.f32 %f{i}, %f{i}, %f{i};" for i in range(10)]
                    + ["  ld.local.f32 %f2, [%rd1];"])
    excerpt = cubin.local_memory_excerpt(ptx, context=1)
    assert excerpt.splitlines() == ["  add.f32 %f9, %f9, %f9;", "  st.local.f32 [%rd1], %f1;",
                                    "  mul.f32 %f0, %f0, %f0;", "...", "  mul.f32 %f9, %f9, %f9;",
                                    "  ld.local.f32 %f2, [%rd1];"]
    assert cubin.local_memory_excerpt("ULDC UR4, c[0x0][0x0] ;\nLDG.E R2, [R4] ;") == ""
    with pytest.raises(TypeError, match="ptx_or_sass"):
        cubin.local_memory_excerpt(None)
    with pytest.raises(ValueError, match="context"):
        cubin.local_memory_excerpt(ptx, context=-1)


# ---------------------------------------------------------------------------------------------------------------
# Numbers from a GPU run (faked CompiledKernel)
# ---------------------------------------------------------------------------------------------------------------


def test_counts_from_compiled():
    Meta = collections.namedtuple("Meta", "shared num_warps")
    kernel = SimpleNamespace(n_regs=40, n_spills=10, metadata=Meta(shared=1024, num_warps=8))
    # n_spills is LOCAL_SIZE_BYTES / 4, so 10 words are 40 bytes per thread.
    assert compiled_kernel.counts_from_compiled(kernel) == {"n_regs": 40, "spill_bytes": 40, "shared_bytes": 1024,
                                                            "num_warps": 8}
    not_loaded = SimpleNamespace(metadata={"shared": 0, "num_warps": 4})
    assert compiled_kernel.counts_from_compiled(not_loaded) == {"n_regs": None, "spill_bytes": None, "shared_bytes": 0,
                                                                "num_warps": 4}
    with pytest.raises(ValueError, match="compiled_kernel"):
        compiled_kernel.counts_from_compiled(None)
    with pytest.raises(TypeError, match="compiled_kernel"):
        compiled_kernel.counts_from_compiled(object())


# ---------------------------------------------------------------------------------------------------------------
# Analytic estimate
# ---------------------------------------------------------------------------------------------------------------


def test_register_cap():
    assert [register_estimate.register_cap(w) for w in (1, 2, 4, 8, 16, 32)] == [255, 255, 255, 255, 128, 64]
    with pytest.raises(ValueError, match="num_warps"):
        register_estimate.register_cap(64)
    with pytest.raises(TypeError, match="num_warps"):
        register_estimate.register_cap(4.0)


def test_estimate_is_monotonic():
    sizes = [2 ** k for k in range(5, 17)]
    for warps in (1, 4, 8, 32):
        estimates = [register_estimate.estimate_registers(b, warps) for b in sizes]
        assert estimates == sorted(estimates)
    for block in (1024, 16384):
        by_warps = [register_estimate.estimate_registers(block, w) for w in (1, 2, 4, 8, 16, 32)]
        assert by_warps == sorted(by_warps, reverse=True)
    assert (register_estimate.estimate_registers(4096, 8, live_fp32_tiles=3)
            > register_estimate.estimate_registers(4096, 8, live_fp32_tiles=2))
    # 2 tiles x 16384 / 256 = 128 values, + 28 overhead.
    assert register_estimate.estimate_registers(16384, 8, 2, 28) == 156
    assert register_estimate.values_per_thread(16, 4) == 1  # small tiles are replicated, never zero per thread


def test_predict_spill_and_caps():
    fits = register_estimate.predict_spill(1024, 4)
    assert not fits.spills and fits.excess_registers == 0 and fits.headroom > 0
    over = register_estimate.predict_spill(16384, 1)
    assert over.spills and over.cap == 255
    assert over.excess_registers == over.estimate - 255 and over.excess_bytes == 4 * over.excess_registers
    # At 16 warps the cap halves to 128: 32768 values / 512 threads * 2 tiles = 128, + overhead -> spills.
    assert register_estimate.predict_spill(32768, 16).spills and register_estimate.predict_spill(32768, 16).cap == 128
    with pytest.raises(ValueError, match="block_size"):
        register_estimate.predict_spill(0, 4)
    with pytest.raises(TypeError, match="live_fp32_tiles"):
        register_estimate.predict_spill(1024, 4, live_fp32_tiles="2")


def test_effective_registers():
    clean = register_estimate.effective_registers(40, 0)
    assert not clean.spills and clean.demand == 40 and not clean.occupancy_from_n_regs_is_optimistic
    heavy = register_estimate.effective_registers(64, 4624)
    assert heavy.spilled_words == 1156 and heavy.demand == 64 + 1156 and heavy.spills
    with pytest.raises(ValueError, match="n_regs"):
        register_estimate.effective_registers(0, 0)
    with pytest.raises(ValueError, match="stack_bytes"):
        register_estimate.effective_registers(32, -4)


def _lagged_launch(loss: str, target_format: str, num_chunks: int, n_slots: int = 3, rows: int = 64,
                   n_cols: int | None = None, prefetch: bool = False, read_ahead: int = 0):
    """The lagged split_row kernel's launch for ``num_chunks`` chunks of 4096 columns, as a GPU would run it
    (``split_row.cooperative_launch``: a CPU plan is the multi-launch form)."""
    from kernels import split_row
    from kernels.problem import build_problem

    if n_cols is None:
        n_cols = (num_chunks - 1) * 4096 + 1152  # rows 16-byte aligned: no peeled head and tail
    logits = torch.zeros(rows, n_cols, dtype=torch.bfloat16)
    target = (torch.zeros(rows, dtype=torch.int64) if target_format == "labels"
              else torch.zeros(rows, n_cols, dtype=torch.bfloat16))
    problem = build_problem(logits, target, loss=loss, target_format=target_format, grad_output=1.0,
                            ignore_index=-100, loss_mask=None)
    launch = split_row.cooperative_launch(problem, 4096, 4, n_slots=n_slots, prefetch=prefetch, read_ahead=read_ahead)
    assert launch.constexprs["NUM_CHUNKS"] == num_chunks and launch.name == "split_row.lagged"
    return launch


@pytest.mark.parametrize("num_chunks", [13, 16])
def test_lagged_labels_kernel_keeps_80_registers_at_any_chunk_count(num_chunks):
    """ptxas (sm_90) put the program id and the row state in per-thread registers, 128 instead of 80, whenever it could
    not see that a program's chunk index is small (NUM_CHUNKS not a power of two): ``split_row.slot_and_chunk``'s mask
    shows it. If a Triton/LLVM drops that mask, this fails at 13 chunks."""
    result = offline_compile.compile_launch(_lagged_launch("cross_entropy", "labels", num_chunks), with_sass=False)
    assert result.n_regs <= 80 and not result.spills


@pytest.mark.parametrize("loss, target_format", [("forward_kl", "logits"), ("reverse_kl", "logits"),
                                                 ("cross_entropy", "labels")])
def test_lagged_fast_math_takes_fewer_instructions(loss, target_format):
    """The lagged kernel's FAST_MATH (its default): log2 from the GPU's MUFU.LG2 instead of libdevice's polynomial, the
    chunk's statistics from its raw tile; fewer SASS instructions than the exact math (forward KL at 32 chunks of
    4096 columns: 1856 vs 1968 offline), no more registers, no spills."""
    fast = offline_compile.compile_launch(_lagged_launch(loss, target_format, 32, n_cols=131072))
    exact_launch = _lagged_launch(loss, target_format, 32, n_cols=131072)
    exact_launch.constexprs["FAST_MATH"] = False
    exact = offline_compile.compile_launch(exact_launch)

    def instructions(result):
        return len(re.findall(r"^\s+/\*[0-9a-f]{4}\*/", result.sass, re.M))

    assert "MUFU.LG2" in fast.sass and "MUFU.LG2" not in exact.sass
    assert instructions(fast) < instructions(exact)
    assert fast.n_regs <= max(exact.n_regs, 128) and not fast.spills


@pytest.mark.parametrize("loss, target_format", [("forward_kl", "logits"), ("cross_entropy", "labels")])
def test_lagged_prefetch_kernel_compiles_on_peeled_rows(loss, target_format):
    """The prefetching lagged kernel (split_row prefetch=True: one more chunk in registers) compiles for sm_90 on rows
    that are not 16-byte aligned (50257 columns: head and tail peeled), holds the next chunk in more registers than
    the plain kernel, and does not spill (4096-column chunks)."""
    plain = offline_compile.compile_launch(_lagged_launch(loss, target_format, 13, n_cols=50257), with_sass=False)
    ahead = offline_compile.compile_launch(_lagged_launch(loss, target_format, 13, n_cols=50257, prefetch=True),
                                           with_sass=False)
    assert ahead.n_regs >= plain.n_regs and not ahead.spills


@pytest.mark.parametrize("loss, target_format", [("forward_kl", "logits"), ("cross_entropy", "labels")])
def test_lagged_read_ahead_goes_through_shared_memory(loss, target_format):
    """read_ahead (split_row's option): Triton's pipeliner turns the step loop's loads into asynchronous copies to
    shared memory (cp.async), one more copy of the step's tiles per step read ahead; without it the loop has no
    asynchronous copy and uses no more than a kilobyte or so of shared memory (the reductions' scratch)."""
    plain = offline_compile.compile_launch(_lagged_launch(loss, target_format, 13), with_sass=False)
    ahead = [offline_compile.compile_launch(_lagged_launch(loss, target_format, 13, read_ahead=steps), with_sass=False)
             for steps in (1, 2)]
    assert "cp.async" not in plain.ptx and plain.shared_bytes < 4096
    tile_bytes = 4096 * 2 * (1 if target_format == "labels" else 2)  # one chunk of x (and t), bf16
    for steps, result in zip((1, 2), ahead):
        assert "cp.async" in result.ptx and not result.spills
        assert result.shared_bytes >= (steps + 1) * tile_bytes


def test_reverse_kl_fused_tile_keeps_the_registers_of_forward_kl():
    """Reverse KL's gradient keeps a bad row's NaN (row_math.tile_gradient). Written as ``where(e_x > 0, ..., kl * 0)``
    it made ptxas compile fused's 32K tile at 16 warps with 64 registers and a 1 KB stack instead of 128 (3.5x the
    time on the H100); at 16 rows, as Triton specializes every measured token count (a multiple of 16)."""
    from perfutils.model.offline_counts import offline_counts

    frame, _ = offline_counts([(loss, "logits", "fused", 32768, 16) for loss in ("forward_kl", "reverse_kl")],
                              vocab=32000, log=None)
    counts = frame.set_index("loss")
    assert (frame["status"] == "ok").all(), frame["error"].tolist()
    assert counts.loc["reverse_kl", "n_regs"] >= counts.loc["forward_kl", "n_regs"]
    assert counts.loc["reverse_kl", "spill_bytes"] <= 1.25 * counts.loc["forward_kl", "spill_bytes"]


def test_the_gpu_launch_of_a_split_plan_is_built_and_counted_off_a_gpu():
    """split_row.cooperative_launch builds the persistent kernel a GPU plan runs (a CPU plan is the multi-launch form),
    and offline_counts counts it for split rows: forward KL 4096 x 32000 in 4096-column chunks, the kernel the plan
    launches (128 registers when the H200 ran it, data/h200/logs/ncu_kept_2026-11-28.txt; 96 since the folded
    gradient, data/h200/logs/offline_steps_folded_2026-11-29.txt)."""
    from kernels import split_row
    from kernels.problem import build_problem
    from perfutils.model.offline_compile import compile_launch
    from perfutils.model.offline_counts import offline_counts

    logits = torch.zeros(64, 32000, dtype=torch.bfloat16)
    problem = build_problem(logits, torch.zeros_like(logits), loss="forward_kl", target_format="logits",
                            grad_output=1.0, ignore_index=-100, loss_mask=None)
    lagged = split_row.cooperative_launch(problem, 4096, 4, n_slots=3)
    assert (lagged.name, lagged.fn, lagged.grid) == ("split_row.lagged", split_row.split_row_lagged_kernel, (24,))
    assert lagged.constexprs["NUM_CHUNKS"] == 8 and lagged.constexprs["POLL_FIRST"] is False
    wait = split_row.cooperative_launch(problem, 4096, 4, schedule="wait")
    assert (wait.name, wait.fn, wait.grid) == ("split_row.cooperative", split_row.split_row_cooperative_kernel, (8,))
    with pytest.raises(ValueError, match="one chunk"):
        split_row.cooperative_launch(problem, 32768, 16)
    with pytest.raises(ValueError, match="'lagged' or 'wait'"):
        split_row.cooperative_launch(problem, 4096, 4, schedule="kept")
    frame, _ = offline_counts([("forward_kl", "logits", "split_row", 4096, 4)], vocab=32000, log=None)
    assert frame.loc[0, "launch"] == "split_row.lagged"
    assert frame.loc[0, "n_regs"] == compile_launch(lagged, with_sass=False).n_regs <= 128
