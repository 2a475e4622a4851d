"""The losses as PyTorch operators (kernels.ops): opcheck, torch.compile(fullgraph=True), no host sync, autograd edges.

On CPU the kernels run under the Triton interpreter; torch.compile uses backend="eager" (Dynamo's trace, no
Inductor). The GPU counterparts (Inductor, CUDA graphs, sync debug mode) are in tests/test_gpu_operators.py.
"""

from __future__ import annotations

import sys

import pytest
import torch

import kernels
from kernels import ops
from conftest import LOSS_FORMATS, TOLERANCE

LOSS_IDS = [f"{loss}-{fmt}" for loss, fmt in LOSS_FORMATS]
DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def make_inputs(gen, shape, dtype, fmt, device):
    logits = (torch.randn(shape, generator=gen) * 2).to(dtype).to(device)
    if fmt == "labels":
        target = torch.randint(0, shape[-1], shape[:-1], generator=gen).to(device)
        target.view(-1)[1] = -100
    else:
        target = (torch.randn(shape, generator=gen) * 2).to(dtype).to(device)
    return logits, target


def rel_err(value, reference):
    value, reference = value.detach().double(), reference.detach().double()
    return float((value - reference).norm() / reference.norm().clamp(min=1e-30))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("loss, fmt", LOSS_FORMATS, ids=LOSS_IDS)
def test_opcheck(loss, fmt, dtype, gen, device):
    logits, target = make_inputs(gen, (2, 3, 40), dtype, fmt, device)
    mask = torch.tensor([[True, False, True]] * 2, device=device)
    for args in (
        (logits, target, None, None, 1.0, True, loss, fmt, -100, "auto", None, None, "", False),
        (logits, target, mask, torch.tensor(0.5, device=device), 0.0, True, loss, fmt, -100, "split_row", 16, 2,
         '{"cooperative": false}', False),
        (logits, target, None, None, 0.0, False, loss, fmt, -100, "fused", 16, 1, "", False),
    ):
        torch.library.opcheck(ops.forward_backward, args)
    grad = torch.randn(4, 70, generator=gen).to(dtype).to(device)
    torch.library.opcheck(ops.scale_gradient_, (grad, torch.tensor(0.25, device=device)))


@pytest.mark.parametrize("loss, fmt", LOSS_FORMATS, ids=LOSS_IDS)
def test_fullgraph_compile_matches_eager(loss, fmt, gen, device, oracle):
    """torch.compile(fullgraph=True) traces the loss with no graph break (Dynamo raises on one): the loss function
    compiled and its backward run by AOTAutograd, and, where Dynamo can trace ``.backward()`` itself
    (``trace_autograd_ops``, torch >= 2.12), the whole step."""
    logits, target = make_inputs(gen, (6, 90), torch.float32, fmt, device)
    mask = torch.tensor([True, True, False, True, True, True], device=device)

    def loss_fn(x, t, m):
        return kernels.entropy_loss(x, t, loss=loss, target_format=fmt, loss_mask=m)

    def step(x, t, m):
        value = loss_fn(x, t, m)
        value.backward()
        return value.detach()

    def forward_backward(x, t, m):
        return kernels.entropy_loss_forward_backward(x, t, loss=loss, target_format=fmt, loss_mask=m, grad_output=0.5)

    eager_x = logits.clone().requires_grad_(True)
    eager = step(eager_x, target, mask)
    oracle.check(logits, target, (eager, eager_x.grad), loss=loss, target_format=fmt, loss_mask=mask)
    torch._dynamo.reset()
    compiled_x = logits.clone().requires_grad_(True)
    compiled = torch.compile(loss_fn, fullgraph=True, backend="eager")(compiled_x, target, mask)
    compiled.backward()
    assert rel_err(compiled, eager) <= TOLERANCE[torch.float32]
    assert rel_err(compiled_x.grad, eager_x.grad) <= TOLERANCE[torch.float32]
    if hasattr(torch._dynamo.config, "trace_autograd_ops"):
        torch._dynamo.reset()
        with torch._dynamo.config.patch(trace_autograd_ops=True):
            step_x = logits.clone().requires_grad_(True)
            stepped = torch.compile(step, fullgraph=True, backend="eager")(step_x, target, mask)
        assert rel_err(stepped, eager) <= TOLERANCE[torch.float32]
        assert rel_err(step_x.grad, eager_x.grad) <= TOLERANCE[torch.float32]

    c_loss, c_grad = torch.compile(forward_backward, fullgraph=True, backend="eager")(logits, target, mask)
    e_loss, e_grad = forward_backward(logits, target, mask)
    assert rel_err(c_loss, e_loss) <= TOLERANCE[torch.float32] and rel_err(c_grad, e_grad) <= TOLERANCE[torch.float32]


