"""perfutils.data.store and records: atomic, resumable, never-mixing data files (CPU only, no timing)."""

from __future__ import annotations

import json
import math
import os

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from perfutils.data import store as store_module
from perfutils.data.records import check_single_gpu, load_metadata, load_records
from perfutils.data.schema import (COLUMNS, SCHEMA_VERSION, DataFileError, IncompatibleDataError, config_key,
                                      data_path, gpu_slug)
from perfutils.data.store import ResultStore

H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"


def meta(gpu: str = H100, **extra) -> dict:
    return {"gpu_name": gpu, "device": "cuda", "compute_capability": [9, 0], "parameters": {"seed": 0}, **extra}


def row(tokens: int = 1024, status: str = "ok", **extra) -> dict:
    base = {
        "loss": "cross_entropy",
        "target_format": "labels",
        "variant": "fused",
        "dtype": "bf16",
        "tokens": tokens,
        "vocab": 32000,
        "block_size": 4096,
        "num_warps": 8,
        "ms_median": 0.25 if status != "error" else None,
        "ms_p20": 0.24 if status != "error" else None,
        "ms_p80": 0.26 if status != "error" else None,
        "bytes_min": 4 * tokens * 32000,
        "gbps": 1234.5,
        "pct_of_copy": 41.2,
        "n_regs": 128,
        "spill_bytes": 0,
        "shared_bytes": 1024,
        "occupancy": 0.25,
        "blocks_per_sm": 2,
        "limiter": "registers",
        "max_rel_err": 1e-4,
        "status": status,
        "error": "RuntimeError: out of resource" if status == "error" else None,
    }
    base.update(extra)
    return base


@pytest.fixture
def store(tmp_path):
    return ResultStore(tmp_path / "h100-sxm-80gb" / "study.csv", meta())


# ---- writing and reading -------------------------------------------------------------------


def test_append_writes_schema_columns_and_sidecar(store):
    assert store.append([row(1024), row(2048, compile_ms=812.5)]) == 2
    frame = load_records(store.path)
    assert list(frame.columns[: len(COLUMNS)]) == list(COLUMNS)
    assert "compile_ms" in frame.columns  # optional extra column
    assert frame["config_key"].tolist() == [config_key(row(1024)), config_key(row(2048))]
    assert set(frame["gpu_name"]) == {H100} and set(frame["study"]) == {"study"}
    sidecar = load_metadata(store.path)
    assert sidecar["schema_version"] == SCHEMA_VERSION
    assert sidecar["gpu_name"] == H100 and sidecar["parameters"] == {"seed": 0}
    assert frame.attrs["metadata"] == sidecar


def test_values_round_trip_exactly(store):
    store.append([row(1024, ms_median=1 / 3, gbps=0.1, passes=[{"name": "stats", "n_regs": 40}], block_size=None)])
    frame = load_records(store.path)
    assert frame.at[0, "ms_median"] == 1 / 3 and frame.at[0, "gbps"] == 0.1
    assert frame["tokens"].dtype == "int64" and frame["n_regs"].dtype == "Int64"
    assert pd.isna(frame.at[0, "block_size"])  # "auto": the variant chose
    assert json.loads(frame.at[0, "passes"]) == [{"name": "stats", "n_regs": 40}]
    assert frame.at[0, "error"] is None


def test_append_keeps_existing_bytes_and_pads_new_columns(store):
    store.append([row(1024)])
    before = store.path.read_bytes()
    store.append([row(2048)])
    assert store.path.read_bytes().startswith(before)  # old rows copied byte for byte
    store.append([row(4096, peak_mem_bytes=123)])
    frame = load_records(store.path)
    assert frame["peak_mem_bytes"].isna().tolist() == [True, True, False]
    assert len(frame) == 3


