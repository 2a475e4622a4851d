"""The learning path of notebook 12: from the #497 kernel to the fastest loss kernels, one design step at a time.

Each :class:`PathStep` names the question it answers, the ``@triton.jit`` functions that answer it (module and
name, rendered from the source file by the notebook), and the recorded H100 rows that measure it: a ``before`` row
(the previous design, where one was recorded on the same shape) and an ``after`` row, each picked from one study's
CSV by column values (:class:`Pick`). :func:`path_frame` reads those rows and puts beside each recorded time the
time :mod:`perfutils.model.predict` gives from the row's non-time columns (its compile counts and plan), with the
bound and the terms; a step with no recorded row says so (``recorded_ms`` missing) instead of inventing one.

:func:`knob_prediction` is what the notebook's widget drives: the fused kernel at one (tile, warps) of the recorded
block-size sweep, predicted by the model from that configuration's recorded compile counts, beside its recorded time;
:func:`knob_compiled` the same configuration of today's source compiled offline for sm_90 (no GPU) and predicted from
those counts, :func:`knob_measured` it measured now on a GPU.

:func:`fold_constexprs` renders a kernel with its compile-time switches fixed at their defaults, so that a step's diff
(:func:`step_diff`) shows the design change and not the switches later work added.
"""

from __future__ import annotations

import ast
import difflib
import importlib
import inspect
import json
import math
import re
import textwrap
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

from .data.records import load_metadata
from .model import predict as model
from .model.roofline import loss_cost
from .model.spill_counts import SpillCount, resident_stack_bytes, spill_key
from .model.step_counts import (exchange_key_of_row, load_counted_sources, load_exchange_counts, load_exchange_sources,
                                load_step_counts)
from .notebook import kernel_source
from .provenance import TWO_GPU_STUDIES, rows_sources, source_match

__all__ = ["Pick", "LogExcerpt", "PathStep", "STEPS", "pick_row", "predict_row", "path_frame", "step_summary",
           "step_functions", "teaching_function", "step_diff", "key_lines", "speedups", "step_evidence", "log_excerpt",
           "knob_options", "knob_prediction", "knob_compiled", "knob_measured", "compiled_differently", "fused_today", "knob_text",
           "sass_excerpt", "live_case", "measure_path", "with_live", "constexpr_defaults", "fold_constexprs",
           "without_docstring", "folded_switches", "exercise_variant", "exercise_check", "exercise_model",
           "exercise_answer"]


@dataclass(frozen=True)
class Pick:
    """One recorded row: the study's CSV and the column values that select it. ``fastest`` takes the fastest row
    among several matches (a tuning sweep's best configuration); ``slice_of`` predicts the row's kernel on
    ``vocab / slice_of`` columns (one rank's slice of a vocabulary split), from the plan row ``plan`` of another
    study (the tensor-parallel rows record no plan)."""

    study: str
    where: tuple  # ((column, value), ...)
    fastest: bool = False
    plan: "Pick | None" = None
    slice_of: int = 1

    def describe(self) -> str:
        values = ", ".join(f"{c}={v}" for c, v in self.where)
        return f"{self.study}.csv ({values}{', fastest' if self.fastest else ''})"


@dataclass(frozen=True)
class LogExcerpt:
    """Lines of a recorded log under ``data/<gpu>/logs`` (``folder``: another GPU's data folder beside it): from the
    first line holding ``start``, the lines that match one of ``patterns`` (every line without patterns), at most
    ``lines`` of them."""

    file: str
    start: str = ""
    patterns: tuple = ()
    lines: int = 12
    folder: str = ""

    @property
    def where(self) -> str:
        """The log's path as a page names it."""
        return f"data/{self.folder}/logs/{self.file}" if self.folder else f"logs/{self.file}"


@dataclass(frozen=True)
class PathStep:
    """One step of the path: its question, the functions it shows, the rows that measure it, and its evidence:
    ``records`` picks rows of the compile and profiler studies (offline SASS counts, Nsight Compute counters),
    ``logs`` excerpts of recorded logs. ``diff_from`` names the function that the step's first function replaces
    (the form of the step before): the page then shows the diff instead of the whole function."""

    key: str
    title: str
    question: str
    functions: tuple  # (("kernels.fused", "fused_loss_kernel"), ...)
    after: Pick | None
    before: Pick | None = None
    evidence: str = ""  # a log under data/<gpu>/logs with the step's SASS or exploration
    note: str = ""  # what is missing, or what to read with the numbers
    records: tuple = ()  # (Pick, ...) of registers/profiler studies
    logs: tuple = ()  # (LogExcerpt, ...)
    diff_from: tuple | None = None  # ("kernels.split_row", "split_row_cooperative_kernel")
    fold: tuple = ()  # constexpr switches of later work, fixed at their defaults before diffing (fold_constexprs)
    read_first: tuple = ()  # text of the lines that carry the step's idea, in the order to read them (key_lines)
    teaching: tuple = ()  # (module, name) of a lab kernel that shows the step's idea at teaching size, shown first

    @property
    def measured(self) -> bool:
        return self.after is not None


RKL = (("loss", "reverse_kl"), ("target_format", "logits"), ("tokens", 4096))
CE = (("loss", "cross_entropy"), ("target_format", "labels"), ("tokens", 4096))


ABLATION = "perfutils.lab_kernels.case_study.ablation"  # the #497 structure with one switch per difference


def _ablation(variant: str) -> Pick:
    return Pick("case_497_ablation", RKL + (("vocab", 32768), ("variant", variant), ("num_warps", 16)))


def _sass(variant: str, vocab: int = 32768) -> Pick:
    """A row of the offline sm_90 compiles of the case study (registers, stack, SASS instruction counts)."""
    return Pick("case_497_registers_offline", (("loss", "reverse_kl"), ("vocab", vocab), ("variant", variant)))


def _ncu_497(kernel: str) -> Pick:
    """A row of the case study's Nsight Compute run (reverse KL, 4096 x 32768)."""
    return Pick("case_497_ncu", (("kernel", kernel),))


def _ncu_profile(kernel: str) -> Pick:
    """A row of the profile study's Nsight Compute run (labels cross-entropy, 4096 x 32768)."""
    return Pick("profile_ncu", (("kernel", kernel), ("vocab", 32768)))


def _compiled(block_size: int, num_warps: int) -> Pick:
    """``kernels.fused`` for reverse KL at 32768 columns, compiled offline for sm_90 (registers_offline.csv)."""
    return Pick("registers_offline", RKL[:2] + (("vocab", 32768), ("variant", "fused"), ("block_size", block_size),
                                                 ("num_warps", num_warps)))


