"""Where a training step's time goes (notebook 08): torch.profiler kernel tables and Nsight Compute metrics.

Two measurements, both GPU only, both recorded so that the notebook replays them on a CPU::

    python -m perfutils.profiling --out data/     # profile_kernels.csv (+ profile_ncu.csv if ncu works), < 3 min

* :func:`measure_profile`: one loss forward + backward (cross-entropy with labels, bf16 logits,
  4096 x 32768 by default) per variant of ``kernels.entropy_loss_forward_backward`` and for PyTorch
  eager ``cross_entropy`` (bf16 directly, and upcast to fp32 first). Per variant one ``step`` row
  (do_bench time of the whole step, GB/s of the 4 B/element floor, correctness against float64,
  peak memory, the limiting launch's registers/occupancy) and one ``kernel`` row per GPU kernel
  from ``torch.profiler``'s ``key_averages()`` (calls and device time per step, share of the step).
* :func:`measure_ncu`: the loss kernels under Nsight Compute (``ncu``, run as a subprocess on a
  small script), one row per profiled launch, with the occupancy perfutils predicts from the
  compiled kernel's registers and shared memory beside what ncu reports. If ``ncu`` is missing or
  fails, nothing is recorded and the reason is printed.
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import pandas as pd
import torch

from .records import config_key, error_text
from .teaching import CudaBackend, _Session, kernel_stats

__all__ = [
    "PROFILE_STUDY",
    "NCU_STUDY",
    "NCU_METRICS",
    "short_kernel_name",
    "kernel_kind",
    "kernel_table",
    "loss_step",
    "measure_profile",
    "find_ncu",
    "ncu_command",
    "parse_ncu_csv",
    "ncu_rows",
    "measure_ncu",
    "run_all_gpu",
    "step_summary",
    "kernel_summary",
    "ncu_comparison",
    "plot_step_breakdown",
    "plot_ncu_occupancy",
]

PROFILE_STUDY = "profile_kernels"
NCU_STUDY = "profile_ncu"
PRODUCER_COMMAND = "python -m perfutils.profiling --out data/"
DEFAULT_TOKENS = 4096
DEFAULT_VOCAB = 32768
DEFAULT_VARIANTS = ("fused", "two_pass", "split_row", "auto")
TORCH_VARIANTS = ("torch_eager", "torch_eager_fp32")
NCU_VARIANTS = ("fused", "two_pass", "split_row")
LOGIT_SCALE = 2.0

# Nsight Compute metrics (names as in the Nsight Compute Profiling Guide, "Metrics Reference").
NCU_CORE_METRICS = (
    "gpu__time_duration.sum",  # kernel duration
    "sm__warps_active.avg.pct_of_peak_sustained_active",  # achieved occupancy (%)
    "dram__throughput.avg.pct_of_peak_sustained_elapsed",  # DRAM throughput (% of peak)
    "launch__registers_per_thread",
    "launch__occupancy_limit_registers",  # blocks/SM allowed by each resource
    "launch__occupancy_limit_shared_mem",
    "launch__occupancy_limit_warps",
    "launch__occupancy_limit_blocks",
)
NCU_EXTRA_METRICS = (
    "sm__maximum_warps_per_active_cycle_pct",  # theoretical occupancy (%)
    "launch__shared_mem_per_block_dynamic",
    "launch__shared_mem_per_block_static",
    "launch__block_size",
    "launch__grid_size",
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "launch__shared_mem_config_size",  # the shared-memory carveout the launch ran with
)
NCU_METRICS = NCU_CORE_METRICS + NCU_EXTRA_METRICS

# Short column names for the ncu metrics in profile_ncu.csv.
NCU_COLUMNS = {
    "gpu__time_duration.sum": "ncu_time_ns",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "ncu_achieved_occupancy_pct",
    "sm__maximum_warps_per_active_cycle_pct": "ncu_theoretical_occupancy_pct",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "ncu_dram_throughput_pct",
    "launch__registers_per_thread": "ncu_registers",
    "launch__occupancy_limit_registers": "ncu_limit_registers",
    "launch__occupancy_limit_shared_mem": "ncu_limit_shared_mem",
    "launch__occupancy_limit_warps": "ncu_limit_warps",
    "launch__occupancy_limit_blocks": "ncu_limit_blocks",
    "launch__shared_mem_per_block_dynamic": "ncu_shared_dynamic_bytes",
    "launch__shared_mem_per_block_static": "ncu_shared_static_bytes",
    "launch__block_size": "ncu_block_size",
    "launch__grid_size": "ncu_grid_size",
    "dram__bytes_read.sum": "ncu_dram_read_bytes",
    "dram__bytes_write.sum": "ncu_dram_write_bytes",
    "launch__shared_mem_config_size": "ncu_shared_config_bytes",
}

# ================================================================================================
# torch.profiler tables
# ================================================================================================


def short_kernel_name(name: str) -> str:
    """A readable kernel name: drop ``void``, namespaces, template arguments and parameter lists.

    ``"void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float>(float*, ...)"`` ->
    ``"cunn_SoftMaxForward"``; Triton kernels (plain names) are returned unchanged.
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    text = name.strip()
    if text.startswith("void "):
        text = text[5:]
    depth, cut = 0, []
    for ch in text:  # remove everything inside <...> and (...), nested
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth = max(0, depth - 1)
        elif depth == 0:
            cut.append(ch)
    text = "".join(cut).strip()
    if "::" in text:
        text = text.rsplit("::", 1)[-1]
    text = text.split()[-1] if text.split() else text
    return text or name.strip()


