"""perfutils.learning_path and its figure on the recorded H100 data (CPU, about a second)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pandas as pd
import pytest

from perfutils import learning_path as lp
from perfutils.model import step_counts
from perfutils.plots.learning_path import plot_path

DATA = Path(__file__).resolve().parent.parent / "data" / "h100-sxm-80gb"


@pytest.fixture(scope="module")
def frame():
    return lp.path_frame(DATA)


def test_every_step_has_an_after_row_and_a_prediction_where_recorded(frame):
    assert list(frame[frame["side"] == "after"]["step"]) == [s.key for s in lp.STEPS]
    recorded = frame[frame["recorded_ms"].notna()]
    assert len(recorded) == len(frame)  # every pick finds its row in today's data
    assert recorded["predicted_ms"].gt(0).all()
    assert set(recorded["bound"]) <= {"dram", "latency", "waves", "l2", "issue", "mufu", "spills", "host", "launch"}


def test_a_missing_row_is_said_not_invented(tmp_path):
    (tmp_path / "ceilings.csv").write_text((DATA / "ceilings.csv").read_text())
    step = lp.PathStep("x", "X", "?", (), after=lp.Pick("nowhere", (("vocab", 1),)))
    out = lp.path_frame(tmp_path, steps=(step,))
    assert math.isnan(out["recorded_ms"].iloc[0]) and math.isnan(out["predicted_ms"].iloc[0])
    assert lp.step_summary(out, "x")[1] == "No recorded row measures this step."


def test_speedups_and_summary_are_computed_from_the_rows(frame):
    ups = lp.speedups(frame).set_index("step")
    rows = frame[frame["step"] == "tuple"].set_index("side")
    assert ups.loc["tuple", "recorded speed-up"] == pytest.approx(rows.loc["before", "recorded_ms"] / rows.loc["after", "recorded_ms"])
    _, sentence = lp.step_summary(frame, "tuple")
    assert f"{rows.loc['after', 'recorded_ms']:.3f} ms" in sentence
    assert "497" not in ups.index  # the first step has nothing before it


def test_the_steps_show_at_least_six_product_kernels():
    shown = {fn for step in lp.STEPS for fn in lp.step_functions(step)}
    product = {fn for fn in shown if getattr(getattr(fn, "fn", fn), "__module__", "").startswith("kernels.")}
    kernels = {fn for fn in product if getattr(getattr(fn, "fn", fn), "__name__", "").endswith("_kernel")}
    assert len(kernels) >= 6


def test_knob_predicts_recorded_configurations_only():
    options = lp.knob_options(DATA)
    first = options.iloc[0]
    out = lp.knob_prediction(DATA, int(first["block_size"]), int(first["num_warps"]))
    assert out["recorded_ms"] == pytest.approx(first["ms_median"]) and out["predicted_ms"] > 0
    bigger = lp.knob_prediction(DATA, int(options["block_size"].max()), int(first["num_warps"]))
    assert bigger["predicted_ms"] != out["predicted_ms"]
    with pytest.raises(KeyError):
        lp.knob_prediction(DATA, 3, 4)


def test_sass_excerpt_keeps_the_heading_and_spill_lines():
    text = lp.sass_excerpt(DATA / "logs" / "case_497_spill_sass_2026-11-23.txt", lines=3)
    lines = text.splitlines()
    assert "stack" in text and len([l for l in lines if l.strip().startswith("/*")]) == 3
    assert all(" STL" in l or " LDL" in l for l in lines if l.strip().startswith("/*"))


def test_plot_path_one_row_per_step(frame):
    import matplotlib.pyplot as plt

    fig = plot_path(frame, title="t")
    assert len(fig.axes[0].get_yticks()) == len(lp.STEPS)
    plt.close(fig)
    with pytest.raises(ValueError):
        plot_path(frame.drop(columns=["floor_ms"]))


def test_lagged_step_shows_its_diff_from_the_wait_kernel_rendered_from_the_sources():
    from kernels import split_row

    from perfutils.notebook import kernel_source

    lagged = next(s for s in lp.STEPS if s.key == "lagged")
    diff = lp.step_diff(lagged)
    assert diff.startswith("--- kernels.split_row.split_row_cooperative_kernel")
    added = [line[1:] for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]
    new = lp.fold_constexprs(kernel_source(split_row.split_row_lagged_kernel), lagged.fold).splitlines()
    assert added and all(line in new for line in added)
    assert lp.step_diff(lp.STEPS[0]) is None  # a step without diff_from shows its functions whole
    steps = {s.key: s for s in lp.STEPS}
    assert "-    tile_acc = tl.sum(" in lp.step_diff(steps["tuple"])  # a separate reduction the tuple form drops
    assert "+def kept_gradient(" in lp.step_diff(steps["kept"])


def test_every_step_has_recorded_evidence_or_says_none_was_recorded():
    for step in lp.STEPS:
        tables = lp.step_evidence(DATA, step)
        assert len(tables) == len({p.study for p in step.records})  # every pick finds its row
        excerpts = [lp.log_excerpt(DATA, e) for e in step.logs]
        assert all(excerpts)
        if not (tables or excerpts or step.evidence):
            assert "no " in step.note and "recorded" in step.note, step.key
    tuple_step = next(s for s in lp.STEPS if s.key == "tuple")
    sass = dict(lp.step_evidence(DATA, tuple_step))["case_497_registers_offline"]
    assert list(sass["variant"]) == ["case497.step1", "case497.step2"] and sass["LDL"].iloc[1] < sass["LDL"].iloc[0]
    with pytest.raises(ValueError):
        lp.log_excerpt(DATA, lp.LogExcerpt("explore_peel_2026-11-26.txt", "no such line"))


def test_knob_text_is_what_the_widget_prints():
    options = lp.knob_options(DATA)
    p = lp.knob_prediction(DATA, int(options.iloc[0]["block_size"]), int(options.iloc[0]["num_warps"]))
    text = lp.knob_text(p)
    assert f"predicted {p['predicted_ms']:.3f} ms ({p['bound']})" in text and f"{p['n_regs']} registers" in text
    live = {**p, "source": "measured now on this GPU", "ms_median": 0.5}
    assert lp.knob_text(p, live).startswith(text + "\nmeasured now on this GPU: ")
    assert lp.knob_text(p, live).endswith("measured 0.500 ms")


def test_knob_compiles_todays_kernel_offline_and_predicts_from_its_counts():
    """The knob on a CPU: today's kernels.fused compiled for sm_90 (seconds), its counts fed to the model."""
    from perfutils.model.occupancy import occupancy_of_counts

    compiled = lp.knob_compiled(DATA, 32768, 4)  # the recorded sweep's one spilling configuration
    assert compiled["source"].startswith("today's kernels.fused compiled offline")
    assert compiled["n_regs"] == 255 and compiled["spill_bytes"] > 0
    assert compiled["resident"] == occupancy_of_counts(255, 0, 4).blocks_per_sm
    assert compiled["predicted_ms"] > 0 and compiled["bound"]
    with pytest.raises(KeyError):
        lp.knob_compiled(DATA, 3, 4)


