"""Figures and tables of notebook 11 (how good the performance model is).

Functions of the frame :func:`perfutils.model.predict.check` returns (one row per recorded configuration: measured
and predicted ms, the bound, the time of every term): :func:`plot_predicted_vs_measured` (log-log, one panel per
study, the y = x line and the goal bands), :func:`worst` (the configurations it misses most, with their breakdown),
:func:`by_bound` (the error split by the limit the model says binds) and :func:`goal_table` (the goals, met or not).
:func:`in_flight_sweep` asks the model what one configuration would run at with other resident programs and tiles
(bytes in flight), :func:`plot_in_flight` draws it, against :func:`floor_ms`; :func:`sidecar_dates` are the days the studies were recorded.
:func:`built_check` checks the model after a kernel was built: each plan an exploration timed (its log's records) beside
the model's prediction; :func:`built_summary` and :func:`built_reading` condense it per cell and design.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.ticker import NullFormatter

from ..model.predict import (BOUNDS, DEFAULT_CONSTANTS, LAG_STEPS, Gpu, LaunchConfig, ModelConstants, check,
                             gpu_from_folder, in_flight, load_configurations, predict, predict_launch, summarize,
                             sweep_spearman)
from ..model.roofline import loss_cost
from .figures import check_frame

__all__ = ["BOUND_COLORS", "binds_reading", "binds_summary", "built_check", "built_reading", "built_summary", "by_bound",
           "floor_ms", "goal_table", "in_flight_sweep", "least_in_flight", "needs_reading", "plot_binds", "plot_in_flight",
           "plot_predicted_vs_measured", "public_cells", "sidecar_dates", "worst"]

_NEEDED = ("study", "measured_ms", "predicted_ms", "bound")
BOUND_COLORS = {"dram": "#1f4e9c", "latency": "#d1495b", "waves": "#f28e2b", "l2": "#7b2d8b", "issue": "#8c564b",
                "mufu": "#e377c2", "spills": "#2e933c", "host": "#edae49", "launch": "#8c8c8c",
                "nvlink": "#17becf"}
_DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


def sidecar_dates(folder, studies) -> str | None:
    """The days (UTC) the sidecars ``<folder>/<study>.json`` of ``studies`` were recorded, counting every process
    that added rows (a sidecar's ``sessions``): one day, or "first to last"; None when none has a time."""
    days = []
    for study in sorted(set(studies)):
        path = Path(folder) / f"{study}.json"
        if path.is_file():
            meta = json.loads(path.read_text(encoding="utf-8"))
            sessions = [session for session in meta.get("sessions") or [] if isinstance(session, dict)]
            stamps = [meta.get("timestamp_utc")] + [session.get("timestamp_utc") for session in sessions]
            days += [str(stamp)[:10] for stamp in stamps if stamp]
    if not days:
        return None
    days.sort()
    return days[0] if days[0] == days[-1] else f"{days[0]} to {days[-1]}"


def _measured(frame: pd.DataFrame) -> pd.DataFrame:
    check_frame(frame, _NEEDED, "frame")
    return frame[frame["measured_ms"].notna() & (frame["measured_ms"] > 0)]


def plot_predicted_vs_measured(frame: pd.DataFrame, *, bands=(0.10, 0.25), title: str = "",
                               columns: int = 3) -> plt.Figure:
    """Predicted against measured time (ms, log-log), one panel per study, coloured by the bound the model says
    binds; the y = x line and shaded bands of ±``bands`` relative error (narrowest darkest)."""
    data = _measured(frame)
    studies = sorted(data["study"].unique())
    if not studies:
        raise ValueError("frame: no configuration with a measured time")
    rows = math.ceil(len(studies) / columns)
    ncols = min(columns, len(studies))
    fig, axes = plt.subplots(rows, ncols, figsize=(4.1 * ncols, 3.7 * rows + 0.6), squeeze=False)
    seen = {}
    for ax, study in zip(axes.flat, studies):
        part = data[data["study"] == study]
        lo = min(part["measured_ms"].min(), part["predicted_ms"].min()) / 1.5
        hi = max(part["measured_ms"].max(), part["predicted_ms"].max()) * 1.5
        x = np.geomspace(lo, hi, 50)
        for band, alpha in zip(sorted(bands, reverse=True), (0.14, 0.26, 0.38)):
            ax.fill_between(x, x * (1 - band), x * (1 + band), color="#4c4c4c", alpha=alpha, lw=0,
                            label=f"±{band:.0%}")
        ax.plot(x, x, color="black", lw=0.8, label="predicted = measured")
        for bound in BOUNDS:
            points = part[part["bound"] == bound]
            if len(points):
                seen[bound] = ax.scatter(points["measured_ms"], points["predicted_ms"], s=11,
                                         color=BOUND_COLORS[bound], alpha=0.75, lw=0, label=f"bound: {bound}")
        ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi))
        for axis in (ax.xaxis, ax.yaxis):  # decades only: minor labels crowd a narrow range
            axis.set_minor_formatter(NullFormatter())
        err = part["abs_rel_err"] if "abs_rel_err" in part else (part["predicted_ms"] / part["measured_ms"] - 1).abs()
        ax.set_title(f"{study} ({len(part)}; median error {err.median():.0%})", fontsize=9)
        ax.grid(True, which="major", lw=0.3, alpha=0.5)
    for ax in axes.flat[len(studies):]:
        ax.set_visible(False)
    for ax in axes[-1]:
        ax.set_xlabel("measured time (ms)")
    for ax in axes[:, 0]:
        ax.set_ylabel("predicted time (ms)")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    keep = [(h, lab) for h, lab in zip(handles, labels) if not lab.startswith("bound:")]
    keep += [(h, f"bound: {b}") for b, h in seen.items()]
    fig.legend([h for h, _ in keep], [lab for _, lab in keep], loc="lower center", ncol=min(6, len(keep)),
               fontsize=8, frameon=False, markerscale=1.6)
    fig.suptitle("Predicted against measured time per configuration" + (f" · {title}" if title else ""),
                 fontsize=11)
    fig.tight_layout(rect=(0, 0.07 if rows > 1 else 0.12, 1, 1))
    return fig


