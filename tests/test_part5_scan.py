"""The operations of part 5: the selective scan (three methods), RMSNorm and the causal convolution,
each against finite differences in float64, and the methods against each other."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from course.mamba import METHODS, causal_conv1d, combine, linear_recurrence, rms_norm, selective_scan
from course.tensor import Tensor, dispatch, gradcheck

pytestmark = pytest.mark.part5

NAMES = ("u", "delta", "A", "B", "C", "D")


def scan_inputs(rng, b=2, l=6, d=3, n=4, dtype=np.float64):
    """Inputs as the Mamba block makes them: delta > 0 (a softplus), A < 0 (minus an exp)."""
    arrays = [rng.normal(size=(b, l, d)), rng.uniform(0.05, 1.0, (b, l, d)), -rng.uniform(0.2, 2.0, (d, n)),
              rng.normal(size=(b, l, n)), rng.normal(size=(b, l, n)), rng.normal(size=d)]
    return [a.astype(dtype) for a in arrays]


def weighted(fn, weight):
    """fn's output times fixed random weights: gradcheck sums it, and each output then counts differently."""
    return lambda *ts: fn(*ts) * Tensor(weight)


# ----- the selective scan ----------------------------------------------------------------------------
@pytest.mark.parametrize("method", METHODS)
def test_scan_gradients_of_all_six_inputs_match_finite_differences(method):
    rng = np.random.default_rng(0)
    arrays = scan_inputs(rng)
    w = rng.normal(size=arrays[0].shape)
    assert gradcheck(weighted(lambda *t: selective_scan(*t, method=method), w), *arrays)
    # Without D (mamba-minimal allows D=None), and with one sequence of one step.
    assert gradcheck(weighted(lambda *t: selective_scan(*t, None, method=method), w), *arrays[:5])
    one = scan_inputs(rng, b=1, l=1, d=2, n=3)
    assert gradcheck(weighted(lambda *t: selective_scan(*t, method=method), rng.normal(size=(1, 1, 2))), *one)


@pytest.mark.parametrize("method", ["parallel", "fast"])
def test_every_method_equals_the_sequential_one_values_and_gradients(method):
    rng = np.random.default_rng(1)
    arrays = scan_inputs(rng, b=3, l=37, d=5, n=6)
    g = rng.normal(size=arrays[0].shape)
    results = {}
    for m in ("sequential", method):
        ts = [Tensor(a, requires_grad=True) for a in arrays]
        y = selective_scan(*ts, method=m)
        y.backward(g)
        results[m] = [y.data] + [t.grad for t in ts]
    for name, got, expected in zip(("y",) + NAMES, results[method], results["sequential"]):
        np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12, err_msg=name)


def test_methods_agree_at_length_1024_in_float32():
    """Over 1024 steps the products of decays underflow to 0: the parallel scan never divides by them."""
    rng = np.random.default_rng(2)
    arrays = scan_inputs(rng, b=2, l=1024, d=8, n=16, dtype=np.float32)
    arrays[1] = rng.uniform(0.001, 2.0, arrays[1].shape).astype(np.float32)  # from long memory to none
    g = rng.normal(size=arrays[0].shape).astype(np.float32)
    results = {}
    for m in METHODS:
        ts = [Tensor(a, requires_grad=True) for a in arrays]
        y = selective_scan(*ts, method=m)
        assert y.dtype == np.float32 and np.isfinite(y.data).all(), m
        y.backward(g)
        results[m] = [y.data] + [t.grad for t in ts]
        assert all(gr.dtype == np.float32 and np.isfinite(gr).all() for gr in results[m][1:]), m
    for m in ("parallel", "fast"):
        for name, got, expected in zip(("y",) + NAMES, results[m], results["sequential"]):
            scale = np.abs(expected).max()
            np.testing.assert_allclose(got, expected, rtol=2e-3, atol=2e-5 * scale, err_msg=f"{m}: {name}")


@settings(max_examples=8, deadline=None)
@given(b=st.integers(1, 3), l=st.integers(1, 40), d=st.integers(1, 5), n=st.integers(1, 5), seed=st.integers(0, 2**16))
def test_methods_agree_on_random_shapes(b, l, d, n, seed):
    arrays = scan_inputs(np.random.default_rng(seed), b, l, d, n)
    expected = selective_scan(*arrays, method="sequential")
    assert expected.shape == (b, l, d)
    for m in ("parallel", "fast"):
        np.testing.assert_allclose(selective_scan(*arrays, method=m), expected, rtol=1e-10, atol=1e-12, err_msg=m)


