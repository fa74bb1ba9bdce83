"""The checks of lesson 3.4: right answers pass (in more than one form), stubs are not attempted, and
the known-wrong answers fail with a message that says what to fix."""

import math

import numpy as np
import pytest

import course.minitf as tf
import course.nn as nn
from course.exercises import check

import known_wrong  # tests/known_wrong.py

pytestmark = pytest.mark.part3


# ---- right answers ---------------------------------------------------------------------------

def gemm(a, b, c=None, alpha=1.0, beta=1.0, trans_a=False, trans_b=False):
    a = a.T if trans_a else a
    b = b.T if trans_b else b
    y = alpha * (a @ b)
    return y if c is None else y + beta * c


def reshape_target(input_shape, target):
    dims = [input_shape[i] if d == 0 else d for i, d in enumerate(target)]
    if -1 in dims:
        known = math.prod(d for d in dims if d != -1)
        dims[dims.index(-1)] = math.prod(input_shape) // known
    return tuple(dims)


def reshape_with_true_division(input_shape, target):  # 24 / 2 is 12.0, a float np.reshape refuses
    dims = [input_shape[i] if d == 0 else d for i, d in enumerate(target)]
    if -1 in dims:
        dims[dims.index(-1)] = math.prod(input_shape) / math.prod(d for d in dims if d != -1)
    return tuple(dims)


def reshape_as_strings(input_shape, target):
    return tuple(str(d) for d in reshape_target(input_shape, target))


def reshape_every_minus_one(input_shape, target):  # -1 in the input's place, not once for the rest
    return tuple(input_shape[i] if d in (0, -1) and i < len(input_shape) else d for i, d in enumerate(target))


def reshape_ignores_zero(input_shape, target):  # 0 read as a zero-length axis
    dims = list(target)
    if -1 in dims:
        known = math.prod(d for d in dims if d not in (-1, 0)) or 1
        dims[dims.index(-1)] = math.prod(input_shape) // known
    return tuple(dims)


def reshape_total_not_rest(input_shape, target):  # -1 given every value, not those the others leave
    dims = [input_shape[i] if d == 0 else d for i, d in enumerate(target)]
    return tuple(math.prod(input_shape) if d == -1 else d for d in dims)


def sequential_to_graph(model):
    g = tf.Graph()
    with g.as_default():
        x = h = tf.placeholder((None, model[0].in_features), name="x")
        for layer in model:
            if isinstance(layer, nn.Linear):
                h = h @ tf.constant(layer.weight.data.T)
                if layer.bias is not None:
                    h = h + tf.constant(layer.bias.data)
            elif isinstance(layer, nn.ReLU):
                h = tf.relu(h)
            elif isinstance(layer, nn.Tanh):
                h = tf.tanh(h)
    return g, x, h


RIGHT = {"3.4.1": gemm, "3.4.2": reshape_target, "3.4.3": sequential_to_graph}


def sequential_with_variables(model):  # the weights as Variables, and the layers walked by index
    g = tf.Graph()
    with g.as_default():
        x = tf.placeholder((None, model[0].weight.shape[1]), name="x")
        h = x
        for k in range(len(model)):
            layer = model[k]
            kind = type(layer).__name__
            if kind == "Linear":
                h = tf.matmul(h, tf.Variable(layer.weight.data.T.copy()))
                h = h if layer.bias is None else tf.add(h, tf.Variable(layer.bias.data))
            elif kind in ("ReLU", "Tanh"):
                h = {"ReLU": tf.relu, "Tanh": tf.tanh}[kind](h)
    return g, x, h


ALTERNATIVES = [
    ("3.4.1", lambda a, b, c=None, alpha=1.0, beta=1.0, trans_a=False, trans_b=False:
        np.einsum("ik,kj->ij", a.T if trans_a else a, b.T if trans_b else b) * alpha + (0 if c is None else beta * c)),
    ("3.4.2", lambda shape, target: list(reshape_target(shape, target))),
    ("3.4.2", lambda shape, target: np.array(reshape_target(shape, target))),
    ("3.4.2", lambda shape, target: tuple(map(int, np.empty(shape).reshape(
        [shape[i] if d == 0 else d for i, d in enumerate(target)]).shape))),
    ("3.4.2", lambda shape, target: np.zeros(shape).reshape([s if t == 0 else t for s, t in zip(shape, target)]
                                                           + list(target[len(shape):])).shape),
    ("3.4.3", sequential_with_variables),
]


@pytest.mark.parametrize("exercise_id", sorted(RIGHT))
def test_right_answer_passes(exercise_id):
    result = check(exercise_id, RIGHT[exercise_id])
    assert result.status == "passed", result.message


@pytest.mark.parametrize("exercise_id,alternative", ALTERNATIVES)
def test_right_answers_in_another_form_pass(exercise_id, alternative):
    result = check(exercise_id, alternative)
    assert result.status == "passed", result.message


@pytest.mark.parametrize("exercise_id", sorted(RIGHT))
def test_stub_is_not_attempted(exercise_id):
    def stub(*args, **kwargs):
        raise NotImplementedError

    assert check(exercise_id, stub).status == "not attempted"


# ---- known-wrong answers ---------------------------------------------------------------------

