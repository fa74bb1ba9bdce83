"""The CPU twins (`course.kernels.cpu`, numba.njit) against NumPy, in float32 and float64."""

import os
import subprocess
import sys
import time

import numba
import numpy as np
import pytest

import course.kernels as K
from course.kernels import cpu
from course.tensor import Tensor

from test_part6_kernels import np_layer_norm, np_scan, np_softmax, scan_inputs  # noqa: E402

pytestmark = pytest.mark.part6

DTYPES = [np.float32, np.float64]
TOL = {np.float32: dict(rtol=1e-4, atol=1e-5), np.float64: dict(rtol=1e-10, atol=1e-12)}


def arr(rng, *shape, dtype=np.float64, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_vector_add_reduce_sum_reduce_rows_add_row(rng, dtype):
    a, b = arr(rng, 3, 11, dtype=dtype), arr(rng, 3, 11, dtype=dtype)
    np.testing.assert_array_equal(cpu.vector_add(a, b), a + b)
    assert cpu.reduce_sum(arr(rng, 1000, dtype=dtype)).dtype == dtype
    x = arr(rng, 1001, dtype=dtype)
    np.testing.assert_allclose(cpu.reduce_sum(x), x.astype(np.float64).sum(), **TOL[dtype])
    np.testing.assert_allclose(cpu.reduce_rows(a), a.sum(0), **TOL[dtype])
    np.testing.assert_array_equal(cpu.add_row(a, b[0]), a + b[0])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (5, 7, 3), (13, 9, 10), (4, 0, 2), (8, 16, 12), (3, 5, 1),
                                   (2, 33, 5), (6, 17, 7), (67, 131, 65), (1, 40, 9)])
def test_matmul_on_awkward_shapes(rng, dtype, m, k, n):
    a, b = arr(rng, m, k, dtype=dtype), arr(rng, k, n, dtype=dtype)
    got = cpu.matmul(a, b)
    assert got.shape == (m, n) and got.dtype == dtype
    np.testing.assert_allclose(got, a.astype(np.float64) @ b, **TOL[dtype])


def test_matmul_takes_strided_views(rng):
    # Register blocks (6 rows by 2 vectors) with edges left over, on inputs that are not contiguous:
    # a column slice, a reversed view, every other row; each product reads them through its strides.
    big_a, big_b = arr(rng, 30, 41, dtype=np.float32), arr(rng, 41, 23, dtype=np.float32)
    for a, b in ((big_a[:, 3:36], big_b[3:36]), (big_a[::-1, ::2], big_b[::2, ::-1]), (big_a[::2], big_b)):
        expected = a.astype(np.float64) @ b
        np.testing.assert_allclose(cpu.matmul(a, b), expected, **TOL[np.float32])
        np.testing.assert_allclose(cpu.matmul_bt(a, np.asfortranarray(b).T), expected, **TOL[np.float32])
        np.testing.assert_allclose(cpu.matmul_at(np.asfortranarray(a).T, b), expected, **TOL[np.float32])


@pytest.mark.parametrize("packs", [(True, True), (True, False), (False, True), (False, False), None])
def test_matmul_packed_or_read_in_place_gives_the_product(rng, packs):
    """A and B are each packed into panels or read where they are (`cpu._packs` chooses by size):
    every combination, on ragged edges, strided and reversed views, batches and a second block of k."""
    big_a, big_b = arr(rng, 30, 300, dtype=np.float32), arr(rng, 300, 45, dtype=np.float32)
    cases = [(big_a, big_b), (big_a[::-1, ::-1], big_b[::-1]), (big_a[:, 3:36], big_b[3:36, :33]), (big_a[::2], big_b),
             (np.asfortranarray(big_a), big_b[:, :32]), (np.asfortranarray(big_a[:29]), big_b),
             (np.broadcast_to(big_a[:1], (30, 300)), np.broadcast_to(big_b[:, :1], (300, 45))),  # strides of 0
             (np.broadcast_to(big_a[:, :1], (30, 300)), np.broadcast_to(big_b[:1], (300, 45))), (arr(rng, 3, 13, 40, dtype=np.float64), arr(rng, 3, 40, 9, dtype=np.float64)),
             (arr(rng, 2, 7, 5, dtype=np.float64), np.swapaxes(arr(rng, 2, 11, 5, dtype=np.float64), 1, 2))]
    for a, b in cases:
        expected = a.astype(np.float64) @ b
        np.testing.assert_allclose(cpu._product(a, b, packs), expected, **TOL[a.dtype.type])


