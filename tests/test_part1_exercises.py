"""Each part-1 exercise: a stub is "not attempted", a wrong answer "failed" naming the input, a right one "passed"."""

import math

import numpy as np
import pytest

from course.exercises import check

import known_wrong  # tests/known_wrong.py

pytestmark = pytest.mark.part1


def stub(*args, **kwargs):
    raise NotImplementedError


# ---- right answers ----

def numerical_derivative(f, x, h=1e-6):
    return (f(x + h) - f(x - h)) / (2 * h)


def numerical_gradient(f, xs, h=1e-6):
    grads = []
    for i in range(len(xs)):
        up, down = list(xs), list(xs)
        up[i] += h
        down[i] -= h
        grads.append((f(up) - f(down)) / (2 * h))
    return grads


def derivative_of_composition(df, g, dg):
    return lambda x: df(g(x)) * dg(x)


def dL_dx(x):
    t = math.tanh(2 * x - 1)
    return 2 * t * (1 - t * t) * 2


def exp_backward(x, out_grad):
    return math.exp(x) * out_grad


def pow_backward(a, b, out_grad):
    return b * a ** (b - 1) * out_grad, a ** b * math.log(a) * out_grad


def tanh_from_exp(x):
    e = (2 * x).exp()
    return (e - 1) / (e + 1)


def topological_order(root):
    order, seen, stack = [], set(), [(root, False)]
    while stack:
        node, done = stack.pop()
        if done:
            order.append(node)
        elif id(node) not in seen:
            seen.add(id(node))
            stack.append((node, True))
            stack.extend((c, False) for c in node._prev)
    return order


def kahn_order(root):
    # Exercise 1.2.4 as the lesson asks: count the uses, emit from the root, reverse.
    uses, seen, stack = {}, {id(root)}, [root]
    while stack:
        node = stack.pop()
        for c in node._prev:
            uses[id(c)] = uses.get(id(c), 0) + 1
            if id(c) not in seen:
                seen.add(id(c))
                stack.append(c)
    order, ready = [], [root]
    while ready:
        node = ready.pop()
        order.append(node)
        for c in node._prev:
            uses[id(c)] -= 1
            if uses[id(c)] == 0:
                ready.append(c)
    return order[::-1]


def hinge_loss(scores, labels):
    return sum((1 - y * s).relu() for s, y in zip(scores, labels)) * (1 / len(scores))


def accuracy(scores, labels):
    return sum((s.data > 0) == (y > 0) for s, y in zip(scores, labels)) / len(labels)


def l2_penalty(params, alpha):
    return alpha * sum(p * p for p in params)


def sgd_step(params, lr):
    for p in params:
        p.data -= lr * p.grad


def mse_loss(preds, targets):
    return sum((p - t) ** 2 for p, t in zip(preds, targets)) * (1 / len(preds))


# ---- wrong answers (each a typical mistake) ----

def forward_difference(f, x, h=1e-6):
    return (f(x + h) - f(x)) / h


def recursive_order(root):
    order, seen = [], set()

    def visit(v):
        if id(v) not in seen:
            seen.add(id(v))
            for c in v._prev:
                visit(c)
            order.append(v)

    visit(root)
    return order


RIGHT_WRONG = {
    "1.1.1": (numerical_derivative, forward_difference, "t**3 at x="),
    "1.1.2": (numerical_gradient, lambda f, xs, h=1e-6: [0.0] * len(xs), "at [1, 2, 3]"),
    "1.1.3": (derivative_of_composition, lambda df, g, dg: (lambda x: df(x) * dg(x)), "at x="),
    "1.1.4": (dL_dx, lambda x: 2 * math.tanh(2 * x - 1) * (1 - math.tanh(2 * x - 1) ** 2), "at x="),
    "1.2.1": (exp_backward, lambda x, g: math.exp(x), "out_grad="),
    "1.2.2": (pow_backward, lambda a, b, g: (b * a ** (b - 1) * g, a ** b * g), "a=2, b=3"),
    "1.2.3": (tanh_from_exp, lambda x: x.tanh(), "without calling course.micrograd.Value.tanh"),
    "1.2.4": (kahn_order, recursive_order, "a chain of 20,000"),
    "1.3.1": (hinge_loss, lambda s, y: sum((1 - yi * si).relu() for si, yi in zip(s, y)), "scores ["),
    "1.3.2": (accuracy, lambda s, y: sum(si.data > 0 for si in s) / len(y), "scores ["),
    "1.3.3": (l2_penalty, lambda ps, a: a * sum(abs(p.data) for p in ps), "params ["),
    "1.3.4": (sgd_step, lambda ps, lr: [setattr(p, "data", p.data + lr * p.grad) for p in ps], "params ["),
    "1.3.5": (mse_loss, lambda p, t: sum((pi - ti) ** 2 for pi, ti in zip(p, t)), "predictions ["),
}


