"""Which configuration a call runs, in one place: the tuning table, the first-call search, the plan.

:func:`plan_problem` is the path every first call of a shape takes: a variant with a configuration given by the
caller is planned as asked; ``split_row`` without one runs its own entry of the committed tuning table
(``data/<gpu-slug>/tuning.csv``, written by ``perfutils.studies.tuning`` from H100 sweeps: per (loss, target_format,
dtype, vocab) and variant, that variant's best (block_size, num_warps, options), taken at the nearest recorded vocab
of the same loss; the H200's holds the first-call search's own choices as its vocab sweep recorded them); ``auto`` on
a GPU runs the first-call search below, seeded with the table's fastest entry; where the search cannot run
(CUDA-graph capture, ``FUSED_LOSS_AUTOTUNE=0``, the interpreter) it takes that entry, and without a table a heuristic
(split_row with its default chunks).

The search, at the first call of a shape class, kept on disk: the table holds a few vocabularies at 4096 tokens
measured on one GPU. Users train at 32000, 50257, 128256, 151936, 256000 columns, at many token counts, on other
GPUs; the table's nearest power of two was up to 9x off (4096 x 50257, cross-entropy from logits: 4.8 ms for a chunk
size that is right at 65536 columns). So the first call of a *shape class* (loss, target format, dtype, vocab, token
count rounded up to a power of two, mask, gradient) times a handful of candidate configurations on the caller's own
tensors (the table's entry first, then the designs the H100 sweeps found competitive: split_row's lagged kernel at
2K-8K-column chunks, one program per row with a tile as wide as the row up to 32K, and for cross-entropy from labels
on 16-byte aligned bf16 rows up to 32K the row kept in registers, at 16 and 8 warps; then the two fastest lagged
kernels again under register caps: their own count, caps that fit one or two more programs per SM, and the most
registers one program fewer allows), runs the fastest's plan as the call's own, and writes the choice to
``$FUSED_LOSS_CACHE_DIR`` (default ``~/.cache/fused-loss-kernels``), one JSON file per GPU model, Triton version and
version of the kernels' code (:func:`code_stamp`). Later calls, and later processes, read the choice and build its
plan: one dictionary lookup, no timing, no sync. The search costs one compile per candidate (seconds, once per
machine: Triton caches them on disk too) and a few milliseconds of GPU time, and synchronizes while it times.
"""

from __future__ import annotations

import csv
import functools
import hashlib
import json
import math
import os
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .device_names import gpu_slug
from .fused import plan_fused
from .launch import Plan
from .occupancy import register_caps_of_compiled
from .problem import Problem
from .prologue import prologue_launch
from .resident_row import plan_resident_row, resident_fits
from .split_row import plan_split_row
from .two_pass import plan_two_pass

# The variants, each named by the kernel it runs: "fused" (one program a row walking its tiles), "resident_row" (the row
# kept in registers), "two_pass", "split_row" (a row's chunks to programs that exchange summaries). Two earlier
# spellings stay accepted, and recorded data (the tuning tables, the sweeps' configurations) holds them: split_row
# with ``split=False`` (the fused kernel's loop: its plan is "fused") and fused with ``resident=True`` (its plan is
# "resident_row"); canonical_variant reads them as the names above.
PLANNERS = {"fused": plan_fused, "resident_row": plan_resident_row, "two_pass": plan_two_pass,
            "split_row": plan_split_row}
VARIANTS = ("auto", *PLANNERS)


def canonical_variant(variant: str, options: dict) -> tuple[str, dict]:
    """``(variant, options)`` with the earlier spellings read as the kernel they run: split_row with ``split=False``
    is ``fused`` (its other options kept: ``keep_last``), fused with ``resident=True`` is ``resident_row``; a
    ``split=True`` or ``resident=False`` that changes nothing is dropped. Anything else is returned as given (a
    planner refuses what it cannot take)."""
    options = dict(options)
    if variant == "split_row" and options.get("split") is False:
        del options["split"]
        return "fused", options
    if variant == "split_row" and options.get("split") is True:
        del options["split"]
    if variant == "fused" and options.get("resident") is True and set(options) == {"resident"}:
        return "resident_row", {}
    if variant == "fused" and options.get("resident") is False:
        del options["resident"]
    return variant, options


