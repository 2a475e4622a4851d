"""Exploration (GPU machine): host µs of an autograd step of kernels.entropy_loss, built several ways, in one
process, beside PyTorch's floors; and the GPU-side ratio of the autograd form to the plain call at a few shapes.

    python scripts/explore_autograd_host.py [--out DIR]

Variants of the autograd Function (all call the same operator implementation; only the autograd wrapping differs):
  shipped      kernels.entropy_loss as it is
  no_save      the gradient on ctx, nothing saved (no second use of the graph)
  no_scale     no_save, and the backward returns the gradient unscaled (wrong unless grad_output is 1: a bound)
  save_*       no_save plus save_for_backward of the inputs or the target; ctx.inputs: kept on the context
Floors: a Function that hands back an allocated tensor; F.cross_entropy(...).backward(); x.float().sum().backward().
Each row: median µs per step over 5 batches (perfutils.measure.host_cost.time_host_calls), 8 x 32000 bf16.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch
import torch.nn.functional as F
import triton

import kernels
from kernels import ops
from perfutils.measure.host_cost import time_host_calls
from perfutils.studies.host_overhead import hand_back_function


def host_us(fn, calls=1000):
    return statistics.median(time_host_calls(fn, torch.cuda.synchronize, calls=calls, repeats=5, warmup=200,
                                             warmup_s=0.3))


class NoSave(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, loss_mask, loss, target_format, ignore_index, variant, block_size, num_warps,
                options, validate):
        result, grad = ops.call_forward_backward(logits, target, loss_mask, None, 1.0, True, loss, target_format,
                                                 ignore_index, variant, block_size, num_warps, options, validate)
        ctx.grad = grad
        return result

    @staticmethod
    def backward(ctx, grad_loss):
        grad, ctx.grad = ctx.grad, None
        ops.call_scale_gradient_(grad, grad_loss)
        return (grad,) + (None,) * 10


class NoScale(NoSave):
    @staticmethod
    def backward(ctx, grad_loss):
        grad, ctx.grad = ctx.grad, None
        return (grad,) + (None,) * 10


class SaveInputs(NoSave):
    @staticmethod
    def forward(ctx, logits, target, loss_mask, *options):
        result = NoSave.forward(ctx, logits, target, loss_mask, *options)
        ctx.save_for_backward(logits, target, loss_mask)
        return result


class SaveTarget(NoSave):
    @staticmethod
    def forward(ctx, logits, target, loss_mask, *options):
        result = NoSave.forward(ctx, logits, target, loss_mask, *options)
        ctx.save_for_backward(target)
        return result


class KeepInputs(NoSave):
    @staticmethod
    def forward(ctx, logits, target, loss_mask, *options):
        result = NoSave.forward(ctx, logits, target, loss_mask, *options)
        ctx.inputs = (logits, target, loss_mask)
        ctx.versions = (logits._version, target._version)
        return result

    @staticmethod
    def backward(ctx, grad_loss):
        keep = torch._C._autograd._get_current_graph_task_keep_graph()
        if not keep:
            ctx.inputs = None
        grad, ctx.grad = ctx.grad, None
        ops.call_scale_gradient_(grad, grad_loss)
        return (grad,) + (None,) * 10


def steps(x, labels):
    args = (None, "cross_entropy", "labels", -100, "auto", None, None, "", False)

    def make(apply):
        def step():
            x.grad = None
            apply().backward()
        return step

    HandBack = hand_back_function()

    return {
        "shipped": make(lambda: kernels.entropy_loss(x, labels)),
        "no_save": make(lambda: NoSave.apply(x, labels, *args)),
        "no_scale": make(lambda: NoScale.apply(x, labels, *args)),
        "shipped Function, no wrapper": make(lambda: kernels.api._EntropyLoss.apply(x, labels, *args)),
        "save_for_backward(logits, target, None)": make(lambda: SaveInputs.apply(x, labels, *args)),
        "save_for_backward(target)": make(lambda: SaveTarget.apply(x, labels, *args)),
        "ctx.inputs + keep_graph query": make(lambda: KeepInputs.apply(x, labels, *args)),
        "plain call": lambda: kernels.entropy_loss_forward_backward(x, labels),
        "forward alone (shipped)": lambda: kernels.entropy_loss(x, labels),
        "floor: HandBack apply + backward": make(lambda: HandBack.apply(x)),
        "floor: F.cross_entropy backward": make(lambda: F.cross_entropy(x, labels)),
        "floor: x.float().sum() backward": make(lambda: x.float().sum()),
        "torch.ones_like(0-d)": lambda: torch.ones_like(labels, dtype=torch.float32)[:0],
    }


def gpu_ratios(shapes):
    """do_bench (median, L2 flushed by do_bench) of the plain call and of the shipped autograd step."""
    rows = []
    for tokens, vocab in shapes:
        x = torch.randn(tokens, vocab, device="cuda").bfloat16()
        labels = torch.randint(0, vocab, (tokens,), device="cuda")
        leaf = x.detach().requires_grad_(True)
        loss, grad = kernels.entropy_loss_forward_backward(x, labels)
        value = kernels.entropy_loss(leaf, labels)
        value.backward()
        ref_loss, ref_grad = kernels.reference.entropy_loss_forward_backward(x, labels)
        err = float((leaf.grad.double() - ref_grad).norm() / ref_grad.norm())
        assert err < 1e-2 and abs(float(value) - float(ref_loss)) < 1e-2 * abs(float(ref_loss)), err

        def step():
            leaf.grad = None
            kernels.entropy_loss(leaf, labels).backward()

        plain = triton.testing.do_bench(lambda: kernels.entropy_loss_forward_backward(x, labels), return_mode="median")
        auto = triton.testing.do_bench(step, return_mode="median")
        rows.append({"tokens": tokens, "vocab": vocab, "plain_ms": plain, "autograd_ms": auto,
                     "ratio": auto / plain, "grad_rel_err": err})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--gpu", action="store_true", help="also the GPU-side ratios at five shapes")
    args = parser.parse_args(argv)
    x = torch.randn(8, 32000, device="cuda").bfloat16().requires_grad_(True)
    labels = torch.randint(0, 32000, (8,), device="cuda")
    results = {}
    print("keep_graph query:", hasattr(torch._C._autograd, "_get_current_graph_task_keep_graph"), torch.__version__)
    for round_ in range(args.rounds):  # interleaved rounds: the host's speed drifts
        for name, fn in steps(x, labels).items():
            value = host_us(fn)
            results[name] = min(results.get(name, value), value)
            print(f"round {round_} {name:45s} {value:8.1f} us", flush=True)
    print(json.dumps(results, indent=1))
    ratios = gpu_ratios([(1024, 32768), (4096, 32000), (4096, 32001), (1024, 128256), (16384, 32000)]) if args.gpu else []
    if args.out:
        with open(args.out, "w") as handle:
            json.dump({"host_us": results, "gpu": ratios, "gpu_name": torch.cuda.get_device_name()}, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
