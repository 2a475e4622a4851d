"""Labels CE with the row resident in registers (``fused`` with ``resident=True``, :mod:`kernels.resident_row`)
against the two-tile fused kernel the first-call search chose at 32000 columns before it existed, and against the
public call (whose first call now times both); prepared plans and the public call alternated round by round in one
process, do_bench median with L2 flushed, each checked against float64 first (scripts/ab_public_plan.py).

  python scripts/explore_resident.py TOKENSxVOCAB [...] [--rounds 5]
"""
import argparse

import torch
import triton

import kernels
from perfutils.measure import providers
from ab_public_plan import compare

CALLS = {  # name: kernels.prepare options (None: the public call)
    "public": None,
    "two_tiles": dict(variant="fused", block_size=16384, num_warps=16),
    "resident_16": dict(variant="fused", resident=True, num_warps=16),
    "resident_8": dict(variant="fused", resident=True, num_warps=8),
    "resident_32": dict(variant="fused", resident=True, num_warps=32),
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cells", nargs="+")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__, flush=True)
    cells = [("cross_entropy", "labels", *(int(n) for n in spec.split("x"))) for spec in args.cells]
    plans = {}

    def make_calls(x, t, loss, fmt):
        plans.clear()
        for name, options in CALLS.items():
            plans[name] = (providers.prepare(x, t, loss=loss, target_format=fmt, variant="public") if options is None
                           else kernels.prepare(x, t, loss=loss, target_format=fmt, **options))
        return {name: plan.run for name, plan in plans.items()}

    def describe(name, *_):
        plan = plans[name]
        launch = plan.launches[0] if getattr(plan, "launches", None) else None
        regs = getattr(getattr(launch, "compiled", None), "n_regs", None)
        return f"{getattr(plan, 'config', '')} regs {regs}"

    compare(cells, make_calls, describe, args.rounds)


if __name__ == "__main__":
    main()
