"""Semantics at the edges, for every variant: NaN, -inf, rows that do not count, empty batches, strides.

The contract (kernels/reference.py, row_math.py): NaN inputs give a NaN loss, never a finite wrong
number; -inf logits are masked vocabulary entries (probability 0, gradient 0, 0·log 0 := 0); a row
whose every logit is -inf gives NaN; ignored / masked rows leave the mean and get a zero gradient;
when no row counts the loss is 0 and the gradient zeros; an empty batch gives loss 0 and an empty
gradient; any row stride (and any layout) gives the result of the contiguous copy.

Rows are split into several tiles / chunks (block_size < vocab), so the special values also meet
the online-softmax merges of the multi-tile (fused, two_pass) and multi-chunk (split_row) paths.
The > 2**31-element case is GPU-only (test_gpu_kernels.py).
"""

from __future__ import annotations

import pytest
import torch

import kernels

VARIANTS = ["fused", "two_pass", "split_row", "auto"]
LOSS_FORMATS = [
    ("cross_entropy", "labels"),
    ("cross_entropy", "logits"),
    ("forward_kl", "logits"),
    ("reverse_kl", "logits"),
]
LOSS_IDS = [f"{loss}-{fmt}" for loss, fmt in LOSS_FORMATS]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
BLOCK = 32
VOCAB = 70  # 3 tiles / chunks of 32, the last one partial (6 columns)

every_case = pytest.mark.parametrize("variant", VARIANTS)
every_loss = pytest.mark.parametrize("loss_index", range(len(LOSS_FORMATS)), ids=LOSS_IDS)


def run(logits, target, loss, fmt, variant, **options):
    options.setdefault("block_size", BLOCK)
    return kernels.entropy_loss_forward_backward(logits, target, loss=loss, target_format=fmt, variant=variant, **options)


def case_dtype(loss_index, variant):
    return DTYPES[(loss_index + VARIANTS.index(variant)) % len(DTYPES)]


# --------------------------------------------------------------------------------------------
# NaN
# --------------------------------------------------------------------------------------------


@every_case
@every_loss
def test_nan_logit_gives_nan_loss(loss_index, variant, gen, oracle):
    loss, fmt = LOSS_FORMATS[loss_index]
    logits, target = oracle.make_inputs(gen, (3, VOCAB), case_dtype(loss_index, variant), fmt)
    # Rotate the NaN over the first tile, an interior tile and the partial last tile.
    column = (0, 40, VOCAB - 1)[(loss_index + VARIANTS.index(variant)) % 3]
    logits[1, column] = float("nan")
    value, _ = run(logits, target, loss, fmt, variant)
    assert torch.isnan(value), f"NaN at column {column} gave a finite loss {value.item()}"
    value, _ = run(logits, target, loss, fmt, variant, grad_output=None)
    assert torch.isnan(value)


@every_case
@pytest.mark.parametrize("loss_index", range(1, len(LOSS_FORMATS)), ids=LOSS_IDS[1:])
def test_nan_target_gives_nan_loss(loss_index, variant, gen, oracle):
    loss, fmt = LOSS_FORMATS[loss_index]
    logits, target = oracle.make_inputs(gen, (3, VOCAB), torch.float32, fmt)
    target[2, 60] = float("nan")
    value, _ = run(logits, target, loss, fmt, variant)
    assert torch.isnan(value), f"NaN target gave a finite loss {value.item()}"


@every_case
@every_loss
def test_nan_in_row_that_does_not_count(loss_index, variant, gen, oracle):
    """A NaN in an ignored (or masked) row changes nothing: finite loss, that row's gradient is 0."""
    loss, fmt = LOSS_FORMATS[loss_index]
    logits, target = oracle.make_inputs(gen, (3, VOCAB), torch.float32, fmt)
    logits[1, 40] = float("nan")
    mask = torch.tensor([True, False, True], device=logits.device)
    options = {"loss_mask": mask}
    if fmt == "labels" and VARIANTS.index(variant) % 2:
        target[1] = -100
        options = {}
    value, grad = result = run(logits, target, loss, fmt, variant, **options)
    assert torch.isfinite(value) and torch.isfinite(grad).all()
    assert torch.count_nonzero(grad[1]) == 0
    clean = logits.clone()
    clean[1] = 0.0
    oracle.check(clean, target, result, loss=loss, target_format=fmt, loss_mask=mask)


