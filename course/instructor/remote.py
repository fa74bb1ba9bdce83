"""Grading across the sandbox's wall: the grader's half.

For each submission the grader starts the answerer (`answerer.py`), inside the sandbox, with the
learner's code and only the library each exercise gives, and joins it to itself with one pair of
pipes per exercise; the checks run in the grader (`checker.py`), outside the sandbox, on the
learner's functions through those pipes. The answerer starts from `BOOT`, which writes the
course's source as the grader read it before any submission ran into a folder of its own: a
submission that changed the files on disk changes nothing there, and the grader imported its own
copy of the course and of every check before any submission ran.
"""

import ast
import json
import os
import secrets
import struct
import subprocess
import sys
import threading
from pathlib import Path

from . import wire

# The start-up code of both processes (`python -I -c BOOT`): read the job, write the course's
# source, run the named module's main(job, root).
BOOT = r"""
import importlib, json, os, struct, sys, tempfile
def read(n):
    parts = []
    while n:
        part = os.read(0, min(n, 1 << 20))
        if not part:
            raise SystemExit("no job")
        parts.append(part)
        n -= len(part)
    return b"".join(parts)
job = json.loads(read(struct.unpack("<Q", read(8))[0]))
os.close(0)
root = job.pop("root") or tempfile.mkdtemp(prefix="course-")
for relative, text in job.pop("sources").items():
    path = os.path.join(root, relative)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
for relative, target in job.pop("links").items():
    path = os.path.join(root, relative)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    os.symlink(target, path)
sys.path.insert(0, root)
importlib.import_module(job["main"]).main(job, root)
"""

# What each part's exercises work with, loaded before the learner's code runs (with what the
# notebook itself imports).
PART_MODULES = {
    "1": ["course.micrograd"],
    "2": ["course.tensor", "course.nn", "course.optim", "course.minitf"],
    "3": ["course.minitf", "course.tensor", "course.nn"],
    "4": ["course.gpt", "course.tensor", "course.nn", "course.optim", "course.pretrained"],
    "5": ["course.mamba", "course.tensor", "course.nn", "course.data"],
    "6": ["course.kernels", "course.kernels.fused", "course.tensor", "course.nn", "course.optim", "course.mamba"],
}
NEVER_LOADED = ("course.exercises", "course.grading", "course.instructor", "course.lab", "course.notebooks",
                "course.doctor", "course.__main__")


def course_sources():
    """{path under the source root: text} of every module of the course package."""
    import course

    package = Path(course.__file__).resolve().parent
    return {f"course/{p.relative_to(package).as_posix()}": p.read_text(encoding="utf-8")
            for p in sorted(package.rglob("*.py")) if "__pycache__" not in p.parts}


def _blank_magics(source):
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())


def _definition(node):
    """Whether a top-level statement defines something (and does no work): an import, a function,
    a class, or a name bound to a value computed without calling anything."""
    if isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return True
    if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
        return not any(isinstance(n, (ast.Call, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp,
                                      ast.Await, ast.Yield, ast.YieldFrom, ast.NamedExpr))
                       for n in ast.walk(node.value))
    return False


def answer_code(cells, exercise_cell):
    """The statements the answerer runs for one exercise: the definitions of every code cell, in
    order, and the exercise's own cell whole (its `check(...)` does nothing there)."""
    return [statement for statement, _ in _statements(cells, exercise_cell)]


def handed_out_statements(cells, exercise_cell, handed):
    """The positions in answer_code's list of the statements that come from cells as the lesson
    handed them out (`handed`: those cells' sources): one of them failing is the lesson's doing
    (a line that needs a variable a plot made), not something to tell the learner."""
    handed = {source.strip() for source in handed}
    return [k for k, (_, n) in enumerate(_statements(cells, exercise_cell)) if cells[n].strip() in handed]


def _statements(cells, exercise_cell):
    for n, source in enumerate(cells):
        source = _blank_magics(source)
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        if n == exercise_cell:
            yield source, n
            continue
        yield from ((ast.unparse(node), n) for node in tree.body if _definition(node))


def preload(cells, part, sources):
    """The modules the answerer imports before any learner code: the part's and those the notebook
    imports, each course package with all its modules (a function may import one when called),
    never the checks or grading."""
    names = list(PART_MODULES.get(part, []))
    for source in cells:
        try:
            tree = ast.parse(_blank_magics(source))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names += [node.module] + [f"{node.module}.{a.name}" for a in node.names
                                          if node.module == "course" or node.module.startswith("course.")]
    modules = [path[:-3].replace("/", ".").removesuffix(".__init__") for path in sources]
    for name in list(names):
        names += [m for m in modules if m.startswith(name + ".")]
    return [name for name in dict.fromkeys(names)
            if not any(name == x or name.startswith(x + ".") for x in NEVER_LOADED)]


