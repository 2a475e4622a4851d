"""kernels.autotune: candidates, the search's bookkeeping and the on-disk cache (no GPU: timing is faked)."""

from __future__ import annotations

import json

import pytest
import torch

from kernels import autotune
from kernels.auto import Choice
from kernels.problem import build_problem


def problem(n_rows=100, n_cols=50257, fmt="labels", mask=False):
    logits = torch.zeros(n_rows, n_cols, dtype=torch.bfloat16)
    target = torch.zeros(n_rows, dtype=torch.long) if fmt == "labels" else torch.zeros_like(logits)
    loss = "cross_entropy" if fmt == "labels" else "reverse_kl"
    return build_problem(logits, target, loss=loss, target_format=fmt, grad_output=1.0, ignore_index=-100,
                         loss_mask=torch.ones(n_rows, dtype=torch.bool) if mask else None)


def test_shape_class_keys_vocab_exactly_and_tokens_by_power_of_two():
    assert autotune.shape_class(problem(100)) == autotune.shape_class(problem(500))  # both <= 512 tokens
    assert autotune.shape_class(problem(600)) != autotune.shape_class(problem(500))
    assert autotune.shape_class(problem(100, 50304)) != autotune.shape_class(problem(100, 50257))
    assert autotune.shape_class(problem(mask=True)) != autotune.shape_class(problem())


def test_candidates_start_with_the_seed_and_stay_within_limits():
    seed = Choice("split_row", 8192, 4, {}, source="tuning table")
    found = autotune.candidates(problem(n_cols=151936), seed)
    assert found[0] == ("split_row", 8192, 4, {})
    assert len(found) == len(set(map(repr, found)))  # no duplicates
    assert all(-(-151936 // block) <= autotune.MAX_CHUNKS for variant, block, _, options in found if not options)
    assert not any(options == {"split": False} for *_, options in found)  # rows too wide for one program
    small = autotune.candidates(problem(n_cols=32000), None)
    assert ("split_row", 32768, 32, {"split": False}) in small and ("split_row", 16384, 16, {"split": False}) in small


def test_search_keeps_the_fastest_and_records_failures(monkeypatch):
    times = iter([1.0, 0.5, 2.0, 0.7, 0.9, 3.0, 1.1])

    def fake_planner(problem, block_size, num_warps, **options):
        if block_size == 2048:
            raise RuntimeError("does not compile")
        return (block_size, num_warps, tuple(options))

    monkeypatch.setattr(autotune, "_time_plan", lambda plan, repeats: next(times))
    entry = autotune._search(problem(n_cols=50257), None, {"split_row": fake_planner})
    ok = [c for c in entry["candidates"] if "ms" in c]
    assert entry["ms"] == min(c["ms"] for c in ok) and entry["source"] == "first-call search"
    assert any("does not compile" in c.get("error", "") for c in entry["candidates"])


def test_disk_cache_merges_entries_atomically(tmp_path):
    path = tmp_path / "gpu" / "triton-x.json"
    autotune._write(path, "a", {"variant": "fused", "block_size": 16, "num_warps": 1, "options": {}, "source": "s"})
    autotune._write(path, "b", {"variant": "split_row", "block_size": 32, "num_warps": 2, "options": {}, "source": "s"})
    stored = json.loads(path.read_text())
    assert set(stored) == {"a", "b"} and stored["b"]["block_size"] == 32
    assert not list(path.parent.glob(".tmp-*"))  # no temporary file left behind
    path.write_text("{not json")
    assert autotune._read(path) == {}  # a damaged cache is ignored, never fatal


@pytest.mark.parametrize("value, expected", [("0", False), ("off", False), ("1", True), ("", True)])
def test_autotune_can_be_switched_off(monkeypatch, value, expected):
    monkeypatch.setenv("FUSED_LOSS_AUTOTUNE", value)
    assert autotune.enabled() is expected
