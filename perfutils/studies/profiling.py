"""Where a training step's time goes (notebook 08): the step profile and the Nsight Compute run, recorded.

Two measurements, both GPU only, both recorded so that the notebook replays them on a CPU::

    python -m perfutils profiling --out data/   # profile_kernels.csv (+ profile_ncu.csv if ncu works), < 3 min

* :func:`measure_profile`: one loss forward + backward (cross-entropy with labels, bf16 logits,
  4096 x 32768 by default) per variant of ``kernels.entropy_loss_forward_backward`` and for PyTorch
  eager ``cross_entropy`` (bf16 directly, and upcast to fp32 first). Per variant one ``step`` row
  (do_bench time of the whole step, GB/s of the 4 B/element floor, correctness against float64,
  peak memory, the limiting launch's registers/occupancy) and one ``kernel`` row per GPU kernel
  from ``torch.profiler``'s ``key_averages()`` (calls and device time per step, share of the step).
* :func:`perfutils.studies.profile_ncu.measure_ncu`: the loss kernels under Nsight Compute, beside the occupancy
  perfutils predicts from the compiled kernel's registers and shared memory.

The tables and figures of these files are in :mod:`perfutils.plots.profiling`.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from ..model.roofline import loss_cost
from .loss_step import (DEFAULT_TOKENS, DEFAULT_VOCAB, LOGIT_SCALE, TORCH_VARIANTS, key_part, launch_stats, loss_step,
                        make_inputs, step_config)
from .profile_ncu import measure_ncu
from ..measure.profiler import kernel_table
from ..data.schema import config_key
from ..measure.session import CudaBackend, Session, run_studies
from ..measure.sweep_config import TOLERANCE
from ..measure.timing import rel_err

__all__ = ["PROFILE_STUDY", "PRODUCER_COMMAND", "DEFAULT_VARIANTS", "measure_profile", "run_all_gpu", "main"]

PROFILE_STUDY = "profile_kernels"
PRODUCER_COMMAND = "python -m perfutils profiling --out data/"
DEFAULT_VARIANTS = ("fused", "two_pass", "split_row", "auto")


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
    for name, value in (("tokens", tokens), ("vocab", vocab), ("steps", steps)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    backend = backend or CudaBackend(producer=PRODUCER_COMMAND)
    device = backend.device
    all_variants = list(variants) + list(torch_variants)
    parameters = {"tokens": tokens, "vocab": vocab, "variants": all_variants, "steps": steps, "seed": seed,
                  "dtype": "bf16", "loss": "cross_entropy", "target_format": "labels", "logit_scale": LOGIT_SCALE,
                  "warmup_ms": getattr(backend, "warmup_ms", None), "rep_ms": getattr(backend, "rep_ms", None)}
    session = Session(PROFILE_STUDY, out_dir, backend, parameters=parameters, copy_gbps=copy_gbps,
                      metadata=metadata, overwrite=overwrite, log=log)
    copy = session.copy_gbps
    bytes_min = int(loss_cost("cross_entropy", "labels", tokens, vocab, 2).bytes)
    tolerance = TOLERANCE["bf16"]
    pending = [v for v in all_variants if config_key(step_config(v, tokens, vocab, None, None)) + ";row=step" not in session.done]
    if not pending:
        return session.finish()

    logits, labels = make_inputs(tokens, vocab, device, seed)
    import kernels

    ref_loss, ref_grad = kernels.reference.entropy_loss_forward_backward(logits, labels, loss="cross_entropy",
                                                                         target_format="labels")
    ref_loss, ref_grad = ref_loss.detach(), ref_grad.detach()

    for variant in pending:
        base = step_config(variant, tokens, vocab, None, None)
        step_key = config_key(base) + ";row=step"

        def measure(variant=variant, base=base, step_key=step_key):
            step, plan = loss_step(variant, logits, labels)
            (loss, grad), compile_ms = backend.first_call(step)
            err = max(rel_err(loss.reshape(()).float(), ref_loss.to(loss.device)), rel_err(grad, ref_grad))
            del loss, grad
            timing = backend.bench(step)
            # A plan allocates its gradient and workspaces up front: count them with what run() allocates.
            peak = backend.peak_bytes(step) + (plan.buffer_bytes if plan is not None else 0)
            by_name, limiting, launches = launch_stats(plan, getattr(backend, "cc", None))
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
                    "config_key": f"{step_key[:-len(';row=step')]};row=kernel;kernel={key_part(event['kernel'])}",
                })
            if table.empty:
                step_row["stats_error"] = "torch.profiler recorded no GPU kernel events"
            return rows

        session.record_rows(step_key, base, measure)
        backend.release()
    del logits, labels, ref_loss, ref_grad
    backend.release()
    return session.finish()


def run_all_gpu(out_dir: str | os.PathLike = "data", *, overwrite: bool = False, ncu_timeout_s: float = 150.0,
                log: Callable[[str], Any] = print) -> list[Path]:
    """Everything notebook 08 replays: profile_kernels.csv, and profile_ncu.csv when ncu works."""
    return run_studies([functools.partial(measure_profile, out_dir, overwrite=overwrite),
                        functools.partial(measure_ncu, out_dir, overwrite=overwrite, timeout_s=ncu_timeout_s)],
                       PRODUCER_COMMAND, log)


# Command line
# ================================================================================================


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m perfutils profiling",
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

