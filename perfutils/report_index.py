"""The report's landing page, reports/index.html: what the collection is, then the map of the collection (each
notebook with its question, a thumbnail of its main figure and a link to its rendered page), then the results of
each GPU (its facts, the dates of its data, the results tables), then where the files are.

Nothing here states a result; every part is read from a file:

* title and introduction: README.md's first heading and first paragraph;
* GPU and versions: the JSON sidecars in ``data/<gpu-slug>/`` (``benchmark.json`` describes the GPU); the dates:
  the ``timestamp_utc`` of the rows of its studies (of the sidecars where a study's rows have none);
* the results tables: ``perfutils.plots.summary``'s, from the files each one reads (:func:`result_tables`):
  ``vocab_sweep.csv`` at 4096 tokens and, where the peers were timed there, at 16384; ``public_call.csv`` (every
  provider in one process); ``host_overhead.csv`` (the host cost of a repeated call and of its autograd form, piece
  by piece); ``autograd_step.csv`` (the autograd form against the plain call in a step with an output head);
  ``tensor_parallel.csv``; ``benchmark.csv`` when there is no vocab sweep;
* a notebook's title and question: its first markdown cell (the heading, and the sentences ending in "?"
  of the first paragraph that asks one; else that cell's first sentence);
* a notebook's main figure: the first figure its code saves (its first ``save_figure(..., "NN_name")``),
  shown from ``<report>/figures/NN_name.png``.

Static HTML, inline CSS, no external resources; links are relative to the report folder.
"""

from __future__ import annotations

import html
import json
import os
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

SAVE_FIGURE = re.compile(r"""save_figure\([^,()]+,[^)]*?["']([^"']+)["']""")
SENTENCE_END = re.compile(r"(?<=[.?!])\s+(?=[A-Z0-9(`\"'])")

CSS = """
body{font:15px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1d232b;margin:0;background:#f6f7f9}
main{max-width:1180px;margin:0 auto;padding:28px 24px 48px}
h1{font-size:27px;margin:0 0 8px}h2{font-size:20px;margin:34px 0 10px;border-bottom:1px solid #d9dde3;padding-bottom:4px}
p{margin:6px 0}a{color:#0b5cad}code{font:13px ui-monospace,SFMono-Regular,Menlo,monospace;background:#eceff3;
padding:0 3px;border-radius:3px}.intro{max-width:900px;font-size:16px}
.facts{display:grid;grid-template-columns:max-content 1fr;gap:2px 16px;background:#fff;border:1px solid #d9dde3;
border-radius:6px;padding:12px 16px;margin:8px 0}.facts dt{color:#5b6570}.facts dd{margin:0}
table{border-collapse:collapse;background:#fff;margin:8px 0;font-variant-numeric:tabular-nums}
th,td{border:1px solid #d9dde3;padding:4px 9px}th{background:#eef1f5;text-align:left}
.results td:not(:first-child){text-align:right}.results td:first-child{white-space:nowrap}.scroll{max-width:100%;overflow-x:auto}.jump{font-size:14px}.note{color:#5b6570;font-size:13.5px;max-width:1000px}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(340px,1fr));gap:16px}
.card{background:#fff;border:1px solid #d9dde3;border-radius:6px;padding:12px 14px;display:flex;flex-direction:column}
.card h3{font-size:16px;margin:0 0 6px}.card .question{font-size:14px;flex:1}
.thumb{display:block;height:210px;margin-top:10px;border:1px solid #eef1f5;background:#fff}
.thumb img{width:100%;height:100%;object-fit:contain}.missing{color:#8a939c;font-size:13px;padding:80px 0;text-align:center}
.failed{border-color:#d33;background:#fff5f5}.badge{color:#fff;background:#c62828;border-radius:3px;padding:0 5px;font-size:12px}
.errors{background:#fff5f5;border:1px solid #d33;border-radius:6px;padding:8px 16px}.errors pre{white-space:pre-wrap;margin:2px 0}
footer{color:#5b6570;font-size:13px;margin-top:32px}
"""


