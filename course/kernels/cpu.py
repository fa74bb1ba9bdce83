"""The same operations on the CPU, compiled by Numba (`@njit`).

These are the CPU twins of the CUDA kernels: the same algorithms, where a GPU block becomes an
iteration of a loop. The heavy ones (the matrix product, the scan, and lesson 6.5's fused kernels)
share their outer loop between the CPU's threads: each is a one-thread kernel over a range of its
jobs (`job0` to `job1`), compiled with `nogil=True`, and `_share` runs it on several Python threads
at once, each on its own range. The others read each number once or twice, so memory, not
arithmetic, sets their speed, and they stay on one thread. They work in float32 and float64.

Why not numba's `prange`? It compiles each parallel loop into functions of their own, and took two
to three times as long to compile as the same loop on one thread (the scan's backward: 4.7 s
against 1.2 s), for every dtype; a first call pays that. A one-thread kernel is also the same code
on one thread or several.

A parallel loop is not free: the threads start together and the call returns only when the last
one is done. When the cores are busy with other programs, that last thread can wait milliseconds
for its turn, on every call, and a training step makes hundreds of calls. So `_share` gives a
kernel several threads only when there is enough work to share and threads to spare: it honours
OMP_NUM_THREADS (the limit NumPy's BLAS obeys; `make test` sets it to 1) unless NUMBA_NUM_THREADS
is set.

The matrix product is the interesting one: `matmul` is built as the vendor BLAS libraries build
theirs (a register micro-kernel, packing, cache blocking, threads over blocks of C; see the
section below and lesson 6.5), and reads its operands through their strides, so `matmul_bt(a,
bt)` (a @ bt.T) and `matmul_at(at, b)` (at.T @ b), the products of a Linear's backward, never
transpose anything first.
"""

import math
import os
import threading

import numba
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils, compiler
from numba.core.imputils import impl_ret_borrowed
from numba.extending import intrinsic, overload, register_jitable
from numba.np.ufunc import parallel as _numba_parallel  # whether numba's own thread pool has started

from .launch import count

# The rows kernels may reorder sums (fastmath's reassociation, so loops vectorise) but must keep nan
# and inf as NumPy does: a row holding one gives nan, never an error. Without "nnan"/"ninf" the
# compiler may not assume they are absent, and error_model="numpy" makes 1/0 give inf, not raise.
ROWS_FASTMATH = {"nsz", "arcp", "contract", "afn", "reassoc"}


# Below this many multiply-adds a call takes well under a millisecond on one thread, and sharing it
# out costs more than it saves.
PARALLEL_WORK = 1 << 21


def threads():
    """The threads a parallel loop may use: numba's count, capped by OMP_NUM_THREADS unless
    NUMBA_NUM_THREADS is set (`OMP_NUM_THREADS=1` asks every library for one thread).

    numba's count is read without starting numba's own pool of threads, which the kernels here
    never run on (`_share` has its own): `numba.get_num_threads()` starts it, on OpenMP by default,
    the runtime that PyTorch's CPU operations run on, and with it started PyTorch's GPT step took
    1.7x as long in the same process. Until something starts the pool (`numba.set_num_threads`
    does), its count is numba's configured one."""
    n = numba.get_num_threads() if _numba_pool_started() else numba.config.NUMBA_NUM_THREADS
    omp = os.environ.get("OMP_NUM_THREADS", "")
    if "NUMBA_NUM_THREADS" not in os.environ and omp.isdigit() and int(omp) > 0:
        n = min(n, int(omp))
    return n


def _numba_pool_started():
    return getattr(_numba_parallel, "_is_initialized", True)  # numba's own flag; if it is gone, ask numba


class _ArraysApart(compiler.Compiler):
    """numba's compiler, told that no two arrays a kernel is given overlap in memory (LLVM's
    `noalias`). Without it, a store into one output array might change what another array holds,
    so the compiler reloads every value after each store and cannot keep sums in registers: the
    scan's backward ran 2.3 times slower (11.8 ms against 5.2 ms at the bench's sizes). numba tells
    the compiler the same of the arrays in a `prange` loop's body, when it finds none that overlap.
    The host functions here and in `fused` give these kernels outputs that overlap none of their
    other arrays (fresh results, or the optimizer's own state), so it holds; inputs may be the same
    array, as they are only read."""

    def __init__(self, typingctx, targetctx, library, args, return_type, flags, locals):
        flags.noalias = True
        super().__init__(typingctx, targetctx, library, args, return_type, flags, locals)


def range_kernel(**options):
    """The decorator of a kernel that `_share` runs: `numba.njit` with nogil (it lets go of Python's
    lock while it runs, so that several threads run it at once), cached, its arrays apart."""
    return njit(cache=True, nogil=True, pipeline_class=_ArraysApart, **options)


class _Helper:
    """A thread that runs a range of a kernel's jobs when asked. Two locks pass the work: the caller
    releases `go`, the helper releases `done` when it has finished. A call costs about 18
    microseconds on 2 cores, against about 50 through a ThreadPoolExecutor's queue and futures."""

    def __init__(self):
        self.go, self.done = threading.Lock(), threading.Lock()
        self.go.acquire()
        self.done.acquire()
        self.work, self.error = None, None
        threading.Thread(target=self._loop, name="course-cpu", daemon=True).start()

    def _loop(self):
        while True:
            self.go.acquire()
            kernel, args = self.work
            try:
                kernel(*args)
            except BaseException as err:  # raised again in the caller's thread
                self.error = err
            self.work = None
            self.done.release()

    def start(self, kernel, args):
        self.work, self.error = (kernel, args), None
        self.go.release()

    def wait(self):
        """Wait until the helper has finished; (its error or None, a KeyboardInterrupt or None). A
        Ctrl-C (the notebook's stop button) while waiting does not end the wait: the helper is still
        writing into the arrays, and a wait cut short would leave it out of step with the next call."""
        done, interrupted = False, None
        while not done:
            try:
                done = self.done.acquire()
            except KeyboardInterrupt as stop:
                interrupted = stop
        error, self.error = self.error, None
        return error, interrupted


_helpers = []
_helpers_busy = threading.Lock()  # one caller at a time; a second runs its kernel on its own thread


def _forget_helpers():  # a forked child has none of its parent's threads
    global _helpers, _helpers_busy
    _helpers, _helpers_busy = [], threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_helpers)


