"""perfutils.plots.occupancy / roofline / registers: the frames and the figures, on tiny inputs."""

from __future__ import annotations

import io
import math

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

import perfutils.plots.occupancy as pocc  # noqa: E402
import perfutils.model.offline_counts as counts  # noqa: E402
import perfutils.plots.registers as preg  # noqa: E402
import perfutils.plots.roofline as prf  # noqa: E402
from perfutils.model.occupancy import occupancy, occupancy_curves  # noqa: E402
from perfutils.model.roofline import Ceilings, loss_cost  # noqa: E402
from perfutils.plots.figures import save_figure  # noqa: E402

GPU = "NVIDIA H100 80GB HBM3"
CEIL = Ceilings(dram_gbps=3000.0, dram_read_gbps=3200.0, l2_gbps=10000.0, fp32_tflops=60.0, exp2_tops=4.0,
                source="measured", gpu=GPU)


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


# ------------------------------------------------------------------------------------------------
# plot_occupancy
# ------------------------------------------------------------------------------------------------


def test_primary_limiter():
    assert pocc.primary_limiter("registers+warps") == "registers"
    assert pocc.primary_limiter("warps") == "warps"
    assert pocc.primary_limiter("") == "none"
    assert pocc.primary_limiter(None) == "none"
    assert pocc.primary_limiter(float("nan")) == "none"
    with pytest.raises(TypeError):
        pocc.primary_limiter(3)


def test_tutorial_formula_overestimates_33_registers():
    # 65536 // (33 * 32 * 8) = 7, but 33 regs -> 1280 per warp -> 12 warps per sub-partition -> 48 warps = 6 blocks.
    assert pocc.triton_tutorial_blocks_per_sm(33, 8) == 7
    table = pocc.tutorial_vs_calculator([(256, 33), (256, 32)])
    first = table.iloc[0]
    assert (first.tutorial_blocks_per_sm, first.blocks_per_sm) == (7, 6)
    assert first.allocated_registers_per_warp == 1280
    assert first.warps_per_sub_partition == 12
    assert first.limiter == "registers"
    second = table.iloc[1]
    assert second.tutorial_blocks_per_sm == second.blocks_per_sm == 8


def test_tutorial_formula_shared_cap_and_errors():
    # 100 KiB of shared memory per block: 232448 // 102400 = 2 blocks.
    assert pocc.triton_tutorial_blocks_per_sm(32, 4, 100 * 1024) == 2
    with pytest.raises(ValueError):
        pocc.triton_tutorial_blocks_per_sm(0, 4)
    with pytest.raises(ValueError):
        pocc.triton_tutorial_blocks_per_sm(32, 4, -1)
    with pytest.raises(ValueError):
        pocc.tutorial_vs_calculator([(100, 32)])  # not a whole number of warps


def test_limits_table_and_description():
    occ = occupancy((9, 0), threads_per_block=256, registers_per_thread=33)
    table = pocc.limits_table(occ)
    assert set(table.columns) == {"limit", "blocks_per_sm", "binding"}
    binding = table[table["binding"]]
    assert list(binding["limit"]) == ["registers"]
    assert int(binding["blocks_per_sm"].iloc[0]) == 6
    text = pocc.describe_occupancy(occ)
    assert "blocks/SM: 6" in text and "binding limit: registers" in text and "75.0%" in text
    with pytest.raises(TypeError):
        pocc.limits_table("not an occupancy")


def test_kernel_occupancy_table():
    df = pd.DataFrame({"n_regs": [33, None, 128], "shared_bytes": [0, 0, 1216], "num_warps": [8, 8, 16]})
    out = pocc.kernel_occupancy_table(df)
    assert len(out) == 2  # the row without n_regs is dropped
    assert list(out["calc_blocks_per_sm"]) == [6, 1]
    assert out["calc_occupancy"].iloc[1] == pytest.approx(16 / 64)
    with pytest.raises(ValueError, match="missing columns"):
        pocc.kernel_occupancy_table(pd.DataFrame({"n_regs": [1]}))


