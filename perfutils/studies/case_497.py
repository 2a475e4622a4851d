"""The case study of Fast-LLM issue #497 (notebook 02): why the real kernel is 6.7x slower than ours with the same tile.

The stages, each writing data the notebook reads (``data/<gpu-slug>/``):

    python -m perfutils case-497 cases                  # list what each stage runs (no GPU, no Fast-LLM needed)
    TRITON_INTERPRET=1 python -m perfutils case-497 dry-run --out /tmp/x   # CPU: every case, tiny shape, interpreter
    python -m perfutils case-497 offline --out data     # CPU: offline sm_90 compiles -> case_497_registers_offline.csv
    python -m perfutils case-497 spill-sass --out data  # CPU: logs/case_497_spill_sass_<date>.txt (SASS at the spills)
    python -m perfutils case-497 measure --out data     # GPU: case_497.csv (Fast-LLM both commits, torch.compile, ours)
    python -m perfutils case-497 ablation --out data    # GPU: case_497_ablation.csv (the walk #497 -> fused)
    python -m perfutils case-497 ncu --out data         # GPU + Nsight Compute: logs/ncu_case_497_<date>.txt, case_497_ncu.csv

Fast-LLM comes from the checkouts in ``$FAST_LLM_PATH`` (``os.pathsep``-separated; see :mod:`perfutils.peers.fast_llm`),
e.g. ``FAST_LLM_PATH=.peers/fast_llm-27f4747e:.peers/fast_llm-7d61a1ba``: 27f4747e is the kernel of the issue (the
parent of the fixing commit 46ffbdd1), 7d61a1ba a later HEAD. Measurements go through the sweep harness
(:func:`perfutils.studies.cases.run_cases`): tidy rows, float64 checks on sampled rows, n_regs / spills / occupancy of
the compiled kernels, peak memory, a JSON sidecar with the Fast-LLM commits; a rerun measures only what is
missing and never rewrites a recorded row.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from ..data.schema import ISSUE_COMMIT
from ..measure.ncu import find_ncu, ncu_command, ncu_version, parse_ncu_text, run_ncu_command, unit_scale
from ..model.cubin import local_memory_bytes, sass_instruction_mix
from ..model.spill_counts import resident_stack_bytes

__all__ = [
    "ABLATION_CASES",
    "LOSSES",
    "NCU_METRICS",
    "NCU_TARGETS",
    "PROJECT_CASES",
    "ablation_offline_rows",
    "fast_llm_offline_rows",
    "main",
    "measure_cases",
    "ncu_summary",
    "offline_table",
    "sass_counts",
    "write_offline_table",
]

TOKENS = 4096
VOCABS = (32768, 65536, 131072)
ABLATION_VOCABS = (32768, 65536)
LOSSES = (("reverse_kl", "logits"), ("cross_entropy", "logits"), ("cross_entropy", "labels"))
OFFLINE_LOSSES = (("reverse_kl", "logits"), ("cross_entropy", "logits"), ("forward_kl", "logits"),
                  ("cross_entropy", "labels"))
TARGET_GPU = "NVIDIA H100 80GB HBM3"  # the folder (data/h100-sxm-80gb) the sm_90 compiles belong to


def _target_sm_count() -> int:
    from ..model.hardware import lookup_device

    return lookup_device(TARGET_GPU).sm_count  # 132 (the H100 SXM datasheet)


STUDY = "case_497"
ABLATION_STUDY = "case_497_ablation"
OFFLINE_STUDY = "case_497_registers_offline"
PEERS_OFFLINE_STUDY = "fast_llm_registers_offline"  # Fast-LLM's kernels at the vocab sweep's shapes, offline
NCU_STUDY = "case_497_ncu"

# The project's side of the comparison at every shape: torch.compile, the emulation of #497 (fused, 32K cap),
# Option A (lower caps), Option B (two_pass) and the fastest variant (auto). Fast-LLM's rows are added per checkout.
PROJECT_CASES = [
    ("torch_compile", None, None),
    ("fused", None, None),
    ("fused", 16384, None),
    ("fused", 8192, None),
    ("two_pass", None, None),
    ("auto", None, None),
]


def _ablation_cases() -> list[tuple[str, int | None, int | None]]:
    from perfutils.lab_kernels.case_study import ablation

    block, warps = ablation.default_config(32768)
    cases = [(step.variant, block, warps) for step in ablation.STEPS]
    cases.append((ablation.FINAL_VARIANT, block, warps))
    cases += [(solo.variant, block, warps) for solo in ablation.SOLO]
    cases += [(ablation.STEPS[0].variant, block, other) for other in (8, 32)]  # the warps, step 0
    return cases


ABLATION_CASES = _ablation_cases()


def fast_llm_checkouts(paths: str | None = None) -> list:
    """Every checkout in ``paths`` / ``$FAST_LLM_PATH``, loaded (ImportError says what is missing)."""
    from ..peers import fast_llm

    found = fast_llm.checkout_paths(paths)
    if not found:
        raise SystemExit(f"set {fast_llm.ENV_VAR} to the Fast-LLM checkout(s), e.g. "
                         f"{fast_llm.ENV_VAR}=.peers/fast_llm-27f4747e:.peers/fast_llm-7d61a1ba")
    return [fast_llm.load(path) for path in found]


def _fast_llm_parameters(checkouts: Iterable) -> list[dict[str, Any]]:
    return [{"variant": c.variant, "commit": c.commit, "path": str(c.path)} for c in checkouts]


# ---------------------------------------------------------------------------------------------------------------
# Offline sm_90 compiles (CPU)
# ---------------------------------------------------------------------------------------------------------------

def sass_counts(sass: str | None) -> dict[str, int | None]:
    """Instruction counts of a SASS listing (:func:`perfutils.model.cubin.sass_instruction_mix`): local loads/stores
    (spill code), MUFU.EX2/RCP, BAR.SYNC, all."""
    keys = {"sass_ldl": "LDL", "sass_stl": "STL", "sass_ex2": "MUFU.EX2", "sass_rcp": "MUFU.RCP", "sass_bar": "BAR.SYNC",
            "sass_instructions": "instructions"}
    if not sass:
        return dict.fromkeys(keys)
    mix = sass_instruction_mix(sass)
    return {key: mix.get(name, 0) for key, name in keys.items()}


def spill_split(sass: str | None) -> dict[str, int | None]:
    """A thread's spill bytes outside every loop (``spill_once_bytes``) and inside the loops, a trip's
    (``spill_loop_bytes``): :func:`perfutils.model.cubin.local_memory_bytes`."""
    if not sass:
        return {"spill_once_bytes": None, "spill_loop_bytes": None}
    split = local_memory_bytes(sass)
    return {"spill_once_bytes": split["once"], "spill_loop_bytes": split["per_trip"]}


def _compiled_row(result, *, num_warps: int, n_rows: int, seconds: float) -> dict[str, Any]:
    """Registers, stack, spills, SASS counts and the occupancy they allow; plus the local-memory footprint."""
    from ..model.occupancy import occupancy_of_counts

    occ = occupancy_of_counts(result.n_regs, result.shared_bytes, num_warps)
    threads = 32 * num_warps
    spill_traffic = None
    if result.spill_store_bytes is not None and result.spill_load_bytes is not None:
        spill_traffic = (result.spill_store_bytes + result.spill_load_bytes) * threads * n_rows
    return {
        "n_regs": result.n_regs,
        "spill_bytes": result.spill_bytes,
        "spill_store_bytes": result.spill_store_bytes,
        "spill_load_bytes": result.spill_load_bytes,
        "shared_bytes": result.shared_bytes,
        "occupancy": float(occ.occupancy),
        "blocks_per_sm": int(occ.blocks_per_sm),
        "limiter": occ.limiter,
        # The stack of every resident thread of the GPU (H100: 132 SMs) against its 50 MB L2.
        "resident_stack_bytes": resident_stack_bytes(result.spill_bytes, num_warps, int(occ.blocks_per_sm),
                                                     _target_sm_count()),
        # Spill instructions' bytes x threads x rows: exact for straight-line (unrolled) code, a lower bound
        # when a spill sits in a loop that runs more than once.
        "static_spill_traffic_bytes": spill_traffic,
        # The same bytes by where they sit: outside every loop, and inside the loops (once a trip of each)
        **spill_split(result.sass),
        **sass_counts(result.sass),
        "compile_s": seconds,
        "triton_version": result.triton_version,
        "ptxas_version": result.ptxas_version,
        "status": "ok",
        "error": None,
    }


def _offline(compile_fn, base: dict[str, Any], *, num_warps: int, n_rows: int, log=print) -> dict[str, Any]:
    from ..data.schema import error_text

    started = time.perf_counter()
    try:
        result = compile_fn()
    except Exception as exc:  # one failed compile is a row, not a lost table
        row = {**base, "status": "error", "error": error_text(exc, 600)}
    else:
        row = {**base, **_compiled_row(result, num_warps=num_warps, n_rows=n_rows,
                                       seconds=time.perf_counter() - started)}
    log(f"  {row['variant']:28s} {row.get('kernel', ''):60.60s} vocab {row['vocab']:6d} warps {num_warps:2d}: "
        f"{row.get('n_regs')} regs, {row.get('spill_bytes')} B stack [{row['status']}]")
    return row


def fast_llm_offline_rows(checkouts, *, tokens: int = TOKENS, vocabs=VOCABS, losses=OFFLINE_LOSSES, dtype="bf16",
                          log=print, jobs: int = 1) -> list[dict[str, Any]]:
    """Every kernel Fast-LLM's wrapper launches at these shapes, compiled for sm_90 with the launch's
    specialization; autotuned kernels once per config (``autotune_choice``). ``jobs`` > 1: the shapes compiled in
    that many forked processes (nothing touches a GPU), the rows in the same order."""
    shapes = [(index, vocab, loss, target_format) for index, checkout in enumerate(checkouts) for vocab in vocabs
              for loss, target_format in losses if checkout.supports(loss, target_format)]
    global _PEER_JOB
    _PEER_JOB = (list(checkouts), tokens, dtype, log)
    try:
        if jobs > 1:
            import multiprocessing

            with multiprocessing.get_context("fork").Pool(jobs) as pool:
                parts = pool.map(_peer_shape_rows, shapes)
        else:
            parts = [_peer_shape_rows(shape) for shape in shapes]
    finally:
        _PEER_JOB = None
    return [row for part in parts for row in part]


_PEER_JOB = None  # (checkouts, tokens, dtype, log) of the fast_llm_offline_rows call in progress (forked workers)


def _peer_shape_rows(shape) -> list[dict[str, Any]]:
    from ..peers import fast_llm

    checkouts, tokens, dtype, log = _PEER_JOB
    index, vocab, loss, target_format = shape
    checkout = checkouts[index]
    rows = []
    for launch in fast_llm.capture_launches(checkout, loss=loss, target_format=target_format, tokens=tokens,
                                            vocab=vocab, dtype=dtype):
        for warps in launch.warp_choices:
            base = dict(source="fast_llm", variant=checkout.variant, fast_llm_commit=checkout.commit,
                        kernel=launch.name, loss=loss, target_format=target_format, dtype=dtype, tokens=tokens,
                        vocab=vocab, block_size=launch.block_size, num_warps=warps, num_stages=launch.num_stages,
                        autotune_choice=launch.autotuned)
            rows.append(_offline(lambda: launch.compile_offline(warps), base, num_warps=warps, n_rows=tokens,
                                 log=log))
    return rows


def _reverse_kl_problem(tokens: int, vocab: int, dtype: str):
    """The reverse-KL problem of the ablation, on meta tensors (plans are built, nothing is allocated)."""
    import torch

    from kernels.problem import build_problem

    from ..data.schema import torch_dtype

    x = torch.empty(tokens, vocab, dtype=torch_dtype(dtype), device="meta")
    return build_problem(x, torch.empty_like(x), loss="reverse_kl", target_format="logits", grad_output=1.0,
                         ignore_index=-100, loss_mask=None)


def ablation_offline_rows(*, tokens: int = TOKENS, vocabs=ABLATION_VOCABS, dtype="bf16", log=print) -> list[dict]:
    """Every ablation step and solo (perfutils.lab_kernels.case_study.ablation) and kernels.fused at the steps' tile and warps,
    and step 0 at 8 and 32 warps (their plans built on meta tensors: nothing is allocated or launched)."""
    from perfutils.lab_kernels.case_study import ablation
    from kernels.fused import plan_fused

    from ..model.offline_compile import compile_launch

    rows = []
    for vocab in vocabs:
        problem = _reverse_kl_problem(tokens, vocab, dtype)
        block, warps = ablation.default_config(vocab)

        def compiled_step(step, num_warps: int) -> dict:
            (launch,) = ablation.plan_step(step, problem, block, num_warps).launches
            base = dict(source="ablation", variant=step.variant, kernel=launch.fn.fn.__name__, loss="reverse_kl",
                        target_format="logits", dtype=dtype, tokens=tokens, vocab=vocab, block_size=block,
                        num_warps=num_warps, num_stages=step.num_stages, removes=step.removes,
                        switches=",".join(sorted(step.switches)))
            return _offline(lambda: compile_launch(launch), base, num_warps=num_warps, n_rows=tokens, log=log)

        rows += [compiled_step(step, warps) for step in (*ablation.STEPS, *ablation.SOLO)]
        rows += [compiled_step(ablation.STEPS[0], other) for other in (8, 32)]  # step 0's other warps (ABLATION_CASES)
        (launch,) = plan_fused(problem, block, warps).launches
        base = dict(source="project", variant=ablation.FINAL_VARIANT, kernel=launch.fn.fn.__name__, loss="reverse_kl",
                    target_format="logits", dtype=dtype, tokens=tokens, vocab=vocab, block_size=block,
                    num_warps=warps, num_stages=launch.num_stages, removes=ablation.FINAL_REMOVES, switches="")
        rows.append(_offline(lambda: compile_launch(launch), base, num_warps=warps, n_rows=tokens, log=log))
    return rows


def offline_table(checkouts, *, tokens: int = TOKENS, vocabs=VOCABS, ablation_vocabs=ABLATION_VOCABS,
                  log=print) -> pd.DataFrame:
    """Fast-LLM's kernels (every checkout) and the ablation steps, compiled for sm_90 on this machine."""
    rows = fast_llm_offline_rows(checkouts, tokens=tokens, vocabs=vocabs, log=log)
    rows += ablation_offline_rows(tokens=tokens, vocabs=ablation_vocabs, log=log)
    return pd.DataFrame(rows)


