"""Exploration (GPU machine): how much of the autograd form's host time is the autograd engine's hand-over to its
device thread, and what ``torch.autograd.set_multithreading_enabled(False)`` (PyTorch's switch that runs a backward's
CUDA nodes on the calling thread) does to it, host-side and GPU-side.

    python scripts/explore_autograd_threads.py [--rounds 3] [--out FILE.json] [--grid TOKENS VOCAB [VOCAB ...]]

(``--grid``: the GPU-side table over the four losses at these vocabularies instead of the six default shapes.)

Host µs per step on 8 x 32000 bf16 (median of 5 batches, interleaved rounds, the best round kept: the host drifts),
each step with the engine's default (a CUDA backward runs on the engine's device thread: the caller wakes it and waits
to be woken) and inside the switch (entered once around the batch, as a training loop would). Then do_bench (median,
L2 flushed) of the plain call and of the autograd step both ways, at shapes where the recorded autograd form is
host-bound, each checked against float64 first.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch
import torch.nn.functional as F
import triton

import kernels
from explore_autograd_host import host_us
from perfutils.studies.host_overhead import hand_back_function

SHAPES = ((1024, 32000, "cross_entropy", "labels"), (1024, 50304, "cross_entropy", "labels"),
          (1024, 32000, "forward_kl", "logits"), (1024, 131072, "forward_kl", "logits"),
          (4096, 32000, "cross_entropy", "labels"), (4096, 32001, "forward_kl", "logits"))


def host_steps(x, labels, teacher):
    hand_back = hand_back_function()

    def step(make):
        def run():
            x.grad = None
            make().backward()
        return run

    return {
        "plain call (labels CE)": lambda: kernels.entropy_loss_forward_backward(x, labels),
        "entropy_loss(...).backward() labels CE": step(lambda: kernels.entropy_loss(x, labels)),
        "entropy_loss(...).backward() forward KL": step(
            lambda: kernels.entropy_loss(x, teacher, loss="forward_kl", target_format="logits")),
        "floor: HandBack apply + backward": step(lambda: hand_back.apply(x)),
        "floor: F.cross_entropy backward": step(lambda: F.cross_entropy(x, labels)),
    }


def host_table(rounds: int) -> dict:
    x = torch.randn(8, 32000, device="cuda").bfloat16().requires_grad_(True)
    labels = torch.randint(0, 32000, (8,), device="cuda")
    teacher = torch.randn(8, 32000, device="cuda").bfloat16()
    best: dict = {}
    for round_ in range(rounds):
        for name, fn in host_steps(x, labels, teacher).items():
            for threads in ("default", "single-threaded"):
                if threads == "default":
                    value = host_us(fn)
                else:
                    with torch.autograd.set_multithreading_enabled(False):
                        value = host_us(fn)
                key = f"{name} [{threads}]"
                best[key] = min(best.get(key, value), value)
                print(f"round {round_} {key:70s} {value:8.1f} us", flush=True)
    return best


def gpu_table(shapes=SHAPES) -> list[dict]:
    rows = []
    for tokens, vocab, loss, fmt in shapes:
        x = (torch.randn(tokens, vocab, device="cuda") * 2).bfloat16()
        target = (torch.randint(0, vocab, (tokens,), device="cuda") if fmt == "labels"
                  else (torch.randn(tokens, vocab, device="cuda") * 2).bfloat16())
        options = dict(loss=loss, target_format=fmt)
        leaf = x.detach().requires_grad_(True)
        ref_loss, ref_grad = kernels.reference.entropy_loss_forward_backward(x, target, **options)

        def step():
            leaf.grad = None
            kernels.entropy_loss(leaf, target, **options).backward()

        row = {"tokens": tokens, "vocab": vocab, "loss": f"{loss}/{fmt}"}
        row["plain_ms"] = triton.testing.do_bench(lambda: kernels.entropy_loss_forward_backward(x, target, **options),
                                                  return_mode="median")
        for threads in ("default", "single"):
            with torch.autograd.set_multithreading_enabled(threads == "default"):
                step()
                err = float((leaf.grad.double() - ref_grad).norm() / ref_grad.norm())
                assert err < 1e-2, (row, threads, err)
                row[f"autograd_{threads}_ms"] = triton.testing.do_bench(step, return_mode="median")
            row[f"ratio_{threads}"] = row[f"autograd_{threads}_ms"] / row["plain_ms"]
            row[f"grad_rel_err_{threads}"] = err
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=None)
    parser.add_argument("--grid", type=int, nargs="+", default=None, metavar="N")
    args = parser.parse_args(argv)
    losses = (("cross_entropy", "labels"), ("cross_entropy", "logits"), ("forward_kl", "logits"),
              ("reverse_kl", "logits"))
    shapes = (SHAPES if not args.grid else
              [(args.grid[0], vocab, loss, fmt) for vocab in args.grid[1:] for loss, fmt in losses])
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__, flush=True)
    host = host_table(args.rounds)
    print(json.dumps(host, indent=1), flush=True)
    gpu = gpu_table(shapes)
    if args.out:
        with open(args.out, "w") as handle:
            json.dump({"host_us_best_round": host, "gpu": gpu, "gpu_name": torch.cuda.get_device_name(),
                       "torch": torch.__version__, "triton": triton.__version__}, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
