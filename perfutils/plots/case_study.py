"""Tables and figures of the #497 case study (notebook 02), each a function of the recorded frames.

The frames are those :mod:`perfutils.studies.case_497` writes: ``case_497`` (the real Fast-LLM kernels, torch.compile
and the project's variants), ``case_497_ablation`` (the walk from the #497 kernel to ``kernels.fused``),
``case_497_registers_offline`` (offline sm_90 compiles: registers, stack, static spill traffic) and ``case_497_ncu``
(Nsight Compute). Nothing here measures or compiles; everything replays on a CPU.

* :func:`case_label` / :func:`with_labels` name each row by its role in the story (the #497 kernel, Fast-LLM HEAD,
  the emulation, Option A / B, auto, the ablation steps); :func:`launch_config` fills ``block_size`` / ``num_warps``
  of rows whose provider chose them (Fast-LLM, auto) from the recorded launches.
* :func:`compare_cases` (time, % of copy, registers, stack, occupancy, peak memory and ratios, per case and vocab),
  :func:`plot_reproduction` (the main figure: time and % of copy of the real kernel vs the others).
* :func:`resident_stack_bytes`, :func:`with_offline` (measured rows beside their offline compiles),
  :func:`ncu_side_by_side`, :func:`plot_time_vs_traffic` (time against the bytes the kernel moves counting its
  spill traffic, with the "everything goes to DRAM" line).
* :func:`ablation_walk` (each step's factor and its share of the slowdown), :func:`walk_product`,
  :func:`solo_effects` (one switch at a time vs the same switch within the walk), :func:`plot_ablation_waterfall`.
* :func:`peak_with_gradient`, :func:`plot_fixes` (Option A, Option B, auto and Fast-LLM HEAD: % of copy and peak
  memory).
"""

from __future__ import annotations

import json
import math
from typing import Iterable, Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ..data.schema import ISSUE_COMMIT  # Fast-LLM's kernel of issue #497
from ..model.spill_counts import resident_stack_bytes  # noqa: F401  (the notebooks call it from here)
from . import figures  # noqa: F401  (fixes svg.hashsalt)
from .figures import plain_log_ticks
from .figures import check_frame, label_points

__all__ = [
    "EMULATION",
    "ISSUE_COMMIT",
    "STALL_MEANINGS",
    "ablation_walk",
    "case_label",
    "compare_cases",
    "launch_config",
    "ncu_side_by_side",
    "peak_with_gradient",
    "plot_ablation_waterfall",
    "plot_fixes",
    "plot_reproduction",
    "plot_time_vs_traffic",
    "resident_stack_bytes",
    "solo_effects",
    "walk_product",
    "with_labels",
    "with_offline",
]

EMULATION = "emulation: fused, 32K cap"
_FAST_LLM = "fast_llm_"
_ABLATION = "case497."
_TORCH_VARIANTS = ("torch_compile", "eager")
_DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


# ---------------------------------------------------------------------------------------------------------------
# Names and launch configurations
# ---------------------------------------------------------------------------------------------------------------


def _missing(value) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))


def case_label(variant: str, block_size=None, *, issue_commit: str = ISSUE_COMMIT) -> str:
    """The name of a row in the story: ``fast_llm_27f4747e`` -> '#497 kernel (Fast-LLM 27f4747e)', another Fast-LLM
    commit -> 'Fast-LLM HEAD (<commit>)', ``fused`` at its default 32K cap (or an explicit 32768) -> the emulation,
    ``fused`` at a lower cap -> 'Option A: fused, 16K cap', ``two_pass`` -> Option B, ``case497.step2`` -> 'step 2'."""
    if not isinstance(variant, str) or not variant:
        raise TypeError(f"variant must be a non-empty str, got {variant!r}")
    if variant.startswith(_FAST_LLM):
        commit = variant[len(_FAST_LLM):]
        return f"#497 kernel (Fast-LLM {commit})" if commit.startswith(issue_commit) else f"Fast-LLM HEAD ({commit})"
    if variant == "torch_compile":
        return "torch.compile"
    if variant == "eager":
        return "eager PyTorch"
    if variant == "fused":
        if _missing(block_size) or int(block_size) == 32768:
            return EMULATION
        return f"Option A: fused, {int(block_size) // 1024}K cap"
    if variant == "two_pass":
        return "Option B: two_pass"
    if variant == "auto":
        return "auto"
    if variant.startswith(_ABLATION):
        name = variant[len(_ABLATION):]
        return f"step {name[4:]}" if name.startswith("step") else name.replace("_", ": ", 1)
    return variant


