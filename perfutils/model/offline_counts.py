"""Offline sm_90 counts of the kernels a plan launches (no GPU): registers, spills, shared memory, occupancy, and
SASS where asked; what notebooks 04 and 05 and the register figures (:mod:`perfutils.plots.registers`) read.

* :func:`offline_counts` compiles the launches of ``kernels.prepare(...)`` plans offline for sm_90
  (:func:`perfutils.model.offline_compile.compile_launch`) and returns one row per configuration, describing the
  limiting launch as the sweeps do (lowest occupancy, ties: more registers).
* :func:`write_step_counts` counts the step of every lagged split-row kernel a GPU folder recorded
  (:func:`count_lagged_step`) into ``split_row_steps.csv``, and of every rank's kernel of its two-GPU symmetric
  design (:func:`count_exchange_step`) into ``exchange_steps.csv``, which :mod:`perfutils.model.step_counts` reads
  for the model (``python -m perfutils step-counts data/<gpu>``);
* :func:`label_index_costs` compiles the two frames of cross-entropy's label test
  (:mod:`perfutils.lab_kernels.teaching.label_index`) and counts their SASS.
"""

from __future__ import annotations

import contextlib
import io
import math
import time
from pathlib import Path

import pandas as pd

from ..data.schema import error_text, torch_dtype
from . import step_counts
from .cubin import sass_instruction_mix
from .occupancy import occupancy_of_counts
from .offline_compile import compile_launch, compile_offline


# Rows of the tiny inputs a kernel is compiled for: Triton specializes a row count that is a multiple of 16, as every
# measured token count is (4 rows once hid a kernel that the GPU ran at half its registers).
ROWS = 16


def quiet_compile(launch, with_sass: bool = True):
    """:func:`perfutils.model.offline_compile.compile_launch`, the compiler's chatter kept out of the output."""
    with contextlib.redirect_stdout(io.StringIO()):
        return compile_launch(launch, with_sass=with_sass)


def limiting_launch(entries: list[dict]) -> dict:
    """The launch with the lowest occupancy (ties: more registers), as perfutils.measure.measurer chooses."""
    def badness(entry):
        occ = entry.get("occupancy")
        return (occ if occ is not None else math.inf, -(entry.get("n_regs") or 0))

    return min(entries, key=badness)


def offline_counts(configs, *, vocab: int, rows: int = ROWS, dtype: str = "bf16", with_sass: bool = False,
                   log=print) -> tuple[pd.DataFrame, dict]:
    """Compile each ``(loss, target_format, variant, block_size, num_warps)`` offline for sm_90.

    A split_row configuration whose rows are split is counted as the cooperative kernel a GPU runs
    (``kernels.split_row.cooperative_launch``, the lagged schedule), not the multi-launch form a CPU plans.
    Inputs are tiny CPU tensors of ``rows`` x ``vocab``: a kernel depends on the vocabulary only
    through its constexprs (e.g. a row that fits in one tile) and divisibility, so the counts are
    those of the full-size problem. ``rows`` matters through divisibility too (:data:`ROWS`). Returns
    ``(frame, compiles)``: one row per configuration (the limiting launch's counts, plus ``launches``), and
    ``{(config tuple, launch name): OfflineCompile}``. A configuration that fails to compile is a row with
    ``status="error"`` and the message.
    """
    import torch

    import kernels
    from kernels import split_row
    from kernels.problem import build_problem

    dtype_of_logits = torch_dtype(dtype)
    generator = torch.Generator().manual_seed(0)
    results, compiles = [], {}
    for config in configs:
        loss, target_format, variant, block_size, num_warps = config
        key = (loss, target_format, variant, int(block_size), int(num_warps))
        row = {"loss": loss, "target_format": target_format, "variant": variant, "dtype": dtype,
               "vocab": int(vocab), "block_size": int(block_size), "num_warps": int(num_warps)}
        started = time.perf_counter()
        try:
            logits = torch.randn(rows, vocab, generator=generator).to(dtype_of_logits)
            if target_format == "labels":
                target = torch.randint(0, vocab, (rows,), generator=generator)
            else:
                target = torch.randn(rows, vocab, generator=generator).to(dtype_of_logits)
            plan = kernels.prepare(logits, target, loss=loss, target_format=target_format, variant=variant,
                                   block_size=int(block_size), num_warps=int(num_warps))
            launches = plan.launches
            if plan.config.get("mode") == "multi_launch":  # a CPU plan; a GPU runs the cooperative kernel
                problem = build_problem(logits, target, loss=loss, target_format=target_format, grad_output=1.0,
                                        ignore_index=-100, loss_mask=None)
                launches = [split_row.cooperative_launch(problem, int(block_size), int(num_warps))]
            entries = []
            for launch in launches:
                compiled = quiet_compile(launch, with_sass=with_sass)
                compiles[(key, launch.name)] = compiled
                occ = occupancy_of_counts(compiled.n_regs, compiled.shared_bytes, launch.num_warps)
                entries.append({"launch": launch.name, "n_regs": compiled.n_regs,
                                "spill_bytes": compiled.spill_bytes,
                                "spill_store_bytes": compiled.spill_store_bytes,
                                "spill_load_bytes": compiled.spill_load_bytes,
                                "shared_bytes": compiled.shared_bytes, "occupancy": occ.occupancy,
                                "blocks_per_sm": occ.blocks_per_sm, "limiter": occ.limiter,
                                "triton_version": compiled.triton_version,
                                "ptxas_version": compiled.ptxas_version, "tool": compiled.tool})
            row.update(limiting_launch(entries))
            row["launches"] = len(entries)
            row["status"], row["error"] = "ok", None
        except Exception as exc:  # a failed configuration is a row, not a crash
            row.update(status="error", error=error_text(exc, 600))
        row["compile_s"] = time.perf_counter() - started
        results.append(row)
        if log is not None:
            detail = (f"{row['n_regs']} regs, {row['spill_bytes']} B spill ({row['launch']})"
                      if row["status"] == "ok" else row["error"])
            log(f"compiled {loss}/{target_format} {variant} block {block_size} warps {num_warps}: {detail}")
    return pd.DataFrame(results), compiles


