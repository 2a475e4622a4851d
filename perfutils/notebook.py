"""What every notebook needs before it measures or replays: its folders, its MODE, a kernel's source to show.

Notebooks run from two places: papermill (``make report``) starts them in the repository root, nbval
(``make test``) in ``notebooks/``. :func:`find_repo_root` and :func:`resolve_path` find the
repository's folders from either; :func:`resolve_mode` turns ``MODE="auto"`` into
``measure`` (a CUDA GPU is there) or ``replay`` (the committed ``data/``); :func:`require` is a recorded input or an
error saying how to make it, :func:`wide_tables` the pages' table width; :func:`kernel_source` is the source of a
``@triton.jit`` kernel, which the teaching notebooks display instead of defining it.

What a page shows: :func:`table` is a DataFrame as a reader wants it (no pandas index unless it means something,
whole numbers without ``.0``, missing values as a dash), :func:`diff_view` a unified diff with its added and removed
lines coloured (the same in JupyterLab and on the report's pages), :func:`say` prose computed from the data (Markdown, shown
as text of the page, not as program output), :func:`shown` a path relative to the repository (a page
never names the folders of the machine that built it), and :func:`quiet_interpreter` silences the numpy warnings
Triton's CPU interpreter raises on the infinities a GPU computes silently. For prose computed from data,
:func:`compared` words a ratio ("faster than", "level with", "slower than"), :func:`span` a range of values
("0.90–1.02") and :func:`listing` a list ("a, b and c").
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Any

__all__ = ["find_repo_root", "resolve_path", "resolve_mode", "require", "wide_tables", "kernel_source", "table",
           "diff_view", "shown", "quiet_interpreter", "say", "compared", "span", "listing"]


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


def require(folder: str | os.PathLike, name: str, how_to: dict[str, str]) -> Path:
    """``folder / name`` when that file exists; else a FileNotFoundError naming it and saying how to make it
    (``how_to[name]``): a missing input stops the page, never draws an empty plot."""
    path = Path(folder) / name
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing, and this notebook needs it. To produce it: {how_to[name]}.")
    return path


def wide_tables() -> None:
    """Print DataFrames as the pages' wide tables: 200 characters, up to 30 columns and 250 rows."""
    import pandas as pd  # here, so that importing this module stays cheap

    pd.set_option("display.width", 200, "display.max_columns", 30, "display.max_rows", 250)


MISSING = "–"  # how a table shows a missing value


def _column_formatter(values, digits: int):
    """A formatter for one column: whole numbers as integers, other floats with ``digits`` decimals, missing
    values as a dash, everything else as ``str``."""
    import math
    import numbers

    numeric = [v for v in values if isinstance(v, numbers.Real) and not isinstance(v, bool)
               and not (isinstance(v, float) and math.isnan(v))]
    whole = all(float(v).is_integer() for v in numeric if not math.isinf(v))

    def fmt(value) -> str:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return MISSING
        try:
            import pandas as pd

            if value is pd.NA or value is pd.NaT:
                return MISSING
        except ImportError:  # pragma: no cover
            pass
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            return str(value)
        if isinstance(value, numbers.Integral) or (whole and not math.isinf(value)):
            return f"{int(value)}"
        return f"{value:.{digits}f}"

    return fmt


class Table:
    """A DataFrame as a page shows it (see :func:`table`): HTML in a notebook, aligned text elsewhere."""

    def __init__(self, df, digits: int | dict = 3, index: bool | None = None):
        if index is None:  # a named index (a pivot's, a groupby's) or one of labels names the rows; row numbers don't
            index = any(name is not None for name in df.index.names) or df.index.dtype == object
        self.df, self.index = df, index
        per_column = digits if isinstance(digits, dict) else {}
        default = 3 if isinstance(digits, dict) else digits
        self.formatters = {c: _column_formatter(df[c].tolist(), per_column.get(c, default)) for c in df.columns}

    def _formatted(self):
        out = self.df.copy()
        for column, fmt in self.formatters.items():
            out[column] = [fmt(v) for v in self.df[column].tolist()]
        return out

    def _repr_html_(self) -> str:
        formatted = self._formatted()
        html = formatted.to_html(index=self.index, border=0, classes="report-table", na_rep=MISSING, escape=True)
        return html.replace('<tr style="text-align: right;">', "<tr>")

    def __repr__(self) -> str:
        return self._formatted().to_string(index=self.index)