def gemm_alpha_on_c_too(a, b, c=None, alpha=1.0, beta=1.0, trans_a=False, trans_b=False):
    y = (a.T if trans_a else a) @ (b.T if trans_b else b)
    return alpha * (y if c is None else y + beta * c)


def gemm_ignores_trans_b(a, b, c=None, alpha=1.0, beta=1.0, trans_a=False, trans_b=False):
    return gemm(a, b, c, alpha, beta, trans_a, False)


def gemm_ignores_beta(a, b, c=None, alpha=1.0, beta=1.0, trans_a=False, trans_b=False):
    return gemm(a, b, c, alpha, 1.0, trans_a, trans_b)


def gemm_needs_c(a, b, c=None, alpha=1.0, beta=1.0, trans_a=False, trans_b=False):
    return alpha * ((a.T if trans_a else a) @ (b.T if trans_b else b)) + beta * c


def gemm_in_place(a, b, c=None, alpha=1.0, beta=1.0, trans_a=False, trans_b=False):
    y = gemm(a, b, None, alpha, 1.0, trans_a, trans_b)
    if c is not None:
        c *= beta  # changes the caller's array
        y = y + c
    return y


def reshape_zero_is_zero(shape, target):  # the classic mistake: 0 read as a size of zero
    dims = list(target)
    if -1 in dims:
        known = math.prod(d for d in dims if d != -1) or 1
        dims[dims.index(-1)] = math.prod(shape) // known
    return tuple(dims)


def reshape_minus_one_before_zero(shape, target):  # -1 worked out with the 0s still in place
    dims = list(target)
    if -1 in dims:
        known = math.prod(d for d in dims if d not in (-1, 0))
        dims[dims.index(-1)] = math.prod(shape) // known
    return tuple(shape[i] if d == 0 else d for i, d in enumerate(dims))


def reshape_forgets_return(shape, target):
    reshape_target(shape, target)


def graph_without_transpose(model):
    g = tf.Graph()
    with g.as_default():
        x = h = tf.placeholder((None, model[0].in_features), name="x")
        for layer in model:
            if isinstance(layer, nn.Linear):
                w = layer.weight.data
                h = h @ tf.constant(w if w.shape[0] == w.shape[1] else w.T)  # transposes only when it must
                if layer.bias is not None:
                    h = h + tf.constant(layer.bias.data)
            elif isinstance(layer, (nn.ReLU, nn.Tanh)):
                h = {nn.ReLU: tf.relu, nn.Tanh: tf.tanh}[type(layer)](h)
    return g, x, h


def graph_without_bias(model):
    g = tf.Graph()
    with g.as_default():
        x = h = tf.placeholder((None, model[0].in_features), name="x")
        for layer in model:
            if isinstance(layer, nn.Linear):
                h = h @ tf.constant(layer.weight.data.T)
            elif isinstance(layer, (nn.ReLU, nn.Tanh)):
                h = {nn.ReLU: tf.relu, nn.Tanh: tf.tanh}[type(layer)](h)
    return g, x, h


def graph_only_linear(model):  # the activations forgotten
    g = tf.Graph()
    with g.as_default():
        x = h = tf.placeholder((None, model[0].in_features), name="x")
        for layer in model:
            if isinstance(layer, nn.Linear):
                h = h @ tf.constant(layer.weight.data.T)
                if layer.bias is not None:
                    h = h + tf.constant(layer.bias.data)
    return g, x, h


def graph_unnamed_input(model):
    g, x, h = sequential_to_graph(model)
    g2 = tf.Graph()
    with g2.as_default():
        tf.placeholder((None, 1), name="inputs")
    return g2, g2.get("inputs"), h


KNOWN_WRONG = {
    "3.4.1": [(gemm_alpha_on_c_too, ["alpha=0.5, beta=2.0", "expected"]),
              (gemm_ignores_trans_b, ["trans_b=True"]),
              (gemm_ignores_beta, ["alpha=0.5, beta=2.0"]),
              (gemm_needs_c, ["no C", "TypeError"]),
              (gemm_in_place, ["changed its inputs"])],
    "3.4.2": [(reshape_zero_is_zero, ["target (0, -1)", "expected (2, 12), got (0, 24)"]),
              (reshape_minus_one_before_zero, ["target (0, -1)", "expected (2, 12), got (2, 24)"]),
              (reshape_forgets_return, ["returned None"]),
              (reshape_with_true_division, ["every size must be an int, got 12.0 (float)", "np.reshape refuses it"]),
              (reshape_as_strings, ["every size must be an int", "(str)"]),
              (reshape_every_minus_one, ["expected (2, 12), got (2, 3)"]),
              (reshape_ignores_zero, ["target (0, -1)", "expected (2, 12), got (0, 24)"]),
              (reshape_total_not_rest, ["expected (2, 12), got (2, 24)"])],
    "3.4.3": [(graph_without_transpose, ["Linear(3, 3), Tanh"]),
              (graph_without_bias, ["Linear(5, 3)", "output"]),
              (graph_only_linear, ["ReLU, Linear(6, 2)"]),
              (graph_unnamed_input, ["placeholder named 'x'"])],
}


@pytest.mark.parametrize("exercise_id,wrong,words", known_wrong.cases(KNOWN_WRONG))
def test_known_wrong_answer_fails_saying_why(exercise_id, wrong, words):
    known_wrong.assert_fails_saying(exercise_id, wrong, words)