def worst(frame: pd.DataFrame, n: int = 10) -> pd.DataFrame:
    """The ``n`` configurations with the largest relative error: what they are, measured and predicted ms, the
    bound, and the breakdown (each term's ms, the terms that are zero left out)."""
    data = _measured(frame)
    data = data.assign(err=(data["predicted_ms"] / data["measured_ms"] - 1).abs())
    data = data.sort_values("err", ascending=False, kind="mergesort").head(n)
    terms = [b for b in BOUNDS if f"{b}_ms" in data.columns]

    def breakdown(row) -> str:
        return " · ".join(f"{t} {row[f'{t}_ms']:.3g}" for t in terms if row[f"{t}_ms"] > 0)

    columns = [c for c in ("study", "variant", "loss", "tokens", "vocab") if c in data.columns]
    out = data[columns + ["measured_ms", "predicted_ms"]].copy()
    out["error %"] = (data["predicted_ms"] / data["measured_ms"] - 1) * 100
    out["bound"] = data["bound"]
    out["breakdown (ms)"] = [breakdown(r) for _, r in data.iterrows()]
    return out.reset_index(drop=True)


def by_bound(frame: pd.DataFrame) -> pd.DataFrame:
    """Per bound the model names: how many configurations, their share, the median and p90 error (%) and the
    median of predicted / measured (below 1: the model is too optimistic there)."""
    data = _measured(frame)
    err = (data["predicted_ms"] / data["measured_ms"] - 1).abs() * 100
    ratio = data["predicted_ms"] / data["measured_ms"]
    groups = data.groupby("bound")
    out = pd.DataFrame({"configurations": groups.size(),
                        "share %": groups.size() / len(data) * 100,
                        "median error %": err.groupby(data["bound"]).median(),
                        "p90 error %": err.groupby(data["bound"]).quantile(0.9),
                        "median predicted / measured": ratio.groupby(data["bound"]).median()})
    order = [b for b in BOUNDS if b in out.index]
    return out.loc[order].rename_axis("bound")


def goal_table(frames: dict, goals: list) -> pd.DataFrame:
    """The goals, each met or not. ``frames``: GPU label -> ``check`` frame; ``goals``: (GPU label, metric,
    target) with metric ``median`` or ``p90`` (of the relative error over all configurations, at most the
    target), ``spearman`` (the median rank correlation over the sweeps, at least the target) or
    ``spearman_every`` (the smallest one). The value is NaN, and the goal not met, when the GPU has no data."""
    rows = []
    for gpu, metric, target in goals:
        frame = frames.get(gpu)
        value = math.nan
        if frame is not None and len(frame):
            if metric in ("median", "p90"):
                value = float(summarize(_measured(frame)).iloc[0][f"{metric}_err"])
            else:
                rhos = sweep_spearman(_measured(frame))["spearman"]
                value = float(rhos.median() if metric == "spearman" else rhos.min()) if len(rhos) else math.nan
        higher = metric.startswith("spearman")
        met = (value >= target) if higher else (value <= target)
        what = {"median": "median |error|", "p90": "p90 |error|", "spearman": "median Spearman over the sweeps",
                "spearman_every": "smallest Spearman of a sweep"}[metric]
        rows.append({"GPU": gpu, "goal": f"{what} {'≥' if higher else '≤'} {target:g}", "value": value,
                     "met": bool(met) if not math.isnan(value) else False})
    return pd.DataFrame(rows)


def floor_ms(config: LaunchConfig, gpu: Gpu) -> float:
    """The floor of ``config``'s problem: its minimal bytes (``loss_cost``) over the GPU's measured copy bandwidth."""
    cost = loss_cost(config.loss, config.target_format, config.tokens, config.vocab, _DTYPE_BYTES.get(config.dtype, 2))
    return cost.bytes / (gpu.ceilings.dram_gbps * 1e9) * 1e3


