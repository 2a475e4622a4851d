"""Fast-LLM's Triton entropy-loss kernels, run from a checkout the user names (the case study of notebook 02).

Fast-LLM's code is never copied into this repository: this module imports it from a checkout and calls it
the way Fast-LLM's loss layers do (``fast_llm/layers/language_model/loss/entropy_loss.py``):
``triton_entropy_loss_forward_backward(logits, target, loss_mask, grad_output=..., target_format=TargetFormat.X,
entropy_loss_type=EntropyLossType.Y, divisor=...)``, which returns ``(loss, grad)`` at commit 27f4747e (the
kernel of issue #497) and ``(loss, z_loss, grad)`` at later commits.

Where the checkout is: ``FAST_LLM_PATH`` (one path, or several separated by ``os.pathsep``, like ``PATH``)
or the ``path`` argument. Its commit comes from a file ``COMMIT`` beside the ``fast_llm`` package (written by
:func:`extract_checkout`, since ``git archive`` leaves no ``.git``), else from ``git rev-parse HEAD``. Several
commits load side by side in one process: each checkout's ``fast_llm`` modules are imported, then taken out
of ``sys.modules`` again (the functions keep their own globals), so two versions never mix.

Variants for the measurement harness (:mod:`perfutils.measure.providers`): ``fast_llm`` is the first checkout,
``fast_llm_<commit prefix>`` the one whose commit starts with that prefix. Their plans have ``.run() ->
(loss, grad)`` and, after the first run, ``.launches``: the kernel launches the wrapper made (kernel object,
grid, arguments by name, and the ``CompiledKernel`` a GPU launch returned, which gives ``n_regs``/``n_spills``;
for an autotuned kernel that is the autotuner's pick, ``best_config``).

The same recording works without a GPU (:func:`capture_launches`, meta tensors, nothing launched), so that
:meth:`FastLLMLaunch.compile_offline` can compile the real ``@triton.jit`` function with the launch's
specialization for sm_90 (``perfutils.model.offline_compile.compile_offline``) on a CPU. Fast-LLM needs Python >= 3.12
(PEP 695 generics) and imports only torch, triton and numpy on this path.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..data.metadata import commit_hash

__all__ = [
    "ENV_VAR",
    "FastLLM",
    "FastLLMLaunch",
    "FastLLMPlan",
    "capture_launches",
    "checkout_commit",
    "checkout_paths",
    "extract_checkout",
    "find_checkout",
    "load",
    "prepare",
    "variant_name",
]

ENV_VAR = "FAST_LLM_PATH"
COMMIT_FILE = "COMMIT"
ENTROPY_MODULE = "fast_llm.functional.triton.entropy_loss"
CONFIG_MODULE = "fast_llm.functional.config"
WRAPPER = "triton_entropy_loss_forward_backward"
VARIANT = "fast_llm"
# (loss, target_format) -> (TargetFormat member, EntropyLossType member) of Fast-LLM's wrapper.
LOSSES = {
    ("cross_entropy", "labels"): ("labels", "cross_entropy"),
    ("cross_entropy", "logits"): ("logits", "cross_entropy"),
    ("forward_kl", "logits"): ("logits", "forward_kl"),
    ("reverse_kl", "logits"): ("logits", "reverse_kl"),
}


# ---------------------------------------------------------------------------------------------------------------
# Checkouts
# ---------------------------------------------------------------------------------------------------------------


def checkout_paths(value: str | os.PathLike | None = None) -> list[Path]:
    """The checkouts named by ``value`` or, when it is None, by ``$FAST_LLM_PATH`` (``os.pathsep``-separated)."""
    if value is None:
        value = os.environ.get(ENV_VAR)
    if value is None or not str(value).strip():
        return []
    return [Path(part) for part in str(value).split(os.pathsep) if part.strip()]


def checkout_commit(path: str | os.PathLike) -> str | None:
    """The commit of a checkout: its ``COMMIT`` file, else ``git rev-parse HEAD`` in a git work tree, else None."""
    path = Path(path)
    marker = path / COMMIT_FILE
    if marker.is_file():
        return commit_hash(marker.read_text(encoding="utf-8"), str(marker))
    try:
        done = subprocess.run(["git", "-C", str(path), "rev-parse", "--show-toplevel", "HEAD"], capture_output=True,
                              text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = done.stdout.split()
    if done.returncode != 0 or len(lines) != 2:
        return None
    # Only the checkout's own repository: an extraction without COMMIT inside another work tree (this project's
    # .peers/) would otherwise report the enclosing repository's HEAD (the H200 sweep of 2026-11-25 recorded it).
    top, head = lines
    return head if Path(top).resolve() == path.resolve() else None


def extract_checkout(commit: str, git_dir: str | os.PathLike, dest_root: str | os.PathLike = ".peers") -> Path:
    """``git archive`` the ``fast_llm`` package of ``commit`` from a (bare) repository into
    ``<dest_root>/fast_llm-<commit>`` and write the full hash to ``COMMIT`` there. Returns that folder;
    an existing extraction of the same commit is reused."""
    full = subprocess.run(["git", "--git-dir", str(git_dir), "rev-parse", "--verify", f"{commit}^{{commit}}"],
                          capture_output=True, text=True, check=True).stdout.strip()
    dest = Path(dest_root) / f"fast_llm-{commit}"
    if (dest / COMMIT_FILE).is_file() and checkout_commit(dest) == full:
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "--git-dir", str(git_dir), "archive", full, "fast_llm"], capture_output=True,
                             check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    (dest / COMMIT_FILE).write_text(full + "\n", encoding="utf-8")
    return dest


def variant_name(commit: str | None) -> str:
    """The harness variant of a checkout: ``fast_llm_<first 8 hex digits>`` (``fast_llm`` without a commit)."""
    return f"{VARIANT}_{commit[:8]}" if commit else VARIANT


def find_checkout(variant: str = VARIANT, paths: str | os.PathLike | None = None) -> Path:
    """The checkout a variant names: ``fast_llm`` -> the first of ``paths``/``$FAST_LLM_PATH``;
    ``fast_llm_<prefix>`` -> the one whose commit starts with ``prefix``."""
    candidates = checkout_paths(paths)
    if not candidates:
        raise FileNotFoundError(
            f"variant {variant!r} runs Fast-LLM from a checkout: set {ENV_VAR} to its folder (the one holding "
            f"fast_llm/), or several separated by {os.pathsep!r}"
        )
    if variant == VARIANT:
        return candidates[0]
    match = re.fullmatch(rf"{VARIANT}_([0-9a-f]{{4,40}})", variant)
    if match is None:
        raise ValueError(f"Fast-LLM variants are {VARIANT!r} or '{VARIANT}_<commit prefix>', got {variant!r}")
    commits = {path: checkout_commit(path) for path in candidates}
    found = [path for path, commit in commits.items() if commit and commit.startswith(match.group(1))]
    if not found:
        listed = ", ".join(f"{path} ({commit or 'no commit'})" for path, commit in commits.items())
        raise FileNotFoundError(f"no checkout in {ENV_VAR} is at commit {match.group(1)}: {listed}")
    return found[0]


# ---------------------------------------------------------------------------------------------------------------
# Loading a checkout
# ---------------------------------------------------------------------------------------------------------------


def _is_fast_llm(name: str) -> bool:
    return name == "fast_llm" or name.startswith("fast_llm.")


def _is_kernel(value: Any) -> bool:
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction

    return isinstance(value, (JITFunction, Autotuner)) or type(value).__name__ == "InterpretedFunction"


@dataclass
class FastLLM:
    """One loaded checkout: its entropy-loss module, enums and commit."""

    path: Path
    commit: str | None
    module: Any  # fast_llm.functional.triton.entropy_loss
    config: Any  # fast_llm.functional.config
    modules: dict = field(default_factory=dict, repr=False)  # every fast_llm.* module of this checkout

    @property
    def variant(self) -> str:
        return variant_name(self.commit)

    @property
    def kernel_names(self) -> list[str]:
        """The kernels the wrapper launches (module-level @triton.jit/autotuned objects named *kernel*)."""
        return sorted(name for name, value in vars(self.module).items() if "kernel" in name and _is_kernel(value))

    def supports(self, loss: str, target_format: str) -> bool:
        if (loss, target_format) not in LOSSES:
            return False
        fmt, kind = LOSSES[(loss, target_format)]
        return hasattr(self.config.TargetFormat, fmt) and hasattr(self.config.EntropyLossType, kind)

    def call(self, logits, target, *, loss: str, target_format: str, grad_output: float | None = 1.0,
             loss_mask=None, divisor: float | None = None, block_size: int | None = None,
             num_warps: int | None = None) -> tuple[Any, Any]:
        """Fast-LLM's wrapper, called like its loss layers call it; returns (loss, grad) at every commit."""
        if not self.supports(loss, target_format):
            raise ValueError(f"Fast-LLM {self.commit or self.path} has no {loss!r} from {target_format!r}")
        fmt, kind = LOSSES[(loss, target_format)]
        result = getattr(self.module, WRAPPER)(
            logits, target, loss_mask, grad_output=grad_output,
            target_format=getattr(self.config.TargetFormat, fmt),
            entropy_loss_type=getattr(self.config.EntropyLossType, kind),
            divisor=divisor, block_size=block_size, num_warps=num_warps,
        )
        if len(result) == 3:  # (loss, z_loss, grad) since the commit after 46ffbdd1
            return result[0], result[2]
        return result[0], result[1]