def kernel_kind(name: str) -> str:
    """``memset``, ``memcpy`` or ``kernel`` for a device event name from the profiler."""
    lowered = name.strip().lower()
    if lowered.startswith("memset"):
        return "memset"
    if lowered.startswith("memcpy"):
        return "memcpy"
    return "kernel"


def _is_device_event(event: Any) -> bool:
    device_type = getattr(event, "device_type", None)
    return device_type is not None and str(device_type).split(".")[-1].upper() == "CUDA"


def _device_us(event: Any) -> float | None:
    for name in ("device_time_total", "cuda_time_total", "self_device_time_total", "self_cuda_time_total"):
        value = getattr(event, name, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


def kernel_table(events: Iterable[Any], steps: int) -> pd.DataFrame:
    """GPU-side rows of ``prof.key_averages()`` as a table, per step.

    Columns: kernel (full name), short_name, kind (kernel | memset | memcpy), calls_per_step,
    us_per_step (device microseconds per step), pct_of_device (share of all device time), sorted by
    time. CPU-side operators (``aten::...``) are left out: their device time is the sum of the
    kernels listed here.
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps <= 0:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    rows = []
    for event in events:
        if not _is_device_event(event):
            continue
        us = _device_us(event)
        name = str(getattr(event, "key", "") or getattr(event, "name", ""))
        if us is None or not name:
            continue
        rows.append({"kernel": name, "short_name": short_kernel_name(name), "kind": kernel_kind(name),
                     "calls_per_step": float(getattr(event, "count", 0)) / steps, "us_per_step": us / steps})
    columns = ["kernel", "short_name", "kind", "calls_per_step", "us_per_step", "pct_of_device"]
    if not rows:
        return pd.DataFrame(columns=columns)
    table = pd.DataFrame(rows).groupby(["kernel", "short_name", "kind"], as_index=False).sum()
    total = table["us_per_step"].sum()
    table["pct_of_device"] = 100.0 * table["us_per_step"] / total if total > 0 else float("nan")
    return table.sort_values(["us_per_step", "kernel"], ascending=[False, True]).reset_index(drop=True)[columns]


# ================================================================================================
# One loss step per variant
# ================================================================================================


def _make_inputs(tokens: int, vocab: int, device: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator(device=device).manual_seed(seed)
    logits = torch.randn(tokens, vocab, generator=generator, device=device, dtype=torch.float32)
    logits = logits.mul_(LOGIT_SCALE).to(torch.bfloat16)
    labels = torch.randint(0, vocab, (tokens,), generator=generator, device=device)
    return logits, labels


def loss_step(variant: str, logits: torch.Tensor, labels: torch.Tensor) -> tuple[Callable[[], Any], Any]:
    """(step, plan): ``step()`` computes (loss, dloss/dlogits) once; ``plan`` is the kernels Plan or None.

    ``torch_eager``: ``F.cross_entropy`` on the bf16 logits + ``torch.autograd.grad``;
    ``torch_eager_fp32``: the same after ``logits.float()`` (a common way to get an fp32 loss);
    anything else: a variant of ``kernels.prepare`` (fused, two_pass, split_row, auto).
    """
    if variant in TORCH_VARIANTS:
        upcast = variant == "torch_eager_fp32"

        def step():
            x = logits.detach().requires_grad_(True)  # a fresh leaf: gradients never accumulate
            loss = torch.nn.functional.cross_entropy(x.float() if upcast else x, labels)
            (grad,) = torch.autograd.grad(loss, x)
            return loss.detach(), grad

        return step, None
    import kernels

    plan = kernels.prepare(logits, labels, loss="cross_entropy", target_format="labels", variant=variant)
    return plan.run, plan


def _launch_stats(plan: Any, cc) -> tuple[dict[str, dict[str, Any]], dict[str, Any], list[dict[str, Any]]]:
    """(stats by kernel function name, stats of the limiting launch, every launch) of a plan that ran."""
    by_name: dict[str, dict[str, Any]] = {}
    launches = []
    for launch in getattr(plan, "launches", None) or []:
        fn_name = getattr(launch.fn, "__name__", None) or getattr(getattr(launch.fn, "fn", None), "__name__", "?")
        stats = kernel_stats(getattr(launch, "compiled", None), cc)
        entry = {"launch": getattr(launch, "name", None), "kernel": fn_name, "grid": list(launch.grid),
                 "block_size": getattr(launch, "block_size", None), "num_warps": launch.num_warps, **stats}
        launches.append(entry)
        by_name.setdefault(fn_name, entry)
    if not launches:
        return by_name, {}, launches
    limiting = min(launches, key=lambda e: (e["occupancy"] if e.get("occupancy") is not None else math.inf,
                                            -(e.get("n_regs") or 0)))
    return by_name, limiting, launches


def _config(variant: str, tokens: int, vocab: int, block_size, num_warps) -> dict[str, Any]:
    return {"loss": "cross_entropy", "target_format": "labels", "variant": variant, "dtype": "bf16",
            "tokens": tokens, "vocab": vocab, "block_size": block_size, "num_warps": num_warps}


def _key_part(text: str) -> str:
    return re.sub(r"[;=\n]", "_", text)[:200]


def measure_profile(out_dir: str | os.PathLike = "data", *, tokens: int = DEFAULT_TOKENS, vocab: int = DEFAULT_VOCAB,
                    variants: Sequence[str] = DEFAULT_VARIANTS, torch_variants: Sequence[str] = TORCH_VARIANTS,
                    steps: int = 5, overwrite: bool = False, copy_gbps: float | None = None, seed: int = 0,
                    backend: Any = None, metadata: Mapping[str, Any] | None = None,
                    log: Callable[[str], Any] = print) -> Path:
    """Record ``<out_dir>/<gpu-slug>/profile_kernels.csv``: step rows and per-kernel rows per variant.

    Step rows (``row_kind = "step"``): ms_median/p20/p80 of the whole forward + backward (for the
    kernels variants ``Plan.run``: the launches, with argument checks and output allocation done once
    in ``prepare``), bytes_min = 4 B/element (read bf16 logits, write bf16 grad, plus labels and the
    loss), GB/s and % of copy, max_rel_err of loss and gradient against float64, compile_ms,
    peak_mem_bytes (what a step allocates plus the buffers a plan allocated up front: the gradient included),
    n_kernels and device_us_per_step (from the profiler), and the limiting launch's n_regs /
    occupancy. Kernel rows (``row_kind = "kernel"``): kernel, short_name, kind, calls_per_step,
    us_per_step, pct_of_device, ms_median = device ms per step; for Triton kernels also their
    registers and occupancy. ``variant`` is the kernels variant or torch_eager / torch_eager_fp32.
    """
    from .model.roofline import loss_cost
    from .sweep import TOLERANCE
    from .timing import rel_err

    for name, value in (("tokens", tokens), ("vocab", vocab), ("steps", steps)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    backend = backend or CudaBackend()
    device = backend.device
    all_variants = list(variants) + list(torch_variants)
    parameters = {"tokens": tokens, "vocab": vocab, "variants": all_variants, "steps": steps, "seed": seed,
                  "dtype": "bf16", "loss": "cross_entropy", "target_format": "labels", "logit_scale": LOGIT_SCALE,
                  "warmup_ms": getattr(backend, "warmup_ms", None), "rep_ms": getattr(backend, "rep_ms", None)}
    session = _Session(PROFILE_STUDY, out_dir, backend, parameters=parameters, copy_gbps=copy_gbps,
                       metadata=metadata, overwrite=overwrite, log=log)
    copy = session.copy_gbps
    bytes_min = int(loss_cost("cross_entropy", "labels", tokens, vocab, 2).bytes)
    tolerance = TOLERANCE["bf16"]
    pending = [v for v in all_variants if config_key(_config(v, tokens, vocab, None, None)) + ";row=step" not in session.done]
    if not pending:
        return session.finish()

    logits, labels = _make_inputs(tokens, vocab, device, seed)
    import kernels

    ref_loss, ref_grad = kernels.reference.entropy_loss_forward_backward(logits, labels, loss="cross_entropy",
                                                                         target_format="labels")
    ref_loss, ref_grad = ref_loss.detach(), ref_grad.detach()

    for variant in pending:
        base = _config(variant, tokens, vocab, None, None)
        step_key = config_key(base) + ";row=step"

        def measure(variant=variant, base=base, step_key=step_key):
            step, plan = loss_step(variant, logits, labels)
            (loss, grad), compile_ms = backend.first_call(step)
            err = max(rel_err(loss.reshape(()).float(), ref_loss.to(loss.device)), rel_err(grad, ref_grad))
            del loss, grad
            timing = backend.bench(step)
            # A plan allocates its gradient and workspaces up front: count them with what run() allocates.
            peak = backend.peak_bytes(step) + (plan.buffer_bytes if plan is not None else 0)
            by_name, limiting, launches = _launch_stats(plan, getattr(backend, "cc", None))
            table = kernel_table(backend.device_events(step, steps), steps)
            ms = float(timing.ms_median)
            gbps = bytes_min / (ms * 1e-3) / 1e9
            status = "ok" if err <= tolerance else "wrong"
            config = dict(base, block_size=limiting.get("block_size"), num_warps=limiting.get("num_warps"))
            kernel_rows = table[table["kind"] == "kernel"]
            step_row = {
                **config, "row_kind": "step", "kernel": None,
                "ms_median": ms, "ms_p20": float(timing.ms_p20), "ms_p80": float(timing.ms_p80),
                "bytes_min": bytes_min, "gbps": gbps, "pct_of_copy": 100.0 * gbps / copy,
                **{k: limiting.get(k) for k in ("n_regs", "spill_bytes", "shared_bytes", "occupancy",
                                                  "blocks_per_sm", "limiter")},
                "max_rel_err": err, "status": status,
                "error": None if status == "ok" else f"max_rel_err {err:.3g} above tolerance {tolerance:g}",
                "compile_ms": compile_ms, "peak_mem_bytes": peak,
                "n_kernels": float(kernel_rows["calls_per_step"].sum()) if not table.empty else None,
                "device_us_per_step": float(table["us_per_step"].sum()) if not table.empty else None,
                "limiting_pass": limiting.get("launch"), "passes": launches or None,
                "plan_config": getattr(plan, "config", None) or None,
                "config_key": step_key,
            }
            rows = [step_row]
            for index, event in table.iterrows():
                stats = by_name.get(event["short_name"]) or by_name.get(event["kernel"]) or {}
                rows.append({
                    **config, "row_kind": "kernel", "kernel": event["kernel"], "short_name": event["short_name"],
                    "kind": event["kind"], "calls_per_step": event["calls_per_step"],
                    "us_per_step": event["us_per_step"], "pct_of_device": event["pct_of_device"],
                    "ms_median": event["us_per_step"] / 1e3,
                    **{k: stats.get(k) for k in ("n_regs", "spill_bytes", "shared_bytes", "occupancy",
                                                 "blocks_per_sm", "limiter")},
                    "status": "ok",
                    "config_key": f"{step_key[:-len(';row=step')]};row=kernel;kernel={_key_part(event['kernel'])}",
                })
            if table.empty:
                step_row["stats_error"] = "torch.profiler recorded no GPU kernel events"
            return rows

        session.record_rows(step_key, base, measure)
        backend.release()
    del logits, labels, ref_loss, ref_grad
    backend.release()
    return session.finish()


# ================================================================================================
# Nsight Compute
# ================================================================================================

_NCU_SCRIPT = '''"""Run one loss call per variant so that ncu can profile their kernels (written by perfutils.profiling)."""
import sys

import torch

import kernels

tokens, vocab, seed, scale = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
variants = sys.argv[5].split(",")
generator = torch.Generator(device="cuda").manual_seed(seed)
logits = torch.randn(tokens, vocab, generator=generator, device="cuda").mul_(scale).to(torch.bfloat16)
labels = torch.randint(0, vocab, (tokens,), generator=generator, device="cuda")
for variant in variants:
    kernels.entropy_loss_forward_backward(logits, labels, loss="cross_entropy", target_format="labels",
                                          variant=variant)
    torch.cuda.synchronize()
    print("perfutils-ncu: ran", variant, flush=True)
'''


def find_ncu() -> str | None:
    """Path of the Nsight Compute CLI: ``ncu`` on PATH, else the usual CUDA install locations."""
    found = shutil.which("ncu")
    if found:
        return found
    candidates = [Path("/usr/local/cuda/bin/ncu")]
    candidates += sorted(Path("/opt/nvidia/nsight-compute").glob("*/ncu"), reverse=True)
    candidates += sorted(Path("/usr/local").glob("cuda-*/bin/ncu"), reverse=True)
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def ncu_command(ncu: str, kernel_names: Sequence[str], metrics: Sequence[str], script: str,
                script_args: Sequence[str]) -> list[str]:
    """The ncu command line: no clock locking, child processes followed, only the named kernels, CSV."""
    names = sorted({re.escape(name) for name in kernel_names})
    if not names:
        raise ValueError("ncu_command: no kernel names to profile")
    return [ncu, "--clock-control", "none", "--target-processes", "all", "-k", "regex:" + "|".join(names),
            "--metrics", ",".join(metrics), "--csv", sys.executable, script, *map(str, script_args)]


_TIME_UNITS_NS = {"nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6,
                  "second": 1e9, "s": 1e9}
_BYTE_UNITS = {"byte": 1.0, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "tbyte": 1e12,
               "kibyte": 1024.0, "mibyte": 1024.0**2, "gibyte": 1024.0**3}


def _ncu_number(value: str, unit: str) -> float:
    """A metric value as a float in base units (ns, bytes); NaN when it is not a number."""
    text = (value or "").strip().replace("\u202f", "").replace(" ", "")
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", text):  # thousands separators: 1,024 / 1,048,576.5
        text = text.replace(",", "")
    elif re.fullmatch(r"-?\d+,\d+", text):  # a decimal comma (non-C locale)
        text = text.replace(",", ".")
    try:
        number = float(text)
    except ValueError:
        return float("nan")
    unit = (unit or "").strip().lower()
    return number * _TIME_UNITS_NS.get(unit, _BYTE_UNITS.get(unit, 1.0))


def parse_ncu_csv(text: str) -> pd.DataFrame:
    """Parse ``ncu --csv`` output (one line per kernel launch and metric) into one row per launch.

    Lines before the header (``==PROF==`` messages, the application's own output) and any non-CSV
    line are ignored. Columns: ncu_id, kernel, block, grid (as ncu prints them, when present), then
    one column per metric named as in ncu, with values in base units (time in ns, sizes in bytes,
    percentages in %). Returns an empty frame when the text holds no metric table.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.lstrip().startswith('"ID"')), None)
    if start is None:
        return pd.DataFrame(columns=["ncu_id", "kernel"])
    body = [lines[start].strip()] + [line.strip() for line in lines[start + 1:] if line.lstrip().startswith('"')]
    reader = csv.DictReader(io.StringIO("\n".join(body) + "\n"))
    required = {"ID", "Kernel Name", "Metric Name", "Metric Value"}
    if not required.issubset(reader.fieldnames or []):
        raise ValueError(f"ncu CSV header lacks {sorted(required - set(reader.fieldnames or []))}: {body[0][:200]}")
    launches: dict[int, dict[str, Any]] = {}
    for record in reader:
        try:
            launch_id = int(str(record["ID"]).strip())
        except ValueError:
            continue
        entry = launches.setdefault(launch_id, {"ncu_id": launch_id, "kernel": record["Kernel Name"]})
        for column, target in (("Block Size", "block"), ("Grid Size", "grid")):
            if record.get(column):
                entry.setdefault(target, record[column])
        entry[record["Metric Name"]] = _ncu_number(record["Metric Value"], record.get("Metric Unit", ""))
    if not launches:
        return pd.DataFrame(columns=["ncu_id", "kernel"])
    return pd.DataFrame([launches[k] for k in sorted(launches)])


