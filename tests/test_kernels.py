"""Correctness of every loss x variant x dtype against PyTorch's own losses in float64.

The oracle (``Oracle.torch_loss`` in conftest.py) is F.cross_entropy / F.kl_div on the same inputs
upcast to float64, with torch.autograd for the gradient. Tolerance: relative L2 error 1e-5 in fp32,
1e-2 in bf16/fp16 (the gradient is stored in the logits' dtype).

Sizes are chosen for the Triton interpreter (CPU): a distribution loss costs ~0.15 ms per padded
element there (its tuple reductions run element by element in Python), so vocabularies are large
only where they exercise a path (many tiles, many split_row chunks) and rows are few. Explicit
small block sizes force the multi-tile (fused, two_pass) and multi-chunk (split_row) code paths.
"""

from __future__ import annotations

import itertools

import pytest
import torch
import triton
import triton.language as tl

import kernels
from kernels import reference
from kernels.resident_row import high_half, low_half, pair_max
from kernels.row_math import (base2, gradient_from_summary, gradient_scales, lse_difference, row_loss, scaled_gradient,
                              tile_statistics, tile_statistics_raw)

VARIANTS = ["fused", "two_pass", "split_row", "auto"]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
LOSS_FORMATS = [
    ("cross_entropy", "labels"),
    ("cross_entropy", "logits"),
    ("forward_kl", "logits"),
    ("reverse_kl", "logits"),
]
LOSS_IDS = [f"{loss}-{fmt}" for loss, fmt in LOSS_FORMATS]
WARPS = [1, 2, 4, 8, 16, 32]


