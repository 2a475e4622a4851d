"""Vocab-parallel (tensor-parallel) losses: the logits' vocabulary split over the ranks of a process group.

    loss, grad = kernels.entropy_loss_forward_backward(logits_slice, target, group=tp_group, loss=..., ...)
    loss = kernels.entropy_loss(logits_slice, target, group=tp_group, ...); loss.backward()

Rank r of a group of tp ranks holds ``logits[..., V_local]``, the columns [r * V_local, (r + 1) * V_local) of a
vocabulary of V = tp * V_local (every rank the same V_local: V must be divisible by tp), and, for the
target-distribution losses, the same slice of the target logits. Labels are global ids in [0, V) (or
ignore_index); labels, loss_mask and grad_output are the same on every rank. Every rank returns the same loss (the
mean over the rows that count, bit-identical on every rank) and the gradient of that loss with respect to its own
slice: the concatenation of the ranks' gradients is the single-GPU gradient on the whole vocabulary.

Two designs (``tp_design``):

* ``"all_gather"`` (:mod:`kernels.vocab_parallel_gather`): local statistics, one all-gather of the packed per-row
  summaries (3 or 5 floats per row and rank), a gradient kernel that reads the slice again. Any backend (NCCL,
  gloo), any placement of the ranks.
* ``"symmetric"`` (:mod:`kernels.vocab_parallel_exchange`): one kernel per rank reads each logit once from DRAM and
  exchanges the per-row summaries with its peers' kernels directly, through symmetric memory over NVLink
  (:mod:`kernels.peer_memory`); no collective launch, bounded waits. Ranks of one host only. Without block_size
  and num_warps, the ranks time its chunk sizes together at the first call of a shape class and keep the fastest
  (:mod:`kernels.vocab_parallel_search`, cached on disk like auto's search).
* ``"auto"``: symmetric on CUDA when every rank of the group runs on one host (checked at the first call of a shape)
  and the interpreter is off; all_gather otherwise.

DRAM bytes per rank and element of the slice (bf16), against the minimum of one read of every input and one write
of the gradient (see :func:`bytes_per_rank`): cross-entropy from labels 6 (all_gather) or 4 (symmetric) vs 4;
the target-distribution losses 10 or 6 vs 6.

Host side: the first call of a shape (and options) on a group checks, on the host, that every rank makes the same
call (through the group's key-value store, not a collective: shapes, dtypes, loss, options, a ValueError naming what
differs) and builds the launches; later calls fill a stored template (:mod:`kernels.dispatch`), launch the compiled
kernels directly, and nothing in them synchronizes with the host. The first call must not be inside a CUDA-graph
capture (it compiles, allocates symmetric memory and talks to the peers); later calls can be captured. All calls of one
group must come from one stream per rank (like NCCL's). ``validate=True`` also checks on the host, each call, that
every rank makes the same call, that labels lie in [0, V) and that labels, loss_mask and grad_output are the same on
every rank (a ValueError on every rank; a few collectives and a sync).

Ranks whose calls differ once a call is cached: a cached call is not checked across the ranks again (that would take
host communication every call). A rank whose call is new (another ignore_index, say) while its peers' calls are cached
waits for their signatures in the store, up to the group's timeout, and then raises a ValueError naming what differs
from their last checked call; it starts no collective they do not join. Under gloo the cached ranks' collective fails
after the same timeout and they raise the same ValueError. Under NCCL their collective is asynchronous: nothing raises
on them, and NCCL's watchdog ends them at the group's timeout (the symmetric design's kernel gives up after
``timeout_s`` with a device-side assert). Differing labels, loss_mask or grad_output values in cached calls give a
wrong loss (a row two ranks count differently gives NaN). Call with ``validate=True`` while a training set-up is new,
or whenever ranks may disagree.

torch.compile: the calls go through the operator ``torch.ops.fused_loss.vocab_parallel_forward_backward``
(registered in :mod:`kernels.ops` with the others; the group travels by name); its collectives run inside the
operator, which graphs hold as one opaque call.
"""

from __future__ import annotations

import json
import socket
import weakref
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import triton

from . import vocab_parallel_search
from .dispatch import GRAD_OUTPUT_VALUE, ROLES, TemplateCache, call_key, call_tensors, in_graph_pool
from .launch import can_launch_directly
from .peer_memory import group_barrier, peer_buffers
from .problem import build_problem
from .vocab_parallel_plans import (Collective, VocabParallelPlan, VocabParallelProblem, all_gather_into, check_options,
                                   default_exchange_config, plan_symmetric, plan_vocab_parallel, resolve_design)

