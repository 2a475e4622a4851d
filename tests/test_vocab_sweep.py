"""The vocab sweep (notebook 09) on a CPU: its stages (the dry run: rows per stage, planned time), the providers of
what users call, the host-cost and sync columns, the runner (resume, time budget, providers that are missing), the
figures and tables, and the quoted quack figures.

The measured numbers of the figure and table tests are synthetic, written into a temporary folder here (never into
data/); no test depends on timing: clocks are fakes, GPU timings stand-ins.
"""

from __future__ import annotations

import itertools
import json
import math
import warnings
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
import torch

import kernels
from perfutils.measure import host_cost, providers
from perfutils.data import schema
from perfutils.studies import cases as studies, vocab_sweep
from perfutils.measure.measurer import GpuMeasurer, TimingBackend
from perfutils.data.records import load_metadata, load_records
from perfutils.data.store import ResultStore
from perfutils.measure.sweep_config import load_config
from perfutils.measure.timing import BenchResult

REPO = Path(__file__).resolve().parents[1]
H100 = "NVIDIA H100 80GB HBM3"


def quiet(*_):
    pass


# ---- the stages: a dry run of the plan ----------------------------------------------------------------------


def full_grid() -> set[tuple]:
    """The grid of issues 13 and 14, written out independently of the stage code."""
    rows = set()
    for tokens, vocab, (loss, fmt), provider in itertools.product(vocab_sweep.TOKENS, vocab_sweep.VOCABS,
                                                                  vocab_sweep.LOSSES, vocab_sweep.PROJECT):
        rows.add((provider, loss, fmt, "bf16", tokens, vocab))  # every project row fits in 39 GiB
    for vocab, (loss, fmt), provider in itertools.product(vocab_sweep.FP32_VOCABS, vocab_sweep.LOSSES,
                                                          vocab_sweep.PROJECT):
        rows.add((provider, loss, fmt, "fp32", 4096, vocab))
    for tokens, vocabs in ((4096, vocab_sweep.VOCABS), (16384, vocab_sweep.PEER_16K_VOCABS)):
        for vocab, (loss, fmt), provider in itertools.product(vocabs, vocab_sweep.LOSSES, vocab_sweep.PEERS):
            if provider in ("liger", "quack") and fmt != "labels":
                continue
            rows.add((provider, loss, fmt, "bf16", tokens, vocab))
    return rows


def test_stages_cover_the_grid_once_within_the_time_budget():
    seen = Counter()
    names = []
    for stage in vocab_sweep.stages():
        rows = vocab_sweep.stage_rows(stage)
        assert rows, f"{stage.name} is empty"
        planned = vocab_sweep.estimate_seconds(rows)
        assert 0 < planned <= vocab_sweep.STAGE_BUDGET_S < 8 * 60, (stage.name, planned)
        seen.update((r["provider"], r["loss"], r["target_format"], r["dtype"], r["tokens"], r["vocab"]) for r in rows)
        names.append(stage.name)
    assert len(names) == len(set(names))
    assert max(seen.values()) == 1, "a configuration sits in two stages"
    assert set(seen) == full_grid()
    assert len(seen) == 17 * 3 * 4 * 3 + 3 * 4 * 3 + 17 * 10 + 5 * 10  # 868


def test_stage_table_and_cli_list_rows_and_minutes(capsys):
    table = vocab_sweep.stages_table()
    assert list(table["stage"]) == [s.name for s in vocab_sweep.stages() + vocab_sweep.same_run_stages()]
    assert table.loc[table["study"] == vocab_sweep.STUDY, "rows"].sum() == len(full_grid())
    assert (table["est_minutes"] <= vocab_sweep.STAGE_BUDGET_S / 60).all()
    assert vocab_sweep.main(["stages"]) == 0
    out = capsys.readouterr().out
    assert f"{len(table)} stages, {table['rows'].sum()} configurations" in out
    with pytest.raises(ValueError, match="unknown stage 'nope'"):
        vocab_sweep.find_stage("nope")
    assert vocab_sweep.main(["run", "public-4096-1", "nope"]) == 2  # refused before anything runs
    assert "unknown stage 'nope'" in capsys.readouterr().err


def test_same_run_stages_time_every_provider_of_a_cell_in_one_process():
    stages = vocab_sweep.same_run_stages()
    assert {s.study for s in stages} == {vocab_sweep.SAME_RUN_STUDY} != {vocab_sweep.STUDY}
    cells = {}
    for stage in stages:
        for row in vocab_sweep.stage_rows(stage):
            cells.setdefault((row["tokens"], row["vocab"], row["loss"], row["target_format"]), set()).add(
                (stage.name, row["provider"]))
    # issue 13's grid: 4096 and 16384 tokens x five vocabularies x the four losses, all four providers of a cell
    # in the same stage (one process)
    assert len(cells) == 2 * 5 * 4
    for found in cells.values():
        assert len({name for name, _ in found}) == 1
        assert {provider for _, provider in found} == {"public", "public_autograd", "plan", "fast_llm"}
    assert vocab_sweep.find_stage(stages[0].name) == stages[0]


def test_memory_rule():
    assert vocab_sweep.fits("project", 16384, 262144, "reverse_kl", "logits")  # 24 GiB of inputs and gradients
    assert vocab_sweep.fits("peers", 16384, 151936, "reverse_kl", "logits")
    assert not vocab_sweep.fits("project", 65536, 262144, "reverse_kl", "logits")
    stage = vocab_sweep.Stage("big", "project", ("public",), 65536, (32000, 262144))
    assert {r["vocab"] for r in vocab_sweep.stage_rows(stage)} == {32000}  # 65536 x 262144 is left out


def test_estimates_grow_with_rows_and_shapes():
    small = vocab_sweep.Stage("a", "project", ("public",), 4096, (32000,))
    large = vocab_sweep.Stage("b", "project", ("public", "plan"), 4096, (32000, 262144))
    assert vocab_sweep.estimate_seconds([]) == 0
    assert vocab_sweep.estimate_seconds(vocab_sweep.stage_rows(small)) < vocab_sweep.estimate_seconds(
        vocab_sweep.stage_rows(large))


# ---- providers of what users call ---------------------------------------------------------------------------


def tiny(loss, fmt, rows=4, vocab=40, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, vocab, generator=gen) * 2).to(dtype)
    t = (torch.randint(0, vocab, (rows,), generator=gen) if fmt == "labels"
         else (torch.randn(rows, vocab, generator=gen) * 2).to(dtype))
    return x, t


