"""Vocab-parallel losses measured on the GPUs of one host: tp=2 against tp=1, recorded as ``tensor_parallel``.

    python -m perfutils tensor-parallel --out data [--tokens 4096 16384] [--vocab 131072 151936 256000]
        [--fast-llm PATH] [--budget-s 360]
    python -m perfutils tensor-parallel --out data --gpu NAME --forget tp2-symmetric   # to measure it again

Spawns one process per GPU (NCCL over a localhost TCP store; NVLink multicast off: ``NCCL_NVLS_ENABLE=0``,
``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``, ``NVSHMEM_DISABLE_NVLS=1`` are set here, for every child). For every
(tokens, vocab) of the grid, each rank builds the same bf16 inputs on its GPU from one seed (logits N(0, 2^2),
target logits likewise, uniform labels), keeps a contiguous copy of its half of the vocabulary, and measures, per
loss:

* ``tp1-auto``: the project's public call on one GPU holding the whole vocabulary (``variant="auto"``, its
  first-call search included in the warm-up). The two ranks split the four losses and measure at the same time,
  each on its own GPU (same model; the row names the GPU index).
* ``tp2-all_gather`` and ``tp2-symmetric``: ``kernels.entropy_loss_forward_backward(..., group=)`` on both GPUs.
* ``tp2-fast_llm``: Fast-LLM's tensor-parallel path (``triton_entropy_loss_forward_backward(..., group=)``,
  ``fast_llm/functional/triton/entropy_loss.py``) when ``--fast-llm`` names a checkout (or ``FAST_LLM_PATH`` does).

Timing. tp=1: ``perfutils.measure.timing.bench`` (``triton.testing.do_bench``: median of CUDA-event timings after
warm-up, L2 flushed before each call). tp=2: both ranks run the same loop (``bench_together``): a warm-up, then
per call an L2 flush, a start event, the call, an end event; the call counts are agreed between the ranks so their
calls pair up, and a call on one rank includes any wait for the other (the exchange, the collective), so the
step time is the slower rank's: ``ms_median`` is the max over ranks of each rank's median (``ms_p20``/``ms_p80``
likewise; the per-rank medians are in ``ms_median_rank<r>``). ``ms_batch`` times a batch of back-to-back calls
after a barrier (no flush), per rank, and keeps the max over ranks.

Correctness, every configuration: the loss against float64 on every row (``kernels.reference.row_losses``, in
chunks of rows), the gradient on 16 sampled rows (float64 autograd of their row losses; each rank checks its own
slice), both ranks' losses equal; ``max_rel_err`` is the largest and ``status`` is ``wrong`` above 1e-2 (bf16).

Bytes per rank (``kernels.vocab_parallel.bytes_per_rank``): ``bytes_min`` (one read of every input element, one
write of the gradient), ``bytes_dram_model``, ``bytes_sent`` / ``bytes_received`` / ``bytes_polled`` (the
exchange), ``collectives``. Resumable: configurations already in the CSV are skipped; past ``--budget-s`` no new
shape is started and the run says so (run it again to finish).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import socket
import sys
import time
from datetime import timedelta
from pathlib import Path

from ..peers.fast_llm import checkout_commit

NO_MULTICAST_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
STUDY = "tensor_parallel"
LOSSES = (("cross_entropy", "labels"), ("cross_entropy", "logits"), ("forward_kl", "logits"),
          ("reverse_kl", "logits"))
TOKENS = (4096, 16384)
VOCABS = (131072, 151936, 256000)
DESIGNS = ("all_gather", "symmetric")
SAMPLED_ROWS = 16
TOLERANCE = 1e-2  # bf16 gradient
REFERENCE_CHUNK_ELEMENTS = 1 << 27  # rows per float64 reference chunk: this many elements
SEED = 1234


# ------------------------------------------------------------------------------------------------------------
# Fast-LLM's tensor-parallel path (the peer)
# ------------------------------------------------------------------------------------------------------------


def load_fast_llm(path: str | None):
    """Fast-LLM's TP entry, ``triton_entropy_loss_forward_backward``, and its enums, from a checkout; or the reason
    it cannot be used (None, reason)."""
    if not path:
        return None, "no checkout given (--fast-llm or FAST_LLM_PATH)"
    if sys.version_info < (3, 12):
        return None, f"Fast-LLM needs Python >= 3.12, this is {sys.version.split()[0]}"
    if not (Path(path) / "fast_llm" / "functional" / "triton" / "entropy_loss.py").is_file():
        return None, f"{path} holds no fast_llm/functional/triton/entropy_loss.py"
    sys.path.insert(0, str(Path(path).resolve()))
    try:
        from fast_llm.functional.config import EntropyLossType, TargetFormat
        from fast_llm.functional.triton.entropy_loss import triton_entropy_loss_forward_backward
    except Exception as error:  # its TP entry needs more than torch.distributed and triton here
        return None, f"import failed: {type(error).__name__}: {error}"
    return (triton_entropy_loss_forward_backward, EntropyLossType, TargetFormat), ""


def fast_llm_bytes(target_format: str, n_rows: int, vocab: int, world_size: int, element_size: int = 2) -> dict:
    """Fast-LLM's TP path per rank (fast_llm/functional/triton/entropy_loss.py at 7d61a1ba): a forward kernel reads
    the slice (logits, and target logits), all-reduces per-row max, sum (and the target's, and the partial losses),
    then the forward-backward kernel reads the slice again and writes the gradient."""
    inputs = 1 if target_format == "labels" else 2
    elements = n_rows * vocab // world_size
    reduces = 3 if target_format == "labels" else 5  # max, sum (x2 with a target distribution), the losses
    share = n_rows * 4 * reduces
    return {"min": elements * element_size * (inputs + 1), "dram": elements * element_size * (2 * inputs + 1),
            "sent": 2 * (world_size - 1) * share // world_size, "received": 2 * (world_size - 1) * share // world_size,
            "polled": 0, "collectives": reduces}


def bytes_model(tokens: list[int], vocabs: list[int], world_size: int = 2, element_size: int = 2):
    """The byte model per rank for every loss, shape and variant of the study (no measurement needed): the minimum,
    the DRAM bytes, the exchange and the collectives, with the DRAM and minimum bytes per element of the rank's
    share of the vocabulary."""
    import pandas as pd

    from kernels.vocab_parallel import bytes_per_rank

    rows = []
    for loss, fmt in LOSSES:
        for n_rows in tokens:
            for vocab in vocabs:
                common = dict(loss=loss, target_format=fmt, n_rows=n_rows, vocab=vocab, element_size=element_size)
                designs = {"tp1-auto": bytes_per_rank("tp1", world_size=1, **common)}
                for design in ("all_gather", "symmetric"):
                    designs[f"tp2-{design}"] = bytes_per_rank(design, world_size=world_size, **common)
                designs["tp2-fast_llm"] = fast_llm_bytes(fmt, n_rows, vocab, world_size, element_size)
                for variant, counts in designs.items():
                    elements = n_rows * vocab // (1 if variant == "tp1-auto" else world_size)
                    rows.append(dict(loss=loss, target_format=fmt, tokens=n_rows, vocab=vocab, variant=variant,
                                     bytes_min=counts["min"], bytes_dram_model=counts["dram"],
                                     bytes_sent=counts["sent"], bytes_received=counts["received"],
                                     bytes_polled=counts["polled"], collectives=counts["collectives"],
                                     dram_bytes_per_element=counts["dram"] / elements,
                                     min_bytes_per_element=counts["min"] / elements))
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------------------------------------
# Inputs and references
# ------------------------------------------------------------------------------------------------------------


def make_inputs(tokens: int, vocab: int, device) -> dict:
    """The same bf16 logits, target logits and labels on every rank (one seed, filled row block by row block)."""
    import torch

    gen = torch.Generator(device=device).manual_seed(SEED + tokens * 7 + vocab)
    step = max(1, REFERENCE_CHUNK_ELEMENTS // vocab)
    tensors = {}
    for name in ("logits", "target"):
        out = torch.empty((tokens, vocab), dtype=torch.bfloat16, device=device)
        for start in range(0, tokens, step):
            rows = min(step, tokens - start)
            out[start:start + rows] = torch.randn((rows, vocab), generator=gen, device=device) * 2.0
        tensors[name] = out
    tensors["labels"] = torch.randint(0, vocab, (tokens,), generator=gen, device=device)
    return tensors


def reference(inputs: dict, loss: str, target_format: str, rows) -> dict:
    """Float64: the mean loss over every row (chunked) and the gradient rows ``rows`` of d loss / d logits."""
    import torch

    from kernels.reference import row_losses

    logits = inputs["logits"]
    target = inputs["labels"] if target_format == "labels" else inputs["target"]
    n_rows, vocab = logits.shape
    step = max(1, REFERENCE_CHUNK_ELEMENTS // (4 * vocab))
    total = torch.zeros((), dtype=torch.float64, device=logits.device)
    for start in range(0, n_rows, step):
        stop = min(n_rows, start + step)
        total += row_losses(logits[start:stop], target[start:stop], loss=loss, target_format=target_format).sum()
    sampled = logits[rows].double().requires_grad_(True)
    per_row = row_losses(sampled, target[rows], loss=loss, target_format=target_format)
    (grad,) = torch.autograd.grad(per_row.sum() / n_rows, sampled)
    return {"loss": float(total) / n_rows, "grad_rows": grad}


def check(result_loss, result_grad, ref: dict, rows, columns: slice) -> dict:
    """Relative errors of a call's loss and sampled gradient rows (this rank's columns) against the reference."""
    from ..measure.timing import rel_err

    loss_err = abs(float(result_loss) - ref["loss"]) / max(abs(ref["loss"]), 1e-30)
    grad_err = math.inf
    if result_grad is not None:
        grad_err = rel_err(result_grad[rows].double(), ref["grad_rows"][:, columns])
    return {"loss_rel_err": loss_err, "grad_rel_err": grad_err}


# ------------------------------------------------------------------------------------------------------------
# Timing across ranks
# ------------------------------------------------------------------------------------------------------------


class WallEvent:
    """torch.cuda.Event's timing interface on the host clock (the CPU smoke run, ``--device cpu``)."""

    def record(self) -> None:
        self.time = time.perf_counter()

    def elapsed_time(self, end: "WallEvent") -> float:
        return (end.time - self.time) * 1e3


