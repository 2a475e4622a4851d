"""A split-row plan's step, counted offline (perfutils.model.offline_counts), read back (perfutils.model.step_counts)
and used by the model: CPU only."""

from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from perfutils.model import offline_counts, predict, step_counts
from perfutils.model.predict import DEFAULT_CONSTANTS, KernelPass, exchange_wait, step_seconds, with_step_counts

DATA = Path(__file__).resolve().parent.parent / "data"


def test_a_key_ignores_options_that_leave_the_code_alone():
    key = step_counts.step_key("forward_kl", "logits", "bf16", 32000, 4096, 4, {"maxnreg": None, "schedule": "lagged"})
    assert key == ("forward_kl", "logits", "bf16", 32000, 4096, 4, 0, False, 0, True)
    capped = step_counts.step_key("forward_kl", "logits", "bf16", 32000, 4096, 4, {"maxnreg": 96.0, "fast_math": False})
    assert capped[6] == 96 and capped[9] is False


def test_the_count_is_the_kernels_own_step():
    """A wider chunk adds per-element work to a step, not per-step work: the same kernel at twice the chunk counts
    more instructions a step, and fewer than twice as many (a part of the step does not grow with the chunk)."""
    narrow = offline_counts.count_lagged_step(("forward_kl", "logits", "bf16", 32000, 2048, 4, 0, False, 0, True))
    wide = offline_counts.count_lagged_step(("forward_kl", "logits", "bf16", 32000, 4096, 4, 0, False, 0, True))
    assert narrow["nested"] > 0  # the poll
    assert narrow["step"] < wide["step"] < 2 * narrow["step"]


@pytest.mark.parametrize("gpu_dir", ["h100-sxm-80gb", "h200"])
def test_every_recorded_lagged_plan_is_counted(gpu_dir):
    """The committed counts file holds every key the folder's records need, each compiled (status ok), and the model
    gives every lagged pass its count."""
    folder = DATA / gpu_dir
    counts = step_counts.load_step_counts(folder)
    assert set(offline_counts.lagged_step_keys(folder)) <= set(counts)
    frame = pd.read_csv(step_counts.counts_path(folder))
    assert set(frame["status"]) == {"ok"}
    lagged = [p for c in predict.load_configurations(folder) for p in c.passes if p.step_key]
    assert lagged and all(p.instructions_per_step == counts[p.step_key] for p in lagged)


@pytest.mark.parametrize("gpu_dir", ["h100-sxm-80gb", "h200"])
def test_every_recorded_two_gpu_plan_has_its_exchange_kernel_counted(gpu_dir):
    """Each GPU's two-GPU symmetric rows each run the exchange kernel on their slice: the committed exchange counts
    hold every such key, compiled, and a count is that kernel's own (a compile made now gives the same step); the
    distribution losses' kernel, five words a summary, takes more instructions a step than labels CE's three."""
    folder = DATA / gpu_dir
    keys = offline_counts.exchange_step_keys(folder)
    counts = step_counts.load_exchange_counts(folder)
    assert keys and set(keys) <= set(counts)
    assert set(pd.read_csv(step_counts.counts_path(folder, step_counts.EXCHANGE_STUDY))["status"]) == {"ok"}
    labels = ("cross_entropy", "labels", "bf16", 65536, 4096, 4, 2, 2)
    assert offline_counts.count_exchange_step(labels)["step"] == counts[labels]
    assert counts[("forward_kl", "logits", "bf16", 65536, 4096, 4, 2, 2)] > counts[labels]


def test_the_exchange_wait_counts_only_in_a_counted_lagged_step():
    kp = KernelPass("split_row.lagged", programs=1056, tile=4096, num_warps=4, resident=4, steps=64,
                    load_bytes_per_step=16384, dram_bytes=1e9, inputs=2, tiles_per_step=2,
                    step_key=("forward_kl", "logits", "bf16", 32000, 4096, 4, 0, False, 0, True))
    k = replace(DEFAULT_CONSTANTS, exchange_round_trip_ns=500.0)
    assert exchange_wait(kp, k) == 0.0  # estimated: its constant absorbed the wait
    counted = with_step_counts(predict.LaunchConfig("s", "c", "plan", "forward_kl", "logits", 4096, 32000, "bf16",
                                                    passes=(kp,)), {kp.step_key: 1196.0}).passes[0]
    assert counted.instructions_per_step == 1196.0
    assert exchange_wait(counted, k) == pytest.approx(500e-9)
    assert exchange_wait(replace(counted, tiles_per_step=1), k) == 0.0
    gpu = predict.gpu_from_folder(DATA / "h200")
    assert step_seconds(counted, gpu, k) > step_seconds(counted, gpu, replace(k, exchange_round_trip_ns=0.0))
