"""The tensor engine (course.tensor): every operation's value and gradient, checked against NumPy
and against central finite differences in float64, on random shapes with broadcasting."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import course.tensor.functional as F
from course.tensor import Tensor, gradcheck, no_grad, numerical_gradient, operation, unbroadcast

pytestmark = pytest.mark.part2

FAST = settings(max_examples=15)

# ----- strategies ------------------------------------------------------------------------------


def floats(lo=-2.0, hi=2.0):
    return st.floats(lo, hi, allow_nan=False, allow_infinity=False, width=64)


def away_from_zero(lo=0.1, hi=2.0):
    """Values with |x| in [lo, hi]: where a kink (relu) or a pole (1/x) cannot be crossed by eps."""
    return floats(lo, hi) | floats(-hi, -lo)


small_shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=4)


@st.composite
def broadcast_pair(draw, elements_a=None, elements_b=None):
    """Two float64 arrays whose shapes broadcast together (one may have fewer or size-1 axes)."""
    shapes = draw(hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3, max_side=3))
    a_shape, b_shape = shapes.input_shapes
    a = draw(hnp.arrays(np.float64, a_shape, elements=floats() if elements_a is None else elements_a))
    b = draw(hnp.arrays(np.float64, b_shape, elements=floats() if elements_b is None else elements_b))
    return a, b


@st.composite
def one_array(draw, elements=None, shapes=small_shapes):
    return draw(hnp.arrays(np.float64, draw(shapes), elements=floats() if elements is None else elements))


def grads(fn, *arrays):
    """The engine's gradients of fn(*tensors).sum() (float64 leaves)."""
    ts = [Tensor(np.array(a, dtype=np.float64), requires_grad=True) for a in arrays]
    out = fn(*ts)
    out.sum().backward()
    return out, [t.grad for t in ts]


# ----- elementwise binary operations with broadcasting -----------------------------------------

BINARY = {
    "+": (lambda a, b: a + b, None),
    "-": (lambda a, b: a - b, None),
    "*": (lambda a, b: a * b, None),
    "/": (lambda a, b: a / b, away_from_zero(0.5, 2.0)),
    "**": (lambda a, b: a ** b, floats(0.2, 1.5)),  # the base is the first argument: positive
}


@pytest.mark.parametrize("op", sorted(BINARY))
@FAST
@given(data=st.data())
def test_binary_forward_and_backward_with_broadcasting(op, data):
    fn, special = BINARY[op]
    if op == "**":
        a, b = data.draw(broadcast_pair(elements_a=special, elements_b=floats(-1.5, 1.5)))
    else:
        a, b = data.draw(broadcast_pair(elements_b=special))
    out, (ga, gb) = grads(fn, a, b)
    np.testing.assert_allclose(out.data, fn(a, b), rtol=1e-12)
    assert ga.shape == a.shape and gb.shape == b.shape
    assert gradcheck(fn, a, b)


@pytest.mark.parametrize("op", ["+", "-", "*", "/", "**"])
def test_binary_with_a_python_number_on_either_side(op):
    x = np.array([0.5, 1.0, 2.0])
    left = {"+": lambda t: t + 3, "-": lambda t: t - 3, "*": lambda t: t * 3,
            "/": lambda t: t / 3, "**": lambda t: t ** 3}[op]
    right = {"+": lambda t: 3 + t, "-": lambda t: 3 - t, "*": lambda t: 3 * t,
             "/": lambda t: 3 / t, "**": lambda t: 3 ** t}[op]
    for fn in (left, right):
        out = fn(Tensor(x))
        np.testing.assert_allclose(out.data, fn(x))
        assert gradcheck(fn, x)


def test_ndarray_on_the_left_gives_a_tensor():
    x = Tensor(np.ones(3), requires_grad=True)
    y = np.arange(3.0) * x
    assert isinstance(y, Tensor)
    y.sum().backward()
    np.testing.assert_allclose(x.grad, [0, 1, 2])


# ----- unary operations ------------------------------------------------------------------------

UNARY = {
    "neg": (lambda t: -t, lambda x: -x, floats()),
    "exp": (lambda t: t.exp(), np.exp, floats()),
    "log": (lambda t: t.log(), np.log, floats(0.2, 3.0)),
    "sqrt": (lambda t: t.sqrt(), np.sqrt, floats(0.2, 3.0)),
    "tanh": (lambda t: t.tanh(), np.tanh, floats()),
    "relu": (lambda t: t.relu(), lambda x: np.maximum(x, 0), away_from_zero()),
    "sigmoid": (lambda t: t.sigmoid(), lambda x: 1 / (1 + np.exp(-x)), floats(-5, 5)),
    "pow2": (lambda t: t ** 2, lambda x: x ** 2, floats()),
    "pow-1.5": (lambda t: t ** -1.5, lambda x: x ** -1.5, floats(0.3, 2.0)),
    "gelu": (F.gelu, lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3))), floats(-3, 3)),
    "silu": (F.silu, lambda x: x / (1 + np.exp(-x)), floats(-4, 4)),
    "softplus": (F.softplus, lambda x: np.log1p(np.exp(x)), floats(-4, 4)),
}


