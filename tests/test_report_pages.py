"""The report's pages as a reader gets them: a small report is built here (two light notebooks, executed with
papermill and rendered as ``make report`` does, plus the landing page), then

* every page shows each figure its notebook saves, prints no Python repr of a path or an object, no path of the
  machine that built it, no stderr box, and loads nothing from the internet (no script, style, image or font
  from another host);
* in headless Chromium (Debian's ``chromium``, driven by playwright as in tests/test_lab_browser.py; skipped with
  the reason where there is none), the landing page and a notebook page with formulas render offline: every image
  loads, every formula is typeset by the MathJax copied into the report, no request leaves the machine.

And over every notebook (no build): a notebook that reads recorded measurements (``data/<gpu>/<study>.csv``) puts
them beside today's code — the kernels it shows, checks, lists or compiles offline — so its page says which kernel
sources the recorded rows come from (``perfutils.provenance.code_note`` / ``rows_code_note``), and shows that note
(displayed, or a cell's last expression); the built pages carry it.

    REPORT_SCREENSHOTS=/some/folder make test-python PYTEST_ARGS="-k report_pages"   # keeps the screenshots
"""

from __future__ import annotations

import json
import os
import re
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from perfutils.provenance import NOTE_CLASS

REPO = Path(__file__).resolve().parent.parent
BUILT = ["07_fusion", "10_tensor_parallel"]  # light ones: seconds each; 07 has formulas, 10 four figures
MATH_PAGE = "07_fusion"
REPR = re.compile(r"PosixPath\(|WindowsPath\(|<[A-Za-z_][\w.]* object at 0x[0-9a-f]+>|\[PosixPath")
# Calls that compute with today's kernels next to recorded counts, and calls that read recorded measurements: a page
# making either must say which kernel sources the recorded rows come from.
CURRENT_CODE_CALLS = ("compare_offline_measured(", "offline_counts(", "compile_launch(")
RECORDED_DATA = re.compile(r"\b(load_records|load_study|load_metadata|read_csv)\(")
NOTES = ("code_note", "rows_code_note")


class Resources(HTMLParser):
    """What a page loads (script/img/link/iframe/source/video/audio sources), its text and its stderr outputs."""

    LOADING = {"script": "src", "img": "src", "iframe": "src", "source": "src", "video": "src", "audio": "src",
               "embed": "src", "object": "data"}

    def __init__(self, text: str):
        super().__init__()
        self.loads: list[str] = []
        self.images: list[str] = []
        self.stderr = 0
        self.chunks: list[str] = []
        self._skip = 0
        self.feed(text)
        self.text = " ".join("".join(self.chunks).split())

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag in self.LOADING and attrs.get(self.LOADING[tag]):
            self.loads.append(attrs[self.LOADING[tag]])
        if tag == "link" and attrs.get("href") and "stylesheet" in (attrs.get("rel") or "") + "icon preload":
            self.loads.append(attrs["href"])
        if tag == "img":
            self.images.append(attrs.get("src", ""))
        if attrs.get("data-mime-type") == "application/vnd.jupyter.stderr":
            self.stderr += 1
        if tag in ("script", "style"):
            self._skip += 1

    def handle_endtag(self, tag):
        if tag in ("script", "style"):
            self._skip -= 1

    def handle_data(self, data):
        if not self._skip:
            self.chunks.append(data)


def remote(url: str) -> bool:
    return url.startswith("//") or urlsplit(url).scheme in ("http", "https", "ftp", "ws", "wss")


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """A report folder built by perfutils.report from BUILT (papermill + the pages' template + the landing page)."""
    from perfutils.report import build_report

    out = tmp_path_factory.mktemp("report") / "reports"
    notebooks = [REPO / "notebooks" / f"{name}.ipynb" for name in BUILT]
    assert build_report(notebooks, out, jobs=2) == 0
    return out


def saved_figures(out: Path, name: str) -> list[Path]:
    return sorted((out / "figures").glob(f"{name[:2]}_*.png"))


@pytest.mark.parametrize("name", BUILT)
def test_page_shows_every_figure_its_notebook_saves(report, name):
    page = Resources((report / f"{name}.html").read_text(encoding="utf-8"))
    saved = saved_figures(report, name)
    assert saved, f"{name} saved no figure"
    inline = [src for src in page.images if src.startswith("data:image/")]
    assert len(inline) >= len(saved), (name, len(inline), [p.name for p in saved])