# --------------------------------------------------------------------------------------------
# -inf: masked vocabulary entries
# --------------------------------------------------------------------------------------------


def masked_vocab_oracle(oracle, logits, target, keep, loss, fmt):
    """The loss with the -inf columns removed from each row, and its gradient (0 at removed columns).

    Each row's loss comes from the PyTorch oracle on that row's finite columns alone; the batch loss
    is the mean over rows, so a row's gradient is its own gradient divided by the number of rows.
    """
    n_rows = logits.shape[0]
    total = 0.0
    grad = torch.zeros(logits.shape, dtype=torch.float64)
    for row in range(n_rows):
        cols = keep[row].nonzero().squeeze(-1)
        x = logits[row, cols].unsqueeze(0)
        if fmt == "labels":
            t = (cols == target[row]).nonzero().reshape(1)  # the label's position among kept columns
        else:
            t = target[row, cols].unsqueeze(0)
        row_loss, row_grad = oracle.torch_loss(x, t, loss=loss, target_format=fmt)
        total += row_loss.item()
        grad[row, cols] = row_grad[0].cpu() / n_rows
    return torch.tensor(total / n_rows, dtype=torch.float64), grad


@every_case
@every_loss
def test_neg_inf_logits_are_masked_entries(loss_index, variant, gen, oracle):
    loss, fmt = LOSS_FORMATS[loss_index]
    dtype = case_dtype(loss_index, variant)
    logits, target = oracle.make_inputs(gen, (4, VOCAB), dtype, fmt)
    keep = torch.rand(4, VOCAB, generator=gen) > 0.3  # scattered masked entries, different per row
    keep[0, 32:64] = False  # a whole tile of -inf (its max is -inf)
    keep[1, :40] = False  # the first tile entirely, and some of the second
    keep[2, 64:] = False  # the partial last tile entirely
    keep[3, 0] = True
    keep[:, 50] = True  # at least one finite entry per row
    if fmt == "labels":
        target = torch.where(keep.to(target.device).gather(1, target.unsqueeze(1)).squeeze(1), target,
                             torch.full_like(target, 50))
    logits[~keep] = float("-inf")
    if fmt == "logits":
        target[~keep] = float("-inf")  # the target distribution has the same support
    value, grad = run(logits, target, loss, fmt, variant)
    ref_loss, ref_grad = masked_vocab_oracle(oracle, logits.cpu(), target.cpu(), keep, loss, fmt)
    tol = oracle.TOLERANCE[dtype]
    assert torch.isfinite(value), f"loss {value.item()}"
    assert oracle.rel_err(value, ref_loss) <= tol, (value.item(), ref_loss.item())
    assert torch.isfinite(grad).all(), "gradient has NaN/inf"
    assert torch.count_nonzero(grad[~keep.to(grad.device)]) == 0, "gradient at -inf logits must be 0"
    assert oracle.rel_err(grad, ref_grad) <= tol
    # The package's reference agrees.
    pkg_loss, pkg_grad = kernels.reference.entropy_loss_forward_backward(logits, target, loss=loss, target_format=fmt)
    assert oracle.rel_err(pkg_loss, ref_loss) <= 1e-12 and oracle.rel_err(pkg_grad, ref_grad) <= 1e-12


