"""Grading stops a notebook that never ends, with every process it started, sandbox or not, and
leaves none of its files behind.

Apart from the other grading tests so that, run in parallel, they do not wait for each other.
"""

import tempfile
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
import psutil
import pytest

from course import grading
from course.notebooks import lesson_paths
from handouts import exercise_handout  # tests/handouts.py

pytestmark = [pytest.mark.foundation, pytest.mark.slow]
ROOT = Path(__file__).resolve().parent.parent
LESSON = [p for p in lesson_paths(ROOT, "notebooks") if p.parent.name == "1-micrograd"][0]
SANDBOXED = grading.sandbox_problem() is None


def _never_ending_notebook(tmp_path, token):
    nb = exercise_handout(LESSON)
    # Every signal held back from the cell's thread, then a sleep: no Python signal handler (no
    # KeyboardInterrupt, whatever Jupyter sends) runs until it wakes, and it waits without keeping
    # a core busy while other tests run.
    nb.cells.append(nbformat.v4.new_code_cell(
        "import signal, subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', {token!r}],\n"
        "                 start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        "signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())\n"
        "while True:\n"
        "    time.sleep(3600)"))
    path = tmp_path / LESSON.name
    nbformat.write(nb, str(path))
    return path


MODES = [False, True] if SANDBOXED else [False]  # the sandbox where bubblewrap can make one


def test_a_notebook_that_runs_too_long_is_stopped_with_all_it_started(tmp_path, monkeypatch):
    """Graded without the sandbox and in it at the same time (as `grade(..., jobs=2)` would), since
    each run waits out its limit."""
    temp = tmp_path / "temp"  # where grading makes each run's folder, and its kernel its files
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    runs = {}
    for sandbox in MODES:
        folder = tmp_path / ("sandboxed" if sandbox else "plain")
        folder.mkdir()
        token = f"orphan-{uuid.uuid4().hex}"
        runs[sandbox] = (token, _never_ending_notebook(folder, token))

    with ThreadPoolExecutor(len(runs)) as pool:
        graded = {sandbox: pool.submit(grading.grade_one, path, time_limit=6, sandbox=sandbox)
                  for sandbox, (_, path) in runs.items()}
        graded = {sandbox: future.result() for sandbox, future in graded.items()}

    for sandbox, (status, outcomes) in graded.items():
        assert status.startswith("timed out after 6 s"), f"sandbox={sandbox}: {status}"
        assert set(outcomes.values()) == {"not run"}, f"sandbox={sandbox}: {outcomes}"
    tokens = {token: sandbox for sandbox, (token, _) in runs.items()}
    left = []
    for p in psutil.process_iter():
        try:
            if p.status() != psutil.STATUS_ZOMBIE and any(t in p.cmdline() for t in tokens):
                left.append(p)
        except psutil.Error:
            pass
    assert not left, f"processes of the graded notebooks are still running: {left}"
    left = [str(p.relative_to(temp)) for p in temp.rglob("*")]
    assert not left, f"the timed-out runs left files behind: {left}"