def _finite(value: Any) -> float | None:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _predicted_limits(stats: Mapping[str, Any], num_warps: int | None, cc) -> dict[str, Any]:
    """perfutils' blocks/SM per resource for a kernel's registers, shared bytes and warps."""
    out = {"pred_limit_registers": None, "pred_limit_shared_mem": None, "pred_limit_warps": None,
           "pred_limit_blocks": None}
    if stats.get("n_regs") is None or stats.get("shared_bytes") is None or not num_warps:
        return out
    from .model.occupancy import occupancy_of_counts

    occ = occupancy_of_counts(int(stats["n_regs"]), int(stats["shared_bytes"]), int(num_warps), cc or (9, 0))
    for name, key in (("registers", "pred_limit_registers"), ("shared_memory", "pred_limit_shared_mem"),
                      ("warps", "pred_limit_warps"), ("blocks", "pred_limit_blocks")):
        out[key] = _finite(occ.limits.get(name))  # "unlimited" (inf) is recorded as empty
    return out


def ncu_rows(parsed: pd.DataFrame, predictions: Sequence[Mapping[str, Any]], *, tokens: int, vocab: int,
             cc=None) -> list[dict[str, Any]]:
    """Rows for ``profile_ncu.csv``: each ncu launch beside perfutils' prediction for that kernel.

    ``predictions``: one dict per expected launch, in launch order, with variant, kernel (function
    name), launch, block_size, num_warps and the :func:`perfutils.teaching.kernel_stats` values.
    Launches are matched in order when ncu saw exactly the expected sequence of kernels, else by name.
    """
    if parsed.empty:
        return []
    parsed = parsed.sort_values("ncu_id").reset_index(drop=True)
    names = [short_kernel_name(str(k)) for k in parsed["kernel"]]
    expected = [p["kernel"] for p in predictions]
    if names == expected:
        matched = list(predictions)
    else:
        by_name: dict[str, Mapping[str, Any]] = {}
        for p in predictions:
            by_name.setdefault(p["kernel"], p)
        matched = [by_name.get(name, {}) for name in names]
    rows = []
    for (_, launch), name, prediction in zip(parsed.iterrows(), names, matched):
        variant = prediction.get("variant") or "unknown"
        config = _config(variant, tokens, vocab, prediction.get("block_size"), prediction.get("num_warps"))
        row: dict[str, Any] = {**config, "kernel": name, "launch": prediction.get("launch"), "ncu_id": int(launch["ncu_id"])}
        for metric, column in NCU_COLUMNS.items():
            row[column] = _finite(launch.get(metric))
        if "block" in launch and isinstance(launch.get("block"), str):
            row["ncu_block"] = launch["block"]
        if "grid" in launch and isinstance(launch.get("grid"), str):
            row["ncu_grid"] = launch["grid"]
        for key in ("n_regs", "spill_bytes", "shared_bytes", "occupancy", "blocks_per_sm", "limiter"):
            row[key] = prediction.get(key)
        row.update(_predicted_limits(prediction, prediction.get("num_warps"), cc))
        shared = [row.get("ncu_shared_dynamic_bytes"), row.get("ncu_shared_static_bytes")]
        if row.get("ncu_registers") is not None and prediction.get("num_warps") and all(s is not None for s in shared):
            from .model.occupancy import occupancy_of_counts

            try:  # the same calculator fed with ncu's own counts
                occ = occupancy_of_counts(int(row["ncu_registers"]), int(sum(shared)), int(prediction["num_warps"]),
                                          cc or (9, 0))
                row["pred_occupancy_from_ncu_counts"] = float(occ.occupancy)
            except Exception:
                row["pred_occupancy_from_ncu_counts"] = None
        time_ns = row.get("ncu_time_ns")
        if time_ns is not None:
            row["ms_median"] = time_ns / 1e6
            row["status"] = "ok"
            read, write = row.get("ncu_dram_read_bytes"), row.get("ncu_dram_write_bytes")
            if read is not None and write is not None and time_ns > 0:
                row["ncu_dram_gbps"] = (read + write) / time_ns  # bytes per ns = GB/s
        else:
            row["status"] = "error"
            row["error"] = "ncu reported no gpu__time_duration.sum for this launch"
        row["config_key"] = f"{config_key(config)};kernel={_key_part(name)};ncu_id={row['ncu_id']}"
        rows.append(row)
    return rows


