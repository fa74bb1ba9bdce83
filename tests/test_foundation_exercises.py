"""The exercise checker: one line for each outcome, and a result for grading."""

import pytest

from course.exercises import CheckFailed, call, check, exercise, expect, expect_close
from course.exercises._core import registered_ids

pytestmark = pytest.mark.foundation


@exercise("0.9.1", hint="square the input")
def _check_square(candidate, rng):
    for x in [0.0, 2.0, -3.0, *rng.uniform(-5, 5, size=3)]:
        got = call(candidate, x, on=f"x={x:.3g}")
        expect_close(got, x * x, on=f"x={x:.3g}")


@exercise("0.9.2")
def _check_positive(candidate, rng):
    expect(call(candidate) > 0, "the answer should be positive")


def test_a_stub_is_not_attempted(capsys):
    def stub(x):
        raise NotImplementedError

    result = check("0.9.1", stub)
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    assert result.status == "not attempted"
    assert "not attempted yet" in out and "[0.9.1]" in out


def test_a_wrong_answer_fails_naming_the_input(capsys):
    result = check("0.9.1", lambda x: 2 * x)
    out = capsys.readouterr().out.strip()
    assert result.status == "failed" and not result.passed
    # x=0 and x=2 pass by luck (2x == x*x there); x=-3 is the first input that shows the mistake.
    assert "on x=-3" in out and "expected result 9" in out and "got -6" in out
    assert "Hint: square the input" in out
    assert out.count("\n") == 0


def test_an_exception_in_the_candidate_fails_naming_the_input(capsys):
    result = check("0.9.1", lambda x: 1 / (x - 2.0) if x == 2.0 else x * x)
    out = capsys.readouterr().out
    assert result.status == "failed"
    assert "ZeroDivisionError" in out and "x=2" in out


def test_a_right_answer_passes(capsys):
    result = check("0.9.1", lambda x: x * x)
    assert result.passed
    assert capsys.readouterr().out == "[0.9.1] passed.\n"


def test_expect_fails_with_its_message(capsys):
    assert check("0.9.2", lambda: -1).status == "failed"
    assert "should be positive" in capsys.readouterr().out


def test_shapes_are_compared():
    with pytest.raises(CheckFailed, match=r"shape \(2,\), expected shape \(3,\)"):
        expect_close([1, 2], [1, 2, 3])


def test_an_unknown_id_is_a_clear_error():
    with pytest.raises(KeyError, match="no exercise"):
        check("0.9.99", lambda: None)


def test_every_part_module_loads():
    ids = registered_ids()
    assert ids == sorted(set(ids), key=lambda s: [int(p) for p in s.split(".")])
