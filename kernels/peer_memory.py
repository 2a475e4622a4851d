"""Memory every rank of a process group can write: the exchange buffers of the vocab-parallel "symmetric" design.

Each rank allocates the same number of int64 words; every rank's kernel gets a table with the address of every
rank's buffer (its own included), as this process sees it, and writes its row summaries straight into its peers'
buffers (see :mod:`kernels.vocab_parallel_exchange`). Two backings:

* CUDA: PyTorch's symmetric memory (``torch.distributed._symmetric_memory``): ``empty`` + ``rendezvous`` map the
  peers' allocations into this process over NVLink (peer-to-peer); ``buffer_ptrs`` are the addresses. NVLink
  multicast is never used: it can put a shared host's GPUs out of service. ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1`` is
  set before the first rendezvous (another value there is refused with an error), and nothing here asks for a
  multicast address.
* CPU (the Triton interpreter, which the CI tests run): files in ``/dev/shm`` that every rank of one host maps with
  ``MAP_SHARED``; the files are unlinked once all ranks have mapped them.

A buffer is allocated on the first call that needs it, and again (larger) when a call needs more; that is a
collective step (every rank of the group must make the same call, which the losses' own collectives require
anyway). It zeroes the new buffer and waits for every rank to have done so before any kernel can write into it.
Buffers that were replaced are kept alive to the end of the process: a peer's kernel may still be writing into
one when this rank moves on. Each buffer comes with a small per-rank ``state`` (int32: the calls completed, which
tags every word a call writes, and a timeout flag).
"""

from __future__ import annotations

import os
import tempfile
import threading
import uuid
import warnings
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

MULTICAST_ENV = "TORCH_SYMM_MEM_DISABLE_MULTICAST"
STATE_WORDS = 2  # [0] calls completed on this buffer (the next call's tag is it + 1), [1] timeout flag


@dataclass
class PeerBuffers:
    """One group's exchange memory as this rank sees it."""

    local: torch.Tensor  # (words,) int64, this rank's buffer (peers write into it)
    table: torch.Tensor  # (world_size,) int64 addresses of every rank's buffer, on the kernels' device
    state: torch.Tensor  # (STATE_WORDS,) int32 on the kernels' device (not shared)
    rank: int
    world_size: int
    backing: str  # "cuda-symmetric-memory" | "cpu-shared-file"
    keep: list = field(default_factory=list, repr=False)  # handles and mappings that must outlive the kernels

    @property
    def words(self) -> int:
        return self.local.numel()


_BUFFERS: dict[tuple, PeerBuffers] = {}
_RETIRED: list[PeerBuffers] = []  # replaced buffers, kept mapped (a peer may still write into them)
_LOCK = threading.Lock()


def peer_buffers(group, device: torch.device, words: int) -> PeerBuffers:
    """This group's exchange memory on ``device`` with at least ``words`` int64 words per rank (collective when it
    has to allocate: every rank of ``group`` must call it with the same ``words``)."""
    key = (group.group_name, device)
    with _LOCK:
        current = _BUFFERS.get(key)
        if current is not None and current.words >= words:
            return current
        words = max(words, 2 * current.words) if current is not None else words
        fresh = _allocate(group, device, words)
        if current is not None:
            fresh.state.copy_(current.state)  # keep the call count: every rank replaces its buffer at the same call
            _RETIRED.append(current)
        _BUFFERS[key] = fresh
        return fresh


def _allocate(group, device: torch.device, words: int) -> PeerBuffers:
    if device.type == "cuda":
        return _cuda_buffers(group, device, words)
    if device.type == "cpu":
        return _shared_file_buffers(group, device, words)
    raise ValueError(f"the symmetric vocab-parallel design needs CUDA or CPU tensors, got device {device}")


def forbid_multicast() -> None:
    """Make sure PyTorch's symmetric memory never creates an NVLink multicast object (set the switch, or refuse)."""
    value = os.environ.get(MULTICAST_ENV)
    if value is None:
        os.environ[MULTICAST_ENV] = "1"
    elif value.strip() != "1":
        raise RuntimeError(
            f"{MULTICAST_ENV}={value!r}: the vocab-parallel losses never use NVLink multicast (it can put a shared "
            f"host's GPUs out of service). Set {MULTICAST_ENV}=1 (and NCCL_NVLS_ENABLE=0 for NCCL), or use "
            "tp_design='all_gather'"
        )


def _cuda_buffers(group, device: torch.device, words: int) -> PeerBuffers:
    forbid_multicast()
    try:
        from torch.distributed import _symmetric_memory as symm_mem
    except ImportError as error:  # a torch built without it
        raise RuntimeError(f"tp_design='symmetric' needs torch.distributed._symmetric_memory ({error}); "
                           "use tp_design='all_gather'") from None
    name = group.group_name
    enabled = getattr(symm_mem, "is_symm_mem_enabled_for_group", None)
    if enabled is not None and not enabled(name):  # needed by older torch; a deprecated no-op on newer ones
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            symm_mem.enable_symm_mem_for_group(name)
    with torch.cuda.device(device):
        local = symm_mem.empty(words, dtype=torch.int64, device=device)
        handle = symm_mem.rendezvous(local, name)
        local.zero_()
        table = torch.tensor([int(address) for address in handle.buffer_ptrs], dtype=torch.int64, device=device)
        state = torch.zeros(STATE_WORDS, dtype=torch.int32, device=device)
        torch.cuda.synchronize(device)
    group_barrier(group, device)  # every rank's buffer is zero before any kernel writes into it
    return PeerBuffers(local, table, state, handle.rank, handle.world_size, "cuda-symmetric-memory", [handle])


def _shared_file_buffers(group, device: torch.device, words: int) -> PeerBuffers:
    rank, world_size = group.rank(), group.size()
    folder = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    path = os.path.join(folder, f"fused-loss-peer-{uuid.uuid4().hex}-rank{rank}")
    local = torch.from_file(path, shared=True, size=words, dtype=torch.int64)  # a new file reads as zeros
    paths: list = [None] * world_size
    dist.all_gather_object(paths, path, group=group)
    views = [local if peer == rank else torch.from_file(paths[peer], shared=True, size=words, dtype=torch.int64)
             for peer in range(world_size)]
    group_barrier(group, device)  # everyone has mapped every file: the names can go
    os.unlink(path)
    table = torch.tensor([view.data_ptr() for view in views], dtype=torch.int64)
    state = torch.zeros(STATE_WORDS, dtype=torch.int32)
    return PeerBuffers(local, table, state, rank, world_size, "cpu-shared-file", views)


def group_barrier(group, device: torch.device) -> None:
    """Every rank of ``group`` has reached this point, and this rank's device work before it is done."""
    token = torch.zeros(1, dtype=torch.float32, device=device)
    dist.all_reduce(token, group=group)
    float(token)  # waits for the collective (and for this device's work queued before it)
