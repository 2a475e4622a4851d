"""Vocab-parallel losses (kernels.vocab_parallel) on two processes: gloo and the Triton interpreter without a GPU,
NCCL and compiled kernels on a machine with two GPUs.

Two spawned ranks each hold half of the vocabulary. Every case runs the loss with ``group=`` on the halves and the
single-process call on the whole vocabulary, and checks the loss (the same on both ranks, bit for bit) and the
concatenated gradient against the single-process result, for the four losses and both designs ("all_gather", and
"symmetric", whose exchange runs through /dev/shm files under the interpreter), with ignore_index, loss_mask,
grad_output (number, tensor, None), batch dimensions, autograd and torch.compile. Bad calls: ranks that disagree
(shapes, labels), labels outside the whole vocabulary, a peer that never calls (the bounded wait's error).

On two GPUs the job adds cases the interpreter cannot run in reasonable time or at all: rows split into several
chunks over persistent grids (large vocabularies), a repeated call captured in a CUDA graph and replayed, a
repeated call under ``torch.cuda.set_sync_debug_mode("error")`` (no host sync), and the call under
``torch.compile(mode="reduce-overhead")`` from no template (its warm-up allocates in the graphs' pool); the peer that
never calls is left out there (its device-side assert ends the CUDA context).

The two ranks run every case in one job (module fixture); a job that hangs is killed after ``JOB_TIMEOUT_S`` and the
tests fail. The argument checks that need no second process run in this process.
"""

from __future__ import annotations

import os
import queue
import socket
import time
import traceback
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

import kernels
from kernels import vocab_parallel
from conftest import LOSS_FORMATS

WORLD = 2
ON_GPUS = torch.cuda.device_count() >= WORLD
JOB_TIMEOUT_S = 480 if ON_GPUS else 300  # on GPUs first calls compile (and run auto's search for the reference)
VOCAB = 40  # 20 columns per rank
DESIGNS = ("all_gather", "symmetric")
TOLERANCE = 1e-5  # fp32 inputs: the split changes only the order of the exact summary combination


def _cases() -> list[dict]:
    cases = []
    for loss, fmt in LOSS_FORMATS:
        for design in DESIGNS:
            base = dict(loss=loss, fmt=fmt, design=design)
            cases.append(dict(base, name=f"{loss}-{fmt}-{design}-batch", shape=(2, 3), grad_output=0.5))
            cases.append(dict(base, name=f"{loss}-{fmt}-{design}-mask", shape=(6,), mask=True, grad_output="tensor"))
            cases.append(dict(base, name=f"{loss}-{fmt}-{design}-autograd", shape=(5,), autograd=True))
            cases.append(dict(base, name=f"{loss}-{fmt}-{design}-backward_twice", shape=(3,), autograd=True,
                              backward_twice=True))
    cases.append(dict(name="reverse_kl-logits-symmetric-bf16", loss="reverse_kl", fmt="logits", design="symmetric",
                      shape=(4,), dtype=torch.bfloat16, grad_output=1.0))
    cases.append(dict(name="cross_entropy-labels-all_gather-forward_only", loss="cross_entropy", fmt="labels",
                      design="all_gather", shape=(4,), grad_output=None))
    cases.append(dict(name="cross_entropy-labels-symmetric-no_rows_count", loss="cross_entropy", fmt="labels",
                      design="symmetric", shape=(3,), all_ignored=True, grad_output=1.0))
    cases.append(dict(name="forward_kl-logits-all_gather-compiled", loss="forward_kl", fmt="logits",
                      design="all_gather", shape=(3,), autograd=True, compiled=True))
    # Several tiles a rank: labels on both sides of tile edges, in either rank's slice (the interpreter runs the
    # symmetric design's exchange with one chunk a rank only).
    for design in DESIGNS if ON_GPUS else ("all_gather",):
        cases.append(dict(name=f"cross_entropy-labels-{design}-tiles", loss="cross_entropy", fmt="labels",
                          design=design, shape=(10,), vocab=200, block_size=16, grad_output=1.0,
                          labels=[47, 0, 15, 16, 99, 100, 101, 115, 116, 199]))
    if ON_GPUS:
        for loss, fmt in (("cross_entropy", "labels"), ("reverse_kl", "logits")):
            for design in DESIGNS:
                base = dict(loss=loss, fmt=fmt, design=design, vocab=65536, dtype=torch.bfloat16)
                cases.append(dict(base, name=f"{loss}-{fmt}-{design}-large", shape=(1000,), mask=True))
                cases.append(dict(base, name=f"{loss}-{fmt}-{design}-graph", shape=(512,), graph=True))
                cases.append(dict(base, name=f"{loss}-{fmt}-{design}-no_sync", shape=(512,), no_sync=True))
                cases.append(dict(base, name=f"{loss}-{fmt}-{design}-reduce_overhead", shape=(512,),
                                  reduce_overhead=True))
    return cases