def write_offline_table(df: pd.DataFrame, out: str | Path, checkouts, *, overwrite: bool = False,
                        gpu: str = TARGET_GPU, study: str = OFFLINE_STUDY) -> Path:
    """``<out>/h100-sxm-80gb/case_497_registers_offline.csv`` + sidecar (target sm_90a, Triton, ptxas, commits);
    ``gpu``: another sm_90 GPU's folder, for the compiles of the code its own rows were measured with; ``study``:
    ``PEERS_OFFLINE_STUDY`` for Fast-LLM's kernels alone at the vocab sweep's shapes (stage ``offline-peers``)."""
    from ..data.metadata import collect_metadata
    from ..data.schema import data_path
    from ..data.store import write_table

    versions = df[["triton_version", "ptxas_version"]].dropna().drop_duplicates()
    triton_version, ptxas_version = (versions.iloc[0].tolist() if len(versions) else (None, None))
    meta = collect_metadata({"study": study, "tokens": sorted(set(df["tokens"])),
                             "vocab": sorted(set(df["vocab"])), "fast_llm": _fast_llm_parameters(checkouts)})
    meta.update(
        study=study,
        gpu_name=f"offline sm_90a compile (Triton {triton_version}, ptxas {ptxas_version})",
        target="sm_90a",
        ptxas_version=ptxas_version,
        fast_llm=_fast_llm_parameters(checkouts),
        note=("n_regs / stack (spill_bytes) / spill store+load bytes from compiling each launch offline with the "
              "launch's specialization (perfutils.model.offline_compile); occupancy from perfutils.model.occupancy; "
              "resident_stack_bytes = stack x threads x blocks/SM x 132 SMs; static_spill_traffic_bytes = spill "
              "instruction bytes x threads x rows (exact for unrolled code); spill_once_bytes / spill_loop_bytes: "
              "a thread's spill bytes outside every loop / inside the loops, a trip's (perfutils.model.cubin."
              "local_memory_bytes). Fast-LLM autotuned kernels: one row per config (autotune_choice)."),
    )
    return write_table(df, data_path(out, gpu, study), meta, overwrite=overwrite)


