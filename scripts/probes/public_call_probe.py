"""Probe (GPU): host cost per public call and public call vs prepared plan, a few shapes."""
import time
import torch
import kernels
from triton.testing import do_bench

dev = "cuda"
def wall_us(fn, n=2000, warm=50):
    for _ in range(warm): fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n): fn()
    el = time.perf_counter() - t
    torch.cuda.synchronize()
    return el / n * 1e6

LF = [("cross_entropy", "labels"), ("cross_entropy", "logits"), ("forward_kl", "logits"), ("reverse_kl", "logits")]
x = torch.randn(8, 32000, device=dev).bfloat16()
for loss, fmt in LF:
    t = torch.randint(0, 32000, (8,), device=dev) if fmt == "labels" else torch.randn(8, 32000, device=dev).bfloat16()
    fb = wall_us(lambda: kernels.entropy_loss_forward_backward(x, t, loss=loss, target_format=fmt))
    xr = x.clone().requires_grad_(True)
    def ag():
        kernels.entropy_loss(xr, t, loss=loss, target_format=fmt).backward()
        xr.grad = None
    a = wall_us(ag, n=1000)
    fo = wall_us(lambda: kernels.entropy_loss_forward_backward(x, t, loss=loss, target_format=fmt, grad_output=None))
    print(f"host 8x32000 {loss}/{fmt}: fwd_bwd {fb:.1f} us, forward-only {fo:.1f} us, autograd fwd+bwd {a:.1f} us")

for tokens, V in [(4096, 32768), (4096, 131072), (4096, 50257), (16384, 32000)]:
    for loss, fmt in LF:
        xx = (torch.randn(tokens, V, device=dev) * 2).bfloat16()
        tt = torch.randint(0, V, (tokens,), device=dev) if fmt == "labels" else (torch.randn(tokens, V, device=dev) * 2).bfloat16()
        pub = do_bench(lambda: kernels.entropy_loss_forward_backward(xx, tt, loss=loss, target_format=fmt), return_mode="median")
        plan = kernels.prepare(xx, tt, loss=loss, target_format=fmt)
        pl = do_bench(plan.run, return_mode="median")
        xr = xx.clone().requires_grad_(True)
        def ag():
            kernels.entropy_loss(xr, tt, loss=loss, target_format=fmt).backward()
            xr.grad = None
        a = do_bench(ag, return_mode="median")
        ref = kernels.reference.entropy_loss(xx[:64].double(), tt[:64], loss=loss, target_format=fmt)
        l64, _ = kernels.entropy_loss_forward_backward(xx[:64], tt[:64], loss=loss, target_format=fmt)
        print(f"{tokens}x{V} {loss}/{fmt}: public {pub:.3f} ms, plan {pl:.3f} ms, autograd {a:.3f} ms ({plan.variant} {plan.config.get('mode')} bs={plan.config.get('block_size')}), check {abs(float(l64)-float(ref))/abs(float(ref)):.1e}")
        del xx, tt, xr
