"""The performance model (perfutils.model.predict): CPU only, a few seconds."""

import shutil
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from perfutils.cli import main
from perfutils.model.predict import BOUNDS, Gpu, KernelPass, LaunchConfig, check, predict
from perfutils.model.roofline import Ceilings

DATA = Path(__file__).resolve().parent.parent / "data" / "h100-sxm-80gb"
TIME_COLUMNS = ("ms_median", "ms_p20", "ms_p80", "host_us_per_call", "host_us_min", "compile_ms", "wall_ms",
                "autotune_ms")


def _small_folder(tmp_path: Path, scale: float = 1.0) -> Path:
    """A copy of a few studies' first rows (and the ceilings), every recorded time multiplied by ``scale``."""
    out = tmp_path / f"gpu-{scale}"
    out.mkdir()
    shutil.copy(DATA / "ceilings.csv", out)
    shutil.copy(DATA / "ceilings.json", out)
    for study in ("blocksize_sweep", "vocab_sweep", "case_497_ablation", "fusion"):
        frame = pd.read_csv(DATA / f"{study}.csv", low_memory=False)
        frame = frame.groupby("variant", group_keys=False).head(12)
        for column in TIME_COLUMNS:
            if column in frame.columns:
                frame[column] = frame[column] * scale
        frame.to_csv(out / f"{study}.csv", index=False)
    return out


def test_predictions_use_no_recorded_time(tmp_path):
    plain = check(_small_folder(tmp_path, 1.0))
    scaled = check(_small_folder(tmp_path, 3.7))
    assert len(plain) > 40
    pd.testing.assert_series_equal(plain["predicted_ms"], scaled["predicted_ms"])
    pd.testing.assert_series_equal(plain["bound"], scaled["bound"])
    assert (scaled["measured_ms"] / plain["measured_ms"]).round(6).eq(3.7).all()


def test_bounds_come_from_a_closed_set(tmp_path):
    frame = check(_small_folder(tmp_path))
    assert set(frame["bound"]) <= set(BOUNDS)
    assert (frame["predicted_ms"] > 0).all()


GPU = Gpu(Ceilings(dram_gbps=3000.0, l2_gbps=7600.0, fp32_tflops=61.0, exp2_tops=4.1))


def _config(dram_bytes: float, spill: int = 0, resident: int = 4) -> LaunchConfig:
    kp = KernelPass("split_row", programs=528, tile=4096, num_warps=4, resident=resident, steps=31.0,
                    load_bytes_per_step=16384, dram_bytes=dram_bytes, l2_bytes=dram_bytes / 3,
                    elements=4096 * 32000, inputs=2, spill_bytes=spill)
    return LaunchConfig("synthetic", "k", "plan", "forward_kl", "logits", 4096, 32000, "bf16", passes=(kp,))


@pytest.mark.parametrize("resident", [1, 4])
def test_more_bytes_is_never_faster(resident):
    times = [predict(_config(b, resident=resident), GPU).ms for b in (1e8, 3e8, 8e8, 2e9, 6e9)]
    assert times == sorted(times)
    assert predict(_config(8e8, spill=512), GPU).ms >= predict(_config(8e8), GPU).ms


def test_fewer_resident_programs_is_never_faster():
    assert predict(_config(8e8, resident=1), GPU).ms >= predict(_config(8e8, resident=4), GPU).ms


def test_host_floor_binds_short_kernels():
    short = replace(_config(1e6), host="autograd")
    assert predict(short, GPU).bound == "host"


def test_cli_on_a_tiny_folder(tmp_path, capsys):
    folder = _small_folder(tmp_path)
    out = tmp_path / "predictions.csv"
    assert main(["predict", "--check", str(folder), "--out", str(out)]) == 0
    frame = pd.read_csv(out)
    assert {"study", "config_key", "measured_ms", "predicted_ms", "bound"} <= set(frame.columns)
    assert "median_err" in capsys.readouterr().out


def test_cli_refuses_an_empty_folder(tmp_path):
    shutil.copy(DATA / "ceilings.csv", tmp_path)
    assert main(["predict", "--check", str(tmp_path)]) == 2


