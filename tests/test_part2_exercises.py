"""The checks of part 2: a stub is not attempted, a wrong answer fails naming the input, a right
answer passes."""

import math

import numpy as np
import pytest

from course.exercises import check

import known_wrong  # tests/known_wrong.py

pytestmark = pytest.mark.part2


def stub(*args, **kwargs):
    raise NotImplementedError


# ----- right answers ---------------------------------------------------------------------------


def mean_backward(x_shape, axis, g):
    axes = tuple(range(len(x_shape))) if axis is None else np.atleast_1d(axis).tolist()
    count = np.prod([x_shape[a] for a in axes])
    return np.broadcast_to(np.expand_dims(g, tuple(axes)), x_shape) / count


def max_backward(x, axis, g):
    mask = (x == x.max(axis=axis, keepdims=True)).astype(x.dtype)
    return mask / mask.sum(axis=axis, keepdims=True) * np.expand_dims(g, axis)


def matmul_backward(A, B, G):
    return G @ np.swapaxes(B, -1, -2), np.swapaxes(A, -1, -2) @ G


def momentum_step(p, grad, velocity, lr, momentum):
    velocity = momentum * velocity + grad
    return p - lr * velocity, velocity


def adam_step(p, grad, m, v, t, lr, beta1, beta2, eps):
    m = beta1 * m + (1 - beta1) * grad
    v = beta2 * v + (1 - beta2) * grad ** 2
    m_hat, v_hat = m / (1 - beta1 ** t), v / (1 - beta2 ** t)
    return p - lr * m_hat / (np.sqrt(v_hat) + eps), m, v


def clip_grad_norm(grads, max_norm):
    norm = math.sqrt(sum(float((g ** 2).sum()) for g in grads))
    scale = min(1.0, max_norm / norm)
    return [g * scale for g in grads], norm


def warmup_cosine(step, warmup_steps, total_steps, min_ratio):
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if step >= total_steps:
        return min_ratio
    progress = (step - warmup_steps) / (total_steps - warmup_steps)
    return min_ratio + (1 - min_ratio) * (1 + math.cos(math.pi * progress)) / 2


def softmax_backward(s, g):
    return s * (g - (g * s).sum(axis=-1, keepdims=True))


def cross_entropy(logits, targets):
    shifted = logits - logits.max(axis=1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    return -logp[np.arange(len(targets)), targets].mean()


def confusion_matrix(y_true, y_pred, n_classes):
    m = np.zeros((n_classes, n_classes), dtype=int)
    np.add.at(m, (y_true, y_pred), 1)
    return m


def dropout(x, p, rng):
    return x * (rng.random(x.shape) >= p) / (1 - p)


# ----- wrong answers: each a mistake a learner might make -----------------------------------------


def mean_backward_wrong(x_shape, axis, g):  # forgets to divide by the count
    axes = tuple(range(len(x_shape))) if axis is None else np.atleast_1d(axis).tolist()
    return np.broadcast_to(np.expand_dims(g, tuple(axes)), x_shape)


def max_backward_wrong(x, axis, g):  # sends the gradient everywhere
    return np.broadcast_to(np.expand_dims(g, axis), x.shape).copy()


def matmul_backward_wrong(A, B, G):  # transposes the wrong factor
    return G @ B, A @ G


def momentum_step_wrong(p, grad, velocity, lr, momentum):  # ignores the velocity
    return p - lr * grad, velocity


def adam_step_wrong(p, grad, m, v, t, lr, beta1, beta2, eps):  # no bias correction
    m = beta1 * m + (1 - beta1) * grad
    v = beta2 * v + (1 - beta2) * grad ** 2
    return p - lr * m / (np.sqrt(v) + eps), m, v


def clip_grad_norm_wrong(grads, max_norm):  # clips each gradient on its own
    out = [g * min(1.0, max_norm / np.linalg.norm(g)) for g in grads]
    return out, math.sqrt(sum(float((g ** 2).sum()) for g in grads))


def warmup_cosine_wrong(step, warmup_steps, total_steps, min_ratio):  # forgets min_ratio
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / (total_steps - warmup_steps))
    return (1 + math.cos(math.pi * progress)) / 2


def softmax_backward_wrong(s, g):  # only the diagonal of the Jacobian
    return s * (1 - s) * g


def cross_entropy_wrong(logits, targets):  # not stable: overflows on large logits
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        p = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
        return -np.log(p[np.arange(len(targets)), targets]).mean()


def confusion_matrix_wrong(y_true, y_pred, n_classes):  # rows and columns swapped
    return confusion_matrix(y_pred, y_true, n_classes)


def dropout_wrong(x, p, rng):  # forgets to scale the kept elements
    return x * (rng.random(x.shape) >= p)


