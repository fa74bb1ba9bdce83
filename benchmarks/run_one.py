"""Time one engine of one benchmark row, alone in this process, and print the result as JSON.

    python -m benchmarks.run_one bench_gpt gpt course --threads 2

`python -m benchmarks` starts this once per engine per row. The thread count goes into the
environment first (OMP/OPENBLAS/MKL/NUMBA_NUM_THREADS), before NumPy, Numba or PyTorch is
imported, so that their thread pools have that size from the start.
"""

import argparse
import json
import sys
import time


def _time_steps(step, warmup, steps):
    check = None
    for i in range(warmup):
        value = step()
        if i == 0 and isinstance(value, (int, float)):
            check = float(value)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return times, check


def _peak_bytes(step):
    """The most memory one more step holds at once beyond what was held before it, as tracemalloc
    sees it (NumPy's arrays; not the small scratch arrays allocated inside compiled kernels)."""
    import tracemalloc

    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        step()
        return tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.run_one")
    p.add_argument("module")
    p.add_argument("row", nargs="?")
    p.add_argument("engine", nargs="?", choices=("course", "reference"))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int)
    p.add_argument("--warmup", type=int)
    args = p.parse_args(argv)

    from .harness import set_threads

    set_threads(args.threads)
    from .harness import Skip, find_row

    module, row = find_row(p, args.module, args.row)
    threads = row.threads or args.threads
    # `python -m benchmarks` passes the row's own count, so the environment had it before NumPy
    # started; run by hand with another count, the pools are cut down here (threadpoolctl).
    from threadpoolctl import threadpool_info, threadpool_limits

    threadpool_limits(threads)
    try:
        import numba

        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    except ImportError:
        pass
    setup = getattr(module, row.course if args.engine == "course" else row.reference)
    try:
        step = setup(threads=threads, **row.extra)
    except Skip as why:
        print(json.dumps({"skipped": str(why)}))
        return 0
    warmup = row.warmup if args.warmup is None else args.warmup
    steps = row.reference_steps if args.engine == "reference" and row.reference_steps else row.steps
    steps = steps if args.steps is None else args.steps
    times, check = _time_steps(step, max(warmup, 1), steps)
    peak = _peak_bytes(step) if getattr(step, "trace_memory", False) else None
    blas = sorted({pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"})
    print(json.dumps({"times": times, "check": check, "threads": threads, "blas_threads": blas,
                      "label": getattr(step, "label", None), "peak_bytes": peak}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