def launch_config(df: pd.DataFrame) -> pd.DataFrame:
    """A copy with ``block_size`` / ``num_warps`` filled (as floats) where the provider chose them, from the
    recorded launch that limits the plan (``passes`` / ``limiting_pass``); torch rows stay NaN."""
    check_frame(df, ["variant", "block_size", "num_warps"])
    out = df.copy()
    blocks = pd.to_numeric(out["block_size"], errors="coerce").astype(float)
    warps = pd.to_numeric(out["num_warps"], errors="coerce").astype(float)
    if "passes" in out:
        for i, (passes, limiting) in enumerate(zip(out["passes"], out.get("limiting_pass", [None] * len(out)))):
            if not (math.isnan(blocks.iat[i]) or math.isnan(warps.iat[i])):
                continue
            entries = json.loads(passes) if isinstance(passes, str) and passes.strip() else (passes or [])
            if not isinstance(entries, list) or not entries:
                continue
            entry = next((e for e in entries if e.get("name") == limiting), entries[0])
            if math.isnan(blocks.iat[i]) and entry.get("block_size") is not None:
                blocks.iat[i] = float(entry["block_size"])
            if math.isnan(warps.iat[i]) and entry.get("num_warps") is not None:
                warps.iat[i] = float(entry["num_warps"])
    out["block_size"], out["num_warps"] = blocks, warps
    return out


def with_labels(df: pd.DataFrame, *, issue_commit: str = ISSUE_COMMIT) -> pd.DataFrame:
    """A copy of the ok rows with a ``case`` column (:func:`case_label`); ValueError when none is ok."""
    check_frame(df, ["variant", "block_size", "status"])
    out = df[df["status"] == "ok"].copy()
    if out.empty:
        raise ValueError("no row with status 'ok'")
    out["case"] = [case_label(v, b, issue_commit=issue_commit) for v, b in zip(out["variant"], out["block_size"])]
    return out


def _select(df: pd.DataFrame, loss: str | None, target_format: str | None) -> pd.DataFrame:
    out = df
    if loss is not None:
        out = out[out["loss"] == loss]
    if target_format is not None:
        out = out[out["target_format"] == target_format]
    if out.empty:
        raise ValueError(f"no rows for loss {loss!r}, target_format {target_format!r}")
    return out


def _ordered(cases: Sequence[str] | None, present: Iterable[str]) -> list[str]:
    present = list(dict.fromkeys(present))
    if cases is None:
        return present
    missing = [c for c in cases if c not in present]
    if missing:
        raise ValueError(f"cases {missing} are not in the data (it has {present})")
    return list(cases)


# ---------------------------------------------------------------------------------------------------------------
# The cases side by side
# ---------------------------------------------------------------------------------------------------------------


def peak_with_gradient(df: pd.DataFrame) -> pd.Series:
    """``peak_mem_bytes`` with the gradient counted for every row.

    The harness measures a call's peak above what is allocated just before it. A torch plan (``torch_compile``,
    ``eager``) keeps ``x.grad`` of its previous call until the next call frees it, so that gradient sits in the
    baseline and its new gradient is not counted; the kernels' plans count theirs (allocated per call, or added as
    the plan's buffers). This adds ``tokens x vocab x dtype bytes`` to the torch rows, nothing to the others."""
    check_frame(df, ["variant", "tokens", "vocab", "dtype", "peak_mem_bytes"])
    peak = pd.to_numeric(df["peak_mem_bytes"], errors="coerce").astype(float)
    grad = df["tokens"].astype(float) * df["vocab"].astype(float) * df["dtype"].map(_DTYPE_BYTES).astype(float)
    return peak + np.where(df["variant"].isin(_TORCH_VARIANTS), grad, 0.0)


