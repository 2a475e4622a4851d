"""Figures and tables of notebook 09 (what users call, over the vocabularies models ship with).

Functions of the frame :mod:`perfutils.studies.vocab_sweep` records (``vocab_sweep.csv``): :func:`plot_pct_of_copy`
(% of copy bandwidth against the vocabulary, one panel per loss and token count, the project's public call, its
autograd form and its kernel-only plan beside the peers: a cliff shows as a drop of one line),
:func:`plot_host_cost` (host microseconds per call and synchronizations per call, per provider) and the tables
:func:`cell_table` (one row per loss x vocab), :func:`worst_cells` (the grid's worst cells) and
:func:`autograd_ratio` / :func:`autograd_line` (the autograd form's time over the plain call's, where one process
measured both side by side). Quoted reference
figures (quack: ``quack_reference.csv``) are drawn as hollow markers and never mixed into measured rows.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from ..notebook import span
from .figures import check_frame, figure_context

__all__ = ["PROVIDER_LABELS", "PROVIDER_ORDER", "PEERS", "auto_choices", "autograd_line", "autograd_ratio",
           "cell_table", "gpu_comparison_line", "host_cost_table", "latest_pairs", "loss_label", "measured",
           "plot_host_cost", "plot_pct_of_copy", "sync_line", "worst_cells"]

PROVIDER_ORDER = ("public", "public_autograd", "plan", "torch_compile", "fast_llm", "liger", "quack")
PROVIDER_LABELS = {
    "public": "public call (ours)",
    "public_autograd": "autograd: entropy_loss + backward (ours)",
    "plan": "plan, kernel-only (ours)",
    "torch_compile": "torch.compile",
    "fast_llm": "Fast-LLM",
    "liger": "Liger-Kernel",
    "quack": "quack",
}
PEERS = ("torch_compile", "fast_llm", "liger", "quack")
LOSS_ORDER = ("cross_entropy (labels)", "cross_entropy (logits)", "forward_kl", "reverse_kl")
_STYLE = {  # color, line style, marker
    "public": ("#1f4e9c", "-", "o"),
    "public_autograd": ("#5b8fd9", "-", "^"),
    "plan": ("#8c8c8c", ":", "."),
    "torch_compile": ("#d1495b", "--", "s"),
    "fast_llm": ("#2e933c", "--", "D"),
    "liger": ("#edae49", "--", "v"),
    "quack": ("#7b2d8b", "--", "P"),
}
_NEEDED = ("loss", "target_format", "variant", "dtype", "tokens", "vocab", "ms_median", "pct_of_copy", "status",
           "gpu_name")


def loss_label(loss: str, target_format: str) -> str:
    """'cross_entropy (labels)', 'cross_entropy (logits)', 'forward_kl', 'reverse_kl': a loss as the pages name it."""
    return f"{loss} ({target_format})" if loss == "cross_entropy" else loss


def measured(df: pd.DataFrame, *, dtype: str | None = "bf16") -> pd.DataFrame:
    """The ok rows (of ``dtype``), with ``loss_label`` and ``provider`` (the variant) columns."""
    check_frame(df, _NEEDED, "vocab sweep")
    rows = df[df["status"] == "ok"]
    if dtype is not None:
        rows = rows[rows["dtype"] == dtype]
    if rows.empty:
        raise ValueError(f"no ok rows{f' of dtype {dtype}' if dtype else ''} to show")
    rows = rows.copy()
    rows["loss_label"] = [loss_label(l, f) for l, f in zip(rows["loss"], rows["target_format"])]
    rows["provider"] = rows["variant"]
    return rows


def _providers(rows: pd.DataFrame) -> list[str]:
    present = set(rows["provider"])
    return [p for p in PROVIDER_ORDER if p in present] + sorted(present - set(PROVIDER_ORDER))


def _quoted_pct(reference: pd.DataFrame | None, gpu: str, copy_gbps: float | None) -> pd.DataFrame | None:
    """Quoted rows on this figure's GPU, with % of this data's copy bandwidth (None when they do not apply)."""
    if reference is None or reference.empty or not copy_gbps:
        return None
    check_frame(reference, ("tokens", "vocab", "gbps", "gpu_name", "loss", "target_format"), "reference")
    same = reference[reference["gpu_name"] == gpu].copy()
    if same.empty:
        return None
    same["pct_of_copy"] = 100.0 * same["gbps"] / copy_gbps
    same["loss_label"] = [loss_label(l, f) for l, f in zip(same["loss"], same["target_format"])]
    return same


def plot_pct_of_copy(df: pd.DataFrame, *, dtype: str = "bf16", reference: pd.DataFrame | None = None,
                     title: str = ""):
    """% of measured copy bandwidth against vocab: a panel per (tokens, loss), a line per provider (small ticks
    on the log-scaled vocab axis: every measured vocab).

    ``reference``: quoted figures (``quack_reference.csv``) drawn as hollow stars where their GPU is the data's, as
    % of the data's copy bandwidth. Returns the figure."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    rows = measured(df, dtype=dtype)
    text, copy_gbps = figure_context(df)
    tokens = sorted(rows["tokens"].unique())
    losses = [l for l in LOSS_ORDER if l in set(rows["loss_label"])]
    providers = _providers(rows)
    quoted = _quoted_pct(reference, rows["gpu_name"].iloc[0], copy_gbps)
    fig, axes = plt.subplots(len(tokens), len(losses), figsize=(3.6 * len(losses), 2.6 * len(tokens) + 1.2),
                             squeeze=False, sharex=True, sharey=True, layout="constrained")
    vocabs = sorted(rows["vocab"].unique())

    def slot(values) -> np.ndarray:
        """A vocabulary's slot on the x axis (between two slots, by log size, for one that was not measured)."""
        return np.interp(np.log2(np.asarray(values, dtype=float)), np.log2(vocabs), np.arange(len(vocabs)))

    for i, n_tokens in enumerate(tokens):
        for j, label in enumerate(losses):
            ax = axes[i][j]
            panel = rows[(rows["tokens"] == n_tokens) & (rows["loss_label"] == label)]
            for provider in providers:
                line = panel[panel["provider"] == provider].sort_values("vocab")
                if line.empty:
                    continue
                color, style, marker = _STYLE.get(provider, ("black", "-", "x"))
                ax.plot(slot(line["vocab"]), line["pct_of_copy"], linestyle=style, marker=marker, color=color,
                        markersize=3.5, linewidth=1.2)
            if quoted is not None:
                here = quoted[(quoted["tokens"] == n_tokens) & (quoted["loss_label"] == label)]
                ax.scatter(slot(here["vocab"]), here["pct_of_copy"], marker="*", s=70, facecolors="none",
                           edgecolors=_STYLE["quack"][0], linewidths=1.0, zorder=5)
            ax.axhline(100, color="grey", linestyle="--", linewidth=0.8)
            # one slot per measured vocabulary, in order: 32000, 32064 and 32768 (or 50257 and 50304) are a few
            # percent apart, and on a scaled axis their points would stack into vertical spikes
            ax.set_xticks(range(len(vocabs)))
            ax.set_xticklabels([str(v) for v in vocabs], rotation=90, fontsize=6)
            ax.set_ylim(0, max(110.0, float(rows["pct_of_copy"].max()) + 5))
            ax.grid(alpha=0.3)
            ax.set_title(f"{label}, {n_tokens} tokens", fontsize=8.5)
            if j == 0:
                ax.set_ylabel("% of copy bandwidth")
            if i == len(tokens) - 1:
                ax.set_xlabel("vocab (each measured size one slot)", fontsize=8.5)
    handles = [Line2D([], [], color=_STYLE.get(p, ("black",))[0], linestyle=_STYLE.get(p, ("", "-"))[1],
                      marker=_STYLE.get(p, ("", "", "x"))[2], label=PROVIDER_LABELS.get(p, p)) for p in providers]
    if quoted is not None:
        handles.append(Line2D([], [], marker="*", linestyle="", markerfacecolor="none", markersize=9,
                              color=_STYLE["quack"][0],
                              label=f"quack, quoted ({quoted['gpu_name'].iloc[0]}, {quoted['measured'].iloc[0]}; "
                              "not measured here)" if "measured" in quoted else "quack, quoted (not measured here)"))
    fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 4), fontsize=7.5)
    headline = title or (f"fwd+bwd, {dtype}: % of measured copy bandwidth ({copy_gbps:.0f} GB/s)" if copy_gbps
                         else f"fwd+bwd, {dtype}: % of measured copy bandwidth")
    fig.suptitle(f"{headline} · {text}", fontsize=9.5)
    return fig


