"""perfutils.plots.prediction_overlays (the model's predictions in notebooks 01 and 03) and notebook 11's two-GPU
sentence, on synthetic frames and on the committed H100 data: CPU only, a few seconds."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from perfutils.data.records import load_records  # noqa: E402
from perfutils.model import predict  # noqa: E402
from perfutils.model.roofline import ceilings_from_records  # noqa: E402
from perfutils.plots import prediction_overlays as po  # noqa: E402
from perfutils.plots import roofline as prf  # noqa: E402
from perfutils.plots.prediction import counts_reading, speedup_reading  # noqa: E402

DATA = Path(__file__).resolve().parent.parent / "data" / "h100-sxm-80gb"


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def sweep(order=(1, 2, 3, 4, 5)) -> pd.DataFrame:
    """Two shapes of five block sizes; the model's times follow ``order`` (times invented, not measurements)."""
    rows = []
    for vocab in (32768, 65536):
        for i, block in enumerate((1024, 2048, 4096, 8192, 16384)):
            measured = 0.1 * (i + 1) * vocab / 32768
            rows.append({"study": "blocksize_sweep", "config_key": f"{vocab}-{block}", "loss": "reverse_kl",
                         "target_format": "logits", "variant": "fused", "vocab": vocab, "block_size": block,
                         "num_warps": 8, "ms_median": measured})
    rows = pd.DataFrame(rows)
    checked = rows[["study", "config_key"]].assign(
        predicted_ms=[0.1 * order[i % 5] for i in range(len(rows))], bound="dram")
    checked["abs_rel_err"] = (checked["predicted_ms"] / rows["ms_median"] - 1).abs()
    return po.with_predictions(rows, checked)


def test_predictions_join_by_study_and_key_and_leave_unknown_rows_empty():
    frame = sweep()
    extra = frame.iloc[:1].assign(config_key="not-modelled")
    joined = po.with_predictions(pd.concat([frame, extra]), frame[["study", "config_key", "predicted_ms", "bound",
                                                                      "abs_rel_err"]])
    assert joined["predicted_ms"].notna().sum() == len(frame) and joined["predicted_ms"].isna().sum() == 1
    twice = pd.concat([frame, frame])[["study", "config_key", "predicted_ms", "bound", "abs_rel_err"]]
    with pytest.raises(ValueError, match="twice"):
        po.with_predictions(frame, twice)


def test_the_reading_says_whether_the_model_picks_the_fastest():
    right = po.pick_reading(sweep((1, 2, 3, 4, 5)))
    assert "fastest at 2" in right and "Spearman rank correlation of 1.00" in right
    wrong = po.pick_reading(sweep((5, 4, 3, 2, 1)))  # the model's pick is the slowest: 5x the best
    assert "fastest at 0" in wrong and "400.0% slower" in wrong and "-1.00" in wrong


def test_the_sweep_figure_has_a_panel_per_shape_with_lines_and_points():
    fig = po.plot_sweep_prediction(sweep(), title="synthetic")
    axes = [ax for ax in fig.axes if ax.lines]
    assert len(axes) == 2
    assert all(len(ax.lines) == 2 for ax in axes)  # one predicted line, one set of measured points
    with pytest.raises(ValueError, match="no row"):
        po.plot_sweep_prediction(sweep().assign(predicted_ms=float("nan")))


def test_the_roofline_carries_a_cross_per_predicted_point():
    """On the committed H100 data: every project kernel's point gets a prediction, the baselines none, and the
    reading names both."""
    bench = load_records(DATA / "benchmark.csv")
    points = prf.best_rows(bench).assign(source="benchmark")
    points = points[points["tokens"] == 4096].reset_index(drop=True)
    ceilings = ceilings_from_records(DATA / "ceilings.csv")
    table = po.with_predictions(prf.roofline_table(prf.with_costs(points), ceilings),
                                predict.check(DATA, studies=("benchmark",)))
    ours = table["variant"].isin(["fused", "two_pass", "split_row", "auto"])
    assert table.loc[ours, "predicted_ms"].notna().all() and table.loc[~ours, "predicted_ms"].isna().all()
    ax = po.plot_roofline_predictions(table, ceilings, title="H100")
    beside = {round(x * po._BESIDE, 9) for x in table.loc[ours, "intensity"]}  # crosses sit right of their column
    crosses = [c for c in ax.collections if len(c.get_offsets()) == 1
               and round(float(c.get_offsets()[0][0]), 9) in beside]
    assert len(crosses) == int(ours.sum())
    text = po.roofline_prediction_reading(table)
    assert f"predicts {int(ours.sum())} of the {len(table)} points" in text and "eager" in text