def compare_cases(df: pd.DataFrame, *, loss: str | None = "reverse_kl", target_format: str | None = "logits",
                  cases: Sequence[str] | None = None, reference: str = EMULATION,
                  issue_commit: str = ISSUE_COMMIT) -> pd.DataFrame:
    """One row per (case, vocab): time, % of copy, the limiting launch's registers / stack / occupancy, peak memory
    (recorded and with the gradient, :func:`peak_with_gradient`), and time over ``reference``'s at that vocab
    (``x_reference``; > 1 = slower). ``cases`` picks and orders the rows (labels of :func:`case_label`)."""
    check_frame(df, ["loss", "target_format", "variant", "vocab", "block_size", "ms_median", "pct_of_copy",
                     "status"])
    data = with_labels(_select(df, loss, target_format), issue_commit=issue_commit)
    order = _ordered(cases, data["case"])
    data = data[data["case"].isin(order)].copy()
    data["order"] = data["case"].map({c: i for i, c in enumerate(order)})
    data = data.sort_values(["vocab", "order"])
    if data.duplicated(["case", "vocab"]).any():
        raise ValueError("more than one ok row per (case, vocab): pass one loss and target_format")
    ref = data[data["case"] == reference].set_index("vocab")["ms_median"]
    out = pd.DataFrame({
        "case": data["case"],
        "vocab": data["vocab"].astype(int),
        "ms": data["ms_median"].astype(float),
        "pct_of_copy": data["pct_of_copy"].astype(float),
        "n_regs": pd.to_numeric(data.get("n_regs"), errors="coerce").astype(float) if "n_regs" in data else np.nan,
        "stack_bytes": (pd.to_numeric(data["spill_bytes"], errors="coerce").astype(float)
                        if "spill_bytes" in data else np.nan),
        "occupancy": data["occupancy"].astype(float) if "occupancy" in data else np.nan,
        "peak_mem_bytes": (pd.to_numeric(data["peak_mem_bytes"], errors="coerce").astype(float)
                           if "peak_mem_bytes" in data else np.nan),
        "peak_with_grad_bytes": (peak_with_gradient(data) if {"peak_mem_bytes", "tokens", "dtype"} <= set(data)
                                 else np.nan),
        "x_reference": data["ms_median"].astype(float).to_numpy() / data["vocab"].map(ref).astype(float).to_numpy(),
    })
    return out.reset_index(drop=True)


def _grouped_bars(table: pd.DataFrame, columns: Sequence[tuple[str, float]], *, figsize):
    """One panel per ``(column, scale)``: that column times ``scale`` as bars, one group per vocab, one bar per case
    (in the table's order). Returns ``(fig, axes, groups)``, ``groups`` = [(case, bar x positions, its rows by
    vocab)] for annotations."""
    if table.empty:
        raise ValueError("table: no rows to plot")
    cases = list(dict.fromkeys(table["case"]))
    vocabs = sorted(table["vocab"].unique())
    colors = dict(zip(cases, plt.get_cmap("tab10").colors))
    width = 0.8 / len(cases)
    offsets = (np.arange(len(cases)) - (len(cases) - 1) / 2) * width
    fig, axes = plt.subplots(1, len(columns), figsize=figsize, squeeze=False)
    axes = list(axes[0])
    groups = []
    for k, case in enumerate(cases):
        part = table[table["case"] == case].set_index("vocab").reindex(vocabs)
        x = np.arange(len(vocabs)) + offsets[k]
        for ax, (column, scale) in zip(axes, columns):
            ax.bar(x, part[column] * scale, width, color=colors[case], label=case, edgecolor="black", linewidth=0.4)
        groups.append((case, x, part))
    for ax in axes:
        ax.set_xticks(np.arange(len(vocabs)), [f"vocab {v // 1024}K" for v in vocabs])
        ax.grid(axis="y", alpha=0.3)
    return fig, axes, groups


def _pct(fraction: float) -> str:
    """0.125 -> '12.5%', 1.0 -> '100%'."""
    return f"{100 * fraction:.3g}%"


def _resource_note(row) -> str:
    """Three short lines: registers per thread, stack bytes per thread, occupancy."""
    if any(_missing(getattr(row, name)) for name in ("n_regs", "stack_bytes", "occupancy")):
        return ""
    return f"{int(row.n_regs)} regs\n{int(row.stack_bytes)} B stack\n{_pct(row.occupancy)} occ."