_LOADED: dict[Path, FastLLM] = {}


def load(path: str | os.PathLike | None = None) -> FastLLM:
    """Import Fast-LLM's entropy-loss module from a checkout (default: the first in ``$FAST_LLM_PATH``).

    Cached per folder. Raises ImportError naming what is missing (a module that is not installed, a folder
    that is not a checkout, Python < 3.12 for Fast-LLM's PEP 695 syntax)."""
    if path is None:
        path = find_checkout(VARIANT)
    root = Path(path).resolve()
    if root in _LOADED:
        return _LOADED[root]
    if not (root / "fast_llm" / "__init__.py").is_file():
        raise ImportError(f"{path} is not a Fast-LLM checkout: no fast_llm/__init__.py in it")
    saved = {name: sys.modules.pop(name) for name in list(sys.modules) if _is_fast_llm(name)}
    interpreter_patch = _interpreter_patch()
    sys.path.insert(0, str(root))
    try:
        try:
            module = importlib.import_module(ENTROPY_MODULE)
            config = importlib.import_module(CONFIG_MODULE)
        except SyntaxError as exc:
            raise ImportError(
                f"Fast-LLM at {path} does not parse on Python {sys.version.split()[0]} ({exc.filename}:{exc.lineno}); "
                f"it needs Python >= 3.12 (PEP 695 generics)"
            ) from exc
        except ModuleNotFoundError as exc:
            if exc.name and not _is_fast_llm(exc.name):
                raise ImportError(
                    f"Fast-LLM at {path} imports {exc.name!r}, which is not installed in this environment "
                    f"(pip install {exc.name.split('.')[0]}, or put its wheel's contents on PYTHONPATH)"
                ) from exc
            raise ImportError(f"{path} is not a Fast-LLM checkout with {ENTROPY_MODULE}: {exc}") from exc
        origin = Path(module.__file__).resolve()
        if root not in origin.parents:
            raise ImportError(f"imported {origin}, not from the checkout {root}")
        if not hasattr(module, WRAPPER):
            raise ImportError(f"{origin} has no {WRAPPER}(): not a Fast-LLM version this provider knows")
        modules = {name: sys.modules[name] for name in list(sys.modules) if _is_fast_llm(name)}
    finally:
        sys.path.remove(str(root))
        for name in [name for name in sys.modules if _is_fast_llm(name)]:
            del sys.modules[name]
        sys.modules.update(saved)
        _undo_incompatible_interpreter_patch(interpreter_patch)
    loaded = FastLLM(root, checkout_commit(root), module, config, modules)
    _LOADED[root] = loaded
    return loaded