TP_DESIGNS = ("auto", "all_gather", "symmetric")
# Extra per-call tensors of a template, after kernels.dispatch.ROLES.
TP_ROLES = ROLES + ("send", "recv", "peers", "state")
SEND, RECV, PEERS, STATE = (TP_ROLES.index(role) for role in ("send", "recv", "peers", "state"))


# --------------------------------------------------------------------------------------------------------------
# Arguments
# --------------------------------------------------------------------------------------------------------------


def check_group(group) -> None:
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("group= needs an initialized torch.distributed (torch.distributed.init_process_group)")
    if not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"group must be a torch.distributed.ProcessGroup (or None), got {type(group).__name__}")
    if group.rank() < 0:
        raise ValueError("this process is not a member of group: only the group's ranks may call the loss with it")


def build_vocab_parallel_problem(logits, target, *, group, loss, target_format, grad_output, ignore_index,
                                 loss_mask) -> VocabParallelProblem:
    check_group(group)
    problem = build_problem(logits, target, loss=loss, target_format=target_format, grad_output=grad_output,
                            ignore_index=ignore_index, loss_mask=loss_mask)
    return VocabParallelProblem(problem, group, group.rank(), group.size())


def call_signature(vp: VocabParallelProblem, design: str, config: tuple) -> dict:
    """What every rank's call must agree on (checked at the first call of a shape)."""
    problem = vp.problem
    return {
        "rows": problem.n_rows,
        "vocab per rank": problem.n_cols,
        "logits dtype": str(problem.logits.dtype),
        "target dtype": str(problem.target.dtype) if problem.target is not None else None,
        "loss": (problem.loss, problem.target_format),
        "ignore_index": problem.ignore_index,
        "loss_mask given": problem.mask is not None,
        "gradient": problem.compute_grad,
        "grad_output kind": "tensor" if problem.grad_output_tensor is not None else "number",
        "tp_design": design,
        "configuration": config,
        "device type": problem.logits.device.type,
    }


def check_same_call(vp: VocabParallelProblem, signature: dict) -> set[str]:
    """Every rank's signature: a ValueError on every rank naming what differs; returns the host names of the ranks (the
    symmetric design needs one host)."""
    mine = dict(signature, host=socket.gethostname())
    store, timeout_s = group_store(vp.group)
    if store is None:  # a torch that keeps the group's store elsewhere: one collective, as before
        everyone: list = [None] * vp.world_size
        dist.all_gather_object(everyone, mine, group=vp.group)
    else:
        everyone = _exchange_signatures(vp, store, timeout_s, mine)
    differences = signature_differences([{name: entry[name] for name in signature} for entry in everyone])
    if differences:
        raise ValueError(
            "the ranks of the group made different vocab-parallel loss calls (every rank holds its slice of the same "
            "vocabulary, V = tp * V_local, so every rank must pass the same shapes and options; V must be divisible "
            "by tp): " + "; ".join(differences)
        )
    return {entry["host"] for entry in everyone}


# How many calls this rank has checked on a group: the count names the store keys of the next check. Every rank checks
# the same calls in the same order, so the counts agree. Weak keys: an entry must not keep a destroyed group alive.
_CHECKED_CALLS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def group_store(group) -> tuple[Any, float | None]:
    """(the group's key-value store, the group's timeout in seconds), or (None, None) where this torch keeps them
    elsewhere."""
    try:
        store = dist.distributed_c10d._get_process_group_store(group)
    except (AttributeError, KeyError, RuntimeError):
        return None, None
    timeout = store.timeout
    for device_type in ("cuda", "cpu"):  # the backend's own timeout (a group may have another than the store's)
        try:
            timeout = group._get_backend(torch.device(device_type)).options._timeout
            break
        except (AttributeError, RuntimeError):
            continue
    return store, timeout.total_seconds()


def _signature_key(count: int, rank: int) -> str:
    return f"fused_loss/vocab_parallel_call/{count}/{rank}"


