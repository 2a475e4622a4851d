"""The loss kernels under Nsight Compute, beside what perfutils predicts for them (notebook 08).

:func:`measure_ncu` compiles and runs each variant here (perfutils' predictions: registers, shared memory,
occupancy, blocks/SM per resource), then runs one call per variant under ``ncu --clock-control none
--target-processes all -k regex:<kernel names> --metrics ... --csv`` in a subprocess (:mod:`perfutils.measure.ncu`),
and records ``<out>/<gpu-slug>/profile_ncu.csv``: one row per profiled launch, ncu's metrics beside the prediction.
If ``ncu`` is missing or fails, nothing is recorded and the reason is printed. :func:`ncu_rows` needs no GPU.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import pandas as pd
import torch

from ..data.schema import config_key, error_text
from ..measure.ncu import find_ncu, ncu_command, ncu_failure_reason, ncu_version, parse_ncu_csv, run_ncu_command
from ..measure.profiler import short_kernel_name
from ..measure.session import CudaBackend, Session
from ..model.occupancy import occupancy_of_counts
from .loss_step import DEFAULT_TOKENS, DEFAULT_VOCAB, LOGIT_SCALE, key_part, launch_stats, make_inputs, step_config

__all__ = ["NCU_STUDY", "NCU_VARIANTS", "NCU_CORE_METRICS", "NCU_EXTRA_METRICS", "NCU_METRICS", "NCU_COLUMNS",
           "ncu_rows", "measure_ncu"]

NCU_STUDY = "profile_ncu"
NCU_VARIANTS = ("fused", "two_pass", "split_row")

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

_NCU_SCRIPT = '''"""Run one loss call per variant so that ncu can profile their kernels (written by perfutils.studies.profile_ncu)."""
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
    occ = occupancy_of_counts(int(stats["n_regs"]), int(stats["shared_bytes"]), int(num_warps), cc or (9, 0))
    for name, key in (("registers", "pred_limit_registers"), ("shared_memory", "pred_limit_shared_mem"),
                      ("warps", "pred_limit_warps"), ("blocks", "pred_limit_blocks")):
        out[key] = _finite(occ.limits.get(name))  # "unlimited" (inf) is recorded as empty
    return out


def ncu_rows(parsed: pd.DataFrame, predictions: Sequence[Mapping[str, Any]], *, tokens: int, vocab: int,
             cc=None) -> list[dict[str, Any]]:
    """Rows for ``profile_ncu.csv``: each ncu launch beside perfutils' prediction for that kernel.

    ``predictions``: one dict per expected launch, in launch order, with variant, kernel (function
    name), launch, block_size, num_warps and the :func:`perfutils.model.compiled_kernel.kernel_stats` values.
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
        config = step_config(variant, tokens, vocab, prediction.get("block_size"), prediction.get("num_warps"))
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
        row["config_key"] = f"{config_key(config)};kernel={key_part(name)};ncu_id={row['ncu_id']}"
        rows.append(row)
    return rows


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
    version = ncu_version(ncu)
    parameters = {"tokens": tokens, "vocab": vocab, "variants": list(variants), "metrics": list(NCU_METRICS),
                  "core_metrics": list(NCU_CORE_METRICS), "seed": seed, "ncu": ncu, "ncu_version": version,
                  "ncu_options": ["--clock-control", "none", "--target-processes", "all", "-k", "regex:<kernels>",
                                  "--metrics", "<metrics>", "--csv"]}
    session = Session(NCU_STUDY, out_dir, backend, parameters=parameters, copy_gbps=copy_gbps, metadata=metadata,
                      overwrite=overwrite, log=log)
    if session.done:
        log(f"[profile_ncu] {session.path} already holds ncu results; nothing re-run (overwrite=True / --overwrite "
            "to profile again)")
        return session.finish()
    # Compile and run every variant once here: predictions, and a warm Triton cache for the script.
    import kernels

    device = backend.device
    logits, labels = make_inputs(tokens, vocab, device, seed)
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
        _, _, launches = launch_stats(plan, getattr(backend, "cc", None))
        predictions.extend({**entry, "variant": variant} for entry in launches)
    del logits, labels
    backend.release()
    if not predictions:
        log("[profile_ncu] no variant ran: nothing to profile, nothing recorded")
        return None
    ran = sorted({p["variant"] for p in predictions}, key=list(variants).index)
    kernel_names = [p["kernel"] for p in predictions]
    root = Path(__file__).resolve().parents[2]
    with tempfile.TemporaryDirectory(prefix="perfutils-ncu-") as tmp:
        script = Path(tmp) / "ncu_target.py"
        script.write_text(_NCU_SCRIPT)
        args = [tokens, vocab, seed, LOGIT_SCALE, ",".join(ran)]
        metrics: Sequence[str] = NCU_METRICS
        command = ncu_command(ncu, kernel_names, metrics, str(script), args)
        log(f"[profile_ncu] running: {' '.join(command)}")
        started = time.perf_counter()
        returncode, out, err = run_ncu_command(command, timeout_s, str(root))
        if returncode not in (0, None) and re.search(r"metric", out + err, re.IGNORECASE) and \
                re.search(r"not found|failed to find|invalid|unknown", out + err, re.IGNORECASE):
            metrics = NCU_CORE_METRICS  # an older ncu may lack a metric: retry with the essential ones
            command = ncu_command(ncu, kernel_names, metrics, str(script), args)
            remaining = max(10.0, timeout_s - (time.perf_counter() - started))
            log(f"[profile_ncu] retrying with the core metrics only: {' '.join(command)}")
            returncode, out, err = run_ncu_command(command, remaining, str(root))
    parsed = pd.DataFrame()
    if returncode == 0:
        try:
            parsed = parse_ncu_csv(out)
        except Exception as exc:
            log(f"[profile_ncu] could not parse ncu's CSV ({error_text(exc, 300)}): nothing recorded")
            return None
    if returncode != 0 or parsed.empty:
        reason = ncu_failure_reason(returncode, out, err, timeout_s) if returncode != 0 else \
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
