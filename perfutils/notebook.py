"""What every notebook needs before it measures or replays: its folders, its MODE, a kernel's source to show.

Notebooks run from two places: papermill (``make report``) starts them in the repository root, nbval
(``make test``) in ``notebooks/``. :func:`repo_root` / :func:`resolve` and :func:`find_repo_root` /
:func:`resolve_path` find the repository's folders from either; :func:`resolve_mode` turns ``MODE="auto"`` into
``measure`` (a CUDA GPU is there) or ``replay`` (the committed ``data/``); :func:`kernel_source` is the source of a
``@triton.jit`` kernel, which the teaching notebooks display instead of defining it.
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Any

__all__ = ["repo_root", "resolve", "find_repo_root", "resolve_path", "resolve_mode", "kernel_source"]


def repo_root(start: str | Path | None = None) -> Path:
    """The nearest folder at or above ``start`` (default: cwd) holding pyproject.toml."""
    here = Path(start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "pyproject.toml").exists() and (folder / "kernels").is_dir():
            return folder
    raise FileNotFoundError(f"no project root (pyproject.toml beside kernels/) at or above {here}")


def resolve(path: str | Path) -> Path:
    """``path`` as given if absolute or existing from cwd, else relative to the repository root."""
    path = Path(path)
    if path.is_absolute() or path.exists():
        return path.resolve()
    return repo_root() / path


def kernel_source(kernel: Any) -> str:
    """The Python source of a ``@triton.jit`` kernel (or of any function), for display in a notebook."""
    fn = getattr(kernel, "fn", kernel)
    while hasattr(fn, "fn") and not inspect.isfunction(fn):  # Autotuner -> JITFunction -> function
        fn = fn.fn
    return inspect.getsource(fn)


def find_repo_root(start: str | os.PathLike | None = None) -> Path | None:
    """The nearest directory at or above ``start`` (default: cwd) holding a pyproject.toml."""
    here = Path(start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "pyproject.toml").is_file():
            return folder
    return None


def resolve_path(path: str | os.PathLike) -> Path:
    """A notebook path parameter: absolute as given; relative, under cwd if it exists there, else under
    the repository root (papermill runs from the root, nbval from ``notebooks/``)."""
    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise ValueError(f"path must be a non-empty str, got {path!r}")
    candidate = Path(path)
    if candidate.is_absolute() or candidate.exists():
        return candidate
    root = find_repo_root()
    return (root / candidate) if root is not None else candidate


def resolve_mode(mode: str) -> str:
    """``auto`` -> ``measure`` when CUDA is available, else ``replay``; ``measure`` needs CUDA."""
    if mode not in ("auto", "measure", "replay"):
        raise ValueError(f"MODE must be 'auto', 'measure' or 'replay', got {mode!r}")
    import torch  # here, so that importing this module stays cheap

    cuda = torch.cuda.is_available()
    if mode == "measure" and not cuda:
        raise RuntimeError("MODE='measure' needs a CUDA GPU and none is available; use MODE='replay' (or 'auto')")
    if mode == "auto":
        return "measure" if cuda else "replay"
    return mode
