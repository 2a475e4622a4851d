"""Kernel designs tried beside the public call (issue 39's explorations): each design's best configuration per cell,
the Nsight Compute evidence of why, and a sentence. Inputs are DataFrames and exploration records (a log's JSON
lines with a ``cfg`` of ``"public"`` for the product's public call, timed in the same process)."""

from __future__ import annotations

import pandas as pd

# Nsight Compute details metrics shown per profiled kernel, and their column names here
EVIDENCE = {"Duration": "us", "Executed Instructions": "instructions_M", "Registers Per Thread": "registers",
            "Active Warps Per Scheduler": "active_warps", "Eligible Warps Per Scheduler": "eligible_warps",
            "L2 Hit Rate": "l2_hit_pct", "DRAM Throughput": "dram_pct",
            "Local Memory Spilling Requests": "spill_requests_M"}


def best_against_public(records, design: str) -> pd.DataFrame:
    """Per cell (loss/target format, vocab), the public call and ``design``'s fastest checked configuration: their %
    of copy, and the design's time over the public call's."""
    frame = pd.DataFrame([r for r in records if "ms" in r])
    if frame.empty:
        return pd.DataFrame(columns=["design", "loss", "vocab", "public_pct", "best_cfg", "design_pct", "time_ratio"])
    frame["loss"] = frame["loss"] + "/" + frame["fmt"]
    rows = []
    for (loss, vocab), cell in frame.groupby(["loss", "vocab"], sort=False):
        public = cell[cell["cfg"] == "public"]
        tried = cell[cell["cfg"] != "public"]
        if public.empty or tried.empty:
            continue
        best = tried.loc[tried["ms"].idxmin()]
        rows.append({"design": design, "loss": loss, "vocab": int(vocab), "public_pct": public["pct"].iloc[0],
                     "best_cfg": best["cfg"], "design_pct": best["pct"],
                     "time_ratio": best["ms"] / public["ms"].iloc[0]})
    return pd.DataFrame(rows)


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
    """One sentence per design: at how many cells it beat the public call, and the span of both sides' % of copy."""
    sentences = []
    for design, part in best.groupby("design", sort=False):
        faster = int((part["time_ratio"] < 1).sum())
        sentences.append(
            f"**{design}**: faster than the public call at {faster} of {len(part)} cells; "
            f"{part['design_pct'].min():.1f}–{part['design_pct'].max():.1f}% of copy against "
            f"{part['public_pct'].min():.1f}–{part['public_pct'].max():.1f}% "
            f"({part['time_ratio'].min():.2f}–{part['time_ratio'].max():.2f}× the public call's time).")
    return " ".join(sentences)