@dataclass
class NotebookEntry:
    name: str  # file stem, e.g. "04_occupancy_explorer"
    title: str  # the first markdown cell's heading (markdown)
    question: str  # markdown
    figure: str | None  # stem of the first figure the notebook saves


def markdown_html(text: str) -> str:
    from nbconvert.filters import markdown2html  # the renderer of the notebook pages

    return markdown2html(text)


def inline_html(text: str) -> str:
    """Markdown of one line as HTML without the paragraph around it."""
    rendered = markdown_html(text).strip()
    return re.sub(r"^<p>(.*)</p>$", r"\1", rendered, flags=re.S)


def _source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def question_of(markdown: str) -> str:
    """The question a notebook's first markdown cell asks (see the module docstring)."""
    paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", markdown)]
    paragraphs = [p for p in paragraphs if p and not p.startswith("#")]
    for paragraph in paragraphs:
        asked = [s for s in SENTENCE_END.split(paragraph.replace("**", "")) if s.endswith("?")]
        if asked:
            return " ".join(asked)
    if not paragraphs:
        return ""
    unlabelled = re.sub(r"^\*\*[^*]{1,40}\.\*\*\s*", "", paragraphs[0])  # "**The report.** ..."
    return SENTENCE_END.split(unlabelled.replace("**", ""))[0]


def notebook_entry(path: Path) -> NotebookEntry:
    cells = json.loads(Path(path).read_text(encoding="utf-8")).get("cells", [])
    first_md = next((_source(c) for c in cells if c.get("cell_type") == "markdown"), "")
    heading = next((line.lstrip("#").strip() for line in first_md.splitlines() if line.startswith("#")), "")
    code = "\n".join(_source(c) for c in cells if c.get("cell_type") == "code")
    saved = SAVE_FIGURE.search(code)
    return NotebookEntry(name=Path(path).stem, title=heading or Path(path).stem, question=question_of(first_md),
                         figure=Path(saved.group(1)).name if saved else None)


def readme_intro(readme: Path) -> tuple[str, str]:
    """README's first heading and first paragraph (markdown); empty strings without a README."""
    if not readme.is_file():
        return "", ""
    text = readme.read_text(encoding="utf-8")
    title = next((line.lstrip("#").strip() for line in text.splitlines() if line.startswith("# ")), "")
    body = text.split("\n## ", 1)[0]
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", body) if p.strip() and not p.lstrip().startswith("#")]
    return title, paragraphs[0] if paragraphs else ""


def _stamp(meta: dict) -> str | None:
    value = meta.get("timestamp_utc") or meta.get("time_utc")
    return str(value)[:10] if value else None


def _sidecars(gpu_dir: Path) -> dict[str, dict]:
    out = {}
    for path in sorted(gpu_dir.glob("*.json")):
        try:
            out[path.stem] = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            out[path.stem] = {}
    return out


def _rel(target: Path, out_dir: Path) -> str:
    return Path(os.path.relpath(target, out_dir)).as_posix()


def data_dates(gpu_dir: Path, sidecars: dict[str, dict]) -> list[str]:
    """The days (YYYY-MM-DD) the GPU's studies were measured: their rows' ``timestamp_utc``, or the sidecar's time
    for a study whose rows carry none, sorted."""
    import csv

    gpu = (sidecars.get("benchmark") or next(iter(sidecars.values()), {})).get("gpu_name")
    days = set()
    for stem, meta in sidecars.items():
        if meta.get("gpu_name") not in (None, gpu):
            continue
        rows = set()
        path = gpu_dir / f"{stem}.csv"
        if path.is_file():
            with open(path, newline="", encoding="utf-8") as handle:
                rows = {r["timestamp_utc"][:10] for r in csv.DictReader(handle) if r.get("timestamp_utc")}
        days |= rows or ({d} if (d := _stamp(meta)) else set())
    return sorted(days)


def _studies_count(sidecars: dict[str, dict]) -> str:
    """'N studies' and the recordings an update kept aside beside them (``<stem>.replaced-<UTC>``, perfutils.data.store)."""
    kept = sum(".replaced-" in stem for stem in sidecars)
    studies = len(sidecars) - kept
    return (f"{studies} stud{'y' if studies == 1 else 'ies'}"
            + (f", {kept} earlier recording{'' if kept == 1 else 's'} kept aside" if kept else ""))


