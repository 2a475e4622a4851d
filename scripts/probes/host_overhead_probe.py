"""Probe (GPU): where the host time of one public call goes, and what 50257/151936 run today. Prints a table."""
import time, statistics, json, sys
import torch, triton
import kernels
from kernels.problem import build_problem
from kernels.auto import choose_config

dev = "cuda"
torch.manual_seed(0)

def wall_us(fn, n=2000, warm=50):
    for _ in range(warm): fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n): fn()
    el = time.perf_counter() - t
    torch.cuda.synchronize()
    return el / n * 1e6

x = torch.randn(8, 32000, device=dev).bfloat16()
lab = torch.randint(0, 32000, (8,), device=dev)
t = torch.randn(8, 32000, device=dev).bfloat16()
out = {}
out["torch.empty"] = wall_us(lambda: torch.empty(8, 32000, dtype=torch.bfloat16, device=dev))
buf = torch.empty(1000, device=dev)
out["fill_"] = wall_us(lambda: buf.fill_(1.0))
out["sum"] = wall_us(lambda: buf.sum())

# Triton launch overhead for the fused kernel: kwargs vs positional
plan = kernels.prepare(x, t, loss="reverse_kl", target_format="logits", variant="fused")
L = plan.launches[0]
L()
out["triton launch fused (kwargs)"] = wall_us(lambda: L.fn[L.grid](**L.args, **L.constexprs, **L.options))
names = [p.name for p in L.fn.params]
allargs = {**L.args, **L.constexprs}
pos = [allargs[n] for n in names]
out["triton launch fused (positional)"] = wall_us(lambda: L.fn[L.grid](*pos, **L.options))

# custom op overhead
lib = torch.library.Library("probe_ns", "DEF")
@torch.library.custom_op("probe_ns::noop", mutates_args=())
def noop(a: torch.Tensor) -> torch.Tensor:
    return a.new_empty(())
@noop.register_fake
def _(a): return a.new_empty(())
out["custom_op noop"] = wall_us(lambda: noop(x))
def setup(ctx, inputs, output): pass
def bwd(ctx, g): return None
noop.register_autograd(bwd, setup_context=setup)
xr = x.clone().requires_grad_(True)
out["custom_op noop autograd (requires_grad)"] = wall_us(lambda: noop(xr))

# current public call breakdown
for loss, fmt, tgt in [("cross_entropy", "labels", lab), ("reverse_kl", "logits", t)]:
    key = f"{loss}"
    out[f"{key}: build_problem"] = wall_us(lambda: build_problem(x, tgt, loss=loss, target_format=fmt, grad_output=1.0, ignore_index=-100, loss_mask=None), n=500)
    prob = build_problem(x, tgt, loss=loss, target_format=fmt, grad_output=1.0, ignore_index=-100, loss_mask=None)
    out[f"{key}: choose_config"] = wall_us(lambda: choose_config(prob), n=500)
    out[f"{key}: prepare"] = wall_us(lambda: kernels.prepare(x, tgt, loss=loss, target_format=fmt), n=300)
    out[f"{key}: public fwd_bwd"] = wall_us(lambda: kernels.entropy_loss_forward_backward(x, tgt, loss=loss, target_format=fmt), n=300)
    p = kernels.prepare(x, tgt, loss=loss, target_format=fmt)
    out[f"{key}: plan.run"] = wall_us(p.run, n=500)
    out[f"{key}: plan config"] = str(p.variant) + " " + json.dumps(p.config)

for k, v in out.items():
    print(f"{k:48s} {v if isinstance(v, str) else f'{v:8.1f} us'}")

# cliffs: what runs at 50257, 50304, 151936 today (plan time, ms)
from triton.testing import do_bench
for V in (50257, 50304, 151936):
    xx = (torch.randn(4096, V, device=dev) * 2).bfloat16()
    tt = (torch.randn(4096, V, device=dev) * 2).bfloat16()
    ll = torch.randint(0, V, (4096,), device=dev)
    for loss, fmt, tg in [("cross_entropy", "labels", ll), ("cross_entropy", "logits", tt), ("reverse_kl", "logits", tt)]:
        p = kernels.prepare(xx, tg, loss=loss, target_format=fmt)
        ms = do_bench(p.run, return_mode="median")
        print(f"V={V} {loss}/{fmt}: {ms:.3f} ms  variant={p.variant} config={p.config}")
    del xx, tt
