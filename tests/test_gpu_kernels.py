"""GPU-only checks at realistic sizes (marked ``gpu``: skipped without CUDA or under TRITON_INTERPRET=1).

* every loss x variant (fused, two_pass, split_row cooperative, multi-launch, unsplit, register-capped,
  prefetching, reading ahead through shared memory and tuned, auto) on 4096 x 32768
  and 4096 x 131072 bf16, against float64 ``kernels.reference``: the loss against the float64 mean
  over all rows (computed in chunks of rows), the gradient on ~16 sampled rows (autograd of the
  reference's row losses, scaled by grad_output / n_valid). Every 7th row does not count (ignored
  label, or loss_mask False), so n_valid != n_rows and ignored rows must get zero gradient;
* a > 2**31-element case (32768 x 131072 bf16: labels CE and reverse KL, split_row and fused), checked on
  sampled rows that include rows whose offsets pass 2**31;
* the cooperative split_row refuses (ValueError) a grid that cannot be co-resident with
  cooperative=True and falls back to the multi-launch form with cooperative=None;
* the occupancy that ``perfutils.model.occupancy`` predicts for each launched kernel equals the driver's
  ``cuOccupancyMaxActiveBlocksPerMultiprocessor``.

Run with ``pytest -m gpu -s tests/test_gpu_kernels.py`` to see the errors printed for each case.
"""

from __future__ import annotations

import math

import pytest
import torch

import kernels
import kernels.split_row as split_row_module
from kernels import reference
from kernels.launch import interpreting

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(interpreting(), reason="TRITON_INTERPRET=1: realistic sizes need compiled kernels"),
]

LOSS_FORMATS = [
    ("cross_entropy", "labels"),
    ("cross_entropy", "logits"),
    ("forward_kl", "logits"),
    ("reverse_kl", "logits"),
]
LOSS_IDS = [f"{loss}-{fmt}" for loss, fmt in LOSS_FORMATS]
# (id, variant, options)
VARIANT_SPECS = [
    ("fused", "fused", {}),
    ("two_pass", "two_pass", {}),
    ("split_row-coop", "split_row", {"cooperative": True}),
    ("split_row-wait", "split_row", {"cooperative": True, "schedule": "wait"}),
    ("split_row-multi", "split_row", {"cooperative": False}),
    ("split_row-unsplit", "split_row", {"split": False, "block_size": 16384, "num_warps": 16}),
    ("split_row-capped", "split_row", {"cooperative": True, "maxnreg": 96}),
    ("split_row-prefetch", "split_row", {"cooperative": True, "prefetch": True}),
    ("split_row-read-ahead", "split_row", {"cooperative": True, "read_ahead": 1}),
    ("split_row-exact-math", "split_row", {"cooperative": True, "fast_math": False}),
    ("split_row-tuned", "split_row", {}),
    ("auto", "auto", {}),
]
SHAPES = [(4096, 32768), (4096, 131072)]
HUGE = (32768, 131072)  # 4.29e9 elements > 2**31
N_SAMPLED = 16
TOL = 1e-2  # bf16 (gradient stored in bf16)
GRAD_OUTPUT = 0.37
SCALE = 2.0
IGNORED_EVERY = 7  # rows r with r % 7 == 3 do not count


# --------------------------------------------------------------------------------------------
# Problems and their float64 references (cached: one problem in GPU memory at a time)
# --------------------------------------------------------------------------------------------


