"""Everything needed to interpret a measurement later: GPU, clocks, software versions (the ptxas in use
too: :func:`find_cuda_tool`), git state.

``collect_metadata`` never raises because a probe failed: each probe is guarded, a field it could
not fill is ``None``, and the reason goes to ``probe_errors`` (so a missing ``nvidia-smi`` is
visible in the sidecar instead of silently absent). On a machine without CUDA the GPU fields are
``None`` and ``device`` is ``"cpu"``.
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import json
import math
import os
import platform
import re
import shutil
import socket
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .schema import utc_now

__all__ = ["collect_metadata", "PROJECT_ROOT", "find_cuda_tool", "tool_version", "ptxas_in_use", "triton_bin_dir",
           "KERNEL_SOURCES", "TWO_GPU_FILES", "sources_digest", "git_sources_digest", "git_sources_digests"]

# The checkout this package lives in: git state is read from here, not from the working directory.
PROJECT_ROOT = Path(__file__).resolve().parents[2]

# nvidia-smi fields -> our keys. Clocks are in MHz, power in W.
_SMI_FIELDS = {
    "name": "smi_name",
    "driver_version": "driver_version",
    "clocks.sm": "sm_clock_mhz",
    "clocks.mem": "mem_clock_mhz",
    "clocks.max.sm": "sm_clock_max_mhz",
    "clocks.max.mem": "mem_clock_max_mhz",
    "clocks.applications.graphics": "sm_clock_app_mhz",
    "power.limit": "power_limit_w",
    "persistence_mode": "persistence_mode",
}


def _run(command: list[str], timeout: float = 10.0) -> str:
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {result.returncode}: {result.stderr.strip()[:200]}")
    return result.stdout


# The CUDA toolchain Triton compiles with: found here, in the data room, because every sidecar records its
# ptxas; perfutils.model.cuda_tools runs these tools.

def triton_bin_dir() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    return path if os.path.isdir(path) else None


def find_cuda_tool(name: str) -> str | None:
    """Path of ``ptxas``/``cuobjdump``/``nvdisasm``: Triton's choice, its bundled copy, PATH, /usr/local/cuda."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty str, got {name!r}")
    candidates: list[str] = []
    # Triton's own resolution first, so we use the very ptxas that produced the cubin (TRITON_PTXAS_PATH etc.).
    try:
        from triton import knobs

        tool = getattr(knobs.nvidia, name.replace("-", "_"))
        candidates.append(tool.path)
    except Exception:  # older Triton without knobs, or no such knob
        pass
    bundled = triton_bin_dir()
    if bundled:
        candidates.append(os.path.join(bundled, name))
    on_path = shutil.which(name)
    if on_path:
        candidates.append(on_path)
    candidates.append(os.path.join("/usr/local/cuda/bin", name))
    for path in candidates:
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


@functools.lru_cache(maxsize=None)
def tool_version(path: str) -> str | None:
    try:
        text = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"V(\d+\.\d+\.\d+)", text)
    if match:
        return match.group(1)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else None


def ptxas_in_use() -> dict:
    """The ptxas Triton compiles with now (path and version), for measurement metadata."""
    path = find_cuda_tool("ptxas")
    return {"ptxas_path": path, "ptxas_version": tool_version(path) if path else None}


def _number_or_text(text: str) -> Any:
    text = text.strip()
    if text in ("", "[N/A]", "N/A", "[Not Supported]"):
        return None
    try:
        value = float(text)
    except ValueError:
        return text
    return int(value) if value.is_integer() else value


def _probe_torch(meta: dict[str, Any], errors: dict[str, str], device_index: int) -> None:
    import torch

    meta["torch_version"] = torch.__version__
    meta["cuda_version"] = torch.version.cuda
    if not torch.cuda.is_available():
        return
    props = torch.cuda.get_device_properties(device_index)
    meta["device"] = "cuda"
    meta["device_index"] = device_index
    meta["gpu_name"] = props.name
    meta["compute_capability"] = [props.major, props.minor]
    meta["sm_count"] = props.multi_processor_count
    meta["l2_bytes"] = getattr(props, "L2_cache_size", None)
    meta["total_memory_bytes"] = props.total_memory
    uuid = getattr(props, "uuid", None)
    meta["gpu_uuid"] = str(uuid) if uuid is not None else None


