"""The report's landing page (perfutils.report_index via perfutils.report.write_index), built into a fake
report folder (pages and figures are placeholder files): no papermill run. The data and notebooks are the
repository's own, so the page is checked against what data/ and notebooks/ hold."""

from __future__ import annotations

import html
import json
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest

from perfutils.plots import summary
from perfutils.report import write_index
from perfutils.report_index import PEER_VOCABS_16384, data_dates, notebook_entry, question_of

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


def markdown_rows(markdown: str) -> list[list[str]]:
    """The rows (header first) of the Markdown table at the start of ``markdown``, cell texts unescaped."""
    table = [line for line in markdown.splitlines() if line.startswith("|")]
    return [[html.unescape(c.strip()) for c in line.strip("|").split("|")] for line in table if not line.startswith("|---")]


def assert_on_page(page, markdown: str) -> None:
    """The table of ``markdown`` is on the page cell for cell, and every paragraph after it word for word."""
    rows = markdown_rows(markdown)
    assert len(rows) > 1
    assert rows in page.tables  # header and every row, as perfutils.plots.summary computes them
    table_lines = sum(1 for line in markdown.splitlines() if line.startswith("|"))
    for paragraph in "\n".join(markdown.splitlines()[table_lines:]).split("\n\n"):
        if paragraph.strip():
            text = " ".join(html.unescape(paragraph).replace("`", "").split())
            assert text in " ".join(page.text.split()), paragraph[:80]


def test_index_holds_the_headline_results_table(built):
    _, page, _ = built
    assert_on_page(page, summary.vocab_sweep_table(GPU_DIR))


@pytest.mark.parametrize("gpu_slug", ["h100-sxm-80gb", "h200"])
def test_index_holds_the_results_tables_of_every_gpu(built, gpu_slug):
    """The tables that once lived in the README, on the landing page, generated from the data: the vocab sweep of
    each GPU (the H200's: a GPU without tuning sweeps), the H100's peers at 16384 tokens (the table and its
    source line, not the whole grid's worst cells again), the one-process grid and the tensor-parallel study."""
    _, page, _ = built
    gpu_dir = REPO / "data" / gpu_slug
    assert_on_page(page, summary.vocab_sweep_table(gpu_dir))
    if gpu_slug == "h100-sxm-80gb":
        table = summary.vocab_sweep_table(gpu_dir, tokens=16384, vocabs=PEER_VOCABS_16384, grid_lines=False)
        assert "Worst cell" not in table and "16384 tokens" in table
        assert_on_page(page, table)
        assert_on_page(page, summary.public_call_table(gpu_dir))
        assert_on_page(page, summary.tensor_parallel_table(gpu_dir))


def test_index_puts_the_notebooks_before_the_results(built):
    """The map of the collection comes first; the results tables after it, with units in their headers."""
    _, page, _ = built
    text = page.text
    assert text.index("The notebooks") < text.index("Results:") < text.index("Where things are")
    header = page.tables[0][0]  # the first table: the H100's vocab sweep
    assert "public call (ms)" in header and "% of copy" in header


def test_index_lists_the_learning_path_in_order(built):
    """After the notebooks' map, the learning path's steps in their order, each with its question."""
    from perfutils.learning_path import STEPS

    _, page, _ = built
    text = " ".join(page.text.split())
    assert text.index("The notebooks") < text.index("The learning path") < text.index("Results:")
    places = [text.index(" ".join(f"{step.title}: {step.question}".replace("`", "").split())) for step in STEPS]
    assert places == sorted(places)


def test_index_names_the_gpu_versions_and_dates(built):
    _, page, _ = built
    meta = json.loads((GPU_DIR / "benchmark.json").read_text())
    for key in ("gpu_name", "torch_version", "triton_version", "driver_version", "cuda_version"):
        assert str(meta[key]) in page.text, key
    assert f"{meta['copy_gbps']:.0f} GB/s" in page.text
    sidecars = {p.stem: json.loads(p.read_text()) for p in GPU_DIR.glob("*.json")}
    dates = data_dates(GPU_DIR, sidecars)  # the days of the studies' rows
    rows = pd.read_csv(GPU_DIR / "vocab_sweep.csv")["timestamp_utc"].astype(str).str[:10]
    assert rows.min() in dates and rows.max() in dates and meta["timestamp_utc"][:10] in dates
    assert (dates[0] if dates[0] == dates[-1] else f"{dates[0]} to {dates[-1]}") in page.text
    current = [stem for stem in sidecars if ".replaced-" not in stem]  # a study's recordings kept aside are not studies
    assert f"data/{GPU_DIR.name}/ ({len(current)} stud" in page.text


def test_studies_count_sets_kept_recordings_apart():
    from perfutils.report_index import _studies_count

    assert _studies_count({"vocab_sweep": {}}) == "1 study"
    assert _studies_count({"a": {}, "b": {}, "a.replaced-20261129T230132Z": {}}) == \
        "2 studies, 1 earlier recording kept aside"


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


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=[n.stem for n in NOTEBOOKS])
def test_every_cell_has_an_id(notebook):
    """nbformat 4.5 cells carry ids (a missing one is a warning in every papermill and nbconvert run, an error in a
    future nbformat): a cell added by hand or by a script must get one."""
    nb = json.loads(notebook.read_text(encoding="utf-8"))
    assert (nb["nbformat"], nb["nbformat_minor"]) >= (4, 5)
    assert [i for i, cell in enumerate(nb["cells"]) if not cell.get("id")] == []