@pytest.mark.parametrize("variant", ["public", "public_autograd", "plan"])
@pytest.mark.parametrize("loss, fmt", [("cross_entropy", "labels"), ("reverse_kl", "logits")])
def test_entry_point_providers_match_float64(variant, loss, fmt):
    x, t = tiny(loss, fmt)
    plan = providers.prepare(x, t, loss=loss, target_format=fmt, variant=variant, block_size=None, num_warps=None)
    ref_loss, ref_grad = kernels.reference.entropy_loss_forward_backward(x, t, loss=loss, target_format=fmt)
    for _ in range(2):  # the first run records the choice, the second is a plain repeated call
        value, grad = plan.run()
        assert value.dim() == 0 and torch.allclose(value.double(), ref_loss, rtol=1e-5)
        assert torch.allclose(grad.double(), ref_grad, rtol=1e-4, atol=1e-7)
    assert plan.config["variant"] in ("fused", "two_pass", "split_row") and plan.config["source"]
    if variant == "public_autograd":
        assert x.grad is None  # the provider's leaf shares the logits' memory but not their autograd state


def test_entry_points_refuse_a_configuration():
    x, t = tiny("cross_entropy", "labels")
    with pytest.raises(ValueError, match="runs variant auto as users call it"):
        providers.prepare(x, t, variant="public", block_size=64)


def test_optional_peers_say_why_they_are_missing(monkeypatch):
    monkeypatch.setattr(providers, "_importable", lambda module: False)
    assert providers.unavailable("quack") == "quack is not importable here"
    assert providers.unavailable("liger") == "liger_kernel is not importable here"
    assert providers.unavailable("public") is None
    monkeypatch.delenv("FAST_LLM_PATH", raising=False)
    assert "FAST_LLM_PATH" in providers.unavailable("fast_llm")
    assert providers.supports("quack", "cross_entropy", "labels")
    assert not providers.supports("liger", "reverse_kl", "logits")
    assert providers.supports("public", "forward_kl", "logits")
    assert not providers.supports("case497.step0", "cross_entropy", "labels")


def test_optional_peer_rows_say_which_source_they_ran(tmp_path, monkeypatch):
    """A peer put on the path from a source extraction (as .peers/liger-<commit>/src, with COMMIT at the top) records
    that commit; the same package without the file records none, and no version when it was not installed."""
    import sys

    package = tmp_path / "liger-abc" / "src" / "liger_kernel"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    commit = "0123456789abcdef0123456789abcdef01234567"
    (tmp_path / "liger-abc" / "COMMIT").write_text(commit + "\n")
    monkeypatch.syspath_prepend(str(package.parent))
    monkeypatch.delitem(sys.modules, "liger_kernel", raising=False)
    monkeypatch.chdir(tmp_path)
    source = providers.peer_source("liger")
    assert source == {"liger_path": str(Path("liger-abc/src/liger_kernel")), "liger_commit": commit,
                      "liger_version": None}
    (tmp_path / "liger-abc" / "COMMIT").unlink()
    assert providers.peer_source("liger")["liger_commit"] is None


# ---- host cost and syncs --------------------------------------------------------------------------------------


def test_time_host_calls_counts_calls_between_syncs():
    events, now = [], [0.0]

    def run():
        events.append("run")
        now[0] += 2e-6  # 2 µs per call

    def sync():
        events.append("sync")
        now[0] += 10e-6  # the GPU's tail, once per batch

    times = host_cost.time_host_calls(run, sync, calls=5, repeats=3, warmup=2, clock=lambda: now[0])
    assert events[:3] == ["run", "run", "sync"]
    assert events.count("run") == 2 + 15 and events.count("sync") == 4
    assert times == pytest.approx([2.0] * 3)  # 5 x 2 µs / 5 calls: the GPU's tail (the sync) is not the host's
    with pytest.raises(ValueError, match="calls must be a positive int"):
        host_cost.time_host_calls(run, sync, calls=0)


def test_time_host_calls_warms_up_for_a_time_before_timing():
    events, now = [], [0.0]

    def run():
        events.append("run")
        now[0] += 0.01

    times = host_cost.time_host_calls(run, lambda: events.append("sync"), calls=4, repeats=2, warmup=1,
                                      warmup_s=0.1, clock=lambda: now[0])
    # 1 warm-up call and its sync, then batches of 4 until 0.1 s passed (3 batches: 0.13 s), then 2 timed batches
    assert events.count("run") == 1 + 3 * 4 + 2 * 4 and events.count("sync") == 1 + 3 + 2
    assert times == pytest.approx([1e4, 1e4])
    with pytest.raises(ValueError, match="warmup_s"):
        host_cost.time_host_calls(run, lambda: None, warmup_s=-1)


def test_trace_host_batches_reports_time_and_collections_per_batch():
    now = [0.0]

    def run():
        now[0] += 1e-6

    trace = host_cost.trace_host_batches(run, lambda: None, calls=10, batches=3, warmup=0, clock=lambda: now[0])
    assert [round(row["t_s"], 9) for row in trace] == [0.0, 1e-5, 2e-5]
    assert all(row["us_per_call"] == pytest.approx(1.0) and row["gc0"] >= 0 for row in trace)


def test_count_syncs_counts_pytorch_sync_warnings_and_restores_the_mode(monkeypatch):
    mode = {"now": 0}
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: mode["now"])

    def set_mode(value):
        if value == "warn":  # what PyTorch says each time the mode is turned on: not a sync
            warnings.warn("Synchronization debug mode is a prototype feature and does not yet detect all "
                          "synchronizing operations")
        mode["now"] = value

    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", set_mode)

    def two_syncs():
        if mode["now"] == "warn":
            warnings.warn("called a synchronizing CUDA operation")
            warnings.warn("called a synchronizing CUDA operation")
            warnings.warn("something else")
        return "result"

    assert host_cost.count_syncs(two_syncs) == 2 and mode["now"] == 0
    assert host_cost.count_syncs(two_syncs) == 2  # "always": repeated warnings are not swallowed

    def fails():
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        host_cost.count_syncs(fails)
    assert mode["now"] == 0


class CountingPlan:
    def __init__(self, calls):
        self.calls = calls

    def run(self):
        self.calls.append(1)
        return None


