"""Check ``perfutils.model.occupancy`` against the CUDA driver on the project's real kernels (GPU only).

    python -m perfutils occupancy-check --out data

For every (loss, variant, block size, warps) of the recorded sweeps, compile the kernels of the plan
(no timing), then compare blocks/SM from NVIDIA's algorithm (our port, fed with the compiled
kernel's registers and shared memory) with ``cuOccupancyMaxActiveBlocksPerMultiprocessor``.
"""

from __future__ import annotations

import argparse

import pandas as pd


def check(configs, tokens: int = 64) -> pd.DataFrame:
    import torch

    import kernels
    from perfutils.model.occupancy import driver_blocks_per_sm, occupancy_of_compiled

    rows = []
    cc = torch.cuda.get_device_capability()
    for loss, target_format, variant, vocab, block_size, num_warps in configs:
        x = torch.randn(tokens, vocab, device="cuda").bfloat16()
        t = torch.randint(0, vocab, (tokens,), device="cuda") if target_format == "labels" else torch.randn_like(x)
        try:
            plan = kernels.prepare(x, t, loss=loss, target_format=target_format, variant=variant,
                                   block_size=block_size, num_warps=num_warps)
            plan.run()
            torch.cuda.synchronize()
        except Exception as error:  # a configuration that cannot compile is not an occupancy question
            rows.append(dict(loss=loss, target_format=target_format, variant=variant, vocab=vocab,
                             block_size=block_size, num_warps=num_warps, kernel=None, error=repr(error)[:300]))
            continue
        for launch in plan.launches:
            compiled = launch.compiled
            occ = occupancy_of_compiled(compiled, cc)
            drv = driver_blocks_per_sm(compiled)
            rows.append(dict(loss=loss, target_format=target_format, variant=variant, vocab=vocab,
                             block_size=launch.block_size, num_warps=launch.num_warps, kernel=launch.name,
                             n_regs=compiled.n_regs, shared_bytes=compiled.metadata.shared,
                             predicted_blocks_per_sm=occ.blocks_per_sm, driver_blocks_per_sm=drv,
                             match=occ.blocks_per_sm == drv, limiter="+".join(sorted(occ.limiters)), error=None))
    return pd.DataFrame(rows)


def main(argv=None) -> int:
    import itertools

    import torch

    from perfutils.data import metadata, schema, store

    parser = argparse.ArgumentParser(prog="python -m perfutils occupancy-check")
    parser.add_argument("--out", default="data")
    args = parser.parse_args(argv)
    pairs = [("cross_entropy", "labels"), ("cross_entropy", "logits"), ("reverse_kl", "logits")]
    configs = [(l, f, v, 32768, b, w) for (l, f), v, b, w in itertools.product(
        pairs, ["fused", "two_pass"], [1024, 2048, 4096, 8192, 16384, 32768], [4, 8, 16, 32])]
    configs += [(l, f, "split_row", 131072, b, w) for (l, f), b, w in itertools.product(
        pairs, [2048, 4096, 8192, 16384], [4, 8, 16])]
    df = check(configs)
    path = schema.data_path(args.out, torch.cuda.get_device_name(), "occupancy_check")
    store.write_table(df, path, metadata.collect_metadata({"study": "occupancy_check"}))
    checked = df[df["kernel"].notna()]
    print(f"{int(checked['match'].sum())}/{len(checked)} kernels: predicted blocks/SM == driver's")
    print(checked[~checked["match"].astype(bool)].to_string() if not checked["match"].all() else "all match")
    return 0

