"""Grading where the verdict is out of the submission's reach.

Each forged submission below hands in wrong answers (or answers that call the library function the
exercise asks the learner to write) together with code that changes whatever a check running in
the same process relies on: NumPy's comparison reached through aliases or names built at run time,
a profile hook, a thread, the garbage collector, a signal handler's frame, ctypes, `__name__`, a
private helper of the library, a working-folder test. Each test first shows that the attack works
against the checks run in the learner's own process (`check(...)` in a fresh Python, as a kernel
would run the notebook), so it cannot pass because the attack broke; then grades the forgeries as
a class and finds that none of them earned a mark.
"""

import csv
import subprocess
import sys
from pathlib import Path

import nbformat
import numpy as np
import pytest

from course import grading
from course.instructor import remote, wire
from handouts import exercise_handout  # tests/handouts.py

pytestmark = [pytest.mark.foundation, pytest.mark.slow]
ROOT = Path(__file__).resolve().parent.parent
LESSON = ROOT / "notebooks" / "1-micrograd" / "1.1-derivatives.ipynb"
TOKENS = ROOT / "notebooks" / "4-gpt" / "4.1-tokenization.ipynb"
IDS = grading.exercise_ids(LESSON)
SANDBOXED = grading.sandbox_problem() is None

# Wrong answers to lesson 1.1, one per exercise: each fails every honest check.
WRONG = {"1.1.1": "return 0.0", "1.1.2": "return [0.0] * len(xs)", "1.1.3": "return lambda x: 0.0",
         "1.1.4": "return 0.0"}
ALWAYS_CLOSE = "lambda *a, **k: True"

# What each attack does before the exercises: change what a check in this process compares with.
ATTACKS = {
    "patch-through-an-alias": f'import os\ngetattr(os.sys, "modules")["numpy"].allclose = {ALWAYS_CLOSE}',
    "patch-by-a-name-built-at-run-time": (
        "name = ''.join(map(chr, [97, 108, 108, 99, 108, 111, 115, 101]))\n"
        f"setattr(__import__('numpy'), name, {ALWAYS_CLOSE})"),
    "profile-hook": (
        "import sys\n"
        "def hook(frame, event, arg):\n"
        "    if event == 'call' and frame.f_code.co_name == '_' and 'expect_close' in frame.f_globals:\n"
        "        frame.f_globals['expect_close'] = lambda *a, **k: None\n"
        "sys.setprofile(hook)"),
    "daemon-thread": (
        "import threading, time, numpy\n"
        "def later():\n"
        "    time.sleep(0.2)\n"
        f"    numpy.allclose = {ALWAYS_CLOSE}\n"
        "threading.Thread(target=later, daemon=True).start()\n"
        "time.sleep(0.5)"),
    "garbage-collector": (
        "import gc\n"
        "def quiet(*args, **kwargs):\n    return None\n"
        "import course.exercises._core\n"
        "for obj in gc.get_objects():\n"
        "    if getattr(obj, '__name__', '') == 'expect_close' and hasattr(obj, '__code__'):\n"
        "        obj.__code__ = quiet.__code__"),
    "signal-frame": (
        "import signal, time, numpy\n"
        "def handler(number, frame):\n"
        f"    frame.f_globals['numpy'].allclose = {ALWAYS_CLOSE}\n"
        "signal.signal(signal.SIGALRM, handler)\n"
        "signal.setitimer(signal.ITIMER_REAL, 0.05)\n"
        "time.sleep(0.2)"),
    "ctypes-dict-write": (
        "import ctypes, numpy\n"
        "ctypes.pythonapi.PyDict_SetItem(ctypes.py_object(vars(numpy)), ctypes.py_object('allclose'),\n"
        f"                                ctypes.py_object({ALWAYS_CLOSE}))"),
    "rewritten-output": (  # what a check in this process prints, and so what a kernel would report
        "import builtins\nreal = builtins.print\n"
        "builtins.print = lambda *a, **k: real(*(x.replace('failed', 'passed') if isinstance(x, str) else x "
        "for x in a), **k)"),
    "only-when-graded": (
        "import os\n"
        "if not os.path.abspath('.').startswith(os.path.expanduser('~/never')):\n"
        f"    __import__('numpy').allclose = {ALWAYS_CLOSE}"),
}


