"""perfutils.measure.sweep (sweep_config, measurer) and the CLI, on a CPU: the measuring step is a fake, so nothing
here times anything."""

from __future__ import annotations

import json
import math
import sys
import types
from dataclasses import dataclass

import pytest
import torch

from perfutils import cli
from perfutils.measure import measurer, sweep, sweep_config
from perfutils.measure.measurer import GpuMeasurer, TimingBackend
from perfutils.data.records import load_records
from perfutils.data.schema import IncompatibleDataError
from perfutils.data.store import ResultStore
from perfutils.measure.sweep import run_sweep
from perfutils.measure.sweep_config import KnownNames, SweepPoint, load_config, plan_configs
from perfutils.measure.timing import BenchResult

H100 = "NVIDIA H100 80GB HBM3"
KNOWN = KnownNames(
    {"cross_entropy": ("labels", "logits"), "reverse_kl": ("logits",)},
    ("fused", "two_pass"),
    (16, 65536),
)


@pytest.fixture(autouse=True)
def fixed_names(monkeypatch):
    """Tests must not depend on what `kernels` exports today."""
    monkeypatch.setattr(sweep_config, "known_names", lambda: KNOWN)
    monkeypatch.setattr(sweep, "known_names", lambda: KNOWN)


def config(**changes) -> dict:
    base = {
        "study": "unit",
        "loss": "cross_entropy",
        "target_format": "labels",
        "variant": ["fused", "two_pass"],
        "dtype": "bf16",
        "tokens": [64, 128],
        "vocab": 1000,
        "block_size": [256, 1024],
        "num_warps": 4,
        "copy_gbps": 3000.0,
    }
    base.update(changes)
    return base


def fake_measure(point: SweepPoint) -> dict:
    ms = 1e-3 * point.tokens * point.vocab / (point.block_size or 512)
    return {"ms_median": ms, "ms_p20": ms * 0.99, "ms_p80": ms * 1.01, "max_rel_err": 1e-4, "status": "ok", "compile_ms": 50.0}


class Recorder:
    """A measure function that records its calls and can fail or be 'killed' on cue."""

    def __init__(self, kill_after: int | None = None, fail_when=None, fail_with: Exception | None = None):
        self.calls: list[str] = []
        self.recovered = 0
        self.kill_after = kill_after
        self.fail_when = fail_when or (lambda point: False)
        self.fail_with = fail_with or RuntimeError("out of resource: shared memory, Required: 262144, Hardware limit: 232448")

    def __call__(self, point: SweepPoint) -> dict:
        if self.kill_after is not None and len(self.calls) == self.kill_after:
            raise KeyboardInterrupt
        self.calls.append(point.key)
        if self.fail_when(point):
            raise self.fail_with
        return fake_measure(point)

    def recover(self) -> None:
        self.recovered += 1


@pytest.fixture
def store(tmp_path):
    return ResultStore(tmp_path / "h100-sxm-80gb" / "unit.csv", {"gpu_name": H100})


def quiet(line: str) -> None:
    pass


# ---- planning and validation ---------------------------------------------------------------


def test_plan_is_the_product_in_shape_major_order():
    points = plan_configs(config(loss=["cross_entropy", "reverse_kl"], target_format=["labels", "logits"]))
    # cross_entropy x {labels, logits} + reverse_kl x logits = 3 pairs; x 2 variants x 2 tokens x 2 block sizes
    assert len(points) == 3 * 2 * 2 * 2
    assert len({p.key for p in points}) == len(points)
    tokens_in_order = [p.tokens for p in points]
    assert tokens_in_order == sorted(tokens_in_order)  # all of one shape before the next
    assert ("reverse_kl", "labels") not in {(p.loss, p.target_format) for p in points}
    assert sweep_config.skipped_pairs(config(loss=["cross_entropy", "reverse_kl"], target_format=["labels", "logits"])) == [("reverse_kl", "labels")]


def test_scalars_lists_aliases_and_defaults():
    spec = load_config(config(dtype=["bfloat16", "fp32"], block_size=None, num_warps=[None, 8]))
    assert spec.grid["dtype"] == ("bf16", "fp32")
    assert spec.grid["block_size"] == (None,) and spec.grid["num_warps"] == (None, 8)
    assert spec.check_rows == 64 and spec.seed == 0 and str(spec.out) == "data"
    assert plan_configs(spec)[0].key.endswith("block_size=auto;num_warps=auto")