def test_a_launch_described_by_hand_is_predicted_and_explained():
    """predict_launch / what_if_registers (notebook 04's what-if): every register count gives a time and a known
    bound, and the programs per SM follow the registers; the explorer's text carries the model's line on sm_90 and
    says why not elsewhere."""
    import perfutils.plots.occupancy as pocc
    from perfutils.model.predict import gpu_from_folder, what_if_registers

    gpu = gpu_from_folder(DATA)
    kernel = dict(loss="reverse_kl", target_format="logits", tokens=4096, vocab=32768, variant="fused",
                  block_size=8192, num_warps=8, shared_bytes=64)
    frame = what_if_registers(gpu, range(32, 256, 16), **kernel)
    assert set(frame["bound"]) <= set(BOUNDS) and (frame["predicted_ms"] > 0).all()
    # more registers never fit more programs; the time may go either way (fewer resident rows re-read from L2)
    assert frame["blocks_per_sm"].is_monotonic_decreasing and frame["blocks_per_sm"].nunique() > 1
    what_if = dict(gpu=gpu, **{k: v for k, v in kernel.items() if k not in ("num_warps", "shared_bytes")},
                   spill_bytes=0)
    text = pocc.explorer_text("9.0", 256, 64, 64, what_if)
    assert text.splitlines()[-1].startswith("model (") and "% of copy, bound: " in text
    assert pocc.explorer_text("8.6", 256, 64, 64, what_if).splitlines()[-1].startswith("model: ceilings recorded")


def test_l2_holds_less_of_a_reread_as_the_rows_in_flight_grow():
    """The fused kernel's second read of a row comes from L2 while the resident rows fit half of it, then less and
    less of it: never more than all, never negative, never rising with the working set."""
    from perfutils.model.predict import l2_hit_fraction

    gpu = Gpu(GPU.ceilings, l2_bytes=50 * 2**20)
    sizes = [1e6, 20e6, 26e6, 40e6, 100e6, 1e9]
    hits = [l2_hit_fraction(s, gpu) for s in sizes]
    assert hits[0] == hits[1] == 1.0
    assert all(0 < h <= 1 for h in hits) and hits == sorted(hits, reverse=True)


def test_the_autograd_form_counts_its_backward_launch():
    """Same kernel, same problem: the autograd form queues one launch more (its backward), so it is never predicted
    faster than the public call, and never as fast once the kernel outlasts the host work."""
    from perfutils.model.predict import config_from_row, gpu_from_folder

    gpu = gpu_from_folder(DATA)
    plan = ('{"variant": "split_row", "block_size": 8192, "num_warps": 8, "options": {}}')
    row = dict(study="vocab_sweep", config_key="k", loss="cross_entropy", target_format="labels", dtype="bf16",
               tokens=16384, vocab=131072, plan_config=plan)
    public = config_from_row({**row, "variant": "public"}, gpu)
    autograd = config_from_row({**row, "variant": "public_autograd"}, gpu)
    assert autograd.launches == public.launches + 1
    assert predict(autograd, GPU).ms > predict(public, GPU).ms


def test_a_gpu_streams_at_its_triton_copy_when_recorded(tmp_path):
    """The folder's Triton copy is the rate a Triton kernel streams at; a folder without it falls back to the copy."""
    from perfutils.model.predict import gpu_from_folder

    ceilings = pd.read_csv(DATA / "ceilings.csv")
    triton = float(ceilings.loc[ceilings["ceiling"] == "dram_copy_triton", "value"].iloc[0])
    assert gpu_from_folder(DATA).stream_gbps == pytest.approx(triton)
    ceilings[ceilings["ceiling"] != "dram_copy_triton"].to_csv(tmp_path / "ceilings.csv", index=False)
    gpu = gpu_from_folder(tmp_path)
    assert gpu.triton_copy_gbps is None and gpu.stream_gbps == gpu.ceilings.dram_gbps


