"""perfutils.plots.step_parts: the lagged step taken apart (runs AE-AH), from an exploration log's records."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from perfutils.data.records import exploration_records  # noqa: E402
from perfutils.plots import step_parts  # noqa: E402

LOG = Path(__file__).resolve().parent.parent / "data/h200/logs/explore_summaries_2026-11-29.txt"
AE = "## run AE (the first call; the pass headers name the ABLATE value)"


def record(cfg, pct, ablate=None, loss="forward_kl", fmt="logits", vocab=32000):
    out = {"lag": 2, "loss": loss, "vocab": vocab, "tokens": 4096, "cfg": cfg, "pct": pct}
    if not cfg.startswith("stream"):
        out["fmt"] = fmt
    if ablate:
        out["ablate"] = ablate
    return out


def test_each_part_keeps_its_best_configuration_over_the_passes():
    records = [record("stream4096/4", 99.0), record("4096/4", 70.0), record("4096/4", 72.0),  # mean 71
               record("8192/4", 73.0), record("8192/4", 67.0),  # mean 70: not the best, though its best pass is
               record("4096/4", 80.0, ablate=2), record("4096/4", 82.0, ablate=2),
               {"lag": 2, "loss": "forward_kl", "fmt": "logits", "vocab": 32000, "cfg": "1024/1", "error": "x"}]
    parts = step_parts.step_parts(records)
    whole = parts[parts["part"] == 0].iloc[0]
    assert (whole["config"], whole["pct"], whole["name"]) == ("4096/4", 71.0, "whole step")
    stream = parts[parts["part"] == "stream"].iloc[0]
    assert stream["target_format"] == "logits" and stream["pct"] == 99.0  # the stream takes its plans' format
    assert list(parts["part"]) == [0, 2, "stream"]  # in the order a reader takes parts away
    table = step_parts.parts_table(parts)
    assert list(table.columns) == ["loss", "target_format", "vocab", "whole step", "no summaries read",
                                   "plain stream"]


def test_unknown_parts_and_empty_records():
    with pytest.raises(ValueError, match="parts"):
        step_parts.step_parts([record("4096/4", 70.0, ablate=16)])
    assert step_parts.step_parts([]).empty
    with pytest.raises(ValueError, match="no record"):
        step_parts.plot_step_parts(step_parts.step_parts([]))


def test_the_recorded_run_ae_reads_and_plots():
    parts = step_parts.step_parts(exploration_records(f"{LOG}::{AE}"))
    assert len(parts) == 6 * 6  # three losses x two vocabularies, five parts and the stream
    table = parts.pivot_table(index=["loss", "vocab"], columns="part", values="pct")
    assert (table[6] > table[0]).all() and (table["stream"] > table[6]).all()
    reading = step_parts.parts_reading(parts)
    assert reading.startswith("Over the whole step, the distribution losses gain") and "no summaries read +" in reading
    assert "plain stream of the same bytes" in reading
    fig = step_parts.plot_step_parts(parts, title="H200")
    ax = fig.axes[0]
    assert len(ax.patches) == 6 * 5  # a bar per cell and part, the stream drawn as ticks
    assert [label.get_text() for label in ax.get_yticklabels()][0] == "cross_entropy (labels)\n32000 columns"


def test_exploration_days_reads_the_stamps_of_a_log_or_its_section(tmp_path):
    from perfutils.data.records import exploration_days

    assert exploration_days(f"{LOG}::{AE}") == "2026-11-29"
    log = tmp_path / "log.txt"
    log.write_text("# a run\n## one\n# code abc 2026-11-28T10:00Z\n{\"lag\": 2}\n## two\n# code abd 2026-11-30T09:00Z\n"
                   "# not a stamp: 2026-12-01\n")
    assert exploration_days(log) == "2026-11-28 to 2026-11-30"
    assert exploration_days(f"{log}::## two") == "2026-11-30"
    assert exploration_days(f"{log}::## one") == "2026-11-28"