def test_knob_measures_on_a_gpu_through_the_harness(tmp_path):
    """The knob with MODE="measure": one harness case, here with the interpreter and a stand-in timing of 1.0 ms
    (no GPU launch, so the model keeps the recorded counts and says so)."""
    from perfutils.measure import providers
    from perfutils.measure.measurer import GpuMeasurer, TimingBackend
    from perfutils.measure.sweep_config import load_config

    spec = load_config(dict(study=lp.LIVE_STUDY, out=str(tmp_path), loss="cross_entropy", target_format="labels",
                            variant="fused", dtype="bf16", tokens=4, vocab=300, check_rows=4))
    measurer = GpuMeasurer(spec, device="cpu", prepare=providers.prepare, backend=TimingBackend.dry_run(),
                           copy_gbps=1.0, log=lambda *_: None)
    shape = dict(loss="cross_entropy", target_format="labels", vocab=131072, tokens=4096)
    with pytest.raises(KeyError):  # a configuration the sweep did not record
        lp.knob_measured(DATA, 3, 4, out=tmp_path, measurer=measurer, **shape)
    live = lp.knob_measured(DATA, 1024, 4, out=tmp_path, measurer=measurer, at=(4, 300), **shape)
    recorded = lp.knob_prediction(DATA, 1024, 4, **shape)
    assert live["ms_median"] == 1.0 and live["source"] == "measured now (counts of the recorded compile)"
    assert live["predicted_ms"] == pytest.approx(recorded["predicted_ms"])
    assert list(tmp_path.glob(f"*/{lp.LIVE_STUDY}.csv"))  # the row is recorded