def _forged(attack):
    """The lesson's handout with `attack` first and a wrong answer in each exercise cell."""
    nb = exercise_handout(LESSON)
    for cell in nb.cells[1:]:
        exercise_id = cell.source.split('check("')[1].split('"')[0]
        cell.source = cell.source.replace("raise NotImplementedError  # your code here", WRONG[exercise_id])
    nb.cells.insert(1, nbformat.v4.new_code_cell(attack))
    return nb


def _by_name(lesson, answers):
    """A handout whose exercise cells call the library's own function, from a cell that says it is
    part of the course (`__name__ = "course.homework"`), so that the in-process gate lets it through."""
    nb = exercise_handout(lesson)
    nb.cells.insert(1, nbformat.v4.new_code_cell('__name__ = "course.homework"'))
    for cell in nb.cells[2:]:
        exercise_id = cell.source.split('check("')[1].split('"')[0]
        if exercise_id in answers:
            head = cell.source.split("\n")[0]
            cell.source = f"{answers[exercise_id][0]}\n{head}\n    {answers[exercise_id][1]}\n\n\ncheck(\"{exercise_id}\", " \
                          f"{head.split('def ')[1].split('(')[0]})"
    return nb


LIBRARY_ANSWERS = {  # the library's own function called from the learner's answer
    "1.1.4": ("from course.micrograd import Value",
              "v = Value(x); loss = (2 * v - 1).tanh() ** 2; loss.backward(); return v.grad"),
}
PRIVATE_HELPER = {  # 4.1.4 answered by an unlisted private helper of the tokenizer
    "4.1.4": ("from course.gpt import BPETokenizer",
              "t = BPETokenizer(sorted(merges, key=merges.get), pattern=None); "
              "return t._encode_plain(text)"),
}


def _in_process(nb):
    """The outcomes of `check(...)` when the notebook's cells run in one Python process, as in a
    kernel: {exercise id: "passed" | "failed" | ...}."""
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    found = {}
    for line in out.stdout.splitlines():
        if line.startswith("[") and "] " in line:
            exercise_id, rest = line[1:].split("] ", 1)
            found[exercise_id] = rest.split(":")[0].split(".")[0].split(" yet")[0]
    return found


def _grade_class(tmp_path, notebooks, lesson, sandbox):
    paths = []
    for student, nb in notebooks.items():
        path = tmp_path / "class" / student / lesson.name
        path.parent.mkdir(parents=True)
        nbformat.write(nb, str(path))
        paths.append(path)
    out = tmp_path / "grades.csv"
    grading.grade(paths, out, time_limit=120, sandbox=sandbox, jobs=2)
    with open(out, newline="") as f:
        return {Path(r["notebook"]).parent.name: r for r in csv.DictReader(f)}


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_each_attack_forges_a_check_in_the_learners_process(name):
    outcomes = _in_process(_forged(ATTACKS[name]))
    assert any(outcomes.get(i) == "passed" for i in IDS), (name, outcomes)


def test_the_library_reached_by_name_or_a_private_helper_passes_in_process():
    assert _in_process(_by_name(LESSON, LIBRARY_ANSWERS)).get("1.1.4") == "passed"
    assert _in_process(_by_name(TOKENS, PRIVATE_HELPER)).get("4.1.4") == "passed"