def _share(kernel, work, jobs, *args):
    """Run `kernel(*args, job0, job1)` over the jobs 0 .. jobs - 1, on as many threads as `work`
    (multiply-adds) deserves: each thread a contiguous range of the jobs, the calling thread the
    first. One thread runs it in the calling thread, with no one to wait for."""
    n = min(threads() if work >= PARALLEL_WORK else 1, jobs)
    if n <= 1 or not _helpers_busy.acquire(blocking=False):
        kernel(*args, 0, jobs)
        return
    try:
        while len(_helpers) < n - 1:
            _helpers.append(_Helper())
        bounds = [jobs * i // n for i in range(n + 1)]
        for i in range(1, n):
            _helpers[i - 1].start(kernel, args + (bounds[i], bounds[i + 1]))
        try:
            kernel(*args, bounds[0], bounds[1])
        finally:
            waited = [helper.wait() for helper in _helpers[:n - 1]]  # every helper, whatever happened
        for error, interrupted in waited:
            if interrupted is not None:
                raise interrupted
        for error, _ in waited:
            if error is not None:
                raise error
    finally:
        _helpers_busy.release()


# ----- exp that vectorises (the scan's, and the fused kernels' of lesson 6.5) -------------------------
# A compiled loop that calls math.exp calls the C library once per number; these are written with
# multiply-adds and integer operations only, so the compiler turns the loop into vector
# instructions: 4 float64 or 8 float32 numbers at a time on AVX2.
@intrinsic
def _bits_as_float(typingctx, bits):
    """The float whose bits are those of the integer `bits`: a float64 for an int64, a float32 for an
    int32 (a reinterpretation, not a conversion)."""
    sig = (types.float64 if bits == types.int64 else types.float32)(bits)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(signature.return_type))

    return sig, codegen


@intrinsic
def _float_bits(typingctx, x):
    """The bits of the float `x` as an integer of its width (int64 for float64, int32 for float32)."""
    integer = types.int64 if x == types.float64 else types.int32
    sig = integer(x)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(signature.return_type))

    return sig, codegen


_LOG2E = 1.4426950408889634
_LN2_HI = 0.693145751953125  # ln 2 split in two, so n * _LN2_HI is exact for |n| < 2048
_LN2_LO = 1.4286068203094173e-06
# Adding 1.5 * 2^52 to a float64 below 2^51 rounds it to an integer, kept in the low bits of the
# sum's mantissa: n without a float-to-integer conversion (AVX2 has none for 64-bit integers).
_ROUND64 = 6755399441055744.0
_ROUND32 = 12582912.0  # the same for float32: 1.5 * 2^23


@njit(cache=True, fastmath=True, error_model="numpy", inline="always")
def _exp64(x):
    """exp(x) in float64: x = n ln2 + r with |r| <= ln2 / 2, exp(r) by its Taylor series to r^11
    (error below 1e-14), 2^n by writing n into the exponent bits."""
    x = np.float64(x)
    x = min(max(x, -708.0), 709.0)
    bits = _float_bits(x * _LOG2E + _ROUND64)  # n + 1.5 * 2^52, as bits: n sits in the low 32
    n = np.float64(np.int32(bits))
    r = (x - n * _LN2_HI) - n * _LN2_LO
    p = 1.0 / 39916800.0
    p = p * r + 1.0 / 3628800.0
    p = p * r + 1.0 / 362880.0
    p = p * r + 1.0 / 40320.0
    p = p * r + 1.0 / 5040.0
    p = p * r + 1.0 / 720.0
    p = p * r + 1.0 / 120.0
    p = p * r + 1.0 / 24.0
    p = p * r + 1.0 / 6.0
    p = p * r + 0.5
    p = p * r + 1.0
    p = p * r + 1.0
    return p * _bits_as_float((bits + 1023) << 52)  # 2^n: n + 1023 in the exponent's bits


_F32 = np.float32
_LN2_HI32 = _F32(0.693115234375)  # 2839 / 4096: n * _LN2_HI32 is exact in float32 for |n| <= 128
_LN2_LO32 = _F32(math.log(2) - 0.693115234375)


@njit(cache=True, fastmath=True, error_model="numpy", inline="always")
def _exp32(x):
    """exp(x) in float32, as `_exp64`, with twice as many numbers per vector instruction: the
    Taylor series to r^7, whose own error (below 1e-8) is under float32's rounding; the result is
    within 3.1e-7 of exp (relative), two or three roundings of float32."""
    x = min(max(x, _F32(-87.0)), _F32(88.0))
    bits = _float_bits(x * _F32(_LOG2E) + _F32(_ROUND32))  # n + 1.5 * 2^23, as bits
    n_bits = np.int32(bits - _float_bits(_F32(_ROUND32)))  # n (numba computes integers in 64 bits)
    n = _F32(n_bits)
    r = (x - n * _LN2_HI32) - n * _LN2_LO32
    p = _F32(1.0 / 5040.0)
    p = p * r + _F32(1.0 / 720.0)
    p = p * r + _F32(1.0 / 120.0)
    p = p * r + _F32(1.0 / 24.0)
    p = p * r + _F32(1.0 / 6.0)
    p = p * r + _F32(0.5)
    p = p * r + _F32(1.0)
    p = p * r + _F32(1.0)
    return p * _bits_as_float(np.int32((n_bits + 127) << 23))


def _exp(x):
    """exp(x) in the precision of x: `_exp32` for a float32, `_exp64` for anything else."""
    return math.exp(x)


@overload(_exp, inline="always", jit_options={"fastmath": True, "error_model": "numpy"})
def _exp_typed(x):
    if x == types.float32:
        return lambda x: _exp32(x)
    return lambda x: _exp64(x)


# ----- elementwise and sums ---------------------------------------------------------------------------


@njit(cache=True)
def _vector_add(a, b, out):
    for i in range(out.size):
        out[i] = a[i] + b[i]


def _floats(x, name, what="x"):
    x = np.asarray(x)
    if not np.issubdtype(x.dtype, np.floating) or x.dtype == np.float16:
        raise TypeError(f"cpu.{name}: {what} has dtype {x.dtype}; the CPU kernels take float32 or float64")
    return np.ascontiguousarray(x)


def vector_add(a, b):
    a, b = _floats(a, "vector_add", "a"), _floats(b, "vector_add", "b")
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(f"cpu.vector_add: shapes {a.shape} and {b.shape} (dtypes {a.dtype}, {b.dtype}) differ")
    out = np.empty_like(a)
    _vector_add(a.ravel(), b.ravel(), out.ravel())
    count("cpu.vector_add")
    return out


