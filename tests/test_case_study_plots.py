"""perfutils.plots.case_study: labels, the comparison and ablation frames, and the figures, on synthetic frames."""

from __future__ import annotations

import json
import math

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from perfutils.plots import case_study as cs  # noqa: E402
from perfutils.plots.figures import save_figure  # noqa: E402

GPU = "NVIDIA H100 80GB HBM3"
ISSUE = "fast_llm_27f4747e"
HEAD = "fast_llm_7d61a1ba"


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _row(variant, vocab, ms, *, block_size=None, num_warps=None, n_regs=None, spill=None, occupancy=None, blocks=None,
         loss="reverse_kl", target_format="logits", peak=None, passes=None, status="ok"):
    return dict(loss=loss, target_format=target_format, variant=variant, dtype="bf16", tokens=4, vocab=vocab,
                block_size=block_size, num_warps=num_warps, ms_median=ms, pct_of_copy=100.0 / ms, n_regs=n_regs,
                spill_bytes=spill, shared_bytes=64, occupancy=occupancy, blocks_per_sm=blocks, status=status,
                gpu_name=GPU, peak_mem_bytes=peak if peak is not None else 4 * vocab * 2, bytes_min=6 * 4 * vocab,
                limiting_pass=variant if passes else None, passes=json.dumps(passes) if passes else "[]",
                max_rel_err=1e-3)


def _main() -> pd.DataFrame:
    rows = []
    for vocab, scale in ((1024, 1.0), (2048, 2.0)):
        rows += [
            _row(ISSUE, vocab, 7.0 * scale, n_regs=32, spill=1600, occupancy=1.0, blocks=4,
                 passes=[{"name": ISSUE, "block_size": 1024, "num_warps": 16}]),
            _row(HEAD, vocab, 0.8 * scale, n_regs=255, spill=100, occupancy=0.125, blocks=1,
                 passes=[{"name": HEAD, "block_size": 512, "num_warps": 8}]),
            _row("torch_compile", vocab, 2.0 * scale, peak=8 * vocab),
            _row("fused", vocab, 1.0 * scale, n_regs=128, spill=448, occupancy=0.25, blocks=1,
                 passes=[{"name": "fused", "block_size": 1024, "num_warps": 16}]),
            _row("fused", vocab, 0.6 * scale, block_size=512, n_regs=126, spill=0, occupancy=0.25, blocks=1),
            _row("two_pass", vocab, 0.7 * scale, n_regs=128, spill=0, occupancy=0.25, blocks=1),
            _row("auto", vocab, 0.5 * scale, n_regs=255, spill=0, occupancy=0.125, blocks=1),
            _row("fused", vocab, 9.9, status="wrong"),  # never shown
        ]
    return pd.DataFrame(rows)


def _ablation() -> pd.DataFrame:
    # #497 at 8 ms -> step0 10 ms -> step1 4 ms -> step2 1 ms -> fused 2 ms: product 8 / 2 = 4.
    rows = [_row(ISSUE, 32768, 8.0, n_regs=32, spill=1600, occupancy=1.0, blocks=4,
                 passes=[{"name": ISSUE, "block_size": 32768, "num_warps": 16}])]
    for variant, ms, regs, spill, occ in (("case497.step0", 10.0, 32, 1800, 1.0), ("case497.step1", 4.0, 64, 900, 0.5),
                                          ("case497.step2", 1.0, 128, 80, 0.25), ("fused", 2.0, 128, 440, 0.25),
                                          ("case497.solo_exp", 5.0, 64, 1200, 0.5)):
        rows.append(_row(variant, 32768, ms, block_size=32768, num_warps=16, n_regs=regs, spill=spill, occupancy=occ,
                         blocks=1))
    rows.append(_row("case497.step0", 32768, 12.0, block_size=32768, num_warps=8, n_regs=32, spill=3000, occupancy=1.0,
                     blocks=8))
    return pd.DataFrame(rows)


def _offline() -> pd.DataFrame:
    rows = []
    for variant, regs, spill, traffic, resident in ((ISSUE, 32, 1600, 12e3, 400.0),
                                                    ("case497.step2", 128, 100, 500.0, 6.0),
                                                    ("fused", 128, 456, 2e3, 30.0)):
        rows.append(dict(variant=variant, loss="reverse_kl", target_format="logits", vocab=32768, block_size=32768,
                         num_warps=16, n_regs=regs, spill_bytes=spill, static_spill_traffic_bytes=traffic,
                         resident_stack_bytes=resident, status="ok"))
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------------------------
# labels and launch configurations
# ------------------------------------------------------------------------------------------------