@pytest.mark.parametrize("name", BUILT + ["index"])
def test_page_prints_no_reprs_no_build_paths_no_stderr(report, name):
    text = (report / f"{name}.html").read_text(encoding="utf-8")
    page = Resources(text)
    assert not REPR.search(page.text), REPR.search(page.text).group(0)
    for folder in {str(REPO), str(report.parent), str(Path.home())}:
        assert folder not in page.text, f"{name} names the build machine's folder {folder}"
    assert page.stderr == 0, f"{name} shows {page.stderr} stderr output(s) (warnings, tracebacks)"


@pytest.mark.parametrize("name", BUILT + ["index"])
def test_page_loads_nothing_from_the_internet(report, name):
    text = (report / f"{name}.html").read_text(encoding="utf-8")
    page = Resources(text)
    assert [u for u in page.loads if remote(u)] == []
    assert not re.search(r"@import\s+(url\()?['\"]?(https?:)?//", text)
    assert not re.search(r"url\(\s*['\"]?(https?:)?//", text)
    for url in page.loads:  # what it loads locally is there
        if not url.startswith("data:"):
            assert (report / urlsplit(url).path).is_file(), url


def _code_cells(path: Path) -> list[str]:
    return ["".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]


def _notes_not_shown(cells: list[str]) -> list[str]:
    """The code-note calls of a notebook whose sentence never reaches its page: neither inside ``display(...)``, nor
    its cell's last expression, nor assigned to a name the notebook displays."""
    import ast

    def note_call(node) -> bool:
        return (isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute))
                and (node.func.id if isinstance(node.func, ast.Name) else node.func.attr) in NOTES)

    shown_names = set(re.findall(r"\bdisplay\((\w+)\)", "\n".join(cells)))
    hidden = []
    for source in cells:
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        last = tree.body[-1] if tree.body else None
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                if not note_call(child):
                    continue
                displayed = (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                             and node.func.id == "display")
                last_expression = isinstance(node, ast.Expr) and node is last
                assigned = isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id in shown_names for t in node.targets)
                if not (displayed or last_expression or assigned):
                    hidden.append(ast.get_source_segment(source, child)[:80])
    return hidden


def test_notebooks_with_recorded_data_say_which_kernel_sources_they_come_from(report):
    """Static over every notebook, and on the built pages: recorded measurements (or today's kernels beside recorded
    counts) come with a note naming their kernel sources, and the note is shown."""
    for path in sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        cells = _code_cells(path)
        code = "\n".join(cells)
        if RECORDED_DATA.search(code) or any(call in code for call in CURRENT_CODE_CALLS):
            assert any(f"{note}(" in code for note in NOTES), (
                f"{path.name} shows recorded measurements (or compares today's kernels with recorded counts) without "
                "saying which kernel sources they come from (perfutils.provenance.code_note / rows_code_note)")
        assert _notes_not_shown(cells) == [], f"{path.name}: a code note that never reaches the page"
    for name in BUILT:
        if RECORDED_DATA.search("\n".join(_code_cells(REPO / "notebooks" / f"{name}.ipynb"))):
            assert f'class="{NOTE_CLASS}' in (report / f"{name}.html").read_text(), name


def test_a_code_note_that_is_computed_but_not_shown_is_caught():
    """The static check's own test: a note assigned and dropped is caught; displayed, last or shown by name is not."""
    assert _notes_not_shown(['note = code_note("rows", meta)\nprint(1)']) == ['code_note("rows", meta)']
    assert _notes_not_shown(['display(rows_code_note("rows", df, meta))\nprint(1)']) == []
    assert _notes_not_shown(['print(1)\ncode_note("rows", meta)']) == []
    assert _notes_not_shown(['n = code_note("rows", meta)', "display(n)"]) == []


# ---- headless Chromium ---------------------------------------------------------------------------------------------

def _chromium():
    from test_lab_browser import CHROMIUM, CHROMIUM_FLAGS

    return CHROMIUM, CHROMIUM_FLAGS


@pytest.fixture(scope="module")
def browser_page():
    chromium, flags = _chromium()
    if chromium is None:
        pytest.skip("no Chromium: chromium on PATH or /usr/bin/chromium not found (apt-get install chromium, or set "
                    "$CHROMIUM); .ci/run installs it")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the test extra has it)")
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, headless=True, args=flags)
        try:
            context = browser.new_context(viewport={"width": 1366, "height": 900})  # a laptop's width
            blocked: list[str] = []

            def local_only(route):
                url = route.request.url
                if url.startswith(("file:", "data:", "about:")):
                    route.continue_()
                else:
                    blocked.append(url)
                    route.abort()

            context.route("**/*", local_only)
            yield context, blocked
        finally:
            browser.close()


def open_page(context, path: Path, wait_ms: int = 60_000):
    page = context.new_page()
    failed: list[str] = []
    page.on("requestfailed", lambda request: failed.append(request.url))
    page.goto(path.as_uri(), wait_until="load", timeout=wait_ms)
    return page, failed


