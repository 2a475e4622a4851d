"""Exploration (issue 39, kernel-only against the public call, not a recorded study): a row's programs in one
thread-block cluster, its summaries exchanged through distributed shared memory (perfutils.lab_kernels.cluster_row),
beside the product's public call and a plain stream of the same bytes, in one process, at 4096 tokens.

  python scripts/explore_cluster.py smoke               # one configuration a loss at 32000 columns, checked and timed
  python scripts/explore_cluster.py compile PART PARTS  # compile a share of the configurations (16-row inputs)
  python scripts/explore_cluster.py time [VOCAB ...]    # check and time every configuration: one JSON line each
  python scripts/explore_cluster.py ablate              # run AJ: the lagged cluster step taken apart
  python scripts/explore_cluster.py kernel-only         # run AL: run AI's best kernel-only and as a call, beside the
                                                        # product's prepared plan and public call

Each configuration (block, warps, register cap, schedule: plain, prefetch or lagged) is checked against float64 (the
loss over all rows, the gradient on 16 sampled rows) before it is timed (do_bench median, L2 flushed). Both sides are
calls with their allocations: ``cluster_row_loss`` (kernel, gradient and row-loss buffers, a torch sum) and the
product's public ``kernels.entropy_loss_forward_backward``. % of copy: the bytes a loss must move
(``explore_lagged.cell_bytes``) over the copy bandwidth of the GPU's recorded ceilings.
"""
import itertools
import json
import sys

import torch
import triton

import kernels
from explore_lagged import (TOKENS, cell_bytes, checked_ms, inputs, references, session_copy_gbps,
                            stream_kernel)
from perfutils.lab_kernels.cluster_row import cluster_row_loss, last_launch, prepare_cluster_row

LOSSES = [("cross_entropy", "labels"), ("forward_kl", "logits"), ("reverse_kl", "logits"), ("cross_entropy", "logits")]
VOCABS = [32000, 50304, 65536, 131072]
# Blocks whose chunks make a cluster (2-8 CTAs, or 16) at each vocabulary, and the warps tried with each block.
BLOCKS = {32000: (4096, 8192), 50304: (8192, 16384), 65536: (8192, 16384), 131072: (8192, 16384, 32768)}
WARPS = {4096: (4, 8), 8192: (4, 8), 16384: (8, 16), 32768: (16, 32)}
CAPS = {"labels": (None, 96, 80), "logits": (None, 128, 96)}  # register caps (maxnreg)


def configs(vocab, fmt, schedules=("prefetch", "lagged")):
    return [(block, warps, cap, schedule) for block in BLOCKS[vocab] for warps in WARPS[block] for cap in CAPS[fmt]
            for schedule in schedules]


def label(block, warps, cap, schedule):
    return f"{block}/{warps}" + (f"/ma{cap}" if cap else "") + {"plain": "", "prefetch": "/pf", "lagged": "/lag"}[
        schedule]


def call(x, t, loss, fmt, block, warps, cap, schedule, ablate=0):
    return lambda: cluster_row_loss(x, t, loss=loss, target_format=fmt, block=block, num_warps=warps, maxnreg=cap,
                                    prefetch=schedule == "prefetch", lagged=schedule == "lagged", ablate=ablate)


# Run AJ: the lagged cluster step taken apart (ABLATE 1: no barrier in the loop, 2: no read of the peers' summaries,
# 3: neither), at run AI's best configurations, two passes, beside the public call.
ABLATE_CELLS = [("cross_entropy", "labels", 32000, [(8192, 4, 96), (4096, 4, 80)]),
                ("forward_kl", "logits", 32000, [(4096, 4, 128)]),
                ("cross_entropy", "labels", 131072, [(8192, 4, 96)]),
                ("forward_kl", "logits", 131072, [(8192, 4, None)])]
# ABLATE 1 (reads without the loop's barriers) ended in "unspecified launch failure" on the H200 (not understood), so
# the run takes the other parts.
ABLATIONS = (0, 2, 3)


def time_ablations():
    copy = session_copy_gbps()
    for loss, fmt, vocab, plans in ABLATE_CELLS:
        x, t = inputs(fmt, vocab, TOKENS)
        nbytes = cell_bytes(fmt, vocab, TOKENS)
        check = references(x, t, loss, fmt)
        for run in (1, 2):
            calls = [("public", {}, lambda: kernels.entropy_loss_forward_backward(x, t, loss=loss, target_format=fmt))]
            calls += [(label(block, warps, cap, "lagged"), {"ablate": ablate},
                       call(x, t, loss, fmt, block, warps, cap, "lagged", ablate))
                      for block, warps, cap in plans for ablate in ABLATIONS]
            for name, extra, fn in calls:  # a timing-only variant's error is recorded, not refused
                ms, err = checked_ms(fn, check, strict=not extra.get("ablate"))
                print(json.dumps({"loss": loss, "fmt": fmt, "vocab": vocab, "tokens": TOKENS, "pass": run, "cfg": name,
                                  **extra, **(last_launch if extra else {}), "ms": round(ms, 4), "err": round(err, 5),
                                  "pct": round(nbytes / ms / 1e6 / copy * 100, 1)}), flush=True)
        del x, t, check
        torch.cuda.empty_cache()


