"""For instructors: hand out lessons without solutions, and grade what comes back.

    python -m course assign 1 2 --out handout/            lessons of parts 1 and 2, with a README
    python -m course grade --out grades.csv -- subs/*/1.1-derivatives.ipynb   (after --: notebooks only)

Grading does not trust the notebooks it grades:
- every submission is read into memory before any of them runs, and grading runs that copy;
- each one runs in a fresh kernel, in a private temporary folder, under a time limit, inside a
  sandbox where the platform has one (bubblewrap on Linux): no network, no other submission, not
  the grader's folder;
- the verdicts are computed out of the submission's reach (course/instructor/): the learner's
  definitions answer in a sandboxed process from which the library names each exercise rebuilds
  are gone, and the checks run in another process that calls them through a pipe with plain data;
  only the checks that watch a kernel from inside (part 6's traced kernels, peak memory, device
  copies) run in the notebook's kernel after its cells, loaded afresh from the course's source and
  read from a line tagged with a random value that no earlier cell could know;
- the runner that drives the kernel signs its report with a key the kernel never sees, so nothing
  the notebook prints or writes can pass for a result: the grader and the runner make themselves
  undumpable (no other process of their user can read their memory or open their files through
  /proc) and the kernel runs without capabilities, so it cannot read the key or reach the channel;
- the kernel gets a clean environment: nothing of the instructor's, and no sign that it is graded;
- when a notebook is done, or out of time, the kernel and every process it started are stopped.
INSTRUCTORS.md says what this does not protect against.
"""

import ast
import contextlib
import csv
import errno
import functools
import hashlib
import hmac
import importlib.util
import io
import json
import os
import re
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import tokenize
from pathlib import Path

from .notebooks import KERNEL_ENV, MARKER_LINE, is_install_cell, lesson_paths, part_folders

STUDENT_README = """\
# Exercises: {parts}

These notebooks are lessons of the course. Read each one top to bottom, run every cell, and
do the exercises at the end: replace each `raise NotImplementedError` with your code and run
the cell. The `check(...)` line under it tells you at once whether your answer is right.

Set up once, on your machine (Python 3.10 or newer). Upgrade pip first: an old pip (23.x)
fails on the second line.

    python -m pip install --upgrade pip
    python -m pip install "course[lab] @ {git_url}"
    jupyter lab

The `[lab]` part installs JupyterLab and the Python kernel along with the course. Or open a
notebook in Colab, where its first cell installs the course.

Hand in the notebooks themselves, keeping their file names. Grading reruns each notebook from
the top in a fresh kernel, then checks your functions by the names the exercise cells use: keep
those names, and make sure that "Restart kernel and run all cells" works from the top. Each
exercise is checked with your notebook's imports, functions, classes and constants and the
exercise's own cell, but without the library function the exercise asks you to write. Results
printed in the notebook are not what is graded.

Notebooks in this folder:
{listing}
"""

OUTCOMES = ("passed", "failed", "not attempted", "not run")
UNGRADED = "_ungraded"  # the key of a row whose input could not be graded at all
RESULT_TAG = "COURSE-GRADE"       # the runner's report line: tag, signature, JSON
PEEK = 300                        # longest status text
LARGEST = 64 << 20                # bytes: a bigger file is not read (a notebook with outputs is a few MB)
MEMORY_GIB = 8                    # address space of each kernel, in GiB (--memory)

# What the kernel keeps of the grader's environment: how to find programs and libraries, the
# language, and the settings that choose a GPU or its simulator. Nothing else (no secret of the
# instructor's, nothing that says it is graded).
KEPT_ENV = ("PATH", "LANG", "LANGUAGE", "TZ", "PYTHONPATH", "LD_LIBRARY_PATH", "COURSE_CUDA",
            "NUMBA_ENABLE_CUDASIM", "NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
            "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "CUDA_HOME")


# ---- handing out ----

def _part_dirs(parts, root=None):
    folders = part_folders(root, "notebooks")
    chosen = []
    for part in parts:
        match = [f for f in folders if f.name == part or f.name.split("-", 1)[0] == str(part)]
        if not match:
            names = ", ".join(f.name for f in folders)
            raise SystemExit(f"there is no part {part!r}: the parts are {names}")
        chosen += match
    return chosen


def course_release(root=None):
    """(version, git commit or None) of the course that is running: what an assignment is pinned to."""
    from . import __version__
    from .notebooks import repo_root

    root = Path(root) if root is not None else repo_root()
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return __version__, commit if re.fullmatch(r"[0-9a-f]{40}", commit) else None


def assign(parts, out, root=None):
    """Copy the lesson notebooks of `parts` (never the solutions) into `out`, with a README and a
    points file (points.csv: 1 point per exercise, for the instructor to edit). Each notebook is
    stamped with the course's version, and its install cell (and the README's install line) is
    pinned to this very commit: students install the course the instructor grades with. Cells and
    their tags (nbval's among them) are kept as they are."""
    import nbformat

    from . import _repo
    from .gradebook.policy import write_points
    from .notebooks import BADGE_RE, badge, install_source, repo_root

    out = Path(out)
    version, commit = course_release(root)
    listing, ids = [], []
    lessons = lesson_paths(root, "notebooks")
    for folder in _part_dirs(parts, root):
        for path in (p for p in lessons if p.parent == folder):
            dest = out / folder.name / path.name
            dest.parent.mkdir(parents=True, exist_ok=True)
            nb = nbformat.read(str(path), as_version=4)
            nb.metadata["course"] = {"version": version, "commit": commit or ""}
            if commit:  # the install cell, and the Colab badge's notebook, of this very commit
                first = next(c for c in nb.cells if c.cell_type == "code")
                if first.source == install_source():
                    first.source = install_source(ref=commit)
                rel = path.relative_to(Path(root) if root is not None else repo_root()).as_posix()
                for cell in nb.cells:
                    if cell.cell_type == "markdown" and BADGE_RE.search(cell.source):
                        cell.source = BADGE_RE.sub(badge(rel, branch=commit).replace("\\", "\\\\"), cell.source, 1)
                        break
            nbformat.write(nb, str(dest))
            ids += [i for i, _ in exercise_calls(nb)]
            listing.append(f"- {folder.name}/{path.name}")
    (out / "README.md").write_text(STUDENT_README.format(
        parts=", ".join(str(p) for p in parts), git_url=_repo.git_url(ref=commit), listing="\n".join(listing)))
    write_points(out / "points.csv", ids)
    pinned = f"pinned to commit {commit[:12]}" if commit else "not pinned (this copy of the course is not a git clone)"
    print(f"wrote {len(listing)} notebooks, README.md and points.csv to {out}; the install lines are {pinned}")
    return out


def lesson_notebooks(root=None):
    """The handed-out lessons a submission may answer."""
    return lesson_paths(root, "notebooks")


# ---- what a lesson asks for ----

def _code_cells(nb):
    return [c for c in nb.cells if c.cell_type == "code"]


def _walk(tree):
    return ast.walk(tree) if tree is not None else ()


def _parse(source):
    # IPython lines (%magic, !shell) are not Python: blank them so the rest still parses.
    lines = ["" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines()]
    try:
        return ast.parse("\n".join(lines))
    except SyntaxError:
        return None


def _check_calls(tree):
    """(exercise id, name of the function checked) for each `check("1.2.3", name)` in a cell's code."""
    for node in _walk(tree):
        if (isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "check"
                and len(node.args) == 2 and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str) and isinstance(node.args[1], ast.Name)):
            yield node.args[0].value, node.args[1].id


