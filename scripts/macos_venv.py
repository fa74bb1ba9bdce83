"""Make a virtual environment, on Linux, with the numba, numba-cuda, llvmlite and NumPy that pip
picks for a Mac, so that part 6 can be tested the way a Mac learner gets it.

    python scripts/macos_venv.py .venv-mac [--platform macosx_14_0_arm64]

On macOS there is no wheel of NVIDIA's cuda-bindings, so pip falls back to the last numba-cuda that
does not require them (0.20.1 at the time of writing), which then refuses to import unless told
to use its ctypes bindings, and whose GPU target does not load with a newer numba. pip is asked
what it would install for the Mac (a dry run with --platform), and exactly those versions are
installed here; the course goes in without its dependencies, then the rest of what the tests need,
without the NVVM wheels (NVIDIA publishes none for macOS).
"""

import argparse
import json
import re
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
RESOLVED = ("numba", "numba-cuda", "llvmlite", "numpy")  # what pip is asked to pick as for the Mac
LEFT_OUT = ("nvidia-",)  # NVVM and friends: no macOS wheels
TEST_NEEDS = ("pytest", "pytest-xdist", "nbval", "ipykernel", "nbformat", "nbclient", "hypothesis", "psutil")


def _name(spec):
    return re.match(r"\s*([A-Za-z0-9_.-]+)", spec).group(1).lower()


def requirements():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    dev = project["optional-dependencies"]["dev"]
    return project["dependencies"], [s for s in dev if _name(s) in TEST_NEEDS]


def resolve_for(platform, python, specs):
    """{name: version} that pip would install on `platform` for these requirements."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--only-binary=:all:",
                        "--platform", platform, "--python-version", python, "--target", str(Path(tmp) / "t"),
                        "--report", str(report), *specs], check=True)
        installs = json.loads(report.read_text())["install"]
    return {item["metadata"]["name"].lower(): item["metadata"]["version"] for item in installs}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path)
    parser.add_argument("--platform", default="macosx_14_0_arm64")
    args = parser.parse_args(argv)

    core, tests = requirements()
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    wanted = [s for s in core if _name(s) in RESOLVED]
    picked = resolve_for(args.platform, python, wanted)
    pins = [f"{name}=={picked[name]}" for name in RESOLVED if name in picked]
    others = [s for s in core if _name(s) not in RESOLVED and not _name(s).startswith(LEFT_OUT)]
    print(f"pip picks for {args.platform}, Python {python}: {', '.join(pins)}"
          + (f" (and {', '.join(sorted(set(picked) - set(RESOLVED)))})" if set(picked) - set(RESOLVED) else ""))

    if not (args.path / "bin" / "python").exists() and not (args.path / "Scripts" / "python.exe").exists():
        venv.EnvBuilder(with_pip=True).create(args.path)
    py = args.path / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")
    pip = [str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, *pins, *others, *tests], check=True)
    subprocess.run([*pip, "--no-deps", "-e", str(ROOT)], check=True)
    found = subprocess.run([str(py), "-c", "import numba, importlib.metadata as m; "
                            "print(numba.__version__, m.version('numba-cuda'))"],
                           capture_output=True, text=True, check=True).stdout.split()
    print(f"{args.path}: numba {found[0]}, numba-cuda {found[1]}")


if __name__ == "__main__":
    main()
