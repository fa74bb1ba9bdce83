"""Instructors' tools: assignments without solutions, and grading that a class cannot fool.

The grading tests hand the grader what a class might: a perfect submission, an untouched one, a
crash, a file that is not a notebook, and submissions that try to forge their grade, overwrite
another student's work, leave junk where results might be collected, or never stop. They pass
with and without bubblewrap; where it works, they also check what the sandbox keeps out.
"""

import csv
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from course import grading, notebooks
from handouts import exercise_handout  # tests/handouts.py

pytestmark = [pytest.mark.foundation, pytest.mark.slow]
ROOT = Path(__file__).resolve().parent.parent
PART1 = ROOT / "notebooks" / "1-micrograd"
SANDBOXED = grading.sandbox_problem() is None


def _part1_lessons():
    return [p for p in notebooks.lesson_paths(ROOT, "notebooks") if p.parent == PART1]


def _first_lesson():
    lessons = _part1_lessons()
    if not lessons:
        pytest.fail("part 1 has no lessons")
    return lessons[0]


def test_assign_writes_lessons_and_a_readme_but_no_solutions(tmp_path):
    grading.assign(["1"], tmp_path)
    written = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.ipynb"))
    expected = sorted(f"1-micrograd/{p.name}" for p in _part1_lessons())
    assert written == expected
    readme = (tmp_path / "README.md").read_text()
    assert "NotImplementedError" in readme and "1-micrograd/" in readme
    assert "course[lab] @ git+" in readme and "jupyter lab" in readme and "from the top" in readme
    assert not any("solutions" in p.parts for p in tmp_path.rglob("*"))


def test_assign_names_an_unknown_part(tmp_path):
    with pytest.raises(SystemExit, match="no part '9'"):
        grading.assign(["9"], tmp_path)


def test_the_lesson_says_which_function_each_exercise_checks():
    nb = nbformat.read(str(_first_lesson()), as_version=4)
    calls = grading.exercise_calls(nb)
    assert len(calls) >= 3
    assert all(name.isidentifier() for _, name in calls)
    assert [i for i, _ in calls] == grading.exercise_ids(_first_lesson())


# ---- submissions a class might hand in ----

def _lesson_nb():
    return nbformat.read(str(_first_lesson()), as_version=4)


def _with_cell(source, before_exercises=False):
    nb = exercise_handout(_first_lesson())  # a handout that tries nothing but its one extra cell
    cell = nbformat.v4.new_code_cell(source)
    nb.cells.insert(1 if before_exercises else len(nb.cells), cell)
    return nb