def plot_reproduction(table: pd.DataFrame, *, title: str = "", highlight: str | None = None,
                      reference: str = EMULATION) -> plt.Figure:
    """Time (log scale) and % of copy bandwidth per case, one group of bars per vocab, from :func:`compare_cases`;
    each Triton bar is annotated with its registers, stack bytes and occupancy, and the bars of ``highlight`` with
    their time over ``reference``'s (``x_reference``)."""
    check_frame(table, ["case", "vocab", "ms", "pct_of_copy", "n_regs", "stack_bytes", "occupancy"], "table")
    fig, (ax_ms, ax_bw), groups = _grouped_bars(table, [("ms", 1.0), ("pct_of_copy", 1.0)], figsize=(13, 5.2))
    notes = []  # (x, top of the bar, note): written above the bars once the layout is final
    for case, x, part in groups:
        for xi, row in zip(x, part.itertuples()):
            note = _resource_note(row)
            if note and not _missing(row.ms):
                notes.append((xi, row.ms, note))
            if case == highlight and "x_reference" in table and not _missing(row.x_reference) and case != reference:
                ax_ms.annotate(f"{row.x_reference:.1f}×", (xi, row.ms), xytext=(0, -4), textcoords="offset points",
                               ha="center", va="top", fontsize=8, fontweight="bold", color="white")
    ax_ms.set_yscale("log")
    plain_log_ticks(ax_ms)
    ax_ms.set_ylim(table["ms"].min() / 2, table["ms"].max() * 6)
    ax_ms.set_ylabel("time per fwd+bwd call (ms, log scale)")
    above = "above each Triton bar: registers and stack per thread, occupancy"
    ax_ms.set_title(f"white: time of {highlight} / time of {reference}; {above}" if highlight is not None else above,
                    fontsize=8)
    ax_bw.set_ylabel("% of measured copy bandwidth (minimal bytes / time)")
    ax_bw.axhline(100, color="grey", linestyle="--", linewidth=1)
    ax_bw.legend(fontsize=7, loc="upper right")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    if notes:  # horizontal, and moved up where two would overlap
        xs, tops, texts = zip(*notes)
        label_points(ax_ms, xs, tops, texts, fontsize=5.5, offset=(0, 12), merge_px=0.5, upward=True, ha="center",
                     linespacing=1.0, marker_pt=0, avoid=ax_ms.patches)
    return fig


# ---------------------------------------------------------------------------------------------------------------
# Registers, stack, spill traffic
# ---------------------------------------------------------------------------------------------------------------


_JOIN = ["variant", "loss", "target_format", "vocab", "block_size", "num_warps"]
_OFFLINE = ["n_regs", "spill_bytes", "spill_store_bytes", "spill_load_bytes", "blocks_per_sm", "occupancy",
            "limiter", "resident_stack_bytes", "static_spill_traffic_bytes", "sass_ldl", "sass_stl"]


def with_offline(measured: pd.DataFrame, offline: pd.DataFrame) -> pd.DataFrame:
    """Measured ok rows (their launch configuration filled by :func:`launch_config`) with the offline sm_90 compile
    of the same kernel, tile and warps beside them (columns suffixed ``_offline``; NaN where none was compiled)."""
    check_frame(measured, _JOIN + ["status"], "measured")
    check_frame(offline, _JOIN + ["n_regs", "spill_bytes", "static_spill_traffic_bytes", "resident_stack_bytes"],
                "offline")
    left = launch_config(measured[measured["status"] == "ok"])
    right = offline[offline.get("status", pd.Series("ok", index=offline.index)) == "ok"].copy()
    right["block_size"] = pd.to_numeric(right["block_size"], errors="coerce").astype(float)
    right["num_warps"] = pd.to_numeric(right["num_warps"], errors="coerce").astype(float)
    right = right[_JOIN + [c for c in _OFFLINE if c in right]].drop_duplicates(_JOIN)
    right = right.rename(columns={c: f"{c}_offline" for c in _OFFLINE})
    return left.merge(right, on=_JOIN, how="left")


# What Nsight Compute's stall reasons mean (Nsight Compute Profiling Guide, "Warp Stall Reasons"), in a few words.
STALL_MEANINGS = {
    "long_scoreboard": "waiting for an L1TEX operation: a global or local-memory load",
    "short_scoreboard": "waiting for an MIO operation: shared memory, special math",
    "lg_throttle": "the local/global memory instruction queue is full",
    "mio_throttle": "the MIO instruction queue is full",
    "barrier": "waiting at a block barrier for the other warps",
    "wait": "a fixed-latency dependency",
    "not_selected": "eligible, another warp was picked",
    "math_pipe_throttle": "a math pipe is busy",
    "membar": "waiting at a memory barrier",
    "branch_resolving": "resolving a branch",
    "dispatch_stall": "dispatch stalled",
    "drain": "draining memory stores at exit",
    "no_instruction": "instruction cache miss",
}