def exercise_calls(nb):
    """[(exercise id, name of the function checked)] for each `check("1.2.3", name)` of a notebook."""
    found = {}
    for cell in _code_cells(nb):
        for exercise_id, name in _check_calls(_parse(cell.source)):
            found.setdefault(exercise_id, name)
    return list(found.items())


def exercise_ids(path):
    """The exercise ids a notebook checks, in order of first appearance."""
    import nbformat

    return [i for i, _ in exercise_calls(nbformat.read(str(path), as_version=4))]


def _find_lesson(name, text, lessons):
    """The handed-out lesson a submission answers: by its file name, else by the ids it checks."""
    by_name = {p.name: p for p in lessons}
    if name in by_name:
        return by_name[name]
    stem = Path(name).stem
    for lesson in lessons:  # "alice-1.1-derivatives", "1.1-derivatives (2)" ...
        if lesson.stem in stem:
            return lesson
    # Only to choose the lesson: the ids graded are the lesson's own, whatever the submission says.
    mentioned = re.findall(r"""check\(\s*\\?["']([0-9]+\.[0-9]+)\.[0-9]+\\?["']""", text)  # in JSON: check(\"1.2.3\"
    for lesson in lessons:
        if mentioned and lesson.stem.split("-", 1)[0] == max(set(mentioned), key=mentioned.count):
            return lesson
    return None


# ---- a second look for the instructor ----

# Things an exercise answer never needs, and that code trying to fool the grader would use.
# Comments are left out of the search; strings are not (a path to /proc is as telling as a call).
SUSPECT = [(re.compile(p), what) for p, what in [
    (r"\bcourse\s*\.\s*exercises\b|\b_core\b|\b_load_part\b|\b_CHECKS\b|\b_FRESH\b", "reaches into the checker"),
    (r"\b__(globals|closure|code|wrapped|defaults|kwdefaults|self|func|subclasses|setattr|getattribute|"
     r"reduce_ex|reduce|dict|builtins|import|loader|spec)__\b", "reaches into an object's insides"),
    (r"\b(tb_frame|tb_next|f_globals|f_locals|f_back|f_builtins|f_code|gi_frame|cr_frame|ag_frame|"
     r"__traceback__|__context__|__cause__)\b", "reaches into stack frames"),
    (r"\bsys\s*\.\s*modules\b", "uses sys.modules"), (r"\bbuiltins\b", "uses builtins"),
    (r"\bget_ipython\b|\bIPython\b|\b_ip\b|\binput_transformers\w*|\bast_transformers\b|\bdisplay(hook|_pub)\b"
     r"|\b(exit|quit)\s*\.", "uses IPython's insides"),
    (r"\bimportlib\b|\bglobals\s*\(|\blocals\s*\(", "uses importlib or the namespace itself"),
    (r"\bsys\s*\.\s*(stdout|stderr|stdin|_getframe|_current_frames|settrace|setprofile|exit|excepthook|"
     r"displayhook|audit|addaudithook|__\w+__)\b", "uses sys's insides"),
    (r"\bctypes\b|\bgc\s*\.|\binspect\s*\.|\bimport\s+inspect\b|\bmarshal\b|\bpickle\b|\btypes\s*\.\s*"
     r"(FunctionType|CodeType)", "inspects the interpreter"),
    (r"\bos\s*\.\s*(system|popen|spawn\w*|posix_spawn\w*|exec\w*|fork\w*|kill\w*|setsid|setpgid|getppid|"
     r"wait\w*|pidfd_\w*)\b|\bsignal\s*\.|\bsubprocess\b|\bmultiprocessing\b"
     r"|\bconcurrent\b|\bpty\b|\bpsutil\b|\bposix\b|\bcreate_subprocess", "handles processes"),
    (r"\bgetenv\w*|\b(put|unset)env\b|\benviron\w*|COURSE.GRADE", "reads the environment"),
    (r"/proc\b|/dev/|/sys/", "reads /proc, /dev or /sys"),
    (r"\bgetcwd\b|\bcwd\s*\(|\bhome\s*\(|\bexpanduser\b|\bgettempdir\b|/tmp\b|\bgetuid\b|\bgetpid\b"
     r"|\bgetlogin\b|\bgethostname\b|\bsys\s*\.\s*(argv|orig_argv)\b|\bplatform\s*\.\s*node\b",
     "looks at where it runs"),
    (r"\bthreading\b|\b_thread\b|\batexit\b", "leaves code running"),
    (r"\b(exec|eval|compile|__import__)\s*\(|\b__dict__\b", "runs code from text or sets attributes"),
]]

# What a cell reaches through its imports, by full dotted name (`import os as o; o.system`,
# `from os import system`, `from concurrent import futures`): a prefix here is worth a look.
SUSPECT_NAMES = {
    "os.system": "handles processes", "os.popen": "handles processes", "os.posix_spawn": "handles processes",
    "os.posix_spawnp": "handles processes", "os.spawn": "handles processes", "os.exec": "handles processes",
    "os.fork": "handles processes", "os.kill": "handles processes", "os.getppid": "handles processes",
    "os.setsid": "handles processes", "os.environ": "reads the environment", "os.getenv": "reads the environment",
    "os.environb": "reads the environment", "os.putenv": "reads the environment",
    "subprocess": "handles processes", "multiprocessing": "handles processes", "concurrent": "handles processes",
    "signal": "handles processes", "pty": "handles processes", "psutil": "handles processes",
    "posix": "handles processes", "ctypes": "inspects the interpreter", "gc": "inspects the interpreter",
    "inspect": "inspects the interpreter", "sys": "uses sys's insides", "builtins": "uses builtins",
    "importlib": "uses importlib", "IPython": "uses IPython's insides", "threading": "leaves code running",
    "_thread": "leaves code running", "atexit": "leaves code running", "course.exercises": "reaches into the checker",
    "course.grading": "reaches into the checker",
}


def _without_comments(source):
    try:
        tokens = tokenize.generate_tokens(io.StringIO(source).readline)
        return " ".join(t.string for t in tokens if t.type != tokenize.COMMENT)
    except (tokenize.TokenError, SyntaxError):
        return source


def _unmarked(source):
    """A cell's code without nbval marker comments: a lesson handed out before they became cell
    tags still has them, and that is no change by the learner."""
    return "\n".join(line for line in source.split("\n") if not MARKER_LINE.match(line)).strip()


def _is_module(dotted):
    """Whether `from a import b` brings a module (a.b), whatever the grader itself has imported."""
    if dotted in sys.modules:
        return True
    try:
        return importlib.util.find_spec(dotted) is not None
    except (ImportError, ValueError, AttributeError):  # a.b where a is no package, or is not installed
        return False