def _ncu_version(ncu: str) -> str | None:
    try:
        result = subprocess.run([ncu, "--version"], capture_output=True, text=True, timeout=30, check=False)
    except Exception:
        return None
    lines = [line.strip() for line in result.stdout.splitlines() if line.strip()]
    return lines[-1] if lines else None


def _run_ncu(command: list[str], timeout_s: float, cwd: str) -> tuple[int | None, str, str]:
    """Run ncu in its own process group; on timeout kill that group. (returncode or None, stdout, stderr)."""
    env = dict(os.environ, LC_ALL="C", LANG="C", PYTHONUNBUFFERED="1")
    env.pop("TRITON_INTERPRET", None)
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd, env=env,
                               start_new_session=True)
    try:
        out, err = process.communicate(timeout=timeout_s)
        return process.returncode, out, err
    except subprocess.TimeoutExpired:
        try:
            os.killpg(process.pid, signal.SIGKILL)  # the group this call started (ncu and its target)
        except OSError:
            pass
        out, err = process.communicate()
        return None, out or "", err or ""


def _ncu_failure_reason(returncode: int | None, out: str, err: str, timeout_s: float) -> str:
    text = "\n".join([out, err])
    if returncode is None:
        return f"ncu did not finish within {timeout_s:.0f}s and was stopped"
    if "ERR_NVGPUCTRPERM" in text:
        return ("ncu may not read the GPU performance counters here (ERR_NVGPUCTRPERM): it needs admin rights or "
                "the driver option NVreg_RestrictProfilingToAdminUsers=0")
    errors = [line.strip() for line in text.splitlines() if "==ERROR==" in line]
    detail = " | ".join(errors[:3]) if errors else text.strip()[-400:]
    return f"ncu exited with status {returncode}: {detail}"


