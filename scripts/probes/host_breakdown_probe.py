"""Probe (GPU): where the host time of a repeated public call goes (template path)."""
import time, torch, kernels
from kernels import ops, dispatch
dev = "cuda"
def wall_us(fn, n=3000, warm=100):
    for _ in range(warm): fn()
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(n): fn()
    el = time.perf_counter() - t; torch.cuda.synchronize(); return el / n * 1e6
x = torch.randn(8, 32000, device=dev).bfloat16(); t = torch.randn(8, 32000, device=dev).bfloat16()
f = lambda: kernels.entropy_loss_forward_backward(x, t, loss="reverse_kl", target_format="logits")
f()
key = dispatch.call_key(x, t, None, None, (True, "reverse_kl", "logits", -100, "auto", None, None, "", False))
tpl = dispatch.TEMPLATES.get(key)
print("template", type(tpl).__name__, "entries", len(dispatch.TEMPLATES))
r = {}
r["public call"] = wall_us(f)
r["op call"] = wall_us(lambda: ops.forward_backward(x, t, None, None, 1.0, True, "reverse_kl", "logits", -100, "auto", None, None, "", False))
r["call_key"] = wall_us(lambda: dispatch.call_key(x, t, None, None, (True, "reverse_kl", "logits", -100, "auto", None, None, "", False)))
r["template.run"] = wall_us(lambda: tpl.run(x, t, None, None, None, 1.0))
r["is_capturing"] = wall_us(torch.cuda.is_current_stream_capturing)
r["empty x2"] = wall_us(lambda: (torch.empty((), device=dev), torch.empty((8, 32000), dtype=torch.bfloat16, device=dev)))
ws = torch.empty(tpl.workspace_shape, device=dev); loss = torch.empty((), device=dev); g = torch.empty_like(x)
tensors = [x, t, None, None, None, g, ws, loss, 1.0]
s = torch._C._cuda_getCurrentRawStream(0)
r["launches only"] = wall_us(lambda: [l(tensors, s) for l in tpl.launches])
for k, v in r.items(): print(f"{k:20s} {v:7.1f} us")
