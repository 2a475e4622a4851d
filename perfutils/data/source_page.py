"""Nsight Compute's source page as recorded, and the loops of an instruction listing.

``ncu --import REPORT --page source --csv --print-source sass`` prints, for each profiled launch, a block that starts
with a ``"Kernel Name","<name>",`` line, then one CSV row per SASS instruction: its address, its text, how often the
warps executed it and where the sampler found them stalled on it (``stall_long_sb``: a global or local load's data,
``stall_barrier``, ``stall_wait``: a fixed-latency dependency, ``stall_short_sb``: MUFU or shared memory, ...).
:func:`parse_source_page` reads those blocks; :func:`step_profile` reads one persistent kernel's step out of it: how
many instructions a warp executes a step, how often a loop nested in the step (a poll) ran again, and where the
warps waited, as shares of all samples.
"""

from __future__ import annotations

import gzip
import io
import os
import re
from pathlib import Path

import numpy as np
import pandas as pd

__all__ = ["loop_spans", "step_loops", "parse_source_page", "read_source_page", "step_profile", "STALLS"]

# The stall reasons step_profile reports on their own (the rest are summed as "other").
STALLS = ("long_sb", "barrier", "wait", "short_sb", "math", "mio", "branch_resolving", "not_selected", "selected")
_KERNEL = re.compile(r'^"Kernel Name","(?P<name>[^"]*)"')
_ADDRESS_BRANCH = re.compile(r"\bBRA(?:\.[A-Z0-9_]+)*\s+(0x[0-9a-fA-F]+)")


def loop_spans(targets) -> list[tuple[int, int]]:
    """The loops of an instruction list: ``targets`` holds, per instruction, the index its branch jumps to (None when
    it does not branch). A branch to itself or to an earlier instruction closes a loop: ``(first, last)`` indices,
    in the order the branches appear. Read this way: nvdisasm's listing (``perfutils.model.cubin.sass_loops``) and
    the source page's (:func:`step_profile`)."""
    return [(target, index) for index, target in enumerate(targets) if target is not None and target <= index]


def step_loops(spans) -> tuple[tuple[int, int], list[tuple[int, int]]]:
    """A persistent kernel's step among its loops (:func:`loop_spans`): the longest loop, and the loops nested in it
    (a poll, run as often as it waits). A ValueError when there is no loop."""
    if not spans:
        raise ValueError("the kernel has no loop (no backward branch)")
    first, last = max(spans, key=lambda span: span[1] - span[0])
    return (first, last), [(a, b) for a, b in spans if (a, b) != (first, last) and first <= a and b <= last]


def parse_source_page(text: str) -> list[tuple[str, pd.DataFrame]]:
    """``(kernel name, frame)`` per profiled launch, in the order profiled. A frame has ``address`` (int),
    ``source`` (the instruction), ``samples`` (every warp-state sample at it), ``executed`` (warp-level
    instructions executed) and one ``stall_<reason>`` column per reason (all samples), numbers as floats."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    launches, name, lines = [], None, []

    def close():
        if name is not None and lines:
            raw = pd.read_csv(io.StringIO("\n".join(lines) + "\n"))
            frame = pd.DataFrame({"address": raw["Address"].map(lambda value: int(str(value), 16)),
                                  "source": raw["Source"].astype(str),
                                  "samples": pd.to_numeric(raw["Warp Stall Sampling (All Samples)"], errors="coerce"),
                                  "executed": pd.to_numeric(raw["Instructions Executed"], errors="coerce")})
            for column in raw.columns:
                if column.startswith("stall_") and not column.endswith("(Not Issued)"):
                    frame[column] = pd.to_numeric(raw[column], errors="coerce")
            launches.append((name, frame.fillna({c: 0.0 for c in frame.columns if c not in ("address", "source")})))

    for line in text.splitlines():
        kernel = _KERNEL.match(line)
        if kernel:
            close()
            name, lines = kernel.group("name"), []
        elif name is not None and line.strip():
            lines.append(line)
    close()
    return launches


def read_source_page(path: str | os.PathLike) -> list[tuple[str, pd.DataFrame]]:
    """:func:`parse_source_page` of a recorded file (``.csv`` or ``.csv.gz``)."""
    path = Path(path)
    text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    return parse_source_page(text)


def step_profile(frame: pd.DataFrame, marker: str | None = None) -> dict:
    """One persistent kernel's step from its source page (:func:`parse_source_page`): its longest loop is the step.

    ``warp_steps`` (executions of the step's first instruction), ``step_instructions`` (instructions a warp executes
    a step outside the loops nested in it), ``nested_passes`` (how often a nested loop's first instruction ran, a
    step: a poll that found its data missing and went round again), then shares of all samples: ``nested_pct``
    (inside nested loops), ``marker_pct`` (at instructions whose text holds ``marker``, such as the poll's compare
    with the empty word) and ``<reason>_pct`` per stall reason of :data:`STALLS`, ``other_pct`` for the rest."""
    addresses = list(frame["address"])
    index_of = {address: i for i, address in enumerate(addresses)}
    targets = []
    for text in frame["source"]:
        branch = _ADDRESS_BRANCH.search(text)
        targets.append(index_of.get(int(branch.group(1), 16)) if branch else None)
    (first, last), inner = step_loops(loop_spans(targets))
    step = frame.iloc[first:last + 1]
    nested = np.zeros(len(step), dtype=bool)
    for a, b in inner:
        nested[a - first:b - first + 1] = True
    warp_steps = float(step["executed"].iloc[0])
    total = float(frame["samples"].sum()) or 1.0
    profile = {"warp_steps": warp_steps,
               "step_instructions": float(step.loc[~nested, "executed"].sum()) / warp_steps if warp_steps else 0.0,
               "nested_passes": (sum(float(frame["executed"].iloc[a]) for a, _b in inner) / warp_steps
                                 if warp_steps else 0.0),
               "nested_pct": 100 * float(step.loc[nested, "samples"].sum()) / total}
    if marker is not None:
        profile["marker_pct"] = 100 * float(frame.loc[frame["source"].str.contains(marker, regex=False),
                                                      "samples"].sum()) / total
    named = 0.0
    for reason in STALLS:
        share = 100 * float(frame.get(f"stall_{reason}", pd.Series(dtype=float)).sum()) / total
        profile[f"{reason}_pct"] = share
        named += share
    profile["other_pct"] = max(0.0, 100.0 - named)
    return profile
