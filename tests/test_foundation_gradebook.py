"""The gradebook of a class: a roster, points, late work, manual points, copies, the Canvas and
Moodle files, feedback pages, and shards merged into the same gradebook as one run.

The class (tests/classroom.py): 30 files of lesson 1.1 handed in by 30 students, as an instructor
gets them: in a folder each, as Canvas and Moodle name their downloads, late, twice, not at all,
broken, copied from a classmate, pasted from the course's solutions, and from someone not on the
roster.
"""

import csv
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import nbformat
import pytest

import classroom  # tests/classroom.py
from course import _repo, grading, notebooks
from course.__main__ import main
from course.gradebook import copies, policy, roster, shard_of

ROOT = Path(__file__).resolve().parent.parent
SANDBOXED = grading.sandbox_problem() is None
LESSON = "1.1-derivatives"
DEADLINE = dt.datetime(2026, 11, 1, 17, 0, tzinfo=dt.timezone.utc)
POINTS = {"1.1.1": 1, "1.1.2": 3, "1.1.3": 1, "1.1.4": 1}
OPTIONS = ["--roster", "roster.csv", "--points", "points.csv", "--deadline", "2026-11-01T17:00+00:00",
           "--late-penalty", "10", "--grace", "10"]


def _rows(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def klass(tmp_path_factory):
    """The class's folder: the handout (from `assign`), roster.csv, points.csv and submissions/."""
    root = tmp_path_factory.mktemp("class")
    grading.assign(["1"], root / "handout")
    handout_path = root / "handout" / "1-micrograd" / f"{LESSON}.ipynb"
    handout = classroom.exercises_only(nbformat.read(str(handout_path), as_version=4))
    solution = ROOT / "solutions" / "1-micrograd" / f"{LESSON}.ipynb"
    subs = root / "submissions"
    students = [f"s{n:02d}" for n in range(1, 30)] + ["s31", "s32"]
    lms = {s: str(1000 + n) for n, s in enumerate(students, 1)}
    lms["s05"] = "2005"   # a Moodle participant id

    def hand_in(path, content, hours_after_deadline=-1.0):
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            nbformat.write(content, str(path))
        when = (DEADLINE + dt.timedelta(hours=hours_after_deadline)).timestamp()
        os.utime(path, (when, when))
        return path

    def own(student, content, hours=-1.0, name=f"{LESSON}.ipynb"):
        return hand_in(subs / student / name, content, hours)

    for n, student in enumerate(["s01", "s02", "s03"]):
        own(student, classroom.honest(handout, n))
    hand_in(subs / "canvas" / f"dlouhydan_{lms['s04']}_55104_{LESSON}.ipynb", classroom.honest(handout, 3))
    hand_in(subs / "moodle" / f"Eve Ek_{lms['s05']}_assignsubmission_file_" / f"{LESSON}.ipynb",
            classroom.honest(handout, 4), hours_after_deadline=5 / 60)           # within the grace period
    own("s06", classroom.honest(handout, 5), hours=12)                           # 1 day late
    own("s07", classroom.honest(handout, 6), hours=50)                           # 3 days late
    own("s08", classroom.honest(handout, 7), hours=48)                           # on time by the LMS's clock
    for n in range(8):
        own(f"s{9 + n:02d}", classroom.partly(handout, n))                        # s09-s16
    for student in ("s17", "s18", "s19", "s20"):
        own(student, handout)                                                      # untouched
    twin = own("s23", classroom.honest(handout, 8))
    own("s24", twin.read_bytes())                                                  # the same file, another name
    own("s22", classroom.renamed(classroom.honest(handout, 8)))                    # and renamed, recommented
    own("s25", solution.read_bytes())                                              # the solutions file itself
    own("s26", classroom.renamed(classroom.pasted(handout, nbformat.read(str(solution), as_version=4))))
    own("s27", b"{ this is not a notebook")
    own("s28", b"")
    own("s29", handout, hours=-30)
    own("s29", classroom.partly(handout, 2), hours=-2, name=f"{LESSON} (2).ipynb")  # the later one counts
    own("x99", classroom.partly(handout, 3))                                       # not on the roster

    with open(root / "roster.csv", "w", newline="", encoding="utf-8-sig") as f:
        writer = csv.writer(f)
        writer.writerow(["Student ID", "Full name", "Section", "Email", "LMS_ID", "Submitted"])
        for n, student in enumerate(students):
            submitted = "2026-11-01T16:30:00+00:00" if student == "s08" else ""
            writer.writerow([student, f"Student {student[1:]} Example", "AB"[n % 2], f"{student}@uni.example",
                             lms[student], submitted])
    with open(root / "points.csv", "w", newline="") as f:
        f.write("exercise,points\n" + "".join(f"{i},{p}\n" for i, p in POINTS.items()))
    files = sorted(p for p in subs.rglob("*.ipynb"))
    assert len(files) == 30
    return root, [p.relative_to(root).as_posix() for p in files]


def _grade(root, *args):
    """Run the command in the class folder; (exit message or None)."""
    old = Path.cwd()
    os.chdir(root)
    try:
        main(list(args))
    except SystemExit as stop:
        return str(stop)
    finally:
        os.chdir(old)
    return None


@pytest.fixture(scope="module")
def graded(klass):
    root, files = klass
    said = _grade(root, "grade", "--jobs", "2", "--time-limit", "120", *OPTIONS,
                  *([] if SANDBOXED else ["--no-sandbox"]), "--", *files)
    return root, files, said


def test_the_class_gradebook_from_a_roster_points_and_a_deadline(graded):
    root, files, said = graded
    assert said and said.startswith("2 of 30 inputs could not be graded"), said  # s27 and s28: status 1
    rows = _rows(root / "grades.csv")
    by = {r["student"]: r for r in rows}
    assert [r["student"] for r in rows] == sorted(by) and len(rows) == 32  # 31 on the roster, and x99
    assert list(rows[0])[:18] == ["student", "name", "section", "lesson", "notebook", "submitted", "days_late",
                                  "course_version", "status", "passed", "total", "points", "max_points",
                                  "manual", "comment", "penalty", "score", "copies"]
    from course import __version__

    for student in [f"s0{n}" for n in range(1, 9)]:  # honest, each written their own way
        row = by[student]
        assert row["status"] == "ok" and row["passed"] == "4" and row["points"] == "6", row
        assert row["max_points"] == "6" and row["copies"] == "" and row["course_version"] == __version__
    assert by["s04"]["notebook"].startswith("submissions/canvas/") and by["s04"]["name"] == "Student 04 Example"
    assert by["s05"]["notebook"].startswith("submissions/moodle/") and by["s05"]["days_late"] == "0"
    assert (by["s06"]["days_late"], by["s06"]["penalty"], by["s06"]["score"]) == ("1", "10%", "5.4")
    assert (by["s07"]["days_late"], by["s07"]["penalty"], by["s07"]["score"]) == ("3", "30%", "4.2")
    assert by["s08"]["days_late"] == "0" and by["s08"]["submitted"] == "2026-11-01T16:30:00+00:00"
    for n in range(8):  # partly done: the points of what passed, never flagged
        row = by[f"s{9 + n:02d}"]
        expected = sum(POINTS[i] for i in POINTS if row[i] == "passed")
        assert row["score"] == f"{expected:g}" and 0 < expected < 6 and row["copies"] == "", row
    for student in ("s17", "s18", "s19", "s20"):
        assert by[student]["status"] == "ok" and by[student]["score"] == "0"
        assert all(by[student][i] == "not attempted" for i in POINTS)
    assert "like s24 (1.00)" in by["s23"]["copies"] and "like s23 (1.00)" in by["s24"]["copies"]
    assert "like s23 (1.00)" in by["s22"]["copies"]  # renamed and recommented, still the same shape
    records = {json.loads(line)["path"].split("/submissions/")[1].split("/")[0]: json.loads(line)
               for line in (root / "grades-results.jsonl").read_text().splitlines()}
    assert {k: v for k, v in records["s24"].items() if k not in ("path", "notebook", "modified")} == \
        {k: v for k, v in records["s23"].items() if k not in ("path", "notebook", "modified")}  # graded once
    for student in ("s25", "s26"):
        assert "like the course's solution (1.00)" in by[student]["copies"], by[student]
        assert by[student]["score"] == "6"  # flagged for review, never marked down by the code
    for student in ("s27", "s28"):
        assert by[student]["status"].startswith("not a notebook") and by[student]["score"] == "0"
    assert "the latest of 2 submissions" in by["s29"]["status"] and by["s29"]["notebook"].endswith("(2).ipynb")
    assert "not on the roster" in by["x99"]["status"] and by["x99"]["name"] == ""
    for student in ("s21", "s31", "s32"):
        assert by[student]["status"] == "no submission" and by[student]["score"] == "0"

    totals = {r["student"]: r for r in _rows(root / "grades-students.csv")}
    assert len(totals) == 32 and totals["s07"][LESSON] == "4.2" and totals["s07"]["total"] == "4.2"
    assert all(t["max_total"] == "6" for t in totals.values())

    copied = {(r["student"], r["like"]) for r in _rows(root / "grades-copies.csv")}
    assert {("s22", "s23"), ("s22", "s24"), ("s23", "s24"), ("s25", "s26"), ("s25", "(the course's solution)"),
            ("s26", "(the course's solution)")} == copied

    with open(root / "grades-canvas.csv", newline="", encoding="utf-8") as f:
        canvas = list(csv.reader(f))
    title = notebooks.title_of(ROOT / "notebooks" / "1-micrograd" / f"{LESSON}.ipynb")
    assert canvas[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", title]
    assert canvas[1][0].strip() == "Points Possible" and canvas[1][5] == "6"
    s07 = next(r for r in canvas if r[2] == "s07")
    assert s07 == ["Student 07 Example", "1007", "s07", "s07@uni.example", "A", "4.2"]
    with open(root / "grades-moodle.csv", newline="", encoding="utf-8") as f:
        moodle = list(csv.reader(f))
    assert moodle[0] == ["First name", "Last name", "ID number", "Email address", f"{title} (Real)"]
    assert ["Student 06", "Example", "s06", "s06@uni.example", "5.4"] in moodle
    assert len(moodle) == 32 and len(canvas) == 33  # the 31 on the roster: x99 cannot be imported

    pages = root / "grades-feedback"
    six = (pages / "s06.html").read_text()
    assert "1 day late, 10% off" in six and "Score: 5.4 of 6 points" in six and "[1.1.1] passed" in six
    assert "like the course's solution" not in (pages / "s25.html").read_text()  # flags are for the instructor
    partial = (pages / "s09.html").read_text()
    assert "Hint:" in partial or "not attempted" in partial
    assert "In full:" not in "".join(p.read_text() for p in pages.iterdir())
    assert "No submission." in (pages / "s31.html").read_text()
    assert (pages / f"s06__{LESSON}.html").exists()


def test_manual_points_are_read_back_and_the_gradebook_rebuilt_without_running(graded):
    root, _, _ = graded
    rows = _rows(root / "grades.csv")
    for row in rows:
        if row["student"] == "s09":
            row["manual"], row["comment"] = "1.5", "good reasoning in the text cell"
    with open(root / "edited.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    _grade(root, "gradebook", "--out", "rebuilt.csv", *OPTIONS, "--manual", "edited.csv", "grades-results.jsonl")
    rebuilt = {r["student"]: r for r in _rows(root / "rebuilt.csv")}
    before = {r["student"]: r for r in rows}
    s09 = rebuilt["s09"]
    assert s09["manual"] == "1.5" and s09["score"] == f"{float(s09['points']) + 1.5:g}"
    assert "good reasoning in the text cell" in (root / "rebuilt-feedback" / "s09.html").read_text()
    assert all(rebuilt[s]["score"] == before[s]["score"] for s in before if s != "s09")
    # Typed into the gradebook itself: a later build keeps it without being told.
    shutil.copy(root / "edited.csv", root / "typed.csv")
    _grade(root, "gradebook", "--out", "typed.csv", *OPTIONS, "grades-results.jsonl")
    assert {r["student"]: r for r in _rows(root / "typed.csv")}["s09"]["score"] == s09["score"]


def test_three_shards_merge_into_the_one_shot_gradebook(graded):
    root, files, _ = graded
    for k in (1, 2, 3):
        _grade(root, "grade", "--jobs", "2", "--time-limit", "120", "--shard", f"{k}/3", "--out", f"shard-{k}.csv",
               *([] if SANDBOXED else ["--no-sandbox"]), "--", *files)
    shards = [[line for line in (root / f"shard-{k}-results.jsonl").read_text().splitlines() if line] for k in (1, 2, 3)]
    assert sum(map(len, shards)) == 30 and all(shards), [len(s) for s in shards]
    said = _grade(root, "gradebook", "--out", "merged.csv", *OPTIONS, *(f"shard-{k}-results.jsonl" for k in (1, 2, 3)))
    assert said.startswith("2 of 30 inputs could not be graded")
    assert _rows(root / "merged.csv") == _rows(root / "grades.csv")
    for name in ("students", "canvas", "moodle", "copies"):
        assert (root / f"merged-{name}.csv").read_text() == (root / f"grades-{name}.csv").read_text(), name
    # One student graded again into the class's gradebook: the others' records stay, and so do their rows.
    before = _rows(root / "grades.csv")
    _grade(root, "grade", "--time-limit", "120", *OPTIONS, *([] if SANDBOXED else ["--no-sandbox"]),
           "--", "submissions/s06/1.1-derivatives.ipynb")
    assert _rows(root / "grades.csv") == before
    assert len((root / "grades-results.jsonl").read_text().splitlines()) == 30


# ---- the parts, each on its own ----

def test_a_roster_names_its_problems(tmp_path):
    path = tmp_path / "r.csv"
    path.write_text("name,section\nAda,A\n")
    with pytest.raises(SystemExit, match="a roster needs a column of student ids"):
        roster.read_roster(path)
    path.write_text("id,name\n7,Ada\n7,Bob\n")
    with pytest.raises(SystemExit, match="line 3: the student id '7' is on the roster twice"):
        roster.read_roster(path)


def test_canvas_and_moodle_exports_are_read_as_rosters(tmp_path, capsys):
    canvas = tmp_path / "canvas.csv"
    canvas.write_text("Student,ID,SIS User ID,SIS Login ID,Section,Lab 1 (123)\n    Points Possible,,,,,10\n"
                      '"Smith, Jane",1234,s01,jane@uni.example,A,5\n')
    assert roster.read_roster(canvas) == [roster.Student("s01", "Smith, Jane", "A", "jane@uni.example", "1234")]
    moodle = tmp_path / "moodle.csv"
    moodle.write_text("First name,Last name,ID number,Institution,Department,Email address\nJane,Smith,s01,,,j@u.edu\n")
    assert roster.read_roster(moodle) == [roster.Student("s01", "Jane Smith", "", "j@u.edu")]
    capsys.readouterr()
    typo = tmp_path / "typo.csv"
    typo.write_text("id,nmae\ns01,Jane\n")
    roster.read_roster(typo)
    assert "not using the column nmae" in capsys.readouterr().out


def test_a_roster_saved_by_excel_as_latin_1_is_read(tmp_path, capsys):
    latin = tmp_path / "latin.csv"
    latin.write_bytes("id,name\nada,Ren\u00e9e Dupr\u00e9\n".encode("cp1252"))
    assert roster.read_roster(latin)[0].name == "Ren\u00e9e Dupr\u00e9"
    assert "read as Windows Latin-1" in capsys.readouterr().out


def test_manual_points_never_take_a_score_below_zero():
    assert policy.score(0, -2, 1.0) == 0 and policy.score(3, -1, 0.5) == 1.0


def test_a_mistyped_pattern_or_missing_file_writes_nothing_and_says_why(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "grades.csv").write_text("student,lesson,manual\nada,1.1-derivatives,2\n")
    (tmp_path / "submissions" / "ada").mkdir(parents=True)
    for args, said in ((["--", "submissions/*/*.ipnyb"], "none of the 1 inputs is a notebook file"),
                       (["--", "submissions"], "it is a folder: give the notebooks in it"),
                       (["--roster", "nosuch.csv", "--", "x.ipynb"], "cannot read the roster nosuch.csv"),
                       (["--points", "nosuch.csv", "--", "x.ipynb"], "cannot read the points file nosuch.csv"),
                       (["--late-penalty", "5", "--", "x.ipynb"], "--late-penalty and --grace need a --deadline")):
        with pytest.raises(SystemExit, match=said):
            main(["grade", *args])
    assert (tmp_path / "grades.csv").read_text() == "student,lesson,manual\nada,1.1-derivatives,2\n"
    assert not (tmp_path / "grades-results.jsonl").exists()
    with pytest.raises(SystemExit, match="there is no records file nosuch-results.jsonl"):
        main(["gradebook", "nosuch-results.jsonl"])


def test_lms_download_names_give_the_student():
    assert roster.submitter("x/smithjane_12345_67890_1.1-derivatives.ipynb") == ("12345", "1.1-derivatives.ipynb")
    assert roster.submitter("x/smithjane_late_12345_67890_1.1-derivatives-1.ipynb")[0] == "12345"
    assert roster.submitter("x/Jane Smith_4321_assignsubmission_file_/a.ipynb") == ("4321", "a.ipynb")
    assert roster.submitter("x/Jane Smith_4321_assignsubmission_file_a.ipynb") == ("4321", "a.ipynb")
    assert roster.submitter("submissions/ada/1.1-derivatives.ipynb") == ("ada", "1.1-derivatives.ipynb")


def test_late_days_count_any_part_of_a_day_after_the_grace():
    late = policy.LatePolicy(DEADLINE, per_day=25, grace=dt.timedelta(minutes=10))
    at = DEADLINE.__add__
    assert [late.days_late(at(dt.timedelta(minutes=m))) for m in (-60, 0, 10, 11, 24 * 60 + 10, 24 * 60 + 11)] \
        == [0, 0, 0, 1, 1, 2]
    assert [late.factor(d) for d in (0, 1, 4, 9)] == [1.0, 0.75, 0.0, 0.0]
    assert policy.LatePolicy().days_late(at(dt.timedelta(days=9))) == 0  # no deadline: never late
    assert policy.parse_time("Friday, 27 November 2026, 5:00 PM").hour == 17
    assert policy.parse_time("2026-11-01T17:00Z") == DEADLINE
    due = policy.parse_time("2026-11-01")  # a date alone: the end of that day
    assert (due.day, due.hour, due.minute) == (1, 23, 59)
    for typed in ("next friday", "2026-13-01"):  # said as typed
        with pytest.raises(SystemExit, match=f"'{typed}' is not a time"):
            policy.parse_time(typed, "--deadline")


def test_a_points_file_names_its_problems(tmp_path):
    path = tmp_path / "p.csv"
    path.write_text("exercise,points\n1.1.1,two\n")
    with pytest.raises(SystemExit, match="line 2: the points of 1.1.1 must be a number, not 'two'"):
        policy.read_points(path)
    path.write_text("exercise,points\n1.1.1,-1\n")
    with pytest.raises(SystemExit, match="must be 0 or more"):
        policy.read_points(path)


def test_copies_are_found_through_renaming_spacing_and_comments_but_short_answers_are_not_flagged():
    a = "def f(xs):\n    total = 0\n    for x in xs:\n        total += x * x\n    return total\n"
    b = "def f(values):  # mine\n    acc = 0\n\n    for v in values:\n        acc += v*v\n    return acc\n"
    assert copies.shape(a) == copies.shape(b)
    assert copies.shape("print('a')") == copies.shape('print("something else")')
    assert copies.shape("%timeit f(1)\nx = (") != []  # not Python: read anyway
    long = "def f(x):\n" + "".join(f"    x = x * {k} + {k * k}\n" for k in range(30)) + "    return x\n"
    other = long.replace("x = x *", "x = 1 + x *")
    prints = {name: copies.fingerprint({"1": src}, {}) for name, src in (("p", long), ("q", long), ("r", other))}
    assert copies.flag_pairs(prints) == [("p", "q", 1.0)]
    assert copies.fingerprint({"1": long}, {"1": long}) == set()  # what the handout holds is nobody's own
    small = copies.fingerprint({"1": a}, {})
    assert len(small) < copies.SMALLEST and copies.flag_pairs({"p": small, "q": set(small)}) == []


def test_shards_split_a_class_deterministically():
    paths = [Path(f"submissions/s{n:03d}/1.1-derivatives.ipynb") for n in range(300)]
    slices = [[p for p in paths if shard_of(p, 4) == k] for k in (1, 2, 3, 4)]
    assert sorted(p for s in slices for p in s) == sorted(paths)
    assert all(50 < len(s) < 100 for s in slices), [len(s) for s in slices]
    assert [shard_of(Path("/mnt/other") / p, 4) for p in paths] == [shard_of(p, 4) for p in paths]


def test_assign_pins_the_install_line_and_stamps_the_version(tmp_path):
    grading.assign(["1"], tmp_path)
    version, commit = grading.course_release()
    nb = nbformat.read(str(tmp_path / "1-micrograd" / f"{LESSON}.ipynb"), as_version=4)
    assert nb.metadata["course"] == {"version": version, "commit": commit or ""}
    first = next(c for c in nb.cells if c.cell_type == "code")
    readme = (tmp_path / "README.md").read_text()
    if commit:  # a git clone: students install the very commit the instructor grades with
        assert f"{_repo.git_url()}@{commit}" in first.source and f"@{commit}" in readme
        badge = next(c for c in nb.cells if c.cell_type == "markdown").source
        assert _repo.colab_url(f"notebooks/1-micrograd/{LESSON}.ipynb", branch=commit) in badge
    handed_out = sorted((tmp_path / "1-micrograd").glob("*.ipynb"))
    assert policy.read_points(tmp_path / "points.csv") == {i: 1.0 for p in handed_out for i in grading.exercise_ids(p)}


# ---- everywhere a notebook opens ----

def test_hub_links_follow_nbgitpuller(capsys):
    """nbgitpuller's documented link: <hub>/hub/user-redirect/git-pull?repo=...&branch=...&urlpath=...,
    where urlpath opens a file in the clone, which is named like the repository's last path segment."""
    main(["hub-links", "https://hub.example.edu/", "1.1", "--branch", "main", "6"])  # lessons before or after
    out = capsys.readouterr().out.splitlines()
    links = [line.strip() for line in out if line.startswith("    ")]
    assert len(links) == 1 + len([p for p in notebooks.lesson_paths(ROOT) if p.parent.name.startswith("6-")])
    link = urlparse(links[0])
    assert (link.scheme, link.netloc, link.path) == ("https", "hub.example.edu", "/hub/user-redirect/git-pull")
    query = parse_qs(link.query, strict_parsing=True)
    assert query == {"repo": [_repo.repo_url()], "branch": ["main"],
                     "urlpath": [f"lab/tree/{_repo.REPO.split('/')[1]}/notebooks/1-micrograd/{LESSON}.ipynb"]}
    assert out[0] == notebooks.title_of(ROOT / "notebooks" / "1-micrograd" / f"{LESSON}.ipynb")
    classic = _repo.hub_link("https://h.edu", "a/b.ipynb", repo="https://gitlab.com/me/handout.git", app="classic")
    assert parse_qs(urlparse(classic).query)["urlpath"] == ["tree/handout/a/b.ipynb"]
    (_, handout), = notebooks.hub_links("https://h.edu", ["1.1"], repo="https://github.com/me/handout")
    assert parse_qs(urlparse(handout).query)["urlpath"] == [f"lab/tree/handout/1-micrograd/{LESSON}.ipynb"]
    with pytest.raises(SystemExit, match="no part or lesson 9.9"):
        main(["hub-links", "https://hub.example.edu", "9.9"])
    with pytest.raises(SystemExit, match="--repo takes an https:// address or owner/name"):
        main(["hub-links", "https://hub.example.edu", "1", "--repo", "git@github.com:me/handout.git"])


def test_binder_files_are_the_ones_repo2docker_reads_and_keep_in_step():
    """repo2docker reads only binder/ when it exists: environment.yml (conda), postBuild (run in the
    repository after the build), among its documented names."""
    import yaml

    documented = {"environment.yml", "requirements.txt", "apt.txt", "postBuild", "start", "runtime.txt",
                  "install.R", "Project.toml", "default.nix", "Dockerfile", "Pipfile"}
    binder = ROOT / "binder"
    assert {p.name for p in binder.iterdir()} <= documented
    assert os.access(binder / "postBuild", os.X_OK) and "pip install" in (binder / "postBuild").read_text()
    ours = yaml.safe_load((binder / "environment.yml").read_text())["dependencies"]
    full = yaml.safe_load((ROOT / "environment.yml").read_text())["dependencies"]
    assert "graphviz" in ours and all(isinstance(d, str) for d in ours)
    assert set(ours) <= {d.split("#")[0].strip() for d in full if isinstance(d, str)}, set(ours) - set(full)
    readme = (ROOT / "README.md").read_text()
    assert _repo.binder_url() in readme


def _wheel(out):
    """A wheel of the course made from this checkout (a zip with the package and its metadata)."""
    import zipfile

    from course import __version__

    name = f"course-{__version__}"
    path = out / f"{name}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as whl:
        for f in sorted((ROOT / "course").rglob("*")):
            if f.is_file() and "__pycache__" not in f.parts:
                whl.write(f, f.relative_to(ROOT).as_posix())
        whl.writestr(f"{name}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: course\nVersion: {__version__}\n")
        whl.writestr(f"{name}.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                                "Tag: py3-none-any\n")
        whl.writestr(f"{name}.dist-info/RECORD", "")
    return path


def test_the_install_cell_installs_the_course_where_it_is_missing(tmp_path):
    """A lesson alone in an empty folder, in a Python that has the course's dependencies but not the
    course: its first cell installs it (offline, from a wheel named by COURSE_SOURCE), and the next
    cell, which imports it, works."""
    import sysconfig

    env = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    python = env / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    # the dependencies, from this Python's site-packages; its .pth files (the course's editable
    # install among them) are not read from a folder added this way
    Path(site, "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    folder = tmp_path / "empty"
    folder.mkdir()
    lesson = shutil.copy(ROOT / "notebooks" / "1-micrograd" / f"{LESSON}.ipynb", folder)
    code = [c.source for c in nbformat.read(lesson, as_version=4).cells if c.cell_type == "code"]
    script = folder / "first_cells.py"
    script.write_text(code[0] + "\n" + code[1] + "\nimport course\nprint('from', course.__file__)\n")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PIP_", "VIRTUAL_ENV"))}
    before = subprocess.run([python, "-c", "import course"], cwd=folder, env=clean, capture_output=True, text=True)
    assert "No module named 'course'" in before.stderr
    offline = subprocess.run([python, "-c", code[0]], cwd=folder, capture_output=True, text=True, timeout=300,
                             env={**clean, "COURSE_SOURCE": "git+https://example.invalid/course", "PIP_NO_INDEX": "1"})
    assert offline.returncode == 0 and "Could not install the course from git+https://example.invalid/course" \
        in offline.stdout and "COURSE_SOURCE=" in offline.stdout, offline.stdout + offline.stderr
    run = subprocess.run([python, script.name], cwd=folder, capture_output=True, text=True, timeout=300,
                         env={**clean, "COURSE_SOURCE": str(_wheel(tmp_path)), "PIP_NO_INDEX": "1",
                              "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"from {site}/course/__init__.py" in run.stdout
    again = subprocess.run([python, "-c", code[0]], cwd=folder, capture_output=True, text=True, timeout=300,
                           env={**clean, "COURSE_SOURCE": "git+https://example.invalid/course"})
    assert again.returncode == 0 and again.stdout == ""  # installed now: the cell does nothing
