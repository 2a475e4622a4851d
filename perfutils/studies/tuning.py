"""Build the tuning table behind ``variant="auto"`` from recorded sweeps.

    python -m perfutils tuning --gpu-dir data/h100-sxm-80gb

For each (loss, target_format, dtype, vocab) and each project variant, the fastest correct row over
the given studies (every configuration measured) becomes an entry; ``fastest`` marks the variant that
``variant="auto"`` runs. ``options`` holds the planner options the row was measured with (JSON:
``{"split": false}`` for split_row's one-program-per-row form). ``kernels.autotune`` reads the table:
``auto`` takes the fastest entry, ``split_row`` without a configuration takes its own.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from ..data.records import load_metadata, load_records
from ..data.store import write_table

STUDIES = ("blocksize_sweep", "split_row_tuning", "split_row_unsplit_tuning", "benchmark")
KEY = ["loss", "target_format", "dtype", "vocab"]
VARIANTS = ["fused", "two_pass", "split_row"]
TOKENS = 4096  # the table describes this row count (the benchmark also holds 1024 and 16384)


def recorded_studies(gpu_dir: Path, studies=STUDIES) -> list[Path]:
    """The data files of ``studies`` present in ``gpu_dir`` (a GPU need not have every study)."""
    paths = [gpu_dir / f"{study}.csv" for study in studies if (gpu_dir / f"{study}.csv").exists()]
    if not paths:
        raise FileNotFoundError(f"none of the studies {list(studies)} is recorded in {gpu_dir}")
    return paths


def build_tuning_table(gpu_dir: str | Path, studies=STUDIES) -> pd.DataFrame:
    rows = pd.concat([load_records(path) for path in recorded_studies(Path(gpu_dir), studies)], ignore_index=True)
    rows = rows[(rows["status"] == "ok") & (rows["tokens"] == TOKENS) & rows["variant"].isin(VARIANTS)]
    if rows.empty:
        raise ValueError(f"no ok rows of {VARIANTS} at {TOKENS} tokens in {gpu_dir}")
    if rows["gpu_name"].nunique() != 1:
        raise ValueError(f"the studies in {gpu_dir} mix GPUs: {sorted(rows['gpu_name'].unique())}")
    rows = rows.assign(**_resolved_config(rows))  # rows measured with the variant's defaults have no block size
    best = rows.loc[rows.groupby(KEY + ["variant"])["ms_median"].idxmin()].copy()
    best["fastest"] = best["ms_median"] == best.groupby(KEY)["ms_median"].transform("min")
    table = best[KEY + ["tokens", "variant", "block_size", "num_warps", "options", "fastest", "ms_median",
                        "pct_of_copy", "gpu_name"]]
    return table.sort_values(KEY + ["ms_median"]).reset_index(drop=True)


def _resolved_config(rows: pd.DataFrame) -> dict:
    """block_size / num_warps as the plan resolved them (``plan_config``), where the row left them to
    defaults, and the planner options that distinguish the row (split_row's ``split``)."""
    plan = rows["plan_config"].map(lambda text: json.loads(text) if isinstance(text, str) and text else {})
    resolved = {
        name: rows[name].fillna(plan.map(lambda config: config.get(name))).astype("Int64")
        for name in ("block_size", "num_warps")
    }
    resolved["options"] = plan.map(lambda config: json.dumps({"split": False}) if config.get("mode") == "row" else "{}")
    return resolved


def write_tuning_table(gpu_dir: str | Path, studies=STUDIES, *, overwrite: bool = False) -> Path:
    gpu_dir = Path(gpu_dir)
    table = build_tuning_table(gpu_dir, studies)
    paths = recorded_studies(gpu_dir, studies)
    meta = {"derived_from": [path.name for path in paths], "sources": {path.stem: load_metadata(path) for path in paths},
            "gpu_name": table["gpu_name"].iloc[0], "rule": "fastest ok row per (loss, target_format, dtype, vocab, variant); fastest: auto's pick"}
    return write_table(table, gpu_dir / "tuning.csv", meta, overwrite=overwrite)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m perfutils tuning", description=__doc__.splitlines()[0])
    parser.add_argument("--gpu-dir", required=True)
    parser.add_argument("--overwrite", action="store_true", help="replace an existing tuning.csv")
    args = parser.parse_args(argv)
    path = write_tuning_table(args.gpu_dir, overwrite=args.overwrite)
    print(pd.read_csv(path).to_string())
    return 0

