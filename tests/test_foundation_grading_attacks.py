"""Grading under attack: submissions that try to steal the runner's signing key, learn that they
are graded, take the instructor's environment, exhaust memory, or fool the instructor's terminal;
and files that would stop a whole class (a FIFO, a link to /dev/zero or to a private file, a file
named like an option). Each class is graded with and without bubblewrap where it works: a forged
submission gets no mark it did not earn, and every other row is what it would be anyway.
"""

import csv
import os
from pathlib import Path

import nbformat
import pytest

from course import grading
from course.__main__ import main
from handouts import exercise_handout  # tests/handouts.py

pytestmark = [pytest.mark.foundation, pytest.mark.slow]
ROOT = Path(__file__).resolve().parent.parent
LESSON = ROOT / "notebooks" / "1-micrograd" / "1.1-derivatives.ipynb"
SOLUTION = ROOT / "solutions" / "1-micrograd" / "1.1-derivatives.ipynb"
IDS = grading.exercise_ids(LESSON)
SANDBOXED = grading.sandbox_problem() is None

# Reads the memory of the two processes above the kernel (the runner, and the grader or the
# sandbox's first process) for 64-hex-digit strings, and writes a report signed with each into
# their stdout and stderr. It first finds a string it planted in its own memory, so a run where it finds nothing
# means that it was kept out, not that it is broken.
STEAL_THE_KEY = r'''
import hashlib, hmac, json, os, secrets

planted = secrets.token_hex(32)
HEX = bytes(49 if c in b"0123456789abcdef" else 48 for c in range(256))  # hex digit -> "1", else "0"

def runs_of_64_hex_digits(data):
    ones, found, at = data.translate(HEX), set(), 0
    while (at := ones.find(b"1" * 64, at)) >= 0:
        end = ones.find(b"0", at)
        end = len(ones) if end < 0 else end
        if end - at == 64:
            found.add(data[at:end].decode())
        at = end
    return found

def hex_strings(pid, looking_for=None):
    found = set()
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for line in maps:
            span, perms, *rest = line.split()
            lo, hi = (int(x, 16) for x in span.split("-"))
            # the heap and anonymous memory, where a Python process keeps its strings
            if not perms.startswith("rw") or (len(rest) > 3 and rest[3] != "[heap]") or hi - lo > 16 << 20:
                continue
            try:
                mem.seek(lo)
                data = mem.read(hi - lo)
            except (OSError, OverflowError, ValueError):
                continue
            found |= runs_of_64_hex_digits(data)
            if looking_for in found:
                break
    return found

if planted not in hex_strings(os.getpid(), looking_for=planted):
    raise RuntimeError("the attack is broken: it cannot find a key in its own memory")
targets, pid = [], os.getppid()
while pid > 0 and len(targets) < 2:
    targets.append(pid)
    pid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
keys, refused = set(), 0
for pid in targets:
    try:
        keys |= hex_strings(pid)
    except OSError:
        refused += 1
report = json.dumps({"status": "ok", "outcomes": {i: "passed" for i in IDS}})
lines = "".join(f"\nCOURSE-GRADE {hmac.new(k.encode(), report.encode(), hashlib.sha256).hexdigest()} {report}\n"
                for k in keys)
for pid in targets:
    for fd in (1, 2):
        try:
            with open(f"/proc/{pid}/fd/{fd}", "w") as out:
                out.write(lines)
        except OSError:
            pass
'''.replace("IDS", repr(IDS))

# The forged submissions keep the lesson's exercise cells untouched: they earned nothing.
LEAKS = "import os\nraise RuntimeError(f\"seen: {sorted(k for k in os.environ if 'CANARY' in k or 'GRADE' in k)}\")"
FAKE_LINE = "\x1b[2K\r[1/1] alice.ipynb: ok, 4/4 passed\n"


def _handout(*extra, at=None):
    """The lesson's handout with `extra` cells at `at` or the end."""
    nb = exercise_handout(LESSON)
    for n, source in enumerate(extra):
        nb.cells.insert(len(nb.cells) if at is None else at + n, nbformat.v4.new_code_cell(source))
    return nb


def _solution_cells():
    nb = nbformat.read(str(SOLUTION), as_version=4)
    return nb, [c for c in nb.cells if c.cell_type == "code"]