def test_a_step_lasts_at_least_the_sms_issue_of_every_resident_tile():
    """Between two steps' loads the SM's four schedulers issue every resident program's tile: the latency term of a
    full wave is never shorter than steps x that issue time, and it grows with the programs that share the SM."""
    from perfutils.model.predict import DEFAULT_CONSTANTS, _pass_terms

    k = DEFAULT_CONSTANTS
    gpu = Gpu(GPU.ceilings, clock_ghz=1.98)

    def latency(resident):
        kp = KernelPass("split_row", programs=132 * resident, tile=4096, num_warps=4, resident=resident,
                        steps=64.0, load_bytes_per_step=16384, dram_bytes=1e6, elements=132 * resident * 4096 * 64,
                        inputs=2)
        return _pass_terms(kp, gpu, k)["latency"]

    instr = k.instructions_per_element * (1 + k.second_input_instructions)
    for resident in (1, 2, 4, 8):
        assert latency(resident) >= 64 * resident * 4096 * instr / 128 / 1.98e9 * (1 - 1e-9)
    assert latency(8) > latency(4) > latency(2)


def test_the_second_inputs_instructions_come_from_the_sass_counts(tmp_path):
    """The share a second input adds is read off the offline compiles' SASS counts, not fitted: the frozen constant
    is that value, and a folder without the counts gives None."""
    from perfutils.model.predict import DEFAULT_CONSTANTS, second_input_instructions

    share = second_input_instructions(DATA)
    assert share is not None and 0.5 < share < 1.0
    assert DEFAULT_CONSTANTS.second_input_instructions == pytest.approx(share, abs=0.01)
    assert second_input_instructions(tmp_path) is None


def _lagged(resident: int = 4, tile: int = 4096, loads_ahead: int = 0) -> LaunchConfig:
    kp = KernelPass("split_row.lagged", programs=132 * resident, tile=tile, num_warps=4, resident=resident,
                    steps=4096 * 131072 / (132 * resident * tile), load_bytes_per_step=4 * tile,
                    dram_bytes=4096 * 131072 * 6.0, l2_bytes=4096 * 131072 * 4.0, elements=2 * 4096 * 131072,
                    inputs=2, tiles_per_step=2, loads_ahead=loads_ahead)
    return LaunchConfig("synthetic", "k", "public", "reverse_kl", "logits", 4096, 131072, "bf16", passes=(kp,))


@pytest.mark.parametrize("loads_ahead", [0, 1])
def test_more_resident_programs_never_predict_slower(loads_ahead):
    """At one tile, a persistent grid with more programs per SM keeps more bytes in flight: never slower."""
    gpu = Gpu(GPU.ceilings, sm_count=132)
    times = [predict(_lagged(r, loads_ahead=loads_ahead), gpu).ms for r in (1, 2, 3, 4, 6, 8)]
    assert all(later <= earlier * (1 + 1e-9) for earlier, later in zip(times, times[1:]))
    assert times[0] > times[-1]


def test_loads_ahead_never_slower_and_always_in_flight():
    """Loads issued a step ahead are in flight through the arithmetic (duty 1); waiting for it they are in flight
    only the round trip's share of the step, and the average is below what was requested."""
    from perfutils.model.predict import in_flight

    gpu = Gpu(GPU.ceilings, sm_count=132)
    waiting, ahead = _lagged(4).passes[0], _lagged(4, loads_ahead=1).passes[0]
    plain, early = in_flight(waiting, gpu), in_flight(ahead, gpu)
    assert 0 < plain["duty"] < 1 and plain["effective_bytes"] < plain["nominal_bytes"] == 4 * 4 * 4096
    assert early["duty"] == 1 and early["effective_bytes"] == early["nominal_bytes"]
    assert predict(_lagged(4, loads_ahead=1), gpu).ms <= predict(_lagged(4), gpu).ms


