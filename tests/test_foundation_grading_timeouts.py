"""Grading stops a notebook that never ends, with every process it started, sandbox or not, and
leaves none of its files behind.

Apart from the other grading tests so that, run in parallel, they do not wait for each other.
"""

import tempfile
import uuid
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


@pytest.mark.parametrize("sandbox", [False, pytest.param(True, marks=pytest.mark.skipif(
    not SANDBOXED, reason="bubblewrap is not installed or cannot make a sandbox here"))])
def test_a_notebook_that_runs_too_long_is_stopped_with_all_it_started(tmp_path, monkeypatch, sandbox):
    token = f"orphan-{uuid.uuid4().hex}"
    path = _never_ending_notebook(tmp_path, token)
    temp = tmp_path / "temp"  # where grading makes each run's folder, and its kernel its files
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))

    status, outcomes = grading.grade_one(path, time_limit=6, sandbox=sandbox)

    assert status.startswith("timed out after 6 s")
    assert set(outcomes.values()) == {"not run"}
    left = []
    for p in psutil.process_iter():
        try:
            if p.status() != psutil.STATUS_ZOMBIE and token in p.cmdline():
                left.append(p)
        except psutil.Error:
            pass
    assert not left, f"processes of the graded notebook are still running: {left}"
    left = [str(p.relative_to(temp)) for p in temp.rglob("*")]
    assert not left, f"the timed-out run left files behind: {left}"
