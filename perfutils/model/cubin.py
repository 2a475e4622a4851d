"""Reading a compiled kernel's resources out of what ptxas produced, and excerpts of its PTX/SASS to teach from.

Pure text and bytes, no tool and no GPU: :func:`parse_res_usage` reads ``cuobjdump -res-usage`` (REG, STACK,
SHARED, LOCAL), :func:`parse_ptxas_log` the ``ptxas -v`` log (registers, stack frame, static spill store/load
bytes), :func:`parse_cubin_resources` the cubin's ``.nv.info`` ELF section directly (registers and stack frame
when no NVIDIA tool is at hand), and :func:`local_memory_excerpt` shows the lines around local-memory
instructions (spills) in PTX or SASS.
"""

from __future__ import annotations

import re
import struct

from ..data.source_page import loop_spans, step_loops

__all__ = ["parse_res_usage", "parse_ptxas_log", "parse_cubin_resources", "local_memory_excerpt",
           "sass_instruction_mix", "sass_loops", "main_loop_instructions"]

_RES_USAGE = re.compile(r"REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)")
_PTXAS_REGS = re.compile(r"Used (\d+) registers")
_PTXAS_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_PTXAS_FUNCTION = re.compile(r"Function properties for (\S+)\s*\n\s*(\d+ bytes stack frame, \d+ bytes spill stores, "
                             r"\d+ bytes spill loads)")


def parse_res_usage(text: str, kernel: str) -> dict[str, int] | None:
    """Parse ``cuobjdump -res-usage``; picks the ``Function <kernel>:`` block (the entry kernel)."""
    blocks = re.split(r"^\s*Function\s+", text, flags=re.MULTILINE)
    found = None
    for block in blocks[1:]:
        fname, _, rest = block.partition(":")
        match = _RES_USAGE.search(rest)
        if match is None:
            continue
        numbers = dict(zip(("n_regs", "stack", "shared", "local"), map(int, match.groups())))
        if fname.strip() == kernel:
            return numbers
        found = found or numbers
    return found


def parse_ptxas_log(text: str, kernel: str | None = None) -> dict[str, int] | None:
    """Parse ``ptxas -v``: registers, stack frame and static spill store/load bytes of the entry function ``kernel``
    (its ``Function properties for <kernel>`` block), else of the last function. A kernel that calls a noinline
    device function gets one block per function, and the callee's comes last: reading it reported the callee's
    4-byte spill for a kernel with 664 bytes of its own."""
    regs = _PTXAS_REGS.findall(text)
    frames = _PTXAS_FRAME.findall(text)
    if not regs or not frames:
        return None
    blocks = dict(_PTXAS_FUNCTION.findall(text))
    frame = _PTXAS_FRAME.fullmatch(blocks[kernel]).groups() if kernel in blocks else frames[-1]
    stack, stores, loads = map(int, frame)
    entry_regs = re.search(rf"entry function '{re.escape(kernel)}'[\s\S]*?Used (\d+) registers", text) if kernel else None
    return {"n_regs": int(entry_regs.group(1) if entry_regs else regs[-1]), "stack": stack, "spill_stores": stores,
            "spill_loads": loads}


# ELF .nv.info attributes (from the EIATTR enumeration the CUDA tools print with `cuobjdump -elf`).
_EIATTR_FRAME_SIZE = 0x11
_EIATTR_REGCOUNT = 0x2F
_EIFMT_SVAL = 0x04


