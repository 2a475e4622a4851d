"""Markdown tables of the recorded results (the report's landing page shows them: perfutils.report_index).

    python -m perfutils.plots.summary [--gpu-dir data/h100-sxm-80gb]                # benchmark.csv's table
    python -m perfutils.plots.summary --vocab-sweep [--gpu-dir data/h100-sxm-80gb]  # vocab_sweep.csv's table
    python -m perfutils.plots.summary --public-call [--gpu-dir data/h100-sxm-80gb]  # public_call.csv's table
    python -m perfutils.plots.summary --host-overhead [--gpu-dir data/h100-sxm-80gb]  # host_overhead.csv's tables
    python -m perfutils.plots.summary --tensor-parallel [--gpu-dir data/h100-sxm-80gb]  # tensor_parallel.csv's
    python -m perfutils.plots.summary --autograd-step [--gpu-dir data/h200]  # autograd_step.csv's table
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import pandas as pd

from ..data.records import load_metadata, load_records
from .sweeps import best_per_group
from .vocab_sweep import (PROVIDER_LABELS, autograd_line, autograd_ratio, cell_table, plan_gap_line, public_over_plan,
                          worst_cells)

TARGETS = [  # issue #4's table: (loss, target_format, vocab, target ms)
    ("cross_entropy", "labels", 32768, 0.198),
    ("cross_entropy", "labels", 131072, 0.79),
    ("cross_entropy", "logits", 131072, 1.26),
    ("reverse_kl", "logits", 32768, 0.314),
    ("reverse_kl", "logits", 65536, 0.627),
    ("reverse_kl", "logits", 131072, 1.26),
]


def benchmark_table(gpu_dir: Path, tokens: int = 4096) -> str:
    df = load_records(gpu_dir / "benchmark.csv")
    meta = df.attrs["metadata"]  # the sidecar, read by load_records
    every_shape = best_per_group(df, by=("loss", "target_format", "tokens", "vocab", "variant"))
    best = every_shape[every_shape["tokens"] == tokens]
    lines = [
        "| loss × vocab | torch.compile | fused | two_pass | split_row | auto | % of copy (auto) | floor | target |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    copy = meta.get("copy_gbps")
    for loss, fmt, vocab, target in TARGETS:
        part = best[(best["loss"] == loss) & (best["target_format"] == fmt) & (best["vocab"] == vocab)].set_index("variant")
        get = lambda v: f"{part.loc[v, 'ms_median']:.3f}" if v in part.index else "-"
        floor = part["bytes_min"].iloc[0] / (copy * 1e9) * 1e3 if copy and len(part) else float("nan")
        pct = f"{part.loc['auto', 'pct_of_copy']:.0f}%" if "auto" in part.index else "-"
        lines.append(f"| {loss} ({fmt}) {vocab // 1024}K | {get('torch_compile')} | {get('fused')} | {get('two_pass')} "
                     f"| {get('split_row')} | {get('auto')} | {pct} | {floor:.3f} | ≤ {target} |")
    source = (f"ms, median of CUDA-event timings, {tokens} tokens, bf16, fwd+bwd; {meta.get('gpu_name')}, "
              f"torch {meta.get('torch_version')}, Triton {meta.get('triton_version')}, copy bandwidth "
              f"{copy:.0f} GB/s, recorded {str(meta.get('timestamp_utc') or meta.get('time_utc') or '')[:10]} "
              f"(data/{gpu_dir.name}/benchmark.csv)")
    return "\n".join(lines) + "\n\n" + source + "\n\n" + ratio_line(every_shape)


def ratio_line(best) -> str:
    """Worst ratios over every recorded shape (all token counts): ours against the others."""
    table = best.pivot_table(index=["loss", "target_format", "tokens", "vocab"], columns="variant", values="ms_median")
    others = table[[v for v in ("fused", "two_pass") if v in table]].min(axis=1)
    ours = {v: table[v] for v in ("split_row", "auto") if v in table}
    parts = [f"{len(table)} recorded shapes"]
    for name, times in ours.items():
        parts.append(f"{name} / best of fused, two_pass ≤ {(times / others).max():.3f}")
        if "torch_compile" in table:
            parts.append(f"{name} / torch.compile ≤ {(times / table['torch_compile']).max():.3f}")
    if "auto" in ours:
        best_ours = table[[v for v in ("fused", "two_pass", "split_row") if v in table]].min(axis=1)
        parts.append(f"auto / best project variant ≤ {(table['auto'] / best_ours).max():.3f}")
    return f"Worst ratios over {parts[0]}: " + "; ".join(parts[1:]) + "."


# The landing page's rows of the vocab sweep: Llama 2 / Mistral, GPT-2, Llama 3, Qwen 2, Gemma 3 vocabularies.
HEADLINE_VOCABS = (32000, 50257, 128256, 151936, 262144)
_PEER_COLUMNS = tuple((peer, PROVIDER_LABELS[peer]) for peer in ("torch_compile", "fast_llm", "liger"))


def _ms(value) -> str:
    return "-" if value is None or pd.isna(value) else f"{value:.3f}"


def vocab_sweep_table(gpu_dir: Path, tokens: int = 4096, dtype: str = "bf16", vocabs=HEADLINE_VOCABS,
                      grid_lines: bool = True) -> str:
    """The landing page's headline results (perfutils.report_index): per loss x vocab at ``tokens``, the peers' and
    the project's ms (public call and its kernel-only plan), and of the public call % of copy, host µs and syncs per
    call; then where the data comes from and, with ``grid_lines``, the whole grid's worst cells, the autograd form
    against the plain call and the quack figures (:func:`vocab_sweep_lines`; a second table of the same file leaves
    them out: they would repeat)."""
    path = gpu_dir / "vocab_sweep.csv"
    df = load_records(path)
    meta = df.attrs["metadata"]  # the sidecar, read by load_records
    table = cell_table(df, tokens=tokens, dtype=dtype, vocabs=vocabs)
    # a peer with no cell in the table gets no column (a column of "-"), but a sentence saying it was not measured
    peers = [(p, label) for p, label in _PEER_COLUMNS if p in table.columns and table[p].notna().any()]
    absent = [label for p, label in _PEER_COLUMNS if (p, label) not in peers]
    header = ["loss × vocab", *(f"{label} (ms)" for _, label in peers), "public call (ms)", "plan, kernel-only (ms)",
              "% of copy", "host µs / call", "syncs / call"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in table.itertuples(index=False):
        cells = [_ms(getattr(row, provider, None)) for provider, _ in peers]
        cells += [_ms(getattr(row, "public", None)), _ms(getattr(row, "plan", None))]
        pct, host, syncs = row.public_pct_of_copy, row.public_host_us_per_call, row.public_syncs_per_call
        cells += ["-" if pd.isna(pct) else f"{pct:.0f}%", "-" if pd.isna(host) else f"{host:.0f}",
                  "-" if pd.isna(syncs) else f"{int(syncs)}"]
        lines.append(f"| {row.loss_label} {row.vocab} | " + " | ".join(cells) + " |")
    notes = vocab_sweep_lines(df, meta, gpu_dir, tokens, dtype, grid=grid_lines)
    if absent:
        notes.insert(1, f"Not measured at these cells yet: {', '.join(absent)} (notebook 09 lists what the recorded "
                        "grid holds).")
    return "\n".join(lines) + "\n\n" + "\n\n".join(notes)


def _session_starts(meta: dict) -> list[str]:
    """When each process that wrote a data file started (the sidecar's own stamp and its sessions'), sorted."""
    return sorted(str(m["timestamp_utc"]) for m in [meta, *meta.get("sessions", [])] if m.get("timestamp_utc"))


def _dates(df) -> str:
    """The days the file's rows were measured (not its sidecar's sessions: rows taken out to be measured again
    leave their session behind)."""
    days = sorted(str(stamp)[:10] for stamp in df["timestamp_utc"].dropna()) if "timestamp_utc" in df else []
    return "?" if not days else days[0] if days[0] == days[-1] else f"{days[0]} to {days[-1]}"


def _peer_versions(df, peer: str) -> list[str]:
    """The commits (8 digits) or versions a peer's rows recorded in their ``plan_config`` (``<peer>_commit``,
    ``<peer>_version``), one entry each, sorted."""
    import json

    if "plan_config" not in df:
        return []
    found = set()
    for config in df.loc[df["variant"] == peer, "plan_config"].dropna():
        config = json.loads(config)
        commit, version = config.get(f"{peer}_commit"), config.get(f"{peer}_version")
        if commit or version:
            found.add(str(commit)[:8] if commit else str(version))
    return sorted(found)


def vocab_sweep_lines(df, meta: dict, gpu_dir: Path, tokens: int = 4096, dtype: str = "bf16",
                      grid: bool = True) -> list[str]:
    """The source line, then with ``grid`` the worst cells of the whole grid, the autograd form against the plain call
    and the plain call against its kernel-only plan where one process measured both, and the quoted quack figures
    beside the public call."""
    copy = meta.get("copy_gbps")
    fast_llm = _peer_versions(df, "fast_llm")
    liger = _peer_versions(df, "liger")
    source = (f"ms, median of CUDA-event timings (do_bench, L2 flushed), {tokens} tokens, {dtype}, fwd+bwd; "
              f"{meta.get('gpu_name')}, torch {meta.get('torch_version')}, Triton {meta.get('triton_version')}"
              + (f", Fast-LLM {', '.join(fast_llm)}" if fast_llm else "")
              + (f", Liger-Kernel {', '.join(liger)}" if liger else "")
              + (f", copy bandwidth {copy:.0f} GB/s" if copy else "")
              + f"; recorded {_dates(df)} (data/{gpu_dir.name}/vocab_sweep.csv). Host µs: wall-clock per call "
              "on 8 rows, calls back to back; syncs: device-to-host synchronizations per call at the shape.")
    lines = [source, *filter(None, [timed_apart_line(df, meta, tokens, dtype)])]
    if not grid:
        return lines
    worst = worst_cells(df, dtype=dtype)
    if "vs_peer" in worst:
        cell = worst["vs_peer"]
        lines.append(f"Worst cell against the peers ({cell['cells']} cells with a peer measured, {dtype}): "
                     f"{cell['loss_label']} {cell['tokens']} × {cell['vocab']}: public call {cell['ms']:.3f} ms, "
                     f"{cell['ratio']:.2f}× the best peer ({cell['peer']}, {cell['peer_ms']:.3f} ms), "
                     f"{cell['pct_of_copy']:.0f}% of copy.")
    low = worst["lowest_pct"]
    lines.append(f"Lowest % of copy of the public call over the grid ({worst['cells']} cells, {dtype}): "
                 f"{low['loss_label']} {low['tokens']} × {low['vocab']}, {low['pct_of_copy']:.0f}% "
                 f"({low['ms']:.3f} ms).")
    autograd = autograd_line(autograd_ratio(df, meta, dtype=dtype))
    if autograd:
        lines.append(autograd)
    gap = plan_gap_line(public_over_plan(df, meta, dtype=dtype))
    if gap:
        lines.append(gap)
    quack = quack_line(df, gpu_dir, dtype)
    if quack:
        lines.append(quack)
    return lines


def timed_apart_line(df, meta: dict, tokens: int, dtype: str = "bf16") -> str | None:
    """Which providers of the table's token count shared a process, and which a GPU (the sidecar's sessions,
    :func:`perfutils.provenance.shared_runs`): a ratio of two providers that shared neither carries the spread of
    two machines and two moments."""
    from ..provenance import shared_runs

    shared = shared_runs(df[(df["status"] == "ok") & (df["tokens"] == tokens) & (df["dtype"] == dtype)], meta)
    return None if shared is None else (f"At {tokens} tokens, {shared} (each provider's processes, GPUs and code: "
                                        "perfutils.provenance.where_rows_ran over the sidecar's sessions).")


def quack_line(df, gpu_dir: Path, dtype: str = "bf16") -> str | None:
    """The quoted quack figures (``quack_reference.csv``, same GPU model only) beside the public call's."""
    path = gpu_dir / "quack_reference.csv"
    if not path.exists() or dtype != "bf16":
        return None
    reference = pd.read_csv(path)
    meta = load_metadata(path)
    ok = df[(df["status"] == "ok") & (df["variant"] == "public") & (df["dtype"] == dtype)
            & (df["loss"] == "cross_entropy") & (df["target_format"] == "labels")]
    if reference.empty or set(ok["gpu_name"]) != {meta.get("gpu_name")}:
        return None
    ours = ok.set_index(["tokens", "vocab"])["ms_median"]
    parts = [f"{r.tokens}×{r.vocab} {r.ms_median:.3f} vs {ours.get((r.tokens, r.vocab), float('nan')):.3f}"
             for r in reference.itertuples()]
    return (f"quack-kernels, labels cross-entropy, quoted from the issue (ms, quack vs our public call; measured by "
            f"the project owner on {meta.get('gpu_name')} on {meta.get('measured')}, not here; "
            f"data/{gpu_dir.name}/quack_reference.csv): " + "; ".join(parts) + ".")