def test_a_knob_measured_on_another_gpu_is_predicted_with_that_gpus_ceilings():
    h100, same = lp.measuring_gpu(DATA, "NVIDIA H100 80GB HBM3")
    h200, own = lp.measuring_gpu(DATA, "NVIDIA H200")
    other, none = lp.measuring_gpu(DATA, "NVIDIA B200")
    assert same == "" and "own ceilings" in own and "no ceilings recorded" in none
    assert "H200" in h200.name and other.name == h100.name
    assert h200.ceilings.dram_gbps > h100.ceilings.dram_gbps


def test_a_one_process_row_of_a_kernel_that_compiles_otherwise_today_is_named(tmp_path):
    columns = ["loss", "target_format", "variant", "vocab", "block_size", "num_warps", "n_regs", "spill_bytes",
               "ms_median"]
    then = pd.DataFrame([("reverse_kl", "logits", "fused", 32768, 32768, 16, 64, 1072, 2.269),
                         ("reverse_kl", "logits", "fused", 32768, 16384, 16, 97, 0, 0.35),
                         ("reverse_kl", "logits", "fused", 32768, 16384, None, 95, 0, 0.346),
                         ("reverse_kl", "logits", "two_pass", 131072, 4096, 4, 127, 0, 1.8)], columns=columns)
    today = {32768: {"n_regs": 128, "spill_bytes": 632}, 16384: {"n_regs": 97, "spill_bytes": 0}}
    asked = []

    def compile_counts(loss, target_format, vocab, block_size, num_warps):
        asked.append((loss, block_size, num_warps))
        return today[block_size]

    assert lp.compiled_differently(tmp_path, compile_counts) == []  # no file: nothing to say
    then.to_csv(tmp_path / f"{lp.LIVE_STUDY}.csv", index=False)
    moved = lp.compiled_differently(tmp_path, compile_counts)
    assert len(moved) == 1 and "64 registers and 1072 B" in moved[0] and "128 and 632 B" in moved[0]
    assert asked == [("reverse_kl", 32768, 16), ("reverse_kl", 16384, 16)]  # fused rows with a tile and warps only


def test_live_cases_cover_the_one_gpu_rows_only():
    cases = {s.key: (lp.live_case(s.before), lp.live_case(s.after)) for s in lp.STEPS}
    assert cases["497"][1] == ("reverse_kl", "logits", 32768, 4096, ("case497.step0", 32768, 16))
    assert cases["lagged"] == (None, None)  # tuning sweeps' fastest rows: not one case
    assert cases["tp"] == (None, None)  # two GPUs