STEPS: tuple[PathStep, ...] = (
    PathStep("497", "The #497 kernel", "Why is the #497 kernel slow when its occupancy is full?",
             ((ABLATION, "ablation_reverse_kl_kernel"), (ABLATION, "split_tile_update")),
             after=_ablation("case497.step0"), before=None,
             evidence="case_497_spill_sass_2026-11-23.txt",
             records=(_sass("fast_llm_27f4747e"), _sass("case497.step0"),
                      _ncu_497("triton_reverse_kl_forward_backward_kernel_from_distribution")),
             note="the #497 structure re-implemented (step 0 of the ablation); the real kernel is run from a "
                  "Fast-LLM checkout, not shown here"),
    PathStep("kept", "Kept exponentials", "What does the backward gain by reusing the forward's exponentials?",
             ((ABLATION, "kept_gradient"), (ABLATION, "tile_grad"), ("kernels.row_math", "tile_gradient")),
             after=_ablation("case497.step1"), before=_ablation("case497.step0"),
             diff_from=(ABLATION, "recomputed_gradient"),
             records=(_sass("case497.step0"), _sass("case497.step1")),
             note="no Nsight Compute run of this step was recorded: the offline compile's counts are its evidence"),
    PathStep("tuple", "Tuple reductions", "What do two tuple reductions save over five separate ones?",
             ((ABLATION, "combined_tile_update"), ("kernels.row_math", "tile_statistics"),
              ("kernels.row_math", "max_pair"), ("kernels.row_math", "sum_triple")),
             after=_ablation("case497.step2"), before=_ablation("case497.step1"),
             diff_from=(ABLATION, "split_tile_update"),
             records=(_sass("case497.step1"), _sass("case497.step2"), _ncu_497("ablation_reverse_kl_kernel"))),
    PathStep("fused", "One tile in registers: fused", "Is one 32K tile in registers the best tile for two softmaxes?",
             (("kernels.fused", "fused_loss_kernel"),),
             after=Pick("case_497", RKL + (("vocab", 32768), ("variant", "fused"), ("block_size", 16384))),
             before=_ablation("fused"),
             records=(_compiled(32768, 16), _compiled(16384, 16), _ncu_497("fused_loss_kernel")),
             read_first=("if SINGLE_TILE:", "x2, t2 = load_tiles(x_body",
                         "m_x, s_x, m_t, s_t, acc, e_x, e_t = tile_statistics(x2, t2", "grad = tile_gradient(e_x, q_factor",
                         "m_x, s_x, m_t, s_t, acc = row_statistics(x_body", "for step in range(0, last, BLOCK_SIZE):",
                         "grad = scaled_gradient(widen(x), widen(t)"),
             note="before: kernels.fused with the #497 tile (32K, 16 warps); after: its tile capped at 16K "
                  "(Option A), the row read twice, the second time from L2"),
    PathStep("two_pass", "Two passes", "When the row is four tiles, does writing the statistics to memory beat "
             "re-reading the row in one program?",
             (("kernels.two_pass", "two_pass_stats_kernel"), ("kernels.two_pass", "two_pass_grad_kernel")),
             after=Pick("case_497", RKL + (("vocab", 131072), ("variant", "two_pass"))),
             before=Pick("case_497", RKL + (("vocab", 131072), ("variant", "fused"), ("block_size", 16384))),
             read_first=("m_x, s_x, m_t, s_t, acc = row_statistics(x_row", "tl.store(row_stats_ptr + row * 4 + 0",
                         "e_x = tl.exp2(x2 - lse2_x)", "grad = tile_gradient(e_x, 1.0, e_t, 1.0"),
             records=(_ncu_profile("fused_loss_kernel"), _ncu_profile("two_pass_stats_kernel"),
                      _ncu_profile("two_pass_grad_kernel")),
             note="the profiler rows are labels cross-entropy at 4096 x 32768, the only shape Nsight Compute recorded "
                  "both designs at"),
    PathStep("split", "Split row, exchanged statistics", "Can a wide row be read from DRAM once if its chunks go "
             "to different programs that exchange their summaries?",
             (("kernels.split_row", "split_row_cooperative_kernel"),),
             after=Pick("split_row_wait_tuning", RKL + (("vocab", 131072),), fastest=True),
             before=Pick("case_497", RKL + (("vocab", 131072), ("variant", "two_pass"))),
             records=(_ncu_profile("two_pass_grad_kernel"), _ncu_profile("split_row_cooperative_kernel")),
             read_first=("m_x, s_x, m_t, s_t, acc, e_x, e_t = tile_statistics(x2, t2", "arrived = tl.atomic_add(",
                         "while arrived < NUM_CHUNKS:", "all_m_x, all_s_x, all_m_t, all_s_t, all_acc = load_partials(",
                         "grad = tile_gradient(e_x, q_factor"),
             note="the profiler rows are labels cross-entropy at 4096 x 32768 (the wait schedule was not profiled at "
                  "the timed shape)"),
    PathStep("lagged", "The lagged exchange", "What if no program waits for its row's slowest chunk?",
             (("kernels.split_row", "split_row_lagged_kernel"),),
             after=Pick("split_row_tuning", RKL + (("vocab", 131072),), fastest=True),
             before=Pick("split_row_wait_tuning", RKL + (("vocab", 131072),), fastest=True),
             diff_from=("kernels.split_row", "split_row_cooperative_kernel"),
             fold=("PEEL", "VEC", "PREFETCH", "READ_AHEAD", "FAST_MATH"),
             teaching=("perfutils.lab_kernels.teaching.lagged_exchange", "lagged_exchange_kernel"),
             read_first=("behind = LAG_STEPS * n_slots", "old = tl.maximum(row - behind, 0)",
                         "x_cur, t_cur = load_chunk(logits_ptr, target_ptr, cur,", "x_old, t_old = load_raw_tiles(",
                         "all_m_x, all_s_x, all_m_t, all_s_t, all_acc = wait_for_summaries(summaries",
                         "grad = scaled_gradient(widen(x_old)", "summarise_chunk(x_cur, t_cur"),
             logs=(LogExcerpt("ncu_split_row_2026-11-22.txt", "=== reverse_kl logits 131072",
                              ("_kernel (", "DRAM Throughput", "Duration", "Achieved Occupancy"), 4),
                   LogExcerpt("ncu_lagged_stalls_2026-11-26.txt", "# Reading:", ("# ",), 11))),
    PathStep("peel", "The row peel", "How does a row that is not 16-byte aligned keep 16-byte loads?",
             (("kernels.row_math", "row_peel"), ("kernels.row_math", "label_in_tile")),
             after=Pick("vocab_sweep", CE + (("vocab", 50257), ("variant", "plan"))), before=None,
             logs=(LogExcerpt("explore_peel_2026-11-26.txt", "# The code:", lines=12),),
             note="no recorded row of the kernel before the peel: its times are in the exploration log only"),
    PathStep("resident", "The resident row (bf16x2)", "Can cross-entropy keep a 32K row in registers without "
             "spilling, by never widening it?",
             (("kernels.resident_row", "resident_row_kernel"), ("kernels.resident_row", "pair_gradient")),
             after=Pick("vocab_sweep", CE + (("vocab", 32768), ("variant", "plan"))),
             before=Pick("case_497", CE + (("vocab", 32768), ("variant", "fused"), ("block_size", 16384))),
             read_first=("words = tl.load(x_words + lanes", "m_x = words_max(words, WORDS)",
                         "s_x = tl.sum(pair_exponential_sum(words, shift)", "tl.store(g_words + lanes, pair_gradient("),
             logs=(LogExcerpt("explore_resident_2026-11-26.txt", "## run C", ("4096x32000",), 6),)),
    PathStep("tp", "The vocabulary split over GPUs", "Can two GPUs each read half the vocabulary once and "
             "exchange only the rows' summaries?",
             (("kernels.vocab_parallel_exchange", "exchange_kernel"),),
             read_first=("for row in range(slot.to(tl.int64), n_rows + behind, n_slots):",
                         "m_x, s_x, m_t, s_t, acc, x_label, timed_out = wait_for_lanes(",
                         "grad = gradient_from_summary(base2(x_old)", "publish(peers_ptr"),
             after=Pick("tensor_parallel", CE + (("vocab", 131072), ("variant", "tp2-symmetric")),
                        plan=Pick("vocab_sweep", CE + (("vocab", 131072), ("variant", "plan"))), slice_of=2),
             before=Pick("tensor_parallel", CE + (("vocab", 131072), ("variant", "tp1-auto")),
                         plan=Pick("vocab_sweep", CE + (("vocab", 131072), ("variant", "plan")))),
             logs=(LogExcerpt("nvlink_2026-11-29.txt", "## second run", ("GB/s", "round trip"), 7, folder="h200"),),
             note="no profiler counters or log of the two-GPU kernel were recorded; tp=2 is predicted as the "
                  "kernel each rank ran (the row's recorded tile, warps, chunks and grid; its step counted offline "
                  "from today's exchange kernel: exchange_steps.csv) on its half of each row, plus the exchange "
                  "(model.with_exchange): the summaries the peer stores into the "
                  "rank's buffer and the rank's polls of it (kernels.vocab_parallel.bytes_per_rank) as L2 traffic at "
                  "the measured L2 bandwidth, and the rank's stores into its peer at the rate the exchange's store "
                  "pattern reached over NVLink (nvlink.csv: python -m perfutils nvlink; model.link_of names the pair "
                  "it was measured on); no round trip is costed (a row's summaries are read LAG steps after they are "
                  "written: the sentence compares the two)"),
)


def _read(data_dir: Path, study: str) -> pd.DataFrame:
    frame = pd.read_csv(Path(data_dir) / f"{study}.csv", low_memory=False)
    frame["study"] = study
    return frame[frame["status"].fillna("ok") == "ok"] if "status" in frame.columns else frame


def pick_row(data_dir, pick: Pick, cache: dict | None = None) -> dict | None:
    """The recorded row ``pick`` selects (a dict), or None if none matches."""
    cache = {} if cache is None else cache
    if pick.study not in cache:
        path = Path(data_dir) / f"{pick.study}.csv"
        cache[pick.study] = _read(data_dir, pick.study) if path.is_file() else pd.DataFrame()
    frame = cache[pick.study]
    for column, value in pick.where:
        if frame.empty or column not in frame.columns:
            return None
        frame = frame[frame[column] == value]
    if frame.empty:
        return None
    if pick.fastest:
        frame = frame.sort_values("ms_median")
    return frame.iloc[0].to_dict()


