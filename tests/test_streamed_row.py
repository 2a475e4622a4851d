"""perfutils.lab_kernels.streamed_row (issue 39's explorations of loads through TMA): both kernels' four losses against
the float64 reference (rows over several chunks with a last partial one; rows in one tile), and the inputs refused."""

import os

import torch

if not torch.cuda.is_available():  # must precede the first import of triton's @jit kernels
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from kernels import reference  # noqa: E402
from perfutils.lab_kernels.streamed_row import resident_tma_loss, streamed_row_loss  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CASES = [("cross_entropy", "labels"), ("forward_kl", "logits"), ("reverse_kl", "logits"), ("cross_entropy", "logits")]


@pytest.mark.parametrize("loss,target_format", CASES)
@pytest.mark.parametrize("rows,columns,block", [(5, 40, 16), (3, 64, 16), (4, 104, 32), (7, 40, None)])
def test_matches_float64(loss, target_format, rows, columns, block):
    generator = torch.Generator().manual_seed(rows * columns + (block or 0))
    logits = (torch.randn(rows, columns, generator=generator) * 3).to(DEVICE)
    target = (torch.randint(0, columns, (rows,), generator=generator) if target_format == "labels"
              else torch.randn(rows, columns, generator=generator) * 3).to(DEVICE)
    if block is None:  # the resident kernel: a row in one tile, programs walking rows
        value, grad = resident_tma_loss(logits, target, loss=loss, target_format=target_format, num_warps=1,
                                        programs_per_sm=3, grad_output=0.5)
    else:
        value, grad = streamed_row_loss(logits, target, loss=loss, target_format=target_format, block=block,
                                        stages=2, num_warps=1, grad_output=0.5)
    logits64 = logits.double().requires_grad_()
    expected = reference.entropy_loss(logits64, target if target_format == "labels" else target.double(), loss=loss,
                                      target_format=target_format)
    (0.5 * expected).backward()
    assert float(abs(value.double() - 0.5 * expected.detach())) <= 1e-5 * max(1.0, float(abs(expected.detach())))
    assert torch.allclose(grad.double(), logits64.grad, rtol=1e-5, atol=1e-7)


def test_refuses_what_it_cannot_stream():
    with pytest.raises(ValueError, match="16-byte aligned"):
        streamed_row_loss(torch.randn(2, 37, device=DEVICE), torch.tensor([1, 2], device=DEVICE))
    with pytest.raises(ValueError, match="must be one of"):
        streamed_row_loss(torch.randn(2, 40, device=DEVICE), torch.tensor([1, 2], device=DEVICE), loss="kl")
    with pytest.raises(ValueError, match="contiguous 2-D"):
        streamed_row_loss(torch.randn(2, 40, device=DEVICE).t(), torch.randn(40, 2, device=DEVICE),
                          loss="forward_kl", target_format="logits")
