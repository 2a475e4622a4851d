"""perfutils.lab_kernels.teaching, perfutils.studies.teaching and perfutils.plots.teaching: the teaching kernels (under
TRITON_INTERPRET=1 on a CPU), the measurement pipeline with a fake GPU back end (CSV + JSON through ResultStore),
and the figures."""

import os

import torch

if not torch.cuda.is_available():  # must precede the first import of triton's @jit kernels
    os.environ.setdefault("TRITON_INTERPRET", "1")

import gc  # noqa: E402
import time  # noqa: E402
from types import SimpleNamespace  # noqa: E402

import matplotlib  # noqa: E402

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from perfutils.lab_kernels.teaching import activations, evonorm, label_index, lagged_exchange, softmax, vector_add  # noqa: E402,E501
from kernels import reference  # noqa: E402
from perfutils import notebook  # noqa: E402
from perfutils.studies import teaching as measure  # noqa: E402
from perfutils.model import compiled_kernel  # noqa: E402
from perfutils.plots import teaching as plots  # noqa: E402
from perfutils.plots.figures import save_figure  # noqa: E402
from perfutils.data.records import load_metadata, load_records  # noqa: E402
from perfutils.measure.timing import BenchResult  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
H100 = {"gpu_name": "NVIDIA H100 80GB HBM3", "device": "cuda", "compute_capability": [9, 0], "sm_count": 132}


class FakeBackend:
    """The measurement back end's interface with times from a simple size model; kernels run where the tests run (the
    interpreter on a CPU, the GPU where there is one)."""

    device = DEVICE
    cc = None
    warmup_ms = 1.0
    rep_ms = 1.0

    def _bytes(self, result):
        return result.numel() * 8 if isinstance(result, torch.Tensor) else 1024

    def first_call(self, fn):
        start = time.perf_counter()
        result = fn()
        return result, (time.perf_counter() - start) * 1e3

    def bench(self, fn):
        ms = 0.004 + self._bytes(fn()) / 2.5e12 * 1e3
        return BenchResult(ms, 0.97 * ms, 1.05 * ms)

    def peak_bytes(self, fn):
        return self._bytes(fn()) // 2

    def wall_ms(self, fn):
        return self.bench(fn).ms_median + 0.01

    def copy_gbps(self):
        return 3000.0

    def count_kernels(self, fn):
        fn()
        return 1

    def release(self):
        gc.collect()


def _rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(DEVICE)


# ---- kernels -----------------------------------------------------------------------------------


@pytest.mark.parametrize("n,block_size,num_warps", [(98_765, 1024, 4), (9_876, 256, 2), (9_876, 4096, 8)])
def test_add_irregular_size_matches_torch(n, block_size, num_warps):
    x, y = _rand(n, seed=1), _rand(n, seed=2)
    out = vector_add.add(x, y, block_size=block_size, num_warps=num_warps)
    torch.testing.assert_close(out, x + y, rtol=0, atol=0)


def test_add_writes_nothing_past_the_end():
    x, y = _rand(1000, seed=1), _rand(1000, seed=2)
    buffer = torch.full((1024 + 64,), 7.0, device=DEVICE)
    vector_add.add(x, y, buffer[:1000], block_size=1024)
    assert torch.equal(buffer[1000:], torch.full((88,), 7.0, device=DEVICE))


def test_add_rejects_bad_arguments():
    x = _rand(10)
    with pytest.raises(ValueError, match="match x"):
        vector_add.add(x, _rand(11))
    with pytest.raises(ValueError, match="power of two"):
        vector_add.add(x, x, block_size=1000)
    with pytest.raises(ValueError, match="contiguous"):
        vector_add.add(_rand(4, 4).t(), _rand(4, 4))


def test_mask_stats_of_98765():
    stats = vector_add.mask_stats(98_765, 1024)
    assert stats["programs"] == 97 and stats["full_programs"] == 96
    assert stats["lanes_in_last"] == 98_765 - 96 * 1024 == 461
    assert stats["idle_lanes"] == 97 * 1024 - 98_765 == 563
    assert stats["idle_fraction"] == pytest.approx(563 / (97 * 1024))
    assert vector_add.mask_stats(4096, 1024)["idle_lanes"] == 0


