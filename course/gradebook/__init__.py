"""The gradebook of a class: who handed in what, their points, late work, copies, and what goes back.

    python -m course grade --roster roster.csv --deadline 2026-12-01T17:00 --late-penalty 10 \\
        -- submissions/*/*.ipynb

Grading (course/grading.py) runs each notebook and appends what it found to a records file, one line
of JSON per submission (`grades-results.jsonl` beside `grades.csv`). Everything else is built from
those records, without running anything again:
- grades.csv            one row per student and lesson, sorted: the submission, its time, days late,
                        the course version it was handed out with, each exercise's outcome, points,
                        manual points and comment (filled in by the instructor, read back with
                        --manual), penalty, score, and any copy flag for review;
- grades-students.csv   one row per student: each lesson's score and the total;
- grades-canvas.csv     the same, as Canvas's gradebook import reads it;
- grades-moodle.csv     the same, as Moodle's CSV grade import reads it;
- grades-copies.csv     the pairs of similar submissions, and those like the course's solutions;
- grades-feedback/      an HTML page per submission and per student (never the copy flags).
A class too large for one machine is graded in shards (`--shard K/N`, each a deterministic slice),
and `python -m course gradebook` builds the one gradebook from all the shards' records.
"""

import datetime as dt
import hashlib
import json
import re
from pathlib import Path

from .. import grading
from . import copies
from .policy import LatePolicy, parse_time, read_points, score
from .roster import Roster, read_roster, submitter

FIRST_COLUMNS = ["student", "name", "section", "lesson", "notebook", "submitted", "days_late", "course_version",
                 "status", "passed", "total", "points", "max_points", "manual", "comment", "penalty", "score", "copies"]


def outputs(out):
    """The files a gradebook written to `out` (grades.csv) consists of."""
    out = Path(out)
    stem = out.with_suffix("")
    return {"gradebook": out, "students": Path(f"{stem}-students.csv"), "canvas": Path(f"{stem}-canvas.csv"),
            "moodle": Path(f"{stem}-moodle.csv"), "copies": Path(f"{stem}-copies.csv"),
            "feedback": Path(f"{stem}-feedback"), "records": Path(f"{stem}-results.jsonl")}


# ---- shards ----

def parse_shard(text):
    """(k, n) of "K/N", 1 <= K <= N."""
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(text))
    if not match or not 1 <= int(match[1]) <= int(match[2]):
        raise SystemExit(f"--shard takes K/N with 1 <= K <= N (the K-th of N slices), not {text!r}")
    return int(match[1]), int(match[2])