CASES = _cases()
ERROR_CASES = ("vocab_differs", "labels_differ", "label_out_of_range", "variant_with_group", "mask_differs",
               "grad_output_differs", "ignore_index_differs_after_a_cached_call", "bad_row_reverse_kl") + (
    () if ON_GPUS else ("peer_never_calls", "a_new_call_meets_a_cached_one"))


def _inputs(case: dict, seed: int, device):
    gen = torch.Generator().manual_seed(seed)
    dtype = case.get("dtype", torch.float32)
    shape = case["shape"]
    vocab = case.get("vocab", VOCAB)
    logits = (torch.randn(*shape, vocab, generator=gen) * 3).to(dtype)
    if case["fmt"] == "labels":
        target = torch.randint(0, vocab, shape, generator=gen)
        if "labels" in case:
            target = torch.tensor(case["labels"]).reshape(shape)
        target.view(-1)[0] = -100
        if case.get("all_ignored"):
            target.fill_(-100)
    else:
        target = (torch.randn(*shape, vocab, generator=gen) * 3).to(dtype)
    mask = None
    if case.get("mask"):
        mask = torch.rand(shape, generator=gen) > 0.4
        mask.view(-1)[1] = False
        mask = mask.to(device)
    return logits.to(device), target.to(device), mask


def _slice(tensor: torch.Tensor, rank: int) -> torch.Tensor:
    width = tensor.shape[-1] // WORLD
    return tensor[..., rank * width:(rank + 1) * width].contiguous()


def _grad_output(case: dict, device):
    value = case.get("grad_output", 1.0)
    return torch.tensor(0.75, device=device) if value == "tensor" else value


def _repeated(call, case: dict):
    """A repeated call (its template), captured in a CUDA graph and replayed, or under the sync-error mode."""
    call()  # the first call of the shape: plans, compiles, checks the ranks' calls
    if case.get("graph"):
        torch.cuda.synchronize()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            call()  # warm on the capture stream
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = call()
        graph.replay()
        graph.replay()
        torch.cuda.synchronize()
        return captured
    if case.get("no_sync"):
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            result = call()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        return result
    return call()


