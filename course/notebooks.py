"""Tools for the notebooks themselves: build, re-execute, list, and point at a fork.

    python -m course notebooks [PATHS...]   re-execute notebooks in place, top to bottom, fresh kernel
    python -m course notebooks --tags-only [PATHS...]
                                            only turn `# NBVAL_...` comment lines into cell tags
    python -m course colab owner/name       rewrite badges and install cells for a fork
    python -m course syllabus               rewrite the syllabus table in README.md
"""

import os
import re
import sys
from pathlib import Path

from . import _repo

ROOT = Path(__file__).resolve().parent.parent  # the repository, when the course is installed with -e
NOTEBOOK_DIRS = ("notebooks", "solutions")

INSTALL_CELL = """\
# Installs the course on Colab, and wherever it is missing (Binder, Kaggle, VS Code, any Jupyter);
# elsewhere this cell does nothing. Offline, COURSE_SOURCE can name a copy: a clone or a wheel.
import importlib.util
import os
import pathlib
import subprocess
import sys

if "google.colab" in sys.modules or importlib.util.find_spec("course") is None:
    source = os.environ.get("COURSE_SOURCE") or "{git_url}"
    if os.path.exists(source):  # a clone or a wheel on this machine
        source = pathlib.Path(source).resolve().as_uri()
    # On a GPU machine, the `gpu` extra also brings the CUDA libraries numba needs to compile kernels.
    extra = "[gpu]" if os.path.exists("/dev/nvidia0") else ""
    if subprocess.run([sys.executable, "-m", "pip", "install", "-q", f"course{{extra}} @ {{source}}"]).returncode:
        print(f"Could not install the course from {{source}} (is this machine offline?). Copy a clone or a wheel of "
              f"it here, then run this cell again after `%env COURSE_SOURCE=/path/to/that/copy`.")
    importlib.invalidate_caches()"""

BADGE_IMAGE = "https://colab.research.google.com/assets/colab-badge.svg"
BADGE = "[![Open In Colab](" + BADGE_IMAGE + ")]({url})"
BADGE_RE = re.compile(r"\[!\[Open In Colab\]\([^)]*\)\]\(https://colab\.research\.google\.com/github/[^)]*\)")

# nbval reads its markers from a comment line in a cell or from the cell's tags. The course keeps
# them in tags, which a learner never sees in a lesson; authors may still start a cell with the
# comment, and building or re-executing a notebook turns it into the tag (nbval's own tag names).
MARKER_TAGS = {
    "NBVAL_IGNORE_OUTPUT": "nbval-ignore-output",
    "NBVAL_CHECK_OUTPUT": "nbval-check-output",
    "NBVAL_SKIP": "nbval-skip",
    "NBVAL_RAISES_EXCEPTION": "nbval-raises-exception",
    "PYTEST_VALIDATE_IGNORE_OUTPUT": "nbval-ignore-output",
}
# A line that is only a comment naming a marker, as nbval finds them (`#NBVAL_SKIP` counts too).
MARKER_LINE = re.compile(r"^[ \t]*#[ \t]*(NBVAL_[A-Z_]+|PYTEST_VALIDATE_IGNORE_OUTPUT)[ \t]*$")

# Variables that make runs repeatable and quiet in every kernel started from here.
KERNEL_ENV = {"PYTHONHASHSEED": "0", "COURSE_QUIET": "1", "TQDM_DISABLE": "1"}


def repo_root():
    if not (ROOT / "notebooks").is_dir():
        raise SystemExit("the notebooks are not here: run this from a clone of the course repository "
                         "(installed with `pip install -e .`, as `make` does)")
    return ROOT


def notebooks_under(folder):
    """Every notebook under `folder`, sorted, leaving out hidden folders and files: JupyterLab
    saves a copy of each notebook it opens in `.ipynb_checkpoints/`, and those are no lessons."""
    folder = Path(folder)
    found = []
    for top, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        found += [Path(top) / f for f in files if f.endswith(".ipynb") and not f.startswith(".")]
    return sorted(found)