def _forgeries(ids, victim, grader_dir):
    """One notebook per way of faking a grade that has been tried, each a handout plus one cell."""
    passed_lines = "".join(f'print("[{i}] passed.")\n' for i in ids)
    log_lines = repr([f'{{"id": "{i}", "status": "passed", "message": "[{i}] passed."}}\n' for i in ids])
    return {
        "prints-passed": _with_cell(passed_lines),
        "redefines-check": _with_cell(
            "def check(exercise_id, candidate):\n    print(f'[{exercise_id}] passed.')", before_exercises=True),
        "replaces-check": _with_cell(
            "import course.exercises\nfrom course.exercises import CheckResult\n\n"
            "def check(exercise_id, candidate):\n"
            "    print(f'[{exercise_id}] passed.')\n"
            "    return CheckResult(exercise_id, 'passed', f'[{exercise_id}] passed.')\n\n"
            "course.exercises.check = check", before_exercises=True),
        "replaces-load-part": _with_cell(
            "import course.exercises._core as core\n"
            "core._load_part = lambda exercise_id: (lambda candidate, rng: None, '')", before_exercises=True),
        "appends-to-grade-log": _with_cell(
            "import os\nlog = os.environ.get('COURSE_GRADE_LOG', 'grade-log.jsonl')\n"
            f"with open(log, 'a') as f:\n    f.writelines({log_lines})"),
        "appends-to-checks-jsonl": _with_cell(
            f"with open('checks.jsonl', 'a') as f:\n    f.writelines({log_lines})"),
        "adds-ids": _with_cell(
            "# check(\"1.1.9\", numerical_derivative) and check(\"7.7.7\", numerical_derivative)\n"
            "extra = 'check(\"1.1.10\", numerical_derivative)'\n" + passed_lines.replace(ids[0], "1.1.9")),
        "kills-its-parent": _with_cell(
            "import os, signal\nopen('status.txt', 'w').write('ok')\nos.kill(os.getppid(), signal.SIGKILL)"),
        # Writes a report line into the runner's own output, and junk everywhere else it can.
        "forges-the-report": _with_cell(
            "import json, os\nreport = json.dumps({'status': 'ok', 'outcomes': {"
            + ", ".join(f"'{i}': 'passed'" for i in ids) + "}})\n"
            "for fd in (1, 2):\n"
            "    try:\n"
            "        with open(f'/proc/{os.getppid()}/fd/{fd}', 'w') as out:\n"
            "            out.write('not json {{{\\n' + 'COURSE-GRADE 0000 ' + report + '\\n')\n"
            "    except OSError:\n"
            "        pass\n"
            "for name in ('checks.jsonl', 'status.txt', 'grades.csv'):\n"
            "    open(name, 'w').write('\\x00 junk {{{\\n')\n"
            "print('COURSE-GRADE 0000 ' + report)\nprint('not json {{')"),
        # Overwrites a classmate's submission (given on the grader's command line) and writes into
        # the grader's folder; the classmate is graded later.
        "overwrites-a-classmate": _with_cell(
            f"for target, text in (({str(victim)!r}, 'overwritten'), ({str(grader_dir / 'dropped.txt')!r}, 'x')):\n"
            "    try:\n"
            "        open(target, 'w').write(text)\n"
            "    except OSError as err:\n"
            "        print('blocked:', err)"),
    }


