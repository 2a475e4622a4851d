"""Shared test setup: interpreter or compiled mode, seeded generators, the `gpu` marker, and a float64 oracle.

Mode. Without a CUDA GPU the Triton kernels run under the interpreter (``TRITON_INTERPRET=1``), which
must be set before ``triton.jit`` decorates anything, i.e. before ``kernels`` is imported: this file is
imported by pytest before any test module. With a GPU the kernels stay compiled and the CPU-sized
tests run on the GPU (``DEVICE``). An explicit ``TRITON_INTERPRET`` in the environment always wins.

Oracle. ``Oracle.torch_loss`` is the ground truth of the correctness tests: PyTorch's own
``F.cross_entropy`` / ``F.kl_div`` in float64 and ``torch.autograd`` for the gradient, independent of
``kernels.reference``. Tests get it through the session fixture ``oracle``.
"""

from __future__ import annotations

import os
import zlib

import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch.nn.functional as F  # noqa: E402

DEVICE = "cuda" if HAS_CUDA else "cpu"

# Relative L2 error allowed against the float64 oracle evaluated on the same (upcast) inputs.
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-2}

# (loss, target_format) pairs the kernels implement.
LOSS_FORMATS = [
    ("cross_entropy", "labels"),
    ("cross_entropy", "logits"),
    ("forward_kl", "logits"),
    ("reverse_kl", "logits"),
]


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (skipped otherwise)")
    # The interpreter evaluates masked lanes too (log2(0), 0/0, -inf - -inf in padding and ignored
    # rows): numpy warns, the kernels discard those values. Only warnings raised from the
    # interpreter's own frames are silenced.
    for message in ("divide by zero encountered", "invalid value encountered", "overflow encountered"):
        config.addinivalue_line("filterwarnings", rf"ignore:{message}:RuntimeWarning:triton\.runtime\.interpreter")
    # Triton 3.6's interpreter calls int() on a 1-element array (numpy >= 1.25 deprecates it).
    config.addinivalue_line(
        "filterwarnings", r"ignore:Conversion of an array with ndim > 0:DeprecationWarning:triton\.runtime\.interpreter"
    )


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def seed_of(nodeid: str) -> int:
    """A stable seed per test case (same on every run, different between parametrized cases)."""
    return zlib.crc32(nodeid.encode())


@pytest.fixture
def seed(request) -> int:
    return seed_of(request.node.nodeid)


@pytest.fixture
def gen(seed) -> torch.Generator:
    """A CPU generator seeded from the test's node id: fresh inputs per case, reproducible per run."""
    return torch.Generator().manual_seed(seed)


@pytest.fixture(scope="session")
def device() -> str:
    return DEVICE