# ---- more known-wrong answers: each with the words its failure message must contain ----

def _library_gradient(f, xs, h=1e-6):  # calls the course's own finite differences
    import numpy as np
    from course.tensor import numerical_gradient

    arr = np.array(xs, dtype=float)
    return list(numerical_gradient(lambda a: f(list(a)), [arr], 0, eps=h))


def _dL_dx_by_autograd(x):  # lets Value.backward apply the chain rule
    from course.micrograd import Value

    v = Value(x)
    ((2 * v - 1).tanh() ** 2).backward()
    return v.grad


def _exp_backward_by_autograd(x, out_grad):
    from course.micrograd import Value

    v = Value(x)
    (v.exp() * out_grad).backward()
    return v.grad


def _pow_backward_by_autograd(a, b, out_grad):
    from course.micrograd import Value

    va, vb = Value(a), Value(b)
    (va ** vb * out_grad).backward()
    return va.grad, vb.grad


def _gradient_ignoring_h(f, xs, h=1e-6):
    return numerical_gradient(f, xs)  # always the default step


def _gradient_forward_difference(f, xs, h=1e-6):
    base = f(xs)
    grads = []
    for i in range(len(xs)):
        up = list(xs)
        up[i] += h
        grads.append((f(up) - base) / h)
    return grads


def _gradient_mutating_xs(f, xs, h=1e-6):  # nudges xs itself and never puts it back
    grads = []
    for i in range(len(xs)):
        xs[i] += h
        up = f(xs)
        xs[i] -= 2 * h
        grads.append((up - f(xs)) / (2 * h))
    return grads


def _library_order(root):
    from course.micrograd import topological_order as library_order

    return library_order(root)


def _library_order_itself():
    from course.micrograd import topological_order as library_order

    return library_order


KNOWN_WRONG = {exercise_id: [(wrong, [names])] for exercise_id, (_, wrong, names) in RIGHT_WRONG.items()}
for exercise_id, wrong, words in [
    ("1.1.1", lambda f, x, h=1e-6: numerical_derivative(f, x), ["with h=0.01", "central difference"]),
    ("1.1.1", lambda f, x, h=1e-6: float(_library_gradient(lambda v: f(v[0]), [x], h)[0]),
     ["write this yourself", "course.tensor.gradcheck.numerical_gradient"]),
    ("1.1.2", _gradient_ignoring_h, ["with h=0.1", "central differences"]),
    ("1.1.2", _gradient_forward_difference, ["with h=0.1"]),
    ("1.1.2", _gradient_mutating_xs, ["changed the list xs"]),
    ("1.1.2", lambda f, xs, h=1e-6: 0.5, ["expected a list of 3 partial derivatives", "float"]),
    ("1.1.2", _library_gradient, ["write this yourself", "numerical_gradient"]),
    ("1.1.4", _dL_dx_by_autograd, ["write this yourself", "course.micrograd.Value.backward"]),
    ("1.2.1", _exp_backward_by_autograd, ["write this yourself", "Value.backward"]),
    ("1.2.2", _pow_backward_by_autograd, ["write this yourself", "Value.backward"]),
    ("1.2.2", lambda a, b, g: {"a": 1.0, "b": 2.0}, ["expected a pair (grad_a, grad_b)", "dict"]),
    ("1.2.2", lambda a, b, g: {1.0, 2.0}, ["expected a pair (grad_a, grad_b)", "set"]),
    ("1.2.3", lambda x: 2 * (2 * x).sigmoid() - 1, ["without calling course.micrograd.Value.sigmoid"]),
    ("1.2.3", lambda x: 2 / (1 + (-2 * x).exp()) - 1 + 0 * x.relu(), ["uses relu", "x.exp() and arithmetic"]),
    ("1.2.4", _library_order, ["write this yourself", "course.micrograd.topological_order"]),
    ("1.2.4", _library_order_itself(), ["library's own function"]),
    ("1.3.3", lambda ps, a: a * sum(p.data ** 2 for p in ps), ["expected a Value"]),
    ("1.3.2", lambda s, y: sum((si.data >= 0) == (yi > 0) for si, yi in zip(s, y)) / len(y),
     ["a score of 0 counted as positive"]),
    ("1.3.4", lambda ps, lr: [setattr(p, "data", p.data - lr * p.grad) or setattr(p, "grad", 0.0) for p in ps],
     ["should not change them"]),
]:
    KNOWN_WRONG[exercise_id].append((wrong, words))


