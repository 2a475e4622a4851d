"""Figures and tables of the tensor-parallel notebook (10): functions of the ``tensor_parallel`` records.

Variants in the data: ``tp1-auto`` (one GPU, the whole vocabulary), ``tp2-all_gather``, ``tp2-symmetric`` (the two
designs of :mod:`kernels.vocab_parallel`) and ``tp2-fast_llm`` (Fast-LLM's tensor-parallel path). Times are per
step (tp=2: the slower rank's); bytes are per rank.
"""

from __future__ import annotations

import json

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from ..notebook import span
from . import figures  # noqa: F401  (fixes svg.hashsalt)
from .figures import caption
from .sweeps import loss_labels

TP1 = "tp1-auto"
TP2_DESIGNS = ("tp2-all_gather", "tp2-symmetric", "tp2-fast_llm")
LABELS = {TP1: "tp=1 (one GPU, auto)", "tp2-all_gather": "tp=2 all_gather (ours)",
          "tp2-symmetric": "tp=2 symmetric (ours)", "tp2-fast_llm": "tp=2 Fast-LLM"}
TARGET_RATIO = 0.6  # issue 16's acceptance: tp=2 step time <= 0.6 x tp=1 at vocab >= 131072
SHAPE = ["loss", "target_format", "tokens", "vocab"]


def plot_bytes_per_rank(frame: pd.DataFrame, *, tokens: int, vocab: int, title: str = "") -> plt.Figure:
    """DRAM bytes one rank moves per step, by design, against the minimum (one read of each input, one write of
    the gradient) of its share of the vocabulary: GB, one group of bars per loss."""
    figures.check_frame(frame, ["variant", "tokens", "vocab", "bytes_dram_model", "bytes_min"], "frame")
    data = frame[(frame["tokens"] == tokens) & (frame["vocab"] == vocab)].copy()
    if data.empty:
        raise ValueError(f"no rows for {tokens} tokens x vocab {vocab}")
    data["label"] = loss_labels(data)
    data["design"] = data["variant"].map(LABELS)
    data["GB"] = data["bytes_dram_model"] / 1e9
    order = [LABELS[v] for v in (TP1, *TP2_DESIGNS) if v in set(data["variant"])]
    fig, ax = plt.subplots(figsize=(9, 3.8))
    sns.barplot(data=data, x="label", y="GB", hue="design", hue_order=order, ax=ax, palette="tab10")
    minimum = data[data["variant"] != TP1].groupby("label", sort=False)["bytes_min"].first() / 1e9
    for index, text in enumerate(t.get_text() for t in ax.get_xticklabels()):
        if text in minimum:
            ax.hlines(minimum[text], index - 0.45, index + 0.45, color="black", linestyle="--", linewidth=1,
                      label="tp=2 minimum per rank" if index == 0 else None)
    ax.set_xlabel("")
    ax.set_ylabel("DRAM GB per rank per step (model)")
    ax.legend(fontsize=7)
    ax.set_title(f"{tokens} tokens × vocab {vocab}, bf16" + (f" · {title}" if title else ""), fontsize=10)
    fig.tight_layout()
    return fig


