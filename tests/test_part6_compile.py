"""Every kernel compiled for real GPUs, with no GPU: numba's compile_ptx for Colab's T4 (sm_75) and
the H100 (sm_90), of every kernel of course.kernels and of the part-6 solutions; and the part-6
checks, which refuse a kernel that the simulator runs but no GPU would compile.

Compiling needs NVIDIA's NVVM (the `dev` extra installs it where it has wheels); where it cannot be
had, those tests are skipped with the reason. The check's own note for that case is tested
everywhere, with NVVM made unavailable.
"""

import functools
import importlib
import json
import linecache
import pkgutil
from pathlib import Path

import numpy as np
import pytest

import course.kernels as K
from course.exercises import check, part6
from course.kernels import compile as C
from course.kernels import cuda

from numba import float32  # noqa: E402  (after course.kernels, which chooses the CUDA backend)

pytestmark = pytest.mark.part6
ROOT = Path(__file__).resolve().parent.parent
TPB = 32


@pytest.fixture(scope="module")
def nvvm():
    ok, why = C.available()
    if not ok:
        pytest.skip(f"cannot compile kernels for a GPU here: {why}")


def compiles(kernel, args, name):
    """PTX for both architectures, or the test fails with numba's reason in one line."""
    try:
        ptx = C.compile_ptx(kernel, args)
    except C.CompileError as err:
        pytest.fail(f"{name}: {err}")
    assert set(ptx) == set(C.ARCHS)
    for (major, minor), text in ptx.items():
        assert f".target sm_{major}{minor}" in text, f"{name}: the PTX for sm_{major}{minor} names another target"
        assert ".entry" in text, f"{name}: the PTX has no kernel entry point"
    return ptx