def test_no_forged_submission_gets_a_mark(tmp_path):
    """In the sandbox where there is one; without it, the wall holds the same (the checks are in the
    grader either way), and test_without_a_sandbox_... below grades that way."""
    sandbox = SANDBOXED
    notebooks = {name: _forged(attack) for name, attack in ATTACKS.items()}
    notebooks["library-by-name"] = _by_name(LESSON, LIBRARY_ANSWERS)
    notebooks["honest"] = nbformat.read(str(ROOT / "solutions" / "1-micrograd" / LESSON.name), as_version=4)
    rows = _grade_class(tmp_path, notebooks, LESSON, sandbox)
    for name, row in rows.items():
        if name == "honest":
            assert row["status"].startswith("ok") and all(row[i] == "passed" for i in IDS), row
        elif name == "library-by-name":
            assert row["1.1.4"] == "failed", row
        else:
            assert row["passed"] == "0" and all(row[i] in ("failed", "not run") for i in IDS), (name, row)


def test_a_private_helper_of_the_library_gets_no_mark(tmp_path):
    rows = _grade_class(tmp_path, {"helper": _by_name(TOKENS, PRIVATE_HELPER)}, TOKENS, SANDBOXED)
    assert rows["helper"]["4.1.4"] == "failed", rows["helper"]


# ---- the wire itself ----

def test_nothing_decodes_into_code_the_sender_chose():
    codec = wire.Codec("a")
    refused = [["x", [], ["c", "course.kernels.cpu:os.system"]],      # an import of a lesson module
               ["x", [], ["c", "os:system"]],
               ["x", [], ["P", "numpy", "save"]],                     # not pure
               ["x", [], ["B", "eval"]], ["x", [], ["B", "open"]],
               ["x", [], ["M", "os"]],
               ["x", [["a1", ["o", "course.grading:Path", []]]], ["r", "a1"]],
               ["x", [["a1", ["o", "course.micrograd:Value", [["__class__", 1]]]]], ["r", "a1"]],
               ["x", [], ["h", "a", "ah0"]]]                          # a handle never lent
    for data in refused:
        with pytest.raises(wire.WireError):
            codec.decode(data)


def test_a_deep_graph_crosses_without_recursion():
    """30,000 nodes, thirty times Python's recursion limit: a message is a flat list of objects."""
    from course.micrograd import Value

    x = Value(1.0)
    y = x
    for _ in range(30_000):
        y = y * 1.0
    sender, receiver = wire.Codec("a"), wire.Codec("b")
    copy = receiver.decode(sender.encode(y))
    depth = 0
    while copy._prev:
        copy, depth = copy._prev[0], depth + 1
    assert depth == 30_000 and copy.data == 1.0


