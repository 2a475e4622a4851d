"""Predict before measuring: how long one launch configuration of a loss kernel takes, and which limit binds.

A kernel is a list of passes (``KernelPass``): programs that each step ``steps`` times over a tile of ``tile``
elements, ``resident`` of them per SM. Each pass costs the slowest of

* ``dram``: the DRAM bytes it moves (the minimum plus re-reads: the fused kernel's second loop over a row that is
  not held in one tile, two_pass's second kernel) over the measured copy bandwidth;
* ``latency``: Little's law. A program issues one tile's loads, waits a DRAM round trip, then works through the
  tile's arithmetic: its warps' instruction streams or, if longer, its turn at the SM's four schedulers, then its
  block reductions. The ``resident`` programs of an SM share the schedulers, so one program's arithmetic issues while
  another waits on its round trip: a step is a closed queue (``step_seconds``), the round trip the delay and the
  schedulers the server, from ``round trip + arithmetic`` for one program to ``resident x issue`` for many, never
  their sum. A wave of programs takes ``steps x step``, whatever the bandwidth. Where bytes in flight are short of
  what the latency needs, this term binds: the distribution losses near 80% of copy;
* ``l2``: bytes read again from L2 (the lagged split_row kernel's second read, the share of re-read rows that L2
  still holds: all while the resident rows fit half of L2, capacity / working set past it) over the measured L2
  bandwidth; DRAM streams at the GPU's Triton copy where recorded (``Gpu.stream_gbps``);
* ``issue``: instructions per element over the SMs' four schedulers (a second input adds the share the offline
  SASS counts give, ``second_input_instructions``): shown, not added, since every step holds it; ``mufu``:
  exp2/log2 over the measured exp2 rate;
* ``spills``: local-memory traffic, added on top (it sits in the dependent chain). Where the kernel's offline compile
  counted it (:mod:`perfutils.model.spill_counts`), that traffic, split between DRAM and L2 by how far the stacks of
  every resident thread overflow the L2 (``spill_seconds``); otherwise the stack stored and loaded a fitted number of
  times each step, over the L2 bandwidth, or the DRAM's once those stacks outgrow half the L2;
* ``waves``: a last partial wave of programs runs with fewer bytes in flight (a term of the latency bound);
* ``host``: a call whose host work per call (the public call, its autograd form, a peer's wrapper) outlasts the
  kernel; ``launch``: the launch floor of tiny kernels (the autograd form adds its backward's launch).

The memory terms are combined smoothly (``(a^p + b^p)^(1/p)``): when bandwidth and latency limits are close the
queues make both bite. The GPU's rates come from its measured ceilings (``ceilings.csv``); what no micro-benchmark
measured (the DRAM round trip, a warp's cycles an instruction, the reductions, instructions per element, host floors)
are the ``ModelConstants``, fitted once on the H100's even half of configurations (``fit_half``) and frozen here:
a prediction reads no recorded time, so scaling every recorded time leaves it unchanged.

``load_configurations(folder)`` turns each study's recorded rows into ``LaunchConfig`` (the times dropped: only the
whitelisted columns are read), ``check(folder)`` predicts them and joins the measured times; the CLI is
``python -m perfutils predict --check data/<gpu> --out FILE.csv``.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from kernels import split_row
from kernels.autotune import canonical_variant
from kernels.occupancy import occupancy_of_counts

from .roofline import LOSS_COUNTS, Ceilings, ceilings_from_records, loss_cost
from .spill_counts import load_spill_counts, offline_file, resident_stack_bytes, spill_key
from .step_counts import load_counted_sources, load_step_counts, step_key

BOUNDS = ("dram", "latency", "waves", "l2", "issue", "mufu", "spills", "host", "launch")

# Studies the check reads, and the variants of each it can model (kernels whose counts are recorded or derivable).
STUDIES = {
    "blocksize_sweep": None,
    "vocab_sweep": ("plan", "public", "public_autograd", "fast_llm"),
    "public_call": ("plan", "public", "public_autograd", "fast_llm"),
    "case_497": None,
    "case_497_ablation": None,
    "benchmark": ("fused", "two_pass", "split_row", "auto"),
    "case_study": ("fused", "two_pass", "split_row", "auto"),
    "fusion": None,
    "triton_basics": None,
}
_UNMODELED = {"eager_torch", "torch_compile", "liger"}  # no compile counts recorded
_ELEMENTWISE = {"fusion", "triton_basics"}

# The only columns a configuration is built from: none of them is a time.
CONFIG_COLUMNS = ("study", "config_key", "loss", "target_format", "variant", "dtype", "tokens", "vocab", "block_size",
                  "num_warps", "bytes_min", "n_regs", "spill_bytes", "shared_bytes", "blocks_per_sm", "passes",
                  "plan_config", "n_kernels", "n_elements", "naive_bytes", "status")
LAG_STEPS = int(split_row.LAG_STEPS.value)  # the lagged kernel finishes a row this many steps after reading it
L1_BYTES = 200 * 1024  # what an H100/H200 SM's 256 KB of L1 + shared leaves for local memory beside the tiles
_DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


@dataclass(frozen=True)
class ModelConstants:
    """What no ceiling measures. Fitted on the H100's half 0 (``fit_half("data/h100-sxm-80gb", 0, rounds=6)``, every
    study weighing the same, starting from hand-set values: 900 ns, 6, 60, 12, 1, 3, 3 us, 30, 200, 190 us), rounded,
    and reported on half 1 by the check. Refitted on half 0 (``fit_half(..., rounds=3)`` twice, the second from the
    first's result) when a step came to include the SM's shared issue of every resident program's tile and the
    fit to score the order inside sweeps: the round trip fell from 1136 to 362 ns (it no longer stands in for the
    issue time it waited behind), the block reduction rose from 27.5 to 194 cycles a level. The lagged split_row
    kernel's step then came to hold its two tiles of arithmetic (``KernelPass.tiles_per_step``; Nsight Compute
    counted 47 thread-instructions an element there, 2 x 14.7 x 1.70 = 50, where one tile counted 25); the
    instructions stay pinned to that count.

    The step is now a closed queue (``step_seconds``): while one program waits on its round trip the others'
    arithmetic issues, and the SM's issue is counted there only (no longer again beside the memory terms). A
    program's own arithmetic is its warps' instruction streams (``warp_cycles_per_instruction``, which replaced the
    dependent cycles per element a thread holds: that constant had risen from 2.41 to 32.4, standing in for the
    per-warp issue it did not count) or, if longer, its turn at the SM's schedulers, then its block reductions, in
    which the schedulers are free for the others. The step's and the combination's constants refitted on half 0
    (``fit_half(..., rounds=3, names=("dram_latency_ns", "warp_cycles_per_instruction",
    "reduce_cycles_per_level", "combine_p"))`` from the values before the two-tile step, 362 ns, 1, 194, 2.37,
    then again from its result, which it kept): the round trip 352 -> 280 ns (about the H100's unloaded DRAM
    latency, 555 cycles: it no longer waits behind the other programs' issue), a warp 1.14 cycles an instruction
    (at least 1: one issue a cycle), a reduction level 213 -> 135 cycles (five shuffle levels and a barrier a
    reduction, several reductions a step), p 3.43 -> 3.0. From the frozen values of the two-tile step the same fit
    wanders to a round trip of 48 ns and 0.59 cycles an instruction (impossible, and a worse score: 0.430 against
    0.423).

    Since 2026-11-28 a recorded lagged split-row plan's step is its kernel's own SASS count
    (:mod:`perfutils.model.step_counts`), which holds a part the per-element estimate had not (the row's summaries and
    scalars, 340-370 instructions a step) and lacks the wait the estimate's constant had absorbed: counted, the lagged
    plans came out 6.1% (H100) and 14.1% (H200) too fast. ``exchange_round_trip_ns`` is that wait, fitted alone on
    the H100's half 0 (``fit_half(..., rounds=3, names=("exchange_round_trip_ns",))`` from 1000 ns: 1262.6, the other
    constants held): the lagged plans' median |error| 2.5% -> 1.7% on the H100's half 1, 5.9% -> 6.3% on the H200's
    (which would want about 2000 ns). The estimate stays for plans with no count (``predict_launch``'s what-ifs)."""

    dram_latency_ns: float = 280.0  # DRAM round trip of a tile's loads
    exchange_round_trip_ns: float = 1260.0  # a counted lagged split-row step's wait beyond its loads' (exchange_wait)
    warp_cycles_per_instruction: float = 1.14  # a warp's own instruction stream: cycles an instruction (>= 1)
    reduce_cycles_per_level: float = 135.0  # a step's block reductions: cycles per halving (warp shuffles + barrier)
    instructions_per_element: float = 14.7  # SASS issued per element per read (one input)
    second_input_instructions: float = 0.70  # what a second input adds, as a share of the first: not fitted, from
    # the SASS counts of the offline sm_90 compiles (second_input_instructions(), H100 folder: 1.73, 1.70, 1.70)
    spill_passes: float = 0.498  # times each spilled byte is stored and loaded per step
    combine_p: float = 3.0  # smoothness of the bandwidth/latency combination
    launch_us: float = 4.05  # per launch, back to back
    host_public_us: float = 30.0  # the public call's host work per call
    host_autograd_us: float = 250.0  # the autograd form's
    host_peer_us: float = 263.0  # a peer's wrapper (Fast-LLM)


DEFAULT_CONSTANTS = ModelConstants()


@dataclass(frozen=True)
class Gpu:
    ceilings: Ceilings
    sm_count: int = 132
    clock_ghz: float = 1.98
    l2_bytes: int = 50 * 2**20
    name: str = ""
    triton_copy_gbps: float | None = None  # the copy a Triton kernel reached (ceilings.csv: dram_copy_triton)
    link: Link | None = None  # the NVLink to a peer GPU, where a vocab-parallel prediction needs it (link_of)

    @property
    def stream_gbps(self) -> float:
        """The DRAM rate a Triton loss kernel can stream at: the Triton copy where it was measured (on the H200 it
        stays 4% under the torch copy, on the H100 under 1%), else the copy bandwidth."""
        return self.triton_copy_gbps or self.ceilings.dram_gbps


@dataclass(frozen=True)
class Link:
    """Two GPUs' NVLink as the vocab-parallel exchange uses it, as ``perfutils.studies.nvlink`` measured it."""

    store_gbps: float  # the exchange's summary words stored into the peer's buffer, both ranks at once (1e9 B/s)
    round_trip_ns: float  # one word bounced between the two GPUs
    gpu_name: str
    links: int | None  # bonded NVLinks between the two GPUs (nvidia-smi topo -m: NV18 -> 18)
    folder: str  # the data folder it was measured in


def bonded_links(sidecar: dict) -> int | None:
    """The bonded NVLinks between GPU0 and GPU1 in a sidecar's ``topology`` (nvidia-smi topo -m), if recorded."""
    found = re.search(r"NV(\d+)", str(sidecar.get("topology") or ""))
    return int(found.group(1)) if found else None


def link_of(folder) -> Link | None:
    """The NVLink a vocab-parallel exchange of ``folder``'s GPU pair crosses: the folder's own ``nvlink.csv``, else
    that of another data folder beside it whose two GPUs were joined by as many bonded NVLinks (the sidecars'
    ``topology``; ``Link.folder`` says which); None where neither was measured."""
    folder = Path(folder)
    own = folder / "nvlink.csv"
    if own.is_file():
        return _link_from(own)
    wanted = {bonded_links(_sidecar(folder / f"{study}.json")) for study in ("tensor_parallel", "nvlink")} - {None}
    for other in sorted(folder.parent.glob("*/nvlink.csv")):
        if wanted and bonded_links(_sidecar(other.with_suffix(".json"))) in wanted:
            return _link_from(other)
    return None


def _sidecar(path: Path) -> dict:
    try:
        return json.loads(path.read_text()) if path.is_file() else {}
    except json.JSONDecodeError:
        return {}


def _link_from(path: Path) -> Link | None:
    rows = pd.read_csv(path)
    rows = rows[rows["status"] == "ok"]
    stores = rows[(rows["measure"] == "summary_words") & (rows["directions"] == "both_ways")]
    trip = rows[rows["measure"] == "round_trip"]
    if stores.empty or trip.empty:
        return None
    return Link(store_gbps=float(stores["gbps"].iloc[0]), round_trip_ns=float(trip["ns_per_round_trip"].iloc[0]),
                gpu_name=str(stores["gpu_name"].iloc[0]), links=bonded_links(_sidecar(path.with_suffix(".json"))),
                folder=path.parent.name)


def gpu_from_folder(folder) -> Gpu:
    """The GPU of a data folder: its measured ceilings and the sidecar's SM count, clock and L2 size."""
    folder = Path(folder)
    ceilings = ceilings_from_records(folder / "ceilings.csv")
    meta = {}
    for sidecar in sorted(folder.glob("*.json")):
        try:
            meta = json.loads(sidecar.read_text())
        except json.JSONDecodeError:
            continue
        if isinstance(meta, dict) and meta.get("sm_count"):
            break
    records = pd.read_csv(folder / "ceilings.csv")
    triton_copy = records.loc[records["ceiling"] == "dram_copy_triton", "value"].max()
    return Gpu(ceilings=ceilings, sm_count=int(meta.get("sm_count") or 132),
               clock_ghz=float(meta.get("sm_clock_max_mhz") or 1980) / 1e3,
               l2_bytes=int(meta.get("l2_bytes") or 50 * 2**20), name=ceilings.gpu,
               triton_copy_gbps=None if pd.isna(triton_copy) else float(triton_copy))


@dataclass(frozen=True)
class KernelPass:
    """One launch: ``programs`` programs, ``resident`` per SM, each stepping ``steps`` times over ``tile`` elements."""

    name: str
    programs: int
    tile: int
    num_warps: int
    resident: int
    steps: float
    load_bytes_per_step: float  # one program's loads in flight per step
    dram_bytes: float
    l2_bytes: float = 0.0
    link_bytes: float = 0.0  # stored into a peer GPU's memory over NVLink (the vocab-parallel exchange's summaries)
    elements: float = 0.0  # elements processed (issue, MUFU)
    inputs: int = 1
    spill_bytes: int = 0  # per thread
    spill_moved_bytes: float = 0.0  # a thread's spill stores + loads in the whole kernel, counted in its offline
    # compile (perfutils.model.spill_counts, with_spill_counts); 0: estimated
    tiles_per_step: int = 1  # tiles a step works through: the lagged split_row kernel summarises the chunk it read
    # from DRAM and finishes the one it reads again from L2 (2); the loads in flight are the DRAM tile's
    loads_ahead: int = 0  # steps whose loads are issued before this step's arithmetic (prefetch, asynchronous copies
    # to shared memory); 0: a step's loads wait for the previous step's arithmetic
    instructions_per_step: float = 0.0  # a thread's instructions a step, counted in the exact kernel's offline SASS
    # (perfutils.model.cubin.main_loop_instructions); 0: estimated from ModelConstants.instructions_per_element
    step_key: tuple = ()  # a lagged split-row pass: its key in the folder's step counts (perfutils.model.step_counts)


@dataclass(frozen=True)
class LaunchConfig:
    """One recorded configuration as the model sees it: the problem, the kernel's passes, the host work around it."""

    study: str
    config_key: str
    variant: str  # the study's name for what ran (plan, public, fused, case497.step0, ...)
    loss: str
    target_format: str
    tokens: int  # rows
    vocab: int  # columns
    dtype: str
    passes: tuple[KernelPass, ...] = ()
    host: str = "kernel"  # kernel | public | autograd | peer
    launches: int = 1
    elementwise_bytes: float = 0.0  # elementwise studies: bytes of all kernels
    exchange_l2_bytes: float = 0.0  # a vocab-parallel rank's exchange traffic through its own L2 (``with_exchange``)
    exchange_link_bytes: float = 0.0  # ... and what it stores into its peers' memory over NVLink


@dataclass(frozen=True)
class Prediction:
    ms: float
    bound: str
    breakdown: dict = field(default_factory=dict)  # ms per term


def _soft_max(values, p: float) -> float:
    values = [v for v in values if v > 0]
    if not values:
        return 0.0
    top = max(values)
    return top * sum((v / top) ** p for v in values) ** (1.0 / p)


def closed_queue_cycle(programs: int, think: float, service: float) -> float:
    """How long each of ``programs`` programs takes to go once round a closed loop of a delay (``think``: time it
    spends on its own, nobody waiting for it) and one shared server (``service``: its turn there), by exact
    mean-value analysis (Reiser and Lavenberg): with one program, ``think + service``; with many, it tends to
    ``programs x service`` (the server never idles); in between, the waits of a queue."""
    queue = residence = 0.0
    for n in range(1, max(1, int(programs)) + 1):
        residence = service * (1.0 + queue)
        queue = n * residence / (think + residence)
    return think + residence


def thread_instructions_per_step(kp: KernelPass, k: ModelConstants = DEFAULT_CONSTANTS) -> float:
    """What one thread issues a step: the count of the kernel's SASS where it was given
    (``KernelPass.instructions_per_step``), else ``instructions_per_element`` (a second input adding its share) times
    the elements of the step's ``tiles_per_step`` tiles a thread holds. The estimate has no per-step part: run Z's
    Nsight Compute and SASS counts (data/h200/logs/ncu_kept_2026-11-28.txt) found 340-370 instructions a step that
    do not grow with the chunk (the row's summaries, its scalars, the poll), so it is high for wide chunks and low
    for narrow ones."""
    if kp.instructions_per_step:
        return float(kp.instructions_per_step)
    per_thread = kp.tile * max(1, kp.tiles_per_step) / (32 * kp.num_warps)
    return per_thread * k.instructions_per_element * (1.0 + k.second_input_instructions * (kp.inputs - 1))


def step_seconds(kp: KernelPass, gpu: Gpu, k: ModelConstants = DEFAULT_CONSTANTS) -> float:
    """How long one step of a program lasts on an SM shared with ``resident`` programs.

    Each program goes round a loop: it issues its tile's loads and waits their DRAM round trip, then works through
    its ``tiles_per_step`` tiles of arithmetic. The arithmetic needs the SM's four schedulers (128 lanes a cycle:
    ``tile x I / 128`` cycles of them a program), which every resident program shares; its warps' own instruction
    streams (one issue a cycle at best: ``warp_cycles_per_instruction``) may last longer than that turn, and its
    block reductions (shuffles and barriers) follow it: that is time on its own. While one program waits on its
    round trip the others' arithmetic issues, so the step is a closed queue (``closed_queue_cycle``): the round trip
    plus the program's time on its own is the delay, the schedulers the server.
    One program alone takes the round trip plus its arithmetic; many take their issue one after another, never the
    sum of both. With ``loads_ahead`` steps of loads issued before the arithmetic, only the part of the round trip
    that ``loads_ahead`` steps of arithmetic do not cover is waited for."""
    hz = gpu.clock_ghz * 1e9
    per_thread = thread_instructions_per_step(kp, k)
    stream = per_thread * k.warp_cycles_per_instruction / hz  # a warp's own instructions, one after another
    reduce = k.reduce_cycles_per_level * math.log2(32 * kp.num_warps) / hz  # shuffles and barriers after them
    issue = per_thread * 32 * kp.num_warps / 128 / hz  # one program's turn at the SM's schedulers
    own = max(stream, issue) + reduce  # its arithmetic alone on the SM
    latency_s = k.dram_latency_ns * 1e-9
    wait = max(0.0, latency_s / kp.loads_ahead - own) if kp.loads_ahead > 0 else latency_s
    return closed_queue_cycle(max(1, kp.resident), wait + own - issue + exchange_wait(kp, k), issue)


def exchange_wait(kp: KernelPass, k: ModelConstants = DEFAULT_CONSTANTS) -> float:
    """What a counted step of the lagged split-row kernel waits beyond its loads' round trip (seconds): its program
    polls the row's summaries, a round trip to L2 of its own each step, under the load of every resident program (the
    step residuals of run Y, data/h200/logs/ncu_kept_2026-11-28.txt: flat over 4 to 64 chunks a row, so not a wait for
    the row's slowest program). Taken apart on an H200 (runs AE-AH, data/h200/logs/explore_summaries_2026-11-29.txt),
    most of it is that read itself, strong loads that come back after the step's other loads, and little the waiting
    for a slow peer. Only where the step is counted: the per-element estimate's constant absorbed it."""
    return k.exchange_round_trip_ns * 1e-9 if kp.tiles_per_step == 2 and kp.instructions_per_step else 0.0


def in_flight(kp: KernelPass, gpu: Gpu, k: ModelConstants = DEFAULT_CONSTANTS) -> dict:
    """Little's law for one pass, per SM: the DRAM bytes its resident programs request a step
    (``nominal_bytes``: programs x the tile bytes each loads, times the steps loaded ahead), the share of a step
    they are in flight (``duty``: the round trip over the step; 1 when loads ahead hide it), the bytes in flight
    on average (``effective_bytes``), what the GPU's stream needs in flight to be fed (``needed_bytes``: its Triton
    copy per SM x the round trip), and the share of that stream the pass's loads can carry
    (``latency_pct_of_stream``: bytes a step over the step's time, against the stream per SM)."""
    per_sm_bps = gpu.stream_gbps * 1e9 / gpu.sm_count
    latency_s = k.dram_latency_ns * 1e-9
    step_s = step_seconds(kp, gpu, k)
    per_step = max(1, kp.resident) * kp.load_bytes_per_step
    ahead = max(1, kp.loads_ahead)
    duty = 1.0 if kp.loads_ahead else min(1.0, latency_s / step_s)
    return {"nominal_bytes": per_step * ahead, "step_ns": step_s * 1e9, "duty": duty,
            "effective_bytes": per_step * ahead * duty, "needed_bytes": per_sm_bps * latency_s,
            "latency_pct_of_stream": 100 * per_step / step_s / per_sm_bps}


def _pass_terms(kp: KernelPass, gpu: Gpu, k: ModelConstants) -> dict:
    c = gpu.ceilings
    sms = gpu.sm_count
    hz = gpu.clock_ghz * 1e9
    step_s = step_seconds(kp, gpu, k)
    instr = k.instructions_per_element * (1.0 + k.second_input_instructions * (kp.inputs - 1))
    slots = max(1, kp.resident) * sms
    waves = kp.programs / slots
    full, part = math.floor(waves), waves - math.floor(waves)
    if full == 0:  # one wave, not full (a persistent grid a few programs short of the slots): it is the kernel
        full, part = 1, 0.0
        waves = 1.0
    dram_s = kp.dram_bytes / (gpu.stream_gbps * 1e9)
    wave_lat = kp.steps * step_s
    lat_full = full * wave_lat
    lat_part = wave_lat if part > 1e-9 else 0.0
    dram_full = dram_s * (full / waves) if waves else 0.0
    dram_part = dram_s - dram_full
    l2_s = kp.l2_bytes / (c.l2_gbps * 1e9) if c.l2_gbps else 0.0
    link_s = link_seconds(kp, gpu)
    issue_s = (kp.programs * kp.steps * thread_instructions_per_step(kp, k) * 32 * kp.num_warps / (128 * hz * sms)
               if kp.instructions_per_step else kp.elements * instr / (128 * hz * sms))
    exps = kp.elements * kp.inputs / (c.exp2_tops * 1e12) if c.exp2_tops else 0.0
    share = full / waves if waves else 0
    mem_full = _soft_max([dram_full, lat_full, l2_s * share, link_s * share], k.combine_p)
    mem_part = _soft_max([dram_part, lat_part], k.combine_p)
    spill_s = 0.0
    if kp.spill_bytes and kp.spill_moved_bytes:
        spill_s = spill_seconds(kp, gpu)
    elif kp.spill_bytes:
        # Local memory lives in L1 while the resident programs' spilled bytes fit there; past it they go to L2,
        # and past L2 to DRAM (the #497 kernel: 1608 B x 512 threads x 4 programs = 3.3 MB an SM).
        per_sm = kp.spill_bytes * 32 * kp.num_warps * max(1, kp.resident)
        traffic = 2 * k.spill_passes * kp.spill_bytes * 32 * kp.num_warps * kp.programs * kp.steps
        if per_sm * sms > gpu.l2_bytes / 2:
            spill_s = traffic / (gpu.stream_gbps * 1e9)
        elif per_sm > L1_BYTES and c.l2_gbps:
            spill_s = traffic / (c.l2_gbps * 1e9)
    # the SM's issue is in the step (step_seconds: the schedulers are the shared server of each step), so it is
    # not added again here; issue_s stays in the breakdown as the time the instructions alone take
    total = _soft_max([mem_full + mem_part, exps], k.combine_p) + spill_s
    return {"dram": dram_s, "latency": lat_full, "waves": mem_part - dram_part if part else 0.0, "l2": l2_s,
            "issue": issue_s, "mufu": exps, "spills": spill_s, "total": total, **({"nvlink": link_s} if link_s else {})}


def link_seconds(kp: KernelPass, gpu: Gpu) -> float:
    """A pass's stores into a peer GPU at the rate the exchange's store pattern reached over the GPU's NVLink
    (``Gpu.link``); 0 where nothing crosses or no rate was measured. Joined to the pass's memory terms like its L2
    traffic: the stores are issued and not waited for, so they overlap the DRAM stream."""
    return kp.link_bytes / (gpu.link.store_gbps * 1e9) if kp.link_bytes and gpu.link else 0.0


def spill_dram_share(stack_bytes: float, gpu: Gpu) -> float:
    """The share of a kernel's spill traffic that reaches DRAM when the stacks of every thread resident on the GPU
    at once come to ``stack_bytes``: x / (1 + x), x = stack_bytes / L2. Not fitted; the simplest form with no
    constant that meets Nsight Compute's three measurements on the H100 (``case_497_ncu.csv``: DRAM bytes beyond the
    minimum over local-memory bytes): 0.09 at x = 0.11 (form 0.10), 0.42 at x = 0.58 (0.37), 0.90 at x = 8.3 (0.89)."""
    x = max(0.0, float(stack_bytes)) / gpu.l2_bytes
    return x / (1.0 + x)


def spill_seconds(kp: KernelPass, gpu: Gpu) -> float:
    """The local-memory time of a pass whose spill traffic was counted (``spill_moved_bytes``): every thread's
    traffic, the share :func:`spill_dram_share` gives at the DRAM's streaming rate, the rest at the L2's. Added to the
    pass's time: the spills sit in each thread's dependent chain."""
    threads = 32 * kp.num_warps
    traffic = kp.spill_moved_bytes * threads * kp.programs
    to_dram = spill_dram_share(resident_stack_bytes(kp.spill_bytes, kp.num_warps, max(1, kp.resident), gpu.sm_count),
                               gpu)
    l2_gbps = gpu.ceilings.l2_gbps or gpu.stream_gbps
    return to_dram * traffic / (gpu.stream_gbps * 1e9) + (1 - to_dram) * traffic / (l2_gbps * 1e9)


def spill_share_check(folder) -> pd.DataFrame:
    """Each Nsight Compute profile of the #497 family a GPU folder recorded (``case_497_ncu.csv``) beside what the
    model takes of its spills: ``stacks_over_l2`` (the offline compile's stack x threads x programs an SM x SMs, over
    the L2), ``modelled_share`` (:func:`spill_dram_share`) against ``measured_share`` (the profile's DRAM bytes beyond
    the loss's minimum over its local-memory bytes), and the counted traffic (``counted_gb``: spill stores + loads x
    threads x rows) against the profiled (``profiled_gb``). Empty where the folder has no profile."""
    folder = Path(folder)
    path = folder / "case_497_ncu.csv"
    if not path.is_file():
        return pd.DataFrame()
    gpu = gpu_from_folder(folder)
    compiled = pd.read_csv(offline_file(folder, "case_497_registers_offline.csv"))
    compiled = compiled[compiled["status"].fillna("ok") == "ok"]
    rows = []
    for r in pd.read_csv(path).to_dict("records"):
        label, _, rest = str(r["label"]).rpartition(": ")  # "<label>: <variant>, <loss> <format>, <rows> x <cols>, .."
        variant, problem = (part.strip() for part in rest.split(",")[:2])
        loss, target_format = problem.split()
        tokens, vocab = (int(v) for v in re.search(r"(\d+) x (\d+)", rest).groups())
        warps = int(re.search(r"\((\d+)", str(r["block"])).group(1)) // 32
        same = compiled[(compiled["variant"] == variant) & (compiled["vocab"] == vocab)
                        & (compiled["num_warps"] == warps)]
        if len(same) > 1:  # an autotuned kernel's configurations: the one with the profile's programs an SM
            same = same[same["blocks_per_sm"] == r["block_limit_registers"]]
        if len(same) != 1:
            continue
        c = same.iloc[0]
        threads = 32 * warps
        stacks = resident_stack_bytes(float(c["spill_bytes"]), warps, int(c["blocks_per_sm"]), gpu.sm_count)
        local = float(r["local_load_bytes"]) + float(r["local_store_bytes"])
        extra = (float(r["dram_read_bytes"]) + float(r["dram_write_bytes"])
                 - loss_cost(loss, target_format, tokens, vocab, 2).bytes)
        counted = (float(c["spill_store_bytes"]) + float(c["spill_load_bytes"])) * threads * tokens
        rows.append({"kernel": label, "variant": variant, "stack_bytes": int(c["spill_bytes"]),
                     "stacks_over_l2": stacks / gpu.l2_bytes, "modelled_share": spill_dram_share(stacks, gpu),
                     "measured_share": extra / local if local else math.nan,
                     "counted_gb": counted / 1e9, "profiled_gb": local / 1e9})
    return pd.DataFrame(rows)


def spilling_errors(folder) -> pd.DataFrame:
    """The model's |predicted / measured - 1| over a folder's recorded configurations that spill, one row with the
    offline compiles' counted spills (``spills`` "counted") and one with the estimate alone ("estimate": no counts):
    ``configurations``, how many the counts reached (``counted``), ``median`` and ``p90``."""
    folder = Path(folder)
    gpu = gpu_from_folder(folder)
    rows = []
    for name, counts in (("counted", None), ("estimate", {})):
        configs = load_configurations(folder, gpu, spill_counts=counts)
        frame = check(folder, configs=configs)
        frame["spills"] = [any(p.spill_bytes for p in c.passes) for c in configs]
        frame["counted"] = [any(p.spill_moved_bytes for p in c.passes) for c in configs]
        frame = frame[frame["spills"] & frame["measured_ms"].notna()]
        rows.append({"spills": name, "configurations": len(frame), "counted": int(frame["counted"].sum()),
                     "median": frame["abs_rel_err"].median(), "p90": frame["abs_rel_err"].quantile(0.9)})
    return pd.DataFrame(rows)


def predict(config: LaunchConfig, gpu: Gpu, constants: ModelConstants = DEFAULT_CONSTANTS) -> Prediction:
    """Predicted time (ms) of ``config`` on ``gpu``, the limit that binds and the time of every term (ms)."""
    k = constants
    launch_s = k.launch_us * 1e-6 * max(1, config.launches)
    terms = dict.fromkeys(BOUNDS, 0.0)
    if config.passes:
        kernel_s = 0.0
        for kp in config.passes:
            t = _pass_terms(kp, gpu, k)
            kernel_s += t.pop("total")
            for name, value in t.items():
                terms[name] = terms.get(name, 0.0) + value
    else:  # elementwise kernels of the teaching and fusion studies: bytes at copy bandwidth
        kernel_s = config.elementwise_bytes / (gpu.stream_gbps * 1e9)
        kernel_s += k.dram_latency_ns * 1e-9 * max(1, config.launches)
        terms["dram"] = kernel_s
    kernel_s += launch_s
    terms["launch"] = launch_s
    host_s = {"kernel": 0.0, "public": k.host_public_us, "autograd": k.host_autograd_us,
              "peer": k.host_peer_us}[config.host] * 1e-6
    terms["host"] = host_s
    if config.exchange_l2_bytes and gpu.ceilings.l2_gbps:  # shown apart; its time is inside the l2 term already
        terms["exchange"] = config.exchange_l2_bytes / (gpu.ceilings.l2_gbps * 1e9)
    total = max(kernel_s, host_s)
    if host_s >= kernel_s:
        bound = "host"
    else:
        candidates = {n: terms[n] for n in (*BOUNDS, "nvlink") if n != "host" and n in terms}
        bound = max(candidates, key=candidates.get)
    return Prediction(ms=total * 1e3, bound=bound, breakdown={n: v * 1e3 for n, v in terms.items()})


def predict_launch(gpu: Gpu, *, loss: str, target_format: str, tokens: int, vocab: int, variant: str,
                   block_size: int, num_warps: int, n_regs: int, shared_bytes: int = 0, spill_bytes: int = 0,
                   dtype: str = "bf16", constants: ModelConstants = DEFAULT_CONSTANTS,
                   plan: dict | None = None) -> Prediction:
    """The prediction for one loss-kernel launch described by hand (notebook 04's explorer, a what-if): ``variant``
    "fused" (one program per row), "split_row" (chunks of ``block_size`` columns) or "two_pass.stats" /
    "two_pass.grad", with the compile counts given; programs per SM from the exact occupancy of those counts.
    ``plan``: more of the plan's configuration where it is known (split_row's ``programs``, ``num_chunks``,
    ``schedule``; a one-launch kernel's ``instructions_per_step`` from its offline SASS)."""
    row = dict(study="what-if", config_key="", loss=loss, target_format=target_format, variant=variant,
               dtype=dtype, tokens=int(tokens), vocab=int(vocab))
    launch = {"name": variant, "block_size": block_size, "num_warps": num_warps, "n_regs": n_regs,
              "shared_bytes": shared_bytes, "spill_bytes": spill_bytes, "grid": [int(tokens)]}
    plan = {"variant": variant.split(".")[0], "block_size": block_size, "num_warps": num_warps, **(plan or {})}
    passes = tuple(_loss_passes(row, launch, plan, gpu))
    counted = _num(plan.get("instructions_per_step"), 0.0)
    if counted and len(passes) == 1:
        passes = (replace(passes[0], instructions_per_step=counted),)
    return predict(LaunchConfig(**row, passes=passes), gpu, constants)


def describe_prediction(prediction: Prediction, gpu: Gpu, *, loss: str, target_format: str, tokens: int,
                        vocab: int, dtype: str = "bf16") -> str:
    """One line: the predicted time, the bandwidth its minimal bytes imply against the GPU's copy bandwidth, and the
    limit that binds (what the explorer prints under its occupancy)."""
    minimal = loss_cost(loss, target_format, int(tokens), int(vocab), _DTYPE_BYTES.get(dtype, 2)).bytes
    gbps = minimal / (prediction.ms * 1e-3) / 1e9
    return (f"model ({gpu.name or 'this GPU'}'s ceilings, {loss}/{target_format} {tokens} x {vocab} {dtype}): "
            f"{prediction.ms:.3f} ms, {gbps:.0f} GB/s = {100 * gbps / gpu.ceilings.dram_gbps:.0f}% of copy, "
            f"bound: {prediction.bound}")


def what_if_registers(gpu: Gpu, registers, **launch) -> pd.DataFrame:
    """:func:`predict_launch` over registers per thread (the rest of ``launch`` held): one row per value with the
    programs per SM they allow, the predicted time, % of copy bandwidth (minimal bytes) and the bound."""
    rows = []
    minimal = loss_cost(launch["loss"], launch["target_format"], int(launch["tokens"]), int(launch["vocab"]),
                        _DTYPE_BYTES.get(launch.get("dtype", "bf16"), 2)).bytes
    for regs in registers:
        pred = predict_launch(gpu, n_regs=int(regs), **launch)
        rows.append({"n_regs": int(regs),
                     "blocks_per_sm": _resident(int(regs), launch.get("shared_bytes"), launch["num_warps"]),
                     "predicted_ms": pred.ms,
                     "pct_of_copy": 100 * minimal / (pred.ms * 1e-3) / 1e9 / gpu.ceilings.dram_gbps,
                     "bound": pred.bound})
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------------------------------------------
# From recorded rows to configurations (no times)
# ------------------------------------------------------------------------------------------------------------------

def _num(value, default=None):
    try:
        out = float(value)
    except (TypeError, ValueError):
        return default
    return default if math.isnan(out) else out


def _json(value):
    if isinstance(value, str) and value.strip():
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return None
    return None


def _resident(n_regs, shared, num_warps, recorded=None) -> int:
    if recorded:
        return max(1, int(recorded))
    try:
        return max(1, occupancy_of_counts(int(min(255, n_regs)), int(shared or 0), int(num_warps)).blocks_per_sm)
    except (ValueError, TypeError):
        return 1


def _loss_passes(row: dict, launch: dict, plan: dict, gpu: Gpu) -> list[KernelPass]:
    """The passes of one loss kernel launch from its recorded compile counts and plan."""
    tokens, vocab = int(row["tokens"]), int(row["vocab"])
    db = _DTYPE_BYTES.get(row["dtype"], 2)
    counts = LOSS_COUNTS.get((row["loss"], row["target_format"]))
    inputs = counts.inputs_per_element if counts else 1
    elements = float(tokens) * vocab
    name = str(launch.get("name", ""))
    block = int(_num(launch.get("block_size"), 0) or _num(plan.get("block_size"), 0) or min(vocab, 65536))
    warps = int(_num(launch.get("num_warps"), 0) or _num(plan.get("num_warps"), 4))
    regs = _num(launch.get("n_regs"), 128)
    resident = _resident(regs, launch.get("shared_bytes"), warps, _num(launch.get("blocks_per_sm")))
    spill = int(_num(launch.get("spill_bytes"), 0) or 0)
    grid = launch.get("grid") or [tokens]
    programs = int(np.prod(grid))
    row_bytes = vocab * inputs * db
    out_bytes = elements * db + tokens * 4
    if "split_row" in name or plan.get("variant") == "split_row" and "fused" not in name:
        # The cooperative lagged kernel (kernels.split_row): a persistent grid of n_slots rows x chunks programs, as
        # many as the GPU holds (a plan recorded without its grid gets the one plan_split_row would pick); a step
        # reads one chunk from DRAM, summarises it, and finishes the chunk read LAG_STEPS steps earlier, again
        # from L2: two tiles of arithmetic a step, every element worked through twice, LAG_STEPS steps more than
        # the rows a slot takes.
        chunks = int(_num(plan.get("num_chunks"), 0) or math.ceil(vocab / block))
        programs = int(_num(plan.get("programs"), 0) or 0)
        if not programs and "grid" not in launch:
            programs = max(1, min(tokens, resident * gpu.sm_count // chunks)) * chunks
        programs = programs or int(np.prod(grid))
        lagged = "cooperative" not in name and plan.get("schedule", "lagged") == "lagged"
        # the "kept" schedule (explore_lagged.py's run Y, archived): the chunk's exponentials kept in registers for
        # keep_steps steps instead of read again: one tile a step, no L2 re-read
        kept = plan.get("schedule") == "kept"
        behind = LAG_STEPS if lagged else int(plan.get("keep_steps", 1)) if kept else 0  # steps from read to finish
        slots = max(1.0, programs / chunks)
        steps = tokens / slots + behind
        options = {**(plan.get("options") or {}), **{o: plan[o] for o in ("prefetch", "read_ahead") if o in plan}}
        return [KernelPass(name or "split_row", programs, block, warps, resident,
                           steps=steps, load_bytes_per_step=block * inputs * db,
                           dram_bytes=elements * inputs * db + out_bytes,
                           l2_bytes=0.0 if kept else elements * inputs * db,
                           elements=elements * (2 if lagged else 1), inputs=inputs, spill_bytes=spill,
                           tiles_per_step=2 if lagged else 1,
                           step_key=step_key(row["loss"], row["target_format"], row["dtype"], vocab, block, warps,
                                             options) if lagged else ())]
    if name == "two_pass.stats":
        return [KernelPass(name, programs, block, warps, resident, steps=math.ceil(vocab / block),
                           load_bytes_per_step=block * inputs * db, dram_bytes=elements * inputs * db + tokens * 8,
                           elements=elements, inputs=inputs, spill_bytes=spill)]
    if name == "two_pass.grad":
        tile = math.ceil(vocab / max(1, programs // tokens))
        return [KernelPass(name, programs, tile, warps, resident, steps=1, load_bytes_per_step=tile * inputs * db,
                           dram_bytes=elements * inputs * db + out_bytes, elements=elements, inputs=inputs,
                           spill_bytes=spill)]
    # one program per row (fused, the resident row, the #497 kernels, Fast-LLM's): one loop, or two over the row
    tiles = math.ceil(vocab / block)
    if name == "fused.resident" or plan.get("resident") or tiles == 1:
        return [KernelPass(name or "row", programs, min(block, vocab) if tiles == 1 else block, warps, resident,
                           steps=tiles, load_bytes_per_step=min(block, vocab) * inputs * db,
                           dram_bytes=elements * inputs * db + out_bytes, elements=elements, inputs=inputs,
                           spill_bytes=spill)]
    reread = elements * inputs * db
    hit = l2_hit_fraction(resident * gpu.sm_count * row_bytes, gpu)
    return [KernelPass(name or "row", programs, block, warps, resident, steps=2 * tiles,
                       load_bytes_per_step=block * inputs * db,
                       dram_bytes=elements * inputs * db + out_bytes + (1 - hit) * reread,
                       l2_bytes=hit * reread, elements=2 * elements, inputs=inputs, spill_bytes=spill)]


def l2_hit_fraction(reuse_bytes: float, gpu: Gpu) -> float:
    """The share of a second read that L2 still holds when ``reuse_bytes`` were read by the SMs since the first
    read of the same bytes (the rows of every resident program). An H100/H200 L2 is two halves that each cache what
    their SMs read, so half of it is the capacity a row sees; past it the re-read bytes that survive fall as
    capacity / working set (programs start and finish at spread-out times, so reuse distances spread around the mean)."""
    capacity = gpu.l2_bytes / 2
    return 1.0 if reuse_bytes <= capacity else capacity / reuse_bytes


def _host_of(row: dict) -> str:
    return {"public": "public", "public_autograd": "autograd", "fast_llm": "peer"}.get(row["variant"], "kernel")


def _cell(row: dict) -> tuple:
    return (row["study"], row["loss"], row["target_format"], row["dtype"], int(row["tokens"]), int(row["vocab"]))


def _launches_of(row: dict, plan_rows: dict) -> list[dict]:
    launches = _json(row.get("passes")) or []
    if launches:
        return launches
    if row["variant"] in ("public", "public_autograd") and _cell(row) in plan_rows:
        return plan_rows[_cell(row)]
    plan = _json(row.get("plan_config")) or {}
    maxnreg = (plan.get("options") or {}).get("maxnreg")
    # the kernel the recorded choice ran, whichever spelling it was recorded under (split_row with split=False is
    # the fused kernel's loop, fused with resident=True the resident row)
    variant, _options = canonical_variant(str(plan.get("variant") or ""), plan.get("options") or {})
    if variant == "split_row":
        return [{"name": "split_row.lagged", "block_size": plan.get("block_size"), "num_warps": plan.get("num_warps"),
                 "n_regs": maxnreg or 128, "shared_bytes": 48}]
    if variant in ("fused", "resident_row"):
        name = "fused.resident" if variant == "resident_row" else "fused"
        return [{"name": name, "block_size": plan.get("block_size"),
                 "num_warps": plan.get("num_warps"), "n_regs": maxnreg or 64, "shared_bytes": 64,
                 "grid": [int(row["tokens"])]}]
    if not math.isnan(_num(row.get("n_regs"), math.nan)):
        return [{"name": row["variant"], "block_size": _num(row.get("block_size")), "num_warps": _num(row.get("num_warps")),
                 "n_regs": row["n_regs"], "shared_bytes": _num(row.get("shared_bytes"), 0),
                 "blocks_per_sm": _num(row.get("blocks_per_sm")), "spill_bytes": _num(row.get("spill_bytes"), 0),
                 "grid": [int(row["tokens"])]}]
    return []


def config_from_row(row: dict, gpu: Gpu, plan_rows: dict | None = None) -> LaunchConfig | None:
    """A ``LaunchConfig`` from one recorded row (only ``CONFIG_COLUMNS`` are read), or None if it cannot be modelled."""
    row = {c: row.get(c) for c in CONFIG_COLUMNS}
    base = dict(study=row["study"], config_key=row["config_key"], loss=row["loss"],
                target_format=str(row["target_format"]), variant=row["variant"], dtype=row["dtype"],
                tokens=int(_num(row["tokens"], 1)), vocab=int(_num(row["vocab"], 1)))
    if row["study"] in _ELEMENTWISE:
        if row["variant"] in ("torch_naive",):
            nbytes = _num(row.get("naive_bytes"), 0) or _num(row["bytes_min"], 0)
        else:
            nbytes = _num(row["bytes_min"], 0)
        n_kernels = int(_num(row.get("n_kernels"), 1) or 1)
        return LaunchConfig(**base, launches=n_kernels, elementwise_bytes=nbytes * n_kernels)
    if row["variant"] in _UNMODELED or (row["loss"], row["target_format"]) not in LOSS_COUNTS:
        return None
    plan = _json(row.get("plan_config")) or {}
    launches = _launches_of(row, plan_rows or {})
    if not launches:
        return None
    passes = []
    for launch in launches:
        passes.extend(_loss_passes(base, launch, plan, gpu))
    host = _host_of(row)
    # the autograd form's backward is a launch of its own (kernels.autograd: scale_gradient_), queued after the kernel
    return LaunchConfig(**base, passes=tuple(passes), host=host, launches=len(launches) + (host == "autograd"))


def exchange_bytes(*, loss: str, target_format: str, tokens: int, vocab: int, tp: int,
                   num_chunks: int | None = None) -> dict:
    """What one rank of the symmetric vocab-parallel design (``kernels.vocab_parallel_exchange``) moves for the
    exchange in one call, as the product counts it (``kernels.vocab_parallel.bytes_per_rank``): each chunk's summary
    of each row (3 words for cross-entropy from labels, 5 for the distribution losses, 8 bytes each) stored into
    every peer's buffer over NVLink (``sent``; as many ``received`` from the peers) and the row's tp x chunks
    summaries polled from the rank's own L2 before it finishes the row (``polled``). No collective, and no round trip
    on the critical path: a row's summaries are read LAG_STEPS steps after they were written. Zero for tp = 1."""
    if tp < 1:
        raise ValueError(f"tp must be at least 1, got {tp}")
    if tp == 1:
        return {"sent": 0, "received": 0, "polled": 0}
    from kernels.vocab_parallel import bytes_per_rank

    counts = bytes_per_rank("symmetric", loss=loss, target_format=target_format, n_rows=int(tokens),
                            vocab=int(vocab), world_size=int(tp), num_chunks=num_chunks)
    return {key: counts[key] for key in ("sent", "received", "polled")}


def with_exchange(config: LaunchConfig, *, tp: int, num_chunks: int | None = None) -> LaunchConfig:
    """``config`` (one rank's kernel on its slice of every row: ``config.vocab`` is the slice's columns) with the
    exchange of the symmetric design added (``exchange_bytes``): the summaries the peers store into the rank's buffer
    and the polls of that buffer are L2 traffic of the rank's kernel, costed at the GPU's measured L2 read bandwidth
    in the kernel's L2 term; the rank's own stores into its peers (``sent``, 24-40 bytes a row and chunk) cross
    NVLink, costed at the rate the exchange's store pattern reached where the GPU has a measured link (``Gpu.link``,
    :func:`link_seconds`)."""
    moved = exchange_bytes(loss=config.loss, target_format=config.target_format, tokens=config.tokens,
                           vocab=config.vocab * tp, tp=tp, num_chunks=num_chunks)
    l2 = float(moved["received"] + moved["polled"])
    if not l2 or not config.passes:
        return config
    return _exchange_added(config, l2, float(moved["sent"]))


def without_exchange(config: LaunchConfig) -> LaunchConfig:
    """``config`` as it was before :func:`with_exchange`: one rank's kernel alone on its slice."""
    if not (config.exchange_l2_bytes or config.exchange_link_bytes):
        return config
    return _exchange_added(config, -config.exchange_l2_bytes, -config.exchange_link_bytes)


def main_pass(config: LaunchConfig) -> int:
    """The index of the pass that moves the most DRAM bytes: where a vocab-parallel rank's exchange lands."""
    return max(range(len(config.passes)), key=lambda i: config.passes[i].dram_bytes)


def _exchange_added(config: LaunchConfig, l2: float, link: float) -> LaunchConfig:
    main = main_pass(config)
    passes = list(config.passes)
    passes[main] = replace(passes[main], l2_bytes=passes[main].l2_bytes + l2,
                           link_bytes=passes[main].link_bytes + link)
    return replace(config, passes=tuple(passes), exchange_l2_bytes=config.exchange_l2_bytes + l2,
                   exchange_link_bytes=config.exchange_link_bytes + link)


def _read_rows(folder: Path, study: str) -> pd.DataFrame:
    path = folder / f"{study}.csv"
    if not path.is_file():
        return pd.DataFrame()
    frame = pd.read_csv(path, low_memory=False)
    if "study" not in frame.columns:
        frame["study"] = study
    if "status" in frame.columns:
        frame = frame[frame["status"].fillna("ok") == "ok"]
    variants = STUDIES[study]
    if variants is not None:
        frame = frame[frame["variant"].isin(variants)]
    return frame


def _studies(studies) -> tuple:
    if studies is None:
        return tuple(STUDIES)
    unknown = sorted(set(studies) - set(STUDIES))
    if unknown:
        raise ValueError(f"studies: the model reads {sorted(STUDIES)}, not {unknown}")
    return tuple(studies)


def load_configurations(folder, gpu: Gpu | None = None, studies=None, step_counts: dict | None = None,
                        spill_counts: dict | None = None) -> list[LaunchConfig]:
    """Every modellable recorded configuration of ``folder`` (of ``studies``, all by default), built from non-time
    columns only. A lagged split-row pass whose kernel the folder's step counts hold (``step_counts``: by default
    :func:`perfutils.model.step_counts.load_step_counts` of the folder; ``{}``: none) takes that count as its
    ``instructions_per_step``; a pass whose spills the offline compiles counted (``spill_counts``: by default
    :func:`perfutils.model.spill_counts.load_spill_counts`), its ``spill_moved_bytes`` (:func:`with_spill_counts`)."""
    folder = Path(folder)
    gpu = gpu or gpu_from_folder(folder)
    counts = load_step_counts(folder) if step_counts is None else step_counts
    spills = load_spill_counts(folder) if spill_counts is None else spill_counts
    configs = []
    for study in _studies(studies):
        frame = _read_rows(folder, study)
        if frame.empty:
            continue
        records = [{c: r.get(c) for c in CONFIG_COLUMNS} for r in frame.to_dict("records")]
        plan_rows = {_cell(r): _json(r["passes"]) for r in records
                     if r["variant"] == "plan" and _json(r.get("passes"))}
        for r in records:
            cfg = config_from_row(r, gpu, plan_rows)
            if cfg is not None:
                configs.append(with_spill_counts(with_step_counts(cfg, counts), spills))
    return configs


def with_spill_counts(config: LaunchConfig, counts: dict) -> LaunchConfig:
    """``config`` with each spilling pass that ``counts`` (:func:`perfutils.model.spill_counts.load_spill_counts`)
    holds given its counted spill traffic: the bytes outside the loops plus a trip's inside them times the row's
    tiles (every loop of these kernels walks the row's tiles); a count not split by loop only for a one-step pass
    (the pass that loops keeps the estimate: such a count does not say which spills repeat)."""
    def counted(p: KernelPass) -> KernelPass:
        if not p.spill_bytes:
            return p
        count = counts.get(spill_key(config.loss, config.target_format, config.dtype, config.vocab, p.tile,
                                     p.num_warps, p.spill_bytes))
        if count is None or not (count.split or p.steps == 1):
            return p
        return replace(p, spill_moved_bytes=count.once + count.per_trip * math.ceil(config.vocab / p.tile))

    passes = tuple(counted(p) for p in config.passes)
    return replace(config, passes=passes) if passes != config.passes else config


def with_step_counts(config: LaunchConfig, counts: dict) -> LaunchConfig:
    """``config`` with each lagged split-row pass that ``counts`` holds given its counted step."""
    passes = tuple(replace(p, instructions_per_step=counts[p.step_key]) if p.step_key in counts else p
                   for p in config.passes)
    return replace(config, passes=passes) if passes != config.passes else config


SASS_COUNTS = "case_497_registers_offline.csv"  # offline sm_90 compiles with their SASS instruction counts
_PAIR = ("variant", "block_size", "num_warps", "num_stages", "tokens", "vocab")


def second_input_instructions(folder) -> float | None:
    """What a second input adds to a kernel's instructions, as a share of the first, from compile counts alone: the
    median over the offline compiles (``SASS_COUNTS``) of one kernel family at the same tile, warps, stages and shape
    of (cross-entropy from target logits / cross-entropy from labels SASS instructions) - 1. None without such a
    pair. Where ``ModelConstants.second_input_instructions`` comes from."""
    path = Path(folder) / SASS_COUNTS
    if not path.is_file():
        return None
    counts = pd.read_csv(path)
    if "status" in counts.columns:
        counts = counts[counts["status"].fillna("ok") == "ok"]
    ce = counts[counts["loss"] == "cross_entropy"]
    pairs = ce[ce["target_format"] == "logits"].merge(ce[ce["target_format"] == "labels"], on=list(_PAIR),
                                                      suffixes=("_two", "_one"))
    if pairs.empty:
        return None
    return float((pairs["sass_instructions_two"] / pairs["sass_instructions_one"]).median() - 1)


def half_of(config_key: str) -> int:
    """0 or 1: the fitting half of a configuration (a hash of its key, stable across runs)."""
    return hashlib.sha256(config_key.encode()).digest()[0] & 1


def _measured(folder: Path, studies=None) -> dict:
    """(study, config_key) -> [(median ms, the row's UTC time or None)], in the records' order."""
    out = {}
    for study in _studies(studies):
        frame = _read_rows(folder, study)
        if frame.empty:
            continue
        stamps = frame["timestamp_utc"] if "timestamp_utc" in frame else [None] * len(frame)
        for study_name, key, ms, stamp in zip(frame["study"], frame["config_key"], frame["ms_median"], stamps):
            out.setdefault((study_name, key), []).append((ms, stamp if isinstance(stamp, str) else None))
    return out


def _counted_kernels(cfg: LaunchConfig, counted_sources: dict) -> str | None:
    """The kernel sources the configuration's counted steps were compiled from ("" for a configuration without a
    counted step; None where its counts name none, or name several)."""
    keys = [p.step_key for p in cfg.passes if p.step_key and p.instructions_per_step]
    if not keys:
        return ""
    found = {counted_sources.get(key) for key in keys}
    return found.pop() if len(found) == 1 else None


def check(folder, constants: ModelConstants = DEFAULT_CONSTANTS, studies=None, configs=None) -> pd.DataFrame:
    """One row per modellable recorded configuration (of ``studies``, all by default; ``configs``: those
    :func:`load_configurations` already gave, in its order): the measured and predicted times, the bound, the terms,
    the row's ``timestamp_utc`` and ``counted_kernels`` (:func:`_counted_kernels`: which kernel sources a counted step
    came from, to set beside the ones the row ran, :func:`perfutils.provenance.row_kernel_sources`)."""
    folder = Path(folder)
    gpu = gpu_from_folder(folder)
    configs = load_configurations(folder, gpu, studies) if configs is None else configs
    measured = _measured(folder, studies)
    counted_sources = load_counted_sources(folder)
    seen: dict = {}
    rows = []
    for cfg in configs:
        key = (cfg.study, cfg.config_key)
        i = seen.get(key, 0)
        seen[key] = i + 1
        times = measured.get(key, [])
        pred = predict(cfg, gpu, constants)
        ms, stamp = times[i] if i < len(times) else (math.nan, None)
        rows.append({"study": cfg.study, "config_key": cfg.config_key, "measured_ms": ms, "timestamp_utc": stamp,
                     "predicted_ms": pred.ms, "bound": pred.bound, "loss": cfg.loss, "variant": cfg.variant,
                     "tokens": cfg.tokens, "vocab": cfg.vocab, "half": half_of(cfg.config_key),
                     "counted_kernels": _counted_kernels(cfg, counted_sources),
                     **{f"{n}_ms": v for n, v in pred.breakdown.items()}})
    frame = pd.DataFrame(rows)
    if not frame.empty:
        frame["abs_rel_err"] = (frame["predicted_ms"] / frame["measured_ms"] - 1).abs()
    return frame


def _spearman(a: pd.Series, b: pd.Series) -> float:
    ra, rb = a.rank(), b.rank()
    if ra.std() == 0 or rb.std() == 0:
        return math.nan
    return float(np.corrcoef(ra, rb)[0, 1])


SWEEP_KEYS = ("study", "loss", "vocab", "tokens")  # a sweep: the configurations of one problem
MIN_SWEEP = 5  # configurations a sweep needs for its rank correlation to count


def sweep_spearman(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per sweep (``SWEEP_KEYS``, at least ``MIN_SWEEP`` configurations) of a ``check`` frame: its size
    and the Spearman rank correlation of predicted and measured times (sweeps of equal ranks are left out)."""
    rows = [dict(zip(SWEEP_KEYS, key), n=len(s), spearman=_spearman(s["measured_ms"], s["predicted_ms"]))
            for key, s in frame.groupby(list(SWEEP_KEYS)) if len(s) >= MIN_SWEEP]
    out = pd.DataFrame(rows, columns=[*SWEEP_KEYS, "n", "spearman"])
    return out[out["spearman"].notna()].reset_index(drop=True)


def summarize(frame: pd.DataFrame) -> pd.DataFrame:
    """Median and 90th percentile of the absolute relative error, and the median Spearman rank correlation
    inside each sweep (``sweep_spearman``), per study and overall."""
    out = []
    groups = [("all", frame)] + list(frame.groupby("study"))
    for name, g in groups:
        rhos = sweep_spearman(g)["spearman"].tolist()
        out.append({"study": name, "n": len(g), "median_err": g["abs_rel_err"].median(),
                    "p90_err": g["abs_rel_err"].quantile(0.9), "sweeps": len(rhos),
                    "median_spearman": float(np.median(rhos)) if rhos else math.nan})
    return pd.DataFrame(out)


def plain_roofline_ms(folder) -> pd.Series:
    """The baseline: minimal bytes over the measured copy bandwidth, per configuration of ``check``."""
    folder = Path(folder)
    gpu = gpu_from_folder(folder)
    rows = []
    for study in STUDIES:
        frame = _read_rows(folder, study)
        if not frame.empty:
            rows.append(frame[["study", "config_key", "bytes_min"]])
    table = pd.concat(rows)
    return table.assign(roofline_ms=table["bytes_min"] / (gpu.ceilings.dram_gbps * 1e9) * 1e3)


__all__ = ["BOUNDS", "DEFAULT_CONSTANTS", "Gpu", "KernelPass", "LaunchConfig", "ModelConstants", "Prediction",
           "Link", "bonded_links", "check", "config_from_row", "exchange_bytes", "gpu_from_folder", "half_of",
           "link_of", "link_seconds", "load_configurations", "main_pass",
           "load_spill_counts", "plain_roofline_ms", "fit_half", "predict", "spill_seconds", "spill_share_check",
           "spilling_errors", "summarize", "sweep_spearman", "with_exchange", "with_spill_counts", "without_exchange"]


def _errors(configs, measured, gpu, constants) -> np.ndarray:
    pred = np.array([predict(c, gpu, constants).ms for c in configs])
    return np.abs(pred / measured - 1)


def fit_half(folder, half: int = 0, start: ModelConstants = DEFAULT_CONSTANTS, rounds: int = 4,
             names=None) -> ModelConstants:
    """Constants fitted on one half of ``folder``'s configurations (``half_of``): coordinate descent on each
    constant over multiplicative steps, minimising the median plus the 90th percentile of the relative error, averaged
    over the studies, plus one minus the median Spearman rank correlation inside the half's sweeps.
    How the frozen ``DEFAULT_CONSTANTS`` were obtained (H100, half 0); reported on the other half by ``check``.
    ``names``: the constants to fit (all by default), the others held."""
    folder = Path(folder)
    frame = check(folder, start)
    gpu = gpu_from_folder(folder)
    configs = load_configurations(folder, gpu)
    keep = [i for i, c in enumerate(configs) if half_of(c.config_key) == half and not math.isnan(frame["measured_ms"][i])]
    configs = [configs[i] for i in keep]
    measured = frame["measured_ms"].to_numpy()[keep]

    studies = np.array([c.study for c in configs])

    sweeps = pd.DataFrame([dict(zip(SWEEP_KEYS, (c.study, c.loss, c.vocab, c.tokens))) for c in configs])

    def score(k):  # every study weighs the same: the vocab sweep's 700 rows must not drown the ablation's 13
        pred = np.array([predict(c, gpu, k).ms for c in configs])
        err = np.abs(pred / measured - 1)
        # and the order inside each sweep, which the error alone does not see (a host floor that lifts a fast call
        # above slower ones costs little error and many ranks)
        rho = sweep_spearman(sweeps.assign(measured_ms=measured, predicted_ms=pred))["spearman"]
        return float(np.mean([np.median(err[studies == s]) + np.quantile(err[studies == s], 0.9)
                              for s in sorted(set(studies))])) + (1 - float(np.median(rho)) if len(rho) else 0.0)

    best, best_score = start, score(start)
    for _ in range(rounds):
        for name in names or asdict(start):
            for factor in (0.5, 0.7, 0.85, 0.93, 1.07, 1.18, 1.4, 2.0):
                trial = replace(best, **{name: getattr(best, name) * factor})
                s = score(trial)
                if s < best_score:
                    best, best_score = trial, s
    return best
