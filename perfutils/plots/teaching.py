"""Tables and figures of notebooks 06 (Triton basics) and 07 (fusion), from the recorded DataFrames.

Functions of the frames :mod:`perfutils.studies.teaching` records (``triton_basics.csv``, ``fusion.csv``): the
summaries the notebooks print (numbers come from the data, never from the prose) and the figures (DataFrame in,
matplotlib figure out), each captioned with the GPU and the date, with the copy bandwidth as a reference line.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import pandas as pd

from .figures import figure_context

# The fusion study's operations, in the order its figures show them (the activations of
# perfutils.lab_kernels.teaching.activations, then EvoNorm-B0): names as recorded in the data's "loss" column.
FUSION_OPS = ["relu", "sigmoid", "swish", "evonorm_b0"]

__all__ = ["bandwidth_summary", "irregular_vs_regular", "tile_summary", "speedups", "flat_region", "fusion_at_largest",
           "plot_vector_add", "plot_tile_sweep", "plot_tile_occupancy", "plot_softmax", "plot_fusion_latency",
           "plot_fusion_throughput", "plot_fusion_memory"]


def bandwidth_summary(df: pd.DataFrame, experiment: str, *, x: str = "vocab", fraction: float = 0.8) -> pd.DataFrame:
    """Per variant of ``experiment``: best GB/s, its % of copy, where it is reached, and the smallest
    ``x`` from which the variant stays at >= ``fraction`` of its best."""
    part = _require(df, (experiment,), "bandwidth_summary")
    rows = []
    for variant, group in part.groupby("variant", sort=True):
        group = group.sort_values(x)
        best = group.loc[group["gbps"].idxmax()]
        good = group["gbps"] >= fraction * best["gbps"]
        # the first x after which every point is good (a later dip resets it)
        bad_positions = [i for i, flag in enumerate(good.tolist()) if not flag]
        from_index = bad_positions[-1] + 1 if bad_positions else 0
        rows.append({"variant": variant, "best_gbps": float(best["gbps"]), "best_pct_of_copy": float(best["pct_of_copy"]),
                     f"{x}_at_best": int(best[x]),
                     f"{x}_from_{int(fraction * 100)}pct": int(group[x].iloc[from_index]) if from_index < len(group) else None})
    return pd.DataFrame(rows)


def irregular_vs_regular(df: pd.DataFrame) -> pd.DataFrame:
    """GB/s at each irregular size next to the power-of-two curve interpolated (in log2 n) at that size."""
    import numpy as np

    regular = _require(df, ("vector_add",), "irregular_vs_regular")
    irregular = _require(df, ("vector_add_irregular",), "irregular_vs_regular")
    rows = []
    for (variant, n), group in irregular.groupby(["variant", "vocab"], sort=True):
        curve = regular[regular["variant"] == variant].sort_values("vocab")
        if len(curve) < 2 or not curve["vocab"].min() <= n <= curve["vocab"].max():
            continue
        expected = float(np.interp(math.log2(n), np.log2(curve["vocab"].astype(float)), curve["gbps"]))
        measured = float(group["gbps"].iloc[0])
        rows.append({"variant": variant, "n": int(n), "gbps": measured, "gbps_power_of_two_curve": expected,
                     "ratio": measured / expected, "idle_lanes_of_1024": -int(n) % 1024})
    return pd.DataFrame(rows)


def tile_summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per size of the tile study: the fastest (BLOCK_SIZE, num_warps), the slowest, and the autotuner's
    pick with its GB/s as a fraction of the best measured in the sweep."""
    part = _require(df, ("add_tile",), "tile_summary")
    picks = _ok(df[df["loss"] == "add_autotune"])
    rows = []
    for n, group in part.groupby("vocab", sort=True):
        best = group.loc[group["gbps"].idxmax()]
        worst = group.loc[group["gbps"].idxmin()]
        row = {"n": int(n), "best": f"{int(best['block_size'])}/{int(best['num_warps'])}", "best_gbps": float(best["gbps"]),
               "worst": f"{int(worst['block_size'])}/{int(worst['num_warps'])}", "worst_gbps": float(worst["gbps"])}
        pick = picks[picks["vocab"] == n]
        if not pick.empty and pd.notna(pick["block_size"].iloc[0]):
            row["autotune"] = f"{int(pick['block_size'].iloc[0])}/{int(pick['num_warps'].iloc[0])}"
            row["autotune_gbps"] = float(pick["gbps"].iloc[0])
            row["autotune_vs_best"] = row["autotune_gbps"] / row["best_gbps"]
            if "autotune_ms" in pick and pd.notna(pick["autotune_ms"].iloc[0]):
                row["autotune_ms"] = float(pick["autotune_ms"].iloc[0])
        rows.append(row)
    return pd.DataFrame(rows)