LABEL_FRAMES = {False: "row column, int64", True: "tile lane, int32"}


def label_index_costs(*, n_cols: int = 50257, block: int = 4096, num_warps: int = 4) -> pd.DataFrame:
    """One row per (frame, peeled head) of :func:`perfutils.lab_kernels.teaching.label_index.onehot_gradient_kernel` compiled for
    sm_90 offline: registers per thread and the static SASS mix (``instructions``, ``compares_64``, the integer
    opcodes that carry the index arithmetic)."""
    import torch

    from perfutils.lab_kernels.teaching.label_index import onehot_gradient_kernel

    q = torch.zeros(4, n_cols, dtype=torch.bfloat16)
    labels = torch.zeros(4, dtype=torch.int64)
    heads = torch.zeros(4, dtype=torch.int32)
    args = dict(q_ptr=q, labels_ptr=labels, heads_ptr=heads, out_ptr=q, n_cols=n_cols, row_stride=n_cols)
    rows = []
    for has_head in (False, True):
        for lane_frame in (False, True):
            compiled = compile_offline(onehot_gradient_kernel, args,
                                       dict(BLOCK=block, LANE_FRAME=lane_frame, HAS_HEAD=has_head),
                                       num_warps=num_warps, with_sass=True)
            mix = sass_instruction_mix(compiled.sass)
            rows.append({"label test": LABEL_FRAMES[lane_frame], "peeled head": has_head, "n_regs": compiled.n_regs,
                         **{key: mix.get(key, 0) for key in ("instructions", "compares_64", "IMAD", "IADD3", "LOP3")}})
    return pd.DataFrame(rows)


def count_lagged_step(key: tuple) -> dict:
    """Compile the key's lagged kernel offline for sm_90 (``kernels.split_row.cooperative_launch``, the launch a GPU
    plan runs) and count its step (:func:`perfutils.model.cubin.main_loop_instructions`): ``step`` (a thread's
    instructions once a step, the poll left out), ``nested`` (the poll loop's), ``n_regs``, ``spill_bytes``."""
    import torch

    from kernels import split_row
    from kernels.problem import build_problem

    from .cubin import main_loop_instructions

    loss, target_format, dtype, vocab, block, warps, maxnreg, prefetch, read_ahead, fast_math = key
    logits = torch.zeros(ROWS, vocab, dtype=torch_dtype(dtype))
    target = (torch.zeros(ROWS, dtype=torch.int64) if target_format == "labels"
              else torch.zeros(ROWS, vocab, dtype=logits.dtype))
    problem = build_problem(logits, target, loss=loss, target_format=target_format, grad_output=1.0,
                            ignore_index=-100, loss_mask=None)
    launch = split_row.cooperative_launch(problem, block, warps, n_slots=3, maxnreg=maxnreg or None,
                                          prefetch=prefetch, read_ahead=read_ahead, fast_math=fast_math)
    compiled = quiet_compile(launch)
    return {**main_loop_instructions(compiled.sass), "n_regs": compiled.n_regs, "spill_bytes": compiled.spill_bytes,
            "triton_version": compiled.triton_version, "ptxas_version": compiled.ptxas_version}


