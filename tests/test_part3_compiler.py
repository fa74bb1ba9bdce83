"""Each compiler pass keeps the outputs and removes the nodes it should."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import course.minitf as tf
from course.minitf import compiler

pytestmark = pytest.mark.part3


def model():
    """A small MLP with some deliberate waste: constant arithmetic, a repeated expression, a dead branch."""
    rng = np.random.default_rng(0)
    g = tf.Graph()
    with g.as_default():
        x = tf.placeholder((None, 3), name="x")
        scale = tf.constant(2.0) * tf.constant(0.25)          # folds to 0.5
        w1 = tf.Variable(rng.normal(size=(3, 8)), name="w1")
        b1 = tf.Variable(np.zeros(8), name="b1")
        h = tf.tanh(x @ w1 + b1)
        h2 = tf.tanh(x @ w1 + b1)                             # the same as h
        w2 = tf.Variable(rng.normal(size=(8, 2)), name="w2")
        logits = (h + h2) * scale @ w2
        out = tf.softmax(tf.exp(-tf.square(logits)) * 3.0 + 1.0, name="out")
        tf.reduce_sum(tf.log(tf.exp(h)), name="unused")      # dead
    return g


def run(g, name, xv):
    return tf.Session(g).run(g.get(name), {g.get("x"): xv})


@given(st.integers(1, 6), st.integers(0, 2**31 - 1))
def test_every_pass_keeps_the_outputs(batch, seed):
    xv = np.random.default_rng(seed).normal(size=(batch, 3))
    g = model()
    want = run(g, "out", xv)
    for p in [compiler.infer_shapes, compiler.fold_constants, compiler.eliminate_common_subexpressions,
              lambda g: compiler.eliminate_dead_code(g, ["out"]), lambda g: compiler.fuse_elementwise(g, ["out"]),
              lambda g: compiler.optimize(g, ["out"])]:
        np.testing.assert_allclose(run(p(g), "out", xv), want, rtol=1e-12)


def test_passes_return_a_new_graph_and_leave_the_old_one():
    g = model()
    n = len(g)
    new = compiler.optimize(g, ["out"])
    assert new is not g and len(g) == n and all(node.graph is new for node in new.nodes)


def test_infer_shapes_specializes_placeholders_and_reports_errors():
    g = model()
    s = compiler.infer_shapes(g, {"x": (5, 3)})
    assert s.get("x").shape == (5, 3)
    assert s.get("out").shape == (5, 2)
    assert g.get("out").shape == (None, 2)
    with pytest.raises(ValueError, match=r"\(None, 3\).*\(5, 4\)"):
        compiler.infer_shapes(g, {"x": (5, 4)})
    g2 = tf.Graph()
    with g2.as_default():
        a = tf.placeholder(None, name="a")
        tf.matmul(a, tf.Variable(np.ones((3, 2))), name="m")
    assert g2.get("m").shape == (None, 2)   # a has no known shape yet
    with pytest.raises(ValueError, match=r"\(2, 4\).*\(3, 2\)"):
        compiler.infer_shapes(g2, {"a": (2, 4)})


def test_fold_constants():
    g = model()
    f = compiler.fold_constants(g)
    # the folded constant's inputs are now unused: dead-code elimination removes them
    assert len(compiler.eliminate_dead_code(f, ["out"])) < len(compiler.eliminate_dead_code(g, ["out"]))
    assert f.count_ops()["mul"] == g.count_ops()["mul"] - 1
    assert f.get("mul").op == "constant" and float(f.get("mul").value) == 0.5


def test_cse_merges_repeated_expressions():
    g = model()
    c = compiler.eliminate_common_subexpressions(g)
    assert c.count_ops()["tanh"] == g.count_ops()["tanh"] - 1
    assert c.count_ops()["matmul"] == g.count_ops()["matmul"] - 1
    assert c.get("tanh_1") is c.get("tanh")  # found through the alias


def test_cse_keeps_variables_and_placeholders_apart():
    g = tf.Graph()
    with g.as_default():
        a = tf.Variable(1.0, name="a")
        b = tf.Variable(1.0, name="b")
        tf.add(a, b, name="s")
    c = compiler.eliminate_common_subexpressions(g)
    assert c.count_ops()["variable"] == 2


def test_dead_code_elimination():
    g = model()
    d = compiler.eliminate_dead_code(g, ["out"])
    assert "unused" in g and "unused" not in d
    assert len(d) < len(g)
    assert compiler.eliminate_dead_code(g, [g.get("unused")]).count_ops().get("softmax") is None


def test_fusion_makes_one_node_of_an_elementwise_chain():
    g = tf.Graph()
    with g.as_default():
        x = tf.placeholder((None, 4), name="x")
        y = tf.relu(tf.exp(-tf.square(x - 1.0)) * 2.0 + x)
        z = tf.reduce_sum(y, name="z")
    f = compiler.fuse_elementwise(g, ["z"])
    assert f.count_ops()["fused"] == 1
    assert [n.op for n in f.nodes if n.op not in ("constant", "placeholder")] == ["fused", "reduce_sum"]
    fused = f.nodes[[n.op for n in f.nodes].index("fused")]
    assert compiler.describe_fused(fused) == "sub > square > neg > exp > mul > add > relu"
    xv = np.random.default_rng(1).normal(size=(3, 4))
    assert np.isclose(tf.Session(f).run("z", {"x": xv}), tf.Session(g).run(z, {x: xv}))


def test_fusion_keeps_nodes_read_twice_or_asked_for():
    g = tf.Graph()
    with g.as_default():
        x = tf.placeholder((3,), name="x")
        e = tf.exp(x, name="e")
        y = tf.tanh(e * e + 1.0, name="y")
    f = compiler.fuse_elementwise(g, ["y"])
    assert f.get("e").op == "exp"       # read twice: stays a node
    assert f.get("y").op == "fused"
    f2 = compiler.fuse_elementwise(g, ["y", "e"])
    assert f2.get("e").op == "exp"
    xv = np.array([0.1, -0.2, 0.3])
    np.testing.assert_allclose(tf.Session(f).run("y", {"x": xv}), np.tanh(np.exp(xv) ** 2 + 1))


def test_fused_kernel_does_not_touch_its_inputs():
    g = tf.Graph()
    with g.as_default():
        x = tf.placeholder((4,), name="x")
        tf.tanh(tf.exp(x) + x, name="y")
    f = compiler.fuse_elementwise(g, ["y"])
    xv = np.linspace(-1, 1, 4)
    copy = xv.copy()
    tf.Session(f).run("y", {"x": xv})
    np.testing.assert_array_equal(xv, copy)


def test_optimize_counts_on_the_model():
    g = model()
    o = compiler.optimize(g, ["out"])
    assert len(o) < len(g) / 2
    assert o.count_ops().get("fused", 0) >= 1


def test_optimize_on_a_training_graph_keeps_training_working():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(32, 2))
    Y = (X[:, :1] * X[:, 1:] > 0).astype(float)
    g = tf.Graph()
    with g.as_default():
        x = tf.placeholder((None, 2), name="x")
        t = tf.placeholder((None, 1), name="t")
        w = tf.Variable(rng.normal(size=(2, 8)) * 0.5, name="w")
        v = tf.Variable(rng.normal(size=(8, 1)) * 0.5, name="v")
        p = tf.sigmoid(tf.tanh(x @ w) @ v, name="p")
        loss = tf.reduce_mean(tf.square(p - t), name="loss")
        tf.GradientDescentOptimizer(0.5).minimize(loss)
    o = compiler.optimize(g, ["GradientDescent", "loss"])
    assert len(o) < len(g)
    s1, s2 = tf.Session(g), tf.Session(o)
    for _ in range(5):
        s1.run("GradientDescent", {"x": X, "t": Y})
        s2.run("GradientDescent", {"x": X, "t": Y})
    np.testing.assert_allclose(o.get("w").value, w.value, rtol=1e-12)
    np.testing.assert_allclose(s2.run("loss", {"x": X, "t": Y}), s1.run(loss, {x: X, t: Y}), rtol=1e-12)
