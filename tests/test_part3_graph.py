"""Graph building, names, shapes at build time, and Session.run."""

import numpy as np
import pytest

import course.minitf as tf
from course.minitf import ops

pytestmark = pytest.mark.part3


def test_names_are_unique_and_nodes_in_creation_order():
    g = tf.Graph()
    with g.as_default():
        a = tf.placeholder((2,), name="a")
        b = tf.constant(np.ones(2))
        c = a + b
        d = a + c
        e = tf.add(c, d, name="total")
        f = tf.add(c, d, name="total")
    assert [n.name for n in g.nodes] == ["a", "Const", "add", "add_1", "total", "total_1"]
    assert g.nodes == [a, b, c, d, e, f]
    assert g.get("add_1") is d


def test_as_default_restores_the_previous_graph():
    outer = tf.get_default_graph()
    g = tf.Graph()
    with g.as_default():
        assert tf.get_default_graph() is g
        x = tf.constant(1.0)
    assert tf.get_default_graph() is outer
    assert x.graph is g


def test_operators_and_reflected_operators(rng):
    g = tf.Graph()
    with g.as_default():
        x = tf.placeholder((3,), name="x")
        outs = [x + 2, 2 + x, x - 1, 1 - x, x * 3, 3 * x, x / 4, 4 / x, x ** 2, 2 ** x, -x,
                np.ones(3) + x]
        m = tf.placeholder((2, 3), name="m")
        mm = m @ np.ones((3, 2))
    xv = rng.uniform(0.5, 2.0, size=3)
    got = tf.Session(g).run(outs, {x: xv})
    want = [xv + 2, 2 + xv, xv - 1, 1 - xv, xv * 3, 3 * xv, xv / 4, 4 / xv, xv ** 2, 2 ** xv, -xv, 1 + xv]
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b)
    mv = rng.normal(size=(2, 3))
    np.testing.assert_allclose(tf.Session(g).run(mm, {m: mv}), mv @ np.ones((3, 2)))


def test_functions_match_numpy(rng):
    g = tf.Graph()
    with g.as_default():
        x = tf.placeholder((4, 3), name="x")
        outs = {
            "exp": tf.exp(x), "log": tf.log(tf.exp(x)), "sigmoid": tf.sigmoid(x), "relu": tf.relu(x),
            "tanh": tf.tanh(x), "square": tf.square(x), "softmax": tf.softmax(x),
            "sum": tf.reduce_sum(x), "sum0": tf.reduce_sum(x, axis=0), "mean1k": tf.reduce_mean(x, 1, keepdims=True),
            "mul": tf.multiply(x, x), "matmul": tf.matmul(x, tf.transpose(x)),
        }
    xv = rng.normal(size=(4, 3))
    got = dict(zip(outs, tf.Session(g).run(list(outs.values()), {x: xv})))
    e = np.exp(xv - xv.max(axis=1, keepdims=True))
    want = {"exp": np.exp(xv), "log": xv, "sigmoid": 1 / (1 + np.exp(-xv)), "relu": np.maximum(xv, 0),
            "tanh": np.tanh(xv), "square": xv ** 2, "softmax": e / e.sum(axis=1, keepdims=True),
            "sum": xv.sum(), "sum0": xv.sum(0), "mean1k": xv.mean(1, keepdims=True), "mul": xv * xv,
            "matmul": xv @ xv.T}
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-12, atol=1e-12, err_msg=k)


def test_shapes_are_known_before_running():
    g = tf.Graph()
    with g.as_default():
        x = tf.placeholder((None, 2), name="x")
        w = tf.Variable(np.zeros((2, 5)))
        b = tf.Variable(np.zeros(5))
        h = tf.relu(x @ w + b)
        s = tf.reduce_sum(h, axis=1, keepdims=True)
        m = tf.reduce_mean(h)
    assert h.shape == (None, 5)
    assert s.shape == (None, 1)
    assert m.shape == ()


def test_matmul_shape_error_at_build_time_names_both_shapes():
    g = tf.Graph()
    with g.as_default():
        a = tf.placeholder((2, 3), name="a")
        b = tf.placeholder((4, 5), name="b")
        with pytest.raises(ValueError, match=r"\(2, 3\).*\(4, 5\)"):
            tf.matmul(a, b)
        with pytest.raises(ValueError, match=r"\(2, 3\).*\(4, 5\)"):
            a @ b
        with pytest.raises(ValueError, match=r"\(2, 3\).*\(4,\)"):
            a + tf.placeholder((4,))


