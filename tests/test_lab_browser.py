"""JupyterLab in a real browser: notebook 04's occupancy explorer and notebook 12's knob respond to their widgets.

What a person does after ``make lab``, done by headless Chromium (Debian's ``chromium``, driven by the
Python ``playwright`` package; no browser download): start JupyterLab on 127.0.0.1 (a free port, a
random token) with the project's ``python3`` kernel, open ``notebooks/04_occupancy_explorer.ipynb``,
Run > Run All Cells, then move the explorer's "regs/thread" slider and pick another compute capability
in its "cc" dropdown. After each change the explorer's text must be what ``perfutils.model.occupancy`` and the
performance model give for the values the widgets now show (the blocks per SM and the predicted time must actually
change). Notebook 12 (the learning path) likewise: Run All, pick another tile in its knob's dropdown, and the printed
prediction must become the performance model's for the new configuration.

Skipped when no Chromium is found (``$CHROMIUM``, ``chromium`` on PATH, /usr/bin/chromium) or
playwright is not installed. Everything is bounded: each browser action, the server start and the
notebook run have timeouts, and the server, its kernel and the browser are stopped in all cases. The
server and its kernel get fresh config, data, runtime, settings, IPython, matplotlib and Triton cache
folders (no warm cache, no user settings), autosave is off (the notebook in the repository is checked
unchanged afterwards), and the browser may only reach 127.0.0.1 (anything else is aborted and reported).

    make test-lab                                        # just this test
    LAB_BROWSER_SCREENSHOT=lab.png make test-lab         # also keep a screenshot of the explorer
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import pytest

REPO = Path(__file__).resolve().parent.parent
NOTEBOOK = "notebooks/04_occupancy_explorer.ipynb"
SERVER_START_S = 120  # JupyterLab up and answering /api/status
ACTION_MS = 60_000  # any single browser action or wait
RUN_ALL_S = 480  # Run All Cells on a busy 2-core machine, with a cold Triton cache
STOP_S = 20  # graceful shutdown before SIGKILL
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# Settings a fresh user would otherwise meet: autosave would write outputs into the repository's
# notebook, the news prompt covers the page, and windowing leaves cells out of view out of the DOM.
LAB_SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false", "checkForUpdates": False},
}


def find_chromium() -> str | None:
    """$CHROMIUM when set (and only it), else ``chromium`` on PATH, else Debian's /usr/bin/chromium."""
    if os.environ.get("CHROMIUM"):
        candidates = [os.environ["CHROMIUM"]]
    else:
        candidates = [shutil.which("chromium"), "/usr/bin/chromium"]
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


CHROMIUM = find_chromium()
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason=f"no Chromium: {os.environ.get('CHROMIUM') or 'chromium on PATH or /usr/bin/chromium'} not found "
           "(apt-get install chromium, or set $CHROMIUM to a Chromium binary)")
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the test extra has it)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def local_get(url: str, timeout: float = 5.0) -> bytes:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # 127.0.0.1 only, never a proxy
    with opener.open(url, timeout=timeout) as response:
        return response.read()


def tail(path: Path, chars: int = 4000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else "(no log)"


def stop_process_tree(proc: subprocess.Popen) -> None:
    """SIGTERM the server (it shuts its kernels down), then SIGKILL whatever it started that is left."""
    import psutil  # ipykernel's dependency

    try:
        children = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=STOP_S)
    _, alive = psutil.wait_procs(children, timeout=STOP_S)
    for child in alive:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass


@pytest.fixture
def lab_server(tmp_path):
    """A JupyterLab server on 127.0.0.1 serving the repository; yields (base url, token, its log file)."""
    port, token = free_port(), secrets.token_hex(16)
    dirs = {name: tmp_path / name for name in ("config", "data", "runtime", "settings", "workspaces",
                                                  "ipython", "mpl", "triton")}
    for folder in dirs.values():
        folder.mkdir()
    for name, values in LAB_SETTINGS.items():
        path = dirs["settings"] / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    env = dict(os.environ, JUPYTER_PREFER_ENV_PATH="1", JUPYTER_CONFIG_DIR=str(dirs["config"]),
               JUPYTER_DATA_DIR=str(dirs["data"]), JUPYTER_RUNTIME_DIR=str(dirs["runtime"]),
               JUPYTERLAB_SETTINGS_DIR=str(dirs["settings"]), JUPYTERLAB_WORKSPACES_DIR=str(dirs["workspaces"]),
               IPYTHONDIR=str(dirs["ipython"]), MPLCONFIGDIR=str(dirs["mpl"]), TRITON_CACHE_DIR=str(dirs["triton"]))
    env.pop("TRITON_INTERPRET", None)  # the notebook's own default (tests/conftest.py sets it for the kernels' tests)
    command = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
               f"--ServerApp.port={port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
               f"--ServerApp.root_dir={REPO}", "--LabApp.extension_manager=readonly", "--LabApp.news_url=None",
               "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    if os.geteuid() == 0:
        command.append("--allow-root")
    log = tmp_path / "server.log"
    with open(log, "wb") as sink:
        proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=sink, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + SERVER_START_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"jupyter lab exited with {proc.returncode}:\n{tail(log)}")
            try:
                local_get(f"{base}/api/status?token={token}")
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"jupyter lab did not answer within {SERVER_START_S} s:\n{tail(log)}")
                time.sleep(0.5)
        yield base, token, log
    finally:
        stop_process_tree(proc)


STDERR = ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']"  # tracebacks, warnings


def prompts(page) -> list[str]:
    return [t.strip() for t in page.locator(".jp-Notebook .jp-CodeCell .jp-InputPrompt").all_inner_texts()]


def run_all_cells(page, log: Path) -> None:
    """Run > Run All Cells, then wait until the fresh kernel has run every code cell in order, [1] to [N].

    (Cells whose output nbval compares keep their saved execution counts in git, so a count alone does
    not say a cell ran in this session.)
    """
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
    deadline, started = time.monotonic() + RUN_ALL_S, False
    while True:
        shown = prompts(page)
        if shown == [f"[{i}]:" for i in range(1, len(shown) + 1)]:
            return
        running = any(p == "[*]:" for p in shown)
        if not running and (started or page.locator(STDERR).count()):
            break  # stopped before the end: a cell failed
        started = started or running
        if time.monotonic() > deadline:
            pytest.fail(f"cells still running after {RUN_ALL_S} s: prompts {shown}\nserver log:\n{tail(log)}")
        page.wait_for_timeout(500)
    errors = page.locator(STDERR).all_inner_texts()
    pytest.fail(f"Run All stopped: prompts {shown}\nerrors:\n" + "\n".join(e[-2000:] for e in errors))


def slider(page, label: str):
    return page.locator(".widget-slider").filter(has=page.locator(".widget-label", has_text=re.compile(f"^{label}$")))


def explorer_state(page) -> dict:
    """The values the explorer's widgets show, read from the page."""
    readout = lambda label: int(slider(page, label).locator(".widget-readout").inner_text().strip())
    return {"cc": page.locator(".widget-dropdown select").input_value(), "threads": readout("threads/block"),
            "regs": readout("regs/thread"), "shared_kib": readout("shared KiB")}


@functools.lru_cache(maxsize=1)
def explorer_what_if() -> dict:
    """The kernel notebook 04's explorer predicts for (its parameters cell's defaults), as the notebook builds it."""
    import perfutils.plots.occupancy as pocc

    params = parameters(NOTEBOOK)
    return pocc.explorer_what_if(REPO / params["DATA_DIR"] / params["GPU_SLUG"], loss=params["LOSS"],
                                 target_format=params["TARGET_FORMAT"], variant=params["VARIANT"],
                                 vocab=params["VOCAB"], block_size=params["BLOCK_SIZE"],
                                 num_warps=params["NUM_WARPS"], tokens=params["TOKENS"])


def explorer_occupancy(state: dict):
    """The explorer's own call (notebook 04's ``show``) for these widget values, run here."""
    from perfutils.model.occupancy import occupancy

    shared = state["shared_kib"] * 1024
    return occupancy(state["cc"], threads_per_block=state["threads"], registers_per_thread=state["regs"],
                     dynamic_shared_bytes=shared, opt_in=shared > 48 * 1024)