def in_flight_sweep(config: LaunchConfig, gpu: Gpu, residents, tiles,
                    constants: ModelConstants = DEFAULT_CONSTANTS, loads_ahead=None,
                    tiles_per_step: int | None = None) -> pd.DataFrame:
    """What the model predicts for ``config`` (one pass) with ``resident`` programs per SM and tiles of ``tile``
    elements instead of its own, as a persistent grid (one wave: ``resident`` x SMs programs stepping over the
    same elements with the same warps and bytes, so the steps scale as 1 / (programs x tile)), and, where
    ``loads_ahead`` lists them, with that many steps of loads issued ahead of the arithmetic (prefetch or
    asynchronous copies; the pass's own otherwise), and with ``tiles_per_step`` tiles of arithmetic a step instead of
    the pass's own (1 for the lagged kernel: a step that no longer works through a re-read chunk, its elements'
    arithmetic done once). One row per (loads ahead, resident, tile): resident warps and
    the bytes requested in flight per SM (programs x one tile of every input x the steps ahead), predicted ms, % of
    copy (the minimal bytes over the measured copy bandwidth, over the prediction) and the bound."""
    if len(config.passes) != 1:
        raise ValueError(f"config: expected one pass, got {len(config.passes)}")
    kp = config.passes[0]
    floor = floor_ms(config, gpu)
    per_element = kp.load_bytes_per_step / kp.tile
    work = kp.programs * kp.steps * kp.tile  # elements stepped over, all programs together
    if tiles_per_step is not None:  # the arithmetic scales with the tiles worked through a step
        kp = replace(kp, elements=kp.elements * tiles_per_step / kp.tiles_per_step, tiles_per_step=int(tiles_per_step))
    rows = []
    for ahead in (kp.loads_ahead,) if loads_ahead is None else loads_ahead:
        for resident in residents:
            for tile in tiles:
                programs = int(resident) * gpu.sm_count
                trial = replace(kp, programs=programs, resident=int(resident), tile=int(tile),
                                load_bytes_per_step=per_element * tile, steps=work / (programs * tile),
                                loads_ahead=int(ahead))
                pred = predict(replace(config, passes=(trial,)), gpu, constants)
                rows.append({"loads_ahead": int(ahead), "resident": int(resident),
                             "warps_per_sm": int(resident) * kp.num_warps, "tile": int(tile),
                             "kb_in_flight_per_sm": in_flight(trial, gpu, constants)["nominal_bytes"] / 1024,
                             "predicted_ms": pred.ms, "pct_of_copy": floor / pred.ms * 100, "bound": pred.bound})
    return pd.DataFrame(rows)


def least_in_flight(sweep: pd.DataFrame, target_pct: float) -> pd.DataFrame:
    """Per steps of loads ahead in an :func:`in_flight_sweep` frame: the configuration that reaches ``target_pct``
    of copy with the fewest bytes in flight per SM (then the fewest warps), or the best one where none does (its
    ``reaches`` False)."""
    check_frame(sweep, ("loads_ahead", "kb_in_flight_per_sm", "warps_per_sm", "pct_of_copy"), "sweep")
    rows = []
    for ahead, part in sweep.groupby("loads_ahead"):
        enough = part[part["pct_of_copy"] >= target_pct]
        if len(enough):
            best = enough.sort_values(["kb_in_flight_per_sm", "warps_per_sm"], kind="mergesort").iloc[0]
        else:
            best = part.sort_values("pct_of_copy", ascending=False, kind="mergesort").iloc[0]
        rows.append({**best.to_dict(), "loads_ahead": int(ahead), "reaches": bool(len(enough))})
    return pd.DataFrame(rows)


FAMILY = {"labels": "labels CE", "logits": "distribution"}  # target_format -> the family of losses


def _main_pass(config: LaunchConfig):
    return max(config.passes, key=lambda kp: kp.dram_bytes)


def public_cells(folder, *, study: str = "vocab_sweep", variants=("public",),
                 constants: ModelConstants = DEFAULT_CONSTANTS) -> pd.DataFrame:
    """One row per recorded configuration of ``study`` run as ``variants`` (the public call by default): what ran
    (GPU, tokens, vocabulary, loss, family), measured and predicted ms and % of copy (minimal bytes over the copy
    bandwidth), the bound the model names, and Little's law of its main pass as the model sees it
    (:func:`~perfutils.model.predict.in_flight`): resident programs, tile, the bytes requested per SM a step
    (``nominal_kib``), on average in flight (``effective_kib``) and needed in flight (``needed_kib``), the share of
    the stream the loads can carry (``latency_pct_of_stream``) and the latency term over the DRAM term."""
    gpu = gpu_from_folder(folder)
    configs = load_configurations(folder, gpu, [study])
    checked = check(folder, constants, [study], configs=configs)
    rows = []
    for config, (_, row) in zip(configs, checked.iterrows()):
        if config.variant not in variants or not config.passes or not row["measured_ms"] > 0:
            continue
        kp = _main_pass(config)
        flight = in_flight(kp, gpu, constants)
        floor = floor_ms(config, gpu)
        rows.append({"GPU": gpu.name, "tokens": config.tokens, "vocab": config.vocab, "loss": config.loss,
                     "family": FAMILY.get(config.target_format, config.target_format),
                     "measured_ms": row["measured_ms"], "predicted_ms": row["predicted_ms"], "bound": row["bound"],
                     "measured_pct": floor / row["measured_ms"] * 100, "predicted_pct": floor / row["predicted_ms"] * 100,
                     "resident": kp.resident, "tile": kp.tile, "nominal_kib": flight["nominal_bytes"] / 1024,
                     "effective_kib": flight["effective_bytes"] / 1024, "needed_kib": flight["needed_bytes"] / 1024,
                     "latency_pct_of_stream": flight["latency_pct_of_stream"],
                     "latency_over_dram": (row["latency_ms"] + row["waves_ms"]) / row["dram_ms"]})
    return pd.DataFrame(rows)


