"""Baselines measured beside the project's kernels, behind the same ``prepare(...) -> plan`` interface.

``eager`` and ``torch_compile`` compute the loss in fp32 with PyTorch's own functions
(``F.cross_entropy``, ``F.kl_div``) and get the gradient from autograd, as a training script would;
``liger`` is Liger-Kernel's fused cross-entropy (labels only; it is measured when the package is
installed). Their plans have no Triton launches, so the per-kernel columns stay empty.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

PROVIDERS = ("eager", "torch_compile", "liger")
# Variants whose prepare lives in its own module, by name prefix: Fast-LLM's kernels run from a checkout
# ("fast_llm", "fast_llm_<commit>") and the case study's ablation kernels ("case497.<step>").
PROVIDER_MODULES = {"fast_llm": "perfutils.measure.fast_llm", "case497.": "kernels.case_study.ablation"}


@dataclass
class TorchPlan:
    variant: str
    step: Callable[[], tuple[Any, Any]]
    launches: list = field(default_factory=list)
    config: dict = field(default_factory=dict)

    def run(self):
        return self.step()


def torch_loss_fn(loss: str, target_format: str, ignore_index: int = -100) -> Callable:
    import torch.nn.functional as F

    def fn(x, t):
        xf = x.float()
        if target_format == "labels":
            return F.cross_entropy(xf, t, ignore_index=ignore_index)
        tf = t.float()
        if loss == "cross_entropy":
            return F.cross_entropy(xf, tf.softmax(-1))
        if loss == "forward_kl":
            return F.kl_div(xf.log_softmax(-1), tf.log_softmax(-1), reduction="batchmean", log_target=True)
        if loss == "reverse_kl":
            return F.kl_div(tf.log_softmax(-1), xf.log_softmax(-1), reduction="batchmean", log_target=True)
        raise ValueError(f"unknown loss {loss!r}")

    return fn


_COMPILED: dict = {}


def liger_available() -> bool:
    try:
        import liger_kernel  # noqa: F401
    except Exception:
        return False
    return True


def prepare(logits, target, *, loss="cross_entropy", target_format="labels", variant="auto", ignore_index=-100, **options):
    """kernels.prepare for the project's variants; a TorchPlan for the baselines in PROVIDERS."""
    module = next((m for prefix, m in PROVIDER_MODULES.items() if str(variant).startswith(prefix)), None)
    if module is not None:
        import importlib

        return importlib.import_module(module).prepare(logits, target, loss=loss, target_format=target_format,
                                                       variant=variant, ignore_index=ignore_index, **options)
    if variant not in PROVIDERS:
        import kernels

        return kernels.prepare(logits, target, loss=loss, target_format=target_format, variant=variant,
                               ignore_index=ignore_index, **options)
    if options.get("block_size") is not None or options.get("num_warps") is not None:
        raise ValueError(f"provider {variant!r} takes no block_size/num_warps")
    import torch

    fn = torch_loss_fn(loss, target_format, ignore_index)
    if variant == "torch_compile":
        # One compilation per shape, from a clean Dynamo state: recompiling one function for many shapes
        # hits Dynamo's recompile limit, after which it silently runs eager (seen in an earlier benchmark).
        key = (loss, target_format, ignore_index, tuple(logits.shape), logits.dtype, target.dtype)
        if key not in _COMPILED:
            torch._dynamo.reset()
            _COMPILED.clear()
            _COMPILED[key] = torch.compile(fn, dynamic=False)
        fn = _COMPILED[key]
    elif variant == "liger":
        if target_format != "labels":
            raise ValueError("liger is measured for cross-entropy from labels only (its fused CE takes labels)")
        from liger_kernel.transformers import LigerCrossEntropyLoss

        fn = LigerCrossEntropyLoss(ignore_index=ignore_index)
    x = logits.detach().clone().requires_grad_(True)  # a copy: some baselines write the gradient in place

    def step():
        x.grad = None
        value = fn(x, target)
        value.backward()
        return value.detach(), x.grad

    if variant == "torch_compile":
        return TorchPlan(variant, _first_call_with_torch_ptxas(step))
    return TorchPlan(variant, step)


def _first_call_with_torch_ptxas(step):
    """Compile (on the first call) with the ptxas torch.compile uses by default: torch's own.

    The harness pins Triton's bundled ptxas for the project's kernels (perfutils.model.cuda_tools.
    pin_bundled_ptxas); Inductor would inherit that pin, which is not how torch.compile runs for users
    (on the H100 its cross-entropy kernels ran about 2x slower with Triton 3.6's ptxas 12.8).
    """
    import os
    from pathlib import Path

    import torch

    torch_ptxas = Path(torch.__file__).parent / "bin" / "ptxas"
    compiled = False

    def first_call_then_step():
        nonlocal compiled
        if compiled or not torch_ptxas.is_file():
            return step()
        saved = os.environ.get("TRITON_PTXAS_PATH")
        os.environ["TRITON_PTXAS_PATH"] = str(torch_ptxas)
        try:
            return step()
        finally:
            compiled = True
            if saved is None:
                os.environ.pop("TRITON_PTXAS_PATH", None)
            else:
                os.environ["TRITON_PTXAS_PATH"] = saved

    return first_call_then_step