def test_plot_occupancy_curves():
    curves = occupancy_curves((9, 0), threads_per_block=512, registers_per_thread=128, shared_bytes=1216)
    fig = pocc.plot_occupancy_curves(curves, title="test")
    axes = fig.axes
    assert len(axes) == 3
    assert axes[0].get_xlabel() == "registers per thread"
    assert axes[1].get_xlabel() == "threads per block"
    assert "KiB" in axes[2].get_xlabel()
    assert "%" in axes[0].get_ylabel()
    texts = [t.get_text() for t in axes[0].texts]
    assert any("1 block/SM" in t and "registers" in t for t in texts)
    with pytest.raises(ValueError):
        pocc.plot_occupancy_curves({"registers": curves["registers"]})


def test_plot_kernels_on_register_curves():
    df = pd.DataFrame({"n_regs": [40, 128, 64], "num_warps": [4, 16, 32], "shared_bytes": [1040, 1216, 1408],
                       "source": ["H100", "H100", "offline"]})
    ax = pocc.plot_kernels_on_register_curves(df, title="t")
    assert ax.get_xlabel() == "registers per thread"
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "kernels: H100" in labels and "kernels: offline" in labels
    assert sum("calculator" in label for label in labels) == 3
    with pytest.raises(ValueError, match="missing columns"):
        pocc.plot_kernels_on_register_curves(df.drop(columns=["source"]))
    with pytest.raises(ValueError, match="no row"):
        pocc.plot_kernels_on_register_curves(df.assign(n_regs=None))


# ------------------------------------------------------------------------------------------------
# plot_roofline
# ------------------------------------------------------------------------------------------------


def _records(rows):
    base = {"loss": "cross_entropy", "target_format": "labels", "dtype": "bf16", "tokens": 4, "vocab": 1024,
            "status": "ok", "gpu_name": GPU, "timestamp_utc": "2025-01-02T03:04:05Z"}
    return pd.DataFrame([{**base, **row} for row in rows])


def test_best_rows_picks_fastest_ok_row():
    df = _records([
        {"variant": "fused", "block_size": 1024, "num_warps": 4, "ms_median": 2.0},
        {"variant": "fused", "block_size": 512, "num_warps": 4, "ms_median": 1.0},
        {"variant": "fused", "block_size": 256, "num_warps": 4, "ms_median": 0.5, "status": "error"},
        {"variant": "two_pass", "block_size": 1024, "num_warps": 8, "ms_median": 3.0},
        {"variant": "two_pass", "block_size": 512, "num_warps": 8, "ms_median": 3.0},
    ])
    best = prf.best_rows(df)
    assert list(best["variant"]) == ["fused", "two_pass"]
    assert list(best["block_size"]) == [512, 512]  # the tie goes to the smaller configuration
    with pytest.raises(ValueError, match="no row"):
        prf.best_rows(df.assign(status="error"))


def test_with_costs_and_roofline_table():
    tokens, vocab = 4, 1024
    cost = loss_cost("cross_entropy", "labels", tokens, vocab, 2)
    floor_ms = cost.bytes / 3000e9 * 1e3
    df = _records([{"variant": "fused", "ms_median": 2 * floor_ms, "bytes_min": cost.bytes},
                   {"variant": "eager", "ms_median": 4 * floor_ms, "bytes_min": None}])
    with_cost = prf.with_costs(df)
    assert list(with_cost["bytes"]) == [cost.bytes, cost.bytes]  # missing bytes_min -> the model's bytes
    assert with_cost["loss_label"].iloc[0] == "cross_entropy/labels"
    table = prf.roofline_table(with_cost, CEIL)
    assert list(table["x_floor"].round(6)) == [2.0, 4.0]
    assert list(table["pct_of_copy"].round(6)) == [50.0, 25.0]
    assert table["gap_us"].iloc[0] == pytest.approx(table["floor_us"].iloc[0])
    assert set(table["binding_roof"]) == {"dram"}
    assert table["intensity"].iloc[0] == pytest.approx(cost.flops / cost.bytes)
    with pytest.raises(TypeError):
        prf.roofline_table(with_cost, "not ceilings")


