"""Tools for the notebooks themselves: build, re-execute, list, and point at a fork.

    python -m course notebooks [PATHS...]   re-execute notebooks in place, top to bottom, fresh kernel
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
# On Colab, install the course package (elsewhere this cell does nothing).
import os
import subprocess
import sys

if "google.colab" in sys.modules:
    url = "{git_url}"
    # On a GPU runtime, the `gpu` extra also brings the CUDA libraries numba needs to compile kernels.
    package = f"course[gpu] @ {{url}}" if os.path.exists("/dev/nvidia0") else url
    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", package])"""

BADGE_IMAGE = "https://colab.research.google.com/assets/colab-badge.svg"
BADGE = "[![Open In Colab](" + BADGE_IMAGE + ")]({url})"
BADGE_RE = re.compile(r"\[!\[Open In Colab\]\([^)]*\)\]\(https://colab\.research\.google\.com/github/[^)]*\)")

# Variables that make runs repeatable and quiet in every kernel started from here.
KERNEL_ENV = {"PYTHONHASHSEED": "0", "COURSE_QUIET": "1", "TQDM_DISABLE": "1"}


def repo_root():
    if not (ROOT / "notebooks").is_dir():
        raise SystemExit("the notebooks are not here: run this from a clone of the course repository "
                         "(installed with `pip install -e .`, as `make` does)")
    return ROOT


def all_notebooks(root=None):
    root = Path(root or repo_root())
    found = []
    for d in NOTEBOOK_DIRS:
        found += [p for p in (root / d).rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts]
    return sorted(found)


def install_source(repo=None):
    return INSTALL_CELL.format(git_url=_repo.git_url(repo or _repo.REPO))


def badge(relpath, repo=None):
    return BADGE.format(url=_repo.colab_url(relpath, repo=repo or _repo.REPO))


def build(path, cells):
    """Write a notebook (not executed) from a list of ("md" | "code", source) pairs.

    The Colab badge goes on top of the first markdown cell and the install cell becomes the
    first code cell, so every notebook starts the same way. Run `make notebooks` afterwards.
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


def cmd_notebooks(paths):
    import time

    targets = [Path(p) for p in paths] or all_notebooks()
    expanded = []
    for t in targets:
        expanded += sorted(t.rglob("*.ipynb")) if t.is_dir() else [t]
    for p in expanded:
        start = time.perf_counter()
        execute(p)
        try:
            shown = p.resolve().relative_to(Path.cwd())
        except ValueError:
            shown = p
        print(f"{time.perf_counter() - start:6.1f} s  {shown}")


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
        f.write_text(f.read_text().replace(f"github.com/{old}", f"github.com/{repo}"))
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
    root = Path(root or repo_root())
    rows = ["| part | lesson | open | solutions |", "|---|---|---|---|"]
    for part_dir in sorted((root / "notebooks").iterdir()):
        if not part_dir.is_dir():
            continue
        part = PART_NAMES.get(part_dir.name, part_dir.name)
        for nb in sorted(part_dir.glob("*.ipynb")):
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
