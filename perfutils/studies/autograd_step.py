"""What the autograd form costs inside a training step (``autograd_step.csv``): the loss behind an output head.

The vocab sweep times ``entropy_loss(x).backward()`` on a leaf: the step is the loss alone, so on small problems it
measures PyTorch's autograd engine (its hand-over of a CUDA backward to the engine's device thread), which any
autograd loss pays, PyTorch's own included (``host_overhead.csv``). Training code calls the loss after a model whose
backward runs through the same engine anyway. This study times one step of a bf16 output head and its loss,
``logits = h @ W.T``, forward and backward, three ways:

===============  ========================================================================================
``autograd``     ``kernels.entropy_loss(logits, target).backward()``
``plain``        ``loss, g = kernels.entropy_loss_forward_backward(logits.detach(), target)``, then
                 ``logits.backward(g)``: the plain call with the head's backward started by hand
``torch``        PyTorch's own loss, ``F.cross_entropy(logits, labels).backward()`` (cross-entropy only)
===============  ========================================================================================

Each way is checked first (the loss and the gradients of ``h`` and ``W`` against float64, ``kernels.reference``;
refused past the dtype's bound), then timed in ``rounds`` that alternate the ways (a row each): on the GPU (``bench``:
median, p20, p80, L2 flushed) and, at 8 rows, on the host (``wall_us``: µs per step until the last returns).
``autograd`` over ``plain`` is the autograd form's own cost in a step.

    python -m perfutils autograd-step --out data
    python -m perfutils autograd-step --profile     # where the autograd form's host time goes at 8 rows
"""

from __future__ import annotations

import argparse
from typing import Callable

__all__ = ["SHAPES", "WAYS", "head_inputs", "step", "timed_step", "check", "measure", "profile", "main"]

WAYS = ("autograd", "plain", "torch")
# (tokens, vocab, hidden): the vocab sweep's host-bound corner (1024 tokens) at two heads, one larger step, and
# 8 rows, where the step is all host.
SHAPES = ((8, 32000, 1024), (1024, 32000, 2048), (1024, 32000, 4096), (1024, 128256, 4096), (4096, 32000, 4096))
LOSSES = (("cross_entropy", "labels"), ("reverse_kl", "logits"))
TOLERANCE = {"torch.bfloat16": 1e-2, "torch.float32": 1e-5}


def head_inputs(tokens: int, vocab: int, hidden: int, target_format: str, *, device, dtype, seed: int = 0):
    """(h, W, target): hidden states and head weights that require grad (logits of standard deviation ~2), and
    labels or a teacher's logits."""
    import torch

    generator = torch.Generator(device=device).manual_seed(seed)

    def normal(*shape, scale=1.0):
        return (torch.randn(*shape, generator=generator, device=device) * scale).to(dtype)

    h = normal(tokens, hidden).requires_grad_(True)
    w = normal(vocab, hidden, scale=2.0 / hidden ** 0.5).requires_grad_(True)
    if target_format == "labels":
        target = torch.randint(0, vocab, (tokens,), generator=generator, device=device)
    else:
        target = normal(tokens, vocab, scale=2.0)
    return h, w, target


def step(way: str, h, w, target, loss: str, target_format: str) -> Callable[[], object]:
    """One forward and backward of the head and its loss; returns the loss. Gradients accumulate in h.grad and
    w.grad (the caller clears them)."""
    import torch.nn.functional as F

    import kernels

    options = dict(loss=loss, target_format=target_format)
    if way == "autograd":
        def run():
            value = kernels.entropy_loss(h @ w.T, target, **options)
            value.backward()
            return value
    elif way == "plain":
        def run():
            logits = h @ w.T
            value, grad = kernels.entropy_loss_forward_backward(logits.detach(), target, **options)
            logits.backward(grad)
            return value
    elif way == "torch":
        if (loss, target_format) != ("cross_entropy", "labels"):
            raise ValueError(f"way 'torch' is PyTorch's cross_entropy from labels, not {loss}/{target_format}")

        def run():
            value = F.cross_entropy(h @ w.T, target)
            value.backward()
            return value
    else:
        raise ValueError(f"way must be one of {WAYS}, got {way!r}")
    return run


def timed_step(way: str, h, w, target, loss: str, target_format: str) -> Callable[[], object]:
    """:func:`step` from cleared gradients, as a training loop's step starts: what is timed."""
    run = step(way, h, w, target, loss, target_format)

    def cleared():
        h.grad = w.grad = None
        return run()

    return cleared


