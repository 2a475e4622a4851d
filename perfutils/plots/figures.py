"""What every figure shares: deterministic files (the same data gives byte-identical SVG and PNG files),
a caption naming the GPU and the date, and the check that a frame has the columns a figure needs."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import pandas as pd

from ..measure.records import check_single_gpu

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