def _exchange_signatures(vp: VocabParallelProblem, store, timeout_s: float, mine: dict) -> list[dict]:
    """Every rank's signature through the store: post this rank's, wait for the others' (bounded by the group's
    timeout). No collective, so a rank whose peers' calls are cached raises here instead of starting a collective they
    never join."""
    posted = json.dumps(mine, default=str)
    mine = json.loads(posted)  # as the store gives it back (tuples become lists)
    count = _CHECKED_CALLS.get(vp.group, 0)
    _CHECKED_CALLS[vp.group] = count + 1
    keys = [_signature_key(count, rank) for rank in range(vp.world_size)]
    store.set(keys[vp.rank], posted)
    try:
        store.wait(keys, timedelta(seconds=timeout_s))
    except RuntimeError as error:
        absent = [rank for rank, key in enumerate(keys) if not store.check([key])]
        entries = [_read_signature(store, _signature_key(count - 1, rank)) if rank in absent else mine
                   for rank in range(vp.world_size)]
        known = all(entry is not None for entry in entries)
        differences = signature_differences([{name: entry[name] for name in mine if name != "host"}
                                             for entry in entries]) if known else []
        raise ValueError(
            f"the ranks of the group made different vocab-parallel loss calls: rank(s) {absent} did not make this call "
            f"within the group's timeout ({timeout_s:g} s); their calls are cached with other arguments, or they are "
            "elsewhere. " + ("Their last checked call differs: " + "; ".join(differences) if differences
                             else "This rank's call: " + posted)
        ) from error
    if count >= 2:  # every rank has read the keys of two checks ago (it posted the last check's after reading them)
        store.delete_key(_signature_key(count - 2, vp.rank))
    return [json.loads(store.get(key)) for key in keys]


def _read_signature(store, key: str) -> dict | None:
    return json.loads(store.get(key)) if store.check([key]) else None


def signature_differences(entries: list[dict]) -> list[str]:
    """'name: rank 0 value, rank 1 value' for every signature entry on which the ranks differ."""
    differences = []
    for name in entries[0]:
        values = [entry[name] for entry in entries]
        if any(value != values[0] for value in values):
            differences.append(f"{name}: " + ", ".join(f"rank {rank} {value!r}" for rank, value in enumerate(values)))
    return differences


def peer_made_another_call(vp: VocabParallelProblem, signature: dict) -> ValueError | None:
    """Why this rank's cached call failed in its collective, when a peer posted a new call's signature that this rank
    did not make (see :func:`_exchange_signatures`): the ValueError naming what differs, else None."""
    store, _timeout = group_store(vp.group)
    if store is None:
        return None
    count = _CHECKED_CALLS.get(vp.group, 0)
    try:
        posted = {rank: _read_signature(store, _signature_key(count, rank)) for rank in range(vp.world_size)
                  if rank != vp.rank}
    except RuntimeError:  # the store is gone too (a peer's exit): nothing to add to the collective's own error
        return None
    if not any(posted.values()):
        return None
    mine = json.loads(json.dumps(signature, default=str))  # compared as the store holds them
    entries = [{name: (posted.get(rank) or mine)[name] for name in mine} for rank in range(vp.world_size)]
    return ValueError(
        "the ranks of the group made different vocab-parallel loss calls: rank(s) "
        f"{[rank for rank, entry in posted.items() if entry]} made a call that this rank did not (this rank's call was "
        "cached, so its collective ran alone): " + "; ".join(signature_differences(entries) or ["(no difference named)"])
    )


def check_labels_and_mask(vp: VocabParallelProblem) -> None:
    """validate=True: labels in [0, V) or ignore_index, and labels, loss_mask and grad_output identical on every rank.
    Two collectives and a sync; the same ValueError on every rank."""
    problem = vp.problem
    device = problem.logits.device
    local = []
    if problem.labels is not None:
        labels = problem.labels.long()
        bad = ((labels < 0) | (labels >= vp.vocab)) & (labels != problem.ignore_index)
        local.append(("labels", labels))
    else:
        bad = torch.zeros(problem.n_rows, dtype=torch.bool, device=device)
    if problem.mask is not None:
        local.append(("loss_mask", problem.mask.long()))
    if problem.compute_grad:  # the number or the tensor's value, as float64 (a NaN grad_output differs from itself)
        value = (problem.grad_output_tensor.double() if problem.grad_output_tensor is not None
                 else torch.tensor(problem.grad_output, dtype=torch.float64, device=device))
        local.append(("grad_output", value.reshape(1)))
    flags = torch.zeros(1 + len(local), device=device)
    flags[0] = bad.sum()
    for index, (name, values) in enumerate(local):
        gathered = torch.empty(vp.world_size * values.numel(), dtype=values.dtype, device=device)
        all_gather_into(gathered, values.contiguous(), vp.group)
        rows = gathered.view(vp.world_size, -1)
        flags[1 + index] = (rows != rows[:1]).any().float()
    dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=vp.group)
    count, *differ = (float(value) for value in flags.tolist())
    if count:
        raise ValueError(f"target (labels) must lie in [0, {vp.vocab}) (the whole vocabulary, tp * V_local) or equal "
                         f"ignore_index={problem.ignore_index}; a rank holds {int(count)} that do not")
    differing = [name for (name, _), flag in zip(local, differ) if flag]
    if differing:
        raise ValueError(f"{' and '.join(differing)} differ between the ranks of the group: every rank must pass the "
                         "same labels, loss_mask and grad_output (only the logits are split over the vocabulary)")