def dtype_id(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def run(logits, target, loss, fmt, variant, **options):
    return kernels.entropy_loss_forward_backward(logits, target, loss=loss, target_format=fmt, variant=variant, **options)


# --------------------------------------------------------------------------------------------
# The main matrix: every loss x variant x dtype, several tiles / chunks per row
# --------------------------------------------------------------------------------------------

MATRIX = list(itertools.product(range(len(LOSS_FORMATS)), VARIANTS, DTYPES))


@pytest.mark.parametrize(
    "loss_index, variant, dtype",
    MATRIX,
    ids=[f"{LOSS_IDS[i]}-{v}-{dtype_id(d)}" for i, v, d in MATRIX],
)
def test_matches_torch(loss_index, variant, dtype, gen, oracle):
    loss, fmt = LOSS_FORMATS[loss_index]
    # fp32: 1000 columns in tiles / chunks of 128, 8 per row, the last one partial. bf16 / fp16
    # (whose tolerance hides less): 300 columns in 5 tiles of 64, to keep the interpreter quick.
    vocab, block_size = (1000, 128) if dtype == torch.float32 else (300, 64)
    logits, target = oracle.make_inputs(gen, (3, vocab), dtype, fmt)
    num_warps = WARPS[(loss_index + VARIANTS.index(variant)) % len(WARPS)]
    result = run(logits, target, loss, fmt, variant, block_size=block_size, num_warps=num_warps)
    oracle.check(logits, target, result, loss=loss, target_format=fmt, label=f"{loss}/{fmt}/{variant}/{dtype}")


# --------------------------------------------------------------------------------------------
# Irregular vocabulary sizes
# --------------------------------------------------------------------------------------------

# (vocab, rows, block_size, dtype): 1 and 7 fit one tile (padding lanes), 5003 spans 20 tiles of 256.
VOCABS = [
    (1, 5, None, torch.bfloat16),
    (7, 6, None, torch.float16),
    (7, 4, 16, torch.float32),
    (5003, 2, 256, torch.float32),
]
# Every loss x variant at every vocab, except that at 5003 each variant runs labels CE and one of the
# (slow under the interpreter) distribution losses, in rotation.
VOCAB_CASES = [
    (i, v, k)
    for i, v, k in itertools.product(range(len(LOSS_FORMATS)), VARIANTS, range(len(VOCABS)))
    if VOCABS[k][0] != 5003 or i == 0 or i == 1 + VARIANTS.index(v) % 3
]


@pytest.mark.parametrize(
    "loss_index, variant, vocab_index",
    VOCAB_CASES,
    ids=[
        f"{LOSS_IDS[i]}-{v}-V{VOCABS[k][0]}-bs{VOCABS[k][2]}-{dtype_id(VOCABS[k][3])}"
        for i, v, k in VOCAB_CASES
    ],
)
def test_vocab_sizes(loss_index, variant, vocab_index, gen, oracle):
    loss, fmt = LOSS_FORMATS[loss_index]
    vocab, rows, block_size, dtype = VOCABS[vocab_index]
    logits, target = oracle.make_inputs(gen, (rows, vocab), dtype, fmt)
    result = run(logits, target, loss, fmt, variant, block_size=block_size)
    oracle.check(logits, target, result, loss=loss, target_format=fmt, label=f"V={vocab}")


def test_vocab_5003_default_blocks(gen, oracle):
    """Default configurations (no block_size): one wide tile per row, masked padding lanes (labels CE)."""
    logits, target = oracle.make_inputs(gen, (3, 5003), torch.bfloat16, "labels")
    for variant in VARIANTS:
        oracle.check(logits, target, run(logits, target, "cross_entropy", "labels", variant), label=variant)


# --------------------------------------------------------------------------------------------
# Rows that do not count: ignore_index and loss_mask
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("ignore_index", [-100, 5])
def test_ignored_rows(variant, ignore_index, gen, oracle):
    """Ignored rows leave the mean and get a zero gradient; ignore_index may be a valid column index."""
    dtype = DTYPES[VARIANTS.index(variant) % len(DTYPES)]
    logits, labels = oracle.make_inputs(gen, (6, 300), dtype, "labels")
    labels[1] = ignore_index
    labels[4] = ignore_index
    if ignore_index == 5:
        labels[2] = 6  # a neighbour of the ignored value still counts
    loss, grad = result = run(logits, labels, "cross_entropy", "labels", variant, block_size=64, ignore_index=ignore_index)
    oracle.check(logits, labels, result, ignore_index=ignore_index, label=variant)
    assert torch.count_nonzero(grad[[1, 4]]) == 0


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("loss_index", range(len(LOSS_FORMATS)), ids=LOSS_IDS)
def test_loss_mask(loss_index, variant, gen, oracle):
    """loss_mask=False rows leave the mean (reference: mean over unmasked rows) and get a zero gradient."""
    loss, fmt = LOSS_FORMATS[loss_index]
    dtype = DTYPES[(loss_index + VARIANTS.index(variant)) % len(DTYPES)]
    logits, target = oracle.make_inputs(gen, (5, 200), dtype, fmt)
    mask = torch.tensor([True, False, True, True, False], device=logits.device)
    if fmt == "labels":
        target[2] = -100  # masked and ignored rows together
    result = run(logits, target, loss, fmt, variant, block_size=64, loss_mask=mask)
    oracle.check(logits, target, result, loss=loss, target_format=fmt, loss_mask=mask, label=variant)
    assert torch.count_nonzero(result[1][~mask]) == 0


# --------------------------------------------------------------------------------------------
# grad_output, forward only, batch dimensions
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("loss_index", range(len(LOSS_FORMATS)), ids=LOSS_IDS)
def test_grad_output(loss_index, variant, gen, oracle):
    """The gradient is d(grad_output * loss)/d logits; grad_output may be a float or a 0-d tensor."""
    loss, fmt = LOSS_FORMATS[loss_index]
    logits, target = oracle.make_inputs(gen, (3, 200), torch.float32, fmt)
    grad_output = 0.37 if (loss_index + VARIANTS.index(variant)) % 2 else torch.tensor(0.37)
    result = run(logits, target, loss, fmt, variant, block_size=64, grad_output=grad_output)
    oracle.check(logits, target, result, loss=loss, target_format=fmt, grad_output=0.37, label=variant)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("loss_index", range(len(LOSS_FORMATS)), ids=LOSS_IDS)
def test_forward_only(loss_index, variant, gen, oracle):
    """grad_output=None: the same loss, no gradient (and no gradient launch)."""
    loss, fmt = LOSS_FORMATS[loss_index]
    dtype = DTYPES[(loss_index + VARIANTS.index(variant)) % len(DTYPES)]
    logits, target = oracle.make_inputs(gen, (3, 200), dtype, fmt)
    result = run(logits, target, loss, fmt, variant, block_size=64, grad_output=None)
    assert result[1] is None
    oracle.check(logits, target, result, loss=loss, target_format=fmt, grad_output=None, label=variant)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("loss_index", range(len(LOSS_FORMATS)), ids=LOSS_IDS)
def test_batch_dims(loss_index, variant, gen, oracle):
    """(*batch, vocab) inputs: labels and loss_mask have the batch shape, grad has logits' shape."""
    loss, fmt = LOSS_FORMATS[loss_index]
    dtype = DTYPES[(loss_index + 2 * VARIANTS.index(variant)) % len(DTYPES)]
    logits, target = oracle.make_inputs(gen, (2, 3, 100), dtype, fmt)
    mask = torch.ones(2, 3, dtype=torch.bool, device=logits.device)
    mask[1, 0] = False
    if fmt == "labels":
        target[0, 2] = -100
    result = run(logits, target, loss, fmt, variant, block_size=64, loss_mask=mask, grad_output=0.37)
    oracle.check(logits, target, result, loss=loss, target_format=fmt, loss_mask=mask, grad_output=0.37)
    assert result[1].shape == (2, 3, 100)


def test_mixed_target_dtype(gen, oracle):
    """Target logits may have another float dtype than the logits (fp32 logits, bf16 target)."""
    for loss in ("cross_entropy", "forward_kl", "reverse_kl"):
        logits, target = oracle.make_inputs(gen, (3, 100), torch.float32, "logits", target_dtype=torch.bfloat16)
        result = run(logits, target, loss, "logits", "fused", block_size=32)
        oracle.check(logits, target, result, loss=loss, target_format="logits", label=loss)


# --------------------------------------------------------------------------------------------
# The PyTorch reference of the package against PyTorch's own losses
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("loss_index", range(len(LOSS_FORMATS)), ids=LOSS_IDS)
def test_reference_matches_torch(loss_index, gen, oracle):
    """kernels.reference (used by benchmarks and GPU tests) agrees with F.cross_entropy / F.kl_div."""
    loss, fmt = LOSS_FORMATS[loss_index]
    logits, target = oracle.make_inputs(gen, (4, 5, 257), torch.bfloat16, fmt)
    mask = torch.rand(4, 5, generator=gen) > 0.3
    options = dict(loss=loss, target_format=fmt, loss_mask=mask.to(logits.device))
    if fmt == "labels":
        target[0, :2] = 9
        options["ignore_index"] = 9
    ref_loss, ref_grad = reference.entropy_loss_forward_backward(logits, target, grad_output=0.37, **options)
    torch_loss, torch_grad = oracle.torch_loss(logits, target, grad_output=0.37, **options)
    assert oracle.rel_err(ref_loss, torch_loss) <= 1e-12
    assert oracle.rel_err(ref_grad, torch_grad) <= 1e-12
    # The differentiable entry point gives the same loss.
    assert oracle.rel_err(reference.entropy_loss(logits, target, **options), torch_loss) <= 1e-12
    # Per-row losses: ignored rows give 0, the mean of the rows that count is the loss.
    rows = reference.row_losses(logits, target, loss=loss, target_format=fmt, **(
        {"ignore_index": 9} if fmt == "labels" else {}))
    assert rows.shape == (4, 5) and rows.dtype == torch.float64
    keep = mask.to(rows.device)
    if fmt == "labels":
        assert torch.all(rows[target == 9] == 0)
        keep &= target != 9
    assert oracle.rel_err(rows[keep].mean(), torch_loss) <= 1e-12


# --------------------------------------------------------------------------------------------
# Variant options
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("loss_index", range(len(LOSS_FORMATS)), ids=LOSS_IDS)
@pytest.mark.parametrize(
    "stats_block, grad_block, stats_warps, grad_warps", [(64, 256, 2, 8), (256, 32, 16, 1)], ids=["small-stats", "small-grad"]
)
def test_two_pass_options(loss_index, stats_block, grad_block, stats_warps, grad_warps, gen, oracle):
    """two_pass with its own block sizes and warps for the statistics and the gradient launches."""
    loss, fmt = LOSS_FORMATS[loss_index]
    logits, target = oracle.make_inputs(gen, (2, 700), torch.float32, fmt)
    plan = kernels.prepare(
        logits, target, loss=loss, target_format=fmt, variant="two_pass", block_size=128, num_warps=4,
        stats_block_size=stats_block, grad_block_size=grad_block, stats_num_warps=stats_warps, grad_num_warps=grad_warps,
    )
    stats, grad_launch = plan.launches
    assert (stats.block_size, stats.num_warps) == (stats_block, stats_warps)
    assert (grad_launch.block_size, grad_launch.num_warps) == (grad_block, grad_warps)
    assert grad_launch.grid == (2, -(-700 // grad_block))
    oracle.check(logits, target, plan.run(), loss=loss, target_format=fmt)


SPLIT_ROW_FORMS = {  # form -> (options, mode, launch names)
    "multi_launch": ({"cooperative": False}, "multi_launch", ["split_row.stats", "split_row.grad"]),
    "unsplit": ({"split": False}, "row", ["fused"]),  # one program per row walks its chunks, no exchange
}


@pytest.mark.parametrize("form", SPLIT_ROW_FORMS)
@pytest.mark.parametrize("loss_index", range(len(LOSS_FORMATS)), ids=LOSS_IDS)
def test_split_row_forms(loss_index, form, gen, oracle):
    """split_row's two-launch form (cooperative=False) and unsplit form (split=False), 5 chunks per row."""
    loss, fmt = LOSS_FORMATS[loss_index]
    options, mode, names = SPLIT_ROW_FORMS[form]
    logits, target = oracle.make_inputs(gen, (3, 300), torch.bfloat16, fmt)
    plan = kernels.prepare(logits, target, loss=loss, target_format=fmt, variant="split_row", block_size=64,
                           num_warps=2, **options)
    assert plan.config["mode"] == mode and plan.config["num_chunks"] == 5
    assert [launch.name for launch in plan.launches] == names
    if form == "unsplit":
        assert plan.launches[0].grid == (3,) and plan.reset is None  # nothing exchanged, nothing to re-arm
    oracle.check(logits, target, plan.run(), loss=loss, target_format=fmt)
    # A plan can be run again (benchmarks do) and gives the same result.
    again = plan.run()
    oracle.check(logits, target, again, loss=loss, target_format=fmt)


KEEP_LAST_VOCABS = [100, 128, 300, 301]  # 2 tiles, 2 full tiles, 5 tiles, 5 tiles of an unaligned row (peeled)


@pytest.mark.parametrize("vocab", KEEP_LAST_VOCABS)
@pytest.mark.parametrize("loss_index", range(len(LOSS_FORMATS)), ids=LOSS_IDS)
def test_keep_last_tile(loss_index, vocab, gen, oracle):
    """keep_last: pass 1 keeps the row's last tile in registers and pass 2 writes it first, then re-reads the
    others newest first; fused and split_row's unsplit form, rows masked out included, fp32 and bf16."""
    loss, fmt = LOSS_FORMATS[loss_index]
    for dtype in (torch.float32, torch.bfloat16):
        logits, target = oracle.make_inputs(gen, (4, vocab), dtype, fmt)
        mask = torch.tensor([True, False, True, True], device=logits.device)
        for variant, options in (("fused", {}), ("split_row", {"split": False})):
            plan = kernels.prepare(logits, target, loss=loss, target_format=fmt, variant=variant, block_size=64,
                                   num_warps=2, keep_last=True, loss_mask=mask, **options)
            assert plan.config["keep_last"] is True
            assert plan.launches[0].constexprs["KEEP_LAST"] is True
            oracle.check(logits, target, plan.run(), loss=loss, target_format=fmt, loss_mask=mask,
                         label=f"{variant} {dtype} vocab {vocab}")


@pytest.mark.parametrize("vocab", [96, 93, 157])
def test_labels_at_tile_edges(vocab, gen, oracle):
    """Labels CE tests each label against a tile's own lanes (row_math.label_in_tile): labels on both sides of every
    32-column boundary (the tiles', counted from a peeled row's head), at the row's first and last columns and in a
    peeled row's head and tail (93 and 157 columns: rows not 16-byte aligned); one tile, several, the last one kept,
    and rows split into chunks (split_row's multi-launch form: the chunk is the tile)."""
    columns = sorted({*range(9), *range(vocab - 9, vocab)} | {c for edge in range(32, vocab, 32)
                                                               for c in range(edge - 3, edge + 8)})
    for dtype in (torch.float32, torch.bfloat16):
        logits, _unused = oracle.make_inputs(gen, (len(columns), vocab), dtype, "labels")
        labels = torch.tensor(columns, device=logits.device)
        for variant, block_size, options in (("fused", 512, {}), ("fused", 32, {}), ("fused", 32, {"keep_last": True}),
                                             ("split_row", 64, {"split": False}), ("split_row", 32, {})):
            plan = kernels.prepare(logits, labels, loss="cross_entropy", target_format="labels", variant=variant,
                                   block_size=block_size, num_warps=2, **options)
            oracle.check(logits, labels, plan.run(), loss="cross_entropy", target_format="labels",
                         label=f"{variant} {block_size} {options} {dtype} vocab {vocab}")


def test_keep_last_tile_options(gen, oracle):
    """One tile: nothing to keep (the single-tile kernel already keeps it); a non-bool is refused."""
    logits, labels = oracle.make_inputs(gen, (2, 64), torch.float32, "labels")
    plan = kernels.prepare(logits, labels, variant="fused", block_size=64, keep_last=True)
    assert "KEEP_LAST" not in plan.launches[0].constexprs
    oracle.check(logits, labels, plan.run())
    split = kernels.prepare(logits, labels, variant="split_row", block_size=64, split=False, keep_last=True)
    assert split.config["mode"] == "single" and "keep_last" not in split.config
    for variant, options in (("fused", {}), ("split_row", {"split": False})):
        with pytest.raises(TypeError, match="keep_last must be True or False"):
            kernels.prepare(logits, labels, variant=variant, block_size=32, keep_last=1, **options)


def test_split_row_modes(gen, oracle):
    """Rows that fit one chunk use the single-tile kernel; without a GPU cooperative=None is multi-launch."""
    logits, labels = oracle.make_inputs(gen, (3, 100), torch.float32, "labels")
    single = kernels.prepare(logits, labels, variant="split_row", block_size=128)
    assert single.config["mode"] == "single" and [launch.name for launch in single.launches] == ["fused"]
    oracle.check(logits, labels, single.run())
    if logits.device.type != "cuda":
        plan = kernels.prepare(logits, labels, variant="split_row", block_size=32)
        assert plan.config["mode"] == "multi_launch"
        auto = kernels.prepare(logits, labels, variant="auto", block_size=32)
        assert auto.variant == "split_row" and auto.config["mode"] == "multi_launch"


def test_split_row_option_errors(gen, oracle):
    logits, labels = oracle.make_inputs(gen, (2, 64), torch.float32, "labels")
    with pytest.raises(ValueError, match="cooperative=True needs split=True"):
        kernels.prepare(logits, labels, variant="split_row", block_size=32, split=False, cooperative=True)
    for bad in ("no", 1, 0):  # 1 == True and 0 == False, but a flag must be a bool
        with pytest.raises(TypeError, match="split must be True or False"):
            kernels.prepare(logits, labels, variant="split_row", block_size=32, split=bad)
        with pytest.raises(TypeError, match="cooperative must be None, True or False"):
            kernels.prepare(logits, labels, variant="split_row", block_size=32, cooperative=bad)
    for bad in (8, 300, 96.0, True):
        with pytest.raises(ValueError, match="maxnreg must be None or an int in \\[16, 255\\]"):
            kernels.prepare(logits, labels, variant="split_row", block_size=32, maxnreg=bad)
    with pytest.raises(TypeError, match="prefetch must be True or False"):
        kernels.prepare(logits, labels, variant="split_row", block_size=32, prefetch=1)
    for options in ({"schedule": "wait"}, {"split": False}, {"cooperative": False}):
        with pytest.raises(ValueError, match="prefetch=True is an option of the lagged cooperative kernel"):
            kernels.prepare(logits, labels, variant="split_row", block_size=32, prefetch=True, **options)
    for bad in (-1, 4, 1.0, True):
        with pytest.raises(ValueError, match="read_ahead must be an int in \\[0, 3\\]"):
            kernels.prepare(logits, labels, variant="split_row", block_size=32, read_ahead=bad)
    for options in ({"schedule": "wait"}, {"split": False}, {"cooperative": False}):
        with pytest.raises(ValueError, match="read_ahead is an option of the lagged cooperative kernel"):
            kernels.prepare(logits, labels, variant="split_row", block_size=32, read_ahead=1, **options)
    for bad in (1, 0, "no"):
        with pytest.raises(TypeError, match="fast_math must be True or False"):
            kernels.prepare(logits, labels, variant="split_row", block_size=32, fast_math=bad)


def test_split_row_prefetch_plans_the_same_math(gen, oracle):
    """prefetch=True changes only when the lagged kernel issues its reads: where no cooperative grid runs (the
    interpreter) the plan is the multi-launch form, with the same results."""
    logits, labels = oracle.make_inputs(gen, (5, 100), torch.float32, "labels")
    plan = kernels.prepare(logits, labels, variant="split_row", block_size=32, prefetch=True)
    oracle.check(logits, labels, plan.run())
    if logits.device.type != "cuda":
        assert plan.config["mode"] == "multi_launch" and "prefetch" not in plan.config


def test_split_row_read_ahead_plans_the_same_math(gen, oracle):
    """read_ahead changes only how the lagged kernel's step loop issues its reads: where no cooperative grid runs (the
    interpreter) the plan is the multi-launch form, with the same results."""
    logits, labels = oracle.make_inputs(gen, (5, 100), torch.float32, "labels")
    plan = kernels.prepare(logits, labels, variant="split_row", block_size=32, read_ahead=2)
    oracle.check(logits, labels, plan.run())
    if logits.device.type != "cuda":
        assert plan.config["mode"] == "multi_launch" and "read_ahead" not in plan.config


def test_launch_options_carry_maxnreg_only_when_set(gen, oracle):
    """A register cap reaches the compiler (and the occupancy query); without one a launch compiles as before."""
    logits, labels = oracle.make_inputs(gen, (2, 64), torch.float32, "labels")
    plain = kernels.prepare(logits, labels, variant="split_row", block_size=32, cooperative=False).launches[0]
    capped = kernels.prepare(logits, labels, variant="split_row", block_size=32, cooperative=False,
                             maxnreg=64).launches[0]
    assert plain.options == {"num_warps": plain.num_warps, "num_stages": 1}
    assert capped.options == {"num_warps": capped.num_warps, "num_stages": 1, "maxnreg": 64}


LAGGED_CASES = [  # (loss_index, poll_first, masked, grad_output, vocab): 93 columns = rows not 16-byte aligned (PEEL)
    (0, True, False, 1.0, 96), (0, False, True, None, 96), (1, False, False, 0.5, 96), (2, False, True, 1.0, 96),
    (3, False, False, 1.0, 96), (3, True, True, None, 96), (0, True, True, 1.0, 93), (3, False, True, 0.5, 93),
]


@pytest.mark.parametrize("loss_index, poll_first, masked, grad_output, vocab", LAGGED_CASES)
def test_split_row_lagged_kernel_math(loss_index, poll_first, masked, grad_output, vocab, gen, oracle):
    """The lagged cooperative kernel, run by the interpreter in its one-chunk form.

    With one chunk per row a program waits only for summaries it published itself LAG_STEPS steps
    earlier, so programs run one after another still finish; this checks its step bookkeeping (rows
    started, finished two steps later, skipped rows, the tail after the last row) and its math on
    CPU. The multi-chunk grid runs in tests/test_gpu_kernels.py.
    """
    from kernels import split_row
    from kernels.launch import Launch
    from kernels.problem import build_problem

    loss, fmt = LOSS_FORMATS[loss_index]
    logits, target = oracle.make_inputs(gen, (11, vocab), torch.bfloat16 if vocab % 8 else torch.float32, fmt)
    options = dict(loss=loss, target_format=fmt, grad_output=grad_output)
    if fmt == "labels":
        target[[1, 6]] = -100
    if masked:
        options["loss_mask"] = torch.tensor([i % 4 != 2 for i in range(11)], device=logits.device)
    plan = kernels.prepare(logits, target, variant="split_row", block_size=32, num_warps=2, cooperative=False, **options)
    peel = build_problem(logits, target, loss=loss, target_format=fmt, grad_output=grad_output, ignore_index=-100,
                         loss_mask=options.get("loss_mask")).peel_constexprs()
    assert peel["PEEL"] == (vocab % 8 != 0)
    stats = plan.launches[0]
    # The plan's workspace starts zeroed (header, row count); the summaries (1 chunk per row, the first half: the
    # workspace has finished no call) sit where the plan's 3 chunks would
    offset = stats.args["partials_offset"]
    workspace = stats.args["ws_ptr"]
    partials = workspace[offset:offset + 11 * split_row.N_PARTIALS.value].view(11, split_row.N_PARTIALS.value, 1)
    partials.view(torch.int32).fill_(split_row.EMPTY_BITS.value)
    n_slots = 3
    constexprs = {k: v for k, v in stats.constexprs.items() if k != "PHASE"}
    constexprs.update(NUM_CHUNKS=1, CHUNKS_POW2=2, BLOCK_SIZE=128, POLL_FIRST=poll_first, **peel)
    lagged = Launch("split_row.lagged", split_row.split_row_lagged_kernel, (n_slots,),
                    dict(stats.args, n_slots=n_slots), constexprs, num_warps=2)
    lagged()
    oracle.check(logits, target, plan.finish(), **options)
    # Exactly the rows that count published a summary; skipped rows were never read. Labels CE publishes only the
    # two words it uses (m_x, s_x); its other three stay empty.
    valid = torch.ones(11, dtype=torch.bool, device=logits.device)
    if fmt == "labels":
        valid &= target != -100
    if masked:
        valid &= options["loss_mask"]
    words = 2 if fmt == "labels" else split_row.N_PARTIALS.value
    written = partials.view(torch.int32) != split_row.EMPTY_BITS.value
    assert torch.equal(written[:, :words].all(dim=2).all(dim=1), valid)
    assert not written[:, words:].any()


def test_split_row_rejects_unknown_schedule(gen, oracle):
    logits, labels = oracle.make_inputs(gen, (2, 64), torch.float32, "labels")
    with pytest.raises(ValueError, match="schedule"):
        kernels.prepare(logits, labels, variant="split_row", block_size=32, schedule="eager")


def test_empty_bits_is_a_nan_that_arithmetic_does_not_produce():
    """The lagged exchange's sentinel is a NaN payload, not the canonical NaN a computation returns."""
    from kernels import split_row

    bits = torch.tensor([split_row.EMPTY_BITS.value], dtype=torch.int32)
    assert torch.isnan(bits.view(torch.float32)).all()
    assert split_row.EMPTY_BITS.value != 0x7FFFFFFF and split_row.EMPTY_BITS.value != 0x7FC00000


# --------------------------------------------------------------------------------------------
# torch.autograd path and output types
# --------------------------------------------------------------------------------------------

AUTOGRAD_CASES = [(i, v) for i in range(len(LOSS_FORMATS)) for v in VARIANTS if (i + VARIANTS.index(v)) % 2 == 0]


@pytest.mark.parametrize(
    "loss_index, variant", AUTOGRAD_CASES, ids=[f"{LOSS_IDS[i]}-{v}" for i, v in AUTOGRAD_CASES]
)
def test_autograd(loss_index, variant, gen, oracle):
    """kernels.entropy_loss(...).backward() gives the oracle's gradient and the direct call's gradient."""
    loss, fmt = LOSS_FORMATS[loss_index]
    dtype = DTYPES[loss_index % len(DTYPES)]
    logits, target = oracle.make_inputs(gen, (2, 2, 150), dtype, fmt)
    mask = torch.tensor([[True, False], [True, True]], device=logits.device)
    options = dict(loss=loss, target_format=fmt, variant=variant, block_size=64)
    x = logits.clone().requires_grad_(True)
    value = kernels.entropy_loss(x, target, loss_mask=mask, **options)
    assert value.dim() == 0 and value.dtype == torch.float32 and value.requires_grad
    (value * 0.37).backward()
    oracle.check(logits, target, (value.detach(), x.grad), loss=loss, target_format=fmt, loss_mask=mask,
                 grad_output=0.37)
    direct_loss, direct_grad = kernels.entropy_loss_forward_backward(
        logits, target, loss_mask=mask, grad_output=0.37, **options
    )
    assert direct_loss.item() == value.item()
    assert oracle.rel_err(x.grad, direct_grad) <= oracle.TOLERANCE[dtype]
    # Without requires_grad the loss is the same and nothing is recorded.
    plain = kernels.entropy_loss(logits, target, loss_mask=mask, **options)
    assert plain.item() == value.item() and not plain.requires_grad


def test_entropy_loss_rejects_grad_output(gen, oracle):
    logits, labels = oracle.make_inputs(gen, (2, 10), torch.float32, "labels")
    with pytest.raises(TypeError, match="grad_output"):
        kernels.entropy_loss(logits, labels, grad_output=1.0)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_output_types(dtype, gen, oracle):
    """loss: 0-d float32 tensor on the logits' device; grad: logits' dtype, shape and device, contiguous."""
    logits, target = oracle.make_inputs(gen, (2, 3, 40), dtype, "logits")
    for variant in VARIANTS:
        loss, grad = run(logits, target, "reverse_kl", "logits", variant, block_size=32)
        assert loss.shape == () and loss.dtype == torch.float32 and loss.device == logits.device
        assert grad.dtype == dtype and grad.shape == logits.shape and grad.device == logits.device
        assert grad.is_contiguous()


@pytest.mark.parametrize("variant", VARIANTS)
def test_kl_of_identical_distributions_is_zero(variant, gen, oracle):
    """KL(p || p) = 0 with a zero gradient, also where the relative error of a tiny KL is meaningless."""
    logits, _ = oracle.make_inputs(gen, (3, 150), torch.bfloat16, "logits")
    for loss in ("forward_kl", "reverse_kl"):
        value, grad = run(logits, logits.clone(), loss, "logits", variant, block_size=64)
        assert abs(value.item()) <= 1e-6, f"{loss}: KL(p || p) = {value.item()}"
        assert grad.abs().max().item() <= 1e-6, f"{loss}: max |grad| {grad.abs().max().item()}"


# --------------------------------------------------------------------------------------------
# One launch per call: the loss kernels count their own rows (row_math.call_scales) and leave the
# workspace as the next call expects it (row_math.finish_program, split_row's two halves)
# --------------------------------------------------------------------------------------------


def _workspace_words(workspace: torch.Tensor) -> torch.Tensor:
    return workspace.view(torch.int32)


@pytest.mark.parametrize("variant", ["fused", "split_row", "two_pass"])
@pytest.mark.parametrize("loss_index", range(len(LOSS_FORMATS)), ids=LOSS_IDS)
def test_plan_runs_again_with_new_rows_counted(loss_index, variant, gen, oracle):
    """No prologue launch: a plan's second run counts the rows again (the first run's last program re-zeroed the
    shared count and the finish counters), so labels and mask changed in place between runs are honoured."""
    from kernels.problem import WS_COUNT, WS_DONE, WS_GEN

    loss, fmt = LOSS_FORMATS[loss_index]
    logits, target = oracle.make_inputs(gen, (7, 200), torch.float32, fmt)
    mask = torch.ones(7, dtype=torch.bool, device=logits.device)
    options = dict(loss=loss, target_format=fmt, loss_mask=mask, grad_output=0.5)
    plan = kernels.prepare(logits, target, variant=variant, block_size=64, num_warps=2, **options)
    assert all(launch.name != "prologue" for launch in plan.all_launches)
    workspace = plan.buffers[0]
    for run_index, drop in enumerate(([], [1, 4], [0, 2, 3, 5, 6])):
        mask.fill_(True)
        mask[drop] = False
        if fmt == "labels":
            target[drop[:1]] = -100
        oracle.check(logits, target, plan.run(), label=f"run {run_index}", **options)
        words = _workspace_words(workspace)
        assert int(words[WS_GEN]) == run_index + 1
        assert not words[:WS_COUNT + 1].any(), "counters and row count are zero again after a run"
        assert WS_DONE < WS_COUNT


def test_published_row_count_is_read_not_recounted(gen, oracle):
    """A program that finds the row count published uses it (the first counter's word is what the others read on
    a GPU): a count planted before the run scales the loss and gradient by it."""
    from kernels.problem import WS_COUNT

    logits, labels = oracle.make_inputs(gen, (6, 96), torch.float32, "labels")
    plan = kernels.prepare(logits, labels, variant="fused", block_size=32, num_warps=2)
    _workspace_words(plan.buffers[0])[WS_COUNT] = 12 + 1  # twice the 6 rows that count
    loss, grad = plan.run()
    ref_loss, ref_grad = oracle.torch_loss(logits, labels, loss="cross_entropy", target_format="labels")
    assert oracle.rel_err(loss, ref_loss / 2) <= 1e-5 and oracle.rel_err(grad, ref_grad / 2) <= 1e-5
    loss, grad = plan.run()  # the planted count was consumed: counted again, right this time
    assert oracle.rel_err(loss, ref_loss) <= 1e-5 and oracle.rel_err(grad, ref_grad) <= 1e-5


def test_each_variant_is_one_launch_per_pass(gen, oracle):
    """What a call launches: one kernel (fused, split_row's one-program-per-row and cooperative forms), two for
    the passes of two_pass and split_row's multi-launch form; a prologue only for an empty batch."""
    logits, labels = oracle.make_inputs(gen, (4, 256), torch.float32, "labels")
    names = {variant: [launch.name for launch in kernels.prepare(logits, labels, variant=variant, block_size=64,
                                                                   num_warps=2, **options).all_launches]
             for variant, options in (("fused", {}), ("two_pass", {}), ("split_row", {"split": False}),
                                      ("split_row", {"cooperative": False}))}
    assert names == {"fused": ["fused"], "two_pass": ["two_pass.stats", "two_pass.grad"],
                     "split_row": ["split_row.stats", "split_row.grad"]}
    assert [launch.name for launch in kernels.prepare(logits, labels, variant="split_row", block_size=64,
                                                      split=False).all_launches] == ["fused"]
    empty = kernels.prepare(logits[:0], labels[:0], variant="fused")
    assert [launch.name for launch in empty.all_launches] == ["prologue"]
    loss, grad = empty.run()
    assert float(loss) == 0.0 and grad.shape == (0, 256)


@pytest.mark.parametrize("loss_index", range(len(LOSS_FORMATS)), ids=LOSS_IDS)
def test_lagged_kernel_alternates_halves(loss_index, gen, oracle):
    """The lagged exchange needs every summary word it polls EMPTY_BITS before a call (labels CE: the two it uses): a
    call polls one half and re-empties its own words of the other, by the parity of the calls the workspace has
    finished. Two calls in a row (new labels or mask in between), one chunk per row so the interpreter can run the
    grid (see test_split_row_lagged_kernel_math)."""
    from kernels import split_row
    from kernels.launch import Launch
    from kernels.problem import WS_GEN, initialize_workspace

    loss, fmt = LOSS_FORMATS[loss_index]
    rows, vocab = 9, 100
    logits, target = oracle.make_inputs(gen, (rows, vocab), torch.float32, fmt)
    mask = torch.ones(rows, dtype=torch.bool, device=logits.device)
    options = dict(loss=loss, target_format=fmt, loss_mask=mask, grad_output=2.0)
    plan = kernels.prepare(logits, target, variant="split_row", block_size=32, num_warps=2, cooperative=False,
                           **options)
    stats = plan.launches[0]
    offset = stats.args["partials_offset"]
    half = rows * split_row.N_PARTIALS.value  # one chunk per row
    workspace = torch.empty(offset + 2 * half, dtype=torch.float32, device=logits.device)
    initialize_workspace(workspace, ((offset, half, split_row.EMPTY_BITS.value),))
    constexprs = {k: v for k, v in stats.constexprs.items() if k != "PHASE"}
    constexprs.update(NUM_CHUNKS=1, CHUNKS_POW2=2, BLOCK_SIZE=128, POLL_FIRST=False, PEEL=False)
    lagged = Launch("split_row.lagged", split_row.split_row_lagged_kernel, (3,), dict(stats.args, ws_ptr=workspace,
                    n_slots=3), constexprs, num_warps=2)
    words = _workspace_words(workspace)
    for call in range(3):
        mask[call::3] = False
        if fmt == "labels":
            target[call] = -100
        lagged()
        oracle.check(logits, target, plan.finish(), label=f"call {call}", **options)
        assert int(words[WS_GEN]) == call + 1
        polled_next = words[offset + (call + 1) % 2 * half:][:half].view(rows, split_row.N_PARTIALS.value)
        used = 2 if fmt == "labels" else split_row.N_PARTIALS.value  # labels CE polls only m_x and s_x
        assert (polled_next[:, :used] == split_row.EMPTY_BITS.value).all(), "the next call's half is empty again"
        mask.fill_(True)


def _special_tiles(loss_code: int, n: int, seed: int) -> list:
    """(x, t, name) tiles of fp32 logits and targets: finite; with -inf entries on both sides and, on the side whose
    probability weighs the loss's sum, -inf entries of the other side's finite values; all -inf; one NaN logit."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=gen) * 3
    t = torch.randn(n, generator=gen) * 3
    x_masked, t_masked = x.clone(), t.clone()
    x_masked[::7] = float("-inf")
    t_masked[::7] = float("-inf")
    (x_masked if loss_code == 3 else t_masked)[3::11] = float("-inf")  # probability 0 on one side only
    x_nan = x.clone()
    x_nan[5] = float("nan")
    return [(x, t, "finite"), (x_masked, t_masked, "-inf entries"),
            (torch.full((n,), float("-inf")), torch.full((n,), float("-inf")), "all -inf"), (x_nan, t, "NaN")]


# The lagged kernel's fast math summarises a chunk from its raw tile (row_math.tile_statistics_raw): the same summary
# as tile_statistics of the base-2 scaled tile, special values included (-inf entries, a whole -inf tile, NaN).
@triton.jit
def _both_summaries(x_ptr, t_ptr, out_ptr, LOSS: tl.constexpr, N: tl.constexpr):
    cols = tl.arange(0, N)
    x = tl.load(x_ptr + cols).to(tl.float32)
    t = tl.load(t_ptr + cols).to(tl.float32)
    m_x, s_x, m_t, s_t, acc, _e_x, _e_t = tile_statistics(base2(x), base2(t), LOSS)
    r_m_x, r_s_x, r_m_t, r_s_t, r_acc = tile_statistics_raw(x, t, LOSS)
    tl.store(out_ptr + 0, m_x)
    tl.store(out_ptr + 1, s_x)
    tl.store(out_ptr + 2, m_t)
    tl.store(out_ptr + 3, s_t)
    tl.store(out_ptr + 4, acc)
    tl.store(out_ptr + 5, r_m_x)
    tl.store(out_ptr + 6, r_s_x)
    tl.store(out_ptr + 7, r_m_t)
    tl.store(out_ptr + 8, r_s_t)
    tl.store(out_ptr + 9, r_acc)


@pytest.mark.parametrize("loss_code", [0, 1, 2, 3], ids=["labels", "ce_logits", "forward_kl", "reverse_kl"])
def test_raw_tile_statistics_match_scaled_ones(loss_code):
    n = 64
    cases = _special_tiles(loss_code, n, seed=loss_code)
    used = 2 if loss_code == 0 else 5  # labels CE's summary is (m_x, s_x)
    for x, t, label in cases:
        out = torch.zeros(10)
        _both_summaries[(1,)](x, t, out, LOSS=loss_code, N=n)
        scaled, raw = out[:used], out[5:5 + used]
        # The raw form zeroes a term by multiplying its weight by 0, so a NaN weight stays NaN in acc (the scaled form
        # dropped it there; s is NaN in both, and so is the loss).
        assert bool((torch.isnan(scaled) <= torch.isnan(raw)).all()), f"{label}: {scaled} vs {raw}"
        if label != "NaN":
            assert torch.equal(torch.isnan(scaled), torch.isnan(raw)), f"{label}: {scaled} vs {raw}"
        close = torch.isclose(raw, scaled, rtol=1e-6, atol=1e-6) | torch.isnan(raw) | (raw == scaled)
        assert bool(close.all()), f"{label}: raw {raw} vs scaled {scaled}"


# The lagged and fused kernels write the gradient from the raw tiles with grad_scale folded into the row's scalars
# (row_math.scaled_gradient): the same numbers as gradient_from_summary of the base-2 tiles times grad_scale.
@triton.jit
def _both_gradients(x_ptr, t_ptr, out_ptr, grad_scale, label, LOSS: tl.constexpr, N: tl.constexpr):
    cols = tl.arange(0, N)
    x = tl.load(x_ptr + cols).to(tl.float32)
    t = tl.load(t_ptr + cols).to(tl.float32)
    m_x, s_x, m_t, s_t, acc, _e_x, _e_t = tile_statistics(base2(x), base2(t), LOSS)
    loss = row_loss(m_x, s_x, m_t, s_t, acc, tl.sum(tl.where(cols == label, x, 0.0), axis=0), LOSS)
    lse_diff2 = lse_difference(m_x, s_x, m_t, s_t)
    before = gradient_from_summary(base2(x), base2(t), m_x, s_x, m_t, s_t, lse_diff2, cols, label, loss, LOSS)
    q_scale, p_scale, offset = gradient_scales(s_x, s_t, lse_diff2, loss, grad_scale, LOSS)
    tl.store(out_ptr + cols, before * grad_scale)
    tl.store(out_ptr + N + cols, scaled_gradient(x, t, m_x, m_t, q_scale, p_scale, offset, cols, label, LOSS))


@pytest.mark.parametrize("loss_code", [0, 1, 2, 3], ids=["labels", "ce_logits", "forward_kl", "reverse_kl"])
def test_scaled_gradient_matches_the_base2_form(loss_code):
    n = 64
    cases = _special_tiles(loss_code, n, seed=20 + loss_code)
    for grad_scale in (1 / 3, -2.5):
        for x_case, t_case, name in cases:
            out = torch.zeros(2 * n)
            _both_gradients[(1,)](x_case, t_case, out, grad_scale, 9, LOSS=loss_code, N=n)
            before, after = out[:n], out[n:]
            label = f"{name}, grad_scale {grad_scale}"
            assert torch.equal(torch.isnan(before), torch.isnan(after)), f"{label}: {before} vs {after}"
            if name in ("finite", "-inf entries"):
                assert bool(torch.isfinite(after).all()), label
            close = torch.isclose(after, before, rtol=1e-5, atol=1e-7) | torch.isnan(after)
            assert bool(close.all()), f"{label}: {after[~close]} vs {before[~close]}"


@pytest.mark.parametrize("loss_index", range(len(LOSS_FORMATS)), ids=LOSS_IDS)
def test_reference_loss_in_blocks_matches_the_whole_mean(loss_index):
    """The blockwise float64 mean (for checking shapes too large to copy to float64 whole) equals entropy_loss,
    with ignored label rows and a last block that is not full."""
    loss, fmt = LOSS_FORMATS[loss_index]
    gen = torch.Generator().manual_seed(11)
    x = (torch.randn(23, 37, generator=gen) * 3).bfloat16()
    if fmt == "labels":
        t = torch.randint(0, 37, (23,), generator=gen)
        t[[0, 5, 22]] = -100
    else:
        t = (torch.randn(23, 37, generator=gen) * 3).bfloat16()
    whole = float(reference.entropy_loss(x, t, loss=loss, target_format=fmt))
    blocks = reference.entropy_loss_in_blocks(x, t, loss=loss, target_format=fmt, rows_per_block=5)
    assert blocks == pytest.approx(whole, rel=1e-12)


# --------------------------------------------------------------------------------------------
# The resident row (fused, resident=True): labels CE with the row kept as pairs of bf16 logits
# --------------------------------------------------------------------------------------------

# (vocab, num_warps, grad_output): one word a thread and many, a row narrower than its power of two (padding words),
# grad_output negative (the packed sign bits), zero, and a 0-d tensor
RESIDENT_CASES = [(8, 1, 1.0), (1000, 4, -0.5), (1000, 2, 0.0), (4104, 8, "tensor"), (64, 1, 1.0)]


@pytest.mark.parametrize("vocab, num_warps, grad_output", RESIDENT_CASES)
def test_resident_row_matches_torch(vocab, num_warps, grad_output, gen, oracle):
    logits, labels = oracle.make_inputs(gen, (9, vocab), torch.bfloat16, "labels")
    # both halves of a word and the row's ends (written again after the barrier), an ignored row
    labels[:6] = torch.tensor([0, 1, vocab - 2, vocab - 1, vocab // 2, vocab // 2 + 1])
    labels[7] = -100
    given = torch.tensor(0.37) if grad_output == "tensor" else grad_output
    value = 0.37 if grad_output == "tensor" else grad_output
    plan = kernels.prepare(logits, labels, variant="fused", resident=True, num_warps=num_warps, grad_output=given)
    assert plan.launches[0].name == "fused.resident" and plan.config["resident"]
    result = plan.run()
    oracle.check(logits, labels, result, grad_output=value, label=f"resident {vocab} {num_warps}")
    assert torch.count_nonzero(result[1][7]) == 0
    if value == 0.0:
        assert torch.count_nonzero(result[1]) == 0


def test_resident_row_with_mask_and_batch_dims(gen, oracle):
    logits, labels = oracle.make_inputs(gen, (2, 3, 200), torch.bfloat16, "labels")
    mask = torch.tensor([[True, False, True], [True, True, False]])
    result = run(logits, labels, "cross_entropy", "labels", "fused", resident=True, num_warps=2, loss_mask=mask)
    oracle.check(logits, labels, result, loss_mask=mask, label="resident masked")
    assert result[1].shape == logits.shape and torch.count_nonzero(result[1][~mask]) == 0


@triton.jit
def _word_halves_kernel(words_ptr, low_ptr, high_ptr, max_ptr, N: tl.constexpr):
    lanes = tl.arange(0, N)
    words = tl.load(words_ptr + lanes)
    tl.store(low_ptr + lanes, low_half(words))
    tl.store(high_ptr + lanes, high_half(words))
    tl.store(max_ptr + lanes, pair_max(words, tl.flip(words, 0)))


def test_resident_row_pairs_round_like_torch():
    """A word's halves are its two bf16 logits in order; the packed max takes each half's larger one."""
    values = torch.tensor([1.5, -2.0, float("-inf"), 3.25, 0.0, -0.0, 1e-3, 65504.0], dtype=torch.bfloat16)
    words = values.view(torch.int32)
    low, high, larger = torch.empty(4), torch.empty(4), torch.empty(4, dtype=torch.int32)
    _word_halves_kernel[(1,)](words, low, high, larger, N=4)
    assert torch.equal(low, values[0::2].float()) and torch.equal(high, values[1::2].float())
    expected = torch.maximum(values.view(4, 2), values.view(4, 2).flip(0)).reshape(-1)
    assert torch.equal(larger.view(torch.bfloat16), expected)


def test_resident_row_refuses_what_it_cannot_take(gen, oracle):
    logits, labels = oracle.make_inputs(gen, (3, 1000), torch.bfloat16, "labels")
    refusals = {
        "bf16 logits only": (logits.float(), labels, {}),
        "cross-entropy from labels only": (logits, logits, {"target_format": "logits"}),
        "16-byte aligned": (oracle.make_inputs(gen, (3, 1004), torch.bfloat16, "labels")[0][:, :1000], labels, {}),
        "vocab 1002": (oracle.make_inputs(gen, (3, 1002), torch.bfloat16, "labels")[0], labels, {}),
        "at most 32768 columns": (torch.zeros(1, 32776, dtype=torch.bfloat16), labels[:1], {}),
        "block_size 512 < vocab": (logits, labels, {"block_size": 512}),
        "nothing to keep": (logits, labels, {"keep_last": True}),
    }
    for message, (x, t, options) in refusals.items():
        with pytest.raises(ValueError, match=message):
            kernels.prepare(x, t, variant="fused", resident=True, **options)
    with pytest.raises(TypeError, match="resident must be True or False"):
        kernels.prepare(logits, labels, variant="fused", resident=1)