def test_call_costs_columns_once_per_provider_loss_dtype_vocab():
    from types import SimpleNamespace

    made, ran = [], []

    def prepare(logits, target, **options):
        made.append((tuple(logits.shape), options["variant"]))
        return CountingPlan(ran)

    costs = host_cost.CallCosts(prepare, device="cpu", calls=3, repeats=2, warmup=1, warmup_s=0, count=lambda run: 7)
    point = SimpleNamespace(variant="plan", loss="cross_entropy", target_format="labels", dtype="bf16", vocab=40,
                            tokens=4096)
    first = costs(point, CountingPlan([]))
    again = costs(SimpleNamespace(**{**vars(point), "tokens": 16384}), CountingPlan([]))
    assert made == [((host_cost.HOST_ROWS, 40), "plan")] and len(ran) == 1 + 3 * 2  # measured once
    assert first["syncs_per_call"] == 7 and first["kernel_only"] is True and first["host_rows"] == 8
    assert first["host_us_per_call"] == again["host_us_per_call"] > 0


def test_tiny_inputs():
    x, t = host_cost.tiny_inputs("cross_entropy", "labels", torch.bfloat16, 50, device="cpu")
    assert x.shape == (8, 50) and x.dtype == torch.bfloat16 and t.shape == (8,) and t[-1] == -100
    x, t = host_cost.tiny_inputs("reverse_kl", "logits", torch.float32, 50, device="cpu")
    assert t.shape == x.shape


# ---- the measurer's extra columns and the runner ------------------------------------------------------------


def eager_measurer(out, extra=None):
    spec = load_config(dict(study="t", out=str(out), loss="cross_entropy", target_format="labels", variant="auto",
                            dtype="fp32", tokens=4, vocab=40, check_rows=4))
    backend = TimingBackend(lambda fn, **_: (fn(), BenchResult(1.0, 0.9, 1.1))[1], lambda fn: (fn(), 0.0), None)
    return GpuMeasurer(spec, device="cpu", prepare=providers.prepare, backend=backend, copy_gbps=1.0, log=quiet,
                       extra=extra)


def test_measurer_adds_extra_columns_and_refuses_to_replace_measured_ones(tmp_path):
    from perfutils.measure.sweep_config import SweepPoint

    point = SweepPoint("cross_entropy", "labels", "eager", "fp32", 4, 40, None, None)
    seen = []
    row = eager_measurer(tmp_path, extra=lambda p, plan: seen.append(plan) or {"host_us_per_call": 3.0})(point)
    assert row["status"] == "ok" and row["host_us_per_call"] == 3.0 and len(seen) == 1
    with pytest.raises(ValueError, match="would replace measured ones"):
        eager_measurer(tmp_path, extra=lambda p, plan: {"ms_median": 0.0})(point)
    with pytest.raises(TypeError, match="extra must be a callable"):
        eager_measurer(tmp_path, extra=3)


class FakeMeasure:
    copy_gbps = 1000.0

    def __init__(self):
        self.points = []

    def __call__(self, point):
        self.points.append(point)
        return {"status": "ok", "ms_median": 1.0, "ms_p20": 1.0, "ms_p80": 1.0, "host_us_per_call": 5.0,
                "syncs_per_call": 0}


def test_run_cases_filters_resumes_stops_at_the_deadline_and_leaves_out_missing_peers(tmp_path, monkeypatch):
    monkeypatch.setattr(providers, "_importable", lambda module: False)  # no quack, no liger here
    lines, measure = [], FakeMeasure()
    common = dict(losses=[("cross_entropy", "labels"), ("reverse_kl", "logits")], vocabs=[40, 80], tokens=[4],
                  out=str(tmp_path), log=lines.append, measurer=measure)
    frame = studies.run_cases("s", [("public", None, None), ("quack", None, None)],
                              keep=lambda tokens, vocab, loss, fmt, variant: vocab == 40 or loss == "reverse_kl",
                              **common)
    assert any("leaving out quack: quack is not importable here" in line for line in lines)
    assert [(p.vocab, p.loss) for p in measure.points] == [(40, "cross_entropy"), (40, "reverse_kl"), (80, "reverse_kl")]
    assert len(frame) == 3 and set(frame["variant"]) == {"public"}
    meta = load_metadata(tmp_path / "cpu" / "s.csv")
    assert meta["sessions"] == [] and meta["parameters"]["study"] == "s"  # one session for the whole call
    again = FakeMeasure()
    studies.run_cases("s", [("public", None, None)], **{**common, "measurer": again})
    assert [(p.vocab, p.loss) for p in again.points] == [(80, "cross_entropy")]  # resumed: only what was missing
    late = FakeMeasure()
    lines.clear()
    assert studies.run_cases("s2", [("public", None, None)], deadline=0.0, **{**common, "measurer": late}) is None
    assert late.points == [] and any("time budget reached with 4 configurations not started" in l for l in lines)


def test_run_stage_with_a_stand_in_measurer(tmp_path):
    stage = vocab_sweep.Stage("tiny", "project", ("public", "plan"), 4, (40, 80),
                              losses=(("cross_entropy", "labels"),))
    measure = FakeMeasure()
    frame = vocab_sweep.run_stage(stage, out=str(tmp_path), measurer=measure, log=quiet)
    assert len(frame) == 4 and len(measure.points) == 4
    meta = load_metadata(tmp_path / "cpu" / "vocab_sweep.csv")
    assert meta["parameters"]["stage"] == "tiny" and "fast_llm" in meta["parameters"]
    measure = FakeMeasure()
    vocab_sweep.run_stage(stage, out=str(tmp_path), measurer=measure, log=quiet)
    assert measure.points == []  # nothing left to measure


def test_cpu_dry_run_through_the_whole_path(tmp_path):
    """The project's three providers and eager PyTorch, under the interpreter, through measurer, extra columns,
    store and sidecar (timings are stand-ins; syncs are not counted without CUDA)."""
    frame = vocab_sweep.cpu_dry_run(str(tmp_path), tokens=4, vocab=40,
                                    losses=[("cross_entropy", "labels"), ("forward_kl", "logits")], calls=1, log=quiet)
    assert len(frame) == 2 * 4 and set(frame["status"]) == {"ok"}
    assert (frame["host_us_per_call"] > 0).all() and frame["syncs_per_call"].isna().all()
    assert frame.groupby("variant")["kernel_only"].first().to_dict() == {
        "eager": False, "plan": True, "public": False, "public_autograd": False}
    chosen = frame[frame["variant"].isin(["public", "public_autograd", "plan"])]["plan_config"].map(json.loads)
    assert all(config["variant"] == "split_row" for config in chosen)  # auto's choice without a GPU: the heuristic


# ---- figures and tables of synthetic data -------------------------------------------------------------------

# % of copy each provider reaches in the synthetic data (public has a cliff at 50257 for reverse KL).
SYNTHETIC_PCT = {"public": 80.0, "public_autograd": 78.0, "plan": 82.0, "torch_compile": 30.0, "fast_llm": 50.0,
                 "liger": 25.0}