def test_yaml_config_with_a_sweep_section(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("MODE: auto\nsweep:\n  study: y\n  loss: cross_entropy\n  target_format: labels\n"
                    "  variant: fused\n  dtype: bf16\n  tokens: [8, 16]\n  vocab: 100\n")
    assert [p.tokens for p in plan_configs(path)] == [8, 16]
    assert load_config(path, overrides={"out": "elsewhere"}).out.name == "elsewhere"


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"block_size": [256, 100]}, "block_size' value 100 is not a power of two"),
        ({"block_size": 8}, r"outside \[16, 65536\]"),
        ({"num_warps": 64}, r"outside \[1, 32\]"),
        ({"num_warps": 3}, "not a power of two"),
        ({"loss": "kl_divergence"}, "unknown loss 'kl_divergence'"),
        ({"variant": "magic"}, "unknown variant 'magic'"),
        ({"target_format": "probabilities"}, "unknown target_format"),
        ({"dtype": "int8"}, "unknown dtype 'int8'"),
        ({"tokens": 0}, "'tokens' values must be positive integers"),
        ({"tokens": "4096"}, "'tokens' values must be positive integers"),
        ({"vocab": 1.5}, "'vocab' values must be positive integers"),
        ({"variant": []}, "empty list"),
        ({"tokens": [64, 64]}, "lists 64 more than once"),
        ({"num_warp": 4}, r"unknown keys \['num_warp'\]"),
        ({"study": None}, r"missing required keys \['study'\]"),
        ({"study": "a/b"}, "file-name-safe"),
        ({"check_rows": 0}, "'check_rows' must be a positive integer"),
        ({"seed": -1}, "'seed'"),
        ({"flush_l2": "yes"}, "'flush_l2' must be true or false"),
        ({"ignore_fraction": 1.0}, "ignore_fraction"),
        ({"copy_gbps": -5}, "'copy_gbps' must be a positive number"),
        ({"prepare_kwargs": {"block_size": 4}}, "must not set"),
        ({"loss": "reverse_kl", "target_format": "labels"}, "no valid configuration"),
    ],
)
def test_invalid_configs_are_rejected_before_anything_runs(store, changes, message):
    measure = Recorder()
    with pytest.raises(ValueError, match=message):
        run_sweep(config(**changes), store, measure=measure, log=quiet)
    assert measure.calls == [] and not store.path.exists()


def test_config_type_errors(tmp_path):
    with pytest.raises(TypeError, match="sweep config must be"):
        load_config(42)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ValueError, match="mapping"):
        load_config(tmp_path / "list.yaml")


# ---- running ---------------------------------------------------------------------------------


def test_sweep_records_one_row_per_configuration(store):
    lines: list[str] = []
    frame = run_sweep(config(), store, measure=fake_measure, log=lines.append)
    assert len(frame) == 8 and set(frame["status"]) == {"ok"}
    assert frame["config_key"].tolist() == [p.key for p in plan_configs(config())]
    assert frame["compile_ms"].tolist() == [50.0] * 8
    assert sum(line.startswith("[") for line in lines) == 8  # one progress line per configuration
    assert "8 to run" in lines[0]


def test_resume_skips_recorded_configurations(store):
    run_sweep(config(tokens=64), store, measure=fake_measure, log=quiet)
    measure = Recorder()
    frame = run_sweep(config(tokens=[64, 128]), store, measure=measure, log=quiet)
    assert len(measure.calls) == 4 and all("tokens=128" in key for key in measure.calls)
    assert len(frame) == 8


def test_killed_sweep_keeps_rows_and_rerun_completes_the_rest(store):
    killed = Recorder(kill_after=3)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(config(), store, measure=killed, log=quiet)
    assert len(load_records(store.path)) == 3  # the configuration in flight is lost, nothing else

    rerun = Recorder()
    frame = run_sweep(config(), store, measure=rerun, log=quiet)
    all_keys = [p.key for p in plan_configs(config())]
    assert rerun.calls == all_keys[3:]
    assert sorted(frame["config_key"]) == sorted(all_keys)


