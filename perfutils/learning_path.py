"""The learning path of notebook 12: from the #497 kernel to the fastest loss kernels, one design step at a time.

Each :class:`PathStep` names the question it answers, the ``@triton.jit`` functions that answer it (module and
name, rendered from the source file by the notebook), and the recorded H100 rows that measure it: a ``before`` row
(the previous design, where one was recorded on the same shape) and an ``after`` row, each picked from one study's
CSV by column values (:class:`Pick`). :func:`path_frame` reads those rows and puts beside each recorded time the
time :mod:`perfutils.model.predict` gives from the row's non-time columns (its compile counts and plan), with the
bound and the terms; a step with no recorded row says so (``recorded_ms`` missing) instead of inventing one.

:func:`knob_prediction` is what the notebook's widget drives: the fused kernel at one (tile, warps) of the recorded
block-size sweep, predicted by the model from that configuration's recorded compile counts, beside its recorded time.
"""

from __future__ import annotations

import importlib
import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd

from .model import predict as model
from .model.roofline import loss_cost

__all__ = ["Pick", "PathStep", "STEPS", "pick_row", "predict_row", "path_frame", "step_summary", "step_functions", "speedups",
           "knob_options", "knob_prediction", "sass_excerpt"]


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
class PathStep:
    """One step of the path: its question, the functions it shows, the rows that measure it."""

    key: str
    title: str
    question: str
    functions: tuple  # (("kernels.fused", "fused_loss_kernel"), ...)
    after: Pick | None
    before: Pick | None = None
    evidence: str = ""  # a log under data/<gpu>/logs with the step's SASS or exploration
    note: str = ""  # what is missing, or what to read with the numbers

    @property
    def measured(self) -> bool:
        return self.after is not None


RKL = (("loss", "reverse_kl"), ("target_format", "logits"), ("tokens", 4096))
CE = (("loss", "cross_entropy"), ("target_format", "labels"), ("tokens", 4096))


def _ablation(variant: str) -> Pick:
    return Pick("case_497_ablation", RKL + (("vocab", 32768), ("variant", variant), ("num_warps", 16)))


STEPS: tuple[PathStep, ...] = (
    PathStep("497", "The #497 kernel", "Why is the #497 kernel slow when its occupancy is full?",
             (("perfutils.lab_kernels.case_study.ablation", "ablation_reverse_kl_kernel"),
              ("perfutils.lab_kernels.case_study.ablation", "split_tile_update")),
             after=_ablation("case497.step0"), before=None,
             evidence="case_497_spill_sass_2026-11-23.txt",
             note="the #497 structure re-implemented (step 0 of the ablation); the real kernel is run from a "
                  "Fast-LLM checkout, not shown here"),
    PathStep("kept", "Kept exponentials", "What does the backward gain by reusing the forward's exponentials?",
             (("perfutils.lab_kernels.case_study.ablation", "tile_grad"),
              ("kernels.row_math", "tile_gradient")),
             after=_ablation("case497.step1"), before=_ablation("case497.step0")),
    PathStep("tuple", "Tuple reductions", "What do two tuple reductions save over five separate ones?",
             (("kernels.row_math", "tile_statistics"), ("kernels.row_math", "max_pair"),
              ("kernels.row_math", "sum_triple")),
             after=_ablation("case497.step2"), before=_ablation("case497.step1")),
    PathStep("fused", "One tile in registers: fused", "Is one 32K tile in registers the best tile for two softmaxes?",
             (("kernels.fused", "fused_loss_kernel"),),
             after=Pick("case_497", RKL + (("vocab", 32768), ("variant", "fused"), ("block_size", 16384))),
             before=_ablation("fused"),
             note="before: kernels.fused with the #497 tile (32K, 16 warps); after: its tile capped at 16K "
                  "(Option A), the row read twice, the second time from L2"),
    PathStep("two_pass", "Two passes", "When the row is four tiles, does writing the statistics to memory beat "
             "re-reading the row in one program?",
             (("kernels.two_pass", "two_pass_stats_kernel"), ("kernels.two_pass", "two_pass_grad_kernel")),
             after=Pick("case_497", RKL + (("vocab", 131072), ("variant", "two_pass"))),
             before=Pick("case_497", RKL + (("vocab", 131072), ("variant", "fused"), ("block_size", 16384)))),
    PathStep("split", "Split row, exchanged statistics", "Can a wide row be read from DRAM once if its chunks go "
             "to different programs that exchange their summaries?",
             (("kernels.split_row", "split_row_cooperative_kernel"),),
             after=Pick("split_row_wait_tuning", RKL + (("vocab", 131072),), fastest=True),
             before=Pick("case_497", RKL + (("vocab", 131072), ("variant", "two_pass"))),
             evidence="ncu_split_row_2026-11-22.txt"),
    PathStep("lagged", "The lagged exchange", "What if no program waits for its row's slowest chunk?",
             (("kernels.split_row", "split_row_lagged_kernel"),),
             after=Pick("split_row_tuning", RKL + (("vocab", 131072),), fastest=True),
             before=Pick("split_row_wait_tuning", RKL + (("vocab", 131072),), fastest=True),
             evidence="ncu_lagged_stalls_2026-11-26.txt"),
    PathStep("peel", "The row peel", "How does a row that is not 16-byte aligned keep 16-byte loads?",
             (("kernels.row_math", "row_peel"), ("kernels.row_math", "label_in_tile")),
             after=Pick("vocab_sweep", CE + (("vocab", 50257), ("variant", "plan"))), before=None,
             evidence="explore_peel_2026-11-26.txt",
             note="no recorded row of the kernel before the peel: its times are in the exploration log only"),
    PathStep("resident", "The resident row (bf16x2)", "Can cross-entropy keep a 32K row in registers without "
             "spilling, by never widening it?",
             (("kernels.resident_row", "resident_row_kernel"), ("kernels.resident_row", "pair_gradient")),
             after=Pick("vocab_sweep", CE + (("vocab", 32768), ("variant", "plan"))),
             before=Pick("case_497", CE + (("vocab", 32768), ("variant", "fused"), ("block_size", 16384))),
             evidence="explore_resident_2026-11-26.txt"),
    PathStep("tp", "The vocabulary split over GPUs", "Can two GPUs each read half the vocabulary once and "
             "exchange only the rows' summaries?",
             (("kernels.vocab_parallel_exchange", "exchange_kernel"),),
             after=Pick("tensor_parallel", CE + (("vocab", 131072), ("variant", "tp2-symmetric")),
                        plan=Pick("vocab_sweep", CE + (("vocab", 131072), ("variant", "plan"))), slice_of=2),
             before=Pick("tensor_parallel", CE + (("vocab", 131072), ("variant", "tp1-auto")),
                         plan=Pick("vocab_sweep", CE + (("vocab", 131072), ("variant", "plan")))),
             note="the model has no term for the exchange: tp=2 is predicted as one rank's kernel on its half of "
                  "each row (the one-GPU plan of the whole row, on half the columns)"),
)