def test_case_labels():
    assert cs.case_label(ISSUE) == "#497 kernel (Fast-LLM 27f4747e)"
    assert cs.case_label(HEAD) == "Fast-LLM HEAD (7d61a1ba)"
    assert cs.case_label("fused") == cs.case_label("fused", float("nan")) == cs.EMULATION
    assert cs.case_label("fused", 32768) == cs.EMULATION
    assert cs.case_label("fused", pd.NA) == cs.EMULATION
    assert cs.case_label("fused", 16384) == "Option A: fused, 16K cap"
    assert cs.case_label("two_pass") == "Option B: two_pass"
    assert cs.case_label("torch_compile") == "torch.compile"
    assert cs.case_label("case497.step3") == "step 3"
    assert cs.case_label("case497.solo_exp") == "solo: exp"
    assert cs.case_label("split_row") == "split_row"
    with pytest.raises(TypeError):
        cs.case_label(None)


def test_launch_config_fills_from_the_limiting_pass():
    df = pd.DataFrame([_row(ISSUE, 1024, 1.0, passes=[{"name": "other", "block_size": 1, "num_warps": 1},
                                                       {"name": ISSUE, "block_size": 1024, "num_warps": 16}]),
                       _row("torch_compile", 1024, 1.0),
                       _row("fused", 1024, 1.0, block_size=512, num_warps=4)])
    out = cs.launch_config(df)
    assert out["block_size"].tolist()[0] == 1024.0 and out["num_warps"].tolist()[0] == 16.0
    assert math.isnan(out["block_size"].iloc[1]) and math.isnan(out["num_warps"].iloc[1])
    assert out["block_size"].iloc[2] == 512.0 and out["num_warps"].iloc[2] == 4.0
    assert pd.isna(df["block_size"].iloc[0])  # the input is not modified


# ------------------------------------------------------------------------------------------------
# comparison and peak memory
# ------------------------------------------------------------------------------------------------


def test_peak_with_gradient_adds_the_torch_gradient_only():
    df = _main()
    peak = cs.peak_with_gradient(df)
    tc = df["variant"] == "torch_compile"
    assert (peak[tc] == df.loc[tc, "peak_mem_bytes"] + 4 * df.loc[tc, "vocab"] * 2).all()
    assert (peak[~tc] == df.loc[~tc, "peak_mem_bytes"]).all()


def test_compare_cases_orders_and_ratios():
    cases = [cs.case_label(ISSUE), "torch.compile", cs.EMULATION]
    table = cs.compare_cases(_main(), cases=cases)
    assert list(table["case"][:3]) == cases and list(table["vocab"].unique()) == [1024, 2048]
    first = table[table["vocab"] == 1024].set_index("case")
    assert first.loc[cs.case_label(ISSUE), "x_reference"] == pytest.approx(7.0)
    assert first.loc[cs.EMULATION, "x_reference"] == pytest.approx(1.0)
    assert first.loc[cs.case_label(ISSUE), "stack_bytes"] == 1600
    assert first.loc["torch.compile", "peak_with_grad_bytes"] == 8 * 1024 + 8 * 1024
    other = cs.compare_cases(_main(), cases=cases, reference="torch.compile")
    assert other.set_index(["case", "vocab"]).loc[(cs.EMULATION, 2048), "x_reference"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="not in the data"):
        cs.compare_cases(_main(), cases=["nothing"])
    with pytest.raises(ValueError, match="no rows"):
        cs.compare_cases(_main(), loss="forward_kl")
    with pytest.raises(ValueError, match="missing columns"):
        cs.compare_cases(_main().drop(columns=["ms_median"]))


