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