def test_faster_memory_leaves_a_latency_bound_launch_further_from_copy():
    """The same launch on a GPU with faster DRAM (same SMs, clock, L2) runs a lower share of its copy bandwidth
    when too few bytes are in flight: Little's law needs bandwidth x latency, and only the bandwidth grew."""
    from perfutils.model.predict import in_flight

    slow = Gpu(Ceilings(dram_gbps=3000.0, l2_gbps=7600.0, fp32_tflops=61.0, exp2_tops=4.1))
    fast = Gpu(Ceilings(dram_gbps=4200.0, l2_gbps=7600.0, fp32_tflops=61.0, exp2_tops=4.1))
    config = _lagged(2, tile=2048)
    pct = {name: config.passes[0].dram_bytes / (gpu.ceilings.dram_gbps * 1e9) / (predict(config, gpu).ms * 1e-3)
           for name, gpu in (("slow", slow), ("fast", fast))}
    assert pct["fast"] < pct["slow"]
    assert predict(config, fast).ms < predict(config, slow).ms  # still faster in time
    assert in_flight(config.passes[0], fast)["needed_bytes"] > in_flight(config.passes[0], slow)["needed_bytes"]


def test_a_lagged_plan_without_its_grid_gets_the_persistent_one():
    """A split_row plan recorded without its grid (the H200's public rows) is modelled as the persistent grid
    plan_split_row launches (whole rows of chunks, no more programs than the SMs hold), with the lagged step's two
    tiles of arithmetic and its LAG_STEPS extra steps, not one program per row."""
    from perfutils.model.predict import LAG_STEPS, config_from_row, gpu_from_folder

    gpu = gpu_from_folder(DATA)
    plan = '{"block_size": 4096, "num_warps": 4, "options": {"maxnreg": 96}, "variant": "split_row"}'
    config = config_from_row(dict(study="vocab_sweep", config_key="k", loss="forward_kl", target_format="logits",
                                  variant="public", dtype="bf16", tokens=4096, vocab=131072, plan_config=plan), gpu)
    (kp,) = config.passes
    assert kp.programs % 32 == 0 and kp.programs <= kp.resident * gpu.sm_count
    assert kp.tiles_per_step == 2 and kp.elements == 2 * 4096 * 131072
    assert kp.steps == pytest.approx(4096 / (kp.programs / 32) + LAG_STEPS)


def test_a_kept_plan_works_each_chunk_once_and_reads_nothing_again():
    """Run Y's "kept" schedule (the chunk's exponentials kept for keep_steps steps): one tile of arithmetic a step, no
    L2 re-read, keep_steps extra steps; the lagged plan of the same launch keeps its two tiles and its re-read."""
    from perfutils.model.predict import LAG_STEPS, gpu_from_folder, predict_launch

    gpu = gpu_from_folder(DATA)
    launch = dict(loss="forward_kl", target_format="logits", tokens=4096, vocab=32000, variant="split_row",
                  block_size=2048, num_warps=4, n_regs=105)
    plans = {name: {"schedule": name, "programs": 528, "num_chunks": 16, **extra}
             for name, extra in (("lagged", {}), ("kept", {"keep_steps": 2}))}
    kept = predict_launch(gpu, **launch, plan=plans["kept"])
    lagged = predict_launch(gpu, **launch, plan=plans["lagged"])
    assert kept.breakdown["l2"] == 0 < lagged.breakdown["l2"]
    assert kept.breakdown["issue"] == pytest.approx(lagged.breakdown["issue"] / 2)
    assert kept.breakdown["latency"] < lagged.breakdown["latency"]
    assert LAG_STEPS == 2  # both finish a row two steps after reading it here: the difference is the step's work


