"""`python -m course doctor`: what this machine has for the course."""

import importlib
import platform
import subprocess
import sys


# Packages whose version is read from their installed metadata instead of importing them:
# importing JupyterLab loads the whole Jupyter server (seconds), which the lab itself checks.
_BY_METADATA = {"jupyterlab"}


def _version(name):
    if name in _BY_METADATA:
        from importlib.metadata import PackageNotFoundError, version
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"
    try:
        module = importlib.import_module(name)
    except Exception as err:  # missing, or broken on import
        return f"not importable ({type(err).__name__})"
    return getattr(module, "__version__", "installed")


def _probe():
    """Ask a child process what `course.kernels` chooses (it chooses when imported, before numba.cuda
    loads, so this process stays free to choose the simulator later): the backend and why, the
    bindings numba-cuda uses, and whether kernels compile for real GPUs (NVVM)."""
    probe = ("import course.kernels as K; from course.kernels import compile as C; "
             "from course.kernels._backend import bindings; print(K.backend()); print(K.backend_reason()); "
             "print(bindings()); ok, why = C.available(); print('yes' if ok else why)")
    try:
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=180)
    except Exception as err:
        return None, f"could not be determined ({type(err).__name__})"
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or len(lines) < 4:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"course.kernels does not import: {last}"
    return lines[:4], ""


def gpu_report(found=None):
    """Say where part 6's CUDA kernels will run."""
    lines, error = found if found is not None else _probe()
    if lines is None:
        return error
    backend, reason = lines[0], lines[1]
    if backend == "gpu":
        return f"a real GPU: {reason}"
    return f"the CUDA simulator ({reason})"


def _numba_cuda_version():
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("numba-cuda")
    except PackageNotFoundError:
        return "not installed (numba's own numba.cuda is used)"


def cpu_report():
    """The register block of the CPU kernels' matrix product: it follows the vector registers of the
    CPU numba compiles for (lesson 6.5, section 5)."""
    try:
        from .kernels import cpu
    except Exception as err:  # numba missing or broken
        return f"unavailable ({type(err).__name__}: {err})"
    isa = "AVX-512" if cpu.VECTOR_BYTES == 64 else "AVX2 or narrower"
    return (f"matmul register block {cpu.MR} x {cpu._panel_width(4)} float32, "
            f"{8 * cpu.VECTOR_BYTES}-bit vectors ({isa}); {cpu.threads()} threads")


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
    found = _probe()
    lines = found[0]
    print(f"numba-cuda     {_numba_cuda_version()}, through {lines[2] if lines else 'unknown bindings'}")
    print(f"GPU kernels    {gpu_report(found)}")
    if lines:
        nvvm = "yes: kernels compile to PTX for real GPUs (sm_75, sm_90)" if lines[3] == "yes" else f"no: {lines[3]}"
        print(f"NVVM           {nvvm}")
    # Imported only now: `course.kernels` chooses the GPU or the simulator when it is imported, and
    # the probe above asked a fresh process what it chooses.
    print(f"CPU kernels    {cpu_report()}")