def time_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per shape: each variant's step time (ms, ok rows only), tp=2 over tp=1, and over Fast-LLM's tp=2."""
    figures.check_frame(df, SHAPE + ["variant", "ms_median", "status"], "df")
    ok = df[df["status"] == "ok"]
    wide = ok.pivot_table(index=SHAPE, columns="variant", values="ms_median", aggfunc="min")
    out = wide.reset_index()
    out.columns.name = None
    for design in ("tp2-all_gather", "tp2-symmetric", "tp2-fast_llm"):
        if design in out and TP1 in out:
            out[f"{design} / tp1"] = out[design] / out[TP1]
    for design in ("tp2-all_gather", "tp2-symmetric"):
        if design in out and "tp2-fast_llm" in out:
            out[f"{design} / fast_llm"] = out[design] / out["tp2-fast_llm"]
    return out.sort_values(SHAPE).reset_index(drop=True)


def symmetric_chunks(df: pd.DataFrame) -> pd.DataFrame:
    """Per shape, the chunk the symmetric design ran with (its plan's ``config``: columns, warps, chunks a rank's
    slice, and where the choice came from: the ranks' first-call search, or the default) beside its step time."""
    figures.check_frame(df, SHAPE + ["variant", "config", "ms_median"], "df")
    rows = df[df["variant"] == "tp2-symmetric"].copy()
    if rows.empty:
        raise ValueError("no tp2-symmetric rows")
    configs = rows["config"].map(lambda text: json.loads(text) if isinstance(text, str) and text else {})
    for column, key in (("block_size", "block_size"), ("num_warps", "num_warps"), ("chunks", "num_chunks"),
                        ("chosen_by", "source")):
        rows[column] = configs.map(lambda config, key=key: config.get(key))
    rows["slice"] = rows["vocab"] // (rows["tp"] if "tp" in rows else 2)  # columns a rank holds
    return rows[SHAPE + ["slice", "block_size", "num_warps", "chunks", "chosen_by", "ms_median"]].sort_values(
        SHAPE).reset_index(drop=True)


def acceptance(df: pd.DataFrame, design: str = "tp2-symmetric", min_vocab: int = 131072) -> pd.DataFrame:
    """Issue 16's acceptance per shape: ``design`` at most TARGET_RATIO x tp=1 (vocab >= min_vocab) and no slower
    than Fast-LLM's tp=2 where it ran; ``met`` is both."""
    table = time_table(df)
    table = table[table["vocab"] >= min_vocab]
    ratio = table.get(f"{design} / tp1", pd.Series(np.nan, index=table.index))
    versus_peer = table.get(f"{design} / fast_llm", pd.Series(np.nan, index=table.index))
    out = table[SHAPE].copy()
    out["ratio_to_tp1"] = ratio
    out["ratio_to_fast_llm"] = versus_peer
    out["within_0.6"] = ratio <= TARGET_RATIO
    out["not_slower_than_fast_llm"] = versus_peer.isna() | (versus_peer <= 1.0)
    out["met"] = out["within_0.6"] & out["not_slower_than_fast_llm"]
    return out.reset_index(drop=True)


def plot_ratio_to_tp1(df: pd.DataFrame, *, title: str = "") -> plt.Figure:
    """tp=2 step time over the tp=1 step time, per shape and design; 0.5 is a perfect split, 0.6 the target."""
    table = time_table(df)
    designs = [d for d in TP2_DESIGNS if f"{d} / tp1" in table]
    if not designs:
        raise ValueError("no shape has both a tp=1 and a tp=2 time")
    long = table.melt(id_vars=SHAPE, value_vars=[f"{d} / tp1" for d in designs], var_name="design",
                      value_name="ratio").dropna(subset=["ratio"])
    long["design"] = long["design"].str.removesuffix(" / tp1").map(LABELS)
    long["label"] = loss_labels(long)
    long["shape"] = long["tokens"].astype(str) + " × " + long["vocab"].astype(str)
    labels = list(dict.fromkeys(long.sort_values(["loss", "target_format"])["label"]))
    fig, axes = plt.subplots(1, len(labels), figsize=(4.2 * len(labels), 3.8), sharey=True, squeeze=False)
    order = [LABELS[d] for d in designs]
    for ax, label in zip(axes[0], labels):
        part = long[long["label"] == label]
        sns.barplot(data=part, x="shape", y="ratio", hue="design", hue_order=order, ax=ax, palette="tab10")
        ax.axhline(0.5, color="grey", linestyle=":", linewidth=1)
        ax.axhline(TARGET_RATIO, color="red", linestyle="--", linewidth=1)
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("tokens × vocab")
        ax.tick_params(axis="x", labelrotation=30, labelsize=7)
        ax.legend().remove()
    axes[0][0].set_ylabel("tp=2 time / tp=1 time")
    handles, names = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, names, loc="upper center", ncol=len(names), fontsize=8, bbox_to_anchor=(0.5, 1.02))
    fig.suptitle(("step time relative to one GPU; dotted 0.5 = perfect split, dashed 0.6 = target"
                  + (f" · {title}" if title else "")), fontsize=9, y=1.08)
    fig.tight_layout()
    return fig


