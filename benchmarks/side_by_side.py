"""Both engines of one row in one process, a step of each in turn: a second opinion on a ratio.

    python -m benchmarks.side_by_side bench_kernels gpt-kernels --pairs 20

`make bench` runs each engine alone, one process after the other, which keeps one library's idle
threads from slowing the other; but on a machine whose speed wanders (a shared or virtual one) two
processes run minutes apart can meet it at different speeds, and their ratio moves with it. Here
each course step is followed by a reference step, so both see the same moment, and the median of
the pairs' ratios says which is faster. The price: the two libraries share the process, so a BLAS
whose threads spin after a call can slow the step that follows it (NumPy's OpenBLAS does, for a
while). Report which of the two measures a figure comes from.
"""

import argparse
import statistics
import sys
import time


def alternate(course, reference, pairs, warmup=2):
    """Time `pairs` course steps and as many reference steps, in turn, after `warmup` of each:
    (course times, reference times), in seconds."""
    for _ in range(warmup):
        course()
        reference()
    times = ([], [])
    for _ in range(pairs):
        for step, out in ((course, times[0]), (reference, times[1])):
            start = time.perf_counter()
            step()
            out.append(time.perf_counter() - start)
    return times


def report(course_times, reference_times):
    ratios = [c / r for c, r in zip(course_times, reference_times)]
    return {"course_median": statistics.median(course_times), "reference_median": statistics.median(reference_times),
            "median_ratio": statistics.median(ratios), "pairs": len(ratios)}


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.side_by_side")
    p.add_argument("module")
    p.add_argument("row")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--pairs", type=int, default=20)
    args = p.parse_args(argv)

    from .harness import find_row, set_threads

    set_threads(args.threads)  # before NumPy or Numba start their threads
    module, row = find_row(p, args.module, args.row)
    threads = row.threads or args.threads
    course = getattr(module, row.course)(threads=threads, **row.extra)
    reference = getattr(module, row.reference)(threads=threads, **row.extra)
    r = report(*alternate(course, reference, args.pairs, max(row.warmup, 1)))
    print(f"{row.name}, {threads} threads, {r['pairs']} pairs in one process: course median "
          f"{1e3 * r['course_median']:.3g} ms, {row.reference_label} {1e3 * r['reference_median']:.3g} ms, "
          f"median of the ratios {r['median_ratio']:.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