class Oracle:
    """Float64 ground truth from PyTorch's own loss functions, plus comparison helpers."""

    TOLERANCE = TOLERANCE
    LOSS_FORMATS = LOSS_FORMATS
    DEVICE = DEVICE

    @staticmethod
    def torch_loss(logits, target, *, loss="cross_entropy", target_format="labels", ignore_index=-100,
                   loss_mask=None, grad_output=1.0):
        """(loss, grad) in float64: the mean of the loss over the rows that count, 0 when none counts.

        Uses F.cross_entropy (labels or probability targets) and F.kl_div (batchmean) on the rows that
        count, and torch.autograd for d(grad_output * loss)/d logits. Inputs are upcast, never rounded.
        """
        vocab = logits.shape[-1]
        x = logits.detach().double().reshape(-1, vocab).requires_grad_(True)
        n_rows = x.shape[0]
        keep = torch.ones(n_rows, dtype=torch.bool, device=x.device)
        if loss_mask is not None:
            keep &= loss_mask.reshape(-1).to(x.device)
        if target_format == "labels":
            labels = target.reshape(-1).long().to(x.device)
            keep &= labels != ignore_index
            # Rows removed by the mask become ignored rows, so PyTorch's own ignore_index does the rest.
            labels = torch.where(keep, labels, torch.full_like(labels, ignore_index))
            if keep.any():
                value = F.cross_entropy(x, labels, ignore_index=ignore_index, reduction="mean")
            else:
                value = x.sum() * 0.0  # PyTorch gives NaN here; the kernels' contract is 0
        else:
            t = target.detach().double().reshape(-1, vocab).to(x.device)
            xs, ts = x[keep], t[keep]
            if not keep.any():
                value = x.sum() * 0.0
            elif loss == "cross_entropy":
                value = F.cross_entropy(xs, ts.softmax(-1), reduction="mean")
            elif loss == "forward_kl":
                value = F.kl_div(xs.log_softmax(-1), ts.softmax(-1), reduction="batchmean")
            elif loss == "reverse_kl":
                value = F.kl_div(ts.log_softmax(-1), xs.softmax(-1), reduction="batchmean")
            else:
                raise ValueError(loss)
        if grad_output is None:
            return value.detach(), None
        (grad,) = torch.autograd.grad(value * float(grad_output), x)
        return value.detach(), grad.reshape(logits.shape)

    @staticmethod
    def rel_err(actual, expected) -> float:
        """||a - b||_2 / ||b||_2 in float64 (the absolute error when b is exactly 0, e.g. vocab 1)."""
        a = torch.as_tensor(actual).detach().double().cpu()
        b = torch.as_tensor(expected).detach().double().cpu()
        diff = torch.linalg.vector_norm((a - b).reshape(-1)).item()
        norm = torch.linalg.vector_norm(b.reshape(-1)).item()
        return diff / norm if norm > 0 else diff

    @classmethod
    def check(cls, logits, target, result, *, dtype=None, label="", **options):
        """Compare a kernel's (loss, grad) with the oracle; check types and shapes. Returns the errors."""
        loss, grad = result
        dtype = dtype or logits.dtype
        tol = cls.TOLERANCE[dtype]
        ref_loss, ref_grad = cls.torch_loss(logits, target, **options)
        assert isinstance(loss, torch.Tensor) and loss.dim() == 0 and loss.dtype == torch.float32, (
            f"loss must be a 0-d float32 tensor, got {getattr(loss, 'dtype', type(loss))} "
            f"shape {tuple(getattr(loss, 'shape', ()))}"
        )
        loss_err = cls.rel_err(loss, ref_loss)
        assert loss_err <= tol, f"{label} loss {loss.item()!r} vs {ref_loss.item()!r}: rel err {loss_err:.3e} > {tol}"
        grad_err = None
        if options.get("grad_output", 1.0) is None:
            assert grad is None, "forward-only (grad_output=None) must return grad=None"
        else:
            assert grad is not None
            assert grad.dtype == logits.dtype, f"grad dtype {grad.dtype} != logits dtype {logits.dtype}"
            assert tuple(grad.shape) == tuple(logits.shape), f"grad shape {tuple(grad.shape)} != {tuple(logits.shape)}"
            grad_err = cls.rel_err(grad, ref_grad)
            assert grad_err <= tol, f"{label} grad rel err {grad_err:.3e} > {tol}"
        return loss_err, grad_err

    @staticmethod
    def make_inputs(gen, shape, dtype, target_format, *, scale=3.0, target_dtype=None, device=DEVICE):
        """Random logits (N(0, scale^2), rounded to dtype) and labels or target logits of the same shape."""
        logits = (torch.randn(shape, generator=gen, dtype=torch.float64) * scale).to(dtype)
        if target_format == "labels":
            target = torch.randint(0, shape[-1], shape[:-1], generator=gen)
        else:
            target = (torch.randn(shape, generator=gen, dtype=torch.float64) * scale).to(target_dtype or dtype)
        return logits.to(device), target.to(device)


@pytest.fixture(scope="session")
def oracle() -> type[Oracle]:
    return Oracle