def host_cost_table(df: pd.DataFrame, *, dtype: str = "bf16") -> pd.DataFrame:
    """Per provider and loss: host µs per call (median, min and max over the vocabularies) and syncs per call
    (the most seen at any shape)."""
    rows = measured(df, dtype=dtype)
    check_frame(rows, ("host_us_per_call", "syncs_per_call"), "vocab sweep (host cost columns)")
    rows = rows.dropna(subset=["host_us_per_call"])
    if rows.empty:
        raise ValueError("no row with host_us_per_call")
    host = rows.drop_duplicates(["provider", "loss_label", "dtype", "vocab"])  # one value per vocab (token-free)
    table = host.groupby(["provider", "loss_label"]).agg(host_us=("host_us_per_call", "median"),
                                                          host_us_low=("host_us_per_call", "min"),
                                                          host_us_high=("host_us_per_call", "max"),
                                                          vocabs=("vocab", "nunique")).reset_index()
    syncs = rows.groupby(["provider", "loss_label"])["syncs_per_call"].max().rename("syncs_per_call")
    table = table.join(syncs, on=["provider", "loss_label"])
    order = {p: i for i, p in enumerate(_providers(rows))}
    losses = {l: i for i, l in enumerate(LOSS_ORDER)}
    return table.sort_values(["provider", "loss_label"], key=lambda s: s.map(order if s.name == "provider" else losses)
                             ).reset_index(drop=True)