def _event(device):
    import torch

    return torch.cuda.Event(enable_timing=True) if device.type == "cuda" else WallEvent()


def _synchronize(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bench_together(fn, group, device, *, warmup_ms: float = 25.0, rep_ms: float = 100.0, min_calls: int = 5) -> dict:
    """Every rank times the same calls of ``fn`` (see the module docstring); this rank's numbers."""
    import torch
    import torch.distributed as dist

    from kernels.peer_memory import group_barrier

    flush = torch.empty((256 << 20) if device.type == "cuda" else 1, dtype=torch.int8, device=device)
    group_barrier(group, device)
    start, end = _event(device), _event(device)
    start.record()
    for _ in range(min_calls):
        fn()
    end.record()
    _synchronize(device)
    estimate = torch.tensor([max(start.elapsed_time(end) / min_calls, 1e-3)], device=device)
    dist.all_reduce(estimate, op=dist.ReduceOp.MAX, group=group)  # the same call counts on every rank
    estimate_ms = float(estimate)
    n_warmup, n_repeat = max(1, int(warmup_ms / estimate_ms)), max(min_calls, int(rep_ms / estimate_ms))
    for _ in range(n_warmup):
        fn()
    starts = [_event(device) for _ in range(n_repeat)]
    ends = [_event(device) for _ in range(n_repeat)]
    for begin, finish in zip(starts, ends):
        flush.zero_()
        begin.record()
        fn()
        finish.record()
    _synchronize(device)
    times = torch.tensor([begin.elapsed_time(finish) for begin, finish in zip(starts, ends)], dtype=torch.float64)
    median, p20, p80 = (float(torch.quantile(times, q)) for q in (0.5, 0.2, 0.8))  # linear, as do_bench
    group_barrier(group, device)
    start.record()
    for _ in range(n_repeat):
        fn()
    end.record()
    _synchronize(device)
    return {"ms_median": median, "ms_p20": p20, "ms_p80": p80, "ms_batch": start.elapsed_time(end) / n_repeat,
            "calls": n_repeat}


# ------------------------------------------------------------------------------------------------------------
# The ranks
# ------------------------------------------------------------------------------------------------------------


def _row(loss: str, target_format: str, variant: str, tokens: int, vocab: int, **values) -> dict:
    return dict(loss=loss, target_format=target_format, variant=variant, dtype="bf16", tokens=tokens, vocab=vocab,
                block_size=None, num_warps=None, **values)


def _bytes_columns(counts: dict, ms: float | None, copy_gbps: float | None) -> dict:
    gbps = counts["min"] / (ms * 1e-3) / 1e9 if ms else None
    return {"bytes_min": counts["min"], "bytes_dram_model": counts["dram"], "bytes_sent": counts["sent"],
            "bytes_received": counts["received"], "bytes_polled": counts["polled"],
            "collectives": counts["collectives"],
            "gbps": gbps, "pct_of_copy": 100 * gbps / copy_gbps if gbps and copy_gbps else None}


def _status(errors: dict, extra_ok: bool = True) -> str:
    worst = max(errors.values())
    return "ok" if worst <= TOLERANCE and extra_ok else "wrong"


def bench_local(fn, device, quick: bool):
    """One GPU's timing of ``fn``: ``perfutils.measure.timing.bench`` (do_bench); on a CPU a few host-timed calls."""
    from ..measure.timing import BenchResult, bench

    if device.type == "cuda" and not quick:
        return bench(fn)
    import torch

    times = []
    for _ in range(3):
        begin = time.perf_counter()
        fn()
        _synchronize(device)
        times.append((time.perf_counter() - begin) * 1e3)
    values = torch.tensor(times, dtype=torch.float64)
    return BenchResult(*(float(torch.quantile(values, q)) for q in (0.5, 0.2, 0.8)))


def _measure_tp1(inputs, loss, target_format, ref, rows, copy_gbps, rank, quick) -> dict:
    import kernels
    from kernels import vocab_parallel

    from ..data.schema import error_text

    tokens, vocab = inputs["logits"].shape
    target = inputs["labels"] if target_format == "labels" else inputs["target"]
    base = _row(loss, target_format, "tp1-auto", tokens, vocab, tp=1, device_index=rank)
    counts = vocab_parallel.bytes_per_rank("tp1", loss=loss, target_format=target_format, n_rows=tokens,
                                                    vocab=vocab, world_size=1)
    try:
        def fn():
            return kernels.entropy_loss_forward_backward(inputs["logits"], target, loss=loss,
                                                         target_format=target_format)

        result = fn()  # the first call: compiles, and auto's first-call search
        errors = check(result[0], result[1], ref, rows, slice(None))
        del result
        timing = bench_local(fn, inputs["logits"].device, quick)
        return dict(base, **timing.as_dict(), **errors, max_rel_err=max(errors.values()),
                    status=_status(errors), **_bytes_columns(counts, timing.ms_median, copy_gbps))
    except Exception as error:  # a failed configuration is a row, not a crash
        return dict(base, status="error", error=error_text(error), **_bytes_columns(counts, None, copy_gbps))


def _measure_tp2(name, fn, config, counts, inputs_local, loss, target_format, ref, rows, columns, group, device,
                 copy_gbps, quick) -> dict:
    """One tp=2 configuration on this rank (every rank calls it): its numbers, errors and status."""
    import torch
    import torch.distributed as dist

    from ..data.schema import error_text

    tokens = inputs_local["tokens"]
    vocab = inputs_local["vocab"]
    base = _row(loss, target_format, f"tp2-{name}", tokens, vocab, tp=2, config=json.dumps(config, sort_keys=True,
                                                                                          default=str))
    outcome: dict = {}
    try:
        result = fn()
        outcome.update(check(result[0], result[1], ref, rows, columns))
        losses = [torch.zeros((), device=device) for _ in range(dist.get_world_size(group))]
        dist.all_gather(losses, result[0].detach().float().reshape(()), group=group)
        outcome["ranks_loss_equal"] = len({float(value) for value in losses}) == 1
        del result
        timing = dict(warmup_ms=1e-3, rep_ms=1e-3, min_calls=2) if quick else {}
        outcome.update(bench_together(fn, group, device, **timing))
    except Exception as error:
        outcome = {"error": error_text(error)}
    everyone: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, outcome, group=group)
    failed = [entry["error"] for entry in everyone if "error" in entry]
    if failed:
        return dict(base, status="error", error=failed[0], **_bytes_columns(counts, None, copy_gbps))
    row = dict(base, ranks_loss_equal=all(entry["ranks_loss_equal"] for entry in everyone))
    for key in ("ms_median", "ms_p20", "ms_p80", "ms_batch", "loss_rel_err", "grad_rel_err"):
        row[key] = max(entry[key] for entry in everyone)
    for rank, entry in enumerate(everyone):
        row[f"ms_median_rank{rank}"] = entry["ms_median"]
        row[f"grad_rel_err_rank{rank}"] = entry["grad_rel_err"]
    row["max_rel_err"] = max(row["loss_rel_err"], row["grad_rel_err"])
    row["status"] = _status({"loss": row["loss_rel_err"], "grad": row["grad_rel_err"]}, row["ranks_loss_equal"])
    row.update(_bytes_columns(counts, row["ms_median"], copy_gbps))
    return row