@njit(cache=True)
def _reduce_sum(x):
    # Pairwise (a tree, as the GPU's): rounding errors grow with log(n), not n.
    if x.size <= 64:
        total = x.dtype.type(0)
        for i in range(x.size):
            total += x[i]
        return total
    half = x.size // 2
    return _reduce_sum(x[:half]) + _reduce_sum(x[half:])


def reduce_sum(x):
    x = _floats(x, "reduce_sum").ravel()
    count("cpu.reduce_sum")
    return x.dtype.type(_reduce_sum(x) if x.size else 0)


@njit(cache=True)
def _column_sum(x, out):
    # Row after row, adding each whole row to the running sums: memory is read in order (a loop
    # down each column would jump a row's length at every step) and the inner loop vectorises.
    out[:] = 0
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            out[j] += x[i, j]


def reduce_rows(x):
    """x.sum(axis=0)."""
    if np.ndim(x) == 0:
        raise ValueError("cpu.reduce_rows: takes an array with at least one axis")
    x = _floats(x, "reduce_rows")
    flat = x.reshape(x.shape[0], int(np.prod(x.shape[1:])))  # not -1: that fails on zero rows
    out = np.empty(flat.shape[1], dtype=x.dtype)
    _column_sum(flat, out)
    count("cpu.reduce_rows")
    return out.reshape(x.shape[1:])


@njit(cache=True)
def _add_row(x, row):
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            x[i, j] += row[j]


def add_row(x, row):
    """x + row for a 2-D array x and a vector row of x.shape[1] numbers (a bias)."""
    x, row = _floats(x, "add_row", "x"), _floats(row, "add_row", "row")
    if x.ndim != 2 or row.shape != x.shape[1:]:
        raise ValueError(f"cpu.add_row: shapes {x.shape} and {row.shape} do not fit: it takes (m, n) and (n,)")
    out = x.copy()
    _add_row(out, row.astype(x.dtype, copy=False))
    count("cpu.add_row")
    return out


# ----- softmax and layer norm over rows ------------------------------------------------------------------
@njit(cache=True)  # no fastmath: it would assume no infinities, and masks use -inf
def _softmax(x, out):
    for r in range(x.shape[0]):
        m = x[r, 0]
        for j in range(1, x.shape[1]):
            m = max(m, x[r, j])
        s = x.dtype.type(0)
        for j in range(x.shape[1]):
            e = np.exp(x[r, j] - m)  # <= 1: never overflows
            out[r, j] = e
            s += e
        inv = 1 / s
        for j in range(x.shape[1]):
            out[r, j] *= inv


@njit(cache=True, fastmath=True)
def _softmax_backward(s, g, dx):
    for r in range(s.shape[0]):
        dot = s.dtype.type(0)
        for j in range(s.shape[1]):
            dot += g[r, j] * s[r, j]
        for j in range(s.shape[1]):
            dx[r, j] = s[r, j] * (g[r, j] - dot)


def _rows(x, name):
    x = _floats(x, name)
    if x.ndim != 2:
        raise ValueError(f"cpu.{name}: takes a 2-D array (softmax over each row), got shape {x.shape}")
    return x


def softmax(x):
    x = _rows(x, "softmax")
    out = np.empty_like(x)
    if x.size:
        _softmax(x, out)
    count("cpu.softmax")
    return out


def softmax_backward(s, g):
    s, g = _rows(s, "softmax_backward"), _rows(g, "softmax_backward")
    if s.shape != g.shape:
        raise ValueError(f"cpu.softmax_backward: shapes {s.shape} and {g.shape} differ")
    dx = np.empty_like(s)
    if s.size:
        _softmax_backward(s, g.astype(s.dtype, copy=False), dx)
    count("cpu.softmax_backward")
    return dx


@njit(cache=True, fastmath=ROWS_FASTMATH, error_model="numpy")
def _layer_norm(x, weight, bias, eps, out, mean, rstd):
    n = x.shape[1]
    for r in range(x.shape[0]):
        s = x.dtype.type(0)
        for j in range(n):
            s += x[r, j]
        mu = s / n
        s = x.dtype.type(0)
        for j in range(n):
            d = x[r, j] - mu
            s += d * d
        rs = 1 / np.sqrt(s / n + eps)
        for j in range(n):
            out[r, j] = (x[r, j] - mu) * rs * weight[j] + bias[j]
        mean[r] = mu
        rstd[r] = rs


@njit(cache=True, fastmath=ROWS_FASTMATH, error_model="numpy")
def _layer_norm_backward(x, weight, mean, rstd, g, dx):
    n = x.shape[1]
    for r in range(x.shape[0]):
        mu, rs = mean[r], rstd[r]
        s1 = x.dtype.type(0)
        s2 = x.dtype.type(0)
        for j in range(n):
            gy = g[r, j] * weight[j]
            s1 += gy
            s2 += gy * (x[r, j] - mu) * rs
        s1 /= n
        s2 /= n
        for j in range(n):
            dx[r, j] = rs * (g[r, j] * weight[j] - s1 - (x[r, j] - mu) * rs * s2)


@njit(cache=True, fastmath=ROWS_FASTMATH, error_model="numpy")
def _layer_norm_params_backward(x, mean, rstd, g, dweight, dbias):
    # Sums down the columns, read row after row (in memory order), as in _column_sum.
    dweight[:] = 0
    dbias[:] = 0
    for r in range(x.shape[0]):
        for j in range(x.shape[1]):
            dweight[j] += g[r, j] * (x[r, j] - mean[r]) * rstd[r]
            dbias[j] += g[r, j]


def _params(weight, bias, n, dtype):
    weight = np.ones(n, dtype) if weight is None else _floats(weight, "layer_norm", "weight").astype(dtype, copy=False)
    bias = np.zeros(n, dtype) if bias is None else _floats(bias, "layer_norm", "bias").astype(dtype, copy=False)
    for what, p in (("weight", weight), ("bias", bias)):
        if p.shape != (n,):
            raise ValueError(f"cpu.layer_norm: rows of {n} numbers need a {what} of shape ({n},), got shape {p.shape}")
    return weight, bias


def layer_norm(x, weight=None, bias=None, eps=1e-5, return_stats=False):
    x = _rows(x, "layer_norm")
    weight, bias = _params(weight, bias, x.shape[1], x.dtype)
    out = np.empty_like(x)
    mean, rstd = np.empty(x.shape[0], x.dtype), np.empty(x.shape[0], x.dtype)
    if x.size:
        _layer_norm(x, weight, bias, x.dtype.type(eps), out, mean, rstd)
    count("cpu.layer_norm")
    return (out, mean, rstd) if return_stats else out


