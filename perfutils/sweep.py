"""Sweeps: measure every configuration of a grid, one CSV row each, resumable after a kill.

A sweep config (a dict, or a YAML file; a top-level ``sweep:`` mapping is used if present so one
file can also carry a notebook's parameters)::

    study: block_size_sweep        # required: the CSV is <out>/<gpu-slug>/<study>.csv
    out: data                      # default "data"
    seed: 0                        # inputs are a pure function of (seed, dtype, tokens, vocab)
    check_rows: 64                 # rows sampled for the float64 correctness check
    loss: [cross_entropy, reverse_kl]   # every grid key takes a value or a list
    target_format: [labels, logits]     # invalid (loss, target_format) pairs are skipped, and reported
    variant: [fused, two_pass]
    dtype: bf16                    # bf16 | fp16 | fp32
    tokens: [4096, 16384]
    vocab: [32000, 131072]
    block_size: [1024, 4096, null] # powers of two; null = the variant's default
    num_warps: [4, 8, 16]          # powers of two 1..32; null = the variant's default
    # optional: warmup_ms 25, rep_ms 100, flush_l2 true, copy_gbps (GB/s), ceilings (the ceilings CSV,
    # or JSON/YAML with copy_gbps; else copy bandwidth is measured at sweep start), retry_errors false,
    # ignore_fraction 0.05 (share of label rows set to ignore_index), logit_scale 2.0, prepare_kwargs {}, notes

Run order groups configurations by input shape so inputs (and their float64 references) are made
once per (dtype, tokens, vocab) and reused.

One row per *plan* (a variant may launch several kernels). The guide's per-kernel columns
(n_regs, spill_bytes, shared_bytes, occupancy, blocks_per_sm, limiter) describe the **limiting
pass**: the launch with the lowest occupancy (ties: more registers), since occupancy is what caps
latency hiding in these memory-bound kernels. Every pass is listed in the ``passes`` column (JSON),
and ``limiting_pass`` names the chosen one.

Extra columns written by the GPU measurer: compile_ms, peak_mem_bytes, loss_rel_err, grad_rel_err,
n_launches, limiting_pass, passes, plan_config, inputs_modified, stats_error.
"""

from __future__ import annotations

import gc
import itertools
import json
import math
import numbers
import os
import re
import time
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from .records import CONFIG_COLUMNS, STATUSES, ResultStore, config_key, data_path, error_text

__all__ = [
    "DTYPES",
    "TOLERANCE",
    "IGNORE_INDEX",
    "SweepSpec",
    "SweepPoint",
    "KnownNames",
    "known_names",
    "load_config",
    "plan_configs",
    "run_sweep",
    "GpuMeasurer",
    "TimingBackend",
]

# Canonical dtype names and their spellings.
_DTYPE_ALIASES = {
    "bf16": "bf16", "bfloat16": "bf16",
    "fp16": "fp16", "float16": "fp16", "half": "fp16",
    "fp32": "fp32", "float32": "fp32", "float": "fp32",
}  # fmt: skip
DTYPES = ("bf16", "fp16", "fp32")
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
# Relative error allowed against the float64 reference (GUIDE: bf16/fp16 1e-2, fp32 1e-5).
TOLERANCE = {"bf16": 1e-2, "fp16": 1e-2, "fp32": 1e-5}
IGNORE_INDEX = -100  # label of rows that take no part in the loss (PyTorch's default)

# Used when `kernels` does not export LOSSES / LOSS_TARGET_FORMATS / VARIANTS itself.
DEFAULT_LOSS_TARGET_FORMATS = {
    "cross_entropy": ("labels", "logits"),
    "forward_kl": ("logits",),
    "reverse_kl": ("logits",),
}

_GRID_REQUIRED = ("loss", "target_format", "variant", "dtype", "tokens", "vocab")
_GRID_OPTIONAL = ("block_size", "num_warps")  # default [None]: the variant picks
_SETTINGS = {
    "study": None,
    "out": "data",
    "seed": 0,
    "check_rows": 64,
    "warmup_ms": 25.0,
    "rep_ms": 100.0,
    "flush_l2": True,
    "copy_gbps": None,
    "ceilings": None,
    "retry_errors": False,
    "ignore_fraction": 0.05,
    "logit_scale": 2.0,
    "prepare_kwargs": {},
    "notes": None,
}

# Messages of CUDA errors after which the context is unusable: every later launch would fail too.
_FATAL_CUDA = (
    "illegal memory access",
    "unspecified launch failure",
    "device-side assert",
    "misaligned address",
    "illegal instruction",
    "cuda error: an illegal",
)


# --------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SweepPoint:
    """One configuration of the grid."""

    loss: str
    target_format: str
    variant: str
    dtype: str
    tokens: int
    vocab: int
    block_size: int | None
    num_warps: int | None

    @property
    def key(self) -> str:
        return config_key(self.as_dict())

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class SweepSpec:
    """A validated sweep config (see the module docstring for the keys)."""

    study: str
    out: Path
    seed: int
    check_rows: int
    grid: dict[str, tuple[Any, ...]]
    warmup_ms: float = 25.0
    rep_ms: float = 100.0
    flush_l2: bool = True
    copy_gbps: float | None = None
    ceilings: Path | None = None
    retry_errors: bool = False
    ignore_fraction: float = 0.05
    logit_scale: float = 2.0
    prepare_kwargs: dict[str, Any] = field(default_factory=dict)
    notes: str | None = None
    source: str = "<dict>"
    parameters: dict[str, Any] = field(default_factory=dict)  # the config as given, for the sidecar


