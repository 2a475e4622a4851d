"""Roofline model: where a measured kernel sits relative to the GPU's ceilings.

A kernel with ``bytes`` of DRAM traffic, ``flops`` FP32 operations and ``transcendentals`` MUFU
operations (exp2/log2/rcp) cannot finish faster than the slowest of

    bytes / DRAM bandwidth,   flops / FP32 rate,   transcendentals / MUFU rate

(each resource working alone at its peak). The largest of these lower bounds is the roof that
binds; achieved time over that bound says how close the kernel gets. For the loss kernels of this
project the DRAM bound dominates by one to two orders of magnitude, which is why results are
reported as % of *measured copy bandwidth* and why ``floor_time_s`` is ``bytes / copy bandwidth``.

Units: bandwidth in GB/s (1e9 B/s), FP32 in TFLOP/s (FMA = 2 flops), transcendentals in
Tops/s (1e12 results/s), times in seconds.
"""

from __future__ import annotations

import json
import math
import numbers
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd

from .hardware import DeviceSpec, lookup_device

SOURCES = ("measured", "datasheet")


def _check_positive(name: str, value, *, optional: bool = False) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) \
            or value <= 0:
        kind = "a positive number or None" if optional else "a positive number"
        raise ValueError(f"{name}: expected {kind}, got {value!r}")
    return float(value)