def layer_norm_backward(x, weight, mean, rstd, g):
    x, g = _rows(x, "layer_norm_backward"), _rows(g, "layer_norm_backward")
    if x.shape != g.shape:
        raise ValueError(f"cpu.layer_norm_backward: shapes {x.shape} and {g.shape} differ")
    weight, _ = _params(weight, None, x.shape[1], x.dtype)
    g = g.astype(x.dtype, copy=False)
    dx, dw, db = np.empty_like(x), np.empty(x.shape[1], x.dtype), np.empty(x.shape[1], x.dtype)
    if x.size:
        _layer_norm_backward(x, weight, mean, rstd, g, dx)
        _layer_norm_params_backward(x, mean, rstd, g, dw, db)
    else:
        dw[:], db[:] = 0, 0
    count("cpu.layer_norm_backward")
    return dx, dw, db


# ----- the matrix product ---------------------------------------------------------------------------------
# C = A B the way the vendor BLAS libraries compute it (GotoBLAS, BLIS), in four steps, each one a
# reason for speed that the lesson 6.5 measures:
#
# 1. A register micro-kernel. A (MR x NR) block of C is summed in vector registers over a run of k:
#    at each k it loads NR numbers of B (two vectors), and for each of the MR rows broadcasts one
#    number of A and does two fused multiply-adds. That is 2 MR multiply-adds for 2 vector loads
#    and MR broadcasts, and the 2 MR sums never leave the registers until the run ends. On AVX2
#    (16 registers of 256 bits, 8 float32) a 6 x 16 block takes 12 sums + 2 loaded vectors + 1
#    broadcast = 15 registers; on AVX-512 (32 registers of 512 bits, 16 float32) a 12 x 32 block
#    takes 24 + 2 + 1 = 27, and does four times the work per k. Numba's loop vectoriser does not
#    find this on its own (it vectorises the loop over k as a sum, and spills), so `_microkernel`
#    states it in LLVM's own vector instructions: a loop whose 2 MR sums are `<8 x float>` (or
#    `<16 x float>`) values, which the compiler keeps in registers.
# 2. Packing. The micro-kernel reads its numbers of A and B one after the other, in the order it
#    uses them: a panel of A (MR rows, k running) and one of B (NR columns, k running) are copied
#    into small contiguous buffers first. Reading A and B for the copy goes through their strides,
#    so a transposed view costs nothing more: `matmul_bt(a, bt)` is `a @ bt.T` with the view
#    `bt.T` and `matmul_at(at, b)` is `at.T @ b`; nobody transposes anything up front. A copy pays
#    only when its panel is used many times, so small products (attention's, one per head) read A,
#    and B where its rows are contiguous, in place: `_packs` decides.
# 3. Cache blocking. A block of KC rows of B (all its columns, up to NC) is packed once and stays
#    in the L3/L2 cache; a block of MC rows of A, packed, stays in L2; each NR-wide panel of the
#    packed B (KC x NR numbers: 16 KB in float32 on AVX2, 32 KB on AVX-512) stays in L1 while
#    every MR-row panel of A passes by. So each number is read from memory about once per block,
#    not once per use.
# 4. Threads over blocks of C: the MC-row blocks of C are independent (each thread packs its own
#    A block, and the B blocks its rows need), so `_share` hands each thread a range of them;
#    blocks are cut so each thread gets as many. A product of few rows and many columns is cut
#    into blocks of columns instead, so that no two threads pack the same part of B.
KC = 256  # k per block: a packed B panel (KC x NR) fits in L1, a packed A block (MC x KC) in L2
MC = 144  # rows of A per block (at most; fewer, so that every thread gets a share)
NC = 4096  # columns of B per packed block
PACK_BYTES = 1024  # A is packed for rows of C longer than this; either, for steps in k this long or longer
PACK_ROWS = 128  # B is packed for more rows of C than this


def _vector_bytes():
    """The width of the vectors the micro-kernel uses: 64 bytes where the CPU numba compiles for has
    AVX-512, 32 elsewhere (AVX2; on ARM a 32-byte vector is two NEON registers). numba compiles for
    this CPU's features (or those NUMBA_CPU_FEATURES names) and keys its cache of compiled kernels by
    them, so a kernel compiled for one width is never loaded where the other applies."""
    features = numba.config.CPU_FEATURES
    if features is None:
        from numba.core.codegen import get_host_cpu_features  # numba's own view: NUMBA_ENABLE_AVX=0 too

        features = get_host_cpu_features()
    return 64 if "+avx512f" in features.split(",") else 32


# VECTOR_BYTES / itemsize numbers per vector, two vectors per row: NR = 16 float32 or 8 float64 on
# AVX2, 32 or 16 on AVX-512; and MR rows, as many as the registers hold (see step 1).
VECTOR_BYTES = _vector_bytes()
MR = 12 if VECTOR_BYTES == 64 else 6  # rows of the register block


@register_jitable  # a plain function in Python, and compiled where kernels call it
def _panel_width(itemsize):
    """NR: the columns of the register block (and of a panel of B), two vectors of numbers this size."""
    return 2 * VECTOR_BYTES // itemsize


def _byte_address(builder, array, i, j):
    """The address of array[i, j] as a byte pointer, through the array's strides (any layout)."""
    s0, s1 = cgutils.unpack_tuple(builder, array.strides, 2)
    data = builder.bitcast(array.data, ir.IntType(8).as_pointer())
    return builder.gep(data, [builder.add(builder.mul(i, s0), builder.mul(j, s1))])


