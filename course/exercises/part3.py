"""Checks for the exercises of part 3 (a mini TensorFlow)."""

import numpy as np

from course.exercises import CheckFailed, call, exercise, expect, expect_close
from course.exercises._core import within


def _short(value, limit=100):
    text = " ".join(repr(value).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _graph_with_waste():
    import course.minitf as tf

    g = tf.Graph()
    with g.as_default():
        x = tf.placeholder((None, 3), name="x")
        a = tf.exp(x, name="a")
        b = tf.add(a, x, name="b")          # a diamond: x is read twice
        c = tf.multiply(b, a, name="c")
        tf.log(x, name="unused")            # not needed by c
        d = tf.reduce_sum(c * 2.0, axis=1, name="d")
    return g, x, d


# ---------------------------------------------------------------- 3.1

@exercise("3.1.1", hint="a node can be placed only after all its inputs; remember the nodes already placed so "
                        "that each appears once",
          answer_hint="depth-first from the fetch: visit a node's inputs first, then append the node; skip a "
                      "node already visited (a stack of (node, inputs_done) pairs avoids recursion)",
          forbid=["course.minitf.topological_order"], task="write the depth-first order")
def _(candidate, rng):
    import course.minitf as tf

    g, x, d = _graph_with_waste()
    with tf.Graph().as_default():  # c reads a, then b = tanh(a): a breadth-first order, reversed, puts b first
        a = tf.exp(tf.placeholder((None, 3), name="x"), name="a")
        chain = tf.multiply(a, tf.tanh(a, name="b"), name="c")
    for fetch, graph in [(d, "a graph with a diamond and an unused node"), (g.get("b"), None), (x, None),
                         (g.get("c"), None), (chain, "c = a * tanh(a), a = exp(x)")]:
        on = f"the fetch '{fetch.name}' of {graph or 'a graph with a diamond and an unused node'}"
        got = call(candidate, fetch, on=on)
        try:
            got = list(got)
        except TypeError:
            raise CheckFailed(f"expected a list of nodes on {on}, got {got!r}") from None
        want = tf.topological_order([fetch])
        strays = [item for item in got if not isinstance(item, tf.Node)]
        expect(not strays, f"expected the nodes themselves, got a {type(strays[0]).__name__ if strays else ''} "
                           f"({_short(strays[0]) if strays else ''}) in your order on {on}")
        expect(len(got) == len(set(got)), f"a node appears twice in your order on {on}")
        expect(set(got) == set(want), f"expected the nodes {sorted(n.name for n in want)}, "
                                      f"got {sorted(getattr(n, 'name', str(n)) for n in got)} on {on}")
        pos = {n: i for i, n in enumerate(got)}
        for n in got:
            for i in n.inputs:
                expect(pos[i] < pos[n], f"'{n.name}' comes before its input '{i.name}' on {on}")


@exercise("3.1.2", hint="a placeholder for the batch (its number of rows unknown), Variables for the weights "
                        "and the bias, and the sigmoid of the affine map, all in the default graph",
          answer_hint="x = tf.placeholder((None, n_features)), w a Variable of shape (n_features, 1), b a "
                      "Variable of shape (1,), p = tf.sigmoid(x @ w + b)")
def _(candidate, rng):
    import course.minitf as tf

    for n_features in [2, 5, 1]:
        on = f"n_features={n_features}"
        g = tf.Graph()
        got = call(within(candidate, g, "as_default"), n_features, on=on)
        try:
            x, w, b, p = got
        except (TypeError, ValueError):
            raise CheckFailed(f"expected the four nodes (x, w, b, p), got {_short(got)} on {on}") from None
        expect(all(isinstance(n, tf.Node) for n in (x, w, b, p)), f"expected four nodes, got {_short(got)} on {on}")
        expect(all(n.graph is g for n in (x, w, b, p)),
               f"your nodes are not in the default graph on {on}: create them directly with tf.placeholder, "
               f"tf.Variable, ..., without making a new tf.Graph()")
        expect(x.op == "placeholder", f"x should be a placeholder, got a {x.op} on {on}")
        expect(w.op == "variable" and b.op == "variable", f"w and b should be Variables on {on}")
        expect(tuple(w.shape) == (n_features, 1), f"w should have shape ({n_features}, 1), got {w.shape} on {on}")
        w.value = rng.normal(size=(n_features, 1))
        b.value = rng.normal(size=b.shape)
        for batch in [1, 7]:
            X = rng.normal(size=(batch, n_features))
            value = call(tf.Session(g).run, p, {x: X}, on=f"{on}, a batch of {batch}")
            want = 1 / (1 + np.exp(-(X @ w.value + b.value)))
            expect_close(value, want, on=f"{on}, a batch of {batch}", what="p")


@exercise("3.1.3", hint="compare the number of axes first, then each size: a declared None fits any size, "
                        "and a declared shape of None fits anything",
          answer_hint="declared is None or (len(declared) == len(actual) and all(d is None or d == a for d, a "
                      "in zip(declared, actual)))",
          forbid=["course.minitf.shapes.compatible", "course.minitf.ops.check_feed"],
          task="write the comparison")
def _(candidate, rng):
    cases = [((None, 2), (5, 2), True), ((None, 2), (5, 3), False), ((None, 2), (2,), False),
             ((3,), (3,), True), ((), (), True), ((), (1,), False), (None, (4, 4, 4), True),
             ((None, None), (0, 7), True), ((2, None), (3, 1), False)]
    for _ in range(5):
        actual = tuple(int(v) for v in rng.integers(1, 5, size=rng.integers(1, 4)))
        declared = tuple(None if rng.random() < 0.5 else d for d in actual)
        cases.append((declared, actual, True))
    for declared, actual, want in cases:
        on = f"declared={declared}, actual={actual}"
        got = call(candidate, declared, actual, on=on)
        expect(got == want, f"expected {want}, got {got!r} on {on}")


# ---------------------------------------------------------------- 3.2

def _softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


_BY_HAND = dict(forbid=["course.minitf.gradients", "course.tensor.Tensor.backward"],
                task="derive the gradient by hand")


@exercise("3.2.1", hint="the Jacobian of softmax is diag(s) - s s^T; apply it to g without building the matrix: "
                        "one sum over the last axis is enough",
          answer_hint="s * (g - (g * s).sum(axis=-1, keepdims=True))", **_BY_HAND)
def _(candidate, rng):
    for shape in [(3,), (2, 4), (5, 3), (2, 3, 4)]:
        x = rng.normal(size=shape)
        g = rng.normal(size=shape)
        s = _softmax(x)
        on = f"a softmax output of shape {shape}"
        got = call(candidate, s, g, on=on)
        # the finite-difference answer, one element at a time
        want = np.zeros_like(x)
        h = 1e-6
        for i in np.ndindex(shape):
            xp, xm = x.copy(), x.copy()
            xp[i] += h
            xm[i] -= h
            want[i] = np.sum(g * (_softmax(xp) - _softmax(xm))) / (2 * h)
        expect_close(got, want, on=on, rtol=1e-5, atol=1e-7, what="gradient")


@exercise("3.2.2", hint="broadcasting added leading axes and stretched axes of size 1: the gradient sums over "
                        "both, and the result must have exactly `shape`",
          answer_hint="sum over the leading axes that broadcasting added, then (keepdims=True) over the axes "
                      "where `shape` has a 1 and the gradient does not",
          forbid=["course.tensor.unbroadcast"], task="write the reduction")
def _(candidate, rng):
    cases = [((4, 3), (3,)), ((4, 3), (1, 3)), ((4, 3), (4, 1)), ((4, 3), ()), ((2, 3, 4), (3, 1)),
             ((2, 3), (2, 3)), ((5,), (1,))]
    for grad_shape, shape in cases:
        g = rng.normal(size=grad_shape)
        on = f"a gradient of shape {grad_shape} for an input of shape {shape}"
        got = call(candidate, g.copy(), shape, on=on)
        want = g
        while want.ndim > len(shape):
            want = want.sum(axis=0)
        for ax, d in enumerate(shape):
            if d == 1:
                want = want.sum(axis=ax, keepdims=True)
        expect_close(got, want, on=on, what="reduced gradient")


@exercise("3.2.3", hint="the derivative of tanh can be written with its output y alone; chain it with the "
                        "incoming gradient g, building nodes",
          answer_hint="g * (1 - y * y)", forbid=["course.minitf.gradients"],
          task="build the gradient from the nodes y and g")
def _(candidate, rng):
    import course.minitf as tf

    for shape in [(3,), (2, 4)]:
        g = tf.Graph()
        with g.as_default():
            y = tf.placeholder(shape, name="y")
            up = tf.placeholder(shape, name="g")
        on = f"nodes y and g of shape {shape}"
        node = call(within(candidate, g, "as_default"), y, up, on=on)
        expect(isinstance(node, tf.Node), f"expected a node, got {type(node).__name__} on {on}")
        x = rng.normal(size=shape)
        gv = rng.normal(size=shape)
        got = tf.Session(g).run(node, {y: np.tanh(x), up: gv})
        expect_close(got, gv * (1 - np.tanh(x) ** 2), on=on, what="gradient")


# ---------------------------------------------------------------- 3.3

@exercise("3.3.1", hint="the result takes the outer sizes; the inner sizes must agree unless one is None, "
                        "and an error should name both shapes",
          answer_hint="return (a[0], b[1]); raise ValueError(f'... {a} ... {b}') when a[1] and b[0] are both known "
                      "and differ", forbid=["course.minitf.shapes.matmul"], task="write the shape rule")
def _(candidate, rng):
    cases = [((2, 3), (3, 4), (2, 4)), ((None, 3), (3, 5), (None, 5)), ((2, None), (7, 1), (2, 1)),
             ((None, None), (None, None), (None, None)), ((1, 1), (1, 1), (1, 1))]
    for _ in range(4):
        n, k, m = (int(v) for v in rng.integers(1, 9, size=3))
        cases.append(((n, k), (k, m), (n, m)))
    for a, b, want in cases:
        on = f"{a} @ {b}"
        got = call(candidate, a, b, on=on)
        expect(got is not None and tuple(got) == want, f"expected {want}, got {got!r} on {on}")
    for a, b in [((2, 3), (4, 5)), ((None, 3), (2, None))]:
        on = f"{a} @ {b}"
        try:
            candidate(a, b)
        except NotImplementedError:
            raise
        except ValueError as err:
            named = [any(form in str(err) for form in (str(s), str(list(s)), str(s).replace(" ", "")))
                     for s in (a, b)]
            expect(all(named),
                   f"the error on {on} should name both shapes, it says: {err}")
        except Exception as err:
            raise CheckFailed(f"expected a ValueError on {on}, got {type(err).__name__}: {err}") from None
        else:
            raise CheckFailed(f"expected a ValueError on {on} (the inner sizes differ), got no error")


@exercise("3.3.2", hint="let compiler.rewrite build the new graph; in visit, look at `inputs` (the new graph's "
                        "nodes), and only a scalar constant 1 may go: an array of ones broadcasts",
          answer_hint="in visit(node, inputs, new): when node.op == 'mul' and one of `inputs` is a constant whose "
                      "value has shape () and equals 1, return the other one of `inputs`; otherwise return None")
def _(candidate, rng):
    import course.minitf as tf
    from course.minitf import compiler

    def build():
        g = tf.Graph()
        with g.as_default():
            x = tf.placeholder((None, 3), name="x")
            a = tf.multiply(x, 1.0, name="a")            # goes
            b = tf.multiply(1.0, tf.exp(a), name="b")    # goes
            c = tf.multiply(b, 2.0, name="c")            # stays: 2 is not 1
            d = tf.multiply(c, np.ones((2, 1, 3)), name="d")  # stays: it broadcasts to (2, None, 3)
            tf.reduce_sum(d + b * 1.0, name="out")       # one more that goes
        return g

    g = build()
    before = [(n.name, n.op) for n in g.nodes]
    new = call(candidate, g, on="a graph with x * 1, 1 * exp(..), b * 1 and two muls that must stay")
    expect([(n.name, n.op) for n in g.nodes] == before, "your pass changed the graph it was given: "
                                                       "build a new graph (compiler.rewrite does)")
    expect(isinstance(new, tf.Graph), f"expected a Graph, got {type(new).__name__}")
    live = compiler.eliminate_dead_code(new, ["out"])
    n_mul = live.count_ops().get("mul", 0)
    expect(n_mul == 2, f"expected 2 multiplications left (by 2 and by a broadcasting array), got {n_mul}")
    for batch in [1, 4]:
        xv = rng.normal(size=(batch, 3))
        got = call(lambda: tf.Session(new).run("out", {"x": xv}), on=f"running your graph on a batch of {batch}")
        expect_close(got, tf.Session(g).run("out", {"x": xv}), on=f"a batch of {batch}", what="output")


@exercise("3.3.3", hint="turn axis into a set of non-negative axes first (None and negative axes included), "
                        "then drop those axes, or keep a 1 in their place",
          answer_hint="axes = all axes if axis is None, else {a % len(shape) for each a}; keepdims: 1 where an "
                      "axis is in axes; otherwise leave those sizes out",
          forbid=["course.minitf.shapes.reduce"], task="write the shape rule")
def _(candidate, rng):
    cases = [((2, 3, 4), None, False, ()), ((2, 3, 4), None, True, (1, 1, 1)), ((2, 3, 4), 1, False, (2, 4)),
             ((2, 3, 4), -1, True, (2, 3, 1)), ((None, 5), 0, False, (5,)), ((None, 5), 1, True, (None, 1)),
             ((2, 3, 4), (0, 2), False, (3,)), ((7,), 0, False, ())]
    for _ in range(4):
        shape = tuple(int(v) for v in rng.integers(1, 6, size=rng.integers(1, 4)))
        axis = int(rng.integers(-len(shape), len(shape)))
        keep = bool(rng.integers(0, 2))
        cases.append((shape, axis, keep, np.sum(np.zeros(shape), axis=axis, keepdims=keep).shape))
    for shape, axis, keepdims, want in cases:
        on = f"shape={shape}, axis={axis}, keepdims={keepdims}"
        got = call(candidate, shape, axis, keepdims, on=on)
        expect(got is not None and tuple(got) == tuple(want), f"expected {want}, got {got!r} on {on}")


from . import part3_onnx  # noqa: E402,F401  (the checks of lesson 3.4 register with the rest of part 3)
