"""torch.profiler's device events as a table: which GPU kernels one step runs, how often, for how long.

:func:`kernel_table` turns ``prof.key_averages()`` into one row per GPU kernel (memsets and copies marked),
per step; :func:`short_kernel_name` makes CUDA's templated names readable. Used by notebook 08's step
profile (:mod:`perfutils.studies.profiling`) and to count the kernels a call launches
(:class:`perfutils.measure.session.CudaBackend`).
"""

from __future__ import annotations

from typing import Any, Iterable

import pandas as pd

__all__ = ["short_kernel_name", "kernel_kind", "kernel_table"]


def short_kernel_name(name: str) -> str:
    """A readable kernel name: drop ``void``, namespaces, template arguments and parameter lists.

    ``"void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float>(float*, ...)"`` ->
    ``"cunn_SoftMaxForward"``; Triton kernels (plain names) are returned unchanged.
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    text = name.strip()
    if text.startswith("void "):
        text = text[5:]
    depth, cut = 0, []
    for ch in text:  # remove everything inside <...> and (...), nested
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth = max(0, depth - 1)
        elif depth == 0:
            cut.append(ch)
    text = "".join(cut).strip()
    if "::" in text:
        text = text.rsplit("::", 1)[-1]
    text = text.split()[-1] if text.split() else text
    return text or name.strip()


def kernel_kind(name: str) -> str:
    """``memset``, ``memcpy`` or ``kernel`` for a device event name from the profiler."""
    lowered = name.strip().lower()
    if lowered.startswith("memset"):
        return "memset"
    if lowered.startswith("memcpy"):
        return "memcpy"
    return "kernel"


def _is_device_event(event: Any) -> bool:
    device_type = getattr(event, "device_type", None)
    return device_type is not None and str(device_type).split(".")[-1].upper() == "CUDA"


def _device_us(event: Any) -> float | None:
    for name in ("device_time_total", "cuda_time_total", "self_device_time_total", "self_cuda_time_total"):
        value = getattr(event, name, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


def kernel_table(events: Iterable[Any], steps: int) -> pd.DataFrame:
    """GPU-side rows of ``prof.key_averages()`` as a table, per step.

    Columns: kernel (full name), short_name, kind (kernel | memset | memcpy), calls_per_step,
    us_per_step (device microseconds per step), pct_of_device (share of all device time), sorted by
    time. CPU-side operators (``aten::...``) are left out: their device time is the sum of the
    kernels listed here.
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps <= 0:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    rows = []
    for event in events:
        if not _is_device_event(event):
            continue
        us = _device_us(event)
        name = str(getattr(event, "key", "") or getattr(event, "name", ""))
        if us is None or not name:
            continue
        rows.append({"kernel": name, "short_name": short_kernel_name(name), "kind": kernel_kind(name),
                     "calls_per_step": float(getattr(event, "count", 0)) / steps, "us_per_step": us / steps})
    columns = ["kernel", "short_name", "kind", "calls_per_step", "us_per_step", "pct_of_device"]
    if not rows:
        return pd.DataFrame(columns=columns)
    table = pd.DataFrame(rows).groupby(["kernel", "short_name", "kind"], as_index=False).sum()
    total = table["us_per_step"].sum()
    table["pct_of_device"] = 100.0 * table["us_per_step"] / total if total > 0 else float("nan")
    return table.sort_values(["us_per_step", "kernel"], ascending=[False, True]).reset_index(drop=True)[columns]


# ================================================================================================
# One loss step per variant