CASES = {
    "2.1.1": (mean_backward, mean_backward_wrong, "x of shape"),
    "2.1.2": (max_backward, max_backward_wrong, "axis="),
    "2.1.3": (matmul_backward, matmul_backward_wrong, "A of shape"),
    "2.2.1": (momentum_step, momentum_step_wrong, "momentum="),
    "2.2.2": (adam_step, adam_step_wrong, "step t="),
    "2.2.3": (clip_grad_norm, clip_grad_norm_wrong, "max_norm="),
    "2.2.4": (warmup_cosine, warmup_cosine_wrong, "min_ratio="),
    "2.3.1": (softmax_backward, softmax_backward_wrong, "softmax(x)"),
    "2.3.2": (cross_entropy, cross_entropy_wrong, "largest |logit| 1e+04"),
    "2.3.3": (confusion_matrix, confusion_matrix_wrong, "y_true="),
    "2.3.4": (dropout, dropout_wrong, "p=0.1"),
}


# ----- more known-wrong answers: calling the library the exercise asks for, ignoring an argument ---


def mean_backward_negative_axes_kept(x_shape, axis, g):
    """Puts the averaged axes back one at a time, without first turning -1 into ndim - 1."""
    axes = tuple(range(len(x_shape))) if axis is None else (axis if isinstance(axis, tuple) else (axis,))
    for a in sorted(axes):
        g = np.expand_dims(g, a)
    return np.broadcast_to(g, x_shape) / math.prod(x_shape[a] for a in axes)


def mean_backward_by_autograd(x_shape, axis, g):
    from course.tensor import Tensor

    x = Tensor(np.zeros(x_shape), requires_grad=True)
    x.mean(axis=axis).backward(g)
    return x.grad


def max_backward_by_autograd(x, axis, g):
    from course.tensor import Tensor

    t = Tensor(x, requires_grad=True)
    t.max(axis=axis).backward(g)
    return t.grad


def matmul_backward_by_autograd(A, B, G):
    from course.tensor import Tensor

    a, b = Tensor(A, requires_grad=True), Tensor(B, requires_grad=True)
    (a @ b).backward(G)
    return a.grad, b.grad


def momentum_by_library(p, grad, velocity, lr, momentum):
    import course.nn as nn
    import course.optim as optim

    param = nn.Parameter(p.copy())
    opt = optim.SGD([param], lr=lr, momentum=momentum)
    param.grad = grad
    opt.step()
    return param.data, grad


def adam_by_library(p, grad, m, v, t, lr, beta1, beta2, eps):
    import course.nn as nn
    import course.optim as optim

    param = nn.Parameter(p.copy())
    optim.Adam([param], lr=lr, betas=(beta1, beta2), eps=eps)
    return p, m, v


def clip_by_library(grads, max_norm):
    import course.nn as nn
    import course.optim as optim

    params = [nn.Parameter(g.copy()) for g in grads]
    for prm, g in zip(params, grads):
        prm.grad = g.copy()
    norm = optim.clip_grad_norm_(params, max_norm)
    return [prm.grad for prm in params], norm


def warmup_cosine_by_library(step, warmup_steps, total_steps, min_ratio):
    import course.optim as optim

    return optim.warmup_cosine(step, warmup_steps, total_steps, min_ratio)


def softmax_backward_by_autograd(s, g):
    import course.tensor.functional as F
    from course.tensor import Tensor

    x = Tensor(np.log(s), requires_grad=True)
    F.softmax(x).backward(g)
    return x.grad


def cross_entropy_by_library(logits, targets):
    import course.tensor.functional as F
    from course.tensor import Tensor

    return float(F.cross_entropy(Tensor(logits), targets).data)


def cross_entropy_by_log_softmax(logits, targets):
    import course.tensor.functional as F
    from course.tensor import Tensor

    logp = F.log_softmax(Tensor(logits)).data
    return -logp[np.arange(len(targets)), targets].mean()


def dropout_ignoring_x(x, p, rng):
    return (rng.random(x.shape) >= p) / (1 - p)


def dropout_own_generator(x, p, rng):
    return dropout(x, p, np.random.default_rng(1234))


def dropout_global_random(x, p, rng):
    return x * (np.random.random(x.shape) >= p) / (1 - p)


def dropout_not_random(x, p, rng):  # zeroes the first p of the elements
    keep = np.arange(x.size).reshape(x.shape) >= p * x.size
    return x * keep / (1 - p)


def dropout_by_library(x, p, rng):
    import course.tensor.functional as F
    from course.tensor import Tensor

    return F.dropout(Tensor(x), p).data


def _library_warmup_cosine():
    import course.optim as optim

    return optim.warmup_cosine