def shard_of(path, n):
    """Which of `n` shards (1 to n) grades this submission: a hash of its student and file name, so
    every job of an array agrees without talking to the others, wherever the files are mounted."""
    key, name = submitter(path)
    digest = hashlib.sha256(f"{key}/{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % n + 1


# ---- grading, then building ----

def grade_class(paths, out="grades.csv", shard=None, roster=None, points=None, late=LatePolicy(), manual=None,
                threshold=copies.THRESHOLD, feedback=True, **grading_options):
    """Grade the submissions (the K-th slice of them with shard=(K, N)) into the records file beside
    `out`, then build the gradebook from it (not for a shard: its records are merged later)."""
    files = outputs(out)
    paths = [Path(p) for p in paths]
    if not any(p.suffix == ".ipynb" and p.is_file() for p in paths):
        why = [f"{p}: {err}" if isinstance(err := grading._read(p), OSError) else f"{p}: not a notebook file (.ipynb)"
               for p in paths[:3]]
        raise SystemExit(f"none of the {len(paths)} inputs is a notebook file, so nothing was graded or written "
                         f"({'; '.join(why)}{' ...' if len(paths) > 3 else ''})")
    if shard is not None:
        k, n = shard
        paths = [p for p in paths if shard_of(p, n) == k]
        print(f"shard {k} of {n}: {len(paths)} submission{'' if len(paths) == 1 else 's'}")
    files["records"].parent.mkdir(parents=True, exist_ok=True)
    # Graded into a file of its own, which replaces the records only once every submission is in:
    # a run that is stopped halfway leaves the last complete records (and what it did) beside them.
    partial = files["records"].with_name(files["records"].name + ".partial")
    partial.write_text("")
    if paths:
        grading.grade(paths, None, feedback=False, records=partial, **grading_options)
    if files["records"].is_file():  # a second run (a late file, one student again): the others stay
        graded = {json.loads(line)["path"] for line in partial.read_text().splitlines() if line.strip()}
        earlier = [json.loads(line) for line in files["records"].read_text().splitlines() if line.strip()]
        # Kept: the notebooks graded then, not graded now, still there (not a folder, a missing file
        # or a README that a mistyped pattern brought in).
        kept = [json.dumps(r, sort_keys=True) for r in earlier if r.get("path") not in graded
                and Path(r.get("path", "")).suffix == ".ipynb" and Path(r.get("path", "")).is_file()]
        if kept:
            with open(partial, "a", encoding="utf-8") as f:
                f.writelines(line + "\n" for line in kept)
            print(f"kept the records of {len(kept)} submission{'s' if len(kept) > 1 else ''} graded before in "
                  f"{files['records']} (remove it to grade the class afresh)")
    partial.replace(files["records"])
    records = load_records([files["records"]])
    print(f"wrote {files['records']}")
    if shard is not None:
        return records, None
    return records, build(records, out, roster=roster, points=points, late=late, manual=manual,
                          threshold=threshold, feedback=feedback)


def load_records(files):
    """Every submission's record from the records files, in a fixed order (by path): shards merged."""
    records = []
    for name in files:
        if Path(name).is_dir():
            raise SystemExit(f"{name} is a folder: give the records files in it ({name}/*-results.jsonl)")
        if not Path(name).is_file():
            raise SystemExit(f"there is no records file {name} (grading writes them as <out>-results.jsonl)")
        with open(name, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                    record["outcomes"], record["status"]  # noqa: B018  (a record has these)
                except (ValueError, KeyError, TypeError):
                    raise SystemExit(f"{name}, line {n}: not a grading record (the -results.jsonl files "
                                     f"that grading writes)") from None
                records.append(record)
    seen = {}
    for record in records:
        seen.setdefault(record["path"], record)  # a submission graded by two shards counts once
    return sorted(seen.values(), key=lambda r: r["path"])


def read_manual(path):
    """{(student, lesson): (manual points, comment)} from a gradebook the instructor filled in."""
    from .files import read_csv

    found = {}
    if not Path(path).is_file():
        raise SystemExit(f"there is no gradebook {path} to read manual points from")
    reader = read_csv(path, "gradebook")
    if not {"student", "lesson", "manual"} <= set(reader.fieldnames or ()):
        raise SystemExit(f"{path}: manual points are read from a gradebook CSV (columns student, lesson, "
                         f"manual, comment), as grading wrote it")
    for n, row in enumerate(reader, 2):
        text = (row.get("manual") or "").strip()
        try:
            value = float(text) if text else 0.0
        except ValueError:
            raise SystemExit(f"{path}, line {n}: manual points must be a number, not {text!r}") from None
        if value or (row.get("comment") or "").strip():
            found[(row["student"], row["lesson"])] = (value, (row.get("comment") or "").strip())
    return found


def _lesson_files():
    """{lesson stem: (handed-out notebook, worked solution or None)}."""
    from ..notebooks import lesson_paths, repo_root

    found = {}
    for path in lesson_paths(None, "notebooks"):
        solution = repo_root() / "solutions" / path.parent.name / path.name
        found[path.stem] = (path, solution if solution.exists() else None)
    return found


def _answer_cells(path):
    import nbformat

    nb = nbformat.read(str(path), as_version=4)
    cells = [c.source for c in nb.cells if c.cell_type == "code"]
    return {i: cells[n] for i, n in grading.exercise_cells(nb, grading.exercise_calls(nb)).items()}


def _title(lesson, files):
    from ..notebooks import title_of

    return title_of(files[lesson][0]) if lesson in files else lesson


def build(records, out, roster=None, points=None, late=LatePolicy(), manual=None, threshold=copies.THRESHOLD,
          feedback=True):
    """Write the gradebook's files (see the module's docstring) from grading records; return its rows."""
    from . import reports

    roster = roster if isinstance(roster, Roster) else Roster(roster or ())
    points = points or {}
    manual = manual or {}
    files = _lesson_files()
    rows, kept = [], {}
    ungraded = []
    for record in records:
        student = roster.student_of(record["path"])
        if not record["lesson"]:
            ungraded.append((student, record))
            continue
        submitted = parse_time(student.submitted, f"the roster's time for {student.id}") if student.submitted \
            else (dt.datetime.fromisoformat(record["modified"]) if record.get("modified") else None)
        key = (student.id, record["lesson"])
        entry = {"student": student, "record": record, "submitted": submitted, "others": 0}
        if key in kept:  # a student's several submissions of one lesson: the latest counts
            earlier, later = sorted([kept[key], entry], key=lambda e: (e["submitted"] is not None, e["submitted"]
                                                                       or dt.datetime.min.replace(tzinfo=dt.timezone.utc)))
            later["others"] = earlier["others"] + 1
            entry = later
        kept[key] = entry

    lessons = sorted({r["lesson"]: r["exercises"] for r in records if r["lesson"]}.items())
    exercises = {lesson: ids for lesson, ids in lessons}
    students = {s.id: s for s in roster.students}
    students.update({e["student"].id: e["student"] for e in kept.values() if e["student"].id not in students})

    flags = _copy_flags(kept, files, threshold)
    for (student_id, lesson), entry in kept.items():
        record, student = entry["record"], entry["student"]
        ids = exercises[lesson]
        most = sum(points.get(i, 1.0) for i in ids)
        got = sum(points.get(i, 1.0) for i in ids if record["outcomes"].get(i) == "passed")
        extra, comment = manual.get((student_id, lesson), (0.0, ""))
        days = late.days_late(entry["submitted"])
        factor = late.factor(days)
        status = record["status"]
        if entry["others"]:
            status = f"{status}; the latest of {entry['others'] + 1} submissions"
        if not student.on_roster:
            status = f"{status}; not on the roster"
        rows.append({"student": student_id, "name": student.name, "section": student.section, "lesson": lesson,
                     "notebook": record["notebook"],
                     "submitted": entry["submitted"].isoformat(timespec="seconds") if entry["submitted"] else "",
                     "days_late": days, "course_version": record.get("version", ""), "status": status,
                     "passed": sum(v == "passed" for v in record["outcomes"].values()), "total": len(ids),
                     "points": _number(got), "max_points": _number(most), "manual": _number(extra) if extra else "",
                     "comment": comment, "penalty": f"{100 * (1 - factor):g}%" if days else "",
                     "score": _number(score(got, extra, factor)), "copies": "; ".join(flags.get((student_id, lesson), [])),
                     **record["outcomes"], "_record": record, grading.UNGRADED: bool(record.get("ungraded"))})
    for student in students.values():  # everyone on the roster has a row for every lesson graded
        for lesson, ids in lessons:
            if (student.id, lesson) not in kept:
                extra, comment = manual.get((student.id, lesson), (0.0, ""))
                rows.append({"student": student.id, "name": student.name, "section": student.section,
                             "lesson": lesson, "notebook": "", "submitted": "", "days_late": 0, "course_version": "",
                             "status": "no submission", "passed": 0, "total": len(ids), "points": "0",
                             "max_points": _number(sum(points.get(i, 1.0) for i in ids)),
                             "manual": _number(extra) if extra else "", "comment": comment, "penalty": "",
                             "score": _number(score(0, extra, 1.0)), "copies": "", "_record": None})
    for student, record in ungraded:
        rows.append({"student": student.id, "name": student.name, "section": student.section, "lesson": "",
                     "notebook": record["notebook"], "status": record["status"], "passed": 0, "total": 0,
                     "score": "0", "_record": record, grading.UNGRADED: True})
    rows.sort(key=lambda r: (r["student"], r["lesson"], r["notebook"]))
    titles = {lesson: _title(lesson, files) for lesson, _ in lessons}
    written = outputs(out)
    if feedback not in (True, False, None):
        written["feedback"] = Path(feedback)
    reports.write_all(written, rows, lessons, students, titles, flags_pairs=flags.get("pairs", []),
                      feedback=bool(feedback))
    return rows


def _number(x):
    return f"{x:g}"


def _copy_flags(kept, files, threshold):
    """{(student, lesson): [what it is similar to]}, and under "pairs" the rows of the copies report."""
    flags = {"pairs": []}
    by_lesson = {}
    for (student_id, lesson), entry in kept.items():
        by_lesson.setdefault(lesson, {})[student_id] = entry["record"].get("answers", {})
    for lesson, answers in sorted(by_lesson.items()):
        handout = _answer_cells(files[lesson][0]) if lesson in files else {}
        prints = {s: copies.fingerprint(a, handout) for s, a in answers.items()}
        solution_file = files.get(lesson, (None, None))[1]
        if solution_file is not None:
            solution = copies.fingerprint(_answer_cells(solution_file), handout)
            for s, p in prints.items():
                similar = copies.similarity(p, solution)
                if len(p) >= copies.SMALLEST and similar >= threshold:
                    flags.setdefault((s, lesson), []).append(f"like the course's solution ({similar:.2f})")
                    flags["pairs"].append((lesson, s, "(the course's solution)", round(similar, 3)))
        for a, b, similar in copies.flag_pairs(prints, threshold):
            flags.setdefault((a, lesson), []).append(f"like {b} ({similar:.2f})")
            flags.setdefault((b, lesson), []).append(f"like {a} ({similar:.2f})")
            flags["pairs"].append((lesson, a, b, similar))
    return flags


__all__ = ["build", "grade_class", "load_records", "outputs", "parse_shard", "read_manual", "read_points",
           "read_roster", "shard_of", "LatePolicy", "parse_time"]
