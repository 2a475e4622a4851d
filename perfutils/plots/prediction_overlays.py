"""The performance model's predictions drawn over other notebooks' measurements.

Notebook 01 draws the predicted time of every block size and warp count beside the measured points
(:func:`plot_sweep_prediction`) and says whether the model picks the fast configurations (:func:`pick_reading`);
notebook 03 places each point's prediction on the roofline beside the measured point (:func:`plot_roofline_predictions`,
:func:`roofline_prediction_reading`). Predictions come from :func:`perfutils.model.predict.check`, joined to the
recorded rows by :func:`with_predictions`.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter, ScalarFormatter

from ..model.predict import MIN_SWEEP
from .figures import check_frame
from .roofline import plot_roofline_points

__all__ = ["pick_reading", "plot_roofline_predictions", "plot_sweep_prediction", "roofline_prediction_reading",
           "with_predictions"]

_JOIN = ("study", "config_key")
_BESIDE = 1.06  # a predicted cross's offset in intensity from its measured point (a factor: the axis is log)


def with_predictions(rows: pd.DataFrame, checked: pd.DataFrame) -> pd.DataFrame:
    """``rows`` (recorded rows with ``study`` and ``config_key``) with the model's ``predicted_ms``, ``bound`` and
    ``abs_rel_err`` from a :func:`~perfutils.model.predict.check` frame; rows the model does not describe (the
    baselines without compile counts) get NaN."""
    check_frame(rows, _JOIN, "rows")
    check_frame(checked, (*_JOIN, "predicted_ms", "bound", "abs_rel_err"), "checked")
    if checked.duplicated(list(_JOIN)).any():
        raise ValueError("checked: a configuration appears twice; join on a study whose keys are unique")
    model = checked[[*_JOIN, "predicted_ms", "bound", "abs_rel_err"]]
    return rows.drop(columns=[c for c in ("predicted_ms", "bound", "abs_rel_err") if c in rows.columns]).merge(
        model, on=list(_JOIN), how="left", validate="many_to_one")


def plot_sweep_prediction(frame: pd.DataFrame, *, x: str = "block_size", hue: str = "num_warps",
                          row: str = "loss", col: str = "vocab", title: str = "") -> plt.Figure:
    """Measured time (points) and the model's predicted time (lines) over ``x`` (log2), one colour per ``hue``,
    one panel per (``row``, ``col``). ``frame``: the sweep's rows with ``ms_median`` and ``predicted_ms``."""
    check_frame(frame, (x, hue, row, col, "ms_median", "predicted_ms"), "frame")
    frame = frame[frame["ms_median"].notna() & frame["predicted_ms"].notna()]
    if frame.empty:
        raise ValueError("frame: no row has both a measured and a predicted time")
    rows, cols = sorted(frame[row].unique()), sorted(frame[col].unique())
    hues = sorted(frame[hue].unique())
    cmap = plt.get_cmap("viridis")
    colors = {h: cmap(i / max(1, len(hues) - 1)) for i, h in enumerate(hues)}
    fig, axes = plt.subplots(len(rows), len(cols), figsize=(3.6 * len(cols), 2.7 * len(rows)), squeeze=False)
    for i, r in enumerate(rows):
        for j, c in enumerate(cols):
            ax = axes[i][j]
            panel = frame[(frame[row] == r) & (frame[col] == c)]
            for h in hues:
                part = panel[panel[hue] == h].sort_values(x)
                if part.empty:
                    continue
                ax.plot(part[x], part["predicted_ms"], color=colors[h], lw=1.4)
                ax.plot(part[x], part["ms_median"], "o", color=colors[h], ms=4)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
            ax.yaxis.set_minor_formatter(NullFormatter())
            ax.set_title(f"{r} · {col} {c}", fontsize=9)
            ax.grid(True, which="both", lw=0.3, alpha=0.5)
            if i == len(rows) - 1:
                ax.set_xlabel(x.replace("_", " "))
            if j == 0:
                ax.set_ylabel("time (ms)")
    handles = [Line2D([], [], color=colors[h], lw=1.4, label=f"{hue.replace('_', ' ')} {h}") for h in hues]
    handles += [Line2D([], [], color="0.3", lw=1.4, label="predicted (model)"),
                Line2D([], [], color="0.3", marker="o", ls="", label="measured")]
    fig.legend(handles=handles, loc="upper center", ncol=len(handles), fontsize=8, frameon=False,
               bbox_to_anchor=(0.5, 1.0))
    fig.suptitle("Predicted (lines) beside measured (points)" + (f" · {title}" if title else ""), fontsize=10,
                 y=1.04)
    fig.tight_layout()
    return fig


def _picks(frame: pd.DataFrame, by) -> pd.DataFrame:
    rows = []
    for key, part in frame.groupby(list(by)):
        part = part[part["ms_median"].notna() & part["predicted_ms"].notna()]
        if len(part) < 2:
            continue
        pick = part.loc[part["predicted_ms"].idxmin()]
        best = part["ms_median"].min()
        rows.append(dict(zip(by, key if isinstance(key, tuple) else (key,)), n=len(part),
                         regret=float(pick["ms_median"] / best - 1)))
    return pd.DataFrame(rows)


