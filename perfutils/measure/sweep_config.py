"""A sweep's configuration: the grid of (loss, target_format, variant, dtype, tokens, vocab, block_size, num_warps).

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
    # optional: warmup_ms 25, rep_ms 100, flush_l2 true, settle_ms 0 (ms of idle GPU before timing a configuration
    # whose first call took >= measurer.SETTLE_AFTER_MS: the studies whose first calls search set it, measurer.SETTLE_MS),
    # copy_gbps (GB/s), ceilings (the ceilings CSV,
    # or JSON/YAML with copy_gbps; else copy bandwidth is measured at sweep start), retry_errors false,
    # ignore_fraction 0.05 (share of label rows set to ignore_index), logit_scale 2.0, prepare_kwargs {}, notes

:func:`load_config` checks everything before anything runs and returns a :class:`SweepSpec`;
:func:`plan_configs` lists the :class:`SweepPoint` s a sweep would run, in run order. Run order groups
configurations by input shape so inputs (and their float64 references) are made once per (dtype, tokens,
vocab) and reused. Run by :func:`perfutils.measure.sweep.run_sweep`.
"""

from __future__ import annotations

import itertools
import json
import math
import numbers
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..data.schema import CONFIG_COLUMNS, DTYPES, config_key

__all__ = [
    "TOLERANCE",
    "IGNORE_INDEX",
    "SweepSpec",
    "SweepPoint",
    "KnownNames",
    "known_names",
    "load_config",
    "plan_configs",
    "skipped_pairs",
    "points_and_skipped",
]

# Canonical dtype names and their spellings.
_DTYPE_ALIASES = {
    "bf16": "bf16", "bfloat16": "bf16",
    "fp16": "fp16", "float16": "fp16", "half": "fp16",
    "fp32": "fp32", "float32": "fp32", "float": "fp32",
}  # fmt: skip

# Relative error allowed against the float64 reference (GUIDE: bf16/fp16 1e-2, fp32 1e-5).
TOLERANCE = {"bf16": 1e-2, "fp16": 1e-2, "fp32": 1e-5}
IGNORE_INDEX = -100  # label of rows that take no part in the loss (PyTorch's default)

_GRID_REQUIRED = ("loss", "target_format", "variant", "dtype", "tokens", "vocab")
_GRID_OPTIONAL = ("block_size", "num_warps")  # default [None]: the variant picks
_SETTINGS = {
    "study": None,
    "out": "data",
    "seed": 0,
    "check_rows": 64,
    "warmup_ms": 25.0,
    "rep_ms": 100.0,
    "settle_ms": 0.0,
    "flush_l2": True,
    "copy_gbps": None,
    "ceilings": None,
    "retry_errors": False,
    "ignore_fraction": 0.05,
    "logit_scale": 2.0,
    "prepare_kwargs": {},
    "notes": None,
}


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
    settle_ms: float = 0.0
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
    """The names ``kernels`` accepts: its (loss, target_format) pairs (``kernels.problem.LOSS_CODES``), its variants
    and its tile sizes."""
    import kernels
    from kernels import problem

    pairs: dict[str, tuple[str, ...]] = {}
    for loss, target_format in problem.LOSS_CODES:
        pairs[loss] = pairs.get(loss, ()) + (target_format,)
    return KnownNames(pairs, tuple(kernels.VARIANTS), (problem.MIN_BLOCK_SIZE, problem.MAX_BLOCK_SIZE))


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


def _positive_number(source: str, name: str, value: Any, *, zero: bool = False) -> float:
    """A finite number > 0 (>= 0 with ``zero``: a setting that 0 turns off)."""
    if (isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value)
            or value < 0 or (value == 0 and not zero)):
        _fail(source, f"{name!r} must be a {'number >= 0' if zero else 'positive number'}, got {value!r}")
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
        settle_ms=_positive_number(source, "settle_ms", settings["settle_ms"], zero=True),
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
    points_and_skipped(spec, known)  # an empty grid is an error now, not after the GPU warms up
    return spec


def points_and_skipped(spec: SweepSpec, known: KnownNames) -> tuple[list[SweepPoint], list[tuple[str, str]]]:
    """(the configurations of ``spec`` in run order, the invalid (loss, target_format) pairs left out)."""
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


def plan_configs(config: Any) -> list[SweepPoint]:
    """The configurations a sweep would run, in run order (validates the config; runs nothing)."""
    known = known_names()
    return points_and_skipped(load_config(config, known=known), known)[0]


def skipped_pairs(config: Any) -> list[tuple[str, str]]:
    """(loss, target_format) pairs of the grid that are not valid and so are not run."""
    known = known_names()
    return points_and_skipped(load_config(config, known=known), known)[1]