@contextlib.contextmanager
def rank_group(rank: int, world_size: int, port: int, device_kind: str):
    """This process as rank ``rank`` of a group on one host, yielding (group, device): NCCL on GPU ``rank`` (NVLink
    multicast off), or gloo on the CPU for the smoke runs (the Triton interpreter); the group is destroyed on exit."""
    os.environ.update(NO_MULTICAST_ENV)
    import torch
    import torch.distributed as dist

    from ..model.cuda_tools import pin_bundled_ptxas

    init = dict(init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                timeout=timedelta(minutes=10))
    if device_kind == "cuda":
        pin_bundled_ptxas()
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
        dist.init_process_group("nccl", device_id=device, **init)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", **init)
    try:
        yield dist.group.WORLD, device
    finally:
        dist.destroy_process_group()


def _worker(rank: int, world_size: int, port: int, args: dict) -> None:
    with rank_group(rank, world_size, port, args["device"]) as (group, device):
        _run(rank, world_size, group, device, args)


def _run(rank, world_size, group, device, args) -> None:
    import torch
    import torch.distributed as dist

    from ..data.metadata import collect_metadata
    from ..data.schema import data_path
    from ..data.store import ResultStore
    from ..measure.timing import copy_bandwidth_gbps

    began = time.monotonic()
    fast_llm, fast_llm_note = load_fast_llm(args["fast_llm"])
    on_gpu = device.type == "cuda"
    copy_gbps = copy_bandwidth_gbps() if on_gpu and not args["quick"] else None
    gpus: list = [None] * world_size
    dist.all_gather_object(gpus, collect_metadata({}, copy_gbps, device_index=rank), group=group)
    store = None
    done: list = [set()]
    if rank == 0:
        meta = collect_metadata(_parameters(args, world_size, fast_llm_note), copy_gbps, device_index=0)
        meta["ranks"] = [{key: gpu.get(key) for key in ("device_index", "gpu_name", "gpu_uuid", "sm_count",
                                                        "sm_clock_mhz", "mem_clock_mhz", "power_limit_w",
                                                        "copy_gbps", "driver_version")} for gpu in gpus]
        meta["environment"] = {key: os.environ.get(key) for key in NO_MULTICAST_ENV}
        if on_gpu:
            meta["nccl_version"] = ".".join(map(str, torch.cuda.nccl.version()))
            meta["peer_access"] = torch.cuda.can_device_access_peer(0, 1) if world_size > 1 else None
            meta["topology"] = gpu_topology()
        store = ResultStore(data_path(args["out"], torch.cuda.get_device_name(0) if on_gpu else None, STUDY), meta)
        store.check_compatible()
        done = [store.done_keys()]
    dist.broadcast_object_list(done, src=0, group=group)
    done_keys = done[0]
    from ..data.schema import config_key

    def pending(row: dict) -> bool:
        return config_key(row) not in done_keys

    variants = ["tp1-auto"] + [f"tp2-{design}" for design in DESIGNS] + (["tp2-fast_llm"] if fast_llm else [])
    if args.get("symmetric_configs"):  # an exploration: only the symmetric design, at the configurations named
        variants = [f"tp2-symmetric-{block}/{warps}" for block, warps in args["symmetric_configs"]]
    stopped = None
    for tokens in args["tokens"]:
        for vocab in args["vocab"]:
            todo = [(loss, fmt, variant) for loss, fmt in args["losses"] for variant in variants
                    if pending(_row(loss, fmt, variant, tokens, vocab))]
            if not todo:
                continue
            spent = torch.tensor([time.monotonic() - began], device=device)
            dist.all_reduce(spent, op=dist.ReduceOp.MAX, group=group)
            if float(spent) > args["budget_s"]:
                stopped = (tokens, vocab)
                break
            rows_out = _measure_shape(rank, world_size, group, device, tokens, vocab, todo, copy_gbps, fast_llm,
                                      args)
            if rank == 0:
                store.append(rows_out)
                for row in rows_out:
                    print(f"{row['variant']:>15} {row['loss']}/{row['target_format']} {tokens}x{vocab}: "
                          f"{_fmt(row.get('ms_median'))} ms, err {_fmt(row.get('max_rel_err'), '.1e')}, "
                          f"{row['status']} {row.get('error') or ''}"[:300], flush=True)
        if stopped:
            break
    if rank == 0:
        if stopped:
            print(f"budget of {args['budget_s']} s spent before {stopped[0]}x{stopped[1]}: run the same command again "
                  "to measure the rest (finished configurations are kept)", flush=True)
        else:
            print(f"done: every configuration of the grid is in {store.path}", flush=True)
        if store.exists():
            print(f"summary: python3 -c 'from perfutils.plots.tensor_parallel import print_summary; "
                  f"print_summary(\"{store.path}\")'", flush=True)