def _excerpt_section(title: str, compiled, *, sites: int) -> str:
    from ..model.cubin import local_memory_excerpt

    sass = compiled.sass or ""
    counts = sass_counts(sass)
    loads, stores = counts["sass_ldl"], counts["sass_stl"]
    head = (f"=== {title}\n{compiled.name}: {compiled.n_regs} registers, {compiled.stack_bytes} B stack per thread, "
            f"{loads} LDL / {stores} STL in the SASS (Triton {compiled.triton_version}, ptxas "
            f"{compiled.ptxas_version}, {compiled.num_warps} warps)")
    body = local_memory_excerpt(sass, context=3, max_sites=sites) if sass else "(no SASS: cuobjdump not found)"
    return head + "\n" + (body or "(no local-memory instruction)") + "\n"


def spill_excerpts(checkouts, *, vocab: int = 32768, tokens: int = TOKENS, sites: int = 4, log=print) -> str:
    """SASS around the spill sites (``STL``/``LDL``) of the #497 reverse-KL kernel (the checkout at
    :data:`ISSUE_COMMIT`) and of the project's fused kernel at the same tile and warps, compiled for sm_90 here."""
    from perfutils.lab_kernels.case_study import ablation
    from kernels.fused import plan_fused

    from ..peers import fast_llm
    from ..model.offline_compile import compile_launch

    issue = [c for c in checkouts if c.commit and c.commit.startswith(ISSUE_COMMIT)]
    if not issue:
        raise ValueError(f"no Fast-LLM checkout at {ISSUE_COMMIT} among {[c.variant for c in checkouts]}: name it in "
                         f"{fast_llm.ENV_VAR}")
    sections = []
    (launch, *_) = fast_llm.capture_launches(issue[0], loss="reverse_kl", target_format="logits", tokens=tokens,
                                             vocab=vocab, dtype="bf16")
    log(f"compiling {launch.name} (Fast-LLM {issue[0].commit[:8]}) at {tokens} x {vocab}")
    sections.append(_excerpt_section(f"#497 kernel, Fast-LLM {issue[0].commit}, reverse KL, bf16, {tokens} x {vocab}",
                                     launch.compile_offline(), sites=sites))
    problem = _reverse_kl_problem(tokens, vocab, "bf16")
    block, warps = ablation.default_config(vocab)
    (fused,) = plan_fused(problem, block, warps).launches
    log(f"compiling the project's fused kernel at block {block}, {warps} warps")
    sections.append(_excerpt_section(f"project fused kernel, reverse KL, bf16, {tokens} x {vocab}, block {block}",
                                     compile_launch(fused), sites=sites))
    return "\n".join(sections)