def test_crash_before_replace_leaves_original_intact(store, monkeypatch):
    store.append([row(1024)])
    original = store.path.read_bytes()

    def killed(*args, **kwargs):
        raise KeyboardInterrupt  # the process dies between writing the temp file and renaming it

    monkeypatch.setattr(store_module.os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        store.append([row(2048)])
    monkeypatch.undo()
    assert store.path.read_bytes() == original
    assert sorted(p.name for p in store.path.parent.iterdir()) == ["study.csv", "study.json"]  # no temp left
    assert len(load_records(store.path)) == 1


def test_crash_while_writing_temp_leaves_original_intact(store, monkeypatch):
    store.append([row(1024)])
    original = store.path.read_bytes()
    monkeypatch.setattr(store_module.os, "fsync", lambda fd: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError, match="disk full"):
        store.append([row(2048)])
    monkeypatch.undo()
    assert store.path.read_bytes() == original


def test_rows_need_configuration_and_valid_status(store):
    with pytest.raises(ValueError, match="status 'maybe'"):
        store.append([row(status="maybe")])
    with pytest.raises(ValueError, match="lacks required values"):
        store.append([{k: v for k, v in row().items() if k != "vocab"}])
    with pytest.raises(ValueError, match="no error message"):
        store.append([row(status="error", error=None)])
    with pytest.raises(TypeError, match="single row"):
        store.append(row())
    with pytest.raises(TypeError, match="column 'ms_median'"):
        store.append([row(ms_median=object())])
    assert not store.path.exists()


def test_bad_store_arguments(tmp_path):
    with pytest.raises(TypeError, match="path_csv"):
        ResultStore(123)
    with pytest.raises(ValueError, match=r"\.csv"):
        ResultStore(tmp_path / "x.txt")
    with pytest.raises(TypeError, match="allow_mixed"):
        ResultStore(tmp_path / "x.csv", allow_mixed="yes")


# ---- resume and duplicates -----------------------------------------------------------------


def test_done_keys_counts_final_outcomes(store):
    assert store.done_keys() == set()
    store.append([row(1, "ok"), row(2, "wrong", error="max_rel_err 0.5"), row(3, "error")])
    keys = {config_key(row(n)) for n in (1, 2, 3)}
    assert store.done_keys() == keys
    assert store.done_keys(retry_errors=True) == keys - {config_key(row(3))}


def test_measurement_is_never_recorded_twice(store):
    store.append([row(1024)])
    with pytest.raises(ValueError, match="already has a measurement"):
        store.append([row(1024)])
    with pytest.raises(ValueError, match="twice in one append"):
        store.append([row(2048), row(2048)])
    assert len(load_records(store.path)) == 1


def test_error_row_may_be_retried_and_is_kept(store):
    store.append([row(1024, "error")])
    store.append([row(1024, "ok")])
    frame = load_records(store.path)
    assert frame["status"].tolist() == ["error", "ok"]


def test_second_session_is_added_to_the_sidecar(store):
    store.append([row(1)])
    later = ResultStore(store.path, meta(git_commit="abc"))
    later.append([row(2)])
    sidecar = load_metadata(store.path)
    assert sidecar.get("git_commit") is None  # the first session stays on top
    assert [s["git_commit"] for s in sidecar["sessions"]] == ["abc"]


# ---- no silent mixing ----------------------------------------------------------------------


def test_refuses_rows_from_another_gpu(store):
    store.append([row(1)])
    other = ResultStore(store.path, meta(A100))
    with pytest.raises(IncompatibleDataError) as caught:
        other.append([row(2)])
    assert A100 in str(caught.value) and H100 in str(caught.value) and "allow_mixed" in str(caught.value)
    with pytest.raises(IncompatibleDataError):
        other.check_compatible()
    assert len(load_records(store.path)) == 1

    ResultStore(store.path, meta(A100), allow_mixed=True).append([row(2)])
    frame = load_records(store.path)
    assert sorted(frame["gpu_name"]) == sorted([H100, A100])
    assert load_metadata(store.path)["mixed_gpus"] == sorted([H100, A100])
    with pytest.raises(IncompatibleDataError, match="mixes GPUs"):
        check_single_gpu(frame)
    assert check_single_gpu(frame, allow_mixed=True) == f"{A100} + {H100}"
    assert check_single_gpu(frame[frame.gpu_name == H100]) == H100


def test_row_gpu_must_match_session(store):
    with pytest.raises(IncompatibleDataError, match=A100):
        store.append([row(1, gpu_name=A100)])


def test_refuses_another_schema(tmp_path):
    path = tmp_path / "old.csv"
    old_columns = [c for c in COLUMNS if c not in ("limiter", "occupancy")]
    values = {**row(1), "study": "old", "gpu_name": H100, "timestamp_utc": "2025-01-01T00:00:00Z", "config_key": "k"}
    frame = pd.DataFrame([{c: values[c] for c in old_columns}])
    frame.to_csv(path, index=False)
    path.with_suffix(".json").write_text(json.dumps({"schema_version": 0, "gpu_name": H100}))
    before = path.read_bytes()
    store = ResultStore(path, meta())
    with pytest.raises(IncompatibleDataError) as caught:
        store.append([row(2)])
    message = str(caught.value)
    assert "schema version 0" in message and f"schema version {SCHEMA_VERSION}" in message and "limiter" in message
    assert path.read_bytes() == before
    with pytest.raises(DataFileError, match="lacks required columns"):
        load_records(path)

    ResultStore(path, meta(), allow_mixed=True).append([row(2)])
    frame = load_records(path)
    assert len(frame) == 2 and pd.isna(frame.at[0, "occupancy"]) and frame.at[1, "limiter"] == "registers"


def test_overwrite_moves_old_files_aside(store):
    store.append([row(1)])
    old_bytes = store.path.read_bytes()
    fresh = ResultStore(store.path, meta(A100), overwrite=True)
    assert fresh.done_keys() == set()
    fresh.append([row(2)])
    fresh.append([row(3)])  # moved aside once, not on every append
    assert load_records(store.path)["tokens"].tolist() == [2, 3]
    assert len(fresh.replaced) == 2 and fresh.replaced[0].read_bytes() == old_bytes


# ---- loading broken files ------------------------------------------------------------------


def test_missing_file_says_how_to_produce_it(tmp_path):
    with pytest.raises(FileNotFoundError) as caught:
        load_records(tmp_path / "h100" / "nothing.csv")
    assert "nothing.csv" in str(caught.value) and "python -m perfutils sweep" in str(caught.value)


def _valid_csv(tmp_path) -> tuple[ResultStore, str]:
    store = ResultStore(tmp_path / "s.csv", meta())
    store.append([row(1), row(2, error='has "quotes", commas\nand a newline', status="error")])
    return store, store.path.read_text()


@pytest.mark.parametrize(
    "corrupt, message",
    [
        (lambda text: "", "is empty"),
        (lambda text: text.splitlines(keepends=True)[0], "header but no rows"),
        (lambda text: text[:-25], "does not end with a newline"),
        (lambda text: text + "cross_entropy,labels,fused\n", "fields but the header has"),
        (lambda text: text.replace("study,", "studdy,", 1), "lacks required columns"),
        (lambda text: text.replace(",0.25,", ",fast,", 1), "'ms_median' holds 'fast'"),
        (lambda text: text.replace(",ok,", ",okay,", 1), "status 'okay'"),
        (lambda text: text.replace(",1,32000,", ",,32000,", 1), "'tokens' is empty"),
    ],
)
def test_corrupt_csv_is_reported_by_name(tmp_path, corrupt, message):
    store, text = _valid_csv(tmp_path)
    store.path.write_text(corrupt(text))
    with pytest.raises(DataFileError, match=message) as caught:
        load_records(store.path)
    assert str(store.path) in str(caught.value)


def test_corrupt_file_is_never_appended_to(tmp_path):
    store, text = _valid_csv(tmp_path)
    store.path.write_text(text[:-25])
    with pytest.raises(DataFileError, match="does not end with a newline"):
        ResultStore(store.path, meta()).append([row(3)])
    with pytest.raises(DataFileError):
        store.done_keys()
    assert store.path.read_text() == text[:-25]


def test_sidecar_problems(tmp_path):
    store, _ = _valid_csv(tmp_path)
    store.metadata_path.write_text('{"gpu_name": ')
    with pytest.raises(DataFileError, match="not valid JSON"):
        load_records(store.path)
    store.metadata_path.unlink()
    with pytest.raises(FileNotFoundError, match="sidecar"):
        load_records(store.path)
    assert len(load_records(store.path, require_metadata=False)) == 2


def test_check_single_gpu_arguments():
    with pytest.raises(TypeError, match="DataFrame"):
        check_single_gpu([1, 2])
    with pytest.raises(DataFileError, match="gpu_name"):
        check_single_gpu(pd.DataFrame({"x": [1]}))


# ---- names ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, slug",
    [
        ("NVIDIA H100 80GB HBM3", "h100-sxm-80gb"),
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("NVIDIA H100 NVL", "h100-nvl"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA A100-SXM4-80GB", "a100-sxm4-80gb"),
        ("NVIDIA GeForce RTX 4090", "geforce-rtx-4090"),
        (None, "cpu"),
    ],
)
def test_gpu_slug(name, slug):
    assert gpu_slug(name) == slug


def test_data_path_and_config_key_validate():
    assert data_path("data", H100, "block_size") == data_path("data", H100, "block_size")
    assert str(data_path("data", H100, "block_size")) == os.path.join("data", "h100-sxm-80gb", "block_size.csv")
    with pytest.raises(ValueError, match="study"):
        data_path("data", H100, "../escape")
    with pytest.raises(ValueError, match="lacks"):
        config_key({"loss": "cross_entropy"})
    with pytest.raises(TypeError, match="mapping"):
        config_key(["loss"])
    assert config_key(row(block_size=None)).endswith("block_size=auto;num_warps=8")


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    message=st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1, max_size=60),
    value=st.floats(allow_nan=False, allow_infinity=True),
)
def test_any_text_and_float_round_trip(tmp_path_factory, message, value):
    store = ResultStore(tmp_path_factory.mktemp("rt") / "rt.csv", meta())
    store.append([row(1, status="error", error=message, gbps=value)])
    frame = load_records(store.path)
    assert frame.at[0, "error"] == message
    got = frame.at[0, "gbps"]
    assert got == value or (math.isinf(value) and math.isinf(got) and (got > 0) == (value > 0))


