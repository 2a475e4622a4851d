"""Host time per call of the pieces a loss call is made of (GPU machine): why the public call is built as it is.

The kernels of a small loss call take microseconds on the GPU, so what the CPU does per call decides whether the GPU
waits. This study times, on the GPU machine's own CPU, the pieces a call can be made of: a Triton launch through
``JITFunction`` (re-binds and re-specializes every argument) and through the compiled kernel's launcher, a
``torch.library.custom_op`` call, a ``torch.library.Library`` operator call (with 14 arguments, as
``fused_loss::forward_backward``), an ``autograd.Function``, an allocation, the current-stream query; and the
project's public calls on an 8 x 32000 problem of each loss. Each piece: wall-clock microseconds per call, the
median of 5 batches of N calls (no synchronization inside a batch) after 0.2 s of warm-up calls. Written to ``<out>/<gpu>/host_overhead.csv``.

    python -m perfutils host-overhead --out data
"""

import argparse
import statistics
from typing import Callable

_KEEP_ALIVE: list = []
ONE_THREAD = "autograd step, one thread"  # timed with the engine's multithreading off around all of its calls
LOSS_FORMATS = (("cross_entropy", "labels"), ("cross_entropy", "logits"), ("forward_kl", "logits"),
                ("reverse_kl", "logits"))


def wall_us(fn: Callable[[], object], calls: int = 2000, batches: int = 5) -> float:
    """Median over batches of the wall-clock microseconds per call, timed as the vocab sweep's host µs are
    (:func:`perfutils.measure.host_cost.time_host_calls`: until the last call returns; the sync after it is not timed)."""
    import torch

    from ..measure.host_cost import time_host_calls

    return statistics.median(time_host_calls(fn, torch.cuda.synchronize, calls=calls, repeats=batches,
                                             warmup=min(calls, 200), warmup_s=0.2))


