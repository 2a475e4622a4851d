"""Exploration (kernel-only, not a recorded study): where the lagged split_row kernel stands against a plain kernel
that streams the same bytes, over configurations the first-call search does and does not try.

  python scripts/explore_lagged.py compile PART PARTS   # prepare (compile) a share of the plans; many at once
  python scripts/explore_lagged.py time                 # time every plan one after another: one JSON line each
  python scripts/explore_lagged.py compile-read-ahead PART PARTS, time-read-ahead   # the same for read_ahead (run E)
  python scripts/explore_lagged.py compile-rows PART PARTS, time-rows   # one program per row, keep_last (run F)
  python scripts/explore_lagged.py compile-caps PART PARTS, time-caps   # deeper register caps (run G)
  python scripts/explore_lagged.py compile-edge PART PARTS, time-edge   # head/tail read with the chunk (run H)
  python scripts/explore_lagged.py compile-deal PART PARTS, time-deal   # (row, chunk) pairs dealt (run I)
  python scripts/explore_lagged.py compile-deal-labels PART PARTS, time-deal-labels   # run I, labels CE's misses
  python scripts/explore_lagged.py compile-align PART PARTS, time-align   # peeled rows' body 16/32/128-byte aligned (J)
  python scripts/explore_lagged.py compile-int32 PART PARTS, time-int32   # run in two code trees: int32 chunk start (O)
  python scripts/explore_lagged.py compile-even PART PARTS, time-even   # even chunks, distribution losses (run P)
  python scripts/explore_lagged.py compile-even-labels PART PARTS, time-even-labels   # the same, labels CE (run P)
  python scripts/explore_lagged.py compile-ring PART PARTS, time-ring   # a shared-memory ring (run Q: needs a patch)
  python scripts/explore_lagged.py compile-fold PART PARTS, time-fold   # 32-lane summary groups (run S: 2 trees)
  python scripts/explore_lagged.py compile-ahead PART PARTS, time-ahead   # summaries read a step early (run T: a patch)
  python scripts/explore_lagged.py compile-scope PART PARTS, time-scope   # GPU-scope poll (run U: a patch)
  python scripts/explore_lagged.py compile-loads PART PARTS, time-loads   # hints off, unmasked loads (run V: a patch)
  python scripts/explore_lagged.py compile-fast PART PARTS, time-fast   # fast math or not (run W)
  python scripts/explore_lagged.py compile-h200 PART PARTS, time-h200   # an H200's choice of configuration (run X)
  python scripts/explore_lagged.py compile-kept PART PARTS, time-kept   # exponentials kept in registers (run Y)
  python scripts/explore_lagged.py compile-warps PART PARTS, time-warps   # programs of one or two warps (run AD)
  python scripts/explore_lagged.py compile-ablate PART PARTS, time-ablate   # the step in parts, the summaries' read
                                                         # (runs AE-AH: a patch; ABLATE, EARLY, SUMLOAD in the env)
  python scripts/explore_lagged.py offline-kept LOG      # a run Y log's plans compiled offline (sm_90): a step's SASS
  python scripts/explore_lagged.py probe-kept            # run Y's kept and lagged kernels, checked and timed, then once
                                                         # each under ncu --profile-from-start off (run Z)
  python scripts/explore_lagged.py probe                # run four plans twice each, for `ncu -k regex:split_row_lagged`
  python scripts/explore_lagged.py probe-misaligned     # the same at 50304 and 50257 columns
  python scripts/explore_lagged.py probe-deal           # run I: where the second read of a chunk comes from
  python scripts/explore_lagged.py probe-ablate         # runs AE-AH under ncu: forward KL 4096 x 32000, 4096/4/ma96
  python scripts/explore_lagged.py probe-stalls         # run R: issue slots, pipes and stall reasons (under ncu)
  python scripts/explore_lagged.py table -fast LOG /fa   # a timing log per cell and configuration (best of each side)
  python scripts/explore_lagged.py model LOG DATA_DIR   # each timed plan of a log beside the performance model's prediction

The cells are issue 14's slow ones (bf16; each run's own losses, vocabularies and token counts below). Each plan is
checked against float64 (the loss over all rows, the gradient on 16 sampled rows) before it is timed (do_bench median,
L2 flushed). ``LAG`` (environment, default 2) sets ``split_row.LAG_STEPS`` for this process; give each value its own
``TRITON_CACHE_DIR``; ``PEEL_BYTES``, ``FORCE_PEEL`` and ``NO_EDGE`` are runs J and K's (NO_EDGE needs the kernel of
``archive/patches/run_K_edges.patch``). How it was run on the H100: ``data/h100-sxm-80gb/logs/explore_lagged_2026-11-24.txt``
(runs A to D), ``explore_read_ahead_2026-11-25.txt`` (run E), ``explore_rows_2026-11-25.txt`` (runs F to H),
``explore_deal_2026-11-25.txt`` (run I: three code trees, the kernel changes in ``archive/patches/run_I_dealt_pairs.patch``) and
``explore_peel_2026-11-26.txt`` (runs J, K and O), ``explore_even_2026-11-26.txt`` (run P: needs the kernel and
planner of ``archive/patches/run_P_even_chunks.patch``, plan_split_row's ``chunks``), ``explore_ring_2026-11-26.txt`` (run Q: needs
``archive/patches/run_Q_ring.patch``, split_row's schedule "ring"), ``ncu_lagged_stalls_2026-11-26.txt`` (run R),
``explore_fold_2026-11-26.txt`` (run S: two trees, the new one with ``archive/patches/run_S_summary_groups.patch``) and
``explore_poll_2026-11-26.txt`` (runs T and U: ``archive/patches/run_T_poll_ahead.patch``, ``archive/patches/run_U_gpu_scope_poll.patch``),
``explore_loads_2026-11-26.txt`` (run V: ``archive/patches/run_V_loads.patch``) and ``explore_fast_2026-11-26.txt`` (run W).
On an H200: ``data/h200/logs/explore_h200_2026-11-28.txt`` (run X) and ``explore_kept_2026-11-28.txt`` (run Y: needs
``data/h200/archive/patches/run_Y_kept.patch``, split_row's schedule "kept" and plan_split_row's ``keep_steps``);
``ncu_kept_2026-11-28.txt`` with ``ncu_kept_source_2026-11-28.csv.gz`` (run Z: the same patch, the command below) and
``offline_kept_2026-11-28.txt`` (run Y's plans' SASS, offline); ``explore_warps_2026-11-29.txt`` (run AD);
``explore_summaries_2026-11-29.txt`` (runs AE-AH: ``data/h200/archive/patches/run_AE_AH_summaries.patch``).
Run Z under Nsight Compute, in a tree with the patch:

  ncu --clock-control none --profile-from-start off -k regex:'split_row_(kept|lagged)_kernel' --section SpeedOfLight \
      --section Occupancy --section LaunchStats --section SchedulerStats --section WarpStateStats \
      --section MemoryWorkloadAnalysis --section InstructionStats --section SourceCounters -o kept \
      python scripts/explore_lagged.py probe-kept
  ncu --import kept.ncu-rep --page source --csv --print-source sass | gzip > ncu_kept_source.csv.gz
"""
import itertools
import json
import math
import os
import sys

