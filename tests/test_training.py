"""The losses as training code uses them, beyond one forward and one backward: a graph used twice (retain_graph,
``autograd.grad`` before ``backward``), hooks, a loss scaler, micro-batches, several losses on one logits tensor,
``torch.compile`` of a step that calls backward twice; rows with NaN or inf logits; CPU tensors without the
interpreter. Every gradient is compared with PyTorch's own loss on the same graph (float64 inputs upcast from fp32)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import kernels
from conftest import LOSS_FORMATS

TOLERANCE = 1e-5


def torch_loss(logits, target, loss, fmt):
    """PyTorch's own loss (the mean over rows), differentiable in logits."""
    if fmt == "labels":
        return F.cross_entropy(logits, target)
    log_q = F.log_softmax(logits, -1)
    log_p = F.log_softmax(target, -1)
    if loss == "cross_entropy":
        return -(log_p.exp() * log_q).sum(-1).mean()
    if loss == "forward_kl":
        return F.kl_div(log_q, log_p, log_target=True, reduction="batchmean")
    return F.kl_div(log_p, log_q, log_target=True, reduction="batchmean")


def problem(loss, fmt, gen, device, rows=4, vocab=13):
    x = torch.randn(rows, vocab, generator=gen).to(device).requires_grad_(True)
    target = (torch.randint(0, vocab, (rows,), generator=gen) if fmt == "labels"
              else torch.randn(rows, vocab, generator=gen)).to(device)
    return x, target


def true_gradient(x, target, loss, fmt, scale=1.0):
    """d(scale * loss)/dx from PyTorch in float64."""
    x64 = x.detach().double().requires_grad_(True)
    t64 = target if fmt == "labels" else target.double()
    (grad,) = torch.autograd.grad(scale * torch_loss(x64, t64, loss, fmt), x64)
    return grad


def assert_close(grad, expected):
    error = float((grad.double() - expected).norm() / expected.norm().clamp(min=1e-30))
    assert error <= TOLERANCE, error


def entropy_loss(x, target, loss, fmt):
    return kernels.entropy_loss(x, target, loss=loss, target_format=fmt)


@pytest.mark.parametrize("loss, fmt", LOSS_FORMATS)
def test_grad_before_backward_leaves_both_gradients_right(loss, fmt, gen, device):
    """Gradient-norm logging: autograd.grad with retain_graph, then backward through the same graph. The first
    gradient is the caller's and never changes; the second use gets the same gradient again."""
    x, target = problem(loss, fmt, gen, device)
    value = entropy_loss(x, target, loss, fmt)
    (first,) = torch.autograd.grad(0.5 * value, x, retain_graph=True)
    kept = first.clone()
    (0.5 * value).backward()
    expected = true_gradient(x, target, loss, fmt, 0.5)
    assert torch.equal(first, kept), "a returned gradient changed after it was returned"
    assert_close(first, expected)
    assert_close(x.grad, expected)


@pytest.mark.parametrize("loss, fmt", LOSS_FORMATS)
def test_backward_twice_accumulates_like_pytorch(loss, fmt, gen, device):
    x, target = problem(loss, fmt, gen, device)
    value = entropy_loss(x, target, loss, fmt)
    (3 * value).backward(retain_graph=True)
    after_first = x.grad.clone()
    (3 * value).backward(retain_graph=True)
    (-1 * value).backward()
    assert_close(after_first, true_gradient(x, target, loss, fmt, 3.0))
    assert_close(x.grad, true_gradient(x, target, loss, fmt, 5.0))


@pytest.mark.parametrize("loss, fmt", LOSS_FORMATS)
def test_backward_on_the_calling_thread_gives_the_same_gradients(loss, fmt, gen, device):
    """With the engine's multithreading off (the README's advice for host-bound small steps), the first backward,
    a second use of the graph and autograd.grad give PyTorch's gradients, as with the default engine."""
    x, target = problem(loss, fmt, gen, device)
    with torch.autograd.set_multithreading_enabled(False):
        value = entropy_loss(x, target, loss, fmt)
        (grad,) = torch.autograd.grad(2 * value, x, retain_graph=True)
        value.backward()
    assert_close(grad, true_gradient(x, target, loss, fmt, 2.0))
    assert_close(x.grad, true_gradient(x, target, loss, fmt, 1.0))


def test_backward_twice_without_retain_graph_raises_pytorchs_error(gen, device):
    x, target = problem("cross_entropy", "labels", gen, device)
    value = entropy_loss(x, target, "cross_entropy", "labels")
    value.backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        value.backward()


