"""Markdown tables of the recorded results (the README's numbers come from here).

    python -m perfutils.plots.summary [--gpu-dir data/h100-sxm-80gb]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..measure.records import load_metadata, load_records
from .sweeps import best_per_group

TARGETS = [  # issue #4's table: (loss, target_format, vocab, target ms)
    ("cross_entropy", "labels", 32768, 0.198),
    ("cross_entropy", "labels", 131072, 0.79),
    ("cross_entropy", "logits", 131072, 1.26),
    ("reverse_kl", "logits", 32768, 0.314),
    ("reverse_kl", "logits", 65536, 0.627),
    ("reverse_kl", "logits", 131072, 1.26),
]


def benchmark_table(gpu_dir: Path, tokens: int = 4096) -> str:
    df = load_records(gpu_dir / "benchmark.csv")
    meta = load_metadata(gpu_dir / "benchmark.csv")
    every_shape = best_per_group(df, by=("loss", "target_format", "tokens", "vocab", "variant"))
    best = every_shape[every_shape["tokens"] == tokens]
    lines = [
        f"| loss × vocab | torch.compile | fused | two_pass | split_row | auto | % of copy (auto) | floor | target |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    copy = meta.get("copy_gbps")
    for loss, fmt, vocab, target in TARGETS:
        part = best[(best["loss"] == loss) & (best["target_format"] == fmt) & (best["vocab"] == vocab)].set_index("variant")
        get = lambda v: f"{part.loc[v, 'ms_median']:.3f}" if v in part.index else "-"
        floor = part["bytes_min"].iloc[0] / (copy * 1e9) * 1e3 if copy and len(part) else float("nan")
        pct = f"{part.loc['auto', 'pct_of_copy']:.0f}%" if "auto" in part.index else "-"
        lines.append(f"| {loss} ({fmt}) {vocab // 1024}K | {get('torch_compile')} | {get('fused')} | {get('two_pass')} "
                     f"| {get('split_row')} | {get('auto')} | {pct} | {floor:.3f} | ≤ {target} |")
    source = (f"ms, median of CUDA-event timings, {tokens} tokens, bf16, fwd+bwd; {meta.get('gpu_name')}, "
              f"torch {meta.get('torch_version')}, Triton {meta.get('triton_version')}, copy bandwidth "
              f"{copy:.0f} GB/s, recorded {str(meta.get('timestamp_utc') or meta.get('time_utc') or '')[:10]} "
              f"(data/{gpu_dir.name}/benchmark.csv)")
    return "\n".join(lines) + "\n\n" + source + "\n\n" + ratio_line(every_shape)


def ratio_line(best) -> str:
    """Worst ratios over every recorded shape (all token counts): ours against the others."""
    table = best.pivot_table(index=["loss", "target_format", "tokens", "vocab"], columns="variant", values="ms_median")
    others = table[[v for v in ("fused", "two_pass") if v in table]].min(axis=1)
    ours = {v: table[v] for v in ("split_row", "auto") if v in table}
    parts = [f"{len(table)} recorded shapes"]
    for name, times in ours.items():
        parts.append(f"{name} / best of fused, two_pass ≤ {(times / others).max():.3f}")
        if "torch_compile" in table:
            parts.append(f"{name} / torch.compile ≤ {(times / table['torch_compile']).max():.3f}")
    if "auto" in ours:
        best_ours = table[[v for v in ("fused", "two_pass", "split_row") if v in table]].min(axis=1)
        parts.append(f"auto / best project variant ≤ {(table['auto'] / best_ours).max():.3f}")
    return f"Worst ratios over {parts[0]}: " + "; ".join(parts[1:]) + "."


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m perfutils.plots.summary")
    parser.add_argument("--gpu-dir", type=Path, default=Path("data/h100-sxm-80gb"))
    args = parser.parse_args(argv)
    print(benchmark_table(args.gpu_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