def _measure_shape(rank, world_size, group, device, tokens, vocab, todo, copy_gbps, fast_llm, args) -> list:
    """Every pending configuration of one (tokens, vocab); the rows (complete on rank 0)."""
    import torch
    import torch.distributed as dist

    import kernels
    from kernels import vocab_parallel

    inputs = make_inputs(tokens, vocab, device)
    width = vocab // world_size
    columns = slice(rank * width, (rank + 1) * width)
    rows = torch.linspace(0, tokens - 1, SAMPLED_ROWS, device=device).long()
    local = {"logits": inputs["logits"][:, columns].contiguous(), "target": inputs["target"][:, columns].contiguous(),
             "labels": inputs["labels"], "tokens": tokens, "vocab": vocab}
    out = []
    references = {(loss, fmt): reference(inputs, loss, fmt, rows) for loss, fmt in LOSSES
                  if any(entry[:2] == (loss, fmt) for entry in todo)}
    # tp=1: the ranks share out the losses and measure at once, each on its GPU
    mine = [(loss, fmt) for index, (loss, fmt) in enumerate(LOSSES) if index % world_size == rank
            and (loss, fmt, "tp1-auto") in todo]
    tp1_rows = [_measure_tp1(inputs, loss, fmt, references[(loss, fmt)], rows, copy_gbps, rank, args["quick"])
                for loss, fmt in mine]
    torch.cuda.empty_cache()
    everyone: list = [None] * world_size
    dist.all_gather_object(everyone, tp1_rows, group=group)
    out += [row for rows_of_rank in everyone for row in rows_of_rank]
    designs = [(design, design, {}) for design in DESIGNS] + [
        (f"symmetric-{block}/{warps}", "symmetric", {"block_size": block, "num_warps": warps})
        for block, warps in args.get("symmetric_configs") or ()]
    for loss, fmt in LOSSES:
        target = local["labels"] if fmt == "labels" else local["target"]
        for name, design, kernel_config in designs:
            if (loss, fmt, f"tp2-{name}") not in todo:
                continue
            plan = kernels.prepare(local["logits"], target, loss=loss, target_format=fmt, group=group,
                                   tp_design=design, **kernel_config)
            config = dict(plan.config)
            del plan
            counts = vocab_parallel.bytes_per_rank(design, loss=loss, target_format=fmt, n_rows=tokens, vocab=vocab,
                                                   world_size=world_size, num_chunks=config.get("num_chunks"))

            def fn(target=target, loss=loss, fmt=fmt, design=design, kernel_config=kernel_config):
                return kernels.entropy_loss_forward_backward(local["logits"], target, loss=loss, target_format=fmt,
                                                             group=group, tp_design=design, **kernel_config)

            out.append(_measure_tp2(name, fn, config, counts, local, loss, fmt, references[(loss, fmt)], rows,
                                    columns, group, device, copy_gbps, args["quick"]))
        if fast_llm and (loss, fmt, "tp2-fast_llm") in todo:
            entry, loss_types, formats = fast_llm

            def fn(target=target, loss=loss, fmt=fmt):
                value, _z, grad = entry(local["logits"], target, None, grad_output=1.0, group=group,
                                        target_format=formats(fmt), entropy_loss_type=loss_types(loss))
                return value, grad

            counts = fast_llm_bytes(fmt, tokens, vocab, world_size)
            out.append(_measure_tp2("fast_llm", fn, {"commit": args["fast_llm_commit"]}, counts, local, loss, fmt,
                                    references[(loss, fmt)], rows, columns, group, device, copy_gbps, args["quick"]))
        torch.cuda.empty_cache()
    del inputs, local
    torch.cuda.empty_cache()
    return out