def _reduce_overhead(case: dict, rank: int, group, device, options: dict) -> tuple:
    """torch.compile(mode="reduce-overhead") of a step that calls the loss with ``group=``, from no template: the
    first calls are the CUDA-graph trees' warm-up, whose allocations land in the graphs' pool (no buffer may be kept
    from them), later calls replay on new inputs; then an eager call. Returns the worst (loss, gradient) errors
    against the single-process call of each input, and the last call's loss."""
    import torch.distributed as dist

    vocab_parallel.TEMPLATES.clear()
    torch._dynamo.reset()
    grad_output = 0.5

    def step(x, t):
        return kernels.entropy_loss_forward_backward(x, t, grad_output=grad_output, group=group,
                                                     tp_design=case["design"], **options)

    compiled = torch.compile(step, mode="reduce-overhead", fullgraph=True)
    loss_err = grad_err = 0.0
    for seed, call in ((11, compiled), (12, compiled), (13, compiled), (14, compiled), (15, step)):
        logits, target, _ = _inputs(case, seed, device)
        ref_loss, ref_grad = kernels.entropy_loss_forward_backward(logits, target, grad_output=grad_output, **options)
        local_target = target if case["fmt"] == "labels" else _slice(target, rank)
        loss, grad = call(_slice(logits, rank), local_target)
        loss, grad = loss.clone(), grad.clone()  # a replay's outputs are the graph's: the next replay writes them
        pieces = [torch.empty_like(grad) for _ in range(WORLD)]
        dist.all_gather(pieces, grad.contiguous(), group=group)
        full, ref = torch.cat(pieces, dim=-1).double(), ref_grad.double()
        grad_err = max(grad_err, float((full - ref).norm() / ref.norm()))
        loss_err = max(loss_err, abs(float(loss) - float(ref_loss)) / max(abs(float(ref_loss)), 1e-6))
    return loss, ref_loss, grad_err, loss_err


def _run_case(case: dict, rank: int, group, device) -> dict:
    import torch.distributed as dist

    if case.get("reduce_overhead"):
        options = dict(loss=case["loss"], target_format=case["fmt"])
        loss, ref_loss, grad_err, loss_err = _reduce_overhead(case, rank, group, device, options)
        losses = [torch.zeros((), device=device) for _ in range(WORLD)]
        dist.all_gather(losses, loss.float().reshape(()), group=group)
        return {"loss": float(loss), "ref_loss": float(ref_loss), "loss_err": loss_err, "grad_err": grad_err,
                "losses_equal": len({float(v) for v in losses}) == 1}
    logits, target, mask = _inputs(case, len(case["name"]) * 7919 + sum(map(ord, case["name"])), device)
    options = dict(loss=case["loss"], target_format=case["fmt"], loss_mask=mask)
    local_target = target if case["fmt"] == "labels" else _slice(target, rank)
    local_logits = _slice(logits, rank)
    if case.get("autograd"):
        scale = 3.0

        def step(loss_fn, x, t):
            x = x.clone().requires_grad_(True)
            value = loss_fn(x, t)
            if case.get("backward_twice"):  # a second use of the graph recomputes the gradient (collective)
                (first,) = torch.autograd.grad(value * scale, x, retain_graph=True)
                kept = first.clone()
                (value * (scale - 1)).backward()
                assert torch.equal(first, kept), "a returned gradient changed"
                x.grad += first
            else:
                (value * scale).backward()
            return value.detach(), x.grad

        def tp_loss(x, t):
            return kernels.entropy_loss(x, t, group=group, tp_design=case["design"], **options)

        reference = step(lambda x, t: kernels.entropy_loss(x, t, **options), logits, target)
        if case.get("compiled"):  # Dynamo traces the call (no graph break); the operator runs the collectives
            tp_loss = torch.compile(tp_loss, fullgraph=True, backend="eager")
        loss, grad = step(tp_loss, local_logits, local_target)
    else:
        grad_output = _grad_output(case, device)
        reference = kernels.entropy_loss_forward_backward(logits, target, grad_output=grad_output, **options)
        tiles = {"block_size": case["block_size"]} if "block_size" in case else {}
        loss, grad = _repeated(lambda: kernels.entropy_loss_forward_backward(
            local_logits, local_target, grad_output=grad_output, group=group, tp_design=case["design"], **tiles,
            **options), case)
    losses = [torch.zeros((), device=device) for _ in range(WORLD)]
    dist.all_gather(losses, loss.detach().float().reshape(()), group=group)
    result = {"loss": float(loss), "ref_loss": float(reference[0]), "losses_equal": len({float(v) for v in losses}) == 1}
    if reference[1] is None:
        result["grad_is_none"] = grad is None
    else:
        assert grad is not None and grad.shape == local_logits.shape and grad.dtype == local_logits.dtype
        pieces = [torch.empty_like(grad) for _ in range(WORLD)]
        dist.all_gather(pieces, grad.contiguous(), group=group)
        full = torch.cat(pieces, dim=-1).double()
        ref = reference[1].double()
        result["grad_err"] = float((full - ref).norm() / ref.norm().clamp(min=1e-30))
    return result


