"""Tables and figures of notebook 08's recorded profiles: where the step's time goes, ncu vs perfutils.

Functions of the DataFrames :mod:`perfutils.studies.profiling` and :mod:`perfutils.studies.profile_ncu` record:
:func:`step_summary`, :func:`kernel_summary` and :func:`ncu_comparison` are tables; :func:`plot_step_breakdown`
(device time per step split into kernels) and :func:`plot_ncu_occupancy` (predicted vs measured occupancy) figures.
"""

from __future__ import annotations

import pandas as pd

from .figures import figure_context

__all__ = ["step_summary", "kernel_summary", "ncu_comparison", "plot_step_breakdown", "plot_ncu_occupancy",
           "step_reading"]


def step_summary(df: pd.DataFrame) -> pd.DataFrame:
    """One line per variant: step time, GB/s, % of copy, kernels per step, peak memory, occupancy, error."""
    steps = df[df["row_kind"] == "step"].copy()
    if steps.empty:
        raise ValueError("step_summary: the data has no step rows (row_kind == 'step')")
    steps["peak_mem_mib"] = steps["peak_mem_bytes"] / 2**20 if "peak_mem_bytes" in steps else float("nan")
    columns = ["variant", "status", "ms_median", "ms_p20", "ms_p80", "gbps", "pct_of_copy", "n_kernels",
               "device_us_per_step", "peak_mem_mib", "n_regs", "occupancy", "limiter", "max_rel_err"]
    columns = [c for c in columns if c in steps]
    return steps[columns].sort_values("ms_median", na_position="last").reset_index(drop=True)


def step_reading(df: pd.DataFrame, *, gradient_bytes: float) -> list[str]:
    """What the recorded profile shows, one Markdown bullet each: % of copy per variant, where the step time exceeds
    the device time (the GPU idle between kernels), peak memory over the gradient (``gradient_bytes``, the part no
    variant can avoid), and for the Triton variants the share of the device time in Triton kernels (rows with
    registers) against the PyTorch kernels around them."""
    summary = step_summary(df)
    ok = summary[summary["status"] == "ok"]
    lines = ["* **Against the floor:** " + ", ".join(f"{r.variant} {r.pct_of_copy:.1f}%" for r in ok.itertuples())
             + " of copy bandwidth."]
    idle = (ok["ms_median"] * 1e3 - ok["device_us_per_step"]).clip(lower=0)
    share = idle / (ok["ms_median"] * 1e3)
    lines.append("* **Time outside kernels** (step time minus device time): " + ", ".join(
        f"{v} {us:.1f} µs ({100 * f:.1f}%)" for v, us, f in zip(ok["variant"], idle, share)) + ".")
    lines.append(f"* **Peak memory** over the gradient ({gradient_bytes / 2**20:.0f} MiB in bf16 at this shape): "
                 + ", ".join(f"{r.variant} {r.peak_mem_mib * 2**20 / gradient_bytes:.2f}×" for r in ok.itertuples())
                 + ".")
    kernels = df[(df["row_kind"] == "kernel") & (df["status"] == "ok")]
    parts = []
    for variant, rows in kernels.groupby("variant", sort=False):
        triton = rows["n_regs"].notna()
        if triton.any():
            others = sorted(set(rows.loc[~triton, "short_name"]))
            parts.append(f"{variant} {rows.loc[triton, 'pct_of_device'].sum():.1f}%"
                         + (f" (the rest: {', '.join(others)})" if others else ""))
    if parts:
        lines.append("* **Device time in the Triton kernels** of each Triton variant: " + "; ".join(parts) + ".")
    return lines


def kernel_summary(df: pd.DataFrame, *, top: int = 4) -> pd.DataFrame:
    """Per variant, its ``top`` kernels by device time per step (the rest summed as ``other``)."""
    kernels_df = df[(df["row_kind"] == "kernel") & (df["status"] == "ok")]
    if kernels_df.empty:
        raise ValueError("kernel_summary: the data has no kernel rows (row_kind == 'kernel')")
    parts = []
    for variant, rows in kernels_df.groupby("variant", sort=False):
        rows = rows.sort_values("us_per_step", ascending=False)
        head = rows.head(top)[["variant", "short_name", "kind", "calls_per_step", "us_per_step", "pct_of_device",
                               "n_regs", "occupancy"]]
        parts.append(head)
        rest = rows.iloc[top:]
        if not rest.empty:
            parts.append(pd.DataFrame([{"variant": variant, "short_name": f"{len(rest)} other kernel{'s' if len(rest) > 1 else ''}", "kind": "",
                                        "calls_per_step": rest["calls_per_step"].sum(),
                                        "us_per_step": rest["us_per_step"].sum(),
                                        "pct_of_device": rest["pct_of_device"].sum()}]))
    return pd.concat(parts, ignore_index=True)


