"""The checks of part 3: a stub is not attempted, a wrong answer fails naming the input and the
mistake, and right answers pass, including ones written differently from the worked solution."""

import numpy as np
import pytest

import course.minitf as tf
from course.exercises import check
from course.tensor import unbroadcast
from course.minitf import compiler

import known_wrong  # tests/known_wrong.py

pytestmark = pytest.mark.part3


def stub(*args, **kwargs):
    raise NotImplementedError


# ---- right answers ---------------------------------------------------------------------------

def evaluation_order(fetch):
    order, seen, stack = [], set(), [(fetch, False)]
    while stack:
        node, inputs_done = stack.pop()
        if inputs_done:
            order.append(node)
        elif node not in seen:
            seen.add(node)
            stack.append((node, True))
            stack.extend((i, False) for i in node.inputs if i not in seen)
    return order


def logistic_regression_graph(n_features):
    x = tf.placeholder((None, n_features), name="x")
    w = tf.Variable(np.zeros((n_features, 1)), name="w")
    b = tf.Variable(np.zeros(1), name="b")
    return x, w, b, tf.sigmoid(x @ w + b)


def feed_fits(declared, actual):
    if declared is None:
        return True
    return len(declared) == len(actual) and all(d is None or d == a for d, a in zip(declared, actual))


def softmax_backward(s, g):
    return s * (g - (g * s).sum(axis=-1, keepdims=True))


def sum_to_shape(grad, shape):
    while grad.ndim > len(shape):
        grad = grad.sum(axis=0)
    for axis, size in enumerate(shape):
        if size == 1:
            grad = grad.sum(axis=axis, keepdims=True)
    return grad


def tanh_grad(y, g):
    return g * (1 - y * y)


def matmul_shape(a, b):
    if a[1] is not None and b[0] is not None and a[1] != b[0]:
        raise ValueError(f"matmul: shapes {a} and {b} do not fit")
    return (a[0], b[1])


def _is_scalar_one(node):
    return node.op == "constant" and np.shape(node.value) == () and node.value == 1


def remove_mul_by_one(graph):
    def visit(node, inputs, new):
        if node.op == "mul":
            for k, inp in enumerate(inputs):
                if _is_scalar_one(inp):
                    return inputs[1 - k]
        return None
    return compiler.rewrite(graph, visit)


def reduce_shape(shape, axis=None, keepdims=False):
    axes = set(range(len(shape))) if axis is None else {
        a % len(shape) for a in ((axis,) if isinstance(axis, int) else axis)}
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


# ---- wrong answers, each with what its failure message should say -------------------------------

def reversed_breadth_first(fetch):  # right on a diamond, wrong where a node's input is reached late
    order, seen, queue = [], {fetch}, [fetch]
    while queue:
        node = queue.pop(0)
        order.append(node)
        for i in node.inputs:
            if i not in seen:
                seen.add(i)
                queue.append(i)
    return order[::-1]


def order_by_name(fetch):  # names instead of nodes
    return [n.name for n in evaluation_order(fetch)]


def logistic_in_its_own_graph(n_features):  # builds a new Graph instead of using the default one
    with tf.Graph().as_default():
        return logistic_regression_graph(n_features)


def fits_ignoring_rank(declared, actual):
    return declared is None or all(d is None or d == a for d, a in zip(declared, actual))


def softmax_backward_diagonal(s, g):  # only the diagonal of the Jacobian
    return s * (1 - s) * g


def sum_to_shape_dropping_axes(grad, shape):  # forgets keepdims
    while grad.ndim > len(shape):
        grad = grad.sum(axis=0)
    for axis, size in enumerate(shape):
        if size == 1 and grad.shape[axis] != 1:
            grad = grad.sum(axis=axis)
    return grad


def tanh_grad_without_g(y, g):
    return 1 - y * y


def matmul_shape_ignoring_none(a, b):
    if a[1] != b[0]:
        raise ValueError(f"matmul: shapes {a} and {b} do not fit")
    return (a[0], b[1])


def remove_every_mul_by_ones(graph):  # also drops a broadcasting array of ones
    def visit(node, inputs, new):
        if node.op == "mul":
            for k, inp in enumerate(inputs):
                if inp.op == "constant" and np.all(inp.value == 1):
                    return inputs[1 - k]
        return None
    return compiler.rewrite(graph, visit)


def reduce_shape_positive_axes_only(shape, axis=None, keepdims=False):
    axes = set(range(len(shape))) if axis is None else set((axis,) if isinstance(axis, int) else axis)
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


CASES = [
    ("3.1.1", evaluation_order, order_by_name, "expected the nodes themselves"),
    ("3.1.1", evaluation_order, reversed_breadth_first, "'b' comes before its input 'a'"),
    ("3.1.2", logistic_regression_graph, logistic_in_its_own_graph, "not in the default graph"),
    ("3.1.3", feed_fits, fits_ignoring_rank, "actual=(2,)"),
    ("3.2.1", softmax_backward, softmax_backward_diagonal, "softmax output of shape"),
    ("3.2.2", sum_to_shape, sum_to_shape_dropping_axes, "expected shape (1, 3)"),
    ("3.2.3", tanh_grad, tanh_grad_without_g, "nodes y and g"),
    ("3.3.1", matmul_shape, matmul_shape_ignoring_none, "(2, None) @ (7, 1)"),
    ("3.3.2", remove_mul_by_one, remove_every_mul_by_ones, "expected 2 multiplications left"),
    ("3.3.3", reduce_shape, reduce_shape_positive_axes_only, "axis=-1"),
]


