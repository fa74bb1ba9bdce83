"""Where a GPT training step on the GPU spends its time (BENCHMARKS.md's "Where the GPU rows miss").

    python -m benchmarks.profile_gpu            # the bench GPT and the large one
    python -m benchmarks.profile_gpu bench      # one of them

For each model (the shapes of `benchmarks/bench_device.py`), after three warm-up steps:
- the host's time for one step, and the kernels it launched (`K.launches()`);
- the GPU's busy time in one step, kernel by kernel, from PyTorch's profiler (it records every
  kernel on the GPU through NVIDIA's CUPTI, numba's too), where PyTorch is installed;
- cProfile of two steps: the Python functions on the host that take the most time.
First, what one launch costs on the host: numba's `kernel[grid, block](args)` alone, then through
the course's `launch()`. Where there is no GPU it says so and stops: the simulator is no measure.
"""

import cProfile
import io
import os
import pstats
import sys
import time

import numpy as np

import course.kernels as K
from course.kernels import cuda
from course.kernels.launch import launch

from .bench_device import SHAPES, course_device_step


@cuda.jit
def bump(a):
    i = cuda.grid(1)
    if i < a.size:
        a[i] += 1.0


def launch_cost(n=3000):
    """Host microseconds per launch of a one-line kernel, numba alone and through `launch()`."""
    d = cuda.to_device(np.zeros(1024, np.float32))
    bump[4, 256](d)  # compiles
    cuda.synchronize()
    costs = {}
    for label, go in [("numba's kernel[grid, block](device array)", lambda: bump[4, 256](d)),
                      ("the course's launch()", lambda: launch(bump, 4, 256, d))]:
        start = time.perf_counter()
        for _ in range(n):
            go()
        cuda.synchronize()
        costs[label] = (time.perf_counter() - start) / n * 1e6
    return costs


def gpu_time(step):
    """(total GPU milliseconds, {kernel: milliseconds}) of one step, from PyTorch's profiler."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
    per_kernel = {}
    for event in prof.events():
        if "CUDA" in str(getattr(event, "device_type", "")):
            name = event.name.split("[abi")[0].split("::")[-1]  # numba's mangled name, shortened
            per_kernel[name] = per_kernel.get(name, 0.0) + event.device_time / 1e3
    return sum(per_kernel.values()), per_kernel


def profile(shape):
    step = course_device_step(2, shape)
    for _ in range(3):
        step()
    K.reset_launches()
    start = time.perf_counter()
    step()
    host = time.perf_counter() - start
    counts = K.launches()
    print(f"\n== the {shape} GPT {SHAPES[shape]}: one step {host * 1e3:.1f} ms on the host, "
          f"{sum(counts.values())} launches")
    for name, n in sorted(counts.items(), key=lambda kv: -kv[1])[:8]:
        print(f"   {n:5d}  {name}")
    try:
        total, per_kernel = gpu_time(step)
    except ImportError:
        print("   (PyTorch is not installed: no GPU time)")
    else:
        print(f"   GPU busy {total:.1f} ms in one step; the longest kernels:")
        for name, ms in sorted(per_kernel.items(), key=lambda kv: -kv[1])[:6]:
            print(f"   {ms:8.2f} ms  {name}")
    prof = cProfile.Profile()
    prof.enable()
    step()
    step()
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(15)
    print(out.getvalue())


def main(shapes):
    if K.backend() != "gpu":
        print(f"skipped: no GPU here ({K.backend_reason()}); the simulator is no measure of speed")
        return
    print(f"on {K.backend_reason()}")
    for label, us in launch_cost().items():
        print(f"one launch, {label}: {us:.1f} us")
    for shape in shapes or list(SHAPES):
        profile(shape)


if __name__ == "__main__":
    main(sys.argv[1:])
    # PyTorch's profiler and numba share the GPU's context; on an H100 their teardown at exit
    # once ended in "double free or corruption" after everything had printed. Leave without it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