def binds_summary(cells: pd.DataFrame) -> pd.DataFrame:
    """Per GPU, token count and family of a :func:`public_cells` frame: the cells, measured and predicted % of copy
    (medians), the median |predicted / measured - 1| (%), the bounds named (counts), and the medians of the bytes
    per SM requested, on average in flight and needed, and of the latency term over the DRAM term."""
    check_frame(cells, ("GPU", "tokens", "family", "measured_pct", "predicted_pct", "bound", "nominal_kib",
                        "effective_kib", "needed_kib", "latency_over_dram"), "cells")
    rows = []
    for (gpu, tokens, family), part in cells.groupby(["GPU", "tokens", "family"], sort=True):
        counts = part["bound"].value_counts()
        rows.append({"GPU": gpu, "tokens": int(tokens), "family": family, "cells": len(part),
                     "measured % of copy": part["measured_pct"].median(),
                     "predicted % of copy": part["predicted_pct"].median(),
                     "median error %": (part["measured_pct"] / part["predicted_pct"] - 1).abs().median() * 100,
                     "bound": ", ".join(f"{b} {n}" for b, n in counts.items()),
                     "KiB requested / SM": part["nominal_kib"].median(),
                     "KiB in flight / SM": part["effective_kib"].median(),
                     "KiB needed / SM": part["needed_kib"].median(),
                     "latency / dram": part["latency_over_dram"].median()})
    return pd.DataFrame(rows)


def _short(gpu_name: str) -> str:
    """A GPU's model without the vendor and memory ("NVIDIA H100 80GB HBM3" -> "H100")."""
    words = gpu_name.replace("NVIDIA ", "").split()
    return words[0] if words else gpu_name


def plot_binds(cells: pd.DataFrame, *, title: str = "") -> plt.Figure:
    """Two panels of a :func:`public_cells` frame (one or more GPUs): predicted against measured % of copy per
    cell (colour: GPU, marker: token count, the y = x line), and the bytes in flight per SM on average against
    those Little's law needs (medians per GPU, token count and family; the need as a black tick)."""
    check_frame(cells, ("GPU", "tokens", "family", "measured_pct", "predicted_pct", "effective_kib", "needed_kib"),
                "cells")
    if cells.empty:
        raise ValueError("cells: no configuration")
    fig, (left, right) = plt.subplots(1, 2, figsize=(12.5, 4.6), gridspec_kw={"width_ratios": [1, 1.25]})
    gpus = sorted(cells["GPU"].unique())
    colors = {g: c for g, c in zip(gpus, ("#1f4e9c", "#d1495b", "#2e933c", "#f28e2b"))}
    markers = {t: m for t, m in zip(sorted(cells["tokens"].unique()), "os^Dv")}
    for (gpu, tokens), part in cells.groupby(["GPU", "tokens"]):
        left.scatter(part["measured_pct"], part["predicted_pct"], s=16, alpha=0.7, lw=0, color=colors[gpu],
                     marker=markers[tokens], label=f"{gpu}, {tokens} tokens")
    lo = min(cells["measured_pct"].min(), cells["predicted_pct"].min()) - 3
    hi = max(cells["measured_pct"].max(), cells["predicted_pct"].max()) + 3
    left.plot([lo, hi], [lo, hi], color="black", lw=0.8)
    left.set(xlim=(lo, hi), ylim=(lo, hi), xlabel="measured % of copy bandwidth", ylabel="predicted % of copy bandwidth")
    left.grid(True, lw=0.3, alpha=0.5)
    left.legend(fontsize=7, frameon=False, loc="upper left")
    groups = cells.groupby(["GPU", "tokens", "family"])[["effective_kib", "needed_kib", "nominal_kib"]].median()
    labels = [f"{_short(g)}, {t}, {f}" for g, t, f in groups.index]  # slanted: a dozen groups side by side
    x = np.arange(len(groups))
    right.bar(x, groups["effective_kib"], color=[colors[g] for g, _, _ in groups.index], alpha=0.8,
              label="in flight on average (model)")
    right.scatter(x, groups["needed_kib"], marker="_", s=500, color="black", lw=2, zorder=3,
                  label="needed: stream per SM × round trip")
    right.set_xticks(x, labels, fontsize=7, rotation=30, ha="right", rotation_mode="anchor")
    right.set_ylabel("KiB per SM")
    right.grid(True, axis="y", lw=0.3, alpha=0.5)
    right.legend(fontsize=8, frameon=False, loc="upper left")
    fig.suptitle("What binds at the public cells" + (f" · {title}" if title else ""), fontsize=10)
    fig.tight_layout()
    return fig


def binds_reading(summary: pd.DataFrame, family: str = "distribution") -> str:
    """One paragraph from a :func:`binds_summary` frame about ``family``: per GPU and token count, measured and
    predicted % of copy and the bound named, and the bytes in flight against the need."""
    part = summary[summary["family"] == family]
    if part.empty:
        return f"No {family} cell was recorded."
    parts = [f"{_short(r['GPU'])} at {r['tokens']} tokens: measured {r['measured % of copy']:.1f}%, predicted "
             f"{r['predicted % of copy']:.1f}% (bound: {r['bound']}; {r['KiB in flight / SM']:.1f} of "
             f"{r['KiB needed / SM']:.1f} KiB needed in flight per SM on average, {r['KiB requested / SM']:.0f} KiB "
             "requested a step)" for _, r in part.iterrows()]
    short = part[part["KiB in flight / SM"] < part["KiB needed / SM"]]
    return (f"The {family} losses' public cells (median over each group's cells, % of copy bandwidth): "
            + "; ".join(parts) + ". "
            + (f"In {len(short)} of {len(part)} groups the loads in flight on average fall short of what the round "
               f"trip needs at that GPU's stream rate: the bytes a step are there, but they wait for the step's "
               f"arithmetic, so they are in flight only part of each step."
               if len(short) else "In every group the loads in flight on average cover the round trip."))


