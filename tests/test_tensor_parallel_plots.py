"""perfutils.plots.tensor_parallel (tables, figures) and the byte model of perfutils.studies.tensor_parallel, on a
synthetic records frame."""

from __future__ import annotations

import json

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from perfutils.studies.tensor_parallel import bytes_model  # noqa: E402
from perfutils.plots import tensor_parallel as tpp  # noqa: E402
from perfutils.plots.figures import save_figure  # noqa: E402

GPU = "NVIDIA H200"


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def records() -> pd.DataFrame:
    """A frame shaped like data/<gpu>/tensor_parallel.csv (times invented for the test, not measurements)."""
    model = bytes_model([4096], [131072, 256000])
    rows = []
    for row in model.itertuples():
        ms = {"tp1-auto": 1.0, "tp2-all_gather": 0.75, "tp2-symmetric": 0.55, "tp2-fast_llm": 0.8}[row.variant]
        ms *= row.vocab / 131072
        rows.append(dict(row._asdict(), ms_median=ms, ms_p20=ms * 0.99, ms_p80=ms * 1.01, status="ok", gpu_name=GPU,
                         ms_batch=ms, ms_median_rank0=ms, ms_median_rank1=ms * 0.98))
    frame = pd.DataFrame(rows).drop(columns=["Index"])
    frame.loc[(frame["variant"] == "tp2-symmetric") & (frame["vocab"] == 256000) & (frame["loss"] == "reverse_kl"),
              "ms_median"] = 2.0 * 0.7  # one shape misses the target
    return frame


def test_bytes_model_counts_what_the_designs_move():
    frame = bytes_model([4096], [131072])
    per = frame.set_index(["loss", "target_format", "variant"])["dram_bytes_per_element"]
    assert per[("cross_entropy", "labels", "tp2-all_gather")] == 6
    assert per[("cross_entropy", "labels", "tp2-symmetric")] == 4
    assert per[("reverse_kl", "logits", "tp2-all_gather")] == 10 and per[("reverse_kl", "logits", "tp2-symmetric")] == 6
    assert per[("reverse_kl", "logits", "tp2-fast_llm")] == 10 and per[("reverse_kl", "logits", "tp1-auto")] == 6
    assert set(frame["collectives"]) == {0, 1, 3, 5}


def test_time_table_and_acceptance():
    table = tpp.time_table(records())
    assert table["tp2-symmetric / tp1"].min() == pytest.approx(0.55)
    verdict = tpp.acceptance(records())
    assert len(verdict) == 8 and verdict["met"].sum() == 7
    missed = verdict[~verdict["met"]].iloc[0]
    assert missed["loss"] == "reverse_kl" and missed["vocab"] == 256000 and not missed["within_0.6"]


def test_symmetric_chunks_reads_each_rows_plan():
    frame = records()
    config = json.dumps({"block_size": 8192, "num_warps": 4, "num_chunks": 8, "source": "first-call search"})
    frame["config"] = None
    frame.loc[frame["variant"] == "tp2-symmetric", "config"] = config
    table = tpp.symmetric_chunks(frame)
    assert len(table) == 8 and set(table["block_size"]) == {8192} and set(table["chosen_by"]) == {"first-call search"}
    assert set(table["slice"]) == {65536, 128000} and set(table["chunks"]) == {8}
    with pytest.raises(ValueError, match="no tp2-symmetric rows"):
        tpp.symmetric_chunks(frame[frame["variant"] != "tp2-symmetric"])


def test_communication_table():
    table = tpp.communication_table(records())
    assert set(table["variant"]) == {"tp2-all_gather", "tp2-symmetric", "tp2-fast_llm"}
    assert (table["exchange_share_of_dram"] < 0.01).all()


def test_figures_render(tmp_path):
    fig = tpp.plot_ratio_to_tp1(records(), title=GPU)
    assert save_figure(fig, tmp_path / "ratio")
    fig = tpp.plot_bytes_per_rank(bytes_model([4096], [131072]), tokens=4096, vocab=131072)
    assert save_figure(fig, tmp_path / "bytes")
    with pytest.raises(ValueError, match="no rows"):
        tpp.plot_bytes_per_rank(bytes_model([4096], [131072]), tokens=1, vocab=131072)
    with pytest.raises(ValueError, match="missing columns"):
        tpp.time_table(pd.DataFrame({"loss": []}))


def test_tensor_parallel_table_says_how_many_shapes_meet_the_bound():
    """The tensor-parallel table of the recorded study (on the report's landing page: tests/test_report_index.py)
    says how many shapes meet the bound, read from the same rows."""
    from pathlib import Path

    from perfutils.data.records import load_records
    from perfutils.plots import summary

    repo = Path(__file__).resolve().parents[1]
    gpu_dir = repo / "data" / "h100-sxm-80gb"
    if not (gpu_dir / "tensor_parallel.csv").exists():
        pytest.skip("no tensor_parallel.csv recorded")
    text = summary.tensor_parallel_table(gpu_dir)
    verdict = tpp.acceptance(load_records(gpu_dir / "tensor_parallel.csv"))
    assert f"at {int(verdict['met'].sum())} of {len(verdict)} shapes" in text


def test_reading_puts_measured_ratios_beside_the_bytes_ratio():
    frame = records()
    frame["config"] = None
    frame.loc[frame["variant"] == "tp2-symmetric", "config"] = json.dumps({"block_size": 4096, "source": "search"})
    lines = tpp.reading(bytes_model([4096], [131072, 256000]), frame)
    assert "tp=2 all_gather (ours) moves 1.50–1.67× the minimum per rank, so its bytes alone give 0.75–0.83× tp=1's " \
           "time; measured 0.75×" in lines[0]
    assert "tp=2 symmetric (ours) moves 1.00× the minimum per rank" in lines[0] and "measured 0.55–0.72×" in lines[0]
    assert lines[1].startswith("* **The exchange.** At most") and "4096-column chunks at 8 of 8 shapes" in lines[2]