PLAN_CONFIGS = {"fast_llm": {"fast_llm_commit": "7d61a1ba" + "0" * 32},
                "public": {"variant": "split_row", "block_size": 4096, "num_warps": 4, "options": {},
                           "source": "first-call search"}}


def write_synthetic(folder: Path, gpu: str = H100, vocabs=(32000, 50257, 131072), tokens=(1024, 4096)) -> Path:
    """A small vocab_sweep.csv in a temporary folder (synthetic: for tests only)."""
    from perfutils.model.roofline import loss_cost

    copy = 3000.0
    meta = {"gpu_name": gpu, "torch_version": "0.test", "triton_version": "0.test", "copy_gbps": copy,
            "timestamp_utc": "2026-01-02T03:04:05Z", "parameters": {"study": "vocab_sweep"}}
    store = ResultStore(schema.data_path(folder, gpu, "vocab_sweep"), meta)
    rows = []
    for n_tokens, vocab, (loss, fmt), provider in itertools.product(tokens, vocabs, vocab_sweep.LOSSES,
                                                                    SYNTHETIC_PCT):
        if provider == "liger" and fmt != "labels":
            continue
        pct = SYNTHETIC_PCT[provider] * (0.5 if (provider == "public" and vocab == 50257 and loss == "reverse_kl")
                                         else 1.0)
        bytes_min = int(loss_cost(loss, fmt, n_tokens, vocab, 2).bytes)
        ms = bytes_min / (copy * 1e9 * pct / 100) * 1e3
        rows.append(dict(loss=loss, target_format=fmt, variant=provider, dtype="bf16", tokens=n_tokens, vocab=vocab,
                         block_size=None, num_warps=None, ms_median=ms, ms_p20=ms, ms_p80=ms, bytes_min=bytes_min,
                         gbps=bytes_min / (ms * 1e-3) / 1e9, pct_of_copy=pct, max_rel_err=1e-3, status="ok",
                         gpu_name=gpu, host_us_per_call={"public": 20.0, "plan": 9.0}.get(provider, 60.0) + vocab / 1e4,
                         syncs_per_call=0 if provider != "liger" else 1, kernel_only=provider == "plan",
                         plan_config=json.dumps(PLAN_CONFIGS.get(provider, {})) if provider in PLAN_CONFIGS else None))
    store.append(rows)
    return store.path


@pytest.fixture
def synthetic(tmp_path):
    path = write_synthetic(tmp_path)
    return load_records(path), path.parent


def test_cell_table_and_worst_cells(synthetic):
    from perfutils.plots import vocab_sweep as plots

    df, _ = synthetic
    table = plots.cell_table(df, tokens=4096)
    assert len(table) == 3 * 4 and list(table["loss_label"].cat.categories)[0] == "cross_entropy (labels)"
    row = table[(table["loss_label"] == "reverse_kl") & (table["vocab"] == 50257)].iloc[0]
    assert row["public_pct_of_copy"] == 40.0 and math.isnan(row["liger"])
    worst = plots.worst_cells(df)
    cell = worst["vs_peer"]
    assert (cell["loss_label"], cell["vocab"], cell["peer"]) == ("reverse_kl", 50257, "fast_llm")
    assert cell["ratio"] == pytest.approx(50.0 / 40.0) and cell["pct_of_copy"] == 40.0
    assert worst["lowest_pct"]["pct_of_copy"] == 40.0 and worst["cells"] == 2 * 3 * 4


def test_auto_choices_table(synthetic):
    from perfutils.plots import vocab_sweep as plots

    df, _ = synthetic
    table = plots.auto_choices(df)
    assert len(table) == 2 * 3 * 4 and set(table["chosen_variant"]) == {"split_row"}
    assert set(table["chosen_source"]) == {"first-call search"}
    assert plots.auto_choices(df, provider="torch_compile")["chosen_variant"].isna().all()


def test_summary_table_is_generated_from_the_data(synthetic):
    from perfutils.plots import summary

    _, gpu_dir = synthetic
    text = summary.vocab_sweep_table(gpu_dir, vocabs=(32000, 131072))
    lines = text.splitlines()
    assert lines[0].startswith("| loss × vocab | torch.compile (ms) | Fast-LLM (ms) | Liger-Kernel (ms) | public call (ms) | "
                               "plan, kernel-only (ms)")
    assert lines[2].startswith("| cross_entropy (labels) 32000 | ") and lines[2].endswith("| 80% | 23 | 0 |")
    days = sorted({str(stamp)[:10] for stamp in pd.read_csv(gpu_dir / "vocab_sweep.csv")["timestamp_utc"]})
    recorded = days[0] if days[0] == days[-1] else f"{days[0]} to {days[-1]}"  # the rows' days, not the sidecar's
    assert "Fast-LLM 7d61a1ba" in text and "copy bandwidth 3000 GB/s" in text and f"recorded {recorded} (" in text
    assert "Worst cell against the peers (24 cells with a peer measured, bf16): reverse_kl 1024 × 50257" in text
    assert "quack" not in text  # no quoted reference in this folder
    vocab_sweep.write_quack_reference(str(gpu_dir.parent))
    assert "quack-kernels, labels cross-entropy, quoted from the issue" in summary.vocab_sweep_table(gpu_dir)


def test_quack_reference_only_beside_the_same_gpu(tmp_path):
    from perfutils.plots import summary

    gpu_dir = write_synthetic(tmp_path, gpu="NVIDIA H200").parent
    (gpu_dir / "quack_reference.csv").write_text((REPO / "data/h100-sxm-80gb/quack_reference.csv").read_text())
    (gpu_dir / "quack_reference.json").write_text((REPO / "data/h100-sxm-80gb/quack_reference.json").read_text())
    assert summary.quack_line(load_records(gpu_dir / "vocab_sweep.csv"), gpu_dir) is None


def test_figures_are_deterministic(synthetic, tmp_path):
    import matplotlib.pyplot as plt

    from perfutils.plots import vocab_sweep as plots
    from perfutils.plots.figures import save_figure

    df, _ = synthetic
    reference = vocab_sweep.quack_reference_frame()
    outputs = []
    for attempt in range(2):
        for name, make in (("pct", lambda: plots.plot_pct_of_copy(df, reference=reference)),
                           ("host", lambda: plots.plot_host_cost(df))):
            fig = make()
            outputs.append([p.read_bytes() for p in save_figure(fig, tmp_path / f"{attempt}" / name)])
            plt.close(fig)
    assert outputs[:2] == outputs[2:]
    fig = plots.plot_pct_of_copy(df, reference=reference)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels[:3] == ["public call (ours)", "autograd: entropy_loss + backward (ours)", "plan, kernel-only (ours)"]
    assert labels[-1].startswith("quack, quoted")
    plt.close(fig)
    table = plots.host_cost_table(df)
    assert table.loc[(table["provider"] == "liger"), "syncs_per_call"].max() == 1