def test_resident_programs_overlap_their_waits_with_each_others_arithmetic():
    """A step is a closed queue: one program alone takes its round trip plus its arithmetic; many share the SM's
    schedulers, so a step lasts at least their issue one after another and never the round trip plus all of it."""
    from perfutils.model.predict import DEFAULT_CONSTANTS, closed_queue_cycle, step_seconds

    assert closed_queue_cycle(1, 3.0, 2.0) == pytest.approx(5.0)
    for programs in (2, 4, 8, 32):
        cycle = closed_queue_cycle(programs, 3.0, 2.0)
        assert max(3.0 + 2.0, programs * 2.0) <= cycle < 3.0 + programs * 2.0
    assert closed_queue_cycle(64, 3.0, 2.0) == pytest.approx(128.0, rel=1e-6)
    gpu = Gpu(GPU.ceilings, clock_ghz=1.98)
    one = _lagged(1).passes[0]
    lone = step_seconds(one, gpu)
    assert lone > DEFAULT_CONSTANTS.dram_latency_ns * 1e-9
    k = DEFAULT_CONSTANTS
    issue = 2 * 4096 * k.instructions_per_element * (1 + k.second_input_instructions) / 128 / 1.98e9
    for resident in (2, 4, 8):
        step = step_seconds(replace(one, resident=resident), gpu)
        assert resident * issue * (1 - 1e-9) <= step < lone + (resident - 1) * issue


def test_the_sms_issue_is_counted_once():
    """The issue time is inside every step: a pass whose steps are all issue is predicted at its latency term, not at
    that term combined again with the same issue time."""
    from perfutils.model.predict import DEFAULT_CONSTANTS, _pass_terms

    gpu = Gpu(GPU.ceilings, clock_ghz=1.98)
    kp = replace(_lagged(8).passes[0], dram_bytes=1e3, l2_bytes=0.0)
    terms = _pass_terms(kp, gpu, DEFAULT_CONSTANTS)
    assert terms["latency"] >= terms["issue"] * (1 - 1e-9)
    assert terms["total"] < terms["latency"] + 0.5 * terms["issue"]


def test_the_vocab_parallel_exchange_grows_with_the_rows_and_is_absent_on_one_gpu():
    """The symmetric design's exchange: each row's chunk summaries cross to the peer and are polled, so more rows move
    more bytes; one GPU exchanges nothing; the exchange's L2 traffic never makes a rank's kernel faster."""
    from perfutils.model.predict import exchange_bytes, gpu_from_folder, with_exchange, without_exchange

    shape = dict(loss="cross_entropy", target_format="labels", vocab=131072, num_chunks=16)
    small, large = exchange_bytes(tokens=4096, tp=2, **shape), exchange_bytes(tokens=16384, tp=2, **shape)
    assert all(0 < small[k] < large[k] for k in ("sent", "received", "polled"))
    assert small["sent"] == 4096 * 16 * 3 * 8  # 3 words of 8 bytes a row and chunk (recorded: tensor_parallel.csv)
    assert exchange_bytes(tokens=4096, tp=1, **shape) == {"sent": 0, "received": 0, "polled": 0}
    wider = exchange_bytes(tokens=4096, tp=2, loss="forward_kl", target_format="logits", vocab=131072, num_chunks=16)
    assert wider["sent"] > small["sent"]  # 5 words for the distribution losses
    with pytest.raises(ValueError):
        exchange_bytes(tokens=4096, tp=0, **shape)
    gpu = gpu_from_folder(DATA)
    rank = replace(_lagged(4), tokens=4096, vocab=65536, loss="cross_entropy", target_format="labels")
    both = with_exchange(rank, tp=2, num_chunks=16)
    assert both.exchange_l2_bytes == small["received"] + small["polled"]
    assert predict(both, gpu).ms >= predict(rank, gpu).ms
    assert predict(both, gpu).breakdown["exchange"] > 0
    assert without_exchange(both) == rank
    assert with_exchange(rank, tp=1) == rank


def test_a_counted_step_replaces_the_per_element_estimate():
    """thread_instructions_per_step: the estimate grows with the tiles a step works through; a counted step (from the
    kernel's SASS) is taken as it is, and a longer one gives a step at least as long."""
    from perfutils.model.predict import DEFAULT_CONSTANTS, KernelPass, step_seconds, thread_instructions_per_step

    kp = KernelPass("split_row", programs=1056, tile=2048, num_warps=4, resident=8, steps=64,
                    load_bytes_per_step=8192, dram_bytes=1e9, inputs=2, tiles_per_step=2)
    k = DEFAULT_CONSTANTS
    estimate = thread_instructions_per_step(kp, k)
    assert estimate == pytest.approx(2 * 2048 / 128 * k.instructions_per_element * (1 + k.second_input_instructions))
    counted = replace(kp, instructions_per_step=787)
    assert thread_instructions_per_step(counted, k) == 787
    gpu = Gpu(GPU.ceilings, sm_count=132)
    assert step_seconds(replace(kp, instructions_per_step=1600), gpu) >= step_seconds(counted, gpu)