def f32(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# ----- the module itself -----------------------------------------------------------------------------


@cuda.jit(device=True)
def twice(v):
    return v * 2


@cuda.jit
def scale_twice(x, alpha, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = twice(alpha * x[i])


@cuda.jit
def block_sum_constant(x, partial):
    cache = cuda.shared.array(TPB, float32)  # a global constant: known when the kernel compiles
    t = cuda.threadIdx.x
    cache[t] = x[cuda.grid(1)] if cuda.grid(1) < x.size else 0
    cuda.syncthreads()
    if t == 0:
        acc = float32(0)
        for j in range(TPB):
            acc += cache[j]
        partial[cuda.blockIdx.x] = acc


@cuda.jit
def tile_from_the_library(a, c):
    c[0, 0] = a[0, 0] * K.TILE  # a constant of the course, through its module


@cuda.jit
def shared_sized_by_block(x, partial):
    cache = cuda.shared.array(cuda.blockDim.x, float32)
    cache[cuda.threadIdx.x] = x[cuda.grid(1)]
    partial[0] = cache[0]


def test_the_signature_comes_from_example_arguments():
    sig = C.signature((f32(3), np.float32(2), np.zeros((2, 3), np.float64), 4, K.cuda.to_device(f32(5))))
    assert [str(t) for t in sig] == ["array(float32, 1d, C)", "float32", "array(float64, 2d, C)", "int64",
                                     "array(float32, 1d, C)"]


def test_a_kernel_with_a_device_function_compiles_from_arguments_or_a_signature(nvvm):
    x = f32(37)
    compiles(scale_twice, (x, np.float32(2), x), "scale_twice")
    from_string = C.compile_ptx(scale_twice, "void(float32[::1], float32, float32[::1])")
    assert set(from_string) == set(C.ARCHS) and "fma.rn.f32" in from_string[(9, 0)]
    only = C.compile_ptx(scale_twice.py_func, (x, np.float32(2), x), archs=((8, 0),))
    assert list(only) == [(8, 0)] and ".target sm_80" in only[(8, 0)]


def test_global_constants_and_the_course_s_constants_reach_the_compiler(nvvm):
    compiles(block_sum_constant, (f32(40), np.zeros(2, np.float32)), "block_sum_constant")
    compiles(tile_from_the_library, (f32(4, 4), np.zeros((4, 4), np.float32)), "tile_from_the_library")


def test_a_kernel_that_cannot_compile_is_one_line_with_numba_s_reason_and_the_line(nvvm):
    with pytest.raises(C.CompileError) as info:
        C.compile_ptx(shared_sized_by_block, (f32(40), np.zeros(2, np.float32)))
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("numba cannot compile shared_sized_by_block for a GPU (sm_75): ")
    assert "shared.array" in message and "constant known when the kernel is compiled" in message
    assert "at line 2 of shared_sized_by_block: `cache = cuda.shared.array(cuda.blockDim.x, float32)`" in message
    assert info.value.line == 2 and "Typing" in info.value.detail


def test_numba_s_message_becomes_its_reason_in_one_line():
    typing = ("No implementation of function Function(<function shared.array at 0x7f12ab>) found for signature:\n"
              " \n >>> array(int32, class(float32))\n \nThere are 2 candidate implementations:\n"
              " - Of which 2 did not match due to:\n")
    assert C._reason(typing) == ("No implementation of function shared.array found for signature array(int32, "
                                 "class(float32)) (the size of a shared or local array must be a constant known "
                                 "when the kernel is compiled (a number or a global constant), not a value the "
                                 "kernel reads or computes)")
    lowering = ("Failed in cuda mode pipeline (step: cuda native lowering)\nNRT required but not enabled\n"
                "During: lowering \"l = build_list(items=[...])\" at k.py (3)")
    assert C._reason(lowering).startswith("NRT required but not enabled (a kernel cannot allocate memory")
    assert C._reason("\x1b[1mNameError: name 'n' is not defined\x1b[0m") == "NameError: name 'n' is not defined"
    assert C._reason("") == "numba gave no reason"


def test_a_kernel_must_be_a_function():
    with pytest.raises(TypeError, match="expected a kernel"):
        C.compile_ptx(42, "void()")


# ----- every kernel of the library -------------------------------------------------------------------


def _library_calls():
    """Run every host function of course.kernels once, on small awkward shapes."""
    x, w, b = f32(3, 20), f32(20, seed=1), f32(20, seed=2)
    K.vector_add(f32(37), f32(37, seed=1))
    K.reduce_sum(f32(70))
    K.reduce_rows(f32(5, 6))
    K.add_row(f32(5, 6), f32(6))
    s = K.softmax(x)
    K.softmax_backward(s, f32(3, 20, seed=3))
    _, mean, rstd = K.layer_norm(x, w, b, return_stats=True)
    K.layer_norm_backward(x, w, mean, rstd, f32(3, 20, seed=4))
    from course.kernels.matmul import METHODS

    for method in METHODS:
        K.matmul(f32(5, 3), f32(3, 7), method=method)
        K.matmul_into(f32(2, 5, 3), f32(2, 3, 7), np.zeros((2, 5, 7), np.float32), method=method)  # batched
    u, delta = f32(2, 5, 3), np.abs(f32(2, 5, 3, seed=1)) * 0.1
    A, Bm, Cm, D = -np.abs(f32(3, 4, seed=2)), f32(2, 5, 4, seed=3), f32(2, 5, 4, seed=4), f32(3, seed=5)
    _, states = K.selective_scan(u, delta, A, Bm, Cm, D, return_states=True)
    K.selective_scan_backward(f32(2, 5, 3, seed=6), u, delta, A, Bm, Cm, D, states)
    from course.kernels import fused_cuda

    q, k, v = f32(2, 5, 4), f32(2, 5, 4, seed=1), f32(2, 5, 4, seed=2)
    out, lse = fused_cuda.attention(q, k, v, causal=True)
    fused_cuda.attention_backward(q, k, v, out, lse, f32(2, 5, 4, seed=3), causal=True)
    fused_cuda.cross_entropy(f32(3, 7), np.array([1, 6, 0]), ignore_index=6)
    _device_calls()


def _device_calls():
    """Tensors on "cuda": every primitive function once, then a GPT and a Mamba training step
    (dropout, both optimizers) launch the device's own kernels."""
    from course.gpt import GPT, GPTConfig
    from course.kernels import primitives
    from course.kernels.device import CudaArray, to_device
    from course.mamba import Mamba, MambaConfig
    from course.optim import SGD, AdamW, clip_grad_norm_

    a, c = to_device(f32(3, 4)), to_device(np.abs(f32(3, 4, seed=1)) + 0.5)
    for name, (arity, _) in primitives.FUNCTIONS.items():
        primitives.elementwise(name, CudaArray.empty((3, 4)), [a, c, a][:arity] if name != "where" else [a > 0, a, 1.5])
    to_device(f32(2, primitives.LONG_ROW + 3)).sum(axis=1)  # the one-block-per-row reduction
    (to_device(f32(2, 3)).astype(np.float64) @ to_device(f32(3, 2)).astype(np.float64))  # the generic matmul
    from course.tensor import Tensor

    logits64 = Tensor(f32(3, 4).astype(np.float64), requires_grad=True)
    import course.tensor.functional as F

    F.cross_entropy(logits64.to("cuda"), np.array([1, 0, 3])).backward()  # float64: the composed version
    rng = np.random.default_rng(0)
    gpt = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8, dropout=0.1)).to("cuda")
    _, loss = gpt(rng.integers(0, 11, (2, 4)), rng.integers(0, 11, (2, 4)))
    loss.backward()
    clip_grad_norm_(gpt.parameters(), 1.0)
    AdamW(gpt.parameters()).step()
    mamba = Mamba(MambaConfig(d_model=8, n_layer=1, vocab_size=11, d_state=4, d_conv=3)).to("cuda")

    F.cross_entropy(mamba(rng.integers(0, 11, (2, 4))), rng.integers(0, 11, (2, 4))).backward()
    SGD(mamba.parameters(), lr=0.1, momentum=0.9).step()


