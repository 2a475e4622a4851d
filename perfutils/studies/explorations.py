"""Combine exploratory sweeps (one study per design, each run with its own planner options) into one
data file with a ``design`` column, so a design that lost stays on record beside the one that won.

    python -m perfutils explorations --out data/h100-sxm-80gb/split_row_register_caps.csv \\
        --notes "..." cap64="labels CE, maxnreg 64"=/path/exp_lab64.csv ...

Each input must be a sweep file written by ``perfutils.measure.sweep`` (validated by ``load_records``) and
all must come from one GPU. The sidecar keeps every input's metadata (parameters, versions, date)
and the description of each design.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from ..data.records import load_metadata, load_records
from ..data.store import write_table


def combine_designs(designs: dict[str, tuple[str, str | Path]], out: str | Path, notes: str, *,
                    overwrite: bool = False) -> Path:
    """``designs``: name -> (description, sweep CSV). Writes ``out`` (refuses to replace it unless asked)."""
    if not designs:
        raise ValueError("combine_designs: no designs given")
    frames, sources = [], {}
    for name, (description, path) in designs.items():
        if not name or not description:
            raise ValueError(f"combine_designs: design {name!r} needs a name and a description")
        frame = load_records(path)
        frames.append(frame.assign(design=name))
        sources[name] = {"description": description, "file": Path(path).name, "metadata": load_metadata(path)}
    rows = pd.concat(frames, ignore_index=True)
    gpus = sorted(rows["gpu_name"].unique())
    if len(gpus) != 1:
        raise ValueError(f"combine_designs: the sweeps mix GPUs {gpus}")
    rows = rows[["design"] + [c for c in rows.columns if c != "design"]]
    meta = {"study": Path(out).stem, "gpu_name": gpus[0], "notes": notes,
            "designs": {name: info["description"] for name, info in sources.items()}, "sources": sources}
    return write_table(rows, out, meta, overwrite=overwrite)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m perfutils explorations", description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--notes", required=True)
    parser.add_argument("--overwrite", action="store_true")
    parser.add_argument("designs", nargs="+", help='name="description"=path/to/sweep.csv')
    args = parser.parse_args(argv)
    designs = {}
    for item in args.designs:
        name, _, rest = item.partition("=")
        description, _, path = rest.rpartition("=")
        if not name or not description or not path:
            parser.error(f"expected name=description=path, got {item!r}")
        designs[name] = (description, path)
    print(combine_designs(designs, args.out, args.notes, overwrite=args.overwrite))
    return 0