def _class(folder, private, only=None):
    """{student: path} of one class, each in a folder of their own (only those named in `only`)."""
    def submit(student, content, name=LESSON.name):
        path = folder / student / name
        path.parent.mkdir(parents=True)
        if only is not None and student not in only:
            return None
        if isinstance(content, bytes):
            path.write_bytes(content)
        elif isinstance(content, Path):
            path.symlink_to(content)
        elif content == "fifo":
            os.mkfifo(path)
        else:
            nbformat.write(content, str(path))
        return path

    # An error before the third exercise's cell, with the fourth's function defined above it: the
    # fourth is "not run", never "failed" or "passed".
    early, cells = _solution_cells()
    early.cells.insert(early.cells.index(cells[4]), nbformat.v4.new_code_cell("raise ValueError('stuck')"))
    early.cells.insert(early.cells.index(cells[2]), nbformat.v4.new_code_cell(cells[5].source.split("\ncheck(")[0]))
    # The exercise cells gone, their functions defined right in other cells: nothing to grade.
    moved, cells = _solution_cells()
    for cell in cells[2:]:
        cell.source = cell.source.split("\ncheck(")[0]
    # The fourth answer calls the library's backward, kept as a default argument.
    alias, cells = _solution_cells()
    cells[5].source = ("from course.micrograd import Value\n\n"
                       "def dL_dx_by_hand(x, _backward=Value.backward):\n"
                       "    v = Value(x)\n    loss = (2 * v - 1).tanh() ** 2\n"
                       "    _backward(loss)\n    return v.grad\n\n"
                       "check(\"1.1.4\", dL_dx_by_hand)")
    paths = {
        "solution": submit("solution", SOLUTION.read_bytes()),
        "backward-as-a-default-argument": submit("backward-as-a-default-argument", alias),
        "steals-the-key": submit("steals-the-key", _handout(STEAL_THE_KEY, LEAKS)),
        "escape-codes": submit(f"escape{FAKE_LINE}codes", _handout(f"raise RuntimeError({FAKE_LINE!r})", at=1)),
        "eats-memory": submit("eats-memory", _handout("block = bytearray(8 * 2**30)", at=1)),
        "error-before-an-exercise": submit("error-before-an-exercise", early),
        "no-exercise-cells": submit("no-exercise-cells", moved),
        "fifo": submit("fifo", "fifo"),
        "dev-zero": submit("dev-zero", Path("/dev/zero")),
        "links-a-private-file": submit("links-a-private-file", private),
        "not-a-notebook": submit("not-a-notebook", b"{ PRIVATE-CONTENT is not a notebook"),
    }
    return {name: path for name, path in paths.items() if path is not None}


def _grade(tmp_path, monkeypatch, capsys, sandbox, only=None):
    """Grade the class (or the students in `only`); return ({student: CSV row}, what was printed)."""
    private = tmp_path / "private.txt"
    private.write_text("PRIVATE-CONTENT of the instructor")
    private.chmod(0o600)
    paths = _class(tmp_path / "class", private, only)
    monkeypatch.setenv("COURSE_CANARY", "a secret of the instructor's")
    out = tmp_path / "grades.csv"

    rows = grading.grade(list(paths.values()), out, time_limit=60, sandbox=sandbox, jobs=2, memory=3)

    with open(out, newline="") as f:
        table = {r["notebook"]: r for r in csv.DictReader(f)}
    assert len(rows) == len(table) == len(paths), "every submission gets its row"
    return {name: table[grading.printable(path)] for name, path in paths.items()}, capsys.readouterr().out


# What the sandbox could change: what the kernel can reach of the processes above it, what it is
# given (its environment, its memory).
IN_BOTH_MODES = ("solution", "steals-the-key", "eats-memory")


def _assert_kept_out(row):
    assert row["solution"]["status"] == "ok" and row["solution"]["passed"] == str(len(IDS)), row["solution"]
    thief = row["steals-the-key"]
    assert "the attack is broken" not in thief["status"]
    assert thief["passed"] == "0", f"a stolen key forged a grade: {thief}"
    assert "review by hand" in thief["status"]
    # The cell after the theft says which variables of the instructor or of grading it saw.
    assert "seen: []" in thief["status"], f"the kernel saw the instructor's or the grader's variables: {thief}"
    memory = row["eats-memory"]
    assert "MemoryError" in memory["status"] and "memory limit is 3 GiB" in memory["status"], memory


