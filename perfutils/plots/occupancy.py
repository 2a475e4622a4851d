"""Occupancy figures in the style of NVIDIA's occupancy calculator, and the frames they plot.

Every function takes plain numbers or DataFrames and returns a Figure/Axes or a DataFrame; the
numbers come from :mod:`perfutils.model.occupancy` (a port of ``cuda_occupancy.h``), never from a
formula of their own, except :func:`triton_tutorial_blocks_per_sm`, which reproduces the
simplified formula of Triton's fused-softmax tutorial on purpose, to show where it goes wrong.

Figures are deterministic (fixed colours per limiter, no dates in files: save them with
:func:`perfutils.plots.figures.save_figure`).
"""

from __future__ import annotations

import math
import numbers
from pathlib import Path

import pandas as pd

from ..model.hardware import sm_limits
from ..model.occupancy import LIMITER_NAMES, Occupancy, occupancy, occupancy_of_counts

__all__ = [
    "LIMITER_COLORS",
    "primary_limiter",
    "triton_tutorial_blocks_per_sm",
    "tutorial_vs_calculator",
    "limits_table",
    "describe_occupancy",
    "kernel_occupancy_table",
    "plot_occupancy_curves",
    "plot_kernels_on_register_curves",
]

# One colour per limiter, the same in every figure.
LIMITER_COLORS = {
    "warps": "tab:blue",
    "registers": "tab:orange",
    "shared_memory": "tab:green",
    "blocks": "tab:purple",
    "barriers": "tab:brown",
    "virtual_resources": "tab:gray",
    "none": "black",  # nothing fits (blocks_per_sm == 0 through an invalid launch)
}

_CURVE_AXES = {
    "registers": ("registers_per_thread", "registers per thread"),
    "threads": ("threads_per_block", "threads per block"),
    "shared_memory": ("shared_bytes", "shared memory per block (KiB)"),
}


def primary_limiter(limiter) -> str:
    """The first name of a limiter string like ``"registers+warps"`` (``"none"`` when empty)."""
    if limiter is None or (isinstance(limiter, float) and math.isnan(limiter)):
        return "none"
    if not isinstance(limiter, str):
        raise TypeError(f"limiter: expected a str like 'registers+warps', got {type(limiter).__name__}")
    first = limiter.split("+")[0].strip()
    return first or "none"


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        raise ValueError(f"{name}: expected a positive integer, got {value!r}")
    return int(value)