def _imports(trees):
    """{name bound in the notebook: the dotted name of what was imported}."""
    names = {}
    for tree in trees:
        for node in _walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    names[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for a in node.names:
                    names[a.asname or a.name] = f"{node.module}.{a.name}"
    return names


def _dotted(node, imports):
    """The full dotted name an expression reaches (`o.system` -> "os.system"), or None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id in imports:
        return ".".join([imports[node.id], *reversed(parts)])
    return None


def _strings(tree):
    """Every string constant of a cell, run together: `"/pr" + "oc"` reads "/proc" here."""
    return "".join(n.value for n in _walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str))


def review_notes(nb, lesson):
    """Why an instructor might look at a submission by hand: cells the lesson does not have that
    touch the machinery around the exercises, the environment or other processes, or that change
    an attribute of an imported module (directly, or by handing the module to other code)."""
    own = {_unmarked(c.source) for c in _code_cells(lesson)}
    trees = [_parse(c.source) for c in _code_cells(nb)]
    imports = _imports(trees)
    imported = set(imports)  # modules, and the functions and classes imported from them
    modules = {name for tree in trees for node in _walk(tree) if isinstance(node, ast.Import)
               for name in [a.asname or a.name.split(".")[0] for a in node.names]}
    modules |= {name for name, full in imports.items() if _is_module(full)}
    notes = []
    for n, (cell, tree) in enumerate(zip(_code_cells(nb), trees), 1):
        if _unmarked(cell.source) in own or is_install_cell(cell.source):
            continue
        source = _without_comments(cell.source).replace("from course . exercises import check", "")
        source += "\n" + _strings(tree)
        hits = [what for pattern, what in SUSPECT if pattern.search(source)]
        reached = {id(n.value) for n in _walk(tree) if isinstance(n, ast.Attribute)}
        reached |= {id(n.args[0]) for n in _walk(tree) if isinstance(n, ast.Call) and n.args
                    and isinstance(n.func, ast.Name) and n.func.id in ("setattr", "vars")}  # said below
        for node in _walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "course" and any(
                    a.name in ("exercises", "grading") for a in node.names):
                hits.append("reaches into the checker")
            if isinstance(node, (ast.Attribute, ast.Name)) and isinstance(getattr(node, "ctx", None), ast.Load):
                full = _dotted(node, imports) or ""
                hits += [what for name, what in SUSPECT_NAMES.items()
                         if (full == name or full.startswith(name + ".") or
                             name in ("os.spawn", "os.exec", "os.fork", "os.kill") and full.startswith(name))
                         and full != "course.exercises.check"]
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [getattr(node, "target", None)]
            for t in targets:
                if isinstance(t, ast.Attribute):
                    root = t.value
                    while isinstance(root, (ast.Attribute, ast.Subscript, ast.Call)):
                        root = root.func if isinstance(root, ast.Call) else root.value
                    if isinstance(root, ast.Name) and root.id in imported:
                        hits.append(f"sets {ast.unparse(t)}")
            # setattr(obj, ...) and vars(obj) are ordinary on the learner's own objects (a
            # Sequential names its layers with setattr); on an imported module they patch it.
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "vars")
                    and node.args and isinstance(node.args[0], ast.Name) and node.args[0].id in imported):
                hits.append(f"{node.func.id}({node.args[0].id}, ...) changes a module")
            # A module handed to other code, which can then change it: helper(np), m = np, [np].
            if (isinstance(node, ast.Name) and node.id in modules and isinstance(node.ctx, ast.Load)
                    and id(node) not in reached):
                hits.append(f"hands the module {node.id} to other code")
        if hits:
            notes.append(f"code cell {n} {', '.join(dict.fromkeys(hits))}")
    return notes


# ---- the sandbox ----

def sandbox_problem():
    """None when bubblewrap can isolate a run here, else a sentence saying why not."""
    if not sys.platform.startswith("linux"):
        return f"no sandbox on {sys.platform}"
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return "bubblewrap (bwrap) is not installed"
    probe = subprocess.run([bwrap, "--ro-bind", "/", "/", "--unshare-all", "--die-with-parent", "--cap-drop", "ALL",
                            "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", "true"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        return f"bubblewrap cannot make a sandbox here ({probe.stderr.strip()[:120]})"
    return None


# Where the process that answers the checks finds the course: its source is written there, then
# deleted once imported; its data files are bound there, read-only.
SOURCE_ROOT = "/tmp/src"
# The sandbox's home and working folder: an ordinary user's home, as a learner's own run has (a
# graded run shows nothing a notebook could tell it apart by).
SANDBOX_HOME = "/home/learner"


def data_files():
    """The course package's files that are not code (text, tables, checkpoints), relative to it."""
    import course

    package = Path(course.__file__).resolve().parent
    return sorted(p.relative_to(package).as_posix() for p in package.rglob("*")
                  if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts)

# What a run sees of the machine, read-only: programs, libraries and settings.
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt", "/nix")
# Of /etc, only what programs and libraries read to start (the dynamic linker's cache, time zone,
# the user and group names): not the rest, where /etc/shadow is readable to root.
ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "timezone", "alternatives", "passwd",
             "group", "nsswitch.conf", "host.conf", "os-release", "mime.types", "matplotlibrc", "fonts")