_CONVERSIONS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "numpy", "cpu")


@pytest.mark.parametrize("loss, fmt", LOSS_FORMATS, ids=LOSS_IDS)
def test_default_call_converts_no_tensor_to_python(loss, fmt, gen, device, monkeypatch):
    """A tensor -> Python value in the call path (what syncs with a GPU) fails the test: every conversion method
    raises when called from the project's own code. (Triton's interpreter reads tensors itself; it is not ours.)
    The first call of a shape is allowed its setup (it may read the tuning table): the second is checked."""
    logits, target = make_inputs(gen, (4, 80), torch.bfloat16, fmt, device)
    mask = torch.tensor([True, False, True, True], device=device)
    kernels.entropy_loss_forward_backward(logits, target, loss=loss, target_format=fmt, loss_mask=mask)
    if fmt == "labels":  # the CPU path checks labels on the host (no device to sync with): take it out here
        monkeypatch.setattr(kernels.problem.Problem, "check_labels_on_host", lambda self: None)

    def guard(name, original):
        def method(self, *args, **kwargs):
            caller = sys._getframe(1).f_globals.get("__name__", "")
            if caller == "kernels" or caller.startswith("kernels."):
                raise AssertionError(f"{caller} converted a tensor to a Python value with Tensor.{name}")
            return original(self, *args, **kwargs)

        return method

    for name in _CONVERSIONS:
        monkeypatch.setattr(torch.Tensor, name, guard(name, getattr(torch.Tensor, name)))
    value, grad = kernels.entropy_loss_forward_backward(logits, target, loss=loss, target_format=fmt, loss_mask=mask,
                                                        grad_output=torch.tensor(0.5, device=device))
    x = logits.clone().requires_grad_(True)
    kernels.entropy_loss(x, target, loss=loss, target_format=fmt, loss_mask=mask).backward()
    monkeypatch.undo()
    assert torch.isfinite(value) and grad.shape == logits.shape and x.grad is not None


def test_grad_output_tensor_is_read_on_the_device(gen, device, oracle):
    logits, target = make_inputs(gen, (5, 64), torch.float32, "logits", device)
    value, grad = kernels.entropy_loss_forward_backward(logits, target, loss="forward_kl", target_format="logits",
                                                        grad_output=torch.tensor([0.25], device=device))
    ref_loss, ref_grad = kernels.reference.entropy_loss_forward_backward(logits, target, loss="forward_kl",
                                                                          target_format="logits", grad_output=0.25)
    assert rel_err(value, ref_loss) <= 1e-5 and rel_err(grad, ref_grad) <= 1e-5


def test_backward_scales_by_the_incoming_gradient(gen, device):
    logits, target = make_inputs(gen, (5, 64), torch.float32, "labels", device)
    x = logits.clone().requires_grad_(True)
    (kernels.entropy_loss(x, target) * 3.0).backward()
    reference_x = logits.double().requires_grad_(True)
    (kernels.reference.entropy_loss(reference_x, target) * 3.0).backward()
    assert rel_err(x.grad, reference_x.grad) <= 1e-5


def test_learnable_target_is_refused_not_dropped(gen, device):
    logits, target = make_inputs(gen, (3, 40), torch.float32, "logits", device)
    teacher = target.clone().requires_grad_(True)
    with pytest.raises(ValueError, match="target requires grad"):
        kernels.entropy_loss(logits.requires_grad_(True), teacher, loss="reverse_kl", target_format="logits")
    with torch.no_grad():  # no autograd: nothing to drop
        kernels.entropy_loss(logits, teacher, loss="reverse_kl", target_format="logits")