def measure_ncu(out_dir: str | os.PathLike = "data", *, tokens: int = DEFAULT_TOKENS, vocab: int = DEFAULT_VOCAB,
                variants: Sequence[str] = NCU_VARIANTS, timeout_s: float = 150.0, overwrite: bool = False,
                seed: int = 0, copy_gbps: float | None = None, backend: Any = None,
                metadata: Mapping[str, Any] | None = None, ncu: str | None = None,
                log: Callable[[str], Any] = print) -> Path | None:
    """Profile the loss kernels with Nsight Compute; record ``<out_dir>/<gpu-slug>/profile_ncu.csv``.

    The kernels are first run here (compiling them and giving perfutils' predictions: registers,
    shared memory, occupancy, blocks/SM per resource), then a small script runs one call per
    variant under ``ncu --clock-control none --target-processes all -k regex:<kernel names>
    --metrics ... --csv``. Returns the CSV path, or None when ncu is missing, fails, times out or
    reports nothing - in which case nothing is recorded and the reason is printed.
    """
    backend = backend or CudaBackend()
    ncu = ncu or find_ncu()
    if ncu is None:
        log("[profile_ncu] ncu (Nsight Compute CLI) not found on PATH or in /usr/local/cuda/bin: nothing recorded")
        return None
    version = _ncu_version(ncu)
    parameters = {"tokens": tokens, "vocab": vocab, "variants": list(variants), "metrics": list(NCU_METRICS),
                  "core_metrics": list(NCU_CORE_METRICS), "seed": seed, "ncu": ncu, "ncu_version": version,
                  "ncu_options": ["--clock-control", "none", "--target-processes", "all", "-k", "regex:<kernels>",
                                  "--metrics", "<metrics>", "--csv"]}
    session = _Session(NCU_STUDY, out_dir, backend, parameters=parameters, copy_gbps=copy_gbps, metadata=metadata,
                       overwrite=overwrite, log=log)
    if session.done:
        log(f"[profile_ncu] {session.path} already holds ncu results; nothing re-run (overwrite=True / --overwrite "
            "to profile again)")
        return session.finish()
    # Compile and run every variant once here: predictions, and a warm Triton cache for the script.
    import kernels

    device = backend.device
    logits, labels = _make_inputs(tokens, vocab, device, seed)
    predictions: list[dict[str, Any]] = []
    for variant in variants:
        try:
            plan = kernels.prepare(logits, labels, loss="cross_entropy", target_format="labels", variant=variant)
            plan.run()
            if device == "cuda":
                torch.cuda.synchronize()
        except Exception as exc:
            log(f"[profile_ncu] {variant} failed before profiling ({error_text(exc, 200)}); left out")
            continue
        _, _, launches = _launch_stats(plan, getattr(backend, "cc", None))
        predictions.extend({**entry, "variant": variant} for entry in launches)
    del logits, labels
    backend.release()
    if not predictions:
        log("[profile_ncu] no variant ran: nothing to profile, nothing recorded")
        return None
    ran = sorted({p["variant"] for p in predictions}, key=list(variants).index)
    kernel_names = [p["kernel"] for p in predictions]
    root = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory(prefix="perfutils-ncu-") as tmp:
        script = Path(tmp) / "ncu_target.py"
        script.write_text(_NCU_SCRIPT)
        args = [tokens, vocab, seed, LOGIT_SCALE, ",".join(ran)]
        metrics: Sequence[str] = NCU_METRICS
        command = ncu_command(ncu, kernel_names, metrics, str(script), args)
        log(f"[profile_ncu] running: {' '.join(command)}")
        started = time.perf_counter()
        returncode, out, err = _run_ncu(command, timeout_s, str(root))
        if returncode not in (0, None) and re.search(r"metric", out + err, re.IGNORECASE) and \
                re.search(r"not found|failed to find|invalid|unknown", out + err, re.IGNORECASE):
            metrics = NCU_CORE_METRICS  # an older ncu may lack a metric: retry with the essential ones
            command = ncu_command(ncu, kernel_names, metrics, str(script), args)
            remaining = max(10.0, timeout_s - (time.perf_counter() - started))
            log(f"[profile_ncu] retrying with the core metrics only: {' '.join(command)}")
            returncode, out, err = _run_ncu(command, remaining, str(root))
    parsed = pd.DataFrame()
    if returncode == 0:
        try:
            parsed = parse_ncu_csv(out)
        except Exception as exc:
            log(f"[profile_ncu] could not parse ncu's CSV ({error_text(exc, 300)}): nothing recorded")
            return None
    if returncode != 0 or parsed.empty:
        reason = _ncu_failure_reason(returncode, out, err, timeout_s) if returncode != 0 else \
            f"ncu profiled no kernel matching {sorted(set(kernel_names))}: {(out + err).strip()[-300:]}"
        log(f"[profile_ncu] {reason}; nothing recorded")
        return None
    rows = ncu_rows(parsed, predictions, tokens=tokens, vocab=vocab, cc=getattr(backend, "cc", None))
    metric_set = "full" if tuple(metrics) == NCU_METRICS else "core"
    for row in rows:
        row["ncu_version"] = version
        row["ncu_metric_set"] = metric_set
    if rows:
        session.store.append(rows)
        session.count += len(rows)
    log(f"[profile_ncu] {len(rows)} kernel launches profiled by ncu")
    return session.finish()


