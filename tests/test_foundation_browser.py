"""The lessons as a learner meets them: JupyterLab in a real browser, Run All, and every cell ran.

One JupyterLab server on a free local port serves a copy of the first lesson of each part (so
Run All never writes into the repository); headless Chromium, driven by Playwright, opens each
one, runs the JupyterLab command Run All, waits for the kernel to be idle, then checks that every
code cell has an execution count, that no cell printed an error or anything on stderr, and that
every image in the outputs was decoded by the browser (naturalWidth > 0), as many as the lesson
shows. The notebooks run side by side, one tab each, so the whole test takes about as long as
the slowest lesson.

Needs Playwright (`pip install -e ".[browser]"`) and a system Chromium (`apt-get install chromium`;
Playwright's own browser download is not used). Where either is missing the test is skipped and
says which; `.ci/run` installs both.
"""

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

from course.notebooks import lesson_paths, part_folders

pytestmark = [pytest.mark.foundation, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
RUN_ALL_TIMEOUT_S = 240  # per lesson; each runs in well under a minute on two cores


def first_lessons():
    """The first lesson of every part folder: notebooks/1-micrograd/1.1-..., notebooks/2-.../2.1-..., ..."""
    lessons = lesson_paths(ROOT, "notebooks")
    return [[p for p in lessons if p.parent == part][0] for part in part_folders(ROOT, "notebooks")]


def find_chromium():
    explicit = os.environ.get("COURSE_CHROMIUM")
    if explicit:
        return explicit if Path(explicit).is_file() else None
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def png_outputs(path):
    """How many PNG outputs the committed lesson has: the browser must show at least as many."""
    nb = nbformat.read(str(path), as_version=4)
    return sum("image/png" in out.get("data", {}) for cell in nb.cells if cell.cell_type == "code"
               for out in cell.get("outputs", []))


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api",
                                   reason='Playwright is not installed: pip install -e ".[browser]" (the browser test)')
    chromium = find_chromium()
    if chromium is None:
        pytest.skip("no Chromium found (apt-get install chromium, or set COURSE_CHROMIUM to its path): "
                    "the browser test cannot run")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server on a free port, on a copy of the lessons, with settings of its own."""
    home = tmp_path_factory.mktemp("lab")
    work = home / "course"
    for lesson in first_lessons():
        target = work / lesson.relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        nb = nbformat.read(str(lesson), as_version=4)
        for cell in nb.cells:  # as a learner gets it after "Clear All Outputs": only Run All fills them
            if cell.cell_type == "code":
                cell.outputs, cell.execution_count = [], None
        nbformat.write(nb, str(target))
    # Every cell in the page at once (no virtual scrolling), so the images of all outputs are in the DOM.
    settings = home / "settings" / "@jupyterlab" / "notebook-extension"
    settings.mkdir(parents=True)
    (settings / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
    port, token = free_port(), secrets.token_hex(16)
    env = dict(os.environ, JUPYTERLAB_SETTINGS_DIR=str(home / "settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(home / "workspaces"), JUPYTER_RUNTIME_DIR=str(home / "runtime"),
               JUPYTER_CONFIG_DIR=str(home / "config"), PYDEVD_DISABLE_FILE_VALIDATION="1")
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
           f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={work}",
           "--LabApp.expose_app_in_browser=True", "--LabApp.news_url=", "--ServerApp.port_retries=0"]
    if hasattr(os, "getuid") and os.getuid() == 0:
        cmd.append("--allow-root")
    log = open(home / "server.log", "wb")
    server = subprocess.Popen(cmd, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2).read()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    log.flush()
                    pytest.fail("JupyterLab did not start:\n" + (home / "server.log").read_text()[-3000:])
                time.sleep(0.3)
        yield {"url": url, "token": token, "work": work}
    finally:
        server.terminate()
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


# Run in the page: the state of the notebook that is open, read from JupyterLab's own model.
NOTEBOOK_STATE = """() => {
    const app = window.jupyterapp;
    const panel = app && app.shell.currentWidget;
    if (!panel || !panel.content || !panel.sessionContext) return null;
    const kernel = panel.sessionContext.session && panel.sessionContext.session.kernel;
    const cells = panel.content.widgets.filter(c => c.model.type === 'code').map(c => ({
        count: c.model.executionCount,
        source: c.model.sharedModel.getSource().slice(0, 60),
        outputs: c.model.outputs.toJSON().map(o => ({type: o.output_type, name: o.name || null,
                                                      text: (o.text || o.evalue || '').toString().slice(0, 300)})),
    }));
    const images = [...panel.node.querySelectorAll('.jp-OutputArea-output img')].map(
        img => ({complete: img.complete, width: img.naturalWidth}));
    return {ready: panel.context.isReady && panel.sessionContext.isReady,
            kernel: kernel ? kernel.status : null, executing: panel.node.querySelectorAll('.jp-mod-executing').length,
            cells, images};
}"""


OPENED = f"() => {{ const s = ({NOTEBOOK_STATE})(); return !!s && s.ready && s.kernel === 'idle'; }}"
ALL_RAN = f"""() => {{
    const s = ({NOTEBOOK_STATE})();
    // Finished: every cell ran, or an error stopped Run All (the cells after it never run).
    const stopped = s && s.cells.some(c => c.outputs.some(o => o.type === 'error'));
    return !!s && s.kernel === 'idle' && s.executing === 0 && s.images.every(img => img.complete)
           && (stopped || s.cells.every(c => c.count !== null));
}}"""


def wait_for(page, condition, timeout_s, what):
    """Wait until the JavaScript `condition` holds in the page; on a time-out say where it stood."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_function(condition, polling=250, timeout=timeout_s * 1000)
    except PlaywrightTimeout:
        state = page.evaluate(NOTEBOOK_STATE)
        raise AssertionError(f"timed out after {timeout_s} s waiting for {what}; "
                             f"last state: {json.dumps(state)[:2000]}") from None
    return page.evaluate(NOTEBOOK_STATE)