def test_floor_table_bytes_per_element():
    table = prf.floor_table([("cross_entropy", "labels"), ("reverse_kl", "logits")], 4096, [32768], copy_gbps=3000)
    per_element = dict(zip(table["loss_label"], table["bytes_per_element"]))
    assert per_element["cross_entropy/labels"] == pytest.approx(4.0, abs=1e-3)
    assert per_element["reverse_kl/logits"] == pytest.approx(6.0, abs=1e-3)
    assert table["floor_us"].iloc[0] == pytest.approx(table["min_MB"].iloc[0] * 1e6 / 3000e9 * 1e6)


def test_measured_date_and_title():
    df = _records([{"variant": "a", "timestamp_utc": "2025-01-02T00:00:00Z"},
                   {"variant": "b", "timestamp_utc": "2025-03-04T00:00:00Z"}])
    assert prf.measured_date(df) == "2025-03-04"
    assert prf.measured_date(pd.DataFrame({"x": [1]})) is None
    title = prf.figure_title("Roofline", GPU, "2025-03-04")
    assert title == f"Roofline\n{GPU} · measured 2025-03-04"
    assert prf.figure_title("Roofline", None, None) == "Roofline"


def _table():
    rows = []
    for loss, fmt in (("cross_entropy", "labels"), ("reverse_kl", "logits")):
        cost = loss_cost(loss, fmt, 4, 1024, 2)
        floor_ms = cost.bytes / 3000e9 * 1e3
        for vocab in (1024, 2048):
            for variant, factor in (("fused", 1.1), ("eager", 3.0)):
                rows.append({"loss": loss, "target_format": fmt, "variant": variant, "vocab": vocab,
                             "ms_median": factor * floor_ms * vocab / 1024, "source": "benchmark"})
            rows.append({"loss": loss, "target_format": fmt, "variant": "fused", "vocab": vocab,
                         "ms_median": 1.05 * floor_ms * vocab / 1024, "source": "sweep best"})
    df = pd.DataFrame(rows).assign(dtype="bf16", tokens=4, status="ok")
    return prf.roofline_table(prf.with_costs(df), CEIL)


def test_plot_roofline_points():
    table = _table()
    ax = prf.plot_roofline_points(table, CEIL, title="roofline")
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert "flop" in ax.get_xlabel() and "TFLOP/s" in ax.get_ylabel()
    assert ax.get_title() == "roofline"
    legend_texts = [t.get_text() for legend in ax.findobj(matplotlib.legend.Legend) for t in legend.get_texts()]
    assert any(text.startswith("DRAM copy 3,000") for text in legend_texts)
    assert sum(text.startswith("exp2 roof") for text in legend_texts) == 2
    assert "sweep best" in legend_texts
    with pytest.raises(ValueError):
        prf.plot_roofline_points(table.iloc[0:0], CEIL)


def test_plot_distance_to_floor_is_deterministic(tmp_path):
    table = _table()
    fig = prf.plot_distance_to_floor(table, CEIL, title="floor")
    assert len(fig.axes) == 2  # one panel per vocab
    assert all("% of copy" in ax.get_xlabel() for ax in fig.axes)
    first = save_figure(fig, tmp_path / "a", formats=("svg",))[0].read_bytes()
    fig2 = prf.plot_distance_to_floor(table, CEIL, title="floor")
    second = save_figure(fig2, tmp_path / "b", formats=("svg",))[0].read_bytes()
    assert first == second
    with pytest.raises(ValueError, match="missing columns"):
        prf.plot_distance_to_floor(table.drop(columns=["pct_of_copy"]), CEIL)


# ------------------------------------------------------------------------------------------------
# plot_registers
# ------------------------------------------------------------------------------------------------


def _counts():
    rows = []
    for block, regs, spill in ((4096, 60, 0), (8192, 124, 0), (16384, 128, 64), (32768, 128, 456)):
        rows.append({"loss": "reverse_kl", "target_format": "logits", "variant": "fused", "vocab": 32768,
                     "block_size": block, "num_warps": 16, "n_regs": regs, "spill_bytes": spill,
                     "shared_bytes": 1216, "source": "H100"})
    return pd.DataFrame(rows)