@dataclass(frozen=True)
class KnownNames:
    """Valid names; ``variants=None`` means any identifier is accepted."""

    loss_target_formats: Mapping[str, tuple[str, ...]]
    variants: tuple[str, ...] | None = None
    block_size_range: tuple[int, int] | None = None  # inclusive; None: any power of two


def known_names() -> KnownNames:
    """The names `kernels` accepts, from its exports when present, else the project defaults.

    Valid (loss, target_format) pairs come from ``kernels.LOSS_TARGET_FORMATS`` ({loss: formats}),
    else the keys of ``kernels.problem.LOSS_CODES``, else :data:`DEFAULT_LOSS_TARGET_FORMATS`;
    variants from ``kernels.VARIANTS`` (not checked when absent).
    """
    try:
        import kernels
    except ModuleNotFoundError as exc:
        if exc.name != "kernels":
            raise
        kernels = None
    pairs = getattr(kernels, "LOSS_TARGET_FORMATS", None)
    codes = getattr(getattr(kernels, "problem", None), "LOSS_CODES", None)
    if pairs is None and isinstance(codes, Mapping):
        pairs = {}
        for loss, target_format in codes:
            pairs.setdefault(loss, ())
            pairs[loss] += (target_format,)
    if pairs is None:
        pairs = DEFAULT_LOSS_TARGET_FORMATS
    variants = getattr(kernels, "VARIANTS", None)
    problem = getattr(kernels, "problem", None)
    low, high = getattr(problem, "MIN_BLOCK_SIZE", None), getattr(problem, "MAX_BLOCK_SIZE", None)
    return KnownNames(
        {str(k): tuple(v) for k, v in dict(pairs).items()},
        tuple(variants) if variants is not None else None,
        (int(low), int(high)) if _is_int(low) and _is_int(high) else None,
    )


def _fail(source: str, message: str) -> None:
    raise ValueError(f"sweep config ({source}): {message}")


def _as_list(source: str, name: str, value: Any) -> list[Any]:
    if isinstance(value, (list, tuple)):
        if not value:
            _fail(source, f"{name!r} is an empty list; give at least one value")
        return list(value)
    if isinstance(value, (set, dict)):
        _fail(source, f"{name!r} must be a value or a list, got {type(value).__name__}")
    return [value]


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _positive_int(source: str, name: str, value: Any) -> int:
    if not _is_int(value) or value <= 0:
        _fail(source, f"{name!r} values must be positive integers, got {value!r}")
    return int(value)


def _power_of_two_or_none(source: str, name: str, value: Any, bounds: tuple[int, int] | None = None) -> int | None:
    if value is None:
        return None
    if not _is_int(value) or value <= 0 or value & (value - 1):
        _fail(source, f"{name!r} value {value!r} is not a power of two (use null for the variant's default)")
    if bounds is not None and not bounds[0] <= value <= bounds[1]:
        _fail(source, f"{name!r} value {value} is outside [{bounds[0]}, {bounds[1]}]")
    return int(value)