def communication_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per tp=2 variant and shape: collectives per step and the bytes a rank sends, receives and polls for the
    exchange, against the DRAM bytes it moves (model) and the step time."""
    figures.check_frame(df, SHAPE + ["variant", "collectives", "bytes_sent", "bytes_dram_model"], "df")
    data = df[df["variant"] != TP1].copy()
    columns = SHAPE + ["variant", "collectives", "bytes_sent", "bytes_received", "bytes_polled", "bytes_dram_model"]
    columns += [c for c in ("ms_median", "ms_batch", "ms_median_rank0", "ms_median_rank1") if c in data]
    out = data[columns].copy()
    out["exchange_share_of_dram"] = (out["bytes_sent"] + out["bytes_received"]) / out["bytes_dram_model"]
    return out.sort_values(SHAPE + ["variant"]).reset_index(drop=True)


def reading(model: pd.DataFrame, df: pd.DataFrame) -> list[str]:
    """What the byte model (``perfutils.studies.tensor_parallel.bytes_model``) and the recorded steps show, one Markdown
    bullet each: each design's bytes per rank over the minimum and the step ratio to tp=1 those bytes alone would
    give, beside the measured ratios; the exchange's share of a rank's DRAM bytes; the symmetric design's chunks."""
    lines = []
    per_element = model.pivot_table(index=["loss", "target_format"], columns="variant",
                                     values="dram_bytes_per_element", aggfunc="first")
    table = time_table(df)
    parts = []
    designs = [d for d in TP2_DESIGNS if d in per_element and f"{d} / tp1" in table and "tp2-symmetric" in per_element]
    for design in designs:
        over_min = per_element[design] / per_element["tp2-symmetric"]  # the symmetric design moves the minimum
        bound = 0.5 * per_element[design] / per_element[TP1]  # half the elements per rank, these bytes each
        measured = table[f"{design} / tp1"].dropna()
        below = int(sum((table[f"{design} / tp1"] < table.apply(
            lambda r: bound.get((r["loss"], r["target_format"]), np.nan), axis=1)).dropna()))
        parts.append(f"{LABELS[design]} moves {span(over_min)}× the minimum per rank, so its bytes alone give "
                     f"{span(bound)}× tp=1's time; measured {span(measured)}×"
                     + (f" (below the bytes' ratio at {below} of {len(measured)} shapes: per byte, tp=1 runs slower "
                        "than tp=2 there)" if below else ""))
    if parts:
        lines.append("* **DRAM bytes per rank.** " + "; ".join(parts) + ".")
    comm = communication_table(df)
    share = comm.groupby("variant")["exchange_share_of_dram"].max()
    lines.append("* **The exchange.** At most " + ", ".join(f"{100 * v:.2f}% ({LABELS.get(k, k)})"
                                                         for k, v in share.items())
                 + " of a rank's DRAM bytes cross between the GPUs.")
    chunks = symmetric_chunks(df)["block_size"].value_counts()
    lines.append("* **The symmetric design's chunks.** The first-call search chose "
                 + ", ".join(f"{int(b)}-column chunks at {n}" for b, n in chunks.items())
                 + f" of {int(chunks.sum())} shapes.")
    peer = peer_calls_line(df)
    return lines + ([peer] if peer else [])


def versus_peer_calls(df: pd.DataFrame, design: str = "tp2-symmetric") -> pd.DataFrame:
    """Per shape where both ran: how steady Fast-LLM's tp=2 calls were (``peer_spread``: p80 / p20 of its timed calls)
    and ``design``'s (``own_spread``), and ``design``'s median over the peer's faster calls (``over_peer_p20``) and
    over its median (``over_peer_median``)."""
    ok = df[df["status"] == "ok"]
    peer = ok[ok["variant"] == "tp2-fast_llm"].set_index(SHAPE)
    ours = ok[ok["variant"] == design].set_index(SHAPE)
    both = peer.index.intersection(ours.index)
    peer, ours = peer.loc[both], ours.loc[both]
    return pd.DataFrame({"peer_spread": peer["ms_p80"] / peer["ms_p20"], "own_spread": ours["ms_p80"] / ours["ms_p20"],
                         "over_peer_p20": ours["ms_median"] / peer["ms_p20"],
                         "over_peer_median": ours["ms_median"] / peer["ms_median"]})


def peer_calls_line(df: pd.DataFrame, design: str = "tp2-symmetric") -> str | None:
    """:func:`versus_peer_calls` as a Markdown bullet, or None where the peer and ``design`` share no shape."""
    table = versus_peer_calls(df, design)
    if table.empty:
        return None
    return (f"* **Fast-LLM's calls.** Its tp=2 calls spread {span(table['peer_spread'])}× from p20 to p80 within a "
            f"shape ({LABELS[design]}: {span(table['own_spread'], '.3f')}×). Against its faster calls (its p20) the "
            f"median step of {LABELS[design]} is {span(table['over_peer_p20'])}× its time; against its median "
            f"{span(table['over_peer_median'])}×.")