def plot_host_cost(df: pd.DataFrame, *, dtype: str = "bf16", title: str = ""):
    """Bars of host µs per call (8-row problems; whiskers: the range over vocabularies) per provider, one bar per
    loss, with the synchronizations per call written above each provider."""
    import matplotlib.pyplot as plt
    import numpy as np

    table = host_cost_table(df, dtype=dtype)
    text, _ = figure_context(df)
    providers = list(dict.fromkeys(table["provider"]))
    losses = [l for l in LOSS_ORDER if l in set(table["loss_label"])]
    width = 0.8 / max(len(losses), 1)
    fig, ax = plt.subplots(figsize=(1.6 * len(providers) + 3.5, 4.0), layout="constrained")
    colors = ["#1f4e9c", "#5b8fd9", "#d1495b", "#edae49"]
    for k, label in enumerate(losses):
        part = table[table["loss_label"] == label].set_index("provider")
        xs, heights, low, high = [], [], [], []
        for i, provider in enumerate(providers):
            if provider in part.index:
                xs.append(i + (k - (len(losses) - 1) / 2) * width)
                heights.append(part.loc[provider, "host_us"])
                low.append(part.loc[provider, "host_us"] - part.loc[provider, "host_us_low"])
                high.append(part.loc[provider, "host_us_high"] - part.loc[provider, "host_us"])
        ax.bar(xs, heights, width=width * 0.95, color=colors[k % len(colors)], label=label,
               yerr=np.array([low, high]), capsize=2, error_kw={"linewidth": 0.8})
    top = table["host_us_high"].max()
    for i, provider in enumerate(providers):
        syncs = table.loc[table["provider"] == provider, "syncs_per_call"]
        most = syncs.max()
        note = "syncs not counted" if pd.isna(most) else f"{int(most)} sync{'s' if int(most) != 1 else ''}/call"
        ax.text(i, top * 1.08, note, ha="center", fontsize=7.5)
    ax.set_xlim(-0.6, len(providers) - 0.4)
    ax.set_xticks(range(len(providers)))
    ax.set_xticklabels([PROVIDER_LABELS.get(p, p).replace(" (ours)", "\n(ours)").replace(": ", ":\n")
                        for p in providers], fontsize=7.5)
    ax.set_ylabel("host µs per call (8 rows, no sync between calls)")
    ax.set_ylim(0, top * 1.2 if math.isfinite(top) and top > 0 else 1)
    ax.grid(axis="y", alpha=0.3)
    fig.legend(fontsize=7.5, loc="outside right upper")
    ax.set_title(f"{title or f'What a call costs the host ({dtype})'} · {text}", fontsize=9)
    return fig


