"""NVIDIA's command-line tools (ptxas, cuobjdump, nvdisasm; Triton ships them in its wheel): running them.

* Finding a tool and its version is the data room's (:func:`perfutils.data.metadata.find_cuda_tool`,
  :func:`~perfutils.data.metadata.tool_version`, :func:`~perfutils.data.metadata.ptxas_in_use`): every sidecar
  records the ptxas in use.
* :func:`pin_bundled_ptxas` makes every compile of a process use Triton's own ptxas (torch.compile would switch it
  to torch's).
* :func:`rerun_ptxas` runs ``ptxas -v`` on a kernel's PTX with Triton's flags (for the spill counts of a kernel
  taken from Triton's cache), :func:`disassemble` / :func:`sass_from_cubin` turn a cubin into SASS text.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import tempfile

from ..data.metadata import find_cuda_tool, triton_bin_dir

__all__ = [
    "pin_bundled_ptxas",
    "ptxas_path",
    "sm_arch",
    "run_tool",
    "rerun_ptxas",
    "disassemble",
    "sass_from_cubin",
]


def pin_bundled_ptxas() -> str | None:
    """Make every compile of this process use Triton's bundled ptxas, unless TRITON_PTXAS_PATH is set.

    torch.compile (Inductor) sets TRITON_PTXAS_PATH to torch's own ptxas the first time it compiles,
    when the variable is unset; kernels compiled before and after it in one process then come from
    different ptxas versions. Seen on the H100 (torch 2.11: ptxas 13.0 vs Triton 3.6's 12.8): the
    split_row reverse-KL kernel, 4096-column chunks, 4 warps, took 123 registers instead of 151.
    Measurements pin one ptxas and record it (``ptxas_in_use``).
    """
    if os.environ.get("TRITON_PTXAS_PATH"):
        return os.environ["TRITON_PTXAS_PATH"]
    bundled = triton_bin_dir()
    path = os.path.join(bundled, "ptxas") if bundled else None
    if path and os.path.isfile(path) and os.access(path, os.X_OK):
        os.environ["TRITON_PTXAS_PATH"] = path
        return path
    return None


def ptxas_path(arch: int) -> str | None:
    # Triton picks a separate ptxas for Blackwell; mirror that choice when the helper exists.
    try:
        from triton.backends.nvidia.compiler import get_ptxas

        path = get_ptxas(arch).path
        if path and os.path.isfile(path):
            return path
    except Exception:
        pass
    return find_cuda_tool("ptxas")


def sm_arch(arch: int) -> str:
    try:
        from triton.backends.nvidia.compiler import sm_arch_from_capability

        return sm_arch_from_capability(arch)
    except Exception:
        return f"sm_{arch}{'a' if arch >= 90 else ''}"


def run_tool(cmd: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def rerun_ptxas(ptx: str, arch: int, fp_fusion: bool, extra_options: str | None = None) -> str | None:
    """``ptxas -v`` with Triton's flags, for the spill store/load counts when Triton's log was not captured
    (a kernel taken from Triton's on-disk cache never runs ptxas)."""
    ptxas = ptxas_path(arch)
    if ptxas is None:
        return None
    with tempfile.TemporaryDirectory(prefix="perfutils_ptxas_") as tmp:
        src = os.path.join(tmp, "kernel.ptx")
        with open(src, "w") as handle:
            handle.write(ptx)
        extra = extra_options.split() if extra_options else []  # PTXAS_OPTIONS / ptx_options, as Triton passes
        cmd = [ptxas, "-lineinfo", *([] if fp_fusion else ["--fmad=false"]), "-v", *extra,
               f"--gpu-name={sm_arch(arch)}", src, "-o", os.path.join(tmp, "kernel.cubin")]
        try:
            done = run_tool(cmd)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout + done.stderr if done.returncode == 0 else None


_ENCODING_COMMENT = re.compile(r"\s*/\*\s*0x[0-9a-f]{16}\s*\*/\s*$")


def disassemble(cubin_path: str) -> str | None:
    """SASS text: nvdisasm (clean) or cuobjdump -sass with the hex encodings stripped."""
    nvdisasm = find_cuda_tool("nvdisasm")
    if nvdisasm:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            done = run_tool([nvdisasm, "-c", cubin_path])
            if done.returncode == 0 and done.stdout.strip():
                return done.stdout
    cuobjdump = find_cuda_tool("cuobjdump")
    if cuobjdump:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            done = run_tool([cuobjdump, "-sass", cubin_path])
            if done.returncode == 0 and done.stdout.strip():
                lines = (_ENCODING_COMMENT.sub("", line) for line in done.stdout.splitlines())
                return "\n".join(line for line in lines if line.strip()) + "\n"
    return None


def sass_from_cubin(cubin: bytes, name: str) -> str | None:
    with tempfile.TemporaryDirectory(prefix="perfutils_cubin_") as tmp:
        path = os.path.join(tmp, f"{name or 'kernel'}.cubin")
        with open(path, "wb") as handle:
            handle.write(cubin)
        return disassemble(path)