def expected_text(state: dict) -> str:
    """What the explorer must print for these widget values: the occupancy, the tutorial formula and the model's
    prediction (perfutils.plots.occupancy.explorer_text, the notebook's own call)."""
    import perfutils.plots.occupancy as pocc

    return pocc.explorer_text(state["cc"], state["threads"], state["regs"], state["shared_kib"] * 1024,
                              explorer_what_if())


def normalized(text: str) -> str:
    return " ".join(text.split())


def wait_for_explorer_text(page, want: str) -> str:
    """Poll the explorer's output until it shows ``want`` (bounded); return what it shows."""
    output = page.locator(".widget-output")
    deadline = time.monotonic() + ACTION_MS / 1000
    while True:
        shown = output.inner_text()
        if normalized(shown) == normalized(want) or time.monotonic() > deadline:
            return shown
        page.wait_for_timeout(250)


@contextlib.contextmanager
def lab_notebook(lab_server, tmp_path, notebook: str):
    """A headless Chromium page with ``notebook`` open in JupyterLab and its kernel idle; on failure a screenshot
    and the server log are printed; afterwards the notebook in the repository must be unchanged."""
    base, token, log = lab_server
    notebook_bytes = (REPO / notebook).read_bytes()
    blocked: list[str] = []

    def only_loopback(route):
        if urlsplit(route.request.url).hostname == "127.0.0.1" or route.request.url.startswith("data:"):
            route.continue_()
        else:
            blocked.append(route.request.url)
            route.abort()

    with sync_api.sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"), executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS,
            viewport={"width": 1400, "height": 1000}, timeout=ACTION_MS)
        page = None
        try:
            context.set_default_timeout(ACTION_MS)
            context.route("**/*", only_loopback)
            page = context.new_page()
            page.goto(f"{base}/lab/tree/{notebook}?token={token}", timeout=ACTION_MS)
            page.locator(".jp-NotebookPanel .jp-Notebook").wait_for()
            # The status bar once the kernel started: "Python 3" is make's kernelspec, "Python 3 (ipykernel)" the
            # default of a plain `pip install -e ".[notebooks,test]"`.
            page.get_by_text(re.compile(r"^Python 3( \(ipykernel\))? \| Idle$")).wait_for()
            yield page
        except Exception:
            if page is not None:
                shot = tmp_path / "failure.png"
                try:
                    page.screenshot(path=str(shot), timeout=10_000)
                    print(f"screenshot of the failure: {shot}")
                except Exception as error:  # the report of the original failure matters more
                    print(f"no screenshot: {error}")
            print(f"server log tail:\n{tail(log)}\nrequests blocked (not 127.0.0.1): {blocked}")
            raise
        finally:
            context.close()

    assert (REPO / notebook).read_bytes() == notebook_bytes, f"{notebook} was modified in the repository"
    print(f"requests blocked (not 127.0.0.1): {blocked or 'none'}")


def test_occupancy_explorer_in_jupyterlab(lab_server, tmp_path):
    log = lab_server[2]
    with lab_notebook(lab_server, tmp_path, NOTEBOOK) as page:
        run_all_cells(page, log)
        # The static figures come first: two matplotlib images above the widgets.
        assert page.locator(".jp-OutputArea-output img").count() >= 2

        output = page.locator(".widget-output")
        output.wait_for()
        before = explorer_state(page)
        shown = wait_for_explorer_text(page, expected_text(before))
        assert normalized(shown) == normalized(expected_text(before)), shown

        # Move "regs/thread" to a value that changes the blocks per SM (typed into its readout,
        # as a person does for an exact value), then check the text follows.
        regs = next(r for r in (64, 32, 96, 160, 255) if r != before["regs"]
                    and explorer_occupancy({**before, "regs": r}).blocks_per_sm
                    != explorer_occupancy(before).blocks_per_sm)
        readout = slider(page, "regs/thread").locator(".widget-readout")
        readout.fill(str(regs))
        readout.press("Enter")
        after = explorer_state(page)
        assert after == {**before, "regs": regs}, after
        shown = wait_for_explorer_text(page, expected_text(after))
        assert normalized(shown) == normalized(expected_text(after)), shown
        assert f"blocks/SM: {explorer_occupancy(after).blocks_per_sm} " in shown
        assert f"{regs} registers/thread" in shown
        # The knob moved the prediction: the model's line is another one (programs per SM changed).
        model_line = lambda text: next(line for line in text.splitlines() if line.startswith("model ("))
        assert model_line(shown) != model_line(expected_text(before)), shown

        # Another compute capability from the dropdown: the SM limits change with it.
        page.locator(".widget-dropdown select").select_option("8.6")
        other = explorer_state(page)
        assert other["cc"] == "8.6"
        shown = wait_for_explorer_text(page, expected_text(other))
        assert normalized(shown) == normalized(expected_text(other)), shown
        assert shown.startswith("sm_86:") and "ceilings recorded for sm_90 only" in shown

        if os.environ.get("LAB_BROWSER_SCREENSHOT"):
            slider(page, "regs/thread").scroll_into_view_if_needed()
            page.screenshot(path=os.environ["LAB_BROWSER_SCREENSHOT"])


