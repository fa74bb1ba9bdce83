"""The fused CUDA kernels of lesson 6.5 on device arrays: attention's backward by tiles, cross-entropy's
forward and backward, against the NumPy path (on the simulator where there is no GPU), clean under the
tracer; and `use_kernels("cuda")` running a GPT's loss and gradients on them."""

import numpy as np
import pytest

import course.kernels as K
import course.tensor.functional as F
from course.kernels import cuda, fused_cuda, ops
from course.tensor import Tensor

pytestmark = pytest.mark.part6

B = fused_cuda.ATT_BLOCK


def _qkv(rng, t_q, t_k, d=4, dv=3, bh=2):
    return (rng.standard_normal((bh, t_q, d)).astype(np.float32),
            rng.standard_normal((bh, t_k, d)).astype(np.float32) * 2,
            rng.standard_normal((bh, t_k, dv)).astype(np.float32))


def _engine(q, k, v, dout, causal):
    ts = [Tensor(a, requires_grad=True) for a in (q, k, v)]
    out = F.scaled_dot_product_attention.default(*ts, causal)
    out.backward(dout)
    return out.data, [t.grad for t in ts]


def _is_device_array(a):
    return hasattr(a, "copy_to_host") and not isinstance(a, np.ndarray)  # a numba device array (or the simulator's)


# ----- attention: device functions against the engine ----------------------------------------------------------
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("t_q, t_k", [(B + 3, B + 3), (3, B + 5), (2 * B, 2 * B), (1, 1)])
def test_attention_forward_and_backward_on_the_device_equal_the_numpy_path(rng, causal, t_q, t_k):
    q, k, v = _qkv(rng, t_q, t_k)
    dout = rng.standard_normal((2, t_q, 3)).astype(np.float32)
    d_q, d_k, d_v = (cuda.to_device(a) for a in (q, k, v))
    out, lse = fused_cuda.attention_forward_device(d_q, d_k, d_v, causal, 1 / np.sqrt(4))
    assert _is_device_array(out) and _is_device_array(lse) and out.shape == (2, t_q, 3) and lse.shape == (2, t_q)
    grads = fused_cuda.attention_backward_device(d_q, d_k, d_v, out, lse, cuda.to_device(dout), causal, 1 / np.sqrt(4))
    assert all(_is_device_array(g) for g in grads)
    expected, expected_grads = _engine(q, k, v, dout, causal)
    np.testing.assert_allclose(out.copy_to_host(), expected, rtol=1e-5, atol=1e-6)
    for name, got, want in zip("qkv", grads, expected_grads):
        np.testing.assert_allclose(got.copy_to_host(), want, rtol=1e-4, atol=1e-5, err_msg=f"d{name}")


def test_non_causal_attention_takes_more_queries_than_keys_and_any_scale(rng):
    q, k, v = _qkv(rng, B + 5, 3)
    dout = rng.standard_normal((2, B + 5, 3)).astype(np.float32)
    out, lse = fused_cuda.attention(q, k, v, causal=False)
    dq, dk, dv = fused_cuda.attention_backward(q, k, v, out, lse, dout, causal=False)
    expected, (eq, ek, ev) = _engine(q, k, v, dout, False)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
    for got, want in ((dq, eq), (dk, ek), (dv, ev)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    # scale 1 on the device is scale 1/sqrt(d) on q scaled by sqrt(d) = 2
    d = [cuda.to_device(a) for a in (q, k, v)]
    out1, _ = fused_cuda.attention_forward_device(cuda.to_device(q / 2), d[1], d[2], False, 1.0)
    np.testing.assert_allclose(out1.copy_to_host(), expected, rtol=1e-5, atol=1e-6)


def test_attention_backward_on_leading_axes_and_bad_shapes_named(rng):
    q, k, v = (rng.standard_normal((2, 2, 5, 4)).astype(np.float32) for _ in range(3))
    out, lse = fused_cuda.attention(q, k, v)
    assert lse.shape == (2, 2, 5)
    dq, dk, dv = fused_cuda.attention_backward(q, k, v, out, lse, np.ones_like(out))
    _, expected = _engine(q, k, v, np.ones_like(out), True)
    for got, want in zip((dq, dk, dv), expected):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match=r"lse \(2, 2, 4\) do not fit"):
        fused_cuda.attention_backward(q, k, v, out, lse[..., :4], out)
    d3 = [cuda.to_device(a.reshape(4, 5, 4)) for a in (q, k, v)]
    with pytest.raises(ValueError, match=r"dout has shape \(4, 4, 4\), expected \(4, 5, 4\)"):
        fused_cuda.attention_backward_device(*d3, d3[0], cuda.to_device(lse.reshape(4, 5)),
                                             cuda.to_device(np.zeros((4, 4, 4), np.float32)))
    with pytest.raises(TypeError, match="q has dtype float64"):
        fused_cuda.attention_forward_device(cuda.to_device(np.zeros((1, 2, 4))), d3[1], d3[2])
    with pytest.raises(ValueError, match="5 causal queries need at least as many keys, got 2"):
        fused_cuda.attention_forward_device(d3[0], d3[1][:, :2], d3[2][:, :2])


