"""perfutils.studies.profiling, ncu, profiler and perfutils.plots.profiling: profiler tables, ncu CSV parsing,
the (fake-GPU) measurement pipeline, figures."""

import os

import torch

if not torch.cuda.is_available():  # must precede the first import of triton's @jit kernels
    os.environ.setdefault("TRITON_INTERPRET", "1")

import gc  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

import matplotlib  # noqa: E402

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from perfutils.measure import ncu, profiler  # noqa: E402
from perfutils.studies import profile_ncu, profiling  # noqa: E402
from perfutils.plots import profiling as plots  # noqa: E402
from perfutils.data.records import load_records  # noqa: E402
from perfutils.measure.timing import BenchResult  # noqa: E402

H100 = {"gpu_name": "NVIDIA H100 80GB HBM3", "device": "cuda", "compute_capability": [9, 0], "sm_count": 132}
TOKENS, VOCAB = 16, 300


class Event:
    """Stands in for one entry of ``prof.key_averages()``."""

    def __init__(self, key, count, device_us, device_type="DeviceType.CUDA"):
        self.key, self.count, self.device_time_total, self.device_type = key, count, device_us, device_type


FILL = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1> >(int, at::native::FillFunctor<float>, std::array<char*, 1>)"


class FakeBackend:
    device = "cpu"
    cc = None
    warmup_ms = 1.0
    rep_ms = 1.0

    def first_call(self, fn):
        start = time.perf_counter()
        result = fn()
        return result, (time.perf_counter() - start) * 1e3

    def bench(self, fn):
        fn()
        return BenchResult(0.2, 0.19, 0.22)

    def peak_bytes(self, fn):
        fn()
        return 12345

    def copy_gbps(self):
        return 3000.0

    def device_events(self, fn, steps):
        fn()
        return [Event("aten::cross_entropy_loss", steps, 150.0 * steps, "DeviceType.CPU"),
                Event("fused_loss_kernel", steps, 150.0 * steps), Event(FILL, steps, 2.0 * steps),
                Event("Memset (Device)", steps, 1.0 * steps)]

    def release(self):
        gc.collect()


@pytest.fixture(autouse=True)
def _quiet_interpreter():
    with warnings.catch_warnings():  # the interpreter warns about exp2(-inf) on masked lanes
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


# ---- profiler tables ---------------------------------------------------------------------------


def test_short_kernel_names():
    assert profiler.short_kernel_name(FILL) == "vectorized_elementwise_kernel"
    assert profiler.short_kernel_name("fused_loss_kernel") == "fused_loss_kernel"
    assert profiler.short_kernel_name(
        "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, at::native::(anonymous "
        "namespace)::LogSoftMaxForwardEpilogue>(float*, float const*, int)") == "cunn_SoftMaxForward"
    assert profiler.short_kernel_name("Memset (Device)") == "Memset"
    assert profiler.kernel_kind("Memset (Device)") == "memset"
    assert profiler.kernel_kind("Memcpy DtoD (Device -> Device)") == "memcpy"
    assert profiler.kernel_kind(FILL) == "kernel"


def test_kernel_table_keeps_device_events_per_step():
    events = [Event("aten::add", 10, 500.0, "DeviceType.CPU"), Event("b_kernel", 10, 300.0), Event("a_kernel", 5, 100.0),
              Event("Memset (Device)", 5, 100.0), Event("no_time", 5, None)]
    table = profiler.kernel_table(events, steps=5)
    assert list(table["kernel"]) == ["b_kernel", "Memset (Device)", "a_kernel"]  # by time, then name
    assert list(table["calls_per_step"]) == [2.0, 1.0, 1.0]
    assert list(table["us_per_step"]) == [60.0, 20.0, 20.0]
    assert table["pct_of_device"].sum() == pytest.approx(100.0)
    assert list(table["kind"]) == ["kernel", "memset", "kernel"]
    assert profiler.kernel_table([Event("aten::add", 1, 5.0, "DeviceType.CPU")], steps=1).empty
    with pytest.raises(ValueError):
        profiler.kernel_table(events, steps=0)


# ---- ncu CSV -----------------------------------------------------------------------------------

NCU_HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
              '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')


def _ncu_line(launch, kernel, metric, unit, value):
    return (f'"{launch}","4242","python3","127.0.0.1","{kernel}","1","7","(128, 1, 1)","(4096, 1, 1)","0","9.0",'
            f'"Command line profiler metrics","{metric}","{unit}","{value}"')