@every_case
@every_loss
def test_all_neg_inf_row_gives_nan(loss_index, variant, gen, oracle):
    loss, fmt = LOSS_FORMATS[loss_index]
    logits, target = oracle.make_inputs(gen, (3, VOCAB), torch.float32, fmt)
    logits[1] = float("-inf")
    if fmt == "logits" and VARIANTS.index(variant) % 2:
        target[1] = float("-inf")  # both distributions empty (else only the logits' one)
    value, _ = run(logits, target, loss, fmt, variant)
    assert torch.isnan(value), f"an all -inf row gave {value.item()}"


# --------------------------------------------------------------------------------------------
# Rows that do not count
# --------------------------------------------------------------------------------------------


@every_case
@every_loss
def test_ignored_rows_get_zero_gradient(loss_index, variant, gen, oracle):
    """Rows that do not count get exact zeros (the gradient buffer starts uninitialised)."""
    loss, fmt = LOSS_FORMATS[loss_index]
    dtype = case_dtype(loss_index, variant)
    logits, target = oracle.make_inputs(gen, (4, VOCAB), dtype, fmt)
    mask = torch.tensor([False, True, False, True], device=logits.device)
    if fmt == "labels":
        target[~mask] = -100
        options = {}
    else:
        options = {"loss_mask": mask}
    value, grad = result = run(logits, target, loss, fmt, variant, **options)
    assert torch.count_nonzero(grad[~mask]) == 0
    oracle.check(logits, target, result, loss=loss, target_format=fmt, loss_mask=mask)


@every_case
@every_loss
def test_no_row_counts(loss_index, variant, gen, oracle):
    """Every row ignored or masked: the loss is exactly 0 and the gradient all zeros."""
    loss, fmt = LOSS_FORMATS[loss_index]
    logits, target = oracle.make_inputs(gen, (3, VOCAB), case_dtype(loss_index, variant), fmt)
    masks = [torch.zeros(3, dtype=torch.bool, device=logits.device)]
    if fmt == "labels":
        target[:] = -100
        masks.append(None)
    for mask in masks:
        value, grad = run(logits, target, loss, fmt, variant, loss_mask=mask)
        assert value.item() == 0.0 and value.dtype == torch.float32 and value.dim() == 0
        assert grad.shape == logits.shape and grad.dtype == logits.dtype
        assert torch.count_nonzero(grad) == 0


@every_case
@every_loss
def test_empty_batch(loss_index, variant, oracle, device):
    loss, fmt = LOSS_FORMATS[loss_index]
    for shape in [(0, VOCAB), (2, 0, VOCAB)]:
        logits = torch.randn(shape, device=device, dtype=torch.bfloat16)
        target = (torch.zeros(shape[:-1], dtype=torch.long, device=device) if fmt == "labels"
                  else torch.randn(shape, device=device))
        value, grad = run(logits, target, loss, fmt, variant)
        assert value.item() == 0.0 and value.dtype == torch.float32 and value.dim() == 0
        assert grad.shape == shape and grad.dtype == torch.bfloat16
        value, grad = run(logits, target, loss, fmt, variant, grad_output=None, loss_mask=torch.ones(
            shape[:-1], dtype=torch.bool, device=device))
        assert value.item() == 0.0 and grad is None


# --------------------------------------------------------------------------------------------
# Layouts: row stride != vocab, column stride != 1, batch dims that cannot be flattened
# --------------------------------------------------------------------------------------------

PAD = 37


