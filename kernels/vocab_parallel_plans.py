"""The vocab-parallel planners, beside the one-GPU ones (fused.py, split_row.py, two_pass.py): a rank's
:class:`VocabParallelProblem` and a design (see :mod:`kernels.vocab_parallel`) -> the steps of
its call, a :class:`VocabParallelPlan`. The designs' kernels are in :mod:`kernels.vocab_parallel_gather` and
:mod:`kernels.vocab_parallel_exchange`.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.distributed as dist
import triton

from .launch import Launch, interpreting
from .peer_memory import peer_buffers
from .problem import (LOSS_CODES, MAX_BLOCK_SIZE, MIN_BLOCK_SIZE, Problem, allocate_outputs, check_block_size,
                      check_num_warps, finisher, next_power_of_2)
from .prologue import prologue_launch
from .split_row import cooperative_slots, default_split_row_config
from .two_pass import default_two_pass_config
from .vocab_parallel_exchange import (LAG_STEPS, TIMEOUT_MESSAGE, check_timeout, exchange_epilogue_kernel,
                                      exchange_kernel)
from .vocab_parallel_gather import gather_grad_kernel, gather_stats_kernel

DEFAULT_TIMEOUT_S = 30.0  # the longest a symmetric-design program waits for one row's summaries
INTERPRETER_POLLS_PER_S = 1000  # the interpreter has no clock: a wait is counted in polls (about 1 ms each)
OPTIONS = {"all_gather": (), "symmetric": ("timeout_s", "lag", "poll_first")}
CE_LABELS_CODE = LOSS_CODES[("cross_entropy", "labels")]


@dataclass
class VocabParallelProblem:
    """A loss call on one rank's slice of the vocabulary: the local :class:`~kernels.problem.Problem` plus where the
    slice lies in the whole vocabulary."""

    problem: Problem  # n_cols = V_local
    group: Any
    rank: int
    world_size: int

    @property
    def vocab(self) -> int:
        return self.problem.n_cols * self.world_size

    @property
    def col_offset(self) -> int:
        return self.rank * self.problem.n_cols



def summary_width(loss_code: int) -> int:
    """Words of one slice's row summary: (m_x, s_x, label logit) for cross-entropy from labels, else
    (m_x, s_x, m_t, s_t, acc)."""
    return 3 if loss_code == CE_LABELS_CODE else 5


def all_gather_into(output: torch.Tensor, tensor: torch.Tensor, group) -> None:
    """Every rank's ``tensor`` into ``output`` (rank-major), one collective."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # torch >= 2.13 renames it
    gather(output, tensor, group=group)


@dataclass
class Collective:
    """A plan step that is not a kernel: an all-gather of ``send`` into ``recv`` over ``group``."""

    name: str
    send: torch.Tensor
    recv: torch.Tensor
    group: Any

    def __call__(self) -> None:
        all_gather_into(self.recv, self.send, self.group)


@dataclass
class VocabParallelPlan:
    """The steps of one vocab-parallel call (the prologue first), run in order by ``run()`` -> (loss, grad)."""

    design: str
    steps: list  # Launch | Collective
    finish: Callable[[], tuple[Any, Any]]
    config: dict = field(default_factory=dict)
    buffers: dict = field(default_factory=dict, repr=False)  # workspace, grad, loss, send, recv, peers, state
    problem: VocabParallelProblem | None = field(default=None, repr=False)

    @property
    def launches(self) -> list[Launch]:
        return [step for step in self.steps if isinstance(step, Launch)]

    def run(self) -> tuple[Any, Any]:
        for step in self.steps:
            step()
        return self.finish()


def _prologue(vp: VocabParallelProblem, workspace, loss) -> Launch:
    """The project's prologue, with labels checked against the whole vocabulary."""
    launch = prologue_launch(vp.problem, workspace, loss)
    launch.args["n_cols"] = vp.vocab
    return launch