# ------------------------------------------------------------------------------------------------------------
# The launcher
# ------------------------------------------------------------------------------------------------------------


def _fmt(value, spec: str = ".3f") -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def gpu_topology() -> str | None:
    import subprocess

    try:
        return subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=20).stdout
    except Exception:  # noqa: BLE001 - metadata only
        return None


def _parameters(args: dict, world_size: int, fast_llm_note: str) -> dict:
    return {"study": STUDY, "tokens": list(args["tokens"]), "vocab": list(args["vocab"]), "dtype": "bf16",
            "losses": [f"{loss}/{fmt}" for loss, fmt in LOSSES], "designs": list(DESIGNS), "world_size": world_size,
            "seed": SEED, "sampled_rows": SAMPLED_ROWS, "tolerance": TOLERANCE, "fast_llm": args["fast_llm"],
            "fast_llm_note": fast_llm_note or "measured", "fast_llm_commit": args.get("fast_llm_commit"),
            "timing": "tp1: do_bench median (L2 flushed); tp2: max over ranks of each rank's median of paired calls "
                      "(L2 flushed), ms_batch: max over ranks of a back-to-back batch",
            "tp1_devices": "the ranks split the losses and measure tp=1 at once, each on its own GPU",
            **({"symmetric_configs": [f"{block}/{warps}" for block, warps in args["symmetric_configs"]]}
               if args.get("symmetric_configs") else {})}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="data")
    parser.add_argument("--tokens", type=int, nargs="+", default=list(TOKENS))
    parser.add_argument("--vocab", type=int, nargs="+", default=list(VOCABS))
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--fast-llm", default=os.environ.get("FAST_LLM_PATH"),
                        help="a Fast-LLM checkout (its tensor-parallel path is measured as the peer)")
    parser.add_argument("--budget-s", type=float, default=360.0,
                        help="start no new shape after this many seconds (rerun to continue)")
    parser.add_argument("--losses", nargs="+", default=[f"{loss}/{fmt}" for loss, fmt in LOSSES],
                        choices=[f"{loss}/{fmt}" for loss, fmt in LOSSES])
    parser.add_argument("--symmetric-configs", nargs="+", default=[], metavar="BLOCK/WARPS",
                        help="an exploration: time only the symmetric design, at these chunk sizes and warps (write "
                             "to an --out other than the recorded study's)")
    parser.add_argument("--forget", nargs="+", default=[], metavar="VARIANT",
                        help="take these variants' rows out of the recorded study (the whole file kept as "
                             "<stem>.replaced-<UTC>.*) so the next run measures them again, then exit; needs --gpu")
    parser.add_argument("--gpu", help="with --forget: the GPU whose study it is (its name, e.g. 'NVIDIA H100 80GB HBM3')")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: a smoke run of the harness (gloo, the Triton interpreter, host timers; tiny shapes, "
                             "meaningless times)")
    options = parser.parse_args(argv)
    if options.symmetric_configs and Path(options.out).resolve() == Path("data").resolve():
        parser.error("--symmetric-configs is an exploration: give it an --out other than the recorded data folder")
    if options.forget:
        if not options.gpu:
            parser.error("--forget needs --gpu (whose recorded study)")
        from ..data.schema import data_path
        from ..data.store import forget_rows

        forget_rows(data_path(options.out, options.gpu, STUDY), options.forget, options.tokens, vocabs=options.vocab,
                    losses=options.losses)
        return 0
    os.environ.update(NO_MULTICAST_ENV)  # inherited by the ranks too
    import torch
    import torch.multiprocessing as mp

    if options.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    elif torch.cuda.device_count() < options.world_size:
        print(f"needs {options.world_size} GPUs, found {torch.cuda.device_count()}", file=sys.stderr)
        return 2
    bad = [vocab for vocab in options.vocab if vocab % options.world_size]
    if bad:
        parser.error(f"every vocab must be divisible by the world size {options.world_size}: {bad}")
    args = {"out": options.out, "tokens": options.tokens, "vocab": options.vocab, "fast_llm": options.fast_llm,
            "budget_s": options.budget_s, "fast_llm_commit": checkout_commit(options.fast_llm) if options.fast_llm else None, "device": options.device,
            "quick": options.device == "cpu", "losses": [tuple(name.split("/")) for name in options.losses],
            "symmetric_configs": [tuple(int(part) for part in config.split("/")) for config in options.symmetric_configs]}
    mp.spawn(_worker, args=(options.world_size, free_port(), args), nprocs=options.world_size, join=True)
    return 0