def plot_in_flight(sweep: pd.DataFrame, *, target_pct: float = 90.0, title: str = "") -> plt.Figure:
    """Predicted % of copy bandwidth against bytes in flight per SM (log2), one line per resident warps per SM
    (a frame of :func:`in_flight_sweep`), with the target as a dashed line."""
    check_frame(sweep, ("warps_per_sm", "kb_in_flight_per_sm", "pct_of_copy"), "sweep")
    fig, ax = plt.subplots(figsize=(8.2, 4.6))
    cmap = plt.get_cmap("viridis")
    warps = sorted(sweep["warps_per_sm"].unique())
    for i, w in enumerate(warps):
        part = sweep[sweep["warps_per_sm"] == w].sort_values("kb_in_flight_per_sm")
        ax.plot(part["kb_in_flight_per_sm"], part["pct_of_copy"], marker="o", ms=4,
                color=cmap(i / max(1, len(warps) - 1)), label=f"{w} warps / SM")
    ax.axhline(target_pct, color="#d1495b", ls="--", lw=1, label=f"{target_pct:g}% of copy")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("loads in flight per SM (KiB: resident programs × one tile of every input)")
    ax.set_ylabel("predicted % of copy bandwidth")
    ax.set_ylim(0, max(105.0, float(sweep["pct_of_copy"].max()) + 5))
    ax.grid(True, lw=0.3, alpha=0.5)
    ax.legend(fontsize=8, ncol=2, frameon=False, loc="lower right")
    ax.set_title("What the model says a configuration needs" + (f" · {title}" if title else ""), fontsize=10)
    fig.tight_layout()
    return fig


def plot_what_if_registers(frame: pd.DataFrame, *, measured: tuple[int, float] | None = None,
                           title: str = "") -> plt.Figure:
    """The model's time for one kernel as its registers per thread vary (:func:`perfutils.model.predict.
    what_if_registers`): predicted ms (left axis) and programs per SM (right axis, steps); ``measured``: the recorded
    (registers, ms) of the kernel as compiled, drawn as a point."""
    check_frame(frame, ["n_regs", "blocks_per_sm", "predicted_ms", "bound"], "frame")
    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    ax.plot(frame["n_regs"], frame["predicted_ms"], color="tab:blue", label="predicted (model)")
    if measured is not None:
        ax.plot([measured[0]], [measured[1]], "o", color="black", label="measured (as compiled)")
    ax.set_xlabel("registers per thread")
    ax.set_ylabel("time (ms)")
    top = max(frame["predicted_ms"].max(), measured[1] if measured is not None else 0.0)
    ax.set_ylim(0, 1.25 * top)
    twin = ax.twinx()
    twin.step(frame["n_regs"], frame["blocks_per_sm"], where="post", color="tab:orange", alpha=0.6,
              label="programs per SM")
    twin.set_ylabel("programs per SM")
    twin.set_ylim(bottom=0)
    handles = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    ax.legend(handles, [h.get_label() for h in handles], loc="lower right", fontsize=8)
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return fig


def counts_reading(frame: pd.DataFrame) -> str:
    """One sentence on a check frame with ``counted_kernels`` and ``kernels`` columns (:func:`~perfutils.model.
    predict.check`, :func:`perfutils.provenance.row_kernel_sources`): how many configurations take a step counted
    offline, and how many of those ran the kernel sources their counts were compiled from."""
    check_frame(frame, ("counted_kernels", "kernels"), "frame")
    counted = frame[frame["counted_kernels"] != ""]
    if counted.empty:
        return f"None of the {len(frame)} configurations takes a step counted offline."
    named = counted["counted_kernels"].notna()
    start = f"{len(counted)} of the {len(frame)} configurations take a lagged step counted offline"
    if not named.any():
        return start + "; the counts name no kernel sources (counted before the counts file recorded them)."
    from ..provenance import source_match

    same, other, unknown = source_match(counted["counted_kernels"], counted["kernels"])
    unknown &= named  # counts that name no sources are told apart below
    parts = [f"{int(same.sum())} ran the kernel sources their counts were compiled from",
             f"{int(other.sum())} ran other sources (their counts are of other kernels)" if other.any() else "",
             f"{int(unknown.sum())} ran sources the history cannot tell" if unknown.any() else "",
             f"{int((~named).sum())} have counts that name no sources" if (~named).any() else ""]
    return start + ": " + ", ".join(p for p in parts if p) + "."