def compile_share(part, parts):
    shares = itertools.count()
    for (loss, fmt), vocab in itertools.product(LOSSES, VOCABS):
        x, t = inputs(fmt, vocab, rows=16)  # the same specialization as 4096 rows (both multiples of 16)
        for config in configs(vocab, fmt):
            if next(shares) % parts == part:
                try:
                    call(x, t, loss, fmt, *config)()
                except Exception as error:  # recorded by the timing run
                    print(json.dumps({"loss": loss, "vocab": vocab, "cfg": label(*config), "compile_error":
                                      str(error)[:300]}), flush=True)
    torch.cuda.synchronize()


def time_cells(vocabs, chosen=None):
    copy = session_copy_gbps()
    for vocab in vocabs:
        for loss, fmt in LOSSES:
            x, t = inputs(fmt, vocab, TOKENS)
            nbytes = cell_bytes(fmt, vocab, TOKENS)
            base = {"loss": loss, "fmt": fmt, "vocab": vocab, "tokens": TOKENS}

            def emit(record, ms, err=None):
                checked = {} if err is None else {"err": round(err, 5)}
                print(json.dumps({**base, **record, "ms": round(ms, 4), **checked,
                                  "pct": round(nbytes / ms / 1e6 / copy * 100, 1)}), flush=True)

            out = torch.empty_like(x)
            ms = triton.testing.do_bench(lambda: stream_kernel[(triton.cdiv(x.numel(), 4096),)](
                x, t, out, x.numel(), TWO=fmt != "labels", BLOCK=4096, num_warps=4), return_mode="median")
            emit({"cfg": "stream4096/4"}, ms)
            del out
            check = references(x, t, loss, fmt)
            ms, err = checked_ms(lambda: kernels.entropy_loss_forward_backward(x, t, loss=loss, target_format=fmt),
                                 check)
            emit({"cfg": "public"}, ms, err)
            for config in (chosen or configs(vocab, fmt)):
                try:
                    ms, err = checked_ms(call(x, t, loss, fmt, *config), check)
                    emit({"cfg": label(*config), **last_launch}, ms, err)
                except Exception as error:  # a wrong result or a failed compile is recorded, and the run goes on
                    print(json.dumps({**base, "cfg": label(*config), "error": str(error)[:300]}), flush=True)
            del x, t, check
            torch.cuda.empty_cache()


# Run AL: run AI's best configuration of a cell (cfg labels as in AI's log) kernel-only, a prepared launch beside the
# product's prepared plan, and both as calls (the cluster's with its buffers and a torch sum, the product's public call)
KERNEL_CELLS = [("cross_entropy", "labels", 32000, (8192, 4, 96, "lagged")),
                ("forward_kl", "logits", 32000, (4096, 4, 128, "lagged")),
                ("reverse_kl", "logits", 32000, (4096, 4, 128, "lagged")),
                ("cross_entropy", "logits", 32000, (4096, 4, None, "prefetch")),
                ("cross_entropy", "labels", 131072, (8192, 4, 96, "lagged")),
                ("forward_kl", "logits", 131072, (8192, 4, None, "prefetch"))]


def time_kernel_only():
    copy = session_copy_gbps()
    for loss, fmt, vocab, (block, warps, cap, schedule) in KERNEL_CELLS:
        x, t = inputs(fmt, vocab, TOKENS)
        nbytes = cell_bytes(fmt, vocab, TOKENS)
        check = references(x, t, loss, fmt)
        options = dict(loss=loss, target_format=fmt, block=block, num_warps=warps, maxnreg=cap,
                       prefetch=schedule == "prefetch", lagged=schedule == "lagged")
        checked_ms(lambda: cluster_row_loss(x, t, **options), check)  # the launch below is this call's kernel
        launch = prepare_cluster_row(x, t, **options)
        plan = kernels.prepare(x, t, loss=loss, target_format=fmt)
        sides = [("public", lambda: kernels.entropy_loss_forward_backward(x, t, loss=loss, target_format=fmt)),
                 ("plan", plan.run), (label(block, warps, cap, schedule), call(x, t, loss, fmt, block, warps, cap,
                                                                                 schedule))]
        for run in (1, 2):
            for name, fn in sides:
                ms, err = checked_ms(fn, check)
                print(json.dumps({"loss": loss, "fmt": fmt, "vocab": vocab, "tokens": TOKENS, "pass": run, "cfg": name,
                                  "kernel_only": name == "plan", "ms": round(ms, 4), "err": round(err, 5),
                                  "pct": round(nbytes / ms / 1e6 / copy * 100, 1)}), flush=True)
            ms = triton.testing.do_bench(launch, return_mode="median")
            print(json.dumps({"loss": loss, "fmt": fmt, "vocab": vocab, "tokens": TOKENS, "pass": run,
                              "cfg": label(block, warps, cap, schedule) + "/launch", "kernel_only": True,
                              **last_launch, "ms": round(ms, 4), "pct": round(nbytes / ms / 1e6 / copy * 100, 1)}),
                  flush=True)
        del x, t, check, launch, plan
        torch.cuda.empty_cache()


if __name__ == "__main__":
    if sys.argv[1] == "smoke":
        time_cells([32000], chosen=[(4096, 4, None, "plain"), (4096, 4, None, "prefetch"), (4096, 4, None, "lagged")])
    elif sys.argv[1] == "compile":
        compile_share(int(sys.argv[2]), int(sys.argv[3]))
    elif sys.argv[1] == "kernel-only":
        time_kernel_only()
    elif sys.argv[1] == "ablate":
        time_ablations()
    elif sys.argv[1] == "time":
        time_cells([int(v) for v in sys.argv[2:]] or VOCABS)
    else:
        raise SystemExit(__doc__)