def test_the_answerer_holds_none_of_what_the_exercise_rebuilds():
    """In a fresh process: loading the lesson modules, removing the names each check of parts 1-5
    forbids, and finding every one of them gone from memory."""
    code = (
        "import sys\n"
        "from course.exercises import _core\n"
        "from course.instructor import answerer, remote\n"
        "ids = [i for i in _core.registered_ids() if not _core.entry(i).inside]\n"
        "for m in remote.PART_MODULES['6'] + remote.PART_MODULES['4'] + remote.PART_MODULES['5']"
        " + remote.PART_MODULES['2'] + ['course.micrograd', 'course.tensor.gradcheck']:\n"
        "    __import__(m)\n"
        "bad = []\n"
        "paths = sorted({p for i in ids for p in _core.entry(i).forbid})\n"
        "bad = answerer.strip(paths)\n"
        "print(len(paths), bad)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    count, problems = out.stdout.split(" ", 1)
    assert int(count) > 40 and problems.strip() == "[]", out.stdout + out.stderr


def test_the_definitions_that_answer_an_exercise():
    cells = ["import numpy as np\nx = np.ones(3)\nTPB = 16\nf = lambda t: t * 2\nmodel = train(3)",
             "%matplotlib inline\ndef helper(a):\n    return a + 1\nprint(helper(1))",
             "def answer(x):\n    return helper(x)\n\ncheck('1.1.1', answer)"]
    code = remote.answer_code(cells, 2)
    assert code[:4] == ["import numpy as np", "TPB = 16", "f = lambda t: t * 2", "def helper(a):\n    return a + 1"]
    assert code[4] == cells[2] and len(code) == 5
    assert not any("train(" in c or "print(" in c for c in code)
    # A line of the lesson's own that fails when answering (it needs what a plot made) is not the
    # learner's to hear about; a line of their own is.
    assert remote.handed_out_statements(cells, 2, handed=[cells[0]]) == [0, 1, 2]
    assert remote.handed_out_statements(cells, 2, handed=[]) == []


# ---- the sandbox and the mode without one ----

@pytest.mark.skipif(not SANDBOXED, reason="bubblewrap cannot make a sandbox here")
def test_the_sandbox_runs_as_nobody_and_shows_only_what_python_needs_of_etc():
    probe = ("import os\n"
             "print(os.getuid(), os.path.exists('/etc/shadow'), os.path.exists('/etc/ld.so.cache'))\n"
             "import course; print(course.__file__)\n")
    answering = grading._sandbox_command(set(), course_source=False) + [sys.executable, "-I", "-c", probe]
    out = subprocess.run(answering, capture_output=True, text=True, timeout=60)
    assert out.stdout.splitlines()[0] == "65534 False True", out.stdout + out.stderr
    assert "ModuleNotFoundError" in out.stderr  # the answerer's sandbox holds no course source


def test_grading_refuses_without_a_sandbox_unless_told(tmp_path, monkeypatch):
    monkeypatch.setattr(grading, "sandbox_problem", lambda: "bubblewrap (bwrap) is not installed")
    path = tmp_path / LESSON.name
    nbformat.write(exercise_handout(LESSON), str(path))
    with pytest.raises(SystemExit, match="refuses to run without a sandbox.*--no-sandbox"):
        grading.grade([path], tmp_path / "g.csv")
    rows = grading.grade([path], tmp_path / "g.csv", sandbox=False, time_limit=60)
    assert rows[0]["status"].startswith("ok") and rows[0]["passed"] == 0


def test_without_a_sandbox_a_submission_that_rewrites_the_course_changes_no_later_grade(tmp_path):
    """The first submission writes into the package it runs with (a fresh copy, read-only, which it
    makes writable again) and into the course's source the grader read; the second, honest but
    wrong, is graded as if nothing had happened."""
    import course

    real = Path(course.__file__).resolve().parent / "exercises" / "_core.py"
    before = real.read_bytes()
    tamper = ("import os, course, course.exercises._core as core\n"
              "target = core.__file__\n"
              "os.chmod(os.path.dirname(target), 0o755); os.chmod(target, 0o644)\n"
              "open(target, 'a').write('\\nrun = lambda *a, **k: CheckResult(a[0], \"passed\", \"\")\\n')\n"
              "print(target)")
    first = _forged("x = 1")
    first.cells.insert(1, nbformat.v4.new_code_cell(tamper))
    second = _forged("y = 2")
    try:
        for name, nb in (("a-tamperer", first), ("b-honest", second)):
            path = tmp_path / name / LESSON.name
            path.parent.mkdir()
            nbformat.write(nb, str(path))
        grading.grade([tmp_path / "a-tamperer" / LESSON.name, tmp_path / "b-honest" / LESSON.name],
                      tmp_path / "g.csv", sandbox=False, jobs=1, time_limit=60)
        assert real.read_bytes() == before  # it wrote into its own copy, not the course
    finally:
        real.write_bytes(before)
    with open(tmp_path / "g.csv", newline="") as f:
        rows = {Path(r["notebook"]).parent.name: r for r in csv.DictReader(f)}
    assert rows["a-tamperer"]["passed"] == rows["b-honest"]["passed"] == "0", rows


# ---- a learner's CUDA kernel: rebuilt from the source, compiled first, traced in its own process ----

KERNELS = ROOT / "notebooks" / "6-kernels" / "6.2-shared-memory.ipynb"
# A kernel whose Python, run by the tracer in the learner's process, switches off what the check
# compares with and what would compile it for a GPU: it does nothing a GPU could do.
FORGING_KERNEL = '''from numba import cuda

@cuda.jit
def reverse_in_place(x):
    if cuda.threadIdx.x == 0:
        __import__("numpy").allclose = lambda *a, **k: True
        __import__("course.kernels.compile", fromlist=["compile_ptx"]).compile_ptx = lambda *a, **k: {}


check("6.2.1", reverse_in_place)'''
HONEST_KERNEL = '''from numba import cuda

@cuda.jit
def reverse_in_place(x):
    t = cuda.threadIdx.x
    value = x[x.size - 1 - t]
    cuda.syncthreads()
    x[t] = value


check("6.2.1", reverse_in_place)'''


def _kernel_handout(source):
    nb = exercise_handout(KERNELS)
    for cell in nb.cells:
        if 'check("6.2.1"' in cell.source:
            cell.source = source
    return nb


def _can_compile():
    from course.kernels import compile as gpu

    return gpu.available()[0]


def test_a_forging_kernel_passes_in_the_learners_process():
    assert _in_process(_kernel_handout(FORGING_KERNEL)).get("6.2.1") == "passed"


@pytest.mark.skipif(not _can_compile(), reason="NVVM is not installed: kernels are checked in the notebook's kernel")
def test_a_kernel_is_compiled_before_it_runs_and_traced_alone(tmp_path):
    notebooks = {"forger": _kernel_handout(FORGING_KERNEL), "honest": _kernel_handout(HONEST_KERNEL)}
    rows = _grade_class(tmp_path, notebooks, KERNELS, SANDBOXED)
    assert rows["honest"]["6.2.1"] == "passed", rows["honest"]
    assert rows["forger"]["6.2.1"] == "failed" and rows["forger"]["passed"] == "0", rows["forger"]


def test_a_kernel_is_rebuilt_from_plain_defs_only():
    from course.instructor import kernels

    statements = ["import numpy as np", "@cuda.jit(device=True)\ndef helper(a, b=2):\n    return a + b",
                  "@cuda.jit\ndef k(x: int, n=len('abc')):\n    x[0] = helper(n)"]
    description = {"kernel": "k", "functions": {"k": [2, False], "helper": [1, True]},
                   "globals": {"np": ["module", "numpy"]}}
    with pytest.raises(kernels.Refused, match="not a constant"):  # a default that would run code
        kernels.bundle(description, statements)
    statements[2] = "@cuda.jit\ndef k(x: int, n=3):\n    x[0] = helper(n)"
    job = kernels.bundle(description, statements)
    assert job["defs"] == [["k", "def k(x, n=3):\n    x[0] = helper(n)", False],
                           ["helper", "def helper(a, b=2):\n    return a + b", True]]
    for bad in (["module", "os"], ["unknown", "function"], ["value", ["x", [], ["h", "b", "bh0"]]]):
        with pytest.raises(kernels.Refused):
            kernels.bundle({**description, "globals": {"np": bad}}, statements)
    with pytest.raises(kernels.Refused, match="not defined by a `def`"):
        kernels.bundle({**description, "functions": {"k": [0, False]}}, statements)


@pytest.mark.skipif(not SANDBOXED, reason="without a sandbox a submission can stop the grader itself")
def test_a_submission_that_kills_every_process_it_can_see_stops_only_itself(tmp_path):
    killer = _forged("import os, signal\ntry:\n    os.kill(-1, signal.SIGKILL)\nexcept OSError:\n    pass")
    for cell in killer.cells:  # and again while its answers are checked
        if 'check("1.1.1"' in cell.source:
            cell.source = cell.source.replace("return 0.0", "import os, signal; os.kill(-1, signal.SIGKILL)")
    honest = nbformat.read(str(ROOT / "solutions" / "1-micrograd" / LESSON.name), as_version=4)
    rows = _grade_class(tmp_path, {"killer": killer, "honest": honest}, LESSON, True)
    assert rows["killer"]["passed"] == "0", rows["killer"]
    assert rows["honest"]["status"].startswith("ok") and all(rows["honest"][i] == "passed" for i in IDS), rows


def test_a_folder_a_missing_file_or_a_readme_is_named_and_the_command_fails(tmp_path, monkeypatch):
    from course.__main__ import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "alice").mkdir()
    (tmp_path / "README.md").write_text("# hand-in notes\n")
    good = tmp_path / LESSON.name
    nbformat.write(exercise_handout(LESSON), str(good))
    with pytest.raises(SystemExit, match="3 of 4 inputs could not be graded"):
        main(["grade", "--no-sandbox", "--time-limit", "60", "--", "alice", "missing.ipynb", "README.md", good.name])
    with open(tmp_path / "grades.csv", newline="") as f:
        rows = {r["notebook"]: r["status"] for r in csv.DictReader(f)}
    assert rows["alice"] == "could not read it: it is a folder: give the notebooks in it (alice/*.ipynb)"
    assert rows["missing.ipynb"].startswith("could not read it: there is no such file")
    assert rows["README.md"] == "not a notebook file (.ipynb): grade the notebooks themselves"
    assert rows[good.name] == "ok"
    main(["grade", "--no-sandbox", "--time-limit", "60", "--", good.name])  # all graded: no error


