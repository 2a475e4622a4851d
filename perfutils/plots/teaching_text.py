"""The sentences notebooks 06 (Triton basics) and 07 (fusion) print about their tables, each computed from them.

Every function takes a table of :mod:`perfutils.plots.teaching` (or the SM limits of :mod:`perfutils.model.hardware`,
or the byte model of ``perfutils.lab_kernels.teaching.activations``) and returns Markdown saying what the numbers show, so that a
prediction written before the measurement is followed by what the measurement says, not by a verdict written by
hand.
"""

from __future__ import annotations

import pandas as pd

from ..notebook import listing, span

__all__ = ["limits_reading", "vector_add_reading", "tile_reading", "softmax_reading", "fusion_predictions",
           "latency_reading", "throughput_reading", "memory_reading"]


def limits_reading(limits) -> str:
    """What the SM limits (``perfutils.model.hardware.sm_limits``) mean for a one-warp program and for registers."""
    warps = limits.max_threads_per_sm // limits.warp_size
    one_warp = min(limits.max_blocks_per_sm, warps)
    full = limits.registers_per_sm // limits.max_threads_per_sm
    return (f"So a program of one warp can never reach more than {one_warp} of the {warps} warp slots (the "
            f"{limits.max_blocks_per_sm}-blocks limit), and a kernel using more than {full} registers per thread "
            f"cannot keep {warps} warps resident ({limits.registers_per_sm:,} registers / "
            f"{limits.max_threads_per_sm} threads).")


def vector_add_reading(summary: pd.DataFrame, irregular: pd.DataFrame, *, fraction: float = 0.8) -> str:
    """The vector add's plateau per implementation (``bandwidth_summary``) and what the irregular sizes measured
    against the power-of-two curve (``irregular_vs_regular``)."""
    from_column = next(c for c in summary.columns if c.endswith(f"_from_{int(fraction * 100)}pct"))
    parts = [f"{r.variant} reaches {r.best_gbps:,.0f} GB/s at best ({r.best_pct_of_copy:.1f}% of copy) and stays "
             f"within {fraction:.0%} of that from {int(getattr(r, from_column)):,} elements"
             for r in summary.itertuples()]
    text = listing(parts) + "."
    if len(irregular):
        smallest = irregular["n"].min()
        small, rest = irregular[irregular["n"] == smallest], irregular[irregular["n"] > smallest]
        text += (f" The irregular sizes against the power-of-two curve: at {smallest:,} elements (the steep part of "
                 "the curve) " + listing(f"{r.variant} {r.ratio:.2f}" for r in small.itertuples()))
        if len(rest):
            text += (f"; from {rest['n'].min():,} up " + listing(
                f"{v} {span(p['ratio'])}" for v, p in rest.groupby("variant")))
        text += " (1 = on the curve)."
    return text


def tile_reading(tiles: pd.DataFrame, df: pd.DataFrame) -> str:
    """The autotuner's pick against the sweep's best cell (``tile_summary``), and the occupancy of one-warp
    programs in the tile study's rows."""
    text = ""
    if "autotune_vs_best" in tiles and tiles["autotune_vs_best"].notna().any():
        picked = tiles.dropna(subset=["autotune_vs_best"])
        worst = picked.loc[picked["autotune_vs_best"].idxmin()]
        text += (f"The autotuner's pick reaches {span(picked['autotune_vs_best'], '.3f')} of the best cell's GB/s over "
                 f"the {len(picked)} sizes (the least at n = {int(worst['n']):,}: {worst['autotune']} against "
                 f"{worst['best']}).")
    rows = df[(df["loss"] == "add_tile") & (df["status"] == "ok") & df["occupancy"].notna()]
    one = rows[rows["num_warps"] == 1]
    if len(one):
        text += (f" One-warp programs reach {one['occupancy'].max():.0%} occupancy at most "
                 f"({span(one['occupancy'] * 100, '.1f')}% over their tiles; limits: "
                 f"{', '.join(sorted(set(one['limiter'].dropna().astype(str))))}); the other warp counts up to "
                 f"{rows.loc[rows['num_warps'] > 1, 'occupancy'].max():.0%}.")
    return text.strip()


def softmax_reading(ratios: pd.DataFrame, *, baseline: str = "triton", predicted: float | None = None) -> str:
    """Each implementation's time over ``baseline``'s per row length (``speedups``), against the byte model's
    ``predicted`` ratio for the naive version."""
    parts = []
    for column in ratios.columns:
        name = column.removesuffix(f"_time_over_{baseline}")
        values = ratios[column].dropna()
        parts.append(f"{name} {span(values)}× the Triton kernel's time (median {values.median():.2f}, at "
                     f"{len(values)} row lengths)")
    text = listing(parts) + "."
    naive = next((c for c in ratios.columns if c.startswith("torch_naive")), None)
    if predicted is not None and naive is not None:
        values = ratios[naive].dropna()
        near = int(((values / predicted - 1).abs() <= 0.25).sum())
        text += (f" The byte count predicts {predicted:.2f}× for the naive version; {near} of {len(values)} row "
                 "lengths are within 25% of it.")
    return text