def speedups(df: pd.DataFrame, experiment: str, *, baseline: str, x: str = "vocab") -> pd.DataFrame:
    """Time of each variant divided by the ``baseline`` variant's, per ``x`` (wide table for display)."""
    part = _require(df, (experiment,), "speedups")
    table = part.pivot_table(index=x, columns="variant", values="ms_median")
    if baseline not in table:
        raise ValueError(f"speedups: no {baseline!r} rows for {experiment!r}")
    return table.div(table[baseline], axis=0).drop(columns=[baseline]).add_suffix(f"_time_over_{baseline}")


def flat_region(df: pd.DataFrame, *, factor: float = 1.5) -> pd.DataFrame:
    """Per op and variant: the smallest time measured, the largest size still within ``factor`` of it
    (where fixed launch cost dominates), and that time per launched kernel."""
    part = _require(df, FUSION_OPS, "flat_region")
    rows = []
    for (op, variant), group in part.groupby(["loss", "variant"], sort=False):
        group = group.sort_values("n_elements")
        floor = float(group["ms_median"].min())
        flat = group[group["ms_median"] <= factor * floor]
        kernels = group["n_kernels"].dropna() if "n_kernels" in group else pd.Series(dtype=float)
        row = {"op": op, "variant": variant, "min_us": floor * 1e3, "flat_up_to_n": int(flat["n_elements"].max()),
               "n_kernels": int(kernels.iloc[0]) if len(kernels) else None}
        row["us_per_kernel"] = row["min_us"] / row["n_kernels"] if row["n_kernels"] else None
        if "wall_ms" in group and group["wall_ms"].notna().any():
            row["host_loop_min_us"] = float(group["wall_ms"].min()) * 1e3
        rows.append(row)
    return _in_fusion_order(pd.DataFrame(rows), part)


def fusion_at_largest(df: pd.DataFrame, byte_model: pd.DataFrame) -> pd.DataFrame:
    """At each op's largest size: time, GB/s, % of copy, peak memory (x output) per variant, the time
    relative to Triton's, and the byte model's prediction of that ratio (activations only; ``byte_model``: the frame
    of ``perfutils.lab_kernels.teaching.activations.activation_byte_model``)."""
    part = _require(df, FUSION_OPS, "fusion_at_largest")
    largest = part[part["n_elements"] == part.groupby("loss")["n_elements"].transform("max")].copy()
    model = byte_model.set_index(["activation", "variant"])
    rows = []
    for _, row in largest.iterrows():
        triton_rows = largest[(largest["loss"] == row["loss"]) & (largest["variant"] == "triton")]
        triton_ms = float(triton_rows["ms_median"].iloc[0]) if len(triton_rows) else float("nan")
        key = (row["loss"], row["variant"])
        predicted = model.loc[key, "bytes_per_element"] / 8 if key in model.index else None
        peak = row.get("peak_mem_bytes")
        rows.append({"op": row["loss"], "variant": row["variant"], "n": int(row["n_elements"]),
                     "ms": float(row["ms_median"]), "gbps": float(row["gbps"]), "pct_of_copy": float(row["pct_of_copy"]),
                     "time_over_triton": float(row["ms_median"]) / triton_ms,
                     "predicted_time_over_triton": predicted,
                     "peak_x_output": float(peak) / (int(row["n_elements"]) * 4) if pd.notna(peak) else None})
    return _in_fusion_order(pd.DataFrame(rows), part)


_VARIANT_ORDER = ("triton", "triton_autotune", "torch", "torch_op", "eager", "torch_naive")


def _ok(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["status"] == "ok"]