def _read(data_dir: Path, study: str) -> pd.DataFrame:
    frame = pd.read_csv(Path(data_dir) / f"{study}.csv", low_memory=False)
    if "study" not in frame.columns:
        frame["study"] = study
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
    if pick is not None and pick.plan is not None:
        plan = pick_row(data_dir, pick.plan, cache)
        if plan is None:
            return None
        source = {**plan, "study": row.get("study"), "config_key": row.get("config_key"),
                  "vocab": int(plan["vocab"]) // pick.slice_of}
    config = model.config_from_row(source, gpu)
    return None if config is None else (config, model.predict(config, gpu))


def _describe(row: dict | None) -> dict:
    if row is None:
        return {}
    passes = row.get("passes")
    launch = (json.loads(passes)[0] if isinstance(passes, str) and passes.startswith("[") else {})
    value = lambda key: launch.get(key) if launch.get(key) is not None else row.get(key)  # noqa: E731
    return {"vocab": int(row["vocab"]), "tokens": int(row["tokens"]), "block_size": value("block_size"),
            "num_warps": value("num_warps"), "n_regs": value("n_regs"), "spill_bytes": value("spill_bytes"),
            "blocks_per_sm": value("blocks_per_sm"), "pct_of_copy": row.get("pct_of_copy"),
            "measured": str(row.get("timestamp_utc") or "")[:10]}


def _model_counts(config) -> dict:
    """What the model sees of a configuration: DRAM bytes per element, resident programs and KiB of loads in flight
    per SM (of its first pass)."""
    if config is None or not config.passes:
        return {}
    first = config.passes[0]
    elements = float(config.tokens) * config.vocab
    return {"dram_bytes_per_element": sum(p.dram_bytes for p in config.passes) / elements,
            "resident": first.resident, "kib_in_flight_per_sm": first.resident * first.load_bytes_per_step / 1024}


def path_frame(data_dir, steps=STEPS) -> pd.DataFrame:
    """One row per (step, side): side ``before``/``after``, the recorded time, the model's predicted time, its
    bound and DRAM/latency terms, the compile counts the row recorded, and the row's source."""
    data_dir = Path(data_dir)
    gpu = model.gpu_from_folder(data_dir)
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
                         **_model_counts(config),
                         "floor_ms": bytes_min / (gpu.ceilings.dram_gbps * 1e9) * 1e3,
                         "source": pick.describe()})
    return pd.DataFrame(rows)


