"""`make bench`: time every row of every registered benchmark module and print one table.

    python -m benchmarks                     # every row, 2 threads per engine
    python -m benchmarks gpt matmul          # rows whose key or module contains "gpt" or "matmul"
    python -m benchmarks --markdown          # the table as Markdown, header included, into BENCHMARKS.md
    python -m benchmarks --list              # the rows, without running them
    python -m benchmarks --quick             # 1 warm-up + 2 steps per engine: checks that all runs

Each engine of each row runs alone in a child process (benchmarks/run_one.py, see
benchmarks/harness.py for why), with its thread count set before any library starts. The table
gives each engine's median time over its steps with the spread (min-max), and the ratio of the
medians: course / reference, below 1 the course is faster. The header names the CPU, its vector
instructions and the versions, so a table can be compared with one from the same machine.

A module registers its rows (`ROWS`) with one line in MODULES.
"""

import argparse
import importlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from .harness import describe, machine, summary

# The benchmark modules, in the table's order: one line each.
MODULES = [
    "bench_mlp",
    "bench_gpt",
    "bench_mamba",
    "bench_kernels",
    "bench_gpt2",
    "bench_device",
]


def fmt_seconds(s):
    if s is None:
        return "-"
    if s < 1e-3:
        return f"{s * 1e6:.0f} us"
    return f"{s * 1e3:.3g} ms" if s < 1 else f"{s:.2f} s"


def _spread(t):
    return f"{fmt_seconds(t['min'])}-{fmt_seconds(t['max'])}"