def test_failed_configuration_is_a_row_and_the_sweep_goes_on(store):
    measure = Recorder(fail_when=lambda p: p.block_size == 1024 and p.variant == "fused")
    frame = run_sweep(config(), store, measure=measure, log=quiet)
    assert len(measure.calls) == 8 and len(frame) == 8
    errors = frame[frame.status == "error"]
    assert len(errors) == 2 and measure.recovered == 2
    assert errors["error"].str.startswith("RuntimeError: out of resource: shared memory").all()
    assert errors["ms_median"].isna().all()
    # final: a re-run does not try them again unless asked to
    again = Recorder()
    run_sweep(config(), store, measure=again, log=quiet)
    assert again.calls == []
    retry = Recorder()
    frame = run_sweep(config(retry_errors=True), store, measure=retry, log=quiet)
    assert sorted(retry.calls) == sorted(errors["config_key"])
    assert len(frame) == 10  # the error rows are kept next to the retries


def test_unusable_cuda_context_stops_the_sweep_after_recording(store):
    fatal = Recorder(fail_when=lambda p: len(fatal.calls) == 2, fail_with=RuntimeError("CUDA error: an illegal memory access was encountered"))
    with pytest.raises(RuntimeError, match="Run the sweep again"):
        run_sweep(config(), store, measure=fatal, log=quiet)
    frame = load_records(store.path)
    assert frame["status"].tolist() == ["ok", "error"]
    rerun = Recorder()
    run_sweep(config(), store, measure=rerun, log=quiet)
    assert len(rerun.calls) == 6


def test_measure_must_return_a_status(store):
    with pytest.raises(TypeError, match="must return a dict with 'status'"):
        run_sweep(config(), store, measure=lambda point: {"ms_median": 1.0}, log=quiet)
    assert not store.path.exists()


def test_grid_values_win_over_measured_ones(store):
    frame = run_sweep(config(tokens=64, variant="fused", block_size=256), store,
                      measure=lambda p: {**fake_measure(p), "tokens": 999}, log=quiet)
    assert frame["tokens"].tolist() == [64]


def test_dry_run_measures_nothing(store):
    run_sweep(config(tokens=64), store, measure=fake_measure, log=quiet)
    measure = Recorder()
    plan = run_sweep(config(), store, measure=measure, dry_run=True, log=quiet)
    assert measure.calls == [] and len(plan) == 8
    assert plan["done"].tolist() == [True] * 4 + [False] * 4


def test_foreign_gpu_file_is_refused_before_measuring(store):
    run_sweep(config(tokens=64), store, measure=fake_measure, log=quiet)
    other = ResultStore(store.path, {"gpu_name": "NVIDIA A100-SXM4-80GB"})
    measure = Recorder()
    with pytest.raises(IncompatibleDataError, match="A100"):
        run_sweep(config(), other, measure=measure, log=quiet)
    assert measure.calls == []


def test_default_store_path_comes_from_the_gpu(tmp_path):
    frame = run_sweep(config(out=str(tmp_path), tokens=64, variant="fused"), measure=fake_measure,
                      metadata={"gpu_name": H100, "parameters": {}}, log=quiet)
    assert frame.attrs["path"] == str(tmp_path / "h100-sxm-80gb" / "unit.csv")


# ---- the GPU measurer's logic, on a CPU with fakes -------------------------------------------


def reference_rows(logits, target, *, loss, target_format):
    """Float64 per-row losses (test's own reference: cross-entropy and reverse KL)."""
    log_q = torch.log_softmax(logits, dim=-1)
    if target_format == "labels":
        keep = target != sweep_config.IGNORE_INDEX
        picked = log_q.gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1)
        return torch.where(keep, -picked, torch.zeros_like(picked))
    log_p = torch.log_softmax(target, dim=-1)
    if loss == "cross_entropy":
        return -(log_p.exp() * log_q).sum(-1)
    return (log_q.exp() * (log_q - log_p)).sum(-1)


@dataclass
class FakeLaunch:
    name: str
    compiled: object = None
    grid: tuple = (1,)
    num_warps: int = 4
    block_size: int | None = 256


