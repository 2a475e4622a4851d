"""The report's landing page (perfutils.report_index via perfutils.report.write_index), built into a fake
report folder (pages and figures are placeholder files): no papermill run. The data and notebooks are the
repository's own, so the page is checked against what data/ and notebooks/ hold."""

from __future__ import annotations

import html
import json
from html.parser import HTMLParser
from pathlib import Path

import pytest

from perfutils.plots import summary
from perfutils.report import write_index
from perfutils.report_index import notebook_entry, question_of

REPO = Path(__file__).resolve().parent.parent
GPU_DIR = REPO / "data" / "h100-sxm-80gb"
NOTEBOOKS = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))
FAILED = NOTEBOOKS[-1]  # the fake report treats the last notebook as failed
ERROR = "PapermillExecutionError: cell 7 raised ValueError: no measured row"


class Page(HTMLParser):
    """Text, elements with their attributes, and tables (rows of cell texts) of an HTML page."""

    def __init__(self, text: str):
        super().__init__()
        self.elements: list[tuple[str, dict]] = []
        self.tables: list[list[list[str]]] = []
        self.chunks: list[str] = []
        self._cell: list[str] | None = None
        self.feed(text)
        self.text = " ".join("".join(self.chunks).split())

    def handle_starttag(self, tag, attrs):
        self.elements.append((tag, dict(attrs)))
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append(" ".join("".join(self._cell).split()))
            self._cell = None

    def handle_data(self, data):
        self.chunks.append(data)
        if self._cell is not None:
            self._cell.append(data)

    def attrs(self, tag: str, name: str) -> list[str]:
        return [a[name] for t, a in self.elements if t == tag and name in a]


def plain(markdown: str) -> str:
    return " ".join(markdown.replace("`", "").replace("**", "").split())


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "reports"
    (out / "figures").mkdir(parents=True)
    pages = []
    for notebook in NOTEBOOKS:
        if notebook != FAILED:
            pages.append(out / f"{notebook.stem}.html")
            pages[-1].write_text("<!doctype html><title>page</title>", encoding="utf-8")
        figure = notebook_entry(notebook).figure
        for suffix in (".png", ".svg"):
            (out / "figures" / f"{figure}{suffix}").write_bytes(b"placeholder")
    index, problems = write_index(NOTEBOOKS, pages, {FAILED.name: ERROR}, out)
    return out, Page(index.read_text(encoding="utf-8")), problems


def test_index_builds_without_problems(built):
    _, _, problems = built
    assert problems == []


def test_index_holds_the_headline_results_table(built):
    _, page, _ = built
    markdown = summary.vocab_sweep_table(GPU_DIR)
    lines = markdown.splitlines()
    table = [line for line in lines if line.startswith("|")]
    rows = [[html.unescape(c.strip()) for c in line.strip("|").split("|")]
            for line in table if not line.startswith("|---")]
    assert len(rows) > 1
    assert rows in page.tables  # header and every row, cell for cell, as perfutils.plots.summary computes them
    for paragraph in "\n".join(lines[len(table):]).split("\n\n"):
        if paragraph.strip():
            assert " ".join(html.unescape(paragraph).split()) in " ".join(page.text.split()), paragraph[:80]


def test_index_names_the_gpu_versions_and_dates(built):
    _, page, _ = built
    meta = json.loads((GPU_DIR / "benchmark.json").read_text())
    for key in ("gpu_name", "torch_version", "triton_version", "driver_version", "cuda_version"):
        assert str(meta[key]) in page.text, key
    assert f"{meta['copy_gbps']:.0f} GB/s" in page.text
    dates = sorted(str(m["timestamp_utc"])[:10] for m in map(json.loads, map(Path.read_text, GPU_DIR.glob("*.json")))
                   if m.get("gpu_name") == meta["gpu_name"] and m.get("timestamp_utc"))
    assert meta["timestamp_utc"][:10] in dates
    assert (dates[0] if dates[0] == dates[-1] else f"{dates[0]} to {dates[-1]}") in page.text


def test_index_has_each_notebook_with_question_thumbnail_and_link(built):
    out, page, _ = built
    links, images = page.attrs("a", "href"), page.attrs("img", "src")
    for notebook in NOTEBOOKS:
        entry = notebook_entry(notebook)
        assert plain(entry.title) in page.text and plain(entry.question) in page.text, notebook.name
        assert f"figures/{entry.figure}.png" in images, notebook.name
        assert (f"{notebook.stem}.html" in links) == (notebook != FAILED), notebook.name
    assert ERROR in page.text  # failures stay listed
    for src in images:
        assert (out / src).is_file(), src


def test_index_points_to_data_and_figures_locally(built):
    out, page, _ = built
    links = page.attrs("a", "href")
    for name in ("benchmark.csv", "benchmark.json", "blocksize_sweep.csv"):
        target = [h for h in links if h.endswith(f"data/{GPU_DIR.name}/{name}")]
        assert target and (out / target[0]).resolve() == (GPU_DIR / name).resolve(), name
    assert "figures/" in links and "notebooks/" in links
    remote = [v for t, a in page.elements for k, v in a.items() if k in ("href", "src") and "://" in v]
    assert remote == [] and "script" not in {t for t, _ in page.elements}  # static, no external resources


def test_missing_data_and_figures_are_reported(tmp_path):
    out = tmp_path / "reports"
    out.mkdir()
    index, problems = write_index(NOTEBOOKS[:1], [], {}, out, data_dir=tmp_path / "no-data")
    page = Page(index.read_text(encoding="utf-8"))
    assert problems and problems[0] in page.text
    assert f"figures/{notebook_entry(NOTEBOOKS[0]).figure}.png not found" in page.text


def test_every_notebook_carries_a_question_and_a_main_figure():
    for notebook in NOTEBOOKS:
        entry = notebook_entry(notebook)
        assert entry.question.endswith("?"), (notebook.name, entry.question)
        assert entry.figure and entry.figure.startswith(notebook.stem[:3]), (notebook.name, entry.figure)


def test_question_of_first_markdown_cell():
    cell = "# 09 · Title\n\n**Question.** Some context. Why is it **slow**? And `how`\nfast?\n\nMore? No."
    assert question_of(cell) == "Why is it slow? And `how` fast?"
    assert question_of("# T\n\n**The report.** It ran 3× slower. Then more.") == "It ran 3× slower."
    assert question_of("# only a title") == ""