def test_large_products_pack_and_small_ones_read_in_place(rng):
    a, b = arr(rng, 1, 64, 128, dtype=np.float32), arr(rng, 1, 128, 64, dtype=np.float32)
    assert cpu._packs(64, 64, a, b) == (False, False)  # attention's: few rows of C use each panel
    assert cpu._packs(2048, 64, a, b) == (False, True)  # many rows: B's panels are worth packing
    assert cpu._packs(64, 64, a, np.swapaxes(arr(rng, 1, 64, 128, dtype=np.float32), 1, 2))[1]  # columns of B apart
    wide = arr(rng, 1, 128, 1024, dtype=np.float32)
    assert cpu._packs(64, 1024, a, wide) == (True, True)  # long rows of C reuse A's panels; B's rows 4 KB apart
    weight_grad = np.swapaxes(arr(rng, 1, 2048, 512, dtype=np.float32), 1, 2)  # dy^T: k steps 2 KB
    assert cpu._packs(512, 64, weight_grad, b)[0]


def test_the_register_block_fits_the_vector_registers_numba_compiles_for(monkeypatch):
    monkeypatch.setattr(numba.config, "CPU_FEATURES", "+avx2,+fma,-avx512f")
    assert cpu._vector_bytes() == 32  # AVX2: 6 x 16 float32 in 16 registers
    monkeypatch.setattr(numba.config, "CPU_FEATURES", "+avx2,+fma,+avx512f")
    assert cpu._vector_bytes() == 64  # AVX-512: 12 x 32 float32 in 32 registers
    assert (cpu.VECTOR_BYTES, cpu.MR) in ((32, 6), (64, 12))


_AVX2_LAYOUT = """
import numpy as np
from course.kernels import cpu, fused
assert (cpu.VECTOR_BYTES, cpu.MR) == (32, 6), (cpu.VECTOR_BYTES, cpu.MR)
rng = np.random.default_rng(0)
for m, k, n in ((1, 1, 1), (13, 9, 10), (67, 300, 65), (200, 40, 150)):
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    for x, y in ((a, b), (np.asfortranarray(a), b), (a, np.asfortranarray(b))):
        for packs in ((True, True), (False, False)):
            np.testing.assert_allclose(cpu._product(x, y, packs), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
q, k_, v = (rng.standard_normal((2, 100, 32)).astype(np.float32) for _ in range(3))
s = q @ np.swapaxes(k_, 1, 2) / np.sqrt(32) + np.triu(np.full((100, 100), -np.inf, np.float32), 1)
p = np.exp(s - s.max(-1, keepdims=True))
out = fused.attention_forward(q, k_, v, causal=True)[0]
np.testing.assert_allclose(out, (p / p.sum(-1, keepdims=True)) @ v, rtol=1e-4, atol=1e-5)
print("ok")
"""