def test_logits_changed_in_place_before_a_second_backward_raise(gen, device):
    x, target = problem("forward_kl", "logits", gen, device)
    logits = x * 1.0  # a non-leaf the caller then overwrites
    value = entropy_loss(logits, target, "forward_kl", "logits")
    value.backward(retain_graph=True)
    with torch.no_grad():
        logits.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        value.backward()


@pytest.mark.parametrize("loss, fmt", LOSS_FORMATS)
def test_plain_call_never_changes_a_returned_gradient(loss, fmt, gen, device):
    x, target = problem(loss, fmt, gen, device)
    logits = x.detach()
    _, first = kernels.entropy_loss_forward_backward(logits, target, loss=loss, target_format=fmt, grad_output=0.5)
    kept = first.clone()
    kernels.entropy_loss_forward_backward(logits, target, loss=loss, target_format=fmt, grad_output=3.0)
    assert torch.equal(first, kept)
    assert_close(first, true_gradient(x, target, loss, fmt, 0.5))


def test_hooks_see_the_gradient_and_may_replace_it(gen, device):
    x, target = problem("reverse_kl", "logits", gen, device)
    seen = []
    x.register_hook(lambda grad: seen.append(grad.clone()) or grad * 2)
    value = entropy_loss(x, target, "reverse_kl", "logits")
    value.backward(retain_graph=True)
    value.backward()
    expected = true_gradient(x, target, "reverse_kl", "logits")
    assert len(seen) == 2
    for grad in seen:
        assert_close(grad, expected)
    assert_close(x.grad, 4 * expected)


def test_loss_scaler_pattern(gen, device):
    """GradScaler's arithmetic (scale the loss by a tensor, backward, unscale x.grad in place): the scale reaches the
    kernel's gradient on the device, and unscaling the caller's gradient touches nothing of the loss's."""
    x, target = problem("cross_entropy", "labels", gen, device)
    scale = torch.tensor(1024.0, device=device)
    value = entropy_loss(x, target, "cross_entropy", "labels")
    (value * scale).backward(retain_graph=True)
    x.grad.div_(scale)
    (value * scale).backward()  # the graph's second use is unaffected by the in-place unscale
    expected = true_gradient(x, target, "cross_entropy", "labels")
    assert_close(x.grad, expected + 1024 * expected)


@pytest.mark.parametrize("loss, fmt", LOSS_FORMATS)
def test_micro_batches_accumulate(loss, fmt, gen, device):
    x, target = problem(loss, fmt, gen, device, rows=6)
    for rows in (slice(0, 2), slice(2, 6)):
        part = x[rows]
        (entropy_loss(part, target[rows], loss, fmt) * (part.shape[0] / 6)).backward()
    assert_close(x.grad, true_gradient(x, target, loss, fmt))


def test_several_losses_on_one_logits_tensor(gen, device):
    x, labels = problem("cross_entropy", "labels", gen, device)
    teacher = torch.randn(x.shape, generator=gen).to(device)
    first = entropy_loss(x, labels, "cross_entropy", "labels")
    second = entropy_loss(x, teacher, "forward_kl", "logits")
    (first + 0.25 * second + 0.5 * first).backward()
    expected = (true_gradient(x, labels, "cross_entropy", "labels", 1.5)
                + true_gradient(x, teacher, "forward_kl", "logits", 0.25))
    assert_close(x.grad, expected)


