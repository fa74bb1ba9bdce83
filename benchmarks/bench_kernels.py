"""Part 6's kernels: the Numba CPU matmul against NumPy's BLAS, and the models on the CPU kernels.

Rows:
- `course.kernels.cpu.matmul` against NumPy's `@` at 512 x 512 float32, both computing a @ b.T
  (B's transpose included), on one thread each: measured in a child Python started with
  OMP/OPENBLAS/MKL/NUMBA_NUM_THREADS=1, so that neither library can use more.
- The GPT training step of bench_gpt and the Mamba training step of bench_mamba, run inside
  `use_kernels("cpu")` against the same step on the NumPy path (the engine's default), timed in
  alternation (best of several steps each), with as many threads as NumPy's BLAS uses.
- On a GPU only: the tiled CUDA matmul at 4096 x 4096 float32, as a fraction of the GPU's fp32
  peak and against cuBLAS (through CuPy, when it is installed), and the selective-scan kernel
  against the CPU path. Without a GPU these rows say so: the simulator is no measure of speed.

    python -m benchmarks kernels
"""

import json
import os
import subprocess
import sys
import time

import numpy as np

MATMUL_N = 512

_CHILD = r"""
import json, time
import numpy as np
import course.kernels as K
n = {n}
rng = np.random.default_rng(0)
a = rng.standard_normal((n, n)).astype(np.float32)
b = rng.standard_normal((n, n)).astype(np.float32)
assert np.allclose(K.cpu.matmul(a, b.T), a @ b.T, rtol=1e-3, atol=1e-3)
def best(fn, repeat=15):
    times = []
    for _ in range(repeat):
        start = time.perf_counter(); fn(); times.append(time.perf_counter() - start)
    return min(times)
course, numpy = [], []
for _ in range(3):  # alternate, so that other load slows both alike
    course.append(best(lambda: K.cpu.matmul(a, b.T)))
    numpy.append(best(lambda: a @ b.T))
print(json.dumps({{"course": min(course), "numpy": min(numpy)}}))
"""


def bench_cpu_matmul(n=MATMUL_N):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
               NUMBA_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", _CHILD.format(n=n)], capture_output=True, text=True, env=env,
                         timeout=600)
    name = f"Numba CPU matmul {n}x{n} float32, a @ b.T"
    if out.returncode != 0:
        return {"name": name, "note": f"failed: {out.stderr.strip().splitlines()[-1]}"}
    t = json.loads(out.stdout.strip().splitlines()[-1])
    flops = 2 * n ** 3
    return {"name": name, "course_s": t["course"], "reference": "NumPy BLAS", "reference_s": t["numpy"],
            "ratio": t["course"] / t["numpy"],
            "note": f"1 thread each; {flops / t['course'] / 1e9:.0f} vs {flops / t['numpy'] / 1e9:.0f} GFLOP/s; "
                    f"speed {t['numpy'] / t['course']:.2f}x NumPy's"}


def _timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _alternate(step_numpy, step_kernels, repeat):
    import course.kernels as K

    def on_kernels():
        with K.use_kernels("cpu"):
            step_kernels()

    for _ in range(2):  # warm up: compile, allocate
        step_numpy()
        on_kernels()
    numpy_t, kernel_t = [], []
    for _ in range(repeat):
        numpy_t.append(_timed(step_numpy))
        kernel_t.append(_timed(on_kernels))
    return min(kernel_t), min(numpy_t)


def bench_gpt_step():
    from course import optim
    from course.gpt import GPT, param_groups

    from .bench_gpt import BATCH, CONFIG, numpy_threads

    rng = np.random.default_rng(0)
    x = rng.integers(0, CONFIG.vocab_size, (BATCH, CONFIG.block_size))
    y = rng.integers(0, CONFIG.vocab_size, (BATCH, CONFIG.block_size))
    model = GPT(CONFIG, seed=0)
    opt = optim.AdamW(param_groups(model, 0.1), lr=1e-3)

    def step():
        _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    threads = _numba_threads(numpy_threads())
    k, n = _alternate(step, step, repeat=8)
    return {"name": f"GPT train step {CONFIG.n_layer}x{CONFIG.n_embd}, use_kernels('cpu')", "course_s": k,
            "reference": "NumPy path", "reference_s": n, "ratio": k / n,
            "note": f"{threads} threads (BLAS and Numba)"}


