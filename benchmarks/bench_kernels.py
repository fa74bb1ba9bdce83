"""Part 6's kernels: the Numba CPU matmul against NumPy's BLAS, and the models on the CPU kernels.

Rows (each engine in a process of its own, see benchmarks/harness.py):
- `course.kernels.cpu.matmul` against NumPy's `@` (its BLAS) at 512 x 512 and 1024 x 1024
  float32, `a @ b` with B as given, and `a @ b.T` with B's transpose as a view; one thread each.
- The GPT training step of bench_gpt and the Mamba training step of bench_mamba, run inside
  `use_kernels("cpu")` against the same step on the NumPy path (the engine's default), with as
  many threads for Numba as for BLAS; and the GPT step on the kernels against PyTorch's.
- Causal attention forward + backward by tiles (`course.kernels.fused`) against the NumPy path at
  T = 256 and 1024; the note under each gives the peak extra memory of one step of each (traced
  by tracemalloc): the NumPy path holds (T, T) arrays of scores and probabilities, quadratic in T;
  the tiles, linear.
- On a GPU only: the register-blocked and the tiled CUDA matmuls at 4096 x 4096 float32 against
  cuBLAS (through PyTorch with TF32 off, or CuPy; the ratio's inverse is the fraction of cuBLAS's
  speed), and the selective-scan kernel against the CPU path. Without a GPU these rows say so:
  the simulator is no measure of speed.

    python -m benchmarks kernels matmul
"""

import numpy as np

from .harness import Row, Skip


def _matrices(n, transposed):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n)).astype(np.float32)
    b = rng.standard_normal((n, n)).astype(np.float32)
    return a, (b.T if transposed else b)  # b.T: a view, its transpose is not made here


def matmul_course(threads, n=512, transposed=False):
    import course.kernels as K

    a, b = _matrices(n, transposed)
    np.testing.assert_allclose(K.cpu.matmul(a, b), a @ b, rtol=1e-3, atol=1e-3 * np.sqrt(n))
    return lambda: float(np.abs(K.cpu.matmul(a, b)).sum())


def matmul_numpy(threads, n=512, transposed=False):
    a, b = _matrices(n, transposed)
    return lambda: float(np.abs(a @ b).sum())


def _gpt(threads, kernels):
    from .bench_gpt import course_step

    step = course_step(threads)
    if not kernels:
        return step
    import course.kernels as K

    def on_kernels():
        with K.use_kernels("cpu"):
            return step()

    return on_kernels


def gpt_kernels(threads):
    return _gpt(threads, True)


def gpt_numpy(threads):
    return _gpt(threads, False)


def gpt_torch(threads):
    from .bench_gpt import torch_step

    return torch_step(threads)


def _mamba(threads, kernels):
    from .bench_mamba import course_step

    step = course_step(threads)
    if not kernels:
        return step
    import course.kernels as K

    def on_kernels():
        with K.use_kernels("cpu"):
            return step()

    return on_kernels


def mamba_kernels(threads):
    return _mamba(threads, True)


def mamba_numpy(threads):
    return _mamba(threads, False)


# ----- on a GPU only --------------------------------------------------------------------------------------
_CORES_PER_SM = {3: 192, 5: 128, 6: 64, 7: 64, 8: 64, 9: 128}  # fp32 lanes per SM, by major version


def _fp32_peak(device):
    major, minor = device.compute_capability
    cores = _CORES_PER_SM.get(major, 128)
    if (major, minor) in ((6, 1), (6, 2), (8, 6), (8, 7), (8, 9)):
        cores = 128
    return 2 * cores * device.MULTIPROCESSOR_COUNT * device.CLOCK_RATE * 1e3  # FMA = 2 flops; clock in kHz


def _gpu():
    import course.kernels as K

    if K.backend() != "gpu":
        raise Skip("no GPU here (the simulator is no measure of speed)")
    return K


GPU_N = 4096