def test_figures_say_what_is_missing(synthetic):
    from perfutils.plots import vocab_sweep as plots

    df, _ = synthetic
    with pytest.raises(ValueError, match="no ok rows of dtype fp32"):
        plots.plot_pct_of_copy(df, dtype="fp32")
    with pytest.raises(ValueError, match="missing columns"):
        plots.plot_host_cost(df.drop(columns=["host_us_per_call"]))


# ---- the quoted quack figures -------------------------------------------------------------------------------


def test_quack_reference_is_the_quoted_table_and_never_overwritten(tmp_path):
    path = vocab_sweep.write_quack_reference(str(tmp_path))
    written = pd.read_csv(path)
    assert list(zip(written["tokens"], written["vocab"], written["ms_median"])) == list(vocab_sweep.QUACK_REFERENCE)
    meta = load_metadata(path)
    assert "not measured here" in meta["note"] and meta["measured"] == "2026-11-23" and meta["gpu_name"] == H100
    with pytest.raises(FileExistsError):
        vocab_sweep.write_quack_reference(str(tmp_path))
    committed = pd.read_csv(REPO / "data" / "h100-sxm-80gb" / "quack_reference.csv")
    pd.testing.assert_frame_equal(committed, written)


# ---- notebook 09 on synthetic data --------------------------------------------------------------------------


def test_notebook_09_replays_recorded_data(tmp_path):
    """The notebook (pending until the GPU data is committed) runs headless on a synthetic data folder."""
    papermill = pytest.importorskip("papermill")
    source = REPO / "notebooks" / "09_vocab_sweep.ipynb"
    if not source.exists():
        source = REPO / "notebooks" / "09_vocab_sweep.ipynb.pending"
    data = tmp_path / "data"
    write_synthetic(data, vocabs=(32000, 50257, 131072), tokens=(1024, 4096))
    vocab_sweep.write_quack_reference(str(data))
    copy = tmp_path / "09.ipynb"
    copy.write_bytes(source.read_bytes())
    papermill.execute_notebook(str(copy), str(tmp_path / "out.ipynb"), cwd=str(REPO), kernel_name="python3",
                               progress_bar=False,
                               parameters=dict(MODE="replay", DATA_DIR=str(data), FIG_DIR=str(tmp_path / "figures"),
                                               GPU=H100))
    assert (tmp_path / "figures" / "09_vocab_sweep.svg").exists()
    assert (tmp_path / "figures" / "09_host_cost.svg").exists()


# The tables of the recorded data on the report's landing page: tests/test_report_index.py.


def test_public_call_table_from_a_small_record(tmp_path):
    """Ratios are the worst over the losses of a cell; a sync in the first row a process recorded is named so."""
    from perfutils.data.store import write_table
    from perfutils.plots import summary

    rows = []
    for n, (variant, ms, host, syncs) in enumerate([("public", 1.02, 30.0, 1), ("public_autograd", 1.10, 150.0, 0),
                                                     ("plan", 1.00, 20.0, 0), ("fast_llm", 2.04, 120.0, 0)]):
        for k, loss in enumerate(("forward_kl", "reverse_kl")):
            rows.append(dict(loss=loss, target_format="logits", variant=variant, dtype="bf16", tokens=4096,
                             vocab=32000, ms_median=ms * (1 + k), host_us_per_call=host + k, status="ok",
                             syncs_per_call=syncs if (n, k) == (0, 0) else 0,
                             timestamp_utc=f"2026-11-23T10:00:{2 * n + k:02d}Z", study="public_call",
                             gpu_name="NVIDIA H100 80GB HBM3", config_key=f"{variant};{loss}"))
    from perfutils.data.schema import COLUMNS

    frame = pd.DataFrame(rows)
    for column in COLUMNS:  # the schema's other columns, empty
        if column not in frame:
            frame[column] = None
    gpu_dir = tmp_path / "h100-sxm-80gb"
    gpu_dir.mkdir()
    write_table(frame, gpu_dir / "public_call.csv",
                {"gpu_name": "NVIDIA H100 80GB HBM3", "timestamp_utc": "2026-11-23T09:59:59Z"})
    text = summary.public_call_table(gpu_dir)
    assert "| 4096 × 32000 | 1.020 | 1.100 | 0.50 | 30–31 | 120–121 | 1 |" in text
    assert "0 syncs in 1 of 2 cells (the 1 call with one sync: the first configuration a process measured)" in text


def test_narrow_keeps_a_part_of_a_stage_and_refuses_unknown_names():
    stage = vocab_sweep.find_stage("peers-4096-1")
    part = vocab_sweep.narrow(stage, vocabs=[32000, 50257], providers=["fast_llm"])
    assert part.vocabs == tuple(v for v in stage.vocabs if v in (32000, 50257)) and part.providers == ("fast_llm",)
    with pytest.raises(ValueError, match="not in the grid"):
        vocab_sweep.narrow(stage, vocabs=[12345])
    with pytest.raises(ValueError, match="providers"):
        vocab_sweep.narrow(stage, providers=["nobody"])


def test_coverage_counts_planned_recorded_and_missing_rows():
    stage = vocab_sweep.find_stage("peers-16384-2")
    planned = [r for r in vocab_sweep.stage_rows(stage) if r["provider"] == "fast_llm"]
    first, second = planned[0], planned[1]
    recorded = pd.DataFrame([
        dict(variant="fast_llm", loss=first["loss"], target_format=first["target_format"], dtype=first["dtype"],
             tokens=first["tokens"], vocab=first["vocab"], status="ok"),
        dict(variant="fast_llm", loss=second["loss"], target_format=second["target_format"], dtype=second["dtype"],
             tokens=second["tokens"], vocab=second["vocab"], status="error"),
        dict(variant="fast_llm", loss="reverse_kl", target_format="logits", dtype="bf16", tokens=7, vocab=3,
             status="ok"),  # outside the grid: not counted
    ])
    grid = vocab_sweep.coverage(recorded)
    row = grid[(grid["stage"] == stage.name) & (grid["provider"] == "fast_llm")].iloc[0]
    assert (row["planned"], row["ok"], row["other"], row["missing"]) == (len(planned), 1, 1, len(planned) - 2)
    assert (grid["planned"] == grid["ok"] + grid["other"] + grid["missing"]).all()
    assert grid["ok"].sum() == 1 and grid["other"].sum() == 1