def gpu_facts_html(gpu_dir: Path, sidecars: dict[str, dict]) -> str:
    meta = sidecars.get("benchmark") or sidecars.get("vocab_sweep") or next(iter(sidecars.values()), {})
    dates = data_dates(gpu_dir, sidecars)
    cc = meta.get("compute_capability")
    facts = [
        ("GPU", meta.get("gpu_name")),
        ("compute capability", ".".join(map(str, cc)) if isinstance(cc, (list, tuple)) else cc),
        ("SMs", meta.get("sm_count")),
        ("L2", f"{meta['l2_bytes'] / 2**20:.0f} MiB" if meta.get("l2_bytes") else None),
        ("measured copy bandwidth", f"{meta['copy_gbps']:.0f} GB/s" if meta.get("copy_gbps") else None),
        ("driver · CUDA", " · ".join(str(meta[k]) for k in ("driver_version", "cuda_version") if meta.get(k)) or None),
        ("torch · Triton · ptxas", " · ".join(str(meta[k]) for k in ("torch_version", "triton_version", "ptxas_version")
                                             if meta.get(k)) or None),
        ("measured (UTC), all its studies", (dates[0] if dates[0] == dates[-1] else f"{dates[0]} to {dates[-1]}")
         if dates else None),
        ("data", f"data/{gpu_dir.name}/ ({_studies_count(sidecars)}; each table below names its file and dates)"),
    ]
    rows = "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(str(v))}</dd>" for k, v in facts if v not in (None, ""))
    return f'<dl class="facts">{rows}</dl>'


PEER_VOCABS_16384 = (32000, 32768, 128256, 131072, 151936)  # where the peers were timed at 16384 tokens


def _peers_at(gpu_dir: Path, tokens: int) -> bool:
    import pandas as pd

    df = pd.read_csv(gpu_dir / "vocab_sweep.csv", usecols=["variant", "tokens", "status"])
    return bool(((df["tokens"] == tokens) & (df["status"] == "ok") & df["variant"].isin(["fast_llm", "torch_compile"])).any())


def result_tables(gpu_dir: Path) -> list[tuple[str, str, callable]]:
    """(heading, file, markdown maker) of each results table ``gpu_dir`` has the data for, in page order."""
    from .plots import summary

    tables = []
    if (gpu_dir / "vocab_sweep.csv").exists():
        tables.append(("What users call, against the peers: 4096 tokens", "vocab_sweep.csv",
                       lambda: summary.vocab_sweep_table(gpu_dir)))
        if _peers_at(gpu_dir, 16384):
            tables.append(("The same at 16384 tokens, where the peers were timed", "vocab_sweep.csv",
                           lambda: summary.vocab_sweep_table(gpu_dir, tokens=16384, vocabs=PEER_VOCABS_16384,
                                                             grid_lines=False)))
    elif (gpu_dir / "benchmark.csv").exists():
        tables.append(("The kernels against the peers", "benchmark.csv", lambda: summary.benchmark_table(gpu_dir)))
    if (gpu_dir / "public_call.csv").exists():
        tables.append(("Every provider of a cell in one process", "public_call.csv",
                       lambda: summary.public_call_table(gpu_dir)))
    if (gpu_dir / "host_overhead.csv").exists():
        tables.append(("What a repeated call costs the host", "host_overhead.csv",
                       lambda: summary.host_overhead_table(gpu_dir)))
    if (gpu_dir / "autograd_step.csv").exists():
        tables.append(("The autograd form in a training step: the loss behind an output head", "autograd_step.csv",
                       lambda: summary.autograd_step_table(gpu_dir)))
    if (gpu_dir / "tensor_parallel.csv").exists():
        tables.append(("Tensor parallel: the vocabulary split over two GPUs", "tensor_parallel.csv",
                       lambda: summary.tensor_parallel_table(gpu_dir)))
    return tables


def results_html(markdown: str) -> str:
    rendered = markdown_html(markdown).replace("<table>", '<div class="scroll"><table class="results">')
    return rendered.replace("</table>", "</table></div>").replace("<p>", '<p class="note">')


