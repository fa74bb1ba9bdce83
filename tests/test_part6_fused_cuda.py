"""The fused CUDA kernels of lesson 6.5 (attention by tiles, cross-entropy): against the NumPy path,
on the simulator where there is no GPU, and clean under the tracer."""

import numpy as np
import pytest

import course.kernels as K
import course.tensor.functional as F
from course.kernels import fused_cuda
from course.tensor import Tensor

pytestmark = pytest.mark.part6

B = fused_cuda.ATT_BLOCK


def _qkv(rng, t_q, t_k, d=4, dv=3, lead=(2,)):
    return (rng.standard_normal(lead + (t_q, d)).astype(np.float32),
            rng.standard_normal(lead + (t_k, d)).astype(np.float32) * 2,
            rng.standard_normal(lead + (t_k, dv)).astype(np.float32))


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("t_q, t_k", [(B + 3, B + 3), (2 * B, 2 * B), (3, B + 5), (1, 1)])
def test_attention_equals_the_numpy_path(rng, causal, t_q, t_k):
    q, k, v = _qkv(rng, t_q, t_k, lead=(2, 1))
    out, lse = fused_cuda.attention(q, k, v, causal)
    expected = F.scaled_dot_product_attention.default(Tensor(q), Tensor(k), Tensor(v), causal).data
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if causal:
        scores = np.where(F.causal_mask(t_q, t_k), -np.inf, scores)
    np.testing.assert_allclose(lse, np.log(np.exp(scores).sum(-1)), rtol=1e-5, atol=1e-5)


def test_cross_entropy_equals_the_numpy_path(rng):
    logits = rng.standard_normal((3, 4, 21)).astype(np.float32) * 3
    targets = rng.integers(0, 21, (3, 4))
    targets[1, :2] = -1
    loss, grad = fused_cuda.cross_entropy(logits, targets, ignore_index=-1)
    x = Tensor(logits, requires_grad=True)
    expected = F.cross_entropy.default(x, targets, ignore_index=-1)
    expected.backward()
    assert loss == pytest.approx(float(expected.data), rel=1e-5)
    np.testing.assert_allclose(grad, x.grad, rtol=1e-5, atol=1e-7)
    assert np.all(grad[1, :2] == 0)


def test_bad_input_is_named(rng):
    q, k, v = _qkv(rng, 4, 4)
    with pytest.raises(ValueError, match=r"q \(2, 4, 4\), k \(2, 4, 3\)"):
        fused_cuda.attention(q, k[..., :3], v)
    with pytest.raises(ValueError, match="at most MAX_HEAD=64"):
        fused_cuda.attention(*_qkv(rng, 2, 2, d=65))
    with pytest.raises(TypeError, match="float32"):
        fused_cuda.attention(q.astype(np.float64), k, v)
    with pytest.raises(ValueError, match="target 9 is out of range for 5 classes"):
        fused_cuda.cross_entropy(np.zeros((2, 5), np.float32), np.array([0, 9]))
    with pytest.raises(ValueError, match="every target equals ignore_index=-1"):
        fused_cuda.cross_entropy(np.zeros((2, 5), np.float32), np.array([-1, -1]), ignore_index=-1)


# ----- the tracer: no races, no out-of-bounds accesses, every output written ------------------------------------
@pytest.mark.parametrize("causal", [True, False])
def test_attention_kernel_is_clean_under_the_tracer(rng, causal):
    t_q = t_k = B + 3  # a partial last tile of queries and of keys
    q, k, v = _qkv(rng, t_q, t_k, lead=(2,))
    out = np.zeros((2, t_q, 3), np.float32)
    lse = np.zeros((2, t_q), np.float32)
    grid = ((t_q + B - 1) // B, 2)
    report = K.trace(fused_cuda.attention_kernel, grid, B, q, k, v, np.float32(0.5), causal, out, lse)
    assert not report.races and not report.out_of_bounds, report.summary()
    assert not report.unwritten("out").any() and not report.unwritten("lse").any()
    expected = F.scaled_dot_product_attention.default(Tensor(q), Tensor(k), Tensor(v), causal).data
    # the tracer ran the kernel with scale 0.5 rather than 1/sqrt(4) = 0.5: the same numbers
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
    # each key is read from global memory by one thread per block of queries, not by every query
    reads = report.counts("k")
    assert reads.max() <= grid[0] * 1  # at most one read per block (for each of its d numbers)

