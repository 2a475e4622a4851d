"""Argument checking: every bad argument raises ValueError / TypeError naming it, before any launch.

``no_launch`` replaces ``kernels.launch.Launch.__call__`` with a function that fails the test, so an
error raised from inside a kernel (or a silently wrong launch) cannot pass for a clean rejection.
"""

from __future__ import annotations

import pytest
import torch

import kernels
from kernels.launch import Launch

VARIANTS = ["fused", "two_pass", "split_row", "auto"]
V = 10


@pytest.fixture(autouse=True)
def no_launch(monkeypatch):
    def refuse(self):
        raise AssertionError(f"launch {self.name!r} ran although the arguments were invalid")

    monkeypatch.setattr(Launch, "__call__", refuse)


@pytest.fixture
def logits(device):
    return torch.randn(4, V, device=device)


@pytest.fixture
def labels(device):
    return torch.tensor([0, 3, V - 1, -100], device=device)


def call(logits, target, **options):
    return kernels.entropy_loss_forward_backward(logits, target, **options)


# --------------------------------------------------------------------------------------------
# logits
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize(
    "bad, error",
    [
        (torch.ones(4, V, dtype=torch.int32), TypeError),
        (torch.ones(4, V, dtype=torch.int64), TypeError),
        (torch.ones(4, V, dtype=torch.float64), TypeError),
        (torch.ones(4, V, dtype=torch.bool), TypeError),
        (torch.tensor(1.0), ValueError),
        (torch.ones(4, 0), ValueError),
    ],
    ids=["int32", "int64", "float64", "bool", "0-d", "empty-vocab"],
)
def test_bad_logits(bad, error, variant, device):
    labels = torch.zeros(bad.shape[:-1] if bad.dim() else (), dtype=torch.long, device=device)
    with pytest.raises(error, match="logits"):
        call(bad.to(device), labels, variant=variant)


def test_logits_not_a_tensor(labels):
    with pytest.raises(TypeError, match="logits"):
        call([[0.0] * V] * 4, labels)


# --------------------------------------------------------------------------------------------
# labels
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
def test_labels_float(logits, variant):
    with pytest.raises(TypeError, match="target"):
        call(logits, torch.zeros(4, device=logits.device), variant=variant)


@pytest.mark.parametrize("shape", [(3,), (4, 1), (2, 2), ()], ids=str)
def test_labels_wrong_shape(logits, shape):
    with pytest.raises(ValueError, match="target.*shape"):
        call(logits, torch.zeros(shape, dtype=torch.long, device=logits.device))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("bad_label", [V, V + 5, -1, -99])
def test_labels_out_of_range(logits, labels, bad_label, variant):
    labels = labels.clone()
    labels[1] = bad_label
    with pytest.raises(ValueError, match=r"target \(labels\) must lie in \[0, 10\)"):
        call(logits, labels, variant=variant)


def test_labels_custom_ignore_index(logits, labels):
    """Labels equal to ignore_index are allowed anywhere; other out-of-range labels are not."""
    labels = labels.clone()
    labels[3] = -1
    with pytest.raises(ValueError, match="ignore_index=-100"):
        call(logits, labels)
    prepared = kernels.prepare(logits, labels, ignore_index=-1)
    assert prepared.launches  # accepted (and not run)


def test_labels_out_of_range_in_masked_row_still_rejected(logits, labels):
    """A masked row's label is still checked: it must be a valid index or ignore_index."""
    labels = labels.clone()
    labels[0] = V
    mask = torch.tensor([False, True, True, True], device=logits.device)
    with pytest.raises(ValueError, match="target"):
        call(logits, labels, loss_mask=mask)


def test_ignore_index_not_int(logits, labels):
    with pytest.raises(TypeError, match="ignore_index"):
        call(logits, labels, ignore_index=-100.0)


# --------------------------------------------------------------------------------------------
# target logits
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("loss", ["cross_entropy", "forward_kl", "reverse_kl"])
@pytest.mark.parametrize("shape", [(4, V + 1), (4, 1, V), (3, V), (4 * V,)], ids=str)
def test_target_logits_wrong_shape(logits, loss, shape):
    with pytest.raises(ValueError, match="target"):
        call(logits, torch.randn(shape, device=logits.device), loss=loss, target_format="logits")


@pytest.mark.parametrize("dtype", [torch.float64, torch.int64])
def test_target_logits_wrong_dtype(logits, dtype):
    with pytest.raises(TypeError, match="target"):
        call(logits, torch.zeros(4, V, dtype=dtype, device=logits.device), loss="reverse_kl", target_format="logits")


def test_target_not_a_tensor(logits):
    with pytest.raises(TypeError, match="target"):
        call(logits, [0, 1, 2, 3])


# --------------------------------------------------------------------------------------------
# loss_mask
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("target_format", ["labels", "logits"])
@pytest.mark.parametrize("shape", [(3,), (4, 1), (4, V), ()], ids=str)
def test_mask_wrong_shape(logits, labels, target_format, shape):
    target = labels if target_format == "labels" else torch.randn_like(logits)
    mask = torch.ones(shape, dtype=torch.bool, device=logits.device)
    with pytest.raises(ValueError, match="loss_mask"):
        call(logits, target, target_format=target_format, loss_mask=mask)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int64, torch.float32])
def test_mask_wrong_dtype(logits, labels, dtype):
    with pytest.raises(TypeError, match="loss_mask"):
        call(logits, labels, loss_mask=torch.ones(4, dtype=dtype, device=logits.device))


