"""Register-pressure figures and the frames behind them: analytic estimate vs compiler vs GPU.

Each is a function of recorded or computed DataFrames; the offline sm_90 counts they draw come from
:mod:`perfutils.model.offline_counts` (which compiles; figures never do).

* :func:`with_estimates` adds the analytic estimate (:func:`perfutils.model.register_estimate.predict_spill`)
  and what the compiler's numbers imply (register *demand* = ``n_regs + spill_bytes / 4``).
* :func:`compare_offline_measured` lines offline counts up against a GPU sweep's.
* :func:`spill_onset` finds the smallest block size that spills, per loss and ``num_warps``.
* :func:`plot_register_pressure` draws registers per thread against block size, one panel per
  (loss, num_warps), with the estimate, the per-thread cap and the spilling configurations.
* :func:`label_index_effect` reads the recorded effect of the change on labels CE (the vocab sweep before and after).
"""

from __future__ import annotations

import math

import pandas as pd

from ..model.register_estimate import DEFAULT_OVERHEAD, predict_spill, register_cap, values_per_thread
from .figures import check_frame

__all__ = [
    "CONFIG_KEYS",
    "with_estimates",
    "compare_offline_measured",
    "spill_onset",
    "plot_register_pressure",
    "label_index_effect",
]

CONFIG_KEYS = ("loss", "target_format", "variant", "vocab", "block_size", "num_warps")


def with_estimates(df: pd.DataFrame, live_tiles: dict, overhead: int = DEFAULT_OVERHEAD) -> pd.DataFrame:
    """Add the analytic estimate and what the measured counts imply.

    ``live_tiles`` maps ``"loss/target_format"`` to the number of BLOCK_SIZE-wide fp32 tiles
    assumed alive at once. New columns: ``values_per_thread``, ``cap`` (registers/thread ptxas may
    use), ``estimate``, ``predicted_spill``, ``demand`` (``n_regs + ceil(spill_bytes / 4)``: the
    registers the kernel would have liked), ``spills`` and ``implied_tiles``
    (``(demand - overhead) / values_per_thread``: the live tiles the compiler's count corresponds to).
    """
    check_frame(df, ["loss", "target_format", "block_size", "num_warps", "n_regs", "spill_bytes"])
    if not isinstance(live_tiles, dict):
        raise TypeError("live_tiles: expected a dict like {'cross_entropy/labels': 2}, "
                        f"got {type(live_tiles).__name__}")
    out = df.copy()
    labels = out["loss"].astype(str) + "/" + out["target_format"].astype(str)
    unknown = sorted(set(labels) - set(live_tiles))
    if unknown:
        raise ValueError(f"live_tiles: no entry for {unknown}; have {sorted(live_tiles)}")
    out["loss_label"] = labels
    predictions = [predict_spill(int(b), int(w), live_tiles[l], overhead)
                   for b, w, l in zip(out["block_size"], out["num_warps"], labels)]
    out["values_per_thread"] = [p.values_per_thread for p in predictions]
    out["cap"] = [p.cap for p in predictions]
    out["estimate"] = [p.estimate for p in predictions]
    out["predicted_spill"] = [p.spills for p in predictions]
    n_regs = pd.to_numeric(out["n_regs"], errors="coerce")
    spill = pd.to_numeric(out["spill_bytes"], errors="coerce")
    out["demand"] = n_regs + (spill / 4).apply(lambda v: math.ceil(v) if pd.notna(v) else v)
    out["spills"] = spill > 0
    out["implied_tiles"] = (out["demand"] - overhead) / out["values_per_thread"]
    return out


