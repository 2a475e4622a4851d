"""Exploration (issue 38, kernel-only, not a recorded study): the lagged exchange at teaching size
(perfutils.lab_kernels.teaching.lagged_exchange) beside the product's lagged kernel at the same chunk and warps and
the product's public call, cross-entropy from labels, bf16, in one process.

  python scripts/explore_lagged_teaching.py      # one JSON line per (cell, side)

Each side checked against float64 first (the loss over all rows, the gradient on 16 sampled rows), then timed
(do_bench median, L2 flushed). pct: % of the GPU's recorded copy bandwidth. Both the teaching kernel and the
product's plan size their grids to every program the GPU holds at once.
"""
import json

import torch
import triton

import kernels
from explore_lagged import cell_bytes, checked_ms, copy_gbps, inputs, references
from perfutils.lab_kernels.teaching.lagged_exchange import lagged_cross_entropy

CELLS = [(4096, 32000), (4096, 131072)]
CONFIGS = [(2048, 4), (4096, 4)]


if __name__ == "__main__":
    copy = copy_gbps()
    print(json.dumps({"gpu": torch.cuda.get_device_name(), "copy_gbps_recorded": copy, "torch": torch.__version__,
                      "triton": triton.__version__}), flush=True)
    for tokens, vocab in CELLS:
        x, t = inputs("labels", vocab, tokens)
        check = references(x, t, "cross_entropy", "labels")
        nbytes = cell_bytes("labels", vocab, tokens)
        sides = [("public", lambda: kernels.entropy_loss_forward_backward(x, t))]
        for block, warps in CONFIGS:
            sides.append((f"teaching {block}/{warps}",
                          lambda block=block, warps=warps: lagged_cross_entropy(x, t, block=block, num_warps=warps)))
            sides.append((f"product plan {block}/{warps}", kernels.prepare(x, t, variant="split_row",
                                                                           block_size=block, num_warps=warps).run))
        for name, call in sides:
            ms, err = checked_ms(call, check)
            print(json.dumps({"loss": "cross_entropy", "fmt": "labels", "vocab": vocab, "tokens": tokens, "cfg": name,
                              "ms": round(ms, 4), "pct": round(nbytes / ms / 1e6 / copy * 100, 1),
                              "err": round(err, 5)}), flush=True)
        del x, t, check, sides
        torch.cuda.empty_cache()