def _interpreter_patch():
    import triton.runtime.interpreter as interpreter

    return interpreter, getattr(interpreter, "_patch_lang_tensor", None)


def _undo_incompatible_interpreter_patch(before) -> None:
    """Under ``TRITON_INTERPRET=1``, Fast-LLM (27f4747e, 7d61a1ba) replaces the interpreter's
    ``_patch_lang_tensor(tensor)`` to fix ``__index__`` of 1-element arrays. Triton 3.6 calls it as
    ``_patch_lang_tensor(tensor, scope)``, so every interpreted kernel (ours too) would fail with a
    TypeError; with numpy < 2.4 Triton's own ``__index__`` already works. Put the original back when the
    replacement takes fewer arguments than it."""
    import inspect

    interpreter, original = before
    replaced = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None or replaced is original:
        return
    if len(inspect.signature(replaced).parameters) < len(inspect.signature(original).parameters):
        interpreter._patch_lang_tensor = original


# ---------------------------------------------------------------------------------------------------------------
# Launches
# ---------------------------------------------------------------------------------------------------------------


def _default_num_stages() -> int:
    from triton.backends.nvidia.compiler import CUDAOptions

    return int(CUDAOptions.num_stages)


@dataclass
class FastLLMLaunch:
    """One ``kernel[grid](*args, **kwargs)`` call made by Fast-LLM's wrapper."""

    name: str
    kernel: Any  # JITFunction, or an Autotuner around one
    grid: tuple
    arguments: dict[str, Any]  # every argument by parameter name (launch options excluded)
    options: dict[str, Any]  # num_warps / num_stages given at the call (none when autotuned)
    module: Any = field(default=None, repr=False)
    compiled: Any = field(default=None, repr=False)  # CompiledKernel returned by a GPU launch

    @property
    def autotuned(self) -> bool:
        return hasattr(self.kernel, "configs") and hasattr(self.kernel, "fn")

    @property
    def jit_fn(self) -> Any:
        return self.kernel.fn if self.autotuned else self.kernel

    @property
    def block_size(self) -> int | None:
        return self.arguments.get("block_size")

    @property
    def num_stages(self) -> int:
        return int(self.options.get("num_stages") or _default_num_stages())

    @property
    def warp_choices(self) -> list[int]:
        """The warps this launch may run with: the autotuner's configs, or the one given (Triton's default 4)."""
        if self.autotuned:
            return [int(config.num_warps) for config in self.kernel.configs]
        return [int(self.options.get("num_warps") or 4)]

    @property
    def num_warps(self) -> int | None:
        """The warps it ran with: given at the call, or the autotuner's pick once it has run (None before)."""
        if not self.autotuned:
            return self.warp_choices[0]
        compiled_warps = getattr(getattr(self.compiled, "metadata", None), "num_warps", None)
        if compiled_warps is not None:
            return int(compiled_warps)
        best = getattr(self.kernel, "best_config", None)
        return int(best.num_warps) if best is not None else None

    def split_arguments(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(run-time arguments, constexpr arguments) as ``perfutils.model.offline_compile.compile_offline`` takes
        them (the kernel's parameter list decides; also for an interpreted kernel)."""
        from ..model.specialization import split_arguments

        return split_arguments(self.jit_fn, self.arguments)

    def compile_offline(self, num_warps: int | None = None, *, with_sass: bool = True, target: Any = None):
        """Compile the real ``@triton.jit`` function with this launch's specialization for sm_90 (no GPU needed).

        In this process (``in_process=True``): the compile worker could not import the kernel (its checkout is not
        on ``sys.path``, and a worker without a GPU would see ``tl_arange = None``). So this process must not
        have run kernels under ``TRITON_INTERPRET=1``: run offline compiles in a process of their own
        (``python -m perfutils case-497 offline``)."""
        from ..model.offline_compile import compile_offline
        from ..model.specialization import DEFAULT_TARGET

        num_warps = num_warps or self.num_warps or self.warp_choices[0]
        runtime, constexprs = self.split_arguments()
        with gpu_globals(self.module):
            return compile_offline(self.jit_fn, runtime, constexprs, num_warps, self.num_stages,
                                   target or DEFAULT_TARGET, with_sass=with_sass, in_process=True)


@contextlib.contextmanager
def gpu_globals(module: Any):
    """Fast-LLM's ``fast_llm.functional.triton`` sets ``tl_arange = None`` when neither a GPU nor the
    interpreter is there; a GPU process has ``tl_arange = tl.arange``. Give the module that value while an
    offline compile reads its globals, and restore it after."""
    if module is None or getattr(module, "tl_arange", object()) is not None:
        yield
        return
    import triton.language as tl

    module.tl_arange = tl.arange
    try:
        yield
    finally:
        module.tl_arange = None


class _Recorder:
    """Stands in for one of Fast-LLM's kernels while a call is recorded: ``rec[grid](*args, **kwargs)``."""

    def __init__(self, name: str, kernel: Any, module: Any, sink: list, launch: bool):
        self.name, self.kernel, self.module, self.sink, self.launch = name, kernel, module, sink, launch

    def __getitem__(self, grid):
        def call(*args, **kwargs):
            options = {k: kwargs.pop(k) for k in ("num_warps", "num_stages") if k in kwargs}
            arguments = dict(zip(self.kernel.arg_names, args), **kwargs)
            record = FastLLMLaunch(self.name, self.kernel, tuple(grid), arguments, options, self.module)
            self.sink.append(record)
            if not self.launch:
                return None
            result = self.kernel[grid](*args, **kwargs, **options)
            if result is not None and hasattr(result, "metadata"):
                record.compiled = result
            return result

        return call


@contextlib.contextmanager
def _recording(fast_llm: FastLLM, *, launch: bool):
    """Replace the module's kernels by recorders (and, when nothing is launched, its loss reduction, a
    ``torch.compile``d function, by a plain sum) for the duration of a call."""
    module, sink = fast_llm.module, []
    replaced = {name: getattr(module, name) for name in fast_llm.kernel_names}
    if not launch and hasattr(module, "reduce_losses"):
        replaced["reduce_losses"] = module.reduce_losses
    try:
        for name in fast_llm.kernel_names:
            setattr(module, name, _Recorder(name, replaced[name], module, sink, launch))
        if "reduce_losses" in replaced:
            module.reduce_losses = lambda losses, divisor=None, mask=None: losses.sum()
        yield sink
    finally:
        for name, value in replaced.items():
            setattr(module, name, value)


def capture_launches(fast_llm: FastLLM, *, loss: str, target_format: str, tokens: int, vocab: int,
                     dtype: str = "bf16", block_size: int | None = None, num_warps: int | None = None,
                     grad_output: float = 1.0) -> list[FastLLMLaunch]:
    """The launches Fast-LLM's wrapper makes for a shape, on meta tensors: nothing is allocated or launched."""
    import torch

    from ..data.schema import torch_dtype

    logits = torch.empty(tokens, vocab, dtype=torch_dtype(dtype), device="meta")
    if target_format == "labels":
        target = torch.empty(tokens, dtype=torch.int64, device="meta")
    else:
        target = torch.empty_like(logits)
    with _recording(fast_llm, launch=False) as sink:
        fast_llm.call(logits, target, loss=loss, target_format=target_format, grad_output=grad_output,
                      divisor=float(tokens), block_size=block_size, num_warps=num_warps)
    return list(sink)


# ---------------------------------------------------------------------------------------------------------------
# The harness provider
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class FastLLMPlan:
    """``run() -> (loss, grad)`` of one Fast-LLM call; the first run records its launches (``launches``)."""

    variant: str
    fast_llm: FastLLM
    step: Callable[[], tuple[Any, Any]]
    config: dict = field(default_factory=dict)
    launches: list = field(default_factory=list)
    _recorded: bool = field(default=False, repr=False)

    def run(self):
        if self._recorded:
            return self.step()
        with _recording(self.fast_llm, launch=True) as sink:
            result = self.step()
        self.launches = list(sink)
        self._recorded = True
        self._describe()
        return result

    def _describe(self) -> None:
        main = next((l for l in self.launches if "backward" in l.name), self.launches[0] if self.launches else None)
        if main is not None:
            self.config.update(kernel=main.name, block_size=main.block_size, num_warps=main.num_warps,
                               num_stages=main.num_stages, autotuned=main.autotuned,
                               warp_choices=main.warp_choices if main.autotuned else None)


def prepare(logits, target, *, loss="cross_entropy", target_format="labels", variant=VARIANT, block_size=None,
            num_warps=None, grad_output=1.0, ignore_index=-100, loss_mask=None, **options) -> FastLLMPlan:
    """A plan that calls Fast-LLM's wrapper on these inputs (mean over the rows that count, like the project).

    ``divisor`` is the number of rows that count (labels >= 0, Fast-LLM's masking, and ``loss_mask``), found
    once here; ``block_size``/``num_warps`` None are Fast-LLM's own choices (its wrapper ignores ``num_warps``
    for the autotuned kernels of later commits)."""
    if options:
        raise TypeError(f"Fast-LLM variants take no option(s) {sorted(options)}")
    if grad_output is None:
        raise ValueError("the Fast-LLM provider measures forward + backward: grad_output must be a number")
    fast_llm = load(find_checkout(variant))
    if not fast_llm.supports(loss, target_format):
        raise ValueError(f"Fast-LLM {fast_llm.commit or fast_llm.path} has no {loss!r} from {target_format!r}")
    if target_format == "labels" and ignore_index >= 0:
        raise ValueError(f"Fast-LLM ignores rows whose label is negative; ignore_index={ignore_index} is not")
    n_rows = logits.shape[:-1].numel()
    count = None
    if target_format == "labels":
        count = target >= 0
    if loss_mask is not None:
        count = loss_mask if count is None else count & loss_mask
    divisor = float(count.sum().item()) if count is not None else float(n_rows)
    grad = float(grad_output)

    def step():
        return fast_llm.call(logits, target, loss=loss, target_format=target_format, grad_output=grad,
                             loss_mask=loss_mask, divisor=divisor, block_size=block_size, num_warps=num_warps)

    config = {"fast_llm_commit": fast_llm.commit, "fast_llm_path": str(fast_llm.path), "divisor": divisor}
    return FastLLMPlan(fast_llm.variant if variant != VARIANT else VARIANT, fast_llm, step, config)
