"""From a checked problem to a plan: the variants' planners, and auto's choice of one."""

from __future__ import annotations

from .auto import choose_config
from .fused import plan_fused
from .launch import Plan
from .prologue import prologue_launch
from .split_row import plan_split_row
from .two_pass import plan_two_pass

PLANNERS = {"fused": plan_fused, "two_pass": plan_two_pass, "split_row": plan_split_row}
VARIANTS = ("auto", *PLANNERS)


def plan_problem(problem, variant: str, block_size, num_warps, variant_options: dict) -> Plan:
    if variant in ("auto", "split_row"):
        choice = choose_config(problem, PLANNERS, variant=variant, block_size=block_size, num_warps=num_warps,
                               **variant_options)
        variant, block_size, num_warps, variant_options = (
            choice.variant, choice.block_size, choice.num_warps, choice.options
        )
    planner = PLANNERS[variant]
    try:
        plan = planner(problem, block_size, num_warps, **variant_options)
    except TypeError as error:
        if "unexpected keyword" in str(error):
            raise TypeError(f"variant {variant!r} does not take option(s) {sorted(variant_options)}") from None
        raise
    if problem.n_rows == 0:  # empty batch: no loss kernel; a prologue writes the loss (0)
        workspace, _grad, loss = plan.buffers[:3]
        plan.launches = []
        plan.reset = None
        plan.prologue = prologue_launch(problem, workspace, loss)
    return plan
