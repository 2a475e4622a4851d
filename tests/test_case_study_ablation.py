"""The case study's ablation kernels (perfutils.lab_kernels.case_study.ablation): every step and every switch combination
computes reverse KL and its gradient, against the float64 reference, on irregular shapes.

Under the Triton interpreter on a CPU (conftest.py); the unrolled (SHAPE_CONSTEXPR) forms get small rows so
the unrolled tile walk stays quick. Offline sm_90 compiles of the steps are in test_fast_llm.py's neighbour
``perfutils.studies.case_497.ablation_offline_rows`` (not run here: compiles take minutes on this machine).
"""

from __future__ import annotations

import itertools

import pytest
import torch

import kernels
from kernels import reference
from perfutils.lab_kernels.case_study import ablation
from kernels.problem import build_problem
from perfutils.measure import providers

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2}

# (rows, vocab, block_size): several tiles with a partial last one, a row narrower than its tile, an exact
# multiple of the tile, a row of one column.
SHAPES = [(3, 300, 64), (4, 50, 64), (2, 256, 64), (3, 1, 16)]
COMBINATIONS = list(itertools.product([False, True], repeat=len(ablation.SWITCHES)))


def rel_err(actual, expected) -> float:
    """||a - b|| / ||b||; the absolute error where b is exactly 0 (a one-column row has KL 0)."""
    a, b = actual.detach().double().cpu(), expected.detach().double().cpu()
    diff, norm = torch.linalg.vector_norm(a - b).item(), torch.linalg.vector_norm(b).item()
    return diff / norm if norm > 0 else diff


def inputs(gen, rows, vocab, dtype, *, stride_pad=0):
    x = torch.randn(rows, vocab + stride_pad, generator=gen, dtype=torch.float64) * 3
    t = torch.randn(rows, vocab + stride_pad, generator=gen, dtype=torch.float64) * 3
    return x.to(dtype)[:, :vocab], t.to(dtype)[:, :vocab]


def check(plan, x, t, dtype, label):
    loss, grad = plan.run()
    ref_loss, ref_grad = reference.entropy_loss_forward_backward(x, t, loss="reverse_kl", target_format="logits")
    assert grad.dtype == x.dtype and tuple(grad.shape) == tuple(x.shape)
    assert loss.dtype == torch.float32 and loss.dim() == 0
    assert rel_err(loss, ref_loss) <= TOLERANCE[dtype], f"{label}: loss {loss.item()} vs {ref_loss.item()}"
    assert rel_err(grad, ref_grad) <= TOLERANCE[dtype], f"{label}: grad rel err {rel_err(grad, ref_grad):.3g}"


def custom_step(flags, num_stages=1):
    switches = frozenset(name for name, on in zip(ablation.SWITCHES, flags) if on)
    return ablation.Step("custom", switches, num_stages, "")


@pytest.mark.parametrize("flags", COMBINATIONS, ids=["".join("1" if f else "0" for f in c) for c in COMBINATIONS])
@pytest.mark.parametrize("rows, vocab, block_size", SHAPES, ids=[f"{r}x{v}-b{b}" for r, v, b in SHAPES])
def test_every_switch_combination(flags, rows, vocab, block_size, gen):
    dtype = torch.float32
    x, t = inputs(gen, rows, vocab, dtype, stride_pad=5)  # row strides != vocab: strides are honoured
    problem = build_problem(x, t, loss="reverse_kl", target_format="logits", grad_output=1.0, ignore_index=-100,
                            loss_mask=None)
    plan = ablation.plan_step(custom_step(flags), problem, block_size, 4)
    assert [launch.name for launch in plan.all_launches] == ["prologue", "case497.custom"]
    loss, grad = plan.run()
    ref_loss, ref_grad = reference.entropy_loss_forward_backward(x, t, loss="reverse_kl", target_format="logits")
    assert rel_err(loss, ref_loss) <= 1e-5
    assert rel_err(grad, ref_grad) <= 1e-5


@pytest.mark.parametrize("variant", ablation.VARIANTS)
def test_named_steps_through_the_harness(variant, gen):
    """Every named step (and solo) through perfutils.providers.prepare, in bf16 as measured on the GPU."""
    x, t = inputs(gen, 3, 333, torch.bfloat16)
    plan = providers.prepare(x, t, loss="reverse_kl", target_format="logits", variant=variant, block_size=128,
                             num_warps=4)
    assert plan.variant == variant and len(plan.launches) == 1
    check(plan, x, t, torch.bfloat16, variant)


def test_steps_walk_from_497_to_fused():
    steps = ablation.STEPS
    assert steps[0].switches == frozenset(ablation.SWITCHES) and steps[0].num_stages == 3
    assert steps[-1].switches == frozenset() and steps[-1].num_stages == 1 and ablation.FINAL_VARIANT == "fused"
    for before, after in zip(steps, steps[1:]):
        changed = (before.switches ^ after.switches, before.num_stages != after.num_stages)
        assert len(changed[0]) + changed[1] == 1, f"{after.name} must remove exactly one difference"
        assert after.removes
    assert all(len(ablation.STEPS[0].switches - solo.switches) == 1 for solo in ablation.SOLO)


def test_defaults_are_497s_launch():
    assert ablation.default_config(32768) == (32768, 16)
    assert ablation.default_config(131072) == (32768, 16)
    assert ablation.default_config(1000) == (1024, 4)
    assert ablation.default_config(4096) == (4096, 8)


def test_final_step_matches_fused_launch_arguments(gen):
    """The last ablation step runs the same math as kernels.fused on the same launch (tile, warps), up to fp32
    rounding: since ae031fd kernels.fused summarises and differentiates a row of several tiles from the raw tiles
    (row_math.tile_statistics_raw, scaled_gradient), the ablation kernels from the base-2 ones."""
    x, t = inputs(gen, 2, 200, torch.float32)
    fused = kernels.prepare(x, t, loss="reverse_kl", target_format="logits", variant="fused", block_size=64,
                            num_warps=4)
    step = providers.prepare(x, t, loss="reverse_kl", target_format="logits", variant=ablation.STEPS[-1].variant,
                             block_size=64, num_warps=4)
    (fused_loss, fused_grad), (step_loss, step_grad) = fused.run(), step.run()
    assert rel_err(step_loss, fused_loss) <= 1e-5 and rel_err(step_grad, fused_grad) <= 1e-5
    assert step.launches[0].num_stages == fused.launches[0].num_stages == 1


@pytest.mark.parametrize("bad, match", [
    (dict(variant="case497.nope"), "unknown ablation variant"),
    (dict(loss="cross_entropy"), "reverse KL"),
    (dict(block_size=100), "power of two"),
    (dict(num_warps=3), "num_warps"),
    (dict(grad_output=None), "gradient"),
    (dict(split=True), "takes no option"),
])
def test_argument_errors(bad, match, gen):
    x, t = inputs(gen, 2, 40, torch.float32)
    options = {**dict(loss="reverse_kl", target_format="logits", variant="case497.step0"), **bad}
    with pytest.raises((ValueError, TypeError), match=match):
        ablation.prepare(x, t, **options)