@intrinsic
def _microkernel(typingctx, kc, a, ai, ak, rows, b, bk, bj, c, ci, cj, accumulate):
    """c[ci:ci+MR, cj:cj+NR] = (c[...] if accumulate else 0) + a[ai:ai+MR, ak:ak+kc] @ b[bk:bk+kc, bj:bj+NR]:
    the sum over k of the outer product of a column of A (MR numbers) and a row of B (NR numbers).
    `a` may have any strides (a packed panel, or A itself); rows at or past `rows` read the last
    row again (the caller keeps only the first `rows` of C). Each row of `b` must be contiguous."""
    sig = types.void(kc, a, ai, ak, rows, b, bk, bj, c, ci, cj, accumulate)

    def codegen(context, builder, signature, args):
        kc, a, ai, ak, rows, b, bk, bj, c, ci, cj, accumulate = args
        dtype = signature.args[8].dtype
        ftype = context.get_value_type(dtype)
        size = context.get_abi_sizeof(ftype)
        lanes = VECTOR_BYTES // size
        vtype = ir.VectorType(ftype, lanes)
        intp = context.get_value_type(types.intp)
        const = lambda i: ir.Constant(intp, i)  # noqa: E731
        A, B, C = (context.make_array(signature.args[i])(context, builder, x) for i, x in ((1, a), (5, b), (8, c)))
        # fmuladd: one fused multiply-add where the CPU has the instruction, a multiply and an add where not
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vtype, [vtype] * 3),
                                             f"llvm.fmuladd.v{lanes}f{8 * size}")
        # Where each of the MR rows of A starts, and the bytes from one k to the next: worked out once.
        last = builder.sub(rows, const(1))
        a_rows = [_byte_address(builder, A, builder.add(ai, builder.select(builder.icmp_signed("<", const(r), rows),
                                                                          const(r), last)), ak) for r in range(MR)]
        a_step = cgutils.unpack_tuple(builder, A.strides, 2)[1]
        b_start, b_step = _byte_address(builder, B, bk, bj), cgutils.unpack_tuple(builder, B.strides, 2)[0]
        # The 2 MR sums: stack slots that LLVM's first pass (mem2reg) turns into registers.
        zero = ir.Constant(vtype, [ir.Constant(ftype, 0.0)] * lanes)
        sums = [[cgutils.alloca_once_value(builder, zero) for _ in range(2)] for _ in range(MR)]
        splat = ir.Constant(ir.VectorType(ir.IntType(32), lanes), [0] * lanes)
        # The block of C is written only after the loop; asking for its lines now (`llvm.prefetch`)
        # lets the cache fetch them while the loop runs, instead of stalling the stores at the end
        # on lines that a fresh result array does not have in cache. A product of 2048 x 128 by
        # 128 x 512 into a result not in cache, one thread: 2.44 ms without, 1.98 with (NumPy's
        # BLAS 1.87; 1.5 into a result in cache); a prefetch for writing gained less (2.19).
        i8p = ir.IntType(8).as_pointer()
        i32 = lambda v: ir.Constant(ir.IntType(32), v)  # noqa: E731
        prefetch = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [i8p] + [ir.IntType(32)] * 3), "llvm.prefetch.p0i8")
        # (address, 0: for reading, 3: keep in every cache level, 1: data)
        for i in range(MR):
            row = _byte_address(builder, C, builder.add(ci, const(i)), cj)
            for offset in (0, 2 * VECTOR_BYTES - 1):  # the first and the last byte of the row's two vectors
                builder.call(prefetch, [builder.gep(row, [const(offset)]), i32(0), i32(3), i32(1)])
        with cgutils.for_range(builder, kc) as loop:
            b_row = builder.bitcast(builder.gep(b_start, [builder.mul(loop.index, b_step)]), vtype.as_pointer())
            b_vectors = [builder.load(builder.gep(b_row, [const(h)]), align=1) for h in range(2)]
            a_offset = builder.mul(loop.index, a_step)
            for i in range(MR):
                x = builder.load(builder.bitcast(builder.gep(a_rows[i], [a_offset]), ftype.as_pointer()))
                x = builder.insert_element(ir.Constant(vtype, None), x, ir.Constant(ir.IntType(32), 0))
                x = builder.shuffle_vector(x, ir.Constant(vtype, None), splat)  # broadcast to every lane
                for h in range(2):
                    builder.store(builder.call(fma, [x, b_vectors[h], builder.load(sums[i][h])]), sums[i][h])
        add = builder.icmp_unsigned("!=", accumulate, ir.Constant(accumulate.type, 0))
        for i in range(MR):
            row = builder.bitcast(_byte_address(builder, C, builder.add(ci, const(i)), cj), vtype.as_pointer())
            for h in range(2):
                ptr = builder.gep(row, [const(h)])
                with builder.if_then(add):
                    builder.store(builder.fadd(builder.load(ptr, align=1), builder.load(sums[i][h])), sums[i][h])
                builder.store(builder.load(sums[i][h]), ptr, align=1)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _any_layout(typingctx, array):
    """`array` typed as read-only with any strides (numba's layout "A"): the same data, a wider
    type. A packed panel and the matrix itself then have one type, so the micro-kernel's call
    compiles once for both (numba compiles a call once per combination of its arguments' types)."""
    sig = array.copy(layout="A", readonly=True)(array)

    def codegen(context, builder, signature, args):
        return impl_ret_borrowed(context, builder, signature.return_type, args[0])

    return sig, codegen


@intrinsic
def _contiguous(typingctx, line):
    """The 1-D view `line`, of any stride (numba's layout "A"), typed as contiguous (layout "C"):
    for a line whose stride the caller has checked is one element. The data and the structure are
    the same; only the type numba compiles for changes, so that its loops read memory in order and
    vectorise."""
    sig = line.copy(layout="C")(line)

    def codegen(context, builder, signature, args):
        return impl_ret_borrowed(context, builder, signature.return_type, args[0])

    return sig, codegen


@njit(cache=True, inline="always")
def _copy_spread(dst, d0, step, src, n):
    """dst[d0 + i*step] = src[i] for i < n: a line of the matrix into a column of a panel."""
    if src.strides[0] == src.itemsize:
        line = _contiguous(src)
        for i in range(n):
            dst[d0 + i * step] = line[i]
    else:
        for i in range(n):
            dst[d0 + i * step] = src[i]


@njit(cache=True)
def _pack_a(A, i0, m, k0, kc, ap):
    """ap[p, k, r] = A[i0 + p*MR + r, k0 + k]: panels of MR rows, k running; past the last row, the
    last row again, as the micro-kernel reads an unpacked A (the caller keeps only the real rows).
    The copy reads along whichever axis of A is contiguous (its rows, or for a transposed view its
    columns), and writes each panel in order. A arrives typed as of any strides (one compiled
    version for every layout); a line whose stride is one number is retyped as contiguous
    (`_contiguous`), so that its loop reads memory in order."""
    if A.strides[0] < A.strides[1]:  # A is a transposed view: its columns are the lines in memory
        At = A.T
        for k in range(kc):
            line = At[k0 + k, i0:i0 + m]
            if line.strides[0] == line.itemsize:
                _spread_line(_contiguous(line), ap, k, m)
            else:
                _spread_line(line, ap, k, m)
    else:
        for p in range(ap.shape[0]):
            for r in range(MR):
                line = A[i0 + min(p * MR + r, m - 1), k0:k0 + kc]
                if line.strides[0] == line.itemsize:
                    _fill_panel_row(_contiguous(line), ap[p], r)
                else:
                    _fill_panel_row(line, ap[p], r)