def _offline_logs(data_dir: str | Path) -> Path:
    """``<data_dir>/h100-sxm-80gb/logs``: the text logs beside the offline table."""
    from ..data.schema import data_path

    return data_path(data_dir, TARGET_GPU, OFFLINE_STUDY).parent / "logs"


def write_spill_excerpts(text: str, out: str | Path, *, date: str | None = None) -> Path:
    """``<out>/h100-sxm-80gb/logs/case_497_spill_sass_<date>.txt``; never replaces a recorded file."""
    date = date or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    path = _offline_logs(out) / f"case_497_spill_sass_{date}.txt"
    if path.exists():
        raise FileExistsError(f"{path} exists: not overwriting a recorded excerpt")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def recorded_spill_excerpt(data_dir: str | Path) -> tuple[Path, str] | None:
    """The newest recorded excerpt (path, text), or None."""
    found = sorted(_offline_logs(data_dir).glob("case_497_spill_sass_*.txt"))
    return (found[-1], found[-1].read_text(encoding="utf-8")) if found else None


# ---------------------------------------------------------------------------------------------------------------
# GPU measurements
# ---------------------------------------------------------------------------------------------------------------


def measure_cases(study: str, cases, *, losses, vocabs, tokens: int = TOKENS, out: str = "data", checkouts=(),
                  log=print):
    """Run ``cases`` through the sweep harness (resumable) with the Fast-LLM commits in the sidecar."""
    import torch

    from .cases import recorded_ceilings, run_cases

    settings = {}
    ceilings = recorded_ceilings(out, torch.cuda.get_device_name())
    if ceilings:
        settings["ceilings"] = ceilings  # the copy bandwidth of the other studies on this GPU
    return run_cases(study, cases, losses=list(losses), vocabs=list(vocabs), tokens=[tokens], out=out, log=log,
                     parameters={"fast_llm": _fast_llm_parameters(checkouts)}, **settings)


