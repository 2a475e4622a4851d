"""What every figure shares: deterministic files (the same data gives byte-identical SVG and PNG files),
a caption naming the GPU and the date, the check that a frame has the columns a figure needs, and labels beside
points that never cover one another (:func:`label_points`)."""

from __future__ import annotations

from pathlib import Path

import math

import matplotlib
import matplotlib.ticker
import pandas as pd

from ..data.records import check_single_gpu

matplotlib.rcParams["svg.hashsalt"] = "fused-loss-notebooks"  # stable element ids in SVG


class SavedFigure(list):
    """The files :func:`save_figure` wrote (a list of paths). In a notebook the figure itself was shown: as the last
    expression of a cell this list displays nothing (a page shows figures, not the names of their files)."""

    def _ipython_display_(self) -> None:
        pass


def _in_notebook_kernel() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def save_figure(fig, path: str | Path, *, formats=("svg", "png"), dpi: int = 120, show: bool | None = None) -> SavedFigure:
    """Save ``fig`` as ``path`` with each suffix in ``formats``, without dates in the metadata.

    In a notebook (an IPython kernel: papermill, nbval, JupyterLab) the figure is also shown on the page, once,
    and closed; ``show`` forces or prevents that. Whatever the matplotlib backend: a figure saved is a figure shown.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    written = SavedFigure()
    for fmt in formats:
        target = path.with_suffix(f".{fmt}")
        metadata = {"Date": None} if fmt in ("svg", "pdf") else {"Software": None}
        fig.savefig(target, format=fmt, dpi=dpi, bbox_inches="tight", metadata=metadata)
        written.append(target)
    if _in_notebook_kernel() if show is None else show:
        import matplotlib.pyplot as plt
        from IPython.display import display

        display(fig)
        plt.close(fig)  # shown once: the inline backend would show an open figure again at the end of the cell
    return written


def check_frame(df, columns, name="df") -> None:
    """TypeError unless ``df`` is a DataFrame, ValueError naming the ``columns`` it lacks."""
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"{name}: expected a DataFrame, got {type(df).__name__}")
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(f"{name}: missing columns {missing}")


def caption(gpu_name: str | None, date: str | None, extra: str = "") -> str:
    """A title suffix naming where and when the data was measured (``date``: a time, or a range of days
    "YYYY-MM-DD to YYYY-MM-DD")."""
    when = (date if " to " in date else date[:10]) if date else None
    parts = [p for p in (gpu_name, f"measured {when}" if when else None, extra) if p]
    return " · ".join(parts)


def measured_days(df: pd.DataFrame) -> str | None:
    """The days the rows of ``df`` were measured (their ``timestamp_utc``): one day, or "first to last"."""
    if "timestamp_utc" not in df:
        return None
    days = sorted(str(stamp)[:10] for stamp in df["timestamp_utc"].dropna())
    if not days:
        return None
    return days[0] if days[0] == days[-1] else f"{days[0]} to {days[-1]}"


def figure_context(df: pd.DataFrame) -> tuple[str, float | None]:
    """(caption text, copy GB/s) of a loaded frame, from its rows (the days they were measured) and metadata
    sidecar (the sidecar's own time only where the rows carry none)."""
    gpu = check_single_gpu(df)
    meta = df.attrs.get("metadata") or {}
    date = measured_days(df) or meta.get("timestamp_utc")
    copy = meta.get("copy_gbps")
    return caption(gpu, date), (float(copy) if isinstance(copy, (int, float)) else None)


def label_points(ax, xs, ys, labels, *, fontsize: float = 6.0, offset=(4.0, 0.0), merge_px: float = 4.0,
                 pad_pt: float = 0.6, draw: bool = True, upward: bool = False, marker_pt: float = 6.0,
                 avoid=(), **text_kw) -> list:
    """Write ``labels`` beside their points (``offset`` in points, right of the point) so that no label covers
    another, a point (a marker of ``marker_pt`` points) or an artist of ``avoid`` (bars, say): the labels of points
    closer than ``merge_px`` pixels become one ("30 · 28"; a label repeated there is written once), and a label that
    would overlap moves up or down by whole label heights, with a thin line back to its point. Place the labels once
    the figure's layout is final (after ``tight_layout``): the layout moves points, and labels keep their offsets.
    ``draw=False`` skips drawing the figure first (a caller labelling several axes of one figure draws it once);
    ``upward`` moves labels only up (labels above bars, which a label moved down would cover). Returns the
    annotations."""
    fig = ax.figure
    if draw:
        fig.canvas.draw()  # positions and the renderer that measures text
    renderer = fig.canvas.get_renderer()
    groups: list[list] = []  # [display (x, y), data (x, y), labels]
    for x, y, label in zip(xs, ys, labels):
        if not label or x is None or y is None or not (math.isfinite(float(x)) and math.isfinite(float(y))):
            continue
        px, py = ax.transData.transform((float(x), float(y)))
        for group in groups:
            if abs(group[0][0] - px) <= merge_px and abs(group[0][1] - py) <= merge_px:
                if str(label) not in group[2]:
                    group[2].append(str(label))
                break
        else:
            groups.append([(px, py), (float(x), float(y)), [str(label)]])
    from matplotlib.transforms import Bbox

    points_to_px = fig.dpi / 72.0
    marker = marker_pt * points_to_px / 2  # the points themselves: no label covers a marker either
    placed = [Bbox.from_extents(px - marker, py - marker, px + marker, py + marker) for (px, py), *_ in groups]
    placed += [artist.get_window_extent(renderer) for artist in avoid]
    annotations = []
    for (px, py), (x, y), names in sorted(groups, key=lambda g: (-g[0][1], g[0][0])):
        text = " · ".join(names)
        probe = ax.annotate(text, (x, y), xytext=offset, textcoords="offset points", fontsize=fontsize,
                            va="center", **text_kw)
        box = probe.get_window_extent(renderer)
        probe.remove()
        step = box.height / points_to_px + pad_pt  # one label height, in points
        for k in range(0, 61):
            # 0, -h, +h, -2h, +2h, ... (upward: 0, +h, +2h, ...)
            dy = k * step if upward else (k + 1) // 2 * step * (-1 if k % 2 else 1)
            moved = box.translated(0, dy * points_to_px)
            if not any(moved.overlaps(other) for other in placed):
                break
        arrow = dict(arrowstyle="-", color="grey", linewidth=0.4, shrinkA=0, shrinkB=2) if dy else None
        annotations.append(ax.annotate(text, (x, y), xytext=(offset[0], offset[1] + dy), textcoords="offset points",
                                       fontsize=fontsize, va="center", arrowprops=arrow, **text_kw))
        placed.append(moved)
    return annotations


def plain_log_ticks(ax, axis: str = "y") -> None:
    """Decimal tick labels (0.5, 1, 2) on a log axis instead of powers of ten."""
    formatter = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
    target = ax.yaxis if axis == "y" else ax.xaxis
    target.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    target.set_major_formatter(formatter)
    target.set_minor_formatter(matplotlib.ticker.NullFormatter())
