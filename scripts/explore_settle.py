"""Is a slow public-call row of the vocab sweep the call, a per-call allocation, or the moment it was timed?

One cell (16384 tokens, bf16, a distribution loss): the public call, its autograd form and its plan (kernel-only)
timed in four rounds of do_bench (25 ms warm-up, 100 ms), each timing followed by nvidia-smi's SM clock, power,
temperature and throttle reasons (the GPU idles while it runs), with the caching allocator's new segments and
retries; then one sustained timing of the public call (500 ms warm-up, 500 ms). Run on a GPU:

    python3 scripts/explore_settle.py 131072 reverse_kl

Output: data/h200/logs/vocab_sweep_2026-11-29b.txt (the settle of perfutils.measure.measurer.SETTLE_AFTER_MS).
"""
import subprocess
import sys
import time

import torch

sys.path.insert(0, ".")
from perfutils.measure import providers  # noqa: E402
from perfutils.measure.timing import bench  # noqa: E402

torch.manual_seed(0)
T, V = 16384, int(sys.argv[1]) if len(sys.argv) > 1 else 131072
loss = sys.argv[2] if len(sys.argv) > 2 else "reverse_kl"
x = torch.randn(T, V, device="cuda", dtype=torch.bfloat16) * 4
t = torch.randn(T, V, device="cuda", dtype=torch.bfloat16) * 4


def clocks():
    query = "--query-gpu=clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active"
    return subprocess.run(["nvidia-smi", "-i", str(torch.cuda.current_device()), query, "--format=csv,noheader"],
                          capture_output=True, text=True).stdout.strip()


plans = {v: providers.prepare(x, t, loss=loss, target_format="logits", variant=v)
         for v in ("public", "public_autograd", "plan")}
t0 = time.time()
plans["public"].run()
torch.cuda.synchronize()
print(f"first public call {1e3 * (time.time() - t0):.0f} ms", clocks(), flush=True)
for v in ("public_autograd", "plan"):
    plans[v].run()
torch.cuda.synchronize()
for rnd in range(4):
    for v in ("public", "public_autograd", "plan"):
        a = torch.cuda.memory_stats()
        r = bench(plans[v].run, warmup_ms=25, rep_ms=100)
        b = torch.cuda.memory_stats()
        segments = b["segment.all.allocated"] - a["segment.all.allocated"]
        print(f"round {rnd} {v:16s} median {r.ms_median:.4f} p20 {r.ms_p20:.4f} p80 {r.ms_p80:.4f} "
              f"cudaMalloc+{segments} retries+{b['num_alloc_retries'] - a['num_alloc_retries']}", clocks(), flush=True)
r = bench(plans["public"].run, warmup_ms=500, rep_ms=500)
print(f"public, warmup 500 ms, rep 500 ms: median {r.ms_median:.4f} p20 {r.ms_p20:.4f} p80 {r.ms_p80:.4f}")
