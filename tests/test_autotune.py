"""kernels.autotune: candidates, the search's bookkeeping and the on-disk cache (no GPU: timing is faked)."""

from __future__ import annotations

import json

import pytest
import torch

from kernels import autotune
from kernels.autotune import Choice
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


def test_unaligned_rows_are_a_shape_class_of_their_own_without_the_resident_row():
    """A choice searched on aligned rows is never applied to a view at an odd offset (peeled; no resident row)."""
    wide = problem(n_cols=32008)
    aligned, unaligned = (build_problem(logits, torch.zeros(100, dtype=torch.long), loss="cross_entropy",
                                        target_format="labels", grad_output=1.0, ignore_index=-100, loss_mask=None)
                          for logits in (wide.logits[:, :32000].contiguous(), wide.logits[:, 1:32001]))
    assert aligned.rows_aligned() and not unaligned.rows_aligned()
    assert autotune.shape_class(aligned) != autotune.shape_class(unaligned)
    assert ("resident_row", 32768, 16, {}) in autotune.candidates(aligned, None)
    assert not any(variant == "resident_row" for variant, *_ in autotune.candidates(unaligned, None))


def test_candidates_start_with_the_seed_and_stay_within_limits():
    seed = Choice("split_row", 8192, 4, {}, source="tuning table")
    found = autotune.candidates(problem(n_cols=151936), seed)
    assert found[0] == ("split_row", 8192, 4, {})
    assert len(found) == len(set(map(repr, found)))  # no duplicates
    assert all(-(-151936 // block) <= autotune.MAX_CHUNKS for variant, block, _, options in found if not options)
    assert not any(variant == "fused" for variant, *_ in found)  # rows too wide for one program
    small = autotune.candidates(problem(n_cols=32000), None)
    assert ("fused", 32768, 32, {}) in small and ("fused", 16384, 16, {}) in small


class FakePlan:
    def __init__(self, block_size, num_warps, options):
        self.key = (block_size, num_warps, tuple(sorted(options.items())))
        lagged = options.get("split", True) and block_size < 50257
        self.config = {"schedule": "lagged"} if lagged else {"mode": "row"}
        self.launches = [type("FakeLaunch", (), {"compiled": f"kernel {block_size}/{num_warps}"})()]
        self.buffers = [None, torch.empty(4, 8), None]  # (workspace, gradient, loss): the gradient is released and kept


def fake_planner(problem, block_size, num_warps, **options):
    if block_size == 2048 and "maxnreg" not in options:
        raise RuntimeError("does not compile")
    return FakePlan(block_size, num_warps, options)


def test_search_keeps_the_fastest_and_records_failures(monkeypatch):
    times = iter([1.0, 0.5, 2.0, 0.7, 0.9, 3.0, 1.1])
    monkeypatch.setattr(autotune, "_time_plan", lambda plan, repeats: next(times))
    monkeypatch.setattr(autotune, "capped_registers", lambda compiled, steps: [])
    entry, plan = autotune._search(problem(n_cols=50257), None, {"split_row": fake_planner})
    ok = [c for c in entry["candidates"] if "ms" in c]
    assert entry["ms"] == min(c["ms"] for c in ok) and entry["source"] == "first-call search"
    assert any("does not compile" in c.get("error", "") for c in entry["candidates"])
    # the plan handed back is the one timed fastest, its gradient's memory given back after the others ran
    assert plan.key == (entry["block_size"], entry["num_warps"], tuple(sorted(entry["options"].items())))
    assert plan.buffers[1].untyped_storage().nbytes() == 4 * 8 * 4


def test_search_times_the_two_fastest_lagged_kernels_under_register_caps(monkeypatch):
    """The two fastest lagged candidates are timed again with every cap capped_registers offers (up to three more
    programs per SM for the fastest, two for the runner-up); a capped twin that is fastest wins, with its maxnreg in
    the options a later call plans with, also when its kernel ranked second uncapped."""
    base = {("split_row", 4096, 4): 0.55, ("split_row", 8192, 4): 0.50, ("split_row", 8192, 8): 0.60,
            ("split_row", 2048, 4): 0.40}

    def fake_time(plan, repeats):
        block, warps, options = plan.key
        cap = dict(options).get("maxnreg")
        if cap is not None:
            return {96: 0.52, 80: 0.45}[cap] if block == 4096 else 0.51
        return base.get(("split_row", block, warps), 0.9)

    capped = []
    monkeypatch.setattr(autotune, "_time_plan", fake_time)
    monkeypatch.setattr(autotune, "capped_registers",
                        lambda compiled, steps: capped.append((compiled, steps)) or [96, 80])
    entry, plan = autotune._search(problem(n_cols=50304), None, {"split_row": fake_planner})
    # the two fastest lagged candidates, fastest first (2048 columns does not compile here)
    assert capped == [("kernel 8192/4", 3), ("kernel 4096/4", 2)]
    twins = [c for c in entry["candidates"] if "maxnreg" in c["options"]]
    assert [(c["block_size"], c["num_warps"], c["options"]["maxnreg"]) for c in twins] == [
        (8192, 4, 96), (8192, 4, 80), (4096, 4, 96), (4096, 4, 80)]
    assert (entry["block_size"], entry["num_warps"], entry["options"]) == (4096, 4, {"maxnreg": 80})
    assert plan.key == (4096, 4, (("maxnreg", 80),))  # the twin's own plan, as timed


def test_a_capped_seed_is_not_timed_again_as_a_twin(monkeypatch):
    """A table entry that is itself a capped twin (the H200's table holds the search's choices) is timed once, as the
    seed, not again when the same cap comes up among its kernel's twins."""
    monkeypatch.setattr(autotune, "_time_plan", lambda plan, repeats: 0.5)
    monkeypatch.setattr(autotune, "capped_registers", lambda compiled, steps: [96, 80])
    seed = Choice("split_row", 8192, 4, {"maxnreg": 96}, source="tuning table")
    entry, _plan = autotune._search(problem(n_cols=50304), seed, {"split_row": fake_planner})
    keys = [(c["block_size"], c["num_warps"], tuple(sorted(c["options"].items()))) for c in entry["candidates"]]
    assert keys[0] == (8192, 4, (("maxnreg", 96),)) and len(keys) == len(set(keys))
    assert (8192, 4, (("maxnreg", 80),)) in keys


def test_capped_registers_reads_a_launched_kernel():
    """Caps that fit one and two more programs per SM, then the one that allows the most registers with one program
    fewer (sm_90, 4 warps, no shared memory: 168 registers fit 3 blocks, 128 fit 4, 96 fit 5, 80 fit 6); nothing for
    a kernel whose counts cannot be read."""
    kernel = type("Compiled", (), {"n_regs": 128, "metadata": type("Meta", (), {"shared": 0, "num_warps": 4})()})()
    assert autotune.capped_registers(kernel) == [128, 96, 80, 168]  # its own count first
    kernel.n_regs = 80  # 6 blocks; 72 fits 7, 64 fits 8, 96 is the most with 5
    assert autotune.capped_registers(kernel) == [80, 72, 64, 96]
    kernel.n_regs = 96  # the fast-math reverse-KL kernel: 128 with one program fewer
    assert autotune.capped_registers(kernel, 1) == [96, 80, 128]
    kernel.n_regs = 128
    assert autotune.capped_registers(kernel, 3) == [128, 96, 80, 72, 168]  # and 72 fits 7
    assert autotune.capped_registers(object()) == []


def test_cache_file_names_the_triton_version_and_the_kernels_code(monkeypatch, tmp_path):
    import triton

    monkeypatch.setenv("FUSED_LOSS_CACHE_DIR", str(tmp_path))
    path = autotune.cache_file("NVIDIA H100 80GB HBM3")
    stamp = autotune.code_stamp()
    assert path.parent == tmp_path / "h100-sxm-80gb"
    assert path.name == f"triton-{triton.__version__}-code-{stamp}.json" and len(stamp) == 12
    monkeypatch.setattr(autotune, "_CODE_STAMP", None)
    assert autotune.code_stamp() == stamp  # a hash of the sources: the same code, the same name


def test_disk_cache_merges_entries_atomically(tmp_path):
    path = tmp_path / "gpu" / "triton-x.json"
    autotune.write_cache(path, "a", {"variant": "fused", "block_size": 16, "num_warps": 1, "options": {}, "source": "s"})
    autotune.write_cache(path, "b", {"variant": "split_row", "block_size": 32, "num_warps": 2, "options": {}, "source": "s"})
    stored = json.loads(path.read_text())
    assert set(stored) == {"a", "b"} and stored["b"]["block_size"] == 32
    assert not list(path.parent.glob(".tmp-*"))  # no temporary file left behind
    path.write_text("{not json")
    assert autotune.read_cache(path) == {}  # a damaged cache is ignored, never fatal


@pytest.mark.parametrize("value, expected", [("0", False), ("off", False), ("1", True), ("", True)])
def test_autotune_can_be_switched_off(monkeypatch, value, expected):
    monkeypatch.setenv("FUSED_LOSS_AUTOTUNE", value)
    assert autotune.enabled() is expected


def test_earlier_spellings_are_read_as_the_kernel_they_run():
    """split_row with split=False is the fused kernel's loop and fused with resident=True the resident row:
    canonical_variant names them so, the tuning table's entries and the search's seed are read through it, and both
    spellings plan the same launch, whose plan names the kernel."""
    import kernels

    canonical = autotune.canonical_variant
    assert canonical("split_row", {"split": False, "keep_last": True}) == ("fused", {"keep_last": True})
    assert canonical("split_row", {"split": True}) == ("split_row", {})
    assert canonical("fused", {"resident": True}) == ("resident_row", {})
    assert canonical("fused", {"resident": False}) == ("fused", {})
    assert canonical("fused", {"resident": True, "keep_last": True}) == ("fused", {"resident": True, "keep_last": True})
    assert canonical("split_row", {"split": "yes"}) == ("split_row", {"split": "yes"})  # the planner refuses it
    assert "resident_row" in autotune.VARIANTS
    seed = Choice("split_row", 16384, 16, {"split": False}, source="tuning table")
    assert autotune.candidates(problem(n_cols=32000), seed)[0] == ("fused", 16384, 16, {})
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 1024, generator=generator).to(torch.bfloat16)
    labels = torch.randint(0, 1024, (4,), generator=generator)
    pairs = [(dict(variant="split_row", split=False, block_size=256, num_warps=4),
              dict(variant="fused", block_size=256, num_warps=4), "fused"),
             (dict(variant="fused", resident=True, num_warps=2), dict(variant="resident_row", num_warps=2),
              "resident_row")]
    for earlier, named, kernel in pairs:
        old, new = (kernels.prepare(logits, labels, **options) for options in (earlier, named))
        assert old.variant == new.variant == kernel
        assert [(launch.fn, launch.grid, launch.constexprs) for launch in old.launches] == \
               [(launch.fn, launch.grid, launch.constexprs) for launch in new.launches]
        torch.testing.assert_close(old.run()[1], new.run()[1], rtol=0, atol=0)
    with pytest.raises(ValueError, match="block_size 512 < vocab"):
        kernels.prepare(logits, labels, variant="resident_row", block_size=512)