def pick_reading(frame: pd.DataFrame, by=("loss", "target_format", "vocab", "variant")) -> str:
    """What the model's choice is worth in a sweep: at how many shapes (``by``) its fastest predicted configuration
    is the measured fastest, how much slower its pick is where not, the median Spearman rank correlation of the
    shapes and the median error. ``frame`` as for :func:`plot_sweep_prediction`, with ``abs_rel_err``."""
    check_frame(frame, (*by, "ms_median", "predicted_ms", "abs_rel_err"), "frame")
    picks = _picks(frame, by)
    if picks.empty:
        return "No shape has two configurations with a measured and a predicted time."
    rhos = [part["ms_median"].rank().corr(part["predicted_ms"].rank())
            for _, part in frame.groupby(list(by)) if len(part) >= MIN_SWEEP]
    rhos = [r for r in rhos if np.isfinite(r)]
    hits = int((picks["regret"] <= 1e-12).sum())
    worst = picks.loc[picks["regret"].idxmax()]
    text = (f"Over {len(picks)} shapes ({', '.join(by)}) the model's fastest configuration is the measured fastest "
            f"at {hits}")
    if hits < len(picks):
        where = ", ".join(f"{worst[k]}" for k in by)
        text += (f"; elsewhere its pick is at most {100 * worst['regret']:.1f}% slower than the best measured "
                 f"({where}), median {100 * picks.loc[picks['regret'] > 0, 'regret'].median():.1f}%")
    text += (f". Inside each shape the predicted order follows the measured one with a median Spearman rank "
             f"correlation of {np.median(rhos):.2f}" if rhos else "")
    text += (f"; the predicted time is off by a median {100 * frame['abs_rel_err'].median():.1f}% "
             f"(90th percentile {100 * frame['abs_rel_err'].quantile(0.9):.1f}%) over {int(frame['abs_rel_err'].notna().sum())} "
             "configurations.")
    return text


def plot_roofline_predictions(table: pd.DataFrame, ceilings, *, title: str | None = None, ax=None):
    """The roofline of :func:`perfutils.plots.roofline.plot_roofline_points` with each point's prediction drawn as a
    cross at the rate its predicted time gives (same intensity: the model moves no byte count), joined to the
    measured point by a thin line. ``table``: a roofline table with ``predicted_ms``; rows without one are drawn as
    measured only. Returns the Axes."""
    check_frame(table, ("intensity", "tflops", "flops", "predicted_ms", "variant"), "table")
    ax = plot_roofline_points(table, ceilings, title=title, ax=ax)
    predicted = table[table["predicted_ms"].notna()]
    tflops = predicted["flops"] / (predicted["predicted_ms"] * 1e-3) / 1e12
    # the colours plot_roofline_points gave the variants, read back from its legend swatches
    colors = {h.get_label(): h.get_facecolor() for h in ax.get_legend().legend_handles if hasattr(h, "get_facecolor")}
    for (x, y_meas, y_pred, variant) in zip(predicted["intensity"], predicted["tflops"], tflops, predicted["variant"]):
        color = colors.get(variant, "0.2")
        # the cross sits just right of its column (same intensity: the model moves no byte count)
        ax.plot([x, x * _BESIDE], [y_meas, y_pred], color=color, lw=0.7, alpha=0.6, zorder=2)
        ax.scatter([x * _BESIDE], [y_pred], marker="x", s=30, color=color, zorder=4)
    # zoomed on the points: at full scale the points of one loss are one column and the crosses hide behind them
    rates = pd.concat([predicted["tflops"], tflops])  # the baselines without a prediction may fall below
    ax.set_xlim(table["intensity"].min() / 1.3, table["intensity"].max() * 1.3)
    ax.set_ylim(rates.min() / 1.4, rates.max() * 1.6)
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(ScalarFormatter())
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_minor_formatter(ScalarFormatter())
    ax.tick_params(which="minor", labelsize=7)
    ax.text(0.99, 0.01, "× the model's prediction, joined to its measured point by a line",
            transform=ax.transAxes, ha="right", va="bottom", fontsize=8)  # the roofs run through the upper left
    return ax


def roofline_prediction_reading(table: pd.DataFrame) -> str:
    """One paragraph: how many roofline points the model predicts, their median error, the worst one and the bounds
    the model names (a roofline names DRAM for all of them)."""
    check_frame(table, ("predicted_ms", "time_us", "bound", "variant", "loss_label", "vocab"), "table")
    done = table[table["predicted_ms"].notna()].copy()
    if done.empty:
        return "The model describes none of these points (no compile counts recorded)."
    done["err"] = (done["predicted_ms"] * 1e3 / done["time_us"] - 1)
    worst = done.loc[done["err"].abs().idxmax()]
    skipped = sorted(table.loc[table["predicted_ms"].isna(), "variant"].unique())
    bounds = done["bound"].value_counts()
    text = (f"The model predicts {len(done)} of the {len(table)} points (median error "
            f"{100 * done['err'].abs().median():.1f}%); the farthest is {worst['variant']} "
            f"{worst['loss_label']} vocab {worst['vocab']}, predicted {100 * worst['err']:+.0f}%. "
            "The limit the model names: " + ", ".join(f"{b} at {n}" for b, n in bounds.items())
            + " (its other terms — re-reads, L2, latency — set how far under the roof each point sits).")
    if skipped:
        text += f" Not predicted (no compile counts recorded): {', '.join(skipped)}."
    return text