def run_all_gpu(out_dir: str | os.PathLike = "data", *, overwrite: bool = False, ncu_timeout_s: float = 150.0,
                log: Callable[[str], Any] = print) -> list[Path]:
    """Everything notebook 08 replays: profile_kernels.csv, and profile_ncu.csv when ncu works."""
    started = time.perf_counter()
    backend = CudaBackend()
    copy = float(backend.copy_gbps())
    log(f"GPU: {torch.cuda.get_device_name()}; copy bandwidth {copy:.0f} GB/s")
    written = [measure_profile(out_dir, overwrite=overwrite, copy_gbps=copy, backend=backend, log=log)]
    ncu_path = measure_ncu(out_dir, overwrite=overwrite, copy_gbps=copy, backend=backend, timeout_s=ncu_timeout_s, log=log)
    if ncu_path is not None:
        written.append(ncu_path)
    log(f"done in {time.perf_counter() - started:.0f}s: " + ", ".join(map(str, written)))
    return written


# ================================================================================================
# Tables and figures for the notebook
# ================================================================================================


def step_summary(df: pd.DataFrame) -> pd.DataFrame:
    """One line per variant: step time, GB/s, % of copy, kernels per step, peak memory, occupancy, error."""
    steps = df[df["row_kind"] == "step"].copy()
    if steps.empty:
        raise ValueError("step_summary: the data has no step rows (row_kind == 'step')")
    steps["peak_mem_mib"] = steps["peak_mem_bytes"] / 2**20 if "peak_mem_bytes" in steps else float("nan")
    columns = ["variant", "status", "ms_median", "ms_p20", "ms_p80", "gbps", "pct_of_copy", "n_kernels",
               "device_us_per_step", "peak_mem_mib", "n_regs", "occupancy", "limiter", "max_rel_err"]
    columns = [c for c in columns if c in steps]
    return steps[columns].sort_values("ms_median", na_position="last").reset_index(drop=True)


