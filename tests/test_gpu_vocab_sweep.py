"""The vocab sweep's GPU-only pieces (skipped without CUDA): PyTorch's sync warnings are what count_syncs counts,
the public call and its kernel-only plan do not synchronize once warm, and one small stage-like run goes through the
real GpuMeasurer with the host-cost columns. Run before the vocab-* stages of scripts/collect_h100.sh."""

from __future__ import annotations

import pytest
import torch

from kernels.autotune import PLANNERS
from perfutils.measure import host_cost, providers
from perfutils.studies import vocab_sweep

pytestmark = pytest.mark.gpu


def test_count_syncs_sees_item_and_not_a_launch():
    x = torch.ones(4, device="cuda")
    assert host_cost.count_syncs(lambda: x.sum().item()) >= 1
    assert host_cost.count_syncs(lambda: x * 2) == 0
    assert torch.cuda.get_sync_debug_mode() == 0  # restored


@pytest.mark.parametrize("variant", ["public", "public_autograd", "plan"])
@pytest.mark.parametrize("loss, fmt", [("cross_entropy", "labels"), ("reverse_kl", "logits")])
def test_entry_points_do_not_synchronize_once_warm(variant, loss, fmt):
    logits, target = host_cost.tiny_inputs(loss, fmt, torch.bfloat16, 32000, rows=64)
    plan = providers.prepare(logits, target, loss=loss, target_format=fmt, variant=variant)
    plan.run()  # the first call may search (it synchronizes while it times candidates)
    torch.cuda.synchronize()
    assert host_cost.count_syncs(plan.run) == 0
    assert plan.config["variant"] in PLANNERS and plan.config["source"]  # a variant named by its kernel


def test_a_small_stage_through_the_gpu_measurer(tmp_path):
    stage = vocab_sweep.Stage("gpu-test", "project", vocab_sweep.PROJECT, 512, (32000, 50257),
                              losses=(("cross_entropy", "labels"), ("forward_kl", "logits")))
    frame = vocab_sweep.run_stage(stage, out=str(tmp_path), budget_minutes=5)
    assert len(frame) == 2 * 2 * 3 and set(frame["status"]) == {"ok"}, frame[["variant", "status", "error"]]
    assert (frame["syncs_per_call"] == 0).all() and (frame["host_us_per_call"] > 0).all()
    assert frame.loc[frame["variant"] == "plan", "kernel_only"].all()