def cell_table(df: pd.DataFrame, *, tokens: int = 4096, dtype: str = "bf16", vocabs=None) -> pd.DataFrame:
    """One row per (loss, vocab) at ``tokens``: ms of each provider, and of the public call its % of copy, host µs
    and syncs per call."""
    rows = measured(df, dtype=dtype)
    rows = rows[rows["tokens"] == tokens]
    if vocabs is not None:
        rows = rows[rows["vocab"].isin(list(vocabs))]
    if rows.empty:
        raise ValueError(f"no ok rows at {tokens} tokens{' for vocabs ' + str(list(vocabs)) if vocabs else ''}")
    ms = rows.pivot_table(index=["loss_label", "vocab"], columns="provider", values="ms_median", aggfunc="min")
    public = rows[rows["provider"] == "public"].set_index(["loss_label", "vocab"])
    for column in ("pct_of_copy", "host_us_per_call", "syncs_per_call"):
        ms[f"public_{column}"] = public[column] if column in public else float("nan")
    ms = ms.reset_index()
    ms["loss_label"] = pd.Categorical(ms["loss_label"], [l for l in LOSS_ORDER if l in set(ms["loss_label"])],
                                      ordered=True)
    return ms.sort_values(["loss_label", "vocab"]).reset_index(drop=True)


def worst_cells(df: pd.DataFrame, *, dtype: str = "bf16") -> dict:
    """The grid's worst cells for the public call: against the best peer measured at that (loss, tokens, vocab)
    (``vs_peer``: the highest public / best-peer time), and against the copy bandwidth (``lowest_pct``)."""
    rows = measured(df, dtype=dtype)
    keys = ["loss_label", "tokens", "vocab"]
    public = rows[rows["provider"] == "public"].set_index(keys)
    if public.empty:
        raise ValueError("no ok public-call rows")
    result = {"cells": len(public)}
    peers = rows[rows["provider"].isin(PEERS)]
    if not peers.empty:
        best = peers.loc[peers.groupby(keys)["ms_median"].idxmin()].set_index(keys)
        best = best[["provider", "ms_median"]].rename(columns={"provider": "peer", "ms_median": "peer_ms"})
        both = public.join(best, how="inner")
        if not both.empty:
            both["ratio"] = both["ms_median"] / both["peer_ms"]
            worst = both["ratio"].idxmax()
            cell = both.loc[worst]
            result["vs_peer"] = dict(zip(keys, worst), ratio=float(cell["ratio"]), peer=cell["peer"],
                                     peer_ms=float(cell["peer_ms"]), ms=float(cell["ms_median"]),
                                     pct_of_copy=float(cell["pct_of_copy"]), cells=len(both))
    lowest = public["pct_of_copy"].idxmin()
    result["lowest_pct"] = dict(zip(keys, lowest), pct_of_copy=float(public.loc[lowest, "pct_of_copy"]),
                                ms=float(public.loc[lowest, "ms_median"]))
    return result