class Problem:
    def __init__(self, n_rows, vocab, loss_index, seed):
        self.loss, self.fmt = LOSS_FORMATS[loss_index]
        self.shape = (n_rows, vocab)
        gen = torch.Generator(device="cuda").manual_seed(seed)
        self.logits = torch.randn(self.shape, generator=gen, device="cuda", dtype=torch.bfloat16).mul_(SCALE)
        self.keep = torch.arange(n_rows, device="cuda") % IGNORED_EVERY != 3
        if self.fmt == "labels":
            labels = torch.randint(0, vocab, (n_rows,), generator=gen, device="cuda")
            self.target = torch.where(self.keep, labels, torch.full_like(labels, -100))
            self.loss_mask = None
        else:
            self.target = torch.randn(self.shape, generator=gen, device="cuda", dtype=torch.bfloat16).mul_(SCALE)
            self.loss_mask = self.keep
        self.n_valid = int(self.keep.sum().item())
        picks = torch.randperm(n_rows, generator=torch.Generator().manual_seed(seed))[: N_SAMPLED - 6].tolist()
        # first / last rows, an ignored row, and (for the huge case) rows on both sides of 2**31 elements
        fixed = [0, 3, n_rows // 2 - 1, n_rows // 2, min(2**31 // vocab, n_rows - 1), n_rows - 1]
        self.rows = sorted(set(picks + fixed))
        self._ref_loss = None
        self._ref_grad = None

    def options(self):
        return dict(loss=self.loss, target_format=self.fmt, loss_mask=self.loss_mask, grad_output=GRAD_OUTPUT)

    def row_losses(self, logits, target):
        return reference.row_losses(logits, target, loss=self.loss, target_format=self.fmt)

    @property
    def ref_loss(self) -> float:
        """The float64 mean over the rows that count, summed in chunks of rows (~16M elements each)."""
        if self._ref_loss is None:
            chunk = max(1, 2**24 // self.shape[1])
            total = torch.zeros((), dtype=torch.float64, device="cuda")
            for start in range(0, self.shape[0], chunk):
                part = slice(start, start + chunk)
                rows = self.row_losses(self.logits[part], self.target[part])
                total += torch.where(self.keep[part], rows, 0.0).sum()
            self._ref_loss = total.item() / self.n_valid
        return self._ref_loss

    @property
    def ref_grad(self) -> torch.Tensor:
        """The float64 gradient of the sampled rows: autograd of their row losses x grad_output / n_valid."""
        if self._ref_grad is None:
            x = self.logits[self.rows].double().requires_grad_(True)
            rows = torch.where(self.keep[self.rows], self.row_losses(x, self.target[self.rows]), 0.0)
            (self._ref_grad,) = torch.autograd.grad(rows.sum() * (GRAD_OUTPUT / self.n_valid), x)
        return self._ref_grad


_CACHE: dict = {}


def get_problem(n_rows, vocab, loss_index) -> Problem:
    key = (n_rows, vocab, loss_index)
    if key not in _CACHE:
        _CACHE.clear()
        torch.cuda.empty_cache()
        _CACHE[key] = Problem(n_rows, vocab, loss_index, seed=1000 * loss_index + vocab // 1024 + n_rows)
    return _CACHE[key]


@pytest.fixture(scope="module", autouse=True)
def free_problems():
    yield
    _CACHE.clear()
    torch.cuda.empty_cache()


def rel_err(actual, expected) -> float:
    a, b = actual.double(), expected.double()
    return (torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b)).item()


def check_against_reference(problem: Problem, result, label: str):
    loss, grad = result
    assert loss.dim() == 0 and loss.dtype == torch.float32
    assert grad.dtype == torch.bfloat16 and grad.shape == problem.shape
    loss_err = abs(loss.item() - problem.ref_loss) / abs(problem.ref_loss)
    sampled = grad[problem.rows]
    grad_err = rel_err(sampled, problem.ref_grad)
    ignored = [i for i, row in enumerate(problem.rows) if row % IGNORED_EVERY == 3]
    print(
        f"\n[gpu] {label}: loss {loss.item():.6f} vs {problem.ref_loss:.6f} (rel err {loss_err:.2e}), "
        f"grad rel err {grad_err:.2e} on rows {problem.rows}",
        flush=True,
    )
    assert math.isfinite(loss.item())
    assert loss_err <= TOL, f"{label}: loss rel err {loss_err:.3e}"
    assert grad_err <= TOL, f"{label}: grad rel err {grad_err:.3e}"
    assert ignored and torch.count_nonzero(sampled[ignored]) == 0, f"{label}: rows that do not count need 0 grad"
    return loss_err, grad_err


# --------------------------------------------------------------------------------------------
# Realistic sizes, every loss x variant
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", VARIANT_SPECS, ids=[s[0] for s in VARIANT_SPECS])
@pytest.mark.parametrize("loss_index", range(len(LOSS_FORMATS)), ids=LOSS_IDS)
@pytest.mark.parametrize("shape", SHAPES, ids=[f"{r}x{v}" for r, v in SHAPES])
def test_realistic_sizes(shape, loss_index, spec):
    name, variant, options = spec
    problem = get_problem(*shape, loss_index)
    plan = kernels.prepare(problem.logits, problem.target, variant=variant, **problem.options(), **options)
    if options.get("cooperative") is True:
        assert plan.config["mode"] == "cooperative"
        assert plan.config["programs"] <= plan.config["resident_programs"]
    if options.get("cooperative") is False and plan.config["num_chunks"] > 1:
        assert plan.config["mode"] == "multi_launch"
    label = f"{shape[0]}x{shape[1]} bf16 {problem.loss}/{problem.fmt} {name} {plan.config}"
    check_against_reference(problem, plan.run(), label)
    # A second run of the same plan (benchmarks re-run plans; the cooperative counters are re-armed).
    loss_again, _ = plan.run()
    assert abs(loss_again.item() - problem.ref_loss) / abs(problem.ref_loss) <= TOL


# Chunk counts that are not powers of two (13 and 4 chunks at 50304 columns; 13 of an unaligned 50257-column row,
# peeled) under the register cap the first-call search may choose, and the unsplit kernel keeping its last tile.
ODD_CHUNK_SPECS = [
    ("lagged-4096-capped80", {"variant": "split_row", "block_size": 4096, "num_warps": 4, "cooperative": True,
                              "maxnreg": 80}),
    ("lagged-16384", {"variant": "split_row", "block_size": 16384, "num_warps": 16, "cooperative": True}),
    ("lagged-2048-prefetch", {"variant": "split_row", "block_size": 2048, "num_warps": 4, "cooperative": True,
                              "prefetch": True}),
    ("lagged-2048-read-ahead", {"variant": "split_row", "block_size": 2048, "num_warps": 4, "cooperative": True,
                                "read_ahead": 2}),
    ("unsplit-keep-last", {"variant": "split_row", "block_size": 16384, "num_warps": 16, "split": False,
                           "keep_last": True}),
    ("fused-keep-last", {"variant": "fused", "block_size": 32768, "num_warps": 16, "keep_last": True}),
]


@pytest.mark.parametrize("spec", ODD_CHUNK_SPECS, ids=[s[0] for s in ODD_CHUNK_SPECS])
@pytest.mark.parametrize("loss_index", range(len(LOSS_FORMATS)), ids=LOSS_IDS)
@pytest.mark.parametrize("vocab", [50304, 50257])
def test_odd_chunk_counts_capped_and_keep_last(vocab, loss_index, spec):
    name, options = spec
    problem = get_problem(1024, vocab, loss_index)
    plan = kernels.prepare(problem.logits, problem.target, **problem.options(), **options)
    if options.get("cooperative"):
        assert plan.config["mode"] == "cooperative" and plan.config["programs"] <= plan.config["resident_programs"]
    label = f"1024x{vocab} bf16 {problem.loss}/{problem.fmt} {name} {plan.config}"
    check_against_reference(problem, plan.run(), label)
    loss_again, _ = plan.run()  # the lagged halves alternate between runs
    assert abs(loss_again.item() - problem.ref_loss) / abs(problem.ref_loss) <= TOL


# Labels CE: the kernels test the label against a tile's own lanes (row_math.label_in_tile), so each row's label sits
# where that frame shifts: the row's head (rows not 16-byte aligned, peeled), the body's first and last columns, both
# sides of every chunk or tile boundary (counted from the row's own head), the tail; aligned rows too.
PEELED_LABEL_SPECS = [
    ("lagged-4096-capped72", {"variant": "split_row", "block_size": 4096, "num_warps": 4, "cooperative": True,
                              "maxnreg": 72}),
    ("lagged-8192", {"variant": "split_row", "block_size": 8192, "num_warps": 4, "cooperative": True}),
    # 49 chunks at 100277 (summaries over 64 lanes), rows peeled
    ("lagged-2048", {"variant": "split_row", "block_size": 2048, "num_warps": 4, "cooperative": True}),
    ("lagged-4096-exact-math", {"variant": "split_row", "block_size": 4096, "num_warps": 4, "cooperative": True,
                                "fast_math": False}),
    ("unsplit-16384", {"variant": "split_row", "block_size": 16384, "num_warps": 16, "split": False}),
    ("unsplit-16384-keep-last", {"variant": "split_row", "block_size": 16384, "num_warps": 16, "split": False,
                                 "keep_last": True}),
    ("fused-65536", {"variant": "fused", "block_size": 65536, "num_warps": 32}),  # one tile at 50257, two at 100277
    # Kernels that do not peel: the "wait" cooperative kernel and the multi-launch form (chunks from column 0).
    ("wait-4096", {"variant": "split_row", "block_size": 4096, "num_warps": 4, "cooperative": True,
                   "schedule": "wait"}),
    ("multi-launch-4096", {"variant": "split_row", "block_size": 4096, "num_warps": 4, "cooperative": False}),
]
UNPEELED_LABEL_SPECS = ("wait-4096", "multi-launch-4096")


def label_positions(head: int, vocab: int, tile: int) -> list[int]:
    """Columns where a kernel's label frame shifts, for a row whose body starts ``head`` columns in (0: not peeled)."""
    body = (vocab - head) // 8 * 8
    found = set(range(head + 1)) | {head + body - 1, head + body} | set(range(vocab - 8, vocab))
    for edge in range(tile, body, tile):
        found |= {head + edge - 1, head + edge}
    return sorted(column for column in found if 0 <= column < vocab)


@pytest.mark.parametrize("spec", PEELED_LABEL_SPECS, ids=[s[0] for s in PEELED_LABEL_SPECS])
@pytest.mark.parametrize("vocab", [32000, 50304, 50257, 100277])
def test_label_positions(vocab, spec):
    name, options = spec
    n_rows = 160
    gen = torch.Generator(device="cuda").manual_seed(vocab)
    logits = torch.randn(n_rows, vocab, generator=gen, device="cuda", dtype=torch.bfloat16).mul_(SCALE)
    peels = bool(vocab % 16) and name not in UNPEELED_LABEL_SPECS
    labels = []
    for row in range(n_rows):
        head = (8 - row * vocab % 8) % 8 if peels else 0
        positions = label_positions(head, vocab, options["block_size"])
        labels.append(positions[row % len(positions)])
    labels = torch.tensor(labels, device="cuda")
    plan = kernels.prepare(logits, labels, loss="cross_entropy", target_format="labels", **options)
    assert plan.launches[0].constexprs.get("PEEL", False) == peels
    ref_loss, ref_grad = reference.entropy_loss_forward_backward(logits, labels, loss="cross_entropy",
                                                                 target_format="labels")
    for _call in range(2):  # the lagged halves alternate between calls
        loss, grad = plan.run()
        label = f"{n_rows}x{vocab} labels CE {name} {plan.config}"
        assert abs(loss.item() - ref_loss.item()) / abs(ref_loss.item()) <= TOL, label
        assert rel_err(grad, ref_grad) <= TOL, label
        at_label = grad.double().gather(1, labels[:, None])
        ref_at_label = ref_grad.gather(1, labels[:, None])
        assert rel_err(at_label, ref_at_label) <= TOL, f"{label}: the gradient at the labels"


# The resident row (labels CE, the row kept in registers as pairs of bf16 logits, kernels.resident_row): every warp
# count the search may time, rows of a power-of-two width and not, labels on both halves of a word and at the
# row's ends (written again after the barrier), ignored rows, grad_output negative (the packed sign bits) or zero.
@pytest.mark.parametrize("num_warps", [8, 16, 32])
@pytest.mark.parametrize("vocab", [32000, 32768, 4104])
def test_resident_rows(vocab, num_warps):
    problem = get_problem(1000, vocab, 0)
    plan = kernels.prepare(problem.logits, problem.target, variant="fused", resident=True, num_warps=num_warps,
                           **problem.options())
    assert plan.launches[0].name == "fused.resident" and plan.config["resident"]
    check_against_reference(problem, plan.run(), f"1000x{vocab} labels CE resident {num_warps} warps")
    n_rows = 64
    logits = problem.logits[:n_rows]
    edges = [0, 1, 2, 3, vocab // 2, vocab // 2 + 1, vocab - 2, vocab - 1]
    labels = torch.tensor([edges[row % len(edges)] for row in range(n_rows)], device="cuda")
    for grad_output in (-0.37, 0.0):
        loss, grad = kernels.entropy_loss_forward_backward(logits, labels, variant="fused", resident=True,
                                                           num_warps=num_warps, grad_output=grad_output)
        ref_loss, ref_grad = reference.entropy_loss_forward_backward(logits, labels, loss="cross_entropy",
                                                                     target_format="labels", grad_output=grad_output)
        label = f"{n_rows}x{vocab} labels CE resident {num_warps} warps, grad_output {grad_output}"
        assert abs(loss.item() - ref_loss.item()) / abs(ref_loss.item()) <= TOL, label
        if grad_output:
            assert rel_err(grad, ref_grad) <= TOL, label
            at_label = grad.double().gather(1, labels[:, None])
            assert rel_err(at_label, ref_grad.gather(1, labels[:, None])) <= TOL, f"{label}: at the labels"
        else:
            assert torch.count_nonzero(grad) == 0, label


# The lagged kernel where the chunk count does not divide the resident programs (38 chunks of 4096 at 151936
# columns, 49 at 200064: a few resident slots stay idle), a call with fewer rows than slots (7 rows), and one whose
# last step leaves most slots without a row (1000 rows), and a row's summaries over 64 lanes partly used or (64 chunks
# at 262144) full.
@pytest.mark.parametrize("loss_index", range(len(LOSS_FORMATS)), ids=LOSS_IDS)
@pytest.mark.parametrize("n_rows, vocab", [(7, 151936), (1000, 151936), (333, 200064), (300, 262144)])
def test_lagged_ragged_chunk_counts(n_rows, vocab, loss_index):
    problem = get_problem(n_rows, vocab, loss_index)
    plan = kernels.prepare(problem.logits, problem.target, **problem.options(), variant="split_row", block_size=4096,
                           num_warps=4, cooperative=True)
    chunks, programs = plan.config["num_chunks"], plan.config["programs"]
    assert plan.config["schedule"] == "lagged" and programs % chunks == 0
    assert programs // chunks == min(n_rows, plan.config["resident_programs"] // chunks)
    label = f"{n_rows}x{vocab} bf16 {problem.loss}/{problem.fmt} {plan.config}"
    for _call in range(3):  # the summaries' two halves alternate between calls
        check_against_reference(problem, plan.run(), label)


# -inf logits (masked vocabulary entries: probability 0, gradient 0) and targets, NaN, and rows whose every logit is
# -inf, through the lagged kernel's statistics, exchange and scalars, with its fast math (approximate log2 and
# division, statistics from the raw tiles) and without. Which entries may be -inf depends on the loss: a target
# probability > 0 where the logits are -inf makes cross-entropy and forward KL infinite, a logit probability > 0
# where the target is -inf makes reverse KL infinite; those are left out of the finite case.
@pytest.mark.parametrize("fast_math", [True, False], ids=["fast-math", "exact-math"])
@pytest.mark.parametrize("loss_index", range(len(LOSS_FORMATS)), ids=LOSS_IDS)
def test_lagged_special_values(loss_index, fast_math):
    loss, fmt = LOSS_FORMATS[loss_index]
    n_rows, vocab = 96, 40000  # 10 chunks of 4096, the last partial
    gen = torch.Generator(device="cuda").manual_seed(97 + loss_index)
    logits = torch.randn(n_rows, vocab, generator=gen, device="cuda").mul_(SCALE).to(torch.bfloat16)
    both = torch.arange(vocab, device="cuda") % 97 == 0  # masked in logits and target
    one = torch.arange(vocab, device="cuda") % 89 == 5  # masked in one of them only (see above)
    logits[:, both] = float("-inf")
    if fmt == "labels":
        target = torch.randint(0, vocab, (n_rows,), generator=gen, device="cuda")
        target = torch.where(both[target], target + 1, target)  # a label's own logit is finite
    else:
        target = torch.randn(n_rows, vocab, generator=gen, device="cuda").mul_(SCALE).to(torch.bfloat16)
        target[:, both] = float("-inf")
        (logits if loss == "reverse_kl" else target)[:, one] = float("-inf")

    def run(x):
        plan = kernels.prepare(x, target, loss=loss, target_format=fmt, variant="split_row", block_size=4096,
                               num_warps=4, cooperative=True, fast_math=fast_math)
        assert plan.config["schedule"] == "lagged" and plan.config["num_chunks"] == 10
        return plan.run()

    value, grad = run(logits)
    ref_loss, ref_grad = reference.entropy_loss_forward_backward(logits, target, loss=loss, target_format=fmt)
    assert torch.isfinite(ref_loss) and abs(value.item() - ref_loss.item()) / abs(ref_loss.item()) <= TOL
    assert rel_err(grad, ref_grad) <= TOL
    assert torch.count_nonzero(grad[:, both]) == 0, "masked vocabulary entries need a zero gradient"
    for row, column, special in ((3, None, float("-inf")), (50, 12345, float("nan"))):
        broken = logits.clone()
        broken[row, slice(None) if column is None else column] = special
        value, _ = run(broken)
        assert torch.isnan(value), f"{special} at row {row} gave a finite loss {value.item()}"


# The lagged kernel's gradient with its scales in the exponents (forward KL and cross-entropy from logits,
# row_math.folded_gradient): a negative grad_output reads the two tiles the other way round, zero gives a zero
# gradient, and target logits of another dtype than the logits (their pointers may not be swapped) take the scaled
# form; rows aligned (32768) and peeled (50257), bf16 and fp32 logits. Every loss runs, the others as the control.
@pytest.mark.parametrize("dtypes", [(torch.bfloat16, torch.bfloat16), (torch.float32, torch.float32),
                                    (torch.float32, torch.bfloat16), (torch.bfloat16, torch.float32)],
                         ids=["bf16", "fp32", "fp32-bf16-target", "bf16-fp32-target"])
@pytest.mark.parametrize("vocab", [32768, 50257])
@pytest.mark.parametrize("loss_index", [i for i, (_loss, fmt) in enumerate(LOSS_FORMATS) if fmt == "logits"],
                         ids=[name for name, (_loss, fmt) in zip(LOSS_IDS, LOSS_FORMATS) if fmt == "logits"])
def test_lagged_gradient_sign_and_target_dtype(loss_index, vocab, dtypes):
    loss, fmt = LOSS_FORMATS[loss_index]
    gen = torch.Generator(device="cuda").manual_seed(131 + loss_index)
    logits = torch.randn(200, vocab, generator=gen, device="cuda").mul_(SCALE).to(dtypes[0])
    target = torch.randn(200, vocab, generator=gen, device="cuda").mul_(SCALE).to(dtypes[1])
    tol = TOL if torch.bfloat16 in dtypes else 1e-5
    plan_options = dict(loss=loss, target_format=fmt, variant="split_row", block_size=4096, num_warps=4,
                        cooperative=True)
    for grad_output in (-0.37, 0.0, torch.tensor(-2.5, device="cuda")):
        plan = kernels.prepare(logits, target, grad_output=grad_output, **plan_options)
        assert plan.config["schedule"] == "lagged"
        for _call in range(2):  # the summaries' two halves alternate between calls
            value, grad = plan.run()
            ref_loss, ref_grad = reference.entropy_loss_forward_backward(logits, target, loss=loss, target_format=fmt,
                                                                         grad_output=float(grad_output))
            label = f"{loss} 200x{vocab} {dtypes} grad_output {float(grad_output)}"
            assert abs(value.item() - ref_loss.item()) / abs(ref_loss.item()) <= tol, label
            if float(grad_output):
                assert rel_err(grad, ref_grad) <= tol, label
            else:
                assert torch.count_nonzero(grad) == 0, label


# --------------------------------------------------------------------------------------------
# More than 2**31 elements
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["split_row", "fused"])
@pytest.mark.parametrize("loss_index", [0, 3], ids=[LOSS_IDS[0], LOSS_IDS[3]])
def test_more_than_2_31_elements(loss_index, variant):
    """32768 x 131072 bf16: every row * stride past 2**31 must use 64-bit offsets."""
    n_rows, vocab = HUGE
    assert n_rows * vocab > 2**31
    if (n_rows, vocab, loss_index) not in _CACHE:
        _CACHE.clear()  # make room: the previous problem's tensors
        torch.cuda.empty_cache()
        # bf16 logits (+ target) + bf16 gradient, and ~4 GiB for the chunked float64 reference
        needed = (3 if LOSS_FORMATS[loss_index][1] == "logits" else 2) * n_rows * vocab * 2 + 4 * 2**30
        free, _ = torch.cuda.mem_get_info()
        if free < needed:
            pytest.skip(f"needs ~{needed / 2**30:.0f} GiB of free GPU memory, {free / 2**30:.0f} GiB free")
    problem = get_problem(n_rows, vocab, loss_index)
    assert any(row * vocab >= 2**31 for row in problem.rows)
    plan = kernels.prepare(problem.logits, problem.target, variant=variant, **problem.options())
    result = plan.run()
    check_against_reference(problem, result, f"{n_rows}x{vocab} bf16 {problem.loss}/{problem.fmt} {variant} {plan.config}")
    del result


# --------------------------------------------------------------------------------------------
# Cooperative split_row: refusal and fallback
# --------------------------------------------------------------------------------------------


def test_cooperative_refuses_grid_that_cannot_be_resident(monkeypatch):
    problem = Problem(64, 32768, 0, seed=7)
    monkeypatch.setattr(split_row_module, "max_resident_programs", lambda launch: 1)
    # 32768 / 8192 = 4 chunks per row, but the "device" holds 1 program at a time.
    with pytest.raises(ValueError, match="cooperative"):
        kernels.prepare(problem.logits, problem.target, variant="split_row", block_size=8192, cooperative=True,
                        **problem.options())
    plan = kernels.prepare(problem.logits, problem.target, variant="split_row", block_size=8192, cooperative=None,
                           **problem.options())
    assert plan.config["mode"] == "multi_launch"
    assert [launch.name for launch in plan.launches] == ["split_row.stats", "split_row.grad"]
    check_against_reference(problem, plan.run(), "64x32768 split_row fallback (resident=1)")


def test_cooperative_is_default_when_resident():
    problem = Problem(256, 65536, 3, seed=8)
    plan = kernels.prepare(problem.logits, problem.target, variant="split_row", block_size=8192, **problem.options())
    assert plan.config["mode"] == "cooperative", plan.config
    assert plan.config["programs"] <= plan.config["resident_programs"]
    assert plan.config["programs"] % plan.config["num_chunks"] == 0
    check_against_reference(problem, plan.run(), f"256x65536 reverse_kl split_row default {plan.config}")


# --------------------------------------------------------------------------------------------
# Occupancy: perfutils' prediction vs the driver, for every kernel the variants launch
# --------------------------------------------------------------------------------------------


def driver_blocks_per_sm(compiled) -> int:
    pytest.importorskip("cuda.bindings.driver", reason="cuda-python (cuda.bindings) is not installed")
    from perfutils.model.occupancy import driver_blocks_per_sm as driver_query

    return driver_query(compiled)


OCCUPANCY_CONFIGS = [
    # (variant, block_size, num_warps, options)
    ("fused", None, None, {}),
    ("fused", 4096, 4, {}),
    ("two_pass", None, None, {"stats_block_size": 2048, "grad_block_size": 8192, "grad_num_warps": 16}),
    ("split_row", None, None, {"cooperative": True}),
    ("split_row", 4096, 4, {"cooperative": True}),
    ("split_row", 4096, 4, {"cooperative": True, "schedule": "wait"}),
    ("split_row", 4096, 4, {"cooperative": True, "maxnreg": 96}),
    ("split_row", 16384, 16, {"cooperative": False}),
]


OCCUPANCY_IDS = ["fused-default", "fused-bs4096-w4", "two_pass-mixed", "split_row-coop-default", "split_row-coop-bs4096-w4",
                 "split_row-wait-bs4096-w4", "split_row-capped96-bs4096-w4", "split_row-multi-bs16384-w16"]


@pytest.mark.parametrize("config", OCCUPANCY_CONFIGS, ids=OCCUPANCY_IDS)
@pytest.mark.parametrize("loss_index", range(len(LOSS_FORMATS)), ids=LOSS_IDS)
def test_occupancy_matches_driver(loss_index, config):
    from perfutils.model.occupancy import occupancy_of_compiled

    variant, block_size, num_warps, options = config
    problem = Problem(512, 32768, loss_index, seed=9)
    plan = kernels.prepare(problem.logits, problem.target, variant=variant, block_size=block_size,
                           num_warps=num_warps, **problem.options(), **options)
    plan.run()
    torch.cuda.synchronize()
    sm_count = torch.cuda.get_device_properties(0).multi_processor_count
    for launch in plan.launches:
        compiled = launch.compiled
        assert compiled is not None, f"{launch.name}: no CompiledKernel recorded"
        predicted = occupancy_of_compiled(compiled)
        actual = driver_blocks_per_sm(compiled)
        print(
            f"\n[gpu] occupancy {problem.loss}/{problem.fmt} {launch.name} BLOCK_SIZE={launch.block_size} "
            f"warps={launch.num_warps}: n_regs={compiled.n_regs} shared={compiled.metadata.shared} -> "
            f"predicted {predicted.blocks_per_sm} blocks/SM ({predicted.limiter}), driver {actual}",
            flush=True,
        )
        assert predicted.blocks_per_sm == actual, f"{launch.name}: predicted {predicted.blocks_per_sm}, driver {actual}"
        if plan.config.get("mode") == "cooperative":
            # The persistent grid was sized from this prediction: it must hold on the real device.
            assert plan.config["resident_programs"] == actual * sm_count
            assert launch.grid[0] <= actual * sm_count
