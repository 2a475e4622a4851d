"""What the first call of a shape class costs on a machine that has seen nothing (no tuning table for its GPU, no
choice cached, no compiled kernel): ``kernels.entropy_loss_forward_backward`` timed wall-clock, first call and then
a repeated one, each cell in a new process with its own empty ``FUSED_LOSS_CACHE_DIR`` and ``TRITON_CACHE_DIR``.

  python scripts/first_call.py                 # every cell below, one JSON line each
  python scripts/first_call.py cell LOSS FORMAT VOCAB TOKENS   # one cell in this process (what the driver runs)

Each line: the first call's seconds, the repeated call's milliseconds (wall, synchronized), how many candidate
configurations the search timed (register-capped twins included) and which one it kept (kernels.autotune).
"""
import json
import os
import subprocess
import sys
import tempfile
import time

CELLS = [("cross_entropy", "labels", 151936, 4096), ("forward_kl", "logits", 50257, 4096),
         ("reverse_kl", "logits", 262144, 4096), ("cross_entropy", "logits", 32000, 16384)]


def cell(loss, fmt, vocab, tokens):
    import torch

    import kernels
    from kernels import autotune

    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(tokens, vocab, generator=gen, device="cuda").to(torch.bfloat16)
    t = (torch.randint(0, vocab, (tokens,), generator=gen, device="cuda") if fmt == "labels"
         else torch.randn(tokens, vocab, generator=gen, device="cuda").to(torch.bfloat16))

    def call():
        start = time.perf_counter()
        kernels.entropy_loss_forward_backward(x, t, loss=loss, target_format=fmt)
        torch.cuda.synchronize()
        return time.perf_counter() - start

    first = call()
    repeated = min(call() for _ in range(5))
    entries = json.loads(autotune.cache_file(torch.cuda.get_device_name()).read_text())
    entry = next(iter(entries.values()))
    print(json.dumps({"gpu": torch.cuda.get_device_name(), "loss": loss, "target_format": fmt, "vocab": vocab,
                      "tokens": tokens, "first_call_s": round(first, 2), "repeated_call_ms": round(repeated * 1e3, 3),
                      "candidates_timed": len(entry["candidates"]),
                      "kept": f"{entry['variant']} {entry['block_size']}/{entry['num_warps']} {entry['options']}",
                      "cpus": os.cpu_count()}), flush=True)


def main():
    if sys.argv[1:2] == ["cell"]:
        loss, fmt, vocab, tokens = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
        cell(loss, fmt, vocab, tokens)
        return
    for loss, fmt, vocab, tokens in CELLS:
        with tempfile.TemporaryDirectory() as fresh:
            env = dict(os.environ, FUSED_LOSS_CACHE_DIR=os.path.join(fresh, "choices"),
                       TRITON_CACHE_DIR=os.path.join(fresh, "triton"))
            subprocess.run([sys.executable, __file__, "cell", loss, fmt, str(vocab), str(tokens)], env=env, check=False)


if __name__ == "__main__":
    main()