def auto_choices(df: pd.DataFrame, *, provider: str = "public", dtype: str = "bf16") -> pd.DataFrame:
    """What variant auto ran for ``provider``'s rows (their ``plan_config``): variant, block size, warps, options and
    where the choice came from (first-call search, tuning table, heuristic), beside the row's % of copy."""
    rows = measured(df, dtype=dtype)
    rows = rows[rows["provider"] == provider]
    if rows.empty:
        raise ValueError(f"no ok rows of {provider!r}")
    configs = [json.loads(text) if isinstance(text, str) and text else {} for text in rows.get("plan_config", [])]
    fields = ("variant", "block_size", "num_warps", "options", "source")
    chosen = pd.DataFrame([{f"chosen_{k}": c.get(k) for k in fields} for c in configs], index=rows.index)
    table = rows[["loss_label", "tokens", "vocab", "ms_median", "pct_of_copy"]].join(chosen)
    table["loss_label"] = pd.Categorical(table["loss_label"], [l for l in LOSS_ORDER if l in set(table["loss_label"])],
                                         ordered=True)
    return table.sort_values(["loss_label", "tokens", "vocab"]).reset_index(drop=True)


def _cells_with_both(rows: pd.DataFrame, first: str, second: str, prefix: str) -> pd.DataFrame:
    """Per (loss, tokens, vocab) that recorded both providers: ``first``'s last row with ``second``'s last row's
    columns beside it, named ``prefix`` + column."""
    keys = ["loss_label", "tokens", "vocab"]

    def last(provider: str) -> pd.DataFrame:
        return rows[rows["provider"] == provider].drop_duplicates(keys, keep="last").set_index(keys)

    return last(first).join(last(second).add_prefix(prefix), how="inner").reset_index()


def autograd_ratio(df: pd.DataFrame, meta: dict, *, dtype: str = "bf16") -> pd.DataFrame:
    """Per (loss, tokens, vocab) with both forms recorded: the autograd form's time (``entropy_loss`` +
    ``.backward()``) over the plain call's (``entropy_loss_forward_backward``), the commit, day and kernel sources
    (:func:`perfutils.provenance.rows_sources`, None where unknown) the plain call's row was recorded with, and
    ``side_by_side``: True where one process measured both (the sidecar's sessions,
    :func:`perfutils.provenance.row_sessions`), so that the ratio compares one code, one machine state."""
    from ..provenance import row_commits, row_sessions, rows_sources

    columns = ["loss_label", "tokens", "vocab", "public_ms", "autograd_ms", "autograd_over_public", "code_commit",
               "day", "autograd_time", "side_by_side", "kernels"]
    rows = measured(df, dtype=dtype)
    rows = rows[rows["provider"].isin(["public", "public_autograd"])]
    if rows.empty:
        return pd.DataFrame(columns=columns)
    rows = rows.assign(session=row_sessions(rows, meta), code_commit=row_commits(rows, meta),
                       kernels=rows_sources(rows, meta), day=rows["timestamp_utc"].astype(str).str[:10],
                       time=rows["timestamp_utc"].astype(str))
    both = _cells_with_both(rows, "public", "public_autograd", "autograd_")
    both["side_by_side"] = both["session"] == both["autograd_session"]
    both["autograd_over_public"] = both["autograd_ms_median"] / both["ms_median"]
    both = both.rename(columns={"ms_median": "public_ms", "autograd_ms_median": "autograd_ms"})
    both["loss_label"] = pd.Categorical(both["loss_label"], [l for l in LOSS_ORDER if l in set(both["loss_label"])],
                                        ordered=True)
    both = both.sort_values(["tokens", "vocab", "loss_label"]).reset_index(drop=True)
    return both[columns]


