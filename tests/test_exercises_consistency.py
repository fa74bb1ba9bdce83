"""Lessons, solutions and checks stay in step: every exercise of a lesson has a check and a worked
solution, the committed lesson shows it unattempted, and the committed solution shows it passed."""

from pathlib import Path

import nbformat
import pytest

from course.exercises import registered_ids
from course.grading import exercise_ids
from course.notebooks import lesson_paths

pytestmark = pytest.mark.foundation
ROOT = Path(__file__).resolve().parent.parent
LESSONS = lesson_paths(ROOT, "notebooks")


def _outputs(path):
    nb = nbformat.read(str(path), as_version=4)
    text = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                text.append(out.get("text", ""))
    return "".join(text)


def test_there_are_lessons():
    assert LESSONS


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_lesson_exercises_have_checks_and_solutions(lesson):
    ids = exercise_ids(lesson)
    assert 3 <= len(ids) <= 6, f"{lesson.name} has {len(ids)} exercises; each lesson has 3 to 6"
    known = set(registered_ids())
    missing = [i for i in ids if i not in known]
    assert not missing, f"no check registered for {missing}"
    solution = ROOT / "solutions" / lesson.parent.name / lesson.name
    assert solution.exists(), f"no solutions notebook at solutions/{lesson.parent.name}/{lesson.name}"
    assert exercise_ids(solution) == ids, "the solutions notebook must check the same exercises, in order"
    lesson_out, solution_out = _outputs(lesson), _outputs(solution)
    for i in ids:
        assert f"[{i}] not attempted yet" in lesson_out, f"the committed lesson should show {i} unattempted"
        assert f"[{i}] passed." in solution_out, f"the committed solution should show {i} passed"


def test_every_check_belongs_to_a_lesson():
    used = {i for lesson in LESSONS for i in exercise_ids(lesson)}
    orphans = [i for i in registered_ids() if i not in used and not i.startswith("0.")]
    assert not orphans, f"checks with no exercise in any lesson: {orphans}"
