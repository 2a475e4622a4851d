"""One loss forward + backward per variant, the way notebook 08 profiles it: inputs, the step, its launches.

A variant is one of ``kernels.prepare``'s (fused, two_pass, split_row, auto; the step is ``Plan.run``) or a PyTorch
baseline (``torch_eager``, ``torch_eager_fp32``). :func:`launch_stats` describes a plan's launches (registers,
occupancy) and picks the limiting one. Shared by the step profile (:mod:`perfutils.studies.profiling`) and the
Nsight Compute run (:mod:`perfutils.studies.profile_ncu`).
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable

import torch

from ..model.compiled_kernel import kernel_stats

__all__ = ["DEFAULT_TOKENS", "DEFAULT_VOCAB", "TORCH_VARIANTS", "LOGIT_SCALE", "make_inputs", "loss_step",
           "launch_stats", "step_config", "key_part"]

DEFAULT_TOKENS = 4096
DEFAULT_VOCAB = 32768
TORCH_VARIANTS = ("torch_eager", "torch_eager_fp32")
LOGIT_SCALE = 2.0


def make_inputs(tokens: int, vocab: int, device: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """bf16 logits (standard normal x LOGIT_SCALE) and int64 labels, reproducible from ``seed``."""
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


def launch_stats(plan: Any, cc) -> tuple[dict[str, dict[str, Any]], dict[str, Any], list[dict[str, Any]]]:
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


def step_config(variant: str, tokens: int, vocab: int, block_size, num_warps) -> dict[str, Any]:
    """The configuration columns of a profiled step (cross-entropy from labels, bf16)."""
    return {"loss": "cross_entropy", "target_format": "labels", "variant": variant, "dtype": "bf16",
            "tokens": tokens, "vocab": vocab, "block_size": block_size, "num_warps": num_warps}


def key_part(text: str) -> str:
    """``text`` made safe for a config key (no ``;``, ``=`` or newline), at most 200 characters."""
    return re.sub(r"[;=\n]", "_", text)[:200]