def test_the_peer_bullet_sets_the_design_against_fast_llms_faster_calls():
    frame = records()
    peer = frame["variant"] == "tp2-fast_llm"
    frame.loc[peer, "ms_p20"], frame.loc[peer, "ms_p80"] = frame.loc[peer, "ms_median"] * 0.5, frame.loc[peer, "ms_median"]
    table = tpp.versus_peer_calls(frame)
    assert len(table) == 8 and table["peer_spread"].round(6).eq(2.0).all()
    # symmetric 0.55 (0.7 x 2 at one shape) over the peer's 0.8: 0.6875 of its median; over its p20 (0.4) twice that
    assert table["over_peer_median"].min() == pytest.approx(0.55 / 0.8)
    assert table["over_peer_p20"].min() == pytest.approx(0.55 / 0.4)
    line = tpp.peer_calls_line(frame)
    assert "spread 2.00× from p20 to p80" in line and "(tp=2 symmetric (ours): 1.020×)" in line
    assert "against its median 0.69–0.90×" in line and "is 1.38–1.79× its time" in line
    assert tpp.peer_calls_line(frame[~peer]) is None


def test_the_link_sentence_sets_the_exchange_stores_against_each_recorded_step():
    """The recorded H100 pair's link (measured on two H200s with as many NVLinks): each symmetric row's stores at the
    measured rate, as a share of its recorded step; the table names every measurement and its check."""
    from pathlib import Path

    from perfutils.model.predict import link_of

    data = Path(__file__).resolve().parent.parent / "data"
    link = link_of(data / "h100-sxm-80gb")
    assert link is not None and link.folder == "h200" and link.links == 18
    table = tpp.link_table(pd.read_csv(data / "h200" / "nvlink.csv"))
    assert len(table) == 7 and set(table["check"]) == {"ok"} and table["round trip µs"].notna().sum() == 1
    df = pd.read_csv(data / "h100-sxm-80gb" / "tensor_parallel.csv")
    text = tpp.link_reading(df, link)
    sym = df[df["variant"] == "tp2-symmetric"]
    worst = (sym["bytes_sent"] / (link.store_gbps * 1e9) / (sym["ms_median"] * 1e-3)).max()
    assert f"{100 * worst:.1f}%" in text and "NV18" in text and "data/h200/nvlink.csv" in text
    assert tpp.link_reading(df[df["variant"] != "tp2-symmetric"], link).startswith("No symmetric")


def test_pair_comparison_sets_two_pairs_side_by_side():
    """Each pair's design over its own tp=1 (range, median, shapes meeting the acceptance), then each variant's step on
    the other pair over this pair's at the shapes both recorded; a study without the design is refused."""
    mine = records()
    other = records()
    other.loc[other["variant"] == "tp1-auto", "ms_median"] *= 0.8  # one GPU faster there, the split's step not
    line = tpp.pair_comparison(mine, other, gpu="GPU A", other_gpu="GPU B")
    assert line.startswith("tp=2 symmetric (ours) over tp=1: 0.69–0.90× (median 0.69) on the two GPU Bs, acceptance "
                           "met at 0 of 8 shapes; 0.55–0.72× (median 0.55) on the two GPU As, acceptance met at 7 of 8")
    assert "(8 shapes): tp=1 (one GPU, auto) 0.80× (median 0.80); tp=2 all_gather (ours) 1.00× (median 1.00)" in line
    assert tpp.pair_comparison(mine, other[other["vocab"] == 256000].assign(vocab=999),
                               gpu="A", other_gpu="B").endswith("The two studies share no shape.")
    with pytest.raises(ValueError, match="tp2-symmetric"):
        tpp.pair_comparison(mine, other[other["variant"] != "tp2-symmetric"], gpu="A", other_gpu="B")


def test_against_half_vocab_sets_each_step_beside_one_gpu_at_the_ranks_share():
    """tp=2's step over the vocab sweep's public call at vocab / tp (same tokens, bf16); shapes without that row are
    left out, and the sentence gives the range per family."""
    tp_rows = records()
    sweep = []
    for loss, fmt in (("cross_entropy", "labels"), ("reverse_kl", "logits")):
        sweep.append(dict(loss=loss, target_format=fmt, variant="public", dtype="bf16", tokens=4096, vocab=65536,
                          ms_median=0.5, status="ok"))
        sweep.append(dict(loss=loss, target_format=fmt, variant="public", dtype="fp32", tokens=4096, vocab=128000,
                          ms_median=0.1, status="ok"))  # another dtype: not the bf16 row's half
    half = tpp.against_half_vocab(tp_rows, pd.DataFrame(sweep))
    assert half[["loss", "vocab", "half"]].values.tolist() == [["cross_entropy", 131072, 65536],
                                                                ["reverse_kl", 131072, 65536]]
    assert half["over_half"].tolist() == pytest.approx([1.1, 1.1])
    line = tpp.against_half_line(half, "GPU A")
    assert line == ("On the two GPU As, tp=2 symmetric (ours)'s step over one GPU's public call at half the vocabulary: "
                    "1.10× for labels CE (1 shape); 1.10× for the distribution losses (1 shape).")
    assert "No shape" in tpp.against_half_line(half.iloc[0:0], "GPU A")