# --------------------------------------------------------------------------------------------------------------
# Repeated calls: templates
# --------------------------------------------------------------------------------------------------------------


@dataclass
class _AllGatherSlot:
    group: Any

    def __call__(self, tensors: list, stream: int) -> None:
        all_gather_into(tensors[RECV], tensors[SEND], self.group)


@dataclass
class VocabParallelTemplate:
    """A first call's plan with its per-call tensors taken out (see kernels.dispatch.CallTemplate): a repeated call
    allocates the loss and the gradient and runs the stored direct launches and collective. Workspace and
    all-gather buffers are kept between calls (calls of a group come from one stream), fresh under graph capture."""

    steps: list
    shapes: dict  # role -> shape of the kept buffers
    grad_shape: tuple | None
    grad_dtype: torch.dtype
    out_shape: tuple
    device: torch.device
    peers_words: int
    group: Any
    kept: dict = field(default_factory=dict)

    def run(self, rows, target, labels, mask, grad_output, grad_output_value: float):
        device = self.device
        stream = torch._C._cuda_getCurrentRawStream(device.index)
        loss = torch.empty((), dtype=torch.float32, device=device)
        grad = torch.empty(self.grad_shape, dtype=self.grad_dtype, device=device) if self.grad_shape else None
        capturing = torch.cuda.is_current_stream_capturing()
        kept = {}
        for role, shape in self.shapes.items():
            buffer = None if capturing else self.kept.get(role)
            if buffer is None:
                buffer = torch.empty(shape, dtype=torch.float32, device=device)
                if not in_graph_pool(device.index, stream):
                    self.kept[role] = buffer
            kept[role] = buffer
        tensors: list = [rows, target, labels, mask, grad_output, grad, kept["workspace"], loss, grad_output_value,
                         kept.get("send"), kept.get("recv"), None, None]
        if self.peers_words:
            peers = peer_buffers(self.group, device, self.peers_words)  # a dictionary lookup once allocated
            tensors[PEERS], tensors[STATE] = peers.table, peers.state
        for step in self.steps:
            step(tensors, stream)
        return loss, (grad.view(self.out_shape) if grad is not None else None)


def make_template(vp: VocabParallelProblem, plan: VocabParallelPlan) -> VocabParallelTemplate | None:
    problem = vp.problem
    if not can_launch_directly(problem.logits.device):
        return None
    buffers = plan.buffers
    by_identity = {}
    for role, tensor in zip(TP_ROLES, (problem.logits, problem.target, problem.labels, problem.mask,
                                       problem.grad_output_tensor, buffers.get("grad"), buffers["workspace"],
                                       buffers["loss"], None, buffers.get("send"), buffers.get("recv"),
                                       buffers.get("peers"), buffers.get("state"))):
        if tensor is not None:
            by_identity.setdefault(id(tensor), TP_ROLES.index(role))
    steps = []
    for step in plan.steps:
        if isinstance(step, Collective):
            steps.append(_AllGatherSlot(step.group))
            continue
        direct = step.direct(by_identity, {"grad_output": GRAD_OUTPUT_VALUE})
        if direct is None:
            return None
        steps.append(direct)
    grad = buffers.get("grad")
    shapes = {role: tuple(buffers[role].shape) for role in ("workspace", "send", "recv") if role in buffers}
    peers = buffers.get("peers")
    return VocabParallelTemplate(
        steps, shapes, tuple(grad.shape) if grad is not None else None, problem.logits.dtype, problem.out_shape,
        problem.logits.device, plan.config.get("peers_words", 0) if peers is not None else 0, vp.group,
    )


TEMPLATES = TemplateCache()
# The calls checked across the ranks, (group, signature) -> the hosts the ranks run on; bounded like the call
# templates (token counts that vary per step would otherwise add an entry per count, forever). Every rank makes the
# same calls in the same order (the collectives need it), so every rank evicts the same entries and re-checks the same
# calls together.
_HOSTS = TemplateCache()