def plan_problem(problem, variant: str, block_size, num_warps, variant_options: dict) -> Plan:
    choice = (choose_config(problem, variant=variant, block_size=block_size, num_warps=num_warps, **variant_options)
              if variant in ("auto", "split_row") else Choice(variant, block_size, num_warps, variant_options))
    plan = choice.plan  # the plan the first-call search timed, on the call that searched
    if plan is None:
        try:
            plan = PLANNERS[choice.variant](problem, choice.block_size, choice.num_warps, **choice.options)
        except TypeError as error:
            if "unexpected keyword" not in str(error):
                raise
            raise TypeError(f"variant {choice.variant!r} does not take option(s) {sorted(choice.options)}") from None
    if problem.n_rows == 0:  # empty batch: no loss kernel; a prologue writes the loss (0)
        workspace, _grad, loss = plan.buffers[:3]
        plan.launches = []
        plan.reset = None
        plan.prologue = prologue_launch(problem, workspace, loss)
    return plan


DATA_DIR = Path(__file__).resolve().parent.parent / "data"
DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}  # the table's dtype column


@dataclass
class Choice:
    variant: str
    block_size: int | None
    num_warps: int | None
    options: dict = field(default_factory=dict)
    source: str = "heuristic"
    plan: Plan | None = field(default=None, repr=False)  # set by the first-call search on the call that searched


@functools.lru_cache(maxsize=None)
def load_tuning_table(gpu_name: str, data_dir: Path = DATA_DIR) -> tuple[dict, ...]:
    """Rows of the tuning table recorded on this GPU under ``data_dir`` (empty if there is none)."""
    path = Path(data_dir) / gpu_slug(gpu_name) / "tuning.csv"
    if not path.exists():
        return ()
    with open(path, newline="") as handle:
        return tuple(csv.DictReader(handle))


def table_choice(rows, loss: str, target_format: str, dtype: str, n_cols: int,
                 variant: str | None = None, unfit: tuple = ()) -> Choice | None:
    """The table's entry for this shape (the nearest recorded vocab), fastest variant or ``variant``'s own; entries
    whose kernel is in ``unfit`` (one that cannot take the call: ``resident_row`` for a row it cannot hold) are
    passed over."""
    rows = [
        row for row in rows
        if row["loss"] == loss and row["target_format"] == target_format and row["dtype"] == dtype
        and (variant is None or row["variant"] == variant)
        and canonical_variant(row["variant"], json.loads(row.get("options") or "{}"))[0] not in unfit
    ]
    if not rows:
        return None
    nearest = min({int(row["vocab"]) for row in rows}, key=lambda vocab: abs(math.log2(vocab) - math.log2(n_cols)))
    best = min((row for row in rows if int(row["vocab"]) == nearest), key=lambda row: float(row["ms_median"]))
    # A tuned chunk wider than this row would only add masked lanes.
    block = min(int(best["block_size"]), max(16, 1 << math.ceil(math.log2(n_cols))))
    variant, options = canonical_variant(best["variant"], json.loads(best.get("options") or "{}"))
    return Choice(variant, block, int(best["num_warps"]), options, source="tuning table")


def table_entry(problem: Problem, variant: str | None = None) -> Choice | None:
    """The committed table's entry for a problem on its CUDA device (:func:`table_choice`): the fastest variant's, or
    ``variant``'s own; the first-call search's seed."""
    return table_choice(load_tuning_table(torch.cuda.get_device_name(problem.logits.device)), problem.loss,
                        problem.target_format, DTYPE_NAMES[problem.logits.dtype], problem.n_cols, variant,
                        unfit=() if resident_fits(problem) else ("resident_row",))