def plan_all_gather(vp: VocabParallelProblem, block_size: int | None, num_warps: int | None) -> VocabParallelPlan:
    problem = vp.problem
    default_block, default_warps = default_two_pass_config(problem.n_cols)  # a stats pass, then a gradient pass
    block_size = check_block_size(block_size) if block_size is not None else default_block
    num_warps = check_num_warps(num_warps) if num_warps is not None else default_warps
    width = summary_width(problem.loss_code)
    workspace, loss, grad = allocate_outputs(problem)
    device = problem.logits.device
    send = torch.zeros(problem.n_rows * width, dtype=torch.float32, device=device)
    recv = torch.empty(vp.world_size * problem.n_rows * width, dtype=torch.float32, device=device)
    steps: list = [_prologue(vp, workspace, loss)]
    if problem.n_rows:
        steps += [
            Launch("vocab_parallel.stats", gather_stats_kernel, (problem.n_rows,),
                   dict(problem.input_args(), send_ptr=send, ignore_index=problem.ignore_index,
                        col_offset=vp.col_offset),
                   dict(LOSS=problem.loss_code, HAS_MASK=problem.mask is not None, WIDTH=width, BLOCK_SIZE=block_size),
                   num_warps=num_warps),
            Collective("vocab_parallel.all_gather", send, recv, vp.group),
            Launch("vocab_parallel.grad", gather_grad_kernel, (problem.n_rows,),
                   dict(problem.loss_args(workspace, loss, grad), recv_ptr=recv, col_offset=vp.col_offset),
                   dict(problem.loss_constexprs(), TP=vp.world_size, TP_POW2=max(2, next_power_of_2(vp.world_size)),
                        WIDTH=width, BLOCK_SIZE=block_size),
                   num_warps=num_warps),
        ]
    return VocabParallelPlan(
        "all_gather", steps, finisher(problem, loss, grad),
        {"block_size": block_size, "num_warps": num_warps, "summary_words": width},
        dict(workspace=workspace, grad=grad, loss=loss, send=send, recv=recv), vp,
    )


def default_exchange_config(n_cols: int) -> tuple[int, int]:
    """split_row's default chunks (4K columns, 4 warps); the interpreter runs one program per rank, so one chunk."""
    if interpreting():
        return max(next_power_of_2(n_cols), MIN_BLOCK_SIZE), 4
    return default_split_row_config(n_cols)


def check_exchange_options(timeout_s, lag, poll_first) -> tuple[float, int, bool | None]:
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not 0 < timeout_s < 3600 \
            or not math.isfinite(timeout_s):
        raise ValueError(f"timeout_s must be a number of seconds in (0, 3600), got {timeout_s!r}")
    if isinstance(lag, bool) or not isinstance(lag, int) or not 1 <= lag <= 8:
        raise ValueError(f"lag must be an int in [1, 8] (steps between reading a row and finishing it), got {lag!r}")
    if poll_first not in (None, True, False):
        raise TypeError(f"poll_first must be None, True or False, got {poll_first!r}")
    return float(timeout_s), lag, poll_first