def studies_html(gpu_dir: Path, sidecars: dict[str, dict], out_dir: Path) -> str:
    rows = []
    for csv in sorted(gpu_dir.glob("*.csv")):
        meta = sidecars.get(csv.stem, {})
        sidecar = csv.with_suffix(".json")
        links = f'<a href="{html.escape(_rel(csv, out_dir))}">{html.escape(csv.name)}</a>'
        if sidecar.exists():
            links += f' · <a href="{html.escape(_rel(sidecar, out_dir))}">{html.escape(sidecar.name)}</a>'
        rows.append(f"<tr><td>{links}</td><td>{html.escape(_stamp(meta) or '')}</td>"
                    f"<td>{html.escape(str(meta.get('gpu_name') or ''))}</td></tr>")
    extra = []
    logs = gpu_dir / "logs"
    if logs.is_dir():
        extra.append(f'<p>Logs that pages and notes cite: <a href="{html.escape(_rel(logs, out_dir))}/">'
                     f"data/{gpu_dir.name}/logs/</a> ({sum(1 for _ in logs.iterdir())} files)</p>")
    archive = gpu_dir / "archive"
    if archive.is_dir():
        extra.append(f'<p>Kept aside (earlier recordings, uncited logs; read by no page): <a href="'
                     f'{html.escape(_rel(archive, out_dir))}/">data/{gpu_dir.name}/archive/</a></p>')
    return ("<table><tr><th>study (CSV · JSON sidecar)</th><th>recorded (sidecar, UTC)</th><th>where</th></tr>"
            + "".join(rows) + "</table>" + "".join(extra))


def card_html(entry: NotebookEntry, page: Path | None, error: str | None, out_dir: Path) -> str:
    title = inline_html(entry.title)
    link = f'<a href="{html.escape(page.name)}">{title}</a>' if page else title
    figure = None
    if entry.figure:
        figure = next((out_dir / "figures" / f"{entry.figure}.{ext}" for ext in ("png", "svg")
                       if (out_dir / "figures" / f"{entry.figure}.{ext}").exists()), None)
    if figure:
        thumb = (f'<img src="{html.escape(_rel(figure, out_dir))}" loading="lazy" '
                 f'alt="{html.escape(entry.figure)}">')
        thumb = f'<a class="thumb" href="{html.escape(page.name if page else _rel(figure, out_dir))}">{thumb}</a>'
    else:
        what = f"figures/{entry.figure}.png not found" if entry.figure else "this notebook saves no figure"
        thumb = f'<div class="thumb missing">{html.escape(what)}</div>'
    failed = f'<p><span class="badge">failed</span> {html.escape(error.splitlines()[0][:300])}</p>' if error else ""
    return (f'<article class="card{" failed" if error else ""}" id="{html.escape(entry.name)}"><h3>{link}</h3>'
            f'<p class="question">{inline_html(entry.question)}</p>{failed}{thumb}</article>')


LEARNING_PATH = "12_learning_path"  # the notebook that walks the design steps (perfutils.learning_path)


def learning_path_html(page: Path | None) -> str:
    """The learning path's steps in order, each with its question, linking to the notebook's page."""
    from .learning_path import STEPS

    link = (lambda text: f'<a href="{html.escape(page.name)}">{text}</a>') if page else (lambda text: text)
    items = "".join(f"<li>{link(inline_html(step.title))}: {inline_html(step.question)}</li>" for step in STEPS)
    return ('<h2 id="path">The learning path</h2><p>From the #497 kernel to the fastest kernels, one design step at a '
            "time: each step's kernel source, the model's prediction and the recorded H100 time.</p>"
            f'<ol class="path">{items}</ol>')