def _probe_nvidia_smi(meta: dict[str, Any], device_index: int) -> None:
    if shutil.which("nvidia-smi") is None:
        raise RuntimeError("nvidia-smi not found on PATH")
    query = ",".join(_SMI_FIELDS)
    out = _run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits", "-i", str(device_index)])
    values = [part.strip() for part in out.strip().splitlines()[0].split(",")]
    if len(values) != len(_SMI_FIELDS):
        raise RuntimeError(f"nvidia-smi returned {len(values)} fields for {len(_SMI_FIELDS)} queried: {out.strip()[:200]}")
    for key, value in zip(_SMI_FIELDS.values(), values):
        meta[key] = _number_or_text(value)


# The commit the measured code came from, named by whoever copied the tree to the GPU machine: a copy whose .git is
# older than its files records an old git_commit with git_dirty True (the H100 sweeps of 2026-11-23 to -25 did).
CODE_COMMIT_ENV = "FUSED_LOSS_CODE_COMMIT"


def commit_hash(value: str, where: str) -> str:
    """``value`` stripped when it is a git commit hash (7 to 40 lowercase hex digits); else a ValueError naming
    ``where`` it came from."""
    if not re.fullmatch(r"[0-9a-f]{7,40}", value.strip()):
        raise ValueError(f"{where} must hold a git commit hash (7 to 40 lowercase hex digits), got {value[:60]!r}")
    return value.strip()


def _code_commit() -> str | None:
    value = os.environ.get(CODE_COMMIT_ENV)
    return None if value is None else commit_hash(value, CODE_COMMIT_ENV)


def _probe_git(meta: dict[str, Any]) -> None:
    if shutil.which("git") is None:
        raise RuntimeError("git not found on PATH")
    root = str(PROJECT_ROOT)
    # Dirty first: it works even before the first commit, when rev-parse HEAD fails.
    status = _run(["git", "-C", root, "status", "--porcelain"])  # untracked files count: they may be code
    meta["git_dirty"] = bool(status.strip())
    meta["git_commit"] = _run(["git", "-C", root, "rev-parse", "HEAD"]).strip()


KERNEL_SOURCES = ("kernels",)  # what "the same code" means for a measurement: the kernels' sources
# The vocabulary split's own files: a measurement on one GPU never runs them, so the pages compare one-GPU data on the
# kernels' other files (sources_digest(exclude=TWO_GPU_FILES)) and two-GPU data on all of them.
TWO_GPU_FILES = ("kernels/vocab_parallel*", "kernels/peer_memory.py")


def _kept(path: str, exclude) -> bool:
    return not any(fnmatch.fnmatchcase(path, pattern) for pattern in exclude)


def _digest(entries) -> str:
    return hashlib.sha256("".join(f"{path} {blob}\n" for path, blob in sorted(entries)).encode()).hexdigest()[:16]


@functools.cache
def process_id() -> str:
    """This Python process, the same in every sidecar session it writes: host, pid and the UTC time of its first ask
    (a pid is reused). One process may record several sessions (a vocab-sweep run walks its stages, one session
    each), and several processes run side by side: the pages count and pair processes by this."""
    return f"{socket.gethostname()}:{os.getpid()}:{utc_now()}"


def sources_digest(paths=KERNEL_SOURCES, root: Path = PROJECT_ROOT, exclude=()) -> str:
    """The files under ``paths`` (folders relative to ``root``) as they are on disk, less those matching a pattern of
    ``exclude`` (e.g. :data:`TWO_GPU_FILES`): a hash over each file's path and git blob id (``__pycache__`` left out,
    as git ignores it). :func:`git_sources_digest` gives the same for a commit, so a sidecar's ``kernel_sources``
    names the kernels that measured it even where the measuring machine's ``.git`` lagged behind its files (its
    ``git_commit`` then names an older commit)."""
    entries = []
    for top in paths:
        for file in (Path(root) / top).rglob("*"):
            name = file.relative_to(root).as_posix()
            if file.is_file() and "__pycache__" not in file.parts and _kept(name, exclude):
                data = file.read_bytes()
                entries.append((name, hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()))
    return _digest(entries)


def git_sources_digest(commit: str, paths=KERNEL_SOURCES, root: Path = PROJECT_ROOT, exclude=()) -> str | None:
    """:func:`sources_digest` of ``paths`` (less ``exclude``) at ``commit`` (None where git cannot answer)."""
    digests = git_sources_digests(commit, paths, root, (exclude,))
    return None if digests is None else digests[0]


def git_sources_digests(commit: str, paths=KERNEL_SOURCES, root: Path = PROJECT_ROOT, excludes=((),)) -> list | None:
    """:func:`git_sources_digest` for each exclusion of ``excludes``, from one listing of the commit's tree."""
    try:
        listing = _run(["git", "-C", str(root), "ls-tree", "-r", commit, "--", *paths])
    except Exception:  # noqa: BLE001 - no git, or a commit it does not hold
        return None
    blobs = [(path, fields.split()[2]) for fields, path in (line.split("\t", 1) for line in listing.splitlines())
             if fields.split()[1] == "blob"]
    return [_digest([(path, blob) for path, blob in blobs if _kept(path, exclude)]) for exclude in excludes]