def _check_non_negative(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) \
            or value < 0:
        raise ValueError(f"{name}: expected a finite number >= 0, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class Ceilings:
    """Peak rates of one GPU, either measured (``perfutils.studies.ceilings``) or from the datasheet."""

    dram_gbps: float  # copy bandwidth: (bytes read + bytes written) / s / 1e9
    dram_read_gbps: float | None = None  # read-only streaming bandwidth
    l2_gbps: float | None = None  # L2-resident read bandwidth
    fp32_tflops: float | None = None
    exp2_tops: float | None = None  # transcendental (MUFU) results per second / 1e12
    source: str = "measured"
    gpu: str = ""

    def __post_init__(self):
        _check_positive("dram_gbps", self.dram_gbps)
        for name in ("dram_read_gbps", "l2_gbps", "fp32_tflops", "exp2_tops"):
            _check_positive(name, getattr(self, name), optional=True)
        if self.source not in SOURCES:
            raise ValueError(f"source: expected one of {SOURCES}, got {self.source!r}")


def ceilings_from_datasheet(spec: DeviceSpec | str) -> Ceilings:
    """Datasheet peaks as ceilings (fallback when nothing was measured).

    The datasheet has one DRAM number, used for both copy and read; it has no L2 bandwidth.
    """
    if isinstance(spec, str):
        spec = lookup_device(spec)
    if not isinstance(spec, DeviceSpec):
        raise TypeError(f"spec: expected a DeviceSpec or device name, got {type(spec).__name__}")
    return Ceilings(dram_gbps=spec.dram_gbps, dram_read_gbps=spec.dram_gbps, l2_gbps=None,
                    fp32_tflops=spec.fp32_tflops, exp2_tops=spec.exp2_tops, source="datasheet",
                    gpu=spec.name)


# ceiling name in the CSV of perfutils.studies.ceilings -> (Ceilings field, expected unit)
_RECORD_FIELDS = {
    "dram_copy_torch": ("dram_gbps", "GB/s"),
    "dram_copy_triton": ("dram_gbps", "GB/s"),
    "dram_read": ("dram_read_gbps", "GB/s"),
    "l2_read": ("l2_gbps", "GB/s"),
    "fp32_fma": ("fp32_tflops", "TFLOP/s"),
    "exp2": ("exp2_tops", "Tops/s"),
}


def _gpu_name_of(df: pd.DataFrame, path: Path | None) -> str:
    for column in ("gpu_name", "gpu"):
        if column in df.columns:
            names = sorted({str(v) for v in df[column].dropna()})
            if len(names) > 1:
                raise ValueError(f"df_or_path: ceilings of several GPUs mixed in one table: {names}")
            if names:
                return names[0]
    if path is not None and path.with_suffix(".json").is_file():
        try:
            meta = json.loads(path.with_suffix(".json").read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"df_or_path: sidecar {path.with_suffix('.json')} is not JSON "
                             f"({exc})") from None
        if isinstance(meta, dict) and isinstance(meta.get("gpu_name"), str):
            return meta["gpu_name"]
    return ""


def ceilings_from_records(df_or_path, gpu: str | None = None) -> Ceilings:
    """Measured ceilings from the table ``perfutils.studies.ceilings.measure_ceilings`` returns/writes.

    Several rows of one ceiling (repeated runs) keep the best value: a ceiling is the best rate
    the GPU was seen to reach. The copy ceiling is the better of the torch and Triton copies.
    """
    path = None
    if isinstance(df_or_path, (str, os.PathLike)):
        path = Path(df_or_path)
        if not path.is_file():
            raise ValueError(f"df_or_path: no such file {path}")
        df = pd.read_csv(path)
    elif isinstance(df_or_path, pd.DataFrame):
        df = df_or_path
    else:
        raise TypeError("df_or_path: expected a DataFrame or a CSV path, "
                        f"got {type(df_or_path).__name__}")
    missing = {"ceiling", "value", "unit"} - set(df.columns)
    if missing:
        raise ValueError(f"df_or_path: missing columns {sorted(missing)}")
    if "status" in df.columns:  # failed rows carry no value
        df = df[df["status"].fillna("ok") == "ok"]
    values: dict[str, float] = {}
    for row in df.itertuples(index=False):
        if row.ceiling not in _RECORD_FIELDS or pd.isna(row.value):
            continue
        name, unit = _RECORD_FIELDS[row.ceiling]
        if row.unit != unit:
            raise ValueError(f"df_or_path: ceiling {row.ceiling!r} in {row.unit!r}, expected {unit!r}")
        values[name] = max(values.get(name, 0.0), float(row.value))
    if "dram_gbps" not in values:
        raise ValueError("df_or_path: no dram_copy_torch/dram_copy_triton row; the copy bandwidth "
                         "is required")
    return Ceilings(source="measured", gpu=gpu if gpu is not None else _gpu_name_of(df, path),
                    **values)


@dataclass(frozen=True)
class KernelCost:
    """Work of one kernel call: DRAM bytes (read + written), FP32 flops, transcendentals."""

    bytes: float
    flops: float = 0.0
    transcendentals: float = 0.0
    l2_resident: bool = False  # the bytes come from L2 (a working set smaller than L2)
    label: str = ""

    def __post_init__(self):
        for name in ("bytes", "flops", "transcendentals"):
            _check_non_negative(name, getattr(self, name))

    @classmethod
    def per_element(cls, elements: float, *, bytes_per_element: float,
                    flops_per_element: float = 0.0, transcendentals_per_element: float = 0.0,
                    rows: float = 0, bytes_per_row: float = 0.0, flops_per_row: float = 0.0,
                    transcendentals_per_row: float = 0.0, label: str = "") -> "KernelCost":
        """Cost from per-element (and optional per-row) counts."""
        elements = _check_non_negative("elements", elements)
        rows = _check_non_negative("rows", rows)
        return cls(bytes=elements * bytes_per_element + rows * bytes_per_row,
                   flops=elements * flops_per_element + rows * flops_per_row,
                   transcendentals=elements * transcendentals_per_element
                   + rows * transcendentals_per_row,
                   label=label)

    @property
    def arithmetic_intensity(self) -> float:
        """FP32 flops per DRAM byte."""
        return self.flops / self.bytes if self.bytes else math.inf

    def __add__(self, other: "KernelCost") -> "KernelCost":
        if not isinstance(other, KernelCost):
            return NotImplemented
        return KernelCost(self.bytes + other.bytes, self.flops + other.flops,
                          self.transcendentals + other.transcendentals,
                          self.l2_resident and other.l2_resident,
                          self.label or other.label)

    def scaled(self, factor: float) -> "KernelCost":
        factor = _check_non_negative("factor", factor)
        return KernelCost(self.bytes * factor, self.flops * factor,
                          self.transcendentals * factor, self.l2_resident, self.label)


@dataclass(frozen=True)
class Placement:
    """A measured kernel placed on the roofline."""

    time_s: float
    bytes: float
    flops: float
    transcendentals: float
    achieved_gbps: float
    achieved_tflops: float
    achieved_tops: float  # transcendentals
    arithmetic_intensity: float  # flop / byte
    bound_times_s: dict[str, float | None] = field(compare=False)  # per roof; None = unknown roof
    binding_roof: str = ""  # the roof with the largest lower bound on time
    bound_time_s: float = 0.0  # that lower bound
    pct_of_roof: float = 0.0  # 100 x bound_time_s / time_s
    floor_time_s: float = 0.0  # bytes / copy bandwidth
    pct_of_copy: float = 0.0  # 100 x achieved bandwidth / copy bandwidth (= floor / time)

    def to_dict(self) -> dict:
        out = asdict(self)
        bounds = out.pop("bound_times_s")
        out.update({f"bound_{name}_s": value for name, value in bounds.items()})
        return out


def place(cost: KernelCost, time_s: float, ceilings: Ceilings) -> Placement:
    """Achieved rates of ``cost`` done in ``time_s`` and the roof that binds it.

    The memory roof is DRAM copy bandwidth unless ``cost.l2_resident``, then L2 (if measured).
    Roofs the ceilings do not know (None) are skipped.
    """
    if not isinstance(cost, KernelCost):
        raise TypeError(f"cost: expected a KernelCost, got {type(cost).__name__}")
    if not isinstance(ceilings, Ceilings):
        raise TypeError(f"ceilings: expected a Ceilings, got {type(ceilings).__name__}")
    time_s = _check_positive("time_s", time_s)

    def bound(amount: float, rate: float | None, scale: float) -> float | None:
        return None if rate is None else amount / (rate * scale)

    bounds = {
        "dram": bound(cost.bytes, ceilings.dram_gbps, 1e9),
        "l2": bound(cost.bytes, ceilings.l2_gbps, 1e9),
        "fp32": bound(cost.flops, ceilings.fp32_tflops, 1e12),
        "transcendental": bound(cost.transcendentals, ceilings.exp2_tops, 1e12),
    }
    memory_roof = "l2" if cost.l2_resident and bounds["l2"] is not None else "dram"
    candidates = {name: bounds[name] for name in (memory_roof, "fp32", "transcendental")
                  if bounds[name] is not None}
    # Ties go to the first candidate (memory), the roof that sets our reference floor.
    binding = max(candidates, key=lambda name: candidates[name])
    floor = bounds["dram"]
    achieved_gbps = cost.bytes / time_s / 1e9
    return Placement(
        time_s=time_s,
        bytes=cost.bytes,
        flops=cost.flops,
        transcendentals=cost.transcendentals,
        achieved_gbps=achieved_gbps,
        achieved_tflops=cost.flops / time_s / 1e12,
        achieved_tops=cost.transcendentals / time_s / 1e12,
        arithmetic_intensity=cost.arithmetic_intensity,
        bound_times_s=bounds,
        binding_roof=binding,
        bound_time_s=candidates[binding],
        pct_of_roof=100.0 * candidates[binding] / time_s,
        floor_time_s=floor,
        pct_of_copy=100.0 * achieved_gbps / ceilings.dram_gbps,
    )


# ------------------------------------------------------------------------------------------
# Algorithmic minimum cost of the losses
# ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _LossCounts:
    inputs_per_element: int  # (rows, vocab) tensors read: logits, and target logits if any
    flops_fwd: float  # per element, forward
    flops_bwd: float  # per element, extra for the gradient
    exps_per_element: float
    logs_per_row: float
    reads_labels: bool


# Counting convention (fused single pass, exp kept in registers for the gradient, FMA = 2):
#   softmax statistics of one (rows, vocab) input: running max 1 + (x*log2e - m*log2e) FMA 2
#       + running sum 1 = 4 flops and 1 exp2 per element; 1 log per row for the logsumexp.
#   cross_entropy/labels: statistics only (the label's logit is one gather per row);
#       gradient p = e/s (1) times grad scale (1) = 2.
#   distribution losses read a target too (+4 flops, +1 exp, +1 log per row) and form the loss:
#       cross_entropy/logits: p_t = e_t/s_t (1), sum p_t*x FMA (2) = 3;
#       forward_kl: p_t (1), t - x (1), FMA (2) = 4;  reverse_kl: p_x (1), x - t (1), FMA (2) = 4;
#       gradient (p_x - p_t, or p_x * (log-ratio - KL)): 3.
# Per-row reciprocals (MUFU.RCP for 1/s) and the final reductions are not counted. These are
# approximations for the roofline: the losses sit at ~1-4 flop/byte, far below the ridge.
LOSS_COUNTS = {
    ("cross_entropy", "labels"): _LossCounts(1, 4, 2, 1, 1, True),
    ("cross_entropy", "logits"): _LossCounts(2, 4 + 4 + 3, 3, 2, 2, False),
    ("forward_kl", "logits"): _LossCounts(2, 4 + 4 + 4, 3, 2, 2, False),
    ("reverse_kl", "logits"): _LossCounts(2, 4 + 4 + 4, 3, 2, 2, False),
}


def loss_cost(loss: str, target_format: str, tokens: int, vocab: int, dtype_bytes: int = 2, *,
              backward: bool = True, label_bytes: int = 8, loss_bytes_per_row: int = 4) -> KernelCost:
    """Algorithmic minimum cost of one fused loss (+ gradient) call over ``tokens x vocab`` logits.

    Bytes: every input element read once (logits; target logits for distribution losses), the
    gradient written once (``backward``), plus per row the int64 label (labels CE) and one fp32
    loss value. bf16 labels CE: 4 B/element; distribution losses: 6 B/element.
    """
    key = (loss, target_format)
    if loss not in {name for name, _ in LOSS_COUNTS}:
        raise ValueError(f"loss: expected one of {sorted({n for n, _ in LOSS_COUNTS})}, got {loss!r}")
    if key not in LOSS_COUNTS:
        allowed = sorted(fmt for name, fmt in LOSS_COUNTS if name == loss)
        raise ValueError(f"target_format: {loss} supports {allowed}, got {target_format!r}")
    for name, value in (("tokens", tokens), ("vocab", vocab), ("dtype_bytes", dtype_bytes)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
            raise ValueError(f"{name}: expected a positive integer, got {value!r}")
    counts = LOSS_COUNTS[key]
    bytes_per_element = dtype_bytes * (counts.inputs_per_element + (1 if backward else 0))
    bytes_per_row = loss_bytes_per_row + (label_bytes if counts.reads_labels else 0)
    return KernelCost.per_element(
        tokens * vocab,
        bytes_per_element=bytes_per_element,
        flops_per_element=counts.flops_fwd + (counts.flops_bwd if backward else 0),
        transcendentals_per_element=counts.exps_per_element,
        rows=tokens,
        bytes_per_row=bytes_per_row,
        transcendentals_per_row=counts.logs_per_row,
        label=f"{loss}/{target_format}",
    )