def test_run_all_in_jupyterlab_runs_every_cell_without_errors_and_shows_the_images(browser, lab):
    lessons = first_lessons()
    assert len(lessons) >= 4, "expected a first lesson in each part folder"
    contexts, pages = [], {}
    try:
        # Each lesson in a window of its own (JupyterLab's tabs of one window share a workspace);
        # Run All starts in each, and they then run side by side.
        for lesson in lessons:
            rel = lesson.relative_to(ROOT).as_posix()
            contexts.append(browser.new_context(viewport={"width": 1400, "height": 1000}))
            page = contexts[-1].new_page()
            page.on("dialog", lambda dialog: dialog.dismiss())
            page.goto(f"{lab['url']}/lab/tree/{rel}?reset&token={lab['token']}")
            pages[rel] = (lesson, page)
        for rel, (lesson, page) in pages.items():
            wait_for(page, OPENED, 90, f"{rel} to open with an idle kernel")
            page.evaluate("() => window.jupyterapp.commands.execute('runmenu:run-all')")
        problems = []
        for rel, (lesson, page) in pages.items():
            state = wait_for(page, ALL_RAN, RUN_ALL_TIMEOUT_S, f"Run All to finish in {rel}")
            not_run = [i for i, cell in enumerate(state["cells"]) if cell["count"] is None]
            if not_run:
                problems.append(f"{rel}: Run All stopped; code cells {not_run} never ran")
            for i, cell in enumerate(state["cells"]):
                for out in cell["outputs"]:
                    if out["type"] == "error" or out["name"] == "stderr":
                        problems.append(f"{rel} code cell {i} ({cell['source']!r}): {out['type']} "
                                        f"{out['name'] or ''}: {out['text'].strip()}")
            broken = [img for img in state["images"] if img["width"] == 0]
            if broken:
                problems.append(f"{rel}: {len(broken)} of {len(state['images'])} images did not render")
            expected = png_outputs(lesson)
            if len(state["images"]) < expected:
                problems.append(f"{rel}: the browser shows {len(state['images'])} images, the lesson has {expected}")
        assert not problems, "\n".join(problems)
    finally:
        for context in contexts:
            context.close()
