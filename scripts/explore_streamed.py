"""Exploration (issue 39, not a recorded study): whole rows streamed through TMA (perfutils.lab_kernels.streamed_row)
beside the product's public call, in one process, at 4096 tokens.

  python scripts/explore_streamed.py compile PART PARTS   # compile a share of the configurations (16-row inputs)
  python scripts/explore_streamed.py time [VOCAB ...]     # check and time every configuration: one JSON line each
  python scripts/explore_streamed.py resident             # run AB: the resident row made persistent, next rows in
                                                          # flight through TMA (resident_tma_loss), rows <= 32768
  python scripts/explore_streamed.py probe                # run AA's best beside the public call, once each between
                                                          # cudaProfilerStart/Stop, for:
  ncu --clock-control none --profile-from-start off --section SpeedOfLight --section MemoryWorkloadAnalysis \
      --section SchedulerStats --section WarpStateStats --section Occupancy --section LaunchStats \
      --section InstructionStats -o streamed python scripts/explore_streamed.py probe

Each configuration (block, warps, stages, programs per SM) is checked against float64 (the loss over all rows, the
gradient on 16 sampled rows) before it is timed (do_bench median, L2 flushed). Both sides are calls with their
allocations: ``streamed_row_loss`` (kernel, gradient and row-loss buffers, a torch sum) and the product's public
``kernels.entropy_loss_forward_backward``. % of copy: the bytes a loss must move (``explore_lagged.cell_bytes``)
over the copy bandwidth of the GPU's recorded ceilings, and over a torch copy of the same bytes timed here.
"""
import itertools
import json
import sys

import torch
import triton

import kernels
from explore_lagged import TOKENS, cell_bytes, checked_ms, inputs, references, session_copy_gbps
from perfutils.lab_kernels.streamed_row import resident_tma_loss, streamed_row_loss

LOSSES = [("cross_entropy", "labels"), ("forward_kl", "logits"), ("reverse_kl", "logits"), ("cross_entropy", "logits")]
VOCABS = [32000, 50304, 65536, 131072]
SHARED_BYTES = 220 * 1024  # an SM's shared memory, less what the kernel's reductions and barriers take
CONFIGS = [(block, warps, stages) for block in (2048, 4096, 8192) for warps in (4, 8) for stages in (3, 5)]


def per_sm_choices(fmt, block, stages):
    """Programs per SM whose stage buffers fit the SM's shared memory."""
    buffers = (stages - 1) * block * 2 * (1 if fmt == "labels" else 2)
    return [n for n in (1, 2, 3, 4) if n * buffers <= SHARED_BYTES]


def compile_share(part, parts):
    shares = itertools.count()
    for (loss, fmt), (block, warps, stages) in itertools.product(LOSSES, CONFIGS):
        if next(shares) % parts != part:
            continue
        for vocab in VOCABS:  # one compile: every vocabulary here is a multiple of 16 columns
            x, t = inputs(fmt, vocab, rows=16)  # the same specialization as 4096 rows (both multiples of 16)
            streamed_row_loss(x, t, loss=loss, target_format=fmt, block=block, stages=stages, num_warps=warps)
    torch.cuda.synchronize()


# Run AB: (stages, warps) of resident_tma_loss; a stage holds a whole row (labels) or two (the target's too), so the
# distribution losses fit one buffer in shared memory only.
RESIDENT_VOCABS = [32000, 32768]
RESIDENT_CONFIGS = {"labels": [(2, 16), (3, 16), (2, 32), (3, 32)], "logits": [(2, 16), (2, 32)]}