def main_cases(checkouts) -> list[tuple[str, int | None, int | None]]:
    return [(c.variant, None, None) for c in checkouts] + PROJECT_CASES


def ablation_cases(checkouts) -> list[tuple[str, int | None, int | None]]:
    issue = [(c.variant, None, None) for c in checkouts if c.commit and c.commit.startswith(ISSUE_COMMIT)]
    return issue + ABLATION_CASES


def dry_run(out: str | Path, checkouts, *, tokens: int = 8, vocab: int = 300, log=print) -> dict[str, pd.DataFrame]:
    """What a CPU can check of ``measure`` and ``ablation``, with ``TRITON_INTERPRET=1``.

    The project's and the ablation's cases run through the same harness at a tiny shape (kernels under the
    interpreter, float64 checks, sidecars; a stand-in timing backend records 1.0 ms). ``torch_compile`` is
    left out (an Inductor CPU build takes minutes here). Fast-LLM's kernels do not run under Triton 3.6's
    interpreter (it passes their constexpr flags as run-time values and fails), so for each checkout the
    launches of the real shapes are captured on meta tensors instead (kernel, grid, tile, warps)."""
    from ..peers import fast_llm
    from ..measure import providers
    from .cases import run_cases
    from ..measure.measurer import GpuMeasurer, TimingBackend
    from ..measure.sweep_config import load_config

    for checkout in checkouts:
        for loss, target_format in LOSSES:
            for launch in fast_llm.capture_launches(checkout, loss=loss, target_format=target_format, tokens=TOKENS,
                                                    vocab=32768):
                log(f"{checkout.variant} {loss}/{target_format} {TOKENS}x32768: {launch.name} grid {launch.grid} "
                    f"block_size {launch.block_size} warps {launch.warp_choices} stages {launch.num_stages}")
    backend = TimingBackend.dry_run()
    frames = {}
    for study, cases, losses in (
        (STUDY + "_dry_run", PROJECT_CASES[1:], LOSSES),
        # The steps' 32K tiles take minutes each under the interpreter: a tile of the row's width here.
        (ABLATION_STUDY + "_dry_run", [(v, 512 if b else b, w) for v, b, w in ABLATION_CASES], [("reverse_kl", "logits")]),
    ):
        first = load_config(dict(study=study, out=str(out), loss=losses[0][0], target_format=losses[0][1],
                                 variant="fused", dtype="bf16", tokens=tokens, vocab=vocab, check_rows=tokens))
        measurer = GpuMeasurer(first, device="cpu", prepare=providers.prepare, backend=backend, copy_gbps=1.0, log=log)
        frames[study] = run_cases(study, cases, losses=list(losses), vocabs=[vocab], tokens=[tokens], out=str(out),
                                  log=log, parameters={"fast_llm": _fast_llm_parameters(checkouts)},
                                  measurer=measurer, check_rows=tokens)
    return frames


