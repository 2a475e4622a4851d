"""The learning path's figure (notebook 12): each step's recorded time beside the model's predicted time."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from .figures import check_frame, plain_log_ticks

__all__ = ["plot_path"]

COLUMNS = ("order", "title", "side", "recorded_ms", "predicted_ms", "floor_ms", "vocab", "loss")


def _label(row) -> str:
    shape = f"{row.loss}, V={int(row.vocab)}" if isinstance(row.loss, str) else "no recorded row"
    return f"{int(row.order)}. {row.title}\n({shape})"


def plot_path(frame: pd.DataFrame, *, title: str = ""):
    """One row per step (its ``after`` side of :func:`perfutils.learning_path.path_frame`): the recorded and the
    predicted time (ms, log scale) as two bars, the byte floor at copy bandwidth as a tick. A step with no recorded
    row keeps its place, empty."""
    check_frame(frame, COLUMNS, "frame")
    steps = frame[frame["side"] == "after"].sort_values("order")
    y = np.arange(len(steps))[::-1]
    fig, ax = plt.subplots(figsize=(9, 0.55 * len(steps) + 1.4))
    height = 0.38
    ax.barh(y + height / 2, steps["recorded_ms"].fillna(0), height, color="#1f5fa8", label="recorded (H100)")
    ax.barh(y - height / 2, steps["predicted_ms"].fillna(0), height, color="#e39b3a", label="predicted (model)")
    ax.scatter(steps["floor_ms"], y, marker="|", s=260, color="black", zorder=3, label="bytes at copy bandwidth")
    ax.set_yticks(y, [_label(r) for r in steps.itertuples()], fontsize=8)
    ax.set_xscale("log")
    plain_log_ticks(ax, "x")  # 0.2, 0.5, 1, 2 ms: powers-of-ten labels of the minor ticks overlapped
    ax.set_xlabel("time per call, fwd+bwd (ms, log scale)")
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(axis="x", which="both", alpha=0.3)
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return fig