@pytest.mark.parametrize("name", sorted(UNARY))
@FAST
@given(data=st.data())
def test_unary_forward_and_backward(name, data):
    fn, reference, elements = UNARY[name]
    x = data.draw(one_array(elements))
    out, _ = grads(fn, x)
    np.testing.assert_allclose(out.data, reference(x), rtol=1e-10, atol=1e-12)
    assert gradcheck(fn, x)


def test_sigmoid_and_softplus_do_not_overflow():
    x = np.array([-1e4, -50.0, 0.0, 50.0, 1e4], dtype=np.float32)
    for fn in (lambda t: t.sigmoid(), F.silu, F.softplus):
        t = Tensor(x, requires_grad=True)
        y = fn(t)
        y.sum().backward()
        assert np.all(np.isfinite(y.data)) and np.all(np.isfinite(t.grad))
    np.testing.assert_allclose(Tensor(x).sigmoid().data, [0, 0, 0.5, 1, 1], atol=1e-6)


# ----- reductions -------------------------------------------------------------------------------


@st.composite
def array_and_axis(draw, unique=False):
    x = draw(one_array(shapes=hnp.array_shapes(min_dims=1, max_dims=3, max_side=4)))
    if unique:  # values far apart (more than the finite-difference step), in a drawn order
        order = draw(st.permutations(range(x.size)))
        x = (np.array(order, dtype=np.float64) * 0.25 - 1).reshape(x.shape)
    axis = draw(st.none() | st.integers(-x.ndim, x.ndim - 1))
    keepdims = draw(st.booleans())
    return x, axis, keepdims


@pytest.mark.parametrize("name", ["sum", "mean", "max"])
@FAST
@given(case=st.data())
def test_reductions(name, case):
    x, axis, keepdims = case.draw(array_and_axis(unique=name == "max"))  # no ties for max

    def fn(t):
        return getattr(t, name)(axis=axis, keepdims=keepdims)

    out, _ = grads(fn, x)
    expected = getattr(np, name)(x, axis=axis, keepdims=keepdims)
    assert out.shape == expected.shape
    np.testing.assert_allclose(out.data, expected, rtol=1e-12)
    assert gradcheck(fn, x)


def test_max_splits_the_gradient_between_ties():
    x = Tensor(np.array([[1.0, 3.0, 3.0], [2.0, 0.0, -1.0]]), requires_grad=True)
    x.max(axis=1).sum().backward()
    np.testing.assert_allclose(x.grad, [[0, 0.5, 0.5], [1, 0, 0]])


# ----- matrix multiplication -------------------------------------------------------------------


@st.composite
def matmul_pair(draw):
    n, k, m = (draw(st.integers(1, 4)) for _ in range(3))
    batch = draw(hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=2, max_side=3))
    a_batch, b_batch = batch.input_shapes
    a_vec, b_vec = draw(st.booleans()), draw(st.booleans())
    a_shape = (k,) if a_vec else a_batch + (n, k)
    b_shape = (k,) if b_vec else b_batch + (k, m)
    a = draw(hnp.arrays(np.float64, a_shape, elements=floats()))
    b = draw(hnp.arrays(np.float64, b_shape, elements=floats()))
    return a, b


@settings(max_examples=40)
@given(pair=matmul_pair())
def test_matmul_batched_broadcast_and_vectors(pair):
    a, b = pair
    out, (ga, gb) = grads(lambda x, y: x @ y, a, b)
    np.testing.assert_allclose(out.data, a @ b, rtol=1e-12)
    assert ga.shape == a.shape and gb.shape == b.shape
    assert gradcheck(lambda x, y: x @ y, a, b)


@pytest.mark.parametrize("a_shape,b_shape", [((3,), (3,)), ((3,), (3, 2)), ((2, 3), (3,)),
                                             ((4, 2, 3), (3,)), ((3,), (4, 3, 2)), ((4, 1, 2, 3), (5, 3, 2))])
