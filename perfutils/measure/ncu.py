"""The one Nsight Compute (``ncu``) runner and its parsers, for every study that profiles with it.

:func:`find_ncu` finds the CLI, :func:`ncu_command` builds a run (no clock locking, the named kernels only, the
sections and metrics asked for), :func:`run_ncu_command` runs it in its own process group (killed on timeout),
:func:`ncu_failure_reason` says why a run gave nothing. Two parsers read what it prints: :func:`parse_ncu_csv`
(``--csv``: one row per launch, values in base units) and :func:`parse_ncu_text` (the text report of ``--section``:
one row per launch, section and metric). Nothing here needs a GPU but the run itself. Studies:
:mod:`perfutils.studies.profile_ncu` (notebook 08), :mod:`perfutils.studies.case_497` (notebook 02).
"""

from __future__ import annotations

import csv
import io
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

__all__ = ["find_ncu", "ncu_command", "unit_scale", "parse_ncu_csv", "parse_ncu_text", "ncu_version", "run_ncu_command",
           "ncu_failure_reason"]


def find_ncu() -> str | None:
    """Path of the Nsight Compute CLI: ``ncu`` on PATH, else the usual CUDA install locations."""
    found = shutil.which("ncu")
    if found:
        return found
    candidates = [Path("/usr/local/cuda/bin/ncu")]
    candidates += sorted(Path("/opt/nvidia/nsight-compute").glob("*/ncu"), reverse=True)
    candidates += sorted(Path("/usr/local").glob("cuda-*/bin/ncu"), reverse=True)
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def ncu_command(ncu: str, kernel_names: Sequence[str], metrics: Sequence[str], script: str,
                script_args: Sequence[str], *, sections: Sequence[str] = (), launch_count: int | None = None,
                follow_children: bool = True, csv_output: bool = True, python: str = sys.executable) -> list[str]:
    """The ncu command line: no clock locking, only the named kernels (and their first ``launch_count`` launches),
    the ``sections`` and ``metrics``; child processes followed and CSV output unless told otherwise. The profiled
    program is ``python script *script_args`` (``script`` may be ``-m`` and the arguments a module's)."""
    names = sorted({re.escape(name) for name in kernel_names})
    if not names:
        raise ValueError("ncu_command: no kernel names to profile")
    command = [ncu, "--clock-control", "none"] + (["--target-processes", "all"] if follow_children else [])
    for section in sections:
        command += ["--section", section]
    command += ["-k", "regex:" + "|".join(names)] + (["-c", str(launch_count)] if launch_count else [])
    command += ["--metrics", ",".join(metrics)] + (["--csv"] if csv_output else [])
    return command + [python, script, *map(str, script_args)]


_TIME_UNITS_NS = {"nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6,
                  "second": 1e9, "s": 1e9}
_BYTE_UNITS = {"byte": 1.0, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "tbyte": 1e12,
               "kibyte": 1024.0, "mibyte": 1024.0**2, "gibyte": 1024.0**3}


def _plain_number(value: str | None) -> float | None:
    """A number as ncu prints it (thousands separators, a decimal comma outside the C locale); None if not one."""
    text = (value or "").strip().replace("\u202f", "").replace(" ", "")
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", text):  # thousands separators: 1,024 / 1,048,576.5
        text = text.replace(",", "")
    elif re.fullmatch(r"-?\d+,\d+", text):  # a decimal comma (non-C locale)
        text = text.replace(",", ".")
    try:
        return float(text)
    except ValueError:
        return None


def unit_scale(unit: str | None) -> float:
    """What one ``unit`` of an ncu metric is in base units: nanoseconds for times, bytes for sizes (else 1)."""
    unit = (unit or "").strip().lower()
    return _TIME_UNITS_NS.get(unit, _BYTE_UNITS.get(unit, 1.0))


def _ncu_number(value: str, unit: str) -> float:
    """A metric value as a float in base units (ns, bytes); NaN when it is not a number."""
    number = _plain_number(value)
    return float("nan") if number is None else number * unit_scale(unit)


def parse_ncu_csv(text: str) -> pd.DataFrame:
    """Parse ``ncu --csv`` output (one line per kernel launch and metric) into one row per launch.

    Lines before the header (``==PROF==`` messages, the application's own output) and any non-CSV
    line are ignored. Columns: ncu_id, kernel, block, grid (as ncu prints them, when present), then
    one column per metric named as in ncu, with values in base units (time in ns, sizes in bytes,
    percentages in %). Returns an empty frame when the text holds no metric table.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.lstrip().startswith('"ID"')), None)
    if start is None:
        return pd.DataFrame(columns=["ncu_id", "kernel"])
    body = [lines[start].strip()] + [line.strip() for line in lines[start + 1:] if line.lstrip().startswith('"')]
    reader = csv.DictReader(io.StringIO("\n".join(body) + "\n"))
    required = {"ID", "Kernel Name", "Metric Name", "Metric Value"}
    if not required.issubset(reader.fieldnames or []):
        raise ValueError(f"ncu CSV header lacks {sorted(required - set(reader.fieldnames or []))}: {body[0][:200]}")
    launches: dict[int, dict[str, Any]] = {}
    for record in reader:
        try:
            launch_id = int(str(record["ID"]).strip())
        except ValueError:
            continue
        entry = launches.setdefault(launch_id, {"ncu_id": launch_id, "kernel": record["Kernel Name"]})
        for column, target in (("Block Size", "block"), ("Grid Size", "grid")):
            if record.get(column):
                entry.setdefault(target, record[column])
        entry[record["Metric Name"]] = _ncu_number(record["Metric Value"], record.get("Metric Unit", ""))
    if not launches:
        return pd.DataFrame(columns=["ncu_id", "kernel"])
    return pd.DataFrame([launches[k] for k in sorted(launches)])


_KERNEL_LINE = re.compile(r"^\s+(?P<kernel>\S+) \((?P<grid>[\d, ]+)\)x\((?P<block>[\d, ]+)\), Context \d+, Stream \d+, "
                          r"Device \d+, CC [\d.]+\s*$")
_SECTION_LINE = re.compile(r"^\s+Section: (?P<section>.+?)\s*$")
_DASHES = re.compile(r"^(\s*)(-+)( -+)( -+)\s*$")


def _ncu_value(text: str) -> float | str | None:
    """A text report's cell: a float when it is a number, else the text (None when empty)."""
    number = _plain_number(text)
    return number if number is not None else (text.strip() or None)