def step_summary(frame: pd.DataFrame, key: str) -> tuple[pd.DataFrame, str]:
    """A step's rows as a page shows them, and one sentence computed from them (recorded and predicted times,
    speed-ups, the bound)."""
    part = frame[frame["step"] == key]
    columns = ["side", "variant", "vocab", "block_size", "num_warps", "n_regs", "spill_bytes", "resident",
               "kib_in_flight_per_sm", "dram_bytes_per_element", "recorded_ms", "predicted_ms", "bound", "measured"]
    shown = part[[c for c in columns if c in part.columns]].reset_index(drop=True)
    after = part[part["side"] == "after"].iloc[0]
    if math.isnan(after["recorded_ms"]):
        return shown, "No recorded row measures this step."
    text = (f"Recorded on the H100: **{after['recorded_ms']:.3f} ms** ({after['pct_of_copy']:.0f}% of copy "
            f"bandwidth); the model predicts **{after['predicted_ms']:.3f} ms**, bound by `{after['bound']}`")
    before = part[part["side"] == "before"]
    if len(before):
        b = before.iloc[0]
        text += (f". Against the step before ({b['recorded_ms']:.3f} ms recorded, {b['predicted_ms']:.3f} ms "
                 f"predicted, bound `{b['bound']}`): **{b['recorded_ms'] / after['recorded_ms']:.2f}x recorded**, "
                 f"{b['predicted_ms'] / after['predicted_ms']:.2f}x predicted")
    return shown, text + "."


def speedups(frame: pd.DataFrame) -> pd.DataFrame:
    """Per step with both sides recorded: the recorded and the predicted speed-up (before / after)."""
    wide = frame.pivot_table(index=["order", "step", "title"], columns="side",
                             values=["recorded_ms", "predicted_ms"], aggfunc="first")
    out = pd.DataFrame({"recorded speed-up": wide[("recorded_ms", "before")] / wide[("recorded_ms", "after")],
                        "predicted speed-up": wide[("predicted_ms", "before")] / wide[("predicted_ms", "after")]}) \
        if ("recorded_ms", "before") in wide.columns else pd.DataFrame(columns=["recorded speed-up", "predicted speed-up"])
    return out.dropna(how="all").reset_index()


def step_functions(step: PathStep) -> list:
    """The ``@triton.jit`` functions a step shows (imported by module and name, so that a renamed kernel fails)."""
    return [getattr(importlib.import_module(module), name) for module, name in step.functions]


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


def knob_options(data_dir, loss: str = "cross_entropy", target_format: str = "labels", vocab: int = 131072,
                 tokens: int = 4096) -> pd.DataFrame:
    """The fused kernel's recorded (tile, warps) configurations of the block-size sweep for one shape."""
    frame = _read(data_dir, "blocksize_sweep")
    frame = frame[(frame["loss"] == loss) & (frame["target_format"] == target_format) & (frame["vocab"] == vocab)
                  & (frame["tokens"] == tokens) & (frame["variant"] == "fused")]
    return frame.sort_values(["block_size", "num_warps"]).reset_index(drop=True)


def knob_prediction(data_dir, block_size: int, num_warps: int, *, loss: str = "cross_entropy",
                    target_format: str = "labels", vocab: int = 131072, tokens: int = 4096,
                    gpu: model.Gpu | None = None) -> dict:
    """The fused kernel at one recorded (tile, warps): the model's time, bound, terms, bytes in flight per SM and
    resident programs, beside the recorded time (``KeyError`` for a configuration the sweep did not record)."""
    options = knob_options(data_dir, loss, target_format, vocab, tokens)
    match = options[(options["block_size"] == block_size) & (options["num_warps"] == num_warps)]
    if match.empty:
        raise KeyError(f"no recorded fused configuration with block_size={block_size}, num_warps={num_warps}")
    row = match.iloc[0].to_dict()
    gpu = gpu or model.gpu_from_folder(data_dir)
    config = model.config_from_row(row, gpu)
    pred = model.predict(config, gpu)
    first = config.passes[0]
    floor = loss_cost(loss, target_format, tokens, vocab, 2)
    return {"block_size": block_size, "num_warps": num_warps, "n_regs": int(row["n_regs"]),
            "spill_bytes": int(row["spill_bytes"]), "resident": first.resident,
            "kib_in_flight_per_sm": first.resident * first.load_bytes_per_step / 1024,
            "dram_mb": sum(p.dram_bytes for p in config.passes) / 1e6, "floor_mb": floor.bytes / 1e6,
            "predicted_ms": pred.ms, "bound": pred.bound, "recorded_ms": float(row["ms_median"]),
            **{f"{name}_ms": value for name, value in pred.breakdown.items() if name in ("dram", "latency", "l2")}}