@pytest.mark.parametrize("loss, fmt", [("cross_entropy", "labels"), ("reverse_kl", "logits")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_autograd_step_studys_ways_give_the_head_its_true_gradients(loss, fmt, dtype, device):
    """perfutils.studies.autograd_step times the loss behind an output head three ways; each is checked (the loss
    and both weights' gradients against float64) before it is timed, and they must agree."""
    from perfutils.studies import autograd_step

    h, w, target = autograd_step.head_inputs(5, 37, 12, fmt, device=device, dtype=dtype, seed=3)
    ways = autograd_step.WAYS if fmt == "labels" else autograd_step.WAYS[:2]
    grads = {}
    for way in ways:
        errors = autograd_step.check(way, h, w, target, loss, fmt)
        assert max(errors.values()) <= autograd_step.TOLERANCE[str(dtype)]
        grads[way] = (h.grad.clone(), w.grad.clone())
    assert torch.equal(grads["autograd"][0], grads["plain"][0]) and torch.equal(grads["autograd"][1], grads["plain"][1])
    h.grad = torch.ones_like(h)  # what is timed starts from cleared gradients, as a training step does
    autograd_step.timed_step("plain", h, w, target, loss, fmt)()
    assert torch.equal(h.grad, grads["plain"][0])
    with pytest.raises(ValueError, match="cross_entropy from labels"):
        autograd_step.step("torch", h, w, target, "forward_kl", "logits")


def test_compiled_step_that_calls_backward_twice(gen, device):
    x, target = problem("forward_kl", "logits", gen, device)

    @torch.compile(backend="aot_eager" if device == "cpu" else "inductor")
    def step(x, target):
        value = entropy_loss(x, target, "forward_kl", "logits")
        (norm_grad,) = torch.autograd.grad(value, x, retain_graph=True)
        (2 * value).backward()
        return norm_grad

    first = step(x, target)
    expected = true_gradient(x, target, "forward_kl", "logits")
    assert_close(first, expected)
    assert_close(x.grad, 2 * expected)


BAD_ROWS = {"nan": float("nan"), "+inf": float("inf"), "all -inf": None}


@pytest.mark.parametrize("variant", ["fused", "two_pass", "split_row", "auto"])
@pytest.mark.parametrize("loss, fmt", LOSS_FORMATS)
@pytest.mark.parametrize("bad", list(BAD_ROWS))
def test_a_bad_row_gives_a_nan_loss_and_a_nan_gradient_row(loss, fmt, variant, bad, gen, device):
    """The same for the four losses: a row with a NaN, a +inf or only -inf logits has a NaN gradient row (reverse KL
    once returned zeros there), and the other rows are untouched."""
    x, target = problem(loss, fmt, gen, device, rows=3)
    logits = x.detach().clone()
    if BAD_ROWS[bad] is None:
        logits[1] = float("-inf")
    else:
        logits[1, 5] = BAD_ROWS[bad]
    value, grad = kernels.entropy_loss_forward_backward(logits, target, loss=loss, target_format=fmt, variant=variant)
    assert value.isnan()
    assert grad[1].isnan().all(), grad[1]
    assert grad[[0, 2]].isfinite().all()


def test_cpu_tensors_without_the_interpreter_say_what_to_do():
    """Without TRITON_INTERPRET a CPU call must say where the tensors are and what to do, not Triton's "0 active
    drivers"."""
    code = ("import torch, kernels\n"
            "kernels.entropy_loss_forward_backward(torch.randn(2, 8), torch.tensor([1, 2]))\n")
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""  # also on a GPU machine: CPU tensors, compiled kernels
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("RuntimeError: the tensors are on the CPU"), result.stderr[-2000:]
    assert "TRITON_INTERPRET=1" in last and "CUDA device" in last


@pytest.mark.gpu
@pytest.mark.parametrize("loss, fmt", LOSS_FORMATS)
def test_autograd_step_makes_no_host_sync(loss, fmt, gen):
    """A repeated autograd step (forward, first backward, a second use of the graph) never waits for the GPU."""
    x, target = problem(loss, fmt, gen, "cuda", rows=64, vocab=32000)
    for _ in range(2):  # first calls plan and compile (they may sync); the steps after them must not
        value = entropy_loss(x, target, loss, fmt)
        value.backward(retain_graph=True)
        value.backward()
    x.grad = None
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        value = entropy_loss(x, target, loss, fmt)
        (2 * value).backward(retain_graph=True)
        value.backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert_close(x.grad, true_gradient(x, target, loss, fmt, 3.0))


@pytest.mark.gpu
def test_autograd_step_replays_in_a_cuda_graph(gen):
    """The user's way out of a host-bound autograd step: capture forward and backward in a CUDA graph."""
    x, labels = problem("cross_entropy", "labels", gen, "cuda", rows=64, vocab=32000)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):  # warm: plans, compiles, templates
            x.grad = None
            entropy_loss(x, labels, "cross_entropy", "labels").backward()
    torch.cuda.current_stream().wait_stream(side)
    x.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        value = entropy_loss(x, labels, "cross_entropy", "labels")
        value.backward()
    static_grad = x.grad
    with torch.no_grad():
        x.copy_(torch.randn(x.shape, generator=gen).to("cuda"))
        labels.copy_(torch.randint(0, 32000, labels.shape, generator=gen).to("cuda"))
    graph.replay()
    torch.cuda.synchronize()
    assert_close(static_grad, true_gradient(x, labels, "cross_entropy", "labels"))