NCU_METRIC_VALUES = [
    ("gpu__time_duration.sum", "usecond", "1,234.50"),
    ("sm__warps_active.avg.pct_of_peak_sustained_active", "%", "45.61"),
    ("sm__maximum_warps_per_active_cycle_pct", "%", "50"),
    ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "%", "88.12"),
    ("launch__registers_per_thread", "register/thread", "40"),
    ("launch__occupancy_limit_registers", "block", "12"),
    ("launch__occupancy_limit_shared_mem", "block", "32"),
    ("launch__occupancy_limit_warps", "block", "16"),
    ("launch__occupancy_limit_blocks", "block", "32"),
    ("launch__shared_mem_per_block_dynamic", "Kbyte", "1.02"),
    ("launch__shared_mem_per_block_static", "byte", "0"),
    ("dram__bytes_read.sum", "Mbyte", "268.44"),
    ("dram__bytes_write.sum", "Gbyte", "0.27"),
]


def _ncu_text(kernels):
    lines = ["==PROF== Connected to process 4242 (/usr/bin/python3)", "perfutils-ncu: ran fused",
             "==PROF== Profiling \"fused_loss_kernel\" - 0: 0%....50%....100% - 9 passes", NCU_HEADER]
    for launch, kernel in enumerate(kernels):
        lines += [_ncu_line(launch, kernel, *metric) for metric in NCU_METRIC_VALUES]
    lines.append("==PROF== Disconnected from process 4242")
    return "\n".join(lines) + "\n"


def test_parse_ncu_csv_one_row_per_launch_in_base_units():
    parsed = ncu.parse_ncu_csv(_ncu_text(["fused_loss_kernel", "two_pass_stats_kernel"]))
    assert list(parsed["ncu_id"]) == [0, 1]
    assert list(parsed["kernel"]) == ["fused_loss_kernel", "two_pass_stats_kernel"]
    first = parsed.iloc[0]
    assert first["gpu__time_duration.sum"] == pytest.approx(1_234_500.0)  # µs -> ns, thousands separator
    assert first["sm__warps_active.avg.pct_of_peak_sustained_active"] == pytest.approx(45.61)
    assert first["launch__registers_per_thread"] == 40
    assert first["launch__shared_mem_per_block_dynamic"] == pytest.approx(1020.0)  # Kbyte -> bytes
    assert first["dram__bytes_write.sum"] == pytest.approx(0.27e9)
    assert first["block"] == "(128, 1, 1)"


def test_parse_ncu_csv_without_a_table_and_with_a_bad_header():
    assert ncu.parse_ncu_csv("==PROF== nothing profiled\n==ERROR== no kernels were profiled\n").empty
    with pytest.raises(ValueError, match="lacks"):
        ncu.parse_ncu_csv('"ID","Kernel Name","Value"\n"0","k","1"\n')


@pytest.mark.parametrize("value,unit,expected", [
    ("1,024", "", 1024.0), ("1,048,576.5", "byte", 1048576.5), ("9,50", "%", 9.5), ("12.5", "msecond", 12.5e6),
    ("n/a", "", math.nan), ("", "", math.nan), ("3", "Mbyte", 3e6),
])
def test_ncu_number(value, unit, expected):
    result = ncu._ncu_number(value, unit)
    assert (math.isnan(result) and math.isnan(expected)) or result == pytest.approx(expected)


def test_ncu_command_line():
    command = ncu.ncu_command("/usr/bin/ncu", ["two_pass_grad_kernel", "fused_loss_kernel", "fused_loss_kernel"],
                              profile_ncu.NCU_METRICS, "/tmp/s.py", [16, 300])
    assert command[:5] == ["/usr/bin/ncu", "--clock-control", "none", "--target-processes", "all"]
    assert command[command.index("-k") + 1] == "regex:fused_loss_kernel|two_pass_grad_kernel"
    assert "--csv" in command and command[-4:] == [sys.executable, "/tmp/s.py", "16", "300"]
    metrics = command[command.index("--metrics") + 1].split(",")
    for name in ("sm__warps_active.avg.pct_of_peak_sustained_active", "dram__throughput.avg.pct_of_peak_sustained_elapsed",
                 "launch__registers_per_thread", "launch__occupancy_limit_registers"):
        assert name in metrics