# ---- metadata --------------------------------------------------------------------------------


def test_collect_metadata_records_the_code_commit_it_is_given(monkeypatch):
    """A tree copied to the GPU machine with an old .git names its real commit through $FUSED_LOSS_CODE_COMMIT; a value
    that is not a commit hash is refused before anything is measured."""
    from perfutils.data.metadata import CODE_COMMIT_ENV, collect_metadata

    monkeypatch.delenv(CODE_COMMIT_ENV, raising=False)
    assert "code_commit" not in collect_metadata({})
    monkeypatch.setenv(CODE_COMMIT_ENV, "e4f1f635d3e01136445367f1dc5c5749ca76c861")
    assert collect_metadata({})["code_commit"] == "e4f1f635d3e01136445367f1dc5c5749ca76c861"
    monkeypatch.setenv(CODE_COMMIT_ENV, "HEAD")
    with pytest.raises(ValueError, match=CODE_COMMIT_ENV):
        collect_metadata({})


def test_collect_metadata_works_without_a_gpu():
    import torch

    from perfutils.data.metadata import collect_metadata, sources_digest

    info = collect_metadata({"tokens": [1, 2]}, 3000.0)
    assert info["parameters"] == {"tokens": [1, 2]} and info["copy_gbps"] == 3000.0
    assert info["python_version"] and info["torch_version"] == torch.__version__
    assert info["timestamp_utc"].endswith("Z")
    assert info["kernel_sources"] == sources_digest()  # the kernels on disk, whatever .git says
    if not torch.cuda.is_available():
        assert info["device"] == "cpu" and info["gpu_name"] is None and info["sm_count"] is None
    json.dumps(info)  # goes straight into the sidecar
    with pytest.raises(ValueError, match="copy_gbps"):
        collect_metadata({}, -1.0)
    with pytest.raises(TypeError, match="parameters"):
        collect_metadata([1, 2])
    with pytest.raises(ValueError, match="parameters"):
        collect_metadata({"x": float("nan")})


def test_a_table_written_over_keeps_the_one_it_replaces(tmp_path):
    """write_table refuses to replace a table unless told to; told to, the earlier table and sidecar move aside to
    <stem>.replaced-<UTC>.* (a measured table is never lost), unless the caller carried every old row over."""
    path = tmp_path / "ceilings.csv"
    store_module.write_table(pd.DataFrame({"value": [1.0]}), path, {"run": 1})
    with pytest.raises(FileExistsError):
        store_module.write_table(pd.DataFrame({"value": [2.0]}), path, {"run": 2})
    store_module.write_table(pd.DataFrame({"value": [2.0]}), path, {"run": 2}, overwrite=True)
    kept = sorted(p.name for p in tmp_path.glob("ceilings.replaced-*"))
    assert len(kept) == 2 and pd.read_csv(tmp_path / kept[0])["value"].tolist() == [1.0]
    assert json.loads((tmp_path / kept[1]).read_text())["run"] == 1
    assert pd.read_csv(path)["value"].tolist() == [2.0]
    store_module.write_table(pd.DataFrame({"value": [1.0, 2.0, 3.0]}), path, {"run": 3}, overwrite=True,
                             keep_old=False)
    assert len(list(tmp_path.glob("ceilings.replaced-*"))) == 2
