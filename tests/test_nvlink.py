"""The NVLink study (perfutils.studies.nvlink): its kernels write what they claim, under the Triton interpreter; the
whole study runs in two processes on the CPU (gloo, shared files) and checks what arrived; the model costs the
exchange's stores at a measured link, found for a GPU pair joined by as many NVLinks."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"

import importlib  # noqa: E402
import json  # noqa: E402
from dataclasses import replace  # noqa: E402

import pandas as pd  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

import perfutils.lab_kernels.microbench as microbench  # noqa: E402
from perfutils.model import predict as model  # noqa: E402

if type(microbench.copy_kernel).__name__ != "InterpretedFunction":
    microbench = importlib.reload(microbench)

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")


def test_summary_words_write_exactly_the_exchange_words():
    """Every word the exchange's layout names holds its value, and no other word is touched (a benchmark of stores
    that skipped some would report a fake rate)."""
    rows, chunks, lanes, width, first = 37, 4, 8, 3, 1000
    buffer = torch.zeros(rows * width * lanes + 8, dtype=torch.int64)
    table = torch.tensor([0, buffer.data_ptr()], dtype=torch.int64)
    microbench.launch_summary_words(table, 1, n_rows=rows, n_slots=5, num_chunks=chunks, lanes=lanes, width=width,
                                    first_value=first)
    offsets, values = microbench.summary_word_offsets(rows, chunks, lanes, width)
    assert len(set(offsets.tolist())) == rows * chunks * width
    assert torch.equal(buffer[offsets], values + first)
    untouched = torch.ones_like(buffer, dtype=torch.bool)
    untouched[offsets] = False
    assert not buffer[untouched].any()
    with pytest.raises(ValueError, match="lanes"):
        microbench.launch_summary_words(table, 1, n_rows=rows, n_slots=5, num_chunks=8, lanes=4, width=width)


def test_copy_to_an_address_copies_into_that_buffer_only():
    src = torch.arange(3 * 64 + 17, dtype=torch.int64) * 7 - 5
    first, second = torch.zeros(300, dtype=torch.int64), torch.zeros(300, dtype=torch.int64)
    table = torch.tensor([first.data_ptr(), second.data_ptr()], dtype=torch.int64)
    microbench.launch_copy_to(src, table, 1, block_size=64, num_warps=1)
    assert torch.equal(second[:src.numel()], src) and not second[src.numel():].any() and not first.any()
    with pytest.raises(ValueError, match="dtype"):
        microbench.launch_copy_to(src.float(), table, 1)


def test_ping_pong_gives_up_when_the_peer_never_answers():
    """One process alone: every round's wait ends at the poll limit, and the count says no answer arrived (the GPU
    study records such a row as wrong instead of hanging)."""
    own, other = torch.zeros(4, dtype=torch.int64), torch.zeros(4, dtype=torch.int64)
    table = torch.tensor([own.data_ptr(), other.data_ptr()], dtype=torch.int64)
    out = torch.zeros(2, dtype=torch.int64)
    microbench.launch_ping_pong(table, 0, out, rounds=3, first_value=0, poll_limit=5)
    assert out.tolist() == [0, 5]
    assert other[0] == 3  # rank 0 served every round
    with pytest.raises(ValueError, match="rank"):
        microbench.launch_ping_pong(table, 2, out, rounds=1, first_value=0, poll_limit=1)


def test_the_study_runs_on_two_cpu_processes_and_checks_what_arrived(tmp_path):
    """The harness end to end (gloo, shared files, the interpreter): every row present, every check passed, the
    round trip answered; the times mean nothing on a CPU."""
    from perfutils.studies import nvlink

    assert nvlink.main(["--device", "cpu", "--out", str(tmp_path), "--reps", "1", "--copy-words", "512",
                        "--rows", "16", "--rounds", "2"]) == 0
    frame = pd.read_csv(tmp_path / "cpu" / "nvlink.csv")
    assert list(frame.columns) == nvlink.COLUMNS
    assert set(zip(frame["measure"], frame["directions"])) == {
        ("copy_engine", "one_way"), ("copy_engine", "both_ways"), ("sm_stores", "one_way"),
        ("sm_stores", "both_ways"), ("summary_words", "both_ways"), ("summary_words_local", "both_ways"),
        ("round_trip", "both_ways")}
    assert (frame["status"] == "ok").all(), frame[["measure", "status", "check"]]
    assert frame.loc[frame["measure"] == "round_trip", "ns_per_round_trip"].iloc[0] > 0
    meta = json.loads((tmp_path / "cpu" / "nvlink.json").read_text())
    assert meta["environment"]["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1" and len(meta["ranks"]) == 2


def _link_folder(root, name, gbps, trip_ns, links, gpu="NVIDIA H200"):
    folder = root / name
    folder.mkdir()
    pd.DataFrame([{"measure": "summary_words", "directions": "both_ways", "gbps": gbps, "ns_per_round_trip": None,
                   "status": "ok", "gpu_name": gpu},
                  {"measure": "round_trip", "directions": "both_ways", "gbps": None, "ns_per_round_trip": trip_ns,
                   "status": "ok", "gpu_name": gpu}]).to_csv(folder / "nvlink.csv", index=False)
    (folder / "nvlink.json").write_text(json.dumps({"topology": f"GPU0\t X \tNV{links}\nGPU1\tNV{links}\t X"}))
    return folder


def test_link_of_a_folder_is_its_own_or_a_pair_with_as_many_nvlinks(tmp_path):
    _link_folder(tmp_path, "b-h200", 65.0, 1300.0, 18)
    _link_folder(tmp_path, "a-other", 20.0, 900.0, 4)
    own = model.link_of(tmp_path / "b-h200")
    assert (own.store_gbps, own.round_trip_ns, own.links, own.folder) == (65.0, 1300.0, 18, "b-h200")
    h100 = tmp_path / "h100"
    h100.mkdir()
    (h100 / "tensor_parallel.json").write_text(json.dumps({"topology": "GPU0\t X \tNV18\nGPU1\tNV18\t X"}))
    assert model.link_of(h100).folder == "b-h200"  # not the 4-link pair listed first
    (h100 / "tensor_parallel.json").write_text(json.dumps({"topology": "GPU0\t X \tNV12"}))
    assert model.link_of(h100) is None
    (h100 / "tensor_parallel.json").write_text(json.dumps({}))
    assert model.link_of(h100) is None  # no topology recorded: no pair is known to match


def test_the_exchange_stores_cost_nvlink_time_only_with_a_measured_link(tmp_path):
    """with_exchange carries the bytes a rank stores into its peer; predict costs them at the link's rate (never
    faster than without them, slower as the link slows) and only where the GPU has a link; without_exchange takes
    them out again."""
    gpu = model.gpu_from_folder("data/h100-sxm-80gb")
    rank = model.LaunchConfig(study="s", config_key="k", variant="plan", loss="cross_entropy", target_format="labels",
                              tokens=4096, vocab=65536, dtype="bf16",
                              passes=(model.KernelPass("main", programs=1184, tile=4096, num_warps=4, resident=9,
                                                       steps=56, load_bytes_per_step=8192,
                                                       dram_bytes=4096 * 65536 * 4.0, elements=4096 * 65536.0),))
    both = model.with_exchange(rank, tp=2, num_chunks=16)
    sent = model.exchange_bytes(loss="cross_entropy", target_format="labels", tokens=4096, vocab=131072, tp=2,
                                num_chunks=16)["sent"]
    assert both.exchange_link_bytes == sent and both.passes[0].link_bytes == sent
    assert "nvlink" not in model.predict(both, gpu).breakdown  # no link: nothing costed
    fast = replace(gpu, link=model.Link(400.0, 1000.0, "g", 18, "f"))
    slow = replace(gpu, link=model.Link(0.5, 1000.0, "g", 18, "f"))
    assert model.predict(both, fast).breakdown["nvlink"] == pytest.approx(sent / 400e9 * 1e3)
    assert model.predict(both, gpu).ms <= model.predict(both, fast).ms <= model.predict(both, slow).ms
    assert model.predict(both, slow).bound == "nvlink"  # a link this slow is what binds
    assert model.without_exchange(both) == rank


def test_a_new_recording_keeps_the_earlier_one_aside(tmp_path):
    """Measuring the link (or any table written with overwrite) again never loses the rows it replaces: they move to
    <stem>.replaced-<UTC>.*."""
    from perfutils.data.store import keep_aside

    path = tmp_path / "nvlink.csv"
    keep_aside(path)  # nothing there: nothing to keep
    path.write_text("measure\ncopy_engine\n")
    path.with_suffix(".json").write_text("{}")
    keep_aside(path)
    kept = sorted(p.name for p in tmp_path.iterdir())
    assert len(kept) == 2 and all(".replaced-" in name for name in kept)
    assert (tmp_path / kept[0]).read_text() == "measure\ncopy_engine\n"