def _sandbox_command(hide, course_source=True):
    """bwrap arguments for one run. It sees the system's programs and libraries, Python and the
    course, all read-only, and nothing else: no home folder, no other submission, not the grader's
    folder (`hide` names those that lie inside what it must see). It gets an empty /tmp of its
    own, no network and no sight of other processes, and it dies with the grader.
    `course_source=False` (the process that answers a check's calls): not the course's code either,
    only its data folders, bound where the start-up code writes the grader's copy of the source."""
    import course

    package = Path(course.__file__).resolve().parent
    keep = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
                                          Path(sys.executable).resolve().parent)}
    keep |= {package} if course_source else set()
    keep |= {Path(p).resolve() for p in sys.path if p and "site-packages" in p and Path(p).is_dir()}

    def under(a, b):
        return a != b and b in a.parents

    # Without capabilities (bwrap keeps them all for root), no process inside may read another's
    # memory or files through /proc once that one is undumpable, as the runner is.
    args = [shutil.which("bwrap"), "--die-with-parent", "--unshare-all", "--new-session", "--cap-drop", "ALL",
            "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
    for d in SYSTEM_DIRS:
        if os.path.islink(d):  # /bin -> usr/bin on most systems now
            args += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            args += ["--ro-bind", d, d]
    for name in ETC_FILES:
        if os.path.lexists(f"/etc/{name}"):
            args += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
    # As the unprivileged user "nobody" inside (the files it makes are nobody's too).
    args += ["--uid", "65534", "--gid", "65534"]
    for k in sorted(keep, key=lambda p: len(p.parts)):
        args += ["--ro-bind", str(k), str(k)]
    # Submissions kept inside the repository or the system folders stay out of sight.
    seen = keep | {Path(d) for d in SYSTEM_DIRS} | {Path("/etc")}
    for h in sorted({Path(h).resolve() for h in hide}, key=lambda p: len(p.parts)):
        if h.is_dir() and any(under(h, k) for k in seen) and not any(h == k or under(k, h) for k in keep):
            args += ["--tmpfs", str(h)]
    if not course_source:
        if any(under(package, k) for k in seen):  # installed among the site-packages: out of sight
            args += ["--tmpfs", str(package)]
        for name in data_files():
            args += ["--ro-bind", str(package / name), f"{SOURCE_ROOT}/course/{name}"]
    return args + ["--dir", SANDBOX_HOME, "--chdir", SANDBOX_HOME, "--setenv", "HOME", SANDBOX_HOME, "--"]


# ---- inside the sandbox: the runner, which drives the kernel ----

# The grader's own cell, sent after the notebook's cells have run. It loads the checks from the
# source text the grader read (course.exercises in this kernel may have been changed), checks the
# lesson's functions from the notebook's namespace, and prints the outcomes after a random tag
# that exists only in this cell.
FINAL_CELL = '''\
def _course_grade(tag, exercises, sources, part, seed):
    import builtins, importlib.abc, importlib.util, json, sys

    class Source(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path=None, target=None):
            if name in sources:
                return importlib.util.spec_from_loader(name, self, is_package=name == "course.exercises")
            if name.startswith("course.exercises."):  # never from a file the notebook could have changed
                raise ModuleNotFoundError(f"the grader has no copy of {name}", name=name)
        def create_module(self, spec):
            return None
        def exec_module(self, module):
            code = builtins.compile(sources[module.__name__], "<grader> " + module.__name__, "exec")
            builtins.exec(code, module.__dict__)

    # A copy: threads the notebook started may import modules meanwhile.
    for name in [m for m in sys.modules.copy() if m == "course.exercises" or m.startswith("course.exercises.")]:
        del sys.modules[name]
    finder = Source()
    sys.meta_path.insert(0, finder)
    try:
        core = importlib.import_module("course.exercises._core")
        importlib.import_module(part)
    finally:
        sys.meta_path.remove(finder)
    core._FRESH = seed  # inputs drawn afresh: none of them could be known from an earlier run
    defined = sys._getframe(0).f_globals
    outcomes = {}
    for exercise_id, name in exercises:
        if name not in defined:
            outcomes[exercise_id] = "not attempted"
            continue
        try:
            outcomes[exercise_id] = core.check(exercise_id, defined[name]).status
        except BaseException:
            outcomes[exercise_id] = "failed"
    sys.stdout.write("\\n" + tag + json.dumps(outcomes) + "\\n")
    sys.stdout.flush()

_course_grade(%r, %r, %r, %r, %r)
'''


class _Kernel:
    """A fresh IPython kernel, driven through jupyter_client (nbclient would pull in nbformat and
    its JSON-schema validation, which take longer to import than the kernel takes to start)."""

    def __init__(self, env, memory):
        from jupyter_client import KernelManager

        # The kernel talks to the runner over Unix sockets in the run's own folder, not TCP ports on
        # this machine's loopback: no other process can reach them, and no other kernel started at
        # the same moment (a test suite's, another submission's) can take the same port.
        self.km = KernelManager(kernel_name="python3", transport="ipc", ip=os.path.join(os.getcwd(), "kernel"))
        # No stdin or stdout of ours: what the kernel writes never reaches the runner's report. Its
        # environment is the one the grader chose, not the runner's.
        try:
            import resource  # here, not between fork and exec, where an import could wait forever
        except ImportError:  # Windows
            resource = None
        self.km.start_kernel(cwd=os.getcwd(), env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, preexec_fn=functools.partial(_powerless, memory, resource),
                             extra_arguments=["--HistoryManager.hist_file=:memory:"])
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=120)

    def run(self, source, store_history=True, keep_output=False):
        """Run one cell; return (what it printed if asked, its error or None, whether the kernel lives)."""
        msg_id = self.kc.execute(source, store_history=store_history, allow_stdin=False)
        printed, error = [], None
        while True:
            try:
                msg = self.kc.get_iopub_msg(timeout=1)
            except Exception:  # nothing for a second: is the kernel still there?
                if not self.km.is_alive():
                    return "".join(printed), "the kernel died", False
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream" and content.get("name") == "stdout" and keep_output:
                printed.append(content.get("text", ""))
            elif kind == "error":
                error = f"{content.get('ename')}: {content.get('evalue')}"
            elif kind == "status" and content.get("execution_state") == "idle":
                return "".join(printed), error, True

    def stop(self):
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)  # which also removes its connection file


# prctl(2) options
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_CHILD_SUBREAPER = 1, 4, 24, 36


@functools.lru_cache(maxsize=None)
def _libc():
    import ctypes

    return ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def _prctl(option, value):
    """prctl(2) on Linux; False where it failed or does not exist."""
    libc = _libc()
    return libc is not None and libc.prctl(option, value, 0, 0, 0) == 0


@contextlib.contextmanager
def _undumpable():
    """While grading, this process is not dumpable: another process of the same user cannot read
    its memory (the runners' keys) or open its files and pipes through /proc, unless it has
    CAP_SYS_PTRACE, which no kernel has."""
    changed = _prctl(PR_SET_DUMPABLE, 0)
    try:
        yield
    finally:
        if changed:
            _prctl(PR_SET_DUMPABLE, 1)


