"""Build the report: execute every notebook with papermill, render HTML without code, write an index.

    python -m perfutils.report --notebooks notebooks/01_*.ipynb ... --out reports

Notebooks run from the repository root with their default parameters (MODE "auto": replay the
committed data/ without a GPU, measure with one). Figures land in reports/figures (the notebooks'
FIG_DIR default); executed notebooks in reports/notebooks; HTML pages in reports/.
"""

from __future__ import annotations

import argparse
import html
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def execute_notebook(notebook: Path, out_dir: Path, parameters: dict | None = None) -> tuple[Path, float]:
    import papermill

    out_dir.mkdir(parents=True, exist_ok=True)
    executed = out_dir / "notebooks" / notebook.name
    executed.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    papermill.execute_notebook(
        str(notebook),
        str(executed),
        parameters=parameters or {},
        cwd=str(REPO_ROOT),
        kernel_name="python3",
        progress_bar=False,
        log_output=False,
    )
    return executed, time.perf_counter() - start


def render_html(executed: Path, out_dir: Path) -> Path:
    import nbformat
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(exclude_input=True, exclude_input_prompt=True, exclude_output_prompt=True)
    body, _ = exporter.from_notebook_node(nbformat.read(executed, as_version=4))
    page = out_dir / f"{executed.stem}.html"
    page.write_text(body, encoding="utf-8")
    return page


def write_index(pages: list[Path], failures: dict[str, str], out_dir: Path) -> Path:
    items = "\n".join(f'<li><a href="{p.name}">{html.escape(p.stem)}</a></li>' for p in pages)
    failed = "\n".join(f"<li>{html.escape(k)}: {html.escape(v)}</li>" for k, v in failures.items())
    index = out_dir / "index.html"
    index.write_text(
        "<!doctype html><meta charset='utf-8'><title>Fused loss kernels on H100: report</title>"
        f"<h1>Fused loss kernels on H100</h1><ul>{items}</ul>"
        + (f"<h2>Failed notebooks</h2><ul>{failed}</ul>" if failures else ""),
        encoding="utf-8",
    )
    return index


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

    def run(nb: Path):
        try:
            executed, seconds = execute_notebook(nb, out_dir)
            page = render_html(executed, out_dir)
            print(f"  ok    {nb.name}  ({seconds:.0f} s)", flush=True)
            return nb, page, None
        except Exception as error:  # keep building the other notebooks, report at the end
            print(f"  FAIL  {nb.name}: {type(error).__name__}: {str(error)[:300]}", flush=True)
            return nb, None, f"{type(error).__name__}: {error}"

    print(f"Executing {len(notebooks)} notebooks with papermill ({jobs} at a time)...", flush=True)
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for nb, page, error in pool.map(run, notebooks):
            if error:
                failures[nb.name] = error
            else:
                pages.append(page)
    index = write_index(sorted(pages), failures, out_dir)
    print(f"Report: {index}  (figures in {out_dir / 'figures'}; {time.perf_counter() - started:.0f} s)")
    if failures:
        print(f"{len(failures)} notebook(s) failed: {', '.join(failures)}", file=sys.stderr)
        return 1
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m perfutils.report", description=__doc__.splitlines()[0])
    parser.add_argument("--notebooks", nargs="+", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "reports")
    parser.add_argument("--jobs", type=int, default=int(os.environ.get("REPORT_JOBS", "2")))
    args = parser.parse_args(argv)
    return build_report(args.notebooks, args.out, jobs=args.jobs)


if __name__ == "__main__":
    sys.exit(main())
