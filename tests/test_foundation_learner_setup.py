"""What a learner meets before the first lesson: `make lab` shows notebooks/ and solutions/, every
listed make target has a recipe and a line in the README, `make doctor` says PyTorch is optional, and
progress bars can draw as widgets in JupyterLab."""

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from course import doctor

pytestmark = pytest.mark.foundation
ROOT = Path(__file__).resolve().parent.parent
MAKEFILE = (ROOT / "Makefile").read_text()
TARGETS = re.findall(r"^([a-z-]+):[^=\n]*## ", MAKEFILE, flags=re.M)


def _dry_run(*args):
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    out = subprocess.run(["make", "-n", *args], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_every_documented_target_has_a_recipe_and_a_readme_line():
    readme = (ROOT / "README.md").read_text()
    assert "grade" in TARGETS and "lab" in TARGETS
    for target in TARGETS:
        if target not in ("help", "setup", "clean"):
            assert f"`make {target}" in readme, f"README's Commands table lacks `make {target}`"


def test_make_lab_opens_the_top_of_the_course():
    lines = [line for line in _dry_run("lab").splitlines() if "-m course lab" in line]
    assert lines, "make lab does not start JupyterLab through `python -m course lab`"
    from course import lab

    command = lab.command(ROOT)
    assert command[1:3] == ["-m", "jupyterlab"] and f"--ServerApp.root_dir={ROOT}" in command
    assert (ROOT / "notebooks").is_dir() and (ROOT / "solutions").is_dir()


def test_make_grade_runs_the_grader_with_the_given_notebooks_and_csv():
    # the notebooks after `--`: a file named like an option is a notebook too
    assert "-m course grade --out grades.csv -- a.ipynb b.ipynb" in _dry_run("grade", "NB=a.ipynb b.ipynb")
    assert "--out marks.csv" in _dry_run("grade", "NB=a.ipynb", "OUT=marks.csv")


def test_doctor_says_a_missing_pytorch_is_optional(monkeypatch, capsys):
    real = doctor._version
    monkeypatch.setattr(doctor, "_version",
                        lambda name: "not importable (ModuleNotFoundError)" if name == "torch" else real(name))
    monkeypatch.setattr(doctor, "_probe", lambda: (None, "not probed in this test"))
    doctor.main()
    torch_line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("torch"))
    assert "optional" in torch_line and "reference" in torch_line


def test_progress_bars_can_draw_as_widgets_in_the_lab():
    dev = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]
    assert any(spec.startswith("ipywidgets") for spec in dev), "tqdm.auto needs ipywidgets in JupyterLab"
    assert "ipywidgets" in (ROOT / "environment.yml").read_text()


def test_a_progress_bar_in_a_kernel_is_a_widget_without_a_warning(monkeypatch):
    """As in JupyterLab: tqdm.auto in a kernel draws a widget and writes nothing to stderr (the tests
    themselves set TQDM_DISABLE=1, which this test lifts for its own kernel)."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "from tqdm.auto import tqdm\nfor _ in tqdm(range(3)):\n    pass")])
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    outputs = nb.cells[0].outputs
    assert not [o for o in outputs if o.get("output_type") == "stream" and o.get("name") == "stderr"], outputs
    assert any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in outputs), outputs