def _powerless(memory, resource):
    """Run in the kernel's process between fork and exec: it dies with the runner, runs with no
    capabilities even as root (so it cannot read the undumpable runner or grader), and may have at
    most `memory` bytes of data (RLIMIT_DATA: the address space a GPU driver reserves, without
    using it, does not count)."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    for cap in range(64):  # emptied bounding set: root gets no capability at exec
        _prctl(PR_CAPBSET_DROP, cap)
    if memory and resource is not None:
        try:
            resource.setrlimit(resource.RLIMIT_DATA, (memory, memory))
        except (ValueError, OSError):  # a platform without it
            pass


def _stop_all(root, also=()):
    """Stop `root`'s descendants (and the processes `also`) for good: freeze first, so none can
    fork meanwhile, then kill, until none is left."""
    import psutil

    for _ in range(10):
        found = {p.pid: p for p in also}
        try:
            found.update((p.pid, p) for p in root.children(recursive=True))
        except psutil.Error:
            pass
        alive = [p for p in found.values() if _alive(p)]
        if not alive:
            return
        for action in ("suspend", "kill"):
            for p in alive:
                try:
                    getattr(p, action)()
                except psutil.Error:
                    pass
        _wait_gone(alive, timeout=2)


def _wait_gone(procs, timeout):
    """Wait until each killed process is gone or a zombie, reaping those that are our children.
    Not psutil.wait_procs: it waits for a zombie until the timeout, and the zombies here are most
    often children of a frozen runner, which reaps them only when it is killed itself."""
    import psutil

    deadline = time.monotonic() + timeout
    while True:
        for p in procs:
            with contextlib.suppress(psutil.Error):
                p.wait(timeout=0)
        if not any(_alive(p) for p in procs) or time.monotonic() > deadline:
            return
        time.sleep(0.01)


def _run_checks(kernel, job, exercises):
    """Run the grader's cell in the notebook's kernel; return {id: outcome} or why it failed."""
    tag = secrets.token_hex(16)  # made now: no cell of the notebook could have seen it
    source = FINAL_CELL % (tag, exercises, job["sources"], job["part"], secrets.randbits(64))
    printed, error, _ = kernel.run(source, store_history=False, keep_output=True)
    if error:
        return f"the checks could not run in this notebook's kernel: {error}"
    found = [line[len(tag):] for line in printed.splitlines() if line.startswith(tag)]
    try:
        (outcomes,) = [json.loads(line) for line in found]
        assert sorted(outcomes) == sorted(i for i, _ in exercises)
        assert all(v in OUTCOMES for v in outcomes.values())
    except (ValueError, TypeError, AssertionError):  # none, several, or not what was asked
        return "the checks gave no readable result"
    return outcomes


def _sign(key, payload):
    return hmac.new(key.encode(), payload.encode(), hashlib.sha256).hexdigest()


def runner_main():
    """The runner: read the job from stdin, run the cells in a kernel, then the checks; report on stdout."""
    import psutil

    # Before the key exists here: no process of the notebook may read this one's memory or reach
    # its stdout through /proc, and every process the kernel leaves behind becomes a child of this one.
    _prctl(PR_SET_DUMPABLE, 0)
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    job = json.loads(sys.stdin.read())
    sys.stdin.close()
    key = job.pop("key")
    outcomes = {i: "not run" for i, _ in job["exercises"]}
    kernel = _Kernel(job["env"], job["memory"])
    status, alive, ran = "ok", True, 0
    for n, source in enumerate(job["cells"], 1):
        _, error, alive = kernel.run(source)
        if error:  # "Restart and run all" stops at the first error: so does grading
            if error.startswith("MemoryError") and job["memory"]:
                error += f" (the memory limit is {job['memory'] / 2**30:g} GiB)"
            status = f"error in code cell {n}: {error}" if alive else f"the kernel died in code cell {n}"
            break
        ran = n
    if alive:
        # Only an exercise whose own cell ran is checked, on the name that cell defines.
        cells, to_the_end = job["exercise_cells"], ran == len(job["cells"])
        checked = [(i, name) for i, name in job["exercises"] if cells.get(i) is not None and cells[i] < ran]
        outcomes.update({i: "not attempted" for i, _ in job["exercises"] if cells.get(i) is None and to_the_end})
        result = _run_checks(kernel, job, checked) if checked else {}
        if isinstance(result, dict):
            outcomes.update(result)
        else:
            status = result if status == "ok" else f"{status}; {result}"
    elif job["memory"]:
        status += f" (it may have reached the memory limit of {job['memory'] / 2**30:g} GiB)"
    # Nothing of the notebook runs any more when the report is written.
    with contextlib.suppress(Exception):
        kernel.stop()
    _stop_all(psutil.Process())
    report = json.dumps({"status": status[:PEEK], "outcomes": outcomes, "ran": ran})
    os.write(sys.stdout.fileno(), f"\n{RESULT_TAG} {_sign(key, report)} {report}\n".encode())


# ---- outside: the grader ----

def _stop_everything(proc):
    """Stop the runner, its kernel and whatever they started: the kernel runs in a session of its
    own, so a process group is not enough. The runner adopts every orphan of the notebook's (it is
    their subreaper), so all are its descendants; inside the sandbox they also share a PID namespace
    that ends with it. They are frozen first so none can fork."""
    import psutil

    if proc.poll() is None:  # not yet reaped, so its pid cannot belong to anyone else
        try:
            runner = psutil.Process(proc.pid)
            runner.suspend()  # frozen, it still adopts the orphans of processes killed below
            _stop_all(runner)  # its descendants first, so that none is handed on to init
            runner.kill()
        except psutil.Error:
            pass
    proc.kill() if proc.poll() is None else None
    proc.wait()


def _alive(p):
    import psutil

    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _read_into(stream, lines, keep=lambda line: True, most=200):
    """Collect the lines of a stream worth keeping, and never too many: a notebook may write
    junk into the runner's output for as long as it runs."""
    for line in iter(lambda: stream.readline(1 << 16), b""):
        if keep(line):
            lines.append(line)
            del lines[:-most]


def _write(stream, data):
    try:
        stream.write(data)
        stream.close()
    except OSError:  # the runner is gone already: its status will say so
        pass


def _check_sources():
    """The source of every module of course.exercises, read by the grader."""
    folder = Path(__file__).parent / "exercises"
    sources = {}
    for path in sorted(folder.glob("*.py")):
        name = "course.exercises" if path.stem == "__init__" else f"course.exercises.{path.stem}"
        sources[name] = path.read_text(encoding="utf-8")
    return sources


def _sources():
    """The course's source, read once before any submission runs: the checks for the notebook's
    kernel, and the whole package for the process that answers across the sandbox's wall. The
    grader also imports every check and every lesson module now, so that none is imported from a
    disk that a submission might have changed by the time it is needed."""
    import pkgutil

    from .exercises import _core
    from .instructor import remote

    _core.registered_ids()
    for name in sorted({m for modules in remote.PART_MODULES.values() for m in modules}):
        module = importlib.import_module(name)
        for info in pkgutil.walk_packages(getattr(module, "__path__", []), prefix=name + "."):
            if not info.name.endswith("__main__"):
                importlib.import_module(info.name)
    return {"checks": _check_sources(), "course": remote.course_sources()}


def _part_sources(sources, part):
    """What the checks of one part load: the package, its core, and the part's modules (part2,
    part2_modules, ...). The kernel compiles all it is given, and every part's checks together
    take it longer than the checks of most lessons take to run."""
    own = re.compile(re.escape(part) + r"(_\w+)?")
    return {name: text for name, text in sources.items()
            if name in ("course.exercises", "course.exercises._core") or own.fullmatch(name)}


def _user_site():
    # Python looks for the user's packages under HOME, which a run gets a fresh one of: point it at
    # the real ones if the course or its dependencies are there, else turn them off.
    import site

    if site.ENABLE_USER_SITE and site.getusersitepackages() in sys.path:
        return {"PYTHONUSERBASE": site.getuserbase()}
    return {"PYTHONNOUSERSITE": "1"}


def _clean_env(work):
    """The environment of the runner and of the kernel: what KEPT_ENV names, and fresh folders."""
    env = {k: v for k, v in os.environ.items() if k in KEPT_ENV or k.startswith("LC_")}
    # Nothing the notebook writes (IPython start-up files, user site-packages) outlives its run.
    env.update(KERNEL_ENV, **_user_site(), HOME=work, TMPDIR=f"{work}/.tmp", IPYTHONDIR=f"{work}/.ipython",
               JUPYTER_RUNTIME_DIR=f"{work}/.jupyter", JUPYTER_CONFIG_DIR=f"{work}/.jupyter",
               MPLCONFIGDIR=f"{work}/.mpl", NUMBA_CACHE_DIR=f"{work}/.numba")
    return env


def _workspace(sandbox):
    """A fresh folder for one run (removed by `_remove`), and the environment of what runs there:
    inside the sandbox the folder is seen as SANDBOX_HOME."""
    work = tempfile.mkdtemp(prefix="grade-")
    os.mkdir(f"{work}/.tmp")
    env = _clean_env(work)
    if sandbox:
        env = {k: v.replace(work, SANDBOX_HOME) for k, v in env.items()}
    return work, env


def _remove(folder):
    """Remove a run's folder, even where the notebook took away the permission to."""
    def retry(function, path, _):
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(path), 0o700)
            os.chmod(path, 0o700) if os.path.isdir(path) and not os.path.islink(path) else None
            function(path)

    shutil.rmtree(folder, onerror=retry)
    shutil.rmtree(folder, ignore_errors=True)


def _fresh_copy(folder, sources):
    """The course's source as the grader read it, written into `folder` with links to its data
    files, all read-only: what one submission run without a sandbox does to it ends with that run."""
    import course

    package = Path(course.__file__).resolve().parent
    for relative, text in sources.items():
        path = Path(folder, relative)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    for name in data_files():
        link = Path(folder, "course", name)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(package / name)
    for path in sorted(Path(folder).rglob("*"), key=lambda p: -len(p.parts)):
        if not path.is_symlink():
            path.chmod(0o555 if path.is_dir() else 0o444)
    return folder