import torch
import triton
import triton.language as tl

import kernels
from kernels import reference, split_row
from perfutils.data.records import exploration_records

LAG = int(os.environ.get("LAG", "2"))
# Runs AE-AH: the kernel of data/h200/archive/patches/run_AE_AH_summaries.patch reads ABLATE, EARLY, SUMLOAD and
# POLLFIRST from the environment. ABLATE takes parts of the step away: timing only, results wrong by design, not checked.
ABLATE = int(os.environ.get("ABLATE", "0"))
if ABLATE and not hasattr(split_row, "ABLATE"):
    raise SystemExit("ABLATE needs the kernel of data/h200/archive/patches/run_AE_AH_summaries.patch")
split_row.LAG_STEPS = tl.constexpr(LAG)  # before the lagged kernel is first compiled in this process
# Run J: the alignment a peeled row's body starts at (16 bytes in the kernels), for this process: VEC of the peeled
# launches (run with 6337c31, where kernels.problem held it; the cells' PEEL decisions are the same at 32 and 128 bytes).
PEEL_BYTES = int(os.environ.get("PEEL_BYTES", "16"))
# Run K: PEEL on where rows are 16-byte aligned (FORCE_PEEL=1: head and tail empty), the head/tail steps skipped
# (NO_EDGE=1: the EDGES=False of archive/patches/run_K_edges.patch's kernel; right only where head and tail are empty).
FORCE_PEEL = os.environ.get("FORCE_PEEL") == "1"
NO_EDGE = os.environ.get("NO_EDGE") == "1"
if FORCE_PEEL or NO_EDGE or PEEL_BYTES != 16:
    _peel_constexprs = kernels.problem.Problem.peel_constexprs

    def _experiment_peel(self):
        found = _peel_constexprs(self)
        peel = found["PEEL"] or FORCE_PEEL
        return dict(found, PEEL=peel, **({"VEC": PEEL_BYTES // self.logits.element_size()} if peel else {}),
                    **({"EDGES": False} if NO_EDGE else {}))

    kernels.problem.Problem.peel_constexprs = _experiment_peel
TOKENS = 4096
CELLS = [(loss, fmt, vocab) for loss, fmt in [("forward_kl", "logits"), ("cross_entropy", "labels")]
         for vocab in [32768, 50257, 50304, 100277, 151936, 256000]]
# (block_size, num_warps, options): the search's lagged candidates, wider chunks, and the prefetching kernel.
CONFIGS = [(2048, 4, {}), (4096, 4, {}), (4096, 8, {}), (8192, 4, {}), (8192, 8, {}), (8192, 16, {}),
           (16384, 8, {}), (16384, 16, {}),
           (1024, 4, {"prefetch": True}), (2048, 4, {"prefetch": True}), (4096, 4, {"prefetch": True}),
           (4096, 4, {"prefetch": True, "maxnreg": 168}), (4096, 4, {"prefetch": True, "maxnreg": 128}),
           (2048, 8, {"prefetch": True}), (8192, 8, {"prefetch": True})]
# Run E (2026-11-25): the step loop's reads issued ahead through shared memory (read_ahead) beside the plain kernel.
READ_AHEAD_CELLS = ([(loss, fmt, vocab) for loss, fmt in [("forward_kl", "logits"), ("cross_entropy", "labels")]
                     for vocab in [32000, 50257, 50304, 100277, 131072, 151936, 256000]]
                    + [("reverse_kl", "logits", 50304), ("reverse_kl", "logits", 151936)])
READ_AHEAD_CONFIGS = [(2048, 4, {}), (4096, 4, {}), (8192, 4, {}),
                      (1024, 4, {"read_ahead": 1}), (1024, 4, {"read_ahead": 2}), (2048, 4, {"read_ahead": 1}),
                      (2048, 4, {"read_ahead": 2}), (2048, 8, {"read_ahead": 1}), (4096, 4, {"read_ahead": 1}),
                      (4096, 8, {"read_ahead": 1})]
# Run X (2026-11-28, an H200): does the H200 want other lagged configurations than the search tries? The distribution
# losses at three widths, the search's candidates and wider chunks (run A's), register caps and reads issued ahead.
H200_CELLS = [(loss, "logits", vocab) for loss in ("forward_kl", "reverse_kl") for vocab in (32000, 50257, 131072)]
H200_EXTRA = [(4096, 4, {"maxnreg": 128}), (8192, 4, {"maxnreg": 168}), (8192, 4, {"maxnreg": 128}),
              (4096, 8, {"maxnreg": 96}), (2048, 4, {"read_ahead": 1}), (4096, 4, {"read_ahead": 1})]
# Run Y (2026-11-28, an H200; needs data/h200/archive/patches/run_Y_kept.patch): the "kept" schedule
# (split_row_kept_kernel: each chunk's exponentials kept in registers for one step, so a step computes one tile, not
# two) beside the lagged kernel at the search's lagged chunks; all four losses at three widths.
KEPT_CELLS = [(loss, fmt, vocab) for loss, fmt in [("forward_kl", "logits"), ("reverse_kl", "logits"),
                                                   ("cross_entropy", "logits"), ("cross_entropy", "labels")]
              for vocab in (32000, 50257, 131072)]
KEPT_CONFIGS = ([(2048, 4, {}), (4096, 4, {}), (8192, 4, {})]
                + [(block, warps, {"schedule": "kept", **ahead}) for block, warps in
                   [(1024, 4), (2048, 4), (2048, 8), (4096, 8), (4096, 4)] for ahead in ({}, {"read_ahead": 1})]
                + [(block, warps, {"schedule": "kept", "read_ahead": 2}) for block, warps in [(1024, 4), (2048, 4)]])
# Run Y's last pass: two sets of exponentials kept, a row finished two steps after it was read (the lagged kernel's
# slack), at the narrow chunks that leave registers for both sets.
KEPT2_CONFIGS = ([(2048, 4, {}), (4096, 4, {}), (8192, 4, {})]
                 + [(block, warps, {"schedule": "kept", **steps}) for block, warps in
                    [(512, 4), (1024, 4), (1024, 8), (2048, 4), (2048, 8)] for steps in ({}, {"keep_steps": 2})])
# Run F (2026-11-25): one program per row (split=False) at tiles and warps the search does not try, with and without
# keep_last (the row's last tile kept in registers between the walks), where labels CE misses 85% (32000, 32064,
# 50257) and beside aligned neighbours.
ROW_CELLS = ([("cross_entropy", "labels", vocab) for vocab in [32000, 32064, 32768, 50257, 50304, 65536]]
             + [("forward_kl", "logits", vocab) for vocab in [32000, 50257]])
ROW_CONFIGS = [(tile, warps, {"split": False, **keep}) for tile, warps in
               [(32768, 16), (16384, 16), (16384, 8), (8192, 8), (8192, 4), (4096, 4)]
               for keep in ({}, {"keep_last": True})] + [(8192, 4, {}), (4096, 4, {})]
# Run G (2026-11-25): labels CE's lagged kernel on rows that are not 16-byte aligned compiles to 128 registers where
# the aligned rows' takes 80 (4096-column chunks), yet runs without spilling under a cap of 64 (offline sm_90
# compile); the search's twins stop two programs per SM above ptxas's count (96, 80). Deeper caps, both token counts.
CAP_CELLS = [("cross_entropy", "labels", vocab, tokens) for tokens in (4096, 16384)
             for vocab in [32000, 50257, 50304, 100277]]
CAP_CONFIGS = ([(4096, 4, {"maxnreg": cap} if cap else {}) for cap in (None, 96, 80, 72, 64)]
               + [(8192, 4, {"maxnreg": cap} if cap else {}) for cap in (None, 128, 96, 80)]
               + [(2048, 4, {"maxnreg": cap} if cap else {}) for cap in (None, 64, 56)])
# Run H (2026-11-25): the last chunk's program reads each row's head and tail with its chunk (edge_tiles) instead of
# after it; the same configurations before and after the change (two code trees, alternated), rows that are and are
# not 16-byte aligned, both token counts.
EDGE_CELLS = [(loss, fmt, vocab, tokens) for tokens in (4096, 16384) for loss, fmt in
              [("cross_entropy", "labels"), ("cross_entropy", "logits"), ("forward_kl", "logits"),
               ("reverse_kl", "logits")] for vocab in [50257, 50304, 100277]]
EDGE_CONFIGS = [(4096, 4, {}), (4096, 4, {"maxnreg": 128}), (4096, 4, {"maxnreg": 72}), (8192, 4, {"maxnreg": 96})]
# Run I (2026-11-25): the lagged kernel deals (row, chunk) pairs to every resident program instead of giving each a
# fixed chunk of every n_slots-th row (38 chunks at 151936 columns left 34 of 528 resident programs idle); before and
# after (code trees alternated: see the log), where the chunk count divides the grid (32000) and where it does not.
DEAL_CELLS = [(loss, fmt, vocab, tokens) for tokens in (4096, 16384) for loss, fmt in
              [("cross_entropy", "labels"), ("cross_entropy", "logits"), ("forward_kl", "logits"),
               ("reverse_kl", "logits")] for vocab in [32000, 50304, 131072, 151936, 200064, 256000]]
DEAL_CONFIGS = [(4096, 4, {}), (4096, 4, {"maxnreg": 128}), (8192, 4, {"maxnreg": 128})]
# ... and labels CE where it misses 85% of copy, at the configurations the search chose there or nearly did.
DEAL_LABEL_CELLS = [("cross_entropy", "labels", vocab, tokens) for tokens in (4096, 16384)
                    for vocab in [32000, 32064, 50257, 100277]]
DEAL_LABEL_CONFIGS = [(4096, 4, {"maxnreg": 72}), (4096, 4, {"maxnreg": 96}), (8192, 4, {"maxnreg": 128}),
                      (8192, 4, {"maxnreg": 96})]
# Run J (2026-11-26): the peeled rows' body starts 16-byte aligned, so a warp's 512-byte access spans five 128-byte
# lines (17 sectors every other row at 50257) where an aligned row's spans four: the body aligned to 32 or 128 bytes
# instead (PEEL_BYTES; head and tail up to 63 columns each). Rows that are not 16-byte aligned (50257, 100277), one
# that is 16- but not 128-byte aligned (50264) and an aligned control (50304, the same kernel in every process).
ALIGN_CELLS = ([("cross_entropy", "labels", vocab, tokens) for tokens in (4096, 16384)
                for vocab in [50257, 50264, 50304, 100277]]
               + [(loss, "logits", vocab, 4096) for loss in ("cross_entropy", "forward_kl", "reverse_kl")
                  for vocab in [50257, 50304, 100277]])
ALIGN_CONFIGS = {"labels": [(4096, 4, {"maxnreg": 72}), (8192, 4, {"maxnreg": 128}), (8192, 4, {"maxnreg": 96})],
                 "logits": [(4096, 4, {}), (4096, 4, {"maxnreg": 128})]}
# Run K (2026-11-26): run J's 50264 (rows 16-byte aligned, PEEL on with empty head and tail) ran like 50257: is the
# cost the head/tail steps or the peeled addressing? 50304 with PEEL forced on, and both with the head/tail steps off.
FORCE_CELLS = ([("cross_entropy", "labels", vocab, tokens) for tokens in (4096, 16384) for vocab in [50264, 50304]]
               + [("forward_kl", "logits", vocab, 4096) for vocab in [50264, 50304]])
# Run O (2026-11-26): the lagged kernel's chunk start as int32 instead of int64 (one line, archive/patches/run_O_int32_start.patch:
# 16-32 fewer SASS instructions offline, the distribution losses' 64-bit compares 14 -> 2); two code trees alternated.
INT32_CELLS = [(loss, fmt, vocab, 4096) for loss, fmt in [("cross_entropy", "labels"), ("cross_entropy", "logits"),
                                                            ("forward_kl", "logits"), ("reverse_kl", "logits")]
               for vocab in [50304, 151936]]
INT32_CONFIGS = [(4096, 4, {}), (8192, 4, {"maxnreg": 128})]
# Run P (2026-11-26): even chunks (plan_split_row's ``chunks``): a row cut into chunks of equal width (a multiple of
# 64 columns) instead of block_size-wide chunks and a sliver (151936 / 4096: 37 full chunks and 384 columns), and
# more, narrower chunks that fill the resident programs with the same rows in flight (R // (R // chunks), R: the
# resident programs of the 4-programs-per-SM kernels, 528 on the H100) or one more chunk a row.
EVEN_CELLS = ([("forward_kl", "logits", vocab, 4096) for vocab in [32000, 50257, 50304, 100277, 128256, 151936, 200064,
                                                                    256000]]
              + [(loss, "logits", vocab, 4096) for loss in ("reverse_kl", "cross_entropy") for vocab in [50257, 151936]]
              + [("forward_kl", "logits", 151936, 16384)])
EVEN_LABEL_CELLS = [("cross_entropy", "labels", vocab, tokens) for vocab in [50257, 50304, 100277]
                    for tokens in (4096, 16384)]
EVEN_RESIDENT = 528
# Run Q (2026-11-26): the ring schedule (split_row's schedule="ring": the lagged kernel in Gluon with each chunk's
# second read from a shared-memory ring; needs the kernel, planner and tests of archive/patches/run_Q_ring.patch) beside the
# lagged kernel at the configurations the search picks most, where the distribution losses miss 80% of copy and
# labels CE misses 85% (or quack).
RING_CELLS = ([(loss, "logits", vocab, 4096) for loss in ("cross_entropy", "forward_kl", "reverse_kl")
               for vocab in [32000, 50257, 128256, 151936, 262144]]
              + [("forward_kl", "logits", vocab, 16384) for vocab in [32000, 151936]]
              + [("cross_entropy", "labels", vocab, 4096) for vocab in [32000, 50257, 151936]])
RING_CONFIGS = ([(4096, 4, {}), (8192, 4, {"maxnreg": 128})]
                + [(block, warps, {"schedule": "ring", **({"maxnreg": cap} if cap else {})})
                   for block, warps, cap in [(1024, 4, None), (2048, 4, None), (2048, 4, 80), (2048, 4, 64),
                                             (4096, 4, None), (4096, 8, None), (8192, 8, None)]])

# Run S (2026-11-26): a row's summaries polled 32 lanes at a time above 32 chunks, the groups folded lane by lane (one
# vector of 64 lanes spans two warps and cost registers), in two code trees alternated (1beb105's split_row and the
# change of archive/patches/run_S_summary_groups.patch).
FOLD_CELLS = ([(loss, fmt, vocab, 4096) for loss, fmt in [("cross_entropy", "labels"), ("cross_entropy", "logits"),
                                                            ("forward_kl", "logits"), ("reverse_kl", "logits")]
               for vocab in [131072, 151936, 200064, 256000, 262144]]
              + [("forward_kl", "logits", 151936, 16384), ("cross_entropy", "labels", 151936, 16384)])
FOLD_CONFIGS = [(4096, 4, {}), (4096, 4, {"maxnreg": 128}), (2048, 4, {}), (8192, 4, {"maxnreg": 128})]
# Run T (2026-11-26): the summaries of the row a step finishes read one step early (plan_split_row's poll_ahead), at
# the cells where the distribution losses miss 80% of copy, labels CE 85%, with and without a 128-register cap.
AHEAD_CELLS = ([(loss, "logits", vocab, 4096) for loss in ("cross_entropy", "forward_kl", "reverse_kl")
                for vocab in [32000, 50257, 50304, 100277, 128256, 151936, 200064, 256000]]
               + [("cross_entropy", "labels", vocab, 4096) for vocab in [32000, 50257, 151936]]
               + [("forward_kl", "logits", vocab, 16384) for vocab in [50257, 151936]])
AHEAD_CONFIGS = [(block, 4, {**ahead, **cap}) for block in (4096, 8192) for cap in ({}, {"maxnreg": 128})
                 for ahead in ({}, {"poll_ahead": True})]
# Run U (2026-11-26): the same cells, the summaries polled with GPU-scope loads (ld.relaxed.gpu, plan_split_row's
# gpu_scope_poll) instead of volatile ones (system scope).
SCOPE_CONFIGS = [(block, 4, {**scope, **cap}) for block in (4096, 8192) for cap in ({}, {"maxnreg": 128})
                 for scope in ({}, {"gpu_scope_poll": True})]
# Run V (2026-11-26): the chunk reads without their L2 eviction hints (plan_split_row's hints=False) and, for a chunk
# wholly inside its row, without a mask (full_loads: no -inf moved into the registers first, no bound check per vector;
# raises registers 128 -> 163-168 offline, so under the 128-register cap too).
LOADS_CELLS = ([(loss, "logits", vocab, 4096) for loss in ("cross_entropy", "forward_kl", "reverse_kl")
                for vocab in [32000, 50257, 50304, 128256, 151936, 256000]]
               + [("cross_entropy", "labels", vocab, 4096) for vocab in [32000, 50257, 151936]])
LOADS_CONFIGS = ([(4096, 4, options) for options in ({}, {"hints": False}, {"maxnreg": 128},
                                                     {"hints": False, "maxnreg": 128},
                                                     {"full_loads": True, "maxnreg": 128},
                                                     {"full_loads": True, "hints": False, "maxnreg": 128})]
                 + [(8192, 4, {"maxnreg": 128}), (8192, 4, {"hints": False, "maxnreg": 128})])
# Run W (2026-11-26): fewer instructions per step and element (statistics from the raw tiles,
# row_math.tile_statistics_raw; approximate log2 and division for the row's scalars) beside the kernel as it was. Run
# with 9543a51 and archive/patches/run_W_fast.patch, where it was plan_split_row's option fast (default off, "fa" in the log); it
# has been the lagged kernel's default since (fast_math, default on): {"fast_math": False} is the kernel it was run
# beside.
FAST_CELLS = LOADS_CELLS + [(loss, "logits", vocab, 16384) for loss in ("forward_kl", "reverse_kl")
                            for vocab in [50257, 151936]]
FAST_CONFIGS = [(4096, 4, {**fast, **cap}) for cap in ({}, {"maxnreg": 128}, {"maxnreg": 96})
                for fast in ({"fast_math": False}, {})] + [(8192, 4, {**fast, "maxnreg": 128})
                                                           for fast in ({"fast_math": False}, {})]

# Run AD (2026-11-29, data/h200/logs/explore_warps_2026-11-29.txt; reading: no gain, not added to the search):
# programs of one or two warps. A lagged step waits about 1.3 us (H100) to 2 us (H200) beyond its loads' round trip
# (perfutils.model.predict.exchange_wait, fitted with counted steps), and each step of a 4-warp program holds 6
# barriers (cross-warp reductions); a one-warp program has none. Offline (sm_90): 1024 columns and 1 warp, 122
# registers, 16 programs an SM, a step of 1143 instructions (4096/4: 1196); the model predicted forward KL 4096 x 32000
# on the H200 at 0.255 ms against 0.270 for 4096/4. The search's usual choices run beside them. Labels CE does not
# compile with one warp on Triton 3.6 ("PassManager::run failed"), nor at 131072 in 2048/2: recorded as errors.
# Runs AE-AH (2026-11-29, an H200, data/h200/logs/explore_summaries_2026-11-29.txt; the kernel of
# data/h200/archive/patches/run_AE_AH_summaries.patch): the lagged step with parts taken away (ABLATE bits) and the
# row's summaries read in other ways (EARLY, SUMLOAD, POLLFIRST), one process and cache each.
ABLATE_CELLS = [(loss, fmt, vocab, TOKENS) for loss, fmt in (("cross_entropy", "labels"), ("forward_kl", "logits"),
                                                             ("reverse_kl", "logits"))
                for vocab in (32000, 131072)]
ABLATE_CONFIGS = [(4096, 4, {}), (4096, 4, {"maxnreg": 96}), (8192, 4, {"maxnreg": 128})]
WARPS_CELLS = [(loss, fmt, vocab, TOKENS) for loss, fmt in (("cross_entropy", "labels"), ("cross_entropy", "logits"),
                                                            ("forward_kl", "logits"), ("reverse_kl", "logits"))
               for vocab in (32000, 50257, 131072)]
WARPS_CONFIGS = [(4096, 4, {}), (4096, 4, {"maxnreg": 96}), (8192, 4, {"maxnreg": 128}), (2048, 2, {}),
                 (1024, 1, {}), (1024, 1, {"maxnreg": 96}), (512, 1, {}), (2048, 1, {})]


def even_configs(bases):
    """Run P: each of ``bases`` (the search's choices at these cells) as is, with even chunks, with narrower ones that
    fill the resident programs, and with one more chunk a row."""
    def configs(vocab):
        out = []
        for block, warps, options in bases(vocab):
            first = math.ceil(vocab / block)
            resident = EVEN_RESIDENT // (2 if options.get("maxnreg") == 251 else 1)
            fill = resident // max(resident // first, 1)
            out += [(block, warps, options)] + [(block, warps, dict(options, chunks=chunks))
                                                 for chunks in sorted({first, fill, first + 1})]
        return out
    return configs


def even_distribution_bases(vocab):
    return ([(4096, 4, {})] + ([(4096, 4, {"maxnreg": 128})] if vocab > 131072 else [])
            + ([(8192, 4, {"maxnreg": 251})] if vocab >= 256000 else []))


PROBES = {"probe": [("forward_kl", "logits", 50304, 4096, 4, {}), ("forward_kl", "logits", 151936, 8192, 4, {}),
                    ("cross_entropy", "labels", 151936, 8192, 4, {}), ("cross_entropy", "labels", 50304, 8192, 4, {})],
          # run I, under ncu in each code tree: L2 and DRAM traffic when a chunk's second read is another program's
          "probe-deal": [("forward_kl", "logits", 131072, 4096, 4, {}), ("forward_kl", "logits", 32000, 4096, 4, {})],
          # the same kernels on rows that are and are not 16-byte aligned
          "probe-misaligned": [("forward_kl", "logits", 50304, 4096, 4, {}), ("forward_kl", "logits", 50257, 4096, 4, {}),
                               ("cross_entropy", "labels", 50304, 8192, 4, {}),
                               ("cross_entropy", "labels", 50257, 8192, 4, {"maxnreg": 96})],
          # runs AE-AH (with their patch, one ABLATE / SUMLOAD value a process): the summaries' read under ncu
          "probe-ablate": [("forward_kl", "logits", 32000, 4096, 4, {"maxnreg": 96})],
          # run R: where a step's time goes (issue slots, pipes, stall reasons) in a slow and a fast distribution cell
          # and in labels CE's fast kernel
          "probe-stalls": [("forward_kl", "logits", 151936, 4096, 4, {}), ("forward_kl", "logits", 128256, 4096, 4, {}),
                           ("cross_entropy", "labels", 151936, 8192, 4, {"maxnreg": 128})]}


def lagged_configs(vocab):
    """Runs A to D: the search's lagged and unsplit candidates, wider chunks, prefetching."""
    out = [(b, w, o) for b, w, o in CONFIGS if b < vocab and math.ceil(vocab / b) <= (128 if b == 1024 else 64)]
    if vocab <= 65536:  # one program per row (the search's unsplit candidates)
        tile = min(32768, triton.next_power_of_2(vocab))
        out += [(tile, max(4, min(32, tile // 1024)), {"split": False}),
                (tile // 2, max(4, min(32, tile // 2048)), {"split": False})]
    return out


def h200_configs(vocab):
    """Run X: run A's configurations and H200_EXTRA (chunks narrower than the row)."""
    return lagged_configs(vocab) + [(b, w, o) for b, w, o in H200_EXTRA if b < vocab]


def read_ahead_configs(vocab):
    return [(b, w, o) for b, w, o in READ_AHEAD_CONFIGS if b < vocab and math.ceil(vocab / b) <= 64]


def row_configs(vocab):  # a tile wider than the row is the single-tile kernel, which the search already tries
    return [(b, w, o) for b, w, o in ROW_CONFIGS if b < vocab or (b == 32768 and not o.get("keep_last"))]


# The runs by command suffix ("compile<suffix>", "time<suffix>"): (cells as (loss, format, vocab, tokens), configs).
RUNS = {"": ([(*cell, TOKENS) for cell in CELLS], lagged_configs),
        "-read-ahead": ([(*cell, TOKENS) for cell in READ_AHEAD_CELLS], read_ahead_configs),
        "-h200": ([(*cell, TOKENS) for cell in H200_CELLS], h200_configs),
        "-kept": ([(*cell, TOKENS) for cell in KEPT_CELLS], lambda vocab: KEPT_CONFIGS),
        "-kept2": ([(*cell, TOKENS) for cell in KEPT_CELLS], lambda vocab: KEPT2_CONFIGS),
        "-rows": ([(*cell, TOKENS) for cell in ROW_CELLS], row_configs),
        "-caps": (CAP_CELLS, lambda vocab: CAP_CONFIGS),
        "-edge": (EDGE_CELLS, lambda vocab: EDGE_CONFIGS),
        "-deal": (DEAL_CELLS, lambda vocab: DEAL_CONFIGS),
        "-deal-labels": (DEAL_LABEL_CELLS, lambda vocab: DEAL_LABEL_CONFIGS),
        "-align": (ALIGN_CELLS, None),
        "-force": (FORCE_CELLS, None),
        "-int32": (INT32_CELLS, lambda vocab: INT32_CONFIGS),
        "-even": (EVEN_CELLS, even_configs(even_distribution_bases)),
        "-even-labels": (EVEN_LABEL_CELLS, even_configs(lambda vocab: [(8192, 4, {"maxnreg": 128})])),
        "-ring": (RING_CELLS, lambda vocab: RING_CONFIGS),
        "-fold": (FOLD_CELLS, lambda vocab: FOLD_CONFIGS),
        "-ahead": (AHEAD_CELLS, lambda vocab: AHEAD_CONFIGS),
        "-scope": (AHEAD_CELLS, lambda vocab: SCOPE_CONFIGS),
        "-loads": (LOADS_CELLS, lambda vocab: LOADS_CONFIGS),
        "-fast": (FAST_CELLS, lambda vocab: FAST_CONFIGS),
        "-ablate": (ABLATE_CELLS, lambda vocab: [c for c in ABLATE_CONFIGS if c[0] < vocab]),
        "-warps": (WARPS_CELLS, lambda vocab: [(b, w, o) for b, w, o in WARPS_CONFIGS if math.ceil(vocab / b) <= 256])}


def inputs(fmt, vocab, rows=TOKENS):
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(rows, vocab, generator=gen, device="cuda") * 2).to(torch.bfloat16)
    t = (torch.randint(0, vocab, (rows,), generator=gen, device="cuda") if fmt == "labels"
         else (torch.randn(rows, vocab, generator=gen, device="cuda") * 2).to(torch.bfloat16))
    return x, t


@triton.jit
def stream_kernel(x_ptr, t_ptr, y_ptr, n, TWO: tl.constexpr, BLOCK: tl.constexpr):
    """The bytes of the loss with none of its math: read x (and t), write one tensor."""
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    value = tl.load(x_ptr + offsets, mask=mask).to(tl.float32)
    if TWO:
        value += tl.load(t_ptr + offsets, mask=mask).to(tl.float32)
    tl.store(y_ptr + offsets, value.to(y_ptr.dtype.element_ty), mask=mask)


def label(block, warps, options):
    return f"{block}/{warps}" + "".join(f"/{key[:2]}{'' if value is True else value}" for key, value in options.items())


def copy_gbps():
    from perfutils.measure.measurer import read_copy_gbps
    from perfutils.data.schema import data_path

    gpu = torch.cuda.get_device_name()
    return read_copy_gbps(data_path("data", gpu, "ceilings"), gpu)


def session_copy_gbps():
    """The recorded copy bandwidth (copy_gbps), after a first JSON line naming the GPU and the versions."""
    copy = copy_gbps()
    print(json.dumps({"gpu": torch.cuda.get_device_name(), "copy_gbps_recorded": copy, "torch": torch.__version__,
                      "triton": triton.__version__}), flush=True)
    return copy


def cell_bytes(fmt, vocab, tokens):
    """The bytes a cell's loss must move at least: read the logits (and the target logits), write the gradient."""
    return tokens * vocab * 2 * (2 if fmt == "labels" else 3)


def references(x, t, loss, fmt):
    """What a plan of this cell is checked against: the float64 loss over all rows, the gradient on 16 sampled rows."""
    rows = torch.randperm(x.shape[0], device="cuda")[:16]
    ref_loss = reference.entropy_loss_in_blocks(x, t, loss=loss, target_format=fmt)
    _unused, ref_grad = reference.entropy_loss_forward_backward(x[rows], t[rows], loss=loss, target_format=fmt)
    return rows, ref_loss, ref_grad


def checked_ms(call, check, strict=None):
    """Run ``call`` (a plan's ``run``, a public call: anything returning (loss, gradient)) once and check it against
    ``check`` (:func:`references`; an AssertionError past 1e-2 when ``strict``, by default unless this process
    takes parts of the kernel away, ABLATE), then time it (do_bench median, L2 flushed): (ms, the larger relative error
    of the loss and the gradient)."""
    rows, ref_loss, ref_grad = check
    value, grad = call()
    loss_err = float(abs(value.double() - ref_loss) / abs(ref_loss))
    grad_err = float((grad[rows].double() * grad.shape[0] / len(rows) - ref_grad).norm() / ref_grad.norm())
    if max(loss_err, grad_err) > 1e-2 and (not ABLATE if strict is None else strict):
        raise AssertionError(f"wrong result: loss {loss_err:.1e}, gradient {grad_err:.1e}")
    return triton.testing.do_bench(call, return_mode="median"), max(loss_err, grad_err)


def run(phase, cells, configs, part=0, parts=1):
    timing = phase == "time"
    copy = copy_gbps() if timing else None
    shares = itertools.count()  # compile: the (cell, configuration) pairs dealt to the processes in turn
    for loss, fmt, vocab, tokens in cells:
        if not timing:  # the kernels a cell compiles do not depend on its row count (both multiples of 16)
            tokens = min(tokens, TOKENS)
        x, t = inputs(fmt, vocab, tokens)
        nbytes = cell_bytes(fmt, vocab, tokens)
        if timing:
            out = torch.empty_like(x)
            for block, warps in [(4096, 4), (8192, 8)]:
                ms = triton.testing.do_bench(lambda: stream_kernel[(triton.cdiv(x.numel(), block),)](
                    x, t, out, x.numel(), TWO=fmt != "labels", BLOCK=block, num_warps=warps), return_mode="median")
                print(json.dumps({"lag": LAG, "loss": loss, "vocab": vocab, "tokens": tokens, "cfg": f"stream{block}/{warps}",
                                  "ms": round(ms, 4), "pct": round(nbytes / ms / 1e6 / copy * 100, 1)}), flush=True)
            del out
            check = references(x, t, loss, fmt)
        for block, warps, options in (configs(vocab) if configs else ALIGN_CONFIGS[fmt]):
            if not timing and next(shares) % parts != part:
                continue
            record = {"lag": LAG, **({"ablate": ABLATE} if ABLATE else {}), "loss": loss, "fmt": fmt, "vocab": vocab,
                      "tokens": tokens,
                      "cfg": label(block, warps, options),
                      **({"peel_bytes": PEEL_BYTES} if PEEL_BYTES != 16 else {}),
                      **({"force_peel": True} if FORCE_PEEL else {}), **({"no_edge": True} if NO_EDGE else {})}
            try:
                plan = kernels.prepare(x, t, loss=loss, target_format=fmt, variant="split_row", block_size=block,
                                       num_warps=warps, **options)
                record.update(programs=plan.config.get("programs"), chunks=plan.config.get("num_chunks"),
                              schedule=plan.config.get("schedule"))
                if timing:
                    ms, err = checked_ms(plan.run, check)
                    compiled = plan.launches[0].compiled
                    record.update(ms=round(ms, 4), pct=round(nbytes / ms / 1e6 / copy * 100, 1),
                                  err=round(err, 5), regs=compiled.n_regs,
                                  spills=getattr(compiled, "n_spills", None))
                del plan
            except Exception as error:  # noqa: BLE001 - an exploration records what failed and goes on
                record["error"] = f"{type(error).__name__}: {error}"[:160]
            if timing:
                print(json.dumps(record), flush=True)
        del x, t
        torch.cuda.empty_cache()


def probe(cases):
    for loss, fmt, vocab, block, warps, options in cases:
        x, t = inputs(fmt, vocab)
        plan = kernels.prepare(x, t, loss=loss, target_format=fmt, variant="split_row", block_size=block,
                               num_warps=warps, **options)
        plan.run()  # compiles; ncu profiles both runs (the second is the one read)
        torch.cuda.synchronize()
        plan.run()
        torch.cuda.synchronize()
        print("ran", loss, vocab, plan.config, flush=True)


# Run Z (2026-11-28, an H200; run Y's patch): why the kept schedule is slower, seen by Nsight Compute. Three cells, the
# kept kernel at its best chunks of run Y beside the lagged kernel at the same chunks and at the search's.
PROBE_KEPT = [((loss, fmt, vocab), (block, 4, options)) for loss, fmt, vocab in
              [("forward_kl", "logits", 32000), ("forward_kl", "logits", 131072), ("cross_entropy", "labels", 32000)]
              for block, options in [(2048, {"schedule": "kept"}), (2048, {}), (4096, {})]]


def probe_kept():
    """Run Z: every plan of PROBE_KEPT checked against float64 and timed (JSON lines as the runs print), then each run
    once between cudaProfilerStart and Stop, the launches ncu profiles ("profiled" lines, in ncu's order)."""
    copy = copy_gbps()
    plans = []
    for (loss, fmt, vocab), (block, warps, options) in PROBE_KEPT:
        x, t = inputs(fmt, vocab)
        plan = kernels.prepare(x, t, loss=loss, target_format=fmt, variant="split_row", block_size=block,
                               num_warps=warps, **options)
        ms, err = checked_ms(plan.run, references(x, t, loss, fmt))
        record = {"loss": loss, "fmt": fmt, "vocab": vocab, "tokens": TOKENS, "cfg": label(block, warps, options),
                  "schedule": plan.config.get("schedule"), "programs": plan.config.get("programs"),
                  "chunks": plan.config.get("num_chunks"), "regs": plan.launches[0].compiled.n_regs,
                  "ms": round(ms, 4), "pct": round(cell_bytes(fmt, vocab, TOKENS) / ms / 1e6 / copy * 100, 1),
                  "err": round(err, 5)}
        print(json.dumps(record), flush=True)
        plans.append((record, plan))  # the plan holds its inputs
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for record, plan in plans:
        plan.run()
        torch.cuda.synchronize()
        print("profiled", json.dumps({key: record[key] for key in ("loss", "vocab", "cfg")}), flush=True)
    torch.cuda.profiler.stop()


def cooperative_launch(loss, fmt, vocab, block, warps, options, rows=64):
    """The cooperative split_row launch a GPU would run for this plan, built on a CPU (where prepare gives the
    multi-launch form): the stats launch's constexprs, the schedule's kernel and its own constexprs, three slots.
    Built by hand because run Y's patched tree (6f1793f) predates kernels.split_row.cooperative_launch, which builds
    the product's launches the same way."""
    from kernels.launch import Launch
    from kernels.problem import build_problem

    x = torch.zeros(rows, vocab, dtype=torch.bfloat16)
    t = torch.zeros(rows, dtype=torch.int64) if fmt == "labels" else torch.zeros(rows, vocab, dtype=torch.bfloat16)
    plan = kernels.prepare(x, t, loss=loss, target_format=fmt, variant="split_row", block_size=block,
                           num_warps=warps, cooperative=False)
    stats = plan.launches[0]
    constexprs = {name: value for name, value in stats.constexprs.items() if name != "PHASE"}
    constexprs.update(build_problem(x, t, loss=loss, target_format=fmt, grad_output=None, ignore_index=-100,
                                    loss_mask=None).peel_constexprs())
    if options.get("read_ahead"):
        constexprs["READ_AHEAD"] = options["read_ahead"]
    if options.get("schedule") == "kept":
        fn = split_row.split_row_kept_kernel  # run Y's patch
        if options.get("keep_steps", 1) != 1:
            constexprs["KEEP_STEPS"] = options["keep_steps"]
    else:
        fn = split_row.split_row_lagged_kernel
        constexprs["POLL_FIRST"] = fmt == "labels"
    return Launch(f"split_row.{options.get('schedule', 'lagged')}", fn, (3 * constexprs["NUM_CHUNKS"],),
                  dict(stats.args, n_slots=3), constexprs, num_warps=warps, maxnreg=options.get("maxnreg"))


def options_of(cfg: str) -> tuple[int, int, dict]:
    """A plan label (:func:`label`) back to ``(block, warps, options)``, for the options run Y used."""
    block, warps, *rest = cfg.split("/")
    names = {"sc": ("schedule", str), "re": ("read_ahead", int), "ke": ("keep_steps", int), "ma": ("maxnreg", int)}
    options = {names[part[:2]][0]: names[part[:2]][1](part[2:]) for part in rest}
    return int(block), int(warps), options


def offline_kept(log: str):
    """Every plan a run Y log timed (``LOG``, all its passes), compiled offline for sm_90, one JSON line each: the
    registers and the instructions of a step in the SASS (perfutils.model.cubin.main_loop_instructions)."""
    import contextlib
    import io

    from perfutils.model.cubin import main_loop_instructions
    from perfutils.model.offline_compile import compile_launch

    seen = set()
    for record in exploration_records(log):
        key = (record["loss"], record.get("fmt"), record["vocab"], record["cfg"])
        if "ms" not in record or not record.get("schedule") or key in seen:
            continue
        seen.add(key)
        loss, fmt, vocab, cfg = key
        out = {"loss": loss, "fmt": fmt, "vocab": vocab, "cfg": cfg}
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                compiled = compile_launch(cooperative_launch(loss, fmt, vocab, *options_of(cfg)))
            out.update(regs=compiled.n_regs, **main_loop_instructions(compiled.sass))
        except Exception as error:  # noqa: BLE001 - a configuration that does not compile is a record
            out["error"] = f"{type(error).__name__}: {error}"[:160]
        print(json.dumps(out), flush=True)


def table(run_name: str, log: str, split: str | None = None) -> None:
    """A timing log's records (``time-<run>``'s JSON lines, as kept in data/<gpu>/logs) per cell and configuration:
    each pass's % of copy and the kernel's registers, then per cell the best configuration (mean over passes) of each
    side: the code trees of a two-tree run ("tree"), else configurations whose label contains ``split`` or not.
    ``LOG::HEADER`` reads only the records under that "## ..." header (a log holding several runs).
    Cells are the run's own, in order (each cell's records start with its stream rows: the logs of runs before W name
    no target format); a pass that stopped early (a crash) ends at its last record."""
    import collections

    cells = RUNS[run_name][0]
    records = exploration_records(log)
    found = collections.defaultdict(list)  # (cell, cfg, side) -> records
    index, tree = -1, None
    for record in records:
        if record.get("tree") != tree:  # another code tree's pass starts with the run's first cell
            index, tree = -1, record.get("tree")
        if record["cfg"].startswith("stream"):
            index += record["cfg"] == "stream4096/4"
            continue
        cell = cells[index % len(cells)]
        side = tree if tree is not None else ("with" if split and split in record["cfg"] else "without")
        found[(cell, record["cfg"], side)].append(record)
    for cell in cells:
        loss, fmt, vocab, tokens = cell
        best = {}
        for (other, cfg, side), rows in found.items():
            if other != cell:
                continue
            pcts = [row["pct"] for row in rows if "pct" in row]
            regs = rows[0].get("regs", "-")
            print(f"{loss}/{fmt} {tokens} x {vocab} {cfg} [{side}]: "
                  + (" ".join(f"{pct:.1f}" for pct in pcts) + f" ({regs} registers)" if pcts else "failed"))
            if pcts and sum(pcts) / len(pcts) > best.get(side, (0, ""))[0]:
                best[side] = (sum(pcts) / len(pcts), cfg)
        print(f"  best: " + ", ".join(f"{side} {mean:.1f} ({cfg})" for side, (mean, cfg) in sorted(best.items())))
    errors = [record["err"] for record in records if "err" in record]
    print(f"{len(errors)} plans checked, max error {max(errors):.1e}; {sum('error' in r for r in records)} failed")


def model(log: str, folder: str) -> None:
    """Each timed plan of a timing log beside what the performance model predicts for it, with the ceilings of
    ``folder`` (the GPU the log was measured on): perfutils.plots.prediction.built_check; ``LOG::HEADER`` as for
    :func:`table`."""
    from perfutils.model.predict import gpu_from_folder
    from perfutils.plots.prediction import built_check, built_reading

    frame = built_check(exploration_records(log), gpu_from_folder(folder))
    for r in frame.itertuples():
        print(f"{r.loss}/{r.target_format} {r.tokens} x {r.vocab} {r.config}: measured {r.measured_pct:.1f}%, "
              f"predicted {r.predicted_pct:.1f}% ({r.bound}), {r.n_regs} registers")
    if {"kept", "lagged"} <= set(frame["design"]):  # a log with both designs (run Y)
        print(built_reading(frame))


if __name__ == "__main__":
    command = sys.argv[1]
    if command == "table":
        table(sys.argv[2], sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else None)
    elif command == "model":
        model(sys.argv[2], sys.argv[3])
    elif command == "probe-kept":
        probe_kept()
    elif command == "offline-kept":
        offline_kept(sys.argv[2])
    elif command in PROBES:
        probe(PROBES[command])
    elif command.startswith("compile") and command[len("compile"):] in RUNS:
        run("compile", *RUNS[command[len("compile"):]], int(sys.argv[2]), int(sys.argv[3]))
    elif command.startswith("time") and command[len("time"):] in RUNS:
        run("time", *RUNS[command[len("time"):]])
    else:
        raise SystemExit(__doc__)