def _library_modules():
    skip = {"_backend", "_ptx_worker", "compile", "trace", "cpu", "launch"}
    for info in pkgutil.iter_modules(K.__path__):
        if info.name not in skip:
            yield importlib.import_module(f"course.kernels.{info.name}")


def _kernels_of(namespace):
    """{name: kernel} of the @cuda.jit kernels (not device functions) in a namespace."""
    found = {}
    for name, value in namespace.items():
        jitted = C._jitted(value)
        if jitted is not None and not jitted[1]:
            found[name] = value
    return found


@pytest.fixture(scope="module")
def library_launches():
    """(kernel, the arguments of its first launch) for every kernel the host functions launch."""
    launched = {}
    modules = list(_library_modules())
    originals = {m: m.launch for m in modules if getattr(m, "launch", None) is K.launch}

    def recording(kernel, griddim, blockdim, *args):
        launched.setdefault(kernel.py_func.__name__, (kernel, args))
        return K.launch(kernel, griddim, blockdim, *args)

    try:
        for module in originals:
            module.launch = recording
        _library_calls()
    finally:
        for module, original in originals.items():
            module.launch = original
    return launched


def test_every_library_kernel_is_launched_by_the_host_calls_here(library_launches):
    defined = {}
    for module in _library_modules():
        for name, kernel in _kernels_of(vars(module)).items():
            defined[kernel.py_func.__name__] = module.__name__
    missing = sorted(f"{module}.{name}" for name, module in defined.items() if name not in library_launches)
    assert not missing, f"no host call in _library_calls launches {missing}: add one, so that it is compiled"


def test_every_library_kernel_compiles_for_real_gpus(nvvm, library_launches):
    for name, (kernel, args) in sorted(library_launches.items()):
        compiles(kernel, args, f"course.kernels: {name}")


def test_the_checks_own_kernels_compile(nvvm):
    part6._kernels()  # gives the checks' module its `cuda`
    x = f32(9)
    compiles(part6._fill, (np.zeros((3, 4), np.float32),), "part6._fill")
    compiles(part6._relu_forward, (x, np.zeros_like(x)), "part6._relu_forward")
    compiles(part6._relu_backward, (x, x, np.zeros_like(x)), "part6._relu_backward")
    compiles(part6._transpose_reference, (f32(40, 33), f32(33, 40)), "part6._transpose_reference")


# ----- every kernel of the solutions -----------------------------------------------------------------