@njit(cache=True, inline="always")
def _spread_line(line, ap, k, m):
    """ap[p, k, r] = line[p*MR + r] (the last number again past m): a line of A's transpose into
    column k of every panel."""
    full = m // MR
    for p in range(full):
        for r in range(MR):  # a constant count: the compiler unrolls it
            ap[p, k, r] = line[p * MR + r]
    for p in range(full, ap.shape[0]):  # the ragged last panel, if any
        for r in range(MR):
            ap[p, k, r] = line[min(p * MR + r, m - 1)]


@njit(cache=True, inline="always")
def _fill_panel_row(line, panel, r):
    """panel[k, r] = line[k]: a row of A into a panel."""
    for k in range(panel.shape[0]):
        panel[k, r] = line[k]


@njit(cache=True)
def _pack_b(B, k0, kc, j0, n, bp):
    """bp[q, k, s] = B[k0 + k, j0 + q*NR + s] (0 past the last column): panels of NR columns,
    k running; read along B's rows, or for a transposed view along its columns."""
    nr = bp.shape[2]
    if B.strides[0] < B.strides[1]:  # B is a transposed view (a Linear's weight, for x W^T)
        Bt = B.T
        for q in range(bp.shape[0]):
            dst, cols = bp[q].ravel(), min(nr, n - q * nr)
            for s in range(cols):
                _copy_spread(dst, s, nr, Bt[j0 + q * nr + s, k0:k0 + kc], kc)
            for s in range(cols, nr):
                for k in range(kc):
                    dst[k * nr + s] = 0
    else:
        for k in range(kc):  # a row of B at a time: one view of it, cut into its panels
            src = B[k0 + k, j0:j0 + n]
            if src.strides[0] == src.itemsize:
                _row_into_panels(_contiguous(src), bp, k, n)
            else:
                _row_into_panels(src, bp, k, n)


@njit(cache=True, inline="always")
def _row_into_panels(line, bp, k, n):
    """bp[q, k, s] = line[q*NR + s] (0 past n): a row of B into row k of every panel. NR is worked
    out from the dtype, so it is a constant where the function compiles, and the copy of a panel's
    row (two vectors) is unrolled code rather than a loop of unknown length: packing a 2048 x 512
    float32 B took 1.5 ms that way, 0.3 ms this way."""
    nr = _panel_width(bp.itemsize)
    full = n // nr
    for q in range(full):
        for s in range(nr):
            bp[q, k, s] = line[q * nr + s]
    if full < bp.shape[0]:  # the ragged last panel
        for s in range(nr):
            bp[full, k, s] = line[full * nr + s] if full * nr + s < n else 0