def pieces() -> list[tuple[str, str, Callable[[], object]]]:
    """(group, name, call) for every piece timed."""
    import torch

    import kernels
    from kernels.dispatch import TEMPLATES, call_key
    from kernels.ops import CallOptions

    device = "cuda"
    x = torch.randn(8, 32000, device=device).bfloat16()
    t = torch.randn(8, 32000, device=device).bfloat16()
    rows = [
        ("torch", "torch.empty((8, 32000), bf16)", lambda: torch.empty((8, 32000), dtype=torch.bfloat16, device=device)),
        ("torch", "torch.empty(()), fp32", lambda: torch.empty((), device=device)),
        ("torch", "torch.cuda.current_stream().cuda_stream", lambda: torch.cuda.current_stream().cuda_stream),
        ("torch", "tensor.sum() (a small reduction kernel)", lambda: x.sum()),
    ]
    plan = kernels.prepare(x, t, loss="reverse_kl", target_format="logits", variant="fused")
    launch = plan.launches[0]
    plan.run()
    compiled = launch.compiled
    given = {**launch.args, **launch.constexprs}
    values = [given.get(name) for name in launch.fn.arg_names]  # a constexpr left at its default: ignored
    pointers = [value.data_ptr() if isinstance(value, torch.Tensor) else value for value in values]
    stream = torch.cuda.current_stream().cuda_stream
    rows += [
        ("triton launch", "JITFunction fn[grid](**kwargs) (fused kernel, 17 arguments)",
         lambda: launch.fn[launch.grid](**launch.args, **launch.constexprs, **launch.options)),
        ("triton launch", "CompiledKernel.run(...) (same kernel, direct)",
         lambda: compiled.run(launch.grid[0], 1, 1, stream, compiled.function, compiled.packed_metadata, None, None,
                              None, *values)),
        ("triton launch", "CompiledKernel.run(...) with pointers as ints (no driver pointer query)",
         lambda: compiled.run(launch.grid[0], 1, 1, stream, compiled.function, compiled.packed_metadata, None, None,
                              None, *pointers)),
    ]
    template_launch = launch.direct({id(value): index for index, value in enumerate(values)
                                     if isinstance(value, torch.Tensor)})
    if template_launch is not None:  # what a repeated public call runs (Triton 3.6: the launcher's C function)
        rows.append(("triton launch", f"call template's launch, pointers as ints (via "
                     f"{'the C launch' if template_launch.launcher is not compiled.run else 'CompiledKernel.run'})",
                     lambda: template_launch(pointers, stream)))

    # (no "from __future__ import annotations" in this module: custom_op reads these annotations as types)
    @torch.library.custom_op("host_overhead_probe::noop", mutates_args=())
    def custom_noop(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a.new_empty(())  # an operator's output may not alias its input

    custom_noop.register_fake(lambda a, b: a.new_empty(a.shape))
    library = torch.library.Library("host_overhead_probe2", "DEF")
    library.define("noop(Tensor logits, Tensor target, Tensor? loss_mask, Tensor? g, float go, bool cg, str loss, "
                   "str fmt, int ii, str variant, int? bs, int? nw, str options, bool validate) -> Tensor")
    library.impl("noop", lambda *args: args[0].new_empty(()), "CUDA")
    _KEEP_ALIVE.append(library)  # an operator lives as long as its Library object
    library_noop = torch.ops.host_overhead_probe2.noop.default

    class Identity(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a):
            return a.view_as(a)

        @staticmethod
        def backward(ctx, grad):
            return grad

    leaf = x.clone().requires_grad_(True)
    rows += [
        ("operator", "torch.library.custom_op call (allocates a 0-d output)", lambda: custom_noop(x, t)),
        ("operator", "torch.library.Library op call, 14 arguments (allocates a 0-d output)",
         lambda: library_noop(x, t, None, None, 1.0, True, "reverse_kl", "logits", -100, "auto", None, None, "", False)),
        ("operator", "autograd.Function.apply (identity)", lambda: Identity.apply(leaf)),
    ]

    def public(loss, fmt, target):
        return lambda: kernels.entropy_loss_forward_backward(x, target, loss=loss, target_format=fmt)

    def public_autograd(loss, fmt, target):
        def step():
            leaf.grad = None
            kernels.entropy_loss(leaf, target, loss=loss, target_format=fmt).backward()
        return step

    def plain_autograd():
        leaf.grad = None
        leaf.float().sum().backward()

    labels = torch.randint(0, 32000, (8,), device=device)
    rows += autograd_pieces(leaf, labels)
    for loss, fmt in LOSS_FORMATS:
        target = labels if fmt == "labels" else t
        rows.append(("public call", f"entropy_loss_forward_backward {loss}/{fmt}", public(loss, fmt, target)))
        public(loss, fmt, target)()  # the first call builds the template timed next
        options = CallOptions(True, loss, fmt, -100, "auto", None, None, "", False)
        template = TEMPLATES.get(call_key(x, target, None, None, options))
        if template:
            rows.append(("public call", f"  of which the template's run (allocations + launches) {loss}/{fmt}",
                         lambda template=template, target=target: template.run(x, target, None, None, 1.0)))
            rows.append(("public call", f"  of which the template key and lookup {loss}/{fmt}",
                         lambda target=target, options=options: TEMPLATES.get(call_key(x, target, None, None,
                                                                                       options))))
        rows.append(("public call", f"entropy_loss(...).backward() {loss}/{fmt}", public_autograd(loss, fmt, target)))
    rows.append(("public call", "floor: x.float().sum().backward() (PyTorch's autograd alone)", plain_autograd))
    return rows


def hand_back_function():
    """PyTorch's autograd floor for a loss like ours: a Function whose forward allocates a gradient and a 0-d loss
    and whose backward hands the gradient back (no kernel)."""
    import torch

    class HandBack(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a):
            ctx.grad = torch.empty_like(a)
            return a.new_empty((), dtype=torch.float32)

        @staticmethod
        def backward(ctx, grad):
            grad, ctx.grad = ctx.grad, None
            return grad

    return HandBack


def autograd_pieces(leaf, labels) -> list[tuple[str, str, Callable[[], object]]]:
    """Where an autograd step's host time goes: the forward alone, the pieces of the backward, and PyTorch's own
    floors (its engine with a custom Function that does nothing but hand back a gradient; its own loss)."""
    import torch
    import torch.nn.functional as F

    import kernels
    from kernels import ops

    def forward_only():
        kernels.entropy_loss(leaf, labels)  # the graph is dropped unused

    hand_back = hand_back_function()

    def hand_back_step():
        leaf.grad = None
        hand_back.apply(leaf).backward()

    def torch_loss_step():
        leaf.grad = None
        F.cross_entropy(leaf, labels).backward()

    def entropy_loss_step():
        leaf.grad = None
        kernels.entropy_loss(leaf, labels).backward()

    loss = torch.ones((), device=leaf.device)
    grad = torch.empty_like(leaf)
    steps = [("floor: Function handing back an allocated gradient, apply + .backward()", hand_back_step),
             ("floor: F.cross_entropy(x, labels).backward() (PyTorch's own loss)", torch_loss_step),
             ("entropy_loss(...).backward() cross_entropy/labels", entropy_loss_step)]
    return [
        ("autograd step", "entropy_loss(...) forward alone (cross_entropy/labels, graph dropped)", forward_only),
        ("autograd step", "torch.ones_like(loss) (the gradient .backward() creates)", lambda: torch.ones_like(loss)),
        ("autograd step", "scale_gradient_(grad, 1) (the backward's launch, direct)",
         lambda: ops.call_scale_gradient_(grad, loss)),
        *(("autograd step", name, step) for name, step in steps[:2]),
        # The engine runs a CUDA backward on its device thread: the caller wakes it and waits to be woken. PyTorch's
        # switch runs it on the calling thread instead (thread-local): entered once around the timed calls, as a
        # training loop would, and entered again at every step.
        *((ONE_THREAD, f"{name} in set_multithreading_enabled(False)", step) for name, step in steps),
        *(("autograd step, one thread per step", f"{name} in set_multithreading_enabled(False) entered per step",
           switched_per_step(step)) for name, step in steps),
    ]


def switched_per_step(step: Callable[[], object]) -> Callable[[], object]:
    """``step`` that turns the engine's multithreading off for its own duration only (the switch's cost, a context
    manager, is in the time)."""
    import torch

    def run():
        with torch.autograd.set_multithreading_enabled(False):
            step()

    return run


def profile(steps: int = 200) -> None:
    """Print torch.profiler's table of host time by operator over ``steps`` autograd steps (cross_entropy/labels,
    8 x 32000 bf16): which of the engine, the custom Function, the dispatcher, allocations and launches costs."""
    import torch
    from torch.profiler import ProfilerActivity, profile as torch_profile

    import kernels

    leaf = torch.randn(8, 32000, device="cuda").bfloat16().requires_grad_(True)
    labels = torch.randint(0, 32000, (8,), device="cuda")

    def step():
        leaf.grad = None
        kernels.entropy_loss(leaf, labels).backward()

    for _ in range(50):
        step()
    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25), flush=True)


