"""Every ceiling kernel computes what its byte/op count claims, under the Triton interpreter.

No timing here: a benchmark kernel that silently skips work reports a fake ceiling, so the
checks are on output values (the copy copies, partial sums add up, the FMA and exp2 chains match
their closed form / float64 recurrence).
"""

from __future__ import annotations

import os

# Must precede the first import of a module that defines @triton.jit kernels.
os.environ["TRITON_INTERPRET"] = "1"

import importlib  # noqa: E402
import math  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

import perfutils.lab_kernels.microbench as microbench  # noqa: E402
from perfutils.studies import ceilings  # noqa: E402
from perfutils.model.roofline import ceilings_from_records  # noqa: E402

# The interpreter turns a runtime loop bound into an int via a 1-element array (NumPy warns).
pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")

if type(microbench.copy_kernel).__name__ != "InterpretedFunction":
    # Another test module imported perfutils.lab_kernels.microbench before the interpreter was switched on;
    # re-decorate its kernels in interpreter mode.
    microbench = importlib.reload(microbench)


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(1234)


def test_copy_kernel_copies_irregular_length(gen):
    src = torch.randn(3 * 64 + 17, generator=gen)
    dst = torch.full_like(src, float("nan"))
    microbench.launch_copy(src, dst, block_size=64, num_warps=1)
    assert torch.equal(dst, src)


def test_read_sum_kernel_partials_add_up(gen):
    src = torch.rand(5 * 4 * 32 + 11, generator=gen) + 0.5
    programs = microbench.read_sum_programs(src.numel(), tiles=4, block_size=32)
    assert programs == 6
    partial = torch.empty(programs)
    microbench.launch_read_sum(src, partial, tiles=4, block_size=32, num_warps=1)
    chunks = torch.nn.functional.pad(src.double(), (0, programs * 128 - src.numel()))
    torch.testing.assert_close(partial.double(), chunks.view(programs, 128).sum(1),
                               rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(partial.double().sum(), src.double().sum(), rtol=1e-6, atol=0)


def test_l2_read_kernel_reads_a_moving_block_each_pass(gen):
    block, n_blocks, programs, passes = 16, 5, 3, 7
    src = torch.rand(n_blocks * block, generator=gen) + 0.5
    out = torch.empty(programs)
    microbench.launch_l2_read(src, out, passes=passes, block_size=block, num_warps=1)
    block_sums = src.double().view(n_blocks, block).sum(1)
    expected = torch.tensor([sum(block_sums[(p + i * programs) % n_blocks].item()
                                 for i in range(passes)) for p in range(programs)],
                            dtype=torch.float64)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="block_size"):
        microbench.launch_l2_read(src[:-1].contiguous(), out, passes=1, block_size=block)


def _fma_closed_form(x: np.ndarray, steps: int, mul: float, add: float) -> np.ndarray:
    # a_N = mul^N a_0 + add (1 - mul^N) / (1 - mul), summed over the chains a_0 = x + j.
    scale = mul ** steps
    return sum(scale * (x + j) + add * (1 - scale) / (1 - mul) for j in range(4))


def test_fma_kernel_matches_closed_form(gen):
    x = torch.rand(2 * 32, generator=gen)
    out = torch.empty_like(x)
    iters, unroll, mul, add = 5, 4, 0.9, 0.1
    microbench.launch_fma(x, out, iters=iters, mul=mul, add=add, block_size=32, unroll=unroll,
                          num_warps=1)
    expected = _fma_closed_form(x.double().numpy(), iters * unroll, mul, add)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5)
    # The flop count the benchmark reports: 2 flops x 4 chains x unroll x iters per element.
    assert 2 * microbench.FMA_CHAINS * unroll * iters * x.numel() == 2 * 4 * 20 * 64


def test_exp2_kernel_matches_recurrence(gen):
    x = torch.rand(2 * 32, generator=gen)
    out = torch.empty_like(x)
    iters, unroll = 3, 4
    microbench.launch_exp2(x, out, iters=iters, scale=-1.0, block_size=32, unroll=unroll,
                           num_warps=1)
    chains = [x.double().numpy() + j / 4 for j in range(4)]
    for _ in range(iters * unroll):
        chains = [np.exp2(-a) for a in chains]
    np.testing.assert_allclose(out.numpy(), sum(chains), rtol=1e-5)
    assert np.all((out.numpy() > 4 * 0.5) & (out.numpy() <= 4.0))  # stays in (0, 1] per chain


def test_launchers_reject_bad_input():
    x = torch.rand(64)
    with pytest.raises(ValueError, match="out"):
        microbench.launch_fma(x, torch.empty(32), iters=1, mul=1.0, add=0.0, block_size=32)
    with pytest.raises(ValueError, match="iters"):
        microbench.launch_exp2(x, torch.empty(64), iters=0, block_size=32)
    with pytest.raises(TypeError, match="src"):
        microbench.launch_copy([1.0], torch.empty(1))
    with pytest.raises(ValueError, match="dst"):
        microbench.launch_copy(x, torch.empty(63))


def test_measure_raises_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("CUDA present: measure_ceilings would really run")
    with pytest.raises(RuntimeError, match="CUDA"):
        ceilings.measure_ceilings()


def test_row_units_and_written_table_round_trip(tmp_path):
    # _row turns a timing into the value column; write_ceilings -> ceilings_from_records.
    copy = ceilings._row("dram_copy_torch", "GB/s", (1.0, 0.9, 1.1), 3_000_000_000, 0, {}, "GPU X")
    assert copy["value"] == pytest.approx(3000.0)
    fma = ceilings._row("fp32_fma", "TFLOP/s", (2.0, 1.9, 2.1), 0, 100_000_000_000, {}, "GPU X")
    assert fma["value"] == pytest.approx(50.0)
    exp2 = ceilings._row("exp2", "Tops/s", (1.0, 1.0, 1.0), 0, 4_000_000_000, {}, "GPU X")
    df = pd.DataFrame([copy, fma, exp2], columns=ceilings.COLUMNS)
    path = ceilings.write_ceilings(df, tmp_path / "gpu-x" / "ceilings.csv", {"note": "test"})
    ceil = ceilings_from_records(path)
    assert (ceil.gpu, ceil.dram_gbps, ceil.fp32_tflops, ceil.exp2_tops) == \
        ("GPU X", pytest.approx(3000.0), pytest.approx(50.0), pytest.approx(4.0))
    assert ceil.l2_gbps is None and not math.isnan(ceil.dram_gbps)
