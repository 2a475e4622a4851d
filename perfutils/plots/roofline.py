"""Roofline figures for the loss kernels, and the tables behind them.

Wraps :mod:`perfutils.model.roofline` (ceilings, ``loss_cost``, ``place``) for DataFrames of measured
rows (:mod:`perfutils.data.schema`): pick the best configuration per group, attach the algorithmic
cost of each row, place it under the roofs, and draw

* :func:`plot_roofline_points` - every (loss, variant) on one log-log roofline, with the DRAM/L2
  roofs, the FP32 roof and each loss's exp2 (MUFU) roof;
* :func:`plot_distance_to_floor` - % of copy bandwidth per (loss, variant), one panel per vocab:
  100 % is the floor (minimum bytes moved at copy bandwidth);
* :func:`plot_roofline` - any labelled points (flops, bytes, time) on a roofline of given ceilings.

Points sit at the *algorithmic* intensity (minimum flops / minimum bytes), so two variants of one
loss share an x: what separates them is time, i.e. the height of the point.
"""

from __future__ import annotations

import math

import pandas as pd

from ..model.roofline import Ceilings, KernelCost, loss_cost, place
from .figures import caption, check_frame

__all__ = [
    "VARIANT_ORDER",
    "DTYPE_BYTES",
    "measured_date",
    "figure_title",
    "best_rows",
    "with_costs",
    "roofline_table",
    "floor_table",
    "plot_roofline_points",
    "plot_distance_to_floor",
    "plot_roofline",
]

# Stable colours: the project's variants first, then PyTorch and library baselines.
VARIANT_ORDER = ("fused", "two_pass", "split_row", "auto", "eager", "torch_compile", "liger")
LOSS_MARKERS = {"cross_entropy/labels": "o", "cross_entropy/logits": "s", "forward_kl/logits": "^",
                "reverse_kl/logits": "D"}
DTYPE_BYTES = {"bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "half": 2, "fp32": 4, "float32": 4,
               "float": 4}
GROUP_COLUMNS = ("loss", "target_format", "variant", "dtype", "tokens", "vocab")


def _variant_key(variant: str):
    return (VARIANT_ORDER.index(variant), "") if variant in VARIANT_ORDER else (len(VARIANT_ORDER), variant)


def measured_date(df: pd.DataFrame) -> str | None:
    """The latest ``timestamp_utc`` of a records frame (``YYYY-MM-DD``), or None."""
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"df: expected a DataFrame, got {type(df).__name__}")
    if "timestamp_utc" not in df.columns:
        return None
    stamps = df["timestamp_utc"].dropna().astype(str)
    return max(stamps)[:10] if len(stamps) else None


def figure_title(what: str, gpu_name: str | None, date: str | None, extra: str = "") -> str:
    """``what`` plus the GPU and measurement date (:func:`perfutils.plots.figures.caption`)."""
    suffix = caption(gpu_name, date, extra)
    return f"{what}\n{suffix}" if suffix else what


def best_rows(df: pd.DataFrame, by=GROUP_COLUMNS) -> pd.DataFrame:
    """The fastest ``status == "ok"`` row (lowest ``ms_median``) of each group ``by``."""
    by = list(by)
    check_frame(df, by + ["ms_median", "status"])
    ok = df[(df["status"] == "ok") & df["ms_median"].notna()]
    if ok.empty:
        raise ValueError("df: no row with status 'ok' and a time; nothing to place")
    # Sort by time, then by the configuration, so ties resolve the same way every run.
    tie = [c for c in ("block_size", "num_warps") if c in ok.columns]
    ordered = ok.sort_values(["ms_median", *tie], kind="mergesort", na_position="last")
    best = ordered.drop_duplicates(subset=by, keep="first")
    return best.sort_values(by, kind="mergesort").reset_index(drop=True)


def _dtype_bytes(dtype) -> int:
    key = str(dtype).lower().replace("torch.", "")
    if key not in DTYPE_BYTES:
        raise ValueError(f"dtype: unknown dtype {dtype!r}; expected one of {sorted(DTYPE_BYTES)}")
    return DTYPE_BYTES[key]


