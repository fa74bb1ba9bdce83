"""How `make bench` times things: each engine alone, in a Python process of its own.

A benchmark module lists its rows in `ROWS`. A row compares two engines (the course's and a
reference) on the same work; each engine is a function of the module that builds the work and
returns a `step()` to time. For every row, `python -m benchmarks` starts one child process per
engine (`python -m benchmarks.run_one MODULE ROW ENGINE`), with the thread count fixed in the
environment before NumPy, PyTorch or Numba start their thread pools. The child warms up, times
`steps` calls of `step()` and prints the times as JSON.

Why a process each: timed in one process, step by step in alternation, the library that ran last
leaves its threads spinning for a while, and they eat the other library's time (PyTorch's GPT
step went from 110 ms alone to 160-180 ms next to the course's). Alone, each gets the cores.

A setup function may raise `Skip("why")` (PyTorch is not installed, there is no GPU): the row is
printed with the reason. A step may return a number (a loss, a checksum): the first one is sent
back as `check`, and a row with `same=...` verifies that both engines computed the same thing.
"""

import os
import platform
import re
from dataclasses import dataclass, field
from importlib import metadata

THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")
# numba starts a pool of threads the first time its thread count is asked or set (the course's
# kernels ask it, `run_one` sets it). Its default pool runs on OpenMP, the same libgomp that
# PyTorch's CPU build runs its operations on, and once numba's pool is up PyTorch's GPT step took
# 1.7 times as long (111 ms against 66, 2 threads, a 2-core Xeon with AVX-512). The course's
# kernels never run on numba's pool (they share work with `_share`'s own threads), so the bench
# gives it numba's own thread layer, which leaves OpenMP to PyTorch.
NUMBA_LAYER = "workqueue"


class Skip(Exception):
    """Raised by an engine's setup when it cannot run here; the message says why."""


@dataclass
class Row:
    key: str  # short name for selecting rows: `make bench ROWS=gpt`
    name: str  # what the table prints
    course: str  # the module's function that sets up the course's engine
    reference: str  # ... and the reference's
    course_label: str = "course"
    reference_label: str = "reference"
    threads: int = None  # None: the run's thread count (2 unless --threads says otherwise)
    steps: int = 15  # timed calls after the warm-up; the table prints their median
    warmup: int = 3
    reference_steps: int = None  # the reference's, where it is much slower (None: the same as steps)
    same: float = None  # if set: both engines' first `check` values agree within this (relative)
    note: str = ""
    extra: dict = field(default_factory=dict)  # keyword arguments for both setups


def find_row(parser, module_name, key):
    """The benchmark module `benchmarks.<module_name>` and its row `key`; a row it lacks is the
    parser's error, which lists the rows it has."""
    import importlib

    module = importlib.import_module(f"benchmarks.{module_name}")
    rows = {r.key: r for r in module.ROWS}
    if key not in rows:
        parser.error(f"{module_name} has no row {key!r}; its rows are {', '.join(rows)}")
    return module, rows[key]


def set_threads(n):
    """Fix every library's thread count in this process's environment (before they are imported),
    and keep numba's thread pool off OpenMP (see NUMBA_LAYER)."""
    for var in THREAD_VARS:
        os.environ[var] = str(n)
    os.environ["NUMBA_THREADING_LAYER"] = NUMBA_LAYER


def torch_threads(torch, n):
    """PyTorch's intra-op threads, set in the child (it ignores OMP_NUM_THREADS on some builds)."""
    torch.set_num_threads(n)
    return torch


# ----- the machine, for the table's header --------------------------------------------------------------
def _cpuinfo():
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
    except OSError:
        return "", set()
    model = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
    flags = re.search(r"^(?:flags|Features)\s*:\s*(.+)$", text, re.M)
    return (model.group(1).strip() if model else ""), set(flags.group(1).split() if flags else ())


def vector_isa(flags):
    """The widest vector instructions the CPU has: AVX-512, AVX2, NEON..."""
    if "avx512f" in flags:
        return "AVX-512 (512-bit vectors, 32 registers)"
    if "avx2" in flags:
        return "AVX2 (256-bit vectors, 16 registers)"
    if "avx" in flags:
        return "AVX (256-bit vectors)"
    if "asimd" in flags or platform.machine() in ("arm64", "aarch64"):
        return "NEON (128-bit vectors)"
    return "SSE (128-bit vectors)" if "sse2" in flags else "unknown"


def _host_cpu_name():
    try:
        from llvmlite import binding

        return binding.get_host_cpu_name()  # what Numba compiles for, e.g. znver3, skylake-avx512
    except Exception:  # noqa: BLE001  (an old llvmlite: the header just lacks it)
        return ""


def _version(package):
    try:
        return metadata.version(package).split("+")[0]
    except metadata.PackageNotFoundError:
        return None


def _blas():
    import numpy as np

    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return f"{blas.get('name', '?')} {blas.get('version', '')}".strip()
    except Exception:  # noqa: BLE001  (NumPy < 1.25 has no mode="dicts")
        return "BLAS unknown"


def machine(threads):
    """A dict describing the machine and the software: the header of the table."""
    model, flags = _cpuinfo()
    model = model or platform.processor() or platform.machine()
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count()
    return {
        "cpu": model,
        "llvm_cpu": _host_cpu_name(),
        "vector": vector_isa(flags),
        "cores": cores,
        "threads": threads,
        "python": platform.python_version(),
        "numpy": _version("numpy"),
        "blas": _blas(),
        "numba": _version("numba"),
        "torch": _version("torch"),
        "system": f"{platform.system()} {platform.machine()}",
    }


def describe(m):
    """The header as two lines of text."""
    cpu = m["cpu"] + (f" ({m['llvm_cpu']})" if m["llvm_cpu"] else "")
    line1 = f"{cpu}, {m['vector']}, {m['cores']} cores; {m['system']}"
    line2 = (f"Python {m['python']}, NumPy {m['numpy']} ({m['blas']}), Numba {m['numba']}, "
             f"PyTorch {m['torch'] or 'not installed'}; {m['threads']} threads per engine unless the row says")
    return line1, line2


def summary(times):
    """Median and spread of a list of seconds."""
    s = sorted(times)
    n = len(s)

    def q(p):  # linear interpolation between order statistics
        x = p * (n - 1)
        i = int(x)
        return s[i] + (s[min(i + 1, n - 1)] - s[i]) * (x - i)

    return {"median": q(0.5), "min": s[0], "max": s[-1], "q1": q(0.25), "q3": q(0.75), "n": n}