def fusion_predictions(model: pd.DataFrame) -> str:
    """The predictions the byte model (``activation_byte_model``: bytes per element, kernels and buffers per call)
    makes before anything is measured."""
    fused = model.loc[model["variant"] == "triton", "bytes_per_element"]
    one_pass = float(fused.iloc[0]) if len(fused) else 8.0
    eager = model[model["variant"] == "eager"]
    times = listing(f"eager {r.activation} {r.bytes_per_element:.0f} / {one_pass:.0f} = "
                    f"{r.bytes_per_element / one_pass:.2f}×" for r in eager.itertuples())
    kernels = listing(f"{int(r.kernels)} for eager {r.activation}" for r in eager.itertuples())
    buffers = listing(f"{r.peak_buffers:g}× the output for eager {r.activation}" for r in eager.itertuples())
    return (f"**Predictions.** For large tensors, where time ≈ bytes ÷ bandwidth, against one fused pass: {times} "
            "(a ratio of 1 is a control: nothing to fuse). For small tensors, where each kernel costs a roughly fixed "
            f"launch time, time should follow the number of kernels: {kernels}, 1 for every fused or built-in op. "
            f"Memory beyond the input: {buffers}.")


def latency_reading(flat: pd.DataFrame) -> str:
    """What the small sizes measured (``flat_region``): time against kernels per call, the GPU-side price of one
    launch, and where the host loop is slower than the GPU."""
    parts = []
    by_kernels = flat.groupby("n_kernels")["min_us"].median()
    if len(by_kernels) > 1:
        times = ", ".join(f"{int(k)} kernel{'s' if k != 1 else ''} {us:.1f} µs" for k, us in by_kernels.items())
        parts.append(f"smallest time by kernels per call (median over ops and variants): {times}")
    parts.append(f"the smallest time per launched kernel is {span(flat['us_per_kernel'], '.1f')} µs")
    if "host_loop_min_us" in flat:
        host = flat.dropna(subset=["host_loop_min_us"])
        slower = int((host["host_loop_min_us"] > host["min_us"]).sum())
        parts.append(f"the host loop takes longer than the GPU time at {slower} of {len(host)} op/variant pairs")
        one = host[host["n_kernels"] == 1].groupby("variant")["host_loop_min_us"]
        if {"triton", "torch_op"} <= set(one.groups):
            parts.append(f"one launch costs the host {span(one.get_group('triton'), '.1f')} µs through Triton's "
                         f"launcher, {span(one.get_group('torch_op'), '.1f')} µs through PyTorch's op")
    text = "; ".join(parts) + "."
    return text[:1].upper() + text[1:]


def throughput_reading(largest: pd.DataFrame, *, tolerance: float = 0.05) -> str:
    """At the largest size (``fusion_at_largest``): measured time over Triton's against the byte model's prediction,
    and the built-in ops against Triton."""
    modelled = largest.dropna(subset=["predicted_time_over_triton"])
    eager = modelled[modelled["variant"] == "eager"]
    agree = eager[(eager["time_over_triton"] / eager["predicted_time_over_triton"] - 1).abs() <= tolerance]
    text = ("Measured against predicted time over Triton's at the largest size: "
            + listing(f"eager {r.op} {r.time_over_triton:.2f}× against {r.predicted_time_over_triton:.2f}×"
                      for r in eager.itertuples())
            + f" ({len(agree)} of {len(eager)} within {tolerance:.0%}).")
    ops = largest[largest["variant"] == "torch_op"]
    if len(ops):
        text += f" The built-in ops take {span(ops['time_over_triton'], '.3f')}× Triton's time."
    others = largest[(largest["variant"] == "eager") & largest["predicted_time_over_triton"].isna()]
    if len(others):
        text += " Without a byte model: " + listing(f"eager {r.op} {r.time_over_triton:.2f}×"
                                                    for r in others.itertuples()) + "."
    return text


def memory_reading(memory: pd.DataFrame) -> str:
    """Peak memory over the output (``peak_x_output``) per variant at the largest size, against the prediction."""
    fused = memory[memory["variant"] == "triton"]["peak_x_output"]
    text = f"The Triton kernels need {span(fused)}× their output."
    eager = memory[memory["variant"] == "eager"]
    parts = [f"eager {r.op} {r.peak_x_output:.2f}×" + (f" (predicted {r.predicted_peak_x_output:g}×)"
                                                       if pd.notna(r.predicted_peak_x_output) else "")
             for r in eager.itertuples()]
    if parts:
        text += " The eager versions: " + listing(parts) + "."
    return text