_NCU_ROWS = {
    "duration_ms": "duration (ms)",
    "dram_throughput_pct": "DRAM throughput (% of peak)",
    "dram_gb": "DRAM bytes read + written (GB)",
    "dram_over_minimal": "DRAM bytes / minimal bytes",
    "local_gb": "local-memory (spill) loads + stores at L1 (GB)",
    "l2_hit_rate_pct": "L2 hit rate (%)",
    "l1_hit_rate_pct": "L1 hit rate (%)",
    "theoretical_occupancy_pct": "theoretical occupancy (%)",
    "achieved_occupancy_pct": "achieved occupancy (%)",
    "warp_cycles_per_issued_instruction": "warp cycles per issued instruction",
    "stall_1": "stall 1",
    "stall_1_cycles": "stall 1 cycles",
    "stall_2": "stall 2",
    "stall_2_cycles": "stall 2 cycles",
    "stall_3": "stall 3",
    "stall_3_cycles": "stall 3 cycles",
}


def ncu_side_by_side(ncu: pd.DataFrame, *, minimal_bytes: float, labels: Sequence[str] | None = None) -> pd.DataFrame:
    """Nsight Compute's summary (:func:`perfutils.studies.case_497.ncu_summary`) as one column per profiled kernel
    and one row per measure (duration, DRAM throughput and bytes, bytes over the minimal, local-memory bytes, cache
    hit rates, occupancy, the top stall reasons)."""
    needed = ["label", "duration_us", "dram_throughput_pct", "dram_read_bytes", "dram_write_bytes",
              "local_load_bytes", "local_store_bytes", "achieved_occupancy_pct"]
    check_frame(ncu, needed, "ncu")
    if not minimal_bytes or minimal_bytes <= 0:
        raise ValueError(f"minimal_bytes must be positive, got {minimal_bytes!r}")
    data = ncu.copy()
    order = _ordered(labels, data["label"])
    data = data.set_index("label").loc[order]
    data["duration_ms"] = data["duration_us"].astype(float) / 1e3
    dram = data["dram_read_bytes"].astype(float) + data["dram_write_bytes"].astype(float)
    data["dram_gb"] = dram / 1e9
    data["dram_over_minimal"] = dram / float(minimal_bytes)
    data["local_gb"] = (data["local_load_bytes"].astype(float) + data["local_store_bytes"].astype(float)) / 1e9
    rows = [c for c in _NCU_ROWS if c in data]
    table = data[rows].T
    table.index = [_NCU_ROWS[c] for c in rows]
    table.columns.name = None
    return table


def plot_time_vs_traffic(points: pd.DataFrame, *, copy_gbps: float, l2_bytes: float, title: str = "") -> plt.Figure:
    """Measured time against the bytes a kernel moves counting its spills (``bytes_min`` +
    ``static_spill_traffic_bytes``), log-log; the line is that traffic at the copy bandwidth (every spill byte
    going to DRAM). Points whose resident stack exceeds the L2 are drawn as filled red circles, the others as blue
    squares; each is labelled with ``case``."""
    check_frame(points, ["case", "ms_median", "bytes_min", "static_spill_traffic_bytes", "resident_stack_bytes"],
                "points")
    data = points.dropna(subset=["static_spill_traffic_bytes", "ms_median"])
    if data.empty:
        raise ValueError("points: no row with both a time and an offline spill traffic")
    if copy_gbps <= 0 or l2_bytes <= 0:
        raise ValueError("copy_gbps and l2_bytes must be positive")
    traffic = (data["bytes_min"].astype(float) + data["static_spill_traffic_bytes"].astype(float)) / 1e9
    beyond = data["resident_stack_bytes"].astype(float) > l2_bytes
    fig, ax = plt.subplots(figsize=(7.5, 5))
    xs = np.geomspace(traffic.min() / 1.5, traffic.max() * 1.5, 50)
    ax.plot(xs, xs / copy_gbps * 1e3, color="grey", linestyle="--", linewidth=1,
            label=f"every one of those bytes through DRAM at the copy bandwidth ({copy_gbps:.0f} GB/s)")
    for flag, style in ((True, dict(marker="o", color="tab:red")), (False, dict(marker="s", color="tab:blue"))):
        sel = beyond == flag
        if sel.any():
            ax.scatter(traffic[sel], data.loc[sel, "ms_median"], s=40, edgecolor="black", linewidth=0.4,
                       label=f"resident stack {'>' if flag else '≤'} L2 ({l2_bytes / 2**20:.0f} MiB)", **style)
    ax.set_xscale("log")
    ax.set_yscale("log")
    plain_log_ticks(ax, "x")
    plain_log_ticks(ax, "y")
    ax.set_xlabel("minimal bytes + static spill traffic (GB, offline sm_90 compile)")
    ax.set_ylabel("measured time (ms)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="upper left")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    label_points(ax, traffic.to_numpy(), data["ms_median"].to_numpy(dtype=float), list(data["case"]), fontsize=7,
                 offset=(5, 0))
    return fig