def test_counted_spills_reach_dram_as_the_stacks_outgrow_the_l2():
    """spill_seconds: the counted traffic goes to L2 while every resident thread's stack is small beside the L2, and
    to DRAM (at the streaming rate) once the stacks are many times the L2; the share is x / (1 + x)."""
    from perfutils.model.predict import spill_dram_share, spill_seconds

    gpu = Gpu(GPU.ceilings, sm_count=132)
    assert spill_dram_share(0, gpu) == 0
    assert spill_dram_share(gpu.l2_bytes, gpu) == pytest.approx(0.5)
    assert spill_dram_share(99 * gpu.l2_bytes, gpu) == pytest.approx(0.99)
    kp = KernelPass("row", programs=4096, tile=32768, num_warps=16, resident=1, steps=1,
                    load_bytes_per_step=131072, dram_bytes=8e8, inputs=2, spill_bytes=8, spill_moved_bytes=1000)
    traffic = 1000 * 512 * 4096
    small = spill_seconds(kp, gpu)
    assert small == pytest.approx(traffic / (gpu.ceilings.l2_gbps * 1e9), rel=0.03)  # 1% of the stacks' L2
    huge = spill_seconds(replace(kp, spill_bytes=800_000, resident=4), gpu)
    assert huge == pytest.approx(traffic / (gpu.stream_gbps * 1e9), rel=0.01)
    assert huge > small


def test_a_one_step_pass_takes_its_counted_spills_and_a_looping_one_keeps_the_estimate(tmp_path):
    """with_spill_counts / load_spill_counts: the offline compile's spill stores + loads become the pass's
    spill_moved_bytes where the pass is one step (its tile is the row) and the key matches; a pass that loops over
    its row, or one the folder never compiled, is left as it was; the prediction uses the count."""
    from perfutils.model.predict import load_spill_counts, with_spill_counts

    pd.DataFrame([{"loss": "reverse_kl", "target_format": "logits", "dtype": "bf16", "vocab": 32768,
                   "block_size": 32768, "num_warps": 16, "spill_bytes": 448, "spill_store_bytes": 484,
                   "spill_load_bytes": 484, "status": "ok"},
                  {"loss": "reverse_kl", "target_format": "logits", "dtype": "bf16", "vocab": 32768,
                   "block_size": 16384, "num_warps": 4, "spill_bytes": 880, "spill_store_bytes": 1648,
                   "spill_load_bytes": 1648, "status": "ok"}]).to_csv(tmp_path / "registers_offline.csv", index=False)
    counts = load_spill_counts(tmp_path)
    assert counts == {("reverse_kl", "logits", "bf16", 32768, 32768, 16, 448): (968.0, 0.0, False),
                      ("reverse_kl", "logits", "bf16", 32768, 16384, 4, 880): (3296.0, 0.0, False)}
    one = KernelPass("row", programs=4096, tile=32768, num_warps=16, resident=1, steps=1,
                     load_bytes_per_step=131072, dram_bytes=8e8, inputs=2, spill_bytes=448)
    looping = replace(one, tile=16384, num_warps=4, steps=4, spill_bytes=880)
    unknown = replace(one, spill_bytes=452)
    for kp, moved in ((one, 968.0), (looping, 0.0), (unknown, 0.0)):
        cfg = LaunchConfig(study="s", config_key="k", loss="reverse_kl", target_format="logits", variant="fused",
                           tokens=4096, vocab=32768, dtype="bf16", passes=(kp,))
        assert with_spill_counts(cfg, counts).passes[0].spill_moved_bytes == moved
    cfg = LaunchConfig(study="s", config_key="k", loss="reverse_kl", target_format="logits", variant="fused",
                       tokens=4096, vocab=32768, dtype="bf16", passes=(one,))
    gpu = Gpu(GPU.ceilings, sm_count=132)
    more = with_spill_counts(cfg, {key: count._replace(once=10 * count.once) for key, count in counts.items()})
    assert predict(more, gpu).ms > predict(with_spill_counts(cfg, counts), gpu).ms