def with_costs(df: pd.DataFrame) -> pd.DataFrame:
    """Add ``flops``, ``transcendentals``, ``bytes`` (``bytes_min`` when recorded, else
    :func:`perfutils.model.roofline.loss_cost`) and ``loss_label`` (``loss/target_format``) per row."""
    check_frame(df, ["loss", "target_format", "tokens", "vocab", "dtype"])
    out = df.copy()
    costs = [loss_cost(str(l), str(f), int(t), int(v), _dtype_bytes(d))
             for l, f, t, v, d in zip(out["loss"], out["target_format"], out["tokens"], out["vocab"], out["dtype"])]
    out["flops"] = [c.flops for c in costs]
    out["transcendentals"] = [c.transcendentals for c in costs]
    model_bytes = pd.Series([c.bytes for c in costs], index=out.index, dtype="float64")
    if "bytes_min" in out.columns:
        recorded = pd.to_numeric(out["bytes_min"], errors="coerce").astype("float64")
        out["bytes"] = recorded.where(recorded.notna(), model_bytes)
    else:
        out["bytes"] = model_bytes
    out["loss_label"] = out["loss"].astype(str) + "/" + out["target_format"].astype(str)
    return out


def roofline_table(df: pd.DataFrame, ceilings: Ceilings) -> pd.DataFrame:
    """Place every row (needs ``ms_median`` and the cost columns of :func:`with_costs`).

    Adds ``time_us``, ``floor_us`` (minimum bytes at copy bandwidth), ``gap_us`` (time - floor),
    ``x_floor`` (time / floor), ``gbps`` (minimum bytes / time), ``pct_of_copy`` (against
    ``ceilings.dram_gbps``, so rows measured in other sessions are judged by one copy number),
    ``intensity``, ``tflops``, ``binding_roof`` and ``pct_of_roof``.
    """
    if not isinstance(ceilings, Ceilings):
        raise TypeError(f"ceilings: expected a Ceilings, got {type(ceilings).__name__}")
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"df: expected a DataFrame, got {type(df).__name__}")
    if not {"flops", "bytes", "transcendentals"} <= set(df.columns):
        df = with_costs(df)
    check_frame(df, ["ms_median", "flops", "bytes", "transcendentals"])
    out = df.copy()
    placements = [place(KernelCost(bytes=float(b), flops=float(f), transcendentals=float(t)), float(ms) / 1e3, ceilings)
                  for b, f, t, ms in zip(out["bytes"], out["flops"], out["transcendentals"], out["ms_median"])]
    out["time_us"] = out["ms_median"].astype(float) * 1e3
    out["floor_us"] = [p.floor_time_s * 1e6 for p in placements]
    out["gap_us"] = out["time_us"] - out["floor_us"]
    out["x_floor"] = out["time_us"] / out["floor_us"]
    out["gbps"] = [p.achieved_gbps for p in placements]
    out["pct_of_copy"] = [p.pct_of_copy for p in placements]
    out["intensity"] = [p.arithmetic_intensity for p in placements]
    out["tflops"] = [p.achieved_tflops for p in placements]
    out["binding_roof"] = [p.binding_roof for p in placements]
    out["pct_of_roof"] = [p.pct_of_roof for p in placements]
    return out


PROJECT_VARIANTS = ("fused", "two_pass", "split_row", "auto")


