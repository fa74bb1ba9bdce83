"""JupyterLab and the tests side by side, as a newcomer meets them: `make lab`, open and save some
notebooks, then `make test`.

JupyterLab keeps a copy of every notebook it opens in `.ipynb_checkpoints/` next to it. One real
JupyterLab server, started the way `make lab` starts it, serves a copy of notebooks/ and solutions/;
notebooks are opened and saved through its REST API as the browser does (read, make a checkpoint,
save), which writes those copies. Then everything that lists the course's notebooks (the tests,
`make notebooks`, assign, grade, the syllabus, pytest's collection) must see only the lessons, and
the lab must not greet the learner with the question about Jupyter's news.
"""

import importlib.util
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from course import grading, lab, notebooks

pytestmark = pytest.mark.foundation
ROOT = Path(__file__).resolve().parent.parent
CHECKPOINTS = ".ipynb_checkpoints"


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Server:
    def __init__(self, url, token):
        self.url, self.token = url, token

    def call(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.url}{path}", data=data, method=method,
                                         headers={"Authorization": f"token {self.token}",
                                                  "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            text = response.read().decode()
        return json.loads(text) if text.lstrip().startswith(("{", "[")) else text

    def open_and_save(self, rel):
        """What JupyterLab does when a learner opens a notebook and presses Ctrl-S."""
        model = self.call("GET", f"/api/contents/{rel}?content=1&type=notebook")
        self.call("POST", f"/api/contents/{rel}/checkpoints")
        self.call("PUT", f"/api/contents/{rel}", {"type": "notebook", "format": "json", "content": model["content"]})


@pytest.fixture(scope="module")
def opened(tmp_path_factory):
    """A copy of the course opened in JupyterLab: (the copy's root, what the lab told the page)."""
    pytest.importorskip("jupyterlab", reason='JupyterLab is not installed (pip install -e ".[dev]")')
    home = tmp_path_factory.mktemp("lab")
    work = home / "course"
    for kind in notebooks.NOTEBOOK_DIRS:
        shutil.copytree(ROOT / kind, work / kind, ignore=shutil.ignore_patterns(CHECKPOINTS))
    (work / "tests").mkdir()
    for name in ("conftest.py", "pyproject.toml", "sanitize.cfg", "tests/test_exercises_consistency.py"):
        shutil.copy(ROOT / name, work / name)
    app_settings = home / "app-settings"
    assert lab.quiet_news(app_settings) == app_settings / "overrides.json"
    env = dict(os.environ, JUPYTERLAB_SETTINGS_DIR=str(home / "settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(home / "workspaces"), JUPYTER_RUNTIME_DIR=str(home / "runtime"),
               JUPYTER_CONFIG_DIR=str(home / "config"), PYDEVD_DISABLE_FILE_VALIDATION="1")
    port, token = _free_port(), secrets.token_hex(16)
    # The command `make lab` runs (python -m course lab), on the copy; the test's own settings
    # folder stands for the one `make lab` writes into this Python's JupyterLab.
    cmd = lab.command(work) + ["--no-browser", f"--port={port}", "--ip=127.0.0.1", "--ServerApp.port_retries=0",
                               f"--IdentityProvider.token={token}", f"--LabApp.app_settings_dir={app_settings}"]
    log = open(home / "server.log", "wb")
    process = subprocess.Popen(cmd, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT)
    server = _Server(f"http://127.0.0.1:{port}", token)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                server.call("GET", "/api/status")
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    pytest.fail("JupyterLab did not start:\n" + (home / "server.log").read_text()[-3000:])
                time.sleep(0.2)
        lessons = notebooks.lesson_paths(ROOT, "notebooks")
        # Three lessons of part 1, one of another part, and a worked solution.
        chosen = lessons[:3] + lessons[-1:] + notebooks.lesson_paths(ROOT, "solutions")[:1]
        for path in chosen:
            server.open_and_save(path.relative_to(ROOT).as_posix())
        page = server.call("GET", "/lab")
        config = json.loads(re.search(r'<script id="jupyter-config-data" type="application/json">(.*?)</script>',
                                      page, re.S).group(1))
        notification = server.call("GET", "/lab/api/settings/@jupyterlab/apputils-extension:notification")
        update = server.call("GET", "/lab/api/update")
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()
    copies = sorted(work.rglob(f"{CHECKPOINTS}/*.ipynb"))
    assert len(copies) == len(chosen), f"JupyterLab should have written one checkpoint copy each: {copies}"
    return work, {"page": config, "notification": notification, "update": update}


def _make_dry_run(*targets):
    """What `make TARGETS` would run, as a make started by hand prints it (not as a sub-make of
    `make test`, which adds "Entering directory" lines)."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    dry = subprocess.run(["make", "-n", *targets], cwd=ROOT, env=env, capture_output=True, text=True)
    assert dry.returncode == 0, dry.stderr
    return dry.stdout.splitlines()


def _rel(paths, root):
    return [p.relative_to(root).as_posix() for p in paths]


@pytest.mark.slow
def test_nothing_that_lists_notebooks_sees_the_checkpoints(opened, tmp_path):
    work, _ = opened
    for kind in notebooks.NOTEBOOK_DIRS:
        assert _rel(notebooks.lesson_paths(work, kind), work) == _rel(notebooks.lesson_paths(ROOT, kind), ROOT)
    assert _rel(notebooks.all_notebooks(work), work) == _rel(notebooks.all_notebooks(ROOT), ROOT)
    # make notebooks NB=notebooks/1-micrograd, and the lessons grading matches submissions against
    part1 = work / "notebooks" / "1-micrograd"
    assert all(CHECKPOINTS not in p.parts for p in notebooks.expand_paths([part1]))
    assert len(notebooks.expand_paths([part1])) == len(list(part1.glob("*.ipynb")))
    assert _rel(grading.lesson_notebooks(work), work) == _rel(grading.lesson_notebooks(ROOT), ROOT)
    assert [f.name for f in notebooks.part_folders(work)] == [f.name for f in notebooks.part_folders(ROOT)]
    assert notebooks.syllabus_table(work) == notebooks.syllabus_table(ROOT)
    grading.assign(["1"], tmp_path / "handout", root=work)
    assert not list((tmp_path / "handout").rglob(f"*{CHECKPOINTS}*"))
    with pytest.raises(SystemExit, match="the parts are 1-micrograd,") as error:
        grading.assign(["9"], tmp_path / "nothing", root=work)
    assert CHECKPOINTS not in str(error.value)


@pytest.mark.slow
def test_the_consistency_test_passes_beside_the_checkpoints(opened):
    """The consistency test itself, as copied into the opened course (its ROOT is the copy)."""
    work, _ = opened
    spec = importlib.util.spec_from_file_location("opened_consistency", work / "tests" / "test_exercises_consistency.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.ROOT == work and module.LESSONS
    assert all(CHECKPOINTS not in p.parts for p in module.LESSONS)
    for lesson in module.LESSONS:
        module.test_lesson_exercises_have_checks_and_solutions(lesson)
    module.test_every_check_belongs_to_a_lesson()


@pytest.mark.slow
def test_pytest_collects_no_checkpoint_copy(opened):
    work, _ = opened
    folders = sorted({p.parent.parent.relative_to(work).as_posix() for p in work.rglob(f"{CHECKPOINTS}/*.ipynb")})
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "--collect-only", "--nbval",
                          "--nbval-current-env", *folders], cwd=work, capture_output=True, text=True,
                         env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "checkpoint" not in run.stdout
    for folder in folders:  # the lessons there are still collected
        assert f"{folder}/" in run.stdout


@pytest.mark.slow
def test_the_lab_does_not_ask_about_news_or_look_for_updates(opened):
    _, seen = opened
    assert seen["page"]["news"] == {"disabled": True}, "the server must not fetch Jupyter's news"
    # The browser asks "Would you like to get notified about official Jupyter news?" whenever the
    # setting fetchNews is "none" (JupyterLab's default), so the course makes "false" the default.
    fetch_news = seen["notification"]["schema"]["properties"]["fetchNews"]["default"]
    assert fetch_news == "false", f"JupyterLab would ask about the news: fetchNews defaults to {fetch_news!r}"
    assert seen["update"].get("notification") is None


def test_make_lab_starts_the_quiet_lab_at_the_top_of_the_course(capsys):
    lines = [line for line in _make_dry_run("lab") if "jupyter" in line or " -m course" in line]
    assert lines == [".venv/bin/python -m course lab"], lines
    from course.__main__ import main

    assert main(["lab", "--dry-run", "--port=8899"]) == 0
    line = capsys.readouterr().out.strip()
    assert " -m jupyterlab " in line and f"--ServerApp.root_dir={ROOT}" in line and line.endswith("--port=8899")
    assert "--LabApp.news_url=None" in line
    assert "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate" in line


def test_the_news_setting_keeps_what_is_already_there(tmp_path):
    path = tmp_path / "overrides.json"
    mine = {"@jupyterlab/apputils-extension:notification": {"fetchNews": "true"},
            "@jupyterlab/apputils-extension:themes": {"theme": "JupyterLab Dark"}}
    path.write_text(json.dumps(mine))
    assert lab.quiet_news(tmp_path) == path
    written = json.loads(path.read_text())
    assert written["@jupyterlab/apputils-extension:notification"] == {"fetchNews": "true", "checkForUpdates": False}
    assert written["@jupyterlab/apputils-extension:themes"] == {"theme": "JupyterLab Dark"}
    before = path.read_bytes()
    lab.quiet_news(tmp_path)
    assert path.read_bytes() == before
    path.write_text("{ not json")
    assert lab.quiet_news(tmp_path) is None and path.read_text() == "{ not json"


def test_make_clean_removes_the_checkpoint_copies(tmp_path):
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    lesson = tmp_path / "notebooks" / "1-micrograd" / "1.1-derivatives.ipynb"
    copy = lesson.parent / CHECKPOINTS / "1.1-derivatives-checkpoint.ipynb"
    copy.parent.mkdir(parents=True)
    lesson.write_text("{}")
    copy.write_text("{}")
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    run = subprocess.run(["make", "clean"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert lesson.exists() and not copy.parent.exists()


def test_the_readme_gives_the_commands_make_runs_for_a_machine_without_make():
    """Windows has no make: the README's commands by hand must stay the ones the Makefile runs."""
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"Without `make`.*?```\n(.*?)```", readme, re.S)
    assert block, "README.md has no commands for a machine without make"
    by_hand = {line.split("  #")[0].strip().replace(".venv\\Scripts\\", "") for line in block.group(1).splitlines()}
    commands = [part.strip(" \\()") for line in _make_dry_run("-B", "test", "lab")
                for part in re.split(r"&&|\|\|", line)]
    made = [re.sub(r"^(\w+=\S* )*\.venv/bin/", "", command).replace(" -q ", " ") for command in commands
            if re.match(r"(\w+=\S* )*\.venv/bin/python -m", command)]
    # make installs with uv where it can (faster, the same packages) and with pip where it cannot;
    # by hand, the README gives pip's way, which needs nothing more
    made = [command for command in made if " -m uv " not in command and not command.endswith("pip install uv")]
    assert len(made) == 4, made
    missing = [command for command in made if command not in by_hand]
    assert not missing, f"README's commands without make lack {missing}"
    assert "python3-venv" in readme and "jupyter server stop" in readme and "Ctrl-C twice" in readme