def _child(args, timeout=600):
    cmd = [sys.executable, "-m", "benchmarks.run_one", *args]
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                             cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        err = (out.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": err}
    return json.loads(lines[-1])


def select(rows_wanted):
    """(module name, Row) for every row selected by the words in rows_wanted."""
    chosen = []
    for name in MODULES:
        for row in importlib.import_module(f"benchmarks.{name}").ROWS:
            if not rows_wanted or any(w in row.key or w in name for w in rows_wanted):
                chosen.append((name, row))
    return chosen


def run_row(module, row, threads, quick=False):
    """Both engines of a row, each in its own process; returns a result dict for the table."""
    result = {"key": row.key, "name": row.name, "module": module, "threads": row.threads or threads,
              "course_label": row.course_label, "reference_label": row.reference_label, "note": row.note}
    extra = ["--warmup", "1", "--steps", "2"] if quick else []
    for engine in ("course", "reference"):
        # The row's thread count goes into the child's environment before it imports anything.
        out = _child([module, row.key, engine, "--threads", str(row.threads or threads), *extra])
        if "error" in out:
            result[engine] = {"error": out["error"]}
        elif "skipped" in out:
            result[engine] = {"skipped": out["skipped"]}
        else:
            result[engine] = {**summary(out["times"]), "check": out["check"]}
            if out.get("peak_bytes") is not None:
                result[engine]["peak_bytes"] = out["peak_bytes"]
            if out.get("label"):
                result[f"{engine}_label"] = out["label"]
    c, r = result["course"], result["reference"]
    if "median" in c and "median" in r:
        result["ratio"] = c["median"] / r["median"]
        if row.same is not None and c["check"] is not None and r["check"] is not None:
            agree = abs(c["check"] - r["check"]) <= row.same * max(abs(r["check"]), 1e-12)
            result["same"] = agree
            if not agree:
                result["note"] = f"RESULTS DIFFER: {c['check']:.6g} vs {r['check']:.6g}; " + result["note"]
    return result


def _cell(result, engine):
    t = result.get(engine)
    if not t:
        return "-"
    if "error" in t:
        return "failed"
    if "skipped" in t:
        return "skipped"
    return f"{fmt_seconds(t['median'])} ({_spread(t)})" if t["min"] != t["max"] else fmt_seconds(t["median"])


def _megabytes(n):
    return f"{n / 2 ** 20:.3g} MB"


def _notes(result):
    notes = [result.get("note", "")]
    peaks = {e: (result.get(e) or {}).get("peak_bytes") for e in ("course", "reference")}
    if all(p is not None for p in peaks.values()):
        notes.append(f"peak extra memory of a step: {result['course_label']} {_megabytes(peaks['course'])}, "
                     f"{result['reference_label']} {_megabytes(peaks['reference'])}")
    for engine in ("course", "reference"):
        t = result.get(engine) or {}
        if "error" in t:
            notes.append(f"{engine} failed: {t['error']}")
        if "skipped" in t and t["skipped"] not in notes:  # once, where both engines skip for one reason
            notes.append(t["skipped"])
    return "; ".join(n for n in notes if n)


def print_text(results, info):
    for line in describe(info):
        print(line)
    # One block per row: the name on its own line, then the figures in columns.
    w = max([14] + [len(r["key"]) for r in results])
    header = f"  {'row':<{w}} {'thr':>3}  {'course: median (min-max)':<30} {'reference: median (min-max)':<50} {'ratio':>7}"
    print(header)
    print("-" * len(header))
    for r in results:
        ref = f"{r['reference_label']} {_cell(r, 'reference')}" if r.get("reference") else "-"
        ratio = f"{r['ratio']:.3g}" if r.get("ratio") is not None else "-"
        print(r["name"])
        print(f"  {r['key']:<{w}} {r['threads']:>3}  {_cell(r, 'course'):<30} {ref:<50} {ratio:>7}")
        if _notes(r):
            print(f"  {'':<{w}} {'':>3}  {_notes(r)}")


BENCHMARKS = Path(__file__).resolve().parent.parent / "BENCHMARKS.md"
TABLE_START = "<!-- bench: written by `make bench MARKDOWN=1` -->"
TABLE_END = "<!-- end of bench -->"


def markdown(results, info):
    line1, line2 = describe(info)
    lines = [f"Measured by `make bench` ({time.strftime('%Y-%m-%d')}) on {line1}",
             f"{line2}. Times: median of each engine's steps, (min-max) after it; ratio: course / reference.",
             "", "| benchmark | threads | course | reference | ratio | note |", "|---|---|---|---|---|---|"]
    for r in results:
        ref = f"{r['reference_label']} {_cell(r, 'reference')}" if r.get("reference") else "-"
        ratio = f"{r['ratio']:.3g}" if r.get("ratio") is not None else "-"
        lines.append(f"| {r['name']} | {r['threads']} | {_cell(r, 'course')} | {ref} | {ratio} | {_notes(r)} |")
    return "\n".join(lines)


def print_markdown(results, info, write=True):
    """Print the table as Markdown and, for a run of every row, put it into BENCHMARKS.md."""
    table = markdown(results, info)
    print(table)
    if not write:
        return
    text = BENCHMARKS.read_text()
    if TABLE_START not in text or TABLE_END not in text:
        raise SystemExit(f"{BENCHMARKS.name} has lost its table markers ({TABLE_START} ... {TABLE_END})")
    head, rest = text.split(TABLE_START, 1)
    BENCHMARKS.write_text(head + TABLE_START + "\n" + table + "\n" + TABLE_END + rest.split(TABLE_END, 1)[1])
    print(f"wrote the table into {BENCHMARKS}", file=sys.stderr)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n")[0])
    p.add_argument("rows", nargs="*", help="run only rows whose key or module contains one of these words")
    p.add_argument("--threads", type=int, default=2, help="threads per engine (rows may fix their own)")
    p.add_argument("--markdown", action="store_true",
                   help="print the table as Markdown, and write it into BENCHMARKS.md when every row ran")
    p.add_argument("--json", metavar="FILE", help="also write every measurement to FILE")
    p.add_argument("--list", action="store_true", help="list the rows and exit")
    p.add_argument("--quick", action="store_true", help="1 warm-up and 2 steps per engine (a smoke test)")
    args = p.parse_args(argv)
    rows = [w for word in args.rows for w in word.replace(",", " ").split()]
    chosen = select(rows)
    if args.list:
        for module, row in chosen:
            print(f"{row.key:<16} {module:<14} {row.name}")
        return []
    if not chosen:
        p.error(f"no row matches {' '.join(rows)}; see --list")
    info = machine(args.threads)
    results = []
    for module, row in chosen:
        print(f"running {module} {row.key} ...", file=sys.stderr, flush=True)
        results.append(run_row(module, row, args.threads, quick=args.quick))
    if args.markdown:
        print_markdown(results, info, write=not rows and not args.quick)
    else:
        print_text(results, info)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": info, "results": results}, f, indent=1)
    return results


if __name__ == "__main__":
    main()