def public_over_plan(df: pd.DataFrame, meta: dict, *, dtype: str = "bf16") -> pd.DataFrame:
    """Per (loss, tokens, vocab) where one process timed both: the public call's time over its own plan's (the
    kernel-only ``plan`` provider: the same kernels, no allocations, no host work), with what could explain a gap:
    the public call's host time a call as a share of the plan's time, its first call's milliseconds (a first call
    that searched left the GPU after a burst of work just before the timing), and ``settled``: whether its process
    idled the GPU after such a first call (the sweep setting ``settle_ms``)."""
    from ..provenance import row_sessions, sessions

    columns = ["loss_label", "tokens", "vocab", "public_ms", "plan_ms", "public_over_plan", "host_share", "first_ms",
               "plan_first_ms", "settled"]
    rows = measured(df, dtype=dtype)
    rows = rows[rows["provider"].isin(["public", "plan"])]
    if rows.empty:
        return pd.DataFrame(columns=columns)
    rows = rows.assign(session=row_sessions(rows, meta))
    if "compile_ms" not in rows:
        rows = rows.assign(compile_ms=np.nan)
    both = _cells_with_both(rows, "public", "plan", "plan_")
    both = both[(both["session"] == both["plan_session"]) & (both["session"] >= 0)]
    both = both.rename(columns={"ms_median": "public_ms", "plan_ms_median": "plan_ms"})
    both["public_over_plan"] = both["public_ms"] / both["plan_ms"]
    host = both["host_us_per_call"] if "host_us_per_call" in both else np.nan
    both["host_share"] = host / 1e3 / both["plan_ms"]
    both["first_ms"], both["plan_first_ms"] = both["compile_ms"], both["plan_compile_ms"]
    settle = [float((s.get("parameters") or {}).get("settle_ms") or 0) for s in sessions(meta)]
    both["settled"] = [settle[i] > 0 for i in both["session"]]
    return both.sort_values(["tokens", "vocab", "loss_label"]).reset_index(drop=True)[columns]


def plan_gap_line(gaps: pd.DataFrame, over: float = 1.05, shown: int = 4) -> str | None:
    """One sentence from :func:`public_over_plan`: the ratio's range, then the cells over ``over`` with what the
    data say of them: whether the host's share explains the gap, whether each public row followed a longer first
    call than every plan row there (a search just before its timing), and whether its process idled the GPU after
    that first call. None without a cell."""
    if gaps.empty:
        return None
    text = (f"The public call over its own plan (kernel-only: the same kernels without allocations or host work), "
            f"both timed by one process: {span(gaps['public_over_plan'])}× over {len(gaps)} cells")
    high = gaps[gaps["public_over_plan"] > over].sort_values("public_over_plan", ascending=False)
    if high.empty:
        return text + f"; none over {over:.2f}×."
    cells = ", ".join(f"{r.loss_label} {r.tokens} × {r.vocab} {r.public_over_plan:.2f}×"
                      for r in high.head(shown).itertuples())
    more = f" and {len(high) - shown} more" if len(high) > shown else ""
    text += f"; over {over:.2f}× at {len(high)}: {cells}{more}."
    if (high["host_share"] < over - 1).all():
        text += (f" The host does not explain them: the public call's host time is at most "
                 f"{100 * high['host_share'].max():.1f}% of the plan's time there.")
    if high["first_ms"].min() > high["plan_first_ms"].max():
        text += (f" Each of these public rows was timed right after a first call of {high['first_ms'].min():.0f} ms "
                 "or more (a first-call search or compiles: the GPU had just run a burst of work), the plan's row of "
                 f"its cell after one of {high['plan_first_ms'].max():.0f} ms at most: read the plan's row there for "
                 "the kernels' time.")
    settled = int(high["settled"].sum())
    if settled == 0:
        text += (" None of them was timed with the GPU idled after its first call; the vocab sweep's stages now do "
                 "that (the sweep setting `settle_ms`, `perfutils.measure.measurer.SETTLE_AFTER_MS`).")
    else:
        text += (f" {settled} of them {'was' if settled == 1 else 'were'} timed with the GPU idled after the first "
                 "call (`settle_ms`): the idle did not remove the gap there.")
    return text


