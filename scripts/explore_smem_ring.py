"""Exploration (kernel-only, not a recorded study): where does the second read of a chunk come from?

The lagged split_row kernel reads a chunk of row r from DRAM in step k and again, from L2, in step k + 2, when the
row's summaries are in and it writes the gradient. Triton's language has no way to keep a tile in shared memory
from one loop step to another; Gluon (``triton.experimental.gluon``, in Triton 3.6) has. This script times the same
pattern without the summary exchange, both ways, on the distribution losses' bytes (read x and t, write one tensor,
bf16) and exp2 count (two per element in each pass):

* ``l2``: a Triton kernel; step k reads row r_k's chunk from DRAM (kept in L2: evict_last) and row r_(k-2)'s chunk
  again (evict_first), writes exp2(x2 - 4) - exp2(t2 - 4) for the old chunk and a per-chunk partial for the new one.
* ``smem``: the same in Gluon, with the chunks of the last three steps in a shared-memory ring (3 x BLOCK bf16 per
  input): the old chunk comes from shared memory, DRAM sees each byte once.

Persistent grids sized like the lagged kernel's (programs per SM from the compiled kernel's registers and shared
memory, whole rows per step). Each output is checked against PyTorch before it is timed (do_bench median, L2
flushed).  python scripts/explore_smem_ring.py   (one GPU; prints one line per kernel and configuration)
How it was run on the H100: data/h100-sxm-80gb/logs/explore_smem_ring_2026-11-26.txt. The real lagged kernel with
such a ring (explore_lagged.py's run Q, logs/explore_ring_2026-11-26.txt) was slower than the lagged kernel: the L2
variant here is a poor stand-in for the real kernel's second read.
"""
import sys

import torch
import triton
import triton.language as tl

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
except ImportError:  # Gluon is experimental: Triton 3.2-3.4 do not have it
    gluon = gl = None

SCALE_SHIFT = 4.0  # exp2(x2 - 4): the math's cost without a real row maximum (the data is N(0, 1))