def speedup_reading(first: pd.DataFrame, second: pd.DataFrame, labels=("H100", "H200")) -> str:
    """One sentence: on the configurations both GPUs ran (same study and key, two :func:`~perfutils.model.predict.
    check` frames), how much faster the second was measured and predicted (medians of the time ratios). A measured
    gain well under the predicted one says the second GPU's extra bandwidth is not what those kernels wait for.
    Frames with a ``kernels`` column (:func:`perfutils.provenance.row_kernel_sources`) are compared like with like:
    only the pairs whose two rows ran identical kernel sources, and the sentence says how many others there were;
    where no pair did, all pairs, and the sentence says that the ratio holds the code's changes too."""
    check_frame(first, ("study", "config_key", "measured_ms", "predicted_ms"), "first")
    check_frame(second, ("study", "config_key", "measured_ms", "predicted_ms"), "second")
    both = first.merge(second, on=["study", "config_key"], suffixes=("_a", "_b"))
    both = both[both["measured_ms_a"].notna() & both["measured_ms_b"].notna()]
    if both.empty:
        return f"No configuration was recorded on both the {labels[0]} and the {labels[1]}."
    aside = ""
    if "kernels_a" in both and "kernels_b" in both:
        from ..provenance import source_match

        same, different, unknown = source_match(both["kernels_a"], both["kernels_b"])
        other, unknown = int(different.sum()), int(unknown.sum())
        parts = [f"{other} ran different kernel sources on the two GPUs" if other else "",
                 f"{unknown} ran sources the history cannot tell" if unknown else ""]
        parts = " and ".join(p for p in parts if p)
        if not same.any():  # no like-for-like pair: the ratio of them all, said to mix code with GPU
            aside = (f" (none is known to have run identical kernel sources on both: {parts}, so the ratio holds "
                     "the code's changes as well as the GPUs')")
        else:
            aside = f" with identical kernel sources on both (left out: {parts})" if parts else (
                " with identical kernel sources on both")
            both = both[same]
    measured = float((both["measured_ms_a"] / both["measured_ms_b"]).median())
    predicted = float((both["predicted_ms_a"] / both["predicted_ms_b"]).median())
    return (f"On the {len(both)} configurations recorded on both GPUs{aside}, the {labels[1]} ran a median "
            f"{measured:.2f}x as fast as the {labels[0]}; the model, from the two GPUs' ceilings, predicts "
            f"{predicted:.2f}x.")


def needs_reading(least: pd.DataFrame) -> str:
    """One sentence per GPU from :func:`least_in_flight` frames stacked with ``GPU`` and ``target`` columns: the
    fewest bytes in flight per SM (programs x tile, steps of loads ahead) that the model says reach the target, or
    the best the grid reaches where none does."""
    check_frame(least, ("GPU", "target", "loads_ahead", "reaches", "kb_in_flight_per_sm", "resident", "tile",
                        "warps_per_sm", "pct_of_copy"), "least")
    sentences = []
    for gpu, part in least.groupby("GPU", sort=False):
        target = part["target"].iloc[0]
        said = []
        for r in part.sort_values("loads_ahead").itertuples():
            how = ("loads waiting for the step's arithmetic" if r.loads_ahead == 0
                   else f"loads issued {r.loads_ahead} step{'s' if r.loads_ahead > 1 else ''} ahead")
            if r.reaches:
                said.append(f"with {how}, {r.kb_in_flight_per_sm:.0f} KiB per SM ({r.resident} programs of "
                            f"{r.tile}-element tiles, {r.warps_per_sm} warps) reach {r.pct_of_copy:.1f}%")
            else:
                said.append(f"with {how}, no configuration of the grid does (best {r.pct_of_copy:.1f}%, "
                            f"{r.kb_in_flight_per_sm:.0f} KiB per SM)")
        sentences.append(f"{gpu}, {target:g}% of copy: " + "; ".join(said) + ".")
    return " ".join(sentences)


def built_check(records, gpu: Gpu, steps: dict | None = None) -> pd.DataFrame:
    """One row per cooperative split_row plan an exploration timed (``perfutils.data.records.exploration_records`` of
    its log; streams and plans of one program a row left out) with the model's prediction for it from its registers,
    grid and schedule (``predict_launch``): the design (the plan's schedule: "lagged", "kept", ...), measured and
    predicted % of copy (the same bytes over the predicted time) and the bound the model names. A label's
    ``/ke<n>`` is the kept schedule's keep_steps. ``steps``: ``{(loss, target format, vocab, label): instructions
    a step}`` counted in the plans' offline SASS (``perfutils.model.cubin.main_loop_instructions``); a plan found
    there is predicted from its count (``predicted_pct``, ``counted``: True), the others from the model's
    per-element estimate."""
    import re

    rows = []
    for record in records:
        if "ms" not in record or not record.get("schedule"):  # a stream, a failed plan, one program a row
            continue
        block, warps = (int(value) for value in record["cfg"].split("/")[:2])
        keep = re.search(r"/ke(\d+)", record["cfg"])
        counted = (steps or {}).get((record["loss"], record["fmt"], record["vocab"], record["cfg"]))
        plan = {"schedule": record["schedule"], "programs": record["programs"], "num_chunks": record["chunks"],
                **({"keep_steps": int(keep.group(1))} if keep else {}),
                **({"instructions_per_step": counted} if counted else {})}
        predicted = predict_launch(gpu, loss=record["loss"], target_format=record["fmt"], tokens=record["tokens"],
                                   vocab=record["vocab"], variant="split_row", block_size=block, num_warps=warps,
                                   n_regs=record["regs"], plan=plan)
        behind = LAG_STEPS if record["schedule"] == "lagged" else int(keep.group(1)) if keep else 1
        rows.append({"loss": record["loss"], "target_format": record["fmt"], "tokens": record["tokens"],
                     "vocab": record["vocab"], "design": record["schedule"],
                     "config": record["cfg"], "n_regs": record["regs"], "programs": record["programs"],
                     "chunks": record["chunks"],
                     "steps": record["tokens"] * record["chunks"] / record["programs"] + behind,
                     "measured_ms": record["ms"], "predicted_ms": predicted.ms,
                     "measured_pct": record["pct"], "predicted_pct": record["pct"] * record["ms"] / predicted.ms,
                     "bound": predicted.bound, "counted": bool(counted)})
    return pd.DataFrame(rows)