def test_matmul_fixed_vector_and_batch_cases(a_shape, b_shape):
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=a_shape), rng.normal(size=b_shape)
    out, _ = grads(lambda x, y: x @ y, a, b)
    np.testing.assert_allclose(out.data, a @ b, rtol=1e-12)
    assert gradcheck(lambda x, y: x @ y, a, b)


def test_matmul_with_an_array_on_the_left():
    w = Tensor(np.eye(2), requires_grad=True)
    y = np.ones((3, 2)) @ w
    assert isinstance(y, Tensor) and y.shape == (3, 2)
    y.sum().backward()
    np.testing.assert_allclose(w.grad, [[3, 3], [3, 3]])


# ----- shapes and indexing ---------------------------------------------------------------------


@FAST
@given(x=one_array(shapes=hnp.array_shapes(min_dims=1, max_dims=3, max_side=4)), data=st.data())
def test_reshape_and_transpose(x, data):
    perm = tuple(data.draw(st.permutations(range(x.ndim))))
    out, _ = grads(lambda t: t.transpose(*perm), x)
    np.testing.assert_array_equal(out.data, x.transpose(perm))
    assert gradcheck(lambda t: t.transpose(*perm) * np.arange(x.size).reshape(x.transpose(perm).shape), x)
    assert gradcheck(lambda t: t.T * np.arange(x.size).reshape(x.T.shape), x)
    new_shape = (-1,) if x.ndim > 1 else (1, x.size)
    out, _ = grads(lambda t: t.reshape(new_shape), x)
    np.testing.assert_array_equal(out.data, x.reshape(new_shape))
    assert gradcheck(lambda t: t.reshape(*new_shape) * np.arange(x.size).reshape(x.reshape(new_shape).shape), x)


@pytest.mark.parametrize("index", [
    1, -1, slice(1, 3), (slice(None), 0), (Ellipsis, 1), (None, 0), (slice(None, None, -1), slice(1, None)),
    np.array([0, 2, 2, 0, 0]), (np.array([0, 1, 1]), np.array([2, 2, 2])), np.array([[1, 1], [3, 0]]),
    np.array([True, False, True, True]), (slice(None), np.array([0, 0, 2])),
])
def test_getitem(index):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(4, 3))
    weights = rng.normal(size=x[index].shape)  # a non-uniform gradient into the picked elements
    out, _ = grads(lambda t: t[index], x)
    np.testing.assert_array_equal(out.data, x[index])
    assert gradcheck(lambda t: t[index] * weights, x)


def test_integer_indexing_with_repeats_accumulates():
    x = Tensor(np.zeros(4), requires_grad=True)
    x[np.array([0, 0, 0, 3])].sum().backward()
    np.testing.assert_array_equal(x.grad, [3, 0, 0, 1])
    x = Tensor(np.zeros((2, 3)), requires_grad=True)
    x[Tensor(np.array([1, 1]))].sum().backward()  # an index given as a Tensor
    np.testing.assert_array_equal(x.grad, [[0, 0, 0], [2, 2, 2]])


def test_unbroadcast():
    g = np.ones((2, 3, 4))
    assert unbroadcast(g, (3, 4)).shape == (3, 4)
    np.testing.assert_array_equal(unbroadcast(g, (1, 4)), np.full((1, 4), 6.0))
    np.testing.assert_array_equal(unbroadcast(g, (3, 1)), np.full((3, 1), 8.0))
    assert unbroadcast(g, ()).shape == () and unbroadcast(g, ()) == 24
    assert unbroadcast(g, (2, 3, 4)) is g


# ----- functional: softmax, losses, normalisation, lookup, joining -----------------------------


def _softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@FAST
@given(case=array_and_axis())
def test_softmax_and_log_softmax(case):
    x, axis, _ = case
    axis = -1 if axis is None else axis
    weights = np.random.default_rng(0).normal(size=x.shape)  # sum() of a softmax has no gradient
    out, _ = grads(lambda t: F.softmax(t, axis=axis), x)
    np.testing.assert_allclose(out.data, _softmax(x, axis), rtol=1e-12)
    assert gradcheck(lambda t: F.softmax(t, axis=axis) * weights, x)
    out, _ = grads(lambda t: F.log_softmax(t, axis=axis), x)
    np.testing.assert_allclose(out.data, np.log(_softmax(x, axis)), rtol=1e-10, atol=1e-12)
    assert gradcheck(lambda t: F.log_softmax(t, axis=axis) * weights, x)


def _cross_entropy(x, t, ignore_index=None):
    logp = np.log(_softmax(x))
    keep = np.ones(t.shape, bool) if ignore_index is None else t != ignore_index
    picked = np.take_along_axis(logp, np.where(keep, t, 0)[..., None], axis=-1)[..., 0]
    return -(picked * keep).sum() / keep.sum()