def _require(df: pd.DataFrame, losses: Iterable[str], what: str) -> pd.DataFrame:
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"{what}: expected a DataFrame, got {type(df).__name__}")
    losses = list(losses)
    part = _ok(df[df["loss"].isin(losses)])
    if part.empty:
        raise ValueError(f"{what}: the data has no successful rows for {losses} (columns 'loss' and 'status')")
    return part


def _copy_line(ax, copy: float | None) -> None:
    if copy:
        ax.set_ylim(top=max(ax.get_ylim()[1], 1.12 * copy))
        ax.axhline(copy, color="0.3", linestyle=":", linewidth=1)
        ax.annotate(f"copy {copy:.0f} GB/s", xy=(0.01, copy), xycoords=("axes fraction", "data"),
                    xytext=(0, 3), textcoords="offset points", fontsize=8, color="0.3")


def _palette(variants: Iterable[str]) -> dict[str, Any]:
    import matplotlib.pyplot as plt

    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    return {v: colors[i % len(colors)] for i, v in enumerate(_VARIANT_ORDER + tuple(sorted(set(variants) - set(_VARIANT_ORDER))))}


def plot_vector_add(df: pd.DataFrame):
    """GB/s of vector add vs elements (log2 x), per variant; irregular sizes as hollow markers."""
    import matplotlib.pyplot as plt

    part = _require(df, ("vector_add", "vector_add_irregular"), "plot_vector_add")
    text, copy = figure_context(df)
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    colors = _palette(part["variant"])
    for variant, rows in part.groupby("variant", sort=True):
        regular = rows[rows["loss"] == "vector_add"].sort_values("vocab")
        irregular = rows[rows["loss"] == "vector_add_irregular"].sort_values("vocab")
        if not regular.empty:
            ax.plot(regular["vocab"], regular["gbps"], marker="o", markersize=4, color=colors[variant], label=variant)
        if not irregular.empty:
            ax.plot(irregular["vocab"], irregular["gbps"], linestyle="none", marker="D", markerfacecolor="none",
                    color=colors[variant], label=f"{variant}, irregular n")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("elements n (fp32; 12 B moved per element)")
    ax.set_ylabel("bandwidth (GB/s, 1e9 B/s)")
    _copy_line(ax, copy)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    ax.set_title(f"Vector add: useful bandwidth vs size\n{text}", fontsize=10)
    fig.tight_layout()
    return fig


def plot_tile_sweep(df: pd.DataFrame):
    """Heatmaps of GB/s over BLOCK_SIZE x num_warps, one panel per size; the autotuner's pick boxed."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    part = _require(df, ("add_tile",), "plot_tile_sweep")
    picks = _ok(df[df["loss"] == "add_autotune"])
    text, _ = figure_context(df)
    sizes = sorted(part["vocab"].unique())
    fig, axes = plt.subplots(1, len(sizes), figsize=(3.3 * len(sizes) + 0.8, 3.6), squeeze=False)
    for ax, n in zip(axes[0], sizes):
        grid = part[part["vocab"] == n].pivot_table(index="block_size", columns="num_warps", values="gbps")
        grid = grid.sort_index()
        sns.heatmap(grid, ax=ax, annot=True, fmt=".0f", cmap="viridis", cbar=False, annot_kws={"fontsize": 7})
        pick = picks[picks["vocab"] == n]
        if not pick.empty and pd.notna(pick["block_size"].iloc[0]):
            block, warps = int(pick["block_size"].iloc[0]), int(pick["num_warps"].iloc[0])
            if block in grid.index and warps in grid.columns:
                r, c = list(grid.index).index(block), list(grid.columns).index(warps)
                ax.add_patch(plt.Rectangle((c, r), 1, 1, fill=False, edgecolor="red", linewidth=2))
        ax.set_title(f"n = 2^{int(round(math.log2(n)))}" if n & (n - 1) == 0 else f"n = {n:,}", fontsize=9)
        ax.set_xlabel("num_warps")
        ax.set_ylabel("BLOCK_SIZE (elements per program)")
    fig.suptitle(f"Vector add GB/s by tile size and warps (red box: triton.autotune's pick)\n{text}", fontsize=10)
    fig.tight_layout()
    return fig


def plot_tile_occupancy(df: pd.DataFrame):
    """Theoretical occupancy (%, annotated with registers/thread) over BLOCK_SIZE x num_warps."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    part = _require(df, ("add_tile",), "plot_tile_occupancy")
    part = part.dropna(subset=["occupancy"])
    if part.empty:
        raise ValueError("plot_tile_occupancy: no add_tile row has an occupancy (measured under the interpreter?)")
    text, _ = figure_context(df)
    n = max(part["vocab"])  # occupancy depends on the compiled kernel only, not on n
    rows = part[part["vocab"] == n]
    occ = rows.pivot_table(index="block_size", columns="num_warps", values="occupancy").sort_index() * 100
    regs = rows.pivot_table(index="block_size", columns="num_warps", values="n_regs").sort_index()
    labels = occ.copy().astype(object)
    for i in occ.index:
        for j in occ.columns:
            r = regs.at[i, j] if (i in regs.index and j in regs.columns) else float("nan")
            labels.at[i, j] = f"{occ.at[i, j]:.0f}%\n{int(r)} regs" if pd.notna(r) else f"{occ.at[i, j]:.0f}%"
    fig, ax = plt.subplots(figsize=(5.2, 3.8))
    sns.heatmap(occ, ax=ax, annot=labels.values, fmt="", cmap="magma", vmin=0, vmax=100, annot_kws={"fontsize": 7},
                cbar_kws={"label": "theoretical occupancy (%)"})
    ax.set_xlabel("num_warps")
    ax.set_ylabel("BLOCK_SIZE (elements per program)")
    ax.set_title(f"add_kernel: occupancy from the compiled kernel\n{text}", fontsize=10)
    fig.tight_layout()
    return fig