def test_plot_reproduction_and_fixes_are_deterministic(tmp_path):
    table = cs.compare_cases(_main())
    paths = []
    for name in ("a", "b"):
        fig = cs.plot_reproduction(table, title=f"synthetic · {GPU} · measured 2026-01-01",
                                   highlight=cs.case_label(ISSUE))
        paths.append(save_figure(fig, tmp_path / name))
        plt.close(fig)
    for (svg_a, png_a), (svg_b, png_b) in [paths]:
        assert svg_a.read_bytes() == svg_b.read_bytes() and png_a.read_bytes() == png_b.read_bytes()
    texts = [t.get_text() for ax in cs.plot_reproduction(table, highlight=cs.case_label(ISSUE)).axes for t in ax.texts]
    assert "7.0×" in texts and any("1600 B stack" in t for t in texts)
    fig = cs.plot_fixes(table, title="fixes")
    assert len(fig.axes) == 2
    with pytest.raises(ValueError):
        cs.plot_fixes(table.iloc[0:0])
    with pytest.raises(ValueError, match="missing columns"):
        cs.plot_reproduction(table.drop(columns=["ms"]))


# ------------------------------------------------------------------------------------------------
# stack, offline compiles, Nsight Compute
# ------------------------------------------------------------------------------------------------


def test_resident_stack_bytes():
    assert cs.resident_stack_bytes(1608, 16, 4, 132) == 1608 * 512 * 4 * 132
    np.testing.assert_array_equal(cs.resident_stack_bytes(np.array([1.0, 2.0]), 16, 1, 2), [1024.0, 2048.0])
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError):
            cs.resident_stack_bytes(1, 1, 1, bad)


def test_with_offline_joins_on_kernel_tile_and_warps():
    joined = cs.with_offline(_ablation(), _offline()).set_index(["variant", "num_warps"])
    assert joined.loc[(ISSUE, 16.0), "spill_bytes_offline"] == 1600  # block/warps filled from the launch
    assert joined.loc[("case497.step2", 16.0), "static_spill_traffic_bytes_offline"] == 500.0
    assert math.isnan(joined.loc[("case497.step0", 8.0), "n_regs_offline"])  # never compiled offline
    assert len(joined) == len(_ablation())


def test_ncu_side_by_side():
    ncu = pd.DataFrame([
        dict(label="b", duration_us=500.0, dram_throughput_pct=70.0, dram_read_bytes=1e9, dram_write_bytes=1e9,
             local_load_bytes=5e8, local_store_bytes=5e8, achieved_occupancy_pct=25.0, stall_1="barrier",
             stall_1_cycles=2.0),
        dict(label="a", duration_us=4000.0, dram_throughput_pct=80.0, dram_read_bytes=6e9, dram_write_bytes=6e9,
             local_load_bytes=7e9, local_store_bytes=5e9, achieved_occupancy_pct=96.0, stall_1="long_scoreboard",
             stall_1_cycles=170.0),
    ])
    table = cs.ncu_side_by_side(ncu, minimal_bytes=1e9, labels=["a", "b"])
    assert list(table.columns) == ["a", "b"]
    assert table.loc["duration (ms)", "a"] == 4.0
    assert table.loc["DRAM bytes / minimal bytes", "a"] == 12.0
    assert table.loc["local-memory (spill) loads + stores at L1 (GB)", "b"] == 1.0
    assert table.loc["stall 1", "a"] == "long_scoreboard"
    assert "long_scoreboard" in cs.STALL_MEANINGS
    with pytest.raises(ValueError):
        cs.ncu_side_by_side(ncu, minimal_bytes=0)
    with pytest.raises(ValueError, match="not in the data"):
        cs.ncu_side_by_side(ncu, minimal_bytes=1.0, labels=["c"])


def test_plot_time_vs_traffic():
    points = pd.DataFrame(dict(case=["x", "y", "z"], ms_median=[4.0, 0.4, 0.41], bytes_min=[1e9] * 3,
                               static_spill_traffic_bytes=[11e9, 0.5e9, 0.5e9],
                               resident_stack_bytes=[400e6, 5e6, 5e6]))
    fig = cs.plot_time_vs_traffic(points, copy_gbps=3000.0, l2_bytes=50 * 2**20, title="t")
    labels = [t.get_text() for t in fig.axes[0].texts]
    assert labels == ["x", "y · z"]  # coincident points share one label
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert any("> L2" in t for t in legend) and any("≤ L2" in t for t in legend)
    with pytest.raises(ValueError):
        cs.plot_time_vs_traffic(points.assign(static_spill_traffic_bytes=np.nan), copy_gbps=1.0, l2_bytes=1.0)
    with pytest.raises(ValueError):
        cs.plot_time_vs_traffic(points, copy_gbps=0.0, l2_bytes=1.0)