PREDICTIONS = [
    {"variant": "fused", "kernel": "fused_loss_kernel", "launch": "fused", "block_size": 4096, "num_warps": 4,
     "n_regs": 40, "spill_bytes": 0, "shared_bytes": 0, "occupancy": 1.0, "blocks_per_sm": 16, "limiter": "warps"},
    {"variant": "two_pass", "kernel": "two_pass_stats_kernel", "launch": "two_pass.stats", "block_size": 2048,
     "num_warps": 4, "n_regs": 40, "spill_bytes": 0, "shared_bytes": 0, "occupancy": 1.0, "blocks_per_sm": 16,
     "limiter": "warps"},
]


def test_ncu_rows_put_prediction_beside_measurement():
    parsed = ncu.parse_ncu_csv(_ncu_text(["fused_loss_kernel", "two_pass_stats_kernel"]))
    rows = profile_ncu.ncu_rows(parsed, PREDICTIONS, tokens=TOKENS, vocab=VOCAB, cc=(9, 0))
    assert [r["variant"] for r in rows] == ["fused", "two_pass"]
    first = rows[0]
    assert first["status"] == "ok" and first["ms_median"] == pytest.approx(1.2345)
    assert first["ncu_registers"] == 40 and first["n_regs"] == 40
    assert first["ncu_achieved_occupancy_pct"] == pytest.approx(45.61)
    # 40 registers x 128 threads on sm_90: 1280 registers/warp -> 12 warps per quadrant -> 48 warps = 12 blocks
    assert first["pred_limit_registers"] == 12 and first["ncu_limit_registers"] == 12
    assert first["pred_limit_warps"] == 16
    assert first["pred_limit_shared_mem"] == 228  # only the 1 KiB the driver reserves per block
    assert first["pred_occupancy_from_ncu_counts"] == pytest.approx(0.75)
    assert first["ncu_dram_gbps"] == pytest.approx((268.44e6 + 0.27e9) / 1_234_500.0)
    assert "ncu_id=0" in first["config_key"] and rows[0]["config_key"] != rows[1]["config_key"]
    # Unexpected order: matched by name instead.
    swapped = profile_ncu.ncu_rows(ncu.parse_ncu_csv(_ncu_text(["two_pass_stats_kernel", "fused_loss_kernel"])),
                           PREDICTIONS, tokens=TOKENS, vocab=VOCAB)
    assert [r["variant"] for r in swapped] == ["two_pass", "fused"]


# ---- measurement pipeline (kernels under the interpreter, fake GPU back end) -------------------


@pytest.fixture(scope="module")
def profile_frame(tmp_path_factory):
    out = tmp_path_factory.mktemp("data")
    path = profiling.measure_profile(out, tokens=TOKENS, vocab=VOCAB, variants=("fused",), torch_variants=("torch_eager",),
                                     steps=2, backend=FakeBackend(), metadata=H100, log=lambda line: None)
    return out, load_records(path)


def test_measure_profile_writes_step_and_kernel_rows(profile_frame):
    out, df = profile_frame
    assert df.attrs["path"].endswith("h100-sxm-80gb/profile_kernels.csv")
    steps = df[df["row_kind"] == "step"]
    assert list(steps["variant"]) == ["fused", "torch_eager"] and set(steps["status"]) == {"ok"}
    assert (steps["max_rel_err"] < 1e-2).all()
    assert set(steps["bytes_min"]) == {TOKENS * VOCAB * 4 + TOKENS * (8 + 4)}
    assert set(steps["n_kernels"]) == {2.0} and set(steps["device_us_per_step"]) == {153.0}
    kernels_rows = df[(df["row_kind"] == "kernel") & (df["variant"] == "fused")]
    assert list(kernels_rows["short_name"]) == ["fused_loss_kernel", "vectorized_elementwise_kernel", "Memset"]
    assert kernels_rows["ms_median"].iloc[0] == pytest.approx(0.150)
    summary = plots.step_summary(df)
    assert list(summary.columns[:3]) == ["variant", "status", "ms_median"]
    table = plots.kernel_summary(df, top=1)
    assert list(table[table["variant"] == "fused"]["short_name"]) == ["fused_loss_kernel", "2 other kernels"]


