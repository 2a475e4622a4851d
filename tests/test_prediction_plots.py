"""perfutils.plots.prediction (notebook 11's figures and tables) on a synthetic check frame, and the what-if on a
synthetic configuration: CPU only, about a second."""

from __future__ import annotations

import json

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from perfutils.model.predict import BOUNDS, Gpu, KernelPass, LaunchConfig  # noqa: E402
from perfutils.model.roofline import Ceilings  # noqa: E402
from perfutils.plots import prediction as pp  # noqa: E402
from perfutils.plots.figures import save_figure  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def frame() -> pd.DataFrame:
    """Shaped like perfutils.model.predict.check's frame (times invented for the test, not measurements)."""
    rows = []
    for study, scale in (("vocab_sweep", 1.0), ("blocksize_sweep", 1.3)):
        for i in range(12):
            measured = 0.1 * (i + 1)
            predicted = measured * (scale if i % 3 else 0.9)
            bound = "dram" if i % 4 else "latency"
            rows.append({"study": study, "config_key": f"{study}-{i}", "measured_ms": measured,
                         "predicted_ms": predicted, "bound": bound, "loss": "reverse_kl", "variant": "plan",
                         "tokens": 4096, "vocab": 32768, **{f"{b}_ms": 0.0 for b in BOUNDS},
                         "dram_ms": predicted * 0.9, "launch_ms": 0.003})
    out = pd.DataFrame(rows)
    return out.assign(abs_rel_err=(out["predicted_ms"] / out["measured_ms"] - 1).abs())


def test_predicted_vs_measured_has_a_panel_per_study_with_units_and_is_deterministic(tmp_path):
    fig = pp.plot_predicted_vs_measured(frame(), title="NVIDIA H100 · measured 2026-11-22")
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert len(panels) == 2
    assert all(ax.get_xscale() == "log" and ax.get_yscale() == "log" for ax in panels)
    assert "(ms)" in panels[0].get_xlabel() and "(ms)" in panels[0].get_ylabel()
    assert "2026-11-22" in fig._suptitle.get_text()
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert {"±10%", "±25%", "predicted = measured", "bound: dram", "bound: latency"} <= set(legend)
    first = save_figure(fig, tmp_path / "a", formats=("svg",), show=False)[0].read_bytes()
    again = save_figure(pp.plot_predicted_vs_measured(frame(), title="NVIDIA H100 · measured 2026-11-22"),
                        tmp_path / "b", formats=("svg",), show=False)[0].read_bytes()
    assert first == again


def test_predicted_vs_measured_refuses_a_frame_without_its_columns():
    with pytest.raises(ValueError, match="measured_ms"):
        pp.plot_predicted_vs_measured(frame().drop(columns=["measured_ms"]))
    with pytest.raises(ValueError, match="no configuration"):
        pp.plot_predicted_vs_measured(frame().assign(measured_ms=float("nan")))


def test_worst_by_bound_and_goals_are_computed_from_the_frame():
    data = frame()
    worst = pp.worst(data, 3)
    assert len(worst) == 3 and worst["error %"].abs().is_monotonic_decreasing
    assert worst["error %"].abs().iloc[0] == pytest.approx(30.0)
    assert "dram" in worst["breakdown (ms)"].iloc[0] and "spills" not in worst["breakdown (ms)"].iloc[0]
    split = pp.by_bound(data)
    assert list(split.index) == ["dram", "latency"] and split["configurations"].sum() == len(data)
    assert split["share %"].sum() == pytest.approx(100.0)
    goals = pp.goal_table({"H100": data}, [("H100", "median", 0.5), ("H100", "p90", 0.01),
                                           ("H100", "spearman", 0.9), ("H200", "median", 0.15)])
    assert goals["met"].tolist() == [True, False, True, False]  # a GPU without data meets nothing
    assert goals["value"].iloc[0] == pytest.approx(data["abs_rel_err"].median())