def plot_softmax(df: pd.DataFrame):
    """GB/s (minimal bytes: read + write once) of the three softmax variants vs row length."""
    import matplotlib.pyplot as plt

    part = _require(df, ("softmax",), "plot_softmax")
    text, copy = figure_context(df)
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    colors = _palette(part["variant"])
    for variant, rows in part.groupby("variant", sort=True):
        rows = rows.sort_values("vocab")
        ax.plot(rows["vocab"], rows["gbps"], marker="o", markersize=4, color=colors[variant], label=variant)
    ax.set_xscale("log", base=2)
    ax.set_xlabel(f"row length N (columns; {int(part['tokens'].iloc[0])} rows, fp32)")
    ax.set_ylabel("bandwidth of 2·M·N·4 B (GB/s)")
    _copy_line(ax, copy)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    ax.set_title(f"Row softmax: fused Triton vs torch vs naive\n{text}", fontsize=10)
    fig.tight_layout()
    return fig


def _figure_legend(fig, axes) -> None:
    """One legend for all panels (each label once), right of the panels."""
    handles: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    if handles:
        fig.legend(list(handles.values()), list(handles.keys()), loc="center left", bbox_to_anchor=(1.0, 0.5),
                   fontsize=7, frameon=False)


def _fusion_ops(part: pd.DataFrame) -> list[str]:
    order = FUSION_OPS
    return [op for op in order if op in set(part["loss"])] + sorted(set(part["loss"]) - set(order))


def _in_fusion_order(rows: pd.DataFrame, part: pd.DataFrame) -> pd.DataFrame:
    """``rows`` sorted by op (in :func:`_fusion_ops`'s order of ``part``), then variant."""
    order = {op: i for i, op in enumerate(_fusion_ops(part))}
    return rows.sort_values(["op", "variant"], key=lambda s: s.map(order) if s.name == "op" else s).reset_index(drop=True)


def _fusion_panels(df: pd.DataFrame, what: str):
    """One panel per op of the fusion study, sharing y: (ok rows, caption, copy GB/s, ops, figure, axes, colours)."""
    import matplotlib.pyplot as plt

    part = _require(df, FUSION_OPS, what)
    text, copy = figure_context(df)
    ops = _fusion_ops(part)
    fig, axes = plt.subplots(1, len(ops), figsize=(3.6 * len(ops) + 0.5, 3.8), squeeze=False, sharey=True)
    return part, text, copy, ops, fig, axes, _palette(part["variant"])


