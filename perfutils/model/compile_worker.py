"""A separate Python process that compiles Triton kernels for sm_90, so the compiler never sees this one's state.

Started as ``python -m perfutils.model.compile_worker`` by :func:`perfutils.model.offline_compile.compile_offline`.

Why a process: ``TRITON_INTERPRET=1`` (the CPU tests, the notebooks' correctness cells) makes Triton patch
``triton.language`` while a kernel runs, and Triton 3.6 leaves some of those patches in place after a
device-function call (``InterpretedFunction.__call__`` patches ``triton.language.core`` and never restores
it). A compile in that process then fails inside Triton's code generator ("'ir.value' object has no
attribute 'dtype'"), or only works if the kernel was already in the on-disk cache. The worker is a fresh
interpreter with the interpreter switched off: it imports the kernel's module itself and compiles real
``JITFunction`` objects, whatever ran before in the process that asked.

Protocol: length-prefixed pickles over the worker's stdin/stdout. The parent sends its ``sys.path`` once,
then jobs ``(locator, spec, options)``; the worker answers ``("ok", OfflineCompile)`` or
``("error", text)``. Anything a compile prints goes to the worker's stderr, never into the protocol.
"""

from __future__ import annotations

import atexit
import importlib
import importlib.util
import os
import pickle
import struct
import subprocess
import sys
import threading
import traceback
from dataclasses import dataclass
from typing import Any

_HEADER = struct.Struct("<Q")


@dataclass(frozen=True)
class KernelLocator:
    """Where the worker finds a ``@triton.jit`` function: its module and qualified name, and the file
    as a fallback (a module run as a script, or one the worker cannot import by name)."""

    module: str
    qualname: str
    file: str | None

    @classmethod
    def of(cls, python_fn: Any) -> "KernelLocator":
        code = getattr(python_fn, "__code__", None)
        return cls(python_fn.__module__, python_fn.__qualname__, code.co_filename if code else None)


def _send(stream, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)))
    stream.write(data)
    stream.flush()


def _receive(stream) -> Any:
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        raise EOFError("compile worker closed its pipe")
    (size,) = _HEADER.unpack(header)
    data = stream.read(size)
    if len(data) < size:
        raise EOFError("compile worker closed its pipe mid-message")
    return pickle.loads(data)


# ---------------------------------------------------------------------------------------------------------------
# Parent side
# ---------------------------------------------------------------------------------------------------------------


class CompileWorker:
    """One persistent worker process; started on first use, restarted if it dies, stopped at exit."""

    def __init__(self) -> None:
        self._process: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def _start(self) -> subprocess.Popen:
        env = dict(os.environ)
        env["TRITON_INTERPRET"] = "0"
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        env.setdefault("PYTHONUNBUFFERED", "1")
        process = subprocess.Popen(
            [sys.executable, "-m", "perfutils.model.compile_worker"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, cwd=os.getcwd(),
        )
        _send(process.stdin, list(sys.path))
        return process

    def compile(self, locator: KernelLocator, spec: Any, options: dict[str, Any]) -> Any:
        """Compile in the worker; returns its OfflineCompile or raises RuntimeError with the worker's message."""
        # Settings a compile reads from the environment (ptxas path and options, cache dir) are sent with every
        # job: the parent may have changed them since the worker started (perfutils.model.cuda_tools.pin_bundled_ptxas).
        environment = {k: v for k, v in os.environ.items() if k.startswith(("TRITON_", "PTXAS_"))}
        environment.pop("TRITON_INTERPRET", None)
        job = (locator, spec, options, environment)
        with self._lock:
            for attempt in (1, 2):
                if self._process is None or self._process.poll() is not None:
                    self._process = self._start()
                try:
                    _send(self._process.stdin, job)
                    status, payload = _receive(self._process.stdout)
                    break
                except (EOFError, BrokenPipeError, OSError) as exc:
                    self.stop_locked()
                    if attempt == 2:
                        raise RuntimeError(f"the offline compile worker died while compiling {locator.qualname}: "
                                           f"{exc}") from exc
        if status != "ok":
            raise RuntimeError(payload)
        return payload

    def stop_locked(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(timeout=10)

    def stop(self) -> None:
        with self._lock:
            self.stop_locked()


WORKER = CompileWorker()
atexit.register(WORKER.stop)


# ---------------------------------------------------------------------------------------------------------------
# Worker side
# ---------------------------------------------------------------------------------------------------------------


def _load_function(locator: KernelLocator) -> Any:
    module = None
    if locator.module != "__main__":
        try:
            module = importlib.import_module(locator.module)
        except Exception:
            module = None
    if module is None and locator.file and os.path.isfile(locator.file):
        spec = importlib.util.spec_from_file_location(f"_offline_compile_{abs(hash(locator.file))}", locator.file)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    if module is None:
        raise RuntimeError(f"cannot import {locator.qualname} from module {locator.module!r} (file {locator.file}): "
                           "offline compiles need the kernel in an importable module or file")
    obj: Any = module
    for part in locator.qualname.split("."):
        if part == "<locals>":
            raise RuntimeError(f"{locator.qualname} is defined inside a function: offline compiles need a "
                               "module-level @triton.jit function")
        obj = getattr(obj, part)
    return obj


def _serve() -> None:
    # The protocol owns the real stdout; anything else printed (Triton, ptxas, user modules) goes to stderr.
    protocol_out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    protocol_in = sys.stdin.buffer
    sys.path[:] = _receive(protocol_in)
    try:
        from triton import knobs

        knobs.runtime.interpret = False  # wins over a module that sets TRITON_INTERPRET=1 when imported
    except ImportError:  # Triton < 3.3: the environment variable (set to 0 by the parent) decides
        pass
    from perfutils.model import triton_compile

    base_environment = dict(os.environ)
    while True:
        try:
            locator, spec, options, environment = _receive(protocol_in)
        except EOFError:
            return
        os.environ.clear()
        os.environ.update(base_environment)
        os.environ.update(environment)
        try:
            jit_fn = _load_function(locator)
            result = triton_compile.compile_in_this_process(jit_fn, spec, **options)
            answer = ("ok", result)
        except Exception as exc:  # reported to the parent, which raises it
            detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            answer = ("error", detail if isinstance(exc, RuntimeError) else f"{detail}\n{traceback.format_exc()}")
        _send(protocol_out, answer)


if __name__ == "__main__":
    _serve()