def test_measure_profile_resumes_without_remeasuring(profile_frame, tmp_path):
    out, df = profile_frame
    path = out / "h100-sxm-80gb" / "profile_kernels.csv"
    before = path.read_bytes()
    profiling.measure_profile(out, tokens=TOKENS, vocab=VOCAB, variants=("fused",), torch_variants=("torch_eager",),
                              backend=FakeBackend(), metadata=H100, log=lambda line: None)
    assert path.read_bytes() == before


def _fake_ncu(tmp_path, body):
    script = tmp_path / "ncu"
    script.write_text(f"#!{sys.executable}\nimport sys\n{body}\n")
    script.chmod(0o755)
    return str(script)


def test_measure_ncu_records_nothing_without_ncu_or_when_it_fails(tmp_path, monkeypatch):
    lines = []
    monkeypatch.setattr(profile_ncu, "find_ncu", lambda: None)
    assert profile_ncu.measure_ncu(tmp_path, backend=FakeBackend(), metadata=H100, log=lines.append) is None
    assert "not found" in lines[-1]
    failing = _fake_ncu(tmp_path, 'print("==ERROR== ERR_NVGPUCTRPERM - no permission"); sys.exit(1)')
    assert profile_ncu.measure_ncu(tmp_path, tokens=TOKENS, vocab=VOCAB, variants=("fused",), backend=FakeBackend(),
                                   metadata=H100, ncu=failing, log=lines.append) is None
    assert "ERR_NVGPUCTRPERM" in lines[-1] and "nothing recorded" in lines[-1]
    assert not (tmp_path / "h100-sxm-80gb").exists()


def test_measure_ncu_records_the_parsed_launches(tmp_path):
    body = (f"if '--version' in sys.argv:\n    print('Version 2025.1.0.0'); sys.exit(0)\n"
            f"sys.stdout.write({_ncu_text(['fused_loss_kernel'])!r})")
    path = profile_ncu.measure_ncu(tmp_path, tokens=TOKENS, vocab=VOCAB, variants=("fused",), backend=FakeBackend(),
                                   metadata=H100, ncu=_fake_ncu(tmp_path, body), log=lambda line: None)
    df = load_records(path)
    assert len(df) == 1 and df["variant"].iloc[0] == "fused" and df["status"].iloc[0] == "ok"
    assert df["ncu_version"].iloc[0] == "Version 2025.1.0.0" and df["ncu_metric_set"].iloc[0] == "full"
    assert df["ncu_registers"].iloc[0] == 40
    comparison = plots.ncu_comparison(df)
    assert {"ncu_achieved_occupancy_pct", "occupancy_pred_pct", "ncu_limit_registers"} <= set(comparison.columns)
    fig = plots.plot_ncu_occupancy(df)
    try:
        assert fig.axes[0].get_ylabel() and "NVIDIA H100 80GB HBM3" in fig.axes[0].get_title()
    finally:
        plt.close(fig)


def test_step_breakdown_figure(profile_frame):
    _, df = profile_frame
    fig = plots.plot_step_breakdown(df)
    try:
        ax = fig.axes[0]
        assert "µs" in ax.get_xlabel() and [t.get_text() for t in ax.get_yticklabels()] == ["fused", "torch_eager"]
        assert "measured" in ax.get_title()
    finally:
        plt.close(fig)


def test_cli_refuses_without_gpu(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert profiling.main(["--out", str(tmp_path)]) == 2
    assert not any(tmp_path.iterdir())
    with pytest.raises(RuntimeError, match="CUDA GPU"):
        profiling.measure_profile(tmp_path)


def test_step_reading_says_what_the_recorded_profile_shows():
    """Notebook 08's bullets from the committed H100 profile: % of copy, time outside kernels, peak memory over the
    gradient, the Triton kernels' share of the device time."""
    from pathlib import Path

    from perfutils.studies import profiling as measured
    from perfutils.data.records import load_study
    from perfutils.plots import profiling as plots

    data = Path(__file__).resolve().parent.parent / "data"
    df = load_study(data, "h100-sxm-80gb", "profile_kernels", measured.PRODUCER_COMMAND)
    lines = plots.step_reading(df, gradient_bytes=4096 * 32768 * 2)
    assert lines[0].startswith("* **Against the floor:** auto") and "of copy bandwidth" in lines[0]
    assert "(256 MiB in bf16 at this shape)" in lines[2] and "torch_eager 3.00×" in lines[2]
    assert lines[3].startswith("* **Device time in the Triton kernels**") and "reduce_kernel" in lines[3]