@njit(cache=True)
def _block(A, B, bp, C, i0, m, k0, kc, j0, n, accumulate, pack_a, b_packed):
    """C[i0:i0+m, j0:j0+n] (+)= A[i0:i0+m, k0:k0+kc] @ B[k0:k0+kc, j0:j0+n]. B's panels come packed
    in bp (b_packed), or are read where they are, but for a last, narrower one, packed here; A's
    are packed here (pack_a) or read where they are."""
    nr = bp.shape[2]
    ap = np.empty(((m + MR - 1) // MR if pack_a else 0, kc, MR), dtype=C.dtype)
    if pack_a:
        _pack_a(A, i0, m, k0, kc, ap)
    edge = np.empty((MR, nr), dtype=C.dtype)  # a whole register block, for the ragged edges of C
    for q in range((n + nr - 1) // nr):  # this panel of B stays in L1 while the panels of A pass by
        j, cols = j0 + q * nr, min(nr, n - q * nr)
        if b_packed:
            panel, bk, bj = _any_layout(bp[q]), 0, 0
        elif cols < nr:  # past the last column: a panel padded with zeros
            _pack_b(B, k0, kc, j, cols, bp[:1])
            panel, bk, bj = _any_layout(bp[0]), 0, 0
        else:
            panel, bk, bj = B, k0, j
        for p in range((m + MR - 1) // MR):
            i, rows = i0 + p * MR, min(MR, m - p * MR)
            if pack_a:
                a, ai, ak = _any_layout(ap[p].T), 0, 0
            else:
                a, ai, ak = A, i, k0
            if rows == MR and cols == nr:
                _microkernel(kc, a, ai, ak, MR, panel, bk, bj, C, i, j, accumulate)
            else:
                _microkernel(kc, a, ai, ak, rows, panel, bk, bj, edge, 0, 0, False)
                for r in range(rows):
                    for s in range(cols):
                        C[i + r, j + s] = edge[r, s] + C[i + r, j + s] if accumulate else edge[r, s]


@range_kernel()
def _gemm(A, B, C, mc, nc, pack_a, pack_b, job0, job1):
    """C[i, h] = A[i, h] B[i, h] for batches A (b, h, m, k) and B (b, h, k, n) of any strides (attention's
    heads, read where the model leaves them); one product is a batch of one. A job is one block of
    C[i, h]: mc rows by nc columns. Many small products
    (attention's, one per head) or one product of many rows give each thread blocks of rows; a
    product of few rows and many columns (a weight's gradient, 128 x 2048 by 2048 x 512) gives each
    thread its own columns, so that it packs only its part of B. `_share` hands each thread a range
    of jobs; block of k by block of k, the thread packs the block of B its next jobs need, once."""
    heads, M, K = A.shape[1], A.shape[2], A.shape[3]
    N = B.shape[3]
    nr = _panel_width(C.itemsize)
    row_blocks, col_blocks = (M + mc - 1) // mc, (N + nc - 1) // nc
    for k0 in range(0, K, KC):
        kc = min(KC, K - k0)
        bp = np.empty(((nc + nr - 1) // nr if pack_b else 1, kc, nr), dtype=C.dtype)
        packed = -1
        for job in range(job0, job1):
            i, rest = job // (row_blocks * col_blocks), job % (row_blocks * col_blocks)
            j0, i0 = (rest // row_blocks) * nc, (rest % row_blocks) * mc
            n = min(nc, N - j0)
            b, h = i // heads, i % heads
            if pack_b and job // row_blocks != packed:  # a new block of columns, or a new B[b, h]
                _pack_b(B[b, h], k0, kc, j0, n, bp[:(n + nr - 1) // nr])
                packed = job // row_blocks
            _block(A[b, h], B[b, h], bp, C[b, h], i0, min(mc, M - i0), k0, kc, j0, n, k0 > 0, pack_a, pack_b)


def _blocks(batch, m, n, threads, nr):
    """(rows, columns) of C per job: whole register blocks, at most MC rows and NC columns, and
    enough jobs that every thread gets as many. Columns are cut only for a product of few rows
    (at most MC per thread), and then each thread's share of them whole."""
    if batch >= 2 * threads or m > MC * threads or n < 2 * nr * threads:
        return _block_rows(m, 1 if batch >= 2 * threads else threads), min(n, NC)
    return _block_rows(m, 1), min(NC, nr * -(-(-(-n // nr)) // threads))


def _block_rows(m, threads):
    """Rows per block: at most MC, in whole register blocks, and as many blocks per thread."""
    blocks = max(threads, -(-m // MC))
    blocks = -(-blocks // threads) * threads
    return MR * max(1, -(-(-(-m // MR)) // blocks))


_ENTRIES = {}  # (kernel, dtype, dimensions and flags of each array, type of each number) -> machine code


def _any_strides(kernel, *args):
    """`kernel` compiled for these arguments with every array typed as "any strides" (numba's layout
    "A"), the inputs read-only, the output (the last array) writable. numba compiles one version of
    a function per combination of its arguments' layouts: C-ordered, Fortran-ordered (a transposed
    matrix) or strided (a slice), three per array, and twice more for a read-only one (a broadcast
    view, an array over bytes). The packing reads through the strides anyway, the micro-kernel
    writes C through its strides, and nothing writes the inputs, so one version per dtype does
    every case: a first run compiles 2 versions (one per dtype) instead of up to 216 (A and B six
    ways each, C three ways, two dtypes)."""
    # numba.typeof takes about 50 microseconds an array, three times a product, a hundred products a
    # GPT step: the entry is first looked up by what the types are made of.
    quick = (kernel,) + tuple((a.dtype, a.ndim, a.flags.c_contiguous, a.flags.f_contiguous, a.flags.writeable,
                               a.flags.aligned) if isinstance(a, np.ndarray) else type(a) for a in args)
    entry = _ENTRIES.get(quick)
    if entry is None:
        types_ = [numba.typeof(a) for a in args]
        last = max(i for i, t in enumerate(types_) if isinstance(t, types.Array))
        sig = tuple(t.copy(layout="A", readonly=i != last) if isinstance(t, types.Array) else t
                    for i, t in enumerate(types_))
        kernel.compile(sig)  # numba compiles a signature once: asked again, it returns what it has
        entry = _ENTRIES[quick] = kernel.overloads[sig].entry_point
    return entry


def _packs(m, n, a, b):
    """Whether to pack A, and B (see step 2 above): a copy pays when what is copied is used often.
    A panel of A serves every panel of B (n / NR of them), a panel of B every panel of A (m / MR).
    B must be packed when its rows are not contiguous (a transposed view). Either is packed when
    the micro-kernel, reading it in place, would step PACK_BYTES or more from one k to the next:
    lines a power of two of kilobytes apart all fall in the same few sets of the L1 cache and push
    each other out (A's step is that far in a Linear's weight gradient, dy^T x, a transposed view)."""
    pack_a = n * a.itemsize > PACK_BYTES or abs(a.strides[-1]) >= PACK_BYTES
    pack_b = b.strides[-1] != b.itemsize or abs(b.strides[-2]) >= PACK_BYTES or m > PACK_ROWS
    return pack_a, pack_b


def _four(x):
    """x as a 4-D array (batch, heads, rows, columns): a view for up to 4 axes; more leading axes
    are merged into the first, a view where their strides allow."""
    return x.reshape((1,) * (4 - x.ndim) + x.shape) if x.ndim <= 4 else x.reshape((-1,) + x.shape[-3:])


def _product(a, b, packs=None, out=None):
    """a @ b for arrays of matching shapes (2-D, or batches with the same leading axes), any strides
    (not counted as a launch: the public functions below count theirs, fused attention its own),
    into `out` where given (any strides: attention writes its heads where the model reads them).
    `packs`: (pack A, pack B) to override `_packs`'s choice (B is packed anyway when it must be)."""
    dtype = a.dtype
    b = b.astype(dtype, copy=False)
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    if out is None:
        out = np.empty(a.shape[:-1] + (n,), dtype=dtype)
    if out.size == 0:
        return out
    if k == 0:
        out[...] = 0
        return out
    work = out.size * k
    n_threads = threads() if work >= PARALLEL_WORK else 1
    if out.ndim > 4 and not out.flags.c_contiguous:  # its leading axes could not be merged in a view
        raise ValueError(f"cpu._product: an output of {out.ndim} axes must be C-ordered, not strides {out.strides}")
    a4, b4, out4 = _four(a), _four(b), _four(out)  # views where the strides allow
    batch = a4.shape[0] * a4.shape[1]
    mc, nc = _blocks(batch, m, n, n_threads, _panel_width(a.itemsize))
    jobs = batch * -(-m // mc) * -(-n // nc)
    pack_a, pack_b = _packs(m, n, a4, b4)
    if packs is not None:
        pack_a, pack_b = packs[0], packs[1] or b4.strides[-1] != b4.itemsize
    _share(_any_strides(_gemm, a4, b4, out4, mc, nc, pack_a, pack_b, 0, jobs), work, jobs, a4, b4, out4, mc, nc,
           pack_a, pack_b)
    return out


def _operands(a, b, name, a_shape, b_shape, how):
    a, b = np.asarray(a), np.asarray(b)
    for what, x in (("a", a), ("b", b)):
        _floats(x, name, what)  # checks the dtype only: the kernel reads any strides
    if a.ndim < 2 or a.ndim != b.ndim or a.shape[:-2] != b.shape[:-2] or a_shape(a)[-1] != b_shape(b)[0]:
        raise ValueError(f"cpu.{name}: shapes {a.shape} and {b.shape} do not match: it takes {how}, or batches "
                         f"of them with the same leading axes")
    return a, b


def matmul(a, b):
    """a @ b for float arrays: 2-D, or batched with the same leading axes, with any strides."""
    a, b = _operands(a, b, "matmul", lambda x: x.shape[-2:], lambda x: x.shape[-2:],
                     "two matrices (m, k) and (k, n)")
    count("cpu.matmul")
    return _product(a, b)


def matmul_bt(a, bt):
    """a @ bt.T (bt holds B's transpose, as a Linear's weight does), read through a view."""
    a, bt = _operands(a, bt, "matmul_bt", lambda x: x.shape[-2:], lambda x: x.shape[-1:],
                      "(m, k) and (n, k)")
    count("cpu.matmul")
    return _product(a, np.swapaxes(bt, -1, -2))


def matmul_at(at, b):
    """at.T @ b (at holds A's transpose: the weight gradient g^T x of a Linear), read through a view."""
    at, b = _operands(at, b, "matmul_at", lambda x: x.shape[-1:] + x.shape[-2:-1], lambda x: x.shape[-2:],
                      "(k, m) and (k, n)")
    count("cpu.matmul")
    return _product(np.swapaxes(at, -1, -2), b)


# ----- the selective scan -------------------------------------------------------------------------------
@range_kernel(fastmath=True)
def _scan(u, delta, A, B, C, D, y, states, decays, keep, keep_decays, job0, job1):
    """Sequences job0 .. job1 - 1 (a job is a sequence); the (d, n) state in a local array, updated
    in time order. The states (and the decays exp(delta A), when asked) are kept for the backward."""
    length, channels = u.shape[1], u.shape[2]
    n = A.shape[1]
    for bi in range(job0, job1):
        h = np.zeros((channels, n), dtype=u.dtype)
        for t in range(length):
            for d in range(channels):
                dt, x = delta[bi, t, d], u[bi, t, d]
                acc = D[d] * x
                for s in range(n):
                    decay = _exp(dt * A[d, s])
                    if keep_decays:  # the same for the whole loop: the compiler takes the test out of it
                        decays[bi, t, d, s] = decay
                    h[d, s] = decay * h[d, s] + dt * B[bi, t, s] * x
                    acc += C[bi, t, s] * h[d, s]
                y[bi, t, d] = acc
            if keep:
                for d in range(channels):
                    for s in range(n):
                        states[bi, t, d, s] = h[d, s]


@range_kernel(fastmath=True)
def _scan_backward(g, u, delta, A, B, C, D, states, decays, saved, du, ddelta, dA, dB, dC, dD, job0, job1):
    """The reverse-time scan of sequences job0 .. job1 - 1; dA and dD get a row per sequence (summed
    by the caller). With `saved`, the decays come from the forward instead of a second exp (twice as
    fast, for one more array)."""
    length, channels = u.shape[1], u.shape[2]
    n = A.shape[1]
    for bi in range(job0, job1):
        dh = np.zeros((channels, n), dtype=u.dtype)  # what reaches h_t from the future
        for t in range(length - 1, -1, -1):
            prev, first = max(t - 1, 0), u.dtype.type(t > 0)  # h_{-1} = 0
            for s in range(n):
                dB[bi, t, s] = 0
                dC[bi, t, s] = 0
            for d in range(channels):
                gt, dt, x = g[bi, t, d], delta[bi, t, d], u[bi, t, d]
                d_delta = u.dtype.type(0)
                s_B = u.dtype.type(0)
                for s in range(n):
                    decay = decays[bi, t, d, s] if saved else _exp(dt * A[d, s])
                    h_prev = states[bi, prev, d, s] * first  # no branch in the loop: it vectorises
                    dh_t = dh[d, s] + gt * C[bi, t, s]
                    dC[bi, t, s] += gt * states[bi, t, d, s]
                    dB[bi, t, s] += dh_t * dt * x
                    d_exp = dh_t * h_prev * decay
                    dA[bi, d, s] += d_exp * dt
                    d_delta += d_exp * A[d, s]
                    s_B += dh_t * B[bi, t, s]
                    dh[d, s] = decay * dh_t
                ddelta[bi, t, d] = d_delta + s_B * x
                du[bi, t, d] = s_B * dt + D[d] * gt
                dD[bi, d] += gt * x


def _scan_inputs(u, delta, A, B, C, D):
    names = ("u", "delta", "A", "B", "C", "D")
    arrays = [None if x is None else _floats(x, "selective_scan", name)
              for name, x in zip(names, (u, delta, A, B, C, D))]
    u, delta, A, B, C, D = arrays
    fits = (u.ndim == 3 and delta.shape == u.shape and A.ndim == 2 and A.shape[0] == u.shape[2]
            and B.shape == u.shape[:2] + (A.shape[1],) and C.shape == B.shape
            and (D is None or D.shape == (u.shape[2],)))
    if not fits:
        shapes = ", ".join(f"{name} {None if x is None else x.shape}" for name, x in zip(names, arrays))
        raise ValueError(f"cpu.selective_scan: the shapes do not fit: {shapes}; expected u and delta (b, l, d), "
                         f"A (d, n), B and C (b, l, n), D (d,) or None")
    dtype = np.result_type(*[x for x in arrays if x is not None])
    D = np.zeros(u.shape[2], dtype) if D is None else D
    return [np.ascontiguousarray(x, dtype=dtype) for x in (u, delta, A, B, C, D)]


def selective_scan(u, delta, A, B, C, D=None, return_states=False, return_decays=False):
    """y; with return_states, (y, states); with return_decays too, (y, states, decays) for the backward."""
    u, delta, A, B, C, D = _scan_inputs(u, delta, A, B, C, D)
    (b, l, d), n = u.shape, A.shape[1]
    y = np.empty_like(u)
    states = np.empty((b, l, d, n) if return_states else (1, 1, 1, 1), dtype=u.dtype)
    keep_decays = return_states and return_decays
    decays = np.empty((b, l, d, n) if keep_decays else (1, 1, 1, 1), dtype=u.dtype)
    _share(_scan, u.size * n, b, u, delta, A, B, C, D, y, states, decays, return_states, keep_decays)
    count("cpu.selective_scan")
    if not return_states:
        return y
    return (y, states, decays) if keep_decays else (y, states)


def selective_scan_backward(g, u, delta, A, B, C, D, states, decays=None):
    u, delta, A, B, C, D = _scan_inputs(u, delta, A, B, C, D)
    g = np.ascontiguousarray(g, dtype=u.dtype)
    b, d = u.shape[0], u.shape[2]
    du, ddelta = np.empty_like(u), np.empty_like(u)
    dB, dC = np.empty_like(B), np.empty_like(C)
    dA, dD = np.zeros((b,) + A.shape, u.dtype), np.zeros((b, d), u.dtype)
    saved = decays is not None
    decays = decays if saved else np.empty((1, 1, 1, 1), u.dtype)
    _share(_scan_backward, u.size * A.shape[1], b, g, u, delta, A, B, C, D, states, decays, saved,
           du, ddelta, dA, dB, dC, dD)
    count("cpu.selective_scan_backward")
    return du, ddelta, reduce_rows(dA), dB, dC, reduce_rows(dD)