@FAST
@given(data=st.data())
def test_cross_entropy(data):
    lead = data.draw(hnp.array_shapes(min_dims=1, max_dims=2, max_side=4))
    classes = data.draw(st.integers(2, 5))
    x = data.draw(hnp.arrays(np.float64, lead + (classes,), elements=floats(-3, 3)))
    t = data.draw(hnp.arrays(np.int64, lead, elements=st.integers(0, classes - 1)))
    ignore = data.draw(st.none() | st.just(0))
    if ignore is not None and (t != ignore).sum() == 0:
        t.flat[0] = 1
    fn = lambda z: F.cross_entropy(z, t, ignore_index=ignore)  # noqa: E731
    out, _ = grads(fn, x)
    assert out.shape == ()
    np.testing.assert_allclose(out.data, _cross_entropy(x, t, ignore), rtol=1e-10)
    assert gradcheck(fn, x)


def test_cross_entropy_ignore_index_and_tensor_targets():
    x = np.array([[2.0, 0.0, -1.0], [0.5, 0.5, 3.0], [1.0, 2.0, 3.0]])
    t = np.array([0, -100, 2])
    loss = F.cross_entropy(Tensor(x), Tensor(t), ignore_index=-100)
    np.testing.assert_allclose(loss.item(), _cross_entropy(x[[0, 2]], t[[0, 2]]))
    xt = Tensor(x, requires_grad=True)
    F.cross_entropy(xt, t, ignore_index=-100).backward()
    np.testing.assert_array_equal(xt.grad[1], 0)  # an ignored row gets no gradient


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softmax_family_is_stable_on_huge_logits(dtype):
    x = np.array([[1e4, -1e4, 0.0], [-1e4, -1e4, -1e4], [1e4, 1e4, -1e4]], dtype=dtype)
    for fn in (F.softmax, F.log_softmax, lambda t: F.cross_entropy(t, np.array([1, 0, 2]))):
        t = Tensor(x, requires_grad=True)
        y = fn(t)
        (y * Tensor(np.ones(y.shape, dtype))).sum().backward()
        assert np.all(np.isfinite(y.data)), fn
        assert np.all(np.isfinite(t.grad)), fn
        assert y.dtype == dtype
    np.testing.assert_allclose(F.softmax(Tensor(x)).data[0], [1, 0, 0])
    np.testing.assert_allclose(F.log_softmax(Tensor(x)).data[0], [0, -2e4, -1e4], rtol=1e-6)
    np.testing.assert_allclose(F.cross_entropy(Tensor(x), np.array([1, 0, 2])).item(), (2e4 + np.log(3) + 2e4 + np.log(2)) / 3,
                               rtol=1e-5)


@FAST
@given(data=st.data())
def test_layer_norm(data):
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=2, max_side=4))
    x = data.draw(hnp.arrays(np.float64, shape, elements=floats(-3, 3)))
    x = x + np.linspace(0, 1, shape[-1])  # never a constant row: its variance would be 0
    rng = np.random.default_rng(0)
    w, b = rng.normal(size=shape[-1]), rng.normal(size=shape[-1])
    weights = rng.normal(size=shape)

    def fn(t, wt, bt):
        return F.layer_norm(t, wt, bt) * weights

    out, _ = grads(lambda t, wt, bt: F.layer_norm(t, wt, bt), x, w, b)
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    np.testing.assert_allclose(out.data, (x - mu) / np.sqrt(var + 1e-5) * w + b, rtol=1e-10, atol=1e-12)
    assert gradcheck(fn, x, w, b, rtol=1e-4, atol=1e-6)
    assert gradcheck(lambda t: F.layer_norm(t, None, None) * weights, x, rtol=1e-4, atol=1e-6)


def test_embedding_accumulates_repeated_rows():
    rng = np.random.default_rng(0)
    table = rng.normal(size=(5, 3))
    idx = np.array([[0, 4, 0], [2, 0, 4]])
    out, (g,) = grads(lambda w: F.embedding(idx, w), table)
    np.testing.assert_array_equal(out.data, table[idx])
    np.testing.assert_array_equal(g[:, 0], [3, 0, 1, 0, 2])
    weights = rng.normal(size=(2, 3, 3))
    assert gradcheck(lambda w: F.embedding(Tensor(idx), w) * weights, table)