def test_autotune_configs_cover_the_tile_study():
    assert len(vector_add.ADD_TILE_CONFIGS) == 20
    blocks = {b for b, _ in vector_add.ADD_TILE_CONFIGS}
    assert min(blocks) == 256 and max(blocks) == 4096
    assert len(vector_add.add_kernel_autotuned.configs) == 20


@pytest.mark.parametrize("shape", [(37, 781), (5, 33), (3, 1)])
def test_softmax_irregular_shapes(shape):
    x = _rand(*shape, seed=3) * 4
    torch.testing.assert_close(softmax.softmax(x), torch.softmax(x.double(), 1).float(), rtol=1e-5, atol=1e-6)


def test_softmax_strided_rows_and_naive_reference():
    base = _rand(9, 300, seed=4)
    x = base[:, :257]  # row stride 300, 257 columns
    torch.testing.assert_close(softmax.softmax(x), torch.softmax(x, 1), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(softmax.naive_softmax(x), torch.softmax(x, 1), rtol=1e-5, atol=1e-6)


def test_softmax_config_and_bytes():
    assert softmax.softmax_config(781) == (1024, 4)
    assert softmax.softmax_config(16384) == (16384, 16)
    with pytest.raises(ValueError):
        softmax.softmax_config(16385)
    assert softmax.softmax_bytes(1823, 781) == 2 * 1823 * 781 * 4
    assert softmax.naive_softmax_bytes(2, 3, 1) == 8 * 6 + 4 * 2


@pytest.mark.parametrize("name", list(activations.ACTIVATIONS))
def test_activations_match_float64(name):
    x = _rand(5000, seed=5) * 6
    reference = activations.activation_reference(x, name)
    for result in (activations.activation(x, name), activations.activation_eager(x, name), activations.activation_torch_op(x, name)):
        torch.testing.assert_close(result.double(), reference, rtol=1e-5, atol=1e-6)


def test_activation_rejects_unknown_name_and_byte_model():
    with pytest.raises(ValueError, match="activation must be one of"):
        activations.activation(_rand(4), "gelu")
    model = activations.activation_byte_model().set_index(["activation", "variant"])
    assert model.loc[("swish", "eager"), "bytes_per_element"] == 20
    assert model.loc[("sigmoid", "eager"), "kernels"] == 4
    assert model.loc[("swish", "triton"), "bytes_per_element"] == 8
    assert model.loc[("relu", "torch_op"), "peak_buffers"] == 1


def _evonorm_inputs(n=2, c=8, h=5, w=7, seed=6):
    x = _rand(n, c, h, w, seed=seed) * 2 + 0.5
    generator = torch.Generator().manual_seed(seed + 1)
    v, gamma, beta = (torch.randn(c, generator=generator).to(DEVICE) for _ in range(3))
    return x, v, gamma, beta


def test_evonorm_triton_matches_float64_reference():
    x, v, gamma, beta = _evonorm_inputs()
    out = evonorm.evonorm_b0(x, v, gamma, beta, groups=2)
    reference = evonorm.evonorm_b0_torch(x.double(), v.double(), gamma.double(), beta.double(), groups=2)
    torch.testing.assert_close(out.double(), reference, rtol=1e-4, atol=1e-5)


def test_evonorm_reference_follows_its_definition():
    x, v, gamma, beta = _evonorm_inputs(n=1, c=4, h=3, w=3)
    x, v, gamma, beta = (t.double() for t in (x, v, gamma, beta))
    y = evonorm.evonorm_b0_torch(x, v, gamma, beta, groups=2, eps=1e-5)
    n, c, i, j = 0, 3, 1, 2  # channel 3 belongs to group 1 (channels 2, 3)
    var_instance = x[n, c].var(correction=0)
    var_group = x[n, 2:4].var(correction=0)
    denominator = torch.maximum(torch.sqrt(var_group + 1e-5), v[c] * x[n, c, i, j] + torch.sqrt(var_instance + 1e-5))
    assert y[n, c, i, j].item() == pytest.approx((x[n, c, i, j] / denominator * gamma[c] + beta[c]).item(), rel=1e-12)


def test_evonorm_rejects_bad_shapes():
    x, v, gamma, beta = _evonorm_inputs()
    with pytest.raises(ValueError, match="groups"):
        evonorm.evonorm_b0(x, v, gamma, beta, groups=3)
    big = torch.zeros(1, 2, 200, 200, device=DEVICE)
    with pytest.raises(ValueError, match="exceeds"):
        evonorm.evonorm_b0(big, v[:2], gamma[:2], beta[:2], groups=1)


@pytest.mark.parametrize("lane_frame", [False, True])
@pytest.mark.parametrize("with_heads", [False, True])
def test_onehot_gradient_frames_match_reference(lane_frame, with_heads):
    """Both frames of the label test write q - onehot(label): labels on both sides of every 64-column tile boundary
    (counted from each row's head), at the first and last columns, and a label past the row (no one-hot at all)."""
    n_cols = 301
    heads = torch.tensor([0, 3, 7, 1, 5, 0, 2, 6], dtype=torch.int32, device=DEVICE) if with_heads else None
    labels = torch.tensor([0, 3 + 63, 7 + 64, 1 + 128, 5 + 255, n_cols - 1, 400, 6 + 192], device=DEVICE)
    q = _rand(len(labels), n_cols, seed=3)
    out = label_index.onehot_gradient(q, labels, heads, block=64, lane_frame=lane_frame)
    torch.testing.assert_close(out.double(), label_index.onehot_gradient_reference(q, labels, heads), rtol=0, atol=1e-6)


def test_onehot_gradient_rejects_bad_arguments():
    q = _rand(2, 100)
    with pytest.raises(ValueError, match="labels"):
        label_index.onehot_gradient(q, torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ValueError, match="power of two"):
        label_index.onehot_gradient(q, torch.zeros(2, dtype=torch.int64), block=48)
    with pytest.raises(ValueError, match="int32"):
        label_index.onehot_gradient(q, torch.zeros(2, dtype=torch.int64), torch.zeros(2, dtype=torch.int64))
    with pytest.raises(ValueError, match="contiguous"):
        label_index.onehot_gradient(q.t(), torch.zeros(100, dtype=torch.int64, device=DEVICE))
    if DEVICE == "cuda":  # a label tensor left on the CPU: a clear error, not Triton's pointer message
        with pytest.raises(ValueError, match="q's device"):
            label_index.onehot_gradient(q, torch.zeros(2, dtype=torch.int64))


def test_kernel_source_is_the_jit_function():
    source = notebook.kernel_source(vector_add.add_kernel)
    assert "@triton.jit" in source and "def add_kernel" in source and "mask" in source
    assert "def add_kernel" in notebook.kernel_source(vector_add.add_kernel_autotuned)


def test_kernel_stats_from_a_compiled_kernel_stand_in():
    assert set(compiled_kernel.kernel_stats(None).values()) == {None}
    compiled = SimpleNamespace(n_regs=32, n_spills=0,
                               metadata=SimpleNamespace(shared=0, num_warps=4, target=SimpleNamespace(arch=90)))
    stats = compiled_kernel.kernel_stats(compiled)
    assert stats["n_regs"] == 32 and stats["spill_bytes"] == 0 and stats["shared_bytes"] == 0
    # 32 registers x 128 threads: 16 blocks of 4 warps = 64 warps = all of an sm_90 SM
    assert stats["occupancy"] == pytest.approx(1.0) and stats["blocks_per_sm"] == 16


# ---- notebook helpers --------------------------------------------------------------------------


def test_resolve_path_and_mode(tmp_path, monkeypatch):
    assert notebook.resolve_path(str(tmp_path)) == tmp_path
    root = notebook.find_repo_root()
    assert root is not None and (root / "pyproject.toml").is_file()
    monkeypatch.chdir(root / "notebooks")
    assert notebook.resolve_path("data") == root / "data"
    assert notebook.resolve_mode("replay") == "replay"
    with pytest.raises(ValueError):
        notebook.resolve_mode("fast")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert notebook.resolve_mode("auto") == "replay"
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        notebook.resolve_mode("measure")


def test_load_study_names_the_missing_file_and_command(tmp_path):
    with pytest.raises(FileNotFoundError) as info:
        measure.load_study(tmp_path, "h100-sxm-80gb", "triton_basics")
    message = str(info.value)
    assert "h100-sxm-80gb/triton_basics.csv" in message and "python -m perfutils teaching" in message


def test_measurements_need_a_gpu(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="CUDA GPU"):
        measure.measure_basics(tmp_path)
    assert measure.main(["--out", str(tmp_path)]) == 2
    assert not any(tmp_path.iterdir())


# ---- measurement pipeline with the fake back end -----------------------------------------------


def _basics(out, **kwargs):
    options = dict(sizes=[1000, 4096], irregular_sizes=[9_876], tile_sizes=[5000], tile_configs=[(256, 2), (1024, 4)],
                   autotune=False, softmax_rows=3, softmax_cols=[33, 300], backend=FakeBackend(), metadata=H100,
                   log=lambda line: None)
    options.update(kwargs)
    return measure.measure_basics(out, **options)


@pytest.fixture(scope="module")
def basics_path(tmp_path_factory):
    return _basics(tmp_path_factory.mktemp("basics"))


@pytest.fixture(scope="module")
def fusion_path(tmp_path_factory):
    return measure.measure_fusion(tmp_path_factory.mktemp("fusion"), sizes=[1024, 3000], evonorm_batches=[1, 3],
                                  evonorm_shape={"channels": 8, "groups": 2, "height": 5, "width": 7},
                                  backend=FakeBackend(), metadata=H100, log=lambda line: None)


def test_measure_basics_records_tidy_rows(basics_path, tmp_path):
    path = basics_path
    assert path.parent.name == "h100-sxm-80gb" and path.name == "triton_basics.csv"
    df = load_records(path)
    assert len(df) == 2 * 2 + 2 + 2 + 2 * 3
    assert set(df["status"]) == {"ok"}
    assert set(df["loss"]) == {"vector_add", "vector_add_irregular", "add_tile", "softmax"}
    assert (df["max_rel_err"] < 1e-6).all()
    row = df[(df["loss"] == "vector_add") & (df["variant"] == "triton") & (df["vocab"] == 4096)].iloc[0]
    assert row["bytes_min"] == 12 * 4096
    assert row["gbps"] == pytest.approx(row["bytes_min"] / (row["ms_median"] * 1e-3) / 1e9)
    assert row["pct_of_copy"] == pytest.approx(100 * row["gbps"] / 3000.0)
    meta = load_metadata(path)
    assert meta["copy_gbps"] == 3000.0 and meta["gpu_name"] == H100["gpu_name"]
    assert meta["parameters"]["softmax_cols"] == [33, 300]


def test_measure_basics_resumes_and_overwrites_only_on_request(tmp_path):
    options = dict(sizes=[1000], irregular_sizes=[], tile_sizes=[], softmax_cols=[])
    path = _basics(tmp_path, **options)
    before = path.read_bytes()
    _basics(tmp_path, **options)  # everything is done: nothing is measured or rewritten
    assert path.read_bytes() == before
    _basics(tmp_path, sizes=[1000, 2000], irregular_sizes=[], tile_sizes=[], softmax_cols=[])  # only the new size
    assert len(load_records(path)) == 4
    _basics(tmp_path, overwrite=True, **options)
    assert len(list(path.parent.glob("triton_basics.replaced-*.csv"))) == 1
    assert len(load_records(path)) == 2


def test_measure_basics_records_a_failing_configuration(tmp_path):
    class Broken(FakeBackend):
        def bench(self, fn):
            raise RuntimeError("out of resources: shared memory")

    df = load_records(_basics(tmp_path, sizes=[1000], irregular_sizes=[], tile_sizes=[], softmax_cols=[], backend=Broken()))
    assert set(df["status"]) == {"error"} and df["error"].str.contains("out of resources").all()


def test_measure_fusion_records_memory_and_launch_columns(fusion_path):
    df = load_records(fusion_path)
    assert len(df) == 3 * 2 * 3 + 2 * 2
    assert set(df["status"]) == {"ok"}
    for column in ("peak_mem_bytes", "wall_ms", "n_kernels", "n_elements", "compile_ms"):
        assert df[column].notna().all(), column
    evonorm = df[df["loss"] == "evonorm_b0"]
    assert set(evonorm["tokens"]) == {1, 3} and set(evonorm["n_elements"]) == {8 * 35, 3 * 8 * 35}
    assert (df["bytes_min"] == 8 * df["n_elements"]).all()


# ---- figures -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def recorded(basics_path, fusion_path):
    basics, fusion = load_records(basics_path), load_records(fusion_path)
    # Pretend the compiled kernels reported registers (the interpreter has none).
    tiles = basics["loss"] == "add_tile"
    basics.loc[tiles, "occupancy"] = 0.5
    basics.loc[tiles, "n_regs"] = 24
    return basics, fusion


@pytest.mark.parametrize("plot,which", [
    (plots.plot_vector_add, 0), (plots.plot_tile_sweep, 0), (plots.plot_tile_occupancy, 0),
    (plots.plot_softmax, 0), (plots.plot_fusion_latency, 1), (plots.plot_fusion_throughput, 1),
    (plots.plot_fusion_memory, 1),
])
def test_plots_have_labelled_axes_and_a_caption(recorded, plot, which, tmp_path):
    fig = plot(recorded[which])
    try:
        axes = [ax for ax in fig.axes if ax.get_xlabel()]
        assert axes and all(ax.get_xlabel() for ax in axes)
        assert any(ax.get_ylabel() for ax in fig.axes)
        titles = " ".join([ax.get_title() for ax in fig.axes] + ([fig._suptitle.get_text()] if fig._suptitle else []))
        assert "NVIDIA H100 80GB HBM3" in titles and "measured" in titles
        written = save_figure(fig, tmp_path / "figure")
        assert all(p.stat().st_size > 0 for p in written)
    finally:
        plt.close(fig)


def test_plots_refuse_frames_without_their_rows(recorded):
    basics, fusion = recorded
    with pytest.raises(ValueError, match="no successful rows"):
        plots.plot_softmax(fusion)
    with pytest.raises(ValueError, match="no add_tile row has an occupancy"):
        plots.plot_tile_occupancy(basics.assign(occupancy=float("nan")))


def test_the_figures_know_every_fusion_operation():
    """perfutils.plots.teaching names the fusion study's operations itself (figures import no kernels): the same
    names as the kernels', in their order."""
    from perfutils.plots.teaching import FUSION_OPS

    assert FUSION_OPS == list(activations.ACTIVATIONS) + ["evonorm_b0"]


def test_idle_lanes_in_the_irregular_table_match_mask_stats():
    for n in (98_765, 4096, 1, 1025):
        assert -n % 1024 == vector_add.mask_stats(n, 1024)["idle_lanes"]


def test_teaching_sentences_say_what_the_recorded_tables_show():
    """Notebooks 06 and 07 print these from the committed H100 data: predictions from the byte model, outcomes from
    the tables (no verdict written by hand)."""
    from pathlib import Path

    from perfutils.model.hardware import sm_limits
    from perfutils.plots import teaching_text as text

    data = Path(__file__).resolve().parent.parent / "data"
    assert text.limits_reading(sm_limits((9, 0))).startswith("So a program of one warp can never reach more than 32 "
                                                              "of the 64 warp slots")
    basics = measure.load_study(data, "h100-sxm-80gb", "triton_basics")
    said = text.vector_add_reading(plots.bandwidth_summary(basics, "vector_add"), plots.irregular_vs_regular(basics))
    assert "triton reaches" in said and "The irregular sizes against the power-of-two curve" in said
    assert "The autotuner's pick reaches" in text.tile_reading(plots.tile_summary(basics), basics)
    ratios = plots.speedups(basics, "softmax", baseline="triton")
    assert "The byte count predicts 4.00× for the naive version" in text.softmax_reading(ratios, predicted=4.0)
    model = activations.activation_byte_model()
    assert "eager sigmoid 32 / 8 = 4.00×" in text.fusion_predictions(model)
    fusion = measure.load_study(data, "h100-sxm-80gb", "fusion")
    assert "the host loop takes longer than the GPU time" in text.latency_reading(plots.flat_region(fusion))
    assert "(3 of 3 within 5%)" in text.throughput_reading(plots.fusion_at_largest(fusion, model))


@pytest.mark.parametrize("rows,columns,block,lag,slots", [(7, 100, 32, 2, 3), (5, 64, 16, 1, 2), (9, 70, 64, 3, 4),
                                                          (4, 33, 16, 2, 5), (1, 16, 16, 2, 1)])
def test_lagged_exchange_matches_float64(rows, columns, block, lag, slots):
    """Rows over several chunks or one, a last partial chunk, fewer rows than slots, lags of 1 to 3: on a CPU one
    launch per step (the persistent form's programs would poll each other under the interpreter)."""
    generator = torch.Generator().manual_seed(rows * columns + lag)
    logits = (torch.randn(rows, columns, generator=generator) * 3).to(DEVICE)
    labels = torch.randint(0, columns, (rows,), generator=generator).to(DEVICE)
    value, grad = lagged_exchange.lagged_cross_entropy(logits, labels, block=block, lag=lag, slots=slots,
                                                       num_warps=1, persistent=False)
    logits64 = logits.double().requires_grad_()
    expected = reference.entropy_loss(logits64, labels)
    expected.backward()
    assert float(abs(value.double() - expected.detach())) <= 1e-5 * max(1.0, float(abs(expected.detach())))
    assert torch.allclose(grad.double(), logits64.grad, rtol=1e-5, atol=1e-7)


def test_lagged_exchange_refuses_bad_arguments():
    logits, labels = torch.randn(4, 64, device=DEVICE), torch.zeros(4, dtype=torch.int64, device=DEVICE)
    with pytest.raises(ValueError, match="block must be a power of two"):
        lagged_exchange.lagged_cross_entropy(logits, labels, block=24)
    with pytest.raises(ValueError, match="lag must be an int"):
        lagged_exchange.lagged_cross_entropy(logits, labels, block=16, lag=0)
    with pytest.raises(ValueError, match="slots must be an int"):
        lagged_exchange.lagged_cross_entropy(logits, labels, block=16, slots=0, persistent=False)
    with pytest.raises(ValueError, match="one int per row"):
        lagged_exchange.lagged_cross_entropy(logits, labels[:3], block=16)
    with pytest.raises(ValueError, match="contiguous 2-D"):
        lagged_exchange.lagged_cross_entropy(logits.t(), labels, block=16)



@pytest.mark.skipif(not torch.cuda.is_available(), reason="the persistent form's programs poll each other: a GPU")
@pytest.mark.parametrize("rows,columns,block", [(4096, 32000, 2048), (300, 50257, 4096), (3, 100, 32)])
def test_lagged_exchange_persistent_on_the_gpu(rows, columns, block):
    logits = (torch.randn(rows, columns, device="cuda") * 2).to(torch.bfloat16)
    labels = torch.randint(0, columns, (rows,), device="cuda")
    value, grad = lagged_exchange.lagged_cross_entropy(logits, labels, block=block)
    logits64 = logits.double().requires_grad_()
    expected = reference.entropy_loss(logits64, labels)
    expected.backward()
    assert float(abs(value.double() - expected.detach())) <= 1e-5 * max(1.0, float(abs(expected.detach())))
    assert float((grad.double() - logits64.grad).norm() / logits64.grad.norm()) <= 1e-2  # bf16 gradient