def predict_row(row: dict, gpu: model.Gpu, data_dir=None, pick: Pick | None = None,
                cache: dict | None = None) -> tuple[model.LaunchConfig, model.Prediction] | None:
    """The model's configuration and prediction for a recorded row (its non-time columns only); with ``pick.plan``,
    the plan row of another study supplies the kernel, on ``vocab / pick.slice_of`` columns."""
    source = dict(row)
    sliced = pick is not None and pick.slice_of > 1
    recorded = _json_config(row) if sliced else None  # a vocab-parallel row's kernel, as its ranks ran it
    ran = _rank_kernel(row, recorded, gpu) if recorded else None
    if ran is not None:  # the kernel each rank ran, as the row recorded it, on its slice
        source = {**row, **ran}
    elif pick is not None and pick.plan is not None:
        plan = pick_row(data_dir, pick.plan, cache)
        if plan is None:
            return None
        source = {**plan, "study": row.get("study"), "config_key": row.get("config_key"),
                  "vocab": int(plan["vocab"]) // pick.slice_of}
    config = counted_config(source, gpu, data_dir)
    if config is not None and sliced:
        chunks = (recorded or {}).get("num_chunks")
        config = model.with_exchange(config, tp=pick.slice_of, num_chunks=int(chunks) if chunks else None)
        if ran is not None and data_dir is not None:
            config = _exchange_counted(config, row, data_dir)
    return None if config is None else (config, model.predict(config, gpu))


def _exchange_counted(config, row: dict, data_dir):
    """A rank's pass with the step of the kernel it ran, the symmetric design's exchange kernel, as the folder's
    offline counts hold it (``exchange_steps.csv``: ``python -m perfutils step-counts``); unchanged without them."""
    step = load_exchange_counts(data_dir).get(exchange_key_of_row(row))
    if not step:
        return config
    main = model.main_pass(config)
    passes = list(config.passes)
    passes[main] = replace(passes[main], instructions_per_step=step, step_key=())
    return replace(config, passes=tuple(passes))


def _step_counted_on(row: dict | None, pick, config, data_dir) -> str | None:
    """Whether a counted step (the exchange kernel's for a two-GPU row, else the lagged pass's) was counted on the
    kernel sources the row ran: "same", "other" or "unknown"; None where no step was counted."""
    if row is None or config is None or data_dir is None:
        return None
    if pick.slice_of > 1:  # a rank's step: the exchange kernel's count (_exchange_counted)
        counted = load_exchange_sources(data_dir).get(exchange_key_of_row(row))
    else:
        keys = [p.step_key for p in config.passes if p.step_key and p.instructions_per_step]
        if not keys:
            return None
        counted = load_counted_sources(data_dir).get(keys[0])
    path = Path(data_dir) / f"{pick.study}.csv"
    ran = rows_sources(pd.DataFrame([row]), load_metadata(path)).iloc[0] if path.is_file() else None
    same, other, _unknown = source_match(pd.Series([counted], dtype=object), pd.Series([ran], dtype=object),
                                         one_gpu=pick.study not in TWO_GPU_STUDIES)
    return "same" if same.iloc[0] else "other" if other.iloc[0] else "unknown"


def counted_config(row: dict, gpu: model.Gpu, data_dir=None, moved_bytes: float | None = None):
    """The model's configuration of a recorded row (``model.config_from_row``) with its lagged step and its spill
    traffic as offline compiles counted them: the folder's step counts (``model.with_step_counts``), and
    ``moved_bytes`` (a thread's spill stores + loads, from a compile made now: a one-step kernel's), else the folder's
    offline compiles (``model.load_spill_counts``)."""
    config = model.config_from_row(row, gpu)
    if config is None:
        return None
    if data_dir is not None:
        config = model.with_step_counts(config, load_step_counts(data_dir))
    if moved_bytes is not None:
        counts = {spill_key(config.loss, config.target_format, config.dtype, config.vocab, p.tile, p.num_warps,
                            p.spill_bytes): SpillCount(float(moved_bytes), 0.0, False)
                  for p in config.passes if p.spill_bytes}
    else:
        counts = model.load_spill_counts(data_dir) if data_dir is not None else {}
    return model.with_spill_counts(config, counts)


def _json_config(row: dict) -> dict | None:
    try:
        value = json.loads(row.get("config") or "")
    except (TypeError, json.JSONDecodeError):
        return None
    return value if isinstance(value, dict) else None


def _rank_kernel(row: dict, config: dict, gpu: model.Gpu) -> dict | None:
    """The columns that describe the kernel one rank of a vocab-parallel row ran (its recorded ``config``: the lagged
    exchange kernel's tile, warps, chunks and persistent grid, the programs the GPU held), on its slice of the
    vocabulary; None where the row did not record them."""
    if not all(config.get(k) for k in ("block_size", "num_warps", "num_chunks", "programs")):
        return None
    tp = int(row.get("tp") or 1)
    resident = math.ceil(int(config.get("resident_programs") or config["programs"]) / gpu.sm_count)
    plan = {"variant": "split_row", "block_size": config["block_size"], "num_warps": config["num_warps"],
            "num_chunks": config["num_chunks"], "programs": config["programs"]}
    launch = {"name": "split_row.lagged", "block_size": config["block_size"], "num_warps": config["num_warps"],
              "blocks_per_sm": resident}
    return {"vocab": int(row["vocab"]) // tp, "plan_config": json.dumps(plan), "passes": json.dumps([launch])}


def _describe(row: dict | None) -> dict:
    if row is None:
        return {}
    passes = row.get("passes")
    launch = (json.loads(passes)[0] if isinstance(passes, str) and passes.startswith("[") else {})
    launch = launch or _json_config(row) or {}  # a vocab-parallel row: the kernel its ranks ran
    value = lambda key: launch.get(key) if launch.get(key) is not None else row.get(key)  # noqa: E731
    return {"vocab": int(row["vocab"]), "tokens": int(row["tokens"]), "block_size": value("block_size"),
            "num_warps": value("num_warps"), "n_regs": value("n_regs"), "spill_bytes": value("spill_bytes"),
            "blocks_per_sm": value("blocks_per_sm"), "pct_of_copy": row.get("pct_of_copy"),
            "ms_p20": row.get("ms_p20"), "ms_p80": row.get("ms_p80"),
            "measured": str(row.get("timestamp_utc") or "")[:10]}


def _model_counts(config, gpu: model.Gpu) -> dict:
    """What the model sees of a configuration: DRAM bytes per element, resident programs, KiB of loads in flight per
    SM and the stacks of every resident thread over the L2 (of its first pass)."""
    if config is None or not config.passes:
        return {}
    first = config.passes[0]
    elements = float(config.tokens) * config.vocab
    stacks = resident_stack_bytes(first.spill_bytes, first.num_warps, first.resident, gpu.sm_count)
    return {"dram_bytes_per_element": sum(p.dram_bytes for p in config.passes) / elements,
            "resident": first.resident, "kib_in_flight_per_sm": first.resident * first.load_bytes_per_step / 1024,
            "stack_over_l2": stacks / gpu.l2_bytes}


def _link_columns(config, pred, gpu: model.Gpu) -> dict:
    """A vocab-parallel step's NVLink: the bytes a rank stores into its peer, their time alone at the link's measured
    rate, the prediction without them, the link's round trip against the time a row's summaries have before they are
    read (LAG_STEPS predicted steps of the pass that sends them), and where the link was measured."""
    if pred is None or not config.exchange_link_bytes or gpu.link is None:
        return {}
    main = config.passes[model.main_pass(config)]
    return {"link_mb": config.exchange_link_bytes / 1e6, "nvlink_ms": pred.breakdown.get("nvlink", 0.0),
            "predicted_without_link_ms": model.predict(config, replace(gpu, link=None)).ms,
            "link_gbps": gpu.link.store_gbps, "round_trip_us": gpu.link.round_trip_ns / 1e3,
            "lag_us": model.LAG_STEPS * model.step_seconds(main, gpu) * 1e6,
            "link_measured_on": f"two {gpu.link.gpu_name}s (NV{gpu.link.links}; data/{gpu.link.folder}/nvlink.csv)"}


def path_frame(data_dir, steps=STEPS) -> pd.DataFrame:
    """One row per (step, side): side ``before``/``after``, the recorded time, the model's predicted time, its
    bound and DRAM/latency terms, the compile counts the row recorded, and the row's source."""
    data_dir = Path(data_dir)
    gpu = replace(model.gpu_from_folder(data_dir), link=model.link_of(data_dir))  # the link: vocab-parallel steps
    cache: dict = {}
    rows = []
    for order, step in enumerate(steps, start=1):
        for side, pick in (("before", step.before), ("after", step.after)):
            if pick is None:
                if side == "after":
                    rows.append({"order": order, "step": step.key, "title": step.title, "side": side,
                                 "recorded_ms": math.nan, "predicted_ms": math.nan, "source": "none recorded"})
                continue
            row = pick_row(data_dir, pick, cache)
            both = predict_row(row, gpu, data_dir, pick, cache) if row is not None else None
            config, pred = both if both else (None, None)
            bytes_min = float(row["bytes_min"]) if row is not None and row.get("bytes_min") == row.get("bytes_min") \
                else math.nan
            rows.append({"order": order, "step": step.key, "title": step.title, "side": side,
                         "loss": row["loss"] if row else None, "variant": row["variant"] if row else None,
                         **_describe(row),
                         "recorded_ms": float(row["ms_median"]) if row else math.nan,
                         "predicted_ms": pred.ms if pred else math.nan, "bound": pred.bound if pred else None,
                         "dram_ms": pred.breakdown.get("dram") if pred else math.nan,
                         "latency_ms": pred.breakdown.get("latency") if pred else math.nan,
                         "spills_ms": pred.breakdown.get("spills") if pred else math.nan,
                         "exchange_ms": pred.breakdown.get("exchange", math.nan) if pred else math.nan,
                         "predicted_without_exchange_ms": (model.predict(model.without_exchange(config), gpu).ms
                                                           if pred and config.exchange_l2_bytes else math.nan),
                         **_link_columns(config, pred, gpu),
                         "step_instructions": max((p.instructions_per_step for p in config.passes), default=0.0)
                         if config is not None else math.nan,
                         "step_counted_on": _step_counted_on(row, pick, config, data_dir),
                         **_model_counts(config, gpu),
                         "floor_ms": bytes_min / (gpu.ceilings.dram_gbps * 1e9) * 1e3,
                         "source": pick.describe()})
    return pd.DataFrame(rows)


# A step's table as the page heads its columns (short enough for the page's width).
STEP_HEADINGS = {"block_size": "tile", "num_warps": "warps", "n_regs": "registers", "spill_bytes": "stack B/thread",
                 "resident": "programs/SM", "kib_in_flight_per_sm": "KiB in flight/SM",
                 "dram_bytes_per_element": "DRAM B/element", "recorded_ms": "recorded ms", "predicted_ms": "predicted ms",
                 "measured": "measured on"}


def step_summary(frame: pd.DataFrame, key: str) -> tuple[pd.DataFrame, str]:
    """A step's rows as a page shows them, and one sentence computed from them (recorded and predicted times,
    speed-ups, the bound)."""
    part = frame[frame["step"] == key]
    columns = ["side", "variant", "vocab", "block_size", "num_warps", "n_regs", "spill_bytes", "resident",
               "kib_in_flight_per_sm", "dram_bytes_per_element", "recorded_ms", "predicted_ms", "bound", "measured"]
    shown = part[[c for c in columns if c in part.columns]].reset_index(drop=True).rename(columns=STEP_HEADINGS)
    after = part[part["side"] == "after"].iloc[0]
    if math.isnan(after["recorded_ms"]):
        return shown, "No recorded row measures this step."
    where = "Measured now" if "(measured now)" in str(after["source"]) else "Recorded on the H100"
    text = (f"{where}: **{after['recorded_ms']:.3f} ms** ({after['pct_of_copy']:.0f}% of copy "
            f"bandwidth); the model predicts **{after['predicted_ms']:.3f} ms**, bound by `{after['bound']}`")
    before = part[part["side"] == "before"]
    if len(before):
        b = before.iloc[0]
        text += (f". Against the step before ({b['recorded_ms']:.3f} ms recorded, {b['predicted_ms']:.3f} ms "
                 f"predicted, bound `{b['bound']}`): **{b['recorded_ms'] / after['recorded_ms']:.2f}x recorded**, "
                 f"{b['predicted_ms'] / after['predicted_ms']:.2f}x predicted")
    if after.get("step_instructions", 0) > 0:  # a step counted in the kernel's offline SASS
        text += (f". Its step is counted in the kernel's offline sm_90 SASS: {after['step_instructions']:.0f} "
                 "instructions a thread")
        if after.get("step_counted_on") == "other":
            text += (", counted on other kernel sources than the timed row ran (the counts file's `kernel_sources`): "
                     "the prediction is of the counted kernel, not of the timed one")
    if pd.notna(after.get("exchange_ms")):  # a vocab-parallel step
        text += (f". The exchange's L2 traffic alone would take {after['exchange_ms'] * 1e3:.1f} us; with it the "
                 f"prediction is {after['predicted_ms']:.4f} ms, without it {after['predicted_without_exchange_ms']:.4f} ms")
    if pd.notna(after.get("nvlink_ms")):  # and its NVLink, measured
        text += (f". Its stores into the peer, {after['link_mb']:.2f} MB a call, would take "
                 f"{after['nvlink_ms'] * 1e3:.1f} us alone at the {after['link_gbps']:.0f} GB/s the exchange's store "
                 f"pattern reached between {after['link_measured_on']}; they overlap the DRAM stream (without them "
                 f"{after['predicted_without_link_ms']:.4f} ms). A word crosses and comes back in "
                 f"{after['round_trip_us']:.1f} us, and a row's summaries are read {model.LAG_STEPS} steps "
                 f"({after['lag_us']:.0f} us predicted) after they are sent, "
                 + ("so no wait is costed" if after["lag_us"] > after["round_trip_us"] else
                    "fewer than the round trip: the model costs no wait for it, and is short by that much"))
    return shown, text + "."


def speedups(frame: pd.DataFrame, one_process: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per step with both sides recorded: the recorded and the predicted speed-up (before / after), and the speed-up
    of ``one_process`` (:func:`one_process_rows`) where it holds both sides of a step."""
    wide = frame.pivot_table(index=["order", "step", "title"], columns="side",
                             values=["recorded_ms", "predicted_ms"], aggfunc="first")
    out = pd.DataFrame({"recorded speed-up": wide[("recorded_ms", "before")] / wide[("recorded_ms", "after")],
                        "predicted speed-up": wide[("predicted_ms", "before")] / wide[("predicted_ms", "after")]}) \
        if ("recorded_ms", "before") in wide.columns else pd.DataFrame(columns=["recorded speed-up", "predicted speed-up"])
    out = out.dropna(how="all").reset_index()
    if one_process is not None:
        sides = one_process.pivot_table(index="step", columns="side", values="ms_median", aggfunc="first")
        ratio = (sides["before"] / sides["after"]) if {"before", "after"} <= set(sides.columns) else pd.Series(dtype=float)
        out["one-process speed-up"] = out["step"].map(ratio)
    return out


def _function(module: str, name: str):
    """A function imported by module and name, so that a renamed kernel fails."""
    return getattr(importlib.import_module(module), name)


def teaching_function(step: PathStep):
    """The lab kernel that shows ``step``'s idea at teaching size (None when the step has none)."""
    return _function(*step.teaching) if step.teaching else None


def step_functions(step: PathStep) -> list:
    """The ``@triton.jit`` functions a step shows."""
    return [_function(module, name) for module, name in step.functions]


def step_diff(step: PathStep, context: int = 1) -> str | None:
    """The unified diff from ``step.diff_from`` to the step's first function, computed from today's source files,
    with the switches ``step.fold`` fixed at their defaults on both sides (None for a step that shows its functions
    whole)."""
    if step.diff_from is None:
        return None
    module, name = step.diff_from
    old = kernel_source(getattr(importlib.import_module(module), name))
    new = kernel_source(step_functions(step)[0])
    if step.fold:
        new = fold_constexprs(new, step.fold)
        old = fold_constexprs(old, [n for n in step.fold if n in constexpr_defaults(old)])
    old, new = without_docstring(old), without_docstring(new)  # rewritten prose would hide the code's change
    return "\n".join(difflib.unified_diff(old.splitlines(), new.splitlines(), f"{module}.{name}",
                                          f"{step.functions[0][0]}.{step.functions[0][1]}", lineterm="", n=context))


def key_lines(step: PathStep) -> str:
    """The lines ``step.read_first`` names, from today's source files of the step's functions (a statement that runs
    over several lines whole), each headed by its file and line number: what to read before the whole function or
    diff. A ValueError when a line is no longer there (the kernel changed: the step must be read again)."""
    shown = []
    for text in step.read_first:
        for (module, name), fn in zip(step.functions, step_functions(step)):
            lines, first = inspect.getsourcelines(getattr(fn, "fn", fn))
            hit = next((i for i, line in enumerate(lines) if text in line), None)
            if hit is not None:
                break
        else:
            raise ValueError(f"step {step.key!r}: no line of {[f for _, f in step.functions]} holds {text!r}")
        end = hit
        while sum(lines[j].count("(") - lines[j].count(")") for j in range(hit, end + 1)) > 0:
            end += 1  # the rest of a call that runs over several lines
        shown.append(f"# {module.replace('.', '/')}.py:{first + hit} ({name})\n"
                     + textwrap.dedent("".join(lines[hit:end + 1])))
    return "\n".join(shown)


def without_docstring(source: str) -> str:
    """A function's source without its docstring (the lines of the first statement when it is a string)."""
    function = next(node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.FunctionDef))
    first = function.body[0] if function.body else None
    if not (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)):
        return source
    lines = source.splitlines(keepends=True)
    return "".join(lines[:first.lineno - 1] + lines[first.end_lineno:])


def folded_switches(step: PathStep) -> dict:
    """The switches ``step.fold`` with the defaults its diff fixes them at ({} for a step that folds none)."""
    if not step.fold:
        return {}
    defaults = constexpr_defaults(kernel_source(step_functions(step)[0]))
    return {name: defaults[name] for name in step.fold}


# What a page shows of each evidence study: (column, heading), in order.
EVIDENCE_COLUMNS = {
    "case_497_registers_offline": (("variant", "variant"), ("block_size", "tile"), ("num_warps", "warps"),
                                   ("n_regs", "registers"), ("spill_bytes", "stack B/thread"), ("sass_ldl", "LDL"),
                                   ("sass_stl", "STL"), ("sass_bar", "BAR"), ("sass_ex2", "MUFU.EX2"),
                                   ("sass_instructions", "SASS instructions")),
    "registers_offline": (("variant", "variant"), ("block_size", "tile"), ("num_warps", "warps"),
                          ("n_regs", "registers"), ("spill_bytes", "stack B/thread"),
                          ("spill_store_bytes", "spill stores B"), ("blocks_per_sm", "programs/SM")),
    "case_497_ncu": (("duration_us", "µs"), ("dram_throughput_pct", "DRAM % of peak"),
                     ("achieved_occupancy_pct", "achieved occupancy %"), ("local_load_bytes", "local loads MB"),
                     ("local_store_bytes", "local stores MB"), ("dram_read_bytes", "DRAM read MB"),
                     ("warp_cycles_per_issued_instruction", "cycles/issued instr."), ("stall_1", "top stall")),
    "profile_ncu": (("kernel", "kernel"), ("block_size", "tile"), ("num_warps", "warps"), ("ncu_time_ns", "µs"),
                    ("ncu_registers", "registers"), ("ncu_achieved_occupancy_pct", "achieved occupancy %"),
                    ("ncu_dram_throughput_pct", "DRAM % of peak"), ("ncu_dram_read_bytes", "DRAM read MB"),
                    ("ncu_dram_write_bytes", "DRAM write MB")),
}
_SCALE = {"local_load_bytes": 1e-6, "local_store_bytes": 1e-6, "dram_read_bytes": 1e-6, "ncu_dram_read_bytes": 1e-6,
          "ncu_dram_write_bytes": 1e-6, "ncu_time_ns": 1e-3}


def step_evidence(data_dir, step: PathStep) -> list[tuple[str, pd.DataFrame]]:
    """The step's recorded evidence rows, one table per study: [(study, table)], in the order of ``step.records``
    (a pick that finds no row is left out; a step without records gives [])."""
    data_dir, cache, tables = Path(data_dir), {}, {}
    for pick in step.records:
        row = pick_row(data_dir, pick, cache)
        if row is None:
            continue
        columns = EVIDENCE_COLUMNS[pick.study]
        shown = {heading: (row.get(c) * _SCALE[c] if c in _SCALE and row.get(c) == row.get(c) else row.get(c))
                 for c, heading in columns}
        if pick.study == "case_497_ncu":  # what was profiled: the run's label without its shape (the step's)
            shown = {"profiled": str(row["label"]).rsplit(": ", 1)[0], **shown}
            shown["top stall"] = f"{row['stall_1']} ({row['stall_1_cycles']:.1f} cycles/instr.)"
        tables.setdefault(pick.study, []).append(shown)
    return [(study, pd.DataFrame(rows)) for study, rows in tables.items()]


def log_excerpt(data_dir, excerpt: LogExcerpt) -> str:
    """The lines ``excerpt`` names of its recorded log (ValueError if its start line is not in the file: a log
    that changed must not silently show something else)."""
    folder = Path(data_dir).parent / excerpt.folder if excerpt.folder else Path(data_dir)
    text = (folder / "logs" / excerpt.file).read_text(encoding="utf-8").splitlines()
    start = next((i for i, line in enumerate(text) if excerpt.start in line), None)
    if start is None:
        raise ValueError(f"{excerpt.file} has no line holding {excerpt.start!r}")
    rest = text[start:]
    if excerpt.patterns:
        rest = [line for line in rest if any(re.search(re.escape(p), line) for p in excerpt.patterns)]
    return "\n".join(line.rstrip() for line in rest[:excerpt.lines])


def sass_excerpt(log: Path, opcodes=("STL", "LDL"), lines: int = 12) -> str:
    """A recorded SASS log's heading lines (what was compiled, its registers and stack) and its first ``lines``
    SASS lines that hold one of ``opcodes`` (local-memory stores and loads: the spills)."""
    text = Path(log).read_text(encoding="utf-8").splitlines()
    heading = []
    for line in text:
        if line.strip().startswith("/*"):
            break
        heading.append(line)
    hits = [line for line in text if line.strip().startswith("/*") and any(f" {op}" in line for op in opcodes)]
    return "\n".join(heading + hits[:lines])


def knob_text(p: dict, live: dict | None = None) -> str:
    """What the notebook's widget prints for one :func:`knob_prediction`, and with ``live`` the same configuration
    compiled offline today (:func:`knob_compiled`) or measured now (:func:`knob_measured`); the browser test compares
    with it."""
    text = (f"recorded compile: {p['n_regs']} registers, {p['spill_bytes']} B spill, {p['resident']} programs/SM, "
            f"{p['kib_in_flight_per_sm']:.0f} KiB in flight/SM, {p['dram_mb']:.0f} MB DRAM\n"
            f"predicted {p['predicted_ms']:.3f} ms ({p['bound']}), recorded {p['recorded_ms']:.3f} ms")
    if live is None:
        return text
    measured = f", measured {live['ms_median']:.3f} ms" if live.get("ms_median") is not None else ""
    return (text + f"\n{live['source']}: {live['n_regs']} registers, {live['spill_bytes']} B spill, "
            f"{live['resident']} programs/SM\npredicted {live['predicted_ms']:.3f} ms ({live['bound']}){measured}")


def knob_options(data_dir, loss: str = "cross_entropy", target_format: str = "labels", vocab: int = 131072,
                 tokens: int = 4096) -> pd.DataFrame:
    """The fused kernel's recorded (tile, warps) configurations of the block-size sweep for one shape."""
    frame = _read(data_dir, "blocksize_sweep")
    frame = frame[(frame["loss"] == loss) & (frame["target_format"] == target_format) & (frame["vocab"] == vocab)
                  & (frame["tokens"] == tokens) & (frame["variant"] == "fused")]
    return frame.sort_values(["block_size", "num_warps"]).reset_index(drop=True)


def _knob_row(data_dir, block_size: int, num_warps: int, loss: str, target_format: str, vocab: int,
              tokens: int) -> dict:
    options = knob_options(data_dir, loss, target_format, vocab, tokens)
    match = options[(options["block_size"] == block_size) & (options["num_warps"] == num_warps)]
    if match.empty:
        raise KeyError(f"no recorded fused configuration with block_size={block_size}, num_warps={num_warps}")
    return match.iloc[0].to_dict()


COUNT_COLUMNS = ("n_regs", "spill_bytes", "shared_bytes", "blocks_per_sm")  # what a compile decides of a launch


def _with_counts(row: dict, counts: dict) -> dict:
    """``row`` with the compile counts of ``counts`` in place of its recorded ones (its launches' too)."""
    out = {**row, **{c: counts[c] for c in COUNT_COLUMNS}}
    passes = row.get("passes")
    if isinstance(passes, str) and passes.startswith("["):
        out["passes"] = json.dumps([{**launch, **{c: counts[c] for c in COUNT_COLUMNS}} for launch in json.loads(passes)])
    return out


def _knob_model(row: dict, loss: str, target_format: str, tokens: int, vocab: int, gpu: model.Gpu) -> dict:
    config = model.config_from_row(row, gpu)
    pred = model.predict(config, gpu)
    first = config.passes[0]
    floor = loss_cost(loss, target_format, tokens, vocab, 2)
    return {"n_regs": int(row["n_regs"]), "spill_bytes": int(row["spill_bytes"]), "resident": first.resident,
            "kib_in_flight_per_sm": first.resident * first.load_bytes_per_step / 1024,
            "dram_mb": sum(p.dram_bytes for p in config.passes) / 1e6, "floor_mb": floor.bytes / 1e6,
            "predicted_ms": pred.ms, "bound": pred.bound,
            **{f"{name}_ms": value for name, value in pred.breakdown.items() if name in ("dram", "latency", "l2")}}


def knob_prediction(data_dir, block_size: int, num_warps: int, *, loss: str = "cross_entropy",
                    target_format: str = "labels", vocab: int = 131072, tokens: int = 4096,
                    gpu: model.Gpu | None = None) -> dict:
    """The fused kernel at one recorded (tile, warps): the model's time, bound, terms, bytes in flight per SM and
    resident programs from the recorded compile counts, beside the recorded time (``KeyError`` for a configuration
    the sweep did not record)."""
    row = _knob_row(data_dir, block_size, num_warps, loss, target_format, vocab, tokens)
    gpu = gpu or model.gpu_from_folder(data_dir)
    return {"block_size": block_size, "num_warps": num_warps,
            **_knob_model(row, loss, target_format, tokens, vocab, gpu), "recorded_ms": float(row["ms_median"])}


_compiled_counts: dict = {}  # (loss, target_format, vocab, tile, warps) -> counts: a compile takes seconds


def fused_today(loss: str, target_format: str, vocab: int, block_size: int, num_warps: int) -> dict:
    """The compile counts (``COUNT_COLUMNS``) of today's ``kernels.fused`` at one configuration, compiled offline for
    sm_90 (:func:`perfutils.model.offline_counts.offline_counts`, kept for the process; ``RuntimeError`` if the
    compile fails)."""
    from .model.offline_counts import offline_counts

    key = (loss, target_format, int(vocab), int(block_size), int(num_warps))
    if key not in _compiled_counts:
        frame, _ = offline_counts([(loss, target_format, "fused", block_size, num_warps)], vocab=vocab, log=None)
        compiled = frame.iloc[0].to_dict()
        if compiled["status"] != "ok":
            raise RuntimeError(f"offline compile of fused {block_size} x {num_warps} failed: {compiled['error']}")
        _compiled_counts[key] = {c: int(compiled[c]) for c in COUNT_COLUMNS}
    return _compiled_counts[key]


def knob_compiled(data_dir, block_size: int, num_warps: int, *, loss: str = "cross_entropy",
                  target_format: str = "labels", vocab: int = 131072, tokens: int = 4096,
                  gpu: model.Gpu | None = None) -> dict:
    """Today's ``kernels.fused`` at one recorded (tile, warps), compiled offline for sm_90 on this machine (no GPU:
    :func:`perfutils.model.offline_counts.offline_counts`, kept for the process), and the model's prediction from
    those counts instead of the recorded ones (``RuntimeError`` if the compile fails)."""
    row = _knob_row(data_dir, block_size, num_warps, loss, target_format, vocab, tokens)
    gpu = gpu or model.gpu_from_folder(data_dir)
    model_row = _with_counts(row, fused_today(loss, target_format, vocab, block_size, num_warps))
    return {"source": "today's kernels.fused compiled offline for sm_90",
            **_knob_model(model_row, loss, target_format, tokens, vocab, gpu)}


def knob_measured(data_dir, block_size: int, num_warps: int, *, out, loss: str = "cross_entropy",
                  target_format: str = "labels", vocab: int = 131072, tokens: int = 4096,
                  gpu: model.Gpu | None = None, measurer=None, at: tuple[int, int] | None = None, log=None) -> dict:
    """Today's ``kernels.fused`` at one recorded (tile, warps) measured now through the sweep harness (float64
    check, sidecar; rows in ``<out>/<gpu>/learning_path.csv``), with the model's prediction from this launch's
    counts. ``measurer``: the harness's measure callable (default: the GPU's); ``at``: (tokens, vocab) to measure
    at instead of the recorded shape (a CPU check under the interpreter)."""
    from .studies.cases import run_cases

    recorded = _knob_row(data_dir, block_size, num_warps, loss, target_format, vocab, tokens)  # recorded ones only
    n_rows, n_cols = at or (tokens, vocab)
    records = run_cases(LIVE_STUDY, [("fused", block_size, num_warps)], losses=[(loss, target_format)],
                        vocabs=[n_cols], tokens=[n_rows], out=str(out), measurer=measurer,
                        log=log or (lambda *_: None))
    row = _latest_row(records if records is not None else pd.DataFrame(),
                      {"loss": loss, "target_format": target_format, "vocab": n_cols, "tokens": n_rows,
                       "variant": "fused", "block_size": block_size, "num_warps": num_warps})
    if row is None:
        raise RuntimeError(f"the harness measured no fused {block_size} x {num_warps} row")
    launched = all(row.get(c) == row.get(c) and row.get(c) is not None for c in COUNT_COLUMNS)
    counts = row if launched else recorded  # no GPU launch (a dry run): the recorded counts
    source = "measured now on this GPU" if launched else "measured now (counts of the recorded compile)"
    if gpu is None:  # the measuring GPU's own ceilings where recorded (a dry run has no GPU: the folder's)
        gpu, whose = measuring_gpu(data_dir, row.get("gpu_name") if launched else None)
        source += whose
    return {"source": source, **_knob_model(_with_counts(recorded, counts), loss, target_format, tokens, vocab, gpu),
            "ms_median": float(row["ms_median"])}


def measuring_gpu(data_dir, gpu_name) -> tuple[model.Gpu, str]:
    """The model's GPU for a row measured now on ``gpu_name``: its own recorded ceilings where ``data/<its slug>``
    has them (an H200 beside the H100's recorded path), else ``data_dir``'s, said in the returned remark."""
    from .data.schema import gpu_slug

    folder = Path(data_dir)
    own = folder.parent / gpu_slug(gpu_name) if gpu_name else folder
    if own == folder:
        return model.gpu_from_folder(folder), ""
    if (own / "ceilings.csv").exists():
        return model.gpu_from_folder(own), f" ({gpu_name}; predicted from its own ceilings)"
    return model.gpu_from_folder(folder), f" ({gpu_name}: no ceilings recorded, predicted with {folder.name}'s)"


# ---------------------------------------------------------------------------------------------------------------
# MODE="measure": the steps measured again on this machine, through the harness
# ---------------------------------------------------------------------------------------------------------------

LIVE_STUDIES = ("case_497", "case_497_ablation", "vocab_sweep")  # one-GPU rows the harness can take again as cases
LIVE_STUDY = "learning_path"


def live_case(pick: Pick | None) -> tuple | None:
    """``(loss, target_format, vocab, tokens, (variant, block_size, num_warps))``: the harness case that measures
    ``pick``'s row again, or None where one case cannot (a tuning sweep's fastest row, the two-GPU rows)."""
    if pick is None or pick.study not in LIVE_STUDIES or pick.fastest or pick.plan is not None:
        return None
    where = dict(pick.where)
    block = where.get("block_size")
    if pick.study == "case_497_ablation":
        block = block or 32768  # the ablation's rows are the #497 tile
    return (where["loss"], where["target_format"], int(where["vocab"]), int(where["tokens"]),
            (where["variant"], block, where.get("num_warps")))


def _live_wanted(steps, tokens=None, vocab=None, block_cap=None) -> tuple[dict, list[dict]]:
    """The harness cases that measure ``steps``' rows again (by shape) and, per (step, side), the row each wants."""
    cases, wanted = {}, []
    for step in steps:
        for side, pick in (("before", step.before), ("after", step.after)):
            case = live_case(pick)
            if case is None:
                continue
            loss, target_format, n_cols, n_rows, (variant, block, warps) = case
            n_cols, n_rows = vocab or n_cols, tokens or n_rows
            block = min(block, block_cap) if block and block_cap else block
            cases.setdefault((loss, target_format, n_cols, n_rows), {})[(variant, block, warps)] = None
            wanted.append({"step": step.key, "side": side, "loss": loss, "target_format": target_format,
                           "vocab": n_cols, "tokens": n_rows, "variant": variant, "block_size": block,
                           "num_warps": warps})
    return cases, wanted


def _latest_row(rows: pd.DataFrame, want: dict) -> dict | None:
    """The latest of the harness's ok ``rows`` whose case is ``want`` (loss, target_format, vocab, tokens, variant,
    and block_size / num_warps where not None), or None."""
    if rows.empty:
        return None
    match = rows[rows["status"].fillna("ok") == "ok"]
    for column in ("loss", "target_format", "vocab", "tokens", "variant", "block_size", "num_warps"):
        if want[column] is not None:
            match = match[match[column] == want[column]]
    return match.iloc[-1].to_dict() if len(match) else None


def _match_live(rows: pd.DataFrame, wanted: list[dict]) -> pd.DataFrame:
    """One row per wanted (step, side) found among the harness's ok ``rows`` (the latest where several match)."""
    out_rows = []
    for want in wanted:
        row = _latest_row(rows, want)
        if row is not None:
            out_rows.append({"step": want["step"], "side": want["side"], "ms_median": float(row["ms_median"]),
                             "pct_of_copy": float(row.get("pct_of_copy", math.nan))})
    return pd.DataFrame(out_rows, columns=["step", "side", "ms_median", "pct_of_copy"])


def measure_path(out, *, steps=STEPS, tokens: int | None = None, vocab: int | None = None,
                 block_cap: int | None = None, measurer=None, log=print) -> pd.DataFrame:
    """Measure every step's rows that :func:`live_case` can take, through the sweep harness (float64 checks,
    sidecar, resumable) into ``<out>/<gpu>/learning_path.csv``; returns one row per (step, side) measured with
    ``ms_median``. ``tokens``/``vocab``/``block_cap`` shrink every case (a CPU check under the interpreter);
    ``measurer``: the harness's measure callable (default: the GPU's)."""
    from .studies.cases import run_cases

    cases, wanted = _live_wanted(steps, tokens, vocab, block_cap)
    measured = []
    for (loss, target_format, n_cols, n_rows), chosen in cases.items():
        log(f"{LIVE_STUDY}: {loss}/{target_format} {n_rows} x {n_cols}: {len(chosen)} cases")
        records = run_cases(LIVE_STUDY, list(chosen), losses=[(loss, target_format)], vocabs=[n_cols],
                            tokens=[n_rows], out=str(out), measurer=measurer, log=log)
        if records is not None:
            measured.append(records)
    if not measured:
        return pd.DataFrame(columns=["step", "side", "ms_median", "pct_of_copy"])
    return _match_live(pd.concat(measured, ignore_index=True), wanted)


def one_process_rows(data_dir, steps=STEPS) -> pd.DataFrame:
    """The path's rows as MODE="measure" recorded them (``learning_path.csv``: every step it can take, in one
    process at one code), one per (step, side); empty where that file is absent."""
    path = Path(data_dir) / f"{LIVE_STUDY}.csv"
    if not path.exists():
        return pd.DataFrame(columns=["step", "side", "ms_median", "pct_of_copy"])
    return _match_live(pd.read_csv(path), _live_wanted(steps)[1])


def compiled_differently(data_dir, compile_counts=None) -> list[str]:
    """The one-process rows (``learning_path.csv``) of ``kernels.fused`` whose kernel compiles otherwise today:
    registers or stack then (recorded with the row) and now (today's source compiled offline for sm_90 at 16 rows,
    ``compile_counts(loss, target_format, vocab, block_size, num_warps)`` -> the counts of :func:`fused_today`, its
    default), one phrase each. Such a row timed a kernel that no longer exists, e.g. reverse KL's fused
    32K tile at 64 registers while a bad-row NaN cost it half its registers (fixed since)."""
    path = Path(data_dir) / f"{LIVE_STUDY}.csv"
    if not path.exists():
        return []
    compile_counts = compile_counts or fused_today
    rows = pd.read_csv(path).dropna(subset=["block_size", "num_warps", "n_regs", "spill_bytes"])
    phrases = []
    for r in rows[rows["variant"] == "fused"].itertuples():
        today = compile_counts(r.loss, r.target_format, int(r.vocab), int(r.block_size), int(r.num_warps))
        n_regs, spill = today["n_regs"], today["spill_bytes"]
        if (n_regs, spill) != (int(r.n_regs), int(r.spill_bytes)):
            phrases.append(f"{r.loss} {r.variant} {int(r.vocab)} columns, tile {int(r.block_size)} x {int(r.num_warps)} "
                           f"warps: {int(r.n_regs)} registers and {int(r.spill_bytes)} B of stack when measured "
                           f"({r.ms_median:.3f} ms), {n_regs} and {spill} B in today's offline compile")
    return phrases


def with_live(frame: pd.DataFrame, live: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with the live times in ``recorded_ms`` where a (step, side) was measured now (``source`` says
    which); the other rows keep their recorded times."""
    out = frame.copy()
    for row in live.itertuples():
        hit = (out["step"] == row.step) & (out["side"] == row.side)
        out.loc[hit, "recorded_ms"] = row.ms_median
        out.loc[hit, "pct_of_copy"] = row.pct_of_copy
        out.loc[hit, "source"] = f"{LIVE_STUDY}.csv (measured now)"
    return out


def data_studies(frame: pd.DataFrame) -> list[str]:
    """The studies whose files the page's rows and evidence come from (their sidecars give the provenance note)."""
    timed = {source.split(".csv")[0] for source in frame["source"] if ".csv" in source}
    evidence = {pick.study for step in STEPS for pick in step.records}  # compile counts, profiler counters
    return sorted(timed | evidence)


# ---------------------------------------------------------------------------------------------------------------
# Rendering: a kernel's compile-time switches folded at their defaults, so that a diff shows the design change
# ---------------------------------------------------------------------------------------------------------------

class _Unknown(Exception):
    """An expression whose value depends on more than the folded switches."""


_BINARY = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b}
_COMPARE = {ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b, ast.Lt: lambda a, b: a < b,
            ast.Gt: lambda a, b: a > b, ast.LtE: lambda a, b: a <= b, ast.GtE: lambda a, b: a >= b}


def _value(node: ast.AST, values: dict):
    """The value of ``node`` when the names of ``values`` are those values (``_Unknown`` if it needs any other)."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name) and node.id in values:
        return values[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return not _value(node.operand, values)
    if isinstance(node, ast.BoolOp):  # a known False in an `and` (True in an `or`) decides it alone
        decides = isinstance(node.op, ast.Or)
        known = []
        for operand in node.values:
            try:
                known.append(bool(_value(operand, values)))
            except _Unknown:
                continue
        if decides in known:
            return decides
        if len(known) < len(node.values):
            raise _Unknown
        return not decides
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return _BINARY[type(node.op)](_value(node.left, values), _value(node.right, values))
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _COMPARE:
        return _COMPARE[type(node.ops[0])](_value(node.left, values), _value(node.comparators[0], values))
    raise _Unknown


def _known(node: ast.AST, values: dict) -> bool:
    try:
        _value(node, values)
        return True
    except _Unknown:
        return False


def constexpr_defaults(source: str) -> dict:
    """The ``tl.constexpr`` parameters of the function in ``source`` that have a default: {name: default}."""
    fn = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef))
    args = fn.args.args
    defaults = dict(zip([a.arg for a in args[len(args) - len(fn.args.defaults):]], fn.args.defaults))
    return {a.arg: ast.literal_eval(defaults[a.arg]) for a in args
            if a.arg in defaults and a.annotation is not None and "constexpr" in ast.unparse(a.annotation)}


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _lines(lines: list, first: int, last: int, dedent: int) -> list:
    """Lines ``first``..``last`` (1-based, inclusive), ``dedent`` spaces less indented."""
    return [line[dedent:] if line[:dedent].strip() == "" else line for line in lines[first - 1:last]]


def _if_edit(node: ast.If, lines: list, values: dict):
    """(first, last, new lines) replacing an ``if`` on a folded switch by the branch it takes."""
    take = bool(_value(node.test, values))
    head = _indent(lines[node.lineno - 1])
    body_first = node.test.end_lineno + 1
    if take:
        first, last = body_first, node.body[-1].end_lineno
    elif not node.orelse:
        return node.lineno, node.end_lineno, []
    elif lines[node.orelse[0].lineno - 1].lstrip().startswith("elif"):  # the elif becomes the if
        elif_line = lines[node.orelse[0].lineno - 1]
        new = [elif_line.replace("elif", "if", 1)] + lines[node.orelse[0].lineno:node.end_lineno]
        return node.lineno, node.end_lineno, new
    else:
        first = next(i for i in range(node.body[-1].end_lineno + 1, node.orelse[0].lineno + 1)
                     if lines[i - 1].strip().startswith("else")) + 1
        last = node.orelse[-1].end_lineno
    inner = _indent(lines[(node.body if take else node.orelse)[0].lineno - 1])
    return node.lineno, node.end_lineno, _lines(lines, first, last, inner - head)


LOOSE_EXPRESSIONS = (ast.BoolOp, ast.IfExp, ast.NamedExpr, ast.Lambda)  # bind looser than `and` and `or`'s operands


def _expression_edit(tree: ast.AST, lines: list, values: dict):
    """(line, line, [line]) with the outermost one-line expression that uses a folded switch replaced by its value
    (an ``and`` keeps its unknown operands); None when no such expression is left."""
    parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
    for name in (n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id in values
                 and isinstance(n.ctx, ast.Load)):
        node = name
        while isinstance(parents.get(node), ast.expr) and _known(parents[node], values):
            node = parents[node]
        parent = parents.get(node)
        if isinstance(parent, ast.BoolOp):  # `SWITCH and rest`: the rest, when the switch does not decide it
            node, kept = parent, [v for v in parent.values if not _known(v, values)]
            source = "\n".join(lines)
            # an operand's own parentheses lie outside its node: put them back where precedence needs them
            text = f" {'and' if isinstance(parent.op, ast.And) else 'or'} ".join(
                f"({ast.get_source_segment(source, v)})" if len(kept) > 1 and isinstance(v, LOOSE_EXPRESSIONS)
                else ast.get_source_segment(source, v) for v in kept)
        else:
            value = _value(node, values)
            text = repr(int(value) if isinstance(value, bool) and isinstance(parent, ast.BinOp) else value)
        if node.lineno != node.end_lineno:
            continue
        line = lines[node.lineno - 1]
        encoded = line.encode()
        new = (encoded[:node.col_offset] + text.encode() + encoded[node.end_col_offset:]).decode()
        return node.lineno, node.lineno, [new]
    return None


def _next_edit(source: str, values: dict):
    """The first edit that folds ``values`` further into ``source``: (first line, last line, new lines) or None."""
    tree = ast.parse(source)
    lines = source.splitlines()
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef))
    for arg in fn.args.args:  # the switch's own parameter line
        if arg.arg in values and lines[arg.lineno - 1].strip().startswith(arg.arg):
            return arg.lineno, arg.lineno, []
    docstring = fn.body[0] if isinstance(fn.body[0], ast.Expr) and isinstance(fn.body[0].value, ast.Constant) else None
    for index, line in enumerate(lines, start=1):
        text = line.strip()
        in_doc = docstring is not None and docstring.lineno < index <= docstring.end_lineno
        about = next((name for name in values if text.startswith((f"{name}:", f"# {name}:"))), None)
        if about is None or (not in_doc and not text.startswith("#")):
            continue
        last = index  # the paragraph (docstring) or the comment block that explains the switch
        while last < len(lines) and (lines[last].strip() if in_doc else lines[last].strip().startswith("#")) \
                and not (in_doc and last + 1 == docstring.end_lineno and lines[last].strip() == '"""'):
            last += 1
        first = index - 1 if in_doc and index > 1 and lines[index - 2].strip() == "" else index
        return first, last, []
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _known(node.test, values):
            return _if_edit(node, lines, values)
    return _expression_edit(tree, lines, values)


def fold_constexprs(source: str, names) -> str:
    """``source`` (one function) with the ``tl.constexpr`` switches ``names`` fixed at their defaults: their parameter
    lines, docstring paragraphs and comment blocks (starting ``NAME:``) dropped, each ``if`` on them replaced by the
    branch it takes, the expressions that use them replaced by their values. The result is still Python (and
    compiles the same kernel for those defaults); a name that is not a defaulted constexpr is a ValueError."""
    defaults = constexpr_defaults(source)
    missing = [name for name in names if name not in defaults]
    if missing:
        raise ValueError(f"not a tl.constexpr parameter with a default: {missing} (have {sorted(defaults)})")
    values = {name: defaults[name] for name in names}
    while (edit := _next_edit(source, values)) is not None:
        first, last, new = edit
        lines = source.splitlines()
        source = "\n".join(lines[:first - 1] + new + lines[last:]) + "\n"
    return source


# ---------------------------------------------------------------------------------------------------------------
# The exercise: change the #497 kernel (turn off one of its switches), check it against the float64 reference and
# against the model
# ---------------------------------------------------------------------------------------------------------------

def exercise_variant(switch: str) -> str:
    """The case study's ablation variant that is step 0 (the #497 structure) with ``switch`` turned off."""
    from .lab_kernels.case_study import ablation

    if switch not in ablation.SWITCHES:
        raise ValueError(f"switch must be one of {ablation.SWITCHES}, got {switch!r}")
    keep = frozenset(ablation.SWITCHES) - {switch}
    return next(step.variant for step in (*ablation.STEPS, *ablation.SOLO)
                if step.switches == keep and step.num_stages == ablation.NUM_STAGES_497)


def exercise_check(variant: str, *, rows: int = 4, vocab: int = 700, seed: int = 0) -> dict:
    """The variant run here (the CPU interpreter without a GPU) on a small bf16 reverse-KL problem, against
    ``kernels.reference`` in float64: the relative errors of the loss and the gradient, and whether both pass the
    project's bf16 bound (1e-2)."""
    import torch

    from kernels import reference

    from .lab_kernels.case_study import ablation
    from .measure.timing import rel_err

    device = "cuda" if torch.cuda.is_available() else "cpu"
    generator = torch.Generator().manual_seed(seed)
    logits, target = (torch.randn(rows, vocab, generator=generator).to(torch.bfloat16).to(device) for _ in range(2))
    loss, grad = ablation.prepare(logits, target, variant=variant).run()
    want_loss, want_grad = reference.entropy_loss_forward_backward(logits, target, loss="reverse_kl",
                                                                   target_format="logits")
    errors = {"loss_rel_err": rel_err(loss, want_loss), "grad_rel_err": rel_err(grad, want_grad)}
    return {**errors, "passes": max(errors.values()) <= 1e-2}


def exercise_model(data_dir, variant: str, *, tokens: int = 4096, vocab: int = 32768, num_warps: int = 16,
                   gpu: model.Gpu | None = None) -> dict:
    """The variant at the #497 shape and tile, compiled offline for sm_90 now (registers, stack; its plan built on
    meta tensors, nothing launched), the model's time from those counts, and the variant's recorded H100 row
    (``case_497_ablation.csv``: its time and the model's time from its recorded counts)."""
    import torch

    from kernels.problem import build_problem

    from .lab_kernels.case_study import ablation
    from .model.occupancy import occupancy_of_counts
    from .model.offline_compile import compile_launch

    x = torch.empty(tokens, vocab, dtype=torch.bfloat16, device="meta")
    problem = build_problem(x, torch.empty_like(x), loss="reverse_kl", target_format="logits", grad_output=1.0,
                            ignore_index=-100, loss_mask=None)
    block, _ = ablation.default_config(vocab)
    (launch,) = ablation.plan_step(ablation.step_of(variant), problem, block, num_warps).launches
    compiled = compile_launch(launch, with_sass=False)
    occ = occupancy_of_counts(compiled.n_regs, compiled.shared_bytes, num_warps)
    counts = {"n_regs": compiled.n_regs, "spill_bytes": compiled.spill_bytes, "shared_bytes": compiled.shared_bytes,
              "blocks_per_sm": occ.blocks_per_sm}
    recorded = pick_row(data_dir, Pick("case_497_ablation", RKL[:2] + (("tokens", tokens), ("vocab", vocab),
                                                                        ("variant", variant), ("num_warps", num_warps))))
    if recorded is None:
        raise KeyError(f"case_497_ablation.csv records no {variant} row at {tokens} x {vocab}, {num_warps} warps")
    gpu = gpu or model.gpu_from_folder(data_dir)
    moved = (compiled.spill_store_bytes or 0) + (compiled.spill_load_bytes or 0)
    today = model.predict(counted_config(_with_counts(recorded, counts), gpu, moved_bytes=moved), gpu)
    then = model.predict(counted_config(recorded, gpu, data_dir), gpu)
    return {"variant": variant, **counts, "predicted_ms": today.ms, "bound": today.bound,
            "recorded_n_regs": int(recorded["n_regs"]), "recorded_spill_bytes": int(recorded["spill_bytes"]),
            "recorded_ms": float(recorded["ms_median"]), "recorded_predicted_ms": then.ms}


def exercise_answer(data_dir, *, tokens: int = 4096, vocab: int = 32768, num_warps: int = 16) -> pd.DataFrame:
    """The exercise's answer from the records: step 0 and, per switch turned off alone, the recorded registers, stack,
    time and the model's time from the recorded counts, and the speed-up over step 0 (recorded and predicted)."""
    from .lab_kernels.case_study import ablation

    gpu = model.gpu_from_folder(data_dir)
    rows = []
    for switch in (None, *ablation.SWITCHES):
        variant = "case497.step0" if switch is None else exercise_variant(switch)
        row = pick_row(data_dir, Pick("case_497_ablation", RKL[:2] + (("tokens", tokens), ("vocab", vocab),
                                                                      ("variant", variant), ("num_warps", num_warps))))
        pred = model.predict(counted_config(row, gpu, data_dir), gpu)
        rows.append({"switch off": switch or "(none: step 0)", "variant": variant, "registers": int(row["n_regs"]),
                     "stack B/thread": int(row["spill_bytes"]), "recorded ms": float(row["ms_median"]),
                     "predicted ms": pred.ms, "bound": pred.bound})
    out = pd.DataFrame(rows)
    out["recorded speed-up"] = out["recorded ms"].iloc[0] / out["recorded ms"]
    out["predicted speed-up"] = out["predicted ms"].iloc[0] / out["predicted ms"]
    return out