@FAST
@given(pair=broadcast_pair(), data=st.data())
def test_where_and_masked_fill(pair, data):
    a, b = pair
    shape = np.broadcast_shapes(a.shape, b.shape)
    cond = data.draw(hnp.arrays(bool, shape))
    out, _ = grads(lambda x, y: F.where(cond, x, y), a, b)
    np.testing.assert_array_equal(out.data, np.where(cond, a, b))
    assert gradcheck(lambda x, y: F.where(cond, x, y), a, b)
    drop = data.draw(st.integers(0, a.ndim))  # a mask that broadcasts to a's shape: fewer or size-1 axes
    mask_shape = tuple(n if data.draw(st.booleans()) else 1 for n in a.shape[drop:])
    mask = data.draw(hnp.arrays(bool, mask_shape))
    out, _ = grads(lambda x: F.masked_fill(x, mask, -5.0), a)
    np.testing.assert_array_equal(out.data, np.where(mask, -5.0, a))
    assert gradcheck(lambda x: F.masked_fill(x, mask, -5.0), a)


def test_where_with_numbers():
    x = Tensor(np.array([-1.0, 2.0]), requires_grad=True)
    y = F.where(x.data > 0, x, 0.0)
    y.sum().backward()
    np.testing.assert_array_equal(y.data, [0, 2])
    np.testing.assert_array_equal(x.grad, [0, 1])


@FAST
@given(data=st.data())
def test_concatenate_and_stack(data):
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=3, max_side=3))
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    sizes = data.draw(st.lists(st.integers(1, 3), min_size=1, max_size=3))
    parts = []
    for n in sizes:
        s = list(shape)
        s[axis] = n
        parts.append(data.draw(hnp.arrays(np.float64, tuple(s), elements=floats())))
    weights = np.random.default_rng(0).normal(size=np.concatenate(parts, axis=axis).shape)
    out, _ = grads(lambda *ts: F.concatenate(ts, axis=axis), *parts)
    np.testing.assert_array_equal(out.data, np.concatenate(parts, axis=axis))
    assert gradcheck(lambda *ts: F.concatenate(ts, axis=axis) * weights, *parts)
    same = [data.draw(hnp.arrays(np.float64, shape, elements=floats())) for _ in sizes]
    new_axis = data.draw(st.integers(-len(shape) - 1, len(shape)))
    weights = np.random.default_rng(1).normal(size=np.stack(same, axis=new_axis).shape)
    out, _ = grads(lambda *ts: F.stack(ts, axis=new_axis), *same)
    np.testing.assert_array_equal(out.data, np.stack(same, axis=new_axis))
    assert gradcheck(lambda *ts: F.stack(ts, axis=new_axis) * weights, *same)


def test_dropout_scales_and_keeps_the_mask_for_backward():
    F.manual_seed(0)
    x = Tensor(np.ones((200, 50)), requires_grad=True)
    y = F.dropout(x, 0.25)
    kept = y.data != 0
    assert 0.70 < kept.mean() < 0.80
    np.testing.assert_allclose(y.data[kept], 1 / 0.75)
    y.sum().backward()
    np.testing.assert_allclose(x.grad, np.where(kept, 1 / 0.75, 0))
    assert F.dropout(x, 0.25, training=False) is x and F.dropout(x, 0.0) is x
    F.manual_seed(3)
    a = F.dropout(Tensor(np.ones(20)), 0.5).data
    F.manual_seed(3)
    np.testing.assert_array_equal(a, F.dropout(Tensor(np.ones(20)), 0.5).data)
    with pytest.raises(ValueError, match="p must be in"):
        F.dropout(x, 1.0)


def test_astype_passes_the_gradient_back_in_the_input_dtype():
    x = Tensor(np.array([1.0, 2.0], dtype=np.float32), requires_grad=True)
    y = x.astype(np.float64) * 3
    assert y.dtype == np.float64
    y.sum().backward()
    assert x.grad.dtype == np.float32
    np.testing.assert_array_equal(x.grad, [3, 3])


def test_gradcheck_catches_a_wrong_gradient():
    def bad(t):  # the wrong derivative on purpose
        return operation("double", t.data * 2.0, (t,), lambda g: g * 3.0)

    with pytest.raises(AssertionError, match="gradient of input 0"):
        gradcheck(bad, np.ones(3))
    np.testing.assert_allclose(numerical_gradient(lambda a: (a ** 2).sum(), [np.array([1.0, -2.0])], 0),
                               [2, -4], rtol=1e-6)


# ----- dtypes -----------------------------------------------------------------------------------