def plot_fusion_latency(df: pd.DataFrame):
    """Latency vs elements, log-log, one panel per op: do_bench median (solid, p20-p80 band) and the
    host-loop time per call (dashed). The flat left part is the fixed cost of a launch."""
    part, text, _, ops, fig, axes, colors = _fusion_panels(df, "plot_fusion_latency")
    for ax, op in zip(axes[0], ops):
        for variant, rows in part[part["loss"] == op].groupby("variant", sort=True):
            rows = rows.sort_values("n_elements")
            us = rows["ms_median"] * 1e3
            ax.plot(rows["n_elements"], us, marker="o", markersize=3, color=colors[variant], label=f"{variant} (GPU)")
            ax.fill_between(rows["n_elements"], rows["ms_p20"] * 1e3, rows["ms_p80"] * 1e3, color=colors[variant], alpha=0.2)
            if "wall_ms" in rows and rows["wall_ms"].notna().any():
                ax.plot(rows["n_elements"], rows["wall_ms"] * 1e3, linestyle="--", linewidth=1, color=colors[variant],
                        label=f"{variant} (host loop)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(op, fontsize=9)
        ax.set_xlabel("elements (fp32)")
    axes[0][0].set_ylabel("time per call (µs)")
    _figure_legend(fig, axes[0])
    fig.suptitle(f"Latency vs size: the flat region is launch cost, the slope-1 region is bandwidth\n{text}", fontsize=10)
    fig.tight_layout()
    return fig


def plot_fusion_throughput(df: pd.DataFrame):
    """GB/s of the minimal traffic (read x + write y) vs elements, one panel per op, copy line."""
    part, text, copy, ops, fig, axes, colors = _fusion_panels(df, "plot_fusion_throughput")
    for ax, op in zip(axes[0], ops):
        for variant, rows in part[part["loss"] == op].groupby("variant", sort=True):
            rows = rows.sort_values("n_elements")
            ax.plot(rows["n_elements"], rows["gbps"], marker="o", markersize=3, color=colors[variant], label=variant)
        ax.set_xscale("log", base=2)
        _copy_line(ax, copy)
        ax.set_ylim(bottom=0)
        ax.set_title(op, fontsize=9)
        ax.set_xlabel("elements (fp32)")
    axes[0][0].set_ylabel("useful bandwidth, 8 B/element (GB/s)")
    _figure_legend(fig, axes[0])
    fig.suptitle(f"Throughput vs size: fused vs unfused\n{text}", fontsize=10)
    fig.tight_layout()
    return fig


def plot_fusion_memory(df: pd.DataFrame):
    """Peak memory allocated during one call, above the inputs, in units of the output's size, at the
    largest size measured of each op."""
    import matplotlib.pyplot as plt

    part = _require(df, FUSION_OPS, "plot_fusion_memory")
    if "peak_mem_bytes" not in part or part["peak_mem_bytes"].isna().all():
        raise ValueError("plot_fusion_memory: the data has no peak_mem_bytes")
    text, _ = figure_context(df)
    ops = _fusion_ops(part)
    largest = part[part["n_elements"] == part.groupby("loss")["n_elements"].transform("max")].copy()
    largest["ratio"] = largest["peak_mem_bytes"] / (largest["n_elements"] * 4)
    variants = [v for v in _VARIANT_ORDER if v in set(largest["variant"])]
    colors = _palette(largest["variant"])
    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    width = 0.8 / max(len(variants), 1)
    for i, variant in enumerate(variants):
        values = [largest[(largest["loss"] == op) & (largest["variant"] == variant)]["ratio"] for op in ops]
        heights = [float(v.iloc[0]) if len(v) else 0.0 for v in values]
        positions = [k + (i - (len(variants) - 1) / 2) * width for k in range(len(ops))]
        ax.bar(positions, heights, width=width, color=colors[variant], label=variant)
    ax.set_xticks(range(len(ops)))
    ax.set_xticklabels([f"{op}\n(n = 2^{math.log2(int(largest[largest['loss'] == op]['n_elements'].iloc[0])):.0f})"
                        for op in ops], fontsize=8)
    ax.set_xlabel("operation (largest size measured)")
    ax.set_ylabel("peak allocated above inputs\n(× output size)")
    ax.axhline(1.0, color="0.3", linestyle=":", linewidth=1)
    ax.legend(fontsize=8)
    ax.set_title(f"Peak memory of one call (1 = just the output)\n{text}", fontsize=10)
    fig.tight_layout()
    return fig