def parse_ncu_text(text: str) -> pd.DataFrame:
    """Parse ncu's text report into one row per (label, kernel launch, section, metric).

    Understands what ``ncu --section ... --metrics ...`` prints: optional ``=== <label>`` lines written by
    :func:`perfutils.studies.case_497.run_ncu` before each run, a kernel header
    (``name (grid)x(block), Context .., Device .., CC 9.0``),
    ``Section: <name>`` headers, and metric tables whose columns are given by the dashed rule under
    ``Metric Name / Metric Unit / Metric Value``. Rule messages (OPT/INF/WRN) are skipped. Columns: label,
    launch (0-based within the text), kernel, grid, block, section, metric, unit, value (float when numeric).
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    rows, label, launch, kernel, grid, block, section, columns = [], None, -1, None, None, None, None, None
    for line in text.splitlines():
        if line.startswith("=== "):
            label, kernel, section, columns = line[4:].strip(), None, None, None
            continue
        match = _KERNEL_LINE.match(line)
        if match:
            launch += 1
            kernel, grid, block = match["kernel"], f"({match['grid']})", f"({match['block']})"
            section, columns = None, None
            continue
        match = _SECTION_LINE.match(line)
        if match and kernel is not None:
            section, columns = match["section"], None
            continue
        match = _DASHES.match(line)
        if match and section is not None:
            start = len(match.group(1))
            name_end = start + len(match.group(2))
            unit_end = name_end + len(match.group(3))
            columns = (start, name_end, unit_end) if columns is None else columns  # the rule above the header
            continue
        if columns is None or kernel is None or not line.strip():
            continue
        start, name_end, unit_end = columns
        if line[:start].strip() or re.match(r"^\s*(OPT|INF|WRN|ERR)\s", line) or line.strip() == "Metric Name":
            continue
        while name_end < len(line) and not line[name_end].isspace():  # a name wider than its column
            name_end += 1
        name = line[start:name_end].strip()
        if not name or name.startswith("Metric Name"):
            continue
        unit, value = line[name_end:unit_end].strip(), line[unit_end:].strip()
        if not value and unit and _ncu_value(unit) is not None and not isinstance(_ncu_value(unit), str):
            unit, value = "", unit  # a value that spilled left into the unit column
        rows.append(dict(label=label, launch=launch, kernel=kernel, grid=grid, block=block, section=section,
                         metric=name, unit=unit, value=_ncu_value(value)))
    return pd.DataFrame(rows, columns=["label", "launch", "kernel", "grid", "block", "section", "metric", "unit",
                                       "value"])



def ncu_version(ncu: str) -> str | None:
    """The last line of ``ncu --version`` (None when it cannot run)."""
    try:
        result = subprocess.run([ncu, "--version"], capture_output=True, text=True, timeout=30, check=False)
    except Exception:
        return None
    lines = [line.strip() for line in result.stdout.splitlines() if line.strip()]
    return lines[-1] if lines else None


def run_ncu_command(command: list[str], timeout_s: float, cwd: str) -> tuple[int | None, str, str]:
    """Run ncu in its own process group; on timeout kill that group. (returncode or None, stdout, stderr)."""
    env = dict(os.environ, LC_ALL="C", LANG="C", PYTHONUNBUFFERED="1")
    env.pop("TRITON_INTERPRET", None)
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd, env=env,
                               start_new_session=True)
    try:
        out, err = process.communicate(timeout=timeout_s)
        return process.returncode, out, err
    except subprocess.TimeoutExpired:
        try:
            os.killpg(process.pid, signal.SIGKILL)  # the group this call started (ncu and its target)
        except OSError:
            pass
        out, err = process.communicate()
        return None, out or "", err or ""


def ncu_failure_reason(returncode: int | None, out: str, err: str, timeout_s: float) -> str:
    """Why an ncu run gave nothing: a timeout, no access to the counters, or its own error lines."""
    text = "\n".join([out, err])
    if returncode is None:
        return f"ncu did not finish within {timeout_s:.0f}s and was stopped"
    if "ERR_NVGPUCTRPERM" in text:
        return ("ncu may not read the GPU performance counters here (ERR_NVGPUCTRPERM): it needs admin rights or "
                "the driver option NVreg_RestrictProfilingToAdminUsers=0")
    errors = [line.strip() for line in text.splitlines() if "==ERROR==" in line]
    detail = " | ".join(errors[:3]) if errors else text.strip()[-400:]
    return f"ncu exited with status {returncode}: {detail}"