def test_forget_project_rows_keeps_the_whole_file_and_says_what_it_took_out(tmp_path):
    """The project's rows of the chosen token counts leave the study (its stages then measure them again); peers and
    other token counts stay; the whole file and sidecar are kept in a .replaced copy the sidecar names."""
    import json

    import pandas as pd

    from perfutils.studies.vocab_sweep import forget_project_rows

    path = tmp_path / "vocab_sweep.csv"
    rows = [{"variant": v, "tokens": t, "dtype": "bf16", "vocab": 32000} for v in ("public", "plan", "public_autograd",
                                                                                   "fast_llm") for t in (1024, 4096)]
    pd.DataFrame(rows).to_csv(path, index=False)
    path.with_suffix(".json").write_text(json.dumps({"study": "vocab_sweep", "sessions": []}))
    kept = forget_project_rows(path, [4096], log=lambda *_: None)
    left = pd.read_csv(path)
    assert sorted(zip(left["variant"], left["tokens"])) == sorted(
        [("fast_llm", 1024), ("fast_llm", 4096), ("plan", 1024), ("public", 1024), ("public_autograd", 1024)])
    assert pd.read_csv(kept).equals(pd.DataFrame(rows)) and kept.with_suffix(".json").exists()
    meta = json.loads(path.with_suffix(".json").read_text())
    assert meta["forgotten"][0]["rows"] == 3 and meta["forgotten"][0]["kept_in"] == kept.name
    assert forget_project_rows(path, [4096], log=lambda *_: None) is None  # nothing left to take out: no new copy
    assert len(list(tmp_path.glob("*.replaced-*.csv"))) == 1


def test_forget_project_rows_of_one_loss(tmp_path):
    """losses= takes out only those losses' project rows (a change to one loss's kernel) and says so."""
    import json

    import pandas as pd

    from perfutils.studies.vocab_sweep import forget_project_rows

    path = tmp_path / "vocab_sweep.csv"
    rows = [{"loss": loss, "target_format": fmt, "variant": v, "tokens": 4096, "dtype": "bf16", "vocab": 32000}
            for loss, fmt in (("cross_entropy", "labels"), ("cross_entropy", "logits")) for v in ("public", "fast_llm")]
    pd.DataFrame(rows).to_csv(path, index=False)
    path.with_suffix(".json").write_text(json.dumps({"study": "vocab_sweep", "sessions": []}))
    forget_project_rows(path, losses=["cross_entropy/labels"], log=lambda *_: None)
    left = pd.read_csv(path)
    assert sorted(zip(left["target_format"], left["variant"])) == [("labels", "fast_llm"), ("logits", "fast_llm"),
                                                                   ("logits", "public")]
    meta = json.loads(path.with_suffix(".json").read_text())
    assert meta["forgotten"][0]["losses"] == ["cross_entropy/labels"] and meta["forgotten"][0]["rows"] == 1
    # A second forget within the same second keeps its own copy (it once overwrote the first's).
    second = forget_project_rows(path, losses=["cross_entropy/logits"], log=lambda *_: None)
    copies = sorted(tmp_path.glob("*.replaced-*.csv"))
    assert len(copies) == 2 and second in copies and len(pd.read_csv(second)) == 3


def test_autograd_ratio_compares_only_rows_one_process_measured(tmp_path):
    """The autograd form over the plain call where both rows come from one process (the sidecar's sessions); a cell
    whose rows come from different processes gets no ratio in the sentence, only a count."""
    meta = {"timestamp_utc": "2026-11-25T10:00:00Z", "code_commit": "aaaaaaa",
            "sessions": [{"timestamp_utc": "2026-11-27T10:00:00Z", "code_commit": "bbbbbbb",
                          "parameters": {"cases": [["public", None, None], ["public_autograd", None, None]],
                                         "tokens": [1024]}}]}
    from perfutils.plots import vocab_sweep as plots

    rows = []
    for variant, vocab, ms, stamp in [("public", 32000, 0.05, "2026-11-27T10:01:00Z"),
                                      ("public_autograd", 32000, 0.20, "2026-11-27T10:02:00Z"),
                                      ("public", 50257, 0.10, "2026-11-27T10:03:00Z"),
                                      ("public_autograd", 50257, 0.11, "2026-11-25T10:04:00Z")]:
        rows.append(dict(loss="cross_entropy", target_format="labels", variant=variant, dtype="bf16", tokens=1024,
                         vocab=vocab, ms_median=ms, pct_of_copy=50.0, status="ok", gpu_name=H100, timestamp_utc=stamp))
    ratios = plots.autograd_ratio(pd.DataFrame(rows), meta)
    assert ratios["side_by_side"].tolist() == [True, False]
    assert ratios.loc[0, "autograd_over_public"] == pytest.approx(4.0) and ratios.loc[0, "code_commit"] == "bbbbbbb"
    line = plots.autograd_line(ratios)
    assert "measured by one process on 2026-11-27, commit bbbbbbb: 4.00× at 1024 tokens (1 cell, vocab 32000)" in line
    assert "At 1 cell the two forms' rows come from different processes" in line
    assert plots.autograd_line(ratios[~ratios["side_by_side"]]) is None


def test_public_over_plan_names_the_cells_a_timing_moment_slowed():
    """The public call over its own plan where one process timed both; a cell over 1.05x whose host share is small
    and whose public row followed a long first call is named with that reading; a plan of another process gives no
    ratio."""
    from perfutils.plots import vocab_sweep as plots

    cases = {"cases": [["public", None, None], ["plan", None, None]], "tokens": [16384]}
    meta = {"timestamp_utc": "2026-11-29T19:00:00Z", "parameters": cases,
            "sessions": [{"timestamp_utc": "2026-11-29T20:00:00Z", "parameters": cases}]}
    rows = []
    for variant, vocab, ms, first, stamp in [("public", 131072, 4.5, 800.0, "2026-11-29T19:01:00Z"),
                                             ("plan", 131072, 4.0, 3.0, "2026-11-29T19:01:02Z"),
                                             ("public", 32000, 1.0, 600.0, "2026-11-29T19:02:00Z"),
                                             ("plan", 32000, 1.0, 2.0, "2026-11-29T19:02:01Z"),
                                             ("public", 65536, 2.0, 600.0, "2026-11-29T19:03:00Z"),
                                             ("plan", 65536, 1.5, 2.0, "2026-11-29T20:03:00Z")]:
        rows.append(dict(loss="forward_kl", target_format="logits", variant=variant, dtype="bf16", tokens=16384,
                         vocab=vocab, ms_median=ms, pct_of_copy=70.0, status="ok", gpu_name=H100,
                         timestamp_utc=stamp, host_us_per_call=20.0, compile_ms=first))
    gaps = plots.public_over_plan(pd.DataFrame(rows), meta)
    assert gaps["vocab"].tolist() == [32000, 131072]  # 65536's plan ran in the later process
    assert gaps["public_over_plan"].tolist() == pytest.approx([1.0, 1.125])
    line = plots.plan_gap_line(gaps)
    assert "1.00–1.12× over 2 cells; over 1.05× at 1: forward_kl 16384 × 131072 1.12×." in line
    assert "host time is at most 0.5% of the plan's time" in line and "first call of 800 ms or more" in line
    assert "its cell after one of 3 ms at most" in line and "None of them was timed with the GPU idled" in line
    meta["parameters"]["settle_ms"] = 1000.0  # the same rows from a process that idled the GPU first
    assert "1 of them was timed with the GPU idled after the first call" in plots.plan_gap_line(
        plots.public_over_plan(pd.DataFrame(rows), meta))
    assert plots.plan_gap_line(gaps[gaps["vocab"] == 32000]).endswith("none over 1.05×.")
    assert plots.plan_gap_line(gaps.iloc[0:0]) is None


