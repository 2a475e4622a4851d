"""GPU checks of the operators (marked ``gpu``; skipped without CUDA or under TRITON_INTERPRET=1).

Every loss, labels included: torch.library.opcheck; torch.compile(fullgraph=True) with Inductor of the loss and its
backward; CUDA-graph capture and replay, also under torch.compile(mode="reduce-overhead"); repeated calls of one
shape (the cached call template) on new data and a new grad_output; no device->host synchronization in a
repeated call (torch.cuda.set_sync_debug_mode("error")); each call (and each graph replay) counting its own rows on
a workspace the previous call left ready; an out-of-range label stops the process with a
device-side assert and never returns a finite loss.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

import kernels
from kernels import ops
from kernels.launch import interpreting

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(interpreting(), reason="TRITON_INTERPRET=1: the operators' GPU path needs compiled kernels"),
]

LOSS_FORMATS = [("cross_entropy", "labels"), ("cross_entropy", "logits"), ("forward_kl", "logits"),
                ("reverse_kl", "logits")]
LOSS_IDS = [f"{loss}-{fmt}" for loss, fmt in LOSS_FORMATS]
TOL = 1e-2  # bf16


def make_inputs(shape, fmt, seed, dtype=torch.bfloat16):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    logits = (torch.randn(shape, generator=gen, device="cuda") * 2).to(dtype)
    if fmt == "labels":
        target = torch.randint(0, shape[-1], shape[:-1], generator=gen, device="cuda")
        target.view(-1)[::7] = -100
    else:
        target = (torch.randn(shape, generator=gen, device="cuda") * 2).to(dtype)
    mask = torch.arange(shape[0], device="cuda") % 5 != 2
    return logits, target, mask


def rel_err(value, reference):
    value, reference = value.detach().double(), reference.detach().double()
    return float((value - reference).norm() / reference.norm().clamp(min=1e-30))


def reference(logits, target, loss, fmt, mask, grad_output=1.0):
    return kernels.reference.entropy_loss_forward_backward(logits, target, loss=loss, target_format=fmt,
                                                           loss_mask=mask, grad_output=grad_output)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("loss, fmt", LOSS_FORMATS, ids=LOSS_IDS)
def test_opcheck(loss, fmt, dtype):
    logits, target, mask = make_inputs((64, 5000), fmt, seed=1, dtype=dtype)
    torch.library.opcheck(ops.forward_backward,
                          (logits, target, mask, None, 1.0, True, loss, fmt, -100, "auto", None, None, "", False))
    torch.library.opcheck(ops.scale_gradient_, (logits.clone(), torch.tensor(0.5, device="cuda")))


@pytest.mark.parametrize("loss, fmt", LOSS_FORMATS, ids=LOSS_IDS)
def test_inductor_fullgraph_matches_eager(loss, fmt):
    logits, target, mask = make_inputs((512, 50257), fmt, seed=2)

    def loss_fn(x, t, m):
        return kernels.entropy_loss(x, t, loss=loss, target_format=fmt, loss_mask=m)

    torch._dynamo.reset()
    x = logits.clone().requires_grad_(True)
    value = torch.compile(loss_fn, fullgraph=True)(x, target, mask)
    value.backward()
    ref_loss, ref_grad = reference(logits, target, loss, fmt, mask)
    assert rel_err(value, ref_loss) <= TOL and rel_err(x.grad, ref_grad) <= TOL
    if hasattr(torch._dynamo.config, "trace_autograd_ops"):  # the whole step, backward() traced too

        def step(x, t, m):
            result = loss_fn(x, t, m)
            result.backward()
            return result.detach()

        torch._dynamo.reset()
        with torch._dynamo.config.patch(trace_autograd_ops=True):
            x = logits.clone().requires_grad_(True)
            value = torch.compile(step, fullgraph=True)(x, target, mask)
        assert rel_err(value, ref_loss) <= TOL and rel_err(x.grad, ref_grad) <= TOL


@pytest.mark.parametrize("loss, fmt", LOSS_FORMATS, ids=LOSS_IDS)
def test_cuda_graph_replay_matches_eager(loss, fmt):
    shape = (1024, 32000)
    static_x, static_t, static_m = make_inputs(shape, fmt, seed=3)
    options = dict(loss=loss, target_format=fmt, loss_mask=static_m)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture, as torch.cuda.graphs requires
        kernels.entropy_loss_forward_backward(static_x, static_t, **options)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_loss, static_grad = kernels.entropy_loss_forward_backward(static_x, static_t, **options)
    for seed in (4, 5):  # replays on new data
        x, t, m = make_inputs(shape, fmt, seed=seed)
        static_x.copy_(x), static_t.copy_(t), static_m.copy_(m)
        graph.replay()
        eager_loss, eager_grad = kernels.entropy_loss_forward_backward(x, t, loss=loss, target_format=fmt, loss_mask=m)
        ref_loss, ref_grad = reference(x, t, loss, fmt, m)
        assert rel_err(static_loss, eager_loss) <= 1e-6 and rel_err(static_grad, eager_grad) <= 1e-6
        assert rel_err(static_loss, ref_loss) <= TOL and rel_err(static_grad, ref_grad) <= TOL


@pytest.mark.parametrize("loss, fmt", LOSS_FORMATS, ids=LOSS_IDS)
def test_reduce_overhead_compile(loss, fmt):
    """torch.compile(mode="reduce-overhead") captures the step in CUDA graphs; replays must see new inputs. The
    templates are cleared first so that the key's first calls are the graphs' warm-up (no earlier test's call of the
    same key may have kept a workspace: a workspace kept from the warm-up stopped inductor, whose pool it was in), and
    an eager call afterwards still gets the right result."""
    from kernels.dispatch import TEMPLATES

    torch._dynamo.reset()
    TEMPLATES.clear()

    def step(x, t, m):
        return kernels.entropy_loss_forward_backward(x, t, loss=loss, target_format=fmt, loss_mask=m, grad_output=0.5)

    compiled = torch.compile(step, mode="reduce-overhead", fullgraph=True)
    for seed in (6, 7, 8, 9):
        x, t, m = make_inputs((1024, 32768), fmt, seed=seed)
        value, grad = compiled(x, t, m)
        ref_loss, ref_grad = reference(x, t, loss, fmt, m, grad_output=0.5)
        assert rel_err(value, ref_loss) <= TOL and rel_err(grad, ref_grad) <= TOL
    value, grad = step(x, t, m)
    assert rel_err(value, ref_loss) <= TOL and rel_err(grad, ref_grad) <= TOL


@pytest.mark.parametrize("loss, fmt", LOSS_FORMATS, ids=LOSS_IDS)
def test_repeated_calls_take_new_data_and_grad_output(loss, fmt):
    shape = (777, 65536)
    for seed, grad_output in ((10, 1.0), (11, 0.25), (12, torch.tensor(3.0, device="cuda"))):
        x, t, m = make_inputs(shape, fmt, seed=seed)
        value, grad = kernels.entropy_loss_forward_backward(x, t, loss=loss, target_format=fmt, loss_mask=m,
                                                            grad_output=grad_output)
        ref_loss, ref_grad = reference(x, t, loss, fmt, m, grad_output=float(grad_output))
        assert rel_err(value, ref_loss) <= TOL and rel_err(grad, ref_grad) <= TOL


@pytest.mark.parametrize("loss, fmt", LOSS_FORMATS, ids=LOSS_IDS)
def test_repeated_calls_of_plain_layouts_pass_pointers(loss, fmt):
    """Contiguous inputs: the template passes the caller's data pointers (no views, no copies); results stay right."""
    from kernels.dispatch import TEMPLATES, call_key
    from kernels.ops import CallOptions

    for seed in (16, 17, 18):
        x, t, m = make_inputs((300, 50257), fmt, seed=seed)
        value, grad = kernels.entropy_loss_forward_backward(x, t, loss=loss, target_format=fmt, loss_mask=m)
        ref_loss, ref_grad = reference(x, t, loss, fmt, m)
        assert rel_err(value, ref_loss) <= TOL and rel_err(grad, ref_grad) <= TOL
    template = TEMPLATES.get(call_key(x, t, m, None, CallOptions(True, loss, fmt, -100, "auto", None, None, "", False)))
    assert template and template.passthrough