def test_construction_dtypes():
    assert Tensor(3).dtype == np.float32
    assert Tensor(2.5).dtype == np.float32
    assert Tensor([1, 2, 3]).dtype == np.float32
    assert Tensor([[1.0, 2.0]]).dtype == np.float32
    assert Tensor(np.zeros(2, np.float64)).dtype == np.float64
    assert Tensor(np.zeros(2, np.float16)).dtype == np.float16
    assert Tensor(np.arange(3)).dtype == np.arange(3).dtype  # an integer array stays integer
    assert Tensor(np.float64(1.0)).dtype == np.float64
    with pytest.raises(TypeError, match="floating-point"):
        Tensor(np.arange(3), requires_grad=True)


FLOAT32_OPS = {
    "+": lambda x, w: x + w, "-": lambda x, w: x - 1.5, "*": lambda x, w: 2.0 * x * w,
    "/": lambda x, w: x / (w * w + 1), "**": lambda x, w: (x * x + 1) ** 1.5, "**t": lambda x, w: (x * x + 1) ** w,
    "neg": lambda x, w: -x, "@": lambda x, w: x @ w.reshape(4, 1), "exp": lambda x, w: x.exp(),
    "log": lambda x, w: (x * x + 1).log(), "sqrt": lambda x, w: (x * x + 1).sqrt(), "tanh": lambda x, w: x.tanh(),
    "relu": lambda x, w: x.relu(), "sigmoid": lambda x, w: x.sigmoid(), "sum": lambda x, w: x.sum(0),
    "mean": lambda x, w: x.mean(1, keepdims=True), "max": lambda x, w: x.max(), "reshape": lambda x, w: x.reshape(-1),
    "T": lambda x, w: x.T, "getitem": lambda x, w: x[np.array([0, 0, 2])], "gelu": lambda x, w: F.gelu(x),
    "silu": lambda x, w: F.silu(x), "softplus": lambda x, w: F.softplus(x), "softmax": lambda x, w: F.softmax(x),
    "log_softmax": lambda x, w: F.log_softmax(x, axis=0), "cross_entropy": lambda x, w: F.cross_entropy(x, np.array([0, 1, 3])),
    "layer_norm": lambda x, w: F.layer_norm(x, w, w), "embedding": lambda x, w: F.embedding(np.array([2, 0]), x),
    "masked_fill": lambda x, w: F.masked_fill(x, x.data > 0, 0.0), "where": lambda x, w: F.where(x.data > 0, x, 0.5),
    "concatenate": lambda x, w: F.concatenate([x, x], axis=1), "stack": lambda x, w: F.stack([x, x]),
    "dropout": lambda x, w: F.dropout(x, 0.5), "linear": lambda x, w: F.linear(x, x, w[:3]),
}


@pytest.mark.parametrize("name", sorted(FLOAT32_OPS))
def test_float32_stays_float32(name):
    rng = np.random.default_rng(0)
    x = Tensor(rng.normal(size=(3, 4)).astype(np.float32), requires_grad=True)
    w = Tensor(rng.normal(size=4).astype(np.float32), requires_grad=True)
    y = FLOAT32_OPS[name](x, w)
    assert y.dtype == np.float32, f"{name} gave {y.dtype}"
    y.sum().backward()
    for t in (x, w):
        assert t.grad is None or t.grad.dtype == np.float32


# ----- the graph: accumulation, deep chains, backward twice, no_grad ---------------------------


def test_a_tensor_used_twice_gets_both_gradients():
    a = Tensor(np.array([1.0, -2.0]), requires_grad=True)
    b = a + a
    c = b + b
    c.sum().backward()
    np.testing.assert_array_equal(a.grad, [4, 4])
    np.testing.assert_array_equal(b.grad, [2, 2])

    x = Tensor(np.array([3.0, -1.0]), requires_grad=True)
    (x * x).sum().backward()
    np.testing.assert_array_equal(x.grad, [6, -2])


def test_skip_connection_and_a_branch_not_leading_to_the_loss():
    x = Tensor(np.array([0.5, -1.5]), requires_grad=True)
    h = x.tanh()
    y = h * 2 + x  # skip connection: x reaches y directly and through h
    unused = x.exp()  # made from x but not used by the loss
    y.sum().backward()
    np.testing.assert_allclose(x.grad, 2 * (1 - np.tanh(x.data) ** 2) + 1)
    assert unused.grad is None
    z = Tensor(np.ones(2), requires_grad=True)  # a leaf not in the graph at all
    assert z.grad is None


def test_a_chain_of_100000_operations():
    x = Tensor(np.array(1.0), requires_grad=True)
    y = x
    for _ in range(100_000):
        y = y * 1.0 + 0.0
    y.backward()
    assert x.grad == 1.0