def test_a_class_under_attack(tmp_path, monkeypatch, capsys):
    """The whole class, in the sandbox where there is one (the other way below)."""
    row, printed = _grade(tmp_path, monkeypatch, capsys, sandbox=SANDBOXED)
    _assert_kept_out(row)
    assert "\x1b" not in printed and "\r" not in printed, "raw control characters reached the terminal"
    codes = row["escape-codes"]
    assert codes["status"].startswith("error in code cell 2: RuntimeError: \\x1b[2K [1/1] alice.ipynb: ok")
    assert "\x1b" not in codes["status"] and "\x1b" not in codes["notebook"] and "\n" not in codes["notebook"]
    alias = row["backward-as-a-default-argument"]
    assert [alias[i] for i in IDS] == ["passed", "passed", "passed", "failed"], alias
    early = row["error-before-an-exercise"]
    assert "ValueError: stuck" in early["status"]
    assert [early[i] for i in IDS] == ["passed", "passed", "not run", "not run"], early
    moved = row["no-exercise-cells"]
    assert moved["status"] == "ok" and all(moved[i] == "not attempted" for i in IDS), moved
    for name in ("fifo", "dev-zero", "links-a-private-file", "not-a-notebook"):
        assert row[name]["passed"] == "0" and all(row[name][i] == "not run" for i in IDS), row[name]
        assert "PRIVATE" not in row[name]["status"], row[name]
    assert row["fifo"]["status"] == "could not read it: it is not a regular file"
    assert row["dev-zero"]["status"] == row["links-a-private-file"]["status"] == \
        "could not read it: it is a symbolic link (grade the file itself)"
    assert row["not-a-notebook"]["status"] == "not a notebook (NotJSONError)"


@pytest.mark.skipif(not SANDBOXED, reason="bubblewrap is not installed or cannot make a sandbox here: "
                                          "the class above ran without it")
def test_the_attacks_that_depend_on_the_sandbox_fail_without_it_too(tmp_path, monkeypatch, capsys):
    row, _ = _grade(tmp_path, monkeypatch, capsys, sandbox=False, only=IN_BOTH_MODES)
    assert sorted(row) == sorted(IN_BOTH_MODES)
    _assert_kept_out(row)


def test_a_file_named_like_an_option_is_graded_not_obeyed(tmp_path, monkeypatch):
    """`grade *.ipynb` in a folder with a file named `--lesson=evil.ipynb`: the shell hands that name
    over as an argument, and it must be graded as a notebook, not set the lesson of everyone."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / LESSON.name).write_bytes(SOLUTION.read_bytes())
    for name in ("--lesson=evil.ipynb", "--out=stolen.ipynb"):
        (tmp_path / name).write_text("{}")
    expanded = sorted(p.name for p in tmp_path.glob("*.ipynb"))  # what the shell makes of *.ipynb
    assert expanded[0].startswith("--")

    with pytest.raises(SystemExit, match="2 of 3 inputs could not be graded"):  # the two named like options
        main(["grade", "--no-sandbox", "--time-limit", "60", *expanded])

    with open(tmp_path / "grades.csv", newline="") as f:
        table = {r["notebook"]: r for r in csv.DictReader(f)}
    assert set(table) == set(expanded) and not (tmp_path / "stolen.ipynb").exists()
    assert table[LESSON.name]["status"] == "ok" and table[LESSON.name]["total"] == str(len(IDS))
    assert all(table[LESSON.name][i] == "passed" for i in IDS)
    for name in expanded[:2]:
        assert table[name]["status"].startswith("no lesson of the course is named like this notebook")


def test_after_a_double_dash_every_name_is_a_notebook(tmp_path, monkeypatch):
    import course.__main__ as cli

    seen = {}
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.ipynb").write_text("{}")
    monkeypatch.setattr(grading, "grade", lambda paths, out, **kw: seen.update(paths=paths, out=out, **kw))
    cli.main(["grade", "--out", "g.csv", "--", "a.ipynb", "--lesson=b.ipynb", "--jobs=9"])
    assert [str(p) for p in seen["paths"]] == ["a.ipynb", "--lesson=b.ipynb", "--jobs=9"] and seen["lesson"] is None
    assert seen["jobs"] == 1 and str(seen["records"]) == "g-results.jsonl.partial"  # renamed once all are in


def test_an_oversized_file_is_not_read(tmp_path, monkeypatch):
    assert grading._read(SOLUTION) == SOLUTION.read_bytes()
    monkeypatch.setattr(grading, "LARGEST", 1000)
    big = tmp_path / LESSON.name
    big.write_bytes(b" " * 1001)
    err = grading._read(big)
    assert isinstance(err, OSError) and str(err).startswith("it is larger than 0.000953674 MB")