def test_measure_mode_runs_the_harness_on_a_cpu_at_a_tiny_shape(tmp_path):
    """MODE="measure"'s path (cases, harness, float64 checks, rows back into the path's frame), with the
    interpreter and a stand-in timing of 1.0 ms."""
    from perfutils.measure import providers
    from perfutils.measure.measurer import GpuMeasurer, TimingBackend
    from perfutils.measure.sweep_config import load_config

    spec = load_config(dict(study=lp.LIVE_STUDY, out=str(tmp_path), loss="reverse_kl", target_format="logits",
                            variant="fused", dtype="bf16", tokens=4, vocab=300, check_rows=4))
    measurer = GpuMeasurer(spec, device="cpu", prepare=providers.prepare, backend=TimingBackend.dry_run(),
                           copy_gbps=1.0, log=lambda *_: None)
    steps = [s for s in lp.STEPS if s.key in ("kept", "two_pass", "resident")]  # ablation, product, public plan
    live = lp.measure_path(tmp_path, steps=steps, tokens=4, vocab=300, block_cap=512, measurer=measurer,
                           log=lambda *_: None)
    assert set(zip(live["step"], live["side"])) == {(key, side) for key in ("kept", "two_pass", "resident")
                                                    for side in ("before", "after")}
    assert (live["ms_median"] == 1.0).all()
    merged = lp.with_live(lp.path_frame(DATA, steps=steps), live)
    assert (merged["recorded_ms"] == 1.0).all() and merged["source"].str.endswith("(measured now)").all()
    assert lp.step_summary(merged, "kept")[1].startswith("Measured now: **1.000 ms**")
    # the page's provenance note reads the sidecar of every study it names: the live rows' file is one of them
    assert "learning_path" in lp.data_studies(merged)
    sidecars = {path.stem for path in tmp_path.rglob("*.json")} | {path.stem for path in DATA.glob("*.json")}
    assert set(lp.data_studies(merged)) <= sidecars


FOLDABLE = '''
@triton.jit
def k(x_ptr, n,
      BLOCK: tl.constexpr,
      FAST: tl.constexpr = True,  # the fast path
      STAGES: tl.constexpr = 0,
):
    """Doc.

    FAST: the fast path, explained
    over two lines.
    """
    # STAGES: pipelined reads
    # (continued)
    for i in tl.range(0, n, num_stages=STAGES + 1):
        if FAST:
            y = 1
        else:
            y = 2
        if not FAST:  # slow only
            y = 3
        z = FAST and BLOCK > 4
        w = f(y, FAST)
'''


def test_fold_constexprs_keeps_the_branch_taken_and_drops_the_switch():
    folded = lp.fold_constexprs(FOLDABLE, ["FAST", "STAGES"])
    import ast

    ast.parse(folded)  # still Python
    assert "FAST" not in folded and "STAGES" not in folded
    assert "y = 1" in folded and "y = 2" not in folded and "y = 3" not in folded
    assert "num_stages=1)" in folded and "z = BLOCK > 4" in folded and "w = f(y, True)" in folded
    assert "Doc." in folded and "BLOCK: tl.constexpr," in folded
    assert lp.constexpr_defaults(FOLDABLE) == {"FAST": True, "STAGES": 0}
    with pytest.raises(ValueError):
        lp.fold_constexprs(FOLDABLE, ["BLOCK"])  # no default: not a switch to fold


def test_folding_keeps_the_parentheses_precedence_needs():
    """`SWITCH and (a or b) and c` folded at SWITCH=True is `(a or b) and c`, not `a or b and c` (another kernel)."""
    source = ("def kernel(a, b, c, SWITCH: tl.constexpr = True):\n"
              "    X: tl.constexpr = SWITCH and (a or b) and c\n"
              "    Y: tl.constexpr = SWITCH and (a or b)\n"
              "    return X, Y\n")
    folded = lp.fold_constexprs(source, ["SWITCH"])
    assert "X: tl.constexpr = (a or b) and c" in folded and "Y: tl.constexpr = a or b" in folded


def test_lagged_diff_folds_the_later_switches_at_their_defaults():
    from kernels import split_row

    from perfutils.notebook import kernel_source

    lagged = next(s for s in lp.STEPS if s.key == "lagged")
    assert lp.folded_switches(lagged) == {"PEEL": False, "VEC": 8, "PREFETCH": False, "READ_AHEAD": 0,
                                          "FAST_MATH": True}
    diff = lp.step_diff(lagged)
    code = "\n".join(line.split("#")[0] for line in diff.splitlines())  # comments may still name a switch
    for switch in lagged.fold:
        assert switch not in code, switch
    raw = kernel_source(split_row.split_row_lagged_kernel)
    assert len(diff.splitlines()) < 0.85 * len(raw.splitlines())
    for lesson in ("n_rows + behind", "wait_for_summaries", '"evict_first"', "-            while arrived < NUM_CHUNKS:"):
        assert lesson in diff, lesson