def compare_offline_measured(offline: pd.DataFrame, measured: pd.DataFrame, *, on=CONFIG_KEYS,
                             measured_name: str = "h100") -> pd.DataFrame:
    """Offline ``n_regs``/``spill_bytes``/``shared_bytes`` beside a GPU sweep's, per configuration.

    Keeps offline rows with ``status == "ok"`` and measured rows that have an ``n_regs``; columns
    ``<x>_offline`` and ``<x>_<measured_name>``, ``match`` (same registers and same local-memory frame)
    and ``shared_diff`` (offline minus measured shared bytes). Shared memory is not part of ``match``:
    the offline count is ``metadata.shared`` plus the cubin's static shared memory as cuobjdump reports
    it, while a GPU run records Triton's ``metadata.shared`` (dynamic shared memory) alone."""
    on = list(on)
    counts = ["n_regs", "spill_bytes", "shared_bytes"]
    check_frame(offline, on + counts, "offline")
    check_frame(measured, on + counts, "measured")
    left = offline[offline["status"] == "ok"] if "status" in offline.columns else offline
    right = measured.dropna(subset=["n_regs"])
    left = left[on + counts].drop_duplicates(subset=on)
    right = right[on + counts].drop_duplicates(subset=on)
    for frame in (left, right):
        for column in ("vocab", "block_size", "num_warps"):
            if column in frame.columns:
                frame[column] = frame[column].astype("int64")
    merged = left.merge(right, on=on, how="inner", suffixes=("_offline", f"_{measured_name}"))
    for column in counts:
        merged[f"{column}_offline"] = merged[f"{column}_offline"].astype("int64")
        merged[f"{column}_{measured_name}"] = merged[f"{column}_{measured_name}"].astype("int64")
    merged["match"] = (
        (merged["n_regs_offline"] == merged[f"n_regs_{measured_name}"])
        & (merged["spill_bytes_offline"] == merged[f"spill_bytes_{measured_name}"])
    )
    merged["shared_diff"] = merged["shared_bytes_offline"] - merged[f"shared_bytes_{measured_name}"]
    return merged.sort_values(on, kind="mergesort").reset_index(drop=True)