def test_in_flight_sweep_and_its_figure():
    gpu = Gpu(Ceilings(dram_gbps=3000.0, l2_gbps=7600.0, fp32_tflops=61.0, exp2_tops=4.1))
    kp = KernelPass("split_row", programs=512, tile=4096, num_warps=4, resident=4, steps=256.0,
                    load_bytes_per_step=16384, dram_bytes=3.2e9, l2_bytes=2.1e9, elements=4096 * 131072, inputs=2)
    config = LaunchConfig("vocab_sweep", "k", "plan", "reverse_kl", "logits", 4096, 131072, "bf16", passes=(kp,))
    sweep = pp.in_flight_sweep(config, gpu, [1, 4], [1024, 4096, 16384])
    assert len(sweep) == 6 and set(sweep["warps_per_sm"]) == {4, 16}
    assert (sweep["pct_of_copy"] > 0).all() and (sweep["pct_of_copy"] <= 100).all()
    one = sweep[sweep["resident"] == 1].sort_values("tile")["pct_of_copy"]
    assert one.is_monotonic_increasing  # more bytes in flight is never slower
    assert sweep.loc[(sweep["resident"] == 4) & (sweep["tile"] == 4096), "kb_in_flight_per_sm"].item() == 64
    fig = pp.plot_in_flight(sweep, target_pct=90, title="H100 · predicted")
    ax = fig.axes[0]
    assert "KiB" in ax.get_xlabel() and "%" in ax.get_ylabel()
    assert any(line.get_ydata()[0] == 90 for line in ax.get_lines())


def test_sidecar_dates(tmp_path):
    for study, stamp in (("a", "2026-11-22T13:00:00Z"), ("b", "2026-11-26T15:00:00Z")):
        (tmp_path / f"{study}.json").write_text(json.dumps({"timestamp_utc": stamp}))
    assert pp.sidecar_dates(tmp_path, ["a", "b", "a"]) == "2026-11-22 to 2026-11-26"
    assert pp.sidecar_dates(tmp_path, ["a"]) == "2026-11-22"
    assert pp.sidecar_dates(tmp_path, ["missing"]) is None
    (tmp_path / "c.json").write_text(json.dumps({"timestamp_utc": "2026-11-23T10:00:00Z", "sessions": [
        {"timestamp_utc": "2026-11-23T10:00:00Z"}, {"timestamp_utc": "2026-11-28T01:49:37Z"}]}))
    assert pp.sidecar_dates(tmp_path, ["c"]) == "2026-11-23 to 2026-11-28"  # rows added by a later process count


def test_what_binds_at_the_public_cells_and_what_a_kernel_needs():
    """Notebook 11's public-cell table and need: every recorded public cell is there with its in-flight bytes, the
    summary groups them per GPU, tokens and family, and the need is the fewest bytes in flight reaching the target."""
    from pathlib import Path

    from perfutils.model.predict import gpu_from_folder, load_configurations

    data = Path(__file__).resolve().parent.parent / "data" / "h100-sxm-80gb"
    cells = pp.public_cells(data)
    assert len(cells) > 100 and set(cells["family"]) == {"labels CE", "distribution"}
    assert (cells["effective_kib"] <= cells["nominal_kib"]).all() and (cells["needed_kib"] > 0).all()
    summary = pp.binds_summary(cells)
    assert summary["cells"].sum() == len(cells) and {1024, 4096, 16384} <= set(summary["tokens"])
    assert "distribution" in pp.binds_reading(summary)
    gpu = gpu_from_folder(data)
    cell = next(c for c in load_configurations(data, gpu, ["vocab_sweep"])
                if c.variant == "public" and c.loss == "reverse_kl" and c.tokens == 4096 and c.vocab == 131072)
    sweep = pp.in_flight_sweep(cell, gpu, [1, 2, 4], [2048, 4096], loads_ahead=[0, 1], tiles_per_step=1)
    least = pp.least_in_flight(sweep, 50.0)
    assert list(least["loads_ahead"]) == [0, 1] and least["reaches"].all()
    for ahead, row in least.set_index("loads_ahead").iterrows():
        part = sweep[(sweep["loads_ahead"] == ahead) & (sweep["pct_of_copy"] >= 50.0)]
        assert row["kb_in_flight_per_sm"] == part["kb_in_flight_per_sm"].min()
    text = pp.needs_reading(least.assign(GPU="H100", target=50.0))
    assert text.startswith("H100, 50% of copy:") and "KiB per SM" in text
    fig = pp.plot_binds(cells)
    assert len(fig.axes) == 2 and "%" in fig.axes[0].get_xlabel()


