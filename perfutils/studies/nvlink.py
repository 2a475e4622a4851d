"""NVLink between two GPUs of one host: what the vocab-parallel exchange's stores can reach (``nvlink.csv``).

The symmetric design (:mod:`kernels.vocab_parallel_exchange`) writes each chunk's summary, 3 or 5 words of 8 bytes,
straight into every rank's buffer over NVLink and polls its own buffer for its peers' words. The performance model
(:func:`perfutils.model.predict.with_exchange`) needs the rate of those stores, and the learning path's last step the
time a word takes to cross. Measured in two processes, one per GPU, on buffers mapped by the product's own
:mod:`kernels.peer_memory` (PyTorch's symmetric memory, NVLink multicast off), each row timed with CUDA events (the
median of ``reps`` launches, the two processes aligned by a barrier before each; no L2 flush: nothing is read twice):

=====================  ==================================================================================
copy_engine            ``peer_view.copy_(src)``: a tensor copy into the peer's buffer (the copy engines)
sm_stores              :func:`~perfutils.lab_kernels.microbench.copy_to_kernel` into the peer's buffer
summary_words          the exchange's stores alone (``summary_words_kernel``, the grid and addresses of the
                       recorded two-GPU plan) into the peer's buffer
summary_words_local    the same into the process's own buffer: the stores without NVLink
round_trip             one word bounced between the GPUs (``ping_pong_kernel``): ``ns_per_round_trip``
=====================  ==================================================================================

Transfers run one way (rank 0 sends, rank 1 waits) and both ways at once (``directions``), as the exchange sends from
every rank. ``gbps`` is the bytes one rank sends over its time (10^9 B/s). Every transfer is checked on the receiving
side (the words that arrived are the words sent) and the round trip's answers are counted: a row that fails its check
is recorded with ``status`` "wrong". ``--device cpu`` runs the same steps under the Triton interpreter with gloo and
shared files (a smoke run of the harness: tiny sizes, meaningless times).

    python -m perfutils nvlink --out data            # two GPUs of one host
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from .tensor_parallel import NO_MULTICAST_ENV, free_port, gpu_topology, rank_group

__all__ = ["COLUMNS", "STUDY", "DEFAULTS", "main"]

STUDY = "nvlink"
COLUMNS = ["measure", "directions", "bytes", "ms_median", "ms_p20", "ms_p80", "gbps", "ns_per_round_trip", "status",
           "check", "params", "gpu_name"]
# The exchange of the recorded two-GPU row the learning path predicts (cross-entropy from labels, 4096 x 131072,
# tp=2: tile 4096, 16 chunks a rank, 1184 programs): its grid and word layout; more rows than the row's 4096 so a
# launch lasts long enough for the barrier's skew not to matter.
DEFAULTS = {"cuda": dict(copy_words=32 << 20, rows=65536, slots=74, chunks=16, width=3, rounds=2000, reps=20,
                         poll_limit=4_000_000),
            "cpu": dict(copy_words=4096, rows=64, slots=4, chunks=4, width=3, rounds=3, reps=2, poll_limit=200_000)}


def _quantiles(values: list[float]) -> tuple[float, float, float]:
    ordered = sorted(values)

    def at(q):
        return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]

    return statistics.median(ordered), at(0.2), at(0.8)


class _Clock:
    """Times one launch on this process's device: CUDA events on a GPU, the wall clock on the CPU."""

    def __init__(self, device):
        import torch

        self.torch = torch
        self.cuda = device.type == "cuda"

    def __call__(self, fn) -> float:
        if self.cuda:
            start, end = (self.torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
            fn()
            end.record()
            end.synchronize()
            return float(start.elapsed_time(end))
        began = time.perf_counter()
        fn()
        return (time.perf_counter() - began) * 1e3


def _timed(fn, senders, rank, group, device, reps, clock) -> list[float] | None:
    """``reps`` timed launches of ``fn`` on the ranks in ``senders`` (the others only keep step), each after a
    barrier: per launch, the slowest sender's ms (on rank 0; None elsewhere)."""
    import torch
    import torch.distributed as dist

    from kernels.peer_memory import group_barrier

    if rank in senders:
        fn()  # a first launch compiles
    group_barrier(group, device)
    times = []
    for _ in range(reps):
        group_barrier(group, device)
        times.append(clock(fn) if rank in senders else 0.0)
    group_barrier(group, device)
    everyone = torch.tensor(times, dtype=torch.float64, device=device)
    gathered = [torch.zeros_like(everyone) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, everyone, group=group)
    if rank != 0:
        return None
    return [max(float(g[i]) for j, g in enumerate(gathered) if j in senders) for i in range(reps)]


def _all_true(flag: bool, group, device) -> bool:
    import torch
    import torch.distributed as dist

    value = torch.tensor([0.0 if flag else 1.0], device=device)
    dist.all_reduce(value, group=group)
    return float(value) == 0.0


def _row(measure, directions, nbytes, times, check_ok, check, params, gpu, ns=None) -> dict:
    median, p20, p80 = _quantiles(times)
    return {"measure": measure, "directions": directions, "bytes": int(nbytes), "ms_median": median, "ms_p20": p20,
            "ms_p80": p80, "gbps": nbytes / (median * 1e-3) / 1e9 if nbytes else None, "ns_per_round_trip": ns,
            "status": "ok" if check_ok else "wrong", "check": check, "params": json.dumps(params, sort_keys=True),
            "gpu_name": gpu}


def _peer_view(buffers, peer: int, words: int):
    """A tensor over ``words`` words of rank ``peer``'s buffer, as this process maps it."""
    import torch

    if buffers.backing == "cuda-symmetric-memory":
        return buffers.keep[0].get_buffer(peer, (words,), torch.int64)
    return buffers.keep[peer][:words]


def measure(rank, group, device, options: dict, log=print) -> list[dict]:
    """Every row of the study, on rank 0 (an empty list on the other rank)."""
    import torch

    from kernels.peer_memory import group_barrier, peer_buffers
    from perfutils.lab_kernels.microbench import (launch_copy_to, launch_ping_pong, launch_summary_words,
                                                  summary_word_offsets)

    o = options
    peer = 1 - rank
    lanes = 2 * o["chunks"]  # tp x chunks, as the exchange lays a row's words out
    summary_extent = o["rows"] * o["width"] * lanes
    buffers = peer_buffers(group, device, max(o["copy_words"], summary_extent) + 8)
    clock = _Clock(device)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    rows = []
    both = (0, 1)

    def record(measure_name, senders, fn, nbytes, check, params, ns_rounds=None):
        times = _timed(fn, senders, rank, group, device, o["reps"], clock)
        ok, what = check()
        ok = _all_true(ok, group, device)
        if rank == 0:
            directions = "one_way" if len(senders) == 1 else "both_ways"
            ns = statistics.median(times) * 1e6 / ns_rounds if ns_rounds else None
            rows.append(_row(measure_name, directions, nbytes, times, ok, what, params, gpu, ns))
            log(f"{measure_name} {directions}: {statistics.median(times):.4f} ms"
                + (f", {rows[-1]['gbps']:.1f} GB/s" if nbytes else "") + (f", {ns:.0f} ns a round trip" if ns else "")
                + ("" if ok else f"  CHECK FAILED: {what}"))

    # Bulk transfers into the peer's buffer: the copy engines, then the SMs' stores.
    words = o["copy_words"]
    src = torch.arange(words, dtype=torch.int64, device=device) * 2 + rank
    view = _peer_view(buffers, peer, words)

    def received(senders):  # this rank's buffer holds the peer's source if the peer sent, else nothing
        def check():
            expect = (torch.arange(words, dtype=torch.int64, device=device) * 2 + peer if peer in senders
                      else torch.zeros(words, dtype=torch.int64, device=device))
            return bool(torch.equal(buffers.local[:words], expect)), "each receiver's buffer holds its sender's source"
        return check

    for name, fn, params in (("copy_engine", lambda: view.copy_(src), {"words": words}),
                             ("sm_stores", lambda: launch_copy_to(src, buffers.table, peer),
                              {"words": words, "block_size": 4096, "num_warps": 8})):
        for senders in ((0,), both):
            buffers.local.zero_()
            group_barrier(group, device)
            record(name, senders, fn, words * 8, received(senders), params)

    # The exchange's stores, into the peer's buffer and into the process's own.
    n_words = o["rows"] * o["chunks"] * o["width"]
    offsets, values = summary_word_offsets(o["rows"], o["chunks"], lanes, o["width"])
    offsets, values = offsets.to(device), values.to(device)
    shape = dict(n_rows=o["rows"], n_slots=o["slots"], num_chunks=o["chunks"], lanes=lanes, width=o["width"])
    params = {**shape, "programs": o["slots"] * o["chunks"], "num_warps": 4}
    first = 1000  # the words of every launch are the same: the check reads the last
    for name, target in (("summary_words", peer), ("summary_words_local", rank)):
        buffers.local.zero_()
        group_barrier(group, device)

        def words_arrived():
            return bool(torch.equal(buffers.local[offsets], values + first)), "every word written holds its value"

        record(name, both, lambda: launch_summary_words(buffers.table, target, first_value=first, **shape),
               n_words * 8, words_arrived, params)

    # One word bounced between the two GPUs.
    buffers.local.zero_()
    group_barrier(group, device)
    out = torch.zeros(2, dtype=torch.int64, device=device)
    launches = [0]
    answered = [True]

    def bounce():
        launch_ping_pong(buffers.table, rank, out, rounds=o["rounds"], first_value=launches[0] * o["rounds"],
                         poll_limit=o["poll_limit"])
        launches[0] += 1

    def every_answer():
        return answered[0], f"every round answered within {o['poll_limit']} polls"

    def bounce_and_count():
        bounce()
        answered[0] = answered[0] and int(out[0]) == o["rounds"]

    record("round_trip", both, bounce_and_count, 0, every_answer,
           {"rounds": o["rounds"], "poll_limit": o["poll_limit"], "num_warps": 1}, ns_rounds=o["rounds"])
    group_barrier(group, device)
    return rows


def _worker(rank: int, world_size: int, port: int, args: dict) -> None:
    with rank_group(rank, world_size, port, args["device"]) as (group, device):
        _run(rank, group, device, args)


def _run(rank, group, device, args) -> None:
    import pandas as pd
    import torch
    import torch.distributed as dist

    from ..data.metadata import collect_metadata
    from ..data.schema import data_path
    from ..data.store import write_table

    options = {**DEFAULTS[args["device"]], **{k: v for k, v in args["options"].items() if v is not None}}
    machines: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(machines, collect_metadata(options, None, device_index=rank)
                           if device.type == "cuda" else {"device": "cpu"}, group=group)
    rows = measure(rank, group, device, options)
    if rank != 0:
        return
    frame = pd.DataFrame(rows, columns=COLUMNS)
    gpu = frame["gpu_name"].iloc[0]
    on_gpu = device.type == "cuda"
    meta = {**machines[0], "study": STUDY, "parameters": options, "ranks": machines,
            "peer_access": torch.cuda.can_device_access_peer(0, 1) if on_gpu else None,
            "topology": gpu_topology() if on_gpu else None, "environment": NO_MULTICAST_ENV,
            "method": "two processes, one a GPU, buffers of kernels.peer_memory; CUDA events, median of reps "
                      "launches each after a barrier; both_ways: the slower rank's time a launch"}
    path = write_table(frame, data_path(args["out"], gpu, STUDY), meta, overwrite=True)  # the earlier one kept aside
    print(f"wrote {path} ({len(frame)} rows, {int((frame['status'] != 'ok').sum())} failed their check)", flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="data")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: a smoke run (gloo, the Triton interpreter, shared files; meaningless times)")
    for name in ("copy_words", "rows", "slots", "chunks", "width", "rounds", "reps", "poll_limit"):
        parser.add_argument("--" + name.replace("_", "-"), type=int, default=None,
                            help=f"default {DEFAULTS['cuda'][name]} on GPUs")
    options = parser.parse_args(argv)
    os.environ.update(NO_MULTICAST_ENV)
    import torch
    import torch.multiprocessing as mp

    if options.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    elif torch.cuda.device_count() < 2:
        print(f"needs two GPUs, found {torch.cuda.device_count()}", file=sys.stderr)
        return 2
    picked = {name: getattr(options, name) for name in DEFAULTS["cuda"]}
    args = {"out": str(Path(options.out)), "device": options.device, "options": picked}
    mp.spawn(_worker, args=(2, free_port(), args), nprocs=2, join=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
