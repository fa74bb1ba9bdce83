"""Autograd operations on kernels, and `use_kernels` running GPT and Mamba on them unchanged."""

import warnings

import numpy as np
import pytest

import course.kernels as K
import course.tensor.functional as F
from course.kernels import ops
from course.tensor import Tensor, dispatch, gradcheck

from test_part6_kernels import scan_inputs  # noqa: E402

pytestmark = pytest.mark.part6


def weights(n):
    """A fixed, uneven weighting of the output, so that sum() does not hide a wrong gradient."""
    return Tensor(np.linspace(-1.0, 2.0, n))


def cpu(op):
    def call(*args, **kwargs):
        return op(*args, device="cpu", **kwargs)
    return call


# ----- every operation against finite differences, in float64 on the CPU kernels ----------------------
CASES = {
    "matmul": (lambda a, b: cpu(ops.matmul)(a, b) * weights(5), [(3, 4), (4, 5)]),
    "matmul batched": (lambda a, b: cpu(ops.matmul)(a, b) * weights(5), [(2, 3, 4), (2, 4, 5)]),
    "linear": (lambda x, w, b: cpu(ops.linear)(x, w, b) * weights(5), [(2, 3, 4), (5, 4), (5,)]),
    "linear without bias": (lambda x, w: cpu(ops.linear)(x, w) * weights(3), [(6, 4), (3, 4)]),
    "softmax": (lambda x: cpu(ops.softmax)(x) * weights(7), [(2, 3, 7)]),
    "layer_norm": (lambda x, w, b: cpu(ops.layer_norm)(x, w, b) * weights(6), [(2, 3, 6), (6,), (6,)]),
    "layer_norm, no parameters": (lambda x: cpu(ops.layer_norm)(x, None, None) * weights(6), [(4, 6)]),
    "attention, causal": (lambda q, k, v: cpu(ops.scaled_dot_product_attention)(q, k, v) * weights(3),
                          [(2, 5, 4), (2, 5, 4), (2, 5, 3)]),
    "attention, queries after a cache": (
        lambda q, k, v: cpu(ops.scaled_dot_product_attention)(q, k, v) * weights(3),
        [(2, 2, 4), (2, 5, 4), (2, 5, 3)]),
    "attention, not causal": (
        lambda q, k, v: cpu(ops.scaled_dot_product_attention)(q, k, v, causal=False) * weights(3),
        [(1, 2, 3, 4), (1, 2, 5, 4), (1, 2, 5, 3)]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_gradients_against_finite_differences(rng, name):
    fn, shapes = CASES[name]
    assert gradcheck(fn, *[rng.standard_normal(s) for s in shapes])


@pytest.mark.parametrize("with_D", [True, False])
def test_scan_gradients_against_finite_differences(rng, with_D):
    u, delta, A, B, C, D = scan_inputs(rng, b=2, l=4, d=3, n=2, dtype=np.float64)
    arrays = [u, delta, A, B, C] + ([D] if with_D else [])

    def fn(*t):
        return cpu(ops.selective_scan)(*t) * weights(3)

    assert gradcheck(fn, *arrays, rtol=1e-5, atol=1e-7)


def test_operations_record_one_node_each_and_keep_the_dtype(rng):
    x = Tensor(rng.standard_normal((3, 4)).astype(np.float32), requires_grad=True)
    w = Tensor(rng.standard_normal((5, 4)).astype(np.float32), requires_grad=True)
    y = cpu(ops.linear)(x, w)
    assert y.op == "linear" and y.dtype == np.float32 and y.inputs[0] is x
    y.sum().backward()
    assert x.grad.dtype == np.float32 and w.grad.shape == (5, 4)


# ----- the CUDA operations (GPU or simulator) against the engine, in float32 --------------------------------
def _compare_with_engine(rng, device_op, engine_op, shapes, rtol=1e-4, atol=1e-5, **kwargs):
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    results = []
    for op in (device_op, engine_op):
        ts = [Tensor(a.copy(), requires_grad=True) for a in arrays]
        out = op(*ts, **kwargs)
        out.backward(np.linspace(-1, 1, out.size).reshape(out.shape).astype(np.float32))
        results.append((out.data, [t.grad for t in ts]))
    (y1, g1), (y2, g2) = results
    np.testing.assert_allclose(y1, y2, rtol=rtol, atol=atol)
    for i, (a, b) in enumerate(zip(g1, g2)):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=f"gradient of input {i}")


def cuda(op):
    def call(*args, **kwargs):
        return op(*args, device="cuda", **kwargs)
    return call


def test_cuda_matmul_and_linear(rng):
    from course.tensor import matmul
    _compare_with_engine(rng, cuda(ops.matmul), matmul.default, [(5, 7), (7, 3)])
    _compare_with_engine(rng, cuda(ops.linear), F.linear.default, [(2, 3, 9), (4, 9), (4,)])


def test_cuda_softmax_and_layer_norm(rng):
    _compare_with_engine(rng, cuda(ops.softmax), F.softmax.default, [(2, 3, 35)])
    _compare_with_engine(rng, cuda(ops.layer_norm), F.layer_norm.default, [(3, 20), (20,), (20,)], rtol=1e-3, atol=1e-4)


def test_cuda_attention(rng):
    _compare_with_engine(rng, cuda(ops.scaled_dot_product_attention), F.scaled_dot_product_attention.default,
                         [(1, 2, 5, 4), (1, 2, 5, 4), (1, 2, 5, 4)])


def test_cuda_selective_scan(rng):
    from course.mamba import selective_scan
    arrays = scan_inputs(rng)
    results = []
    for op in (cuda(ops.selective_scan), lambda *t: selective_scan.default(*t, method="sequential")):
        ts = [Tensor(a.copy(), requires_grad=True) for a in arrays]
        out = op(*ts)
        out.backward(np.linspace(-1, 1, out.size).reshape(out.shape).astype(np.float32))
        results.append([out.data] + [t.grad for t in ts])
    for name, a, b in zip("y u delta A B C D".split(), *results):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4, err_msg=name)
    assert isinstance(cuda(ops.selective_scan)(*arrays), np.ndarray)  # arrays in, array out, as the engine's