def test_a_built_kernel_is_checked_plan_by_plan(tmp_path):
    """built_check reads an exploration log's records (one pass of several), predicts each split plan from its
    registers, grid and schedule and keeps the streams and one-program-a-row plans out; built_summary keeps each
    cell's and design's fastest configuration; built_reading counts the cells the built design won and the model's
    median miss per design."""
    from pathlib import Path

    from perfutils.data.records import DataFileError, exploration_records
    from perfutils.model.predict import gpu_from_folder

    cell = {"lag": 2, "loss": "forward_kl", "fmt": "logits", "vocab": 32000, "tokens": 4096}
    plans = [dict(cell, cfg="4096/4", programs=528, chunks=8, schedule="lagged", ms=0.30, pct=60.0, regs=128),
             dict(cell, cfg="2048/4", programs=1056, chunks=16, schedule="lagged", ms=0.32, pct=56.0, regs=64),
             dict(cell, cfg="2048/4/sckept/ke2", programs=528, chunks=16, schedule="kept", ms=0.40, pct=45.0, regs=96),
             dict(cell, cfg="2048/4/sckept", programs=528, chunks=16, schedule="kept", ms=0.36, pct=50.0, regs=105)]
    stream = dict(cell, cfg="stream4096/4", ms=0.18, pct=100.0)
    row_plan = dict(cell, cfg="32768/16/spFalse", programs=None, chunks=1, schedule=None, ms=0.3, pct=60.0, regs=128)
    log = tmp_path / "explore.txt"
    log.write_text("# header\n## pass 1\n" + json.dumps(dict(plans[0], pct=1.0)) + "\n## pass 2\nGPU 0: test\n"
                   + "\n".join(json.dumps(r) for r in [stream, *plans, row_plan]) + "\n")
    records = exploration_records(f"{log}::## pass 2")
    assert len(records) == 6 and records[1]["pct"] == 60.0
    with pytest.raises(DataFileError, match="pass 3"):
        exploration_records(f"{log}::## pass 3")
    gpu = gpu_from_folder(Path(__file__).resolve().parent.parent / "data" / "h200")
    built = pp.built_check(records, gpu)
    assert list(built["design"]) == ["lagged", "lagged", "kept", "kept"]
    assert (built["predicted_pct"] > 0).all() and set(built["bound"]) <= set(BOUNDS)
    summary = pp.built_summary(built)
    assert list(summary["config"]) == ["4096/4", "2048/4/sckept"]
    reading = pp.built_reading(built)
    assert reading.startswith("The kept design beat the lagged one at 0 of 1 cells")
    assert "-10.0 to -10.0 points" in reading and "(2 plans)" in reading