def test_double_backward_raises(gen, device):
    logits, target = make_inputs(gen, (3, 40), torch.float32, "labels", device)
    x = logits.clone().requires_grad_(True)
    value = kernels.entropy_loss(x, target)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(value, x, create_graph=True)


def test_out_of_range_labels(gen, device):
    """validate=True: a ValueError before any launch. Without it the device poisons the loss and gradient with NaN
    (prepare() runs the kernels without any host check, as a GPU call does); never a finite wrong number."""
    logits, target = make_inputs(gen, (4, 50), torch.float32, "labels", device)
    target[2] = 50
    with pytest.raises(ValueError, match=r"must lie in \[0, 50\)"):
        kernels.entropy_loss_forward_backward(logits, target, validate=True)
    value, grad = kernels.prepare(logits, target, variant="fused", block_size=64).run()
    counted = target != -100  # make_inputs ignores row 1: its gradient is 0 whatever the other labels
    assert torch.isnan(value) and torch.isnan(grad[counted]).all() and not grad[~counted].any()
    target[2] = -100  # ignore_index is fine anywhere
    value, grad = kernels.prepare(logits, target, variant="fused", block_size=64).run()
    assert torch.isfinite(value) and torch.isfinite(grad).all()


def test_empty_batch_gives_zero_loss(device):
    logits = torch.randn(0, 30, device=device)
    value, grad = kernels.entropy_loss_forward_backward(logits, torch.zeros(0, dtype=torch.long, device=device))
    assert float(value) == 0.0 and grad.shape == (0, 30)


def test_options_of_another_type_are_checked_even_after_a_good_call(gen):
    x, t = make_inputs(gen, (3, 40), torch.float32, "labels", "cpu")
    kernels.entropy_loss_forward_backward(x, t, ignore_index=-100, block_size=64)  # fills the options cache
    with pytest.raises(TypeError, match="ignore_index"):
        kernels.entropy_loss_forward_backward(x, t, ignore_index=-100.0, block_size=64)
    with pytest.raises(TypeError):
        kernels.entropy_loss_forward_backward(x, t, ignore_index=-100, block_size=64.0)
    with pytest.raises(TypeError, match="validate"):
        kernels.entropy_loss_forward_backward(x, t, validate=0)


def test_call_key_tells_apart_what_a_template_cannot_reuse():
    from kernels.dispatch import call_key

    x = torch.zeros(4, 40)
    t = torch.zeros(4, dtype=torch.long)
    mask = torch.ones(4, dtype=torch.bool)
    key = call_key(x, t, mask, None, ())
    assert key == call_key(x, t, mask.clone(), None, ())
    assert key != call_key(x, t, mask.to(torch.int64), None, ())  # same shape, other dtype
    assert key != call_key(x, t, torch.ones(5, dtype=torch.bool)[1:], None, ())  # same shape, not 16-byte aligned
    scale = torch.ones(())
    assert call_key(x, t, None, scale, ()) != call_key(x, t, None, torch.ones(3), ())


def test_workspaces_are_not_kept_from_torch_compiles_graph_pool(monkeypatch):
    """A call on the stream of torch.compile's CUDA graphs (reduce-overhead warms a function up there, its allocations
    going to the graphs' pool) takes a fresh workspace instead of keeping one: inductor refuses a kept one. The tree
    manager is stood in for (its module is torch's internals, loaded only once reduce-overhead compiled something)."""
    import types

    from kernels import dispatch

    monkeypatch.setattr(torch._C, "_cuda_isCurrentStreamCapturing", lambda: False)
    monkeypatch.delitem(sys.modules, "torch._inductor.cudagraph_trees", raising=False)
    assert not dispatch.in_graph_pool(0, 77)  # no reduce-overhead in this process
    manager = types.SimpleNamespace(stream=types.SimpleNamespace(cuda_stream=77))
    managers = {0: manager}
    trees = types.SimpleNamespace(get_manager=lambda index, create_if_none_exists=True: managers.get(index))
    monkeypatch.setitem(sys.modules, "torch._inductor.cudagraph_trees", trees)
    assert dispatch.in_graph_pool(0, 77)  # the graphs' stream
    assert not dispatch.in_graph_pool(0, 5)  # the caller's own stream
    assert not dispatch.in_graph_pool(1, 77)  # a device with no graphs yet
    monkeypatch.setattr(torch._C, "_cuda_isCurrentStreamCapturing", lambda: True)
    assert dispatch.in_graph_pool(1, 5)  # capture


