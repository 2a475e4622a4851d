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


H200_DIR = H100_DIR.parent / "h200"


def test_a_kernel_that_cannot_take_the_call_is_passed_over():
    table = [entry("resident_row", 32768, 0.15, 32768, 8), entry("split_row", 32768, 0.18, 8192, 4),
             entry("fused", 49152, 0.19, 16384, 16, json.dumps({"resident": True}))]
    assert table_choice(table, "cross_entropy", "labels", "bf16", 32000).variant == "resident_row"
    choice = table_choice(table, "cross_entropy", "labels", "bf16", 32001, unfit=("resident_row",))
    assert (choice.variant, choice.block_size) == ("split_row", 8192)
    # the earlier spelling of the resident row is the same kernel
    assert table_choice(table, "cross_entropy", "labels", "bf16", 49152, unfit=("resident_row",)).variant == "split_row"


def search_row(vocab, plan, ms, stamp, variant="public", tokens=4096, status="ok"):
    return dict(loss="forward_kl", target_format="logits", dtype="bf16", vocab=vocab, tokens=tokens, variant=variant,
                status=status, ms_median=ms, pct_of_copy=70.0, gpu_name="NVIDIA H200", timestamp_utc=stamp,
                plan_config=json.dumps(plan) if plan else "")


def test_search_table_keeps_each_cells_last_search_choice(tmp_path, monkeypatch):
    lagged = {"variant": "split_row", "block_size": 4096, "num_warps": 4, "options": {"maxnreg": 96},
              "source": "first-call search"}
    rows = [search_row(32000, {**lagged, "block_size": 8192}, 0.30, "2026-11-25T00:00:00Z"),
            search_row(32000, lagged, 0.27, "2026-11-28T00:00:00Z"),  # measured again: this choice counts
            search_row(65536, {**lagged, "source": "caller"}, 0.5, "2026-11-28T00:00:00Z"),  # not the search's
            search_row(65536, lagged, 0.52, "2026-11-28T00:00:00Z", variant="plan"),
            search_row(131072, lagged, 1.0, "2026-11-28T00:00:00Z", tokens=1024),
            search_row(131072, lagged, 1.0, "2026-11-28T00:00:00Z", status="error")]
    monkeypatch.setattr(tuning, "load_records", lambda path: pd.DataFrame(rows))
    table = tuning.build_search_table(tmp_path)
    assert table[["vocab", "variant", "block_size", "num_warps", "options", "fastest"]].values.tolist() == [
        [32000, "split_row", 4096, 4, '{"maxnreg": 96}', True]]
    assert table["ms_median"].tolist() == [0.27]
    monkeypatch.setattr(tuning, "load_records", lambda path: pd.DataFrame(rows[2:]))
    with pytest.raises(ValueError, match="first-call search chose"):
        tuning.build_search_table(tmp_path)


def test_h200_table_is_its_vocab_sweeps_search_choices():
    """The H200's tuning.csv is what build_search_table makes of its committed vocab sweep (not hand-edited)."""
    built = tuning.build_search_table(H200_DIR)
    committed = pd.read_csv(H200_DIR / "tuning.csv", keep_default_na=False)
    for column in ["loss", "target_format", "dtype", "variant", "options"]:
        assert list(built[column]) == list(committed[column]), column
    for column in ["vocab", "block_size", "num_warps"]:
        assert [int(v) for v in built[column]] == [int(v) for v in committed[column]], column
    assert built["ms_median"].tolist() == pytest.approx(committed["ms_median"].astype(float).tolist(), rel=1e-12)
    assert json.loads((H200_DIR / "tuning.json").read_text())["derived_from"] == ["vocab_sweep.csv"]


def test_every_h200_entry_plans_at_its_own_vocab():
    """Each entry is a configuration its kernel's planner takes, options (register caps) included."""
    import torch

    from kernels.autotune import PLANNERS, canonical_variant
    from kernels.problem import build_problem

    for row in pd.read_csv(H200_DIR / "tuning.csv", keep_default_na=False).itertuples():
        logits = torch.zeros(4, row.vocab, dtype=torch.bfloat16)
        target = (torch.zeros(4, dtype=torch.int64) if row.target_format == "labels" else torch.zeros_like(logits))
        problem = build_problem(logits, target, loss=row.loss, target_format=row.target_format, grad_output=1.0,
                                ignore_index=-100, loss_mask=None)
        variant, options = canonical_variant(row.variant, json.loads(row.options))
        plan = PLANNERS[variant](problem, int(row.block_size), int(row.num_warps), **options)
        assert plan.variant == variant, row