def test_counted_steps_reach_the_check_and_split_into_fixed_and_per_element(tmp_path):
    """built_check predicts a plan from its counted step where the offline log has it (counted: True) and from the
    per-element estimate elsewhere; more instructions a step predict a slower plan. counted_reading compares the two
    checks per design. step_split recovers a line through the plain plans' counts; nsight_steps lines records up with
    their profiles."""
    from pathlib import Path

    from perfutils.model.predict import gpu_from_folder

    cell = {"lag": 2, "loss": "forward_kl", "fmt": "logits", "vocab": 32000, "tokens": 4096}
    records = [dict(cell, cfg="2048/4", programs=1056, chunks=16, schedule="lagged", ms=0.31, pct=60.0, regs=64),
               dict(cell, cfg="2048/4/sckept", programs=528, chunks=16, schedule="kept", ms=0.33, pct=55.0, regs=105)]
    offline = [{"loss": "forward_kl", "fmt": "logits", "vocab": 32000, "cfg": "2048/4", "regs": 64, "step": 787},
               {"loss": "forward_kl", "fmt": "logits", "vocab": 32000, "cfg": "2048/4/sckept", "regs": 105,
                "step": 681},
               {"loss": "forward_kl", "fmt": "logits", "vocab": 32000, "cfg": "2048/4/sckept/re1", "step": 900},
               {"loss": "forward_kl", "fmt": "logits", "vocab": 50257, "cfg": "4096/4", "step": 2000},
               {"loss": "forward_kl", "fmt": "logits", "vocab": 32000, "cfg": "4096/4", "step": 1195},
               {"loss": "forward_kl", "fmt": "logits", "vocab": 32000, "cfg": "1024/4/sckept", "step": 521}]
    steps = pp.counted_steps(offline)
    assert steps[("forward_kl", "logits", 32000, "2048/4")] == 787 and len(steps) == 6
    gpu = gpu_from_folder(Path(__file__).resolve().parent.parent / "data" / "h200")
    estimated, counted = pp.built_check(records, gpu), pp.built_check(records, gpu, steps)
    assert not estimated["counted"].any() and counted["counted"].all()
    heavier = pp.built_check(records, gpu, {key: 4 * value for key, value in steps.items()})
    assert (heavier["predicted_pct"] < counted["predicted_pct"]).all()
    reading = pp.counted_reading(estimated, counted)
    assert reading.count("over 1 plans") == 2 and "the kept plans" in reading
    split = pp.step_split(offline).set_index("design")
    assert split.loc["lagged", "per_element"] == pytest.approx((1195 - 787) / 16)
    assert split.loc["lagged", "fixed"] == pytest.approx(787 - 16 * (1195 - 787) / 16)
    assert split.loc["kept", "per_element"] == pytest.approx((681 - 521) / 8) and split.loc["kept", "plans"] == 2
    profiles = [{"step_instructions": 767.0, "nested_passes": 1.9, "nested_pct": 5.4, "marker_pct": 25.8,
                 "long_sb_pct": 28.6, "barrier_pct": 11.3}] * 2
    table = pp.nsight_steps(records, profiles, steps)
    assert list(table["step_counted"]) == [787, 681] and list(table["design"]) == ["lagged", "kept"]
    with pytest.raises(ValueError, match="2 timed records but 1"):
        pp.nsight_steps(records, profiles[:1])
    residuals = pp.step_residuals(counted)
    assert list(residuals["design"]) == ["kept", "lagged"] and list(residuals["plans"]) == [1, 1]
    lagged = counted[counted["design"] == "lagged"].iloc[0]
    assert lagged["steps"] == pytest.approx(4096 * 16 / 1056 + 2)
    assert residuals.loc[1, "median_us"] == pytest.approx((0.31 - lagged["predicted_ms"]) * 1e3 / lagged["steps"])
    assert pp.residual_reading(residuals).count("µs") == 2


def test_round_trip_check_fits_on_half_and_checks_the_other():
    from perfutils.plots.prediction import round_trip_check, round_trip_reading

    # measured = predicted + 0.5 us a step, exactly: the fitted trip is 0.5 and the held-out error vanishes
    rows = [{"loss": "forward_kl", "target_format": "logits", "vocab": vocab, "config": f"{block}/4",
             "design": "lagged", "counted": True, "steps": steps, "predicted_ms": 0.2,
             "measured_ms": 0.2 + 0.5e-3 * steps, "measured_pct": 60.0}
            for vocab in (32000, 131072) for block, steps in ((2048, 100.0), (4096, 50.0))]
    rows.append({**rows[0], "config": "1024/4", "counted": False, "measured_ms": 9.0})  # not counted: left out
    table = round_trip_check(pd.DataFrame(rows))
    assert table.loc[0, "round_trip_us"] == pytest.approx(0.5)
    assert (table.loc[0, "fitted_on"], table.loc[0, "checked_on"]) == (2, 2)
    assert table.loc[0, "error_pct_with"] == pytest.approx(0.0, abs=1e-9)
    assert table.loc[0, "error_pct_without"] > 10
    assert "0.50 µs a step" in round_trip_reading(table)