def measure(out: str = "data", overwrite: bool = False):
    import pandas as pd
    import torch

    from ..data.metadata import collect_metadata
    from ..data.schema import data_path
    from ..data.store import write_table

    path = data_path(out, torch.cuda.get_device_name(), "host_overhead")
    if path.exists() and not overwrite:
        raise SystemExit(f"{path} exists: not overwriting recorded data (pass --overwrite to move it aside)")
    records = []
    for group, name, call in pieces():
        calls = 500 if group == "public call" else 2000
        if group == ONE_THREAD:
            with torch.autograd.set_multithreading_enabled(False):
                us = wall_us(call, calls=calls)
        else:
            us = wall_us(call, calls=calls)
        records.append({"group": group, "piece": name, "us_per_call": us, "calls": calls})
        print(f"{group:14s} {name:75s} {records[-1]['us_per_call']:8.1f} us", flush=True)
    frame = pd.DataFrame(records)
    write_table(frame, path, collect_metadata({"study": "host_overhead", "problem": "8 x 32000 bf16"}),
                overwrite=overwrite)
    return frame


def trace(batches: int = 40, calls: int = 300) -> None:
    """Print, per batch, the µs per call of each loss's public call on 8 x 32000 from a cold start (no time-based
    warm-up), with the garbage collections run during the batch: whether host µs drift, spike or settle."""
    import torch

    import kernels
    from ..measure.host_cost import trace_host_batches

    x = torch.randn(8, 32000, device="cuda").bfloat16()
    t = torch.randn(8, 32000, device="cuda").bfloat16()
    labels = torch.randint(0, 32000, (8,), device="cuda")
    for loss, fmt in LOSS_FORMATS:
        target = labels if fmt == "labels" else t
        rows = trace_host_batches(lambda: kernels.entropy_loss_forward_backward(x, target, loss=loss, target_format=fmt),
                                  torch.cuda.synchronize, calls=calls, batches=batches)
        print(f"trace {loss}/{fmt}: " + " ".join(f"{row['us_per_call']:.1f}" + ("*" if row["gc2"] else "")
                                                 for row in rows), flush=True)
    print("(µs per call per batch of", calls, "calls; * = a full garbage collection ran in the batch)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m perfutils host-overhead", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="data")
    parser.add_argument("--overwrite", action="store_true")
    parser.add_argument("--trace", action="store_true", help="print per-batch host µs of the public calls; write nothing")
    parser.add_argument("--profile", action="store_true",
                        help="print torch.profiler's host table of the autograd step; write nothing")
    args = parser.parse_args(argv)
    if args.trace:
        trace()
    elif args.profile:
        profile()
    else:
        measure(args.out, args.overwrite)
    return 0

