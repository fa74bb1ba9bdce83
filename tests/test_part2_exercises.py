"""The checks of part 2: a stub is not attempted, a wrong answer fails naming the input, a right
answer passes."""

import math

import numpy as np
import pytest

from course.exercises import check

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

    assert sorted(i for i in registered_ids() if i.startswith("2.")) == sorted(CASES)