def screenshot(page, name: str, tmp_path: Path) -> Path:
    folder = Path(os.environ.get("REPORT_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    shot = folder / f"{name}.png"
    page.screenshot(path=str(shot), full_page=True)
    return shot


def images_loaded(page) -> tuple[int, list[str]]:
    return page.evaluate("""() => {
        const imgs = Array.from(document.images);
        imgs.forEach(i => i.scrollIntoView());
        return [imgs.length, imgs.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src.slice(0, 80))];
    }""")


def test_landing_page_renders_in_chromium(report, browser_page, tmp_path):
    context, blocked = browser_page
    page, failed = open_page(context, report / "index.html")
    page.wait_for_function("() => Array.from(document.images).every(i => i.complete)", timeout=30_000)
    count, broken = images_loaded(page)
    assert count >= len(BUILT) and broken == [], broken  # the cards' thumbnails of the pages built
    assert page.locator("h2#notebooks").bounding_box()["y"] < page.locator("table.results").first.bounding_box()["y"]
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 1366, f"the landing page is {width} px wide at a 1366 px window"
    screenshot(page, "index", tmp_path)
    assert blocked == [] and failed == [], (blocked, failed)


def test_notebook_page_renders_figures_and_math_in_chromium(report, browser_page, tmp_path):
    context, blocked = browser_page
    page, failed = open_page(context, report / f"{MATH_PAGE}.html")
    # MathJax typesets after load: wait until its queue is done (MathJax.Hub.queue.pending 0 and no unprocessed math)
    page.wait_for_function("""() => window.MathJax && MathJax.Hub && MathJax.Hub.queue && !MathJax.Hub.queue.pending
                              && document.querySelectorAll('.MathJax, .MathJax_Display').length > 0""", timeout=60_000)
    count, broken = images_loaded(page)
    assert count >= len(saved_figures(report, MATH_PAGE)) and broken == [], broken
    typeset = page.locator(".MathJax, .MathJax_Display").count()
    errors = page.locator(".MathJax_Error").count() + page.get_by_text("Math Processing Error").count()
    raw = page.evaluate("() => document.querySelector('main').innerText")
    leftover = re.findall(r"\$[^$\n]*\\[a-z]+[^$\n]*\$", raw)  # TeX still between dollars: not typeset
    assert typeset > 0 and errors == 0 and leftover == [], (typeset, errors, leftover[:3])
    screenshot(page, MATH_PAGE, tmp_path)
    # MathJax's combined configuration probes for its HTML-CSS fonts (not shipped, not used: the math is MathML the
    # browser draws); any other failed request is a missing file of the report.
    probes = [u for u in failed if "/mathjax/" in u and ("/fonts/" in u or u.startswith("about:"))]
    assert blocked == [] and sorted(set(failed) - set(probes)) == [], (blocked, failed)


NOTEBOOK_LINK = re.compile(r"\]\((\d\d_[A-Za-z0-9_]+)\.ipynb(?:#([^)\s]+))?\)")


def heading_anchor(line: str) -> str:
    """The id JupyterLab and nbconvert give a Markdown heading (spaces as '-', '#' percent-encoded, code marks
    dropped)."""
    return line.lstrip("#").strip().replace("`", "").replace(" ", "-").replace("#", "%23")


def test_links_between_notebooks_name_a_notebook_and_a_heading_it_has():
    from perfutils.report import page_links

    found = 0
    for path in sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] != "markdown":
                continue
            for target, anchor in NOTEBOOK_LINK.findall("".join(cell["source"])):
                found += 1
                linked = REPO / "notebooks" / f"{target}.ipynb"
                assert linked.is_file(), f"{path.name} links to {target}.ipynb, which does not exist"
                if anchor:
                    headings = {heading_anchor(line) for c in json.loads(linked.read_text())["cells"]
                                if c["cell_type"] == "markdown" for line in "".join(c["source"]).splitlines()
                                if line.startswith("#")}
                    assert anchor in headings, f"{path.name}: {target}.ipynb has no heading #{anchor}"
    assert found >= 3  # notebooks 02 and 10 link into the learning path
    assert page_links('<a href="12_learning_path.ipynb#x">') == '<a href="12_learning_path.html#x">'
    assert page_links('<a href="https://a.b/12_x.ipynb">') == '<a href="https://a.b/12_x.ipynb">'


def test_built_pages_link_to_pages_not_notebooks(report):
    body = (report / "10_tensor_parallel.html").read_text(encoding="utf-8")
    assert 'href="12_learning_path.html#' in body and ".ipynb#" not in body