# ----- what the kernels do not cover goes back to the engine -------------------------------------------------
def test_unsupported_calls_are_handed_back_to_the_engine(rng):
    x = Tensor(rng.standard_normal((3, 4)).astype(np.float32))
    K.reset_launches()
    np.testing.assert_allclose(cpu(ops.softmax)(x, axis=0).data, F.softmax.default(x, axis=0).data)
    v = Tensor(rng.standard_normal(4).astype(np.float32))
    np.testing.assert_allclose(cpu(ops.matmul)(x, v).data, x.data @ v.data, rtol=1e-6)
    x64 = Tensor(rng.standard_normal((3, 4)))
    with warnings.catch_warnings():  # said once, and tested below
        warnings.simplefilter("ignore", ops.KernelFallbackWarning)
        np.testing.assert_allclose(cuda(ops.softmax)(x64).data, F.softmax.default(x64).data)  # CUDA kernels: float32
    assert K.launches() == {}
    q = Tensor(rng.standard_normal((2, 3, 4)).astype(np.float32))
    F.manual_seed(0)
    a = cpu(ops.scaled_dot_product_attention)(q, q, q, dropout_p=0.5).data
    F.manual_seed(0)
    b = F.scaled_dot_product_attention.default(q, q, q, dropout_p=0.5).data
    np.testing.assert_array_equal(a, b)
    assert K.launches() == {}


def test_shape_errors_stay_the_engines(rng):
    a, b = Tensor(rng.standard_normal((2, 3))), Tensor(rng.standard_normal((4, 5)))
    with K.use_kernels("cpu"):
        with pytest.raises(ValueError, match=r"\(2, 3\) and \(4, 5\)"):
            a @ b
        with pytest.raises(ValueError, match="expects 3"):
            F.linear(Tensor(rng.standard_normal((2, 4))), a)


# ----- use_kernels ------------------------------------------------------------------------------------------------
def test_use_kernels_swaps_inside_only_and_counts_launches(rng):
    x = Tensor(rng.standard_normal((2, 6)).astype(np.float32))
    w = Tensor(rng.standard_normal((3, 6)).astype(np.float32))
    K.reset_launches()
    outside = F.linear(x, w)
    assert K.launches() == {} and dispatch.current("linear") is F.linear.default
    with K.use_kernels("cpu"):
        inside = F.linear(x, w)
        assert dispatch.current("linear") is not F.linear.default
    assert K.launches().get("cpu.matmul", 0) >= 1
    counted = K.launches()
    np.testing.assert_allclose(inside.data, outside.data, rtol=1e-5)
    F.linear(x, w)
    F.softmax(x)
    assert K.launches() == counted and dispatch.current("linear") is F.linear.default


def test_use_kernels_cuda_counts_kernel_launches(rng):
    x = Tensor(rng.standard_normal((2, 6)).astype(np.float32))
    K.reset_launches()
    with K.use_kernels("cuda"):
        F.softmax(x)
    assert K.launches() == {"softmax_kernel": 1}


def test_unknown_device_lists_the_known_ones():
    with pytest.raises(ValueError, match="'gpu'.*'cpu', 'cuda'"):
        with K.use_kernels("gpu"):
            pass
    assert dispatch.current("softmax") is F.softmax.default


# ----- whole models, unchanged ----------------------------------------------------------------------------------
def _gpt(dtype):
    from course.gpt import GPT, GPTConfig
    return GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=8), seed=0).astype(dtype)


def _logits_and_gradients(model, idx, targets=None):
    model.zero_grad()
    if targets is None:
        logits = model(idx)
        logits = logits[0] if isinstance(logits, tuple) else logits
        loss = (logits * Tensor(np.linspace(-1, 1, logits.shape[-1]).astype(logits.dtype))).sum()
    else:
        logits, loss = model(idx, targets)
    loss.backward()
    return logits.data.copy(), {n: p.grad.copy() for n, p in model.named_parameters()}


