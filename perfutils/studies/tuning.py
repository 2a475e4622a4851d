"""Build the tuning table behind ``variant="auto"`` from recorded sweeps.

    python -m perfutils tuning --gpu-dir data/h100-sxm-80gb
    python -m perfutils tuning --gpu-dir data/h200 --from-search

For each (loss, target_format, dtype, vocab) and each project variant, the fastest correct row over
the given studies (every configuration measured) becomes an entry; ``fastest`` marks the variant that
``variant="auto"`` runs. ``options`` holds the planner options the row was measured with (JSON:
``{"split": false}`` for split_row's one-program-per-row form). ``kernels.autotune`` reads the table:
``auto`` takes the fastest entry, ``split_row`` without a configuration takes its own.

A GPU with no tuning sweeps (the H200) gets its table from the first-call search's own choices, as its vocab sweep
recorded them (``--from-search``, :func:`build_search_table`): one entry per cell, the configuration the search chose
on that GPU, with the public call's median. It is what a call there runs where the search cannot (CUDA-graph
capture, ``FUSED_LOSS_AUTOTUNE=0``) and the search's first candidate.
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


SEARCH_STUDY = "vocab_sweep"


def build_search_table(gpu_dir: str | Path) -> pd.DataFrame:
    """The table of the first-call search's choices: per (loss, target_format, dtype, vocab) of the vocab sweep's
    public-call rows at :data:`TOKENS` tokens, the plan the search chose (``plan_config``: variant, block size, warps,
    options such as a register cap) and that call's median."""
    rows = load_records(Path(gpu_dir) / f"{SEARCH_STUDY}.csv")
    rows = rows[(rows["status"] == "ok") & (rows["variant"] == "public") & (rows["tokens"] == TOKENS)]
    plans = rows["plan_config"].map(lambda text: json.loads(text) if isinstance(text, str) and text else {})
    searched = plans.map(lambda plan: plan.get("source") == "first-call search")
    rows, plans = rows[searched], plans[searched]
    if rows.empty:
        raise ValueError(f"no public-call row at {TOKENS} tokens whose plan the first-call search chose in {gpu_dir}")
    if rows["gpu_name"].nunique() != 1:
        raise ValueError(f"the vocab sweep in {gpu_dir} mixes GPUs: {sorted(rows['gpu_name'].unique())}")
    table = rows[KEY + ["tokens", "ms_median", "pct_of_copy", "gpu_name"]].assign(
        variant=plans.map(lambda plan: plan["variant"]), block_size=plans.map(lambda plan: int(plan["block_size"])),
        num_warps=plans.map(lambda plan: int(plan["num_warps"])),
        options=plans.map(lambda plan: json.dumps(plan.get("options") or {}, sort_keys=True)), fastest=True)
    latest = table.loc[rows.groupby(KEY)["timestamp_utc"].idxmax()]  # a cell measured again: its last choice
    return latest[KEY + ["tokens", "variant", "block_size", "num_warps", "options", "fastest", "ms_median",
                         "pct_of_copy", "gpu_name"]].sort_values(KEY).reset_index(drop=True)


def write_tuning_table(gpu_dir: str | Path, studies=STUDIES, *, overwrite: bool = False,
                       from_search: bool = False) -> Path:
    gpu_dir = Path(gpu_dir)
    if from_search:
        table = build_search_table(gpu_dir)
        paths = [gpu_dir / f"{SEARCH_STUDY}.csv"]
        rule = ("the first-call search's choice per (loss, target_format, dtype, vocab): the plan_config of the vocab "
                f"sweep's public-call rows at {TOKENS} tokens (the last one where a cell was measured again); "
                "ms_median: that public call's median")
    else:
        table = build_tuning_table(gpu_dir, studies)
        paths = recorded_studies(gpu_dir, studies)
        rule = "fastest ok row per (loss, target_format, dtype, vocab, variant); fastest: auto's pick"
    meta = {"derived_from": [path.name for path in paths], "sources": {path.stem: load_metadata(path) for path in paths},
            "gpu_name": table["gpu_name"].iloc[0], "rule": rule}
    return write_table(table, gpu_dir / "tuning.csv", meta, overwrite=overwrite)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m perfutils tuning", description=__doc__.splitlines()[0])
    parser.add_argument("--gpu-dir", required=True)
    parser.add_argument("--overwrite", action="store_true", help="replace an existing tuning.csv")
    parser.add_argument("--from-search", action="store_true",
                        help="the first-call search's choices recorded by the GPU's vocab sweep (no tuning sweeps)")
    args = parser.parse_args(argv)
    path = write_tuning_table(args.gpu_dir, overwrite=args.overwrite, from_search=args.from_search)
    print(pd.read_csv(path).to_string())
    return 0

