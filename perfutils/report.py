"""Build the report: execute every notebook with papermill, render HTML without code, write an index.

    python -m perfutils.report --notebooks notebooks/01_*.ipynb ... --out reports

Notebooks run from the repository root with their default parameters (MODE "auto": replay the
committed data/ without a GPU, measure with one). Figures land in reports/figures (the notebooks'
FIG_DIR default); executed notebooks in reports/notebooks; HTML pages in reports/; the landing page
reports/index.html (perfutils.report_index) shows the data's GPU and dates, the headline results and
each notebook's question and main figure.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


CELL_TIMEOUT_S = 1200  # a cell running longer fails its notebook: a hang becomes an error, not an endless wait


def _ipc_kernel_manager(folder: str):
    """A kernel manager whose kernel talks over local (IPC) sockets in ``folder``, not TCP: nothing listens on a
    port, and ipykernel has no reason to warn about unencrypted TCP."""
    from jupyter_client.manager import AsyncKernelManager

    class IPCKernelManager(AsyncKernelManager):
        def __init__(self, **kwargs):
            super().__init__(transport="ipc", ip=os.path.join(folder, "kernel"), **kwargs)

        async def _async_interrupt_kernel(self):
            # jupyter_client interrupts a kernel before shutting it down; a notebook that has finished has nothing
            # to interrupt, and ipykernel would log "KeyboardInterrupt caught in kernel" as an error.
            if not self.shutting_down:
                await super()._async_interrupt_kernel()

    return IPCKernelManager


OUTPUT_PARAMETERS = {"FIG_DIR": "figures", "TABLE_DIR": "tables"}  # notebook parameters naming where it writes


def output_parameters(notebook: Path, out_dir: Path) -> dict:
    """FIG_DIR/TABLE_DIR under ``out_dir`` for the notebooks that have those parameters, so that a report built
    anywhere holds its own figures (the landing page's thumbnails and the pages read them there)."""
    import json
    import re

    cells = json.loads(Path(notebook).read_text(encoding="utf-8"))["cells"]
    source = "\n".join("".join(c["source"]) for c in cells if "parameters" in c.get("metadata", {}).get("tags", []))
    return {name: str(out_dir / sub) for name, sub in OUTPUT_PARAMETERS.items()
            if re.search(rf"^{name}\s*[:=]", source, flags=re.M)}


def execute_notebook(notebook: Path, out_dir: Path, parameters: dict | None = None) -> tuple[Path, float]:
    import papermill

    out_dir.mkdir(parents=True, exist_ok=True)
    executed = out_dir / "notebooks" / notebook.name
    executed.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="report-kernel-") as sockets:
        papermill.execute_notebook(
            str(notebook),
            str(executed),
            parameters={**output_parameters(notebook, out_dir), **(parameters or {})},
            cwd=str(REPO_ROOT),
            kernel_name="python3",
            progress_bar=False,
            log_output=False,
            execution_timeout=CELL_TIMEOUT_S,
            kernel_manager_class=_ipc_kernel_manager(sockets),
        )
    return executed, time.perf_counter() - start


TEMPLATE_DIR = Path(__file__).resolve().parent / "report_template"  # the pages' nbconvert template
MATHJAX_DIR = "mathjax"  # under the report folder: MathJax 2.7, copied from the jupyter-server-mathjax package
WIDGET_NOTE = ('<p class="report-note">An interactive explorer (ipywidgets) stands here: it needs a live kernel. '
               "Open the notebook in JupyterLab (<code>make lab</code>) to use it; the figures above show its "
               "starting point.</p>")


def install_mathjax(out_dir: Path) -> Path:
    """Copy MathJax into ``out_dir/mathjax`` (once) so that the pages typeset their math offline."""
    import shutil

    import jupyter_server_mathjax

    source = Path(jupyter_server_mathjax.__file__).resolve().parent / "static"
    target = out_dir / MATHJAX_DIR
    if not (target / "MathJax.js").is_file():
        shutil.copytree(source, target, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("mathmaps", "SVG", "STIX-Web"))
    return target


def static_outputs(nb):
    """The notebook as a static page shows it: widget views (a live kernel's) become a note saying where to use
    them, and the widget state that would make the page load a widget manager from the internet is dropped."""
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if "application/vnd.jupyter.widget-view+json" in data:
                output["data"] = {"text/html": WIDGET_NOTE}
    return nb