def kernel_summary(df: pd.DataFrame, *, top: int = 4) -> pd.DataFrame:
    """Per variant, its ``top`` kernels by device time per step (the rest summed as ``other``)."""
    kernels_df = df[(df["row_kind"] == "kernel") & (df["status"] == "ok")]
    if kernels_df.empty:
        raise ValueError("kernel_summary: the data has no kernel rows (row_kind == 'kernel')")
    parts = []
    for variant, rows in kernels_df.groupby("variant", sort=False):
        rows = rows.sort_values("us_per_step", ascending=False)
        head = rows.head(top)[["variant", "short_name", "kind", "calls_per_step", "us_per_step", "pct_of_device",
                               "n_regs", "occupancy"]]
        parts.append(head)
        rest = rows.iloc[top:]
        if not rest.empty:
            parts.append(pd.DataFrame([{"variant": variant, "short_name": f"other ({len(rest)})", "kind": "",
                                        "calls_per_step": rest["calls_per_step"].sum(),
                                        "us_per_step": rest["us_per_step"].sum(),
                                        "pct_of_device": rest["pct_of_device"].sum()}]))
    return pd.concat(parts, ignore_index=True)


def ncu_comparison(df: pd.DataFrame) -> pd.DataFrame:
    """profile_ncu rows side by side: perfutils' prediction next to what ncu measured."""
    ok = df[df["status"] == "ok"].copy()
    if ok.empty:
        raise ValueError("ncu_comparison: no successful ncu rows")
    ok["occupancy_pred_pct"] = ok["occupancy"] * 100
    wanted = ["variant", "kernel", "num_warps", "n_regs", "ncu_registers", "pred_limit_registers", "ncu_limit_registers",
              "pred_limit_shared_mem", "ncu_limit_shared_mem", "ncu_shared_config_bytes", "pred_limit_warps",
              "ncu_limit_warps",
              "occupancy_pred_pct", "ncu_theoretical_occupancy_pct", "ncu_achieved_occupancy_pct",
              "ncu_dram_throughput_pct", "ms_median"]
    return ok[[c for c in wanted if c in ok]].reset_index(drop=True)