def _json_safe(value: Any, where: str) -> Any:
    """Parameters go into a JSON file: check that now, not when the sweep ends."""
    try:
        json.dumps(value, allow_nan=False, default=str)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"collect_metadata: {where} cannot be stored as JSON ({exc})") from None
    return json.loads(json.dumps(value, default=str))


def collect_metadata(
    parameters: Mapping[str, Any] | None = None,
    copy_gbps: float | None = None,
    *,
    device_index: int = 0,
) -> dict[str, Any]:
    """Describe this machine and checkout for a data file's JSON sidecar.

    Args:
        parameters: the study's parameters (sweep config), stored verbatim.
        copy_gbps: measured device-to-device copy bandwidth in GB/s (1e9 B/s), or ``None``.
        device_index: which CUDA device was measured.

    Keys: ``timestamp_utc, device ("cuda"|"cpu"), gpu_name, compute_capability [major, minor],
    sm_count, l2_bytes, total_memory_bytes, driver_version, sm_clock_mhz, mem_clock_mhz,
    sm_clock_max_mhz, mem_clock_max_mhz, sm_clock_app_mhz, power_limit_w, cuda_version,
    torch_version, triton_version, python_version, platform, git_commit, git_dirty, kernel_sources
    (:func:`sources_digest`), copy_gbps, parameters, process (:func:`process_id`), probe_errors``; and
    ``code_commit`` when ``$FUSED_LOSS_CODE_COMMIT`` names the commit the code came from (a ValueError when it is not
    a commit hash: a wrong provenance is worse than none).
    """
    code_commit = _code_commit()
    if parameters is None:
        parameters = {}
    if not isinstance(parameters, Mapping):
        raise TypeError(f"collect_metadata: parameters must be a dict, got {type(parameters).__name__}")
    if copy_gbps is not None:
        if isinstance(copy_gbps, bool) or not isinstance(copy_gbps, (int, float)) or not math.isfinite(copy_gbps) or copy_gbps <= 0:
            raise ValueError(f"collect_metadata: copy_gbps must be a positive number of GB/s or None, got {copy_gbps!r}")
        copy_gbps = float(copy_gbps)
    if isinstance(device_index, bool) or not isinstance(device_index, int) or device_index < 0:
        raise ValueError(f"collect_metadata: device_index must be a non-negative int, got {device_index!r}")

    meta: dict[str, Any] = {
        "timestamp_utc": utc_now(),
        "device": "cpu",
        "gpu_name": None,
        "compute_capability": None,
        "sm_count": None,
        "l2_bytes": None,
        "total_memory_bytes": None,
        **{key: None for key in _SMI_FIELDS.values() if key != "smi_name"},
        "cuda_version": None,
        "torch_version": None,
        "triton_version": None,
        "ptxas_path": None,
        "ptxas_version": None,
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "git_commit": None,
        "git_dirty": None,
        "copy_gbps": copy_gbps,
        "parameters": _json_safe(dict(parameters), "parameters"),
    }
    errors: dict[str, str] = {}

    try:
        _probe_torch(meta, errors, device_index)
    except Exception as exc:  # a broken driver must not stop us from recording what we can
        errors["torch"] = f"{type(exc).__name__}: {exc}"
    try:
        import triton

        meta["triton_version"] = triton.__version__
    except Exception as exc:
        errors["triton"] = f"{type(exc).__name__}: {exc}"
    try:  # register counts (and speed) depend on the ptxas version, not only on Triton's
        meta.update(ptxas_in_use())
    except Exception as exc:
        errors["ptxas"] = f"{type(exc).__name__}: {exc}"
    if meta["device"] == "cuda":
        try:
            _probe_nvidia_smi(meta, device_index)
        except Exception as exc:
            errors["nvidia_smi"] = f"{type(exc).__name__}: {exc}"
        meta.pop("smi_name", None)  # same as gpu_name; torch's spelling is the one we key on
    try:
        _probe_git(meta)
    except Exception as exc:
        errors["git"] = f"{type(exc).__name__}: {exc}"
    try:  # the kernels as they are on this machine, whatever its .git says
        meta["kernel_sources"] = sources_digest()
    except Exception as exc:
        errors["kernel_sources"] = f"{type(exc).__name__}: {exc}"
    if code_commit is not None:
        meta["code_commit"] = code_commit
    meta["process"] = process_id()
    meta["probe_errors"] = errors
    return meta