class FakePlan:
    """What kernels.prepare returns: run() -> (mean loss, grad), computed in float32 with autograd."""

    def __init__(self, logits, target, loss, target_format, corrupt=None, launches=()):
        self.logits, self.target, self.loss, self.target_format = logits, target, loss, target_format
        self.corrupt = corrupt
        self.launches = list(launches)
        self.config = {"block_size": 256}

    def run(self):
        x = self.logits.detach().float().requires_grad_(True)
        target = self.target if self.target_format == "labels" else self.target.float()
        rows = reference_rows(x, target, loss=self.loss, target_format=self.target_format)
        n_valid = int((self.target != sweep_config.IGNORE_INDEX).sum()) if self.target_format == "labels" else x.shape[0]
        mean = rows.sum() / n_valid
        (grad,) = torch.autograd.grad(mean, x)
        grad = grad.to(self.logits.dtype)
        if self.corrupt == "scale":
            grad = grad * 1.1
        elif self.corrupt == "nan":
            grad[0, 0] = float("nan")
        elif self.corrupt == "in_place":
            self.logits.mul_(0.5)
        return mean.detach(), grad


def fake_bench(fn, *, warmup_ms, rep_ms, flush_l2):
    fn()
    return BenchResult(0.5, 0.45, 0.55)


def make_measurer(spec, corrupt=None, launches=(), prepared=None):
    def prepare(logits, target, *, loss, target_format, variant, block_size, num_warps):
        if prepared is not None:
            prepared.append((logits.data_ptr(), target.data_ptr()))
        return FakePlan(logits, target, loss, target_format, corrupt, launches)

    backend = TimingBackend(fake_bench, lambda fn: (fn(), 12.0), lambda fn: 4096)
    return GpuMeasurer(spec, device="cpu", prepare=prepare, reference=reference_rows, backend=backend,
                       cost=lambda loss, fmt, tokens, vocab, dtype_bytes: 4 * tokens * vocab, copy_gbps=1000.0, log=quiet)


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_measurer_checks_against_float64_reference(store, dtype):
    spec = load_config(config(loss=["cross_entropy", "reverse_kl"], target_format=["labels", "logits"], dtype=dtype,
                              tokens=[50, 70], vocab=300, check_rows=16))
    prepared: list = []
    frame = run_sweep(spec, store, measure=make_measurer(spec, prepared=prepared), log=quiet)
    assert len(frame) == 3 * 2 * 2 * 2 and set(frame["status"]) == {"ok"}, frame[["config_key", "max_rel_err"]]
    assert (frame["max_rel_err"] < sweep_config.TOLERANCE[dtype]).all()
    assert frame["grad_rel_err"].notna().all() and frame["loss_rel_err"].notna().all()
    row = frame.iloc[0]
    assert row["bytes_min"] == 4 * 50 * 300 and row["gbps"] == pytest.approx(4 * 50 * 300 / 0.5e-3 / 1e9)
    assert row["pct_of_copy"] == pytest.approx(100 * row["gbps"] / 1000.0)
    assert row["compile_ms"] == 12.0 and row["peak_mem_bytes"] == 4096 and not row["inputs_modified"]
    # inputs are allocated once per shape and reused by every configuration of that shape
    logits_buffers = {ptr for ptr, _ in prepared}
    assert len(logits_buffers) <= 2 * 2


@pytest.mark.parametrize("corrupt, expected_err", [("scale", pytest.approx(0.1, rel=0.05)), ("nan", math.inf)])
def test_measurer_flags_wrong_results(store, corrupt, expected_err):
    spec = load_config(config(tokens=40, vocab=200, variant="fused", block_size=256, check_rows=40))
    frame = run_sweep(spec, store, measure=make_measurer(spec, corrupt=corrupt), log=quiet)
    assert frame["status"].tolist() == ["wrong"]
    assert frame["max_rel_err"].iloc[0] == expected_err
    assert "above tolerance" in frame["error"].iloc[0]


def test_measurer_notices_in_place_kernels(store):
    spec = load_config(config(tokens=40, vocab=200, variant="fused", block_size=[256, 1024]))
    frame = run_sweep(spec, store, measure=make_measurer(spec, corrupt="in_place"), log=quiet)
    assert frame["inputs_modified"].tolist() == [True, True]
    assert frame["status"].tolist() == ["ok", "ok"]  # checked before the inputs were touched


