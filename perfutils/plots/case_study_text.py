"""The sentences notebook 02 (the case study of Fast-LLM #497) prints about its tables, each computed from them.

Every function takes a table :mod:`perfutils.plots.case_study` builds (``compare_cases``, ``ablation_walk``,
``solo_effects``, the time-against-traffic points) and returns Markdown that states what the numbers show: which
kernel is faster, by how much, where an effect reverses. The words follow the numbers (a comparison within a few
per cent is "level with"), so a page cannot keep a sentence its data no longer supports.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd

from ..notebook import compared, listing, span

__all__ = ["reproduction_reading", "traffic_reading", "walk_reading", "solo_reading", "exp2_reading",
           "fixes_reading", "other_losses_reading"]


def _k(vocab) -> str:
    return f"{int(vocab) // 1024}K"


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


def _times(ratio: float) -> str:
    return f"{ratio:.2f}×"


def reproduction_reading(repro: pd.DataFrame, *, real: str, reference: str, peer: str, later: str | None,
                         vocab: int) -> str:
    """How the #497 kernel (``real``) compares with the emulation (``reference``), ``peer`` (torch.compile) and the
    ``later`` Fast-LLM at each vocabulary, and at ``vocab`` its occupancy and stack among the Triton kernels."""
    ms = repro.pivot(index="vocab", columns="case", values="ms")
    over_reference = ms[real] / ms[reference]
    slower = over_reference[over_reference > 1]
    worst = over_reference.idxmax()
    if len(slower) == len(over_reference):
        text = (f"The #497 kernel is slower than the emulation at every vocabulary ({span(over_reference)}× its "
                f"time), the most at {_k(worst)}")
    else:
        faster = over_reference.index.difference(slower.index)
        text = (f"The #497 kernel is slower than the emulation at {listing(_k(v) for v in slower.index) or 'none'} of "
                f"the vocabularies and not at {listing(_k(v) for v in faster)}")
    at = repro[repro["vocab"] == vocab].set_index("case")
    order = at["ms"].sort_values()
    if order.index[-1] == real:
        text += f"; at {_k(vocab)} it is the slowest of the {len(order)} ({at.loc[real, 'pct_of_copy']:.1f}% of copy)"
    if peer in at.index:
        if at.loc[reference, "ms"] < at.loc[peer, "ms"] < at.loc[real, "ms"]:
            text += f", and {peer} lies between the emulation and it"
        over_peer = ms[real] / ms[peer]
        text += (f". Against {peer}, the #497 kernel takes "
                 + listing(f"{_times(r)} its time at {_k(v)}" for v, r in over_peer.items()))
    text += "."
    if later is not None and later in ms:
        over = ms[later] / ms[reference]
        faster = int((over < 1).sum())
        text += (f" {later} is faster than the emulation at {faster} of {len(over)} vocabularies "
                 f"({span(over)}× its time).")
    triton = at[at["n_regs"].notna()]
    if real in triton.index and len(triton) > 1:
        others = triton.drop(index=real)
        occupancy, stack = triton.loc[real, "occupancy"], triton.loc[real, "stack_bytes"]
        most = "the highest" if occupancy > others["occupancy"].max() else "not the highest"
        largest = "the largest" if stack > others["stack_bytes"].max() else "not the largest"
        text += (f" At {_k(vocab)} the #497 kernel has {most} occupancy of the Triton kernels ({occupancy:.0%}, "
                 f"against {span(others['occupancy'] * 100, '.1f')}%) and {largest} stack ({int(stack)} B per thread, "
                 f"against {span(others['stack_bytes'], '.0f')} B).")
    return text


def traffic_reading(traffic: pd.DataFrame, *, real: str, ratio: str = "measured / at_copy_bw",
                    tolerance: float = 0.05) -> str:
    """Where the kernels lie against the line "every byte, spills included, at the copy bandwidth": those whose
    resident stack exceeds the L2 and those whose stack fits in it."""
    parts = []
    beyond = traffic[traffic["resident_over_L2"] > 1]
    within = traffic[traffic["resident_over_L2"] <= 1]
    if len(beyond):
        on = beyond[(beyond[ratio] - 1).abs() <= tolerance]
        off = beyond.drop(index=on.index)
        text = (f"The {len(beyond)} kernels whose resident stack exceeds the L2 (red) run at {span(beyond[ratio])}× "
                f"the time of their bytes at the copy bandwidth: {len(on)} of them within {tolerance:.0%} of the line "
                "where every spilled byte goes through DRAM")
        if len(off):
            text += "; further off it: " + listing(f"`{c}` ({v:.2f}×)" for c, v in zip(off["case"], off[ratio]))
        parts.append(text + ".")
    if real in set(traffic["case"]):
        mine = float(traffic.loc[traffic["case"] == real, ratio].iloc[0])
        parts.append(f"The #497 kernel: {mine:.2f}×" + (", so its time is its traffic, spills included."
                                                        if abs(mine - 1) <= tolerance else "."))
    if len(within):
        below = int((within[ratio] < 1 - tolerance).sum())
        parts.append(f"The {len(within)} kernels whose stack fits in the L2 (blue) run at {span(within[ratio])}×, "
                     f"{below} of them below the line: part of their spill traffic is served by the caches.")
    return " ".join(parts)


def walk_reading(walk: pd.DataFrame, *, tolerance: float = 0.01) -> str:
    """Which steps of the ablation carry the gap, what they do to registers, stack and occupancy, and which steps
    give time back or change nothing."""
    steps = walk.iloc[1:]  # the first row is the #497 kernel itself, the start of the walk
    top = steps.sort_values("share_of_gap", ascending=False).head(2).sort_index()  # in the walk's order
    share = float(top["share_of_gap"].sum())
    names = listing(top["case"])
    shares = listing(f"{s:.0%}" for s in top["share_of_gap"])
    more = ", more than the whole gap" if share > 1 else ""
    text = f"{_capital(names)} carry {share:.0%} of the gap ({shares}{more})."
    moves = []
    for position, row in top.iterrows():
        before = walk.loc[walk.index[walk.index.get_loc(position) - 1]]
        moves.append(f"{row['case']}: registers {int(before['n_regs'])} → {int(row['n_regs'])}, stack "
                     f"{int(before['stack_bytes'])} → {int(row['stack_bytes'])} B, occupancy "
                     f"{before['occupancy']:.0%} → {row['occupancy']:.0%}")
    text += " " + "; ".join(moves) + "."
    regs_up = all(r["n_regs"] > walk.loc[walk.index[walk.index.get_loc(p) - 1], "n_regs"] for p, r in top.iterrows())
    stack_down = all(r["stack_bytes"] < walk.loc[walk.index[walk.index.get_loc(p) - 1], "stack_bytes"]
                     for p, r in top.iterrows())
    if regs_up and stack_down:
        text += (" In both the compiler keeps more registers and spills less: the kernel stops trading registers for "
                 "occupancy, and gets faster as occupancy falls.")
    first = steps.iloc[0]
    time = 1 / first["factor"]  # factor: the previous step's time over this one's
    text += (f" {_capital(first['case'])} (the structure re-implemented) runs {compared(time, tolerance)} the real "
             f"kernel ({_times(time)} its time).")
    later = steps.loc[steps.index > top.index.max()]
    back = later[later["factor"] < 1 - tolerance]
    flat = later[(later["factor"] - 1).abs() <= tolerance]
    if len(back):
        text += (" After them " + listing(f"{r.case} ({1 / r.factor:.2f}× slower)" for r in back.itertuples())
                 + " give time back")
    if len(flat):
        text += ("; " if len(back) else " ") + listing(flat["case"]) + \
            f" change the time by less than {tolerance:.0%}"
    return text + "."


def solo_reading(solo: pd.DataFrame, *, tolerance: float = 0.02) -> str:
    """Each switch alone from step 0 against the same switch within the walk (``alone``, ``in_walk``: factors, > 1 =
    faster)."""
    reversed_, larger, smaller = [], [], []
    for row in solo.itertuples():
        if row.alone > 1 + tolerance and row.in_walk < 1 - tolerance:
            reversed_.append(f"`{row.solo}` ({row.alone:.2f}× alone, {row.in_walk:.2f}× in the walk)")
        elif row.alone > row.in_walk * (1 + tolerance) and row.in_walk > 1:
            larger.append(f"`{row.solo}` ({row.alone:.2f}× against {row.in_walk:.2f}×)")
        elif row.in_walk > row.alone * (1 + tolerance) and row.alone > 1:
            smaller.append(f"`{row.solo}` ({row.alone:.2f}× against {row.in_walk:.2f}×)")
    parts = []
    if reversed_:
        parts.append(f"A win from the spilling step 0 and a loss within the walk: {listing(reversed_)}")
    if larger:
        parts.append(f"a larger win alone than within the walk: {listing(larger)}")
    if smaller:
        parts.append(f"a smaller win alone than within the walk: {listing(smaller)}")
    big = solo.sort_values("alone", ascending=False).head(2)
    text = ("; ".join(parts) + ". ") if parts else ""
    text = text[:1].upper() + text[1:]
    text += ("The two largest single switches from step 0 are " + listing(f"`{r.solo}` ({r.alone:.2f}×)"
                                                                        for r in big.itertuples())
             + ": the walk's big factors are not artefacts of its order.")
    return text


def exp2_reading(walk: pd.DataFrame, offline: pd.DataFrame, *, vocab: int, before: str, after: str, final: str,
                 labels: Mapping[str, str]) -> str:
    """What exp2 pre-scaling (``before`` -> ``after``) did at ``vocab`` (time and stack at the same registers), and
    whether the offline compiles at the other vocabularies keep the order of the stacks of ``before``, ``after`` and
    ``final``."""
    w = walk.set_index("variant")
    b, a = w.loc[before], w.loc[after]
    verdict = ("costs more than the multiplies it saves" if a["ms"] > b["ms"] else "pays for itself")
    text = (f"At {_k(vocab)}, pre-scaling by log2(e) leaves {int(a['n_regs'])} registers "
            f"({'the same' if a['n_regs'] == b['n_regs'] else 'not the same'} as before) and takes the stack from "
            f"{int(b['stack_bytes'])} to {int(a['stack_bytes'])} B: the extra spilling {verdict} "
            f"({a['ms'] / b['ms']:.2f}× the time).")
    order_here = sorted((before, after, final), key=lambda v: w.loc[v, "stack_bytes"])
    others = offline[(offline["vocab"] != vocab) & offline["variant"].isin([before, after, final])]
    for other_vocab, part in others.groupby("vocab"):
        stack = part.drop_duplicates("variant").set_index("variant")["spill_bytes"]
        if not {before, after, final} <= set(stack.index):
            continue
        order = sorted((before, after, final), key=lambda v: stack[v])
        stacks = listing(f"{labels[v]} {int(stack[v])} B" for v in order)
        same = "the same order as" if order == order_here else "an order other than"
        kept = (stack[after] > stack[before]) == (w.loc[after, "stack_bytes"] > w.loc[before, "stack_bytes"])
        still = "still" if kept else "no longer"
        text += (f" Offline at {_k(other_vocab)} (compiled, not timed) the stacks are {stacks}: {same} at {_k(vocab)}, "
                 f"{labels[after]} {still} above {labels[before]}.")
    return text


def fixes_reading(fixes: pd.DataFrame, *, real: str, peer: str, head: str, option_a: str, option_b: str,
                  tokens: int, quoted_peaks: Mapping[int, float] | None = None,
                  tolerance: float = 0.02) -> str:
    """Memory and time of the fixes: peaks against the gradient (and the issue's quoted torch.compile peaks), which
    fixes spill and beat ``peer``, ``option_a`` against ``option_b``, ``head`` against both. Cases are named by the
    part of their label before a colon ("Option A: fused, 16K cap" -> "Option A")."""
    def short(case: str) -> str:
        return case.split(":")[0].split(" (")[0]

    ms = fixes.pivot(index="vocab", columns="case", values="ms")
    peak = fixes.pivot(index="vocab", columns="case", values="peak_with_grad_bytes") / 2**30
    stack = fixes.pivot(index="vocab", columns="case", values="stack_bytes")
    grad = pd.Series({v: tokens * v * 2 / 2**30 for v in ms.index})  # bf16 gradient, GiB
    triton = [c for c in ms.columns if c != peer]
    parts = []
    over_grad = peak[triton].div(grad, axis=0)
    parts.append(f"Every Triton variant's peak is {span(over_grad.stack(), '.2f')}× its gradient "
                 f"({listing(f'{grad[v]:.2f} GiB at {_k(v)}' for v in grad.index)}); {peer}'s, with its gradient "
                 f"counted, {span(peak[peer] / grad, '.2f')}× it")
    if quoted_peaks:
        quoted = pd.Series(quoted_peaks)
        diff = (peak[peer].reindex(quoted.index) - quoted).abs()
        said = "the issue's quoted Δpeak" if (diff <= 0.01).all() else "against the issue's quoted Δpeak"
        parts[-1] += f", {said} ({listing(f'{q:.2f} GiB at {_k(v)}' for v, q in quoted.items())})"
    text = parts[0] + "."
    fixes_named = [option_a, option_b]
    spill_free = [c for c in fixes_named if (stack[c].fillna(0) == 0).all()]
    beats = [c for c in fixes_named if (ms[c] < ms[peer]).all()]
    speed = 1 / ms[fixes_named].div(ms[peer], axis=0)
    free = listing(short(c) for c in spill_free) or "Neither proposed fix"
    text += (f" {free} keep{'s' if len(spill_free) == 1 else ''} no stack at any vocabulary (the #497 kernel: "
             f"{span(stack[real], '.0f')} B); {listing(short(c) for c in beats) or 'neither'} "
             f"beat{'s' if len(beats) == 1 else ''} {peer} at every vocabulary ({span(speed.stack())}× its speed).")
    a, b = short(option_a), short(option_b)
    a_over_b = ms[option_a] / ms[option_b]
    text += (f" {a} ({option_a.split(': ')[-1]}) against {b} ({option_b.split(': ')[-1]}, which reads the logits "
             "twice): " + listing(f"{compared(r, tolerance)} it at {_k(v)} ({_times(r)} its time)"
                                  for v, r in a_over_b.items()) + ".")
    if head in ms:
        head_b, head_a = ms[head] / ms[option_b], ms[head] / ms[option_a]
        text += (f" {head} takes " + listing(f"{_times(hb)} {b}'s time and {_times(ha)} {a}'s at {_k(v)}"
                                             for v, hb, ha in zip(ms.index, head_b, head_a)) + ".")
    fastest = ms.idxmin(axis=1)
    text += (" Fastest per vocabulary: " + listing(f"{c} at {_k(v)}" for v, c in fastest.items()) + ".")
    return text


def other_losses_reading(tables: Mapping[str, pd.DataFrame], reverse: pd.DataFrame, *, real: str,
                         fixes: Sequence[str]) -> str:
    """For each other loss (``tables``: a case x vocab frame of % of copy): where the #497 kernel ranks and how far
    it trails the best of ``fixes``, against the same for reverse KL (``reverse``, same shape)."""
    def gap(table: pd.DataFrame) -> pd.Series:
        return table.loc[list(fixes)].max() / table.loc[real]

    parts = []
    for label, table in tables.items():
        rank = table.rank(ascending=False, method="min").loc[real].astype(int)
        g = gap(table)
        ranks = listing(f"{r} of {len(table)} at {_k(v)}" for v, r in rank.items())
        parts.append(f"{label}: the #497 kernel ranks {ranks}; the best fix reaches {span(g)}× its % of copy")
    return ("; ".join(parts) + f" (reverse KL: {span(gap(reverse))}×).")
