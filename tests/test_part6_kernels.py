"""The CUDA kernels (on a GPU where there is one, else on Numba's simulator) against NumPy.

The simulator runs each GPU thread as a Python thread, so every size here is small, and awkward
on purpose: not a multiple of the block or the tile.
"""

import numpy as np
import pytest

import course.kernels as K

pytestmark = pytest.mark.part6


def f32(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def test_backend_is_known_and_explained():
    assert K.backend() in ("gpu", "simulator")
    assert isinstance(K.backend_reason(), str) and K.backend_reason()


# ----- vector add and sum -------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(1,), (33,), (3, 11)])
def test_vector_add(rng, shape):
    a, b = f32(rng, *shape), f32(rng, *shape)
    got = K.vector_add(a, b)
    assert got.shape == shape and got.dtype == np.float32
    np.testing.assert_array_equal(got, a + b)


def test_vector_add_with_small_blocks(rng):
    a, b = f32(rng, 21), f32(rng, 21)
    np.testing.assert_array_equal(K.vector_add(a, b, threads_per_block=8), a + b)


@pytest.mark.parametrize("n", [1, 7, 33, 300])
def test_reduce_sum(rng, n):
    x = f32(rng, n)
    np.testing.assert_allclose(K.reduce_sum(x), x.astype(np.float64).sum(), rtol=1e-5, atol=1e-5)


def test_reduce_sum_many_blocks_and_odd_sizes(rng):
    x = f32(rng, 5, 13)
    np.testing.assert_allclose(K.reduce_sum(x, threads_per_block=8, blocks=3), x.sum(), rtol=1e-5, atol=1e-5)
    assert K.reduce_sum(np.zeros(0, np.float32)) == 0


# ----- impossible launches and bad input are refused before launching ------------------------------
def test_impossible_launches_name_the_limit(rng):
    a = f32(rng, 8)
    K.reset_launches()
    with pytest.raises(ValueError, match=f"2048 threads is more than the {K.MAX_THREADS_PER_BLOCK}"):
        K.vector_add(a, a, threads_per_block=2048)
    with pytest.raises(ValueError, match="no threads"):
        K.vector_add(a, a, threads_per_block=0)
    with pytest.raises(ValueError, match="no blocks"):
        K.check_launch(0, 32)
    with pytest.raises(ValueError, match="no blocks"):
        K.reduce_sum(a, threads_per_block=8, blocks=0)
    with pytest.raises(ValueError, match="no blocks"):
        K.check_launch((2, -1), 32)
    with pytest.raises(ValueError, match="power of two"):
        K.reduce_sum(a, threads_per_block=12)
    with pytest.raises(ValueError, match="1 to 3 dimensions"):
        K.check_launch((1, 1, 1, 1), 32)
    assert K.launches() == {}  # nothing was launched


def test_mismatched_shapes_and_dtypes_are_named(rng):
    with pytest.raises(ValueError, match=r"\(3,\) and \(4,\)"):
        K.vector_add(f32(rng, 3), f32(rng, 4))
    with pytest.raises(TypeError, match="float64.*float32"):
        K.vector_add(np.ones(3), np.ones(3))
    with pytest.raises(TypeError, match="int64.*astype"):
        K.reduce_sum(np.arange(3))


def test_launch_counter(rng):
    K.reset_launches()
    K.vector_add(f32(rng, 4), f32(rng, 4))
    K.reduce_sum(f32(rng, 200), threads_per_block=8, blocks=2)
    assert K.launches() == {"vector_add_kernel": 1, "reduce_sum_kernel": 2}
    K.reset_launches()
    assert K.launches() == {}


# ----- softmax and layer norm over rows -----------------------------------------------------------------
def np_softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def np_layer_norm(x, w, b, eps=1e-5):
    mu = x.mean(axis=-1, keepdims=True)
    var = x.var(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


@pytest.mark.parametrize("shape", [(1, 1), (3, 33), (2, 70)])  # rows shorter and longer than the block
def test_softmax(rng, shape):
    x = f32(rng, *shape, scale=3)
    got = K.softmax(x)
    np.testing.assert_allclose(got, np_softmax(x.astype(np.float64)), rtol=1e-5, atol=1e-7)


def test_softmax_where_exp_overflows_float32(rng):
    x = f32(rng, 2, 33)
    x[0] += 500  # exp(500) is inf in float32
    x[1, 5] = 1e4
    got = K.softmax(x)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, np_softmax(x.astype(np.float64)), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(got.sum(axis=1), 1, rtol=1e-5)


def test_softmax_backward(rng):
    x, g = f32(rng, 3, 37), f32(rng, 3, 37)
    s = K.softmax(x)
    expected = s * (g - (g * s).sum(axis=1, keepdims=True))
    np.testing.assert_allclose(K.softmax_backward(s, g), expected, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("shape", [(1, 5), (3, 45)])
def test_layer_norm_and_its_backward(rng, shape):
    x, g = f32(rng, *shape, scale=4) + 3, f32(rng, *shape)
    w, b = f32(rng, shape[1]), f32(rng, shape[1])
    y, mean, rstd = K.layer_norm(x, w, b, return_stats=True)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(y, np_layer_norm(x64, w, b), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(mean, x64.mean(axis=1), rtol=1e-5, atol=1e-6)
    xhat = (x64 - x64.mean(1, keepdims=True)) / np.sqrt(x64.var(1, keepdims=True) + 1e-5)
    gy = g * w
    dx = (gy - gy.mean(1, keepdims=True) - xhat * (gy * xhat).mean(1, keepdims=True)) * rstd[:, None]
    got_dx, got_dw, got_db = K.layer_norm_backward(x, w, mean, rstd, g)
    np.testing.assert_allclose(got_dx, dx, rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(got_dw, (g * xhat).sum(0), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got_db, g.sum(0), rtol=1e-5, atol=1e-5)


def test_layer_norm_without_weight_and_bias(rng):
    x = f32(rng, 2, 9)
    np.testing.assert_allclose(K.layer_norm(x), np_layer_norm(x.astype(np.float64), 1, 0), rtol=1e-4, atol=1e-5)


# ----- matrix product ------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["tiled", "naive"])
@pytest.mark.parametrize("m,k,n", [(5, 7, 3), (1, 1, 1), (11, 13, 9), (2, 0, 3)])
def test_matmul(rng, method, m, k, n):
    a, b = f32(rng, m, k), f32(rng, k, n)
    got = K.matmul(a, b, method=method)
    assert got.shape == (m, n) and got.dtype == np.float32
    np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)


def test_matmul_errors_name_both_shapes_and_the_methods(rng):
    with pytest.raises(ValueError, match=r"\(5, 7\) and \(6, 3\).*7 and 6"):
        K.matmul(f32(rng, 5, 7), f32(rng, 6, 3))
    with pytest.raises(ValueError, match="'tiled', 'naive'"):
        K.matmul(f32(rng, 2, 2), f32(rng, 2, 2), method="fast")
    with pytest.raises(ValueError, match="2-D"):
        K.matmul(f32(rng, 2, 2, 2), f32(rng, 2, 2))


# ----- selective scan --------------------------------------------------------------------------------------
def scan_inputs(rng, b=2, l=5, d=3, n=4, dtype=np.float32):
    u = rng.standard_normal((b, l, d))
    delta = np.abs(rng.standard_normal((b, l, d))) * 0.5 + 0.05
    A = -np.exp(rng.standard_normal((d, n)) * 0.5)
    B, C = rng.standard_normal((b, l, n)), rng.standard_normal((b, l, n))
    D = rng.standard_normal(d)
    return [x.astype(dtype) for x in (u, delta, A, B, C, D)]


def np_scan(u, delta, A, B, C, D):
    """The recurrence, step by step in float64: the reference."""
    b, l, d = u.shape
    h = np.zeros((b, d, A.shape[1]))
    y = np.empty((b, l, d))
    for t in range(l):
        h = np.exp(delta[:, t, :, None] * A) * h + delta[:, t, :, None] * B[:, t, None, :] * u[:, t, :, None]
        y[:, t] = (h * C[:, t, None, :]).sum(-1) + D * u[:, t]
    return y


def test_selective_scan_and_states(rng):
    args = scan_inputs(rng)
    y, states = K.selective_scan(*args, return_states=True)
    np.testing.assert_allclose(y, np_scan(*[a.astype(np.float64) for a in args]), rtol=1e-4, atol=1e-5)
    assert states.shape == (2, 5, 3, 4)
    np.testing.assert_allclose(K.selective_scan(*args[:5]), np_scan(*args[:5], np.zeros(3)), rtol=1e-4, atol=1e-5)


def test_selective_scan_backward_matches_the_engine(rng):
    from course.mamba import selective_scan as engine_scan
    from course.tensor import Tensor

    args = scan_inputs(rng)
    g = f32(rng, 2, 5, 3)
    _, states = K.selective_scan(*args, return_states=True)
    got = K.selective_scan_backward(g, *args, states)
    tensors = [Tensor(a.astype(np.float64), requires_grad=True) for a in args]
    engine_scan(*tensors, method="sequential").backward(g.astype(np.float64))
    for name, grad, t in zip("u delta A B C D".split(), got, tensors):
        np.testing.assert_allclose(grad, t.grad, rtol=1e-3, atol=1e-4, err_msg=name)


def test_selective_scan_shapes_that_do_not_fit_are_named(rng):
    u, delta, A, B, C, D = scan_inputs(rng)
    with pytest.raises(ValueError, match=r"B \(2, 4, 4\)"):
        K.selective_scan(u, delta, A, B[:, :4], C, D)
    big = np.zeros((3, K.MAX_STATE + 1), np.float32)
    with pytest.raises(ValueError, match="MAX_STATE"):
        K.selective_scan(u, delta, big, np.zeros((2, 5, K.MAX_STATE + 1), np.float32),
                         np.zeros((2, 5, K.MAX_STATE + 1), np.float32), D)


# ----- the small helpers and a failing kernel ------------------------------------------------------------
def test_reduce_rows_and_add_row(rng):
    x, r = f32(rng, 6, 35), f32(rng, 35)
    np.testing.assert_allclose(K.reduce_rows(x), x.sum(0), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(K.add_row(x, r), x + r)
    with pytest.raises(ValueError, match=r"\(6, 35\) and \(34,\)"):
        K.add_row(x, r[:34])


@K.cuda.jit
def _divides_by_zero_index(x):
    i = K.cuda.grid(1)
    x[i // (i - 2)] = 1.0  # thread 2 divides by zero


@pytest.mark.skipif(K.backend() != "simulator", reason="a Python exception inside a kernel is the simulator's")
def test_a_kernel_that_fails_in_the_simulator_names_itself_and_the_next_call_works(rng):
    with pytest.raises(RuntimeError, match="_divides_by_zero_index failed"):
        K.launch(_divides_by_zero_index, 1, 4, K.cuda.to_device(np.zeros(4, np.float32)))
    a, b = f32(rng, 40), f32(rng, 40)
    np.testing.assert_array_equal(K.vector_add(a, b), a + b)
    np.testing.assert_allclose(K.softmax(f32(rng, 2, 5)).sum(1), 1, rtol=1e-5)


def test_reduce_rows_of_zero_rows_is_zeros():
    for shape in [(0, 3), (0, 2, 4)]:
        x = np.zeros(shape, np.float32)
        np.testing.assert_array_equal(K.reduce_rows(x), np.zeros(shape[1:], np.float32))
        np.testing.assert_array_equal(K.cpu.reduce_rows(x), np.zeros(shape[1:], np.float32))
        np.testing.assert_array_equal(K.cpu.reduce_rows(x.astype(np.float64)), np.zeros(shape[1:]))
    with pytest.raises(ValueError, match="at least one axis"):
        K.cpu.reduce_rows(np.float32(1))


def test_layer_norm_of_numbers_whose_squares_overflow_float32():
    x = np.array([[3e38, -3e38, 1], [1e-30, -1e-30, 0], [5, 5, 5], [1, 2, 3]], np.float32)
    expected = np_layer_norm(x.astype(np.float64), np.ones(3), np.zeros(3), 1e-5)
    got = K.layer_norm(x)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[0], [1.2247449, -1.2247449, 0], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got, K.cpu.layer_norm(x), rtol=1e-5, atol=1e-6)