def latest_pairs(ratios: pd.DataFrame) -> pd.DataFrame:
    """The rows of :func:`autograd_ratio` measured side by side with the kernels of its latest such measurement: the
    pairs whose processes ran the same kernel sources as the latest pair's (where the sources are unknown, the same
    commit). Each pair is one process's, so each ratio compares one code on one machine state; pairs of several
    processes, days or commits of identical kernels are set side by side (a vocab sweep measured over several
    sessions, a few cells measured again)."""
    paired = ratios[ratios["side_by_side"]]
    if paired.empty:
        return paired
    keys = _kernels_key(paired)
    latest = paired["autograd_time"].idxmax()
    return paired[keys == keys[latest]]


def _kernels_key(ratios: pd.DataFrame) -> pd.Series:
    """The kernel sources each pair of :func:`autograd_ratio` ran, or its commit where they are unknown ("" where
    both are: such pairs are taken as one unknown code)."""
    kernels = ratios["kernels"] if "kernels" in ratios else pd.Series(None, index=ratios.index, dtype=object)
    commits = ratios["code_commit"].where(ratios["code_commit"].notna(), "")
    return kernels.where(kernels.notna(), "commit " + commits.astype(str))


def autograd_line(ratios: pd.DataFrame) -> str | None:
    """One sentence from :func:`autograd_ratio`: the autograd form over the plain call, per token count, in the
    pairs measured side by side with the latest measurement's kernels (:func:`latest_pairs`: the days and commits
    they span named), then how many side-by-side pairs of other kernels and how many cells whose two rows came from
    different processes (no ratio given). None without a pair."""
    paired = ratios[ratios["side_by_side"]]
    if paired.empty:
        return None
    newest = latest_pairs(ratios)
    parts = []
    for tokens, part in newest.groupby("tokens"):
        vocabs = sorted(part["vocab"].unique())
        where = f"{vocabs[0]}–{vocabs[-1]}" if len(vocabs) > 1 else f"{vocabs[0]}"
        cells = f"{len(part)} cell{'s' if len(part) != 1 else ''}"
        parts.append(f"{span(part['autograd_over_public'])}× at {tokens} tokens ({cells}, vocab {where})")
    days = sorted(newest["day"].unique())
    when = days[0] if len(days) == 1 else f"{days[0]} to {days[-1]}"
    commits = sorted({c for c in newest["code_commit"] if isinstance(c, str)})
    if len(commits) == 1:
        code = f", commit {commits[0]}"
    elif commits:
        code = f", commits {', '.join(commits)} (identical kernel sources)"
    else:
        code = ""
    text = (f"The autograd form (`entropy_loss` + `.backward()`) over the plain call, both measured by one process on "
            f"{when}{code}: " + "; ".join(parts) + ".")
    earlier = paired.drop(newest.index)
    if len(earlier):
        ratio = earlier["autograd_over_public"]
        days = f"{earlier['day'].min()} to {earlier['day'].max()}"
        commits = earlier["code_commit"].nunique()
        text += (f" Earlier side-by-side pairs ({len(earlier)} cell{'s' if len(earlier) != 1 else ''}, {commits} other "
                 f"commit{'s' if commits != 1 else ''}, {days}): {span(ratio)}×.")
    apart = int((~ratios["side_by_side"]).sum())
    if apart:
        text += (f" At {apart} cell{'s' if apart != 1 else ''} the two forms' rows come from different processes "
                 "(other days or code): no ratio is drawn from them.")
    return text