PATH_NOTEBOOK = "notebooks/12_learning_path.ipynb"


def parameters(notebook: str) -> dict:
    """The literals of a notebook's ``parameters`` cell."""
    import ast

    cells = json.loads((REPO / notebook).read_text())["cells"]
    source = next("".join(c["source"]) for c in cells if "parameters" in c.get("metadata", {}).get("tags", []))
    return {node.targets[0].id if isinstance(node, ast.Assign) else node.target.id: ast.literal_eval(node.value)
            for node in ast.parse(source).body if isinstance(node, (ast.Assign, ast.AnnAssign))}


def dropdown(page, label: str):
    return page.locator(".widget-dropdown").filter(has=page.locator(".widget-label", has_text=re.compile(f"^{label}$")))


def test_learning_path_knob_in_jupyterlab(lab_server, tmp_path):
    """Notebook 12's knob: pick another tile in its dropdown; the printed text must become the model's prediction for
    the new (tile, warps) from the recorded counts and from today's offline sm_90 compile (perfutils.learning_path.
    knob_text of knob_prediction and knob_compiled, the notebook's own calls, on a machine without a GPU) and differ.
    The step diffs show coloured added and removed lines."""
    from perfutils import learning_path as lp

    params = parameters(PATH_NOTEBOOK)
    assert params["MODE"] != "measure"  # the test's machine has no GPU: the knob compiles offline
    shape = dict(loss=params["KNOB_LOSS"], target_format=params["KNOB_TARGET_FORMAT"], vocab=params["KNOB_VOCAB"],
                 tokens=params["KNOB_TOKENS"])
    data = REPO / params["DATA_DIR"]
    expected = lambda tile, warps: lp.knob_text(lp.knob_prediction(data, tile, warps, **shape),
                                                lp.knob_compiled(data, tile, warps, **shape))
    with lab_notebook(lab_server, tmp_path, PATH_NOTEBOOK) as page:
        run_all_cells(page, lab_server[2])
        assert page.locator(".jp-OutputArea-output img").count() >= 1  # the static figure above the widget
        backgrounds = {kind: page.locator(f".diff-view .diff-{kind}").first.evaluate(
            "e => getComputedStyle(e).backgroundColor") for kind in ("added", "removed")}
        assert backgrounds == {"added": "rgb(230, 255, 236)", "removed": "rgb(255, 235, 233)"}, backgrounds
        page.locator(".widget-output").wait_for()
        value = lambda label: int(dropdown(page, label).locator("select").input_value())
        tile, warps = value("tile"), value("warps")
        first = expected(tile, warps)
        shown = wait_for_explorer_text(page, first)
        assert normalized(shown) == normalized(first), shown

        other = next(int(t) for t in lp.knob_options(data, **shape)["block_size"].unique() if int(t) != tile
                     and expected(int(t), warps) != first)
        dropdown(page, "tile").locator("select").select_option(str(other))
        assert (value("tile"), value("warps")) == (other, warps)
        want = expected(other, warps)
        shown = wait_for_explorer_text(page, want)
        assert normalized(shown) == normalized(want), shown
        assert normalized(shown) != normalized(first)
        if os.environ.get("LAB_BROWSER_SCREENSHOT"):
            dropdown(page, "tile").scroll_into_view_if_needed()
            page.screenshot(path=os.environ["LAB_BROWSER_SCREENSHOT"].replace(".png", "_12.png"))
