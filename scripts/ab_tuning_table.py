"""What a GPU's tuning table gives the calls that cannot search: the public call with ``FUSED_LOSS_AUTOTUNE=0`` (as
under CUDA-graph capture) with the committed table, and with none (the heuristic), alternated in one process.

  FUSED_LOSS_AUTOTUNE=0 python scripts/ab_tuning_table.py [VOCAB ...]   # 4096 tokens, bf16, the four losses

Each side is checked against float64 once (loss over all rows, gradient on 16 sampled rows), then timed (do_bench
median, L2 flushed) in ROUNDS alternated rounds; one JSON line per side and round, with the configuration it ran.
"""
import json
import os
import sys

import torch
import triton

import kernels
from explore_lagged import TOKENS, cell_bytes, checked_ms, inputs, references, session_copy_gbps
from kernels import autotune, dispatch
from kernels.problem import build_problem

LOSSES = [("cross_entropy", "labels"), ("forward_kl", "logits"), ("reverse_kl", "logits"), ("cross_entropy", "logits")]
VOCABS = [32000, 50257, 131072, 262144]
ROUNDS = 2


COMMITTED = autotune.load_tuning_table


def with_table(on: bool) -> None:
    """The committed table, or none, for the calls from here on (the search is off: the table or the heuristic); the
    call templates are dropped, so the next call plans again."""
    autotune.load_tuning_table = COMMITTED if on else (lambda gpu_name, data_dir=None: ())
    dispatch.TEMPLATES.clear()


def main(vocabs):
    if autotune.enabled():
        raise SystemExit("run with FUSED_LOSS_AUTOTUNE=0: the calls must not search")
    copy = session_copy_gbps()
    for vocab in vocabs:
        for loss, fmt in LOSSES:
            x, t = inputs(fmt, vocab, TOKENS)
            check = references(x, t, loss, fmt)
            for round_ in range(ROUNDS):
                for side in ("table", "heuristic"):
                    with_table(side == "table")
                    choice = autotune.table_entry(build_problem(x, t, loss=loss, target_format=fmt, grad_output=1.0,
                                                                ignore_index=-100, loss_mask=None))
                    ms, err = checked_ms(lambda: kernels.entropy_loss_forward_backward(x, t, loss=loss,
                                                                                       target_format=fmt), check)
                    print(json.dumps({"loss": loss, "fmt": fmt, "vocab": vocab, "tokens": TOKENS, "round": round_,
                                      "cfg": side, "choice": None if choice is None else
                                      f"{choice.variant} {choice.block_size}/{choice.num_warps} {choice.options}",
                                      "ms": round(ms, 4), "err": round(err, 5),
                                      "pct": round(cell_bytes(fmt, vocab, TOKENS) / ms / 1e6 / copy * 100, 1)}),
                          flush=True)
            del x, t, check
            torch.cuda.empty_cache()
    print(json.dumps({"env": {"FUSED_LOSS_AUTOTUNE": os.environ.get("FUSED_LOSS_AUTOTUNE")},
                      "triton": triton.__version__}), flush=True)


if __name__ == "__main__":
    main([int(v) for v in sys.argv[1:]] or VOCABS)