def test_limiting_pass_describes_a_multi_launch_plan(store, monkeypatch):
    registers = types.ModuleType("perfutils.model.compiled_kernel")
    registers.kernel_stats = lambda compiled, cc: {"n_regs": compiled["regs"], "spill_bytes": 0, "shared_bytes": 64,
                                                   "occupancy": compiled["occ"], "blocks_per_sm": compiled["blocks"],
                                                   "limiter": "registers"}
    cuda_tools = types.ModuleType("perfutils.model.cuda_tools")
    cuda_tools.pin_bundled_ptxas = lambda: None  # the measurer pins one ptxas per process
    monkeypatch.setitem(sys.modules, "perfutils.model.compiled_kernel", registers)
    monkeypatch.setitem(sys.modules, "perfutils.model.cuda_tools", cuda_tools)
    launches = [FakeLaunch("two_pass.stats", {"regs": 40, "occ": 0.5, "blocks": 4}),
                FakeLaunch("two_pass.grad", {"regs": 128, "occ": 0.25, "blocks": 2})]
    spec = load_config(config(tokens=40, vocab=200, variant="two_pass", block_size=256))
    frame = run_sweep(spec, store, measure=make_measurer(spec, launches=launches), log=quiet)
    row = frame.iloc[0]
    assert row["limiting_pass"] == "two_pass.grad" and row["n_regs"] == 128 and row["occupancy"] == 0.25
    assert row["blocks_per_sm"] == 2 and row["limiter"] == "registers" and row["n_launches"] == 2
    assert [p["name"] for p in json.loads(row["passes"])] == ["two_pass.stats", "two_pass.grad"]


def test_measurer_preflights_the_reference(store):
    spec = load_config(config(tokens=40, vocab=200))
    with pytest.raises(ValueError, match="per-row losses of shape"):
        GpuMeasurer(spec, device="cpu", prepare=lambda *a, **k: None, reference=lambda x, t, **k: x.sum(),
                    backend=TimingBackend(fake_bench, lambda fn: (fn(), 0.0), None), cost=lambda *a: 1, copy_gbps=1.0)


def test_measurer_needs_cuda_by_default():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(RuntimeError, match="CUDA GPU"):
        GpuMeasurer(load_config(config()))


# ---- command line ----------------------------------------------------------------------------


def write_yaml(tmp_path, text: str):
    path = tmp_path / "x.yaml"
    path.write_text(text)
    return str(path)


