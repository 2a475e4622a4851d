"""What users call, timed the way the peers are timed, over the vocabularies models ship with (notebook 09).

One study, ``data/<gpu-slug>/vocab_sweep.csv``: every row is one provider at one (loss, dtype, tokens, vocab),
measured in one process by the sweep harness (do_bench median/p20/p80 with the L2 flushed, GB/s and % of copy,
errors against float64 on sampled rows, peak memory, the configuration auto chose) plus what a call costs the
host (:mod:`perfutils.measure.host_cost`: ``host_us_per_call`` on 8 rows, ``syncs_per_call`` at the shape).

Providers (:mod:`perfutils.measure.providers`): the project's ``public`` call (``kernels.entropy_loss_forward_backward``,
variant auto), ``public_autograd`` (``kernels.entropy_loss`` + ``.backward()``) and ``plan``
(``kernels.prepare(...).run()``: kernel-only, ``kernel_only`` True); peers ``torch_compile``, ``liger`` and ``quack``
(labels only, when installed) and ``fast_llm`` (Fast-LLM's kernels from the checkout ``$FAST_LLM_PATH`` names; its
commit in the sidecar and in each row's ``plan_config``).

The grid (issues 13 and 14): :data:`VOCABS` x :data:`TOKENS` x the four losses in bf16 for the project's
providers (16384 tokens where it fits: :func:`fits`), fp32 logits at :data:`FP32_VOCABS` (4096 tokens), the peers
at 4096 tokens for every vocab and at 16384 tokens for :data:`PEER_16K_VOCABS`. It is cut into resumable stages
(:func:`stages`), each planned to stay under :data:`STAGE_BUDGET_S` by :func:`estimate_seconds`; a run also stops
starting configurations after ``budget_minutes`` (run it again to resume: the harness measures only what is
missing and never rewrites a row). Rows land under the measuring GPU's own folder, so the same stages run on
another GPU unchanged.

    python -m perfutils vocab-sweep stages                   # the stages, rows and estimated minutes (no GPU)
    python -m perfutils vocab-sweep run public-4096-1 --out data
    python -m perfutils vocab-sweep quack-reference --out data   # the quoted quack figures (no GPU)
    python -m perfutils vocab-sweep forget-project --tokens 4096 --out data  # before re-measuring the project
    TRITON_INTERPRET=1 python -m perfutils vocab-sweep dry-run    # CPU: a tiny stage through the whole path
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterable

__all__ = [
    "FP32_VOCABS", "LOSSES", "PEER_16K_VOCABS", "PEERS", "PROJECT", "QUACK_REFERENCE", "QUACK_STUDY", "SAME_RUN_STUDY",
    "STAGE_BUDGET_S", "STUDY", "Stage", "TOKENS", "VOCABS", "cpu_dry_run", "estimate_seconds", "find_stage", "fits",
    "forget_project_rows", "main", "narrow", "quack_reference_frame", "run_stage", "same_run_stages", "stage_rows",
    "stages", "stages_table", "write_quack_reference",
]

STUDY = "vocab_sweep"
VOCABS = (32000, 32064, 32768, 49152, 50257, 50304, 65536, 100277, 128000, 128256, 129280, 131072, 151936, 152064,
          200064, 256000, 262144)
TOKENS = (1024, 4096, 16384)
LOSSES = (("cross_entropy", "labels"), ("cross_entropy", "logits"), ("forward_kl", "logits"), ("reverse_kl", "logits"))
PROJECT = ("public", "public_autograd", "plan")
PEERS = ("torch_compile", "liger", "fast_llm", "quack")
FP32_VOCABS = (32000, 128256, 151936)
PEER_TOKENS = 4096
PEER_16K_VOCABS = (32000, 32768, 128256, 131072, 151936)
# Issue 13's acceptance grid, every provider of a cell timed in one process (the public call against the plan and
# Fast-LLM "measured in the same run"): its own study, so vocab_sweep.csv's rows stay as recorded.
SAME_RUN_STUDY = "public_call"
SAME_RUN_PROVIDERS = ("public", "public_autograd", "plan", "fast_llm")
SAME_RUN_TOKENS = (4096, 16384)
SAME_RUN_VOCABS = PEER_16K_VOCABS

# Memory a configuration may use, with its float64 check: half of an H100's 78 GiB, the same on every GPU so the
# grid is the same everywhere.
MEMORY_BUDGET_BYTES = 39 * 2**30
# Bytes per logit element a provider keeps alive beyond the inputs (in units of the input dtype's size, plus fp32
# temporaries): project: the gradient of the timed call and of one more in flight; peers: a copy of the logits
# (their gradient may overwrite it), the gradient, and torch.compile's fp32 softmax (4 B/element on the H100's
# benchmark: peak 8.6 GB above the inputs at 16384 x 131072 reverse KL).
EXTRA_ELEMENTS = {"project": 2, "peers": 2}
EXTRA_FP32_BYTES = {"project": 0, "peers": 4}
FLOAT64_CHECK_BYTES = 2**30  # the float64 reference's chunks and sampled rows

# Planning numbers for the H100 (seconds; estimates, not measurements: a run prints its real times).
STAGE_BUDGET_S = 300.0  # what a stage is planned for; the runner stops starting rows after budget_minutes
STAGE_START_S = 30.0  # imports, the first compiles of a fresh machine, reading the ceilings
ROW_OVERHEAD_S = 0.4  # first call, peak-memory call, syncs call, one CSV append
SHAPE_S = 0.5  # inputs and float64 references of a new (dtype, tokens, vocab)
SHAPE_S_PER_GELEMENT = 1.0  # ... plus this per 1e9 logit elements
FLUSH_MS = 0.1  # do_bench zeroes 256 MiB before every timed call
BENCH_MS = 125.0  # do_bench's warmup (25 ms) + rep (100 ms)
PROJECT_GBPS = 2400.0  # ~80% of the H100's 3000 GB/s copy bandwidth
PEER_SLOWDOWN = {"torch_compile": 4.0, "liger": 4.0, "fast_llm": 2.5, "quack": 1.2}  # x the project's time
# First call per row: auto's search (the first project provider of a shape), torch.compile's compile (2-5 s in
# benchmark.csv), Fast-LLM's autotuner (3 configs, compiled per vocab: its n_cols is a constexpr; 2-7 s per loss
# and vocab offline at 32K-128K in case_497_registers_offline.csv, growing with the vocab).
FIRST_CALL_S = {"public": 0.5, "public_autograd": 0.1, "plan": 0.1, "torch_compile": 4.0, "liger": 1.0,
                "quack": 2.0}
FAST_LLM_FIRST_CALL_S_PER_32K = 1.5
# Per (provider, loss, dtype, vocab): the 8-row problem's first calls (auto's search, torch.compile's compile).
HOST_COST_S = {"public": 0.3, "public_autograd": 0.1, "plan": 0.1, "torch_compile": 4.0, "liger": 0.5,
               "fast_llm": 1.0, "quack": 1.0}

QUACK_STUDY = "quack_reference"
# quack-kernels' labels cross-entropy (fwd+bwd), as the project owner measured it on an H100 on 2026-11-23 and
# quoted in the issue: (tokens, vocab, ms). Quoted, not measured here.
QUACK_REFERENCE = ((4096, 32768, 0.205), (4096, 131072, 0.837), (4096, 128256, 0.801), (16384, 32000, 0.716),
                   (4096, 32000, 0.188), (4096, 151936, 0.901), (4096, 256000, 1.699))
QUACK_SOURCE = {
    "source": "issue text (measure what users call): quack-kernels cross_entropy, labels, bf16, forward + backward, "
              "measured by the project owner",
    "gpu_name": "NVIDIA H100 80GB HBM3",
    "measured": "2026-11-23",
    "note": "quoted, not measured here: no quack row of vocab_sweep.csv comes from these numbers",
}


@dataclass(frozen=True)
class Stage:
    """A resumable piece of the grid: ``providers`` x ``vocabs`` x ``losses`` at ``tokens`` and ``dtype`` (less what
    a provider does not compute and what does not :func:`fits`)."""

    name: str
    group: str  # "project" or "peers"
    providers: tuple[str, ...]
    tokens: int
    vocabs: tuple[int, ...]
    losses: tuple[tuple[str, str], ...] = LOSSES
    dtype: str = "bf16"
    study: str = STUDY


def _dtype_bytes(dtype: str) -> int:
    from ..data.schema import DTYPE_BYTES

    return DTYPE_BYTES[dtype]


def fits(group: str, tokens: int, vocab: int, loss: str, target_format: str, dtype: str = "bf16") -> bool:
    """Whether a configuration stays within :data:`MEMORY_BUDGET_BYTES`: the logits (and target logits), what the
    providers of ``group`` keep alive (:data:`EXTRA_ELEMENTS`, :data:`EXTRA_FP32_BYTES`) and the float64 check."""
    elements = tokens * vocab
    size = _dtype_bytes(dtype)
    inputs = 1 + (target_format == "logits")
    needed = elements * (size * (inputs + EXTRA_ELEMENTS[group]) + EXTRA_FP32_BYTES[group]) + FLOAT64_CHECK_BYTES
    return needed <= MEMORY_BUDGET_BYTES


def _supports_offline(provider: str, loss: str, target_format: str) -> bool:
    """What a provider computes, known without loading anything (Fast-LLM: all four losses since 27f4747e)."""
    from ..measure.providers import LABELS_ONLY

    if provider in LABELS_ONLY:
        return (loss, target_format) == ("cross_entropy", "labels")
    return True


def stage_rows(stage: Stage, supports: Callable[[str, str, str], bool] = _supports_offline) -> list[dict[str, Any]]:
    """The configurations of a stage in run order (shapes outermost, like the harness), as dicts."""
    rows = []
    for vocab, (loss, target_format) in itertools.product(stage.vocabs, stage.losses):
        if not fits(stage.group, stage.tokens, vocab, loss, target_format, stage.dtype):
            continue
        for provider in stage.providers:
            if supports(provider, loss, target_format):
                rows.append(dict(provider=provider, loss=loss, target_format=target_format, dtype=stage.dtype,
                                 tokens=stage.tokens, vocab=vocab))
    return rows


def _row_seconds(row: dict[str, Any]) -> float:
    from ..model.roofline import loss_cost

    bytes_min = loss_cost(row["loss"], row["target_format"], row["tokens"], row["vocab"],
                          _dtype_bytes(row["dtype"])).bytes
    call_ms = bytes_min / (PROJECT_GBPS * 1e9) * 1e3 * PEER_SLOWDOWN.get(row["provider"], 1.0)
    bench_s = BENCH_MS * (call_ms + FLUSH_MS) / call_ms / 1e3
    first_call = (FAST_LLM_FIRST_CALL_S_PER_32K * row["vocab"] / 32768 if row["provider"] == "fast_llm"
                  else FIRST_CALL_S.get(row["provider"], 1.0))
    return ROW_OVERHEAD_S + first_call + bench_s


def estimate_seconds(rows: Iterable[dict[str, Any]]) -> float:
    """Planned wall time of a stage's rows on the H100: a start, per row (first call, do_bench with its L2 flushes,
    the extra calls), per new shape (inputs, float64 references) and per host-cost problem."""
    rows = list(rows)
    if not rows:
        return 0.0
    total = STAGE_START_S + sum(_row_seconds(row) for row in rows)
    shapes = {(r["dtype"], r["tokens"], r["vocab"]) for r in rows}
    total += sum(SHAPE_S + tokens * vocab / 1e9 * SHAPE_S_PER_GELEMENT for _, tokens, vocab in shapes)
    host = {(r["provider"], r["loss"], r["target_format"], r["dtype"], r["vocab"]) for r in rows}
    total += sum(HOST_COST_S.get(key[0], 1.0) for key in host)
    return total


def _split(name: str, group: str, providers: tuple[str, ...], tokens: int, vocabs: Iterable[int],
           dtype: str = "bf16", study: str = STUDY) -> list[Stage]:
    """Consecutive vocabularies into stages planned under :data:`STAGE_BUDGET_S` (numbered ``name-1``, ``-2``...)."""
    chunks: list[list[int]] = [[]]
    for vocab in vocabs:
        trial = Stage(name, group, providers, tokens, tuple(chunks[-1] + [vocab]), dtype=dtype, study=study)
        if chunks[-1] and estimate_seconds(stage_rows(trial)) > STAGE_BUDGET_S:
            chunks.append([vocab])
        else:
            chunks[-1].append(vocab)
    return [Stage(f"{name}-{index}", group, providers, tokens, tuple(chunk), dtype=dtype, study=study)
            for index, chunk in enumerate(chunks, start=1)]


def stages() -> list[Stage]:
    """Every stage of the study, in the order collect_h100.sh runs them."""
    found = []
    for tokens in TOKENS:
        found += _split(f"public-{tokens}", "project", PROJECT, tokens, VOCABS)
    found += _split("public-fp32", "project", PROJECT, 4096, FP32_VOCABS, dtype="fp32")
    found += _split(f"peers-{PEER_TOKENS}", "peers", PEERS, PEER_TOKENS, VOCABS)
    found += _split("peers-16384", "peers", PEERS, 16384, PEER_16K_VOCABS)
    return found


def same_run_stages() -> list[Stage]:
    """The stages of :data:`SAME_RUN_STUDY`: the public call, its autograd form, the plan and Fast-LLM at one
    cell in one process (``same-<tokens>-<n>``)."""
    found = []
    for tokens in SAME_RUN_TOKENS:
        found += _split(f"same-{tokens}", "peers", SAME_RUN_PROVIDERS, tokens, SAME_RUN_VOCABS, study=SAME_RUN_STUDY)
    return found


def find_stage(name: str) -> Stage:
    known = {stage.name: stage for stage in stages() + same_run_stages()}
    if name not in known:
        raise ValueError(f"unknown stage {name!r}; the stages are {', '.join(known)}")
    return known[name]


def narrow(stage: Stage, vocabs: Iterable[int] | None = None, providers: Iterable[str] | None = None) -> Stage:
    """A stage restricted to some of its vocabularies and providers (a device session too short for the whole
    grid measures a part of it; the rest stays missing, and a later run of the full stage fills it in)."""
    if vocabs is not None:
        unknown = sorted(set(vocabs) - set(VOCABS))
        if unknown:
            raise ValueError(f"vocab {unknown} is not in the grid {VOCABS}")
    if providers is not None:
        unknown = sorted(set(providers) - set(PROJECT) - set(PEERS))
        if unknown:
            raise ValueError(f"providers {unknown} are not among {PROJECT + PEERS}")
    kept_vocabs = tuple(v for v in stage.vocabs if vocabs is None or v in set(vocabs))
    kept_providers = tuple(p for p in stage.providers if providers is None or p in set(providers))
    return replace(stage, vocabs=kept_vocabs, providers=kept_providers)


def stages_table():
    """One row per stage: providers, tokens, dtype, vocabs, rows (per provider) and estimated minutes."""
    import pandas as pd

    table = []
    for stage in stages() + same_run_stages():
        rows = stage_rows(stage)
        per_provider = {p: sum(r["provider"] == p for r in rows) for p in stage.providers}
        table.append(dict(stage=stage.name, study=stage.study, tokens=stage.tokens, dtype=stage.dtype,
                          vocabs=f"{min(stage.vocabs)}..{max(stage.vocabs)} ({len(stage.vocabs)})", rows=len(rows),
                          per_provider=", ".join(f"{p} {n}" for p, n in per_provider.items()),
                          est_minutes=round(estimate_seconds(rows) / 60, 1)))
    return pd.DataFrame(table)


def coverage(recorded) -> "pd.DataFrame":
    """What of each stage the recorded rows hold: per stage and provider, configurations planned, recorded ``ok``,
    recorded with another status, and missing (not run yet: the grid a figure or table is drawn from)."""
    import pandas as pd

    done: dict[tuple, str] = {}
    for row in recorded.itertuples(index=False):
        done[(row.variant, row.loss, row.target_format, row.dtype, int(row.tokens), int(row.vocab))] = row.status
    table = []
    for stage in stages():
        for provider in stage.providers:
            planned = [r for r in stage_rows(stage) if r["provider"] == provider]
            if not planned:
                continue
            status = [done.get((provider, r["loss"], r["target_format"], r["dtype"], r["tokens"], r["vocab"]))
                      for r in planned]
            table.append(dict(stage=stage.name, provider=provider, tokens=stage.tokens, dtype=stage.dtype,
                              planned=len(planned), ok=sum(s == "ok" for s in status),
                              other=sum(s is not None and s != "ok" for s in status),
                              missing=sum(s is None for s in status)))
    return pd.DataFrame(table)


# ---------------------------------------------------------------------------------------------------------------
# Running a stage
# ---------------------------------------------------------------------------------------------------------------


def _fast_llm_parameters() -> list[dict[str, Any]]:
    from ..peers import fast_llm

    return [{"path": str(path), "commit": fast_llm.checkout_commit(path)} for path in fast_llm.checkout_paths()]


def run_stage(stage: Stage | str, *, out: str = "data", budget_minutes: float = 7.0, measurer: Any = None,
              extra: Any = None, log=print):
    """Measure a stage's missing rows; returns the study's records. ``measurer``/``extra``: stand-ins for tests
    (default: a GpuMeasurer with :class:`~perfutils.measure.host_cost.CallCosts`)."""
    from ..measure.host_cost import HOST_ROWS, CallCosts
    from ..measure.measurer import SETTLE_MS
    from .cases import recorded_ceilings, run_cases

    stage = find_stage(stage) if isinstance(stage, str) else stage
    deadline = time.monotonic() + budget_minutes * 60
    settings = {"settle_ms": SETTLE_MS}  # the public call's first call searches: time it from an idle GPU
    if measurer is None:
        import torch

        ceilings = recorded_ceilings(out, torch.cuda.get_device_name())
        if ceilings:
            settings["ceilings"] = ceilings  # the copy bandwidth the other studies of this GPU report against
        extra = extra or CallCosts()
    planned = stage_rows(stage)
    log(f"{stage.study} stage {stage.name}: {len(planned)} configurations planned "
        f"(~{estimate_seconds(planned) / 60:.1f} min on the H100), stopping new ones after {budget_minutes} min")

    def keep(n_tokens, vocab, loss, target_format, variant):
        return fits(stage.group, n_tokens, vocab, loss, target_format, stage.dtype)

    host = extra if isinstance(extra, CallCosts) else None
    parameters = {"stage": stage.name, "group": stage.group, "fast_llm": _fast_llm_parameters(),
                  "host_cost": {"rows": HOST_ROWS,
                                **({"calls": host.calls, "repeats": host.repeats, "warmup_calls": host.warmup,
                                    "warmup_s": host.warmup_s} if host else {}),
                                "note": f"host_us_per_call on {HOST_ROWS} rows: median over batches of calls timed "
                                        "until the last call returns (the sync after a batch not timed), after a "
                                        "warm-up of calls and then batches for warmup_s; syncs_per_call at the "
                                        "shape"}}
    return run_cases(stage.study, [(p, None, None) for p in stage.providers], losses=list(stage.losses),
                     vocabs=list(stage.vocabs), tokens=[stage.tokens], dtype=stage.dtype, out=out, log=log,
                     parameters=parameters, measurer=measurer, extra=extra, deadline=deadline, keep=keep,
                     skip_missing=True, **settings) if planned else None


def forget_project_rows(path, tokens: Iterable[int] | None = None, *, dtype: str | None = None,
                        vocabs: Iterable[int] | None = None, losses: Iterable[str] | None = None,
                        log=print) -> Path | None:
    """After a kernel or search change: take the project's rows (:data:`PROJECT`) of ``tokens``, ``dtype``, ``vocabs``
    and ``losses`` out of a recorded study so its stages measure them again (:func:`perfutils.data.store.forget_rows`:
    nothing is lost)."""
    from ..data.store import forget_rows

    return forget_rows(path, PROJECT, tokens, dtype=dtype, vocabs=vocabs, losses=losses, log=log)


def cpu_dry_run(out: str, *, tokens: int = 8, vocab: int = 300, losses=LOSSES, calls: int = 2, log=print):
    """What a CPU checks of a stage (run with ``TRITON_INTERPRET=1``): the project's three providers and eager
    PyTorch (standing in for the peers: an Inductor CPU build takes minutes, Fast-LLM's kernels do not run under
    the interpreter) at a tiny shape through the same runner, measurer and ``extra`` columns: float64 checks,
    host µs per call (``calls`` per batch), syncs (None: no CUDA), sidecar. The timings are a stand-in 1.0 ms."""
    from ..measure import providers
    from ..measure.host_cost import CallCosts
    from ..measure.measurer import GpuMeasurer, TimingBackend
    from ..measure.sweep_config import load_config

    stage = Stage("cpu-dry-run", "project", (*PROJECT, "eager"), tokens, (vocab,), losses=tuple(losses))
    spec = load_config(dict(study=STUDY, out=str(out), loss=losses[0][0], target_format=losses[0][1], variant="auto",
                            dtype="bf16", tokens=tokens, vocab=vocab, check_rows=tokens))
    backend = TimingBackend.dry_run()
    extra = CallCosts(device="cpu", calls=calls, repeats=1, warmup=1, warmup_s=0)
    measurer = GpuMeasurer(spec, device="cpu", prepare=providers.prepare, backend=backend, copy_gbps=1.0, log=log,
                           extra=extra)
    return run_stage(stage, out=out, measurer=measurer, extra=extra, log=log)


# ---------------------------------------------------------------------------------------------------------------
# The quoted quack figures
# ---------------------------------------------------------------------------------------------------------------


def quack_reference_frame():
    """The quoted figures as a tidy frame (ms; GB/s from the minimal bytes; no % of copy: that needs a copy
    bandwidth measured beside them, which the quote does not give)."""
    import pandas as pd

    from ..model.roofline import loss_cost

    rows = []
    for tokens, vocab, ms in QUACK_REFERENCE:
        bytes_min = int(loss_cost("cross_entropy", "labels", tokens, vocab, 2).bytes)
        rows.append(dict(provider="quack", loss="cross_entropy", target_format="labels", dtype="bf16", tokens=tokens,
                         vocab=vocab, ms_median=ms, bytes_min=bytes_min, gbps=bytes_min / (ms * 1e-3) / 1e9,
                         gpu_name=QUACK_SOURCE["gpu_name"], measured=QUACK_SOURCE["measured"], quoted=True))
    return pd.DataFrame(rows)


def write_quack_reference(out: str = "data", *, overwrite: bool = False):
    """``<out>/h100-sxm-80gb/quack_reference.csv`` + sidecar naming the source (refuses to overwrite)."""
    from ..data.schema import data_path, utc_now
    from ..data.store import write_table

    meta = {**QUACK_SOURCE, "study": QUACK_STUDY, "written_utc": utc_now(),
            "written_by": "python -m perfutils vocab-sweep quack-reference",
            "columns": {"ms_median": "the quoted milliseconds", "gbps": "minimal bytes (perfutils.model.roofline."
                        "loss_cost) / quoted time, computed here"}}
    return write_table(quack_reference_frame(), data_path(out, QUACK_SOURCE["gpu_name"], QUACK_STUDY), meta,
                       overwrite=overwrite)


# ---------------------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------------------


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m perfutils vocab-sweep", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("stages", help="list the stages, their rows and estimated minutes (no GPU)")
    run = commands.add_parser("run", help="measure the missing rows of one or more stages (GPU)")
    run.add_argument("stage", nargs="+")
    run.add_argument("--out", default="data")
    run.add_argument("--budget-minutes", type=float, default=7.0,
                     help="start no configuration after this many minutes (run again to resume)")
    run.add_argument("--vocab", type=int, nargs="+", default=None, help="only these vocabularies of the stages")
    run.add_argument("--providers", nargs="+", default=None, help="only these providers of the stages")
    dry = commands.add_parser("dry-run", help="CPU, TRITON_INTERPRET=1: a tiny stage through the whole path")
    dry.add_argument("--out", default=None, help="data folder (default: a new temporary folder)")
    quack = commands.add_parser("quack-reference", help="write the quoted quack figures (no GPU)")
    quack.add_argument("--out", default="data")
    forget = commands.add_parser("forget-project", help="take the project's rows out of the recorded sweep (kept "
                                 "in a .replaced copy) so the stages measure them again")
    forget.add_argument("--out", default="data")
    forget.add_argument("--gpu", default=None, help="GPU name (default: this machine's CUDA device)")
    forget.add_argument("--tokens", type=int, nargs="+", default=None)
    forget.add_argument("--dtype", default=None)
    forget.add_argument("--vocab", type=int, nargs="+", default=None)
    forget.add_argument("--losses", nargs="+", default=None, choices=[f"{loss}/{fmt}" for loss, fmt in LOSSES],
                        help="only these losses (loss/target_format)")
    args = parser.parse_args(argv)
    if args.command == "stages":
        import pandas as pd

        table = stages_table()
        with pd.option_context("display.width", 200, "display.max_colwidth", 80):
            print(table.to_string(index=False))
        print(f"{len(table)} stages, {table['rows'].sum()} configurations, ~{table['est_minutes'].sum():.0f} min "
              f"planned on the H100 (each stage under {STAGE_BUDGET_S / 60:.0f} min)")
        return 0
    if args.command == "dry-run":
        import os
        import tempfile

        if os.environ.get("TRITON_INTERPRET") != "1":
            raise SystemExit("dry-run runs the kernels under the Triton interpreter: set TRITON_INTERPRET=1")
        frame = cpu_dry_run(args.out or tempfile.mkdtemp(prefix="vocab_sweep_dry_run_"))
        columns = ["loss", "target_format", "variant", "status", "max_rel_err", "host_us_per_call", "syncs_per_call",
                   "kernel_only", "plan_config"]
        print(frame[columns].to_string())
        return 0 if set(frame["status"]) == {"ok"} else 1
    if args.command == "forget-project":
        from ..data.schema import data_path

        if args.gpu is None:
            import torch

            args.gpu = torch.cuda.get_device_name()
        forget_project_rows(data_path(args.out, args.gpu, STUDY), args.tokens, dtype=args.dtype, vocabs=args.vocab,
                            losses=args.losses)
        return 0
    if args.command == "quack-reference":
        print(f"wrote {write_quack_reference(args.out)}")
        return 0
    try:
        chosen = [narrow(find_stage(name), args.vocab, args.providers) for name in args.stage]  # checked before the GPU
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    started = time.monotonic()
    for stage in chosen:
        budget = args.budget_minutes - (time.monotonic() - started) / 60
        if budget <= 0:
            print(f"time budget spent before stage {stage.name}: run it again", flush=True)
            break
        frame = run_stage(stage, out=args.out, budget_minutes=budget)
        if frame is not None:
            counts = frame["status"].value_counts().to_dict()
            print(f"{stage.study}: {len(frame)} rows recorded ({', '.join(f'{n} {s}' for s, n in sorted(counts.items()))})",
                  flush=True)
    return 0

