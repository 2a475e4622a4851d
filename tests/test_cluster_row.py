"""perfutils.lab_kernels.cluster_row (issue 39's exploration of a row's programs in one cluster): the kernel compiles
for sm_90 with its exchange through distributed shared memory (offline, no GPU), bad input is refused, and on a GPU
the four losses in its three schedules match the float64 reference (marked ``gpu``)."""

import os

import torch

if not torch.cuda.is_available():  # must precede the first import of triton's @jit kernels
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import triton  # noqa: E402

from kernels import reference  # noqa: E402
from kernels.launch import interpreting  # noqa: E402
from kernels.problem import LOSS_CODES  # noqa: E402
from perfutils.lab_kernels.cluster_row import cluster_row_kernel, cluster_row_loss, cluster_size  # noqa: E402
from perfutils.model.offline_compile import compile_offline  # noqa: E402

CASES = [("cross_entropy", "labels"), ("forward_kl", "logits"), ("reverse_kl", "logits"), ("cross_entropy", "logits")]


def offline(loss, target_format, columns, block, num_warps, **schedule):
    logits = torch.zeros(16, columns, dtype=torch.bfloat16)
    labels = target_format == "labels"
    target = torch.zeros(16, dtype=torch.int64) if labels else torch.zeros_like(logits)
    args = dict(logits_ptr=logits, target_ptr=logits if labels else target, labels_ptr=target if labels else logits,
                grad_ptr=torch.zeros_like(logits), row_loss_ptr=torch.zeros(16), n_rows=16, n_cols=columns, n_slots=7,
                grad_scale=0.5)
    chunks = cluster_size(columns, block)
    constexprs = dict(LOSS=LOSS_CODES[(loss, target_format)], NUM_CHUNKS=chunks,
                      CHUNKS_POW2=triton.next_power_of_2(chunks), BLOCK_SIZE=block, PREFETCH=False, LAGGED=False)
    constexprs.update(schedule)
    return compile_offline(cluster_row_kernel, args, constexprs, num_warps)


@pytest.mark.parametrize("loss,target_format,schedule", [("forward_kl", "logits", {"LAGGED": True}),
                                                          ("cross_entropy", "labels", {"PREFETCH": True})])
def test_compiles_for_sm90_with_its_cluster_exchange(loss, target_format, schedule):
    compiled = offline(loss, target_format, 32000, 4096, 4, **schedule)
    ptx = compiled.ptx
    # the summaries go to this CTA's shared memory and come back from each peer's, around the cluster's barrier
    for instruction in ("st.shared.v4.f32", "barrier.cluster.arrive.release", "barrier.cluster.wait.acquire",
                        "mapa.shared::cluster", "ld.shared::cluster.v4.f32", "%dynamic_smem_size"):
        assert instruction in ptx, instruction
    assert 0 < compiled.n_regs <= 255 and compiled.spill_store_bytes == 0


def test_cluster_size():
    assert cluster_size(32000, 4096) == 8 and cluster_size(50304, 8192) == 7 and cluster_size(131072, 8192) == 16
    for columns, block in ((32000, 1024), (100, 128), (131072, 4096), (90000, 8192)):  # 32, 1, 32, 11 chunks
        with pytest.raises(ValueError, match="cluster takes 2-8 or 16"):
            cluster_size(columns, block)


def test_refuses_bad_input():
    logits, labels = torch.randn(4, 64), torch.randint(0, 64, (4,))
    with pytest.raises(ValueError, match="loss, target_format"):
        cluster_row_loss(logits, labels, loss="kl", target_format="labels")
    with pytest.raises(ValueError, match="contiguous 2-D CUDA"):
        cluster_row_loss(logits, labels, loss="cross_entropy", target_format="labels", block=32)
    with pytest.raises(ValueError, match="needs lagged=True"):
        cluster_row_loss(logits, labels, loss="cross_entropy", target_format="labels", block=32, ablate=2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or interpreting(), reason="needs a CUDA GPU (clusters)")
@pytest.mark.parametrize("loss,target_format", CASES)
@pytest.mark.parametrize("schedule", ["plain", "prefetch", "lagged"])
def test_matches_float64_on_gpu(loss, target_format, schedule):
    generator = torch.Generator(device="cuda").manual_seed(len(schedule))
    rows, columns = 37, 3000  # rows that do not fill the clusters evenly, a last chunk cut short
    logits = torch.randn(rows, columns, generator=generator, device="cuda") * 3
    target = (torch.randint(0, columns, (rows,), generator=generator, device="cuda") if target_format == "labels"
              else torch.randn(rows, columns, generator=generator, device="cuda") * 3)
    value, grad = cluster_row_loss(logits, target, loss=loss, target_format=target_format, block=512, num_warps=4,
                                   prefetch=schedule == "prefetch", lagged=schedule == "lagged", grad_output=0.5)
    logits64 = logits.double().requires_grad_()
    expected = reference.entropy_loss(logits64, target if target_format == "labels" else target.double(), loss=loss,
                                      target_format=target_format)
    (0.5 * expected).backward()
    assert float(abs(value.double() - 0.5 * expected.detach())) <= 1e-5 * max(1.0, float(abs(expected.detach())))
    assert torch.allclose(grad.double(), logits64.grad, rtol=1e-5, atol=1e-7)