def lesson_paths(root=None, kind="notebooks"):
    """The course's notebooks: the lessons (`kind="notebooks"`) or the worked solutions
    (`kind="solutions"`), sorted, without JupyterLab's checkpoint copies. Everything that lists
    notebooks (tests, `make notebooks`, assign, grade, the syllabus) goes through here."""
    if kind not in NOTEBOOK_DIRS:
        raise ValueError(f"kind is one of {', '.join(map(repr, NOTEBOOK_DIRS))}, not {kind!r}")
    root = Path(root) if root is not None else repo_root()
    return notebooks_under(root / kind)


def part_folders(root=None, kind="notebooks"):
    """The part folders (`notebooks/1-micrograd`, ...) that hold at least one notebook."""
    return sorted({p.parent for p in lesson_paths(root, kind)})


def all_notebooks(root=None):
    """Lessons and solutions together, sorted."""
    return sorted(p for kind in NOTEBOOK_DIRS for p in lesson_paths(root, kind))


def install_source(repo=None, ref=_repo.BRANCH):
    """The first code cell of every lesson: installs the course from `repo` at `ref` where it is missing."""
    return INSTALL_CELL.format(git_url=_repo.git_url(repo, ref))


_INSTALL_FROM = re.compile(r'"git\+https://[^"\n]*"')
# The install cell lessons had before this one (it installed on Colab only): a notebook downloaded
# then is still handed in with it.
FORMER_INSTALL_CELL = """\
# On Colab, install the course package (elsewhere this cell does nothing).
import os
import subprocess
import sys

if "google.colab" in sys.modules:
    url = ""
    # On a GPU runtime, the `gpu` extra also brings the CUDA libraries numba needs to compile kernels.
    package = f"course[gpu] @ {url}" if os.path.exists("/dev/nvidia0") else url
    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", package])"""


def is_install_cell(source):
    """Whether `source` is the install cell (this one or the one before it), from whichever
    repository and commit it installs."""
    return _INSTALL_FROM.sub('""', source.strip()) in (_INSTALL_FROM.sub('""', install_source()), FORMER_INSTALL_CELL)


def badge(relpath, repo=None, branch=_repo.BRANCH):
    return BADGE.format(url=_repo.colab_url(relpath, repo=repo or _repo.REPO, branch=branch))


def markers_to_tags(nb, where="the notebook"):
    """Move every nbval marker comment of the code cells of `nb` into the cell's tags, in place.

    Only the marker lines go, and only the tags they name are added (after any tags already
    there): running it twice changes nothing the second time. Returns how many cells changed."""
    changed = 0
    for n, cell in enumerate((c for c in nb.cells if c.cell_type == "code"), 1):
        lines = cell.source.split("\n")
        markers = [m.group(1) for m in map(MARKER_LINE.match, lines) if m]
        if not markers:
            continue
        unknown = [m for m in markers if m not in MARKER_TAGS]
        if unknown:
            raise ValueError(f"code cell {n} of {where} has the marker {unknown[0]}, which nbval does not "
                             f"know: the markers are {', '.join(sorted(MARKER_TAGS))}")
        tags = list(cell.metadata.get("tags", []))
        tags += [t for t in dict.fromkeys(MARKER_TAGS[m] for m in markers) if t not in tags]
        cell.metadata["tags"] = tags
        cell.source = "\n".join(line for line in lines if not MARKER_LINE.match(line))
        changed += 1
    return changed


def convert_markers(path):
    """Turn the marker comments of the notebook at `path` into cell tags without running it; the
    file is rewritten only when something changed. Returns how many cells changed."""
    import nbformat

    nb = nbformat.read(str(path), as_version=4)
    changed = markers_to_tags(nb, where=str(path))
    if changed:
        nbformat.write(nb, str(path))
    return changed


