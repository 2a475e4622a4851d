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


def cell(spec: str):
    name, shape = spec.split(":")
    loss, fmt = name.split("/")
    tokens, vocab = (int(n) for n in shape.split("x"))
    return loss, fmt, tokens, vocab


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cells", nargs="+", type=cell)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__, flush=True)
    worst = 0.0
    for loss, fmt, tokens, vocab in args.cells:
        torch.manual_seed(0)
        x = (torch.randn(tokens, vocab, device="cuda") * 2).bfloat16()
        t = (torch.randint(0, vocab, (tokens,), device="cuda") if fmt == "labels"
             else (torch.randn(tokens, vocab, device="cuda") * 2).bfloat16())
        plans = {name: providers.prepare(x, t, loss=loss, target_format=fmt, variant=name)
                 for name in ("public", "plan")}
        times = {name: [] for name in plans}
        for name, plan in plans.items():
            error = errors(plan.run, x, t, loss, fmt)
            print(f"{loss}/{fmt} {tokens}x{vocab} {name}: {plan.config}, max rel err {error:.1e}", flush=True)
            worst = max(worst, error)
        for _ in range(args.rounds):
            for name, plan in plans.items():
                times[name].append(triton.testing.do_bench(plan.run, warmup=25, rep=100, return_mode="median"))
        line = " | ".join(f"{name} " + " ".join(f"{ms:.4f}" for ms in values) for name, values in times.items())
        ratio = sorted(times["public"])[args.rounds // 2] / sorted(times["plan"])[args.rounds // 2]
        print(f"{loss}/{fmt} {tokens}x{vocab}: {line} | public/plan {ratio:.3f}", flush=True)
        del x, t, plans
        torch.cuda.empty_cache()
    if not worst <= 1e-2:
        raise SystemExit(f"a result differs from float64 by {worst:.1e} (bf16 tolerance 1e-2)")


if __name__ == "__main__":
    main()
