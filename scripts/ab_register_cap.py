"""A/B in one process: lagged split_row (labels CE, 4096-column chunks, 4 warps) at its natural 80 registers vs
maxnreg=80, alternated; kernel-only (prepared plans), do_bench median with L2 flushed; loss checked vs float64."""
import torch, triton, kernels
from kernels.reference import entropy_loss as ref_loss
torch.manual_seed(0)
print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)
for vocab in (49152, 50304, 65536, 100277):
    x = (torch.randn(4096, vocab, device="cuda") * 2).bfloat16()
    y = torch.randint(0, vocab, (4096,), device="cuda")
    ref = ref_loss(x.double(), y, loss="cross_entropy", target_format="labels").item()
    plans = {cap: kernels.prepare(x, y, variant="split_row", block_size=4096, num_warps=4, cooperative=True,
                                  **({"maxnreg": cap} if cap else {})) for cap in (None, 80)}
    times = {cap: [] for cap in plans}
    for cap, plan in plans.items():
        loss, grad = plan.run()
        err = abs(loss.item() - ref) / abs(ref)
        regs = plan.launches[-1].compiled.n_regs
        print(f"vocab {vocab} cap {cap}: regs {regs}, loss rel err {err:.1e}", flush=True)
        assert err < 1e-2
    for _ in range(5):
        for cap, plan in plans.items():
            times[cap].append(triton.testing.do_bench(plan.run, warmup=25, rep=60, return_mode="median"))
    print(f"vocab {vocab}: natural {' '.join(f'{t:.4f}' for t in times[None])} | cap80 {' '.join(f'{t:.4f}' for t in times[80])}", flush=True)
    del x, y, plans
    torch.cuda.empty_cache()