def count_exchange_step(key: tuple) -> dict:
    """Compile the key's exchange kernel offline for sm_90 and count its step as :func:`count_lagged_step` does: the
    launch ``kernels.vocab_parallel_plans.plan_symmetric`` plans for rank 0 of ``tp`` on its slice, with the two steps
    that need the ranks' GPUs stood in for (the exchange buffers, a table of addresses; the rows in flight, three:
    Triton's "any other value" class of ``n_slots``, as a GPU's persistent grid is)."""
    from types import SimpleNamespace
    from unittest import mock

    import torch

    from kernels import vocab_parallel_plans as plans
    from kernels.problem import build_problem

    from .cubin import main_loop_instructions

    loss, target_format, dtype, vocab, block, warps, tp, lag = key
    logits = torch.zeros(ROWS, vocab, dtype=torch_dtype(dtype))
    target = (torch.zeros(ROWS, dtype=torch.int64) if target_format == "labels"
              else torch.zeros(ROWS, vocab, dtype=logits.dtype))
    problem = build_problem(logits, target, loss=loss, target_format=target_format, grad_output=1.0,
                            ignore_index=-100, loss_mask=None)
    buffers = SimpleNamespace(rank=0, world_size=tp, table=torch.zeros(tp, dtype=torch.int64),
                              state=torch.zeros(2, dtype=torch.int32), backing="offline")

    def three_slots(launch, n_rows, num_chunks):
        launch.args["n_slots"] = 3
        return 3, 3

    with mock.patch.object(plans, "peer_buffers", lambda group, device, words: buffers), \
            mock.patch.object(plans, "cooperative_slots", three_slots), mock.patch.object(plans, "interpreting",
                                                                                         lambda: False):
        plan = plans.plan_symmetric(plans.VocabParallelProblem(problem, None, 0, tp), block, warps, lag=lag)
    compiled = quiet_compile(next(step for step in plan.steps if getattr(step, "name", "") == "vocab_parallel.exchange"))
    return {**main_loop_instructions(compiled.sass), "n_regs": compiled.n_regs, "spill_bytes": compiled.spill_bytes,
            "triton_version": compiled.triton_version, "ptxas_version": compiled.ptxas_version}


def exchange_step_keys(folder) -> list[tuple]:
    """The exchange keys of the folder's recorded two-GPU symmetric-design rows (``tensor_parallel.csv``:
    :func:`perfutils.model.step_counts.exchange_key_of_row`), sorted."""
    path = Path(folder) / "tensor_parallel.csv"
    if not path.is_file():
        return []
    frame = pd.read_csv(path)
    rows = frame[frame["variant"].astype(str).str.startswith("tp2-symmetric")].to_dict("records")
    return sorted({key for key in map(step_counts.exchange_key_of_row, rows) if key})


def lagged_step_keys(folder) -> list[tuple]:
    """The keys of every lagged split-row pass :func:`perfutils.model.predict.load_configurations` builds from the
    folder's records, sorted."""
    from .predict import load_configurations

    keys = {p.step_key for c in load_configurations(folder, step_counts={}) for p in c.passes if p.step_key}
    return sorted(keys)


def write_step_counts(folder, log=print) -> list[Path]:
    """Count the step of every key the folder's records need that its counts file lacks (a key that does not compile
    is a row with status "error") and write the file with its sidecar; rows already there are kept, so a file's rows
    may count different versions of the kernels: each names the one it counted (``kernel_sources``, the digest of
    :func:`perfutils.data.metadata.sources_digest`; empty in rows counted before it was recorded). After a kernel
    change, remove the file to count every key again. Returns the counts files (the exchange's where the folder
    recorded two-GPU rows)."""
    paths = [_write_counts(folder, step_counts.STUDY, lagged_step_keys(folder), count_lagged_step, log)]
    exchange = exchange_step_keys(folder)
    if exchange:
        paths.append(_write_counts(folder, step_counts.EXCHANGE_STUDY, exchange, count_exchange_step, log))
    return paths


def _write_counts(folder, study, keys, count, log) -> Path:
    from ..data import metadata, store
    from ..data.schema import utc_now

    sources = metadata.sources_digest()  # the kernels these compiles import: a row counts this version of them
    key_columns, normal = step_counts.KEYS[study]
    path = step_counts.counts_path(folder, study)
    old = pd.read_csv(path) if path.is_file() else pd.DataFrame(columns=key_columns)
    have = {normal(r) for r in old[list(key_columns)].itertuples(index=False, name=None)}
    rows = []
    for key in keys:
        if normal(key) in have:
            continue
        started = time.perf_counter()
        row = dict(zip(key_columns, key))
        try:
            row.update(count(key), status="ok", error=None)
        except Exception as error:  # noqa: BLE001 - a key that does not compile is a row
            row.update(status="error", error=error_text(error, 300))
        row["compile_s"] = round(time.perf_counter() - started, 1)
        row["counted_utc"] = utc_now()
        row["kernel_sources"] = sources
        log(f"{key}: {row.get('step', row.get('error'))}")
        rows.append(row)
    if not rows and path.is_file():
        return path  # nothing new: the file and its sidecar stay as written
    frame = pd.concat([old, pd.DataFrame(rows)], ignore_index=True) if rows else old
    meta = metadata.collect_metadata({"rows": ROWS,
                                      "source": "perfutils.model.offline_counts.write_step_counts"})
    meta.update(study=study, target="sm_90, offline (no GPU): the counts hold for every sm_90 GPU")
    store.write_table(frame, path, meta, overwrite=True, keep_old=False)  # every old row is in the new file
    return path


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m perfutils step-counts", description=__doc__.split("\n\n")[0])
    parser.add_argument("gpu_dir", nargs="+", help="data/<gpu> folders whose recorded split-row plans to count")
    args = parser.parse_args(argv)
    for folder in args.gpu_dir:
        print("wrote " + ", ".join(str(path) for path in write_step_counts(folder)))
    return 0
