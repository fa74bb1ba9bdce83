"""The course's command line: `python -m course COMMAND`.

    assign PARTS... --out DIR          lesson notebooks of the chosen parts, without solutions
    grade [--out FILE.csv] -- NOTEBOOKS...  run submitted notebooks, check their exercises, write the gradebook
    gradebook RECORDS...               build the gradebook again from grading's records (shards merged)
    doctor                             versions, graphviz, GPU or simulator
    lab                                JupyterLab at the top of the course, without the news pop-up
    notebooks [PATHS...]               re-execute notebooks in place (all of them by default)
    notebooks --tags-only [PATHS...]   only turn `# NBVAL_...` comments into cell tags (no run)
    colab OWNER/NAME                   point badges and install cells at a fork
    hub-links HUB [LESSONS...]         JupyterHub links (nbgitpuller) that open each lesson on a hub
    syllabus                           rewrite the syllabus table of README.md
"""

import argparse
from pathlib import Path

from . import _quick_nbformat  # noqa: F401  (before anything imports nbformat)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m course", description="The course's tools.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("assign", help="write lesson notebooks (without solutions) for students")
    p.add_argument("parts", nargs="+", help="part numbers (1 2) or folder names (1-micrograd)")
    p.add_argument("--out", required=True, help="folder to write into")

    p = sub.add_parser("grade", help="run submitted notebooks and write the class's gradebook",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog="""examples:
  python -m course grade -- submissions/*/1.1-derivatives.ipynb       one lesson, a folder per student
  python -m course grade --out part1.csv -- subs/*/*.ipynb            every lesson, into part1.csv and its siblings
  python -m course grade --roster roster.csv -- subs/*/*.ipynb        students' names and sections, LMS download names
  python -m course grade --points points.csv -- subs/*/*.ipynb        points per exercise (make assignment writes one)
  python -m course grade --deadline 2026-12-01T17:00 --late-penalty 10 --grace 15 -- subs/*/*.ipynb
                                                                      10% off per day late, after 15 minutes' grace
  python -m course grade --manual grades.csv -- subs/*/*.ipynb        keep the manual points filled in last time
  python -m course grade --similarity 0.9 -- subs/*/*.ipynb           flag only answers 90% alike for review
  python -m course grade --shard 2/8 --out shard-2.csv -- subs/*/*.ipynb   the 2nd of 8 slices (a job array)
  python -m course grade --jobs 4 --time-limit 120 -- subs/*/*.ipynb  4 at once, 2 minutes each
  python -m course grade --lesson my-1.1.ipynb -- subs/*.ipynb        all answer this handed-out lesson
  python -m course grade --memory 4 -- subs/*/*.ipynb                 4 GiB of memory each
  python -m course grade --feedback pages/ -- subs/*/*.ipynb          the feedback pages in pages/
  python -m course grade --no-sandbox -- mine.ipynb                   a notebook you trust, without bubblewrap
Besides grades.csv it writes grades-students.csv, grades-canvas.csv, grades-moodle.csv, grades-copies.csv,
grades-feedback/ and grades-results.jsonl (what `python -m course gradebook` rebuilds them from).
It exits with status 1 when an input could not be graded (a folder, a missing file, not a notebook).""")
    p.add_argument("notebooks", nargs="*", help="the notebooks; after `--`, names that begin with - too")
    p.add_argument("--out", default="grades.csv", help="the gradebook (default grades.csv); its other files are "
                                                      "named after it: grades-students.csv, ...")
    p.add_argument("--time-limit", type=float, default=300, help="seconds per notebook (default 300)")
    p.add_argument("--lesson", help="the handed-out lesson notebook they all answer (by default, "
                                    "the course's lesson with the submission's file name)")
    p.add_argument("--no-sandbox", action="store_true",
                   help="grade without bubblewrap (grading refuses to run where it is missing, unless given this): "
                        "every submission can then read and write what your user can, stop your processes, and "
                        "change the grading of the submissions after it. Only for a class you trust")
    p.add_argument("--jobs", type=int, default=1, help="notebooks run at once (default 1)")
    p.add_argument("--memory", type=float, default=8,
                   help="GiB of memory each notebook may use (default 8, 0: no limit)")
    p.add_argument("--shard", help="K/N: grade only the K-th of N deterministic slices of the submissions and "
                                   "write its records; `python -m course gradebook` merges the shards")
    _class_options(p)

    p = sub.add_parser("gradebook", help="build the gradebook again from grading records (merge shards, "
                                         "new points, deadline or manual points), without running anything",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog="""examples:
  python -m course gradebook --out grades.csv shard-*-results.jsonl          merge the shards of a class
  python -m course gradebook --points points.csv grades-results.jsonl        the same grading, new points
  python -m course gradebook --manual grades.csv grades-results.jsonl        add the manual points filled in""")
    p.add_argument("records", nargs="+", help="the -results.jsonl files that grading wrote")
    p.add_argument("--out", default="grades.csv", help="the gradebook (default grades.csv); its other files are "
                                                      "named after it: grades-students.csv, ...")
    _class_options(p)

    sub.add_parser("doctor", help="what this machine has for the course")
    p = sub.add_parser("lab", help="start JupyterLab at the top of the course (Ctrl-C twice stops it)")
    p.add_argument("--dry-run", action="store_true", help="print the command instead of running it")
    p = sub.add_parser("notebooks", help="re-execute notebooks in place, in a fresh kernel")
    p.add_argument("paths", nargs="*")
    p.add_argument("--tags-only", action="store_true",
                   help="do not run them: only turn `# NBVAL_...` comment lines into cell tags")
    p = sub.add_parser("colab", help="point badges and install cells at a fork")
    p.add_argument("repo", help="owner/name on GitHub")
    sub.add_parser("syllabus", help="rewrite the syllabus table in README.md")
    p = sub.add_parser("hub-links", help="print a JupyterHub link (nbgitpuller) for each lesson",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog="""examples:
  python -m course hub-links https://hub.example.edu                  every lesson
  python -m course hub-links https://hub.example.edu 1 4.2            part 1 and lesson 4.2
  python -m course hub-links https://hub.example.edu 1 --classic      in the classic notebook interface
  python -m course hub-links https://hub.example.edu 1 --repo https://github.com/me/handout --branch fall
                                    a hand-out repository (make assignment's folders at its top)
A student who opens a link gets the repository cloned into their home on the hub (updated, keeping
their changes, when it is there already) and the lesson opened.""")
    p.add_argument("hub", help="the hub's address, https://hub.example.edu")
    p.add_argument("lessons", nargs="*", help="parts (1) or lessons (4.2); all by default")
    p.add_argument("--repo", help="the repository the hub clones (default: the course's own)")
    p.add_argument("--branch", default=None, help="its branch (default: main)")
    p.add_argument("--solutions", action="store_true", help="link the worked solutions instead of the lessons")
    p.add_argument("--classic", action="store_true", help="open them in the classic notebook, not JupyterLab")

    argv, files = _split_files(argv)
    args, extra = parser.parse_known_args(argv)
    if args.command == "hub-links" and not any(e.startswith("-") for e in extra):
        args.lessons, extra = args.lessons + extra, []  # lessons named after the options
    if extra and args.command != "lab":  # only `lab` passes options on (to JupyterLab)
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "assign":
        from .grading import assign
        assign(args.parts, args.out)
    elif args.command in ("grade", "gradebook"):
        from .grading import UNGRADED

        options = _read_class_options(args, argv)
        said, kept = options.pop("said"), options.pop("kept")
        if args.command == "grade":
            from .gradebook import grade_class, parse_shard

            args.notebooks += files
            if not args.notebooks:
                parser.error("grade: give the notebooks to grade (python -m course grade -- *.ipynb)")
            shard = parse_shard(args.shard) if args.shard else None
            records, rows = grade_class(args.notebooks, args.out, shard=shard, time_limit=args.time_limit,
                                        lesson=args.lesson, sandbox=not args.no_sandbox, jobs=args.jobs,
                                        memory=args.memory, **options)
            if shard is not None:
                print("once every shard is done, merge them, with the class's options: python -m course gradebook "
                      f"--out grades.csv {' '.join(said) or '[--roster ... --deadline ...]'} "
                      "<every shard's -results.jsonl>")
        else:
            from .gradebook import build, load_records

            records = load_records(args.records)
            rows = build(records, args.out, **options)
        if kept and rows is not None:
            print(kept)
        if args.command == "grade":  # this run's inputs, not the records kept from an earlier one
            given = {str(Path(n).resolve()) for n in args.notebooks}
            records = [r for r in records if r.get("path") in given]
        ungraded = [r["notebook"] for r in records if r.get("ungraded")]
        if ungraded:  # a mistyped pattern must not look like a class of zeros graded with success
            raise SystemExit(f"{len(ungraded)} of {len(records)} inputs could not be graded (see their status in "
                             f"{args.out}): {', '.join(ungraded[:3])}{' ...' if len(ungraded) > 3 else ''}")
    elif args.command == "doctor":
        from .doctor import main as doctor
        doctor()
    elif args.command == "lab":
        from .lab import main as lab
        return lab(extra, dry_run=args.dry_run)
    elif args.command == "notebooks":
        from .notebooks import cmd_notebooks
        cmd_notebooks(args.paths, tags_only=args.tags_only)
    elif args.command == "colab":
        from .notebooks import set_repo, write_syllabus
        set_repo(args.repo)
        write_syllabus()
    elif args.command == "hub-links":
        from .notebooks import hub_links

        for title, link in hub_links(args.hub, args.lessons, repo=args.repo, branch=args.branch,
                                     kind="solutions" if args.solutions else "notebooks",
                                     app="classic" if args.classic else "lab"):
            print(f"{title}\n    {link}")
    elif args.command == "syllabus":
        from .notebooks import write_syllabus
        write_syllabus()


