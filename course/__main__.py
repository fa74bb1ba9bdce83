"""The course's command line: `python -m course COMMAND`.

    assign PARTS... --out DIR          lesson notebooks of the chosen parts, without solutions
    grade [--out FILE.csv] -- NOTEBOOKS...  run submitted notebooks, check their exercises, one row each
    doctor                             versions, graphviz, GPU or simulator
    lab                                JupyterLab at the top of the course, without the news pop-up
    notebooks [PATHS...]               re-execute notebooks in place (all of them by default)
    notebooks --tags-only [PATHS...]   only turn `# NBVAL_...` comments into cell tags (no run)
    colab OWNER/NAME                   point badges and install cells at a fork
    syllabus                           rewrite the syllabus table of README.md
"""

import argparse

from . import _quick_nbformat  # noqa: F401  (before anything imports nbformat)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m course", description="The course's tools.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("assign", help="write lesson notebooks (without solutions) for students")
    p.add_argument("parts", nargs="+", help="part numbers (1 2) or folder names (1-micrograd)")
    p.add_argument("--out", required=True, help="folder to write into")

    p = sub.add_parser("grade", help="run submitted notebooks and write one CSV row each",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog="""examples:
  python -m course grade -- submissions/*/1.1-derivatives.ipynb       one lesson, a folder per student
  python -m course grade --out part1.csv -- subs/*/*.ipynb            every lesson, into part1.csv
  python -m course grade --jobs 4 --time-limit 120 -- subs/*/*.ipynb  4 at once, 2 minutes each
  python -m course grade --lesson my-1.1.ipynb -- subs/*.ipynb        all answer this handed-out lesson
  python -m course grade --memory 4 -- subs/*/*.ipynb                 4 GiB of memory each
  python -m course grade --feedback pages/ -- subs/*/*.ipynb          a feedback page per submission in pages/
  python -m course grade --no-sandbox -- mine.ipynb                   a notebook you trust, without bubblewrap
It exits with status 1 when an input could not be graded (a folder, a missing file, not a notebook).""")
    p.add_argument("notebooks", nargs="*", help="the notebooks; after `--`, names that begin with - too")
    p.add_argument("--out", default="grades.csv")
    p.add_argument("--time-limit", type=float, default=300, help="seconds per notebook (default 300)")
    p.add_argument("--lesson", help="the handed-out lesson notebook they all answer (by default, "
                                    "the course's lesson with the submission's file name)")
    p.add_argument("--no-sandbox", action="store_true",
                   help="grade without bubblewrap (grading refuses to run where it is missing, unless given this): "
                        "every submission can then read and write what your user can, stop your processes, and "
                        "change the grading of the submissions after it. Only for a class you trust")
    p.add_argument("--jobs", type=int, default=1, help="notebooks run at once (default 1)")
    p.add_argument("--feedback", default=None,
                   help="folder for one HTML page per submission, each exercise's outcome and what its check said "
                        "(default: beside the CSV, grades-feedback/ for grades.csv)")
    p.add_argument("--no-feedback", action="store_true", help="write no feedback pages")
    p.add_argument("--memory", type=float, default=8,
                   help="GiB of memory each notebook may use (default 8, 0: no limit)")

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

    argv, files = _split_files(argv)
    args, extra = parser.parse_known_args(argv)
    if extra and args.command != "lab":  # only `lab` passes options on (to JupyterLab)
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "assign":
        from .grading import assign
        assign(args.parts, args.out)
    elif args.command == "grade":
        from .grading import grade

        args.notebooks += files
        if not args.notebooks:
            parser.error("grade: give the notebooks to grade (python -m course grade -- *.ipynb)")
        from .grading import UNGRADED

        rows = grade(args.notebooks, args.out, time_limit=args.time_limit, lesson=args.lesson,
                     sandbox=not args.no_sandbox, jobs=args.jobs, memory=args.memory,
                     feedback=False if args.no_feedback else (args.feedback or True))
        ungraded = [r["notebook"] for r in rows or () if r.get(UNGRADED)]
        if ungraded:  # a mistyped pattern must not look like a class of zeros graded with success
            raise SystemExit(f"{len(ungraded)} of {len(rows)} inputs could not be graded (see their status in "
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
    elif args.command == "syllabus":
        from .notebooks import write_syllabus
        write_syllabus()


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