# ----- the tracer: no races, no out-of-bounds accesses, no garbage read, every output written --------------------
def _clean(report):
    assert not report.races and not report.out_of_bounds, report.summary()
    assert not report.uninitialised and not report.barrier_issues, report.summary()


@pytest.mark.parametrize("causal, t_q, t_k", [(True, B + 3, B + 3), (False, B + 3, B + 3), (True, 3, B + 2)])
def test_attention_backward_kernels_are_clean_under_the_tracer(rng, causal, t_q, t_k):
    q, k, v = _qkv(rng, t_q, t_k)
    dout = rng.standard_normal((2, t_q, 3)).astype(np.float32)
    out, lse = fused_cuda.attention(q, k, v, causal)
    scale = np.float32(0.5)  # 1/sqrt(4)
    dq, delta = np.zeros_like(q), np.zeros((2, t_q), np.float32)
    report = K.trace(fused_cuda.attention_backward_dq_kernel, ((t_q + B - 1) // B, 2), B,
                     q, k, v, out, dout, lse, scale, causal, dq, delta)
    _clean(report)
    assert not report.unwritten("dq").any() and not report.unwritten("delta").any()
    dk, dv = np.zeros_like(k), np.zeros_like(v)
    report = K.trace(fused_cuda.attention_backward_dkdv_kernel, ((t_k + B - 1) // B, 2), B,
                     q, k, v, dout, lse, delta, scale, causal, dk, dv)
    _clean(report)
    assert not report.unwritten("dk").any() and not report.unwritten("dv").any()
    _, expected = _engine(q, k, v, dout, causal)
    for got, want in zip((dq, dk, dv), expected):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(delta, (dout * out).sum(-1), rtol=1e-5, atol=1e-6)
    # each query row is read from global memory once per block of keys that it sees, not once per key
    blocks_of_keys = (t_k + B - 1) // B
    assert report.counts("q").max() <= blocks_of_keys


# ----- cross-entropy on the device ---------------------------------------------------------------------------------
def _engine_ce(logits, targets, ignore_index, dloss=1.0):
    x = Tensor(logits, requires_grad=True)
    loss = F.cross_entropy.default(x, targets, ignore_index=ignore_index)
    loss.backward(np.asarray(dloss, np.float32))
    return float(loss.data), x.grad


@pytest.mark.parametrize("ignore_index", [-1, 3, None])
def test_cross_entropy_device_functions_equal_the_numpy_path(rng, ignore_index):
    logits = (rng.standard_normal((7, 21)) * 3).astype(np.float32)
    targets = rng.integers(0, 21, 7)
    if ignore_index is not None:
        targets[[1, 4]] = ignore_index
    ignore = -100 if ignore_index is None else ignore_index
    count = int(np.sum(targets != ignore))
    d_x, d_t = cuda.to_device(logits), cuda.to_device(targets.astype(np.int64))
    losses, lse = fused_cuda.cross_entropy_forward_device(d_x, d_t, ignore)
    assert _is_device_array(losses) and _is_device_array(lse)
    scale = cuda.to_device(np.array([0.5 / count], np.float32))  # dloss = 0.5, over the rows that count
    grad = fused_cuda.cross_entropy_backward_device(d_x, d_t, lse, ignore, scale)
    assert _is_device_array(grad)
    loss, expected_grad = _engine_ce(logits, targets, ignore_index, 0.5)
    losses, grad = losses.copy_to_host(), grad.copy_to_host()
    assert losses.sum() / count == pytest.approx(loss, rel=1e-5)
    np.testing.assert_allclose(lse.copy_to_host(), np.log(np.exp(logits.astype(np.float64)).sum(-1)), rtol=1e-5)
    np.testing.assert_allclose(grad, expected_grad, rtol=1e-5, atol=1e-7)
    if ignore_index is not None:
        assert np.all(losses[[1, 4]] == 0) and np.all(grad[[1, 4]] == 0)


def test_cross_entropy_kernels_are_clean_under_the_tracer(rng):
    logits = rng.standard_normal((3, 37)).astype(np.float32)
    targets = np.array([4, -1, 36], np.int64)
    losses, lse = np.zeros(3, np.float32), np.zeros(3, np.float32)
    report = K.trace(fused_cuda.cross_entropy_forward_kernel, 3, 16, logits, targets, np.int64(-1), losses, lse)
    _clean(report)
    assert not report.unwritten("losses").any() and not report.unwritten("lse").any()
    grad = np.zeros_like(logits)
    report = K.trace(fused_cuda.cross_entropy_backward_kernel, 3, 16, logits, targets, lse, np.int64(-1),
                     np.array([0.5], np.float32), grad)
    _clean(report)
    assert not report.unwritten("grad").any()
    loss, expected_grad = _engine_ce(logits, targets, -1)
    np.testing.assert_allclose(losses.sum() / 2, loss, rtol=1e-5)
    np.testing.assert_allclose(grad, expected_grad, rtol=1e-5, atol=1e-7)


def test_a_target_out_of_range_gives_nan_on_the_device_not_a_read_outside_the_row():
    d_x = cuda.to_device(np.zeros((2, 5), np.float32))
    losses, _ = fused_cuda.cross_entropy_forward_device(d_x, cuda.to_device(np.array([1, 9])), -100)
    losses = losses.copy_to_host()
    assert losses[0] == pytest.approx(np.log(5)) and np.isnan(losses[1])


# ----- the operations under use_kernels("cuda") --------------------------------------------------------------------
def test_cuda_attention_operation_equals_the_engine_and_dropout_falls_back(rng):
    q, k, v = (rng.standard_normal((1, 2, 5, 4)).astype(np.float32) for _ in range(3))
    dout = np.linspace(-1, 1, q.size).reshape(q.shape).astype(np.float32)
    K.reset_launches()
    ts = [Tensor(a, requires_grad=True) for a in (q, k, v)]
    out = ops.cuda_attention(*ts)
    out.backward(dout)
    assert out.op == "attention"
    assert K.launches() == {"attention_kernel": 1, "attention_backward_dq_kernel": 1,
                            "attention_backward_dkdv_kernel": 1}
    expected, grads = _engine(q, k, v, dout, True)
    np.testing.assert_allclose(out.data, expected, rtol=1e-5, atol=1e-6)
    for t, want in zip(ts, grads):
        np.testing.assert_allclose(t.grad, want, rtol=1e-4, atol=1e-5)
    K.reset_launches()
    ops.cuda_attention(*[Tensor(a) for a in (q, k, v)], dropout_p=0.5, training=True)
    assert "attention_kernel" not in K.launches()


def test_cuda_cross_entropy_operation_checks_targets_as_the_engine_does(rng):
    x = Tensor(np.zeros((2, 3, 5), np.float32), requires_grad=True)
    for targets, ignore_index in ((np.array([[0, 9, 1], [2, 3, 4]]), None), (np.full((2, 3), -1), -1),
                                  (np.zeros((2, 3)), None), (np.zeros((3, 2), np.int64), None)):
        with pytest.raises((ValueError, TypeError)) as engine:
            F.cross_entropy.default(x, targets, ignore_index)
        with pytest.raises(type(engine.value), match=str(engine.value).replace("(", r"\(").replace(")", r"\)")):
            ops.cuda_cross_entropy(x, targets, ignore_index)
    logits = (rng.standard_normal((2, 3, 5)) * 2).astype(np.float32)
    targets = Tensor(np.array([[0, -1, 4], [2, 3, -1]]))
    x = Tensor(logits, requires_grad=True)
    K.reset_launches()
    loss = ops.cuda_cross_entropy(x, targets, ignore_index=-1)
    (loss * 3).backward()
    assert K.launches() == {"cross_entropy_forward_kernel": 1, "cross_entropy_backward_kernel": 1}
    expected, grad = _engine_ce(logits, targets.data, -1, 3.0)
    assert loss.dtype == np.float32 and float(loss.data) == pytest.approx(expected, rel=1e-6)
    np.testing.assert_allclose(x.grad, grad, rtol=1e-5, atol=1e-7)


def test_gpt_loss_and_gradients_on_cuda_kernels_equal_the_numpy_path(rng):
    from course.gpt import GPT, GPTConfig
    model = GPT(GPTConfig(vocab_size=11, block_size=4, n_layer=1, n_head=2, n_embd=8), seed=0).astype(np.float32)
    idx, targets = rng.integers(0, 11, (2, 4)), rng.integers(0, 11, (2, 4))
    targets[1, 0] = -1  # GPT's ignore_index

    def loss_and_grads():
        model.zero_grad()
        _, loss = model(idx, targets)
        loss.backward()
        return float(loss.data), {n: p.grad.copy() for n, p in model.named_parameters()}

    loss, grads = loss_and_grads()
    K.reset_launches()
    with K.use_kernels("cuda"):
        loss_k, grads_k = loss_and_grads()
    used = K.launches()
    assert {"attention_kernel", "attention_backward_dq_kernel", "attention_backward_dkdv_kernel",
            "cross_entropy_forward_kernel", "cross_entropy_backward_kernel"} <= set(used), used
    assert "softmax_kernel" not in used  # attention by tiles: no (T, T) softmax
    assert loss_k == pytest.approx(loss, rel=1e-5)
    assert grads_k.keys() == grads.keys()
    for name in grads:
        np.testing.assert_allclose(grads_k[name], grads[name], rtol=1e-4, atol=1e-5, err_msg=name)