@triton.jit
def l2_kernel(x_ptr, t_ptr, g_ptr, part_ptr, n_rows, n_cols, n_slots, C: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    slot = pid // C
    chunk = pid % C
    cols = tl.arange(0, BLOCK) + chunk * BLOCK
    behind = 2 * n_slots
    for row in range(slot, n_rows + behind, n_slots):
        cur = tl.minimum(row, n_rows - 1).to(tl.int64)
        x = tl.load(x_ptr + cur * n_cols + cols, eviction_policy="evict_last").to(tl.float32)
        t = tl.load(t_ptr + cur * n_cols + cols, eviction_policy="evict_last").to(tl.float32)
        old = tl.maximum(row - behind, 0).to(tl.int64)
        x_old = tl.load(x_ptr + old * n_cols + cols, eviction_policy="evict_first").to(tl.float32)
        t_old = tl.load(t_ptr + old * n_cols + cols, eviction_policy="evict_first").to(tl.float32)
        if row >= behind:
            g = tl.exp2(x_old * 1.4426950408889634 - 4.0) - tl.exp2(t_old * 1.4426950408889634 - 4.0)
            tl.store(g_ptr + old * n_cols + cols, g.to(tl.bfloat16))
        if row < n_rows:
            summary = tl.max(x, 0) + tl.sum(tl.exp2(x * 1.4426950408889634 - 4.0)
                                            - tl.exp2(t * 1.4426950408889634 - 4.0), 0)
            tl.store(part_ptr + cur * C + chunk, summary)


if gluon is not None:
    @gluon.jit
    def smem_kernel(x_ptr, t_ptr, g_ptr, part_ptr, n_rows, n_cols, n_slots, C: gl.constexpr, BLOCK: gl.constexpr,
                    WARPS: gl.constexpr):
        layout: gl.constexpr = gl.BlockedLayout([8], [32], [WARPS], [0])  # 16 bytes a thread a load
        ring_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
        x_ring = gl.allocate_shared_memory(gl.bfloat16, [3, BLOCK], ring_layout)
        t_ring = gl.allocate_shared_memory(gl.bfloat16, [3, BLOCK], ring_layout)
        pid = gl.program_id(0)
        slot = pid // C
        chunk = pid % C
        cols = gl.arange(0, BLOCK, layout=layout) + chunk * BLOCK
        behind = 2 * n_slots
        step = 0
        for row in range(slot, n_rows + behind, n_slots):
            cur = gl.minimum(row, n_rows - 1).to(gl.int64)
            x = gl.load(x_ptr + cur * n_cols + cols)
            t = gl.load(t_ptr + cur * n_cols + cols)
            if row >= behind:  # step k - 2's chunk, in the ring slot after this step's (each thread reads its own)
                x_old = x_ring.index((step + 1) % 3).load(layout).to(gl.float32)
                t_old = t_ring.index((step + 1) % 3).load(layout).to(gl.float32)
                old = gl.maximum(row - behind, 0).to(gl.int64)
                g = gl.exp2(x_old * 1.4426950408889634 - 4.0) - gl.exp2(t_old * 1.4426950408889634 - 4.0)
                gl.store(g_ptr + old * n_cols + cols, g.to(gl.bfloat16))
            x_ring.index(step % 3).store(x)
            t_ring.index(step % 3).store(t)
            if row < n_rows:
                xf = x.to(gl.float32)
                tf = t.to(gl.float32)
                summary = gl.max(xf, 0) + gl.sum(gl.exp2(xf * 1.4426950408889634 - 4.0)
                                                 - gl.exp2(tf * 1.4426950408889634 - 4.0), 0)
                gl.store(part_ptr + cur * C + chunk, summary)
            step += 1


def run(n_rows: int, n_cols: int, block: int, warps: int, copy_gbps: float | None = None) -> None:
    chunks = n_cols // block
    x = torch.randn(n_rows, n_cols, device="cuda").to(torch.bfloat16)
    t = torch.randn(n_rows, n_cols, device="cuda").to(torch.bfloat16)
    expected = (torch.exp2(x.float() * 1.4426950408889634 - SCALE_SHIFT)
                - torch.exp2(t.float() * 1.4426950408889634 - SCALE_SHIFT)).to(torch.bfloat16).float()
    part = torch.empty(n_rows * chunks, device="cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for name in ("l2", "smem") if gluon is not None else ("l2",):
        g = torch.zeros_like(x)

        def launch(slots):
            if name == "l2":
                return l2_kernel[(slots * chunks,)](x, t, g, part, n_rows, n_cols, slots, C=chunks, BLOCK=block,
                                                    num_warps=warps)
            return smem_kernel[(slots * chunks,)](x, t, g, part, n_rows, n_cols, slots, C=chunks, BLOCK=block,
                                                  WARPS=warps, num_warps=warps)

        kernel = launch(1)
        torch.cuda.synchronize()
        regs, shared = kernel.n_regs, kernel.metadata.shared
        per_sm = min(65536 // (max(regs, 1) * 32 * warps), (227 * 1024) // shared if shared > 1024 else 32, 64 // warps)
        slots = per_sm * sms // chunks  # whole rows a step, every program resident
        g.zero_()
        launch(slots)
        torch.cuda.synchronize()
        error = float((g.float() - expected).abs().max())
        if error > 1e-2:
            raise AssertionError(f"{name}: wrong output (max abs error {error})")
        ms = triton.testing.do_bench(lambda: launch(slots), return_mode="median")
        gbps = 3 * x.numel() * 2 / ms / 1e6
        pct = f", {100 * gbps / copy_gbps:.1f}% of copy" if copy_gbps else ""
        print(f"{n_rows} x {n_cols}, chunk {block}/{warps}: {name:4s} {ms:.4f} ms, {gbps:.0f} GB/s{pct}; {regs} registers, "
              f"{shared} B shared, {per_sm} programs/SM, {slots * chunks} programs; max error {error:.1e}", flush=True)


if __name__ == "__main__":
    if gluon is None:
        print(f"Triton {triton.__version__} has no triton.experimental.gluon: only the L2 kernel runs", file=sys.stderr)
    from perfutils.measure.measurer import read_copy_gbps
    from perfutils.data.schema import data_path

    gpu = torch.cuda.get_device_name()
    copy = read_copy_gbps(data_path("data", gpu, "ceilings"), gpu)
    for n_cols in (32768, 131072, 151552):
        for block, warps in ((4096, 4), (2048, 4), (4096, 8)):
            run(4096, n_cols, block, warps, copy)