def test_mask_not_a_tensor(logits, labels):
    with pytest.raises(TypeError, match="loss_mask"):
        call(logits, labels, loss_mask=[True, True, False, True])


# --------------------------------------------------------------------------------------------
# loss, target_format, variant
# --------------------------------------------------------------------------------------------


def test_unknown_loss(logits, labels):
    with pytest.raises(ValueError, match="loss"):
        call(logits, labels, loss="kl")


def test_unknown_target_format(logits, labels):
    with pytest.raises(ValueError, match="target_format"):
        call(logits, labels, target_format="probabilities")


@pytest.mark.parametrize("variant", ["Fused", "split", "", None])
def test_unknown_variant(logits, labels, variant):
    with pytest.raises(ValueError, match="variant"):
        call(logits, labels, variant=variant)


@pytest.mark.parametrize("loss", ["forward_kl", "reverse_kl"])
def test_kl_with_labels(logits, labels, loss):
    with pytest.raises(ValueError, match="target_format"):
        call(logits, labels, loss=loss, target_format="labels")


# --------------------------------------------------------------------------------------------
# block_size, num_warps, variant options
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize(
    "block_size, error",
    [(48, ValueError), (100, ValueError), (8, ValueError), (1, ValueError), (0, ValueError), (-64, ValueError),
     (131072, ValueError), (64.0, TypeError), ("64", TypeError), (True, TypeError)],
    ids=["48", "100", "8-too-small", "1", "0", "negative", "131072-too-large", "float", "str", "bool"],
)
def test_bad_block_size(logits, labels, variant, block_size, error):
    with pytest.raises(error, match="block_size"):
        call(logits, labels, variant=variant, block_size=block_size)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("num_warps", [0, 3, 6, 64, 4.0, True])
def test_bad_num_warps(logits, labels, variant, num_warps):
    with pytest.raises(ValueError, match="num_warps"):
        call(logits, labels, variant=variant, num_warps=num_warps)


@pytest.mark.parametrize(
    "variant, options, name",
    [
        ("fused", {"cooperative": True}, "cooperative"),
        ("fused", {"stats_block_size": 64}, "stats_block_size"),
        ("two_pass", {"cooperative": False}, "cooperative"),
        ("split_row", {"grad_num_warps": 4}, "grad_num_warps"),
        ("auto", {"tile": 64}, "tile"),
    ],
)
def test_unknown_variant_option(logits, labels, variant, options, name):
    with pytest.raises(TypeError, match=name):
        call(logits, labels, variant=variant, **options)


@pytest.mark.parametrize(
    "options, name",
    [
        ({"stats_block_size": 48}, "stats_block_size"),
        ({"grad_block_size": 8}, "grad_block_size"),
        ({"stats_num_warps": 3}, "stats_num_warps"),
        ({"grad_num_warps": 64}, "grad_num_warps"),
    ],
)
def test_bad_two_pass_options(logits, labels, options, name):
    with pytest.raises(ValueError, match=name):
        call(logits, labels, variant="two_pass", **options)


def test_bad_cooperative(logits, labels):
    with pytest.raises(TypeError, match="cooperative"):
        call(logits, labels, variant="split_row", block_size=16, cooperative="yes")


def test_cooperative_needs_gpu(logits, labels):
    """cooperative=True cannot run under the interpreter or on CPU tensors: refused with a reason."""
    if logits.device.type == "cuda" and not kernels.launch.interpreting():
        pytest.skip("a compiled CUDA run may go cooperative; the refusal is tested in test_gpu_kernels.py")
    wide = torch.randn(4, 40, device=logits.device)  # 3 chunks of 16: a row needs an exchange
    with pytest.raises(ValueError, match="cooperative"):
        call(wide, labels, variant="split_row", block_size=16, cooperative=True)


# --------------------------------------------------------------------------------------------
# grad_output, devices
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "grad_output, error",
    [(torch.ones(2), ValueError), ("1", TypeError), (True, TypeError), ([1.0], TypeError)],
    ids=["two-elements", "str", "bool", "list"],
)
def test_bad_grad_output(logits, labels, grad_output, error):
    with pytest.raises(error, match="grad_output"):
        call(logits, labels, grad_output=grad_output)


def test_target_on_other_device(logits, labels):
    """A target on another device is refused by name. Without a second real device, 'meta' stands in."""
    other = torch.device("meta")
    with pytest.raises(ValueError, match="target.*device"):
        call(logits, labels.to(other))
    with pytest.raises(ValueError, match="target.*device"):
        call(logits, torch.randn(4, V, device=other), loss="reverse_kl", target_format="logits")


def test_mask_on_other_device(logits, labels):
    mask = torch.ones(4, dtype=torch.bool, device="meta")
    with pytest.raises(ValueError, match="loss_mask is on meta"):
        call(logits, labels, loss_mask=mask)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA for a real second device")
def test_cpu_target_with_cuda_logits():
    logits = torch.randn(4, V, device="cuda")
    with pytest.raises(ValueError, match="target.*device"):
        call(logits, torch.zeros(4, dtype=torch.long))


def test_prepare_validates_without_running(logits, labels):
    """prepare() checks everything and builds launches; nothing runs until Plan.run()."""
    plan = kernels.prepare(logits, labels, variant="two_pass", block_size=16)
    assert [launch.name for launch in plan.launches] == ["two_pass.stats", "two_pass.grad"]
    with pytest.raises(AssertionError, match="ran although"):
        plan.run()  # the no_launch fixture proves the launch is only reached here