def built_summary(frame: pd.DataFrame) -> pd.DataFrame:
    """Per cell and design of a :func:`built_check` frame, the configuration measured fastest: its % of copy measured
    and predicted, its registers and programs."""
    check_frame(frame, ("loss", "target_format", "tokens", "vocab", "design", "config", "measured_pct",
                        "predicted_pct"), "built")
    keys = ["loss", "target_format", "tokens", "vocab", "design"]
    best = frame.loc[frame.groupby(keys, sort=False)["measured_pct"].idxmax()]
    columns = keys + ["config", "n_regs", "programs", "measured_pct", "predicted_pct", "bound"]
    return best[columns].reset_index(drop=True)


def built_reading(frame: pd.DataFrame, built: str = "kept", baseline: str = "lagged") -> str:
    """What a :func:`built_check` frame says: at how many cells the built design's best configuration beat the
    baseline's, by how much it missed, and how far the model was off for each design (median of predicted - measured
    over every plan, in points of copy bandwidth)."""
    summary = built_summary(frame)
    keys = ["loss", "target_format", "tokens", "vocab"]
    pair = summary[summary["design"] == built].merge(summary[summary["design"] == baseline], on=keys,
                                                     suffixes=("_built", "_base"))
    gap = pair["measured_pct_built"] - pair["measured_pct_base"]
    miss = (frame["predicted_pct"] - frame["measured_pct"]).groupby(frame["design"]).agg(["median", "size"])
    won = int((gap > 0).sum())
    return (f"The {built} design beat the {baseline} one at {won} of {len(pair)} cells (best configuration of each: "
            f"{gap.min():+.1f} to {gap.max():+.1f} points of copy bandwidth). The model predicted the {built} plans a "
            f"median {miss.at[built, 'median']:+.1f} points from what they measured ({miss.at[built, 'size']} plans), "
            f"the {baseline} plans {miss.at[baseline, 'median']:+.1f} ({miss.at[baseline, 'size']}).")


def counted_steps(offline_records) -> dict:
    """``{(loss, target format, vocab, label): instructions a step}`` of an offline compile log's records
    (``explore_lagged.py offline-kept``: ``step`` from each plan's SASS), as :func:`built_check` takes them."""
    return {(r["loss"], r["fmt"], r["vocab"], r["cfg"]): r["step"] for r in offline_records if "step" in r}


def step_split(offline_records) -> pd.DataFrame:
    """What a step's instructions are made of, per loss and design: a straight line through the counted steps of the
    plain plans (4 warps, no option but the schedule; rows 16-byte aligned, so no peeled head and tail) against the
    elements a thread holds of a chunk: ``fixed`` (instructions that do not grow with the chunk: the row's summaries
    and scalars, publishing, the poll) and ``per_element``, with the widest miss of the line (``worst``)."""
    rows = []
    for r in offline_records:
        block, warps, *options = r["cfg"].split("/")
        if "step" not in r or r["vocab"] % 8 or int(warps) != 4 or options not in ([], ["sckept"]):
            continue
        rows.append({"loss": r["loss"], "target_format": r["fmt"], "design": "kept" if options else "lagged",
                     "elements": int(block) / (32 * int(warps)), "step": r["step"]})
    frame = pd.DataFrame(rows)
    out = []
    for (loss, fmt, design), group in frame.groupby(["loss", "target_format", "design"], sort=False):
        slope, fixed = np.polyfit(group["elements"], group["step"], 1)
        worst = float(np.abs(fixed + slope * group["elements"] - group["step"]).max())
        out.append({"loss": loss, "target_format": fmt, "design": design, "fixed": fixed, "per_element": slope,
                    "worst": worst, "plans": len(group)})
    return pd.DataFrame(out)


def nsight_steps(records, profiles, steps: dict | None = None) -> pd.DataFrame:
    """One row per profiled plan: a run's timed records (``exploration_records``) beside Nsight Compute's reading of
    each launch's step (``perfutils.data.source_page.step_profile``, the same order): % of copy, registers, the
    instructions a warp executed a step (and the SASS count of ``steps`` where given), how often the poll went round
    again a step, and where the samples found the warps: on loaded data (``data_wait``), at the poll's compare with
    the empty word (``compare``), inside the poll loop (``poll_loop``), at a barrier. ``loss`` is loss/target
    format (one column: the table fits a page)."""
    if len(records) != len(profiles):
        raise ValueError(f"{len(records)} timed records but {len(profiles)} profiled launches")
    rows = []
    for record, profile in zip(records, profiles):
        key = (record["loss"], record["fmt"], record["vocab"], record["cfg"])
        rows.append({"loss": f"{record['loss']}/{record['fmt']}", "vocab": record["vocab"],
                     "design": record["schedule"], "config": record["cfg"], "pct_of_copy": record["pct"],
                     "n_regs": record["regs"], "step_executed": profile["step_instructions"],
                     "step_counted": (steps or {}).get(key, np.nan), "polls_again": profile["nested_passes"],
                     "data_wait_pct": profile["long_sb_pct"], "compare_pct": profile.get("marker_pct", np.nan),
                     "poll_loop_pct": profile["nested_pct"], "barrier_pct": profile["barrier_pct"]})
    return pd.DataFrame(rows)


