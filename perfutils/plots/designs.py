"""Kernel designs tried beside the product (issue 39's explorations): each design's best configuration per cell,
the Nsight Compute evidence of why, and a sentence. Inputs are DataFrames and exploration records (a log's JSON
lines: the product's public call as ``cfg`` "public", timed in the same process, or the product's plans beside the
variation's)."""

from __future__ import annotations

import pandas as pd

# Nsight Compute details metrics shown per profiled kernel, and their column names here
EVIDENCE = {"Duration": "us", "Executed Instructions": "instructions_M", "Registers Per Thread": "registers",
            "Active Warps Per Scheduler": "active_warps", "Eligible Warps Per Scheduler": "eligible_warps",
            "L2 Hit Rate": "l2_hit_pct", "DRAM Throughput": "dram_pct",
            "Local Memory Spilling Requests": "spill_requests_M"}


def best_against_product(records, design: str, marker: str | None = None) -> pd.DataFrame:
    """Per cell (loss/target format, vocab), the baseline's and ``design``'s fastest checked configuration: their % of
    copy, and the design's time over the baseline's. The baseline is the public call (``cfg`` "public"), or with
    ``marker`` the plans whose label lacks it (a kernel-only run of the product's plans beside its variation, whose
    labels contain ``marker``); a run's plain-stream rows are left out, and so are the timing-only rows of a design
    taken apart (a nonzero ``ablate``: their results are wrong by design) and rows marked ``kernel_only`` beside the
    public call (a prepared launch or plan: the table sets calls against calls)."""
    frame = pd.DataFrame([r for r in records if "ms" in r and not r["cfg"].startswith("stream") and not r.get("ablate")
                          and not (marker is None and r.get("kernel_only"))])
    columns = ["design", "loss", "vocab", "baseline", "baseline_pct", "best_cfg", "design_pct", "time_ratio"]
    if frame.empty:
        return pd.DataFrame(columns=columns)
    frame["loss"] = frame["loss"] + "/" + frame["fmt"]
    in_design = (frame["cfg"] != "public") if marker is None else frame["cfg"].str.contains(marker, regex=False)
    rows = []
    for (loss, vocab), cell in frame.groupby(["loss", "vocab"], sort=False):
        baseline = cell[~in_design.loc[cell.index]]
        tried = cell[in_design.loc[cell.index]]
        if baseline.empty or tried.empty:
            continue
        base = baseline.loc[baseline["ms"].idxmin()]
        best = tried.loc[tried["ms"].idxmin()]
        rows.append({"design": design, "loss": loss, "vocab": int(vocab),
                     "baseline": "public call" if marker is None else f"plan {base['cfg']}",
                     "baseline_pct": base["pct"], "best_cfg": best["cfg"], "design_pct": best["pct"],
                     "time_ratio": best["ms"] / base["ms"]})
    return pd.DataFrame(rows, columns=columns)


def taken_apart(records, parts: dict) -> pd.DataFrame:
    """A design's step taken apart (records with an ``ablate`` field: 0 the whole kernel, other values the variants
    ``parts`` names): per cell and configuration, the mean % of copy of each part over the passes, one column a part
    in the order of ``parts``."""
    frame = pd.DataFrame([r for r in records if "ms" in r and r.get("ablate") in parts])
    if frame.empty:
        return pd.DataFrame(columns=["loss", "vocab", "cfg", *parts.values()])
    frame["loss"] = frame["loss"] + "/" + frame["fmt"]
    frame["part"] = frame["ablate"].map(parts)
    table = frame.pivot_table(index=["loss", "vocab", "cfg"], columns="part", values="pct", aggfunc="mean",
                              sort=False)
    return table.reindex(columns=list(parts.values())).reset_index().rename_axis(columns=None)


LOSS_KERNELS = ("streamed_row", "resident_tma", "resident_row", "split_row", "fused", "two_pass")


def nsight_evidence(details: pd.DataFrame, design: str, cells=None) -> pd.DataFrame:
    """The loss kernels of an Nsight Compute details export (``perfutils.measure.ncu.parse_ncu_csv``'s frame; torch's
    own elementwise and reduction kernels left out), in launch order, with the :data:`EVIDENCE` metrics. ``cells``:
    the probed cells in order (e.g. ``"forward_kl 32000"``), each with the same number of loss launches."""
    keep = details[details["kernel"].map(lambda name: name.startswith(LOSS_KERNELS))]
    table = keep[["kernel", *EVIDENCE]].rename(columns=EVIDENCE).assign(design=design)
    if cells:
        if len(table) % len(cells):
            raise ValueError(f"{len(table)} loss launches do not split evenly over {len(cells)} cells")
        per_cell = len(table) // len(cells)
        table.insert(0, "cell", [cells[i // per_cell] for i in range(len(table))])
    table["us"] = table["us"] / 1e3  # ns from the parser
    table["instructions_M"] = table["instructions_M"] / 1e6
    table["spill_requests_M"] = table["spill_requests_M"] / 1e6
    return table[[*(["cell"] if cells else []), "design", "kernel", *EVIDENCE.values()]].reset_index(drop=True)


def designs_reading(best: pd.DataFrame) -> str:
    """One sentence per design: at how many cells it beat its baseline, and the span of both sides' % of copy."""
    sentences = []
    for design, part in best.groupby("design", sort=False):
        faster = int((part["time_ratio"] < 1).sum())
        against = "the public call" if (part["baseline"] == "public call").all() else "the product's plans"
        sentences.append(
            f"**{design}**: faster than {against} at {faster} of {len(part)} cells; "
            f"{part['design_pct'].min():.1f}–{part['design_pct'].max():.1f}% of copy against "
            f"{part['baseline_pct'].min():.1f}–{part['baseline_pct'].max():.1f}% "
            f"({part['time_ratio'].min():.2f}–{part['time_ratio'].max():.2f}× their time).")
    return " ".join(sentences)