@pytest.mark.parametrize("exercise_id,wrong,words", known_wrong.cases(KNOWN_WRONG))
def test_known_wrong_answer_fails_saying_why(exercise_id, wrong, words):
    known_wrong.assert_fails_saying(exercise_id, wrong, words)


def _dL_dx_in_float32(x):
    t = np.tanh(np.float32(2) * np.float32(x) - np.float32(1))  # float32 throughout
    return 4 * t * (1 - t * t)


@pytest.mark.parametrize("exercise_id,right", [
    ("1.1.4", lambda x: float(2 * np.float32(math.tanh(2 * x - 1)) * (1 - np.float32(math.tanh(2 * x - 1)) ** 2) * 2)),
    ("1.2.1", lambda x, g: np.float32(math.exp(x)) * np.float32(g)),
    ("1.2.2", lambda a, b, g: tuple(np.float32(v) for v in pow_backward(a, b, g))),
    ("1.1.4", _dL_dx_in_float32),
], ids=["1.1.4-float32", "1.2.1-float32", "1.2.2-float32", "1.1.4-all-float32"])
def test_float32_answers_pass(exercise_id, right):
    result = check(exercise_id, right)
    assert result.status == "passed", result.message


def test_a_near_miss_shows_enough_digits_and_the_relative_error():
    result = check("1.2.1", lambda x, g: math.exp(x) * g * (1 + 1e-4))
    assert "relative error 1.0e-04" in result.message, result.message


def test_library_function_is_available_again_after_the_check():
    from course.micrograd import Value, topological_order as library_order

    check("1.2.4", _library_order)
    a = Value(2.0)
    b = a * a
    assert library_order(b)[-1] is b
    b.backward()
    assert a.grad == 4.0


@pytest.mark.parametrize("exercise_id", sorted(RIGHT_WRONG))
def test_stub_is_not_attempted(exercise_id, capsys):
    result = check(exercise_id, stub)
    assert result.status == "not attempted"
    assert "not attempted" in capsys.readouterr().out


@pytest.mark.parametrize("exercise_id", sorted(RIGHT_WRONG))
def test_right_answer_passes(exercise_id):
    result = check(exercise_id, RIGHT_WRONG[exercise_id][0])
    assert result.status == "passed", result.message


@pytest.mark.parametrize("exercise_id", sorted(RIGHT_WRONG))
def test_wrong_answer_fails_naming_the_input(exercise_id):
    _, wrong, names = RIGHT_WRONG[exercise_id]
    result = check(exercise_id, wrong)
    assert result.status == "failed"
    assert result.message.startswith(f"[{exercise_id}] failed:")
    assert names in result.message, result.message
    assert "Hint:" in result.message


def test_every_part1_exercise_is_tested_here():
    from course.exercises import registered_ids

    assert sorted(i for i in registered_ids() if i.startswith("1.")) == sorted(RIGHT_WRONG)


# ---- correct alternatives are accepted; typical mistakes get a message that says what is wrong ----

def test_a_depth_first_order_also_passes_1_2_4():
    # as the statement says: any valid order passes, the lesson's own depth-first search included;
    # only the library's function is refused (KNOWN_WRONG)
    assert check("1.2.4", topological_order).status == "passed"


def test_pow_backward_may_return_any_pair():
    np = pytest.importorskip("numpy")
    assert check("1.2.2", lambda a, b, g: [b * a ** (b - 1) * g, a ** b * math.log(a) * g]).status == "passed"
    assert check("1.2.2", lambda a, b, g: np.array(pow_backward(a, b, g))).status == "passed"


@pytest.mark.parametrize("solution", [
    lambda x: (x.exp() - (-x).exp()) / (x.exp() + (-x).exp()),
    lambda x: 2 / (1 + (-2 * x).exp()) - 1,
    lambda x: 1 - 2 / ((2 * x).exp() + 1),
])
def test_other_forms_of_tanh_pass(solution):
    assert check("1.2.3", solution).status == "passed"


def test_tanh_from_exp_names_a_wrong_formula_by_its_value():
    # tanh(x/2) agrees with tanh(x) at x = 0: the values at every point are checked before gradients.
    result = check("1.2.3", lambda x: (x.exp() - 1) / (x.exp() + 1))
    assert result.status == "failed" and "expected value" in result.message, result.message


def test_tanh_from_exp_says_when_the_graph_does_not_reach_x():
    from course.micrograd import Value

    result = check("1.2.3", lambda x: Value(math.tanh(x.data)))
    assert result.status == "failed" and "not computed from x" in result.message, result.message


def test_sgd_step_that_zeroes_the_grads_is_told_so():
    def step_and_zero(ps, lr):
        for p in ps:
            p.data -= lr * p.grad
            p.grad = 0.0

    result = check("1.3.4", step_and_zero)
    assert result.status == "failed" and "should not change them" in result.message
