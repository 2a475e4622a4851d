"""Studies made of hand-picked cases (not a full grid): the #497 case study and the peer benchmark.

A case is ``(variant, block_size, num_warps)``; a variant is one of the project's (``fused``,
``two_pass``, ``split_row``, ``auto``) or a baseline from :mod:`perfutils.measure.providers` (``eager``,
``torch_compile``, ``liger``, ``quack``, ``public``...). ``TUNED`` as block size and warps runs the variant at its best recorded
configuration for the shape (the GPU's ``tuning.csv``; nearest recorded vocab at 4096 tokens).
``split_row`` and ``auto`` with no configuration take theirs from the same table. Every case runs through the sweep harness, so its rows have the same
schema, checks and metadata as the block-size sweep (and resume the same way after a kill).

    python -m perfutils studies case_study --out data
    python -m perfutils studies benchmark --out data
"""

from __future__ import annotations

import argparse
import itertools
from typing import Any, Iterable

from ..measure import providers
from ..measure.measurer import GpuMeasurer
from ..measure.sweep import run_sweep
from ..measure.sweep_config import KnownNames, known_names, load_config

# Fast-LLM issue #497: the fused kernel with a 32K tile cap (its default), Option A caps, Option B.
CASE_STUDY_CASES = [
    ("eager", None, None),
    ("torch_compile", None, None),
    ("fused", None, None),  # block_size = min(next_pow2(vocab), 32768): the kernel
    ("fused", 16384, None),
    ("fused", 8192, None),
    ("fused", 4096, None),
    ("two_pass", None, None),
    ("split_row", None, None),
    ("auto", None, None),
]

TUNED = "tuned"

# Every project variant at its best recorded configuration (the peers at theirs: their defaults).
BENCHMARK_CASES = [
    ("eager", None, None),
    ("torch_compile", None, None),
    ("liger", None, None),
    ("fused", TUNED, TUNED),
    ("two_pass", TUNED, TUNED),
    ("split_row", None, None),
    ("auto", None, None),
]


def tuned_config(out: str, gpu_name: str, loss: str, target_format: str, dtype: str, vocab: int,
                 variant: str) -> tuple[int | None, int | None]:
    """(block_size, num_warps) of ``variant``'s tuning-table entry for this shape; (None, None), its
    defaults, when the GPU has no table, the table no entry, or the entry is not a plain configuration of this
    variant (options, or another kernel: split_row's entry recorded with ``split=False`` is the fused kernel's)."""
    from pathlib import Path

    from kernels.autotune import load_tuning_table, table_choice

    choice = table_choice(load_tuning_table(gpu_name, Path(out)), loss, target_format, dtype, vocab, variant)
    if choice is None or choice.options or choice.variant != variant:
        return None, None
    return choice.block_size, choice.num_warps


def _known_with_providers() -> KnownNames:
    known = known_names()
    return KnownNames(known.loss_target_formats, None, known.block_size_range)


def recorded_ceilings(out: str, gpu_name: str) -> str | None:
    """The ceilings file recorded for this GPU under ``out`` (its copy bandwidth makes % of copy comparable across
    studies), or None: then a study measures the copy bandwidth when it starts."""
    from ..data.schema import data_path

    path = data_path(out, gpu_name, "ceilings")
    return str(path) if path.exists() else None


def run_cases(
    study: str,
    cases: Iterable[tuple[str, int | None, int | None]],
    *,
    losses: list[tuple[str, str]],
    vocabs: list[int],
    tokens: list[int] = (4096,),
    dtype: str = "bf16",
    out: str = "data",
    skip_missing: bool = True,
    log=print,
    parameters: dict[str, Any] | None = None,
    measurer: Any = None,
    extra: Any = None,
    deadline: float | None = None,
    keep: Any = None,
    **settings: Any,
):
    """Measure every case at every (loss, vocab, tokens); rows go to ``<out>/<gpu>/<study>.csv``, one session in
    its sidecar per call. Returns the study's records (None when nothing ran).

    A provider that cannot run here (a package not installed, no Fast-LLM checkout: ``providers.unavailable``) is
    left out with a line saying why (``skip_missing=False``: its cases become error rows), and so are the losses a
    provider does not compute (``providers.supports``). ``parameters``: more for the sidecar's parameters (e.g. the
    commits of peer checkouts); ``measurer``: a measure(point) callable with ``copy_gbps`` to use instead of a
    GpuMeasurer (dry runs on a CPU); ``extra``: the GpuMeasurer's ``extra`` columns; ``deadline``: a
    ``time.monotonic()`` value after which no configuration starts (the call returns; the same call again resumes);
    ``keep(tokens, vocab, loss, target_format, variant) -> bool``: which configurations of the product to run."""
    import time

    from ..data.metadata import collect_metadata
    from ..data.schema import data_path
    from ..data.store import ResultStore

    known = _known_with_providers()
    cases = list(cases)
    if skip_missing:
        for variant in dict.fromkeys(case[0] for case in cases):
            reason = providers.unavailable(variant)
            if reason:
                log(f"{study}: leaving out {variant}: {reason}")
                cases = [case for case in cases if case[0] != variant]
    todo = [(n_tokens, vocab, loss, target_format, case)
            # Shapes outermost: the measurer keeps one shape's inputs and float64 reference at a time.
            for n_tokens, vocab, (loss, target_format) in itertools.product(tokens, vocabs, losses)
            for case in cases if providers.supports(case[0], loss, target_format)
            and (keep is None or keep(n_tokens, vocab, loss, target_format, case[0]))]
    metadata = store = None
    for index, (n_tokens, vocab, loss, target_format, (variant, block_size, num_warps)) in enumerate(todo):
        if deadline is not None and time.monotonic() > deadline:
            log(f"{study}: time budget reached with {len(todo) - index} configurations not started; run the same "
                "command again to resume")
            break
        if TUNED in (block_size, num_warps):
            import torch

            block_size, num_warps = tuned_config(out, torch.cuda.get_device_name(), loss, target_format, dtype,
                                                 vocab, variant)
        config = dict(
            study=study, out=out, loss=loss, target_format=target_format, variant=variant, dtype=dtype,
            tokens=n_tokens, vocab=vocab, block_size=block_size, num_warps=num_warps, **settings,
        )
        spec = load_config(config, known=known)
        if metadata is None:
            measurer = measurer or GpuMeasurer(spec, prepare=providers.prepare, log=log, extra=extra)
            metadata = collect_metadata(
                dict(study=study, cases=cases, losses=list(losses), vocab=list(vocabs), tokens=list(tokens),
                     dtype=dtype, **settings, **(parameters or {})),
                measurer.copy_gbps,
            )
            store = ResultStore(data_path(out, metadata.get("gpu_name"), study), metadata)
        run_sweep(spec, store, measure=measurer, log=log)
    return store.load() if store is not None and store.exists() else None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m perfutils studies", description="Run a case study on the GPU.")
    parser.add_argument("study", choices=["case_study", "benchmark"])
    parser.add_argument("--out", default="data")
    parser.add_argument("--tokens", type=int, nargs="+", default=[4096])
    parser.add_argument("--vocab", type=int, nargs="+", default=None)
    parser.add_argument("--loss", nargs="+", default=None, help="loss:target_format, e.g. reverse_kl:logits")
    args = parser.parse_args(argv)
    if args.study == "case_study":
        losses = [("reverse_kl", "logits")]
        cases, vocabs = CASE_STUDY_CASES, args.vocab or [32768, 65536, 131072]
    else:
        losses = [("cross_entropy", "labels"), ("cross_entropy", "logits"), ("reverse_kl", "logits")]
        cases, vocabs = BENCHMARK_CASES, args.vocab or [32768, 65536, 131072]
    if args.loss:
        losses = [tuple(item.split(":")) for item in args.loss]
    run_cases(args.study, cases, losses=losses, vocabs=vocabs, tokens=args.tokens, out=args.out)
    return 0