def test_scan_follows_the_recurrence_written_out():
    """y_t = <C_t, h_t> + D u_t with h_t = exp(delta_t A) h_{t-1} + delta_t B_t u_t, for one channel by hand."""
    rng = np.random.default_rng(3)
    u, delta, A, B, C, D = scan_inputs(rng, b=1, l=5, d=2, n=3)
    h = np.zeros(3)
    for t in range(5):
        h = np.exp(delta[0, t, 1] * A[1]) * h + delta[0, t, 1] * B[0, t] * u[0, t, 1]
        expected = C[0, t] @ h + D[1] * u[0, t, 1]
        for m in METHODS:
            assert selective_scan(u, delta, A, B, C, D, method=m)[0, t, 1] == pytest.approx(expected, rel=1e-12)


def test_arrays_in_array_out_tensors_in_tensor_out_dtype_kept():
    rng = np.random.default_rng(4)
    arrays = scan_inputs(rng, dtype=np.float32)
    y = selective_scan(*arrays, method="fast")
    assert isinstance(y, np.ndarray) and y.dtype == np.float32 and y.shape == (2, 6, 3)
    mixed = [Tensor(arrays[0], requires_grad=True)] + arrays[1:]
    out = selective_scan(*mixed, method="fast")
    assert isinstance(out, Tensor) and out.dtype == np.float32 and out.op == "selective_scan"
    out.sum().backward()
    assert mixed[0].grad.shape == arrays[0].shape and mixed[0].grad.dtype == np.float32
    np.testing.assert_allclose(out.data, y)


def test_scan_errors_name_the_problem():
    rng = np.random.default_rng(5)
    arrays = scan_inputs(rng)
    with pytest.raises(ValueError, match=r"unknown method 'blelloch'.*'sequential', 'parallel', 'fast'"):
        selective_scan(*arrays, method="blelloch")
    bad = list(arrays)
    bad[3] = rng.normal(size=(2, 6, 5))  # B with n = 5, A with n = 4
    with pytest.raises(ValueError, match=r"u \(2, 6, 3\), delta \(2, 6, 3\), A \(3, 4\), B \(2, 6, 5\), "
                                         r"C \(2, 6, 4\), D \(3,\)"):
        selective_scan(*bad)
    bad = list(arrays)
    bad[5] = np.ones(4)
    with pytest.raises(ValueError, match=r"D \(4,\)"):
        selective_scan(*bad, method="fast")
    bad = list(arrays)
    bad[0] = np.ones((2, 6, 3), dtype=np.int64)
    with pytest.raises(TypeError, match="u must hold floating-point"):
        selective_scan(*bad)


def test_scan_is_a_dispatch_point():
    assert "selective_scan" in dispatch.names()
    rng = np.random.default_rng(6)
    arrays = scan_inputs(rng)
    calls = []

    def replacement(u, delta, A, B, C, D=None, method="sequential"):
        calls.append(method)
        return selective_scan.default(u, delta, A, B, C, D, method="sequential")

    with dispatch.override({"selective_scan": replacement}):
        y = selective_scan(*arrays, method="fast")
    assert calls == ["fast"]
    np.testing.assert_allclose(y, selective_scan(*arrays))


def test_linear_recurrence_and_its_associative_combine():
    rng = np.random.default_rng(7)
    a, b = rng.uniform(0, 1, (2, 33, 3)), rng.normal(size=(2, 33, 3))
    np.testing.assert_allclose(linear_recurrence(a, b, "parallel"), linear_recurrence(a, b, "sequential"), rtol=1e-12)
    steps = [(rng.uniform(0, 1, 4), rng.normal(size=4)) for _ in range(3)]
    left = combine(combine(steps[0], steps[1]), steps[2])
    right = combine(steps[0], combine(steps[1], steps[2]))
    for x, y in zip(left, right):
        np.testing.assert_allclose(x, y, rtol=1e-12)
    h0 = rng.normal(size=4)  # applying the combined step equals applying the two steps one after the other
    ab = combine(steps[0], steps[1])
    np.testing.assert_allclose(ab[0] * h0 + ab[1], steps[1][0] * (steps[0][0] * h0 + steps[0][1]) + steps[1][1])
    with pytest.raises(ValueError, match="unknown method"):
        linear_recurrence(a, b, "fast")


