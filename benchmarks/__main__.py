"""`make bench`: run every benchmarks/bench_*.py in one process and print one table of ratios.

Each module's `run()` returns rows: dicts with `name`, `course_s` (seconds, best of several
repetitions), and, where there is a reference to compare with, `reference`, `reference_s` and
`ratio` (course time / reference time: below 1 means the course is faster). A row may carry a
`note` (for example why its reference was skipped).
"""

import importlib
import pkgutil
import platform
import sys
from pathlib import Path


def fmt_seconds(s):
    if s is None:
        return "-"
    return f"{s * 1e3:.2f} ms" if s < 1 else f"{s:.2f} s"


def main(selected=()):
    import numpy as np

    here = Path(__file__).parent
    names = sorted(m.name for m in pkgutil.iter_modules([str(here)]) if m.name.startswith("bench_"))
    if selected:
        names = [n for n in names if any(s in n for s in selected)]
    rows = []
    for name in names:
        module = importlib.import_module(f"benchmarks.{name}")
        print(f"running {name} ...", file=sys.stderr, flush=True)
        rows += module.run()
    print(f"machine: {platform.machine()}, {platform.processor() or platform.system()}; "
          f"python {platform.python_version()}, numpy {np.__version__}")
    header = f"{'benchmark':<48} {'course':>11} {'reference':>26} {'ratio':>7}  note"
    print(header)
    print("-" * len(header))
    for r in rows:
        ref = f"{r.get('reference', '')} {fmt_seconds(r.get('reference_s'))}" if r.get("reference") else "-"
        ratio = f"{r['ratio']:.3g}" if r.get("ratio") is not None else "-"
        print(f"{r['name']:<48} {fmt_seconds(r.get('course_s')):>11} {ref:>26} {ratio:>7}  {r.get('note', '')}")
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
