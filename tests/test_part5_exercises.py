"""The checks of part 5: a stub is not attempted, a wrong answer fails naming the input and what to
fix, a right answer passes."""

import numpy as np
import pytest

from course.exercises import check

pytestmark = pytest.mark.part5


def stub(*args, **kwargs):
    raise NotImplementedError


def forgot_return(*args, **kwargs):
    pass


# ---- 5.1 right answers -------------------------------------------------------------------------------


def discretize_zoh(A, B, delta):
    A_bar = np.exp(delta * A)
    return A_bar, (A_bar - 1) / (delta * A) * (delta * B)


def discretize_mamba(delta, A, B, u):
    return np.exp(delta[..., None] * A), np.einsum("bld,bln->bldn", delta * u, B)


def ssm_kernel(A_bar, B_bar, C, L):
    return (A_bar[None, :] ** np.arange(L)[:, None]) @ (C * B_bar)


def ssm_recurrence(A_bar, B_bar, C, D, u):
    x, y = np.zeros_like(A_bar), []
    for u_k in u:
        x = A_bar * x + B_bar * u_k
        y.append(C @ x + D * u_k)
    return y  # a list is fine


# ---- 5.1 wrong answers -------------------------------------------------------------------------------


def zoh_simple_b(A, B, delta):
    return np.exp(delta * A), delta * B


def mamba_with_zoh(delta, A, B, u):
    deltaA, deltaB_u = discretize_mamba(delta, A, B, u)
    dA = delta[..., None] * A
    return deltaA, deltaB_u * np.expm1(dA) / dA


def kernel_from_one(A_bar, B_bar, C, L):
    return (A_bar[None, :] ** np.arange(1, L + 1)[:, None]) @ (C * B_bar)


def recurrence_reads_old_state(A_bar, B_bar, C, D, u):
    x, y = np.zeros_like(A_bar), []
    for u_k in u:
        y.append(C @ x + D * u_k)
        x = A_bar * x + B_bar * u_k
    return np.array(y)


def recurrence_without_d(A_bar, B_bar, C, D, u):
    return np.array(ssm_recurrence(A_bar, B_bar, C, 0.0, u))


CASES = [
    ("5.1.1", discretize_zoh, zoh_simple_b, "simple rule"),
    ("5.1.2", discretize_mamba, mamba_with_zoh, "zero-order-hold factor"),
    ("5.1.3", ssm_kernel, kernel_from_one, "starts at A_bar**1"),
    ("5.1.4", ssm_recurrence, recurrence_reads_old_state, "before the update"),
]


@pytest.mark.parametrize("exercise_id,right,wrong,named", CASES, ids=[c[0] for c in CASES])
def test_stub_wrong_right(exercise_id, right, wrong, named, capsys):
    assert check(exercise_id, stub).status == "not attempted"
    failed = check(exercise_id, wrong)
    assert failed.status == "failed"
    assert named in failed.message
    forgot = check(exercise_id, forgot_return)
    assert forgot.status == "failed" and "forget `return`" in forgot.message
    assert check(exercise_id, right).status == "passed"
    assert capsys.readouterr().out.strip().splitlines()[-1] == f"[{exercise_id}] passed."


@pytest.mark.parametrize("exercise_id,candidate,named", [
    ("5.1.4", recurrence_without_d, "skip term"),
    ("5.1.2", lambda delta, A, B, u: (delta[..., None] * A, discretize_mamba(delta, A, B, u)[1]), "deltaA"),
], ids=["5.1.4-no-D", "5.1.2-no-exp"])
def test_near_misses_fail(exercise_id, candidate, named):
    result = check(exercise_id, candidate)
    assert result.status == "failed" and named in result.message, result.message


@pytest.mark.parametrize("exercise_id,candidate", [
    ("5.1.1", lambda A, B, d: tuple(np.float32(v) for v in discretize_zoh(A, B, d))),
    ("5.1.3", lambda A_bar, B_bar, C, L: list(ssm_kernel(A_bar, B_bar, C, L))),
], ids=["5.1.1-float32", "5.1.3-list"])
def test_other_right_answers_pass(exercise_id, candidate):
    assert check(exercise_id, candidate).status == "passed"