def test_the_spill_share_is_checked_against_every_recorded_profile():
    """spill_share_check: every Nsight Compute profile of the #497 family on each GPU is matched to its offline
    compile (the H200's own, of the code it ran), the counted spill traffic is the profiled one and the modelled
    share of it that reaches DRAM follows the measured share (the H200's nine profiles were not used to choose it)."""
    from perfutils.model.predict import spill_share_check

    for folder, profiles in ((DATA, 3), (DATA.parent / "h200", 9)):
        check_frame = spill_share_check(folder)
        assert len(check_frame) == profiles
        assert ((check_frame["counted_gb"] / check_frame["profiled_gb"] - 1).abs() < 0.05).all()
        assert ((check_frame["modelled_share"] - check_frame["measured_share"]).abs() < 0.1).all()
    assert spill_share_check(DATA.parent / "no-such-gpu").empty


def test_an_sm90_folder_without_offline_compiles_reads_the_h100s(tmp_path):
    """offline_file: a folder with its own offline compiles keeps them; an sm_90 folder without reads the H100
    folder's beside it; a folder of another GPU reads none."""
    from perfutils.model.spill_counts import SM90_FOLDER, offline_file

    name = "case_497_registers_offline.csv"
    for folder, capability in (("sm90", [9, 0]), ("sm100", [10, 0])):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "vocab_sweep.json").write_text(f'{{"compute_capability": {capability}}}')
    assert offline_file(tmp_path / "sm90", name) == (tmp_path / SM90_FOLDER).resolve() / name
    assert offline_file(tmp_path / "sm100", name) == (tmp_path / "sm100").resolve() / name
    assert offline_file(DATA.parent / "h200", name) == (DATA.parent / "h200").resolve() / name


def test_a_count_split_by_loop_gives_a_looping_pass_its_trips():
    """with_spill_counts: a count split by where the spills sit gives a pass that loops over its row the bytes outside
    the loops once and a trip's inside them once per tile of the row."""
    from perfutils.model.predict import with_spill_counts
    from perfutils.model.spill_counts import SpillCount

    kp = KernelPass("row", programs=4096, tile=16384, num_warps=32, resident=1, steps=16,
                    load_bytes_per_step=65536, dram_bytes=3e9, inputs=2, spill_bytes=264)
    cfg = LaunchConfig(study="s", config_key="k", loss="reverse_kl", target_format="logits", variant="fast_llm",
                       tokens=4096, vocab=131072, dtype="bf16", passes=(kp,))
    key = ("reverse_kl", "logits", "bf16", 131072, 16384, 32, 264)
    counted = with_spill_counts(cfg, {key: SpillCount(once=500.0, per_trip=30.0, split=True)})
    assert counted.passes[0].spill_moved_bytes == 500 + 30 * 8


def test_counted_spills_predict_the_spilling_configurations_better_on_both_gpus():
    """spilling_errors: on each GPU's committed records, the configurations that spill are predicted with a smaller
    median and p90 error from the offline compiles' counted spills than from the estimate alone; the estimate's row
    counts none."""
    from perfutils.model.predict import spilling_errors

    for folder in (DATA, DATA.parent / "h200"):
        errors = spilling_errors(folder).set_index("spills")
        assert errors.loc["estimate", "counted"] == 0
        assert 0 < errors.loc["counted", "counted"] <= errors.loc["counted", "configurations"]
        assert errors.loc["counted", "median"] < errors.loc["estimate", "median"]
        assert errors.loc["counted", "p90"] < errors.loc["estimate", "p90"]