LINK_MEASURES = {"copy_engine": "tensor copy into the peer (copy engines)", "sm_stores": "SM stores into the peer",
                 "summary_words": "the exchange's 8-byte words into the peer",
                 "summary_words_local": "the same words into local memory", "round_trip": "a word's round trip"}


def link_table(rows: pd.DataFrame) -> pd.DataFrame:
    """The NVLink study's rows (``nvlink.csv``, ``python -m perfutils nvlink``) as a table: what moved, which way,
    MB a launch, ms, GB/s, and the round trip in µs."""
    figures.check_frame(rows, ["measure", "directions", "bytes", "ms_median", "gbps", "ns_per_round_trip", "status"],
                        "rows")
    out = pd.DataFrame({"what": rows["measure"].map(LINK_MEASURES).fillna(rows["measure"]),
                        "directions": rows["directions"].str.replace("_", " "),
                        "MB": rows["bytes"].where(rows["bytes"] > 0) / 1e6, "ms": rows["ms_median"],
                        "GB/s": rows["gbps"], "round trip µs": rows["ns_per_round_trip"] / 1e3, "check": rows["status"]})
    return out.reset_index(drop=True)


def link_reading(df: pd.DataFrame, link) -> str:
    """How long the symmetric design's stores into its peer (``bytes_sent``) would take alone at the rate the
    exchange's store pattern reached over ``link`` (a ``perfutils.model.predict.Link``), against each recorded step,
    and the link's round trip: one sentence."""
    figures.check_frame(df, SHAPE + ["variant", "bytes_sent", "ms_median"], "df")
    sym = df[df["variant"] == "tp2-symmetric"]
    if sym.empty:
        return "No symmetric-design row to set against the link."
    alone_us = sym["bytes_sent"] / (link.store_gbps * 1e9) * 1e6
    share = alone_us / (sym["ms_median"] * 1e3)
    return (f"At the {link.store_gbps:.0f} GB/s the exchange's stores reached between two {link.gpu_name}s "
            f"(NV{link.links}, data/{link.folder}/nvlink.csv), the symmetric design's stores into its peer would take "
            f"{span(alone_us, '.0f')} µs alone a step, {span(100 * share, '.1f')}% of the recorded step "
            f"({len(sym)} shapes). They are issued and not waited for, so they overlap the step's DRAM stream; a word "
            f"crosses and comes back in {link.round_trip_ns / 1e3:.1f} µs.")


def against_half_vocab(df: pd.DataFrame, sweep: pd.DataFrame, design: str = "tp2-symmetric") -> pd.DataFrame:
    """Per shape, ``design``'s tp=2 step beside the one-GPU public call at the rank's share of the vocabulary (the
    vocab sweep's ``public`` row of the same GPU at ``vocab / tp`` columns, same tokens, bf16): what a perfect split
    would take, each rank's own work alone. ``over_half`` is the step over that time: what the split costs beyond
    halving the work (the exchange, the wait for the slower rank, the kernel's own step). Shapes whose half vocabulary
    the sweep did not record are left out."""
    figures.check_frame(df, SHAPE + ["variant", "ms_median", "status"], "df")
    figures.check_frame(sweep, ["loss", "target_format", "variant", "dtype", "tokens", "vocab", "ms_median", "status"],
                        "sweep")
    tp2 = df[(df["variant"] == design) & (df["status"] == "ok")].copy()
    tp2["half"] = tp2["vocab"] // (tp2["tp"] if "tp" in tp2 else 2)
    one = _public_rows(sweep).rename(columns={"vocab": "half", "ms_median": "one_gpu_half_ms"})
    out = tp2.merge(one[["loss", "target_format", "tokens", "half", "one_gpu_half_ms"]],
                    on=["loss", "target_format", "tokens", "half"], how="inner")
    out = out.rename(columns={"ms_median": "tp2_ms"})
    out["over_half"] = out["tp2_ms"] / out["one_gpu_half_ms"]
    return out[SHAPE + ["half", "tp2_ms", "one_gpu_half_ms", "over_half"]].sort_values(SHAPE).reset_index(drop=True)


def _public_rows(sweep: pd.DataFrame) -> pd.DataFrame:
    """The vocab sweep's rows of the public call in bf16 that measured (what :func:`against_half_vocab` compares)."""
    return sweep[(sweep["variant"] == "public") & (sweep["dtype"] == "bf16") & (sweep["status"] == "ok")]