# Arguments of the types each exercise's check passes (the same kernel names as in the notebooks).
SOLUTION_ARGS = {
    "scale_kernel": (f32(37), np.float32(2), f32(37)),
    "add_matrices": (f32(5, 7), f32(5, 7), f32(5, 7)),
    "scale_strided": (f32(37), np.float32(2), f32(37)),
    "reverse_in_place": (f32(8),),
    "block_sum": (f32(37), f32(2)),
    "rms_norm_rows": (f32(2, 7), f32(7), np.float32(1e-5), f32(2, 7)),
    "matmul_bt": (f32(5, 3), f32(7, 3), f32(5, 7)),
    "matmul_bt_tiled": (f32(5, 3), f32(7, 3), f32(5, 7)),
    "scan_kernel": (f32(2, 5, 3), f32(2, 5, 3), f32(3, 4), f32(2, 5, 4), f32(2, 5, 4), f32(3), f32(2, 5, 3)),
    "softmax_backward_kernel": (f32(2, 7), f32(2, 7), f32(2, 7)),
    "relu_forward_kernel": (f32(3), f32(3)),
    "relu_backward_kernel": (f32(3), f32(3), f32(3)),
    "reverse_by_swaps": (f32(8),),
    "block_sum_by_shuffles": (f32(37), f32(2)),
    "total_by_warps": (f32(37), f32(1)),
    "transpose_tiles": (f32(40, 33), f32(33, 40)),
    "matmul_register_step": (f32(17, 9), f32(9, 20), f32(17, 20)),
    "zip_add_kernel": (f32(12), (1, 1, 3, 4), f32(6), 0, (0, 0, 1, 0), f32(4), 0, (0, 0, 0, 1)),
    "embedding_backward_kernel": (f32(4, 5), np.array([1, 3, 1, 0, 3, 3]), f32(6, 5)),
    "sum_axis_kernel": (f32(4), (1, 1, 3, 4), f32(12), 0, (0, 0, 4, 1), 2),
}
SOLUTIONS = sorted((ROOT / "solutions" / "6-kernels").glob("*.ipynb"))


@functools.lru_cache(maxsize=None)
def _solution_kernels(path):
    """Run the notebook's code cells (not the Colab install cell) with `check` doing nothing (nbval
    runs the real checks on the solutions); return the kernels its cells define (once per notebook:
    two tests ask)."""
    def skipped(exercise_id, candidate):
        return None

    namespace = {"__name__": "__solution__", "check": skipped}
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    for number, cell in enumerate(cells):
        source = "".join(cell["source"])
        if 'find_spec("course")' in source:  # the install cell
            continue
        filename = f"<{path.name}, code cell {number}>"
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)  # numba's errors quote it
        exec(compile(source, filename, "exec"), namespace)
        namespace["check"] = skipped  # again after the cell that imports the real one
    return {name: k for name, k in _kernels_of(namespace).items() if k.py_func.__code__.co_filename.startswith("<")}


CPU_ONLY = {"6.5-fusion-and-flash-attention.ipynb"}  # its exercises are CPU kernels (numba.njit)


@pytest.mark.parametrize("path", SOLUTIONS, ids=[p.name for p in SOLUTIONS])
def test_every_solution_kernel_compiles_for_real_gpus(nvvm, path):
    kernels = _solution_kernels(path)
    assert kernels or path.name in CPU_ONLY, f"{path.name}: no kernel found"
    for name, kernel in sorted(kernels.items()):
        assert name in SOLUTION_ARGS, f"{path.name} defines {name}: add example arguments for it to SOLUTION_ARGS"
        compiles(kernel, SOLUTION_ARGS[name], f"{path.name}: {name}")


def test_solutions_define_kernels():
    assert SOLUTIONS, "no part-6 solutions found"
    found = set()
    for path in SOLUTIONS:
        found |= set(_solution_kernels(path))
    assert {"block_sum", "scan_kernel", "matmul_bt_tiled"} <= found


# ----- the checks refuse what a GPU would ---------------------------------------------------------------


@cuda.jit
def block_sum_shared_by_block_dim(x, partial):
    cache = cuda.shared.array(cuda.blockDim.x, float32)  # the simulator allows it; a GPU does not
    t = cuda.threadIdx.x
    i = cuda.grid(1)
    cache[t] = x[i] if i < x.size else 0
    cuda.syncthreads()
    step = cuda.blockDim.x // 2
    while step > 0:
        if t < step:
            cache[t] += cache[t + step]
        cuda.syncthreads()
        step //= 2
    if t == 0:
        partial[cuda.blockIdx.x] = cache[0]


@cuda.jit
def block_sum_with_a_list(x, partial):
    cache = cuda.shared.array(32, float32)
    t = cuda.threadIdx.x
    i = cuda.grid(1)
    cache[t] = x[i] if i < x.size else 0
    cuda.syncthreads()
    steps = [16, 8, 4, 2, 1]  # a Python list: a GPU kernel cannot build one
    for k in range(5):
        step = steps[k]
        if t < step:
            cache[t] += cache[t + step]
        cuda.syncthreads()
    if t == 0:
        partial[cuda.blockIdx.x] = cache[0]