def test_autograd_line_leads_with_the_latest_measurement_when_one_day_holds_two_commits():
    """Two side-by-side measurements on one day, of two commits: the sentence leads with the later one (it once
    picked by day alone, and named the earlier commit's cells as the latest)."""
    from perfutils.plots import vocab_sweep as plots

    cases = {"cases": [["public", None, None], ["public_autograd", None, None]]}
    meta = {"timestamp_utc": "2026-11-28T01:00:00Z", "code_commit": "aaaaaaa", "parameters": cases,
            "sessions": [{"timestamp_utc": "2026-11-28T07:00:00Z", "code_commit": "bbbbbbb", "parameters": cases}]}
    rows = []
    for variant, tokens, ms, stamp in [("public", 1024, 0.05, "2026-11-28T01:01:00Z"),
                                       ("public_autograd", 1024, 0.20, "2026-11-28T01:02:00Z"),
                                       ("public", 4096, 0.19, "2026-11-28T07:01:00Z"),
                                       ("public_autograd", 4096, 0.20, "2026-11-28T07:02:00Z")]:
        rows.append(dict(loss="cross_entropy", target_format="labels", variant=variant, dtype="bf16", tokens=tokens,
                         vocab=32000, ms_median=ms, pct_of_copy=50.0, status="ok", gpu_name=H100, timestamp_utc=stamp))
    ratios = plots.autograd_ratio(pd.DataFrame(rows), meta)
    assert ratios["side_by_side"].all() and ratios["code_commit"].tolist() == ["aaaaaaa", "bbbbbbb"]
    assert plots.latest_pairs(ratios)["tokens"].tolist() == [4096]
    line = plots.autograd_line(ratios)
    assert "on 2026-11-28, commit bbbbbbb: 1.05× at 4096 tokens" in line and "(1 cell, 1 other commit, 2026-11-28 to 2026-11-28)" in line


def test_autograd_line_sets_side_by_side_the_pairs_of_identical_kernels():
    """Pairs of several processes (a grid, then a few cells measured again, on another commit) whose kernel sources
    are identical are read together, each token count's range over all its cells; a pair of other kernels is an
    earlier pair (once the latest process's few cells hid the grid's ranges)."""
    from perfutils.plots import vocab_sweep as plots

    cases = {"cases": [["public", None, None], ["public_autograd", None, None]]}
    meta = {"timestamp_utc": "2026-11-27T01:00:00Z", "code_commit": "aaaaaaa", "kernel_sources": "old",
            "parameters": cases,
            "sessions": [{"timestamp_utc": "2026-11-28T01:00:00Z", "code_commit": "bbbbbbb", "kernel_sources": "new",
                          "parameters": {**cases, "vocab": [32000, 50257]}},
                         {"timestamp_utc": "2026-11-29T01:00:00Z", "code_commit": "ccccccc", "kernel_sources": "new",
                          "parameters": {**cases, "vocab": [65536]}}]}
    rows = []
    for variant, tokens, vocab, ms, stamp in [("public", 1024, 131072, 0.10, "2026-11-27T01:01:00Z"),
                                              ("public_autograd", 1024, 131072, 0.30, "2026-11-27T01:02:00Z"),
                                              ("public", 1024, 32000, 0.05, "2026-11-28T01:01:00Z"),
                                              ("public_autograd", 1024, 32000, 0.20, "2026-11-28T01:02:00Z"),
                                              ("public", 1024, 50257, 0.10, "2026-11-28T01:03:00Z"),
                                              ("public_autograd", 1024, 50257, 0.12, "2026-11-28T01:04:00Z"),
                                              ("public", 4096, 65536, 1.00, "2026-11-29T01:01:00Z"),
                                              ("public_autograd", 4096, 65536, 1.01, "2026-11-29T01:02:00Z")]:
        rows.append(dict(loss="cross_entropy", target_format="labels", variant=variant, dtype="bf16", tokens=tokens,
                         vocab=vocab, ms_median=ms, pct_of_copy=50.0, status="ok", gpu_name=H100, timestamp_utc=stamp))
    ratios = plots.autograd_ratio(pd.DataFrame(rows), meta)
    assert ratios["side_by_side"].all() and ratios["kernels"].tolist() == ["new", "new", "old", "new"]
    latest = plots.latest_pairs(ratios)
    assert sorted(latest["vocab"]) == [32000, 50257, 65536]
    line = plots.autograd_line(ratios)
    assert ("on 2026-11-28 to 2026-11-29, commits bbbbbbb, ccccccc (identical kernel sources): 1.20–4.00× at 1024 "
            "tokens (2 cells, vocab 32000–50257); 1.01× at 4096 tokens (1 cell, vocab 65536).") in line
    assert "(1 cell, 1 other commit, 2026-11-27 to 2026-11-27): 3.00×." in line