def build(path, cells):
    """Write a notebook (not executed) from a list of ("md" | "code", source) pairs.

    The Colab badge goes on top of the first markdown cell and the install cell becomes the
    first code cell, so every notebook starts the same way; a `# NBVAL_...` first line becomes the
    cell's tag. Run `make notebooks` afterwards.
    """
    import nbformat

    path = Path(path).resolve()
    rel = path.relative_to(repo_root()).as_posix()
    nb = nbformat.v4.new_notebook()
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }
    out = []
    first_md = True
    install_done = False
    for kind, source in cells:
        source = source.strip("\n")
        if kind == "md":
            if first_md:
                source = badge(rel) + "\n\n" + source
                first_md = False
            out.append(nbformat.v4.new_markdown_cell(source))
        elif kind == "code":
            if not install_done:
                out.append(nbformat.v4.new_code_cell(install_source()))
                install_done = True
            out.append(nbformat.v4.new_code_cell(source))
        else:
            raise ValueError(f"a cell is 'md' or 'code', not {kind!r}")
    nb.cells = out
    for i, cell in enumerate(nb.cells):  # stable ids: no random churn in the diffs
        cell["id"] = f"cell-{i}"
    markers_to_tags(nb, where=rel)
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))
    return path


def execute(path, timeout=600):
    """Run a notebook top to bottom in a fresh kernel, in its own folder, and save it with outputs."""
    import nbformat
    from nbclient import NotebookClient

    path = Path(path)
    nb = nbformat.read(str(path), as_version=4)
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"cell-{i}"
        cell.metadata.pop("execution", None)
    markers_to_tags(nb, where=str(path))
    # Executed as Run All runs it: the first cell that raises stops the notebook (a lesson shows an
    # error with try/except and a printed message, never a raising cell).
    os.environ.update(KERNEL_ENV)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", record_timing=False,
                            resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = _merge_streams(cell.outputs)
    nb.metadata.pop("widgets", None)
    nb.metadata["language_info"] = {"name": "python"}  # the version would differ between machines
    nbformat.write(nb, str(path))


def _merge_streams(outputs):
    """Join consecutive prints to the same stream: the kernel may split one print in two, and
    the saved file should not change when the text does not."""
    merged = []
    for out in outputs:
        prev = merged[-1] if merged else None
        if (prev is not None and out.get("output_type") == "stream" and prev.get("output_type") == "stream"
                and prev.get("name") == out.get("name")):
            prev["text"] = prev["text"] + out["text"]
        else:
            merged.append(out)
    return merged


def expand_paths(paths):
    """The notebooks that paths name: a folder stands for the notebooks under it (never the
    checkpoint copies in it); no paths stands for every notebook of the course."""
    if not paths:
        return all_notebooks()
    expanded = []
    for t in map(Path, paths):
        expanded += notebooks_under(t) if t.is_dir() else [t]
    return expanded


def cmd_notebooks(paths, tags_only=False):
    import time

    expanded = expand_paths(paths)
    if tags_only:
        changed = {p: convert_markers(p) for p in expanded}
        for p, n in changed.items():
            if n:
                print(f"{n:4d} cells  {_shown(p)}")
        print(f"nbval markers as cell tags: {sum(changed.values())} cells in "
              f"{sum(1 for n in changed.values() if n)} of {len(expanded)} notebooks changed")
        return
    for p in expanded:
        start = time.perf_counter()
        execute(p)
        print(f"{time.perf_counter() - start:6.1f} s  {_shown(p)}")


def _shown(path):
    try:
        return path.resolve().relative_to(Path.cwd())
    except ValueError:
        return path