def roofline_reading(table: pd.DataFrame, ceilings: Ceilings) -> list[str]:
    """What the placed points (:func:`roofline_table`) show, one Markdown bullet each: their intensity against the
    FP32 ridge and the roof that binds; ``two_pass`` against its re-read bound (it reads every input twice: the
    minimal bytes over those, in bf16 4 of 6 B per element for labels cross-entropy, 6 of 10 with target logits);
    how far each baseline and the project's best sit from the floor; where the benchmark's configuration trails the
    sweep's best for the same variant and shape."""
    lines = []
    binding = table["binding_roof"].value_counts()
    text = (f"* **Roofs.** The points' intensity is {table['intensity'].min():.2f}–{table['intensity'].max():.2f} "
            "flop/byte")
    if ceilings.fp32_tflops and ceilings.dram_gbps:
        ridge = ceilings.fp32_tflops * 1e3 / ceilings.dram_gbps
        text += f", {ridge / table['intensity'].max():.0f}× left of the FP32 ridge ({ridge:.1f} flop/byte)"
    text += "; binding roof: " + ", ".join(f"{roof} at {n} of {len(table)} points" for roof, n in binding.items()) + "."
    lines.append(text)
    two = table[table["variant"] == "two_pass"]
    if len(two):
        parts = []
        per_element = two["bytes"] / (two["tokens"] * two["vocab"])
        dtype_bytes = two["dtype"].map(_dtype_bytes)
        bound = 100 * per_element / (2 * per_element - dtype_bytes)  # every input read twice, the gradient once
        for label, part in two.assign(bound=bound).groupby("loss_label"):
            parts.append(f"{label} at most {part['pct_of_copy'].max():.1f}% (bound {part['bound'].iloc[0]:.1f}%)")
        lines.append("* **two_pass and its re-read.** Reading every input twice caps it near minimal bytes / bytes "
                     "moved of copy bandwidth: " + "; ".join(parts) + ".")
    bench = table[table["source"] == "benchmark"] if "source" in table else table
    spans = []
    for variant in [v for v in bench["variant"].unique() if v not in PROJECT_VARIANTS]:
        x = bench.loc[bench["variant"] == variant, "x_floor"]
        spans.append(f"{variant} {x.min():.2f}–{x.max():.2f}×")
    ours = bench[bench["variant"].isin(PROJECT_VARIANTS)].groupby(["loss_label", "vocab"])["x_floor"].min()
    if len(ours):
        spans.append(f"the best of the project's variants {ours.min():.2f}–{ours.max():.2f}×")
    if spans:
        lines.append("* **Distance to the floor** (time over the floor, per shape): " + ", ".join(spans) + ".")
    if "source" in table:
        keys = ["loss_label", "vocab", "variant"]
        pair = (table[table["source"] == "benchmark"].set_index(keys)["time_us"]
                / table[table["source"] == "sweep best"].set_index(keys)["time_us"]).dropna()
        if len(pair):
            worst = pair.idxmax()
            lines.append(f"* **Sweep best against the benchmark.** At {len(pair)} shapes both recorded a variant, the "
                         f"benchmark's configuration takes {pair.min():.2f}–{pair.max():.2f}× the sweep's best time "
                         f"(the most: {worst[2]}, {worst[0]} at vocab {worst[1]}).")
    return lines


def floor_table(pairs, tokens: int, vocabs, dtype: str = "bf16", copy_gbps: float | None = None) -> pd.DataFrame:
    """Reference math per (loss, target_format) and vocab: bytes/element, minimum bytes, flops,
    transcendentals, intensity, and (with ``copy_gbps``) the floor in microseconds."""
    rows = []
    for loss, target_format in pairs:
        for vocab in vocabs:
            cost = loss_cost(loss, target_format, int(tokens), int(vocab), _dtype_bytes(dtype))
            elements = int(tokens) * int(vocab)
            row = {"loss_label": f"{loss}/{target_format}", "tokens": int(tokens), "vocab": int(vocab),
                   "bytes_per_element": round(cost.bytes / elements, 4),
                   "min_MB": cost.bytes / 1e6,
                   "GFLOP": cost.flops / 1e9,
                   "G_exp2": cost.transcendentals / 1e9,
                   "flop_per_byte": cost.arithmetic_intensity}
            if copy_gbps is not None:
                row["floor_us"] = cost.bytes / (float(copy_gbps) * 1e9) * 1e6
            rows.append(row)
    return pd.DataFrame(rows)


def _memory_roofs(ceilings: Ceilings) -> list[tuple[str, float, str]]:
    """(name, GB/s, line style) of each memory roof the ceilings know."""
    memory = [("DRAM copy", ceilings.dram_gbps, "-"), ("DRAM read", ceilings.dram_read_gbps, "--"),
              ("L2 read", ceilings.l2_gbps, ":")]
    return [(name, bw, style) for name, bw, style in memory if bw is not None]