KNOWN_WRONG = {exercise_id: [(wrong, [where])] for exercise_id, (_, wrong, where) in CASES.items()}
for exercise_id, wrong, words in [
    ("2.1.1", mean_backward_by_autograd, ["write this yourself", "course.tensor.Tensor.backward"]),
    ("2.1.2", max_backward_by_autograd, ["write this yourself", "course.tensor.Tensor.backward"]),
    ("2.1.3", matmul_backward_by_autograd, ["write this yourself", "course.tensor.Tensor.backward"]),
    ("2.2.1", momentum_by_library, ["write this yourself", "course.optim.SGD"]),
    ("2.2.2", adam_by_library, ["write this yourself", "course.optim.Adam"]),
    ("2.2.2", lambda p, grad, m, v, t, lr, beta1, beta2, eps: adam_step(p, grad, m, v, t, lr, beta1, beta2, 1e-8),
     ["eps=0.5"]),
    ("2.2.3", clip_by_library, ["write this yourself", "course.optim.clip_grad_norm_"]),
    ("2.2.4", warmup_cosine_by_library, ["write this yourself", "course.optim.warmup_cosine"]),
    ("2.2.4", _library_warmup_cosine(), ["library's own function"]),
    ("2.3.1", softmax_backward_by_autograd, ["write this yourself", "course.tensor.Tensor.backward"]),
    ("2.3.2", cross_entropy_by_library, ["write this yourself", "course.tensor.functional.cross_entropy"]),
    ("2.3.2", cross_entropy_by_log_softmax, ["write this yourself", "course.tensor.functional.log_softmax"]),
    ("2.3.2", lambda logits, targets: np.zeros(len(targets)), ["the loss", "has shape (1,), expected shape ()"]),
    ("2.3.4", dropout_ignoring_x, ["x / (1 - p)"]),
    ("2.3.4", dropout_own_generator, ["seeded differently", "the rng you are given"]),
    ("2.3.4", dropout_global_random, ["seeded alike", "the rng you are given"]),
    ("2.3.4", dropout_not_random, ["not spread at random"]),
    ("2.3.4", dropout_by_library, ["write this yourself", "course.tensor.functional.dropout"]),
    ("2.1.1", mean_backward_negative_axes_kept, ["axis=(-2, -1)"]),
]:
    KNOWN_WRONG[exercise_id].append((wrong, words))


@pytest.mark.parametrize("exercise_id,wrong,words", known_wrong.cases(KNOWN_WRONG))
def test_known_wrong_answer_fails_saying_why(exercise_id, wrong, words):
    known_wrong.assert_fails_saying(exercise_id, wrong, words)


def test_the_library_is_back_after_the_check():
    import course.optim as optim
    from course.tensor import Tensor

    check("2.2.4", warmup_cosine_by_library)
    check("2.1.1", mean_backward_by_autograd)
    assert optim.warmup_cosine(0, 4, 10) == 0.25
    x = Tensor(np.ones(3), requires_grad=True)
    x.mean().backward()
    assert np.allclose(x.grad, 1 / 3)


def test_library_functions_that_the_exercise_does_not_ask_for_still_work():
    # softmax's own backward is off in 2.3.1, but its forward is not what the exercise asks for
    import course.tensor.functional as F
    from course.tensor import Tensor

    def through_the_library_forward(s, g):
        again = F.softmax(Tensor(np.log(s))).data
        return again * (g - (g * again).sum(axis=-1, keepdims=True))

    assert check("2.3.1", through_the_library_forward).status == "passed"


@pytest.mark.parametrize("exercise_id", sorted(CASES))
def test_stub_is_not_attempted(exercise_id, capsys):
    result = check(exercise_id, stub)
    assert result.status == "not attempted"
    assert "not attempted" in capsys.readouterr().out


@pytest.mark.parametrize("exercise_id", sorted(CASES))
def test_wrong_answer_fails_naming_the_input(exercise_id):
    _, wrong, where = CASES[exercise_id]
    result = check(exercise_id, wrong)
    assert result.status == "failed", result.message
    assert where in result.message, result.message
    assert "Hint:" in result.message


@pytest.mark.parametrize("exercise_id", sorted(CASES))
def test_right_answer_passes(exercise_id, capsys):
    right, _, _ = CASES[exercise_id]
    result = check(exercise_id, right)
    assert result.status == "passed", result.message
    assert capsys.readouterr().out.strip() == f"[{exercise_id}] passed."


def test_an_exception_in_the_learners_code_names_the_input():
    def broken(x_shape, axis, g):
        raise ValueError("oops")

    result = check("2.1.1", broken)
    assert result.status == "failed"
    assert "ValueError: oops" in result.message and "x of shape" in result.message


def test_every_part2_exercise_is_tested():
    from course.exercises import registered_ids

    modules = {"2.2.5", "2.2.6"}  # tested in test_part2_exercises_modules.py
    assert sorted(i for i in registered_ids() if i.startswith("2.") and i not in modules) == sorted(CASES)