def triton_tutorial_blocks_per_sm(n_regs: int, num_warps: int, shared_bytes: int = 0, cc=(9, 0)) -> int:
    """Blocks per SM by the formula of Triton's fused-softmax tutorial (``02-fused-softmax.py``)::

        occupancy = NUM_REGS // (n_regs * WARP_SIZE * num_warps)
        occupancy = min(occupancy, SIZE_SMEM // size_smem)

    with ``NUM_REGS`` the SM's 64 Ki registers and ``SIZE_SMEM`` the opt-in shared memory per
    block. It ignores the per-warp register allocation unit (256), the SM sub-partitions, the
    warp-slot and blocks-per-SM limits and the driver's reserved 1 KiB per block.
    """
    n_regs = _positive_int("n_regs", n_regs)
    num_warps = _positive_int("num_warps", num_warps)
    if isinstance(shared_bytes, bool) or not isinstance(shared_bytes, numbers.Integral) or shared_bytes < 0:
        raise ValueError(f"shared_bytes: expected an integer >= 0, got {shared_bytes!r}")
    limits = sm_limits(cc)
    blocks = limits.registers_per_sm // (n_regs * limits.warp_size * num_warps)
    if shared_bytes:
        blocks = min(blocks, limits.shared_bytes_per_block_optin // int(shared_bytes))
    return blocks


def tutorial_vs_calculator(configs, cc=(9, 0)) -> pd.DataFrame:
    """One row per ``(threads_per_block, registers_per_thread)`` (or with shared bytes as a third
    item): the tutorial's blocks/SM, the calculator's, its limiter and the registers it allocates."""
    rows = []
    limits = sm_limits(cc)
    for config in configs:
        threads, regs, *rest = config
        shared = rest[0] if rest else 0
        threads = _positive_int("threads_per_block", threads)
        if threads % limits.warp_size:
            raise ValueError(f"threads_per_block: expected a multiple of {limits.warp_size}, got {threads}")
        num_warps = threads // limits.warp_size
        occ = occupancy_of_counts(regs, shared, num_warps, cc)
        naive = triton_tutorial_blocks_per_sm(regs, num_warps, shared, cc)
        regs_per_warp = -(-regs * limits.warp_size // limits.register_allocation_unit) * limits.register_allocation_unit
        rows.append({
            "threads_per_block": threads,
            "registers_per_thread": regs,
            "shared_bytes": shared,
            "tutorial_blocks_per_sm": naive,
            "blocks_per_sm": occ.blocks_per_sm,
            "allocated_registers_per_warp": regs_per_warp,
            "warps_per_sub_partition": (limits.registers_per_sm // limits.sub_partitions) // regs_per_warp
            if regs_per_warp else None,
            "occupancy": occ.occupancy,
            "limiter": occ.limiter,
        })
    return pd.DataFrame(rows)


def limits_table(occ: Occupancy) -> pd.DataFrame:
    """Blocks/SM each resource allows (``inf`` shown as None), marking the binding ones."""
    if not isinstance(occ, Occupancy):
        raise TypeError(f"occ: expected an Occupancy, got {type(occ).__name__}")
    rows = []
    for name in LIMITER_NAMES:
        if name not in occ.limits:
            continue
        value = occ.limits[name]
        rows.append({"limit": name, "blocks_per_sm": None if value == math.inf else int(value),
                     "binding": name in occ.limiters})
    return pd.DataFrame(rows)


def describe_occupancy(occ: Occupancy) -> str:
    """A few lines of text for one configuration (the explorer widget prints this)."""
    if not isinstance(occ, Occupancy):
        raise TypeError(f"occ: expected an Occupancy, got {type(occ).__name__}")
    limits = sm_limits(occ.cc)
    lines = [
        f"sm_{occ.cc[0]}{occ.cc[1]}: {occ.threads_per_block} threads/block ({occ.warps_per_block} warps), "
        f"{occ.registers_per_thread} registers/thread, {occ.shared_bytes_per_block} B shared/block",
        f"blocks/SM: {occ.blocks_per_sm}   active warps: {occ.active_warps} / {occ.max_warps_per_sm}   "
        f"occupancy: {100 * occ.occupancy:.1f}%   binding limit: {occ.limiter or 'none'}",
        f"allocated per block: {occ.allocated_registers_per_block} registers "
        f"(of {limits.registers_per_sm}/SM), {occ.allocated_shared_bytes_per_block} B shared "
        f"(incl. {limits.reserved_shared_bytes_per_block} B reserved; carveout {occ.shared_bytes_per_sm} B/SM)",
        "blocks/SM allowed by: " + ", ".join(
            f"{name} {'unlimited' if value == math.inf else int(value)}" for name, value in occ.limits.items()),
    ]
    return "\n".join(lines)


def explorer_text(cc, threads: int, regs: int, shared_bytes: int, what_if: dict | None = None) -> str:
    """What notebook 04's explorer prints for its knobs: the occupancy (:func:`describe_occupancy`), Triton's tutorial
    formula beside it, and with ``what_if`` (``gpu`` and the kernel: ``loss``, ``target_format``, ``tokens``,
    ``vocab``, ``variant``, ``block_size``, ``spill_bytes``) the performance model's time for that kernel with these
    counts, on the GPU whose ceilings it has (compute capability 9.0 only)."""
    occ = occupancy(cc, threads_per_block=threads, registers_per_thread=regs, dynamic_shared_bytes=shared_bytes,
                    opt_in=shared_bytes > 48 * 1024)
    naive = triton_tutorial_blocks_per_sm(max(regs, 1), threads // 32, shared_bytes, cc)
    lines = [describe_occupancy(occ), f"Triton tutorial formula: {naive} blocks/SM"]
    if what_if is not None:
        from ..model.hardware import normalize_cc
        from ..model.predict import describe_prediction, predict_launch

        kernel = {key: value for key, value in what_if.items() if key != "gpu"}
        if normalize_cc(cc) != (9, 0):
            lines.append(f"model: ceilings recorded for sm_90 only, not sm_{occ.cc[0]}{occ.cc[1]}")
        elif occ.blocks_per_sm == 0:
            lines.append("model: no program fits on an SM")
        else:
            prediction = predict_launch(what_if["gpu"], num_warps=threads // 32, n_regs=max(regs, 1),
                                        shared_bytes=shared_bytes, **kernel)
            lines.append(describe_prediction(prediction, what_if["gpu"], loss=kernel["loss"],
                                             target_format=kernel["target_format"], tokens=kernel["tokens"],
                                             vocab=kernel["vocab"]))
    return "\n".join(lines)


def explorer_what_if(gpu_dir, *, loss: str, target_format: str, variant: str, vocab: int, block_size: int,
                     num_warps: int, tokens: int) -> dict:
    """The ``what_if`` of :func:`explorer_text` for a kernel of the block-size sweep recorded in ``gpu_dir``: the GPU's
    ceilings (for the model) and the kernel with its recorded spill bytes (the knobs change the other counts)."""
    from ..data.records import load_records
    from ..model.predict import gpu_from_folder

    sweep = load_records(Path(gpu_dir) / "blocksize_sweep.csv")
    row = sweep[(sweep["status"] == "ok") & (sweep["loss"] == loss) & (sweep["target_format"] == target_format)
                & (sweep["variant"] == variant) & (sweep["vocab"] == vocab) & (sweep["block_size"] == block_size)
                & (sweep["num_warps"] == num_warps)]
    spill = int(row["spill_bytes"].fillna(0).iloc[0]) if len(row) else 0
    return dict(gpu=gpu_from_folder(gpu_dir), loss=loss, target_format=target_format, tokens=int(tokens),
                vocab=int(vocab), variant=variant, block_size=int(block_size), spill_bytes=spill)


def kernel_occupancy_table(df: pd.DataFrame, cc=(9, 0)) -> pd.DataFrame:
    """Add the calculator's ``calc_blocks_per_sm``, ``calc_occupancy`` and ``calc_limiter`` to rows
    with ``n_regs``, ``shared_bytes`` and ``num_warps`` (rows missing any of them are dropped)."""
    if not isinstance(df, pd.DataFrame):
        raise TypeError(f"df: expected a DataFrame, got {type(df).__name__}")
    missing = {"n_regs", "shared_bytes", "num_warps"} - set(df.columns)
    if missing:
        raise ValueError(f"df: missing columns {sorted(missing)}")
    out = df.dropna(subset=["n_regs", "shared_bytes", "num_warps"]).copy()
    results = [occupancy_of_counts(int(r), int(s), int(w), cc)
               for r, s, w in zip(out["n_regs"], out["shared_bytes"], out["num_warps"])]
    out["calc_blocks_per_sm"] = [o.blocks_per_sm for o in results]
    out["calc_occupancy"] = [o.occupancy for o in results]
    out["calc_limiter"] = [o.limiter for o in results]
    return out.reset_index(drop=True)


def _check_curves(curves) -> None:
    if not isinstance(curves, dict) or set(curves) != set(_CURVE_AXES):
        raise ValueError(f"curves: expected the dict of perfutils.model.occupancy.occupancy_curves with keys "
                         f"{sorted(_CURVE_AXES)}, got {type(curves).__name__}")
    for key, (column, _) in _CURVE_AXES.items():
        frame = curves[key]
        need = {column, "occupancy", "limiter", "current", "blocks_per_sm"}
        if not isinstance(frame, pd.DataFrame) or need - set(frame.columns):
            raise ValueError(f"curves[{key!r}]: expected a DataFrame with columns {sorted(need)}")
        if len(frame) == 0:
            raise ValueError(f"curves[{key!r}] is empty")


def plot_occupancy_curves(curves: dict, *, title: str | None = None):
    """Three panels, as in NVIDIA's calculator: occupancy against registers/thread, threads/block
    and shared memory/block, each varied alone around the current configuration.

    ``curves`` is what :func:`perfutils.model.occupancy.occupancy_curves` returns. The step line is the
    occupancy; its dots are coloured by the binding limit at that value; the current configuration
    is a red ring annotated with its blocks/SM and binding limit. Returns the Figure.
    """
    import matplotlib.pyplot as plt  # lazy: importing perfutils must not pick a backend
    from matplotlib.lines import Line2D

    _check_curves(curves)
    fig, axes = plt.subplots(1, 3, figsize=(14.0, 4.2), sharey=True)
    seen = set()
    for ax, key in zip(axes, ("registers", "threads", "shared_memory")):
        column, label = _CURVE_AXES[key]
        frame = curves[key].sort_values(column)
        x = frame[column] / 1024 if key == "shared_memory" else frame[column]
        y = 100 * frame["occupancy"]
        ax.step(x, y, where="post", color="0.35", linewidth=1.0, zorder=1)
        limiters = frame["limiter"].map(primary_limiter)
        for name in sorted(set(limiters), key=lambda n: list(LIMITER_COLORS).index(n) if n in LIMITER_COLORS else 99):
            sel = limiters == name
            ax.scatter(x[sel], y[sel], s=9, color=LIMITER_COLORS.get(name, "black"), zorder=2)
            seen.add(name)
        current = frame[frame["current"]]
        if len(current):
            row = current.iloc[0]
            cx = row[column] / 1024 if key == "shared_memory" else row[column]
            cy = 100 * row["occupancy"]
            ax.scatter([cx], [cy], s=90, facecolors="none", edgecolors="red", linewidths=2, zorder=3)
            blocks = int(row["blocks_per_sm"])
            ax.annotate(f"{blocks} block{'' if blocks == 1 else 's'}/SM, {cy:.0f}%\nlimit: {row['limiter'] or 'none'}",
                        (cx, cy), textcoords="offset points", xytext=(8, -28), fontsize=8, color="red")
        ax.set_xlabel(label)
        ax.set_ylim(-3, 105)
        ax.grid(True, linewidth=0.4, alpha=0.6)
    axes[0].set_ylabel("occupancy (% of max warps per SM)")
    order = [name for name in LIMITER_COLORS if name in seen]
    handles = [Line2D([], [], marker="o", linestyle="", color=LIMITER_COLORS[n], label=f"limited by {n}")
               for n in order]
    handles.append(Line2D([], [], marker="o", linestyle="", markerfacecolor="none", markeredgecolor="red",
                          markersize=9, label="current configuration"))
    axes[-1].legend(handles=handles, fontsize=8, loc="upper right")
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return fig


def plot_kernels_on_register_curves(kernels_df: pd.DataFrame, cc=(9, 0), *, shared_bytes: int | None = None,
                                    title: str | None = None, ax=None):
    """Real kernels on the calculator's occupancy-vs-registers curves, one curve per ``num_warps``.

    ``kernels_df`` needs ``n_regs``, ``num_warps`` and ``source`` (e.g. "H100 sweep", "offline
    sm_90"); ``shared_bytes`` per row when present. A kernel is drawn at the occupancy the
    calculator gives for its own counts; the curves use ``shared_bytes`` (default: the largest
    in the frame, which for these kernels is far from binding). Returns the Axes.
    """
    import matplotlib.pyplot as plt

    if not isinstance(kernels_df, pd.DataFrame):
        raise TypeError(f"kernels_df: expected a DataFrame, got {type(kernels_df).__name__}")
    missing = {"n_regs", "num_warps", "source"} - set(kernels_df.columns)
    if missing:
        raise ValueError(f"kernels_df: missing columns {sorted(missing)}")
    df = kernels_df.dropna(subset=["n_regs", "num_warps"]).copy()
    if df.empty:
        raise ValueError("kernels_df: no row has both n_regs and num_warps")
    if "shared_bytes" not in df.columns:
        df["shared_bytes"] = 0
    df["shared_bytes"] = df["shared_bytes"].fillna(0).astype(int)
    if shared_bytes is None:
        shared_bytes = int(df["shared_bytes"].max())
    limits = sm_limits(cc)
    if ax is None:
        _, ax = plt.subplots(figsize=(8.0, 4.8))
    warps_values = sorted(int(w) for w in df["num_warps"].unique())
    colors = {w: f"C{i}" for i, w in enumerate(warps_values)}
    regs_axis = list(range(1, limits.max_registers_per_thread + 1))
    for w in warps_values:
        threads = w * limits.warp_size
        ys = []
        for r in regs_axis:
            opt_in = shared_bytes > 48 * 1024
            occ = occupancy(limits.cc, threads_per_block=threads, registers_per_thread=r,
                            dynamic_shared_bytes=shared_bytes, opt_in=opt_in)
            ys.append(100 * occ.occupancy)
        ax.step(regs_axis, ys, where="post", color=colors[w], linewidth=1.0, alpha=0.8,
                label=f"calculator, {w} warps ({threads} threads)")
    markers = ["o", "x", "s", "^", "D", "v"]
    sources = list(dict.fromkeys(df["source"].astype(str)))
    for j, source in enumerate(sources):
        part = df[df["source"].astype(str) == source]
        for w in warps_values:
            sel = part[part["num_warps"].astype(int) == w]
            if sel.empty:
                continue
            occs = [100 * occupancy_of_counts(int(r), int(s), w, cc).occupancy
                    for r, s in zip(sel["n_regs"], sel["shared_bytes"])]
            ax.scatter(sel["n_regs"].astype(int), occs, marker=markers[j % len(markers)], s=45,
                       color=colors[w], alpha=0.85, zorder=3 + j)
        ax.scatter([], [], marker=markers[j % len(markers)], color="0.3", label=f"kernels: {source}")
    ax.set_xlim(0, limits.max_registers_per_thread + 1)
    ax.set_ylim(-3, 105)
    ax.set_xlabel("registers per thread")
    ax.set_ylabel("occupancy (% of max warps per SM)")
    ax.grid(True, linewidth=0.4, alpha=0.6)
    ax.legend(fontsize=8, loc="upper right")
    if title:
        ax.set_title(title, fontsize=10)
    return ax