def _roof_lines(ax, ceilings: Ceilings, xs, linewidth: float = 1.1):
    compute = ceilings.fp32_tflops
    for name, bw, style in _memory_roofs(ceilings):
        ys = [x * bw / 1e3 for x in xs]  # flop/B x GB/s = GFLOP/s -> TFLOP/s
        if compute:
            ys = [min(y, compute) for y in ys]
        ax.plot(xs, ys, style, color="black", linewidth=linewidth, label=f"{name} {bw:,.0f} GB/s")
    if compute:
        ax.axhline(compute, color="tab:blue", linewidth=linewidth, label=f"FP32 {compute:,.1f} TFLOP/s")


def plot_roofline_points(table: pd.DataFrame, ceilings: Ceilings, *, title: str | None = None, ax=None,
                         source_column: str = "source"):
    """Every row of ``table`` (from :func:`roofline_table`) on a log-log roofline.

    Colour = variant, marker = loss; rows whose ``source`` is not the first source in the frame
    (e.g. "sweep best" after "benchmark") are drawn hollow. Each loss gets a dashed grey segment
    at its exp2 roof (MUFU rate x flops per transcendental) when the ceilings know the MUFU rate.
    Returns the Axes.
    """
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    check_frame(table, ["variant", "loss_label", "intensity", "tflops", "flops", "transcendentals"], "table")
    if not isinstance(ceilings, Ceilings):
        raise TypeError(f"ceilings: expected a Ceilings, got {type(ceilings).__name__}")
    if table.empty:
        raise ValueError("table: no rows to plot")
    if ax is None:
        _, ax = plt.subplots(figsize=(8.5, 5.5))
    intensities = list(table["intensity"])
    ridge = ceilings.fp32_tflops * 1e3 / ceilings.dram_gbps if ceilings.fp32_tflops else max(intensities)
    x_lo = 2 ** math.floor(math.log2(min(intensities) / 4))
    x_hi = 2 ** math.ceil(math.log2(max(ridge, max(intensities)) * 4))
    xs = [x_lo * (x_hi / x_lo) ** (i / 200) for i in range(201)]
    _roof_lines(ax, ceilings, xs)

    losses = sorted(table["loss_label"].unique())
    if ceilings.exp2_tops is not None:
        styles = [(0, (5, 2)), (0, (2, 2)), (0, (6, 2, 1, 2)), (0, (1, 1))]
        for k, label in enumerate(losses):
            part = table[table["loss_label"] == label]
            ratio = float((part["flops"] / part["transcendentals"]).median())
            roof = ceilings.exp2_tops * ratio  # Tops/s x flop per exp2 = TFLOP/s at which MUFU saturates
            x_mid = float(part["intensity"].median())
            ax.plot([x_mid / 3, x_mid * 3], [roof, roof], linestyle=styles[k % len(styles)], color="0.35",
                    linewidth=1.4, label=f"exp2 roof, {label}: {roof:,.1f} TFLOP/s")
            ax.scatter([x_mid * 3], [roof], marker=LOSS_MARKERS.get(label, "P"), s=18, color="0.35")

    variants = sorted(table["variant"].unique(), key=_variant_key)
    colors = {v: f"C{i % 10}" for i, v in enumerate(variants)}
    sources = list(dict.fromkeys(table[source_column].astype(str))) if source_column in table.columns else [""]
    for row in table.sort_values(["loss_label", "variant"], kind="mergesort").itertuples(index=False):
        source = str(getattr(row, source_column, "")) if source_column in table.columns else ""
        hollow = sources.index(source) > 0 if source in sources else False
        marker = LOSS_MARKERS.get(row.loss_label, "P")
        color = colors[row.variant]
        ax.scatter([row.intensity], [row.tflops], marker=marker, s=42, zorder=3,
                   facecolors="none" if hollow else color, edgecolors=color, linewidths=1.3)

    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(x_lo, x_hi)
    y_lo = min(float(table["tflops"].min()), x_lo * ceilings.dram_gbps / 1e3)
    y_hi = max(ceilings.fp32_tflops or 0, float(table["tflops"].max()))
    ax.set_ylim(y_lo / 1.5, y_hi * 2)
    ax.set_xlabel("arithmetic intensity (FP32 flop / minimum DRAM byte)")
    ax.set_ylabel("achieved FP32 rate (TFLOP/s)")
    ax.grid(True, which="major", linewidth=0.4, alpha=0.6)
    # Both legends beside the axes, not on them (the roofs run through every corner of a roofline). Variants are
    # colours (swatches), losses markers, sources filled or hollow: no marker stands for two things.
    from matplotlib.patches import Patch

    roof_legend = ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0,
                            title=f"roofs ({ceilings.source})", title_fontsize=7)
    ax.add_artist(roof_legend)
    handles = [Patch(color=colors[v], label=v) for v in variants]
    handles += [Line2D([], [], marker=LOSS_MARKERS.get(l, "P"), linestyle="", color="0.3", label=l) for l in losses]
    if len(sources) > 1:
        handles += [Patch(facecolor="0.3", edgecolor="0.3", label=sources[0]),
                    Patch(facecolor="none", edgecolor="0.3", label=" / ".join(sources[1:]))]
    ax.legend(handles=handles, fontsize=7, loc="lower left", bbox_to_anchor=(1.01, 0.0), borderaxespad=0.0, ncol=2)
    if title is not None:
        ax.set_title(title, fontsize=10)
    return ax