def _class_options(p):
    """The options of a class's gradebook, the same for grading and for building it again."""
    p.add_argument("--roster", help="CSV of the students (id, name, section, email, lms_id, submitted): "
                                    "names each row and matches LMS download names")
    p.add_argument("--points", help="CSV exercise,points (default: 1 point each)")
    p.add_argument("--deadline", help="when the work was due: 2026-12-01T17:00 (local time), with a zone "
                                      "(2026-12-01T17:00+01:00), or a date alone (the end of that day)")
    p.add_argument("--late-penalty", type=float, default=0,
                   help="percent of the points taken off per day late, any part of a day counting (default 0)")
    p.add_argument("--grace", type=float, default=0, help="minutes after the deadline still on time (default 0)")
    p.add_argument("--manual", help="a gradebook CSV to take the manual points and comments from (by default "
                                    "the --out gradebook's own, when it exists)")
    p.add_argument("--similarity", type=float, default=None,
                   help="how alike two answers must be to be flagged for review, 0 to 1 (default 0.8)")
    p.add_argument("--feedback", default=None, help="folder for the feedback pages (default: beside the CSV, "
                                                    "grades-feedback/ for grades.csv)")
    p.add_argument("--no-feedback", action="store_true", help="write no feedback pages")


def _read_class_options(args, argv):
    import datetime
    import os

    from .gradebook import LatePolicy, copies, parse_time, read_manual, read_points, read_roster

    manual = read_manual(args.manual) if args.manual else None
    kept = None
    if manual is None and os.path.isfile(args.out):
        try:  # what the instructor typed into the gradebook is never lost to a new run
            manual = read_manual(args.out)
        except SystemExit:
            manual = None
        if manual:  # said once the gradebook that keeps them is written
            kept = (f"kept the manual points and comments of {len(manual)} row{'s' if len(manual) > 1 else ''} "
                    f"of {args.out} (--manual names another file to take them from)")
    names = ("--roster", "--points", "--deadline", "--late-penalty", "--grace", "--similarity", "--manual")
    said = [a for n, a in enumerate(argv) if a.split("=")[0] in names or (n and argv[n - 1] in names)]

    if args.late_penalty < 0 or args.grace < 0:
        raise SystemExit("--late-penalty and --grace cannot be negative")
    if (args.late_penalty or args.grace) and not args.deadline:
        raise SystemExit("--late-penalty and --grace need a --deadline")
    if args.similarity is not None and not 0 < args.similarity <= 1:
        raise SystemExit(f"--similarity is a share between 0 and 1 (0.8: 80% alike), not {args.similarity}")
    return {"roster": read_roster(args.roster) if args.roster else None,
            "points": read_points(args.points) if args.points else None,
            "late": LatePolicy(parse_time(args.deadline, "--deadline") if args.deadline else None, args.late_penalty,
                               datetime.timedelta(minutes=args.grace)),
            "manual": manual, "threshold": copies.THRESHOLD if args.similarity is None else args.similarity,
            "feedback": False if args.no_feedback else (args.feedback or True), "said": said, "kept": kept}


def _split_files(argv):
    """For `grade`: (the arguments argparse reads, the notebooks it must not see). Everything after
    `--` is a notebook; so is an argument that names an existing file, such as `--lesson=x.ipynb`
    brought in by the shell from `grade *.ipynb`: a file name is never taken for an option."""
    import os
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "grade":
        return argv, []
    end = argv.index("--") if "--" in argv else len(argv)
    files = [a for a in argv[1:end] if a.startswith("-") and os.path.lexists(a)]
    return [a for a in argv[:end] if a not in files], files + argv[end + 1:]


if __name__ == "__main__":
    raise SystemExit(main())