def test_backward_twice_accumulates_leaf_gradients():
    x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    h = x * 3
    loss = (h * x).sum()  # 3 x^2
    loss.backward()
    np.testing.assert_array_equal(x.grad, [6, 12])
    loss.backward()
    np.testing.assert_array_equal(x.grad, [12, 24])  # leaves add up across calls
    np.testing.assert_array_equal(h.grad, [1, 2])  # intermediate grads are recomputed, not added


def test_backward_with_an_explicit_gradient():
    x = Tensor(np.array([1.0, 2.0, 3.0]), requires_grad=True)
    (x * 2).backward(np.array([1.0, 0.0, -1.0]))
    np.testing.assert_array_equal(x.grad, [2, 0, -2])


def test_no_grad_records_nothing():
    x = Tensor(np.ones(3), requires_grad=True)
    with no_grad():
        y = (x * 2).exp().sum()
        z = F.softmax(x)
    assert not y.requires_grad and y.inputs == () and y._backward is None
    assert not z.requires_grad and z.inputs == ()
    y2 = (x * 2).sum()  # recording is back on after the block
    assert y2.requires_grad
    with pytest.raises(RuntimeError, match="does not depend"):
        y.backward()


def test_constants_get_no_gradient():
    x = Tensor(np.ones(3), requires_grad=True)
    c = Tensor(np.arange(3.0))
    (x * c).sum().backward()
    assert c.grad is None
    np.testing.assert_array_equal(x.grad, [0, 1, 2])


# ----- errors name the problem ------------------------------------------------------------------


def test_backward_on_a_non_scalar_needs_a_gradient():
    y = Tensor(np.ones((2, 3)), requires_grad=True) * 2
    with pytest.raises(RuntimeError, match=r"shape \(2, 3\).*needs a gradient"):
        y.backward()
    with pytest.raises(ValueError, match=r"gradient has shape \(3,\).*shape \(2, 3\)"):
        y.backward(np.ones(3))


@pytest.mark.parametrize("op,fn", [
    ("+", lambda a, b: a + b), ("-", lambda a, b: a - b), ("*", lambda a, b: a * b),
    ("/", lambda a, b: a / b), ("**", lambda a, b: a ** b),
])
def test_broadcast_errors_name_both_shapes_and_the_operation(op, fn):
    a, b = Tensor(np.ones((2, 3))), Tensor(np.ones((4,)))
    with pytest.raises(ValueError) as err:
        fn(a, b)
    message = str(err.value)
    assert op in message and "(2, 3)" in message and "(4,)" in message


@pytest.mark.parametrize("a_shape,b_shape", [((2, 3), (4, 5)), ((3,), (4,)), ((2, 2, 3), (3, 3, 1)), ((), (3,))])
def test_matmul_errors_name_both_shapes(a_shape, b_shape):
    with pytest.raises(ValueError) as err:
        Tensor(np.ones(a_shape)) @ Tensor(np.ones(b_shape))
    message = str(err.value)
    assert "@" in message and str(a_shape) in message and str(b_shape) in message


def test_other_errors_are_clear():
    x = Tensor(np.ones((2, 3)))
    with pytest.raises(ValueError, match=r"reshape.*\(2, 3\).*\(4,\)"):
        x.reshape(4)
    with pytest.raises(ValueError, match=r"transpose.*\(2, 3\)"):
        x.transpose(0, 0)
    with pytest.raises(IndexError, match=r"shape \(2, 3\)"):
        x[5]
    with pytest.raises(ValueError, match=r"cross_entropy.*\(2, 3\).*\(3,\)"):
        F.cross_entropy(x, np.array([0, 1, 2]))
    with pytest.raises(TypeError, match="integers"):
        F.cross_entropy(x, np.array([0.0, 1.0]))
    with pytest.raises(ValueError, match="out of range"):
        F.cross_entropy(x, np.array([0, 3]))
    with pytest.raises(ValueError, match="ignore_index"):
        F.cross_entropy(x, np.array([-1, -1]), ignore_index=-1)
    with pytest.raises(IndexError, match="out of range"):
        F.embedding(np.array([0, 7]), x)
    with pytest.raises(ValueError, match=r"concatenate.*\(2, 3\).*\(2, 4\)"):
        F.concatenate([x, Tensor(np.ones((2, 4)))], axis=0)
    with pytest.raises(ValueError, match=r"stack.*\(2, 3\)"):
        F.stack([x, Tensor(np.ones((3, 2)))])
    with pytest.raises(ValueError, match=r"masked_fill.*\(2, 3\)"):
        F.masked_fill(x, np.ones(4, bool), 0.0)
    with pytest.raises(ValueError, match=r"where"):
        F.where(np.ones(4, bool), x, 0.0)