@pytest.mark.parametrize("loss, fmt", LOSS_FORMATS, ids=LOSS_IDS)
def test_repeated_calls_with_strided_inputs(loss, fmt):
    """Layouts the kernels cannot take as they are (column stride 2; a 3-D batch whose leading dims do not collapse;
    strided labels and mask) are copied on every call: the first (which builds the template) and repeated ones."""
    for seed in (14, 15):
        x, t, m = make_inputs((600, 2 * 4099), fmt, seed=seed)
        if fmt == "labels":  # drawn for 2 * 4099 columns: keep them in range of the 4099 the calls see
            t = torch.where(t >= 0, t % 4099, t)
        x2, m2 = x[:, ::2], m[::2].repeat_interleave(2)  # column stride 2; a mask view with stride 1
        t2 = t if fmt == "labels" else t[:, ::2]
        value, grad = kernels.entropy_loss_forward_backward(x2, t2, loss=loss, target_format=fmt, loss_mask=m2)
        ref_loss, ref_grad = reference(x2, t2, loss, fmt, m2)
        assert rel_err(value, ref_loss) <= TOL and rel_err(grad, ref_grad) <= TOL
        x3 = x[:, :4099].reshape(3, 200, 4099)[:, :100]  # (3, 100, V) with strides (200 V, V, 1): no single row stride
        t3 = t.reshape(3, 200)[:, :100] if fmt == "labels" else t[:, :4099].reshape(3, 200, 4099)[:, :100]
        m3 = m.reshape(3, 200)[:, :100]
        value, grad = kernels.entropy_loss_forward_backward(x3, t3, loss=loss, target_format=fmt, loss_mask=m3)
        ref_loss, ref_grad = reference(x3.reshape(300, 4099), t3.reshape(-1) if fmt == "labels" else t3.reshape(300, 4099),
                                       loss, fmt, m3.reshape(-1))
        assert grad.shape == x3.shape
        assert rel_err(value, ref_loss) <= TOL and rel_err(grad.reshape(300, 4099), ref_grad) <= TOL