def plan_symmetric(vp: VocabParallelProblem, block_size: int | None, num_warps: int | None, *,
                   timeout_s: float = DEFAULT_TIMEOUT_S, lag: int = LAG_STEPS,
                   poll_first: bool | None = None) -> VocabParallelPlan:
    problem = vp.problem
    timeout_s, lag, poll_first = check_exchange_options(timeout_s, lag, poll_first)
    default_block, default_warps = default_exchange_config(problem.n_cols)
    block_size = check_block_size(block_size) if block_size is not None else default_block
    num_warps = check_num_warps(num_warps) if num_warps is not None else default_warps
    num_chunks = triton.cdiv(problem.n_cols, block_size)
    on_interpreter = interpreting()
    if on_interpreter and num_chunks > 1:
        raise ValueError(
            f"under the Triton interpreter the symmetric design runs one program per rank, so one chunk must cover "
            f"the slice: block_size >= {problem.n_cols} (at most {MAX_BLOCK_SIZE}), got {block_size}"
        )
    width = summary_width(problem.loss_code)
    lanes = vp.world_size * num_chunks
    half_words = max(problem.n_rows, 1) * width * lanes
    workspace, loss, grad = allocate_outputs(problem)
    buffers = dict(workspace=workspace, grad=grad, loss=loss)
    steps: list = [_prologue(vp, workspace, loss)]
    config = {"block_size": block_size, "num_warps": num_warps, "num_chunks": num_chunks, "summary_words": width,
              "lag": lag, "timeout_s": timeout_s}
    if problem.n_rows:
        peers = peer_buffers(vp.group, problem.logits.device, 2 * half_words)
        if peers.rank != vp.rank or peers.world_size != vp.world_size:
            raise RuntimeError(f"symmetric memory numbers this rank {peers.rank} of {peers.world_size}, the group "
                               f"{vp.rank} of {vp.world_size}")
        poll_first = poll_first if poll_first is not None else problem.loss_code == CE_LABELS_CODE
        main = Launch(
            "vocab_parallel.exchange", exchange_kernel, (num_chunks,),
            dict(problem.loss_args(workspace, loss, grad), peers_ptr=peers.table, state_ptr=peers.state, n_slots=1,
                 col_offset=vp.col_offset, rank=vp.rank, half_words=half_words,
                 wait_limit=(max(1, int(timeout_s * INTERPRETER_POLLS_PER_S)) if on_interpreter
                             else int(timeout_s * 1e9))),
            dict(problem.loss_constexprs(), TP=vp.world_size, NUM_CHUNKS=num_chunks,
                 LANES_POW2=max(2, next_power_of_2(lanes)), WIDTH=width, BLOCK_SIZE=block_size, LAG=lag,
                 POLL_FIRST=poll_first, TIMER=not on_interpreter),
            num_warps=num_warps,
        )
        if not on_interpreter:  # a persistent grid no larger than what the GPU holds at once (split_row's sizing)
            n_slots, resident = cooperative_slots(main, problem.n_rows, num_chunks)
            if n_slots < 1:
                raise ValueError(f"the symmetric design cannot run: a row needs {num_chunks} programs at once but the "
                                 f"device holds only {resident} of this kernel; use a larger block_size")
            main.grid = (n_slots * num_chunks,)
            config.update(programs=n_slots * num_chunks, resident_programs=resident)
        steps += [main, Launch("vocab_parallel.epilogue", exchange_epilogue_kernel, (1,), dict(state_ptr=peers.state),
                               dict(MESSAGE=TIMEOUT_MESSAGE), num_warps=1)]
        if not problem.logits.is_cuda:
            steps.append(functools.partial(check_timeout, peers.state))
        buffers.update(peers=peers.table, state=peers.state)
        config.update(exchange_backing=peers.backing, peers_words=2 * half_words)
    return VocabParallelPlan("symmetric", steps, finisher(problem, loss, grad), config, buffers, vp)


def resolve_design(tp_design: str, vp: VocabParallelProblem, hosts: set[str] | None) -> str:
    if tp_design != "auto":
        return tp_design
    on_one_host = hosts is not None and len(hosts) == 1
    return "symmetric" if vp.problem.logits.is_cuda and on_one_host and not interpreting() else "all_gather"


def check_options(design: str, options: dict) -> None:
    unknown = sorted(set(options) - set(OPTIONS[design]))
    if unknown:
        raise TypeError(f"tp_design {design!r} does not take option(s) {unknown} (it takes {list(OPTIONS[design])})")


def plan_vocab_parallel(vp: VocabParallelProblem, design: str, block_size, num_warps, options: dict
                        ) -> VocabParallelPlan:
    check_options(design, options)
    if design == "all_gather":
        return plan_all_gather(vp, block_size, num_warps)
    return plan_symmetric(vp, block_size, num_warps, **options)