def test_host_overhead_table_puts_each_piece_beside_its_loss_and_names_the_floors(tmp_path):
    from perfutils.plots import summary

    gpu_dir = tmp_path / "h100-sxm-80gb"
    gpu_dir.mkdir()
    pieces = [("public call", f"entropy_loss_forward_backward {spec}", us) for spec, us in
              (("cross_entropy/labels", 30.0), ("reverse_kl/logits", 20.0))]
    pieces += [("public call", f"entropy_loss(...).backward() {spec}", us) for spec, us in
               (("cross_entropy/labels", 210.0), ("reverse_kl/logits", 300.0))]
    pieces += [("autograd step", "floor: F.cross_entropy(x, labels).backward() (PyTorch's own loss)", 217.0),
               ("public call", "floor: x.float().sum().backward() (PyTorch's autograd alone)", 171.0),
               ("torch", "torch.empty(()), fp32", 7.44),
               ("autograd step, one thread", "floor: Function handing back an allocated gradient, apply + .backward() "
                "in set_multithreading_enabled(False)", 51.0),
               ("autograd step, one thread", "entropy_loss(...).backward() cross_entropy/labels in "
                "set_multithreading_enabled(False)", 88.0),
               ("autograd step, one thread per step", "entropy_loss(...).backward() cross_entropy/labels in "
                "set_multithreading_enabled(False) entered per step", 150.0)]
    pd.DataFrame(pieces, columns=["group", "piece", "us_per_call"]).assign(calls=500).to_csv(
        gpu_dir / "host_overhead.csv", index=False)
    (gpu_dir / "host_overhead.json").write_text('{"gpu_name": "NVIDIA H100 80GB HBM3", "timestamp_utc": '
                                                '"2026-11-27T21:50:17Z", "parameters": {"problem": "8 x 32000 bf16"}}')
    text = summary.host_overhead_table(gpu_dir)
    assert "| public call, `entropy_loss_forward_backward` | 30.0 | 20.0 |" in text
    assert "| autograd form, `entropy_loss(...).backward()` | 210 | 300 |" in text
    assert "| PyTorch's floor: x.float().sum().backward() (PyTorch's autograd alone) | 171 |" in text
    every_piece = summary.host_overhead_table(gpu_dir, None)
    assert "torch.empty" not in text and "torch: torch.empty(()), fp32 | 7.4 |" in every_piece
    line = summary.host_overhead_line(gpu_dir)
    assert "its autograd form 210–300 (7.0–15.0× the public call's)" in line
    assert "`F.cross_entropy(...).backward()` step 217" in line and "`x.float().sum().backward()` 171" in line
    assert "the labels CE autograd step costs 88 and the hand-back floor 51" in line  # entered once, not per step
    assert "entered per step | 150 |" in text
    assert "| PyTorch's floor: Function handing back an allocated gradient, apply + .backward() in " \
           "set\\_multithreading\\_enabled(False) | 51.0 |" in text  # Markdown-escaped underscores


def test_autograd_step_table_gives_each_way_over_the_plain_call_per_round(tmp_path):
    from perfutils.plots import summary

    gpu_dir = tmp_path / "h200"
    gpu_dir.mkdir()
    rows = []
    for tokens, host in ((8, True), (1024, False)):
        for round_, (plain, autograd, torch_ms) in enumerate(((1.0, 1.02, 1.10), (2.0, 2.0, 2.4), (1.0, 0.98, 1.2))):
            for way, ms in (("plain", plain), ("autograd", autograd), ("torch", torch_ms)):
                rows.append({"loss": "cross_entropy", "target_format": "labels", "tokens": tokens, "vocab": 32000,
                             "hidden": 1024, "way": way, "round": round_, "ms_median": ms,
                             "host_us_per_step": {"plain": 200.0, "autograd": 290.0, "torch": 250.0}[way] + round_
                             if host else float("nan"), "loss_rel_err": 1e-7, "h_grad_rel_err": 2e-3,
                             "w_grad_rel_err": 3e-3})
    pd.DataFrame(rows).to_csv(gpu_dir / "autograd_step.csv", index=False)
    (gpu_dir / "autograd_step.json").write_text('{"gpu_name": "NVIDIA H200", "timestamp_utc": "2026-11-30T02:34:47Z"}')
    text = summary.autograd_step_table(gpu_dir)
    # medians over the rounds: plain 1.0 ms; autograd / plain 1.02, 1.00, 0.98; torch / plain 1.10, 1.20, 1.20
    assert "| cross_entropy (labels) | 1024 × 32000, 1024 | 1.000 | 1.000 [0.980–1.020] | 1.200 [1.100–1.200] | - |" in text
    assert "| 201 / 291 / 251 |" in text  # host µs at 8 rows, the rounds' median
    assert "worst relative error 3.0e-03" in text and "alternated over 3 rounds" in text
    assert "the autograd form's step is 1.00–1.00× the plain call's" in text and "PyTorch's own loss 1.20–1.20×" in text
    assert "the autograd form adds 90–90 µs a step" in text
    assert summary.autograd_step_table(tmp_path) is None


def test_the_table_says_which_providers_shared_a_process_and_a_gpu():
    """The H200's grid of 2026-11-29 ran four processes side by side, one a GPU, each over its own vocabularies: the
    project's three forms in one process, then the peers in another on the same GPU, Liger on another machine. The
    line says which shared a process and which only a GPU (a row found its own process among those side by side)."""
    from perfutils.plots.summary import timed_apart_line

    path = Path(__file__).resolve().parent.parent / "data" / "h200" / "vocab_sweep.csv"
    df = load_records(path)
    line = timed_apart_line(df, df.attrs["metadata"], 4096)
    assert line.startswith("At 4096 tokens, timed in one process: fast_llm with torch_compile, plan with public, "
                           "plan with public_autograd, public with public_autograd; on one GPU: ")
    shared_gpu = line.split("on one GPU: ")[1]
    assert "fast_llm with public," in shared_gpu and "liger" not in line
    assert timed_apart_line(df[df["variant"] == "public"], df.attrs["metadata"], 4096) is None


def test_the_two_gpu_sentence_says_when_the_cells_ran_other_kernels():
    """The H200's public rows (today's kernels) beside the H100's (older ones): the sentence says the comparison holds
    the code's changes; without sidecars every cell's sources are unknown; with one recorded digest on both, none."""
    from perfutils.plots.vocab_sweep import gpu_comparison_line

    data = Path(__file__).resolve().parent.parent / "data"
    h100, h200 = (load_records(data / gpu / "vocab_sweep.csv") for gpu in ("h100-sxm-80gb", "h200"))
    assert "holds the code's changes as well as the GPUs'" in gpu_comparison_line(h100, h200)
    bare = gpu_comparison_line(pd.DataFrame(h100), pd.DataFrame(h200))  # a copy without attrs: no sidecar
    assert "0 ran identical kernel sources on both GPUs, 0 different ones and 204 sources the history cannot" in bare
    same = {"kernel_sources": "one-digest", "timestamp_utc": "2000-01-01T00:00:00Z"}
    h100.attrs["metadata"], h200.attrs["metadata"] = dict(same), dict(same)
    assert "kernel sources" not in gpu_comparison_line(h100, h200)
