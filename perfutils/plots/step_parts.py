"""The lagged split-row step taken apart (issue 39's runs AE-AH): an exploration log's plans timed with parts of the
step taken away (a record's ``ablate`` bits: 1 the poll never waits, 2 no summaries read, 4 no second read; timing
only, their results are wrong by design), the best configuration of each part per cell beside a plain stream of the
same bytes, a figure and a sentence. Inputs are the log's JSON records (``perfutils.data.records.exploration_records``).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from .vocab_sweep import loss_label

# The parts of run AE, in the order a reader takes them away, and their colours
PARTS = {0: "whole step", 1: "no wait for a peer", 4: "no second read", 2: "no summaries read", 6: "neither read",
         "stream": "plain stream"}
COLOURS = {0: "#1f4e9c", 1: "#7fa7d9", 4: "#f28e2b", 2: "#d1495b", 6: "#2e933c", "stream": "#555555"}


def step_parts(records) -> pd.DataFrame:
    """Per cell (loss, target format, vocab) and part (:data:`PARTS`), the best configuration's % of copy (mean over
    the passes of the log), the configuration, and the part's name; the plain stream's rows (``cfg`` "stream...", which
    name no target format: the plans' of their loss and vocab) as part "stream"."""
    rows = []
    for record in records:
        if "pct" not in record:  # a plan that failed
            continue
        stream = record["cfg"].startswith("stream")
        rows.append({"loss": record["loss"], "target_format": record.get("fmt"), "vocab": int(record["vocab"]),
                     "config": record["cfg"], "part": "stream" if stream else record.get("ablate", 0),
                     "pct": float(record["pct"])})
    columns = ["loss", "target_format", "vocab", "part", "name", "config", "pct"]
    if not rows:
        return pd.DataFrame(columns=columns)
    frame = pd.DataFrame(rows)
    formats = frame.dropna(subset=["target_format"]).groupby(["loss", "vocab"])["target_format"].agg(set)
    if (formats.map(len) > 1).any():
        raise ValueError("records hold two target formats of one loss and vocab: their streams cannot be told apart")
    frame["target_format"] = [fmt if isinstance(fmt, str) else next(iter(formats.get((loss, vocab), {None})))
                              for loss, vocab, fmt in zip(frame["loss"], frame["vocab"], frame["target_format"])]
    unknown = set(frame["part"]) - set(PARTS)
    if unknown:
        raise ValueError(f"records hold parts {sorted(map(str, unknown))} that step_parts does not know")
    keys = ["loss", "target_format", "vocab", "part"]
    means = frame.groupby(keys + ["config"], sort=False, dropna=False)["pct"].mean().reset_index()
    best = means.loc[means.groupby(keys, sort=False, dropna=False)["pct"].idxmax()]
    best = best.assign(name=best["part"].map(PARTS))
    order = {part: i for i, part in enumerate(PARTS)}
    best = best.assign(_order=best["part"].map(order)).sort_values(["loss", "vocab", "_order"])
    return best[columns].reset_index(drop=True)


def parts_table(parts: pd.DataFrame) -> pd.DataFrame:
    """One row per cell, one column per part (% of copy): the figure's numbers."""
    table = parts.pivot_table(index=["loss", "target_format", "vocab"], columns="name", values="pct", sort=False)
    table = table[[name for name in PARTS.values() if name in table.columns]].reset_index()
    table.columns.name = None  # the pivot's "name" is no column of the page's table
    return table


def plot_step_parts(parts: pd.DataFrame, *, title: str = "") -> plt.Figure:
    """Horizontal bars per cell, one per part (:func:`step_parts`), the plain stream as a black tick."""
    if parts.empty:
        raise ValueError("parts: no record")
    cells = list(dict.fromkeys(zip(parts["loss"], parts["target_format"], parts["vocab"])))
    shown = [part for part in PARTS if part != "stream" and part in set(parts["part"])]
    fig, ax = plt.subplots(figsize=(11, 0.9 + 0.75 * len(cells)))
    height = 0.8 / len(shown)
    for k, part in enumerate(shown):
        values = [parts[(parts["loss"] == loss) & (parts["target_format"] == fmt) & (parts["vocab"] == vocab)
                        & (parts["part"] == part)]["pct"] for loss, fmt, vocab in cells]
        y = np.arange(len(cells)) + (k - (len(shown) - 1) / 2) * height
        ax.barh(y, [v.iloc[0] if len(v) else np.nan for v in values], height=height * 0.92, color=COLOURS[part],
                label=PARTS[part])
    streams = parts[parts["part"] == "stream"].set_index(["loss", "target_format", "vocab"])["pct"]
    for i, cell in enumerate(cells):
        if cell in streams.index:
            ax.plot([streams[cell]] * 2, [i - 0.45, i + 0.45], color="black", lw=2)
    ax.plot([], [], color="black", lw=2, label=PARTS["stream"])
    ax.set_yticks(np.arange(len(cells)), [f"{loss_label(loss, fmt)}\n{vocab} columns" for loss, fmt, vocab in cells])
    ax.invert_yaxis()
    ax.set_xlabel("% of copy bandwidth (best configuration of each part)")
    low = np.nanmin(parts["pct"]) - 10
    ax.set_xlim(max(0, low), 105)
    ax.grid(True, axis="x", lw=0.3, alpha=0.5)
    ax.legend(fontsize=8, frameon=False, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.set_title("The lagged step taken apart" + (f" · {title}" if title else ""), fontsize=10)
    fig.tight_layout()
    return fig


def parts_reading(parts: pd.DataFrame, distribution=("forward_kl", "reverse_kl")) -> str:
    """What taking each part away gave the distribution losses (points of copy over the whole step, least to most
    over the cells), and what is left with neither read against the plain stream."""
    table = parts.pivot_table(index=["loss", "target_format", "vocab"], columns="part", values="pct")
    table = table[table.index.get_level_values("loss").isin(distribution)]
    if table.empty or 0 not in table.columns:
        return "No distribution-loss cell with the whole step in these records."
    gains = []
    for part in (1, 4, 2):
        if part in table.columns:
            gain = table[part] - table[0]
            gains.append(f"{PARTS[part]} {gain.min():+.1f} to {gain.max():+.1f}")
    text = ("Over the whole step, the distribution losses gain (points of copy bandwidth): " + "; ".join(gains) + ".")
    if 6 in table.columns and "stream" in table.columns:
        worst = table[6].idxmin()
        text += (f" With neither read, {loss_label(worst[0], worst[1])} at {worst[2]} columns still runs at "
                 f"{table.loc[worst, 6]:.1f}% of copy, where a plain stream of the same bytes runs at "
                 f"{table.loc[worst, 'stream']:.1f}%.")
    return text
