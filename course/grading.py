"""For instructors: hand out lessons without solutions, and grade what comes back.

    python -m course assign 1 2 --out handout/            lessons of parts 1 and 2, with a README
    python -m course grade a.ipynb b.ipynb --out grades.csv

Grading runs each submitted notebook on a copy, in a fresh kernel, under a time limit, and never
touches the submission. Every `check(...)` the notebook runs appends its result to a log that
grading reads back, so a row holds the outcome of each exercise the notebook contains.
"""

import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from .exercises._core import GRADE_LOG_ENV
from .notebooks import KERNEL_ENV, all_notebooks, repo_root

CHECK_CALL = re.compile(r"""check\(\s*["']([0-9]+(?:\.[0-9]+)+)["']""")

STUDENT_README = """\
# Exercises: {parts}

These notebooks are lessons of the course. Read each one top to bottom, run every cell, and
do the exercises at the end: replace each `raise NotImplementedError` with your code and run
the cell. The `check(...)` line under it tells you at once whether your answer is right.

Set up once, on your machine:

    python -m pip install "{git_url}"
    jupyter lab

or open a notebook in Colab, where its first cell installs the course.

Hand in the notebooks themselves, saved after your last run. They are graded by running them
again from the top in a fresh kernel, so make sure that "Restart kernel and run all cells" works.

Notebooks in this folder:
{listing}
"""


def _part_dirs(parts):
    root = repo_root()
    folders = sorted(p for p in (root / "notebooks").iterdir() if p.is_dir())
    chosen = []
    for part in parts:
        match = [f for f in folders if f.name == part or f.name.split("-", 1)[0] == str(part)]
        if not match:
            names = ", ".join(f.name for f in folders)
            raise SystemExit(f"there is no part {part!r}: the parts are {names}")
        chosen += match
    return chosen


def assign(parts, out):
    """Copy the lesson notebooks of `parts` (never the solutions) into `out`, with a README."""
    from . import _repo

    out = Path(out)
    listing = []
    for folder in _part_dirs(parts):
        for nb in sorted(folder.glob("*.ipynb")):
            dest = out / folder.name / nb.name
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(nb, dest)
            listing.append(f"- {folder.name}/{nb.name}")
    (out / "README.md").write_text(STUDENT_README.format(
        parts=", ".join(str(p) for p in parts), git_url=_repo.git_url(), listing="\n".join(listing)))
    print(f"wrote {len(listing)} notebooks and README.md to {out}")
    return out


def exercise_ids(path):
    """The exercise ids a notebook checks, in order of first appearance."""
    import nbformat

    nb = nbformat.read(str(path), as_version=4)
    ids = []
    for cell in nb.cells:
        if cell.cell_type == "code":
            for found in CHECK_CALL.findall(cell.source):
                if found not in ids:
                    ids.append(found)
    return ids


def _run_one(path, status_file):
    """Run in a child process: execute a notebook copy and write how it went to `status_file`."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=None, kernel_name="python3",
                            resources={"metadata": {"path": str(Path(path).parent)}})
    status = "ok"
    try:
        client.execute()
    except CellExecutionError:
        code_cells = [c for c in nb.cells if c.cell_type == "code"]
        for i, cell in enumerate(code_cells, 1):
            errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
            if errors:
                status = f"error in code cell {i}: {errors[0]['ename']}: {errors[0]['evalue']}"[:300]
                break
        else:
            status = "error while running"
    except Exception as err:  # a kernel that dies, a notebook that is not JSON ...
        status = f"could not run: {type(err).__name__}: {err}"[:300]
    Path(status_file).write_text(status)


def grade_one(path, time_limit):
    """Grade one notebook; return (status, {exercise id: outcome})."""
    path = Path(path)
    try:
        ids = exercise_ids(path)
    except Exception as err:
        return f"could not read: {type(err).__name__}: {err}"[:300], {}
    outcomes = {i: "not run" for i in ids}
    with tempfile.TemporaryDirectory(prefix="grade-") as work:
        copy = Path(work) / path.name
        shutil.copyfile(path, copy)
        log = Path(work) / "checks.jsonl"
        status_file = Path(work) / "status.txt"
        env = dict(os.environ, **KERNEL_ENV, **{GRADE_LOG_ENV: str(log)})
        # A session of its own, so a notebook that runs too long is stopped with its kernel.
        proc = subprocess.Popen([sys.executable, "-c",
                                 "import sys; from course.grading import _run_one; _run_one(sys.argv[1], sys.argv[2])",
                                 str(copy), str(status_file)], env=env, start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            proc.wait(timeout=time_limit)
            status = status_file.read_text() if status_file.exists() else "could not run"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            status = f"timed out after {time_limit} s"
        if log.exists():
            for line in log.read_text().splitlines():
                entry = json.loads(line)
                outcomes[entry["id"]] = entry["status"]
    return status, outcomes


def grade(paths, out, time_limit=300):
    """Grade notebooks and write one CSV row per notebook; return the rows."""
    rows = []
    for p in paths:
        status, outcomes = grade_one(p, time_limit)
        rows.append({"notebook": str(p), "status": status, **outcomes})
        passed = sum(v == "passed" for v in outcomes.values())
        print(f"{p}: {status}, {passed}/{len(outcomes)} exercises passed")
    ids = []
    for row in rows:
        ids += [k for k in row if k not in ("notebook", "status") and k not in ids]
    fields = ["notebook", "status", "passed", "total"] + ids
    with open(out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, restval="")
        writer.writeheader()
        for row in rows:
            outcomes = {k: v for k, v in row.items() if k not in ("notebook", "status")}
            writer.writerow({**row, "passed": sum(v == "passed" for v in outcomes.values()),
                             "total": len(outcomes)})
    print(f"wrote {out}")
    return rows


def lesson_notebooks():
    return [p for p in all_notebooks() if p.parts[-3] == "notebooks"]