# ---------------------------------------------------------------------------------------------------------------
# Nsight Compute
# ---------------------------------------------------------------------------------------------------------------

NCU_SECTIONS = ("SpeedOfLight", "WarpStateStats", "Occupancy", "MemoryWorkloadAnalysis")
STALL_REASONS = ("long_scoreboard", "short_scoreboard", "wait", "barrier", "membar", "math_pipe_throttle",
                 "mio_throttle", "lg_throttle", "tex_throttle", "not_selected", "selected", "branch_resolving",
                 "dispatch_stall", "drain", "no_instruction", "sleeping", "misc", "imc_miss")
STALL_METRIC = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
NCU_METRICS = (
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum",
    "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum",
    *(STALL_METRIC.format(reason) for reason in STALL_REASONS),
)
# (label, variant, kernel-name regex) at 4096 x 32768 reverse KL, bf16; the Fast-LLM variant is the #497 commit.
NCU_TARGETS = (
    ("#497 kernel (Fast-LLM 27f4747e)", "fast_llm_27f4747e", "triton_reverse_kl_forward_backward_kernel"),
    ("emulation: fused, 32K tile, 16 warps", "fused", "fused_loss_kernel"),
    ("ablation step 2 (least spilling)", "case497.step2", "ablation_reverse_kl_kernel"),
)
# ``ncu --spilling``: the other spilling steps of the ablation too, whose resident stacks span 0.5 to 9x the L2 (what
# the performance model's share of spill traffic reaching DRAM is checked against: perfutils.model.predict)
SPILLING_TARGETS = tuple((f"ablation {variant}", variant, "ablation_reverse_kl_kernel")
                         for variant in ("case497.step0", "case497.step1", "case497.step3", "case497.solo_shape",
                                         "case497.solo_exp", "case497.solo_reduce"))


def ncu_argv(ncu: str, variant: str, kernel_name: str, *, vocab: int = 32768, python: str = sys.executable) -> list[str]:
    """One Nsight Compute run: the four sections and the extra metrics, the first launch of the kernel."""
    target = ["perfutils", "case-497", "ncu-target", variant, "--vocab", vocab]
    return ncu_command(ncu, [kernel_name], NCU_METRICS, "-m", target,
                       sections=NCU_SECTIONS, launch_count=1, follow_children=False, csv_output=False, python=python)


def ncu_target(variant: str, vocab: int = 32768, tokens: int = TOKENS) -> None:
    """What ncu profiles: one reverse-KL call of ``variant`` on fresh random bf16 inputs (seeded)."""
    import torch

    from ..measure import providers
    from ..model.cuda_tools import pin_bundled_ptxas

    pin_bundled_ptxas()  # the ptxas the measured rows use
    generator = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(tokens, vocab, device="cuda", generator=generator) * 2).bfloat16()
    t = (torch.randn(tokens, vocab, device="cuda", generator=generator) * 2).bfloat16()
    plan = providers.prepare(x, t, loss="reverse_kl", target_format="logits", variant=variant)
    plan.run()
    torch.cuda.synchronize()
    print(f"ran {variant}: {getattr(plan, 'config', {})}", flush=True)


_SUMMARY = {
    "duration_us": ("GPU Speed Of Light Throughput", "Duration"),
    "dram_throughput_pct": ("GPU Speed Of Light Throughput", "DRAM Throughput"),
    "memory_throughput_pct": ("GPU Speed Of Light Throughput", "Memory Throughput"),
    "sm_throughput_pct": ("GPU Speed Of Light Throughput", "Compute (SM) Throughput"),
    "l2_hit_rate_pct": ("Memory Workload Analysis", "L2 Hit Rate"),
    "l1_hit_rate_pct": ("Memory Workload Analysis", "L1/TEX Hit Rate"),
    "local_spilling_requests": ("Memory Workload Analysis", "Local Memory Spilling Requests"),
    "theoretical_occupancy_pct": ("Occupancy", "Theoretical Occupancy"),
    "achieved_occupancy_pct": ("Occupancy", "Achieved Occupancy"),
    "block_limit_registers": ("Occupancy", "Block Limit Registers"),
    "warp_cycles_per_issued_instruction": ("Warp State Statistics", "Warp Cycles Per Issued Instruction"),
    "dram_read_bytes": (None, "dram__bytes_read.sum"),
    "dram_write_bytes": (None, "dram__bytes_write.sum"),
    "local_load_bytes": (None, "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum"),
    "local_store_bytes": (None, "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum"),
}