def parse_cubin_resources(cubin: bytes, kernel: str | None = None) -> dict[str, int]:
    """Registers and stack frame from a cubin's ``.nv.info`` section, with no NVIDIA tool at all.

    ``.nv.info`` holds (format, attribute, payload) records; REGCOUNT and FRAME_SIZE carry
    (symbol index, value) pairs, where the symbol index names the kernel in ``.symtab``."""
    if not isinstance(cubin, (bytes, bytearray)):
        raise TypeError(f"cubin must be bytes, got {type(cubin).__name__}")
    if cubin[:4] != b"\x7fELF" or cubin[4] != 2 or cubin[5] != 1:
        raise ValueError("cubin is not a 64-bit little-endian ELF file")
    (shoff,) = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * shentsize) for i in range(shnum)]

    def cstring(table_offset: int, offset: int) -> str:
        start = table_offset + offset
        return cubin[start:cubin.index(b"\0", start)].decode("ascii", "replace")

    names = [cstring(sections[shstrndx][4], s[0]) for s in sections]
    symbols: dict[int, str] = {}
    for s in sections:
        if s[1] == 2:  # SHT_SYMTAB: 24-byte Elf64_Sym records, names in the linked string table
            strtab_offset = sections[s[6]][4]
            for index in range(s[5] // 24):
                (st_name,) = struct.unpack_from("<I", cubin, s[4] + index * 24)
                symbols[index] = cstring(strtab_offset, st_name)
    values: dict[int, dict[int, int]] = {}  # attribute -> {symbol index: value}
    for s, name in zip(sections, names):
        if name != ".nv.info":
            continue
        data = cubin[s[4]:s[4] + s[5]]
        pos = 0
        while pos + 4 <= len(data):
            fmt, attr = data[pos], data[pos + 1]
            if fmt == _EIFMT_SVAL:
                (size,) = struct.unpack_from("<H", data, pos + 2)
                payload = data[pos + 4:pos + 4 + size]
                if attr in (_EIATTR_REGCOUNT, _EIATTR_FRAME_SIZE) and size >= 8:
                    sym, value = struct.unpack_from("<II", payload)
                    values.setdefault(attr, {})[sym] = value
                pos += 4 + size
            else:  # NVAL/BVAL/HVAL: value packed in the 2 bytes after the header
                pos += 4
    regs = values.get(_EIATTR_REGCOUNT, {})
    if not regs:
        raise ValueError("cubin has no EIATTR_REGCOUNT record in .nv.info")
    wanted = next((i for i, n in symbols.items() if n == kernel), None) if kernel else None
    sym = wanted if wanted in regs else next(iter(regs))
    return {"n_regs": regs[sym], "stack": values.get(_EIATTR_FRAME_SIZE, {}).get(sym, 0)}


_LOCAL_MEMORY = re.compile(r"\b(?:ld|st)\.local\b|\b(?:LDL|STL)(?:\.[A-Z0-9]+)*\b")


def local_memory_excerpt(ptx_or_sass: str, context: int = 3, max_sites: int | None = 8) -> str:
    """Lines around local-memory instructions (``ld.local``/``st.local`` in PTX, ``LDL``/``STL`` in SASS).

    Windows of ``context`` lines either side are merged when they overlap; at most ``max_sites`` windows are
    shown (None: all), separated by ``...``. Returns "" when there is no local memory traffic. Note that
    Triton's PTX rarely has any: spills are ptxas's decision, so look at the SASS."""
    if not isinstance(ptx_or_sass, str):
        raise TypeError(f"ptx_or_sass must be a str, got {type(ptx_or_sass).__name__}")
    if not isinstance(context, int) or isinstance(context, bool):
        raise TypeError(f"context must be an int, got {type(context).__name__}")
    if context < 0:
        raise ValueError(f"context must be >= 0, got {context}")
    if max_sites is not None and (not isinstance(max_sites, int) or isinstance(max_sites, bool)):
        raise TypeError(f"max_sites must be an int or None, got {type(max_sites).__name__}")
    if max_sites is not None and max_sites < 1:
        raise ValueError(f"max_sites must be >= 1 or None, got {max_sites}")
    lines = ptx_or_sass.splitlines()
    hits = [i for i, line in enumerate(lines) if _LOCAL_MEMORY.search(line)]
    windows: list[list[int]] = []
    shown = 0  # local-memory instructions inside the windows kept
    for i in hits:
        lo, hi = max(0, i - context), min(len(lines) - 1, i + context)
        if windows and lo <= windows[-1][1] + 1:
            windows[-1][1] = hi
        elif max_sites is not None and len(windows) == max_sites:
            break
        else:
            windows.append([lo, hi])
        shown += 1
    text = "\n...\n".join("\n".join(lines[lo:hi + 1]) for lo, hi in windows)
    if shown < len(hits):
        text += f"\n... ({len(hits)} local-memory instructions in all, {shown} shown)"
    return text


_SASS_INSTRUCTION = re.compile(r"^\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)((?:\.[A-Z0-9_]+)*)")


def sass_instruction_mix(sass: str) -> dict[str, int]:
    """Static counts of a disassembled kernel (``nvdisasm`` text): ``instructions`` in all, ``compares_64`` (integer
    compares of 64-bit values: ``ISETP`` with ``.EX``, the high half chained to the low one), ``memory`` (global
    loads and stores), the special-function and barrier forms (``MUFU.EX2``, ``MUFU.RCP``, ``BAR.SYNC``, counted under
    those names as well as under their opcode), and one entry per opcode (``IMAD``, ``LOP3``, ``LDL``, ... without
    modifiers)."""
    if not isinstance(sass, str):
        raise TypeError(f"sass must be a str, got {type(sass).__name__}")
    mix: dict[str, int] = {"instructions": 0, "compares_64": 0, "memory": 0, "MUFU.EX2": 0, "MUFU.RCP": 0,
                           "BAR.SYNC": 0}
    for line in sass.splitlines():
        found = _SASS_INSTRUCTION.match(line)
        if not found:
            continue
        opcode, modifiers = found.group(1), found.group(2)
        mix["instructions"] += 1
        mix[opcode] = mix.get(opcode, 0) + 1
        if opcode == "ISETP" and "EX" in modifiers.split("."):
            mix["compares_64"] += 1
        if opcode in ("LDG", "STG"):
            mix["memory"] += 1
        form = opcode + ".".join(modifiers.split(".")[:2])  # e.g. MUFU.EX2, BAR.SYNC
        if form in SASS_FORMS:
            mix[form] += 1
    return mix


SASS_FORMS = ("MUFU.EX2", "MUFU.RCP", "BAR.SYNC")


_LABEL = re.compile(r"^\s*(\.L_x_\d+):")
_LABEL_BRANCH = re.compile(r"\bBRA(?:\.[A-Z0-9_]+)*\s+`\((\.L_x_\d+)\)")


def sass_loops(sass: str) -> tuple[list[tuple[int, int]], list[str]]:
    """The loops of a disassembled kernel (``nvdisasm -c`` text, whose branches jump to ``.L_x_N`` labels):
    ``(spans, instructions)``, spans as ``perfutils.data.source_page.loop_spans`` gives them over the instructions'
    text."""
    if not isinstance(sass, str):
        raise TypeError(f"sass must be a str, got {type(sass).__name__}")
    labels, instructions, branches = {}, [], []
    for line in sass.splitlines():
        label = _LABEL.match(line)
        if label:
            labels[label.group(1)] = len(instructions)
            continue
        found = _SASS_INSTRUCTION.match(line)
        if not found:
            continue
        branch = _LABEL_BRANCH.search(line)
        branches.append(branch.group(1) if branch else None)
        instructions.append(line.split("*/", 1)[-1].strip())
    return loop_spans([labels.get(name) if name else None for name in branches]), instructions


_LOCAL_WIDTH = {"8": 1, "U8": 1, "S8": 1, "16": 2, "U16": 2, "S16": 2, "64": 8, "128": 16}


def local_memory_bytes(sass: str) -> dict[str, int]:
    """A thread's local-memory (spill) bytes in a disassembled kernel, split by where they sit: ``once`` outside
    every loop, ``per_trip`` inside the loops (each loop's once a trip, nested ones counted with their loop): the
    traffic of a kernel whose loops run ``trips`` times is ``once + per_trip x trips``. ``LDL``/``STL`` move 4 bytes,
    or their width (``.64``: 8, ``.128``: 16, ``.U8``: 1, ...)."""
    spans, instructions = sass_loops(sass)
    in_loop = {i for a, b in spans for i in range(a, b + 1)}
    out = {"once": 0, "per_trip": 0}
    for index, text in enumerate(instructions):
        found = re.match(r"(?:@!?U?P[T0-9]+\s+)?(LDL|STL)((?:\.[A-Z0-9]+)*)\s", text)
        if not found:
            continue
        widths = [_LOCAL_WIDTH[m] for m in found.group(2).split(".") if m in _LOCAL_WIDTH]
        out["per_trip" if index in in_loop else "once"] += widths[0] if widths else 4
    return out


def main_loop_instructions(sass: str) -> dict[str, int]:
    """A persistent kernel's step, counted in its SASS: the instructions of its longest loop (``step``: what each
    thread issues once a step, the loops nested in it left out) and of those nested loops (``nested``: a poll, run
    as often as it waits). On the lagged and kept split_row kernels the step was 0.3-8.5% above Nsight Compute's
    executed instructions a step, never below (data/h200/logs/ncu_kept_2026-11-28.txt: branches skipped at run
    time). Raises ValueError for a kernel with no loop."""
    (first, last), inner = step_loops(sass_loops(sass)[0])
    covered = {index for a, b in inner for index in range(a, b + 1)}
    return {"step": last - first + 1 - len(covered), "nested": len(covered)}