def ncu_comparison(df: pd.DataFrame) -> pd.DataFrame:
    """profile_ncu rows side by side: perfutils' prediction next to what ncu measured."""
    ok = df[df["status"] == "ok"].copy()
    if ok.empty:
        raise ValueError("ncu_comparison: no successful ncu rows")
    ok["occupancy_pred_pct"] = ok["occupancy"] * 100
    wanted = ["variant", "kernel", "num_warps", "n_regs", "ncu_registers", "pred_limit_registers", "ncu_limit_registers",
              "pred_limit_shared_mem", "ncu_limit_shared_mem", "ncu_shared_config_bytes", "pred_limit_warps",
              "ncu_limit_warps",
              "occupancy_pred_pct", "ncu_theoretical_occupancy_pct", "ncu_achieved_occupancy_pct",
              "ncu_dram_throughput_pct", "ms_median"]
    return ok[[c for c in wanted if c in ok]].reset_index(drop=True)


def plot_step_breakdown(df: pd.DataFrame, *, top: int = 4):
    """Stacked bars: device time per step of each variant split into its top kernels; a black tick
    marks the do_bench time of the whole step (gaps between kernels and host work show as the excess)."""
    import matplotlib.pyplot as plt

    table = kernel_summary(df, top=top)
    steps = df[(df["row_kind"] == "step") & (df["status"] == "ok")].set_index("variant")
    order = [v for v in steps.sort_values("ms_median").index if v in set(table["variant"])]
    order += [v for v in table["variant"].unique() if v not in order]
    text, _ = figure_context(df)
    fig, ax = plt.subplots(figsize=(10.0, 0.6 * len(order) + 1.8))
    cmap = plt.get_cmap("tab20")
    names = list(dict.fromkeys(table["short_name"]))
    colors = {name: cmap(i % 20) for i, name in enumerate(names)}
    longest = float(max(table.groupby("variant")["us_per_step"].sum().max(),
                        (steps["ms_median"] * 1e3).max() if len(steps) else 0.0))
    for y, variant in enumerate(order):
        left = 0.0
        for _, row in table[table["variant"] == variant].iterrows():
            width = float(row["us_per_step"])
            ax.barh(y, width, left=left, color=colors[row["short_name"]], edgecolor="white", linewidth=0.5)
            fits = int(width / longest * 110) - 2  # characters of a 6.5 pt label that fit in the segment
            if fits >= 5:
                name = row["short_name"]
                ax.text(left + width / 2, y, name if len(name) <= fits else name[:fits - 1] + "…",
                        ha="center", va="center", fontsize=6.5)
            left += width
        if variant in steps.index:
            ax.plot([steps.at[variant, "ms_median"] * 1e3] * 2, [y - 0.4, y + 0.4], color="black", linewidth=2)
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(color=colors[name], label=name) for name in names], loc="center left",
              bbox_to_anchor=(1.01, 0.5), fontsize=7, frameon=False, title="kernel", title_fontsize=7)
    ax.set_yticks(range(len(order)))
    ax.set_yticklabels(order)
    ax.invert_yaxis()
    ax.set_xlabel("time per loss forward+backward step (µs): bars = GPU kernels (profiler), tick = do_bench step")
    keys = ["loss", "target_format", "tokens", "vocab", "dtype"]
    shapes = df[keys].dropna().drop_duplicates() if set(keys) <= set(df.columns) else pd.DataFrame(columns=keys)
    what = "; ".join(f"{r.loss} ({r.target_format}), {r.tokens} × {r.vocab} {r.dtype}" for r in shapes.itertuples())
    ax.set_title(f"Where the step's time goes{': ' + what if what else ''}, forward + backward\n{text}", fontsize=10)
    fig.tight_layout()
    return fig


def plot_ncu_occupancy(df: pd.DataFrame):
    """Per profiled kernel: predicted theoretical occupancy (perfutils), ncu's theoretical and achieved
    occupancy, and ncu's DRAM throughput, all in %."""
    import matplotlib.pyplot as plt

    table = ncu_comparison(df)
    text, _ = figure_context(df)
    labels = [f"{v}\n{k}" for v, k in zip(table["variant"], table["kernel"])]
    series = [("perfutils theoretical", "occupancy_pred_pct"), ("ncu theoretical", "ncu_theoretical_occupancy_pct"),
              ("ncu achieved", "ncu_achieved_occupancy_pct"), ("ncu DRAM throughput", "ncu_dram_throughput_pct")]
    series = [(label, column) for label, column in series if column in table and table[column].notna().any()]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(table) + 2), 4.0))
    width = 0.8 / max(len(series), 1)
    for i, (label, column) in enumerate(series):
        positions = [k + (i - (len(series) - 1) / 2) * width for k in range(len(table))]
        ax.bar(positions, table[column].fillna(0.0), width=width, label=label)
    ax.set_xticks(range(len(table)))
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylim(0, 105)
    ax.set_ylabel("% (occupancy: of 64 warps/SM; DRAM: of peak)")
    ax.legend(fontsize=7, ncol=2)
    ax.set_title(f"Loss kernels under Nsight Compute vs perfutils' prediction\n{text}", fontsize=10)
    fig.tight_layout()
    return fig