def _gpu_matmul(n, method):
    """One launch of the course's kernel `method` on n x n float32 device arrays, then a wait for
    the GPU (a launch only queues the kernel); a slice of the result is checked against NumPy."""
    _gpu()
    import sys

    from course.kernels import cuda

    mm = sys.modules["course.kernels.matmul"]  # the module (course.kernels.matmul is also the function's name)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((1, n, n)).astype(np.float32)
    b = rng.standard_normal((1, n, n)).astype(np.float32)
    d_a, d_b = cuda.to_device(a), cuda.to_device(b)
    d_c = cuda.device_array((1, n, n), np.float32)
    mm.matmul_into(d_a, d_b, d_c, method)  # compiles the kernel
    cuda.synchronize()
    np.testing.assert_allclose(d_c[0, :64].copy_to_host(), a[0, :64] @ b[0], rtol=1e-3, atol=1e-3 * np.sqrt(n))

    def step():
        mm.matmul_into(d_a, d_b, d_c, method)
        cuda.synchronize()

    tiles = f", tiles {tuple(mm.TILES)}" if method == "register" else ""
    peak = _fp32_peak(cuda.get_current_device())
    step.label = f"{method}{tiles} (fp32 peak {peak / 1e12:.0f} TFLOP/s = {2 * n ** 3 / peak * 1e3:.2f} ms)"
    return step


def gpu_matmul_register(threads, n=GPU_N):
    return _gpu_matmul(n, "register")


def gpu_matmul_tiled(threads, n=GPU_N):
    return _gpu_matmul(n, "tiled")


def gpu_matmul_cublas(threads, n=GPU_N):
    """cuBLAS through PyTorch (TF32 off: true float32 products, as the course's kernels), or CuPy."""
    _gpu()
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n)).astype(np.float32)
    b = rng.standard_normal((n, n)).astype(np.float32)
    try:
        import torch

        if not torch.cuda.is_available():
            raise ImportError("PyTorch sees no GPU")
    except ImportError as why:
        try:
            import cupy
        except ImportError:
            raise Skip(f"no cuBLAS reference: neither PyTorch with CUDA ({why}) nor CuPy") from None
        ca, cb = cupy.asarray(a), cupy.asarray(b)

        def cupy_step():
            ca @ cb
            cupy.cuda.Device().synchronize()

        cupy_step.label = "cuBLAS (CuPy)"
        return cupy_step
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    ta, tb = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()

    def torch_step():
        ta @ tb
        torch.cuda.synchronize()

    torch_step.label = "cuBLAS (PyTorch, TF32 off)"
    return torch_step


SCAN_SHAPE = (8, 1024, 256, 16)


def scan_inputs():
    """u, delta, A, B, C, D of SCAN_SHAPE, float32 NumPy arrays."""
    bsz, length, d, s = SCAN_SHAPE
    rng = np.random.default_rng(0)
    u = rng.standard_normal((bsz, length, d)).astype(np.float32)
    delta = (np.abs(rng.standard_normal((bsz, length, d))) * 0.1).astype(np.float32)
    A = -np.exp(rng.standard_normal((d, s))).astype(np.float32)
    B, C = (rng.standard_normal((bsz, length, s)).astype(np.float32) for _ in range(2))
    return u, delta, A, B, C, np.ones(d, np.float32)


def _scan(threads, on_gpu):
    K = _gpu()
    inputs = scan_inputs()
    fn = K.selective_scan if on_gpu else K.cpu.selective_scan
    return lambda: float(np.abs(fn(*inputs)).sum())


def gpu_scan(threads):
    return _scan(threads, True)


def cpu_scan(threads):
    return _scan(threads, False)



