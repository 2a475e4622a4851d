"""Figures of the block-size sweep notebook (01) and shared helpers (best_per_group): functions of a tidy DataFrame
(records schema). The case study's figures are in :mod:`perfutils.plots.case_study`."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from . import figures  # noqa: F401  (fixes svg.hashsalt)
from .figures import label_points
from .vocab_sweep import loss_label
from ..data.records import check_single_gpu


def _panels(df: pd.DataFrame) -> list[tuple[str, int]]:
    keys = df[["loss_label", "vocab"]].drop_duplicates().sort_values(["loss_label", "vocab"])
    return list(keys.itertuples(index=False, name=None))


def loss_labels(df: pd.DataFrame) -> list[str]:
    """Each row's :func:`perfutils.plots.vocab_sweep.loss_label` ('cross_entropy (labels)', 'reverse_kl', ...), for
    facet titles."""
    return [loss_label(loss, target_format) for loss, target_format in zip(df["loss"], df["target_format"])]


def _ok(df: pd.DataFrame) -> pd.DataFrame:
    if df.empty:
        raise ValueError("no rows to plot")
    check_single_gpu(df)
    out = df[df["status"] == "ok"].copy()
    if out.empty:
        raise ValueError("no row with status 'ok' to plot (every configuration failed or was wrong)")
    out["loss_label"] = loss_labels(out)
    return out


def plot_bandwidth_vs_occupancy(df: pd.DataFrame, *, copy_gbps: float | None = None, title: str = "") -> plt.Figure:
    """GB/s against theoretical occupancy, one point per (block size, warps), per loss × vocab.

    Points are annotated with registers per thread (and spilled bytes when the compiler spilled); labels of points
    that coincide are joined, and none covers another (:func:`perfutils.plots.figures.label_points`).
    """
    data = _ok(df)
    panels = _panels(data)
    losses = sorted(data["loss_label"].unique())
    vocabs = sorted(data["vocab"].unique())
    fig, axes = plt.subplots(len(losses), len(vocabs), figsize=(4.2 * len(vocabs), 3.4 * len(losses)), squeeze=False,
                             sharex=True, sharey=True)
    block_sizes = sorted(data["block_size"].dropna().unique())
    palette = dict(zip(block_sizes, sns.color_palette("viridis", len(block_sizes))))
    markers = dict(zip(sorted(data["num_warps"].dropna().unique()), "osD^vP"))
    notes = []  # (axes, x, y, label): written once the layout is final, so that none covers another
    for (label, vocab) in panels:
        ax = axes[losses.index(label)][vocabs.index(vocab)]
        part = data[(data["loss_label"] == label) & (data["vocab"] == vocab)]
        for row in part.itertuples():
            ax.scatter(row.occupancy * 100, row.gbps, color=palette[row.block_size], marker=markers[row.num_warps],
                       s=36, edgecolor="black", linewidth=0.4)
            note = f"{int(row.n_regs)}" if not pd.isna(row.n_regs) else ""
            if not pd.isna(row.spill_bytes) and row.spill_bytes > 0:
                note += f"/S{int(row.spill_bytes)}"
            notes.append((ax, row.occupancy * 100, row.gbps, note))
        if copy_gbps:
            ax.axhline(copy_gbps, color="grey", linestyle="--", linewidth=1)
            ax.text(1, copy_gbps, "copy bandwidth", fontsize=7, va="bottom", color="grey")
        ax.set_title(f"{label}, vocab {vocab // 1024}K", fontsize=9)
        ax.grid(alpha=0.3)
    for ax in axes[-1]:
        ax.set_xlabel("theoretical occupancy (% of 64 warps/SM)")
    for row_axes in axes:
        row_axes[0].set_ylabel("GB/s (minimal bytes / time)")
    handles = [plt.Line2D([], [], marker="o", linestyle="", color=palette[b], label=f"block {int(b)}") for b in block_sizes]
    handles += [plt.Line2D([], [], marker=m, linestyle="", color="black", label=f"{int(w)} warps") for w, m in markers.items()]
    fig.legend(handles=handles, loc="upper center", ncol=min(len(handles), 10), fontsize=7, bbox_to_anchor=(0.5, 1.02))
    fig.suptitle(title or "Bandwidth vs occupancy (labels: registers/thread, S = spilled bytes)", y=1.06, fontsize=10)
    fig.tight_layout()
    fig.canvas.draw()  # once: every panel's labels are measured against this layout
    for ax in {id(a): a for a, *_ in notes}.values():
        xs, ys, texts = zip(*[(x, y, note) for a, x, y, note in notes if a is ax])
        label_points(ax, xs, ys, texts, fontsize=5.5, draw=False)
    return fig


def plot_gbps_heatmap(df: pd.DataFrame, *, value: str = "gbps", title: str = "") -> plt.Figure:
    """Heatmaps of ``value`` over block size × warps, one per loss × vocab."""
    data = _ok(df)
    losses = sorted(data["loss_label"].unique())
    vocabs = sorted(data["vocab"].unique())
    fig, axes = plt.subplots(len(losses), len(vocabs), figsize=(4.0 * len(vocabs), 3.0 * len(losses)), squeeze=False)
    vmax = data[value].max()
    for (label, vocab) in _panels(data):
        ax = axes[losses.index(label)][vocabs.index(vocab)]
        part = data[(data["loss_label"] == label) & (data["vocab"] == vocab)]
        table = part.pivot_table(index="num_warps", columns="block_size", values=value, aggfunc="max")
        sns.heatmap(table, ax=ax, annot=True, fmt=".0f", cmap="mako", vmin=0, vmax=vmax, cbar=False,
                    annot_kws={"fontsize": 6})
        ax.set_title(f"{label}, vocab {vocab // 1024}K", fontsize=9)
        ax.set_xlabel("block size (columns)")
        ax.set_ylabel("warps")
    unit = "GB/s" if value == "gbps" else value
    fig.suptitle(title or f"{unit} over block size × warps (blank: failed or not run)", fontsize=10)
    fig.tight_layout()
    return fig


def occupancy_reading(df: pd.DataFrame, by=("loss", "target_format", "vocab", "variant")) -> str:
    """What the sweep says about occupancy and spills, per shape (``by``): at how many shapes the fastest
    configuration has the highest occupancy of its shape, the sign of the rank correlation of occupancy and GB/s, and
    where the configurations that spill rank among their shape's (the share in its slower half and slowest quarter),
    with the median % of copy with and without spills."""
    ok = df[df["status"] == "ok"]
    shapes = list(ok.groupby(list(by)))
    fastest_most = 0
    correlations = []
    ranks = []
    for _, part in shapes:
        best = part.loc[part["gbps"].idxmax()]
        fastest_most += int(best["occupancy"] >= part["occupancy"].max())
        correlations.append(part[["occupancy", "gbps"]].corr(method="spearman").iloc[0, 1])
        spills = part["spill_bytes"].fillna(0) > 0
        ranks += part["gbps"].rank(pct=True)[spills].tolist()  # 1 = the fastest of its shape
    negative = sum(c < 0 for c in correlations)
    text = (f"At {fastest_most} of {len(shapes)} shapes the fastest configuration has the highest occupancy of its "
            f"shape; the rank correlation of occupancy and GB/s is negative at {negative} of them "
            f"({min(correlations):.2f} to {max(correlations):.2f}).")
    if ranks:
        slower_half = sum(r <= 0.5 for r in ranks)
        slowest_quarter = sum(r <= 0.25 for r in ranks)
        spills = ok["spill_bytes"].fillna(0) > 0
        with_spills, without = ok.loc[spills, "pct_of_copy"].median(), ok.loc[~spills, "pct_of_copy"].median()
        text += (f" Of the {len(ranks)} configurations that spill, {slower_half} rank in the slower half of their "
                 f"shape's configurations and {slowest_quarter} in the slowest quarter; median % of copy "
                 f"{with_spills:.1f} with spills, {without:.1f} without.")
    else:
        text += " No configuration spills."
    return text


def best_per_group(df: pd.DataFrame, by=("loss", "target_format", "vocab", "variant")) -> pd.DataFrame:
    """The fastest ok row of each group (e.g. each variant's best configuration per shape)."""
    ok = df[df["status"] == "ok"]
    idx = ok.groupby(list(by), dropna=False)["ms_median"].idxmin()
    return ok.loc[idx].sort_values(list(by)).reset_index(drop=True)

