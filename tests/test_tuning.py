"""The tuning table behind variant="auto" and split_row's default configuration (no GPU needed)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pandas as pd
import pytest

from kernels.autotune import table_choice
from perfutils.studies import tuning
from perfutils.data.records import load_records
from perfutils.studies.cases import tuned_config

H100_DIR = Path(__file__).resolve().parent.parent / "data" / "h100-sxm-80gb"
H100 = "NVIDIA H100 80GB HBM3"


def entry(variant, vocab, ms, block=4096, warps=4, options="{}", loss="cross_entropy", fmt="labels"):
    return dict(loss=loss, target_format=fmt, dtype="bf16", vocab=str(vocab), variant=variant,
                block_size=str(block), num_warps=str(warps), options=options, ms_median=str(ms))


TABLE = [
    entry("fused", 32768, 0.20, 16384, 16),
    entry("split_row", 32768, 0.21, 16384, 16, json.dumps({"split": False})),
    entry("two_pass", 32768, 0.28, 8192, 8),
    entry("fused", 131072, 1.03, 32768, 16),
    entry("split_row", 131072, 0.85, 4096, 4),
    entry("split_row", 131072, 1.30, 4096, 4, loss="reverse_kl", fmt="logits"),
]


def test_auto_takes_the_fastest_variant_of_the_nearest_vocab():
    choice = table_choice(TABLE, "cross_entropy", "labels", "bf16", 40000)
    assert (choice.variant, choice.block_size, choice.num_warps, choice.options) == ("fused", 16384, 16, {})
    choice = table_choice(TABLE, "cross_entropy", "labels", "bf16", 262144)
    assert (choice.variant, choice.block_size, choice.source) == ("split_row", 4096, "tuning table")


def test_a_variant_takes_its_own_entry_named_by_the_kernel_it_runs():
    """split_row's entry here is its one-program-a-row form, recorded as split_row with split=False: the choice names
    the kernel that runs (fused), as the search and the plan do."""
    choice = table_choice(TABLE, "cross_entropy", "labels", "bf16", 32768, "split_row")
    assert (choice.variant, choice.block_size, choice.options) == ("fused", 16384, {})
    assert table_choice(TABLE, "cross_entropy", "labels", "bf16", 32768, "two_pass").block_size == 8192


def test_tuned_chunks_never_exceed_the_row():
    assert table_choice(TABLE, "cross_entropy", "labels", "bf16", 1000).block_size == 1024
    assert table_choice(TABLE, "cross_entropy", "labels", "bf16", 5).block_size == 16


def test_no_entry_for_another_loss_dtype_or_variant():
    assert table_choice(TABLE, "forward_kl", "logits", "bf16", 32768) is None
    assert table_choice(TABLE, "cross_entropy", "labels", "fp32", 32768) is None
    assert table_choice(TABLE, "reverse_kl", "logits", "bf16", 32768, "fused") is None
    assert table_choice((), "cross_entropy", "labels", "bf16", 32768) is None


def test_tuned_config_reads_the_gpu_table_under_out(tmp_path):
    from perfutils.data.schema import data_path

    path = data_path(tmp_path, H100, "tuning")
    path.parent.mkdir()
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(TABLE[0]))
        writer.writeheader()
        writer.writerows(TABLE)
    assert tuned_config(str(tmp_path), H100, "cross_entropy", "labels", "bf16", 131072, "fused") == (32768, 16)
    # An entry with options is not a plain (block, warps) configuration; no table: the defaults.
    assert tuned_config(str(tmp_path), H100, "cross_entropy", "labels", "bf16", 32768, "split_row") == (None, None)
    assert tuned_config(str(tmp_path / "none"), H100, "cross_entropy", "labels", "bf16", 32768, "fused") == (None, None)


def test_committed_table_is_built_from_the_committed_studies():
    """tuning.csv is exactly what perfutils.studies.tuning builds from the recorded sweeps (not hand-edited, not stale)."""
    built = tuning.build_tuning_table(H100_DIR)
    committed = pd.read_csv(H100_DIR / "tuning.csv", keep_default_na=False)
    assert len(built) == len(committed)
    for column in ["loss", "target_format", "dtype", "variant", "options"]:
        assert list(built[column]) == list(committed[column]), column
    for column in ["vocab", "block_size", "num_warps"]:
        assert [int(v) for v in built[column]] == [int(v) for v in committed[column]], column
    assert [bool(v) for v in built["fastest"]] == [str(v).lower() == "true" for v in committed["fastest"]]
    assert built["ms_median"].tolist() == pytest.approx(committed["ms_median"].astype(float).tolist(), rel=1e-12)


def test_table_has_each_variants_best_and_one_fastest_per_shape():
    table = tuning.build_tuning_table(H100_DIR)
    assert not table.duplicated(tuning.KEY + ["variant"]).any()
    assert (table.groupby(tuning.KEY)["fastest"].sum() >= 1).all()
    rows = pd.concat([load_records(H100_DIR / f"{s}.csv") for s in tuning.STUDIES if (H100_DIR / f"{s}.csv").exists()])
    rows = rows[(rows["status"] == "ok") & (rows["tokens"] == tuning.TOKENS) & rows["variant"].isin(tuning.VARIANTS)]
    best = rows.groupby(tuning.KEY + ["variant"])["ms_median"].min()
    for _, entry_row in table.iterrows():
        key = tuple(entry_row[c] for c in tuning.KEY + ["variant"])
        assert entry_row["ms_median"] == pytest.approx(best[key])
        json.loads(entry_row["options"])


def test_explorations_combine_designs_with_their_provenance(tmp_path):
    from perfutils.studies.explorations import combine_designs
    from perfutils.data.records import load_metadata

    sources = {"lagged": ("lagged sweep", H100_DIR / "split_row_tuning.csv"),
               "wait": ("wait sweep", H100_DIR / "split_row_wait_tuning.csv")}
    path = combine_designs(sources, tmp_path / "designs.csv", "two sweeps")
    combined = pd.read_csv(path)
    assert list(combined.columns[:2]) == ["design", "loss"]
    for name, (_, source) in sources.items():
        assert (combined["design"] == name).sum() == len(pd.read_csv(source))
    meta = load_metadata(path)
    assert meta["designs"] == {"lagged": "lagged sweep", "wait": "wait sweep"}
    assert meta["sources"]["wait"]["file"] == "split_row_wait_tuning.csv" and meta["sources"]["wait"]["metadata"]["gpu_name"]
    with pytest.raises(FileExistsError):
        combine_designs(sources, path, "again")
    with pytest.raises(ValueError, match="no designs"):
        combine_designs({}, tmp_path / "x.csv", "none")


def test_benchmark_table_is_generated_from_the_data():
    """The earlier kernel-only benchmark's table (the README now shows the vocab sweep's: tests/test_vocab_sweep.py)
    still builds from the committed benchmark.csv."""
    from perfutils.plots.summary import benchmark_table

    text = benchmark_table(H100_DIR)
    assert text.startswith("| loss × vocab |") and "benchmark.csv" in text