def render_index(*, notebooks: list[Path], pages: list[Path], failures: dict[str, str], out_dir: Path,
                 data_dir: Path, readme: Path) -> tuple[str, list[str]]:
    """The landing page's HTML and the problems met while building it (also listed on the page)."""
    out_dir, data_dir = Path(out_dir), Path(data_dir)
    problems: list[str] = []
    title, intro = readme_intro(readme)
    title = title or "Fused loss kernels: report"

    by_stem = {p.stem: p for p in pages}
    cards = []
    for notebook in notebooks:
        try:
            entry = notebook_entry(notebook)
        except (OSError, ValueError) as error:
            problems.append(f"{Path(notebook).name}: cannot read it: {error}")
            entry = NotebookEntry(Path(notebook).stem, Path(notebook).stem, "", None)
        cards.append(card_html(entry, by_stem.get(entry.name), failures.get(Path(notebook).name), out_dir))

    path = (learning_path_html(by_stem.get(LEARNING_PATH))
            if any(Path(notebook).stem == LEARNING_PATH for notebook in notebooks) else "")

    data_parts = []
    gpu_dirs = sorted(d for d in data_dir.iterdir() if d.is_dir() and any(d.glob("*.json"))) if data_dir.is_dir() else []
    sidecars = {gpu_dir: _sidecars(gpu_dir) for gpu_dir in gpu_dirs}  # read once, used by the facts and the list
    for gpu_dir in gpu_dirs:
        meta = sidecars[gpu_dir].get("benchmark") or sidecars[gpu_dir].get("vocab_sweep") or {}
        name = meta.get("gpu_name") or gpu_dir.name
        data_parts.append(f'<h2 id="{html.escape(gpu_dir.name)}">Results: {html.escape(str(name))}</h2>'
                          + gpu_facts_html(gpu_dir, sidecars[gpu_dir]))
        for heading, source, make in result_tables(gpu_dir):
            try:
                data_parts.append(f"<h3>{html.escape(heading)}</h3>" + results_html(make()))
            except Exception as error:  # the page still lists the notebooks; the failure is shown
                problems.append(f"results table of data/{gpu_dir.name}/{source}: {type(error).__name__}: {error}")
    if not gpu_dirs:
        problems.append(f"no recorded data (no data/<gpu-slug>/*.json under {data_dir})")

    where = [f'<li>Figures (SVG + PNG): <a href="figures/">{html.escape(str(out_dir.name))}/figures/</a></li>',
             f'<li>Executed notebooks: <a href="notebooks/">{html.escape(str(out_dir.name))}/notebooks/</a></li>']
    for gpu_dir in gpu_dirs:
        where.append(f"<li>Measurements: data/{html.escape(gpu_dir.name)}/ — one tidy CSV per study with its JSON "
                     f"sidecar (GPU, versions, parameters, date)" + studies_html(gpu_dir, sidecars[gpu_dir], out_dir)
                     + "</li>")

    listed = {**failures, **{f"index page ({i + 1})": p for i, p in enumerate(problems)}}
    errors = ""
    if listed:
        items = "".join(f"<li><b>{html.escape(k)}</b><pre>{html.escape(v[:2000])}</pre></li>" for k, v in listed.items())
        errors = f'<section class="errors"><h2>Failures ({len(listed)})</h2><ul>{items}</ul></section>'

    jump = " · ".join(['<a href="#notebooks">the notebooks</a>'] + (['<a href="#path">the learning path</a>'] if path else [])
                      + [f'<a href="#{html.escape(d.name)}">results on {html.escape(d.name)}</a>' for d in gpu_dirs]
                      + ['<a href="#where">where things are</a>'])
    built = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    body = (f"<main><h1>{html.escape(title)}</h1>"
            f'<div class="intro">{markdown_html(intro)}</div><p class="jump">{jump}</p>{errors}'
            + f'<h2 id="notebooks">The notebooks</h2><div class="grid">{"".join(cards)}</div>' + path
            + "".join(data_parts)
            + f'<h2 id="where">Where things are</h2><ul>{"".join(where)}</ul>'
            + f"<footer>Built {built} by <code>make report</code> (<code>python -m perfutils.report</code>): "
              "each notebook executed with papermill, replaying the recorded data without a GPU, measuring with "
              "one.</footer></main>")
    page = (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" '
            f'content="width=device-width,initial-scale=1"><title>{html.escape(title)}</title>'
            f"<style>{CSS}</style></head><body>{body}</body></html>")
    return page, problems