def half_vocab_rows(data_dir, gpu: str, tp_rows: pd.DataFrame):
    """The GPU's recorded vocab sweep set against ``tp_rows`` (:func:`against_half_vocab`): (that table, the sweep's
    public rows it used, the sweep's sidecar), or None where the GPU has no vocab sweep under ``data_dir``."""
    from ..data import records, schema

    path = schema.data_path(data_dir, gpu, "vocab_sweep")
    if not path.exists():
        return None
    sweep = records.load_records(path)
    half = against_half_vocab(tp_rows, sweep)
    cells = half[["loss", "target_format", "tokens", "half"]].drop_duplicates().rename(columns={"half": "vocab"})
    used = _public_rows(sweep).merge(cells, on=["loss", "target_format", "tokens", "vocab"])
    return half, used, records.load_metadata(path)


def study_title(meta: dict) -> str:
    """A figure's caption for a recorded study: its GPU, date and versions (torch, Triton, NCCL)."""
    return caption(meta.get("gpu_name"), meta.get("timestamp_utc"), f"torch {meta.get('torch_version')}, "
                   f"Triton {meta.get('triton_version')}, NCCL {meta.get('nccl_version')}")


def against_half_line(table: pd.DataFrame, gpu: str, design: str = "tp2-symmetric") -> str:
    """One sentence from :func:`against_half_vocab`: the step over one GPU at half the vocabulary, per loss family."""
    if table.empty:
        return f"No shape of {gpu}'s study has its half vocabulary in the same GPU's vocab sweep."
    family = np.where((table["loss"] == "cross_entropy") & (table["target_format"] == "labels"), "labels CE",
                      "the distribution losses")
    parts = [f"{span(part['over_half'])}× for {name} ({len(part)} shape{'s' if len(part) != 1 else ''})"
             for name, part in table.groupby(family, sort=False)]
    return (f"On the two {gpu}s, {LABELS[design]}'s step over one GPU's public call at half the vocabulary: "
            + "; ".join(parts) + ".")


def pair_comparison(df: pd.DataFrame, other: pd.DataFrame, *, gpu: str, other_gpu: str,
                    design: str = "tp2-symmetric") -> str:
    """The same study on two pairs of GPUs, one sentence each: ``design`` over tp=1 on each pair (range and median)
    and the shapes where issue 16's acceptance holds; then, over the shapes both recorded, each variant's step on
    ``other_gpu``'s pair over its step on ``gpu``'s (which forms gained from the other pair and which less)."""
    mine, theirs = time_table(df), time_table(other)
    column = f"{design} / tp1"
    if column not in mine or column not in theirs:
        raise ValueError(f"both studies need {design} and {TP1} rows")
    verdicts = {name: acceptance(frame, design) for name, frame in ((gpu, df), (other_gpu, other))}
    parts = []
    for name, table in ((other_gpu, theirs), (gpu, mine)):
        ratio = table[column].dropna()
        verdict = verdicts[name]
        parts.append(f"{span(ratio)}× (median {ratio.median():.2f}) on the two {name}s, acceptance met at "
                     f"{int(verdict['met'].sum())} of {len(verdict)} shapes")
    text = f"{LABELS[design]} over tp=1: " + "; ".join(parts) + "."
    both = theirs.merge(mine, on=SHAPE, how="inner", suffixes=("_other", ""))
    if both.empty:
        return text + " The two studies share no shape."
    gains = []
    for variant in (TP1, *TP2_DESIGNS):
        if variant in mine and variant in theirs:
            ratio = (both[f"{variant}_other"] / both[variant]).dropna()
            if len(ratio):
                gains.append(f"{LABELS[variant]} {span(ratio)}× (median {ratio.median():.2f})")
    return (text + f" Each step on the two {other_gpu}s over the same shape's step on the two {gpu}s ({len(both)} "
            "shapes): " + "; ".join(gains) + ".")


def print_summary(path) -> None:
    """Print a recorded study's step times against tp=1 and issue 16's acceptance per shape (symmetric design): what
    the collection script shows after a run."""
    from ..data.records import load_records

    df = load_records(path)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(time_table(df).round(3).to_string(index=False))
        verdict = acceptance(df)
        print(f"acceptance (tp2-symmetric <= {TARGET_RATIO} x tp1, <= Fast-LLM's tp2 where measured): "
              f"met on {int(verdict['met'].sum())} of {len(verdict)} shapes")
        print(verdict.round(3).to_string(index=False))