# ------------------------------------------------------------------------------------------------
# the ablation
# ------------------------------------------------------------------------------------------------

ORDER = [ISSUE, "case497.step0", "case497.step1", "case497.step2", "fused"]


def test_ablation_walk_factors_shares_and_product():
    walk = cs.ablation_walk(_ablation(), ORDER, removes={"case497.step1": "kept exps"}, short={"fused": "end"})
    assert list(walk["case"]) == [cs.case_label(ISSUE), "step 0", "step 1", "step 2", cs.EMULATION]
    np.testing.assert_allclose(walk["factor"].iloc[1:], [0.8, 2.5, 4.0, 0.5])
    np.testing.assert_allclose(walk["cumulative"], [1.0, 0.8, 2.0, 8.0, 4.0])
    assert walk["share_of_gap"].iloc[1:].sum() == pytest.approx(1.0)
    assert walk["share_of_gap"].iloc[3] == pytest.approx(math.log(4.0) / math.log(4.0))
    assert cs.walk_product(walk) == pytest.approx(4.0)
    assert walk.set_index("variant").loc["case497.step1", "removes"] == "kept exps"
    assert walk.set_index("variant").loc["fused", "short"] == "end"
    with pytest.raises(ValueError, match="found 0"):
        cs.ablation_walk(_ablation(), [ISSUE, "case497.step5"])
    with pytest.raises(ValueError):
        cs.ablation_walk(_ablation(), [ISSUE])


def test_solo_effects_and_waterfall():
    walk = cs.ablation_walk(_ablation(), ORDER)
    solo = cs.solo_effects(_ablation(), "case497.step0", {"case497.solo_exp": "case497.step2"}, walk)
    row = solo.iloc[0]
    assert row["solo"] == "solo: exp" and row["alone"] == pytest.approx(2.0) and row["in_walk"] == pytest.approx(4.0)
    with pytest.raises(ValueError, match="not a step"):
        cs.solo_effects(_ablation(), "case497.step0", {"case497.solo_exp": "case497.step9"}, walk)
    fig = cs.plot_ablation_waterfall(walk, reference_ms=2.0, reference_label="ref", title="walk")
    ax = fig.axes[0]
    assert len(ax.patches) == len(walk)
    texts = [t.get_text() for t in ax.texts]
    assert "÷2.50" in texts and "×1.25" in texts and "×2.00" in texts and "ref" in texts
    assert "100% occupancy" in ax.get_xticklabels()[0].get_text()
    with pytest.raises(ValueError):
        cs.plot_ablation_waterfall(walk.iloc[:1])


# ------------------------------------------------------------------------------------------------
# the sentences notebook 02 prints (perfutils.plots.case_study_text)
# ------------------------------------------------------------------------------------------------


def test_case_study_sentences_follow_the_numbers():
    """The words come from the tables: who is slower, by how much, which steps carry the gap, which fix is fastest."""
    from perfutils.plots import case_study_text as text

    real = cs.case_label(ISSUE)
    head = cs.case_label(HEAD)
    repro = cs.compare_cases(_main(), cases=[real, "torch.compile", head, cs.EMULATION])
    said = text.reproduction_reading(repro, real=real, reference=cs.EMULATION, peer="torch.compile", later=head,
                                     vocab=1024)
    assert "slower than the emulation at every vocabulary (7.00× its time)" in said
    assert "at 1K it is the slowest of the 4" in said and "torch.compile lies between the emulation and it" in said
    assert "the highest occupancy of the Triton kernels (100%" in said and "the largest stack (1600 B" in said
    walk = cs.ablation_walk(_ablation(), ORDER)
    said = text.walk_reading(walk)
    assert said.startswith("Step 1 and step 2 carry") and "registers 32 → 64" in said
    assert "Step 0 (the structure re-implemented) runs slower than the real kernel (1.25× its time)" in said
    fixes = cs.compare_cases(_main(), cases=[real, head, "torch.compile", cs.EMULATION, "Option A: fused, 0K cap",
                                             "Option B: two_pass", "auto"], reference=real)
    said = text.fixes_reading(fixes, real=real, peer="torch.compile", head=head, option_a="Option A: fused, 0K cap",
                              option_b="Option B: two_pass", tokens=4)
    assert "faster than it at 1K (0.86× its time)" in said
    assert "Fastest per vocabulary: auto at 1K and auto at 2K" in said