def bench_mamba_step():
    try:
        from course import optim
        from course.mamba import Mamba
        from course.tensor import functional as F
        from course.train import param_groups

        from .bench_gpt import numpy_threads
        from .bench_mamba import BATCH, CONFIG, LENGTH
    except ImportError as err:
        return {"name": "Mamba train step, use_kernels('cpu')", "note": f"skipped: {err}"}
    rng = np.random.default_rng(0)
    x = rng.integers(0, CONFIG.vocab_size, (BATCH, LENGTH))
    y = rng.integers(0, CONFIG.vocab_size, (BATCH, LENGTH))
    model = Mamba(CONFIG, seed=0)
    opt = optim.AdamW(param_groups(model, 0.1), lr=1e-3)

    def step():
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    threads = _numba_threads(numpy_threads())
    k, n = _alternate(step, step, repeat=4)
    return {"name": f"Mamba train step {CONFIG.n_layer}x{CONFIG.d_model}, use_kernels('cpu')", "course_s": k,
            "reference": "NumPy path", "reference_s": n, "ratio": k / n,
            "note": f"{threads} threads (BLAS and Numba)"}


def _numba_threads(wanted):
    import numba

    threads = max(1, min(wanted, numba.config.NUMBA_NUM_THREADS))
    numba.set_num_threads(threads)
    return threads


# ----- on a GPU only --------------------------------------------------------------------------------------
_CORES_PER_SM = {3: 192, 5: 128, 6: 64, 7: 64, 8: 64, 9: 128}  # fp32 lanes per SM, by major version


def _fp32_peak(device):
    major, minor = device.compute_capability
    cores = _CORES_PER_SM.get(major, 128)
    if (major, minor) in ((6, 1), (6, 2), (8, 6), (8, 7), (8, 9)):
        cores = 128
    return 2 * cores * device.MULTIPROCESSOR_COUNT * device.CLOCK_RATE * 1e3  # FMA = 2 flops; clock in kHz


def bench_gpu(n=4096):
    import course.kernels as K

    if K.backend() != "gpu":
        note = "skipped: no GPU here (the simulator is no measure of speed)"
        return [{"name": f"CUDA tiled matmul {n}x{n} float32", "note": note},
                {"name": "CUDA selective scan (b=8, l=1024, d=256, n=16)", "note": note}]
    from course.kernels import cuda
    from course.kernels.matmul import matmul_device

    rows = []
    rng = np.random.default_rng(0)
    a = cuda.to_device(rng.standard_normal((n, n)).astype(np.float32))
    b = cuda.to_device(rng.standard_normal((n, n)).astype(np.float32))

    def tiled():
        matmul_device(a, b, "tiled")
        cuda.synchronize()

    tiled()
    t = min(_timed(tiled) for _ in range(5))
    device = cuda.get_current_device()
    peak = _fp32_peak(device)
    flops = 2 * n ** 3
    row = {"name": f"CUDA tiled matmul {n}x{n} float32", "course_s": t,
           "note": f"{flops / t / 1e12:.2f} TFLOP/s = {flops / t / peak:.1%} of fp32 peak ({peak / 1e12:.0f} TFLOP/s)"}
    try:
        import cupy

        ca, cb = cupy.asarray(a.copy_to_host()), cupy.asarray(b.copy_to_host())

        def cublas():
            ca @ cb
            cupy.cuda.Device().synchronize()

        cublas()
        r = min(_timed(cublas) for _ in range(5))
        row.update(reference="cuBLAS (CuPy)", reference_s=r, ratio=t / r)
    except ImportError:
        row["note"] += "; CuPy not installed: no cuBLAS reference"
    rows.append(row)

    shape = (8, 1024, 256, 16)
    bsz, length, d, s = shape
    u = rng.standard_normal((bsz, length, d)).astype(np.float32)
    delta = (np.abs(rng.standard_normal((bsz, length, d))) * 0.1).astype(np.float32)
    A = -np.exp(rng.standard_normal((d, s))).astype(np.float32)
    B, C = (rng.standard_normal((bsz, length, s)).astype(np.float32) for _ in range(2))
    D = np.ones(d, np.float32)
    K.selective_scan(u, delta, A, B, C, D)
    K.cpu.selective_scan(u, delta, A, B, C, D)
    t_gpu = min(_timed(lambda: K.selective_scan(u, delta, A, B, C, D)) for _ in range(5))
    t_cpu = min(_timed(lambda: K.cpu.selective_scan(u, delta, A, B, C, D)) for _ in range(3))
    rows.append({"name": f"CUDA selective scan (b={bsz}, l={length}, d={d}, n={s})", "course_s": t_gpu,
                 "reference": "CPU kernel", "reference_s": t_cpu, "ratio": t_gpu / t_cpu,
                 "note": "forward, host copies included"})
    return rows


def run():
    return [bench_cpu_matmul(), bench_gpt_step(), bench_mamba_step(), *bench_gpu()]


if __name__ == "__main__":
    from . import __main__ as table

    table.main(["kernels"])
