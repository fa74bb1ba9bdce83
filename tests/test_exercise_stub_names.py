"""Every exercise stub of a lesson has a name of its own: a stub that reuses a name the lesson defined
earlier replaces the lesson's function, so re-running a lesson cell after the exercises raises
NotImplementedError, and a wrong answer silently changes the lesson's own results."""

import ast
from pathlib import Path

import nbformat
import pytest

pytestmark = pytest.mark.foundation
ROOT = Path(__file__).resolve().parent.parent
LESSONS = sorted((ROOT / "notebooks").rglob("*.ipynb"))


def _defined(tree):
    """Names bound at the top level of a cell: functions, classes, assignments, imports, loop targets."""
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.For, ast.With)):
            targets = (node.targets if isinstance(node, ast.Assign) else
                       [item.optional_vars for item in node.items if item.optional_vars] if isinstance(node, ast.With)
                       else [node.target])
            for target in targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return names


def _stubs(tree):
    """The functions and classes of a cell whose body raises NotImplementedError (an exercise stub)."""
    found = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            raises = [n for n in ast.walk(node) if isinstance(n, ast.Raise) and n.exc is not None]
            if any("NotImplementedError" in ast.unparse(r.exc) for r in raises):
                found.append(node.name)
    return found


def _cells(path):
    nb = nbformat.read(str(path), as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            source = "\n".join(line for line in cell.source.splitlines() if not line.lstrip().startswith(("%", "!")))
            yield ast.parse(source)


def clashes(path):
    """(stub name, exercise id) for every stub that reuses a name bound by an earlier cell."""
    earlier, found = set(), []
    for tree in _cells(path):
        checks = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "check"]
        if checks:
            exercise = ast.literal_eval(checks[0].args[0]) if checks[0].args else "?"
            found += [(name, exercise) for name in _stubs(tree) if name in earlier]
        earlier |= _defined(tree)
    return found


def test_the_detector_finds_a_reused_name(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("def ssm_kernel(A):\n    return A\n\nK = ssm_kernel(1)"),
                nbformat.v4.new_code_cell("def ssm_kernel(A):\n    raise NotImplementedError  # your code here\n\n\n"
                                          "check('5.1.3', ssm_kernel)"),
                nbformat.v4.new_code_cell("def fresh(A):\n    raise NotImplementedError\n\n\ncheck('5.1.4', fresh)")]
    path = tmp_path / "lesson.ipynb"
    nbformat.write(nb, str(path))
    assert clashes(path) == [("ssm_kernel", "5.1.3")]


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_exercise_stub_has_a_name_of_its_own(lesson):
    found = clashes(lesson)
    assert not found, (f"{lesson.name}: exercise stubs reuse names the lesson defined before them: "
                       + ", ".join(f"{name} ({exercise})" for name, exercise in found))
