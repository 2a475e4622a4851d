"""Find the repository's folders from wherever a notebook runs (papermill: the repo root; nbval: notebooks/)."""

from __future__ import annotations

from pathlib import Path


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