def _positive_number(source: str, name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value <= 0:
        _fail(source, f"{name!r} must be a positive number, got {value!r}")
    return float(value)


def _name_list(source: str, name: str, value: Any, allowed: Iterable[str] | None) -> tuple[str, ...]:
    values = _as_list(source, name, value)
    allowed = tuple(allowed) if allowed is not None else None
    for item in values:
        if not isinstance(item, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", item):
            _fail(source, f"{name!r} values must be names (letters, digits, '_', '.', '-'), got {item!r}")
        if allowed is not None and item not in allowed:
            _fail(source, f"unknown {name} {item!r}; expected one of {list(allowed)}")
    return tuple(values)


def _read_config_source(config: Any) -> tuple[dict[str, Any], str]:
    if isinstance(config, (str, os.PathLike)):
        path = Path(config)
        if not path.exists():
            raise FileNotFoundError(f"sweep config {path} does not exist")
        import yaml

        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except yaml.YAMLError as exc:
            raise ValueError(f"sweep config {path} is not valid YAML: {exc}") from None
        source = str(path)
    elif isinstance(config, Mapping):
        data, source = dict(config), "<dict>"
    else:
        raise TypeError(f"sweep config must be a dict, a YAML path or a SweepSpec, got {type(config).__name__}")
    if not isinstance(data, Mapping):
        raise ValueError(f"sweep config ({source}) must be a mapping of keys to values, got {type(data).__name__}")
    if "sweep" in data:  # a params file shared with a notebook keeps the sweep under `sweep:`
        if not isinstance(data["sweep"], Mapping):
            _fail(source, f"'sweep' must be a mapping, got {type(data['sweep']).__name__}")
        data = data["sweep"]
    return dict(data), source


def load_config(config: Any, *, known: KnownNames | None = None, overrides: Mapping[str, Any] | None = None) -> SweepSpec:
    """Validate a sweep config (dict, YAML path, or SweepSpec) into a :class:`SweepSpec`.

    Everything is checked before anything runs: unknown keys (typos), names, dtypes, positive
    sizes, powers of two, duplicates, tolerances, and that the grid is not empty. ``overrides``
    (e.g. the CLI's ``--out``) replace keys of the config before validation.
    """
    if isinstance(config, SweepSpec):
        if not overrides:
            return config
        data, source = dict(config.parameters), config.source
    else:
        data, source = _read_config_source(config)
    if overrides is not None and not isinstance(overrides, Mapping):
        raise TypeError(f"load_config: overrides must be a mapping, got {type(overrides).__name__}")
    data.update(overrides or {})
    unknown = sorted(set(data) - set(_SETTINGS) - set(_GRID_REQUIRED) - set(_GRID_OPTIONAL))
    if unknown:
        _fail(source, f"unknown keys {unknown}; allowed: {sorted(set(_SETTINGS) | set(_GRID_REQUIRED) | set(_GRID_OPTIONAL))}")
    missing = [name for name in ("study",) + _GRID_REQUIRED if data.get(name) is None]
    if missing:
        _fail(source, f"missing required keys {missing}")
    known = known or known_names()
    settings = {**_SETTINGS, **{k: v for k, v in data.items() if k in _SETTINGS}}

    study = settings["study"]
    if not isinstance(study, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", study):
        _fail(source, f"'study' must be a file-name-safe name (letters, digits, '_', '.', '-'), got {study!r}")
    if not isinstance(settings["out"], (str, os.PathLike)) or not str(settings["out"]):
        _fail(source, f"'out' must be a directory path, got {settings['out']!r}")
    if not _is_int(settings["seed"]) or settings["seed"] < 0:
        _fail(source, f"'seed' must be a non-negative integer, got {settings['seed']!r}")
    check_rows = settings["check_rows"]
    if not _is_int(check_rows) or check_rows <= 0:
        _fail(source, f"'check_rows' must be a positive integer, got {check_rows!r}")
    for name in ("flush_l2", "retry_errors"):
        if not isinstance(settings[name], bool):
            _fail(source, f"{name!r} must be true or false, got {settings[name]!r}")
    fraction = settings["ignore_fraction"]
    if isinstance(fraction, bool) or not isinstance(fraction, numbers.Real) or not 0 <= fraction < 1:
        _fail(source, f"'ignore_fraction' must be a number in [0, 1), got {fraction!r}")
    copy_gbps = settings["copy_gbps"]
    if copy_gbps is not None:
        copy_gbps = _positive_number(source, "copy_gbps", copy_gbps)
    ceilings = settings["ceilings"]
    if ceilings is not None:
        if not isinstance(ceilings, (str, os.PathLike)):
            _fail(source, f"'ceilings' must be a file path, got {ceilings!r}")
        ceilings = Path(ceilings)
    if not isinstance(settings["prepare_kwargs"], Mapping):
        _fail(source, f"'prepare_kwargs' must be a mapping, got {settings['prepare_kwargs']!r}")
    overlap = sorted(set(settings["prepare_kwargs"]) & (set(CONFIG_COLUMNS) | {"logits", "target"}))
    if overlap:
        _fail(source, f"'prepare_kwargs' must not set {overlap}: they are grid keys")
    if settings["notes"] is not None and not isinstance(settings["notes"], str):
        _fail(source, f"'notes' must be text, got {settings['notes']!r}")

    losses = _name_list(source, "loss", data["loss"], known.loss_target_formats)
    all_formats = sorted({f for formats in known.loss_target_formats.values() for f in formats})
    target_formats = _name_list(source, "target_format", data["target_format"], all_formats)
    variants = _name_list(source, "variant", data["variant"], known.variants)
    dtypes = []
    for item in _as_list(source, "dtype", data["dtype"]):
        if not isinstance(item, str) or item.lower() not in _DTYPE_ALIASES:
            _fail(source, f"unknown dtype {item!r}; expected one of {list(DTYPES)} (or bfloat16/float16/float32)")
        dtypes.append(_DTYPE_ALIASES[item.lower()])
    grid: dict[str, tuple[Any, ...]] = {
        "loss": losses,
        "target_format": target_formats,
        "variant": variants,
        "dtype": tuple(dtypes),
        "tokens": tuple(_positive_int(source, "tokens", v) for v in _as_list(source, "tokens", data["tokens"])),
        "vocab": tuple(_positive_int(source, "vocab", v) for v in _as_list(source, "vocab", data["vocab"])),
        "block_size": tuple(_power_of_two_or_none(source, "block_size", v, known.block_size_range) for v in _as_list(source, "block_size", data.get("block_size"))),
        "num_warps": tuple(_power_of_two_or_none(source, "num_warps", v, (1, 32)) for v in _as_list(source, "num_warps", data.get("num_warps"))),
    }
    for name, values in grid.items():
        repeated = sorted({repr(v) for v in values if values.count(v) > 1})
        if repeated:
            _fail(source, f"{name!r} lists {', '.join(repeated)} more than once")

    parameters = json.loads(json.dumps(data, default=str))
    spec = SweepSpec(
        study=study,
        out=Path(settings["out"]),
        seed=int(settings["seed"]),
        check_rows=int(check_rows),
        grid=grid,
        warmup_ms=_positive_number(source, "warmup_ms", settings["warmup_ms"]),
        rep_ms=_positive_number(source, "rep_ms", settings["rep_ms"]),
        flush_l2=settings["flush_l2"],
        copy_gbps=copy_gbps,
        ceilings=ceilings,
        retry_errors=settings["retry_errors"],
        ignore_fraction=float(fraction),
        logit_scale=_positive_number(source, "logit_scale", settings["logit_scale"]),
        prepare_kwargs=dict(settings["prepare_kwargs"]),
        notes=settings["notes"],
        source=source,
        parameters=parameters,
    )
    _points_and_skipped(spec, known)  # an empty grid is an error now, not after the GPU warms up
    return spec


def _points_and_skipped(spec: SweepSpec, known: KnownNames) -> tuple[list[SweepPoint], list[tuple[str, str]]]:
    g = spec.grid
    points, skipped = [], []
    # Shape-major order: inputs and references are built once per (dtype, tokens, vocab).
    for dtype, tokens, vocab, target_format, loss in itertools.product(g["dtype"], g["tokens"], g["vocab"], g["target_format"], g["loss"]):
        if target_format not in known.loss_target_formats.get(loss, ()):
            if (loss, target_format) not in skipped:
                skipped.append((loss, target_format))
            continue
        for variant, block_size, num_warps in itertools.product(g["variant"], g["block_size"], g["num_warps"]):
            points.append(SweepPoint(loss, target_format, variant, dtype, tokens, vocab, block_size, num_warps))
    if not points:
        _fail(spec.source, f"no valid configuration: every (loss, target_format) pair is invalid {skipped}; valid: {dict(known.loss_target_formats)}")
    return points, skipped


def plan_configs(config: Any, *, known: KnownNames | None = None) -> list[SweepPoint]:
    """The configurations a sweep would run, in run order (validates the config; runs nothing)."""
    known = known or known_names()
    spec = load_config(config, known=known)
    return _points_and_skipped(spec, known)[0]


def skipped_pairs(config: Any, *, known: KnownNames | None = None) -> list[tuple[str, str]]:
    """(loss, target_format) pairs of the grid that are not valid and so are not run."""
    known = known or known_names()
    return _points_and_skipped(load_config(config, known=known), known)[1]


# --------------------------------------------------------------------------------------------
# The sweep loop
# --------------------------------------------------------------------------------------------


def _print_now(line: str) -> None:
    print(line, flush=True)  # flushed: papermill and `tee` show progress as it happens


def _is_fatal_cuda_error(exc: BaseException) -> bool:
    if type(exc).__name__ == "AcceleratorError":
        return True
    message = str(exc).lower()
    return any(pattern in message for pattern in _FATAL_CUDA)


def _progress_line(index: int, total: int, point: SweepPoint, row: Mapping[str, Any], seconds: float) -> str:
    head = f"[{index}/{total}] {point.key}:"
    status = row.get("status")
    if status == "error":
        return f"{head} error {str(row.get('error', ''))[:160]} [{seconds:.1f} s]"
    parts = [str(status)]
    ms = row.get("ms_median")
    if isinstance(ms, (int, float)):
        parts.append(f"{ms:.4f} ms")
    if isinstance(row.get("gbps"), (int, float)):
        parts.append(f"{row['gbps']:.0f} GB/s")
    if isinstance(row.get("pct_of_copy"), (int, float)):
        parts.append(f"{row['pct_of_copy']:.1f}% of copy")
    if isinstance(row.get("max_rel_err"), (int, float)):
        parts.append(f"err {row['max_rel_err']:.1e}")
    if isinstance(row.get("compile_ms"), (int, float)):
        parts.append(f"first call {row['compile_ms']:.0f} ms")
    return f"{head} {', '.join(parts)} [{seconds:.1f} s]"


def run_sweep(
    config: Any,
    store: ResultStore | None = None,
    *,
    measure: Callable[[SweepPoint], Mapping[str, Any]] | None = None,
    metadata: Mapping[str, Any] | None = None,
    dry_run: bool = False,
    allow_mixed: bool = False,
    overwrite: bool = False,
    known: KnownNames | None = None,
    log: Callable[[str], Any] = _print_now,
) -> pd.DataFrame:
    """Measure every configuration of ``config`` not yet in the store; return the study's records.

    Args:
        config: dict, YAML path or SweepSpec (validated before anything runs).
        store: where rows go; default ``<out>/<gpu-slug>/<study>.csv``.
        measure: ``measure(point) -> dict`` of measured columns including ``status``; default a
            :class:`GpuMeasurer`. An exception from it becomes a ``status="error"`` row and the
            sweep goes on (KeyboardInterrupt stops it; rows already measured stay recorded).
        metadata: this session's sidecar metadata (default: ``collect_metadata``).
        dry_run: return the planned configurations (with a ``done`` column when ``store`` is
            given) and measure nothing.
        allow_mixed, overwrite: passed to the default store (see :class:`ResultStore`).
        known: valid names (default :func:`known_names`, from ``kernels``); e.g. with
            ``variants=None`` for baseline providers that are not kernels variants.
        log: receives one progress line per configuration (``print`` works under papermill).
    """
    known = known or known_names()
    spec = load_config(config, known=known)
    points, skipped = _points_and_skipped(spec, known)
    if skipped:
        log(f"{spec.study}: skipping invalid (loss, target_format) pairs {skipped}")
    if dry_run:
        plan = pd.DataFrame([{**p.as_dict(), "config_key": p.key} for p in points])
        if store is not None:
            done = store.done_keys(retry_errors=spec.retry_errors)
            plan["done"] = plan["config_key"].isin(done)
        return plan

    if store is not None and not isinstance(store, ResultStore):
        raise TypeError(f"run_sweep: store must be a ResultStore or None, got {type(store).__name__}")
    if measure is None:
        measure = GpuMeasurer(spec, log=log)
    elif not callable(measure):
        raise TypeError(f"run_sweep: measure must be a callable taking a SweepPoint, got {type(measure).__name__}")
    copy_gbps = getattr(measure, "copy_gbps", None) or spec.copy_gbps
    if store is None:
        if metadata is None:
            from .metadata import collect_metadata

            metadata = collect_metadata(spec.parameters, copy_gbps)
        store = ResultStore(data_path(spec.out, metadata.get("gpu_name"), spec.study), metadata, allow_mixed=allow_mixed, overwrite=overwrite)
    elif store.metadata is None:
        if metadata is None:
            from .metadata import collect_metadata

            metadata = collect_metadata(spec.parameters, copy_gbps)
        store.metadata = dict(metadata)

    store.check_compatible()  # refuse a foreign file before spending GPU time
    done = store.done_keys(retry_errors=spec.retry_errors)
    todo = [p for p in points if p.key not in done]
    log(f"{spec.study}: {len(points)} configurations, {len(points) - len(todo)} already in {store.path}, {len(todo)} to run")

    for index, point in enumerate(todo, start=1):
        started = time.perf_counter()
        fatal: BaseException | None = None
        try:
            fields = measure(point)
        except KeyboardInterrupt:
            log(f"interrupted during {point.key}; {index - 1} new rows are in {store.path}; run again to resume")
            raise
        except Exception as exc:  # compile error, out of resources, OOM...: a row, not a crash
            fields = {"status": "error", "error": error_text(exc)}
            if _is_fatal_cuda_error(exc):
                fatal = exc
        if not isinstance(fields, Mapping) or fields.get("status") not in STATUSES:
            raise TypeError(
                f"run_sweep: measure({point.key}) must return a dict with 'status' in {STATUSES}, got {fields!r}"
            )
        if fields.get("status") == "error" and fatal is None:
            # Outside the except block: the traceback (and the tensors its frames hold) is gone,
            # so empty_cache can really return the memory.
            recover = getattr(measure, "recover", None)
            if callable(recover):
                recover()
        # The grid point is the truth for the configuration columns; measured values fill the rest.
        row = {**fields, **point.as_dict(), "config_key": point.key}
        store.append([row])
        log(_progress_line(index, len(todo), point, row, time.perf_counter() - started))
        if fatal is not None:
            raise RuntimeError(
                f"the CUDA context is unusable after {point.key} ({error_text(fatal, 300)}); it is recorded as an "
                f"error row. Run the sweep again in a new process to resume with the remaining configurations."
            ) from fatal
    return store.load()


# --------------------------------------------------------------------------------------------
# The GPU measurer
# --------------------------------------------------------------------------------------------


@dataclass
class TimingBackend:
    """The timing functions the measurer uses; tests swap in fakes (no GPU)."""

    bench: Callable[..., Any]
    first_call_ms: Callable[[Callable[[], Any]], tuple[Any, float]]
    peak_memory_above: Callable[[Callable[[], Any]], int] | None

    @classmethod
    def cuda(cls) -> "TimingBackend":
        from . import timing

        return cls(timing.bench, timing.first_call_ms, timing.peak_memory_above)


_COPY_CEILINGS = ("dram_copy_torch", "dram_copy_triton")  # perfutils.ceilings rows, preferred first


def read_copy_gbps(path: str | os.PathLike, gpu_name: str | None = None) -> float:
    """Copy bandwidth (GB/s) from a ceilings file.

    Either the CSV that ``perfutils.ceilings.write_ceilings`` writes (row ``dram_copy_torch``,
    else ``dram_copy_triton``, column ``value`` in GB/s; it must be from ``gpu_name`` when both
    are known), or a JSON/YAML mapping with a top-level ``copy_gbps``.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"ceilings file {path} does not exist (expected the ceilings CSV, or JSON/YAML with copy_gbps)")
    value: Any = None
    if path.suffix == ".csv":
        table = pd.read_csv(path)
        missing = {"ceiling", "value"} - set(table.columns)
        if missing:
            raise ValueError(f"ceilings file {path} lacks columns {sorted(missing)}")
        for name in _COPY_CEILINGS:
            rows = table[table["ceiling"] == name]
            if len(rows):
                if gpu_name and "gpu_name" in rows and rows["gpu_name"].iloc[0] != gpu_name:
                    raise ValueError(f"ceilings file {path} was measured on {rows['gpu_name'].iloc[0]!r}, not on this GPU {gpu_name!r}")
                value = float(rows["value"].iloc[0])
                break
        else:
            raise ValueError(f"ceilings file {path} has no {' or '.join(_COPY_CEILINGS)} row")
    else:
        import yaml  # YAML is a superset of JSON

        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except yaml.YAMLError as exc:
            raise ValueError(f"ceilings file {path} is not valid JSON/YAML: {exc}") from None
        value = data.get("copy_gbps") if isinstance(data, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"ceilings file {path} must give a positive copy bandwidth in GB/s, got {value!r}")
    return float(value)


def kernels_reference_rows(logits: Any, target: Any, *, loss: str, target_format: str) -> Any:
    """Per-row float64 losses from ``kernels.reference.row_losses`` (ignored label rows give 0).

    Falls back to one ``kernels.reference.entropy_loss`` call per row (a one-row mean) when the
    reference has no ``row_losses``.
    """
    import torch
    from kernels import reference

    row_losses = getattr(reference, "row_losses", None)
    if row_losses is not None:
        return row_losses(logits, target, loss=loss, target_format=target_format, ignore_index=IGNORE_INDEX)
    rows = []
    for row in range(logits.shape[0]):
        if target_format == "labels" and int(target[row]) == IGNORE_INDEX:
            rows.append(logits.new_zeros(()))
            continue
        one = reference.entropy_loss(logits[row : row + 1], target[row : row + 1], loss=loss, target_format=target_format)
        rows.append(one.reshape(()))
    return torch.stack(rows) if rows else logits.new_zeros((0,))


@dataclass
class _Inputs:
    shape_key: tuple[str, int, int]
    logits: Any
    targets: dict[str, Any]  # target_format -> labels or target logits
    rows: Any  # sampled row indices (sorted, on the device)
    logits_rows: Any  # copy of logits[rows] taken before any kernel ran
    target_rows: dict[str, Any]


class GpuMeasurer:
    """``measure(point)`` for :func:`run_sweep`: inputs, plan, first call, check, time, stats.

    Injectable parts (tests run it on a CPU with fakes): ``prepare`` (default
    ``kernels.prepare``), ``reference`` (per-row float64 losses, default
    :func:`kernels_reference_rows`), ``backend`` (:class:`TimingBackend`), ``cost`` (bytes_min,
    default ``perfutils.roofline.loss_cost(...).bytes``), ``device``, ``copy_gbps``.
    """

    def __init__(
        self,
        spec: SweepSpec,
        *,
        device: str = "cuda",
        prepare: Callable[..., Any] | None = None,
        reference: Callable[..., Any] | None = None,
        backend: TimingBackend | None = None,
        cost: Callable[..., int] | None = None,
        copy_gbps: float | None = None,
        log: Callable[[str], Any] = _print_now,
    ) -> None:
        import torch

        if not isinstance(spec, SweepSpec):
            raise TypeError(f"GpuMeasurer: spec must be a SweepSpec (use load_config), got {type(spec).__name__}")
        if device == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("the sweep measures on a CUDA GPU and none is available (use --dry-run to list the configurations)")
        from .model.cuda_tools import pin_bundled_ptxas

        pin_bundled_ptxas()  # one ptxas for the whole run, whatever torch.compile does later
        self.spec = spec
        self.device = torch.device(device)
        self.log = log
        if prepare is None:
            import kernels

            prepare = getattr(kernels, "prepare", None)
            if prepare is None:
                raise RuntimeError("kernels.prepare is not available: the sweep needs kernels.prepare(logits, target, loss=..., ...) -> Plan")
        self.prepare = prepare
        self.reference = reference or kernels_reference_rows
        self.backend = backend or TimingBackend.cuda()
        self.cost = cost or _roofline_bytes
        self.cc = torch.cuda.get_device_capability(self.device) if self.device.type == "cuda" else None
        self._inputs: _Inputs | None = None
        self._references: dict[tuple[Any, ...], dict[str, Any]] = {}
        self._preflight_reference()
        if copy_gbps is None:
            copy_gbps = spec.copy_gbps
        if copy_gbps is None and spec.ceilings is not None:
            gpu_name = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else None
            copy_gbps = read_copy_gbps(spec.ceilings, gpu_name)
        if copy_gbps is None:
            from .timing import copy_bandwidth_gbps

            copy_gbps = copy_bandwidth_gbps()
            log(f"measured copy bandwidth: {copy_gbps:.0f} GB/s")
        self.copy_gbps = float(copy_gbps)

    # ---- references ------------------------------------------------------------------------

    def _preflight_reference(self) -> None:
        """Call the reference on a tiny CPU problem per (loss, target_format), before any GPU work."""
        import torch

        generator = torch.Generator().manual_seed(0)
        pairs = {(p.loss, p.target_format) for p in plan_configs(self.spec)}
        for loss, target_format in sorted(pairs):
            logits = torch.randn(3, 5, generator=generator, dtype=torch.float64)
            if target_format == "labels":
                target = torch.tensor([1, IGNORE_INDEX, 4])
            else:
                target = torch.randn(3, 5, generator=generator, dtype=torch.float64)
            try:
                rows = self.reference(logits, target, loss=loss, target_format=target_format)
            except Exception as exc:
                raise ValueError(f"the float64 reference fails for loss={loss!r}, target_format={target_format!r}: {error_text(exc, 500)}") from exc
            if not isinstance(rows, torch.Tensor) or tuple(rows.shape) != (3,):
                shape = tuple(rows.shape) if isinstance(rows, torch.Tensor) else type(rows).__name__
                raise ValueError(
                    f"the reference must return per-row losses of shape (3,) for 3 rows (loss={loss!r}, "
                    f"target_format={target_format!r}), got {shape}"
                )

    def _reference_for(self, point: SweepPoint, inputs: _Inputs) -> dict[str, Any]:
        """Float64 references for one (loss, target_format, shape): all row losses, sampled-row grad."""
        import torch

        key = (point.loss, point.target_format, *inputs.shape_key)
        if key in self._references:
            return self._references[key]
        target = inputs.targets[point.target_format]
        valid = target != IGNORE_INDEX if point.target_format == "labels" else torch.ones(point.tokens, dtype=torch.bool, device=self.device)
        n_valid = int(valid.sum())
        # Every row's loss, chunked so the float64 copy stays ~256 MiB; cheap next to the sweep.
        chunk = max(1, (256 << 20) // (point.vocab * 8 * 4))
        row_losses = []
        with torch.no_grad():
            for start in range(0, point.tokens, chunk):
                x = inputs.logits[start : start + chunk].to(torch.float64)
                t = target[start : start + chunk]
                t = t if point.target_format == "labels" else t.to(torch.float64)
                row_losses.append(self._reference_rows(x, t, point, valid[start : start + chunk]))
        row_losses = torch.cat(row_losses)
        # Gradient of the mean loss (sum over valid rows / n_valid) on the sampled rows only.
        x = inputs.logits_rows.to(torch.float64).requires_grad_(True)
        t = inputs.target_rows[point.target_format]
        t = t if point.target_format == "labels" else t.to(torch.float64)
        sampled = self._reference_rows(x, t, point, valid[inputs.rows])
        (sampled.sum() / n_valid).backward()
        reference = {"row_losses": row_losses, "mean": row_losses.sum() / n_valid, "grad_rows": x.grad.detach()}
        self._references[key] = reference
        return reference

    def _reference_rows(self, x: Any, t: Any, point: SweepPoint, valid: Any) -> Any:
        import torch

        rows = self.reference(x, t, loss=point.loss, target_format=point.target_format)
        rows = torch.as_tensor(rows).to(torch.float64)
        return torch.where(valid, rows, torch.zeros_like(rows))  # ignored rows contribute nothing

    # ---- inputs ----------------------------------------------------------------------------

    def _inputs_for(self, point: SweepPoint) -> _Inputs:
        import torch

        shape_key = (point.dtype, point.tokens, point.vocab)
        current = self._inputs
        if current is not None and current.shape_key == shape_key and point.target_format in current.targets:
            return current
        if current is None or current.shape_key != shape_key:
            self.recover()  # free the previous shape before allocating the next
            current = self._make_logits(point, shape_key)
            self._inputs = current
        generator = self._generator(shape_key, f"target:{point.target_format}")  # never the logits stream
        dtype = _torch_dtype(point.dtype)
        if point.target_format == "labels":
            labels = torch.randint(0, point.vocab, (point.tokens,), generator=generator, device=self.device)
            ignored = torch.rand(point.tokens, generator=generator, device=self.device) < self.spec.ignore_fraction
            ignored[0] = False  # at least one row counts, so the mean is defined
            target = labels.masked_fill(ignored, IGNORE_INDEX)
        else:
            target = torch.randn(point.tokens, point.vocab, generator=generator, device=self.device, dtype=dtype)
            target.mul_(self.spec.logit_scale)
        current.targets[point.target_format] = target
        current.target_rows[point.target_format] = target[current.rows].clone()
        return current

    def _generator(self, shape_key: tuple[str, int, int], purpose: str) -> Any:
        import torch

        seed = (self.spec.seed * 1_000_003 + zlib.crc32(repr((shape_key, purpose)).encode())) % (1 << 62)
        return torch.Generator(device=self.device).manual_seed(seed)

    def _make_logits(self, point: SweepPoint, shape_key: tuple[str, int, int]) -> _Inputs:
        import torch

        generator = self._generator(shape_key, "logits")
        logits = torch.randn(point.tokens, point.vocab, generator=generator, device=self.device, dtype=_torch_dtype(point.dtype))
        logits.mul_(self.spec.logit_scale)
        n_check = min(self.spec.check_rows, point.tokens)
        rows_gen = torch.Generator().manual_seed(self.spec.seed)
        rows = torch.randperm(point.tokens, generator=rows_gen)[:n_check].sort().values.to(self.device)
        return _Inputs(shape_key, logits, {}, rows, logits[rows].clone(), {})

    def recover(self) -> None:
        """Drop cached inputs and references and return memory (after an error, or a new shape)."""
        import torch

        self._inputs = None
        self._references.clear()
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    # ---- one configuration -----------------------------------------------------------------

    def __call__(self, point: SweepPoint) -> dict[str, Any]:
        import torch

        inputs = self._inputs_for(point)
        reference = self._reference_for(point, inputs)  # before the kernel could touch the inputs
        plan = self.prepare(
            inputs.logits,
            inputs.targets[point.target_format],
            loss=point.loss,
            target_format=point.target_format,
            variant=point.variant,
            block_size=point.block_size,
            num_warps=point.num_warps,
            **self.spec.prepare_kwargs,
        )
        (loss, grad), compile_ms = self.backend.first_call_ms(plan.run)
        loss_err, grad_err = self._errors(point, inputs, reference, loss, grad)
        del loss, grad
        timing = self.backend.bench(plan.run, warmup_ms=self.spec.warmup_ms, rep_ms=self.spec.rep_ms, flush_l2=self.spec.flush_l2)
        peak = self.backend.peak_memory_above(plan.run) if self.backend.peak_memory_above is not None else None
        if peak is not None:  # buffers a plan allocated up front (gradient, workspaces) count too
            peak += int(getattr(plan, "buffer_bytes", 0) or 0)
        stats = self._launch_stats(plan)
        modified = not torch.equal(inputs.logits[inputs.rows], inputs.logits_rows) or not torch.equal(
            inputs.targets[point.target_format][inputs.rows], inputs.target_rows[point.target_format]
        )
        if modified:  # an in-place variant: give the next configuration fresh inputs
            self.recover()

        bytes_min = int(self.cost(point.loss, point.target_format, point.tokens, point.vocab, DTYPE_BYTES[point.dtype]))
        ms = float(timing.ms_median)
        gbps = bytes_min / (ms * 1e-3) / 1e9 if ms > 0 else None
        errors = [e for e in (loss_err, grad_err) if e is not None]
        max_err = max(errors)
        status = "ok" if max_err <= TOLERANCE[point.dtype] else "wrong"  # NaN/inf errors are inf: wrong
        return {
            "ms_median": ms,
            "ms_p20": float(timing.ms_p20),
            "ms_p80": float(timing.ms_p80),
            "bytes_min": bytes_min,
            "gbps": gbps,
            "pct_of_copy": 100.0 * gbps / self.copy_gbps if gbps is not None else None,
            **stats,
            "max_rel_err": max_err,
            "status": status,
            "error": None if status == "ok" else f"max_rel_err {max_err:.3g} above tolerance {TOLERANCE[point.dtype]:g}",
            "compile_ms": compile_ms,
            "peak_mem_bytes": peak,
            "loss_rel_err": loss_err,
            "grad_rel_err": grad_err,
            "plan_config": getattr(plan, "config", None) or None,
            "inputs_modified": modified,
        }

    def _errors(self, point: SweepPoint, inputs: _Inputs, reference: Mapping[str, Any], loss: Any, grad: Any) -> tuple[float, float | None]:
        import torch

        from .timing import rel_err

        loss = torch.as_tensor(loss)
        if loss.numel() == 1:
            loss_err = rel_err(loss.reshape(()), reference["mean"].to(loss.device))
        elif tuple(loss.shape) == (point.tokens,):  # per-row losses (unreduced)
            loss_err = rel_err(loss[inputs.rows], reference["row_losses"][inputs.rows.to(reference["row_losses"].device)].to(loss.device))
        else:
            raise ValueError(f"the plan returned a loss of shape {tuple(loss.shape)}; expected a scalar or ({point.tokens},)")
        if grad is None:
            return loss_err, None
        if tuple(grad.shape) != (point.tokens, point.vocab):
            raise ValueError(f"the plan returned a gradient of shape {tuple(grad.shape)}; expected ({point.tokens}, {point.vocab})")
        return loss_err, rel_err(grad[inputs.rows], reference["grad_rows"].to(grad.device))

    def _launch_stats(self, plan: Any) -> dict[str, Any]:
        """Per-launch registers/occupancy; the guide's columns describe the limiting pass."""
        passes, problems = [], []
        for launch in getattr(plan, "launches", []) or []:
            entry: dict[str, Any] = {
                "name": getattr(launch, "name", None),
                "grid": list(getattr(launch, "grid", ()) or ()),
                "block_size": getattr(launch, "block_size", None),
                "num_warps": getattr(launch, "num_warps", None),
            }
            compiled = getattr(launch, "compiled", None)
            if compiled is not None:
                try:
                    from .model.compiled_kernel import counts_from_compiled

                    entry.update(counts_from_compiled(compiled))
                except Exception as exc:
                    problems.append(f"{entry['name']} registers: {error_text(exc, 200)}")
                try:
                    from .model.occupancy import occupancy_of_compiled

                    occ = occupancy_of_compiled(compiled, self.cc)
                    limiter = getattr(occ, "limiter", None) or "+".join(sorted(occ.limiters))
                    entry.update(occupancy=float(occ.occupancy), blocks_per_sm=int(occ.blocks_per_sm), limiter=limiter)
                except Exception as exc:
                    problems.append(f"{entry['name']} occupancy: {error_text(exc, 200)}")
            passes.append(entry)

        def badness(entry: dict[str, Any]) -> tuple[float, float]:
            occupancy = entry.get("occupancy")
            return (occupancy if occupancy is not None else math.inf, -(entry.get("n_regs") or 0))

        limiting = min(passes, key=badness) if passes else {}
        return {
            "n_regs": limiting.get("n_regs"),
            "spill_bytes": limiting.get("spill_bytes"),
            "shared_bytes": limiting.get("shared_bytes"),
            "occupancy": limiting.get("occupancy"),
            "blocks_per_sm": limiting.get("blocks_per_sm"),
            "limiter": limiting.get("limiter") or None,
            "n_launches": len(passes),
            "limiting_pass": limiting.get("name"),
            "passes": passes,
            "stats_error": "; ".join(problems) or None,
        }


def _torch_dtype(name: str) -> Any:
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


def _roofline_bytes(loss: str, target_format: str, tokens: int, vocab: int, dtype_bytes: int) -> int:
    from .model.roofline import loss_cost

    return int(loss_cost(loss, target_format, tokens, vocab, dtype_bytes).bytes)