# ---------------------------------------------------------------------------------------------------------------
# The ablation
# ---------------------------------------------------------------------------------------------------------------


def _one_row(data: pd.DataFrame, variant: str, num_warps: int) -> pd.Series:
    match = data[(data["variant"] == variant) & (data["num_warps"] == num_warps)]
    if len(match) != 1:
        raise ValueError(f"expected one ok row of {variant!r} at {num_warps} warps, found {len(match)}")
    return match.iloc[0]


def ablation_walk(ablation: pd.DataFrame, order: Sequence[str], *, num_warps: int = 16,
                  removes: Mapping[str, str] | None = None, short: Mapping[str, str] | None = None,
                  issue_commit: str = ISSUE_COMMIT) -> pd.DataFrame:
    """The walk ``order`` (variants, first = where it starts) at ``num_warps``: per step what it removes
    (``removes``, and a ``short`` name for the figure: variant -> text), its time, registers, stack and occupancy,
    ``factor`` = previous time / this time (> 1: the step made it faster), ``cumulative`` = first time / this time,
    and ``share_of_gap`` = log(factor) / log(first / last time), the part of the whole slowdown
    the step accounts for (shares add up to 1; a negative share is a step that made the kernel slower)."""
    check_frame(ablation, ["variant", "ms_median", "status", "block_size", "num_warps"], "ablation")
    if len(order) < 2:
        raise ValueError("order: at least two variants")
    data = launch_config(ablation[ablation["status"] == "ok"])
    rows = [_one_row(data, variant, num_warps) for variant in order]
    ms = np.array([float(r["ms_median"]) for r in rows])
    total = ms[0] / ms[-1]
    factor = np.concatenate([[np.nan], ms[:-1] / ms[1:]])
    out = pd.DataFrame({
        "case": [case_label(r["variant"], r["block_size"], issue_commit=issue_commit) for r in rows],
        "variant": list(order),
        "removes": [(removes or {}).get(v, "") for v in order],
        "short": [(short or {}).get(v, "") for v in order],
        "ms": ms,
        "n_regs": [float(r["n_regs"]) if not _missing(r.get("n_regs")) else np.nan for r in rows],
        "stack_bytes": [float(r["spill_bytes"]) if not _missing(r.get("spill_bytes")) else np.nan for r in rows],
        "occupancy": [float(r["occupancy"]) if not _missing(r.get("occupancy")) else np.nan for r in rows],
        "factor": factor,
        "cumulative": ms[0] / ms,
        "share_of_gap": np.log(factor) / math.log(total) if total != 1 else np.nan,
    })
    return out


def walk_product(walk: pd.DataFrame) -> float:
    """The product of the steps' factors (first time / last time when the walk is consecutive)."""
    check_frame(walk, ["factor"], "walk")
    return float(np.prod(walk["factor"].dropna().to_numpy()))


def solo_effects(ablation: pd.DataFrame, start: str, solos: Mapping[str, str], walk: pd.DataFrame, *,
                 num_warps: int = 16) -> pd.DataFrame:
    """Each switch alone from ``start`` (``solos``: solo variant -> the walk variant whose step flips the same
    switch) beside the same switch within the walk: ``alone`` = start time / solo time, ``in_walk`` = that step's
    factor; a ratio far from 1 is an interaction (the switch's effect depends on the others)."""
    check_frame(walk, ["variant", "factor"], "walk")
    data = launch_config(ablation[ablation["status"] == "ok"])
    base = _one_row(data, start, num_warps)
    factors = walk.set_index("variant")["factor"]
    rows = []
    for solo, step in solos.items():
        row = _one_row(data, solo, num_warps)
        if step not in factors.index:
            raise ValueError(f"{step!r} is not a step of the walk")
        alone = float(base["ms_median"]) / float(row["ms_median"])
        rows.append({"solo": case_label(solo), "ms": float(row["ms_median"]),
                     "n_regs": float(row["n_regs"]), "stack_bytes": float(row["spill_bytes"]),
                     "occupancy": float(row["occupancy"]), "alone": alone, "step": case_label(step),
                     "in_walk": float(factors[step])})
    return pd.DataFrame(rows)


