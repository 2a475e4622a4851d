"""A/B in one process: the public call (``entropy_loss_forward_backward``, outputs allocated per call) against the
prepared plan of the same choice (``prepare(...).run()``, outputs reused), alternated round by round; do_bench median
with L2 flushed, each checked against float64 on sampled rows first. Asks whether a gap between the vocab sweep's
``public`` and ``plan`` rows is the call's or the moment it was measured in.

  python scripts/ab_public_plan.py LOSS/FORMAT:TOKENSxVOCAB [...] [--rounds 5]
"""
import argparse

import torch
import triton

from kernels import reference
from perfutils.measure import providers
from perfutils.measure.timing import rel_err

CHECK_ROWS = 32  # gradient rows checked against float64 (the loss is checked over every row, in blocks)


def errors(run, x, t, loss: str, fmt: str) -> float:
    """The larger relative error of the loss (all rows) and of the gradient's first rows, against float64."""
    value, grad = run()
    ref_loss = reference.entropy_loss_in_blocks(x, t, loss=loss, target_format=fmt)
    _loss, ref_grad = reference.entropy_loss_forward_backward(x[:CHECK_ROWS], t[:CHECK_ROWS], loss=loss,
                                                              target_format=fmt)  # the mean over these rows
    return max(rel_err(value, ref_loss), rel_err(grad[:CHECK_ROWS] * (x.shape[0] / CHECK_ROWS), ref_grad))


def alternate(calls: dict, rounds: int) -> tuple[str, dict]:
    """Time each call once per round, in turn (do_bench median, L2 flushed): (a line of every time, each call's
    median over the rounds)."""
    times = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            times[name].append(triton.testing.do_bench(call, warmup=25, rep=100, return_mode="median"))
    line = " | ".join(f"{name} " + " ".join(f"{ms:.4f}" for ms in values) for name, values in times.items())
    return line, {name: sorted(values)[rounds // 2] for name, values in times.items()}


def cell(spec: str):
    name, shape = spec.split(":")
    loss, fmt = name.split("/")
    tokens, vocab = (int(n) for n in shape.split("x"))
    return loss, fmt, tokens, vocab


def compare(cells, make_calls, describe, rounds: int) -> None:
    """For each cell, seeded bf16 inputs; ``make_calls(x, t, loss, fmt)``: named calls returning (loss, grad), each
    checked against float64 (``describe(name, x, t, loss, fmt)`` says what it ran) and then alternated; prints the
    times and the first call's median over the second's. Exits non-zero when an error passes bf16's 1e-2."""
    worst = 0.0
    for loss, fmt, tokens, vocab in cells:
        torch.manual_seed(0)
        x = (torch.randn(tokens, vocab, device="cuda") * 2).bfloat16()
        t = (torch.randint(0, vocab, (tokens,), device="cuda") if fmt == "labels"
             else (torch.randn(tokens, vocab, device="cuda") * 2).bfloat16())
        calls = make_calls(x, t, loss, fmt)
        for name, call in calls.items():
            error = errors(call, x, t, loss, fmt)  # a public call's first call also runs the first-call search
            print(f"{loss}/{fmt} {tokens}x{vocab} {name}: {describe(name, x, t, loss, fmt)}, max rel err {error:.1e}",
                  flush=True)
            worst = max(worst, error)
        line, medians = alternate(calls, rounds)
        first, second = list(calls)[:2]
        print(f"{loss}/{fmt} {tokens}x{vocab}: {line} | {first}/{second} {medians[first] / medians[second]:.3f}",
              flush=True)
        del x, t, calls
        torch.cuda.empty_cache()
    if not worst <= 1e-2:
        raise SystemExit(f"a result differs from float64 by {worst:.1e} (bf16 tolerance 1e-2)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cells", nargs="+", type=cell)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__, flush=True)
    plans = {}

    def make_calls(x, t, loss, fmt):
        plans.update({name: providers.prepare(x, t, loss=loss, target_format=fmt, variant=name)
                      for name in ("public", "plan")})
        return {name: plan.run for name, plan in plans.items()}

    compare(args.cells, make_calls, lambda name, *_: plans[name].config, args.rounds)


if __name__ == "__main__":
    main()