def choose_config(problem: Problem, *, variant: str = "auto", block_size=None, num_warps=None,
                  **options) -> Choice:
    """What ``variant`` runs for this problem when the caller gave no configuration (block size, warps or options):
    for ``auto`` on a GPU the first-call search (:func:`choose`, seeded with the tuning table's entry; on the call
    that searched, ``plan`` is the plan it timed), for ``split_row`` its own table entry; otherwise the caller's
    settings (auto: split_row's)."""
    device = problem.logits.device
    if device.type == "cuda" and block_size is None and num_warps is None and not options:
        seed = table_entry(problem, None if variant == "auto" else variant)
        choice = (choose(problem, seed) if variant == "auto" else None) or seed
        if choice is not None:
            return choice
    return Choice("split_row" if variant == "auto" else variant, block_size, num_warps, options)


CANDIDATE_REPEATS = 5  # timed runs per candidate (after one untimed run that compiles)
MAX_CHUNKS = 64  # lagged split_row candidates with at most this many chunks a row (see candidates)
# The fastest lagged candidates are timed again under register caps that fit this many more programs per SM (see
# _search): three for the fastest (rows that are not 16-byte aligned take labels CE's 4096-column kernel from 80 to
# 128 registers; capped at 72, seven programs, it ran 8-9 points faster: logs/explore_rows_2026-11-25.txt, run H),
# two for the runner-up. Twins for the third as well were never fastest: forward KL and logits CE at 151936-262144
# columns, 4096 and 16384 tokens, their 4096-column kernel third uncapped (141 registers) and capped (128) still
# 0.4-2.9% slower than the 8192-column one (code 586ddfd, data/h100-sxm-80gb/logs/vocab_sweep_twins_2026-11-26.txt).
TWIN_STEPS = (3, 2)
_MEMORY: dict[tuple, dict] = {}
_LOCK = threading.Lock()


def enabled() -> bool:
    return os.environ.get("FUSED_LOSS_AUTOTUNE", "1").strip().lower() not in ("0", "false", "no", "off")


# The sources a choice depends on (the kernels, their planners, the candidates): a cache written by other code is
# not read (a changed kernel can change which candidate is fastest).
_SEARCH_SOURCES = ("autotune.py", "fused.py", "resident_row.py", "split_row.py", "row_math.py", "two_pass.py",
                   "problem.py", "vocab_parallel.py", "vocab_parallel_plans.py", "vocab_parallel_exchange.py",
                   "vocab_parallel_search.py")


def code_stamp() -> str:
    """A short hash of :data:`_SEARCH_SOURCES` (computed once): part of the cache file's name."""
    global _CODE_STAMP
    if _CODE_STAMP is None:
        digest = hashlib.sha1()
        for name in _SEARCH_SOURCES:
            digest.update((Path(__file__).parent / name).read_bytes())
        _CODE_STAMP = digest.hexdigest()[:12]
    return _CODE_STAMP


_CODE_STAMP: str | None = None


def cache_file(gpu_name: str) -> Path:
    import triton

    root = Path(os.environ.get("FUSED_LOSS_CACHE_DIR") or Path.home() / ".cache" / "fused-loss-kernels")
    return root / gpu_slug(gpu_name) / f"triton-{triton.__version__}-code-{code_stamp()}.json"


def shape_class(problem: Problem) -> str:
    """What a choice is valid for: the vocab exactly (chunking depends on it), tokens up to the next power of two, and
    whether the rows are 16-byte aligned (a view at an odd offset is peeled, and the resident row cannot take it)."""
    tokens = 1 << max(9, math.ceil(math.log2(max(problem.n_rows, 1))))
    dtype = str(problem.logits.dtype).removeprefix("torch.")
    return (f"{problem.loss}/{problem.target_format}/{dtype}/vocab={problem.n_cols}/tokens<={tokens}"
            f"/mask={problem.mask is not None}/grad={problem.compute_grad}/aligned={problem.rows_aligned()}")