def test_session_evaluates_only_what_the_fetch_needs(monkeypatch):
    calls = []
    real_exp = ops.OPS["exp"].forward
    real_log = ops.OPS["log"].forward
    monkeypatch.setattr(ops.OPS["exp"], "forward", lambda *a, **k: calls.append("exp") or real_exp(*a, **k))
    monkeypatch.setattr(ops.OPS["log"], "forward", lambda *a, **k: calls.append("log") or real_log(*a, **k))
    g = tf.Graph()
    with g.as_default():
        x = tf.placeholder((), name="x")
        e = tf.exp(x)
        b = e + e        # e read twice
        c = b * e        # and a third time
        tf.log(x)        # not needed by c
    sess = tf.Session(g)
    assert np.isclose(sess.run(c, {x: 0.5}), 2 * np.exp(0.5) ** 2)
    assert calls == ["exp"]
    sess.run([c, b, e], {x: 0.5})
    assert calls == ["exp", "exp"]


def test_running_part_of_a_graph_and_feeding_an_inner_node():
    g = tf.Graph()
    with g.as_default():
        x = tf.placeholder((), name="x")
        y = x * 3
        z = y + 1
    sess = tf.Session(g)
    assert sess.run(z, {y: 10.0}) == 11.0  # y fed: x is not needed
    assert sess.run("add", {"x": 1.0}) == 4.0


def test_missing_placeholder_is_named():
    g = tf.Graph()
    with g.as_default():
        x = tf.placeholder((None, 2), name="inputs")
        y = tf.reduce_sum(x * 2)
    with pytest.raises(ValueError, match="'inputs'.*not fed"):
        tf.Session(g).run(y)


def test_wrong_feed_shape_names_both_shapes():
    g = tf.Graph()
    with g.as_default():
        x = tf.placeholder((None, 2), name="x")
        y = tf.reduce_sum(x)
    with pytest.raises(ValueError, match=r"'x'.*\(None, 2\).*\(5, 3\)"):
        tf.Session(g).run(y, {x: np.zeros((5, 3))})
    assert tf.Session(g).run(y, {x: np.ones((5, 2))}) == 10.0


def test_deep_graph_runs_without_recursion():
    g = tf.Graph()
    with g.as_default():
        x = tf.placeholder((), name="x")
        y = x
        for _ in range(20000):
            y = y + 1.0
        (dx,) = tf.gradients(y, [x])
    assert tf.Session(g).run([y, dx], {x: 0.0}) == [20000.0, 1.0]


def test_nodes_of_another_graph_are_refused():
    g1, g2 = tf.Graph(), tf.Graph()
    with g1.as_default():
        a = tf.constant(1.0)
    with g2.as_default():
        b = tf.constant(2.0)
    with pytest.raises(ValueError, match="another graph"):
        a + b
    with pytest.raises(ValueError, match="another graph"):
        tf.Session(g2).run(a)


# ----- misuse gets a clear error ----------------------------------------------------------------
def test_placeholder_written_from_tensorflow_habit_is_explained():
    with tf.Graph().as_default():
        with pytest.raises(TypeError, match=r"the first argument is the shape, and float32 is a dtype.*"
                                            r"write tf.placeholder\(\(None, 3\)\)"):
            tf.placeholder(np.float32, (None, 3))
        with pytest.raises(TypeError, match="float32 is a dtype"):
            tf.placeholder("float32")
        with pytest.raises(ValueError, match=r"shape \(None, 2.5\) may hold sizes \(0 or more\) and None, not 2.5"):
            tf.placeholder((None, 2.5))
        with pytest.raises(TypeError, match="name must be a string, got 3"):
            tf.placeholder((None, 3), 3)
        assert tf.placeholder([None, np.int64(3)], name="x").shape == (None, 3)


def test_graph_does_not_import_the_operations():
    # graph.py holds the registry and the operators; ops.py builds on it, never the other way.
    import ast
    from pathlib import Path

    source = Path(tf.graph.__file__).read_text()
    imported = {n.module for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ImportFrom)}
    assert "ops" not in imported and not any(m and m.endswith(".ops") for m in imported)


def test_operators_are_methods_of_node_and_match_the_functions():
    g = tf.Graph()
    with g.as_default():
        x = tf.placeholder((None, 2), name="x")
        pairs = [(x + 1, tf.add(x, 1)), (2 - x, tf.subtract(2, x)), (x * x, tf.multiply(x, x)),
                 (1 / x, tf.divide(1, x)), (x ** 2, tf.pow(x, 2)), (-x, ops.negative(x))]
    assert "__add__" in vars(tf.Node) and "__rtruediv__" in vars(tf.Node)
    feed = {x: np.array([[1.0, 2.0], [3.0, 4.0]])}
    sess = tf.Session(g)
    for by_operator, by_function in pairs:
        assert by_operator.op == by_function.op
        np.testing.assert_array_equal(sess.run(by_operator, feed), sess.run(by_function, feed))