def make_layout(layout: str, shape: tuple[int, int], dtype, gen, device):
    """A tensor of the given (rows, vocab) shape (or (2, rows // 2, vocab)) in a non-contiguous layout."""
    rows, vocab = shape

    def randn(*size):
        return (torch.randn(size, generator=gen, dtype=torch.float64) * 3).to(dtype).to(device)

    if layout == "column_slice":  # row stride vocab + PAD, with a storage offset
        return randn(rows + 1, vocab + PAD + 5)[1:, 5:5 + vocab]
    if layout == "row_step":  # every other row of a contiguous buffer: row stride 2 * vocab
        return randn(2 * rows, vocab)[::2]
    if layout == "transposed":  # column stride != 1: stride (1, rows)
        return randn(vocab, rows).t()
    if layout == "batch_transposed":  # (2, rows // 2, vocab) whose batch dims do not flatten into one stride
        return randn(rows // 2, 2, vocab).transpose(0, 1)
    if layout == "expanded":  # one row broadcast to all rows: row stride 0
        return randn(1, vocab).expand(rows, vocab)
    raise ValueError(layout)


LAYOUTS = ["column_slice", "row_step", "transposed", "batch_transposed", "expanded"]


@every_case
@every_loss
def test_non_contiguous_inputs(loss_index, variant, gen, oracle, device):
    """Any layout gives what the contiguous copy gives (one layout per case, in rotation: every
    loss and every variant meets every layout)."""
    loss, fmt = LOSS_FORMATS[loss_index]
    dtype = case_dtype(loss_index, variant)
    for layout in [LAYOUTS[(loss_index + VARIANTS.index(variant)) % len(LAYOUTS)]]:
        logits = make_layout(layout, (4, VOCAB), dtype, gen, device)
        assert not logits.is_contiguous()
        if fmt == "labels":
            target = torch.randint(0, VOCAB, (8,), generator=gen).to(device)[::2].reshape(logits.shape[:-1])
        else:
            # The target in another 2-D layout (or the same batch layout, whose shape it must share).
            target_layout = layout if layout == "batch_transposed" else LAYOUTS[(LAYOUTS.index(layout) + 1) % 3]
            target = make_layout(target_layout, (4, VOCAB), dtype, gen, device)
        mask = torch.tensor([True, True, False, True], device=device).reshape(logits.shape[:-1])
        value, grad = run(logits, target, loss, fmt, variant, loss_mask=mask)
        copy_value, copy_grad = run(logits.contiguous(), target.contiguous(), loss, fmt, variant, loss_mask=mask)
        assert grad.shape == logits.shape and grad.is_contiguous()
        torch.testing.assert_close(value, copy_value, rtol=1e-6, atol=0, msg=f"{layout}: loss differs")
        torch.testing.assert_close(grad, copy_grad, rtol=1e-6, atol=0, msg=f"{layout}: grad differs")
        oracle.check(logits, target, (value, grad), loss=loss, target_format=fmt, loss_mask=mask, label=layout)


@every_case
@every_loss
def test_unbatched_logits(loss_index, variant, gen, oracle):
    """1-D logits (vocab,) with a 0-d label (or 1-D target logits): one row, grad of shape (vocab,)."""
    loss, fmt = LOSS_FORMATS[loss_index]
    logits, target = oracle.make_inputs(gen, (VOCAB,), torch.float32, fmt)
    assert target.dim() == (0 if fmt == "labels" else 1)
    result = run(logits, target, loss, fmt, variant)
    oracle.check(logits, target, result, loss=loss, target_format=fmt)
    assert result[1].shape == (VOCAB,)


@pytest.mark.parametrize("variant", ["fused", "two_pass", "split_row"])
def test_row_stride_is_not_copied(variant, gen, oracle, device):
    """A column slice (unit column stride) is passed to the kernels as is, with its own row stride."""
    big = torch.randn(3, VOCAB + PAD, generator=gen).to(device)
    logits = big[:, :VOCAB]
    target = torch.randn(6, VOCAB + PAD, generator=gen).to(device)[::2, PAD:]
    plan = kernels.prepare(logits, target, loss="reverse_kl", target_format="logits", variant=variant, block_size=BLOCK)
    first = plan.launches[0]
    assert first.args["logits_ptr"].data_ptr() == big.data_ptr()
    assert first.args["logits_stride"] == VOCAB + PAD
    assert first.args["target_stride"] == 2 * (VOCAB + PAD)
    oracle.check(logits, target, plan.run(), loss="reverse_kl", target_format="logits")
