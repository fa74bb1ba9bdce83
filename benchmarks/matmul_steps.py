"""The steps of lesson 6.3's last section on a GPU, each timed against cuBLAS.

    python -m benchmarks.matmul_steps          # 4096 x 4096 float32
    python -m benchmarks.matmul_steps 2048

Each kernel multiplies two n x n float32 matrices already on the device (a batch of one): the
tiled kernel, the 1-D thread tile, then the 2-D register kernel (`make_register_kernel`, 128 x 128
blocks of 8 x 8 per thread on a GPU) one change at a time, up to the library's. Times are the
median of 20 launches measured with CUDA events, after 3 warm-up launches; 64 rows of every
result are checked against NumPy in float64. cuBLAS (the bench's reference: PyTorch with TF32
off, else CuPy) is timed the same way.
Where there is no GPU it says so and stops: the simulator is no measure of speed.
"""

import sys

import numpy as np

import course.kernels as K
from course.kernels import cuda
from course.kernels.launch import blocks_for, launch

from .bench_kernels import GPU_N, gpu_matmul_cublas

mm = sys.modules["course.kernels.matmul"]  # the module (course.kernels.matmul is also a function)


def steps():
    """(name, kernel, (rows, columns) of C per block, threads per block) for each step."""
    t = mm.TILES
    block = (t.bn // t.tn, t.bm // t.tm)

    def register(**options):
        return mm.make_register_kernel(*t, **options), (t.bm, t.bn), block

    found = [(f"tiled in shared memory, {mm.TILE} x {mm.TILE} (method \"tiled\")",) + tuple(mm._BATCHED["tiled"]),
             (f"1-D thread tile, {mm.THREAD_TILE[0]} x {mm.THREAD_TILE[1]} blocks, tm = {mm.THREAD_TILE[3]} "
              f"(method \"thread_tile\")",) + tuple(mm._BATCHED["thread_tile"])]
    found += [(f"2-D, {t.tm} x {t.tn} per thread: {name}",) + register(**options) for name, options in [
        ("contiguous, 4-byte reads (group=None, align=None)", dict(group=None, align=None)),
        ("strided (group=1)", dict(group=1)),
        ("contiguous, 16-byte reads (group=None)", dict(group=None)),
        ("runs of 4, 16-byte reads (group=4)", dict(group=4)),
        ("runs of 4, no checks inside (group=4, interior=True)", dict(group=4, interior=True)),
    ]]
    return found


def timed(go, repeat=20, warmup=3):
    """Median milliseconds of `go()` on the GPU, from CUDA events around each call."""
    for _ in range(warmup):
        go()
    cuda.synchronize()
    times = []
    for _ in range(repeat):
        start, end = cuda.event(), cuda.event()
        start.record()
        go()
        end.record()
        end.synchronize()
        times.append(cuda.event_elapsed_time(start, end))
    return float(np.median(times)), min(times), max(times)


def main(n):
    if K.backend() != "gpu":
        print(f"skipped: no GPU here ({K.backend_reason()}); the simulator is no measure of speed")
        return
    reference = gpu_matmul_cublas(None, n)  # the bench's cuBLAS step (it waits for the GPU)
    ref_ms = timed(reference)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((1, n, n)).astype(np.float32)  # a batch of one, C-contiguous (as `matmul_into` gets it)
    b = rng.standard_normal((1, n, n)).astype(np.float32)
    expected = a[0, :64].astype(np.float64) @ b[0]  # 64 rows of the product, checked for every kernel
    d_a, d_b = cuda.to_device(a), cuda.to_device(b)
    d_c = cuda.device_array((1, n, n), np.float32)
    print(f"{n} x {n} float32 on {K.backend_reason()}, tiles {tuple(mm.TILES)}; "
          f"{reference.label}: {ref_ms[0]:.2f} ms ({ref_ms[1]:.2f}-{ref_ms[2]:.2f})")
    print(f"{'kernel':76s} {'ms (min-max)':>20s} {'x cuBLAS time':>14s}")
    for name, kernel, (rows, cols), block in steps():
        grid = (blocks_for(n, cols), blocks_for(n, rows), 1)

        def go():
            launch(kernel, grid, block, d_a, d_b, d_c)

        go()  # compiles
        err = np.linalg.norm(d_c[0, :64].copy_to_host() - expected) / np.linalg.norm(expected)
        assert err < 1e-5, f"{name}: relative error {err:.1e} against NumPy in float64"
        ms = timed(go)
        print(f"{name:76s} {ms[0]:7.2f} ({ms[1]:.2f}-{ms[2]:.2f}) {ms[0] / ref_ms[0]:14.2f}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else GPU_N)