def test_check_reads_only_the_studies_asked_for():
    frame = predict.check(DATA, studies=("case_497_ablation",))
    assert set(frame["study"]) == {"case_497_ablation"} and len(frame) > 5
    with pytest.raises(ValueError, match="not"):
        predict.check(DATA, studies=("no_such_study",))


def test_the_two_gpu_sentence_compares_measured_and_predicted_gains():
    a = pd.DataFrame({"study": ["s"] * 3, "config_key": list("abc"), "measured_ms": [2.0, 4.0, 6.0],
                      "predicted_ms": [2.0, 4.0, 6.0]})
    b = a.assign(measured_ms=a["measured_ms"] / 1.1, predicted_ms=a["predicted_ms"] / 1.4)
    text = speedup_reading(a, b, ("old", "new"))
    assert "3 configurations" in text and "1.10x" in text and "1.40x" in text
    assert "No configuration" in speedup_reading(a, b.assign(config_key=list("xyz")))


def test_the_two_gpu_sentence_compares_like_with_like_where_it_can():
    """With each row's kernel sources: only the pairs of identical sources count, and the others are named; where
    none is identical, all pairs count and the sentence says the ratio holds the code's changes too."""
    a = pd.DataFrame({"study": ["s"] * 3, "config_key": list("abc"), "measured_ms": [2.0, 4.0, 6.0],
                      "predicted_ms": [2.0, 4.0, 6.0], "kernels": ["k1", "k1", None]})
    b = a.assign(measured_ms=[2.0 / 1.1, 4.0 / 3.0, 6.0 / 3.0], predicted_ms=a["predicted_ms"] / 1.4,
                 kernels=["k1", "k2", "k1"])
    text = speedup_reading(a, b, ("old", "new"))
    assert text.startswith("On the 1 configurations recorded on both GPUs with identical kernel sources on both")
    assert "1 ran different kernel sources" in text and "1 ran sources the history cannot tell" in text
    assert "1.10x" in text and "1.40x" in text
    mixed = speedup_reading(a, b.assign(kernels=["k2", "k2", "k2"]), ("old", "new"))
    assert "On the 3 configurations" in mixed and "none is known" in mixed and "3.00x" in mixed


def test_the_counts_sentence_says_which_rows_ran_the_counted_kernels():
    frame = pd.DataFrame({"counted_kernels": ["", "k1", "k1", "k1", None], "kernels": ["k1", "k1", "k2", None, "k1"]})
    assert counts_reading(frame) == ("4 of the 5 configurations take a lagged step counted offline: 1 ran the kernel "
                                     "sources their counts were compiled from, 1 ran other sources (their counts are "
                                     "of other kernels), 1 ran sources the history cannot tell, 1 have counts that "
                                     "name no sources.")
    unnamed = frame.assign(counted_kernels=["", None, None, None, None])
    assert counts_reading(unnamed).endswith("the counts name no kernel sources (counted before the counts file "
                                            "recorded them).")
    assert counts_reading(frame.assign(counted_kernels="")).startswith("None of the 5")


def test_check_names_the_kernels_a_counted_step_came_from():
    """The H200's counts file records the kernel sources each count compiled; a row without a counted step says ""."""
    frame = predict.check(DATA.parent / "h200")
    counted = frame[frame["counted_kernels"] != ""]
    assert len(counted) and counted["counted_kernels"].notna().all()
    assert frame["timestamp_utc"].notna().any()
