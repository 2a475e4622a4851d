"""perfutils.peers.fast_llm (Fast-LLM run from a checkout) and perfutils.studies.case_497 (the case study's stages).

Most tests use a small stand-in checkout written into a temporary folder (a ``fast_llm`` package with the same
module path, enums and wrapper signature as Fast-LLM, and a toy kernel): they check the loader, commits,
variant names, the launch recording, the provider's plan and an offline sm_90 compile, on any Python. The
tests marked ``real`` load the checkouts named by ``$FAST_LLM_PATH`` (Python >= 3.12) and check what their
launches look like; Fast-LLM's kernels do not run under Triton 3.6's interpreter, so their numbers are checked
on the GPU by the harness.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import torch

from perfutils.studies import case_497
from perfutils.peers import fast_llm
from perfutils.measure import ncu, providers

FAKE_CONFIG = '''
import enum


class TargetFormat(enum.StrEnum):
    labels = "labels"
    logits = "logits"


class EntropyLossType(enum.StrEnum):
    cross_entropy = "cross_entropy"
    reverse_kl = "reverse_kl"
'''

FAKE_ENTROPY_LOSS = '''
import os

import torch
import triton
import triton.language as tl

from fast_llm.functional.config import EntropyLossType, TargetFormat

# Like Fast-LLM: tl.arange on a GPU, a jitted wrapper under the interpreter, None with neither.
if torch.cuda.is_available():
    tl_arange = tl.arange
elif os.environ.get("TRITON_INTERPRET") == "1":
    @triton.jit
    def tl_arange(start: tl.constexpr, end: tl.constexpr):
        return tl.arange(start, end)
else:
    tl_arange = None


@triton.jit
def toy_forward_backward_kernel(logits_ptr, grad_ptr, losses_ptr, grad_losses, n_cols: tl.constexpr,
                                block_size: tl.constexpr, accumulate: tl.constexpr = False):
    row = tl.program_id(0).to(tl.int64)
    cols = tl_arange(0, block_size)
    x = tl.load(logits_ptr + row * n_cols + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
    tl.store(grad_ptr + row * n_cols + cols, x * grad_losses, mask=cols < n_cols)
    tl.store(losses_ptr + row, tl.sum(x, 0))


def reduce_losses(losses, divisor=None, mask=None):
    return losses.sum() / divisor


def triton_entropy_loss_forward_backward(logits, target, loss_mask, grad_logits=None, grad_output=None, group=None,
                                         logits_scale_factor=1.0, temperature=1.0,
                                         target_format=TargetFormat.labels,
                                         entropy_loss_type=EntropyLossType.cross_entropy, block_size=None,
                                         num_warps=None, divisor=None):
    n_rows, n_cols = logits.shape
    block_size = block_size or triton.next_power_of_2(n_cols)
    grad = torch.empty_like(logits)
    losses = torch.empty(n_rows, dtype=torch.float, device=logits.device)
    toy_forward_backward_kernel[(n_rows,)](logits, grad, losses, grad_output / divisor, n_cols=n_cols,
                                           block_size=block_size, num_warps=num_warps or 4)
    return reduce_losses(losses, divisor), grad
'''


def write_checkout(root: Path, commit: str | None = "ab" * 20, entropy_loss: str = FAKE_ENTROPY_LOSS) -> Path:
    files = {
        "fast_llm/__init__.py": "",
        "fast_llm/functional/__init__.py": "",
        "fast_llm/functional/config.py": FAKE_CONFIG,
        "fast_llm/functional/triton/__init__.py": "",
        "fast_llm/functional/triton/entropy_loss.py": entropy_loss,
    }
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    if commit is not None:
        (root / "COMMIT").write_text(commit + "\n")
    return root


@pytest.fixture
def two_checkouts(tmp_path, monkeypatch):
    a = write_checkout(tmp_path / "a", "a" * 40)
    b = write_checkout(tmp_path / "b", "b1" * 20)
    monkeypatch.setenv(fast_llm.ENV_VAR, os.pathsep.join([str(a), str(b)]))
    return a, b


def commit_all(repo: Path) -> str:
    """Make ``repo`` a git repository with one commit of everything in it; returns the commit."""
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    for step in (["init", "-q"], ["add", "."], ["commit", "-qm", "x"]):
        subprocess.run(git + step, check=True)
    return subprocess.run(git + ["rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()


def test_commit_from_file_git_or_nothing(tmp_path):
    assert fast_llm.checkout_commit(write_checkout(tmp_path / "file", "c" * 40)) == "c" * 40
    assert fast_llm.checkout_commit(write_checkout(tmp_path / "none", None)) is None
    repo = write_checkout(tmp_path / "git", None)
    head = commit_all(repo)
    assert fast_llm.checkout_commit(repo) == head
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "COMMIT").write_text("not a hash")
    with pytest.raises(ValueError, match="commit hash"):
        fast_llm.checkout_commit(tmp_path / "bad")


def test_commit_of_an_extraction_inside_another_repository_is_unknown(tmp_path):
    """A checkout without COMMIT inside another work tree (this project's .peers/) is not that tree's HEAD."""
    outer = tmp_path / "project"
    (outer / "src").mkdir(parents=True)
    (outer / "src" / "x.py").write_text("x = 1\n")
    commit_all(outer)
    inner = write_checkout(outer / ".peers" / "fast_llm-1234abcd", None)
    assert fast_llm.checkout_commit(inner) is None
    (inner / "COMMIT").write_text("d" * 40)
    assert fast_llm.checkout_commit(inner) == "d" * 40


def test_extract_checkout_from_a_repository(tmp_path):
    repo = write_checkout(tmp_path / "repo", None)
    head = commit_all(repo)
    dest = fast_llm.extract_checkout(head[:8], repo / ".git", tmp_path / "peers")
    assert dest == tmp_path / "peers" / f"fast_llm-{head[:8]}"
    assert (dest / "fast_llm" / "functional" / "triton" / "entropy_loss.py").is_file()
    assert fast_llm.checkout_commit(dest) == head
    assert fast_llm.extract_checkout(head[:8], repo / ".git", tmp_path / "peers") == dest  # reused


def test_variants_name_checkouts(two_checkouts, monkeypatch):
    a, b = two_checkouts
    assert fast_llm.find_checkout("fast_llm") == a
    assert fast_llm.find_checkout("fast_llm_b1b1b1b1") == b
    assert fast_llm.variant_name("b1" * 20) == "fast_llm_b1b1b1b1" and fast_llm.variant_name(None) == "fast_llm"
    with pytest.raises(FileNotFoundError, match="no checkout .* is at commit 1234"):
        fast_llm.find_checkout("fast_llm_1234")
    with pytest.raises(ValueError, match="commit prefix"):
        fast_llm.find_checkout("fast_llm_xyz")
    monkeypatch.delenv(fast_llm.ENV_VAR)
    with pytest.raises(FileNotFoundError, match="FAST_LLM_PATH"):
        fast_llm.find_checkout("fast_llm")


def test_two_checkouts_load_side_by_side(two_checkouts):
    a, b = two_checkouts
    first, second = fast_llm.load(a), fast_llm.load(b)
    assert first.module is not second.module and fast_llm.load(a) is first  # cached per folder
    assert Path(first.module.__file__).is_relative_to(a.resolve())
    assert Path(second.module.__file__).is_relative_to(b.resolve())
    assert not [name for name in sys.modules if name == "fast_llm" or name.startswith("fast_llm.")]
    assert first.kernel_names == ["toy_forward_backward_kernel"]
    assert first.supports("reverse_kl", "logits") and not first.supports("forward_kl", "logits")
    assert first.variant == "fast_llm_aaaaaaaa"


def test_load_says_what_is_missing(tmp_path):
    with pytest.raises(ImportError, match="not a Fast-LLM checkout"):
        fast_llm.load(tmp_path)
    missing = write_checkout(tmp_path / "missing", entropy_loss="import surely_not_installed_module\n")
    with pytest.raises(ImportError, match="surely_not_installed_module.*not installed"):
        fast_llm.load(missing)
    newer = write_checkout(tmp_path / "newer", entropy_loss="def f[T](x: T) -> T:\n    return x\n")
    if sys.version_info < (3, 12):
        with pytest.raises(ImportError, match="Python >= 3.12"):
            fast_llm.load(newer)
    assert not [name for name in sys.modules if name.startswith("fast_llm")]


def test_capture_records_the_launch_without_running_it(two_checkouts):
    checkout = fast_llm.load(two_checkouts[0])
    (launch,) = fast_llm.capture_launches(checkout, loss="reverse_kl", target_format="logits", tokens=4096,
                                          vocab=1000, num_warps=8)
    assert launch.name == "toy_forward_backward_kernel" and launch.grid == (4096,)
    assert launch.block_size == 1024 and launch.warp_choices == [8] and launch.num_warps == 8
    assert launch.num_stages == 3 and not launch.autotuned  # Triton's default: Fast-LLM passes none
    runtime, constexprs = launch.split_arguments()
    assert constexprs == {"n_cols": 1000, "block_size": 1024}
    assert set(runtime) == {"logits_ptr", "grad_ptr", "losses_ptr", "grad_losses"}
    assert runtime["logits_ptr"].device.type == "meta"
    assert checkout.module.toy_forward_backward_kernel is launch.kernel  # restored after the call


def test_provider_runs_the_wrapper_and_records_its_launches(two_checkouts):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 40, generator=gen)
    labels = torch.tensor([1, -100, 3, 4, -100])
    plan = providers.prepare(x, labels, loss="cross_entropy", target_format="labels", variant="fast_llm_b1b1b1b1",
                             grad_output=2.0)
    assert plan.variant == "fast_llm_b1b1b1b1" and plan.config["divisor"] == 3.0 and plan.launches == []
    loss, grad = plan.run()
    assert torch.allclose(loss, x.sum() / 3) and torch.allclose(grad, x * 2 / 3)
    assert [launch.name for launch in plan.launches] == ["toy_forward_backward_kernel"]
    assert plan.config["block_size"] == 64 and plan.config["num_warps"] == 4
    assert plan.config["fast_llm_commit"] == "b1" * 20
    plan.run()  # later runs call the wrapper directly
    assert len(plan.launches) == 1
    with pytest.raises(ValueError, match="negative"):
        providers.prepare(x, labels, loss="cross_entropy", target_format="labels", variant="fast_llm", ignore_index=7)
    with pytest.raises(ValueError, match="has no"):
        providers.prepare(x, x, loss="forward_kl", target_format="logits", variant="fast_llm")


def test_offline_compile_of_a_recorded_launch(two_checkouts, tmp_path):
    """In a fresh process without the interpreter, as the offline stage runs (tl_arange is None there)."""
    script = textwrap.dedent(f'''
        from perfutils.peers import fast_llm
        checkout = fast_llm.load({str(two_checkouts[0])!r})
        assert checkout.module.tl_arange is None
        (launch,) = fast_llm.capture_launches(checkout, loss="reverse_kl", target_format="logits", tokens=4096,
                                              vocab=1000, num_warps=8)
        result = launch.compile_offline(with_sass=False)
        assert checkout.module.tl_arange is None
        print(result.n_regs, result.num_warps, result.name)
    ''')
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    n_regs, num_warps, name = done.stdout.split()[-3:]
    assert int(n_regs) > 0 and num_warps == "8" and name == "toy_forward_backward_kernel"


# --------------------------------------------------------------------------------------------------------------
# perfutils.studies.case_497
# --------------------------------------------------------------------------------------------------------------

NCU_SAMPLE = """\
NVIDIA H100 80GB HBM3 torch 2.11.0+cu130 triton 3.6.0
Version 2025.3.1.0 (build 36398880) (public-release)
=== #497 kernel (Fast-LLM 27f4747e): fast_llm_27f4747e, reverse_kl logits, 4096 x 32768, bf16
$ ncu --clock-control none ...
==WARNING== Note: Running with unmodified GPU clocks.
  triton_reverse_kl_forward_backward_kernel_from_distribution (4096, 1, 1)x(512, 1, 1), Context 1, Stream 7, Device 0, CC 9.0
    Section: GPU Speed Of Light Throughput
    ----------------------- ----------- ------------
    Metric Name             Metric Unit Metric Value
    ----------------------- ----------- ------------
    DRAM Frequency                  Ghz         2.62
    Elapsed Cycles                cycle    9,012,345
    DRAM Throughput                   %        91.50
    Duration                         ms         4.61
    SM Active Cycles              cycle 8,999,998.89
    ----------------------- ----------- ------------
    OPT   Memory is more heavily utilized than Compute: Look at the Memory Workload Analysis section to identify the
          DRAM bottleneck.
    Section: Memory Workload Analysis
    -------------------------------------- ----------- ------------
    Metric Name                            Metric Unit Metric Value
    -------------------------------------- ----------- ------------
    Local Memory Spilling Requests                      402,653,184
    Local Memory Spilling Request Overhead           %      no data
    L2 Hit Rate                                      %        12.10
    -------------------------------------- ----------- ------------
    Section: Occupancy
    ------------------------------- ----------- ------------
    Metric Name                     Metric Unit Metric Value
    ------------------------------- ----------- ------------
    Block Limit Registers                 block            4
    Theoretical Occupancy                     %          100
    Achieved Occupancy                        %        93.75
    ------------------------------- ----------- ------------
    Section: Command line profiler metrics
    --------------------------------------------------------------------- ----------- ------------
    Metric Name                                                           Metric Unit Metric Value
    --------------------------------------------------------------------- ----------- ------------
    dram__bytes_read.sum                                                        Gbyte         7.52
    dram__bytes_write.sum                                                       Gbyte         6.01
    l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum                                 Gbyte         7.00
    smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio                         0.80
    smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio                    11.20
    smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio                42.00
    smsp__average_warps_issue_stalled_selected_per_issue_active.ratio                        1.00
    --------------------------------------------------------------------- ----------- ------------
=== emulation: fused, 32K tile, 16 warps: fused, reverse_kl logits, 4096 x 32768, bf16
  fused_loss_kernel (4096, 1, 1)x(512, 1, 1), Context 1, Stream 7, Device 0, CC 9.0
    Section: GPU Speed Of Light Throughput
    ----------------------- ----------- ------------
    Metric Name             Metric Unit Metric Value
    ----------------------- ----------- ------------
    DRAM Throughput                   %        40.25
    Duration                         us       691.20
    ----------------------- ----------- ------------
    Section: Occupancy
    ------------------------------- ----------- ------------
    Metric Name                     Metric Unit Metric Value
    ------------------------------- ----------- ------------
    Achieved Occupancy                        %        24.80
    ------------------------------- ----------- ------------
"""


def test_parse_ncu_text_reads_sections_and_metrics():
    parsed = ncu.parse_ncu_text(NCU_SAMPLE)
    first = parsed[parsed["launch"] == 0]
    assert set(first["kernel"]) == {"triton_reverse_kl_forward_backward_kernel_from_distribution"}
    assert first["label"].iloc[0].startswith("#497 kernel")
    value = lambda metric: first.loc[first["metric"] == metric, "value"].iloc[0]  # noqa: E731
    assert value("SM Active Cycles") == 8999998.89 and value("Elapsed Cycles") == 9012345.0
    assert value("Local Memory Spilling Requests") == 402653184.0
    assert value("Local Memory Spilling Request Overhead") == "no data"
    assert value("dram__bytes_read.sum") == 7.52
    assert first.loc[first["metric"] == "dram__bytes_read.sum", "unit"].iloc[0] == "Gbyte"
    assert first.loc[first["metric"] == "DRAM Throughput", "section"].iloc[0] == "GPU Speed Of Light Throughput"
    assert not parsed["metric"].str.contains("Memory is more heavily").any()  # rule text is skipped
    assert set(parsed["launch"]) == {0, 1} and parsed[parsed["launch"] == 1]["label"].iloc[0].startswith("emulation")


def test_ncu_summary_one_row_per_launch():
    summary = case_497.ncu_summary(ncu.parse_ncu_text(NCU_SAMPLE))
    assert len(summary) == 2
    issue, ours = summary.iloc[0], summary.iloc[1]
    assert issue["duration_us"] == pytest.approx(4610.0) and ours["duration_us"] == pytest.approx(691.2)
    assert issue["dram_throughput_pct"] == 91.5 and issue["achieved_occupancy_pct"] == 93.75
    assert issue["dram_read_bytes"] == pytest.approx(7.52e9) and issue["local_load_bytes"] == pytest.approx(7e9)
    assert (issue["stall_1"], issue["stall_2"], issue["stall_3"]) == ("long_scoreboard", "lg_throttle", "barrier")
    assert issue["stall_1_cycles"] == 42.0
    assert pd.isna(ours["stall_1"]) and ours["achieved_occupancy_pct"] == 24.8


def test_ncu_command_line():
    argv = case_497.ncu_argv("ncu", "fused", "fused_loss_kernel", python="python3")
    assert argv[:3] == ["ncu", "--clock-control", "none"]
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--section"] == list(case_497.NCU_SECTIONS)
    assert argv[argv.index("-k") + 1] == "regex:fused_loss_kernel" and argv[argv.index("-c") + 1] == "1"
    metrics = argv[argv.index("--metrics") + 1].split(",")
    assert "dram__bytes_read.sum" in metrics and len(metrics) == len(case_497.NCU_METRICS)
    assert argv[-8:] == ["python3", "-m", "perfutils", "case-497", "ncu-target", "fused", "--vocab", "32768"]


def test_sass_counts():
    sass = """
        /*0010*/                   LDL.64 R2, [R1+0x10] ;
        /*0020*/              @!P0 STL [R1+0x4], R5 ;
        /*0030*/                   MUFU.EX2 R4, R4 ;
        /*0040*/                   MUFU.RCP R6, R6 ;
        /*0050*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0060*/                   FADD R1, R2, R3 ;
    """
    assert case_497.sass_counts(sass) == {"sass_ldl": 1, "sass_stl": 1, "sass_ex2": 1, "sass_rcp": 1, "sass_bar": 1,
                                          "sass_instructions": 6}
    assert case_497.sass_counts(None)["sass_ldl"] is None


def test_case_lists(two_checkouts, capsys):
    assert case_497.main(["cases"]) == 0
    out = capsys.readouterr().out
    assert "fast_llm_aaaaaaaa" in out and "fast_llm_b1b1b1b1" in out and "case497.step0" in out
    variants = [case[0] for case in case_497.ABLATION_CASES]
    assert variants[:7] == [f"case497.step{i}" for i in range(6)] + ["fused"]
    assert all(block == 32768 for _, block, _ in case_497.ABLATION_CASES)


class _FakeLaunch:
    """A Fast-LLM launch whose offline compile is made up: a stack of 8 B per warp, one spill outside the loop and
    one inside."""
    name, block_size, num_stages, autotuned, warp_choices = "k", 16384, 3, True, (8, 16)
    SASS = """
        /*0000*/                   STL.64 [R1+0x8], R4 ;
.L_x_1:
        /*0010*/                   LDL R2, [R1] ;
        /*0020*/               @P0 BRA `(.L_x_1) ;
        /*0030*/                   EXIT ;
"""

    def compile_offline(self, warps):
        from types import SimpleNamespace

        return SimpleNamespace(n_regs=64, shared_bytes=0, spill_bytes=8 * warps, spill_store_bytes=8,
                               spill_load_bytes=4, sass=self.SASS, triton_version="3.6.0", ptxas_version="12.8")


class _FakeCheckout:
    variant, commit = "fast_llm_cccccccc", "c" * 40

    def supports(self, loss, target_format):
        return target_format == "logits"


def test_peer_offline_rows_forked_are_the_serial_rows(monkeypatch):
    """fast_llm_offline_rows: every supported shape and warp choice is a row with its spill bytes split by loop, and
    compiling in forked processes gives the same rows in the same order."""
    monkeypatch.setattr(fast_llm, "capture_launches", lambda checkout, **shape: [_FakeLaunch()])
    args = dict(vocabs=(1000, 2000), losses=(("reverse_kl", "logits"), ("cross_entropy", "labels")), log=lambda _: None)
    serial = pd.DataFrame(case_497.fast_llm_offline_rows([_FakeCheckout()], **args)).drop(columns="compile_s")
    forked = pd.DataFrame(case_497.fast_llm_offline_rows([_FakeCheckout()], jobs=2, **args)).drop(columns="compile_s")
    pd.testing.assert_frame_equal(serial, forked)
    assert list(zip(serial["vocab"], serial["num_warps"])) == [(1000, 8), (1000, 16), (2000, 8), (2000, 16)]
    assert (serial["spill_once_bytes"] == 8).all() and (serial["spill_loop_bytes"] == 4).all()


def test_offline_stages_write_where_they_are_told(monkeypatch, tmp_path):
    """The CLI: ``offline --gpu`` writes the compiles to that GPU's folder, ``offline-peers`` compiles Fast-LLM at the
    vocab sweep's vocabularies into its own study, ``ncu --spilling`` profiles the ablation's other spilling steps
    too."""
    from perfutils.studies import vocab_sweep

    written, profiled = [], []
    monkeypatch.setattr(case_497, "fast_llm_checkouts", lambda paths=None: [])
    monkeypatch.setattr(case_497, "offline_table", lambda checkouts, vocabs: pd.DataFrame({"status": ["ok"]}))
    monkeypatch.setattr(case_497, "fast_llm_offline_rows",
                        lambda checkouts, vocabs, jobs: [{"status": "ok", "vocab": v} for v in vocabs])
    monkeypatch.setattr(case_497, "write_offline_table",
                        lambda df, out, checkouts, **kw: written.append((len(df), kw)) or Path(out))
    monkeypatch.setattr(case_497, "run_ncu", lambda out, vocab, targets: profiled.append(targets))
    assert case_497.main(["offline", "--out", str(tmp_path), "--gpu", "NVIDIA H200"]) == 0
    assert case_497.main(["offline-peers", "--out", str(tmp_path)]) == 0
    assert case_497.main(["ncu", "--out", str(tmp_path), "--spilling"]) == 0
    assert case_497.main(["ncu", "--out", str(tmp_path)]) == 0
    assert written[0] == (1, {"overwrite": False, "gpu": "NVIDIA H200"})
    assert written[1] == (len(vocab_sweep.VOCABS), {"overwrite": False, "gpu": case_497.TARGET_GPU,
                                                     "study": case_497.PEERS_OFFLINE_STUDY})
    assert profiled == [case_497.NCU_TARGETS + case_497.SPILLING_TARGETS, case_497.NCU_TARGETS]
    assert {variant for _, variant, _ in case_497.SPILLING_TARGETS} <= {v for v, _, _ in case_497.ABLATION_CASES}


# --------------------------------------------------------------------------------------------------------------
# The real checkouts (FAST_LLM_PATH, Python >= 3.12)
# --------------------------------------------------------------------------------------------------------------

REAL = [Path(p) for p in fast_llm.checkout_paths() if (Path(p) / "fast_llm" / "functional" / "triton").is_dir()]
if sys.version_info < (3, 12):
    WHY_NOT_REAL = (f"Fast-LLM needs Python >= 3.12 (PEP 695 generics); this is Python "
                    f"{sys.version_info.major}.{sys.version_info.minor} (the GPU image has 3.12)")
elif not REAL:
    WHY_NOT_REAL = f"no Fast-LLM checkout: set {fast_llm.ENV_VAR} to folders holding fast_llm/ (e.g. .peers/fast_llm-<commit>)"
else:
    WHY_NOT_REAL = ""
real = pytest.mark.skipif(bool(WHY_NOT_REAL), reason=WHY_NOT_REAL)


@real
@pytest.mark.parametrize("path", REAL, ids=[p.name for p in REAL])
def test_real_checkout_launches(path):
    checkout = fast_llm.load(path)
    assert checkout.commit and checkout.supports("reverse_kl", "logits") and checkout.supports("cross_entropy", "labels")
    (launch,) = fast_llm.capture_launches(checkout, loss="reverse_kl", target_format="logits", tokens=4096,
                                          vocab=32768)
    assert launch.name == "triton_reverse_kl_forward_backward_kernel_from_distribution" and launch.grid == (4096,)
    runtime, constexprs = launch.split_arguments()
    assert constexprs["n_cols"] == 32768 and constexprs["from_logits"] is True
    if checkout.commit.startswith("27f4747e"):  # the #497 launch: 32K tile, 16 warps, Triton's default stages
        assert launch.block_size == 32768 and launch.warp_choices == [16] and not launch.autotuned
    else:  # after 46ffbdd1: 16K tile for distributions, warps autotuned over 8/16/32
        assert launch.block_size == 16384 and launch.autotuned and launch.warp_choices == [8, 16, 32]
    assert launch.num_stages == 3


def test_spill_excerpt_sections_and_recorded_files(two_checkouts, tmp_path):
    from types import SimpleNamespace

    sass = "\n".join([f"        /*{i:04x}*/  FADD R{i}, R1, R2 ;" for i in range(10)]
                     + ["        /*0100*/  STL [R1+0x4], R5 ;", "        /*0110*/  LDL.LU R0, [R1] ;"])
    compiled = SimpleNamespace(sass=sass, name="k", n_regs=32, stack_bytes=1608, triton_version="3.6.0",
                               ptxas_version="12.8", num_warps=16)
    section = case_497._excerpt_section("title", compiled, sites=2)
    head, counts = section.splitlines()[:2]
    assert head == "=== title" and "32 registers, 1608 B stack" in counts and "1 LDL / 1 STL" in counts
    assert "STL [R1+0x4]" in section and "/*0000*/" not in section  # only the lines around the spill sites
    quiet = case_497._excerpt_section("none", SimpleNamespace(**{**vars(compiled), "sass": "FADD R1, R2, R3 ;"}),
                                      sites=2)
    assert "(no local-memory instruction)" in quiet

    assert case_497.recorded_spill_excerpt(tmp_path) is None
    path = case_497.write_spill_excerpts(section, tmp_path, date="2026-01-02")
    assert path.parent.name == "logs" and case_497.recorded_spill_excerpt(tmp_path) == (path, section)
    with pytest.raises(FileExistsError):
        case_497.write_spill_excerpts("other", tmp_path, date="2026-01-02")
    assert path.read_text() == section
    with pytest.raises(ValueError, match="27f4747e"):  # neither toy checkout is the #497 commit
        case_497.spill_excerpts(case_497.fast_llm_checkouts(None))
