"""`python -m course doctor`: what this machine has for the course."""

import importlib
import platform
import subprocess
import sys


def _version(name):
    try:
        module = importlib.import_module(name)
    except Exception as err:  # missing, or broken on import
        return f"not importable ({type(err).__name__})"
    return getattr(module, "__version__", "installed")


def gpu_report():
    """Say where part 6's CUDA kernels will run: `course.kernels` chooses when it is imported
    (asked in a child process, so that this process can still choose the simulator later)."""
    probe = "import course.kernels as K; print(K.backend()); print(K.backend_reason())"
    try:
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    except Exception as err:
        return f"could not be determined ({type(err).__name__})"
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or len(lines) < 2:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        return f"course.kernels does not import: {last}"
    backend, reason = lines[0], lines[1]
    if backend == "gpu":
        return f"a real GPU: {reason}"
    return f"the CUDA simulator ({reason})"


def main():
    print(f"python         {platform.python_version()} ({sys.executable})")
    for name in ("numpy", "numba", "matplotlib", "graphviz", "tqdm", "threadpoolctl", "jupyterlab",
                 "ipywidgets", "nbval", "pytest", "hypothesis"):
        print(f"{name:<14} {_version(name)}")
    torch = _version("torch")
    if torch.startswith("not importable"):
        # PyTorch is an optional reference: the course and its lessons never need it.
        torch += (": optional, only the `reference` tests compare with it and are skipped without it "
                  "(pip install -e '.[reference]' to add it)")
    print(f"{'torch':<14} {torch}")
    try:
        from .viz.graphs import find_dot
        dot = find_dot()  # the system's Graphviz first, else the graphviz-pure wheel's
    except Exception:  # the graphviz package itself is missing or broken
        dot = None
    if dot:
        version = subprocess.run([dot, "-V"], capture_output=True, text=True)
        print(f"dot            {(version.stderr or version.stdout).strip()} ({dot})")
    else:
        print("dot            missing: graphs will not be drawn (apt-get install graphviz, brew install "
              "graphviz, conda install graphviz, or pip install graphviz-pure)")
    print(f"GPU kernels    {gpu_report()}")