@pytest.mark.parametrize("loss, fmt", LOSS_FORMATS, ids=LOSS_IDS)
def test_no_sync_in_a_repeated_call(loss, fmt):
    """The first call of a shape may set up (compile, size grids); the same calls again must not synchronize."""
    x, t, m = make_inputs((2048, 32000), fmt, seed=13)
    leaf = x.clone().requires_grad_(True)
    half = torch.tensor(0.5, device="cuda")  # made here: a tensor from a Python number is a host->device copy

    def calls():
        leaf.grad = None
        value, grad = kernels.entropy_loss_forward_backward(x, t, loss=loss, target_format=fmt, loss_mask=m,
                                                            grad_output=half)
        plain, _ = kernels.entropy_loss_forward_backward(x, t, loss=loss, target_format=fmt)
        (kernels.entropy_loss(leaf, t, loss=loss, target_format=fmt, loss_mask=m) * 2).backward()
        return value, grad

    calls()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        value, grad = calls()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    ref_loss, ref_grad = reference(x, t, loss, fmt, m)
    assert rel_err(value, ref_loss) <= TOL and rel_err(grad, ref_grad * 0.5) <= TOL
    assert rel_err(leaf.grad, ref_grad * 2) <= TOL


def test_out_of_range_label_trips_a_device_side_assert():
    """Run in a child process: a device-side assert leaves the CUDA context unusable, as with PyTorch's own."""
    script = textwrap.dedent("""
        import torch, kernels
        x = torch.randn(64, 1000, device="cuda")
        labels = torch.randint(0, 1000, (64,), device="cuda")
        labels[5] = 1000
        try:
            loss, grad = kernels.entropy_loss_forward_backward(x, labels)
            print("loss", loss.item())
        except Exception as error:  # the assert surfaces at the next call that waits for the GPU
            print("caught:", error)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    output = done.stdout + done.stderr
    assert "caught:" in done.stdout and "assert" in done.stdout.lower(), output  # not a finite loss


DESIGNS = [("auto", {}), ("fused", {}), ("two_pass", {}), ("split_row", {"block_size": 1024}),
           ("split_row", {"block_size": 1024, "cooperative": False})]
DESIGN_IDS = ["auto", "fused", "two_pass", "lagged", "multi_launch"]


@pytest.mark.parametrize("variant, options", DESIGNS, ids=DESIGN_IDS)
@pytest.mark.parametrize("loss, fmt", LOSS_FORMATS, ids=LOSS_IDS)
def test_repeated_calls_count_their_own_rows(loss, fmt, variant, options):
    """One launch per call and no prologue: every call counts the rows of its own mean (row_math.call_scales) on a
    workspace the previous call left ready (counters re-zeroed, the lagged exchange's other half re-emptied). Five
    calls of one template, each with a different number of counted rows and a different grad_output."""
    x, t, m = make_inputs((700, 4099), fmt, seed=21)
    for call in range(5):
        m = torch.arange(700, device="cuda") % (call + 2) != 0
        if fmt == "labels":
            t = torch.where(torch.arange(700, device="cuda") % (call + 3) == 1, -100, t.clamp(min=0))
        scale = 0.25 * (call + 1)
        value, grad = kernels.entropy_loss_forward_backward(x, t, loss=loss, target_format=fmt, loss_mask=m,
                                                            grad_output=scale, variant=variant, **options)
        ref_loss, ref_grad = reference(x, t, loss, fmt, m, grad_output=scale)
        assert rel_err(value, ref_loss) <= TOL and rel_err(grad, ref_grad) <= TOL, f"call {call}"


@pytest.mark.parametrize("loss, fmt", LOSS_FORMATS, ids=LOSS_IDS)
def test_graph_replays_count_their_own_rows(loss, fmt):
    """A captured call replayed on new labels and masks (copied into the captured inputs) counts each replay's rows."""
    x, t, m = make_inputs((512, 32000), fmt, seed=22)
    kernels.entropy_loss_forward_backward(x, t, loss=loss, target_format=fmt, loss_mask=m)  # compile, search, template
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        value, grad = kernels.entropy_loss_forward_backward(x, t, loss=loss, target_format=fmt, loss_mask=m)
    for replay in range(3):
        x2, t2, _ = make_inputs((512, 32000), fmt, seed=30 + replay)
        m2 = torch.arange(512, device="cuda") % (replay + 2) != 0
        x.copy_(x2)
        t.copy_(t2)
        m.copy_(m2)
        graph.replay()
        ref_loss, ref_grad = reference(x, t, loss, fmt, m)
        assert rel_err(value, ref_loss) <= TOL and rel_err(grad, ref_grad) <= TOL, f"replay {replay}"