def _error_case(name: str, rank: int, group, device) -> str:
    """Run a call that must fail; returns the error text ('' when nothing was raised)."""
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(4, VOCAB // WORLD, generator=gen).to(device)
    labels = torch.randint(0, VOCAB, (4,), generator=gen).to(device)
    try:
        if name == "vocab_differs":
            width = VOCAB // WORLD + (rank == 1)
            kernels.entropy_loss_forward_backward(torch.randn(4, width, device=device), labels, group=group,
                                                  tp_design="all_gather")
        elif name == "labels_differ":
            kernels.entropy_loss_forward_backward(logits, labels + rank, group=group, tp_design="all_gather",
                                                  validate=True)
        elif name == "label_out_of_range":
            kernels.entropy_loss_forward_backward(logits, torch.full((4,), VOCAB, device=device), group=group,
                                                  tp_design="all_gather", validate=True)
        elif name == "mask_differs":  # without validate=True: the rank that counts a row the other skips sees NaN
            mask = torch.tensor([rank == 0, True, True, True], device=device)
            loss, _ = kernels.entropy_loss_forward_backward(logits, labels, group=group, tp_design="all_gather",
                                                            loss_mask=mask)
            return f"loss {float(loss)}"
        elif name == "grad_output_differs":
            kernels.entropy_loss_forward_backward(logits, labels, group=group, tp_design="all_gather", validate=True,
                                                  grad_output=1.0 + rank)
        elif name == "ignore_index_differs_after_a_cached_call":  # rank 0's call is cached, rank 1's is new
            call = dict(group=group, tp_design="all_gather", validate=True)
            kernels.entropy_loss_forward_backward(logits, labels, **call)
            kernels.entropy_loss_forward_backward(logits, labels, ignore_index=-100 if rank == 0 else 3, **call)
        elif name == "a_new_call_meets_a_cached_one":  # no validate: rank 0's call is cached, rank 1's is new
            import torch.distributed as dist

            short = dist.new_group(list(range(WORLD)), timeout=timedelta(seconds=3))  # the wait that bounds it
            call = dict(group=short, tp_design="all_gather")
            kernels.entropy_loss_forward_backward(logits, labels, **call)
            kernels.entropy_loss_forward_backward(logits, labels, ignore_index=-100 if rank == 0 else 3, **call)
        elif name == "bad_row_reverse_kl":  # a NaN in rank 0's slice of row 1: NaN loss, NaN gradient row everywhere
            bad = logits.clone()
            if rank == 0:
                bad[1, 2] = float("nan")
            loss, grad = kernels.entropy_loss_forward_backward(bad, torch.randn_like(bad), group=group,
                                                               loss="reverse_kl", target_format="logits")
            return (f"loss nan {bool(loss.isnan())} row nan {bool(grad[1].isnan().all())} "
                    f"others finite {bool(grad[[0, 2, 3]].isfinite().all())}")
        elif name == "variant_with_group":
            kernels.entropy_loss_forward_backward(logits, labels, group=group, variant="fused")
        elif name == "peer_never_calls":  # the same call once on both ranks, then only on rank 0: a bounded wait
            call = dict(group=group, tp_design="symmetric", timeout_s=0.05)
            kernels.entropy_loss_forward_backward(logits, labels, **call)
            if rank == 0:
                kernels.entropy_loss_forward_backward(logits, labels, **call)
            else:
                return "not called on this rank"
    except Exception as error:  # noqa: BLE001 - the text is what the test checks
        return f"{type(error).__name__}: {error}"
    return ""


def _worker(rank: int, port: int, results) -> None:
    import warnings

    import torch.distributed as dist

    warnings.filterwarnings("ignore")
    try:
        init = dict(init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
                    timeout=timedelta(seconds=JOB_TIMEOUT_S // 2))
        if ON_GPUS:
            os.environ.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
            device = torch.device("cuda", rank)
            torch.cuda.set_device(device)
            dist.init_process_group("nccl", device_id=device, **init)
        else:
            device = torch.device("cpu")
            dist.init_process_group("gloo", **init)
        group = dist.new_group(list(range(WORLD)))
        for case in CASES:
            started = time.perf_counter()
            try:
                outcome = _run_case(case, rank, group, device)
            except Exception:  # noqa: BLE001 - reported to the test, which fails on it
                outcome = {"error": traceback.format_exc()}
            outcome["seconds"] = time.perf_counter() - started
            results.put((rank, case["name"], outcome))
        for name in ERROR_CASES:
            results.put((rank, name, {"error_text": _error_case(name, rank, group, device)}))
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        results.put((rank, "worker", {"error": traceback.format_exc()}))
    results.put((rank, "done", {}))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def job() -> dict:
    """Both ranks' outcomes, by (rank, case name)."""
    if torch.cuda.is_available() and not ON_GPUS:
        pytest.skip(f"needs {WORLD} GPUs (or none: then gloo and the interpreter)")
    context = mp.get_context("spawn")
    results = context.Queue()
    if not ON_GPUS:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    port = _free_port()
    workers = [context.Process(target=_worker, args=(rank, port, results), daemon=True) for rank in range(WORLD)]
    for worker in workers:
        worker.start()
    outcomes: dict = {}
    deadline = time.monotonic() + JOB_TIMEOUT_S
    finished = 0
    try:
        while finished < WORLD:
            try:
                rank, name, outcome = results.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"the two-rank job did not finish within {JOB_TIMEOUT_S} s (a hang); got {sorted(outcomes)}")
            if name == "done":
                finished += 1
            else:
                outcomes[(rank, name)] = outcome
    finally:
        for worker in workers:
            worker.join(timeout=5)
            if worker.is_alive():
                worker.kill()
    for rank in range(WORLD):
        assert "error" not in outcomes.get((rank, "worker"), {}), outcomes[(rank, "worker")]["error"]
    return outcomes


@pytest.mark.parametrize("case", CASES, ids=[case["name"] for case in CASES])
def test_matches_single_process(job, case):
    for rank in range(WORLD):
        outcome = job[(rank, case["name"])]
        assert "error" not in outcome, f"rank {rank}: {outcome['error']}"
        tolerance = 1e-2 if case.get("dtype") == torch.bfloat16 else TOLERANCE
        assert outcome["losses_equal"], f"the ranks returned different losses ({case['name']})"
        ref = outcome["ref_loss"]
        assert abs(outcome["loss"] - ref) <= tolerance * max(abs(ref), 1e-6), (outcome["loss"], ref)
        assert outcome.get("loss_err", 0.0) <= tolerance, f"rank {rank}: worst loss rel err {outcome['loss_err']}"
        if "grad_is_none" in outcome:
            assert outcome["grad_is_none"]
        else:
            assert outcome["grad_err"] <= tolerance, f"rank {rank}: concatenated gradient rel err {outcome['grad_err']}"


def test_no_counted_rows_give_zero(job):
    assert job[(0, "cross_entropy-labels-symmetric-no_rows_count")]["loss"] == 0.0


@pytest.mark.parametrize("name, expected", [
    ("vocab_differs", ("ValueError", "vocab per rank", "rank 1 21")),
    ("labels_differ", ("ValueError", "labels differ between the ranks")),
    ("label_out_of_range", ("ValueError", "[0, 40)")),
    ("variant_with_group", ("ValueError", "variant must be 'auto'")),
    ("grad_output_differs", ("ValueError", "grad_output differ between the ranks")),
    ("ignore_index_differs_after_a_cached_call", ("ValueError", "ignore_index: rank 0 -100, rank 1 3")),
])
def test_bad_calls_raise_on_every_rank(job, name, expected):
    for rank in range(WORLD):
        text = job[(rank, name)]["error_text"]
        assert all(piece in text for piece in expected), f"rank {rank}: {text!r}"


def test_a_bad_row_gives_nan_gradient_rows_on_every_rank(job):
    for rank in range(WORLD):
        assert job[(rank, "bad_row_reverse_kl")]["error_text"] == "loss nan True row nan True others finite True"


def test_ranks_that_disagree_on_a_row_give_nan_not_a_stale_value(job):
    assert job[(0, "mask_differs")]["error_text"] == "loss nan"


@pytest.mark.skipif(ON_GPUS, reason="on GPUs the timeout is a device-side assert, which ends the CUDA context")
def test_peer_that_never_calls_times_out(job):
    text = job[(0, "peer_never_calls")]["error_text"]
    assert "vocab-parallel exchange timed out" in text, text


@pytest.mark.skipif(ON_GPUS, reason="under NCCL the cached rank's collective is asynchronous: its watchdog ends it")
def test_a_new_call_beside_cached_ones_raises_on_every_rank_without_a_collective(job):
    """Without validate=True: rank 1's call is new, rank 0's is cached (it runs its all-gather alone). Rank 1 waits for
    rank 0's signature in the store (bounded by the group's timeout) instead of starting a collective rank 0 does not
    join; rank 0's collective times out. Both raise the ValueError naming what differs (no abort, no hang)."""
    for rank in range(WORLD):
        text = job[(rank, "a_new_call_meets_a_cached_one")]["error_text"]
        assert text.startswith("ValueError") and "ignore_index: rank 0 -100, rank 1 3" in text, f"rank {rank}: {text!r}"


def test_job_time_is_modest(job):
    """The interpreter is slow; keep the CPU job's cases small (seconds each)."""
    slowest = max(outcome["seconds"] for key, outcome in job.items() if "seconds" in outcome)
    assert slowest < (120 if ON_GPUS else 30), slowest  # on GPUs a first call compiles and runs auto's search


# ---- argument checks that need no second process -------------------------------------------------------------


def test_group_needs_initialized_distributed():
    x, t = torch.randn(2, 8), torch.randint(0, 8, (2,))
    with pytest.raises(RuntimeError, match="init_process_group"):
        kernels.entropy_loss_forward_backward(x, t, group=object())


def test_tp_design_needs_group():
    x, t = torch.randn(2, 8), torch.randint(0, 8, (2,))
    with pytest.raises(ValueError, match="needs group="):
        kernels.entropy_loss_forward_backward(x, t, tp_design="symmetric")
    with pytest.raises(ValueError, match="needs group="):
        kernels.entropy_loss(x, t, tp_design="all_gather")


def test_checked_calls_are_bounded_and_checked_again_once_forgotten(monkeypatch, tmp_path):
    """The record of calls the ranks agreed on (one collective each) keeps at most its bound of shapes, least
    recently used out (token counts that vary per step must not grow it forever); a forgotten shape is checked again
    (a one-rank gloo group in this process)."""
    import torch.distributed as dist

    from kernels import dispatch, vocab_parallel

    checked = []
    real_check = vocab_parallel.check_same_call
    monkeypatch.setattr(vocab_parallel, "check_same_call",
                        lambda vp, signature: checked.append(signature["rows"]) or real_check(vp, signature))
    monkeypatch.setattr(vocab_parallel, "_HOSTS", dispatch.TemplateCache(max_entries=4))
    dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"file://{tmp_path / 'rendezvous'}")
    try:
        group = dist.new_group([0])
        for rows in [1, 2, 3, 4, 5, 1, 5]:
            vocab_parallel.prepare(torch.randn(rows, 8), torch.randint(0, 8, (rows,)), group=group)
    finally:
        dist.destroy_process_group()
    assert checked == [1, 2, 3, 4, 5, 1]  # 1 was forgotten for 5; 5 was still known
    assert len(vocab_parallel._HOSTS) == 4


def test_exchange_search_agrees_across_ranks_and_stays_off_the_cpu():
    """kernels.vocab_parallel_search: the ranks keep a cached choice only when every rank read the same one; its key
    names the group's size; off a GPU (here) nothing is timed and the default comes back, with no collective."""
    from kernels import vocab_parallel_search as search
    from kernels.problem import build_problem

    entry = {"block_size": 8192, "num_warps": 4, "source": "first-call search"}
    assert search.agreed_entry([entry, dict(entry)]) == entry
    assert search.agreed_entry([entry, None]) is None and search.agreed_entry([None, None]) is None
    assert search.agreed_entry([entry, dict(entry, block_size=4096)]) is None
    logits = torch.zeros(16, 20000)
    problem = build_problem(logits, torch.zeros(16, dtype=torch.int64), loss="cross_entropy", target_format="labels",
                            grad_output=1.0, ignore_index=-100, loss_mask=None)
    vp = vocab_parallel.VocabParallelProblem(problem, None, 0, 2)
    assert search.shape_class(vp).startswith("vocab_parallel/symmetric/tp=2/cross_entropy/labels/")
    assert not search.searchable(vp)
    assert search.choose(vp, lambda *_: pytest.fail("nothing is planned off a GPU"),
                         (4096, 4)) == (4096, 4, "default", None)


def test_exchange_search_hands_back_the_plan_it_timed(monkeypatch):
    """The search's winner is the plan the call runs: built once, timed, returned (not planned a second time); while
    the next candidate is timed, the fastest so far holds no gradient memory (one gradient at a time), and the winner
    gets its memory back."""
    from types import SimpleNamespace

    from kernels import vocab_parallel_search as search

    built = []

    def planner(block_size, num_warps):
        built.append(SimpleNamespace(block_size=block_size, buffers={"grad": torch.zeros(64)}))
        return built[-1]

    def fake_time(vp, plan):
        assert all(other.buffers["grad"].untyped_storage().nbytes() == 0 for other in built[:-1])
        return {4096: 0.4, 8192: 0.5}[plan.block_size]

    monkeypatch.setattr(search, "_time_together", fake_time)
    entry, plan = search._search(None, planner, (4096, 4))
    assert plan is built[0] and entry["block_size"] == 4096 and entry["source"] == "first-call search"
    assert [(p.block_size, 4) for p in built] == list(search.CANDIDATES) and entry["candidates"][1]["ms"] == 0.5
    assert plan.buffers["grad"].untyped_storage().nbytes() == 64 * 4


def test_bytes_per_rank():
    common = dict(loss="cross_entropy", target_format="labels", n_rows=4096, vocab=131072, world_size=2)
    tp1 = vocab_parallel.bytes_per_rank("tp1", **common)
    gather = vocab_parallel.bytes_per_rank("all_gather", **common)
    symmetric = vocab_parallel.bytes_per_rank("symmetric", **common)
    elements = 4096 * 65536
    assert tp1["min"] == 2 * gather["min"] == 4096 * 131072 * 4
    assert gather["dram"] == elements * 6 and symmetric["dram"] == gather["min"] == elements * 4
    assert gather["collectives"] == 1 and symmetric["collectives"] == 0
    assert gather["sent"] == 4096 * 3 * 4 and symmetric["sent"] == 4096 * 16 * 3 * 8
    kl = vocab_parallel.bytes_per_rank("all_gather", **dict(common, loss="reverse_kl", target_format="logits"))
    assert kl["dram"] == elements * 10 and kl["min"] == elements * 6
    with pytest.raises(ValueError, match="design must be"):
        vocab_parallel.bytes_per_rank("ring", **common)


def test_measurement_harness_smoke(tmp_path):
    """perfutils.studies.tensor_parallel end to end on two CPU ranks (gloo, interpreter, host timers): the rows, the
    checks and the sidecar the GPU run writes, on a tiny shape (times meaningless)."""
    if torch.cuda.is_available():
        pytest.skip("the smoke run is the CPU path; on GPUs run the measurement itself")
    from perfutils.data import records
    from perfutils.studies import tensor_parallel

    code = tensor_parallel.main(["--device", "cpu", "--out", str(tmp_path), "--tokens", "8", "--vocab", "32",
                                 "--losses", "cross_entropy/labels"])
    assert code == 0
    path = tmp_path / "cpu" / "tensor_parallel.csv"
    df = records.load_records(path)
    assert sorted(df["variant"]) == ["tp1-auto", "tp2-all_gather", "tp2-symmetric"]
    assert (df["status"] == "ok").all(), df[["variant", "status", "error"]]
    tp2 = df[df["tp"] == 2]
    assert tp2["ranks_loss_equal"].all() and (tp2["bytes_min"] == 8 * 16 * 4).all()
    assert set(tp2["collectives"]) == {0, 1}
    meta = records.load_metadata(path)
    assert len(meta["ranks"]) == 2 and meta["environment"]["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
    assert tensor_parallel.main(["--device", "cpu", "--out", str(tmp_path), "--tokens", "8", "--vocab", "32",
                                 "--losses", "cross_entropy/labels"]) == 0  # resumes: nothing left to measure
    assert len(records.load_records(path)) == 3
    with pytest.raises(SystemExit):  # an exploration never writes into the recorded data folder
        tensor_parallel.main(["--out", "data", "--symmetric-configs", "4096/4"])
    # --forget takes a variant's rows out (the whole file kept aside) and the next run measures them again
    assert tensor_parallel.main(["--out", str(tmp_path), "--gpu", "cpu", "--tokens", "8", "--vocab", "32",
                                 "--forget", "tp2-symmetric"]) == 0
    assert sorted(records.load_records(path)["variant"]) == ["tp1-auto", "tp2-all_gather"]
    kept = list(path.parent.glob("tensor_parallel.replaced-*.csv"))
    assert len(kept) == 1 and len(records.load_records(kept[0])) == 3
    assert records.load_metadata(path)["forgotten"][0]["variants"] == ["tp2-symmetric"]
    assert tensor_parallel.main(["--device", "cpu", "--out", str(tmp_path), "--tokens", "8", "--vocab", "32",
                                 "--losses", "cross_entropy/labels"]) == 0
    assert sorted(records.load_records(path)["variant"]) == ["tp1-auto", "tp2-all_gather", "tp2-symmetric"]
    # Notebook 10 replays these rows on the CPU.
    import papermill

    root = Path(__file__).resolve().parents[1]
    notebook = tmp_path / "10_tensor_parallel.ipynb"
    notebook.write_bytes((root / "notebooks" / "10_tensor_parallel.ipynb").read_bytes())
    papermill.execute_notebook(str(notebook), str(tmp_path / "executed.ipynb"), cwd=str(root), progress_bar=False,
                               parameters=dict(MODE="replay", DATA_DIR=str(tmp_path), FIG_DIR=str(tmp_path / "figs"),
                                               GPU="cpu", TOKENS=[8], VOCABS=[32]))
    assert (tmp_path / "figs" / "10_tp2_vs_tp1.svg").exists() and (tmp_path / "figs" / "10_bytes_per_rank.svg").exists()
