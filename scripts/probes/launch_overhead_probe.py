"""Probe (GPU): host cost of launch paths and op dispatch; GPU cost of same-address atomics."""
import time
import torch, triton, triton.language as tl
import kernels

dev = "cuda"

def wall_us(fn, n=3000, warm=100):
    for _ in range(warm): fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n): fn()
    el = time.perf_counter() - t
    torch.cuda.synchronize()
    return el / n * 1e6

x = torch.randn(8, 32000, device=dev).bfloat16()
t = torch.randn(8, 32000, device=dev).bfloat16()
res = {}
plan = kernels.prepare(x, t, loss="reverse_kl", target_format="logits", variant="fused")
L = plan.launches[0]
ck = L.fn[L.grid](**L.args, **L.constexprs, **L.options)
G3 = (L.grid[0], 1, 1)
names = [p.name for p in L.fn.params]
allargs = {**L.args, **L.constexprs}
vals = [allargs[n] for n in names]
res["JITFunction fn[grid](**kw)"] = wall_us(lambda: L.fn[L.grid](**L.args, **L.constexprs, **L.options))
res["compiled[grid](*args)"] = wall_us(lambda: ck[G3](*vals))
stream = torch.cuda.current_stream().cuda_stream
res["compiled[grid](*args, stream=)"] = wall_us(lambda: ck[G3](*vals, stream=stream))
g = L.grid
run = ck.run; fnh = ck.function; pm = ck.packed_metadata
res["compiled.run direct"] = wall_us(lambda: run(g[0], 1, 1, stream, fnh, pm, None, None, None, *vals))
res["current_stream().cuda_stream"] = wall_us(lambda: torch.cuda.current_stream().cuda_stream)
res["torch._C._cuda_getCurrentRawStream(0)"] = wall_us(lambda: torch._C._cuda_getCurrentRawStream(0))
res["torch.empty(()) fp32"] = wall_us(lambda: torch.empty((), device=dev))
res["torch.empty((8,32000)) bf16"] = wall_us(lambda: torch.empty((8, 32000), dtype=torch.bfloat16, device=dev))
res["x.view(-1, 32000)"] = wall_us(lambda: x.view(-1, 32000))
res["x.data_ptr()%16"] = wall_us(lambda: x.data_ptr() % 16)
res["key tuple"] = wall_us(lambda: (x.shape, x.stride(), x.dtype, x.device, t.shape, t.stride(), t.dtype, x.data_ptr() % 16, t.data_ptr() % 16))

@torch.library.custom_op("probe2::noop", mutates_args=())
def noop(a: torch.Tensor, b: torch.Tensor, s: str, i: int) -> tuple[torch.Tensor, torch.Tensor]:
    return a.new_empty(()), a.new_empty(0)
@noop.register_fake
def _(a, b, s, i): return a.new_empty(()), a.new_empty(0)
res["CustomOpDef call"] = wall_us(lambda: noop(x, t, "reverse_kl", 5))
op = torch.ops.probe2.noop.default
res["torch.ops.ns.op.default call"] = wall_us(lambda: op(x, t, "reverse_kl", 5))

def setup(ctx, inputs, output): pass
def bwd(ctx, g1, g2): return None, None, None, None
noop.register_autograd(bwd, setup_context=setup)
xr = x.clone().requires_grad_(True)
res["op.default autograd, requires_grad"] = wall_us(lambda: op(xr, t, "reverse_kl", 5))
res["op.default autograd, no grad"] = wall_us(lambda: op(x, t, "reverse_kl", 5))

class F(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b):
        return a.new_empty(())
    @staticmethod
    def backward(ctx, g):
        return None, None
res["autograd.Function.apply (requires_grad)"] = wall_us(lambda: F.apply(xr, t))

lib = torch.library.Library("probe3", "DEF")
lib.define("noop(Tensor a, Tensor b, str s, int i) -> (Tensor, Tensor)")
def impl(a, b, s, i): return a.new_empty(()), a.new_empty(0)
lib.impl("noop", impl, "CUDA")
op3 = torch.ops.probe3.noop.default
res["Library.impl CUDA op call"] = wall_us(lambda: op3(x, t, "reverse_kl", 5))
res["Library.impl via packet"] = wall_us(lambda: torch.ops.probe3.noop(x, t, "reverse_kl", 5))

for k, v in res.items():
    print(f"{k:45s} {v:8.2f} us")

@triton.jit
def atomic_kernel(ptr, out_ptr, DO_ATOMIC: tl.constexpr):
    pid = tl.program_id(0)
    tl.store(out_ptr + pid, pid.to(tl.float32))
    if DO_ATOMIC:
        tl.atomic_add(ptr, 1.0, sem="acq_rel")

from triton.testing import do_bench
c = torch.zeros(1, device=dev); o = torch.empty(1 << 20, device=dev)
for n in (4096, 16384, 65536):
    a = do_bench(lambda: atomic_kernel[(n,)](c, o, DO_ATOMIC=True), return_mode="median")
    b = do_bench(lambda: atomic_kernel[(n,)](c, o, DO_ATOMIC=False), return_mode="median")
    print(f"{n} programs: with same-address atomic {a*1000:.1f} us, without {b*1000:.1f} us")