@FAST
@given(data=st.data())
def test_linear(data):
    lead = data.draw(hnp.array_shapes(min_dims=0, max_dims=2, max_side=3))
    n_in, n_out = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 4))
    x = data.draw(hnp.arrays(np.float64, lead + (n_in,), elements=floats()))
    w = data.draw(hnp.arrays(np.float64, (n_out, n_in), elements=floats()))
    b = data.draw(hnp.arrays(np.float64, (n_out,), elements=floats()))
    out, _ = grads(lambda *ts: F.linear(*ts), x, w, b)
    np.testing.assert_allclose(out.data, x @ w.T + b, rtol=1e-12, atol=1e-12)
    assert gradcheck(lambda *ts: F.linear(*ts), x, w, b)
    assert gradcheck(lambda xt, wt: F.linear(xt, wt), x, w)


def test_linear_error_names_both_shapes():
    with pytest.raises(ValueError, match=r"linear.*\(2, 3\).*\(4, 5\)"):
        F.linear(Tensor(np.ones((2, 3))), Tensor(np.ones((4, 5))))


# ----- drawing the graph -------------------------------------------------------------------------


def _graph_source():
    x = Tensor(np.array([1.0, -2.0]), requires_grad=True, label="x")
    w = Tensor(np.ones((2, 3)), requires_grad=True, label="w")
    y = ((x @ w).relu() + x.sum()).mean()
    y.backward()
    from course.viz import draw_graph

    return draw_graph(y)


def test_draw_graph_of_a_tensor_is_deterministic():
    first, second = _graph_source(), _graph_source()
    assert first.source == second.source
    assert first.n_nodes == 7  # tensors: x, w, x @ w, relu, x.sum(), +, mean
    src = first.source
    assert "0x" not in src  # no addresses
    assert 't0 [label="x\\n(2,) float64\\ndata [1, -2]' in src  # small tensors show data and grad
    assert "(2, 3) float64" in src and "data [1, 1" not in src  # a 6-element tensor shows no values
    for op in ("@", "relu", "sum", "mean"):
        assert op in src


def test_draw_graph_refuses_huge_graphs_clearly():
    from course.viz import tensor_graph
    from course.viz.graphs import new_digraph

    y = Tensor(np.ones(1), requires_grad=True)
    for _ in range(20):
        y = y * 2.0
    with pytest.raises(ValueError, match="max_nodes"):
        tensor_graph.build(y, new_digraph(), max_nodes=10)
    _, n = tensor_graph.build(y, new_digraph())
    assert n == 41  # the leaf, 20 constants 2.0 and 20 products


# ----- misuse gets a clear error ----------------------------------------------------------------
def test_tensor_of_none_is_refused_not_nan():
    with pytest.raises(TypeError, match=r"Tensor\(None\): a Tensor needs numbers"):
        Tensor(None)


def test_tensors_of_objects_or_ragged_lists_are_refused():
    with pytest.raises(TypeError, match="dtype object"):
        Tensor(np.array([None, 1.0], dtype=object))
    with pytest.raises(TypeError, match="a Tensor needs numbers.*inhomogeneous"):
        Tensor([[1.0, 2.0], [3.0]])
    with pytest.raises(TypeError, match="a Tensor needs numbers.*'abc'"):
        Tensor("abc")


def test_a_micrograd_value_mixed_with_a_tensor_is_named():
    from course.micrograd import Value

    t, v = Tensor([1.0, 2.0], requires_grad=True), Value(3.0)
    for mixed in (lambda: t + v, lambda: v + t, lambda: t * v, lambda: v * t, lambda: t - v,
                  lambda: Tensor(v)):
        with pytest.raises(TypeError, match="a micrograd Value cannot be mixed with a Tensor.*Tensor\\(value.data\\)"):
            mixed()
    with pytest.raises(TypeError, match="not with a NoneType"):
        t + None


@pytest.mark.parametrize("fn", [F.gelu, F.silu, F.softplus, F.softmax, F.log_softmax, lambda x: F.dropout(x, 0.5),
                                lambda x: F.masked_fill(x, x > 0, 0.0), lambda x: F.layer_norm(x, None, None)])
def test_functional_names_a_numpy_array_given_for_a_tensor(fn):
    with pytest.raises(TypeError, match="`x` must be a Tensor, got a NumPy array: wrap it first, Tensor\\(x\\)"):
        fn(np.ones((2, 3)))


def test_attention_names_which_argument_is_not_a_tensor():
    q = Tensor(np.ones((1, 2, 4)))
    with pytest.raises(TypeError, match="scaled_dot_product_attention: `k` must be a Tensor, got a list"):
        F.scaled_dot_product_attention(q, [[1.0]], q)
