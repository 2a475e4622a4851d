"""The symmetric vocab-parallel design's chunk size, chosen by the ranks together at the first call of a shape class.

The exchange kernel (``kernels.vocab_parallel_exchange``) cuts each rank's slice of a row into chunks. 4096 columns
with 4 warps was the fastest or within 4% of it at most widths measured on two H100s, but not at all of them:
cross-entropy from labels at 151936 columns (75968 a rank) took 0.532 ms with 8192-column chunks against 0.598 with
4096, and 8192 lost 4-13% at 131072 and 256000 (``data/h100-sxm-80gb/logs/explore_exchange_2026-11-26.txt``); no
rule on the slice's width separates those. So, like split_row's first-call search (``kernels.autotune``), the first
call of a shape class times the candidates, here on every rank at once: a candidate's plan runs on all ranks
together (L2 flushed before each run, as the tensor-parallel study times it), the slowest rank's median is its time,
and since every rank computes the same numbers every rank keeps the same candidate. The choice goes to the same
disk cache as autotune's (a key of its own, per GPU model, Triton version and code) and to memory. Ranks whose
caches disagree (one host's cache cleared, say) find out in one ``all_gather_object`` and search again together.

The search runs where autotune's would (a CUDA device, not the interpreter, not while a CUDA graph is captured,
``FUSED_LOSS_AUTOTUNE`` not 0) and on slices wider than one 4096-column chunk; elsewhere the default applies.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist

from . import autotune
from .peer_memory import group_barrier
from .launch import interpreting

CANDIDATES = ((4096, 4), (8192, 4))  # (block_size, num_warps); the other sizes explored never won
WARMUP = 3  # untimed runs per candidate (the first one starts the kernel)
REPEATS = 15  # timed runs per candidate
FLUSH_BYTES = 256 * 2**20  # more than the L2 of any GPU the project targets (H100: 50 MB)
_MEMORY: dict[tuple, dict] = {}


def shape_class(vp) -> str:
    """What a choice holds for: autotune's shape class of the rank's slice, and the group's size."""
    return f"vocab_parallel/symmetric/tp={vp.world_size}/" + autotune.shape_class(vp.problem)


def searchable(vp) -> bool:
    problem = vp.problem
    return (problem.logits.is_cuda and not interpreting() and autotune.enabled() and problem.n_rows > 0
            and problem.n_cols > CANDIDATES[0][0] and not torch.cuda.is_current_stream_capturing())


def agreed_entry(entries: list):
    """The cache entry every rank read, or None when they differ or none read one (then they search together)."""
    first = entries[0]
    return first if first is not None and all(entry == first for entry in entries) else None


def choose(vp, planner: Callable, default: tuple[int, int]) -> tuple[int, int, str, object]:
    """``(block_size, num_warps, source, plan)`` for this call's shape class. ``planner(block_size, num_warps)`` builds
    a candidate's plan; ``plan`` is the winner's, already built, when this call searched (else None: the caller
    builds it). Collective on a memory miss (every rank calls it at the same point, as every vocab-parallel call)."""
    if not searchable(vp):
        return (*default, "default", None)
    device = vp.problem.logits.device
    gpu_name = torch.cuda.get_device_name(device)
    key = shape_class(vp)
    entry, plan = _MEMORY.get((gpu_name, key)), None
    if entry is None:
        path = autotune.cache_file(gpu_name)
        everyone: list = [None] * vp.world_size
        dist.all_gather_object(everyone, autotune.read_cache(path).get(key), group=vp.group)
        entry = agreed_entry(everyone)
        if entry is None:
            entry, plan = _search(vp, planner, default)
            autotune.write_cache(path, key, entry)
        _MEMORY[(gpu_name, key)] = entry
    return entry["block_size"], entry["num_warps"], entry["source"], plan


def _search(vp, planner: Callable, default: tuple[int, int]) -> tuple[dict, object]:
    """The cache entry of the fastest candidate, and its plan (timed, so not built again for the call); the fastest
    so far lends its gradient's memory to the next candidate meanwhile, as autotune's search does."""
    timed, best_plan, best_ms = [], None, float("inf")
    for block_size, num_warps in CANDIDATES:
        plan = planner(block_size, num_warps)
        record = {"block_size": block_size, "num_warps": num_warps, "ms": _time_together(vp, plan)}
        timed.append(record)
        if record["ms"] < best_ms:  # the first of equal times, as min() would choose
            autotune.gradient_memory(_grad(plan), keep=False)
            best_plan, best_ms = plan, record["ms"]
        del plan  # a losing plan's workspace goes before the next candidate's is allocated
    autotune.gradient_memory(_grad(best_plan), keep=True)
    best = min(timed, key=lambda record: record["ms"])
    return ({"block_size": best["block_size"], "num_warps": best["num_warps"], "source": "first-call search",
             "candidates": timed, "default": list(default)}, best_plan)


def _grad(plan):
    buffers = getattr(plan, "buffers", None)
    return buffers.get("grad") if isinstance(buffers, dict) else None


def _time_together(vp, plan) -> float:
    """The slowest rank's median ms of ``plan.run()``, the same number on every rank. Timed as the tensor-parallel
    study times a call (perfutils.studies.tensor_parallel.bench_together): after one barrier the ranks issue the same
    calls back to back, each preceded by an L2 flush, and stay in step through the exchange itself; a barrier before
    each call would add the ranks' launch skew to every time (it did: up to 40% on two H100s)."""
    device = vp.problem.logits.device
    flush = torch.empty(FLUSH_BYTES, dtype=torch.int8, device=device)
    group_barrier(vp.group, device)  # planning compiled the kernel that waits for its peers: start them together
    for _ in range(WARMUP):
        plan.run()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(REPEATS)]
    for start, end in events:
        flush.zero_()
        start.record()
        plan.run()
        end.record()
    torch.cuda.synchronize(device)
    times = sorted(start.elapsed_time(end) for start, end in events)
    slowest = torch.tensor([times[len(times) // 2]], device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=vp.group)
    return float(slowest)
