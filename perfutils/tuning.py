"""Build the tuning table behind ``variant="auto"`` from recorded sweeps.

    python -m perfutils.tuning --gpu-dir data/h100-sxm-80gb

For each (loss, target_format, dtype, vocab) the fastest correct row over the given studies (every
variant and configuration measured) becomes the entry. ``kernels.auto`` reads the table.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from .records import load_metadata, load_records, write_table

STUDIES = ("blocksize_sweep", "split_row_tuning", "benchmark")
KEY = ["loss", "target_format", "dtype", "vocab"]
TOKENS = 4096  # the table describes this row count (the benchmark also holds 1024 and 16384)


def build_tuning_table(gpu_dir: str | Path, studies=STUDIES) -> pd.DataFrame:
    gpu_dir = Path(gpu_dir)
    frames = [load_records(gpu_dir / f"{study}.csv") for study in studies]
    rows = pd.concat(frames, ignore_index=True)
    rows = rows[(rows["status"] == "ok") & (rows["tokens"] == TOKENS) & rows["variant"].isin(["fused", "two_pass", "split_row"])]
    rows = rows.assign(**_resolved_config(rows))  # rows measured with the variant's defaults have no block size
    if rows["gpu_name"].nunique() != 1:
        raise ValueError(f"the studies in {gpu_dir} mix GPUs: {sorted(rows['gpu_name'].unique())}")
    best = rows.loc[rows.groupby(KEY)["ms_median"].idxmin()]
    table = best[KEY + ["tokens", "variant", "block_size", "num_warps", "ms_median", "pct_of_copy", "gpu_name"]]
    return table.sort_values(KEY).reset_index(drop=True)


def _resolved_config(rows: pd.DataFrame) -> dict:
    """block_size / num_warps as the plan resolved them (``plan_config``), where the row left them to defaults."""
    import json

    plan = rows["plan_config"].map(lambda text: json.loads(text) if isinstance(text, str) and text else {})
    return {
        name: rows[name].fillna(plan.map(lambda config: config.get(name))).astype("Int64")
        for name in ("block_size", "num_warps")
    }


def write_tuning_table(gpu_dir: str | Path, studies=STUDIES, *, overwrite: bool = False) -> Path:
    gpu_dir = Path(gpu_dir)
    table = build_tuning_table(gpu_dir, studies)
    meta = {"derived_from": [f"{s}.csv" for s in studies], "sources": {s: load_metadata(gpu_dir / f"{s}.csv") for s in studies},
            "gpu_name": table["gpu_name"].iloc[0], "rule": "fastest ok row per (loss, target_format, dtype, vocab)"}
    return write_table(table, gpu_dir / "tuning.csv", meta, overwrite=overwrite)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m perfutils.tuning", description=__doc__.splitlines()[0])
    parser.add_argument("--gpu-dir", required=True)
    parser.add_argument("--overwrite", action="store_true", help="replace an existing tuning.csv")
    args = parser.parse_args(argv)
    path = write_tuning_table(args.gpu_dir, overwrite=args.overwrite)
    print(pd.read_csv(path).to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