def time_cells(vocabs, resident=False):
    copy = session_copy_gbps()
    for vocab in vocabs:
        for loss, fmt in LOSSES:
            x, t = inputs(fmt, vocab, TOKENS)
            nbytes = cell_bytes(fmt, vocab, TOKENS)
            # a torch copy of the same bytes: the session's own copy ceiling
            src = torch.empty(nbytes // 4, dtype=torch.bfloat16, device="cuda").normal_()
            dst = torch.empty_like(src)
            copy_ms = triton.testing.do_bench(lambda: dst.copy_(src), return_mode="median")
            session_copy = nbytes / copy_ms / 1e6
            del src, dst
            check = references(x, t, loss, fmt)
            base = {"loss": loss, "fmt": fmt, "vocab": vocab, "tokens": TOKENS}

            def emit(record, ms, err):
                print(json.dumps({**base, **record, "ms": round(ms, 4), "err": round(err, 5),
                                  "pct": round(nbytes / ms / 1e6 / copy * 100, 1),
                                  "pct_session": round(nbytes / ms / 1e6 / session_copy * 100, 1)}), flush=True)

            ms, err = checked_ms(lambda: kernels.entropy_loss_forward_backward(x, t, loss=loss, target_format=fmt),
                                      check)
            emit({"cfg": "public"}, ms, err)
            if resident:
                for stages, warps in RESIDENT_CONFIGS[fmt]:
                    record = {"cfg": f"resident/{warps}/s{stages}"}
                    try:
                        ms, err = checked_ms(lambda: resident_tma_loss(
                            x, t, loss=loss, target_format=fmt, stages=stages, num_warps=warps), check)
                        emit(record, ms, err)
                    except AssertionError as error:
                        print(json.dumps({**base, **record, "error": str(error)}), flush=True)
                continue
            for block, warps, stages in CONFIGS:
                for per_sm in per_sm_choices(fmt, block, stages):
                    record = {"cfg": f"{block}/{warps}/s{stages}/p{per_sm}"}
                    try:
                        ms, err = checked_ms(lambda: streamed_row_loss(
                            x, t, loss=loss, target_format=fmt, block=block, stages=stages, num_warps=warps,
                            programs_per_sm=per_sm), check)
                        emit(record, ms, err)
                    except AssertionError as error:  # a wrong result is recorded, and the run goes on
                        print(json.dumps({**base, **record, "error": str(error)}), flush=True)
            del x, t, check
            torch.cuda.empty_cache()


# Run AA's fastest streamed configuration at 4096 x 32000 for labels CE and forward KL (block/warps/stages/per SM).
PROBES = [("cross_entropy", "labels", 32000, (8192, 4, 5, 3)), ("forward_kl", "logits", 32000, (8192, 4, 3, 2))]


PROBE_RESIDENT = {}  # fmt -> (stages, warps) of resident_tma_loss: `probe-resident S W S W` sets it


def probe():
    """Each probe's streamed call and the public call, checked, warmed up, then run once each under the profiler:
    ``ncu --profile-from-start off`` profiles only these launches."""
    for loss, fmt, vocab, (block, warps, stages, per_sm) in PROBES:
        x, t = inputs(fmt, vocab, TOKENS)
        check = references(x, t, loss, fmt)
        calls = [lambda: kernels.entropy_loss_forward_backward(x, t, loss=loss, target_format=fmt),
                 lambda: streamed_row_loss(x, t, loss=loss, target_format=fmt, block=block, stages=stages,
                                           num_warps=warps, programs_per_sm=per_sm)]
        if PROBE_RESIDENT:  # run AB's probe: the persistent resident row instead of the streamed rows
            stages, warps = PROBE_RESIDENT[fmt]
            calls[1] = lambda: resident_tma_loss(x, t, loss=loss, target_format=fmt, stages=stages, num_warps=warps)
        for call in calls:
            rows, ref_loss, _unused = check
            value, _grad = call()
            assert float(abs(value.double() - ref_loss) / abs(ref_loss)) < 1e-2
            call()
        torch.cuda.synchronize()
        for call in calls:
            torch.cuda.profiler.start()
            call()
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
        label = (f"resident/{warps}/s{stages}" if PROBE_RESIDENT else f"{block}/{warps}/s{stages}/p{per_sm}")
        print(json.dumps({"probe": loss, "fmt": fmt, "vocab": vocab, "cfg": label}), flush=True)
        del x, t, check


if __name__ == "__main__":
    if sys.argv[1] == "compile":
        compile_share(int(sys.argv[2]), int(sys.argv[3]))
    elif sys.argv[1] == "resident":
        time_cells(RESIDENT_VOCABS, resident=True)
    elif sys.argv[1] == "probe":
        probe()
    elif sys.argv[1] == "probe-resident":
        PROBE_RESIDENT.update(labels=(int(sys.argv[2]), int(sys.argv[3])), logits=(int(sys.argv[4]), int(sys.argv[5])))
        probe()
    elif sys.argv[1] == "time":
        time_cells([int(v) for v in sys.argv[2:]] or VOCABS)
    else:
        raise SystemExit(__doc__)