def ncu_summary(parsed: pd.DataFrame, top_stalls: int = 3) -> pd.DataFrame:
    """One row per profiled launch: duration, DRAM throughput, occupancy, local memory, top stall reasons
    (cycles per issued instruction spent in each, from the ``smsp__average_warps_issue_stalled_*`` metrics)."""
    rows = []
    for (label, launch), group in parsed.groupby(["label", "launch"], dropna=False, sort=True):
        first = group.iloc[0]
        row: dict[str, Any] = {"label": label, "kernel": first["kernel"], "grid": first["grid"], "block": first["block"]}
        for column, (section, metric) in _SUMMARY.items():
            found = group[(group["metric"] == metric) & ((group["section"] == section) if section else True)]
            value = found["value"].iloc[0] if len(found) else None
            if isinstance(value, float) and column.endswith(("_bytes", "_us")):  # bytes; times in µs
                value *= unit_scale(found["unit"].iloc[0]) / (1e3 if column.endswith("_us") else 1.0)
            row[column] = value
        numeric = group["value"].map(lambda v: isinstance(v, float)).astype(bool)
        stalls = group[group["metric"].str.startswith("smsp__average_warps_issue_stalled_") & numeric].copy()
        stalls["reason"] = stalls["metric"].str.replace("smsp__average_warps_issue_stalled_", "", regex=False).str.replace(
            "_per_issue_active.ratio", "", regex=False)
        stalls = stalls[stalls["reason"] != "selected"].sort_values("value", ascending=False)
        for rank in range(top_stalls):
            has = rank < len(stalls)
            row[f"stall_{rank + 1}"] = stalls["reason"].iloc[rank] if has else None
            row[f"stall_{rank + 1}_cycles"] = float(stalls["value"].iloc[rank]) if has else None
        rows.append(row)
    return pd.DataFrame(rows)


def run_ncu(out: str | Path = "data", *, vocab: int = 32768, targets=NCU_TARGETS, timeout: float = 240,
            log=print) -> tuple[Path, Path]:
    """Profile each target with Nsight Compute; write the text log and the parsed summary (refuses to overwrite)."""
    import torch

    from ..data.metadata import collect_metadata
    from ..data.schema import data_path
    from ..data.store import write_table

    ncu = find_ncu()
    if ncu is None:
        raise SystemExit("ncu (Nsight Compute) not found on PATH or in the usual CUDA folders")
    gpu = torch.cuda.get_device_name()
    csv_path = data_path(out, gpu, NCU_STUDY)
    log_path = csv_path.parent / "logs" / f"ncu_case_497_{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d}.txt"
    for path in (csv_path, log_path):
        if path.exists():
            raise SystemExit(f"{path} exists: not overwriting recorded data")
    lines = [f"{gpu} torch {torch.__version__} triton {__import__('triton').__version__}",
             ncu_version(ncu) or "ncu version unknown"]
    for label, variant, kernel in targets:
        argv = ncu_argv(ncu, variant, kernel, vocab=vocab)
        lines.append(f"=== {label}: {variant}, reverse_kl logits, {TOKENS} x {vocab}, bf16")
        lines.append("$ " + " ".join(argv))
        log(lines[-2])
        returncode, out, err = run_ncu_command(argv, timeout, os.getcwd())
        output = out + err + ("" if returncode is not None else f"\nTIMEOUT after {timeout} s")
        lines += [line for line in output.splitlines() if line.strip() and not line.startswith("==PROF==")]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    summary = ncu_summary(parse_ncu_text("\n".join(lines)))
    meta = collect_metadata({"study": NCU_STUDY, "vocab": vocab, "tokens": TOKENS, "targets": list(targets),
                             "sections": list(NCU_SECTIONS), "metrics": list(NCU_METRICS)})
    meta.update(study=NCU_STUDY, ncu_version=lines[1], log=str(log_path))
    write_table(summary, csv_path, meta)
    log(f"wrote {log_path} and {csv_path} ({len(summary)} profiled launches)")
    return log_path, csv_path


# ---------------------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------------------