# ----- RMSNorm and the causal convolution -------------------------------------------------------------
def test_rms_norm_gradients_and_values():
    rng = np.random.default_rng(8)
    x, w = rng.normal(size=(2, 3, 5)), rng.normal(size=5)
    assert gradcheck(weighted(rms_norm, rng.normal(size=x.shape)), x, w)
    y = rms_norm(Tensor(x), Tensor(w), eps=1e-5).data
    np.testing.assert_allclose(y, x / np.sqrt((x ** 2).mean(-1, keepdims=True) + 1e-5) * w, rtol=1e-12)
    with pytest.raises(ValueError, match=r"weight of shape \(4,\).*\(2, 3, 5\)"):
        rms_norm(Tensor(x), Tensor(np.ones(4)))


@pytest.mark.parametrize("k", [1, 2, 4])
def test_causal_conv1d_gradients_both_weight_layouts(k):
    rng = np.random.default_rng(9)
    x, w3, bias = rng.normal(size=(2, 6, 3)), rng.normal(size=(3, 1, k)), rng.normal(size=3)
    weight = rng.normal(size=x.shape)
    assert gradcheck(weighted(causal_conv1d, weight), x, w3, bias)
    assert gradcheck(weighted(lambda x, w: causal_conv1d(x, w), weight), x, w3[:, 0])


def test_causal_conv1d_never_sees_the_future():
    rng = np.random.default_rng(10)
    x, w, bias = rng.normal(size=(1, 8, 2)), rng.normal(size=(2, 1, 4)), rng.normal(size=2)
    y = causal_conv1d(Tensor(x), Tensor(w), Tensor(bias)).data
    x2 = x.copy()
    x2[:, 5:] = 100.0  # changing positions 5.. changes nothing before 5
    y2 = causal_conv1d(Tensor(x2), Tensor(w), Tensor(bias)).data
    np.testing.assert_array_equal(y[:, :5], y2[:, :5])
    assert not np.allclose(y[:, 5:], y2[:, 5:])
    # position t is bias + the taps over x[t-3..t], zeros before the start
    t, c = 2, 1
    window = np.concatenate([np.zeros(1), x[0, :3, c]])
    assert y[0, t, c] == pytest.approx(bias[c] + window @ w[c, 0], rel=1e-12)


def test_causal_conv1d_shape_errors():
    x = Tensor(np.ones((2, 5, 3)))
    with pytest.raises(ValueError, match=r"x \(2, 5, 3\), weight \(4, 1, 2\) and bias None"):
        causal_conv1d(x, Tensor(np.ones((4, 1, 2))))
    with pytest.raises(ValueError, match=r"bias \(2,\)"):
        causal_conv1d(x, Tensor(np.ones((3, 2))), Tensor(np.ones(2)))


def test_arrays_where_tensors_belong_and_mismatched_recurrences_are_named():
    with pytest.raises(TypeError, match="rms_norm: `x` must be a Tensor, got ndarray: wrap it first"):
        rms_norm(np.ones((2, 4)), Tensor(np.ones(4)))
    with pytest.raises(TypeError, match="causal_conv1d: `weight` must be a Tensor, got ndarray"):
        causal_conv1d(Tensor(np.ones((1, 5, 3))), np.ones((3, 4)))
    with pytest.raises(ValueError, match=r"linear_recurrence: a \(1, 3\) and b \(1, 4\) must have the same shape"):
        linear_recurrence(np.ones((1, 3)), np.ones((1, 4)))


def test_the_fast_scan_warns_on_overflow_as_the_numpy_methods_do():
    # A > 0: exp(delta A) > 1 and the state grows until it overflows; NumPy warns for the other methods
    rng = np.random.default_rng(0)
    u, delta, _, B, C, D = scan_inputs(rng, b=1, l=400, d=2, n=3)
    A = np.full((2, 3), 2.0)
    delta = np.ones_like(delta)
    for method in METHODS:
        with pytest.warns(RuntimeWarning, match="overflow"):
            y = selective_scan(u, delta, A, B, C, D, method=method)
        assert not np.isfinite(y).all()
    with pytest.warns(RuntimeWarning, match="A has positive entries"):
        selective_scan(u, delta, A, B, C, D, method="fast")