def plot_ablation_waterfall(walk: pd.DataFrame, *, reference_ms: float | None = None, reference_label: str = "",
                            title: str = "") -> plt.Figure:
    """The walk as a waterfall on a log time axis: the first bar is the starting kernel's time, each later bar spans
    from the previous time to the step's (green: faster, red: slower), labelled with its factor; under each step its
    registers, stack bytes and occupancy. ``reference_ms`` draws a dashed line (e.g. the emulation measured in the
    main study)."""
    check_frame(walk, ["case", "ms", "factor", "n_regs", "stack_bytes", "occupancy"], "walk")
    if len(walk) < 2:
        raise ValueError("walk: at least two rows")
    ms = walk["ms"].to_numpy(dtype=float)
    x = np.arange(len(walk))
    fig, ax = plt.subplots(figsize=(max(7.0, 1.35 * len(walk)), 5))
    floor = ms.min() / 3
    ax.bar(x[0], ms[0] - floor, bottom=floor, color="tab:grey", edgecolor="black", linewidth=0.4, width=0.6)
    for i in range(1, len(walk)):
        low, high = sorted((ms[i - 1], ms[i]))
        faster = ms[i] < ms[i - 1]
        ax.bar(x[i], max(high - low, high * 1e-3), bottom=low, width=0.6, edgecolor="black", linewidth=0.4,
               color="tab:green" if faster else "tab:red")
        ax.plot([x[i - 1] + 0.3, x[i] - 0.3], [ms[i - 1], ms[i - 1]], color="black", linewidth=0.6)
        factor = ms[i - 1] / ms[i]
        text = f"÷{factor:.2f}" if faster else f"×{1 / factor:.2f}"
        ax.annotate(text, (x[i], high), xytext=(0, 3), textcoords="offset points", ha="center", fontsize=8)
    if reference_ms:
        ax.axhline(reference_ms, color="tab:blue", linestyle="--", linewidth=1)
        ax.annotate(reference_label or f"{reference_ms:.3f} ms", (x[0] + 0.35, reference_ms), fontsize=7,
                    color="tab:blue", ha="left", va="bottom")
    ticks = []
    for row in walk.itertuples():
        resources = (f"{int(row.n_regs)} regs · {int(row.stack_bytes)} B stack\n{_pct(row.occupancy)} occupancy"
                     if not any(_missing(v) for v in (row.n_regs, row.stack_bytes, row.occupancy)) else "")
        name = row.case.replace(" (", "\n(", 1) if len(row.case) > 18 else row.case
        extra = getattr(row, "short", "")
        name = f"{name}\n{extra}" if isinstance(extra, str) and extra else name
        ticks.append(f"{name}\n{row.ms:.3f} ms\n{resources}")
    ax.set_xticks(x, ticks, fontsize=7)
    ax.set_yscale("log")
    plain_log_ticks(ax)
    ax.set_ylim(floor, ms.max() * 1.6)
    ax.set_ylabel("time per fwd+bwd call (ms, log scale)")
    ax.grid(axis="y", alpha=0.3, which="both")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------------------------------------------------------
# The fixes
# ---------------------------------------------------------------------------------------------------------------


def plot_fixes(table: pd.DataFrame, *, title: str = "") -> plt.Figure:
    """% of copy bandwidth and peak memory (gradient included, GiB) per case, one group of bars per vocab, from
    :func:`compare_cases`."""
    check_frame(table, ["case", "vocab", "pct_of_copy", "peak_with_grad_bytes"], "table")
    fig, (ax_bw, ax_mem), _ = _grouped_bars(table, [("pct_of_copy", 1.0), ("peak_with_grad_bytes", 2.0**-30)],
                                            figsize=(13, 4.4))
    ax_bw.axhline(100, color="grey", linestyle="--", linewidth=1)
    ax_bw.set_ylabel("% of measured copy bandwidth")
    ax_mem.set_ylabel("peak memory above the inputs, gradient included (GiB)")
    ax_mem.legend(fontsize=7, loc="upper left")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig
