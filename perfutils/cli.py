"""Command line: ``python -m perfutils sweep --config notebooks/params/x.yaml``, ``python -m perfutils info``,
``python -m perfutils predict --check data/<gpu> --out FILE.csv`` (the performance model against the recorded times),
and every study's own command line, ``python -m perfutils <study> ...`` (:data:`STUDIES`: ``python -m perfutils
vocab-sweep run public-4096-1 --out data`` runs ``perfutils.studies.vocab_sweep``'s ``main`` with the arguments after
the study's name; ``python -m perfutils <study> --help`` says what each takes). ``scripts/collect_h100.sh`` calls them
so.

Exit codes: 0 success, 1 the sweep stopped on a runtime problem (no GPU, unusable CUDA context),
2 bad arguments or input files (argparse's convention), 130 interrupted (rows measured so far are kept).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from .data.schema import DataFileError, IncompatibleDataError


# The studies with a command line of their own (each module's ``main(argv)``), by the name the CLI gives them.
STUDIES = {
    "studies": "perfutils.studies.cases",  # case_study | benchmark
    "case-497": "perfutils.studies.case_497",
    "vocab-sweep": "perfutils.studies.vocab_sweep",
    "host-overhead": "perfutils.studies.host_overhead",
    "autograd-step": "perfutils.studies.autograd_step",
    "occupancy-check": "perfutils.studies.occupancy_check",
    "tuning": "perfutils.studies.tuning",
    "teaching": "perfutils.studies.teaching",
    "profiling": "perfutils.studies.profiling",
    "tensor-parallel": "perfutils.studies.tensor_parallel",
    "nvlink": "perfutils.studies.nvlink",
    "explorations": "perfutils.studies.explorations",
    "step-counts": "perfutils.model.offline_counts",
}


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m perfutils", description="Measure and record fused-loss kernel sweeps.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="studies (python -m perfutils STUDY --help for each): " + ", ".join(STUDIES))
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sweep = commands.add_parser("sweep", help="run a sweep from a YAML config (resumes where a previous run stopped)")
    sweep.add_argument("--config", required=True, help="YAML sweep config, e.g. notebooks/params/block_size.yaml")
    sweep.add_argument("--out", default=None, help="data directory (overrides the config's 'out'; default data/)")
    sweep.add_argument("--dry-run", action="store_true", help="list the configurations and exit; measures nothing")
    sweep.add_argument("--retry-errors", action="store_true", help="run again configurations recorded only as errors")
    sweep.add_argument("--allow-mixed", action="store_true", help="append even if the file holds another GPU's data or schema")
    sweep.add_argument(
        "--overwrite", action="store_true", help="start the file afresh (the old CSV/JSON are renamed *.replaced-<time>.*, not deleted)"
    )

    predict = commands.add_parser("predict", help="predict recorded configurations' times offline (perfutils.model.predict)")
    predict.add_argument("--check", required=True, metavar="DIR", help="a GPU's data folder, e.g. data/h100-sxm-80gb")
    predict.add_argument("--out", default=None, help="CSV of one row per configuration (measured, predicted, bound)")
    predict.add_argument("--baseline", action="store_true", help="also report the plain roofline (minimal bytes at copy)")

    info = commands.add_parser("info", help="print this machine's metadata (what a data file's sidecar records)")
    info.add_argument("--copy", action="store_true", help="also measure device copy bandwidth (needs a GPU)")
    return parser


def _sweep(args: argparse.Namespace) -> int:
    from .measure.sweep import run_sweep
    from .measure.sweep_config import load_config

    overrides = {}
    if args.out is not None:
        overrides["out"] = args.out
    if args.retry_errors:
        overrides["retry_errors"] = True
    spec = load_config(args.config, overrides=overrides)
    if args.dry_run:
        plan = run_sweep(spec, dry_run=True)
        for key in plan["config_key"]:
            print(key)
        print(f"{len(plan)} configurations in study {spec.study!r} (output under {spec.out}/<gpu-slug>/{spec.study}.csv)")
        return 0
    frame = run_sweep(spec, allow_mixed=args.allow_mixed, overwrite=args.overwrite)
    counts = frame["status"].value_counts().to_dict()
    print(f"done: {len(frame)} rows in {frame.attrs.get('path')} ({', '.join(f'{n} {s}' for s, n in sorted(counts.items()))})")
    return 0


def _info(args: argparse.Namespace) -> int:
    from .data.metadata import collect_metadata

    copy_gbps = None
    if args.copy:
        from .measure.timing import copy_bandwidth_gbps

        copy_gbps = copy_bandwidth_gbps()
    print(json.dumps(collect_metadata({}, copy_gbps), indent=2, default=str))
    return 0


def _predict(args: argparse.Namespace) -> int:
    from .model.predict import check, plain_roofline_ms, summarize

    frame = check(args.check)
    if frame.empty:
        raise ValueError(f"--check: no modellable configuration with a recorded time under {args.check}")
    if args.out is not None:
        frame.to_csv(args.out, index=False)
    table = summarize(frame).round(3).to_string(index=False)
    print(f"{len(frame)} configurations in {args.check}; |predicted / measured - 1| and Spearman per sweep:")
    print(table)
    for half in (0, 1):
        part = frame[frame["half"] == half]
        print(f"half {half} ({len(part)}): median {part['abs_rel_err'].median():.3f}, "
              f"p90 {part['abs_rel_err'].quantile(0.9):.3f}")
    if args.baseline:
        base = frame.merge(plain_roofline_ms(args.check).drop_duplicates(["study", "config_key"]),
                           on=["study", "config_key"], how="left")
        base["abs_rel_err"] = (base["roofline_ms"] / base["measured_ms"] - 1).abs()
        print("plain roofline (minimal bytes at copy bandwidth):")
        print(summarize(base.assign(predicted_ms=base["roofline_ms"])).round(3).to_string(index=False))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in STUDIES:  # a study's own command line, with the arguments after its name
        import importlib

        return importlib.import_module(STUDIES[argv[0]]).main(argv[1:])
    parser = _build_parser()
    args = parser.parse_args(argv)
    handler = {"sweep": _sweep, "info": _info, "predict": _predict}[args.command]
    try:
        return handler(args)
    except (ValueError, TypeError, FileNotFoundError, DataFileError, IncompatibleDataError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted: the rows measured so far are kept; run the same command again to resume", file=sys.stderr)
        return 130