def page_links(body: str) -> str:
    """Links between notebooks (``12_learning_path.ipynb#...``, which JupyterLab follows) as links between the
    report's pages (``12_learning_path.html#...``)."""
    return re.sub(r'href="(\d\d_[A-Za-z0-9_]+)\.ipynb', r'href="\1.html', body)


def render_html(executed: Path, out_dir: Path) -> Path:
    import nbformat
    from nbconvert import HTMLExporter

    install_mathjax(out_dir)
    exporter = HTMLExporter(template_name=TEMPLATE_DIR.name, extra_template_basedirs=[str(TEMPLATE_DIR.parent)],
                            mathjax_url=f"{MATHJAX_DIR}/MathJax.js", exclude_input=True, exclude_input_prompt=True,
                            exclude_output_prompt=True)
    body, _ = exporter.from_notebook_node(static_outputs(nbformat.read(executed, as_version=4)))
    body = page_links(body)
    page = out_dir / f"{executed.stem}.html"
    page.write_text(body, encoding="utf-8")
    return page


def write_index(notebooks: list[Path], pages: list[Path], failures: dict[str, str], out_dir: Path,
                data_dir: Path = REPO_ROOT / "data", readme: Path = REPO_ROOT / "README.md") -> tuple[Path, list[str]]:
    """Write out_dir/index.html (perfutils.report_index); returns it and the problems met building it."""
    from .report_index import render_index

    page, problems = render_index(notebooks=notebooks, pages=pages, failures=failures, out_dir=out_dir,
                                  data_dir=data_dir, readme=readme)
    index = out_dir / "index.html"
    index.write_text(page, encoding="utf-8")
    return index, problems


def _build_one(nb: Path, out_dir: Path) -> tuple[Path, Path | None, str | None]:
    """Execute and render one notebook (in a worker process); failures are returned, not raised, so the other
    notebooks still build and the report lists what failed."""
    try:
        executed, seconds = execute_notebook(nb, out_dir)
        page = render_html(executed, out_dir)
        print(f"  ok    {nb.name}  ({seconds:.0f} s)", flush=True)
        return nb, page, None
    except Exception as error:
        print(f"  FAIL  {nb.name}: {type(error).__name__}: {str(error)[:300]}", flush=True)
        return nb, None, f"{type(error).__name__}: {error}"


def build_report(notebooks: list[Path], out_dir: Path, jobs: int = 2) -> int:
    out_dir = out_dir.resolve()
    notebooks = [Path(n).resolve() for n in notebooks]
    missing = [str(n) for n in notebooks if not n.exists()]
    if missing:
        raise FileNotFoundError(f"notebooks not found: {missing}")
    if not notebooks:
        raise ValueError("no notebooks given (expected notebooks/NN_topic.ipynb files)")
    started = time.perf_counter()
    pages, failures = [], {}

    print(f"Executing {len(notebooks)} notebooks with papermill ({jobs} at a time, one process each)...", flush=True)
    # Processes, not threads: papermill's kernel clients share asyncio and ZMQ state within a process, and two of
    # them driven from threads once left a notebook waiting forever for a kernel that had gone idle.
    with ProcessPoolExecutor(max_workers=max(1, jobs), mp_context=multiprocessing.get_context("spawn")) as pool:
        for nb, page, error in pool.map(_build_one, notebooks, [out_dir] * len(notebooks)):
            if error:
                failures[nb.name] = error
            else:
                pages.append(page)
    index, problems = write_index(notebooks, sorted(pages), failures, out_dir)
    print(f"Report: {index}  (figures in {out_dir / 'figures'}; {time.perf_counter() - started:.0f} s)")
    if failures:
        print(f"{len(failures)} notebook(s) failed: {', '.join(failures)}", file=sys.stderr)
    for problem in problems:
        print(f"index page: {problem}", file=sys.stderr)
    return 1 if failures or problems else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m perfutils.report", description=__doc__.splitlines()[0])
    parser.add_argument("--notebooks", nargs="+", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "reports")
    parser.add_argument("--jobs", type=int, default=int(os.environ.get("REPORT_JOBS", "2")))
    args = parser.parse_args(argv)
    return build_report(args.notebooks, args.out, jobs=args.jobs)


if __name__ == "__main__":
    sys.exit(main())