# ---- more known-wrong answers: each calls the library function the exercise asks the learner to write ----

def order_by_the_library(fetch):
    return tf.topological_order([fetch])


def softmax_backward_by_gradients(s, g):
    graph = tf.Graph()
    with graph.as_default():
        x = tf.placeholder(s.shape, name="x")
        loss = tf.reduce_sum(tf.softmax(x) * tf.constant(g))
        (dx,) = tf.gradients(loss, [x])
    return tf.Session(graph).run(dx, {x: np.log(s)})


def tanh_grad_by_gradients(y, g):
    (dy,) = tf.gradients(tf.tanh(y), [y], [g])
    return dy


def _ops():
    from course.minitf import ops
    return ops


def fits_by_check_feed(declared, actual):
    try:
        _ops().check_feed("x", declared, np.zeros(actual))
    except ValueError:
        return False
    return True


def _shapes():
    from course.minitf import shapes
    return shapes


KNOWN_WRONG = {exercise_id: [(wrong, [says])] for exercise_id, _, wrong, says in CASES}
for exercise_id, wrong, words in [
    ("3.1.1", order_by_the_library, ["write this yourself", "course.minitf.topological_order"]),
    ("3.1.3", lambda declared, actual: _shapes().compatible(declared, actual),
     ["write this yourself", "course.minitf.shapes.compatible"]),
    ("3.2.1", softmax_backward_by_gradients, ["write this yourself", "course.minitf.gradients"]),
    ("3.2.2", lambda grad, shape: unbroadcast(grad, shape), ["write this yourself", "course.tensor.unbroadcast"]),
    ("3.2.2", lambda grad, shape: _ops().sum_to_shape(grad, shape), ["write this yourself", "course.tensor.unbroadcast"]),
    ("3.1.3", fits_by_check_feed, ["write this yourself", "course.minitf.ops.check_feed"]),
    ("3.2.3", tanh_grad_by_gradients, ["write this yourself", "course.minitf.gradients"]),
    ("3.3.1", lambda a, b: _shapes().matmul(a, b), ["write this yourself", "course.minitf.shapes.matmul"]),
    ("3.3.3", lambda shape, axis=None, keepdims=False: _shapes().reduce(shape, axis, keepdims),
     ["write this yourself", "course.minitf.shapes.reduce"]),
]:
    KNOWN_WRONG[exercise_id].append((wrong, words))


@pytest.mark.parametrize("exercise_id,wrong,words", known_wrong.cases(KNOWN_WRONG))
def test_known_wrong_answer_fails_saying_why(exercise_id, wrong, words):
    known_wrong.assert_fails_saying(exercise_id, wrong, words)


def test_the_library_order_is_back_after_the_check():
    check("3.1.1", order_by_the_library)
    g = tf.Graph()
    with g.as_default():
        x = tf.placeholder((None, 2), name="x")
        y = tf.exp(x, name="y")
    assert [n.name for n in tf.topological_order([y])] == ["x", "y"]


def test_the_library_still_works_inside_a_learners_graph():
    # 3.1.1 switches tf.topological_order off for the learner, not for Session.run, which uses it
    def order_checked_by_running(fetch):
        order = evaluation_order(fetch)
        if fetch.op != "placeholder" and fetch.graph.get("x").shape == (None, 3):
            tf.Session(fetch.graph).run(fetch, {"x": np.ones((2, 3))})
        return order

    assert check("3.1.1", order_checked_by_running).status == "passed"


@pytest.mark.parametrize("exercise_id", [c[0] for c in CASES])
def test_stub_is_not_attempted(exercise_id):
    assert check(exercise_id, stub).status == "not attempted"


@pytest.mark.parametrize("exercise_id,right", [(c[0], c[1]) for c in CASES])
def test_right_answer_passes(exercise_id, right):
    result = check(exercise_id, right)
    assert result.status == "passed", result.message


@pytest.mark.parametrize("exercise_id,wrong,says", [(c[0], c[2], c[3]) for c in CASES])
def test_wrong_answer_fails_saying_why(exercise_id, wrong, says):
    result = check(exercise_id, wrong)
    assert result.status == "failed"
    assert says in result.message, result.message
    assert "Hint:" in result.message


ALTERNATIVES = [
    ("3.1.1", lambda fetch: tuple(evaluation_order(fetch))),
    ("3.2.1", lambda s, g: softmax_backward(s, g).astype(np.float32)),
    ("3.2.2", lambda grad, shape: sum_to_shape(grad, shape).tolist()),
    ("3.2.3", lambda y, g: g * (1.0 - tf.square(y))),
    ("3.3.1", lambda a, b: list(matmul_shape(a, b))),
    # the error names the shapes as lists: still both shapes
    ("3.3.1", lambda a, b: matmul_shape(a, b) if a[1] is None or b[0] is None or a[1] == b[0]
     else (_ for _ in ()).throw(ValueError(f"cannot multiply {list(a)} by {list(b)}"))),
    ("3.3.3", lambda shape, axis=None, keepdims=False: list(reduce_shape(shape, axis, keepdims))),
]


@pytest.mark.parametrize("exercise_id,alternative", ALTERNATIVES)
def test_right_answers_in_another_form_pass(exercise_id, alternative):
    result = check(exercise_id, alternative)
    assert result.status == "passed", result.message