def test_diff_view_colours_added_and_removed_lines():
    from perfutils.notebook import diff_view

    lagged = next(s for s in lp.STEPS if s.key == "lagged")
    html = diff_view(lp.step_diff(lagged))._repr_html_()
    assert html.count('class="diff-added"') > 10 and html.count('class="diff-removed"') > 5
    assert "&lt;" in html or "<" not in lp.step_diff(lagged)  # source text is escaped
    assert diff_view("+a\n-b")._repr_markdown_() == "```diff\n+a\n-b\n```"


def test_one_provenance_note_groups_the_data_files_by_their_code():
    import json

    from perfutils.provenance import code_notes

    files = {f"{s}.csv": json.loads((DATA / f"{s}.json").read_text()) for s in ("case_497", "case_497_ablation",
                                                                                "registers_offline")}
    note = code_notes(files)
    assert len(note.lines) == 2  # the two case-study files share their commit
    assert any(line.startswith("case_497.csv and case_497_ablation.csv: commit") for line in note.lines)
    assert note._repr_html_().count("<li>") == 2 and 'class="code-version' in note._repr_html_()


def test_exercise_changes_one_switch_and_checks_it_against_the_reference_and_the_model():
    """The exercise's cell on a CPU: the variant of step 0 with one switch off, run in the interpreter against the
    float64 reference, compiled offline for sm_90 and predicted; the answer computed from the records."""
    variant = lp.exercise_variant("SPLIT_REDUCTIONS")
    assert variant == "case497.solo_reduce" and lp.exercise_variant("RECOMPUTE_GRAD") == "case497.step1"
    with pytest.raises(ValueError):
        lp.exercise_variant("PEEL")
    check = lp.exercise_check(variant, rows=2, vocab=300)
    assert check["passes"] and check["grad_rel_err"] <= 1e-2
    mine = lp.exercise_model(DATA, variant)
    assert mine["n_regs"] > 0 and mine["predicted_ms"] > 0 and mine["recorded_ms"] > 0
    answer = lp.exercise_answer(DATA)
    assert list(answer["variant"])[0] == "case497.step0" and len(answer) == 5
    assert answer["recorded speed-up"].iloc[0] == 1.0
    best = answer.iloc[1:].sort_values("recorded ms").iloc[0]
    assert best["stack B/thread"] < answer["stack B/thread"].iloc[0]


def test_one_process_rows_map_the_measured_file_back_to_the_steps():
    """learning_path.csv (MODE="measure" on the H100, one process) read back as (step, side) rows, and the
    speed-up they give beside the recorded and predicted ones."""
    rows = lp.one_process_rows(DATA)
    assert len(rows) and rows["ms_median"].gt(0).all()
    assert set(rows["step"]) <= {step.key for step in lp.STEPS}
    ups = lp.speedups(lp.path_frame(DATA), rows)
    sides = rows.pivot_table(index="step", columns="side", values="ms_median")
    measured = ups.dropna(subset=["one-process speed-up"])
    assert len(measured)
    for _, row in measured.iterrows():
        assert row["one-process speed-up"] == sides.loc[row["step"], "before"] / sides.loc[row["step"], "after"]
    assert lp.one_process_rows(DATA / "absent").empty


def test_diffs_leave_docstrings_out_and_keep_the_code():
    source = 'def k(x):\n    """Doc,\n    two lines."""\n    y = x  # code\n    return y\n'
    assert lp.without_docstring(source) == "def k(x):\n    y = x  # code\n    return y\n"
    assert lp.without_docstring("def k(x):\n    return x\n") == "def k(x):\n    return x\n"
    lagged = lp.step_diff(next(step for step in lp.STEPS if step.key == "lagged"))
    assert '"""' not in lagged and "@@" in lagged