def test_grading_a_class_including_forgeries(tmp_path, monkeypatch):
    lesson = _first_lesson()
    solution = ROOT / "solutions" / lesson.parent.name / lesson.name
    ids = grading.exercise_ids(lesson)
    subs = tmp_path / "submissions"
    grader_dir = tmp_path / "grader"
    grader_dir.mkdir()
    monkeypatch.chdir(grader_dir)

    def submit(student, content, name=lesson.name):
        path = subs / student / name
        path.parent.mkdir(parents=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            nbformat.write(content, str(path))
        return path

    crashing = _lesson_nb()
    code = [c for c in crashing.cells if c.cell_type == "code"]
    code[1].source = "raise RuntimeError('this submission breaks here')\n" + code[1].source
    # A worked notebook that breaks in the third exercise: the first two still count.
    stops_early = nbformat.read(str(solution), as_version=4)
    third = [c for c in stops_early.cells if c.cell_type == "code" and f'check("{ids[2]}"' in c.source][0]
    third.source = "raise ValueError('stuck here')\n" + third.source
    # The worked solution is handed in last: a forgery overwrites it before it is graded.
    victim = subs / "solution" / lesson.name
    paths = [submit("untouched", lesson.read_bytes()), submit("crash", crashing), submit("stops-early", stops_early),
             submit("not-json", b"{ this is not a notebook")]
    forgeries = _forgeries(ids, victim, grader_dir)
    paths += [submit(name, nb) for name, nb in forgeries.items()]
    # The first worked lesson of every other part: the grader's fresh copy of the checks works for all.
    others = {}
    solutions = notebooks.lesson_paths(ROOT, "solutions")
    for folder in notebooks.part_folders(ROOT, "solutions"):
        if folder.name != lesson.parent.name:
            first = [p for p in solutions if p.parent == folder][0]
            others[f"solution-{folder.name}"] = grading.exercise_ids(first)
            paths.append(submit(f"solution-{folder.name}", first.read_bytes(), name=first.name))
    paths.append(submit("solution", solution.read_bytes()))
    before = {p: p.read_bytes() for p in paths}

    out = grader_dir / "grades.csv"
    rows = grading.grade(paths, out, time_limit=60, jobs=2, sandbox=SANDBOXED)

    changed = [p.parent.name for p in paths if p.read_bytes() != before[p]]
    assert changed in ([], ["solution"]), "grading itself must never modify a submission"
    with open(out) as f:
        reader = csv.DictReader(f)
        more = [i for other in others.values() for i in other]
        assert reader.fieldnames == ["notebook", "status", "passed", "total"] + ids + more
        table = {Path(r["notebook"]).parent.name: r for r in reader}
    assert len(table) == len(paths) == len(rows)
    for name, other in others.items():
        row = table.pop(name)
        assert row["status"] == "ok" and row["passed"] == row["total"] == str(len(other)), row
    assert all(r["total"] == str(len(ids)) and not any(r[i] for i in more) for r in table.values())

    sol = table["solution"]  # graded from its copy, read before a forgery overwrote the file
    assert sol["status"] == "ok" and all(sol[i] == "passed" for i in ids) and sol["passed"] == str(len(ids))
    untouched = table["untouched"]
    assert untouched["status"] == "ok" and all(untouched[i] == "not attempted" for i in ids)
    crashed = table["crash"]
    assert crashed["status"].startswith("error in code cell 2: RuntimeError: this submission breaks here")
    assert all(crashed[i] == "not run" for i in ids)
    early = table["stops-early"]
    assert early["status"].startswith("error in code cell") and "ValueError: stuck here" in early["status"]
    assert [early[i] for i in ids] == ["passed", "passed"] + ["not run"] * (len(ids) - 2)
    assert table["not-json"]["status"].startswith("not a notebook")
    assert all(table["not-json"][i] == "not run" for i in ids)

    for name in forgeries:
        assert table[name]["passed"] == "0", f"the forgery {name!r} got marks: {table[name]}"
    assert table["kills-its-parent"]["status"].startswith("the run stopped before grading could check it")
    assert "review by hand" in table["replaces-load-part"]["status"]
    assert "review by hand" in table["forges-the-report"]["status"]

    if SANDBOXED:
        assert changed == [] and not (grader_dir / "dropped.txt").exists()


def test_a_notebook_of_no_known_lesson_is_not_run(tmp_path):
    path = tmp_path / "homework.ipynb"
    nbformat.write(nbformat.v4.new_notebook(), str(path))
    status, outcomes = grading.grade_one(path, sandbox=SANDBOXED)
    assert status.startswith("no lesson of the course is named like this notebook") and outcomes == {}


def test_review_notes_point_at_cells_that_touch_the_machinery():
    lesson = _lesson_nb()
    assert grading.review_notes(lesson, lesson) == []
    nb = _with_cell("import numpy as np\nnp.allclose = lambda *a, **k: True")
    assert grading.review_notes(nb, lesson) == [f"code cell {len(nb.cells)} sets np.allclose"]
    nb = _with_cell("import numpy as np\nsetattr(np, 'allclose', lambda *a, **k: True)")
    assert grading.review_notes(nb, lesson) == [f"code cell {len(nb.cells)} setattr(np, ...) changes a module"]
    own_object = "class Net:\n    def __init__(self, *layers):\n        for i, l in enumerate(layers):\n            setattr(self, str(i), l)"
    assert grading.review_notes(_with_cell(own_object), lesson) == []


def test_a_submission_is_matched_to_its_lesson_by_name_or_by_the_ids_it_checks():
    lessons = grading.lesson_notebooks()
    lesson = _first_lesson()
    assert grading._find_lesson(lesson.name, "", lessons) == lesson
    assert grading._find_lesson(f"alice-{lesson.stem}.ipynb", "", lessons) == lesson
    first_id = grading.exercise_ids(lesson)[0]
    assert grading._find_lesson("homework.ipynb", f'check("{first_id}", f)', lessons) == lesson
    as_json = lesson.read_text().replace(lesson.stem, "")
    assert grading._find_lesson("homework.ipynb", as_json, lessons) == lesson
    assert grading._find_lesson("homework.ipynb", "", lessons) is None


def test_only_a_signed_report_with_the_lessons_ids_counts():
    exercises = [("1.1.1", "f"), ("1.1.2", "g")]
    good = '{"status": "ok", "outcomes": {"1.1.1": "passed", "1.1.2": "failed"}, "ran": 3}'
    extra = '{"status": "ok", "outcomes": {"1.1.1": "passed", "1.1.2": "passed", "1.1.9": "passed"}, "ran": 3}'
    odd = '{"status": "ok", "outcomes": {"1.1.1": "passed", "1.1.2": "excellent"}, "ran": 3}'

    def line(payload, key="k"):
        return f"{grading.RESULT_TAG} {grading._sign(key, payload)} {payload}"

    junk = "\x00 not json {{{\n" + line(good, key="guessed") + "\nCOURSE-GRADE 00 " + good
    assert grading._verified_report(junk, "k", exercises) is None
    assert grading._verified_report(line(extra) + "\n" + line(odd), "k", exercises) is None
    report = grading._verified_report(junk + "\n" + line(good), "k", exercises)
    assert report == {"status": "ok", "outcomes": {"1.1.1": "passed", "1.1.2": "failed"}, "ran": 3}


@pytest.mark.parametrize("lesson", notebooks.lesson_paths(ROOT, "notebooks"), ids=lambda p: p.stem)
def test_worked_solutions_need_no_second_look(lesson):
    solution = ROOT / "solutions" / lesson.parent.name / lesson.name
    nbs = [nbformat.read(str(p), as_version=4) for p in (solution, lesson)]
    assert grading.review_notes(*nbs) == []


def test_lesson_notebooks_are_found():
    assert all(p.parts[-3] == "notebooks" for p in grading.lesson_notebooks())
    assert notebooks.all_notebooks(ROOT)


def test_the_sandbox_hides_submissions_and_keeps_python(tmp_path):
    if not SANDBOXED:
        pytest.skip("bubblewrap is not installed or cannot make a sandbox here")
    args = grading._sandbox_command({tmp_path})
    assert "--unshare-all" in args and args[-1] == "--"
    kept = {args[i + 1] for i, a in enumerate(args) if a == "--ro-bind"}
    assert str(Path(grading.__file__).resolve().parent) in kept
    assert str(tmp_path.resolve()) not in kept


# Each way of reaching into the checker, the kernel or other processes that has been tried, in a
# cell of its own; every one must be flagged for review by hand.
REACHES_IN = {
    "the checker's globals": "from course import exercises\ng = exercises.check.__globals__\ng['_CHECKS'].clear()",
    "the checker through check": "from course.exercises import check\ncore = check.__globals__",
    "frames of a traceback": "try:\n    1 / 0\nexcept Exception as e:\n    f = e.__traceback__.tb_frame.f_back",
    "a module handed to a helper": "import json\n\ndef patch(m, name, v):\n    setattr(m, name, v)\n\n"
                                   "patch(json, 'dumps', lambda *a, **k: '{}')",
    "sys.stdout through a helper": "import sys\n\ndef swap(module):\n    module.stdout = None\n\nswap(sys)",
    "np.allclose through an alias": "import numpy as np\nm = np\nm.allclose = lambda *a, **k: True",
    "a submodule's function": "import numpy as np\nnp.linalg.norm = lambda *a, **k: 0.0",
    "IPython through exit": "exit._ip.input_transformers_cleanup.append(lambda lines: lines)",
    "a path built from pieces": "path = '/pr' + 'oc' + '/self/maps'\nopen(path).read()",
    "os.system": "import os\nos.system('true')",
    "os.posix_spawn": "import os as o\no.posix_spawn('/bin/true', ['true'], {})",
    "os.system imported by name": "from os import system\nsystem('true')",
    "concurrent.futures": "from concurrent import futures\nfutures.ProcessPoolExecutor().submit(print)",
    "the environment": "import os\nif os.getenv('COURSE_GRADE_RUN'):\n    print('graded')",
    "the environment by name": "from os import environ\ngraded = len(environ)",
    "the folder it runs in": "import os\ngraded = os.getcwd().startswith('/tmp/work')",
    "the kernel's arguments": "import sys\ngraded = any('kernel' in a for a in sys.argv)",
}


@pytest.mark.parametrize("attack", list(REACHES_IN), ids=lambda name: name.replace(" ", "-"))
def test_review_notes_flag_every_way_in_that_has_been_tried(attack):
    nb = _with_cell(REACHES_IN[attack])
    notes = grading.review_notes(nb, _lesson_nb())
    assert len(notes) == 1 and notes[0].startswith(f"code cell {len(nb.cells)} "), notes


def test_only_the_exercise_cells_own_functions_are_graded():
    """Lesson 5.1 writes its own `ssm_kernel` in the text. A submission that deletes the exercise
    cells and binds the exercise's name to the lesson's function elsewhere must not have that graded
    as its answer: only a function the exercise cell itself defines is graded."""
    lesson = nbformat.read(str(ROOT / "notebooks" / "5-mamba" / "5.1-state-space-models.ipynb"), as_version=4)
    exercises = grading.exercise_calls(lesson)
    assert ("5.1.3", "ssm_kernel_dense") in exercises
    cells = grading.exercise_cells(lesson, exercises)
    assert sorted(cells) == [i for i, _ in exercises]
    own = [n for n, c in enumerate(grading._code_cells(lesson)) if c.source.startswith("def ssm_kernel_dense")]
    assert len(own) == 1 and cells["5.1.3"] == own[0], "the exercise cell is the one with check(...)"
    lesson.cells = [c for c in lesson.cells if 'check("5.1.' not in c.source]
    lesson.cells.append(nbformat.v4.new_code_cell("ssm_kernel_dense = ssm_kernel"))
    assert grading.exercise_cells(lesson, exercises) == {}


def test_a_module_handed_to_other_code_is_flagged_whatever_the_grader_has_imported():
    """`from numpy import linalg` brings a module whether or not the grading process has imported
    numpy.linalg itself: the flag is the same in a fresh interpreter."""
    # course._quick_nbformat first, as in the test run itself: nbformat's import is 3 s without it.
    code = ("import course._quick_nbformat\nimport nbformat\nfrom course import grading\n"
            "nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("
            "'from course import tensor\\nfrom numpy import linalg\\nhelper(tensor, linalg)')])\n"
            "print(grading.review_notes(nb, nbformat.v4.new_notebook()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT).stdout
    assert "hands the module tensor to other code" in out and "hands the module linalg to other code" in out, out


def test_the_install_cell_of_any_commit_or_of_the_course_before_needs_no_second_look():
    lesson = _lesson_nb()
    for first in (notebooks.install_source(ref="0" * 40), notebooks.install_source(repo="someone/fork"),
                  notebooks.FORMER_INSTALL_CELL.replace('url = ""', 'url = "git+https://github.com/x/y"')):
        nb = _lesson_nb()
        next(c for c in nb.cells if c.cell_type == "code").source = first
        assert grading.review_notes(nb, lesson) == [], first
    nb = _lesson_nb()
    next(c for c in nb.cells if c.cell_type == "code").source = "import os\nos.environ['X'] = '1'"
    assert grading.review_notes(nb, lesson)  # anything else in its place is looked at