def test_gpt_on_cpu_kernels_equals_the_numpy_path(rng):
    model = _gpt(np.float64)
    idx, targets = rng.integers(0, 11, (2, 7)), rng.integers(0, 11, (2, 7))
    logits, grads = _logits_and_gradients(model, idx, targets)
    K.reset_launches()
    with K.use_kernels("cpu"):
        logits_k, grads_k = _logits_and_gradients(model, idx, targets)
    used = K.launches()
    # attention runs by tiles (no softmax kernel on the CPU; see test_part6_fused.py)
    assert {"cpu.matmul", "cpu.attention_forward", "cpu.layer_norm", "cpu.layer_norm_backward"} <= set(used)
    np.testing.assert_allclose(logits_k, logits, rtol=1e-10, atol=1e-12)
    assert grads_k.keys() == grads.keys()
    for name in grads:
        np.testing.assert_allclose(grads_k[name], grads[name], rtol=1e-9, atol=1e-12, err_msg=name)


def test_gpt_forward_on_cuda_kernels_equals_the_numpy_path(rng):
    model = _gpt(np.float32)
    idx = rng.integers(0, 11, (1, 5))
    expected, _ = model(idx)
    K.reset_launches()
    with K.use_kernels("cuda"):
        got, _ = model(idx)
    assert {"matmul_tiled_kernel", "attention_kernel", "layer_norm_kernel"} <= set(K.launches())
    np.testing.assert_allclose(got.data, expected.data, rtol=1e-4, atol=1e-5)


def test_mamba_on_cpu_kernels_equals_the_numpy_path(rng):
    from course.mamba import Mamba, MambaConfig
    model = Mamba(MambaConfig(d_model=8, n_layer=2, vocab_size=11, d_state=4), seed=0).astype(np.float64)
    idx = rng.integers(0, 11, (2, 6))
    logits, grads = _logits_and_gradients(model, idx)
    K.reset_launches()
    with K.use_kernels("cpu"):
        logits_k, grads_k = _logits_and_gradients(model, idx)
    assert {"cpu.selective_scan", "cpu.selective_scan_backward", "cpu.matmul"} <= set(K.launches())
    np.testing.assert_allclose(logits_k, logits, rtol=1e-9, atol=1e-12)
    for name in grads:
        np.testing.assert_allclose(grads_k[name], grads[name], rtol=1e-8, atol=1e-11, err_msg=name)


# ----- against PyTorch ------------------------------------------------------------------------------------------
@pytest.mark.reference
def test_operations_against_pytorch(rng):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (optional `reference` extra)")
    tf = torch.nn.functional

    def check(op, ref, shapes, **kwargs):
        arrays = [rng.standard_normal(s) for s in shapes]
        ours = [Tensor(a.copy(), requires_grad=True) for a in arrays]
        theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
        out, ref_out = op(*ours, **kwargs), ref(*theirs)
        g = rng.standard_normal(out.shape)
        out.backward(g)
        ref_out.backward(torch.tensor(g))
        np.testing.assert_allclose(out.data, ref_out.detach().numpy(), rtol=1e-10, atol=1e-12)
        for a, b in zip(ours, theirs):
            np.testing.assert_allclose(a.grad, b.grad.numpy(), rtol=1e-9, atol=1e-12)

    check(cpu(ops.matmul), torch.matmul, [(2, 3, 4), (2, 4, 5)])
    check(cpu(ops.linear), tf.linear, [(3, 4), (5, 4), (5,)])
    check(cpu(ops.softmax), lambda x: torch.softmax(x, -1), [(3, 6)])
    check(cpu(ops.layer_norm), lambda x, w, b: tf.layer_norm(x, (6,), w, b, 1e-5), [(3, 6), (6,), (6,)])
    check(cpu(ops.scaled_dot_product_attention),
          lambda q, k, v: tf.scaled_dot_product_attention(q, k, v, is_causal=True), [(2, 5, 4)] * 3)


def test_a_float64_model_under_cuda_kernels_says_once_that_it_runs_on_numpy(rng):
    x = Tensor(rng.standard_normal((2, 6)))
    w = Tensor(rng.standard_normal((3, 6)))
    K.reset_launches()
    with pytest.warns(ops.KernelFallbackWarning, match="float64 tensors run on the NumPy path") as said:
        with K.use_kernels("cuda"):
            F.softmax(F.linear(x, w))
            F.layer_norm(x, None, None)
    assert len([w_ for w_ in said if issubclass(w_.category, ops.KernelFallbackWarning)]) == 1
    assert K.launches() == {}
    with warnings.catch_warnings():
        warnings.simplefilter("error", ops.KernelFallbackWarning)
        with K.use_kernels("cuda"):
            F.softmax(Tensor(x.data.astype(np.float32)))  # float32: on the kernels, nothing to say
        with K.use_kernels("cpu"):
            F.softmax(x)  # the CPU kernels take float64