def _start(command, job, fds, env, cwd, stdout):
    proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=stdout, stderr=subprocess.DEVNULL,
                            pass_fds=fds, env=env, cwd=cwd, start_new_session=True)
    data = json.dumps(job).encode()

    def feed():
        try:
            proc.stdin.write(struct.pack("<Q", len(data)) + data)
            proc.stdin.close()
        except OSError:
            pass

    threading.Thread(target=feed, daemon=True).start()
    return proc


def check_kernel(exercise, description, *, seed, sources, kernel_command, env, work, stop):
    """(outcome, message) of a kernel exercise: the kernel rebuilt from the grader's copy of the
    notebook's source and checked in a fresh process of its own (`kernels.main`)."""
    from . import kernels

    exercise_id = exercise["id"]
    try:
        job = kernels.bundle(description, exercise["code"])
    except (kernels.Refused, wire.WireError, SyntaxError) as err:
        return "failed", f"[{exercise_id}] failed: {err}"
    report_read, report_write = os.pipe()
    proc = None
    try:
        proc = _start(kernel_command + [sys.executable, "-I", "-c", BOOT],
                      {"main": "course.instructor.kernels", "sources": sources,
                       # inside its sandbox, a folder of the sandbox's own /tmp; else one in the run's folder
                       "root": None if kernel_command else f"{work}/.kernel-{exercise_id}",
                       "links": _data_links(), "id": exercise_id, "seed": seed, "report_fd": report_write, **job},
                      [report_write], env, work, subprocess.DEVNULL)
        os.close(report_write)
        report_write = None
        try:
            proc.wait(timeout=exercise["seconds"] * 2)
        except subprocess.TimeoutExpired:
            return "failed", f"[{exercise_id}] failed: your kernel ran longer than {exercise['seconds'] * 2:g} s"
        data = os.read(report_read, 1 << 20)
        try:
            outcome, message = json.loads(data)
            return str(outcome), str(message)
        except (ValueError, TypeError):
            return "failed", f"[{exercise_id}] failed: the kernel's check gave no result"
    finally:
        os.close(report_read)
        if report_write is not None:
            os.close(report_write)
        if proc is not None:
            stop(proc)


def _data_links():
    import course

    from course.grading import data_files

    package = Path(course.__file__).resolve().parent
    return {f"course/{name}": str(package / name) for name in data_files()}


def grade_across(job, exercises, *, sources, sandbox_command, env, work, time_limit, stop, seconds=60,
                 kernel_command=()):
    """{exercise id: (outcome, message)} for `exercises` [(id, name, strip)] of one submission: its
    learner's code answering in the sandbox (`sandbox_command`, or none), the checks run here."""
    if not exercises:
        return {}
    from course.grading import SOURCE_ROOT

    from . import checker

    answerer_fds, checking = [], []
    cells, part = job["cells"], job["part"].rsplit("part", 1)[-1]
    answering = []
    for exercise_id, name, strip in exercises:
        to_answerer, from_checker = os.pipe()   # the checker writes, the answerer reads
        to_checker, from_answerer = os.pipe()
        answerer_fds += [to_answerer, from_answerer]
        code = answer_code(cells, job["exercise_cells"][exercise_id])
        quiet = handed_out_statements(cells, job["exercise_cells"][exercise_id], job.get("handed", ()))
        kernel = exercise_id in job.get("kernels", ())
        answering.append({"id": exercise_id, "name": name, "strip": list(strip), "seconds": seconds,
                          "code": code, "quiet": quiet, "kernel": kernel, "fds": [to_answerer, from_answerer]})
        checking.append({"id": exercise_id, "name": name, "seconds": seconds, "code": code,
                         "fds": [to_checker, from_checker]})
    links = {} if sandbox_command else _data_links()
    kernel_command = list(kernel_command)
    answerer = None
    results = {}
    try:
        answerer = _start((sandbox_command or []) + [sys.executable, "-I", "-c", BOOT],
                          {"main": "course.instructor.answerer",
                           "root": SOURCE_ROOT if sandbox_command else f"{work}/.answerer",
                           "sources": sources, "links": links, "preload": preload(cells, part, sources),
                           "exercises": answering}, answerer_fds, env, work, subprocess.DEVNULL)
        for fd in answerer_fds:
            os.close(fd)
        answerer_fds = []
        seed = secrets.randbits(64)  # inputs no earlier run has seen

        def run_kernel(exercise, description):
            return check_kernel(exercise, description, seed=seed, sources=sources, kernel_command=kernel_command,
                                env=env, work=work, stop=stop)

        for exercise in checking:
            results[exercise["id"]] = checker.check_one(exercise, seed, run_kernel)
        return results
    finally:
        for fd in answerer_fds:
            os.close(fd)
        for exercise in checking[len(results):]:  # not reached: an error of ours
            for fd in exercise["fds"]:
                try:
                    os.close(fd)
                except OSError:
                    pass
        if answerer is not None:
            stop(answerer)
