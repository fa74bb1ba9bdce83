"""Instructors' tools: assignments without solutions, and grading that survives broken notebooks."""

import csv
import shutil
from pathlib import Path

import nbformat
import pytest

from course import grading, notebooks

pytestmark = [pytest.mark.foundation, pytest.mark.slow]
ROOT = Path(__file__).resolve().parent.parent
PART1 = ROOT / "notebooks" / "1-micrograd"


def _first_lesson():
    lessons = sorted(PART1.glob("*.ipynb"))
    if not lessons:
        pytest.fail("part 1 has no lessons")
    return lessons[0]


def test_assign_writes_lessons_and_a_readme_but_no_solutions(tmp_path):
    grading.assign(["1"], tmp_path)
    written = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.ipynb"))
    expected = sorted(f"1-micrograd/{p.name}" for p in PART1.glob("*.ipynb"))
    assert written == expected
    readme = (tmp_path / "README.md").read_text()
    assert "NotImplementedError" in readme and "1-micrograd/" in readme
    assert not any("solutions" in p.parts for p in tmp_path.rglob("*"))


def test_assign_names_an_unknown_part(tmp_path):
    with pytest.raises(SystemExit, match="no part '9'"):
        grading.assign(["9"], tmp_path)


def test_grading_three_notebooks(tmp_path):
    lesson = _first_lesson()
    solution = ROOT / "solutions" / lesson.parent.name / lesson.name
    broken = tmp_path / "broken.ipynb"
    nb = nbformat.read(str(lesson), as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    code[2].source = "raise RuntimeError('this submission breaks here')\n" + code[2].source
    nbformat.write(nb, str(broken))
    submitted = [tmp_path / "solution.ipynb", tmp_path / "lesson.ipynb", broken]
    shutil.copy(solution, submitted[0])
    shutil.copy(lesson, submitted[1])
    before = [p.read_bytes() for p in submitted]

    out = tmp_path / "grades.csv"
    rows = grading.grade(submitted, out, time_limit=120)

    assert [p.read_bytes() for p in submitted] == before, "grading must never modify a submission"
    with open(out) as f:
        table = list(csv.DictReader(f))
    assert len(table) == 3
    ids = grading.exercise_ids(lesson)
    assert len(ids) >= 3
    sol, untouched, crashed = table
    assert sol["status"] == "ok" and all(sol[i] == "passed" for i in ids)
    assert sol["passed"] == sol["total"] == str(len(ids))
    assert untouched["status"] == "ok" and all(untouched[i] == "not attempted" for i in ids)
    assert untouched["passed"] == "0"
    assert crashed["status"].startswith("error in code cell 3: RuntimeError: this submission breaks here")
    assert all(crashed[i] == "not run" for i in ids)
    assert rows[0]["notebook"].endswith("solution.ipynb")


def test_a_notebook_that_runs_too_long_is_stopped(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("from course.exercises import check"),
                nbformat.v4.new_code_cell("import time\ntime.sleep(600)")]
    path = tmp_path / "slow.ipynb"
    nbformat.write(nb, str(path))
    status, outcomes = grading.grade_one(path, time_limit=8)
    assert status == "timed out after 8 s"
    assert outcomes == {}


def test_lesson_notebooks_are_found():
    assert all(p.parts[-3] == "notebooks" for p in grading.lesson_notebooks())
    assert notebooks.all_notebooks(ROOT)