def plot_distance_to_floor(table: pd.DataFrame, ceilings: Ceilings, *, title: str | None = None):
    """% of copy bandwidth per (loss, variant), one panel per vocab; 100 % is the floor.

    Bars: rows of the first source in the frame (e.g. "benchmark"); black diamonds: rows of the
    other sources (e.g. "sweep best") at the same (loss, variant, vocab). Returns the Figure.
    """
    import matplotlib.pyplot as plt

    check_frame(table, ["variant", "loss_label", "vocab", "pct_of_copy"], "table")
    if table.empty:
        raise ValueError("table: no rows to plot")
    vocabs = sorted(int(v) for v in table["vocab"].unique())
    fig, axes = plt.subplots(1, len(vocabs), figsize=(4.2 * len(vocabs) + 1.5, 0.9 + 0.28 * max(4, len(
        table[["loss_label", "variant"]].drop_duplicates()))), sharey=True, squeeze=False)
    axes = list(axes[0])
    sources = list(dict.fromkeys(table["source"].astype(str))) if "source" in table.columns else [""]
    variants = sorted(table["variant"].unique(), key=_variant_key)
    colors = {v: f"C{i % 10}" for i, v in enumerate(variants)}
    keys = sorted({(l, v) for l, v in zip(table["loss_label"], table["variant"])},
                  key=lambda lv: (lv[0], _variant_key(lv[1])))
    ypos = {key: i for i, key in enumerate(keys)}
    for ax, vocab in zip(axes, vocabs):
        part = table[table["vocab"].astype(int) == vocab]
        for row in part.itertuples(index=False):
            source = str(getattr(row, "source", "")) if "source" in table.columns else ""
            y = ypos[(row.loss_label, row.variant)]
            if not sources or source == sources[0]:
                ax.barh(y, row.pct_of_copy, color=colors[row.variant], height=0.7)
            else:
                ax.scatter([row.pct_of_copy], [y], marker="D", s=22, facecolors="none", edgecolors="black", zorder=3)
        ax.axvline(100.0, color="black", linewidth=1.2)
        ax.text(101.5, (len(keys) - 1) / 2, f"floor: copy bandwidth {ceilings.dram_gbps:,.0f} GB/s", fontsize=7,
                rotation=90, va="center", ha="left")
        for i in range(1, len(keys)):
            if keys[i][0] != keys[i - 1][0]:
                ax.axhline(i - 0.5, color="0.6", linewidth=0.6)
        ax.set_xlim(0, max(108.0, 1.05 * float(table["pct_of_copy"].max())))
        ax.set_title(f"vocab {vocab:,}", fontsize=9)
        ax.set_xlabel("% of copy bandwidth (minimum bytes / time)")
        ax.grid(True, axis="x", linewidth=0.4, alpha=0.6)
    axes[0].set_yticks(range(len(keys)))
    axes[0].set_yticklabels([f"{l} · {v}" for l, v in keys], fontsize=7)
    axes[0].set_ylim(len(keys) - 0.4, -0.6)
    if len(sources) > 1:
        from matplotlib.lines import Line2D
        from matplotlib.patches import Patch

        axes[-1].legend(handles=[Patch(color="0.5", label=sources[0]),
                                 Line2D([], [], marker="D", linestyle="", markerfacecolor="none", color="black",
                                        label=" / ".join(sources[1:]))], fontsize=7, loc="lower right")
    if title is not None:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------------------------------
