"""Symbolic gradients against central finite differences (float64), the graph shapes that break
naive implementations, and training with GradientDescentOptimizer."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import course.minitf as tf

pytestmark = pytest.mark.part3


def numeric_grad(f, x, h=1e-6):
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        old = x[i]
        x[i] = old + h
        up = f(x)
        x[i] = old - h
        down = f(x)
        x[i] = old
        g[i] = (up - down) / (2 * h)
    return g


def check_grads(build, shapes_, rng, low=-2.0, high=2.0, rtol=1e-5, atol=1e-7):
    """build(*placeholders) -> a node; checks d(sum of it)/d(each input) numerically."""
    g = tf.Graph()
    with g.as_default():
        xs = [tf.placeholder(s, name=f"x{i}") for i, s in enumerate(shapes_)]
        y = tf.reduce_sum(build(*xs))
        grads = tf.gradients(y, xs)
    values = [rng.uniform(low, high, size=s) for s in shapes_]
    sess = tf.Session(g)
    got = sess.run(grads, dict(zip(xs, values)))
    for k in range(len(xs)):
        def f(v, k=k):
            feed = dict(zip(xs, values))
            feed[xs[k]] = v
            return float(sess.run(y, feed))
        np.testing.assert_allclose(got[k], numeric_grad(f, values[k].copy()), rtol=rtol, atol=atol,
                                   err_msg=f"input {k}")


CASES = {
    "add": (lambda a, b: a + b, [(3, 4), (3, 4)]),
    "add_broadcast": (lambda a, b: a + b, [(3, 4), (4,)]),
    "add_broadcast_ones": (lambda a, b: a + b, [(3, 1), (1, 4)]),
    "sub": (lambda a, b: a - b, [(3, 4), (1, 4)]),
    "mul": (lambda a, b: a * b, [(2, 3), (3,)]),
    "div": (lambda a, b: a / b, [(2, 3), (2, 1)]),
    "neg": (lambda a: -a, [(5,)]),
    "matmul": (lambda a, b: a @ b, [(3, 4), (4, 2)]),
    "transpose": (lambda a: tf.transpose(a) * np.arange(6.0).reshape(3, 2), [(2, 3)]),
    "exp": (lambda a: tf.exp(a), [(2, 3)]),
    "sigmoid": (lambda a: tf.sigmoid(a), [(2, 3)]),
    "relu": (lambda a: tf.relu(a), [(2, 3)]),
    "tanh": (lambda a: tf.tanh(a), [(2, 3)]),
    "square": (lambda a: tf.square(a), [(2, 3)]),
    "softmax": (lambda a: tf.softmax(a) * np.arange(4.0), [(3, 4)]),
    "softmax_axis0": (lambda a: tf.softmax(a, axis=0) * np.arange(12.0).reshape(3, 4), [(3, 4)]),
    "reduce_sum_axis": (lambda a: tf.square(tf.reduce_sum(a, axis=1)), [(3, 4)]),
    "reduce_sum_keepdims": (lambda a: a * tf.reduce_sum(a, axis=0, keepdims=True), [(3, 4)]),
    "reduce_mean": (lambda a: tf.square(tf.reduce_mean(a, axis=0)), [(3, 4)]),
    "reduce_mean_all": (lambda a: tf.square(tf.reduce_mean(a)), [(3, 4)]),
    "pow_const": (lambda a: a ** 3, [(4,)]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_gradient_matches_finite_differences(case, rng):
    build, shapes_ = CASES[case]
    check_grads(build, shapes_, rng)


def test_log_and_pow_gradients_on_positive_inputs(rng):
    check_grads(lambda a: tf.log(a), [(2, 3)], rng, low=0.5, high=2.0)
    check_grads(lambda a, b: a ** b, [(2, 3), (2, 3)], rng, low=0.5, high=2.0)
    check_grads(lambda a: tf.pow(2.0, a), [(3,)], rng)


def test_relu_gradient_is_zero_on_the_negative_side():
    g = tf.Graph()
    with g.as_default():
        x = tf.placeholder((4,), name="x")
        dx = tf.gradients(tf.reduce_sum(tf.relu(x)), x)
    np.testing.assert_array_equal(tf.Session(g).run(dx, {x: [-1.0, -0.5, 0.5, 2.0]}), [0, 0, 1, 1])


def test_node_used_twice():
    g = tf.Graph()
    with g.as_default():
        a = tf.placeholder((), name="a")
        b = a + a
        c = b + b
        sq = a * a
        da, = tf.gradients(c, [a])
        dsq = tf.gradients(sq, a)
    sess = tf.Session(g)
    assert sess.run(da, {a: 3.0}) == 4.0
    assert sess.run(dsq, {a: 3.0}) == 6.0


def test_skip_connection():
    g = tf.Graph()
    with g.as_default():
        x = tf.placeholder((), name="x")
        h = tf.tanh(x)
        y = h * 2.0 + x          # x reaches y directly and through h
        dx = tf.gradients(y, x)
    v = 0.3
    assert np.isclose(tf.Session(g).run(dx, {x: v}), 2 * (1 - np.tanh(v) ** 2) + 1)


def test_variable_feeding_a_dead_branch():
    g = tf.Graph()
    with g.as_default():
        w = tf.Variable(2.0, name="w")
        loss = w * 3.0
        dead = tf.exp(w) * 5.0   # reads w, never reaches the loss
        other = tf.Variable(1.0, name="other")
        dw, dother = tf.gradients(loss, [w, other])
    assert dother is None
    assert tf.Session(g).run(dw) == 3.0
    assert dead.graph is g


def test_shared_intermediate_with_many_paths(rng):
    # a diamond inside a diamond: every contribution must be summed exactly once
    check_grads(lambda a: (lambda h: (h * h + tf.exp(h)) * h)(tf.sigmoid(a) + a), [(3,)], rng)


@given(st.lists(st.integers(1, 4), min_size=1, max_size=3), st.integers(0, 2**31 - 1))
def test_broadcast_gradients_have_the_input_shapes(shape, seed):
    rng = np.random.default_rng(seed)
    shape = tuple(shape)
    small = tuple(1 if rng.random() < 0.5 else d for d in shape)[rng.integers(0, len(shape) + 1):]
    check_grads(lambda a, b: a * b + b, [shape, small], rng)


def test_gradient_descent_on_a_quadratic():
    g = tf.Graph()
    with g.as_default():
        w = tf.Variable(np.array([1.0, -2.0]), name="w")
        loss = tf.reduce_sum(tf.square(w - np.array([3.0, 0.5])))
        train = tf.GradientDescentOptimizer(0.1).minimize(loss)
    sess = tf.Session(g)
    for _ in range(100):
        assert sess.run(train) is None
    np.testing.assert_allclose(w.value, [3.0, 0.5], atol=1e-6)


def test_updates_in_one_step_all_use_the_old_values():
    g = tf.Graph()
    with g.as_default():
        a = tf.Variable(1.0, name="a")
        b = tf.Variable(2.0, name="b")
        loss = a * b
        train = tf.GradientDescentOptimizer(1.0).minimize(loss)
    tf.Session(g).run(train)
    assert (float(a.value), float(b.value)) == (1.0 - 2.0, 2.0 - 1.0)


def test_logistic_regression_learns(rng):
    X = rng.normal(size=(100, 2))
    y = (X[:, :1] + X[:, 1:] > 0).astype(float)
    g = tf.Graph()
    with g.as_default():
        x = tf.placeholder((None, 2), name="x")
        t = tf.placeholder((None, 1), name="t")
        w = tf.Variable(np.zeros((2, 1)), name="w")
        b = tf.Variable(0.0, name="b")
        p = tf.sigmoid(x @ w + b)
        loss = -tf.reduce_mean(t * tf.log(p) + (1 - t) * tf.log(1 - p))
        train = tf.GradientDescentOptimizer(0.5).minimize(loss)
    sess = tf.Session(g)
    first = sess.run(loss, {x: X, t: y})
    for _ in range(100):
        sess.run(train, {x: X, t: y})
    assert sess.run(loss, {x: X, t: y}) < first / 3


def test_a_matmul_gradient_through_an_unshaped_stack_is_an_error_not_a_wrong_answer():
    """Without shapes, the gradient of x @ w transposes x as a matrix; fed a stack of matrices it
    says so when it runs, instead of reversing all three axes."""
    g = tf.Graph()
    with g.as_default():
        x = tf.placeholder()
        w = tf.Variable(np.ones((3, 3)))
        (dw,) = tf.gradients(tf.reduce_sum(tf.matmul(x, w)), [w])
    sess = tf.Session(g)
    np.testing.assert_allclose(sess.run(dw, {x: np.arange(9.0).reshape(3, 3)}),
                               np.arange(9.0).reshape(3, 3).T @ np.ones((3, 3)))
    with pytest.raises(RuntimeError, match=r"transpose without perm takes a 2-D matrix, got shape \(2, 3, 3\)"):
        sess.run(dw, {x: np.ones((2, 3, 3))})