@cuda.jit
def rms_norm_shared_by_block_dim(x, weight, eps, out):
    cache = cuda.shared.array(cuda.blockDim.x, float32)
    row, t, n = cuda.blockIdx.x, cuda.threadIdx.x, x.shape[1]
    s = 0.0
    for j in range(t, n, cuda.blockDim.x):
        s += x[row, j] * x[row, j]
    cache[t] = s
    cuda.syncthreads()
    step = cuda.blockDim.x // 2
    while step > 0:
        if t < step:
            cache[t] += cache[t + step]
        cuda.syncthreads()
        step //= 2
    scale = 1 / (cache[0] / n + eps) ** 0.5
    for j in range(t, n, cuda.blockDim.x):
        out[row, j] = x[row, j] * scale * weight[j]


@cuda.jit
def scan_local_sized_at_run_time(u, delta, A, B, C, D, y):
    i = cuda.grid(1)
    batch, length, channels = u.shape
    n = A.shape[1]
    if i < batch * channels:
        seq, d = i // channels, i % channels
        h = cuda.local.array(n, float32)  # n is only known when the kernel runs
        for s in range(n):
            h[s] = 0
        for t in range(length):
            dt, x = delta[seq, t, d], u[seq, t, d]
            acc = D[d] * x
            for s in range(n):
                h[s] = (2.718281828459045 ** (dt * A[d, s])) * h[s] + dt * B[seq, t, s] * x
                acc += C[seq, t, s] * h[s]
            y[seq, t, d] = acc


CANNOT_COMPILE = [
    ("6.2.2", block_sum_shared_by_block_dim, ["shared.array", "constant known when the kernel is compiled",
                                              "line 2 of block_sum_shared_by_block_dim"]),
    ("6.2.2", block_sum_with_a_list, ["cannot allocate memory as it runs", "line 7 of block_sum_with_a_list",
                                      "`steps = [16, 8, 4, 2, 1]"]),
    ("6.2.3", rms_norm_shared_by_block_dim, ["shared.array", "line 2 of rms_norm_shared_by_block_dim"]),
    ("6.3.4", scan_local_sized_at_run_time, ["local.array", "constant known when the kernel is compiled",
                                             "`h = cuda.local.array(n, float32)"]),
]


@pytest.mark.parametrize("exercise_id, kernel, words", CANNOT_COMPILE,
                         ids=[f"{e}-{k.py_func.__name__}" for e, k, _ in CANNOT_COMPILE])
def test_a_kernel_only_the_simulator_runs_fails_its_check(nvvm, exercise_id, kernel, words):
    result = check(exercise_id, kernel)
    assert result.status == "failed", result.message
    assert "numba cannot compile" in result.message and "for a GPU" in result.message, result.message
    for word in words:
        assert word in result.message, result.message
    assert result.message.count("\n") == 0


def test_without_nvvm_the_checks_say_once_that_they_cannot_compile(monkeypatch, capsys):
    monkeypatch.setattr(C, "available", lambda: (False, "NVVM is not installed (test): pip install it"))
    monkeypatch.setattr(part6, "_said_no_compiler", [])
    first = check("6.2.2", block_sum_shared_by_block_dim)
    second = check("6.2.2", block_sum_shared_by_block_dim)
    out = capsys.readouterr().out
    assert first.passed and second.passed  # on the tracer alone it cannot be told apart from a right answer
    assert out.count("they cannot compile for a GPU here, NVVM is not installed (test)") == 1, out


def test_a_stub_is_not_attempted_and_says_nothing_about_compiling(monkeypatch, capsys):
    monkeypatch.setattr(C, "available", lambda: (False, "NVVM is not installed (test)"))
    monkeypatch.setattr(part6, "_said_no_compiler", [])

    @cuda.jit
    def stub(x, partial):
        raise NotImplementedError  # your code here

    assert check("6.2.2", stub).status == "not attempted"
    assert "cannot compile" not in capsys.readouterr().out


def test_when_the_compiling_process_cannot_start_nvvm_is_unavailable_with_the_reason(monkeypatch):
    def broken(*args, **kwargs):
        raise OSError("no such interpreter")

    monkeypatch.setattr(C, "_worker", None)
    monkeypatch.setattr(C.subprocess, "Popen", broken)
    ok, why = C.available()
    assert not ok and "could not start (OSError: no such interpreter)" in why
    with pytest.raises(RuntimeError, match="cannot compile kernels for a GPU here"):
        C.compile_ptx(shared_sized_by_block, "void(float32[:], float32[:])")
