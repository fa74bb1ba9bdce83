"""`python -m course doctor`: what this machine has for the course."""

import importlib
import os
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
    """Say whether part 6 will use a real GPU or Numba's CUDA simulator (checked in a child process,
    so that this process can still choose the simulator later)."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        return "the CUDA simulator (NUMBA_ENABLE_CUDASIM=1 is set)"
    probe = ("from numba import cuda\n"
             "name = cuda.get_current_device().name if cuda.is_available() else ''\n"
             "print(name.decode() if isinstance(name, bytes) else name)")
    try:
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
        name = out.stdout.strip()
    except Exception:
        name = ""
    if name:
        return f"a real GPU: {name}"
    return "the CUDA simulator (no usable GPU found)"


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
