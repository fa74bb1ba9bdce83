"""The repository keeps its promises: the same dependencies for pip and conda, notebooks that start
the same way, one place for the repository's address, and a fork that can be pointed at in one go."""

import re
import shutil
import sys
from pathlib import Path

import nbformat
import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli", reason="Python 3.10 needs tomli to read pyproject.toml")

from course import _repo, notebooks

pytestmark = pytest.mark.foundation
ROOT = Path(__file__).resolve().parent.parent
CONDA_NAMES = {"graphviz": "python-graphviz"}  # the Python binding's name on conda-forge
# pip packages whose job a conda-forge package does: graphviz-pure's dot is conda-forge's graphviz.
CONDA_PROVIDES = {"graphviz-pure": "graphviz"}


def _name_and_floor(spec):
    found = re.match(r"\s*([A-Za-z0-9_.-]+)\s*(>=\s*[0-9.]+)?", spec)
    return found.group(1).lower(), (found.group(2) or "").replace(" ", "")


def test_environment_yml_lists_the_same_dependencies_as_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = project["dependencies"] + project["optional-dependencies"]["dev"]
    lines = [line.split("#")[0].strip() for line in (ROOT / "environment.yml").read_text().splitlines()]
    conda = dict(_name_and_floor(line[2:]) for line in lines if line.startswith("- ") and ":" not in line)
    for spec in wanted:
        name, floor = _name_and_floor(spec)
        if name in CONDA_PROVIDES:
            assert CONDA_PROVIDES[name] in conda, f"{name} is in pyproject.toml but {CONDA_PROVIDES[name]} is not in environment.yml"
            continue
        name = CONDA_NAMES.get(name, name)
        assert name in conda, f"{name} is in pyproject.toml but not in environment.yml"
        assert conda[name] == floor, f"{name}: pyproject.toml says {floor}, environment.yml says {conda[name]}"
    assert "graphviz" in conda, "environment.yml must bring graphviz's dot program"


def test_every_notebook_starts_with_the_colab_badge_and_install_cell():
    nbs = notebooks.all_notebooks(ROOT)
    assert nbs, "no notebooks found"
    for path in nbs:
        nb = nbformat.read(str(path), as_version=4)
        rel = path.relative_to(ROOT).as_posix()
        first_md = next(c for c in nb.cells if c.cell_type == "markdown")
        assert notebooks.badge(rel) in first_md.source, f"{rel}: badge missing or pointing elsewhere"
        first_code = next(c for c in nb.cells if c.cell_type == "code")
        assert first_code.source == notebooks.install_source(), f"{rel}: first code cell is not the install cell"
        assert 'if "google.colab" in sys.modules or importlib.util.find_spec("course") is None' in first_code.source


def test_the_readme_lists_every_lesson_with_a_badge():
    readme = (ROOT / "README.md").read_text()
    for path in notebooks.all_notebooks(ROOT):
        if path.parts[-3] == "notebooks":
            rel = path.relative_to(ROOT).as_posix()
            assert notebooks.badge(rel) in readme, f"README's syllabus lacks {rel}: run `make syllabus`"


def test_the_repository_is_named_in_one_place():
    """Only course/_repo.py spells out the owner/name; everything else is made from it."""
    sources = [p for p in (ROOT / "course").rglob("*.py") if p.name != "_repo.py"]
    for p in sources:
        assert _repo.REPO not in p.read_text(), f"{p} repeats the repository name"


def test_make_colab_points_everything_at_a_fork(tmp_path, monkeypatch):
    for name in ("README.md", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    (tmp_path / "course").mkdir()
    shutil.copy(ROOT / "course" / "_repo.py", tmp_path / "course" / "_repo.py")
    lesson = notebooks.all_notebooks(ROOT)[0]
    rel = lesson.relative_to(ROOT)
    (tmp_path / rel).parent.mkdir(parents=True)
    shutil.copy(lesson, tmp_path / rel)
    monkeypatch.setattr(notebooks, "ROOT", tmp_path)
    monkeypatch.setattr(_repo, "REPO", _repo.REPO)  # restored after the test
    notebooks.set_repo("someone/fork")
    nb = nbformat.read(str(tmp_path / rel), as_version=4)
    text = "\n".join(c.source for c in nb.cells)
    assert "github.com/someone/fork" in text and "colab.research.google.com/github/someone/fork/" in text
    assert "dl-from-scratch" not in text
    assert 'REPO = "someone/fork"' in (tmp_path / "course" / "_repo.py").read_text()
    assert "github.com/someone/fork" in (tmp_path / "pyproject.toml").read_text()
    readme = (tmp_path / "README.md").read_text()
    assert _repo.binder_url(repo="someone/fork") in readme  # (the syllabus badges: `make colab` rewrites it)
    assert 'or "git+https://github.com/someone/fork@main"' in text  # the install cell
    with pytest.raises(SystemExit, match="owner/name"):
        notebooks.set_repo("not a repo")