def check(way: str, h, w, target, loss: str, target_format: str) -> dict[str, float]:
    """Run one step from cleared gradients; the relative errors of the loss, h.grad and w.grad against float64:
    ``kernels.reference``'s loss of the logits the head computed, its gradient taken back through the head in float64
    (the head's own rounding is the same for every way, so it is not what is checked). Raises AssertionError past the
    dtype's bound."""
    import torch

    import kernels
    from ..measure.timing import rel_err

    with torch.no_grad():
        logits = (h @ w.T).double().requires_grad_(True)
    t64 = target if target_format == "labels" else target.double()
    ref = kernels.reference.entropy_loss(logits, t64, loss=loss, target_format=target_format)
    ref.backward()
    h_ref, w_ref = logits.grad @ w.double(), logits.grad.T @ h.double()
    h.grad = w.grad = None
    value = step(way, h, w, target, loss, target_format)()
    errors = {"loss_rel_err": rel_err(value.detach(), ref.detach()), "h_grad_rel_err": rel_err(h.grad, h_ref),
              "w_grad_rel_err": rel_err(w.grad, w_ref)}
    bound = TOLERANCE[str(h.dtype)]
    if not max(errors.values()) <= bound:
        raise AssertionError(f"{way} {loss}/{target_format} {tuple(h.shape)} x {tuple(w.shape)}: wrong result "
                             f"{errors} (bound {bound})")
    return errors


def measure(out: str = "data", overwrite: bool = False, shapes=SHAPES, rounds: int = 3):
    import pandas as pd
    import torch

    from ..data.metadata import collect_metadata
    from ..data.schema import data_path
    from ..data.store import write_table
    from ..measure.timing import bench
    from .host_overhead import wall_us

    gpu = torch.cuda.get_device_name()
    path = data_path(out, gpu, "autograd_step")
    if path.exists() and not overwrite:
        raise SystemExit(f"{path} exists: not overwriting recorded data (pass --overwrite to move it aside)")
    records = []
    for loss, target_format in LOSSES:
        for tokens, vocab, hidden in shapes:
            h, w, target = head_inputs(tokens, vocab, hidden, target_format, device="cuda", dtype=torch.bfloat16)
            ways = WAYS if target_format == "labels" else WAYS[:2]
            # every way checked before any is timed (the first call's search is not timed)
            errors = {way: check(way, h, w, target, loss, target_format) for way in ways}
            steps = {way: timed_step(way, h, w, target, loss, target_format) for way in ways}
            for round_ in range(rounds):  # the ways alternate, each round in another order: drift hits them alike
                for way in ways[round_ % len(ways):] + ways[:round_ % len(ways)]:
                    timed = bench(steps[way])
                    # Host µs only where the step is all host; past it the launch queue fills and the wall clock
                    # is the GPU's.
                    host = wall_us(steps[way]) if tokens <= 8 else float("nan")
                    records.append({"loss": loss, "target_format": target_format, "tokens": tokens, "vocab": vocab,
                                    "hidden": hidden, "dtype": "bf16", "way": way, "round": round_,
                                    "ms_median": timed.ms_median, "ms_p20": timed.ms_p20, "ms_p80": timed.ms_p80,
                                    "host_us_per_step": host, **errors[way], "gpu_name": gpu})
                    print(f"{loss}/{target_format} {tokens}x{vocab} h{hidden} round {round_} {way:9s} "
                          f"{timed.ms_median:.4f} ms host {host:.1f} us  errors {max(errors[way].values()):.1e}",
                          flush=True)
    frame = pd.DataFrame(records)
    write_table(frame, path, collect_metadata({"study": "autograd_step", "shapes": [list(s) for s in shapes],
                                               "losses": [list(x) for x in LOSSES], "dtype": "bf16",
                                               "rounds": rounds}),
                overwrite=overwrite)
    return frame


def profile(steps: int = 200) -> None:
    """Print, at 8 rows, three rounds of µs a step of each loss's autograd and plain ways (1000 steps each, the ways
    side by side), then torch.profiler's tables (self CPU, self CUDA) of ``steps`` steps of each: where the autograd
    form's extra host time goes. Writes nothing."""
    import time

    import torch
    from torch.profiler import ProfilerActivity, profile as torch_profile

    cases = {}
    for loss, target_format in LOSSES:
        h, w, target = head_inputs(*SHAPES[0], target_format, device="cuda", dtype=torch.bfloat16)  # 8 rows
        for way in WAYS[:2]:
            run = cases[f"{loss}/{way}"] = timed_step(way, h, w, target, loss, target_format)
            for _ in range(100):
                run()
    for round_ in range(3):
        line = []
        for name, run in cases.items():
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(1000):
                run()
            torch.cuda.synchronize()
            line.append(f"{name} {(time.perf_counter() - start) * 1e3:.0f} us")
        print(f"round {round_}: " + ", ".join(line), flush=True)
    for name, run in cases.items():
        with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                run()
            torch.cuda.synchronize()
        print(f"===== {name}", flush=True)
        for key in ("self_cpu_time_total", "self_cuda_time_total"):
            print(prof.key_averages().table(sort_by=key, row_limit=14, max_name_column_width=60), flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m perfutils autograd-step", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="data")
    parser.add_argument("--overwrite", action="store_true")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the ways alternated (at least 1)")
    parser.add_argument("--profile", action="store_true", help="print where the autograd form's host time goes at 8 "
                        "rows (torch.profiler); write nothing")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    if args.profile:
        profile()
    else:
        measure(args.out, args.overwrite, rounds=args.rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