def plot_step_breakdown(df: pd.DataFrame, *, top: int = 4):
    """Stacked bars: device time per step of each variant split into its top kernels; a black tick
    marks the do_bench time of the whole step (gaps between kernels and host work show as the excess)."""
    import matplotlib.pyplot as plt

    from .teaching import _figure_context

    table = kernel_summary(df, top=top)
    steps = df[(df["row_kind"] == "step") & (df["status"] == "ok")].set_index("variant")
    order = [v for v in steps.sort_values("ms_median").index if v in set(table["variant"])]
    order += [v for v in table["variant"].unique() if v not in order]
    text, _ = _figure_context(df)
    fig, ax = plt.subplots(figsize=(10.0, 0.6 * len(order) + 1.8))
    cmap = plt.get_cmap("tab20")
    names = list(dict.fromkeys(table["short_name"]))
    colors = {name: cmap(i % 20) for i, name in enumerate(names)}
    longest = float(max(table.groupby("variant")["us_per_step"].sum().max(),
                        (steps["ms_median"] * 1e3).max() if len(steps) else 0.0))
    for y, variant in enumerate(order):
        left = 0.0
        for _, row in table[table["variant"] == variant].iterrows():
            width = float(row["us_per_step"])
            ax.barh(y, width, left=left, color=colors[row["short_name"]], edgecolor="white", linewidth=0.5)
            fits = int(width / longest * 110) - 2  # characters of a 6.5 pt label that fit in the segment
            if fits >= 5:
                name = row["short_name"]
                ax.text(left + width / 2, y, name if len(name) <= fits else name[:fits - 1] + "…",
                        ha="center", va="center", fontsize=6.5)
            left += width
        if variant in steps.index:
            ax.plot([steps.at[variant, "ms_median"] * 1e3] * 2, [y - 0.4, y + 0.4], color="black", linewidth=2)
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(color=colors[name], label=name) for name in names], loc="center left",
              bbox_to_anchor=(1.01, 0.5), fontsize=7, frameon=False, title="kernel", title_fontsize=7)
    ax.set_yticks(range(len(order)))
    ax.set_yticklabels(order)
    ax.invert_yaxis()
    ax.set_xlabel("time per loss forward+backward step (µs): bars = GPU kernels (profiler), tick = do_bench step")
    ax.set_title(f"Where the step's time goes\n{text}", fontsize=10)
    fig.tight_layout()
    return fig


def plot_ncu_occupancy(df: pd.DataFrame):
    """Per profiled kernel: predicted theoretical occupancy (perfutils), ncu's theoretical and achieved
    occupancy, and ncu's DRAM throughput, all in %."""
    import matplotlib.pyplot as plt

    from .teaching import _figure_context

    table = ncu_comparison(df)
    text, _ = _figure_context(df)
    labels = [f"{v}\n{k}" for v, k in zip(table["variant"], table["kernel"])]
    series = [("perfutils theoretical", "occupancy_pred_pct"), ("ncu theoretical", "ncu_theoretical_occupancy_pct"),
              ("ncu achieved", "ncu_achieved_occupancy_pct"), ("ncu DRAM throughput", "ncu_dram_throughput_pct")]
    series = [(label, column) for label, column in series if column in table and table[column].notna().any()]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(table) + 2), 4.0))
    width = 0.8 / max(len(series), 1)
    for i, (label, column) in enumerate(series):
        positions = [k + (i - (len(series) - 1) / 2) * width for k in range(len(table))]
        ax.bar(positions, table[column].fillna(0.0), width=width, label=label)
    ax.set_xticks(range(len(table)))
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylim(0, 105)
    ax.set_ylabel("% (occupancy: of 64 warps/SM; DRAM: of peak)")
    ax.legend(fontsize=7, ncol=2)
    ax.set_title(f"Loss kernels under Nsight Compute vs perfutils' prediction\n{text}", fontsize=10)
    fig.tight_layout()
    return fig


# ================================================================================================
# Command line
# ================================================================================================


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m perfutils.profiling",
        description="Profile the loss step on this GPU: <out>/<gpu-slug>/profile_kernels.csv and profile_ncu.csv.",
    )
    parser.add_argument("--out", default="data", help="data directory (default: data)")
    parser.add_argument("--overwrite", action="store_true",
                        help="start new files (old ones are renamed <study>.replaced-<time>.csv, never deleted)")
    parser.add_argument("--ncu-timeout", type=float, default=150.0, help="seconds allowed for the ncu run (default 150)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: no CUDA GPU is available; these measurements only run on a GPU", file=sys.stderr)
        return 2
    run_all_gpu(args.out, overwrite=args.overwrite, ncu_timeout_s=args.ncu_timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