def test_the_avx2_register_block_where_this_cpu_has_avx512():
    # The tests above run the layout of this CPU; on one with AVX-512, a process that tells numba to
    # compile without it runs the 6 x 16 block of AVX2 machines (an AVX2 CPU cannot run AVX-512's).
    from llvmlite import binding

    features = binding.get_host_cpu_features()
    if not features.get("avx512f"):
        pytest.skip("this CPU has no AVX-512: the tests above ran the AVX2 layout")
    for name in list(features):
        if name.startswith("avx512"):
            features[name] = False
    env = dict(os.environ, NUMBA_CPU_FEATURES=features.flatten())
    out = subprocess.run([sys.executable, "-c", _AVX2_LAYOUT], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0 and out.stdout.split() == ["ok"], out.stderr[-3000:]


@pytest.mark.parametrize("m,threads", [(1, 1), (6, 2), (100, 2), (2048, 2), (2048, 1), (10 ** 5, 2)])
def test_blocks_of_rows_are_whole_register_blocks_shared_evenly(m, threads):
    mc = cpu._block_rows(m, threads)
    blocks = -(-m // mc)
    assert mc % cpu.MR == 0 and mc <= max(cpu.MC, cpu.MR)
    assert blocks >= min(threads, -(-m // cpu.MR))  # every thread gets a block where there are enough rows
    if m <= 20 * cpu.MC:  # a few blocks: as many for each thread (many: one more is a small share)
        assert blocks % threads == 0 or blocks < threads


def test_few_rows_and_many_columns_give_each_thread_its_columns():
    whole = lambda m: cpu.MR * -(-m // cpu.MR)  # noqa: E731  m rows in whole register blocks
    assert cpu._blocks(1, 128, 512, 2, 16) == (whole(128), 256)  # a weight's gradient: each thread half of B
    assert cpu._blocks(1, 2048, 128, 2, 16) == (cpu._block_rows(2048, 2), 128)  # many rows: rows are shared
    assert cpu._blocks(128, 64, 64, 2, 16) == (whole(64), 64)  # many products: each thread whole products
    assert cpu._blocks(1, 64, 20, 2, 16) == (cpu._block_rows(64, 2), 20)  # too few columns to cut


def test_a_product_cut_into_columns_for_threads_is_the_product(rng, monkeypatch):
    monkeypatch.setattr(cpu, "threads", lambda: 3)
    monkeypatch.setattr(cpu, "PARALLEL_WORK", 0)
    a, b = arr(rng, 40, 300, dtype=np.float32), arr(rng, 300, 150, dtype=np.float32)  # 3 x 48 columns + 6
    assert cpu._blocks(1, 40, 150, 3, 16)[1] == 64
    for x, y in ((a, b), (np.asfortranarray(a), b), (a, np.asfortranarray(b)), (a[None].repeat(2, 0), b[None].repeat(2, 0))):
        np.testing.assert_allclose(cpu.matmul(x, y), x.astype(np.float64) @ y, **TOL[np.float32])


@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul_across_several_blocks_of_k_and_of_rows(rng, dtype):
    # k = 700 is three blocks of KC (the last one short) summed into C; 300 rows are several blocks of MC.
    a, b = arr(rng, 300, 700, dtype=dtype), arr(rng, 700, 37, dtype=dtype)
    assert a.shape[1] > 2 * cpu.KC and a.shape[0] > cpu.MC
    expected = a.astype(np.float64) @ b
    np.testing.assert_allclose(cpu.matmul(a, b), expected, rtol=TOL[dtype]["rtol"] * 10, atol=TOL[dtype]["atol"] * 100)
    np.testing.assert_allclose(cpu.matmul_at(np.ascontiguousarray(a.T), b), expected,
                               rtol=TOL[dtype]["rtol"] * 10, atol=TOL[dtype]["atol"] * 100)


def test_matmul_takes_a_transposed_view_and_batches(rng):
    a, b = arr(rng, 9, 6), arr(rng, 7, 6)
    np.testing.assert_allclose(cpu.matmul(a, b.T), a @ b.T, rtol=1e-12)
    np.testing.assert_allclose(cpu.matmul_bt(a, b), a @ b.T, rtol=1e-12)
    np.testing.assert_allclose(cpu.matmul_at(b.T, a.T), b @ a.T, rtol=1e-12)
    a3, b3 = arr(rng, 2, 3, 5, 7), arr(rng, 2, 3, 7, 6)
    np.testing.assert_allclose(cpu.matmul(a3, b3), a3 @ b3, rtol=1e-12)
    np.testing.assert_allclose(cpu.matmul(a3, np.swapaxes(b3, -1, -2).copy().swapaxes(-1, -2)), a3 @ b3, rtol=1e-12)
    np.testing.assert_allclose(cpu.matmul_at(np.swapaxes(a3, -1, -2), b3), a3 @ b3, rtol=1e-12)
    a5, b5 = arr(rng, 5, 4, 3), arr(rng, 5, 3, 6)  # batches enough to share out whole
    np.testing.assert_allclose(cpu.matmul(a5, b5), a5 @ b5, rtol=1e-12)


def test_matmul_errors_name_both_shapes(rng):
    with pytest.raises(ValueError, match=r"\(3, 4\) and \(5, 2\)"):
        cpu.matmul(arr(rng, 3, 4), arr(rng, 5, 2))
    with pytest.raises(ValueError, match=r"\(2, 3, 4\) and \(3, 4, 2\)"):
        cpu.matmul(arr(rng, 2, 3, 4), arr(rng, 3, 4, 2))
    with pytest.raises(TypeError, match="int64.*float32 or float64"):
        cpu.matmul(np.ones((2, 2), np.int64), arr(rng, 2, 2))
    with pytest.raises(ValueError, match=r"matmul_at: shapes \(3, 4\) and \(5, 2\)"):
        cpu.matmul_at(arr(rng, 3, 4), arr(rng, 5, 2))
    with pytest.raises(ValueError, match=r"matmul_bt: shapes \(3, 4\) and \(5, 2\)"):
        cpu.matmul_bt(arr(rng, 3, 4), arr(rng, 5, 2))


@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_and_backward(rng, dtype):
    x, g = arr(rng, 3, 33, dtype=dtype, scale=5), arr(rng, 3, 33, dtype=dtype)
    x[0, 0] = 1e4  # exp would overflow without the maximum subtracted
    s = cpu.softmax(x)
    np.testing.assert_allclose(s, np_softmax(x.astype(np.float64)), **TOL[dtype])
    np.testing.assert_allclose(cpu.softmax_backward(s, g), s * (g - (g * s).sum(1, keepdims=True)), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm_and_backward(rng, dtype):
    x, g = arr(rng, 4, 45, dtype=dtype, scale=3) + 2, arr(rng, 4, 45, dtype=dtype)
    w, b = arr(rng, 45, dtype=dtype), arr(rng, 45, dtype=dtype)
    y, mean, rstd = cpu.layer_norm(x, w, b, return_stats=True)
    np.testing.assert_allclose(y, np_layer_norm(x.astype(np.float64), w, b), **TOL[dtype])
    x64 = x.astype(np.float64)
    xhat = (x64 - x64.mean(1, keepdims=True)) / np.sqrt(x64.var(1, keepdims=True) + 1e-5)
    gy = g * w
    dx = (gy - gy.mean(1, keepdims=True) - xhat * (gy * xhat).mean(1, keepdims=True)) / np.sqrt(
        x64.var(1, keepdims=True) + 1e-5)
    got = cpu.layer_norm_backward(x, w, mean, rstd, g)
    for name, value, expected in zip(("dx", "dw", "db"), got, (dx, (g * xhat).sum(0), g.sum(0))):
        np.testing.assert_allclose(value, expected, rtol=TOL[dtype]["rtol"] * 10, atol=TOL[dtype]["atol"] * 10,
                                   err_msg=name)


@pytest.mark.parametrize("dtype", DTYPES)
def test_selective_scan_matches_the_cuda_kernel_and_numpy(rng, dtype):
    args = scan_inputs(rng, dtype=dtype)
    y, states = cpu.selective_scan(*args, return_states=True)
    np.testing.assert_allclose(y, np_scan(*[a.astype(np.float64) for a in args]), **TOL[dtype])
    g = arr(rng, *y.shape, dtype=dtype)
    ours = cpu.selective_scan_backward(g, *args, states)
    args32 = [a.astype(np.float32) for a in args]
    _, states32 = K.selective_scan(*args32, return_states=True)
    theirs = K.selective_scan_backward(g.astype(np.float32), *args32, states32)
    for name, a, b in zip("u delta A B C D".split(), ours, theirs):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4, err_msg=name)


def test_scan_shapes_that_do_not_fit_are_named(rng):
    u, delta, A, B, C, D = scan_inputs(rng)
    with pytest.raises(ValueError, match=r"D \(2,\)"):
        cpu.selective_scan(u, delta, A, B, C, D[:2])


def test_cpu_calls_are_counted(rng):
    K.reset_launches()
    cpu.matmul(arr(rng, 2, 2), arr(rng, 2, 2))
    cpu.softmax(arr(rng, 2, 2))
    assert K.launches() == {"cpu.matmul": 1, "cpu.softmax": 1}


def test_thread_count_follows_omp_num_threads_unless_numba_num_threads_is_set(monkeypatch):
    monkeypatch.delenv("NUMBA_NUM_THREADS", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert cpu.threads() == 1
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert cpu.threads() == numba.get_num_threads()
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("NUMBA_NUM_THREADS", str(numba.get_num_threads()))
    assert cpu.threads() == numba.get_num_threads()


def test_the_kernels_leave_numba_s_own_thread_pool_unstarted():
    # numba's pool runs on OpenMP by default, which PyTorch shares: started, it slows PyTorch down.
    code = """
import numpy as np, numba
from numba.np.ufunc import parallel
from course.kernels import cpu
a = np.ones((300, 300), np.float32)
assert np.allclose(cpu.matmul(a, a), 300)  # shared between threads where there are two
assert cpu.threads() == numba.config.NUMBA_NUM_THREADS and not parallel._is_initialized
numba.set_num_threads(1)  # the learner's own choice starts the pool, and counts
assert cpu.threads() == 1
print("ok")
"""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0 and out.stdout.split() == ["ok"], out.stderr[-3000:]


@pytest.mark.parametrize("work", [0, 1 << 40])  # every call parallel, every call on one thread
def test_parallel_and_serial_loops_agree_and_leave_the_thread_count_alone(rng, monkeypatch, work):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(cpu, "PARALLEL_WORK", work)
    before = numba.get_num_threads()
    a, b = arr(rng, 3, 13, 9), arr(rng, 3, 9, 10)
    np.testing.assert_allclose(cpu.matmul(a, b), a @ b, **TOL[np.float64])
    np.testing.assert_allclose(cpu.matmul(a[0], b[0]), a[0] @ b[0], **TOL[np.float64])
    args = scan_inputs(rng, dtype=np.float64)
    np.testing.assert_allclose(cpu.selective_scan(*args), np_scan(*args), **TOL[np.float64])
    y, states = cpu.selective_scan(*args, return_states=True)
    grads = cpu.selective_scan_backward(np.ones_like(y), *args, states)
    assert all(np.isfinite(g).all() for g in grads)
    assert numba.get_num_threads() == before


@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm_of_a_row_holding_nan_or_inf_is_nan_as_numpy(dtype):
    import course.tensor.functional as F
    from course.tensor import Tensor

    x = np.array([[np.nan, 1, 2], [np.inf, 1, 2], [-np.inf, np.inf, 0], [1, 2, 3]], dtype)
    w, b = np.ones(3, dtype), np.zeros(3, dtype)
    out, mean, rstd = cpu.layer_norm(x, w, b, return_stats=True)
    with np.errstate(invalid="ignore"):
        expected = F.layer_norm.default(Tensor(x), Tensor(w), Tensor(b)).data
    np.testing.assert_array_equal(np.isnan(out), np.isnan(expected))
    assert np.isnan(out[:3]).all() and np.isfinite(out[3]).all()
    np.testing.assert_allclose(out[3], expected[3], **TOL[dtype])
    dx, dw, db = cpu.layer_norm_backward(x, w, mean, rstd, np.ones_like(x))
    assert np.isnan(dx[:3]).all() and np.isfinite(dx[3]).all()


def test_one_compiled_product_per_dtype_for_every_layout(rng):
    """C-ordered, transposed, sliced, read-only and broadcast operands, single and batched, all run
    the same compiled product: one version per dtype."""
    a, b = arr(rng, 13, 9, dtype=np.float32), arr(rng, 9, 7, dtype=np.float32)
    read_only = a.copy()
    read_only.flags.writeable = False
    cases = [(a, b), (a.T.copy().T, b), (arr(rng, 13, 18, dtype=np.float32)[:, ::2], b), (read_only, b),
             (np.broadcast_to(a, (3, 13, 9)), np.broadcast_to(b, (3, 9, 7))), (read_only[None].repeat(5, 0), b[None].repeat(5, 0))]
    heads = arr(rng, 2, 5, 3, 9, dtype=np.float32).transpose(0, 2, 1, 3)  # (B, H, T, D) over (B, T, H, D)
    cases += [(heads, arr(rng, 2, 3, 9, 4, dtype=np.float32)), (arr(rng, 2, 1, 2, 3, 9, dtype=np.float32), arr(rng, 2, 1, 2, 9, 7, dtype=np.float32))]
    for x, y in cases:
        np.testing.assert_allclose(cpu.matmul(x, y), np.matmul(x, y), rtol=1e-5, atol=1e-5)
    into = np.empty((2, 5, 3, 4), np.float32).transpose(0, 2, 1, 3)
    assert cpu._product(heads, cases[-2][1], out=into) is into  # written through its strides
    np.testing.assert_allclose(into, np.matmul(heads, cases[-2][1]), rtol=1e-5, atol=1e-5)
    compiled = {sig for sig in cpu._gemm.signatures if sig[0].dtype == numba.float32}
    assert len(compiled) == 1, compiled


def test_heads_are_read_where_they_are(rng, monkeypatch):
    """Attention's heads, q of shape (B, H, T, D) seen over a (B, T, H, D) array, go into the product
    as they are: no copy. An output of more than 4 axes that a view cannot flatten is refused."""
    heads = arr(rng, 2, 6, 3, 8, dtype=np.float32).transpose(0, 2, 1, 3)
    keys = arr(rng, 2, 6, 3, 8, dtype=np.float32).transpose(0, 2, 3, 1)
    seen = []
    original = cpu._share
    monkeypatch.setattr(cpu, "_share", lambda kernel, work, jobs, a, b, c, *rest: (seen.append((a, b)),
                                                                                   original(kernel, work, jobs, a, b, c, *rest)))
    np.testing.assert_allclose(cpu.matmul(heads, keys), heads @ keys, rtol=1e-5, atol=1e-5)
    (a, b), = seen
    assert np.shares_memory(a, heads) and np.shares_memory(b, keys)
    with pytest.raises(ValueError, match="5 axes must be C-ordered"):
        cpu._product(arr(rng, 2, 2, 2, 3, 4), arr(rng, 2, 2, 2, 4, 5), out=np.empty((2, 2, 2, 5, 3)).swapaxes(-1, -2))


def test_shared_kernels_give_the_same_numbers_on_one_thread_and_on_several(rng, monkeypatch):
    """`_share` splits a kernel's jobs between threads; each job is computed as on one thread, so
    the numbers are the same to the last bit (`make test` allows one thread: here three are forced)."""
    from course.kernels import fused

    q, k, v = (arr(rng, 5, 70, 8, dtype=np.float32) for _ in range(3))  # 5 heads, 2 query tiles each
    dout = arr(rng, 5, 70, 8, dtype=np.float32)
    scan = scan_inputs(rng, dtype=np.float32)
    a, b = arr(rng, 50, 300, dtype=np.float32), arr(rng, 300, 40, dtype=np.float32)  # two blocks of k
    heads, keys = arr(rng, 4, 30, 8, dtype=np.float32), arr(rng, 4, 8, 20, dtype=np.float32)
    wide = arr(rng, 300, 150, dtype=np.float32)  # few rows, many columns: cut into columns for threads
    rows = [arr(rng, 3 * fused.ROWS + 5, 24, dtype=np.float32) for _ in range(3)]  # four blocks of rows, one short
    w, bias = arr(rng, 24, dtype=np.float32), arr(rng, 24, dtype=np.float32)

    def rows_and_grads(f, *arrays):
        tensors = [Tensor(x, requires_grad=True) for x in arrays]
        outs = f(*tensors)
        outs = outs if isinstance(outs, tuple) else (outs,)
        sum(((o * Tensor(rows[2])).sum() for o in outs), Tensor(np.float32(0))).backward()
        return [o.data for o in outs] + [t.grad for t in tensors]

    def run():
        out, lse = fused.attention_forward(q, k, v, causal=True)
        grads = fused.attention_backward(q, k, v, out, lse, dout, causal=True)
        y, states = cpu.selective_scan(*scan, return_states=True)
        scan_grads = cpu.selective_scan_backward(np.ones_like(y), *scan, states)
        return [out, lse, *grads, y, *scan_grads, cpu.matmul(a, b), cpu.matmul_bt(b.T, a), cpu.matmul(heads, keys), cpu.matmul(a[:40], wide),
                *rows_and_grads(fused.bias_gelu, rows[0], bias), *rows_and_grads(fused.add_layer_norm, *rows[:2], w, bias)]

    alone = run()
    calls = []
    original = cpu._share
    monkeypatch.setattr(cpu, "threads", lambda: 3)
    monkeypatch.setattr(cpu, "PARALLEL_WORK", 0)
    monkeypatch.setattr(cpu, "_share", lambda kernel, work, jobs, *args: (calls.append(jobs),
                                                                          original(kernel, work, jobs, *args)))
    shared = run()
    assert calls and min(calls) >= 2 and max(calls) >= 3, calls  # jobs enough for the threads
    for x, y in zip(alone, shared):
        np.testing.assert_array_equal(x, y)


def test_a_forked_child_shares_its_kernels_on_threads_of_its_own(rng, monkeypatch):
    """A process forked after the parent started its threads has none of them: it starts its own."""
    import multiprocessing

    monkeypatch.setattr(cpu, "threads", lambda: 2)
    monkeypatch.setattr(cpu, "PARALLEL_WORK", 0)
    a, b = arr(rng, 40, 30, dtype=np.float32), arr(rng, 30, 20, dtype=np.float32)
    expected = cpu.matmul(a, b)
    assert cpu._helpers
    with multiprocessing.get_context("fork").Pool(1) as pool:
        got = pool.apply_async(cpu.matmul, (a, b)).get(timeout=60)
    np.testing.assert_array_equal(got, expected)


@cpu.range_kernel()
def _fails_after_the_first_job(x, job0, job1):
    for i in range(job0, job1):
        if i > 0:
            raise ValueError("a job after the first")
        x[i] = 1


def test_an_error_in_a_helper_thread_is_raised_in_the_caller_and_the_threads_go_on(rng, monkeypatch):
    monkeypatch.setattr(cpu, "threads", lambda: 3)
    monkeypatch.setattr(cpu, "PARALLEL_WORK", 0)
    x = np.zeros(3)
    with pytest.raises(ValueError, match="a job after the first"):
        cpu._share(_fails_after_the_first_job, 1, 3, x)  # jobs 1 and 2 run in the two helpers
    assert x[0] == 1  # the caller's own job ran
    a, b = arr(rng, 40, 30, dtype=np.float32), arr(rng, 30, 20, dtype=np.float32)
    np.testing.assert_allclose(cpu.matmul(a, b), a @ b, rtol=1e-5, atol=1e-5)  # the helpers still work


def test_ctrl_c_while_the_helpers_work_waits_for_them_then_stops(monkeypatch):
    """The notebook's stop button raises KeyboardInterrupt in the calling thread; the helpers are
    still writing, so `_share` waits for them before it stops, and the next call starts in step.
    (The "kernel" here is a Python function, so that the helper's job ends when the test says.)"""
    import signal
    import threading

    if os.name != "posix" or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("needs Ctrl-C to raise KeyboardInterrupt in this process (POSIX, Python's own handler)")
    monkeypatch.setattr(cpu, "threads", lambda: 2)
    monkeypatch.setattr(cpu, "PARALLEL_WORK", 0)
    started, release = threading.Event(), threading.Event()

    def slow_after_the_first_job(x, job0, job1):
        if job0 > 0:
            started.set()
            release.wait(30)
        x[job0:job1] = 1

    def interrupt_then_release():
        started.wait(30)
        time.sleep(0.1)  # the caller is waiting for the helper by now
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)
        release.set()

    x = np.zeros(2)
    stopper = threading.Thread(target=interrupt_then_release)
    stopper.start()
    with pytest.raises(KeyboardInterrupt):
        cpu._share(slow_after_the_first_job, 1, 2, x)
    stopper.join()
    assert x[1] == 1, "the call stopped before its helper had finished"
    y = np.zeros(2)
    cpu._share(slow_after_the_first_job, 1, 2, y)
    assert list(y) == [1, 1], "the next call returned before its helper had finished"