def public_call_table(gpu_dir: Path) -> str:
    """Issue 13's acceptance grid (``public_call.csv``: every provider of a cell timed in one process): per tokens x
    vocab, the worst over the four losses of the public call / plan, autograd form / plan and public call /
    Fast-LLM; host µs per call of the public call and of Fast-LLM; syncs per call; then a summary line."""
    path = gpu_dir / "public_call.csv"
    df = load_records(path)
    meta = df.attrs["metadata"]
    ok = df[df["status"] == "ok"]
    # one row per (cell, provider)
    cells = ok.pivot_table(index=["tokens", "vocab", "loss", "target_format"], columns="variant",
                           values=["ms_median", "host_us_per_call", "syncs_per_call"])
    ms, host, syncs = cells["ms_median"], cells["host_us_per_call"], cells["syncs_per_call"]
    ratios = pd.DataFrame({"public_plan": ms["public"] / ms["plan"],
                           "autograd_plan": ms["public_autograd"] / ms["plan"],
                           "public_fast_llm": ms["public"] / ms["fast_llm"],
                           "host_public": host["public"], "host_fast_llm": host["fast_llm"],
                           "syncs": syncs[["public", "public_autograd"]].max(axis=1)})
    header = ["tokens × vocab", "public / plan (×)", "autograd form / plan (×)", "public / Fast-LLM (×)",
              "host µs / call: public", "host µs / call: Fast-LLM", "syncs / call"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for (tokens, vocab), cell in ratios.groupby(level=["tokens", "vocab"]):
        lines.append(f"| {tokens} × {vocab} | {cell['public_plan'].max():.3f} | {cell['autograd_plan'].max():.3f} | "
                     f"{cell['public_fast_llm'].max():.2f} | {cell['host_public'].min():.0f}–"
                     f"{cell['host_public'].max():.0f} | {cell['host_fast_llm'].min():.0f}–"
                     f"{cell['host_fast_llm'].max():.0f} | {int(cell['syncs'].max())} |")
    host_us = host["public"]  # measured once per (provider, loss, vocab) in each stage's process: one per cell
    zero = int((ratios["syncs"] == 0).sum())
    synced = ok[ok["syncs_per_call"] > 0]
    first = _first_of_their_process(ok, meta, synced)
    fast_llm = sorted({str(c.get("commit", ""))[:8] for c in meta.get("parameters", {}).get("fast_llm", [])} - {""})
    source = (f"Every provider of a cell in one process, cells in turn; ms are medians of CUDA-event timings (do_bench, "
              f"L2 flushed), bf16, fwd+bwd, each cell the worst of the four losses; {meta.get('gpu_name')}, torch "
              f"{meta.get('torch_version')}, Triton {meta.get('triton_version')}"
              + (f", Fast-LLM {', '.join(fast_llm)}" if fast_llm else "")
              + f"; recorded {_dates(df)} (data/{gpu_dir.name}/public_call.csv). Host µs: wall-clock per call on 8 "
              "rows (batches of calls back to back, median batch), the range over the four losses; syncs: the most "
              "device-to-host synchronizations of one call of the public call or its autograd form at the shape.")
    summary = (f"Over the {len(ratios)} cells: public call / plan {ratios['public_plan'].min():.3f}–"
               f"{ratios['public_plan'].max():.3f}; public call / Fast-LLM at most {ratios['public_fast_llm'].max():.2f}; "
               f"autograd form / plan at most {ratios['autograd_plan'].max():.2f}; public call host µs median "
               f"{host_us.median():.0f}, max {host_us.max():.0f}, at most 40 µs in {int((host_us <= 40).sum())} of "
               f"{len(host_us)} measurements (Fast-LLM: median {host['fast_llm'].median():.0f}); 0 syncs "
               f"in {zero} of {len(ratios)} cells"
               + (f" (the {first} call{'s' if first > 1 else ''} with one sync: the first configuration a process "
                  "measured)" if first and first == len(synced) else "") + ".")
    return "\n".join(lines) + "\n\n" + source + "\n\n" + summary


PUBLIC_CALL_PIECE = re.compile(r"^\s*(?P<piece>.*\S)\s+(?P<loss>[a-z_]+/[a-z_]+)$")  # "... cross_entropy/labels"
HOST_PIECE_LABELS = {  # the public call's pieces as the by-loss table names them (the CSV's names otherwise)
    "entropy_loss_forward_backward": "public call, `entropy_loss_forward_backward`",
    "of which the template's run (allocations + launches)": "… of which the template's run (allocations + launch)",
    "of which the template key and lookup": "… of which the template's key and lookup",
    "entropy_loss(...).backward()": "autograd form, `entropy_loss(...).backward()`",
}


def _md_text(text: str) -> str:
    """``text`` as literal Markdown table text: brackets, asterisks, underscores and pipes escaped."""
    return re.sub(r"([\\`*_\[\]|])", r"\\\1", text)


def _us(value) -> str:
    """Host microseconds as a table shows them: one decimal below 100."""
    return "-" if value is None or pd.isna(value) else f"{value:.1f}" if value < 100 else f"{value:.0f}"


def _loss_header(spec: str) -> str:
    loss, target_format = spec.split("/")
    return f"{loss} ({target_format})" if loss == "cross_entropy" else loss


def _host_pieces(df: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the public call's pieces per loss: a piece x loss frame of µs, the other rows: group, piece, µs)."""
    parsed = df["piece"].astype(str).str.extract(PUBLIC_CALL_PIECE)
    per_loss = (df["group"] == "public call") & parsed["loss"].notna()
    table = (df[per_loss].assign(piece=parsed.loc[per_loss, "piece"], loss=parsed.loc[per_loss, "loss"])
             .pivot_table(index="piece", columns="loss", values="us_per_call", sort=False))
    return table, df[~per_loss][["group", "piece", "us_per_call"]]


# host_overhead.csv's groups of steps timed inside set_multithreading_enabled(False): entered once around the calls,
# and entered again at every step
ONE_THREAD, ONE_THREAD_PER_STEP = "autograd step, one thread", "autograd step, one thread per step"


def host_overhead_table(gpu_dir: Path, groups=("autograd step", ONE_THREAD, ONE_THREAD_PER_STEP, "public call")
                        ) -> str | None:
    """What a repeated call costs the host, piece by piece (``host_overhead.csv``), as Markdown: the public call and
    its autograd form per loss (µs per call), then the other pieces of ``groups`` (by default the autograd step's
    parts and PyTorch's floors, e.g. ``x.float().sum().backward()``; every group with ``groups=None``), then where the
    data comes from and a summary sentence (:func:`host_overhead_line`)."""
    path = gpu_dir / "host_overhead.csv"
    if not path.exists():
        return None
    df = pd.read_csv(path)
    meta = load_metadata(path)
    per_loss, others = _host_pieces(df)
    losses = list(per_loss.columns)
    lines = ["| host µs per call | " + " | ".join(_loss_header(l) for l in losses) + " |",
             "|---|" + "---|" * len(losses)]
    for piece, row in per_loss.iterrows():
        lines.append(f"| {HOST_PIECE_LABELS.get(piece, piece)} | " + " | ".join(_us(row[l]) for l in losses) + " |")
    shown = others if groups is None else others[others["group"].isin(groups)]
    if len(shown):
        lines += ["", "| what is timed | host µs per call |", "|---|---|"]
        for r in shown.itertuples():  # PyTorch's floors (pieces "floor: ...") say so first
            floor = r.piece.strip().startswith("floor:")
            what = "PyTorch's floor" if floor else r.group
            piece = r.piece.strip().removeprefix("floor:").strip()
            lines.append(f"| {what}: {_md_text(piece)} | {_us(r.us_per_call)} |")
    source = (f"Wall-clock µs per call of calls back to back on the host of the GPU machine ({meta.get('gpu_name')}, "
              f"torch {meta.get('torch_version')}, Triton {meta.get('triton_version')}, "
              f"{(meta.get('parameters') or {}).get('problem') or meta.get('problem') or '8 x 32000 bf16'}), "
              f"recorded {str(meta.get('timestamp_utc', ''))[:10]} (data/{gpu_dir.name}/host_overhead.csv).")
    summary = host_overhead_line(gpu_dir)
    return "\n".join(lines) + "\n\n" + source + (f"\n\n{summary}" if summary else "")


def host_overhead_line(gpu_dir: Path) -> str | None:
    """What the pieces of a repeated call cost the host (``host_overhead.csv``), as one sentence: the public call and
    its autograd form over the four losses, and the floors PyTorch sets for an autograd step where recorded."""
    path = gpu_dir / "host_overhead.csv"
    if not path.exists():
        return None
    df = pd.read_csv(path)
    per_loss, others = _host_pieces(df)

    def row(name: str) -> pd.Series:
        return per_loss.loc[name] if name in per_loss.index else pd.Series(dtype=float)

    def other(contains: str, group: str | None = None) -> float | None:
        rows = (others[others["group"] == group] if group
                else others[~others["group"].isin((ONE_THREAD, ONE_THREAD_PER_STEP))])
        found = rows[rows["piece"].str.contains(contains, regex=False)]["us_per_call"]
        return float(found.iloc[0]) if len(found) else None

    public, template = row("entropy_loss_forward_backward"), row("of which the template's run (allocations + launches)")
    autograd = row("entropy_loss(...).backward()")
    parts = []
    if len(public):
        parts.append(f"the public call costs {public.min():.0f}–{public.max():.0f} µs over the four losses"
                     + (f", of which its template's run (allocations and the launch) {template.min():.0f}–"
                        f"{template.max():.0f}" if len(template) else ""))
    if len(autograd):
        text = f"its autograd form {autograd.min():.0f}–{autograd.max():.0f}"
        if len(public):
            ratio = autograd / public
            text += f" ({ratio.min():.1f}–{ratio.max():.1f}× the public call's)"
        parts.append(text)
    floors = [(other("F.cross_entropy("), "PyTorch's own `F.cross_entropy(...).backward()` step"),
              (other("Function handing back"), "a Function that only hands an allocated gradient back (`.apply` + "
                                               "`.backward()`: the autograd engine's own cost)"),
              (other("x.float().sum().backward()"), "`x.float().sum().backward()`")]
    floors = [(us, what) for us, what in floors if us is not None]
    if floors:
        parts.append("against " + ", ".join(f"{what} {us:.0f}" for us, what in floors))
    ours, floor = other("entropy_loss(", ONE_THREAD), other("Function handing back", ONE_THREAD)
    if ours is not None and floor is not None:  # the engine's hand-over to its device thread, switched off
        parts.append(f"with the engine's multithreading off around the calls "
                     f"(`torch.autograd.set_multithreading_enabled(False)`, which runs a CUDA backward on the calling "
                     f"thread) the labels CE autograd step costs {ours:.0f} and the hand-back floor {floor:.0f}")
    return ("Host µs per call: " + "; ".join(parts) + ".") if parts else None


def autograd_step_table(gpu_dir: Path) -> str | None:
    """The loss behind an output head, forward and backward (``autograd_step.csv``), as Markdown: per loss and shape
    the plain call's step (ms, the median of the rounds' medians), the autograd form's and PyTorch's own loss over it
    (the median of the rounds' ratios, their range in brackets) and, where the step is all host, the host µs a step;
    then where the data comes from and one sentence."""
    path = gpu_dir / "autograd_step.csv"
    if not path.exists():
        return None
    df = pd.read_csv(path)
    meta = load_metadata(path)
    keys = ["loss", "target_format", "tokens", "vocab", "hidden"]
    rounds = df.pivot_table(index=keys + ["round"], columns="way", values="ms_median").reset_index()
    others = [way for way in ("autograd", "torch") if way in rounds]
    for way in others:
        rounds[f"{way}_x"] = rounds[way] / rounds["plain"]
    shapes = rounds.groupby(keys, sort=False).agg(
        plain=("plain", "median"), **{f"{way}_{stat}": (f"{way}_x", stat) for way in others
                                      for stat in ("median", "min", "max")})
    host = df.pivot_table(index=keys, columns="way", values="host_us_per_step", aggfunc="median")  # all-host shapes

    def ratio_cell(row, way) -> str:
        if f"{way}_median" not in row or pd.isna(row[f"{way}_median"]):
            return "-"
        return f"{row[f'{way}_median']:.3f} [{row[f'{way}_min']:.3f}–{row[f'{way}_max']:.3f}]"

    lines = ["| loss | tokens × vocab, hidden | plain call + `logits.backward(g)` (ms) | autograd form (× plain) | "
             "PyTorch's loss (× plain) | host µs a step: plain / autograd / PyTorch |",
             "|---|---|---|---|---|---|"]
    for key, row in shapes.iterrows():
        loss, target_format, tokens, vocab, hidden = key
        host_cell = (" / ".join(_us(host.loc[key].get(way)) for way in ("plain", "autograd", "torch"))
                     if key in host.index else "-")
        lines.append(f"| {_loss_header(f'{loss}/{target_format}')} | {tokens} × {vocab}, {hidden} | "
                     f"{row['plain']:.3f} | {ratio_cell(row, 'autograd')} | {ratio_cell(row, 'torch')} | {host_cell} |")
    worst = df[[c for c in df.columns if c.endswith("_rel_err")]].max().max()
    source = (f"A step of a bf16 output head, `logits = h @ W.T`, and its loss, forward and backward: the plain call "
              f"(`entropy_loss_forward_backward` on the detached logits, then `logits.backward(g)`), the autograd form "
              f"(`entropy_loss(...).backward()`) and PyTorch's `F.cross_entropy` (labels only). do_bench median, L2 "
              f"flushed, the ways alternated over {df['round'].nunique()} rounds; every way checked first against "
              f"float64 through the head (worst relative error {worst:.1e}). {meta.get('gpu_name')}, torch "
              f"{meta.get('torch_version')}, Triton {meta.get('triton_version')}, recorded "
              f"{str(meta.get('timestamp_utc', ''))[:10]} (data/{gpu_dir.name}/autograd_step.csv).")
    sentence = []
    timed_on_gpu = shapes[~shapes.index.isin(host.index)]  # the shapes whose step is the GPU's
    if len(timed_on_gpu):
        ours, theirs = timed_on_gpu["autograd_median"], timed_on_gpu.get("torch_median", pd.Series(dtype=float))
        sentence.append(f"from {timed_on_gpu.index.get_level_values('tokens').min()} tokens on, the autograd form's "
                        f"step is {ours.min():.2f}–{ours.max():.2f}× the plain call's (medians of the rounds)"
                        + (f" and PyTorch's own loss {theirs.min():.2f}–{theirs.max():.2f}×" if theirs.notna().any()
                           else ""))
    if len(host):
        extra = host["autograd"] - host["plain"]
        sentence.append(f"at {host.index.get_level_values('tokens').max()} rows, where the step is the host's, the "
                        f"autograd form adds {extra.min():.0f}–{extra.max():.0f} µs a step to the plain call's (the "
                        "host's own spread between rounds is large: compare within a round)")
    return ("\n".join(lines) + "\n\n" + source
            + ("\n\n" + "In a training step " + "; ".join(sentence) + "." if sentence else ""))


def _first_of_their_process(rows, meta: dict, chosen) -> int:
    """How many of ``chosen`` rows were the first a process (a sidecar session) recorded."""
    starts = _session_starts(meta)
    stamps = sorted(rows["timestamp_utc"].astype(str))
    count = 0
    for stamp in chosen["timestamp_utc"].astype(str):
        start = max((s for s in starts if s <= stamp), default=None)
        if start is not None and not any(start <= other < stamp for other in stamps):
            count += 1
    return count


_TP_COLUMNS = (("tp2-symmetric", "tp=2 symmetric"), ("tp2-all_gather", "tp=2 all_gather"), ("tp2-fast_llm",
                                                                                         "tp=2 Fast-LLM"))


def tensor_parallel_table(gpu_dir: Path) -> str:
    """The vocab-parallel study (tensor_parallel.csv): per loss x tokens x vocab, tp=1's step time and each tp=2
    design's (ms, and / tp=1), then how many shapes meet issue 16's bound (symmetric <= 0.6 x tp=1, no slower than
    Fast-LLM's tp=2)."""
    from .tensor_parallel import TARGET_RATIO, acceptance, time_table

    path = gpu_dir / "tensor_parallel.csv"
    df = load_records(path)
    meta = df.attrs["metadata"]
    table = time_table(df)
    designs = [(variant, name) for variant, name in _TP_COLUMNS if variant in table]
    lines = ["| loss | tokens × vocab | tp=1, one GPU (ms) | " + " | ".join(f"{name} (ms, × tp=1)" for _v, name in designs)
             + " |",
             "|---|---|---|" + "---|" * len(designs)]
    for row in table.to_dict("records"):
        cells = [f"{_ms(row.get(variant))} ({row.get(variant) / row['tp1-auto']:.2f}×)"
                 if pd.notna(row.get(variant)) else "-" for variant, _name in designs]
        lines.append(f"| {row['loss']} ({row['target_format']}) | {row['tokens']} × {row['vocab']} | "
                     f"{_ms(row.get('tp1-auto'))} | " + " | ".join(cells) + " |")
    ranks = meta.get("ranks") or []
    gpus = " + ".join(str(rank.get("gpu_name")) for rank in ranks) or meta.get("gpu_name")
    parameters = meta.get("parameters", {})
    fast_llm = parameters.get("fast_llm_commit")
    link = "NVLink" if "NV" in str(meta.get("topology")) else "one host"
    source = (f"ms per step (loss and gradient), bf16; tp=1: the public call on one GPU holding the whole vocabulary "
              f"(do_bench median, L2 flushed); tp=2: each rank holds half, the slower rank's median of paired calls "
              f"(L2 flushed); (×): over tp=1. {gpus}, {link}, torch {meta.get('torch_version')}, Triton "
              f"{meta.get('triton_version')}, NCCL {meta.get('nccl_version')}"
              + (f", Fast-LLM {fast_llm[:8]}" if fast_llm else "")
              + f"; recorded {_dates(df)} (data/{gpu_dir.name}/tensor_parallel.csv).")
    verdict = acceptance(df)
    missed = verdict[~verdict["met"]]
    summary = (f"tp=2 symmetric ≤ {TARGET_RATIO} × tp=1 and no slower than Fast-LLM's tp=2 at "
               f"{int(verdict['met'].sum())} of {len(verdict)} shapes; symmetric / tp=1 {verdict['ratio_to_tp1'].min():.2f}–"
               f"{verdict['ratio_to_tp1'].max():.2f}, symmetric / Fast-LLM {verdict['ratio_to_fast_llm'].min():.2f}–"
               f"{verdict['ratio_to_fast_llm'].max():.2f}" + _against_peer_p20(df)
               + ("; over the bound: " + ", ".join(f"{r.loss} ({r.target_format}) {r.tokens} × {r.vocab} "
                                                 f"{r.ratio_to_tp1:.2f}" for r in missed.itertuples())
                  if len(missed) else "") + ".")
    return "\n".join(lines) + "\n\n" + source + "\n\n" + summary


def _against_peer_p20(df) -> str:
    """' (a–b against its p20, its faster calls)': the symmetric design's median over Fast-LLM's p20, or ''."""
    from .tensor_parallel import versus_peer_calls

    ratio = versus_peer_calls(df)["over_peer_p20"].dropna()
    return f" ({ratio.min():.2f}–{ratio.max():.2f} against its p20, its faster calls)" if len(ratio) else ""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m perfutils.plots.summary")
    parser.add_argument("--gpu-dir", type=Path, default=Path("data/h100-sxm-80gb"))
    parser.add_argument("--vocab-sweep", action="store_true", help="the vocab sweep's table (vocab_sweep.csv)")
    parser.add_argument("--public-call", action="store_true", help="issue 13's grid in one process (public_call.csv)")
    parser.add_argument("--tensor-parallel", action="store_true", help="tp=2 against tp=1 (tensor_parallel.csv)")
    parser.add_argument("--host-overhead", action="store_true", help="the pieces of a call's host time "
                        "(host_overhead.csv)")
    parser.add_argument("--autograd-step", action="store_true", help="the loss behind an output head, three ways "
                        "(autograd_step.csv)")
    parser.add_argument("--tokens", type=int, default=4096, help="the vocab sweep's table at this token count")
    parser.add_argument("--vocabs", type=int, nargs="+", default=list(HEADLINE_VOCABS),
                        help="the vocab sweep's table at these vocabularies")
    parser.add_argument("--table-only", action="store_true",
                        help="leave out the whole grid's worst cells and the quack figures (a second table)")
    args = parser.parse_args(argv)
    if args.public_call:
        print(public_call_table(args.gpu_dir))
    elif args.host_overhead:
        print(host_overhead_table(args.gpu_dir, groups=None) or f"no host_overhead.csv in {args.gpu_dir}")
    elif args.tensor_parallel:
        print(tensor_parallel_table(args.gpu_dir))
    elif args.autograd_step:
        print(autograd_step_table(args.gpu_dir) or f"no autograd_step.csv in {args.gpu_dir}")
    else:
        print(vocab_sweep_table(args.gpu_dir, tokens=args.tokens, vocabs=tuple(args.vocabs),
                                grid_lines=not args.table_only)
              if args.vocab_sweep else benchmark_table(args.gpu_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