def spill_onset(df: pd.DataFrame, *, by=("loss", "target_format", "variant", "vocab", "num_warps"),
                value: str = "spill_bytes") -> pd.DataFrame:
    """Smallest ``block_size`` whose ``value`` (> 0 means spilling) is positive, per group.

    Columns: the group, ``first_spilling_block`` (None when nothing in the group spills),
    ``largest_clean_block`` (largest block size below it, or the largest tried when none spills)
    and ``spill_bytes_there``."""
    by = list(by)
    check_frame(df, by + ["block_size", value])
    rows = []
    data = df.dropna(subset=[value, "block_size"])
    for key, part in data.groupby(by, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        part = part.sort_values("block_size")
        spilling = part[part[value] > 0]
        first = int(spilling["block_size"].iloc[0]) if len(spilling) else None
        clean = part[part["block_size"] < first] if first is not None else part
        clean = clean[clean[value] <= 0]
        rows.append({**dict(zip(by, key)),
                     "first_spilling_block": first,
                     "largest_clean_block": int(clean["block_size"].max()) if len(clean) else None,
                     "spill_bytes_there": int(spilling[value].iloc[0]) if len(spilling) else 0})
    out = pd.DataFrame(rows)
    for column in ("first_spilling_block", "largest_clean_block"):
        if column in out.columns:
            out[column] = out[column].astype("Int64")
    return out


def plot_register_pressure(df: pd.DataFrame, *, live_tiles: dict, overhead: int = DEFAULT_OVERHEAD,
                           title: str | None = None, source_column: str = "source"):
    """Registers per thread against block size: rows = loss, columns = ``num_warps``.

    ``df`` holds ``loss, target_format, block_size, num_warps, n_regs, spill_bytes`` and a
    ``source`` column (e.g. "H100 sweep", "offline sm_90"); each source gets its own marker. The
    dashed line is the analytic estimate (``live_tiles`` per loss, ``overhead``), the dotted line
    the cap ptxas works under; red triangles mark the *demand* (n_regs + spilled words) of every
    spilling configuration. Returns the Figure.
    """
    import matplotlib
    import matplotlib.pyplot as plt
    import matplotlib.ticker  # noqa: F401 - used through matplotlib.ticker
    from matplotlib.lines import Line2D

    check_frame(df, ["loss", "target_format", "block_size", "num_warps", "n_regs", "spill_bytes"])
    data = df.dropna(subset=["n_regs", "block_size", "num_warps"]).copy()
    if data.empty:
        raise ValueError("df: no row with n_regs, block_size and num_warps")
    if source_column not in data.columns:
        data[source_column] = "measured"
    data["loss_label"] = data["loss"].astype(str) + "/" + data["target_format"].astype(str)
    data["block_size"] = data["block_size"].astype(int)
    data["num_warps"] = data["num_warps"].astype(int)
    losses = sorted(data["loss_label"].unique())
    warps = sorted(int(w) for w in data["num_warps"].unique())
    blocks = sorted(int(b) for b in data["block_size"].unique())
    sources = list(dict.fromkeys(data[source_column].astype(str)))
    markers = ["o", "x", "s", "^"]
    fig, axes = plt.subplots(len(losses), len(warps), figsize=(3.0 * len(warps) + 0.8, 2.5 * len(losses) + 0.9),
                             sharex=True, sharey=True, squeeze=False)
    y_top = 10
    for i, label in enumerate(losses):
        for j, w in enumerate(warps):
            ax = axes[i][j]
            part = data[(data["loss_label"] == label) & (data["num_warps"] == w)]
            if label in live_tiles:
                est = [math.ceil(live_tiles[label] * values_per_thread(b, w) + overhead) for b in blocks]
                ax.plot(blocks, est, "--", color="0.4", linewidth=1.0)
                y_top = max(y_top, min(max(est), 1024))
            ax.axhline(register_cap(w), linestyle=":", color="tab:red", linewidth=1.0)
            for k, source in enumerate(sources):
                sel = part[part[source_column].astype(str) == source].sort_values("block_size")
                if sel.empty:
                    continue
                ax.plot(sel["block_size"], sel["n_regs"].astype(int), marker=markers[k % len(markers)],
                        linestyle="-" if k == 0 else "none", color=f"C{k}", markersize=5, linewidth=0.9)
                spill = sel[sel["spill_bytes"].fillna(0) > 0]
                if len(spill):
                    demand = spill["n_regs"].astype(int) + (spill["spill_bytes"].astype(float) / 4).apply(math.ceil)
                    ax.scatter(spill["block_size"], demand, marker="^", color="tab:red", s=28, zorder=3)
                    y_top = max(y_top, min(int(demand.max()), 2048))
            ax.set_xscale("log", base=2)
            ax.grid(True, linewidth=0.4, alpha=0.6)
            if i == 0:
                ax.set_title(f"{w} warps ({32 * w} threads)", fontsize=9)
            if j == 0:
                ax.set_ylabel(f"{label}\nregisters / thread", fontsize=8)
            if i == len(losses) - 1:
                ax.set_xlabel("BLOCK_SIZE (elements)", fontsize=8)
    y_low = 2 ** math.floor(math.log2(max(1, int(data["n_regs"].min()) / 1.5)))
    for row in axes:
        for ax in row:
            ax.set_yscale("log", base=2)
            y_high = 2 ** math.ceil(math.log2(y_top * 1.1))
            ax.set_ylim(y_low, y_high)
            ticks = [2 ** k for k in range(int(math.log2(y_low)), int(math.log2(y_high)) + 1)]
            ax.set_yticks(ticks)
            ax.yaxis.set_minor_locator(matplotlib.ticker.NullLocator())
            ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
            ax.set_xticks(blocks)
            ax.set_xticklabels([f"{b // 1024}K" if b >= 1024 else str(b) for b in blocks], fontsize=7)
    handles = [Line2D([], [], marker=markers[k % len(markers)], color=f"C{k}", linestyle="-" if k == 0 else "none",
                      label=f"n_regs, {s}") for k, s in enumerate(sources)]
    handles += [
        Line2D([], [], linestyle="--", color="0.4", label=f"estimate (live tiles x values/thread + {overhead})"),
        Line2D([], [], linestyle=":", color="tab:red", label="cap: registers/thread ptxas may use"),
        Line2D([], [], marker="^", linestyle="none", color="tab:red", label="demand when spilling (n_regs + spill/4)"),
    ]
    fig.legend(handles=handles, loc="lower center", ncol=3, fontsize=8, bbox_to_anchor=(0.5, -0.01))
    if title is not None:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig


def label_index_effect(before: pd.DataFrame, after: pd.DataFrame, *, tokens: int = 4096,
                       vocabs=(32000, 50257, 50304, 100277)) -> pd.DataFrame:
    """Labels CE's public call, % of copy bandwidth, in two recordings of the vocab sweep (before and after a
    change), bf16, at ``tokens`` and ``vocabs``."""
    def pick(frame):
        check_frame(frame, ["target_format", "variant", "dtype", "tokens", "vocab", "pct_of_copy"])
        keep = ((frame["target_format"] == "labels") & (frame["variant"] == "public") & (frame["dtype"] == "bf16")
                & (frame["tokens"] == tokens) & frame["vocab"].isin(list(vocabs)))
        return frame[keep].set_index("vocab")["pct_of_copy"]

    table = pd.DataFrame({"before": pick(before), "after": pick(after)}).round(1)
    table["gain (points)"] = (table["after"] - table["before"]).round(1)
    return table
