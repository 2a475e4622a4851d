"""Nsight Compute's source page and the SASS listing read as a persistent kernel's step (perfutils.data.source_page,
perfutils.model.cubin.main_loop_instructions), on small listings and on run Z's recorded profile."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from perfutils.data.records import exploration_records
from perfutils.data.source_page import loop_spans, parse_source_page, read_source_page, step_profile
from perfutils.model.cubin import local_memory_bytes, main_loop_instructions, sass_loops

LOGS = Path(__file__).resolve().parents[1] / "data" / "h200" / "logs"
HEADER = ('"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)",'
          '"# Samples","Instructions Executed","stall_long_sb","stall_barrier","stall_selected",'
          '"stall_long_sb (Not Issued)"')


def _page(kernel: str, rows) -> str:
    """A source-page block: rows of (address, text, samples, executed, long_sb, barrier, selected)."""
    lines = [f'"Kernel Name","{kernel}",', HEADER]
    for address, text, samples, executed, long_sb, barrier, selected in rows:
        lines.append(f'"{address:#x}","{text}","{samples}","{samples}","{samples}","{executed}","{long_sb}",'
                     f'"{barrier}","{selected}","0"')
    return "\n".join(lines) + "\n"


# A step of four instructions run 10 times (0x100-0x130), a poll loop nested in it (0x110-0x120) that went round 5
# times in all, and one instruction before the loop.
STEP = [(0x0f0, "MOV R1, R2", 1, 1, 0, 0, 1),
        (0x100, "LDG.E R2, [R4]", 2, 10, 0, 0, 2),
        (0x110, "ISETP.NE.U32.AND P0, PT, R6, 0x7fbadbad, PT", 10, 15, 9, 0, 1),
        (0x120, "@P0 BRA 0x110", 3, 15, 0, 0, 3),
        (0x130, "@P1 BRA 0x100", 4, 10, 0, 4, 0)]


def test_loop_spans_are_backward_branches():
    assert loop_spans([None, None, 1, None, 0]) == [(1, 2), (0, 4)]
    assert loop_spans([3, None, None, None]) == []  # a forward branch closes no loop
    assert loop_spans([0]) == [(0, 0)]  # a branch to itself is a loop


def test_the_source_page_is_read_per_launch_and_as_a_step():
    text = "==PROF== noise\n" + _page("split_row_kept_kernel", STEP) + _page("other", STEP[:2])
    launches = parse_source_page(text)
    assert [name for name, _frame in launches] == ["split_row_kept_kernel", "other"]
    frame = launches[0][1]
    assert list(frame["address"]) == [0xF0, 0x100, 0x110, 0x120, 0x130]
    assert "stall_long_sb" in frame and "stall_long_sb (Not Issued)" not in frame
    profile = step_profile(frame, marker="0x7fbadbad")
    assert profile["warp_steps"] == 10
    # the step's instructions outside the poll loop: 10 + 10 a step; the poll ran 15 times its head, 1.5 a step
    assert profile["step_instructions"] == pytest.approx(2.0)
    assert profile["nested_passes"] == pytest.approx(1.5)
    assert profile["nested_pct"] == pytest.approx(100 * 13 / 20)
    assert profile["marker_pct"] == pytest.approx(100 * 10 / 20)
    assert profile["long_sb_pct"] == pytest.approx(45.0) and profile["barrier_pct"] == pytest.approx(20.0)
    assert profile["other_pct"] == pytest.approx(0.0)
    with pytest.raises(ValueError, match="no loop"):
        step_profile(launches[1][1])
    with pytest.raises(TypeError):
        parse_source_page(None)


def test_a_sass_listing_is_counted_as_a_step():
    sass = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_3:
        /*0010*/                   LDG.E R2, desc[UR4][R4.64] ;
.L_x_1:
        /*0020*/                   ISETP.NE.U32.AND P0, PT, R2, 0x7fbadbad, PT ;
        /*0030*/               @P0 BRA `(.L_x_1) ;
        /*0040*/                   FADD R3, R2, R3 ;
        /*0050*/               @P1 BRA `(.L_x_2) ;
.L_x_2:
        /*0060*/              @!P2 BRA `(.L_x_3) ;
        /*0070*/                   EXIT ;
"""
    spans, instructions = sass_loops(sass)
    assert spans == [(2, 3), (1, 6)] and instructions[0].startswith("MOV")
    assert main_loop_instructions(sass) == {"step": 4, "nested": 2}
    with pytest.raises(ValueError, match="no loop"):
        main_loop_instructions("        /*0000*/                   EXIT ;\n")


def test_spill_bytes_are_split_by_where_they_sit():
    """local_memory_bytes: a spill's width from its modifier (4 bytes without one), outside every loop once, inside a
    loop (nested ones with it) per trip."""
    sass = """
        /*0000*/                   STL.64 [R1+0x8], R4 ;
.L_x_3:
        /*0010*/                   LDL.LU R2, [R1] ;
.L_x_1:
        /*0020*/                   STL.128 [R1+0x10], R8 ;
        /*0030*/               @P0 BRA `(.L_x_1) ;
        /*0040*/               @P1 LDL.U8 R3, [R1+0x4] ;
        /*0060*/              @!P2 BRA `(.L_x_3) ;
        /*0070*/                   LDL R5, [R1+0x20] ;
        /*0080*/                   EXIT ;
"""
    assert local_memory_bytes(sass) == {"once": 8 + 4, "per_trip": 4 + 16 + 1}
    assert local_memory_bytes("        /*0000*/                   EXIT ;\n") == {"once": 0, "per_trip": 0}


def test_run_z_profile_matches_the_offline_count():
    """The recorded profile of run Z: each launch's executed step is at most the SASS count of the same plan (branches
    skipped at run time), and within 10% of it."""
    timed = exploration_records(f"{LOGS / 'ncu_kept_2026-11-28.txt'}::## timed (no profiler)")
    launches = read_source_page(LOGS / "ncu_kept_source_2026-11-28.csv.gz")
    counted = {(r["loss"], r["fmt"], r["vocab"], r["cfg"]): r["step"]
               for r in exploration_records(LOGS / "offline_kept_2026-11-28.txt")}
    assert len(timed) == len(launches) == 9
    for record, (name, frame) in zip(timed, launches):
        assert name == f"split_row_{record['schedule']}_kernel"
        executed = step_profile(frame)["step_instructions"]
        count = counted[(record["loss"], record["fmt"], record["vocab"], record["cfg"])]
        assert 0.9 * count <= executed <= count
    text = gzip.decompress((LOGS / "ncu_kept_source_2026-11-28.csv.gz").read_bytes()).decode()
    assert len(parse_source_page(text)) == 9


def test_exploration_records_take_loss_first_lines_at_line_starts_only(tmp_path):
    log = tmp_path / "z.txt"
    record = {"loss": "forward_kl", "fmt": "logits", "vocab": 32000, "cfg": "2048/4", "ms": 0.3}
    log.write_text("# header\n" + json.dumps(record) + "\nprofiled " + json.dumps({"loss": "x"}) + "\n")
    assert exploration_records(log) == [record]