def test_each_submission_gets_a_feedback_page_with_what_its_checks_said(tmp_path):
    wrong = _forged("x = 1")  # wrong answers, no attack; one that raises what would be markup
    for cell in wrong.cells:
        if 'check("1.1.2"' in cell.source:
            cell.source = cell.source.replace("return [0.0] * len(xs)", "raise ValueError('<script>alert(1)</script>')")
    honest = nbformat.read(str(ROOT / "solutions" / "1-micrograd" / LESSON.name), as_version=4)
    untouched = exercise_handout(LESSON)
    for name, nb in (("bob", wrong), ("carol", honest), ("dave", untouched)):
        (tmp_path / name).mkdir()
        nbformat.write(nb, str(tmp_path / name / LESSON.name))
    paths = [tmp_path / name / LESSON.name for name in ("bob", "carol", "dave")]
    grading.grade(paths, tmp_path / "grades.csv", sandbox=SANDBOXED, time_limit=120, jobs=2)
    pages = {p.name: p.read_text() for p in (tmp_path / "grades-feedback").iterdir()}
    stem = LESSON.stem
    assert sorted(pages) == [f"bob__{stem}.html", f"carol__{stem}.html", f"dave__{stem}.html"]
    bob, carol, dave = (pages[f"{n}__{stem}.html"] for n in ("bob", "carol", "dave"))
    assert "0 of 4 exercises passed" in bob and "[1.1.1] failed: expected derivative" in bob
    assert "Hint:" in bob and "In full:" not in bob  # the hint, never the answer
    assert "4 of 4 exercises passed" in carol and carol.count("passed.</td>") == 4
    assert "[1.1.1] not attempted yet" in dave
    assert "<script" not in bob and "&lt;script&gt;alert(1)&lt;/script&gt;" in bob


def test_an_object_changed_between_two_messages_arrives_as_it_is_now():
    """The learner's numerical_gradient may pass one list to f twice, changed in between: each call
    must see the list as it is then, not as it was when it first crossed."""
    from course.instructor.codec import Codec

    here, there = Codec("a"), Codec("b")
    xs, nested, weights = [1.0, 2.0], {"inner": [0]}, np.zeros(3)
    first = there.decode(here.encode((xs, nested, weights)))
    xs[0] += 0.5
    nested["inner"].append(7)
    weights[1] = 2.0
    second = there.decode(here.encode((xs, nested, weights)))
    assert second[0] == [1.5, 2.0] and second[1] == {"inner": [0, 7]} and list(second[2]) == [0, 2, 0]
    assert second[0] is first[0]  # the same object on the other side, updated in place
    untouched = here.encode((xs, nested, weights))
    assert untouched[1] == []  # nothing changed: nothing is sent again