def _attention(threads, T, fused):
    """Causal attention forward + backward, batch 4, 4 heads, head size 32, float32, as GPT calls it."""
    import course.kernels  # noqa: F401  (chooses the CUDA backend before numba starts)
    from course.kernels import fused as K_fused
    from course.tensor import Tensor
    from course.tensor import functional as F

    rng = np.random.default_rng(0)
    q, k, v = (Tensor(rng.standard_normal((4, 4, T, 32)).astype(np.float32), requires_grad=True) for _ in range(3))
    g = rng.standard_normal((4, 4, T, 32)).astype(np.float32)
    attend = K_fused.attention if fused else F.scaled_dot_product_attention.default

    def step():
        for t in (q, k, v):
            t.grad = None
        out = attend(q, k, v, causal=True)
        out.backward(g)
        return float(np.abs(q.grad).sum())

    step.trace_memory = True  # the table's note gives each path's peak extra memory (tracemalloc)
    return step


def attention_fused(threads, T=256):
    return _attention(threads, T, True)


def attention_numpy(threads, T=256):
    return _attention(threads, T, False)

ROWS = [
    Row("matmul-512", "Numba CPU matmul (`course.kernels.cpu`), 512 x 512 float32, `a @ b`", "matmul_course",
        "matmul_numpy", reference_label="NumPy's BLAS", threads=1, steps=30, same=1e-4, extra={"n": 512},
        note="target >= 0.8x BLAS's speed: ratio <= 1.25"),
    Row("matmul-1024", "Numba CPU matmul, 1024 x 1024 float32, `a @ b`", "matmul_course", "matmul_numpy",
        reference_label="NumPy's BLAS", threads=1, steps=10, same=1e-4, extra={"n": 1024},
        note="target ratio <= 1.25"),
    Row("matmul-512-bt", "Numba CPU matmul, 512 x 512 float32, `a @ b.T` (B's transpose as a view)",
        "matmul_course", "matmul_numpy", reference_label="NumPy's BLAS", threads=1, steps=30, same=1e-4,
        extra={"n": 512, "transposed": True}),
    Row("gpt-kernels", "GPT training step (as above) on the CPU kernels, `use_kernels(\"cpu\")`", "gpt_kernels",
        "gpt_numpy", reference_label="NumPy path", same=1e-4, note="target <= 0.8"),
    Row("gpt-kernels-torch", "The same step on the CPU kernels against PyTorch's eager step (the same weights, "
        "AdamW)", "gpt_kernels", "gpt_torch", reference_label="PyTorch", same=1e-4, note="target <= 0.7"),
    Row("mamba-kernels", "Mamba training step (as above) on the CPU kernels, `use_kernels(\"cpu\")`",
        "mamba_kernels", "mamba_numpy", reference_label="NumPy path", steps=9, warmup=2, same=1e-4,
        note="target <= 0.9"),
    Row("attention-256", "Causal attention forward + backward, 4 x 4 heads x 256 tokens x 32, float32: "
        "by tiles (`course.kernels.fused`) against the NumPy path", "attention_fused", "attention_numpy",
        reference_label="NumPy path", same=1e-3, extra={"T": 256}, note="target < 1"),
    Row("attention-1024", "The same at 1024 tokens", "attention_fused", "attention_numpy",
        reference_label="NumPy path", same=1e-3, extra={"T": 1024}, steps=5, note="target < 1"),
    Row("matmul-gpu-4096", f"CUDA matmul {GPU_N} x {GPU_N} float32, blocked in registers (`matmul_into`, "
        "method \"register\")", "gpu_matmul_register", "gpu_matmul_cublas", reference_label="cuBLAS",
        steps=10, warmup=2, note="target >= 0.5x cuBLAS's speed: ratio <= 2"),
    Row("matmul-gpu-4096-tiled", f"CUDA matmul {GPU_N} x {GPU_N} float32, tiled in shared memory (method "
        "\"tiled\")", "gpu_matmul_tiled", "gpu_matmul_cublas", reference_label="cuBLAS", steps=10, warmup=2),
    Row("gpu-scan", "CUDA selective scan (b=8, l=1024, d=256, n=16), forward, host copies included", "gpu_scan",
        "cpu_scan", reference_label="CPU kernel", steps=5, warmup=1),
]
