"""What every figure shares: deterministic files (the same data gives byte-identical SVG and PNG files),
a caption naming the GPU and the date, and the check that a frame has the columns a figure needs."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import pandas as pd

from ..measure.records import check_single_gpu

matplotlib.rcParams["svg.hashsalt"] = "fused-loss-notebooks"  # stable element ids in SVG


def save_figure(fig, path: str | Path, *, formats=("svg", "png"), dpi: int = 120) -> list[Path]:
    """Save ``fig`` as ``path`` with each suffix in ``formats``, without dates in the metadata."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    written = []
    for fmt in formats:
        target = path.with_suffix(f".{fmt}")
        metadata = {"Date": None} if fmt in ("svg", "pdf") else {"Software": None}
        fig.savefig(target, format=fmt, dpi=dpi, bbox_inches="tight", metadata=metadata)
        written.append(target)
    return written


def check_frame(df, columns, name="df") -> None:
    """TypeError unless ``df`` is a DataFrame, ValueError naming the ``columns`` it lacks."""
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"{name}: expected a DataFrame, got {type(df).__name__}")
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(f"{name}: missing columns {missing}")


def caption(gpu_name: str | None, date: str | None, extra: str = "") -> str:
    """A title suffix naming where and when the data was measured."""
    parts = [p for p in (gpu_name, f"measured {date[:10]}" if date else None, extra) if p]
    return " · ".join(parts)


def figure_context(df: pd.DataFrame) -> tuple[str, float | None]:
    """(caption text, copy GB/s) of a loaded frame, from its rows and metadata sidecar."""
    gpu = check_single_gpu(df)
    meta = df.attrs.get("metadata") or {}
    date = meta.get("timestamp_utc") or (str(df["timestamp_utc"].dropna().min()) if "timestamp_utc" in df else None)
    copy = meta.get("copy_gbps")
    return caption(gpu, date), (float(copy) if isinstance(copy, (int, float)) else None)