def counted_reading(estimated: pd.DataFrame, counted: pd.DataFrame) -> str:
    """How far the model was off, per design, before and after it was given each plan's counted step: two
    :func:`built_check` frames of the same records, without and with ``steps``."""
    parts = []
    for design in estimated["design"].unique():
        before = estimated.loc[estimated["design"] == design]
        after = counted.loc[(counted["design"] == design) & counted["counted"]]
        miss_before = before["predicted_pct"] - before["measured_pct"]
        miss_after = after["predicted_pct"] - after["measured_pct"]
        if after.empty:
            continue
        parts.append(f"the {design} plans {miss_before.median():+.1f} ({miss_before.min():+.1f} to "
                     f"{miss_before.max():+.1f}) become {miss_after.median():+.1f} ({miss_after.min():+.1f} to "
                     f"{miss_after.max():+.1f}) over {len(after)} plans")
    return ("Given each plan's step as counted in its SASS instead of the per-element estimate, the model's miss "
            "(median, and range, in points of copy bandwidth): " + "; ".join(parts) + ".")


def step_residuals(frame: pd.DataFrame) -> pd.DataFrame:
    """What the model misses a step, per design and chunks a row, over the counted plans of a :func:`built_check`
    frame (given ``steps``): the measured minus the predicted time over the steps a program takes, in microseconds
    (median, least, most, plans). A wait for a row's slowest program would grow with the chunks a row; a round trip
    the model does not count would not."""
    counted = frame[frame["counted"]]
    per_step = (counted["measured_ms"] - counted["predicted_ms"]) * 1e3 / counted["steps"]
    table = per_step.groupby([counted["design"], counted["chunks"]]).agg(["median", "min", "max", "size"])
    return table.rename(columns={"median": "median_us", "min": "least_us", "max": "most_us", "size": "plans"}
                        ).reset_index()


def residual_reading(table: pd.DataFrame) -> str:
    """One sentence on a :func:`step_residuals` table: per design, the median miss a step and its range over the
    chunks a row, and whether it rises with them (the rank correlation of the per-chunk medians with the chunks)."""
    parts = []
    for design, rows in table.groupby("design", sort=False):
        trend = rows["chunks"].rank().corr(rows["median_us"].rank()) if len(rows) > 2 else float("nan")
        parts.append(f"{design} {rows['median_us'].median():.2f} µs ({rows['median_us'].min():.2f} to "
                     f"{rows['median_us'].max():.2f} over {rows['chunks'].min()} to {rows['chunks'].max()} chunks a "
                     f"row; rank correlation with the chunks {trend:+.2f})")
    return ("What the model still misses, a step, given the counted instructions (median of the per-chunk medians): "
            + "; ".join(parts) + ".")


def round_trip_check(frame: pd.DataFrame) -> pd.DataFrame:
    """The term :func:`step_residuals` points at, fitted and checked: per design, one round trip a step (microseconds)
    fitted as the median per-step miss of half the counted plans of a :func:`built_check` frame (given ``steps``;
    every other plan in (loss, target format, vocab, label) order), then added to the model's time for the other
    half: their median |error| in % of the measured time and their median miss in points of copy, without and with
    the term."""
    counted = frame[frame["counted"]].sort_values(["loss", "target_format", "vocab", "config"]).reset_index(drop=True)
    rows = []
    for design, plans in counted.groupby("design", sort=False):
        fit, held = plans.iloc[::2], plans.iloc[1::2]
        if fit.empty or held.empty:
            continue
        trip_us = float(((fit["measured_ms"] - fit["predicted_ms"]) * 1e3 / fit["steps"]).median())
        with_trip = held["predicted_ms"] + trip_us * held["steps"] / 1e3
        row = {"design": design, "round_trip_us": trip_us, "fitted_on": len(fit), "checked_on": len(held)}
        for name, predicted in (("without", held["predicted_ms"]), ("with", with_trip)):
            row[f"error_pct_{name}"] = float(((predicted - held["measured_ms"]).abs() / held["measured_ms"]).median()
                                             * 100)
            row[f"miss_points_{name}"] = float((held["measured_pct"] * held["measured_ms"] / predicted
                                                - held["measured_pct"]).median())
        rows.append(row)
    return pd.DataFrame(rows)


def round_trip_reading(table: pd.DataFrame) -> str:
    """One sentence on a :func:`round_trip_check` table."""
    parts = [f"the {r.design} plans {r.round_trip_us:.2f} µs a step (fitted on {r.fitted_on}); on the other "
             f"{r.checked_on} the median error goes from {r.error_pct_without:.1f}% to {r.error_pct_with:.1f}% of the "
             f"measured time ({r.miss_points_without:+.1f} to {r.miss_points_with:+.1f} points of copy)"
             for r in table.itertuples()]
    return "One round trip a step, fitted on half the counted plans and checked on the other half: " + "; ".join(
        parts) + "."
