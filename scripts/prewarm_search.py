"""Compile what the first-call search would time for some cells of the vocab sweep, ahead of measuring them, in several
processes at once: every candidate of ``kernels.autotune.candidates`` and, for each lagged split_row candidate, the
register-capped twins the search may add (``capped_registers`` with the most steps it uses). The measuring process
then finds them in the Triton cache and only times them. Nothing is timed or recorded here.

  python scripts/prewarm_search.py PART PARTS --vocab 50257 100277 [--losses cross_entropy/labels] [--dtype bf16]

(one process per PART in 0..PARTS-1, all with the same TRITON_CACHE_DIR as the measurement).
"""
import argparse

import torch

from kernels import autotune
from kernels.autotune import PLANNERS
from kernels.problem import build_problem
from perfutils.measure.host_cost import HOST_ROWS
from perfutils.studies.vocab_sweep import LOSSES as LOSS_PAIRS

LOSSES = tuple(f"{loss}/{fmt}" for loss, fmt in LOSS_PAIRS)
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
# The row counts whose kernels the sweep compiles: Triton specializes an integer argument on its divisibility by 16,
# so one multiple of 16 stands for the sweep's token counts, and the 8-row problem of its host-cost columns
# (perfutils.measure.host_cost.HOST_ROWS) is searched and compiled apart (a profile of a cold row on the H100: of
# 100 kernels compiled in its first calls after a 1024-row prewarm of 98, about as many as the 8-row search times;
# logs/first_call_profile_2026-11-28.txt).
ROWS = (1024, HOST_ROWS)


def search_launches(loss: str, fmt: str, vocab: int, dtype: torch.dtype, take=lambda index: True, rows: int = 1024):
    """(variant, block_size, num_warps, options, outcome) of the plans the search could time for this cell at
    ``rows`` rows: its candidates whose index ``take`` accepts, each with its twins."""
    x = torch.randn(rows, vocab, device="cuda").to(dtype)
    t = torch.randint(0, vocab, (rows,), device="cuda") if fmt == "labels" else torch.randn_like(x)
    problem = build_problem(x, t, loss=loss, target_format=fmt, grad_output=1.0, ignore_index=-100, loss_mask=None)
    seed = autotune.table_entry(problem)
    for index, (variant, block, warps, options) in enumerate(autotune.candidates(problem, seed)):
        if not take(index):
            continue
        try:
            plan = PLANNERS[variant](problem, block, warps, **options)
            plan.run()
        except Exception as error:  # noqa: BLE001 - the search skips such a candidate too
            yield variant, block, warps, options, f"{type(error).__name__}: {error}"[:120]
            continue
        yield variant, block, warps, options, "compiled"
        if autotune.has_twins(plan, options):
            for cap in autotune.capped_registers(plan.launches[0].compiled, max(autotune.TWIN_STEPS)):
                capped = dict(options, maxnreg=cap)
                try:
                    PLANNERS[variant](problem, block, warps, **capped).run()
                    yield variant, block, warps, capped, "compiled"
                except Exception as error:  # noqa: BLE001
                    yield variant, block, warps, capped, f"{type(error).__name__}: {error}"[:120]
        del plan


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("part", type=int)
    parser.add_argument("parts", type=int)
    parser.add_argument("--vocab", type=int, nargs="+", required=True)
    parser.add_argument("--losses", nargs="+", default=list(LOSSES), choices=LOSSES)
    parser.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    args = parser.parse_args()
    cells = [(*name.split("/"), vocab, rows) for vocab in args.vocab for name in args.losses for rows in ROWS]
    for cell, (loss, fmt, vocab, rows) in enumerate(cells):  # (cell, candidate) pairs dealt round-robin
        mine = lambda index: (cell * 7 + index) % args.parts == args.part  # noqa: E731
        for variant, block, warps, options, outcome in search_launches(loss, fmt, vocab, DTYPES[args.dtype], mine,
                                                                       rows):
            print(f"{loss}/{fmt} {vocab} x{rows} {variant} {block}/{warps} {options}: {outcome}", flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
