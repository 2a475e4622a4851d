"""Roofline model: roofs, floors, loss byte counts, and the plot."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from perfutils.model.hardware import DEVICE_SPECS, lookup_device  # noqa: E402
from perfutils.model.roofline import (  # noqa: E402
    Ceilings,
    KernelCost,
    ceilings_from_datasheet,
    ceilings_from_records,
    loss_cost,
    place,
)
from perfutils.plots.roofline import plot_roofline  # noqa: E402

# Round numbers so the arithmetic in the assertions is obvious.
CEIL = Ceilings(dram_gbps=3000.0, dram_read_gbps=3200.0, l2_gbps=10000.0, fp32_tflops=60.0,
                exp2_tops=4.0, source="measured", gpu="Test GPU")


def test_memory_bound_kernel():
    # 3 GB at 3000 GB/s = 1 ms; 1 GFLOP at 60 TFLOP/s = 16.7 us; 0.1 G exp at 4 T/s = 25 us.
    cost = KernelCost(bytes=3e9, flops=1e9, transcendentals=1e8)
    p = place(cost, 2e-3, CEIL)
    assert p.binding_roof == "dram"
    assert p.floor_time_s == pytest.approx(1e-3)
    assert p.bound_time_s == pytest.approx(1e-3)
    assert p.pct_of_roof == pytest.approx(50.0)
    assert p.pct_of_copy == pytest.approx(50.0)
    assert p.achieved_gbps == pytest.approx(1500.0)
    assert p.arithmetic_intensity == pytest.approx(1 / 3)
    assert p.bound_times_s["fp32"] == pytest.approx(1e9 / 60e12)
    assert p.bound_times_s["transcendental"] == pytest.approx(25e-6)
    row = p.to_dict()
    assert row["bound_dram_s"] == pytest.approx(1e-3) and row["binding_roof"] == "dram"


def test_compute_and_transcendental_bound_kernels():
    fma_heavy = KernelCost(bytes=1e6, flops=6e12)  # 0.33 us of DRAM, 100 ms of FP32
    p = place(fma_heavy, 0.125, CEIL)
    assert p.binding_roof == "fp32"
    assert p.pct_of_roof == pytest.approx(80.0)
    exp_heavy = KernelCost(bytes=1e6, flops=1e9, transcendentals=4e11)  # 100 ms of MUFU
    assert place(exp_heavy, 0.1, CEIL).binding_roof == "transcendental"


def test_l2_resident_and_unknown_roofs():
    cost = KernelCost(bytes=1e10, l2_resident=True)
    p = place(cost, 2e-3, CEIL)
    assert p.binding_roof == "l2" and p.bound_time_s == pytest.approx(1e-3)
    assert p.floor_time_s == pytest.approx(1e10 / 3e12)  # the floor stays DRAM copy
    datasheet = Ceilings(dram_gbps=3000.0, source="datasheet")  # no L2/FP32/exp2 roofs known
    p = place(cost, 2e-3, datasheet)
    assert p.binding_roof == "dram" and p.bound_times_s["l2"] is None


def test_kernel_cost_helpers():
    cost = KernelCost.per_element(1000, bytes_per_element=4, flops_per_element=6,
                                  transcendentals_per_element=1, rows=10, bytes_per_row=12,
                                  transcendentals_per_row=1)
    assert (cost.bytes, cost.flops, cost.transcendentals) == (4120, 6000, 1010)
    total = cost + cost.scaled(0.5)
    assert total.bytes == pytest.approx(6180)
    with pytest.raises(ValueError, match="bytes"):
        KernelCost(bytes=-1)
    with pytest.raises(ValueError, match="time_s"):
        place(cost, 0, CEIL)


@pytest.mark.parametrize("loss, fmt, per_elem, per_row", [
    ("cross_entropy", "labels", 4, 8 + 4),  # read bf16 logits + write bf16 grad; int64 label
    ("cross_entropy", "logits", 6, 4),  # + read the target logits
    ("forward_kl", "logits", 6, 4),
    ("reverse_kl", "logits", 6, 4),
])
def test_loss_bytes(loss, fmt, per_elem, per_row):
    tokens, vocab = 1024, 32000
    cost = loss_cost(loss, fmt, tokens, vocab, dtype_bytes=2)
    assert cost.bytes == tokens * vocab * per_elem + tokens * per_row
    exps_per_elem = 1 if fmt == "labels" else 2
    assert cost.transcendentals == pytest.approx(tokens * vocab * exps_per_elem,
                                                 rel=1 / vocab * 2 + 1e-12)
    assert 1 <= cost.arithmetic_intensity <= 4  # far left of the ridge
    fwd = loss_cost(loss, fmt, tokens, vocab, dtype_bytes=2, backward=False)
    assert cost.bytes - fwd.bytes == tokens * vocab * 2  # the gradient write
    fp32 = loss_cost(loss, fmt, tokens, vocab, dtype_bytes=4)
    assert fp32.bytes - tokens * per_row == 2 * (cost.bytes - tokens * per_row)


def test_loss_cost_rejects_bad_input():
    with pytest.raises(ValueError, match="loss"):
        loss_cost("mse", "labels", 8, 8)
    with pytest.raises(ValueError, match="target_format"):
        loss_cost("forward_kl", "labels", 8, 8)
    with pytest.raises(ValueError, match="vocab"):
        loss_cost("cross_entropy", "labels", 8, 0)


def test_floor_of_h100_labels_ce():
    # Guide example: bf16 labels CE moves 4 B/element; 8192 x 128256 at 3 TB/s copy ~ 1.4 ms.
    cost = loss_cost("cross_entropy", "labels", 8192, 128256)
    p = place(cost, 2e-3, Ceilings(dram_gbps=3000.0))
    assert p.floor_time_s == pytest.approx(8192 * (128256 * 4 + 12) / 3e12)
    assert p.binding_roof == "dram"


def test_ceilings_from_datasheet():
    c = ceilings_from_datasheet(lookup_device("NVIDIA H100 80GB HBM3"))
    assert (c.gpu, c.source, c.dram_gbps, c.fp32_tflops) == ("H100 SXM", "datasheet", 3350.0, 67.0)
    # 16 MUFU/clk/SM x 132 SMs x 1.98 GHz
    assert c.exp2_tops == pytest.approx(16 * 132 * 1.98e9 / 1e12)
    assert ceilings_from_datasheet("Tesla T4").dram_gbps == 320.0
    with pytest.raises(TypeError, match="spec"):
        ceilings_from_datasheet(42)


def _ceiling_rows(gpu="NVIDIA H100 80GB HBM3"):
    return pd.DataFrame({
        "ceiling": ["dram_copy_torch", "dram_copy_triton", "dram_read", "l2_read", "fp32_fma",
                    "exp2"],
        "value": [2900.0, 2950.0, 3100.0, 9000.0, 55.0, 3.9],
        "unit": ["GB/s", "GB/s", "GB/s", "GB/s", "TFLOP/s", "Tops/s"],
        "gpu_name": gpu,
    })


def test_ceilings_from_records(tmp_path):
    c = ceilings_from_records(_ceiling_rows())
    assert (c.dram_gbps, c.dram_read_gbps, c.l2_gbps, c.fp32_tflops, c.exp2_tops) == \
        (2950.0, 3100.0, 9000.0, 55.0, 3.9)
    assert (c.source, c.gpu) == ("measured", "NVIDIA H100 80GB HBM3")
    path = tmp_path / "ceilings.csv"
    _ceiling_rows().drop(columns="gpu_name").to_csv(path, index=False)
    (tmp_path / "ceilings.json").write_text('{"gpu_name": "NVIDIA H200"}')
    assert ceilings_from_records(path).gpu == "NVIDIA H200"
    with pytest.raises(ValueError, match="copy"):
        ceilings_from_records(_ceiling_rows().iloc[2:])
    bad_unit = _ceiling_rows()
    bad_unit.loc[0, "unit"] = "GiB/s"
    with pytest.raises(ValueError, match="unit|GiB"):
        ceilings_from_records(bad_unit)
    mixed = pd.concat([_ceiling_rows(), _ceiling_rows("NVIDIA L4")])
    with pytest.raises(ValueError, match="several GPUs"):
        ceilings_from_records(mixed)


def test_lookup_device_names():
    assert lookup_device("NVIDIA H100 80GB HBM3").name == "H100 SXM"
    assert lookup_device("NVIDIA H100 PCIe").name == "H100 PCIe"
    assert lookup_device("NVIDIA H200").name == "H200"
    assert lookup_device("NVIDIA A100-SXM4-80GB").name == "A100 SXM 80GB"
    assert lookup_device("NVIDIA L4").name == "L4"
    assert lookup_device("Tesla T4").name == "T4"
    assert lookup_device("NVIDIA B200").name == "B200"
    for name in ("NVIDIA A100-SXM4-40GB", "NVIDIA H100 NVL", "NVIDIA GeForce RTX 4090"):
        with pytest.raises(ValueError, match="name"):
            lookup_device(name)
    for spec in DEVICE_SPECS.values():  # FP32 = SMs x lanes x 2 x clock, within 3 %
        lanes = 64 if spec.cc in {(8, 0), (7, 5)} else 128
        derived = spec.sm_count * lanes * 2 * spec.boost_clock_mhz * 1e6 / 1e12
        assert derived == pytest.approx(spec.fp32_tflops, rel=0.03), spec.name


def test_plot_roofline_runs_and_labels():
    points = pd.DataFrame({
        "label": ["CE labels", "reverse KL"],
        "flops": [6.0e9, 1.5e10],
        "bytes": [4.0e9, 6.0e9],
        "transcendentals": [1.0e9, 2.0e9],
        "ms_median": [1.6, 2.4],
    })
    ax = plot_roofline(None, points, CEIL)
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert "flop / DRAM byte" in ax.get_xlabel() and "TFLOP/s" in ax.get_ylabel()
    assert {t.get_text() for t in ax.texts} >= {"CE labels", "reverse KL"}
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any("DRAM copy" in t for t in legend) and any("FP32" in t for t in legend)
    assert "Test GPU" in ax.get_title()
    plt.close(ax.figure)
    fig, ax2 = plt.subplots()
    assert plot_roofline(ax2, points.drop(columns="transcendentals"),
                         Ceilings(dram_gbps=3000.0)) is ax2
    plt.close(fig)
    with pytest.raises(ValueError, match="points_df"):
        plot_roofline(None, points.drop(columns="bytes"), CEIL)


def test_roofline_reading_and_the_sweep_reading_state_what_the_recorded_points_show():
    """Notebooks 03 and 01 print these sentences from the committed H100 data; the words follow the numbers."""
    from pathlib import Path

    from perfutils.data.records import load_records
    from perfutils.model.roofline import ceilings_from_records
    from perfutils.plots import roofline as prf
    from perfutils.plots.sweeps import occupancy_reading

    gpu_dir = Path(__file__).resolve().parent.parent / "data" / "h100-sxm-80gb"
    ceilings = ceilings_from_records(gpu_dir / "ceilings.csv")
    bench, sweep = load_records(gpu_dir / "benchmark.csv"), load_records(gpu_dir / "blocksize_sweep.csv")
    points = pd.concat([prf.best_rows(bench).assign(source="benchmark"),
                        prf.best_rows(sweep).assign(source="sweep best")], ignore_index=True)
    table = prf.roofline_table(prf.with_costs(points[points["tokens"] == 4096]), ceilings)
    lines = prf.roofline_reading(table, ceilings)
    assert lines[0].startswith("* **Roofs.** The points' intensity is") and f"of {len(table)} points" in lines[0]
    assert "cross_entropy/labels at most" in lines[1] and "(bound 66.7%)" in lines[1] and "(bound 60.0%)" in lines[1]
    assert "the best of the project's variants" in lines[2] and "Sweep best against the benchmark" in lines[3]
    said = occupancy_reading(sweep)
    assert said.startswith("At ") and " of 18 shapes the fastest configuration" in said and "spill" in said