# --------------------------------------------------------------------------------------------------------------
# The call
# --------------------------------------------------------------------------------------------------------------


def _check_design(tp_design) -> str:
    if tp_design not in TP_DESIGNS:
        raise ValueError(f"tp_design must be one of {', '.join(map(repr, TP_DESIGNS))}, got {tp_design!r}")
    return tp_design


def forward_backward(logits, target, loss_mask, grad_output_tensor, grad_output: float, call):
    """The operator's implementation (``call``: a :class:`kernels.ops.CallOptions` with its group): (loss, grad) on
    this rank (an empty grad when compute_grad is false)."""
    group = call.group
    # keyed by the group's name, not the object: a cache entry must not keep a destroyed process group alive until the
    # interpreter exits (gloo's destructor then aborted a CPU rank: "terminate called without an active exception")
    key = call_key(logits, target, loss_mask, grad_output_tensor, call._replace(group=group.group_name))
    template = TEMPLATES.get(key)
    grad_value = (grad_output_tensor if grad_output_tensor is not None
                  else (grad_output if call.compute_grad else None))
    if template:
        if call.validate:  # the same checks as a first call's (prepare), so every rank runs the same collectives
            vp = build_vocab_parallel_problem(logits, target, group=group, loss=call.loss,
                                              target_format=call.target_format, grad_output=grad_value,
                                              ignore_index=call.ignore_index, loss_mask=loss_mask)
            agree_on_call(vp, call.tp_design, call.block_size, call.num_warps, call.variant_options(), again=True)
            check_labels_and_mask(vp)
        tensors = call_tensors(logits, target, call.target_format, loss_mask, grad_output_tensor)
        try:
            result, grad = template.run(*tensors, float(grad_output))
        except RuntimeError as error:  # a peer that made another call (no cost until then: try is free)
            raise _explained(error, logits, target, loss_mask, grad_value, call)
        return result, (grad if grad is not None else logits.new_empty(0))
    if logits.is_cuda and torch.cuda.is_current_stream_capturing():
        raise RuntimeError("the first vocab-parallel call of a shape cannot be captured in a CUDA graph (it compiles, "
                           "allocates symmetric memory and checks the ranks' calls on the host): call it once before "
                           "capturing")
    plan = prepare(logits, target, group=group, loss=call.loss, target_format=call.target_format,
                   tp_design=call.tp_design, block_size=call.block_size, num_warps=call.num_warps,
                   grad_output=grad_value, ignore_index=call.ignore_index, loss_mask=loss_mask, validate=call.validate,
                   **call.variant_options())
    if plan.design == "symmetric" and template is False:  # a first call: every rank has compiled the kernel that
        group_barrier(group, logits.device)  # waits for its peers; start them together
    try:
        result, grad = plan.run()
    except RuntimeError as error:
        raise _explained(error, logits, target, loss_mask, grad_value, call)
    if template is False and not (logits.is_cuda and torch.cuda.is_current_stream_capturing()):
        TEMPLATES.put(key, make_template(plan.problem, plan))
    return result, (grad if grad is not None else logits.new_empty(0))


def agree_on_call(vp: VocabParallelProblem, tp_design: str, block_size, num_warps, options: dict, *,
                  again: bool) -> set[str]:
    """Check that every rank makes this call (a ValueError on every rank naming what differs), once per call
    signature, or ``again`` (validate=True: every call, so that a rank whose call is cached and one whose call is new
    still check together). Returns the ranks' host names."""
    signature = full_signature(vp, tp_design, block_size, num_warps, options)
    agreed = (vp.group.group_name, json.dumps(signature, sort_keys=True, default=str))
    hosts = None if again else _HOSTS.get(agreed, None)
    if hosts is None:
        hosts = check_same_call(vp, signature)
        _HOSTS.put(agreed, hosts)
    return hosts


def full_signature(vp: VocabParallelProblem, tp_design: str, block_size, num_warps, options: dict) -> dict:
    return call_signature(vp, tp_design, (block_size, num_warps, json.dumps(options, sort_keys=True, default=str)))


def _explained(error: RuntimeError, logits, target, loss_mask, grad_value, call) -> Exception:
    """A call's collective failed: the ValueError naming what differs when a peer made another call (caused by
    ``error``), else ``error`` itself."""
    vp = build_vocab_parallel_problem(logits, target, group=call.group, loss=call.loss,
                                      target_format=call.target_format, grad_output=grad_value,
                                      ignore_index=call.ignore_index, loss_mask=loss_mask)
    signature = full_signature(vp, call.tp_design, call.block_size, call.num_warps, call.variant_options())
    explained = peer_made_another_call(vp, signature)
    if explained is None:
        return error
    explained.__cause__ = error
    return explained