def _losses(items: list[str] | None, default) -> list[tuple[str, str]]:
    return [tuple(item.split(":")) for item in items] if items else list(default)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m perfutils case-497", description=__doc__.split("\n\n")[0])
    parser.add_argument("stage", choices=["cases", "dry-run", "offline", "offline-peers", "spill-sass", "measure",
                                          "ablation", "ncu", "ncu-target"])
    parser.add_argument("variant", nargs="?", help="ncu-target: the variant to run once")
    parser.add_argument("--out", default=None, help="data folder (default data; dry-run: a new temporary folder)")
    parser.add_argument("--vocab", type=int, nargs="+", default=None)
    parser.add_argument("--loss", nargs="+", default=None, help="loss:target_format, e.g. reverse_kl:logits")
    parser.add_argument("--fast-llm", default=None, help=f"checkouts (default ${'FAST_LLM_PATH'})")
    parser.add_argument("--overwrite", action="store_true", help="offline: replace the recorded table")
    parser.add_argument("--spilling", action="store_true", help="ncu: the ablation's other spilling steps too")
    parser.add_argument("--gpu", default=TARGET_GPU,
                        help="offline: the sm_90 GPU whose folder gets the compiles (default the H100's)")
    args = parser.parse_args(argv)

    if args.stage == "ncu-target":
        if not args.variant:
            parser.error("ncu-target needs the variant to run")
        ncu_target(args.variant, (args.vocab or [32768])[0])
        return 0
    if args.stage == "cases":
        names = [f"{v} (from {p})" for p, v in _checkout_variants(args.fast_llm)]
        print("Fast-LLM checkouts:", names or "none (set FAST_LLM_PATH)")
        fast = [(v, None, None) for _, v in _checkout_variants(args.fast_llm)]
        vocabs = args.vocab or list(VOCABS)
        print(f"measure -> {STUDY}: {len(fast) + len(PROJECT_CASES)} cases x {len(vocabs)} vocabs x "
              f"{len(_losses(args.loss, LOSSES))} losses")
        for case in fast + PROJECT_CASES:
            print("   ", case)
        print(f"ablation -> {ABLATION_STUDY}: reverse KL at vocab {args.vocab or list(ABLATION_VOCABS)}")
        for case in [c for c in fast if c[0].startswith("fast_llm_27f4747e")] + ABLATION_CASES:
            print("   ", case)
        print(f"ncu -> {NCU_STUDY}: {[t[1] for t in NCU_TARGETS]}")
        return 0
    if args.stage == "dry-run":
        if os.environ.get("TRITON_INTERPRET") != "1":
            raise SystemExit("dry-run runs the kernels under the Triton interpreter: set TRITON_INTERPRET=1")
        os.environ.setdefault("FAST_LLM_SKIP_TRITON_AUTOTUNE", "1")
        import tempfile

        out = args.out or tempfile.mkdtemp(prefix="case_497_dry_run_")
        frames = dry_run(out, fast_llm_checkouts(args.fast_llm), vocab=(args.vocab or [300])[0])
        for study, frame in frames.items():
            print(study, frame["status"].value_counts().to_dict())
            print(frame[["loss", "target_format", "variant", "block_size", "num_warps", "max_rel_err", "status",
                         "error"]].to_string())
        return 0
    args.out = args.out or "data"
    checkouts = fast_llm_checkouts(args.fast_llm)
    if args.stage == "spill-sass":
        path = write_spill_excerpts(spill_excerpts(checkouts, vocab=(args.vocab or [32768])[0]), args.out or "data")
        print(f"wrote {path}")
        return 0
    if args.stage == "offline":
        df = offline_table(checkouts, vocabs=args.vocab or VOCABS)
        path = write_offline_table(df, args.out, checkouts, overwrite=args.overwrite, gpu=args.gpu)
        print(f"wrote {path} ({len(df)} compiles, {int((df['status'] != 'ok').sum())} failed)")
    elif args.stage == "offline-peers":
        from .vocab_sweep import VOCABS as SWEEP_VOCABS

        df = pd.DataFrame(fast_llm_offline_rows(checkouts, vocabs=args.vocab or SWEEP_VOCABS,
                                                jobs=max(1, (os.cpu_count() or 2) - 2)))
        path = write_offline_table(df, args.out, checkouts, overwrite=args.overwrite, gpu=args.gpu,
                                   study=PEERS_OFFLINE_STUDY)
        print(f"wrote {path} ({len(df)} compiles, {int((df['status'] != 'ok').sum())} failed)")
    elif args.stage == "measure":
        measure_cases(STUDY, main_cases(checkouts), losses=_losses(args.loss, LOSSES), vocabs=args.vocab or VOCABS,
                      out=args.out, checkouts=checkouts)
    elif args.stage == "ablation":
        measure_cases(ABLATION_STUDY, ablation_cases(checkouts), losses=[("reverse_kl", "logits")],
                      vocabs=args.vocab or ABLATION_VOCABS, out=args.out, checkouts=checkouts)
    elif args.stage == "ncu":
        run_ncu(args.out, vocab=(args.vocab or [32768])[0],
                targets=NCU_TARGETS + (SPILLING_TARGETS if args.spilling else ()))
    return 0


def _checkout_variants(paths: str | None) -> list[tuple[Path, str]]:
    """(path, variant) of each named checkout, from its commit alone (nothing imported)."""
    from ..peers import fast_llm

    return [(p, fast_llm.variant_name(fast_llm.checkout_commit(p))) for p in fast_llm.checkout_paths(paths)]