def test_the_tp_step_predicts_the_ranks_kernel_with_its_exchange():
    """The vocabulary split's step: each rank's recorded kernel on half of each row, plus the exchange of the rows'
    summaries (L2 traffic of the rank's kernel), which never makes the prediction faster; the one-GPU step before
    it has no exchange."""
    frame = lp.path_frame(DATA)
    after = frame[(frame["step"] == "tp") & (frame["side"] == "after")].iloc[0]
    before = frame[(frame["step"] == "tp") & (frame["side"] == "before")].iloc[0]
    assert after["exchange_ms"] > 0 and after["predicted_ms"] >= after["predicted_without_exchange_ms"]
    assert after["block_size"] == 4096 and after["resident"] == 9  # the recorded config: 1188 programs on 132 SMs
    assert math.isnan(before["exchange_ms"])
    assert "exchange" in lp.step_summary(frame, "tp")[1]
    # Its stores into the peer at the link measured between two H200s, the H100 pair's NV18 (data/h200/nvlink.csv):
    # costed, and the round trip set against the time a row's summaries have before they are read.
    assert after["nvlink_ms"] > 0 and after["predicted_ms"] >= after["predicted_without_link_ms"]
    assert after["lag_us"] > after["round_trip_us"] > 0 and "data/h200/nvlink.csv" in after["link_measured_on"]
    assert "comes back in" in lp.step_summary(frame, "tp")[1]
    # Each rank's step is the exchange kernel's, counted offline (exchange_steps.csv), not an estimate.
    counted = step_counts.load_exchange_counts(DATA)[("cross_entropy", "labels", "bf16", 65536, 4096, 4, 2, 2)]
    assert after["step_instructions"] == counted
    # The count's kernel sources against the row's (the counts file's kernel_sources, the row's session): the page
    # says when the counted kernel is not the timed one (the H100 pair's rows predate the exchange's fast math).
    assert step_counts.load_exchange_sources(DATA)[("cross_entropy", "labels", "bf16", 65536, 4096, 4, 2, 2)]
    assert after["step_counted_on"] in ("same", "other", "unknown")
    said = "not of the timed one" in lp.step_summary(frame, "tp")[1]
    assert said == (after["step_counted_on"] == "other")


def test_every_steps_key_lines_are_in_todays_source():
    """The lines a step names to read first exist in its functions' files today (a renamed or rewritten line fails
    here, so the page never points at code that is gone); each comes with its file and line number."""
    from dataclasses import replace

    for step in lp.STEPS:
        if not step.read_first:
            continue
        shown = lp.key_lines(step)
        assert shown.count("\n# ") + 1 == len(step.read_first)
        assert all(text in shown for text in step.read_first)
        assert re.search(r"^# [\w/]+\.py:\d+ \(\w+\)$", shown.splitlines()[0])
    lagged = next(step for step in lp.STEPS if step.key == "lagged")
    with pytest.raises(ValueError, match="no line"):
        lp.key_lines(replace(lagged, read_first=("a line no kernel holds",)))


def test_the_lagged_step_shows_its_idea_at_teaching_size():
    steps = {step.key: step for step in lp.STEPS}
    from perfutils.lab_kernels.teaching import lagged_exchange

    assert lp.teaching_function(steps["lagged"]) is lagged_exchange.lagged_exchange_kernel
    assert all(lp.teaching_function(step) is None for key, step in steps.items() if not step.teaching)


def test_the_497_steps_spills_are_predicted_from_their_counted_traffic():
    """The learning path's spilling steps take the spill traffic their offline compile counted (one-step kernels):
    each prediction uses it, and the #497 kernel's spill term is most of its predicted time, as the recorded
    Nsight Compute profile says of its measured time (DRAM bytes 15x the minimum)."""
    frame = lp.path_frame(DATA)
    first = frame[frame["variant"] == "case497.step0"].iloc[0]
    assert first["bound"] == "spills"
    assert first["spills_ms"] > 0.8 * first["predicted_ms"]
    step2 = frame[frame["variant"] == "case497.step2"].iloc[0]
    assert 0 < step2["spills_ms"] < first["spills_ms"]