def gpu_comparison_line(df: pd.DataFrame, other: pd.DataFrame, *, dtype: str = "bf16") -> str | None:
    """One sentence on the public call on ``other``'s GPU against ``df``'s at the cells both recorded: against the
    fastest peer measured there (``other``'s own peers), and its % of copy against ``df``'s; where the two rows of a
    cell ran different (or unknown) kernel sources (the sidecars in ``attrs["metadata"]``), how many. None without a
    shared cell."""
    from ..provenance import rows_sources, source_match

    keys = ["loss_label", "tokens", "vocab"]
    mine, theirs = measured(df, dtype=dtype), measured(other, dtype=dtype)

    def public(rows, source):
        """The public call's % of copy per cell and, like with like, the kernel sources each row ran (through the
        sidecar that load_records leaves in attrs)."""
        rows = rows[rows["provider"] == "public"].drop_duplicates(keys, keep="last")
        kernels = rows_sources(rows, source.attrs.get("metadata") or {})
        return rows.assign(kernels=kernels)[[*keys, "pct_of_copy", "kernels"]]

    both = public(mine, df).merge(public(theirs, other), on=keys, suffixes=("_here", "_there"))
    both = both.rename(columns={"pct_of_copy_here": "here", "pct_of_copy_there": "there"})
    if both.empty:
        return None
    gpu, other_gpu = mine["gpu_name"].iloc[0], theirs["gpu_name"].iloc[0]
    lower = int((both["there"] < both["here"]).sum())
    text = (f"At the {len(both)} cells ({dtype}) both GPUs recorded, the public call reaches a lower % of copy on the "
            f"{other_gpu} than on the {gpu} at {lower} (median {both['there'].median():.0f}% against "
            f"{both['here'].median():.0f}%)")
    _, copy_here = figure_context(df)
    _, copy_there = figure_context(other)
    if copy_here and copy_there:
        text += f"; its measured copy bandwidth is {copy_there:.0f} GB/s against {copy_here:.0f}"
    worst = worst_cells(other, dtype=dtype).get("vs_peer")
    if worst:
        verdict = ("faster than the fastest peer measured there at every one of its" if worst["ratio"] < 1
                   else "not faster than the fastest peer at all of its")
        text += (f". On the {other_gpu} it is {verdict} {worst['cells']} cells with a peer (at most "
                 f"{worst['ratio']:.2f}× the best peer's time: {worst['loss_label']} {worst['tokens']} × "
                 f"{worst['vocab']})")
    same, different, unknown = source_match(both["kernels_here"], both["kernels_there"])
    if not same.all():
        text += (f". Of those {len(both)} cells, {int(same.sum())} ran identical kernel sources on both GPUs, "
                 f"{int(different.sum())} different ones and {int(unknown.sum())} sources the history cannot "
                 "tell: the comparison holds the code's changes as well as the GPUs'")
    return text + "."


def sync_line(df: pd.DataFrame, *, dtype: str = "bf16") -> str:
    """One sentence: which providers synchronize with the GPU inside a call, how often, at how many of their shapes
    (``syncs_per_call`` of the ok rows)."""
    rows = measured(df, dtype=dtype).dropna(subset=["syncs_per_call"])
    parts = []
    for provider in _providers(rows):
        mine = rows[rows["provider"] == provider]["syncs_per_call"]
        synced = mine[mine > 0]
        if len(synced):
            low, high = int(synced.min()), int(synced.max())
            many = f"{low}" if low == high else f"{low}–{high}"
            parts.append(f"{PROVIDER_LABELS.get(provider, provider)} {many} at {len(synced)} of its {len(mine)} rows")
    if not parts:
        return f"No provider synchronizes with the GPU inside a call ({len(rows)} rows, {dtype})."
    return ("Device-to-host synchronizations per call, where a provider made any (syncs per call, at how many of its "
            f"{dtype} rows): " + "; ".join(parts) + ".")
