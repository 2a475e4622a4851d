"""The GPU measurer of a sweep: one configuration in, one row of measured columns out.

:class:`GpuMeasurer` makes the inputs of a shape once (reproducible from the seed), computes float64 references
(every row's loss, the gradient of sampled rows), builds the plan (``kernels.prepare``), times its first call
(compilation), checks loss and gradient against the references, times it with do_bench and reads each launch's
registers and occupancy from the compiled kernel.

One row per *plan* (a variant may launch several kernels). The guide's per-kernel columns
(n_regs, spill_bytes, shared_bytes, occupancy, blocks_per_sm, limiter) describe the **limiting
pass**: the launch with the lowest occupancy (ties: more registers), since occupancy is what caps
latency hiding in these memory-bound kernels. Every pass is listed in the ``passes`` column (JSON),
and ``limiting_pass`` names the chosen one.

Extra columns written by the GPU measurer: compile_ms, peak_mem_bytes, loss_rel_err, grad_rel_err,
n_launches, limiting_pass, passes, plan_config, inputs_modified, stats_error; and whatever a study's ``extra``
function measures on the same plan (e.g. host cost and syncs per call: :mod:`perfutils.measure.host_cost`).
"""

from __future__ import annotations

import gc
import math
import os
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from ..data.schema import DTYPE_BYTES, error_text, torch_dtype
from .sweep_config import IGNORE_INDEX, TOLERANCE, SweepPoint, SweepSpec, plan_configs

__all__ = ["GpuMeasurer", "TimingBackend", "SETTLE_AFTER_MS", "SETTLE_MS", "read_copy_gbps", "kernels_reference_rows",
           "print_now"]


def print_now(line: str) -> None:
    """One progress line, flushed."""
    print(line, flush=True)  # flushed: papermill and `tee` show progress as it happens


@dataclass
class TimingBackend:
    """The timing functions the measurer uses; tests swap in fakes (no GPU)."""

    bench: Callable[..., Any]
    first_call_ms: Callable[[Callable[[], Any]], tuple[Any, float]]
    peak_memory_above: Callable[[Callable[[], Any]], int] | None
    settle: Callable[[float], None] | None = None  # idle the GPU for so many ms (timing.settle)

    @classmethod
    def cuda(cls) -> "TimingBackend":
        from . import timing

        return cls(timing.bench, timing.first_call_ms, timing.peak_memory_above, timing.settle)

    @classmethod
    def dry_run(cls) -> "TimingBackend":
        """Runs each call once and reports 1 ms (CPU dry runs: the whole path, no timing)."""
        from .timing import BenchResult

        return cls(lambda fn, **_: (fn(), BenchResult(1.0, 1.0, 1.0))[1], lambda fn: (fn(), 0.0), None)


# A first call this long ran a first-call search or compiles: the GPU may have spent a second or more at full load.
# On an H200 the configuration timed right after such a call (the public call, first of its cell) ran 1.03-1.21x
# the same kernels timed a second later (the plan, the autograd form) at 16384-token cells, with a wide p20-p80
# spread, while rounds of 125 ms timings separated by idle moments agreed within 1% and a sustained 500 ms timing
# ran 5-7% slower with the power cap active (data/h200/logs/vocab_sweep_2026-11-29b.txt). So in the studies whose first
# calls search (the vocab sweep's stages set spec.settle_ms to SETTLE_MS) such a timing starts after an idle GPU, as
# every later configuration of a cell does. Sweeps of fixed configurations leave it off: their long first calls are
# compiles, with the GPU idle, and a second of idle a configuration would cost their hundreds of rows minutes.
SETTLE_AFTER_MS = 100.0
SETTLE_MS = 1000.0

_COPY_CEILINGS = ("dram_copy_torch", "dram_copy_triton")  # perfutils.studies.ceilings rows, preferred first


def read_copy_gbps(path: str | os.PathLike, gpu_name: str | None = None) -> float:
    """Copy bandwidth (GB/s) from a ceilings file.

    Either the CSV that ``perfutils.studies.ceilings.write_ceilings`` writes (row ``dram_copy_torch``,
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
    """Per-row float64 losses from ``kernels.reference.row_losses`` (ignored label rows give 0)."""
    from kernels import reference

    return reference.row_losses(logits, target, loss=loss, target_format=target_format, ignore_index=IGNORE_INDEX)


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
    default ``perfutils.model.roofline.loss_cost(...).bytes``), ``device``, ``copy_gbps``, and ``extra``:
    ``extra(point, plan) -> dict`` of more columns, called after the timing with the plan that was timed (its
    keys must not replace the measured ones).
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
        log: Callable[[str], Any] = print_now,
        extra: Callable[[SweepPoint, Any], Mapping[str, Any]] | None = None,
    ) -> None:
        import torch

        if not isinstance(spec, SweepSpec):
            raise TypeError(f"GpuMeasurer: spec must be a SweepSpec (use load_config), got {type(spec).__name__}")
        if device == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("the sweep measures on a CUDA GPU and none is available (use --dry-run to list the configurations)")
        from ..model.cuda_tools import pin_bundled_ptxas

        pin_bundled_ptxas()  # one ptxas for the whole run, whatever torch.compile does later
        self.spec = spec
        self.device = torch.device(device)
        self.log = log
        if prepare is None:
            import kernels

            prepare = kernels.prepare
        self.prepare = prepare
        self.reference = reference or kernels_reference_rows
        self.backend = backend or TimingBackend.cuda()
        self.cost = cost or _roofline_bytes
        if extra is not None and not callable(extra):
            raise TypeError(f"GpuMeasurer: extra must be a callable (point, plan) -> dict, got {type(extra).__name__}")
        self.extra = extra
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
        dtype = torch_dtype(point.dtype)
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
        logits = torch.randn(point.tokens, point.vocab, generator=generator, device=self.device, dtype=torch_dtype(point.dtype))
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
        if self.spec.settle_ms and compile_ms >= SETTLE_AFTER_MS and self.backend.settle is not None:
            self.backend.settle(self.spec.settle_ms)
        timing = self.backend.bench(plan.run, warmup_ms=self.spec.warmup_ms, rep_ms=self.spec.rep_ms, flush_l2=self.spec.flush_l2)
        peak = self.backend.peak_memory_above(plan.run) if self.backend.peak_memory_above is not None else None
        if peak is not None:  # buffers a plan allocated up front (gradient, workspaces) count too
            peak += int(getattr(plan, "buffer_bytes", 0) or 0)
        stats = self._launch_stats(plan)
        more = dict(self.extra(point, plan)) if self.extra is not None else {}
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
        row = {
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
        clash = sorted(set(more) & set(row))
        if clash:
            raise ValueError(f"GpuMeasurer: extra columns {clash} would replace measured ones")
        return {**row, **more}

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
                from ..model.compiled_kernel import kernel_stats

                stats = kernel_stats(compiled, self.cc)
                error = stats.pop("stats_error", None)
                if error:
                    problems.append(f"{entry['name']}: {error}")
                entry.update(stats)
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


def _roofline_bytes(loss: str, target_format: str, tokens: int, vocab: int, dtype_bytes: int) -> int:
    from ..model.roofline import loss_cost

    return int(loss_cost(loss, target_format, tokens, vocab, dtype_bytes).bytes)