def set_repo(repo):
    """Point every badge and install cell, the README and course/_repo.py at `repo` (owner/name)."""
    import nbformat

    if not re.fullmatch(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+", repo):
        raise SystemExit(f"REPO must look like owner/name, got {repo!r}")
    root = repo_root()
    old = _repo.REPO
    repo_file = root / "course" / "_repo.py"
    text = repo_file.read_text()
    repo_file.write_text(re.sub(r'^REPO = ".*"$', f'REPO = "{repo}"', text, flags=re.M))
    for name in ("README.md", "pyproject.toml"):
        f = root / name
        f.write_text(f.read_text().replace(f"github.com/{old}", f"github.com/{repo}")
                     .replace(f"mybinder.org/v2/gh/{old}/", f"mybinder.org/v2/gh/{repo}/"))
    for p in all_notebooks(root):
        nb = nbformat.read(str(p), as_version=4)
        rel = p.relative_to(root).as_posix()
        for cell in nb.cells:
            if cell.cell_type == "markdown" and BADGE_RE.search(cell.source):
                cell.source = BADGE_RE.sub(badge(rel, repo).replace("\\", "\\\\"), cell.source, count=1)
                break
        for cell in nb.cells:
            if cell.cell_type == "code":
                cell.source = install_source(repo)
                break
        nbformat.write(nb, str(p))
    _repo.REPO = repo
    print(f"badges, install cells and links now point at github.com/{repo}")


def hub_links(hub, chosen=(), repo=None, branch=None, kind="notebooks", app="lab"):
    """[(lesson title, JupyterHub nbgitpuller link)] for the lessons chosen by part ("1") or lesson
    ("4.2"), all of them by default."""
    if not re.match(r"https?://[^/\s]+", hub):
        raise SystemExit(f"the hub's address starts with https:// (https://hub.example.edu), not {hub!r}")
    root = repo_root()
    paths = lesson_paths(root, kind)
    picked = [p for p in paths if not chosen or any(p.stem.split("-", 1)[0] == c or p.parent.name.split("-", 1)[0] == c
                                                    for c in map(str, chosen))]
    unknown = [c for c in chosen if not any(p.stem.split("-", 1)[0] == c or p.parent.name.split("-", 1)[0] == c
                                            for p in paths)]
    if unknown:
        raise SystemExit(f"no part or lesson {', '.join(unknown)}: name parts (1) or lessons (4.2)")
    # The course's own repository has notebooks/ and solutions/; a hand-out repository, the parts'
    # folders at its top, as `make assignment` writes them.
    where = (lambda p: p.relative_to(root).as_posix()) if repo is None else (lambda p: f"{p.parent.name}/{p.name}")
    return [(title_of(p), _repo.hub_link(hub, where(p), repo=repo, branch=branch or _repo.BRANCH, app=app))
            for p in picked]


def title_of(path):
    import nbformat

    nb = nbformat.read(str(path), as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return path.stem


SYLLABUS_START = "<!-- syllabus: made by `python -m course syllabus` -->"
SYLLABUS_END = "<!-- end of syllabus -->"
PART_NAMES = {
    "1-micrograd": "Part 1: micrograd",
    "2-tensors": "Part 2: tensors",
    "3-minitf": "Part 3: a mini TensorFlow",
    "4-gpt": "Part 4: minGPT",
    "5-mamba": "Part 5: Mamba",
    "6-kernels": "Part 6: GPU kernels",
}


def syllabus_table(root=None):
    root = Path(root) if root is not None else repo_root()
    rows = ["| part | lesson | open | solutions |", "|---|---|---|---|"]
    lessons = lesson_paths(root, "notebooks")
    for part_dir in part_folders(root, "notebooks"):
        part = PART_NAMES.get(part_dir.name, part_dir.name)
        for nb in (p for p in lessons if p.parent == part_dir):
            rel = nb.relative_to(root).as_posix()
            sol = root / "solutions" / part_dir.name / nb.name
            sol_link = f"[solutions](solutions/{part_dir.name}/{nb.name})" if sol.exists() else ""
            rows.append(f"| {part} | [{title_of(nb)}]({rel}) | {badge(rel)} | {sol_link} |")
            part = ""
    return "\n".join(rows)


def write_syllabus():
    readme = repo_root() / "README.md"
    text = readme.read_text()
    if SYLLABUS_START not in text or SYLLABUS_END not in text:
        raise SystemExit("README.md has no syllabus markers")
    head, rest = text.split(SYLLABUS_START, 1)
    _, tail = rest.split(SYLLABUS_END, 1)
    readme.write_text(head + SYLLABUS_START + "\n" + syllabus_table() + "\n" + SYLLABUS_END + tail)
    print("README.md syllabus rewritten")


if __name__ == "__main__":
    cmd_notebooks(sys.argv[1:])
