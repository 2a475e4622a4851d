"""perfutils.plots.designs: a design's best configuration per cell against the public call, and Nsight evidence."""

import pandas as pd
import pytest

from perfutils.plots import designs


def record(cfg, ms, pct, vocab=32000, loss="forward_kl", fmt="logits"):
    return {"loss": loss, "fmt": fmt, "vocab": vocab, "tokens": 4096, "cfg": cfg, "ms": ms, "pct": pct}


def test_best_against_product_takes_the_fastest_checked_configuration():
    records = [record("public", 0.20, 80.0), record("a", 0.30, 53.3), record("b", 0.25, 64.0),
               {"loss": "forward_kl", "fmt": "logits", "vocab": 32000, "cfg": "c", "error": "wrong result"},
               record("public", 0.10, 70.0, vocab=50304), record("a", 0.08, 87.5, vocab=50304)]
    best = designs.best_against_product(records, "d")
    assert list(best["best_cfg"]) == ["b", "a"]
    assert best["time_ratio"].tolist() == pytest.approx([1.25, 0.8])
    assert list(best["loss"]) == ["forward_kl/logits"] * 2
    assert list(best["baseline"]) == ["public call"] * 2
    reading = designs.designs_reading(best)
    assert "faster than the public call at 1 of 2 cells" in reading and "64.0–87.5% of copy" in reading


def test_a_marker_sets_the_product_plans_against_the_variation():
    records = [record("stream4096/4", 0.10, 99.0), record("2048/4", 0.30, 60.0), record("4096/4", 0.24, 70.0),
               record("2048/4/tm", 0.33, 55.0), record("4096/4/tm/re1", 0.28, 58.0)]
    best = designs.best_against_product(records, "d", marker="/tm")
    assert best[["baseline", "best_cfg"]].values.tolist() == [["plan 4096/4", "4096/4/tm/re1"]]
    assert best["time_ratio"].iloc[0] == pytest.approx(0.28 / 0.24)
    assert "faster than the product's plans at 0 of 1 cells" in designs.designs_reading(best)


def test_a_design_taken_apart_counts_only_its_whole_kernel_and_its_calls():
    records = [record("public", 0.20, 80.0), {**record("a", 0.25, 64.0), "ablate": 0},
               {**record("a", 0.15, 99.0), "ablate": 3, "err": float("inf")}]
    records += [{**record("plan", 0.19, 84.0), "kernel_only": True},
                {**record("a/launch", 0.18, 88.0), "kernel_only": True}]
    best = designs.best_against_product(records, "d")
    assert best[["best_cfg", "design_pct"]].values.tolist() == [["a", 64.0]]


def test_taken_apart_averages_each_part_over_the_passes():
    records = [{**record("4096/4/lag", 0.3, pct), "ablate": ablate, "pass": run}
               for run, values in ((1, (60.0, 64.0, 70.0)), (2, (61.0, 64.0, 71.0)))
               for ablate, pct in zip((0, 2, 3), values)]
    records += [record("public", 0.2, 80.0), {**record("4096/4/lag", 0.2, 99.0), "ablate": 1}]  # not a named part
    table = designs.taken_apart(records, {0: "whole", 2: "no read", 3: "neither"})
    assert table.columns.tolist() == ["loss", "vocab", "cfg", "whole", "no read", "neither"]
    assert table[["whole", "no read", "neither"]].values.tolist() == [[60.5, 64.0, 70.5]]
    assert designs.taken_apart([record("public", 0.2, 80.0)], {0: "whole"}).empty


def test_a_cell_without_the_public_call_is_left_out():
    assert designs.best_against_product([record("a", 0.3, 50.0)], "d").empty


def test_nsight_evidence_keeps_loss_kernels_in_order_with_their_cells():
    details = pd.DataFrame({"kernel": ["resident_row_kernel", "vectorized_elementwise_kernel", "streamed_row_kernel",
                                       "split_row_lagged_kernel", "streamed_row_kernel"],
                            **{metric: [1e6, 0, 2e6, 3e6, 4e6] for metric in designs.EVIDENCE}})
    table = designs.nsight_evidence(details, "d", cells=["x", "y"])
    assert list(table["kernel"]) == ["resident_row_kernel", "streamed_row_kernel", "split_row_lagged_kernel",
                                     "streamed_row_kernel"]
    assert list(table["cell"]) == ["x", "x", "y", "y"]
    assert table["us"].tolist() == [1e3, 2e3, 3e3, 4e3]  # ns from the parser
    assert table["instructions_M"].tolist() == [1, 2, 3, 4]
    with pytest.raises(ValueError, match="split evenly"):
        designs.nsight_evidence(details, "d", cells=["x", "y", "z"])
