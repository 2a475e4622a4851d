"""Everything a study times, behind one ``prepare(logits, target, ...) -> plan`` interface (``plan.run() -> (loss, grad)``).

* The project's kernels alone: a variant of ``kernels.prepare`` (``fused``, ``two_pass``, ``split_row``, ``auto``),
  and ``plan``: ``kernels.prepare(..., variant="auto")``, the kernel-only plan of what the public call runs.
* What users call: ``public`` (``kernels.entropy_loss_forward_backward``, variant auto, grad_output 1.0) and
  ``public_autograd`` (``kernels.entropy_loss`` on a leaf that requires grad, then ``.backward()``); their plans
  record, after the first run, which variant and configuration auto chose (``config``).
* Peers: ``eager`` and ``torch_compile`` compute the loss in fp32 with PyTorch's own functions
  (``F.cross_entropy``, ``F.kl_div``) and get the gradient from autograd, as a training script would;
  ``liger`` (Liger-Kernel's fused cross-entropy) and ``quack`` (quack-kernels' ``cross_entropy``) take labels only
  and are measured when their package is installed; ``fast_llm`` runs Fast-LLM's kernels from a checkout
  (:mod:`perfutils.peers.fast_llm`); ``case497.<step>`` are the case study's ablation kernels.

Peers' plans have no Triton launches the harness can read, so the per-kernel columns stay empty for them.
:func:`unavailable` says why a provider cannot run here, :func:`supports` which losses it computes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable

PROVIDERS = ("eager", "torch_compile", "liger", "quack", "public", "public_autograd", "plan")
LABELS_ONLY = ("liger", "quack")  # fused cross-entropy from labels: no target distributions
KERNEL_ONLY = ("plan",)  # timed without the public entry points' host work
# Variants whose prepare lives in its own module, by name prefix: Fast-LLM's kernels run from a checkout
# ("fast_llm", "fast_llm_<commit>") and the case study's ablation kernels ("case497.<step>").
PROVIDER_MODULES = {"fast_llm": "perfutils.peers.fast_llm", "case497.": "perfutils.lab_kernels.case_study.ablation"}
# Python packages that the optional peers come from, and their distributions' names (for the version).
PACKAGES = {"liger": "liger_kernel", "quack": "quack.cross_entropy"}
DISTRIBUTIONS = {"liger": "liger-kernel", "quack": "quack-kernels"}


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


def _importable(module: str) -> bool:
    import importlib

    try:
        importlib.import_module(module)
    except Exception:
        return False
    return True


def _module_of(variant: str) -> str | None:
    return next((m for prefix, m in PROVIDER_MODULES.items() if str(variant).startswith(prefix)), None)


def unavailable(variant: str) -> str | None:
    """Why ``variant`` cannot run in this environment (None: it can, as far as can be told without a GPU run)."""
    if variant in PACKAGES and not _importable(PACKAGES[variant]):
        return f"{PACKAGES[variant].split('.')[0]} is not importable here"
    if str(variant).startswith("fast_llm"):
        from ..peers import fast_llm

        try:
            fast_llm.load(fast_llm.find_checkout(variant))
        except (FileNotFoundError, ImportError, ValueError) as exc:
            return str(exc)
    return None


def peer_source(variant: str) -> dict:
    """Where an optional peer's code came from, for its rows' ``plan_config``: the package's folder, the commit of
    the source tree it was extracted from (a ``COMMIT`` file in the package's folder or up to three folders above
    it, as ``fast_llm.extract_checkout`` writes one) and the installed distribution's version (None when it was
    not installed, only put on the path)."""
    import importlib
    import importlib.metadata
    from pathlib import Path

    from ..peers.fast_llm import COMMIT_FILE, checkout_commit

    package = importlib.import_module(PACKAGES[variant].split(".")[0])
    folder = Path(package.__file__).resolve().parent
    commit = None
    for candidate in [folder, *folder.parents][:4]:
        if (candidate / COMMIT_FILE).is_file():
            commit = checkout_commit(candidate)
            break
    try:
        version = importlib.metadata.version(DISTRIBUTIONS[variant])
    except importlib.metadata.PackageNotFoundError:
        version = None
    try:
        shown = folder.relative_to(Path.cwd())  # a checkout under the repository, as Fast-LLM's path is written
    except ValueError:
        shown = folder
    return {f"{variant}_path": str(shown), f"{variant}_commit": commit, f"{variant}_version": version}


def supports(variant: str, loss: str, target_format: str) -> bool:
    """Whether ``variant`` computes this loss (the project's entry points compute every valid pair)."""
    if variant in LABELS_ONLY:
        return (loss, target_format) == ("cross_entropy", "labels")
    if str(variant).startswith("fast_llm"):
        from ..peers import fast_llm

        try:
            return fast_llm.load(fast_llm.find_checkout(variant)).supports(loss, target_format)
        except (FileNotFoundError, ImportError, ValueError):
            return True  # cannot tell: unavailable() reports it, or the row records the error
    if str(variant).startswith("case497."):
        return (loss, target_format) == ("reverse_kl", "logits")
    return True


def auto_choice(logits, target, *, loss: str, target_format: str, grad_output=1.0, ignore_index: int = -100) -> dict:
    """What variant ``auto`` runs for this call, and from where (``source``: first-call search, tuning table,
    heuristic): ``kernels.autotune.choose_config`` on the call's checked problem. After a first call of the shape
    this is a lookup of auto's remembered choice (no timing, nothing allocated)."""
    from kernels.autotune import choose_config
    from kernels.problem import build_problem

    problem = build_problem(logits, target, loss=loss, target_format=target_format, grad_output=grad_output,
                            ignore_index=ignore_index, loss_mask=None)
    choice = choose_config(problem, variant="auto")
    return {"variant": choice.variant, "block_size": choice.block_size, "num_warps": choice.num_warps,
            "options": dict(choice.options), "source": choice.source}


def _entry_point_plan(variant: str, call: Callable[[], tuple[Any, Any]], describe: Callable[[], dict]) -> TorchPlan:
    """A plan that runs ``call`` and, after its first run, records ``describe()`` as its config."""
    plan = TorchPlan(variant, call)

    def first_run():
        result = call()
        plan.config.update(describe())
        plan.step = call  # later runs: the call alone
        return result

    plan.step = first_run
    return plan


def _prepare_project(logits, target, *, loss, target_format, variant, ignore_index, options):
    import kernels

    if variant not in ("public", "public_autograd", "plan"):
        return kernels.prepare(logits, target, loss=loss, target_format=target_format, variant=variant,
                               ignore_index=ignore_index, **options)
    given = sorted(k for k, v in options.items() if v is not None)
    if given:
        raise ValueError(f"provider {variant!r} runs variant auto as users call it; it takes no {given}")

    def describe():
        return auto_choice(logits, target, loss=loss, target_format=target_format, ignore_index=ignore_index)

    if variant == "plan":
        plan = kernels.prepare(logits, target, loss=loss, target_format=target_format, variant="auto",
                               ignore_index=ignore_index)
        plan.config = {**describe(), **plan.config}  # the planner's resolved numbers win over the choice's
        return plan
    if variant == "public":
        def call():
            return kernels.entropy_loss_forward_backward(logits, target, loss=loss, target_format=target_format,
                                                         variant="auto", grad_output=1.0, ignore_index=ignore_index)
    else:
        x = logits.detach().requires_grad_(True)  # a leaf sharing the logits' memory: the kernels never write it

        def call():
            x.grad = None
            value = kernels.entropy_loss(x, target, loss=loss, target_format=target_format, variant="auto",
                                         ignore_index=ignore_index)
            value.backward()
            return value.detach(), x.grad

    return _entry_point_plan(variant, call, describe)


def prepare(logits, target, *, loss="cross_entropy", target_format="labels", variant="auto", ignore_index=-100, **options):
    """A plan for ``variant``: kernels.prepare for the project's variants, the entry points and peers above."""
    module = _module_of(variant)
    if module is not None:
        import importlib

        return importlib.import_module(module).prepare(logits, target, loss=loss, target_format=target_format,
                                                       variant=variant, ignore_index=ignore_index, **options)
    if variant not in PROVIDERS or variant in ("public", "public_autograd", "plan"):
        return _prepare_project(logits, target, loss=loss, target_format=target_format, variant=variant,
                                ignore_index=ignore_index, options=options)
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
    elif variant in LABELS_ONLY:
        if target_format != "labels":
            raise ValueError(f"{variant} is measured for cross-entropy from labels only (its fused CE takes labels)")
        if variant == "liger":
            from liger_kernel.transformers import LigerCrossEntropyLoss

            fn = LigerCrossEntropyLoss(ignore_index=ignore_index)
        else:
            from quack.cross_entropy import cross_entropy

            def fn(x, t):
                return cross_entropy(x, t, ignore_index=ignore_index)  # mean over rows whose label counts
    x = logits.detach().clone().requires_grad_(True)  # a copy: some baselines write the gradient in place

    def step():
        x.grad = None
        value = fn(x, target)
        value.backward()
        return value.detach(), x.grad

    if variant == "torch_compile":
        return TorchPlan(variant, _first_call_with_torch_ptxas(step))
    return TorchPlan(variant, step, config=peer_source(variant) if variant in LABELS_ONLY else {})


def _first_call_with_torch_ptxas(step):
    """Compile (on the first call) with the ptxas torch.compile uses by default: torch's own.

    The harness pins Triton's bundled ptxas for the project's kernels (perfutils.model.cuda_tools.
    pin_bundled_ptxas); Inductor would inherit that pin, which is not how torch.compile runs for users
    (on the H100 its cross-entropy kernels ran about 2x slower with Triton 3.6's ptxas 12.8).
    """
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