def test_with_estimates():
    out = preg.with_estimates(_counts(), {"reverse_kl/logits": 4}, overhead=28)
    last = out.iloc[-1]
    assert last.values_per_thread == 32768 // 512
    assert last.cap == 128
    assert last.estimate == 4 * 64 + 28 and bool(last.predicted_spill)
    assert last.demand == 128 + 114
    assert bool(last.spills)
    assert last.implied_tiles == pytest.approx((242 - 28) / 64)
    assert not bool(out.iloc[0].spills)
    with pytest.raises(ValueError, match="live_tiles"):
        preg.with_estimates(_counts(), {"cross_entropy/labels": 2})


def test_compare_offline_measured():
    measured = _counts()
    offline = measured.assign(status="ok", shared_bytes=measured["shared_bytes"] + 1024)
    offline.loc[3, "spill_bytes"] = 400
    merged = preg.compare_offline_measured(offline, measured)
    assert list(merged["match"]) == [True, True, True, False]  # shared memory is compared apart
    assert list(merged["shared_diff"]) == [1024] * 4
    assert {"n_regs_offline", "n_regs_h100", "spill_bytes_offline", "spill_bytes_h100"} <= set(merged.columns)
    assert len(preg.compare_offline_measured(offline.assign(status="error"), measured)) == 0


def test_spill_onset():
    onset = preg.spill_onset(_counts())
    row = onset.iloc[0]
    assert row.first_spilling_block == 16384
    assert row.largest_clean_block == 8192
    assert row.spill_bytes_there == 64
    clean = preg.spill_onset(_counts().assign(spill_bytes=0))
    assert pd.isna(clean.iloc[0].first_spilling_block)
    assert clean.iloc[0].largest_clean_block == 32768


def test_plot_register_pressure():
    df = pd.concat([_counts(), _counts().assign(num_warps=32, source="offline"),
                    _counts().assign(loss="cross_entropy", target_format="labels")], ignore_index=True)
    fig = preg.plot_register_pressure(df, live_tiles={"reverse_kl/logits": 4, "cross_entropy/labels": 2}, title="t")
    assert len(fig.axes) == 4  # 2 losses x 2 warp counts
    ax = fig.axes[0]
    assert ax.get_yscale() == "log"
    assert "BLOCK_SIZE" in fig.axes[-1].get_xlabel()
    assert "registers" in ax.get_ylabel()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="svg")
    with pytest.raises(ValueError, match="no row"):
        preg.plot_register_pressure(df.assign(n_regs=None), live_tiles={})


def test_offline_counts_records_failures_as_rows():
    frame, compiles = counts.offline_counts([("cross_entropy", "labels", "fused", 3, 4)], vocab=64, log=None)
    assert compiles == {}
    assert frame.iloc[0].status == "error"
    assert "block_size" in frame.iloc[0].error


@pytest.mark.slow
def test_offline_counts_compiles_for_sm90():
    frame, compiles = counts.offline_counts([("cross_entropy", "labels", "fused", 1024, 4)], vocab=1024, log=None)
    row = frame.iloc[0]
    assert row.status == "ok", row.error
    assert row.launch == "fused" and row.launches == 1
    assert 0 < row.n_regs <= 255 and row.spill_bytes == 0
    assert math.isclose(row.occupancy, row.occupancy)  # a number, not NaN
    assert len(compiles) == 1


def test_label_points_never_overlap_and_join_coincident_points():
    """Crowded points (a column of configurations at one occupancy, two at the same place) get labels that cover
    neither each other nor a marker; the labels of coincident points become one."""
    import matplotlib.pyplot as plt

    from perfutils.plots.figures import label_points

    fig, ax = plt.subplots(figsize=(3, 3))
    xs = [100, 100, 100, 100, 100, 50]
    ys = [1000, 1040, 1080, 1120, 1120, 500]
    ax.scatter(xs, ys)
    ax.set_xlim(0, 110)
    ax.set_ylim(0, 1200)
    notes = label_points(ax, xs, ys, ["28", "30", "32", "40", "64", "40"], fontsize=6)
    assert sorted(n.get_text() for n in notes) == ["28", "30", "32", "40", "40 · 64"]
    from matplotlib.text import Text

    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = [Text.get_window_extent(n, renderer) for n in notes]  # the text, not the line back to its point
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
    plt.close(fig)