def read_cache(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def write_cache(path: Path, key: str, entry: dict) -> None:
    """Read-merge-replace, atomically (ranks of one job may search at once: the last writer wins per key)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        merged = read_cache(path)
        merged[key] = entry
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
        with os.fdopen(handle, "w") as file:
            json.dump(merged, file, indent=1, sort_keys=True)
        os.replace(temporary, path)
    except OSError:
        pass  # an unwritable cache costs a search per process, never a wrong result


def candidates(problem: Problem, seed) -> list[tuple[str, int, int, dict]]:
    """(variant, block_size, num_warps, options) to time, the table's entry (``seed``) first."""
    n_cols = problem.n_cols
    row_tile = min(32768, 1 << max(4, math.ceil(math.log2(n_cols))))
    found = []
    if seed is not None:
        variant, options = canonical_variant(seed.variant, seed.options)
        found.append((variant, seed.block_size, seed.num_warps, options))
    if n_cols <= 65536:  # one program per row walking its tiles (the fused kernel's loop), tile up to the row
        for tile in sorted({row_tile, max(16, row_tile // 2)}, reverse=True):
            warps = max(4, min(32, tile // 1024))
            found.append(("fused", tile, warps, {}))
    if resident_fits(problem):  # labels CE, bf16, aligned rows up to 32K: the row read once, kept in registers
        for warps in (16, 8):
            found.append(("resident_row", row_tile, warps, {}))
    for chunk, warps in ((4096, 4), (8192, 4), (2048, 4), (8192, 8)):  # split rows, lagged exchange
        # at most 64 chunks a row (Triton 3.6's compiler failed on 75 chunks of 2048 columns)
        if chunk < n_cols and math.ceil(n_cols / chunk) <= MAX_CHUNKS:
            found.append(("split_row", chunk, warps, {}))
    unique = []
    for item in found:
        if item not in unique:
            unique.append(item)
    return unique


def _time_plan(plan, repeats: int) -> float:
    """Median ms of ``plan.run`` as the benchmarks time it (triton.testing.do_bench: L2 flushed before each run)."""
    import triton.testing

    plan.run()  # compiles; its result is discarded
    return float(triton.testing.do_bench(plan.run, warmup=5, rep=max(10, 4 * repeats), return_mode="median"))


def choose(problem: Problem, seed) -> Choice | None:
    """The fastest candidate for this shape class: from memory, from the disk cache, or timed now (then with the plan
    it timed: :func:`_search`). None where the search cannot run here (use the seed)."""
    device = problem.logits.device
    gpu_name = torch.cuda.get_device_name(device)
    key = shape_class(problem)
    memory_key = (gpu_name, key)
    entry = _MEMORY.get(memory_key)
    plan = None
    if entry is None:
        path = cache_file(gpu_name)
        entry = read_cache(path).get(key)
        if entry is None:
            if not enabled() or torch.cuda.is_current_stream_capturing() or problem.n_rows == 0:
                return None
            with _LOCK:
                found = _search(problem, seed, PLANNERS)
            if found is None:
                return None
            entry, plan = found
            write_cache(path, key, entry)
        _MEMORY[memory_key] = entry
    return Choice(entry["variant"], entry["block_size"], entry["num_warps"], dict(entry["options"]), entry["source"],
                  plan)


def _search(problem: Problem, seed, planners: dict) -> tuple[dict, Plan] | None:
    """Time the candidates on the problem's own tensors: (the cache entry of the fastest, with every candidate's
    record; the fastest's plan), or None when none ran. The fastest plan so far is kept for the hand-back, its
    gradient's memory lent to the next candidates meanwhile (:func:`gradient_memory`): one gradient at a time."""
    timed = []
    lagged = []  # (ms, candidate, compiled kernel) of the lagged split_row candidates, for their capped twins
    best = None  # (entry, plan) of the fastest candidate so far

    def time_candidate(variant, block_size, num_warps, options):
        nonlocal best
        entry = {"variant": variant, "block_size": block_size, "num_warps": num_warps, "options": options}
        timed.append(entry)
        try:
            plan = planners[variant](problem, block_size, num_warps, **options)
            entry["ms"] = _time_plan(plan, CANDIDATE_REPEATS)
        except Exception as error:  # a candidate that cannot run here (resources, refusal) is skipped
            entry["error"] = f"{type(error).__name__}: {error}"[:200]
            return None
        if best is None or entry["ms"] < best[0]["ms"]:
            gradient_memory(plan.buffers[1], keep=False)
            best = (entry, plan)
        return plan

    for variant, block_size, num_warps, options in candidates(problem, seed):
        plan = time_candidate(variant, block_size, num_warps, options)
        if plan is not None and has_twins(plan, options):
            lagged.append((timed[-1]["ms"], (variant, block_size, num_warps, options), plan.launches[0].compiled))
        del plan
    # The fastest lagged kernels again under register caps that fit more programs per SM (ptxas's own count is not
    # always the least it needs: kernels.occupancy.register_caps_for_more_blocks) or give it more registers
    # with one program fewer; a cap that spills is timed like any candidate and loses.
    fastest = sorted(lagged, key=lambda item: item[0])[:len(TWIN_STEPS)]
    for steps, (_ms, (variant, block_size, num_warps, options), compiled) in zip(TWIN_STEPS, fastest):
        for cap in capped_registers(compiled, steps):
            twin = {"variant": variant, "block_size": block_size, "num_warps": num_warps,
                    "options": {**options, "maxnreg": cap}}
            if not any(all(entry[name] == value for name, value in twin.items()) for entry in timed):  # the seed
                time_candidate(*twin.values())
    if best is None:
        return None
    entry, plan = best
    gradient_memory(plan.buffers[1], keep=True)
    return {**entry, "source": "first-call search", "candidates": timed}, plan


def gradient_memory(grad, keep: bool) -> None:
    """Free (``keep=False``) or give back the memory of a kept plan's gradient ``grad`` (None: none): its storage is
    resized, the tensor its launches and ``finish`` hold stays (contents undefined: every run writes all of it)."""
    if grad is not None:
        grad.untyped_storage().resize_(grad.numel() * grad.element_size() if keep else 0)


def has_twins(plan, options: dict) -> bool:
    """Whether the search may time this candidate's plan again under register caps (:func:`capped_registers`): a
    lagged split_row kernel that has no cap of its own."""
    return plan.config.get("schedule") == "lagged" and "maxnreg" not in options


def capped_registers(compiled, steps: int = 2) -> list[int]:
    """maxnreg values to time a launched kernel under again: its own register count (an explicit cap at the count
    ptxas chose anyway ran 2-4% faster on the H100: lagged labels CE at 80 registers, 4096 x 49152-65536,
    ``scripts/ab_register_cap.py``, ``data/h100-sxm-80gb/logs/ab_register_cap_2026-11-23.txt``), then the caps that
    fit one, two, ... ``steps`` more programs per SM, then the cap that gives it the most registers with one program
    fewer (ptxas may leave registers its occupancy allows unused: ``register_cap_for_fewer_blocks``). [] when its
    counts cannot be read."""
    try:
        caps = [cap for cap, _blocks in register_caps_of_compiled(compiled, steps=steps, fewer=True)]
    except Exception:  # noqa: BLE001 - another Triton's kernel object: no twins, no harm
        return []
    own = getattr(compiled, "n_regs", None)
    return ([own] if isinstance(own, int) and own > 0 and own not in caps else []) + caps
