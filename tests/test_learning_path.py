"""perfutils.learning_path and its figure on the recorded H100 data (CPU, about a second)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from perfutils import learning_path as lp
from perfutils.plots.learning_path import plot_path

DATA = Path(__file__).resolve().parent.parent / "data" / "h100-sxm-80gb"


@pytest.fixture(scope="module")
def frame():
    return lp.path_frame(DATA)


def test_every_step_has_an_after_row_and_a_prediction_where_recorded(frame):
    assert list(frame[frame["side"] == "after"]["step"]) == [s.key for s in lp.STEPS]
    recorded = frame[frame["recorded_ms"].notna()]
    assert len(recorded) == len(frame)  # every pick finds its row in today's data
    assert recorded["predicted_ms"].gt(0).all()
    assert set(recorded["bound"]) <= {"dram", "latency", "waves", "l2", "issue", "mufu", "spills", "host", "launch"}


def test_a_missing_row_is_said_not_invented(tmp_path):
    (tmp_path / "ceilings.csv").write_text((DATA / "ceilings.csv").read_text())
    step = lp.PathStep("x", "X", "?", (), after=lp.Pick("nowhere", (("vocab", 1),)))
    out = lp.path_frame(tmp_path, steps=(step,))
    assert math.isnan(out["recorded_ms"].iloc[0]) and math.isnan(out["predicted_ms"].iloc[0])
    assert lp.step_summary(out, "x")[1] == "No recorded row measures this step."


def test_speedups_and_summary_are_computed_from_the_rows(frame):
    ups = lp.speedups(frame).set_index("step")
    rows = frame[frame["step"] == "tuple"].set_index("side")
    assert ups.loc["tuple", "recorded speed-up"] == pytest.approx(rows.loc["before", "recorded_ms"] / rows.loc["after", "recorded_ms"])
    _, sentence = lp.step_summary(frame, "tuple")
    assert f"{rows.loc['after', 'recorded_ms']:.3f} ms" in sentence
    assert "497" not in ups.index  # the first step has nothing before it


def test_the_steps_show_at_least_six_product_kernels():
    shown = {fn for step in lp.STEPS for fn in lp.step_functions(step)}
    product = {fn for fn in shown if getattr(getattr(fn, "fn", fn), "__module__", "").startswith("kernels.")}
    kernels = {fn for fn in product if getattr(getattr(fn, "fn", fn), "__name__", "").endswith("_kernel")}
    assert len(kernels) >= 6


def test_knob_predicts_recorded_configurations_only():
    options = lp.knob_options(DATA)
    first = options.iloc[0]
    out = lp.knob_prediction(DATA, int(first["block_size"]), int(first["num_warps"]))
    assert out["recorded_ms"] == pytest.approx(first["ms_median"]) and out["predicted_ms"] > 0
    bigger = lp.knob_prediction(DATA, int(options["block_size"].max()), int(first["num_warps"]))
    assert bigger["predicted_ms"] != out["predicted_ms"]
    with pytest.raises(KeyError):
        lp.knob_prediction(DATA, 3, 4)


def test_sass_excerpt_keeps_the_heading_and_spill_lines():
    text = lp.sass_excerpt(DATA / "logs" / "case_497_spill_sass_2026-11-23.txt", lines=3)
    lines = text.splitlines()
    assert "stack" in text and len([l for l in lines if l.strip().startswith("/*")]) == 3
    assert all(" STL" in l or " LDL" in l for l in lines if l.strip().startswith("/*"))


def test_plot_path_one_row_per_step(frame):
    import matplotlib.pyplot as plt

    fig = plot_path(frame, title="t")
    assert len(fig.axes[0].get_yticks()) == len(lp.STEPS)
    plt.close(fig)
    with pytest.raises(ValueError):
        plot_path(frame.drop(columns=["floor_ms"]))