def _run(job, time_limit, sandbox, hide):
    """Run one notebook in a runner process (inside the sandbox if any); return (status, outcomes of
    the exercises checked in its kernel, how many code cells ran)."""
    exercises = job["inside"]
    key = secrets.token_hex(32)
    tag = RESULT_TAG.encode()
    outcomes = {i: "not run" for i, _ in exercises}
    work, env = _workspace(sandbox)
    try:
        if not sandbox:  # a fresh, read-only copy of the course, as the grader read it, for this run alone
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [_fresh_copy(f"{work}/.course", job["course"]),
                                                              env.get("PYTHONPATH")]))
        message = {"key": key, "cells": job["cells"], "exercises": exercises, "part": job["part"],
                   "exercise_cells": job["exercise_cells"], "sources": _part_sources(job["sources"], job["part"]),
                   "env": env,
                   "memory": int(job["memory"] * 2**30)}
        command = [sys.executable, "-c", "from course.grading import runner_main; runner_main()"]
        if sandbox:
            command = _sandbox_command(hide) + command
        proc = subprocess.Popen(command, cwd=work, env=env, start_new_session=True,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = [], []
        # Only a signed line is kept: a flood of forged ones cannot push the report out.
        signed = lambda line: line.startswith(tag) and _verified_report(line.decode(errors="replace"), key, exercises)
        readers = [threading.Thread(target=_read_into, args=(proc.stdout, out, signed), daemon=True),
                   threading.Thread(target=_read_into, args=(proc.stderr, err), daemon=True)]
        readers.append(threading.Thread(target=_write, args=(proc.stdin, json.dumps(message).encode()),
                                        daemon=True))
        for r in readers:
            r.start()
        try:
            proc.wait(timeout=time_limit)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:  # also when the instructor presses Ctrl-C
            _stop_everything(proc)
        for r in readers:
            r.join(timeout=5)
    finally:
        _remove(work)
    if timed_out:
        return f"timed out after {time_limit:g} s", outcomes, 0
    report = _verified_report(b"".join(out).decode(errors="replace"), key, exercises)
    if report is None:
        tail = b"".join(err).decode(errors="replace").strip().splitlines()[-1:] or [""]
        return (f"the run stopped before grading could check it ({_ending(proc.returncode)}) {tail[0]}".strip(),
                outcomes, 0)
    return report["status"], report["outcomes"], report["ran"]


def _ending(code):
    # bwrap passes a signal on as 128 + its number, as shells do.
    if code < 0 or code > 128:
        return f"killed by signal {-code if code < 0 else code - 128}"
    return f"exit status {code}"


def _verified_report(text, key, exercises):
    """The runner's report, if one line carries its signature and says only what it may say."""
    ids = [i for i, _ in exercises]
    for line in text.splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3 and parts[0] == RESULT_TAG and hmac.compare_digest(parts[1], _sign(key, parts[2])):
            report = json.loads(parts[2])
            outcomes = report.get("outcomes", {})
            ran = report.get("ran")
            if (sorted(outcomes) == sorted(ids) and all(v in OUTCOMES for v in outcomes.values())
                    and type(ran) is int):
                return {"status": str(report.get("status"))[:PEEK], "outcomes": outcomes, "ran": ran}
    return None


def _defines(tree, name):
    """Whether a cell's code binds `name` at its top level (def, class, assignment, import)."""
    for node in getattr(tree, "body", ()):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return True
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if any((a.asname or a.name.split(".")[0]) == name for a in node.names):
                return True
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            if any(isinstance(t, ast.Name) and t.id == name for target in targets for t in ast.walk(target)):
                return True
    return False


def exercise_cells(nb, exercises):
    """{exercise id: index of the code cell that answers it}: the last cell that calls check on that
    id and defines the function checked. Only those are graded: a lesson's own function of the same
    name, defined elsewhere, is not the learner's answer."""
    found = {}
    for n, cell in enumerate(_code_cells(nb)):
        tree = _parse(cell.source)
        if tree is None:
            continue
        asked = {i for i, _ in _check_calls(tree)}
        for exercise_id, name in exercises:
            if exercise_id in asked and _defines(tree, name):
                found[exercise_id] = n
    return found


def _prepare(path, data, lessons, lesson=None):
    """What grading needs to know of one submission (its bytes, or why they could not be read)
    before anything runs: the lesson it answers, its code cells, anything worth a second look."""
    import nbformat

    if isinstance(data, OSError) and not lesson and _find_lesson(Path(path).name, "", lessons) is None:
        # a folder, a missing file, a link: say so, rather than that no lesson has this name
        return {"problem": f"could not read it: {data.strerror or data}", "exercises": []}
    if not isinstance(data, OSError) and Path(path).suffix != ".ipynb" and not lesson:
        return {"problem": "not a notebook file (.ipynb): grade the notebooks themselves", "exercises": []}
    text = "" if isinstance(data, OSError) else data.decode("utf-8", errors="replace")
    lesson = Path(lesson) if lesson else _find_lesson(Path(path).name, text, lessons)
    if lesson is None:
        names = ", ".join(p.name for p in lessons[:3])
        return {"problem": f"no lesson of the course is named like this notebook ({names}, ...): "
                           f"keep the handed-out file name, or give --lesson", "exercises": []}
    handed_out = nbformat.read(str(lesson), as_version=4)
    exercises = exercise_calls(handed_out)
    if not exercises:
        return {"problem": f"{lesson.name} has no exercises to grade", "exercises": []}
    job = {"lesson": lesson, "exercises": exercises,
           "part": "course.exercises.part" + exercises[0][0].split(".")[0]}
    if isinstance(data, OSError):
        job["problem"] = f"could not read it: {data.strerror or data}"
        return job
    try:
        nb = nbformat.reads(text, as_version=4)
        nbformat.validate(nb)
    except Exception as err:
        # The kind of problem only: the message may quote the file, which need not be a notebook
        # at all (or someone else's file).
        job["problem"] = f"not a notebook ({type(err).__name__})"
        return job
    job["review"] = review_notes(nb, handed_out)
    job["version"] = str((nb.metadata.get("course") or {}).get("version", ""))[:80]
    job["cells"] = [c.source for c in _code_cells(nb)]
    job["exercise_cells"] = exercise_cells(nb, exercises)
    # An exercise cell left as it was handed out (`raise NotImplementedError`) is not attempted:
    # nothing of it needs checking (a kernel's check alone costs a process and a compiler).
    given = [c.source for c in _code_cells(handed_out)]
    job["handed"] = given
    handed = {i: given[n] for i, n in exercise_cells(handed_out, exercises).items()}
    job["untouched"] = {i for i, n in job["exercise_cells"].items()
                        if job["cells"][n].strip() == handed.get(i, "").strip() and "NotImplementedError" in handed[i]}
    job["inside"], job["across"], job["kernels"] = _where_checked(exercises)
    return job


@functools.lru_cache(maxsize=None)
def _can_compile_kernels():
    """Whether numba can compile kernels for a GPU here (NVVM is installed): a learner's kernel is
    run outside the notebook's process only once it has compiled."""
    from course.kernels import compile as gpu

    return gpu.available()[0]


def _where_checked(exercises):
    """([(id, name)] checked in the notebook's kernel, [(id, name, names to remove)] checked across
    the sandbox's wall, {ids of those that are kernels}), from the checks as the grader loaded them.
    A kernel is checked across only where it can be compiled for a GPU first."""
    from course.exercises import _core

    inside, across, kernels = [], [], set()
    for exercise_id, name in exercises:
        try:
            entry = _core.entry(exercise_id)
        except KeyError:
            inside.append((exercise_id, name))  # no check: the kernel reports it as the notebook has it
            continue
        if entry.inside or (entry.kernel and not _can_compile_kernels()):
            inside.append((exercise_id, name))
        else:
            across.append((exercise_id, name, entry.forbid))
            if entry.kernel:
                kernels.add(exercise_id)
    return inside, across, kernels


def _read(path):
    """The bytes of a regular file, read without following a symbolic link or waiting on a FIFO or
    a device; an OSError saying why not otherwise."""
    if os.path.isdir(path) and not os.path.islink(path):
        folder = Path(path)
        deeper = not any(folder.glob("*.ipynb")) and any(folder.glob("*/*.ipynb"))
        return OSError(f"it is a folder: give the notebooks in it ({folder.as_posix()}/{'*/' if deeper else ''}*.ipynb)")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as err:
        if os.path.islink(path):
            return OSError("it is a symbolic link (grade the file itself)")
        if err.errno == errno.ENOENT:
            return OSError("there is no such file (a misspelt name, or a pattern that matched nothing?)")
        return err
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return OSError("it is not a regular file")
        if info.st_size > LARGEST:
            return OSError(f"it is larger than {LARGEST / 2**20:g} MB")
        chunks, size = [], 0
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
            size += len(chunk)
            if size > LARGEST:
                return OSError(f"it is larger than {LARGEST / 2**20:g} MB")
        return b"".join(chunks)
    except OSError as err:
        return err
    finally:
        os.close(fd)


def printable(text):
    """`text` with every control character written as an escape: a file name or an error message
    cannot move the cursor, clear the line, or start a new row on the instructor's terminal."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))


def grade_one(path, time_limit=300, lesson=None, sandbox=True, memory=MEMORY_GIB):
    """Grade one notebook; return (status, {exercise id: outcome})."""
    job = _prepare(path, _read(path), lesson_notebooks() if lesson is None else [], lesson)
    if sandbox and sandbox_problem() is not None:
        raise SystemExit(f"grading refuses to run without a sandbox: {sandbox_problem()}; "
                         f"pass sandbox=False for a notebook you trust")
    use_sandbox = sandbox
    with _undumpable():
        return _grade_job(job, time_limit, use_sandbox, hide={Path(path).resolve().parent, Path.cwd()},
                          sources=_sources(), memory=memory)


def _grade_across(job, exercises, time_limit, sandbox, hide, sources):
    """{id: (outcome, message)}: the learner's code answering in a sandboxed process of its own,
    the checks run in a process outside it (course/instructor/remote.py)."""
    if not exercises:
        return {}
    from .instructor import remote

    work, env = _workspace(sandbox)
    try:
        return remote.grade_across(job, exercises, sources=sources, env=env, work=work,
                                   sandbox_command=_sandbox_command(hide, course_source=False) if sandbox else None,
                                   kernel_command=_sandbox_command(hide) if sandbox else (),
                                   time_limit=time_limit, stop=_stop_everything)
    finally:
        _remove(work)


def _grade_job(job, time_limit, sandbox, hide, sources, memory, messages=None):
    """(status, {id: outcome}) of one submission; `messages`, a dict, gets what each check said."""
    from course.exercises import _core

    outcomes = {i: "not run" for i, _ in job["exercises"]}
    messages = {} if messages is None else messages
    if "problem" in job:
        messages.update({i: f"[{i}] not run: {job['problem']}" for i in outcomes})
        return printable(job["problem"])[:PEEK], outcomes
    # The exercises checked across the wall are answered while the notebook runs (for its status
    # and the checks that stay in its kernel); only those whose own cell ran then count.
    cells = job["exercise_cells"]
    answered = [(i, name, strip) for i, name, strip in job["across"]
                if cells.get(i) is not None and i not in job["untouched"]]
    across = {}
    worker = threading.Thread(target=lambda: across.update(
        _grade_across(job, answered, time_limit, sandbox, hide, sources["course"])), daemon=True)
    worker.start()
    try:
        status, inside, ran = _run({**job, "sources": sources["checks"], "course": sources["course"], "memory": memory},
                                   time_limit, sandbox, hide)
    finally:
        worker.join()
    outcomes.update(inside)
    if ran == len(job["cells"]):
        outcomes.update({i: "not attempted" for i, _, _ in job["across"] if cells.get(i) is None})
    if not status.startswith("timed out"):
        outcomes.update({i: outcome for i, (outcome, _) in across.items() if cells[i] < ran})
        messages.update({i: message for i, (_, message) in across.items() if cells[i] < ran})
        for i, _, _ in job["across"]:
            if i in job["untouched"] and cells[i] < ran:
                outcomes[i] = "not attempted"
                messages[i] = _core.not_attempted(i)  # what its check says of the handed-out stub
    for i, outcome in outcomes.items():
        if i in messages:
            continue
        if outcome == "not run":
            messages[i] = f"[{i}] not run: the notebook stopped before this exercise's cell ({status[:120]})"
        elif outcome == "not attempted" and cells.get(i) is None:
            messages[i] = f"[{i}] not attempted: no cell of the notebook checks it"
        else:
            messages[i] = f"[{i}] {outcome} (checked in the notebook's own kernel)"
    status = printable(" ".join(status.split()))[:PEEK]  # one line, however long the error message was
    if job["review"]:
        more = f"; and {len(job['review']) - 3} more" if len(job["review"]) > 3 else ""
        status = f"{status}; review by hand: {'; '.join(job['review'][:3])}{more}"
    return status, outcomes


def grade(paths, out, time_limit=300, lesson=None, sandbox=True, jobs=1, memory=MEMORY_GIB, feedback=True,
          records=None):
    """Grade notebooks and write one CSV row per notebook as each is graded; return the rows.

    Every submission is read before any runs, so what one does to another's file changes nothing.
    `sandbox=True` uses bubblewrap where it works, and says so once when it does not. With
    `jobs` > 1, that many notebooks run at once and rows come in the order they finish. Each kernel
    may use `memory` GiB of address space (0: no limit). `feedback`: a folder for one HTML page per
    submission, with each exercise's outcome and what its check said (never the full answer); True
    puts it beside the CSV (`grades-feedback/` for `grades.csv`), False writes none. `out=None`
    writes no CSV. `records`: a file to which each submission's full result is appended as a line
    of JSON as soon as it is graded (what the gradebook, course/gradebook/, is built from).
    """
    from concurrent.futures import ThreadPoolExecutor, as_completed

    paths = [Path(p) for p in paths]
    modified = [_modified(p) for p in paths]  # before any submission runs, like their bytes
    copies = [_read(p) for p in paths]
    sources = _sources()  # once, before any submission runs
    lessons = lesson_notebooks() if lesson is None else []
    submissions = [_prepare(p, data, lessons, lesson) for p, data in zip(paths, copies)]
    ids = list(dict.fromkeys(i for job in submissions for i, _ in job["exercises"]))

    problem = sandbox_problem() if sandbox else "it was turned off"
    if problem and sandbox:
        raise SystemExit(f"grading refuses to run without a sandbox: {problem}. Install bubblewrap "
                         f"(apt-get install bubblewrap), or grade a class you trust with --no-sandbox")
    if problem:
        print(f"running without a sandbox ({problem}): each submission can read and write what this user can, "
              f"stop your processes and change the grading of the submissions after it.")
    hide = {p.resolve().parent for p in paths} | {Path.cwd()}
    hide |= {Path(f).resolve().parent for f in (out, records) if f is not None}
    if feedback is True and out is not None:
        feedback = Path(out).with_name(Path(out).stem + "-feedback")
    feedback = Path(feedback) if feedback else None
    if feedback is not None:
        feedback.mkdir(parents=True, exist_ok=True)
        hide.add(feedback.resolve())
    taken = set()  # feedback file names given out, so two submissions never share one

    def one(path, job, when):
        start = time.monotonic()
        said = {}
        try:
            status, outcomes = _grade_job(job, time_limit, problem is None, hide, sources, memory, said)
        except Exception as err:  # a bug of ours must not cost the rows still to come
            status = printable(f"grading failed: {type(err).__name__}: {err}")[:PEEK]
            outcomes = {i: "not run" for i, _ in job["exercises"]}
        passed = sum(v == "passed" for v in outcomes.values())
        row = {"notebook": printable(path), "status": status, "passed": passed, "total": len(outcomes), **outcomes}
        if "problem" in job:
            row[UNGRADED] = True  # not a column: the command's exit status says it
        record = submission_record(path, job, row, outcomes, said, when)
        if feedback is not None:
            write_feedback_page(feedback / _page_name(path, taken), record)
        return row, record, time.monotonic() - start

    rows = []
    with contextlib.ExitStack() as stack:
        stack.enter_context(_undumpable())
        f = stack.enter_context(open(out, "w", newline="")) if out is not None else io.StringIO()
        log = stack.enter_context(open(records, "a", encoding="utf-8")) if records is not None else io.StringIO()
        pool = stack.enter_context(ThreadPoolExecutor(max(1, jobs)))
        writer = csv.DictWriter(f, fieldnames=["notebook", "status", "passed", "total"] + ids, restval="",
                                extrasaction="ignore")
        writer.writeheader()
        f.flush()
        # Byte-identical submissions of one lesson (the hand-out returned untouched, a copy) are
        # graded once: the same code gets the same verdict, and each still has its own row.
        same, first = {}, {}
        for n, (data, job) in enumerate(zip(copies, submissions)):
            if isinstance(data, bytes) and "problem" not in job:
                leader = first.setdefault((hashlib.sha256(data).digest(), str(job["lesson"])), n)
                if leader != n:
                    same.setdefault(leader, []).append(n)
        followers = {m for found in same.values() for m in found}
        running = {pool.submit(one, paths[n], submissions[n], modified[n]): n
                   for n in range(len(paths)) if n not in followers}
        done_count = 0
        for done in (list(running) if jobs <= 1 else as_completed(running)):
            row, record, seconds = done.result()
            graded = [(paths[running[done]], row, record, f"{seconds:.0f} s")]
            for m in same.get(running[done], []):
                twin_row = {**row, "notebook": printable(paths[m])}
                twin = {**record, "notebook": twin_row["notebook"], "path": str(paths[m].resolve()), "modified": modified[m]}
                if feedback is not None:
                    write_feedback_page(feedback / _page_name(paths[m], taken), twin)
                graded.append((paths[m], twin_row, twin, f"the same file as {row['notebook']}: graded once"))
            for path, row, record, how in graded:
                done_count += 1
                writer.writerow(row)
                f.flush()
                log.write(json.dumps(record, sort_keys=True) + "\n")
                log.flush()
                rows.append(row)
                print(f"[{done_count}/{len(paths)}] {row['notebook']}: {row['status']}, {row['passed']}/{row['total']} "
                      f"passed ({how})", flush=True)
    _summary(rows, ids, out)
    return rows


def _modified(path):
    """When the file was last changed, as an ISO 8601 time in UTC (None where it cannot be read)."""
    import datetime

    try:
        seconds = os.lstat(path).st_mtime
    except OSError:
        return None
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).isoformat(timespec="seconds")


def submission_record(path, job, row, outcomes, said, modified):
    """What grading found out about one submission, as plain data (one line of the records file):
    enough to build every report of the gradebook again without running anything."""
    cells = job.get("cells", [])
    return {"notebook": str(row["notebook"]), "path": str(Path(path).resolve()),
            "lesson": job["lesson"].stem if "lesson" in job else "",
            "exercises": [i for i, _ in job["exercises"]], "status": row["status"],
            "outcomes": dict(outcomes), "messages": {i: printable(said.get(i, ""))[:2000] for i in outcomes},
            "answers": {i: cells[n] for i, n in job.get("exercise_cells", {}).items() if n < len(cells)},
            "modified": modified, "version": job.get("version", ""), "ungraded": "problem" in job}


_NAMING = threading.Lock()


def page_name(words, taken):
    """A file name for a feedback page made of `words`, never one given out before (in any case:
    some file systems do not tell Ada.html from ada.html)."""
    base = re.sub(r"[^A-Za-z0-9._-]+", "_", "__".join(words)).strip("_") or "feedback"
    with _NAMING:  # submissions are graded in several threads at once
        name, n = f"{base}.html", 1
        while name.lower() in taken:
            n += 1
            name = f"{base}-{n}.html"
        taken.add(name.lower())
    return name


def _page_name(path, taken):
    return page_name((Path(path).parent.name, Path(path).stem), taken)


def feedback_html(record, heading=None):
    """The body of a feedback page for one submission: what was graded, and for each exercise its
    outcome and what the check said (the input it failed on and the hint; grading never adds the
    full answer)."""
    import html

    outcomes = record["outcomes"]
    passed = sum(v == "passed" for v in outcomes.values())
    name = Path(record["notebook"]).name
    lines = [f"<h2>{html.escape(heading or name)}</h2>",
             f"<p>Submitted as {html.escape(printable(record['notebook']))}. "
             f"Notebook run: {html.escape(str(record['status']))}.</p>",
             f"<p>{passed} of {len(outcomes)} exercises passed.</p>",
             "<table>", "<tr><th>Exercise</th><th>Outcome</th><th>What the check said</th></tr>"]
    for exercise_id, outcome in outcomes.items():
        message = printable(record["messages"].get(exercise_id, ""))[:2000]
        lines.append(f"<tr><td>{html.escape(exercise_id)}</td><td>{html.escape(outcome)}</td>"
                     f"<td>{html.escape(message)}</td></tr>")
    lines.append("</table>")
    return lines


def html_page(title, body):
    import html

    return "\n".join(["<!doctype html>", '<meta charset="utf-8">', f"<title>{html.escape(title)}</title>",
                      *body]) + "\n"


def write_feedback_page(path, record):
    name = Path(record["notebook"]).name
    Path(path).write_text(html_page(f"Feedback on {name}", feedback_html(record)), encoding="utf-8")


def _summary(rows, ids, out):
    failed = sum(not r["status"].startswith("ok") for r in rows)
    review = sum("review by hand" in r["status"] for r in rows)
    print(f"graded {len(rows)} notebook{'' if len(rows) == 1 else 's'}: {len(rows) - failed} ran to the end, "
          f"{failed} failed to run"
          + (f", {review} to review by hand (see their status)" if review else ""))
    for i in ids:
        scored = [r[i] == "passed" for r in rows if i in r]
        print(f"  {i}: {sum(scored) / len(scored):.2f} passed on average ({sum(scored)} of {len(scored)})")
    if out is not None:
        print(f"wrote {out}")
