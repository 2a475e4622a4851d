"""Probe (GPU): misaligned rows (50257) vs aligned (50304) after the peel; correctness vs float64 on sampled rows."""
import torch, kernels
from triton.testing import do_bench
LF = [("cross_entropy", "labels"), ("cross_entropy", "logits"), ("forward_kl", "logits"), ("reverse_kl", "logits")]
for V in (50257, 50304, 100277, 151936):
    x = (torch.randn(4096, V, device="cuda") * 2).bfloat16()
    tt = (torch.randn(4096, V, device="cuda") * 2).bfloat16()
    ll = torch.randint(0, V, (4096,), device="cuda"); ll[::9] = -100
    for loss, fmt in LF:
        t = ll if fmt == "labels" else tt
        kernels.entropy_loss_forward_backward(x, t, loss=loss, target_format=fmt)  # first call: search
        ms = do_bench(lambda: kernels.entropy_loss_forward_backward(x, t, loss=loss, target_format=fmt), return_mode="median")
        plan = kernels.prepare(x, t, loss=loss, target_format=fmt)
        l, g = kernels.entropy_loss_forward_backward(x, t, loss=loss, target_format=fmt)
        rows = torch.arange(0, 4096, 257, device="cuda")
        rl, rg = kernels.reference.entropy_loss_forward_backward(x[rows], t[rows], loss=loss, target_format=fmt)
        keep = (t[rows] != -100) if fmt == "labels" else torch.ones_like(rows, dtype=torch.bool)
        n_all = int((t != -100).sum()) if fmt == "labels" else 4096
        grad_err = float(((g[rows].double() * n_all / keep.sum()) - rg).norm() / rg.norm())
        nbytes = 4096 * V * (4 if fmt == "labels" else 6)
        print(f"V={V} {loss}/{fmt}: {ms:.3f} ms ({nbytes/ms/1e6/3001*100:.0f}% of 3001 GB/s) grad_err {grad_err:.1e} chose {plan.variant} {plan.config}")
    del x, tt