def table(df, digits: int | dict = 3, index: bool | None = None) -> Table:
    """``df`` as a page shows it: the pandas index only where it names the rows (a named index, as a pivot's or a
    groupby's, or one of labels; ``index`` forces either), whole-number columns as integers, other floats with
    ``digits`` decimals (an int, or a dict per column), missing values as a dash."""
    return Table(df, digits=digits, index=index)


# A diff line's colours by its first character: added, removed, hunk header (inline styles: the same wherever the
# HTML is shown, with no style sheet to load).
DIFF_STYLES = {"+": "background:#e6ffec;color:#116329", "-": "background:#ffebe9;color:#82071e",
               "@": "background:#ddf4ff;color:#0550ae"}
DIFF_KINDS = {"+": "added", "-": "removed", "@": "hunk"}


class DiffView(str):
    """A unified diff (see :func:`diff_view`): coloured HTML in a notebook, a ```diff block elsewhere."""

    def _kind(self, line: str) -> str | None:
        if line.startswith(("+++", "---")):
            return None
        return DIFF_KINDS.get(line[:1])

    def _repr_html_(self) -> str:
        import html

        rows = []
        for line in str(self).splitlines():
            kind = self._kind(line)
            attributes = f' class="diff-{kind}" style="display:block;{DIFF_STYLES[line[:1]]}"' if kind else \
                ' style="display:block"'
            rows.append(f"<span{attributes}>{html.escape(line) or ' '}</span>")
        style = "font-family:var(--jp-code-font-family,monospace);font-size:12px;line-height:1.35;padding:6px 8px"
        return f'<pre class="diff-view" style="{style};overflow-x:auto">' + "".join(rows) + "</pre>"

    def _repr_markdown_(self) -> str:
        return "```diff\n" + str(self) + "\n```"


def diff_view(diff: str) -> DiffView:
    """A unified diff as a page shows it: added lines green, removed lines red, hunk headers blue."""
    return DiffView(diff)


def shown(path: str | os.PathLike) -> str:
    """``path`` as a page prints it: relative to the repository root when it lies inside it, else its name."""
    path = Path(path).resolve()
    root = find_repo_root(path if path.is_dir() else path.parent) or find_repo_root()
    try:
        return path.relative_to(root).as_posix() if root else path.name
    except ValueError:
        return path.name


def quiet_interpreter() -> None:
    """Hide the numpy RuntimeWarnings of Triton's CPU interpreter (``invalid value encountered in subtract`` on
    ``-inf - -inf``, an overflow in ``exp2``): the kernels compute those infinities and NaNs on purpose and mask
    them, silently on a GPU. Only warnings raised inside the interpreter are hidden."""
    import warnings

    warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"triton\.runtime\.interpreter")


def say(markdown: str) -> None:
    """Show ``markdown`` as prose of the page: for sentences that state a number or a comparison, computed from the
    data beside them instead of written into a Markdown cell."""
    from IPython.display import Markdown, display

    display(Markdown(markdown))


def compared(ratio: float, tolerance: float = 0.02, *, lower: str = "faster than", same: str = "level with",
             higher: str = "slower than") -> str:
    """The words for ``ratio`` (a time over another's): ``same`` within ``tolerance`` of 1, else ``lower`` below it,
    ``higher`` above it."""
    if abs(ratio - 1) <= tolerance:
        return same
    return lower if ratio < 1 else higher


def span(values, fmt: str = ".2f", unit: str = "") -> str:
    """``values`` as a range, "0.90–1.02" (one value: "0.90"), with ``unit`` after it."""
    values = [float(v) for v in values]
    low, high = min(values), max(values)
    text = f"{low:{fmt}}" if f"{low:{fmt}}" == f"{high:{fmt}}" else f"{low:{fmt}}–{high:{fmt}}"
    return text + unit


def listing(items) -> str:
    """"a", "a and b", "a, b and c"."""
    items = [str(i) for i in items]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1] if items else ""