class _FakeCompiled:
    """What kernels.launch.DirectLaunch reads of a triton CompiledKernel, recording the launches it is given."""

    def __init__(self):
        self.calls = []
        self.run = lambda *args: self.calls.append(args)
        self.function = 1234
        self.packed_metadata = (4, 1, 0)


def test_template_launch_puts_the_call_values_in_their_slots():
    from kernels import launch as launches

    compiled = _FakeCompiled()
    launch = launches.DirectLaunch(compiled, (3, 1, 1), [None, 7, None, "C"], [(0, 2), (2, 0)])
    launch([111, 222, 333], stream=99)
    launch([444, 555, 666], stream=99)
    prefix = (compiled.packed_metadata, None, None, None)
    assert compiled.calls == [(3, 1, 1, 99, 1234, *prefix, 333, 7, 111, "C"),
                              (3, 1, 1, 99, 1234, *prefix, 666, 7, 444, "C")]


def _fake_cuda_launcher(global_scratch_size=0):
    """A triton CudaLauncher with its attributes set by hand (building a real one compiles a C module)."""
    from triton.backends.nvidia.driver import CudaLauncher

    launcher = object.__new__(CudaLauncher)
    launcher.calls = []
    launcher.launch = lambda *args: launcher.calls.append(args)
    launcher.global_scratch_size = global_scratch_size
    launcher.profile_scratch_size = 0
    launcher.launch_cooperative_grid = False
    launcher.launch_pdl = True
    return launcher


def test_template_launch_calls_triton_36s_c_launch_with_what_the_launcher_would_pass(monkeypatch):
    from kernels import launch as launches

    monkeypatch.setattr(launches, "_TRITON_VERSION", (3, 6))
    compiled = _FakeCompiled()
    compiled.run = _fake_cuda_launcher()
    launch = launches.DirectLaunch(compiled, (3, 1, 1), [None, 7], [(0, 1)])
    launch([111, 222], stream=99)
    # CudaLauncher.__call__ passes (grid, stream, function, cooperative, pdl, global scratch, profile scratch, *args)
    assert compiled.run.calls == [(3, 1, 1, 99, 1234, False, True, None, None, compiled.packed_metadata, None, None,
                                   None, 222, 7)]
    # scratch buffers needed, or another Triton: the launcher's own __call__
    for version, scratch in (((3, 6), 64), ((3, 7), 0), ((3, 5), 0)):
        monkeypatch.setattr(launches, "_TRITON_VERSION", version)
        compiled.run = _fake_cuda_launcher(global_scratch_size=scratch)
        assert launches.DirectLaunch(compiled, (3, 1, 1), [None], [(0, 0)]).launcher is compiled.run


def test_template_passes_pointers_only_where_the_kernels_read_the_callers_tensors():
    from kernels.dispatch import reads_given_tensors
    from kernels.problem import build_problem

    x = torch.randn(6, 40)
    labels = torch.randint(0, 40, (6,))
    mask = torch.ones(6, dtype=torch.bool)
    scale = torch.ones(1)

    def reads(logits, target, fmt="labels", loss_mask=None, grad_output=1.0):
        problem = build_problem(logits, target, loss="cross_entropy", target_format=fmt, grad_output=grad_output,
                                ignore_index=-100, loss_mask=loss_mask)
        tensor = grad_output if isinstance(grad_output, torch.Tensor) else None
        return reads_given_tensors(problem, logits, target, loss_mask, tensor)

    assert reads(x, labels, loss_mask=mask, grad_output=scale)
    assert reads(x.view(2, 3, 40), labels.view(2, 3))  # batch dims collapse into a view
    assert reads(x, x.flip(0), fmt="logits")
    assert not reads(x.t().contiguous().t(), labels)  # columns not contiguous: the kernels read a copy
    assert not reads(x, torch.randint(0, 40, (12,))[::2])  # strided labels: copied
    assert not reads(x, labels, loss_mask=torch.ones(12, dtype=torch.bool)[::2])