# A roofline of arbitrary points
# ------------------------------------------------------------------------------------------

def _points_with_rates(points_df: pd.DataFrame) -> pd.DataFrame:
    if not isinstance(points_df, pd.DataFrame):
        raise TypeError(f"points_df: expected a DataFrame, got {type(points_df).__name__}")
    df = points_df.copy()
    if "time_s" not in df.columns:
        for ms_column in ("ms_median", "ms"):
            if ms_column in df.columns:
                df["time_s"] = df[ms_column] / 1e3
                break
    missing = {"label", "flops", "bytes", "time_s"} - set(df.columns)
    if missing:
        raise ValueError(f"points_df: missing columns {sorted(missing)} (need label, flops, bytes "
                         "and time_s, ms_median or ms)")
    if (df["flops"] <= 0).any() or (df["bytes"] <= 0).any() or (df["time_s"] <= 0).any():
        raise ValueError("points_df: flops, bytes and time must be > 0 on a log-log roofline")
    df["intensity"] = df["flops"] / df["bytes"]
    df["tflops"] = df["flops"] / df["time_s"] / 1e12
    return df


def plot_roofline(ax, points_df: pd.DataFrame, ceilings: Ceilings, *, title: str | None = None):
    """Log-log roofline: FP32 TFLOP/s against flop/byte, memory roofs as slanted lines.

    ``points_df`` needs ``label, flops, bytes`` and ``time_s`` (or ``ms_median``/``ms``); with a
    ``transcendentals`` column each point also gets a short dashed mark at its own exp2 roof
    (MUFU rate x the point's flops per transcendental). Returns the axes.
    """
    import matplotlib.pyplot as plt  # lazy: importing perfutils must not pick a backend

    if not isinstance(ceilings, Ceilings):
        raise TypeError(f"ceilings: expected a Ceilings, got {type(ceilings).__name__}")
    points = _points_with_rates(points_df)
    if ax is None:
        _, ax = plt.subplots(figsize=(7.0, 4.8))

    compute = ceilings.fp32_tflops
    ridges = [compute * 1e3 / bw for _, bw, _ in _memory_roofs(ceilings)] if compute else []
    span = list(points["intensity"]) + ridges
    x_lo = 10 ** math.floor(math.log10(min(span)) - 1)
    x_hi = 10 ** math.ceil(math.log10(max(span)) + 1)
    xs = [x_lo * (x_hi / x_lo) ** (i / 200) for i in range(201)]
    _roof_lines(ax, ceilings, xs, linewidth=1.2)

    has_sfu = ceilings.exp2_tops is not None and "transcendentals" in points.columns
    sfu_labelled = False
    for i, row in enumerate(points.itertuples(index=False)):
        color = f"C{(i + 1) % 10}"
        ax.plot([row.intensity], [row.tflops], "o", color=color)
        # Staggered offsets keep labels of coinciding points apart (deterministically).
        ax.annotate(str(row.label), (row.intensity, row.tflops), textcoords="offset points",
                    xytext=(6, 6 - 11 * (i % 3)), fontsize=8)
        if has_sfu and row.transcendentals > 0:
            sfu_roof = ceilings.exp2_tops * row.flops / row.transcendentals
            ax.plot([row.intensity / 1.8, row.intensity * 1.8], [sfu_roof, sfu_roof], "--",
                    color=color, linewidth=1.5,
                    label=None if sfu_labelled else
                    f"exp2 roof per point ({ceilings.exp2_tops:,.2f} Tops/s)")
            sfu_labelled = True

    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(x_lo, x_hi)
    ax.set_xlabel("arithmetic intensity (FP32 flop / DRAM byte)")
    ax.set_ylabel("achieved FP32 rate (TFLOP/s)")
    gpu = ceilings.gpu or "unknown GPU"
    ax.set_title(title if title is not None else f"Roofline, {gpu} ({ceilings.source} ceilings)")
    ax.grid(True, which="major", linewidth=0.4, alpha=0.6)
    ax.legend(fontsize=8, loc="lower right")
    return ax