def test_cli_dry_run_lists_configurations(tmp_path, capsys):
    path = write_yaml(tmp_path, "study: c\nloss: cross_entropy\ntarget_format: labels\nvariant: [fused, two_pass]\n"
                                "dtype: bf16\ntokens: 64\nvocab: 1000\n")
    assert cli.main(["sweep", "--config", path, "--dry-run", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "variant=fused" in out and "variant=two_pass" in out and "2 configurations" in out


def test_cli_reports_bad_config_clearly(tmp_path, capsys):
    path = write_yaml(tmp_path, "study: c\nloss: cross_entropy\ntarget_format: labels\nvariant: fused\n"
                                "dtype: bf16\ntokens: 64\nvocab: 1000\nblock_size: 100\n")
    assert cli.main(["sweep", "--config", path, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: sweep config (") and "not a power of two" in err
    assert cli.main(["sweep", "--config", str(tmp_path / "nope.yaml")]) == 2
    with pytest.raises(SystemExit):
        cli.main(["sweep"])  # argparse: --config is required


def test_cli_info_prints_metadata(capsys):
    assert cli.main(["info"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert {"device", "gpu_name", "torch_version", "triton_version", "python_version", "git_dirty"} <= set(info)


# ---- timing helpers the measurer relies on (no GPU timing here) ------------------------------


def test_rel_err_is_float64_and_never_passes_nan():
    from perfutils.measure.timing import rel_err

    reference = torch.tensor([3.0, 4.0], dtype=torch.float64)
    assert rel_err(torch.tensor([3.0, 4.0], dtype=torch.bfloat16), reference) == 0.0
    assert rel_err(torch.tensor([3.0, 4.5]), reference) == pytest.approx(0.1)
    assert rel_err(torch.tensor([float("nan"), 4.0]), reference) == math.inf
    assert rel_err(torch.tensor([3.0, 4.0]), torch.tensor([float("inf"), 4.0])) == math.inf
    assert rel_err(torch.zeros(2), torch.zeros(2)) == 0.0 and rel_err(torch.ones(2), torch.zeros(2)) == math.inf
    with pytest.raises(ValueError, match="shapes differ"):
        rel_err(torch.ones(2), torch.ones(3))
    with pytest.raises(TypeError, match="rel_err: a"):
        rel_err("1.0", reference)


def test_timing_refuses_to_run_without_a_gpu():
    from perfutils.measure import timing

    with pytest.raises(TypeError, match="callable"):
        timing.bench(42)
    with pytest.raises(ValueError, match="rep_ms"):
        timing.bench(lambda: None, rep_ms=0)
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(RuntimeError, match="only taken on a GPU"):
        timing.bench(lambda: None)
    with pytest.raises(RuntimeError, match="CUDA"):
        timing.peak_memory_above(lambda: None)
    result, ms = timing.first_call_ms(lambda: "compiled")
    assert result == "compiled" and ms >= 0.0


def test_copy_bandwidth_from_a_ceilings_file(tmp_path):
    csv_path = tmp_path / "ceilings.csv"
    csv_path.write_text("ceiling,value,unit,gpu_name\nl2_read,9000.0,GB/s,G\ndram_copy_triton,2900.0,GB/s,G\n"
                        "dram_copy_torch,3000.5,GB/s,G\n")
    assert measurer.read_copy_gbps(csv_path) == 3000.5
    assert measurer.read_copy_gbps(csv_path, "G") == 3000.5
    with pytest.raises(ValueError, match="not on this GPU"):
        measurer.read_copy_gbps(csv_path, "other")
    yaml_path = tmp_path / "ceilings.yaml"
    yaml_path.write_text("copy_gbps: 2500\n")
    assert measurer.read_copy_gbps(yaml_path) == 2500.0
    yaml_path.write_text("copy: fast\n")
    with pytest.raises(ValueError, match="positive copy bandwidth"):
        measurer.read_copy_gbps(yaml_path)
    with pytest.raises(FileNotFoundError):
        measurer.read_copy_gbps(tmp_path / "none.csv")


def test_a_long_first_call_is_followed_by_an_idle_gpu_before_timing(store):
    """A first call that searched leaves the GPU after a burst of work: with settle_ms (the studies that search set
    it) the measurer idles it that long before timing; not after a short first call, not by default."""
    events = []

    def bench(fn, **_):
        events.append("bench")
        return fake_bench(fn, warmup_ms=1, rep_ms=1, flush_l2=True)

    def measure_with(first_ms, **settings):
        events.clear()
        spec = load_config(config(tokens=40, vocab=200, variant="fused", loss="cross_entropy",
                                  target_format="labels", **settings))
        backend = TimingBackend(bench, lambda fn: (fn(), first_ms), None, lambda ms: events.append(("settle", ms)))
        measure_one = GpuMeasurer(spec, device="cpu", prepare=lambda logits, target, **k: FakePlan(
            logits, target, k["loss"], k["target_format"]), reference=reference_rows, backend=backend,
            cost=lambda *a: 1, copy_gbps=1.0, log=quiet)
        row = measure_one(plan_configs(spec)[0])
        assert row["status"] == "ok"
        return list(events)

    assert measure_with(measurer.SETTLE_AFTER_MS + 1, settle_ms=measurer.SETTLE_MS) == [("settle", 1000.0), "bench"]
    assert measure_with(measurer.SETTLE_AFTER_MS - 1, settle_ms=measurer.SETTLE_MS) == ["bench"]
    assert measure_with(5000.0, settle_ms=250) == [("settle", 250.0), "bench"]
    assert measure_with(5000.0) == ["bench"]  # off by default: sweeps of fixed configurations only compile
    with pytest.raises(ValueError, match="settle_ms"):
        load_config(config(settle_ms=-1))