def prepare(logits, target, *, group, loss: str = "cross_entropy", target_format: str = "labels",
            tp_design: str = "auto", block_size=None, num_warps=None, grad_output=1.0, ignore_index: int = -100,
            loss_mask=None, validate: bool = False, **options) -> VocabParallelPlan:
    """Check the arguments (the first call of a shape also checks that every rank makes the same call: collective)
    and build the steps of one call without running them; ``plan.run()`` -> (loss, grad), callable again (every rank
    must run it the same number of times)."""
    _check_design(tp_design)
    vp = build_vocab_parallel_problem(logits, target, group=group, loss=loss, target_format=target_format,
                                      grad_output=grad_output, ignore_index=ignore_index, loss_mask=loss_mask)
    hosts = agree_on_call(vp, tp_design, block_size, num_warps, options, again=validate)
    if validate:
        check_labels_and_mask(vp)
    design = resolve_design(tp_design, vp, hosts)
    check_options(design, options)  # before the search plans candidates with them
    source, plan = None, None
    if design == "symmetric" and block_size is None and num_warps is None:  # the ranks choose the chunks together
        block_size, num_warps, source, plan = vocab_parallel_search.choose(
            vp, lambda block, warps: plan_symmetric(vp, block, warps, **options),
            default_exchange_config(vp.problem.n_cols))
    if plan is None:  # a searched call runs the plan it timed
        plan = plan_vocab_parallel(vp, design, block_size, num_warps, options)
    if source is not None:
        plan.config["source"] = source
    return plan


def check_call(group, variant, tp_design) -> None:
    """What the public calls check of ``group``, ``variant`` and ``tp_design``, beyond their own argument checks."""
    if group is None:
        if tp_design != "auto":
            raise ValueError(f"tp_design={tp_design!r} needs group= (a torch.distributed process group over which the "
                             "vocabulary is split)")
        return
    check_group(group)
    if variant != "auto":
        raise ValueError(f"with group=, variant must be 'auto' (got {variant!r}): the vocab-parallel losses have their "
                         "own kernels; choose them with tp_design='all_gather' or 'symmetric'")
    _check_design(tp_design)


# --------------------------------------------------------------------------------------------------------------
# Bytes
# --------------------------------------------------------------------------------------------------------------


def bytes_per_rank(design: str, *, loss: str, target_format: str, n_rows: int, vocab: int, world_size: int,
                   element_size: int = 2, num_chunks: int | None = None) -> dict:
    """The bytes one rank moves for one call, by design ("tp1" for one GPU holding the whole vocabulary).

    ``min``: one read of every input element and one write of the gradient (labels, masks, summaries are noise);
    ``dram``: the design's DRAM traffic (all_gather reads its slices twice; symmetric and tp1 at the minimum, the
    second read coming from L2); ``sent`` / ``received``: bytes leaving / reaching the rank's GPU for the exchange
    (NCCL's ring all-gather moves (tp - 1) shares each way; the symmetric design's NVLink stores, 8-byte tagged
    words); ``polled``: the symmetric design's reads of its own exchange buffer (L2, at least once per word and
    chunk); ``collectives``: collective launches per call."""
    inputs = 1 if target_format == "labels" else 2
    width = 3 if target_format == "labels" else 5
    v_local = vocab // world_size if design != "tp1" else vocab
    elements = n_rows * v_local
    minimum = elements * element_size * (inputs + 1)
    result = {"min": minimum, "dram": minimum, "sent": 0, "received": 0, "polled": 0, "collectives": 0}
    if design == "all_gather":
        share = n_rows * width * 4
        result.update(dram=elements * element_size * (2 * inputs + 1), sent=(world_size - 1) * share,
                      received=(world_size - 1) * share, collectives=1)
    elif design == "symmetric":
        chunks = num_chunks or triton.cdiv(v_local, 4096)
        words = n_rows * chunks * width * 8
        result.update(sent=(world_size - 1) * words, received=(world_size - 1) * words,
                      polled=n_rows * chunks * world_size * chunks * width * 8)
    elif design != "tp1":
        raise ValueError(f"design must be 'tp1', 'all_gather' or 'symmetric', got {design!r}")
    return result
