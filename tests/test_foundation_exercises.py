"""The exercise checker: one line for each outcome, and a result for grading."""

import numpy as np
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


# ---- hints: a nudge first, the full answer only after repeated failures --------------------------

@exercise("0.9.3", hint="think about squares", answer_hint="return x * x")
def _check_square_again(candidate, rng):
    expect_close(call(candidate, 3.0, on="x=3"), 9.0, on="x=3")


def test_the_full_answer_comes_only_after_repeated_failures():
    from course.exercises._core import ANSWER_AFTER

    check("0.9.3", lambda x: x * x)  # a pass starts the count again
    same = [check("0.9.3", lambda x: 2 * x).message for _ in range(ANSWER_AFTER + 1)]
    assert not any("x * x" in m for m in same)  # the same wrong code run again is no new try
    tries = [lambda x: 4 * x, lambda x: x + x + 1, lambda x: x ** 3][:ANSWER_AFTER - 1]
    messages = same[:1] + [check("0.9.3", wrong).message for wrong in tries]
    for early in messages[:-1]:
        assert "Hint: think about squares." in early and "x * x" not in early
    assert "In full: return x * x" in messages[-1]
    assert check("0.9.3", lambda x: x * x).passed
    assert "x * x" not in check("0.9.3", lambda x: 2 * x).message


# ---- what a learner's value cannot do: crash a check, or hide a forgotten return ------------------

@exercise("0.9.4", hint="return the pair (x, 2x)")
def _check_pair(candidate, rng):
    got = call(candidate, 2.0, on="x=2")
    a, b = got  # unpacking a float, a dict or a set trips here
    expect_close([a, b], [2.0, 4.0], on="x=2")


@pytest.mark.parametrize("value, kind", [(0.5, "a float"), ({"a": 1}, "a dict"), ({1, 2, 3}, "a set")])
def test_an_exception_inside_a_check_is_a_failure_naming_the_value(value, kind, monkeypatch, capsys):
    from course.exercises._core import DEBUG_ENV

    monkeypatch.delenv(DEBUG_ENV, raising=False)
    result = check("0.9.4", lambda x: value)
    assert result.status == "failed"
    assert f"your function returned {kind}" in result.message and "could not use" in result.message
    assert capsys.readouterr().out.count("\n") == 1


def test_the_debug_variable_shows_the_checks_own_exception(monkeypatch):
    from course.exercises._core import DEBUG_ENV

    monkeypatch.setenv(DEBUG_ENV, "1")
    with pytest.raises(TypeError):
        check("0.9.4", lambda x: 0.5)


def test_a_forgotten_return_is_named():
    result = check("0.9.1", lambda x: None)
    assert result.status == "failed" and "your function returned None" in result.message


def test_a_near_miss_shows_the_relative_error():
    # two numbers equal to 6 digits are shown with all theirs, and how far apart they are
    with pytest.raises(CheckFailed, match=r"expected result 1, got 1\.0000001 \(relative error 1\.0e-07\)"):
        expect_close(1.0000001, 1.0, rtol=1e-9, atol=0)
    with pytest.raises(CheckFailed, match=r"largest difference is at index \(1,\)"):
        expect_close([1.0, 2.5, 3.0], [1.0, 2.0, 3.0])


# ---- unavailable: the library function an exercise asks for, switched off while it is checked -----

def _course_helper():
    import course.optim as optim

    return optim


def test_unavailable_blocks_the_learner_and_puts_everything_back():
    import course.optim as optim
    from course.exercises import unavailable
    from course.exercises._core import Unavailable

    alias = optim.warmup_cosine
    namespace = {"schedule": alias}
    with unavailable("course.optim.warmup_cosine", "course.optim.SGD", task="write the schedule",
                     namespaces=[namespace]):
        with pytest.raises(Unavailable, match="write this yourself: the exercise asks you to write the schedule "
                                              "without calling course.optim.warmup_cosine"):
            optim.warmup_cosine(0, 4, 10)
        with pytest.raises(Unavailable):
            namespace["schedule"](0, 4, 10)  # the learner's own name for it
        with pytest.raises(Unavailable, match="course.optim.SGD"):
            optim.SGD([], lr=0.1)
        # the course's own code still reaches it: WarmupCosine calls warmup_cosine
        opt = optim.Adam([_parameter()], lr=1.0)
        optim.WarmupCosine(opt, 4, 10)
        assert opt.param_groups[0]["lr"] == 0.25
        assert isinstance(optim.SGD, type)
    assert optim.warmup_cosine is alias and namespace["schedule"] is alias
    assert optim.warmup_cosine(0, 4, 10) == 0.25
    assert optim.SGD([_parameter()], lr=0.1) is not None


def _parameter():
    import numpy as np

    import course.nn as nn

    return nn.Parameter(np.zeros(2, dtype=np.float32))


def test_unavailable_restores_after_an_exception_and_blocks_methods():
    from course.exercises import unavailable
    from course.tensor import Tensor

    backward = Tensor.backward
    with pytest.raises(ZeroDivisionError):
        with unavailable("course.tensor.Tensor.backward"):
            with pytest.raises(CheckFailed, match="course.tensor.Tensor.backward"):
                Tensor(1.0, requires_grad=True).backward()
            1 / 0
    assert Tensor.backward is backward
    t = Tensor(2.0, requires_grad=True)
    (t * t).backward()
    assert float(t.grad) == 4.0


def test_a_dispatchable_operation_is_unavailable_by_every_way_in():
    from course.exercises import unavailable
    from course.exercises._core import Unavailable
    from course.tensor import Tensor, dispatch
    from course.tensor import functional as F

    x = Tensor(np.array([[1.0, 2.0, 3.0]]))
    with unavailable("course.tensor.functional.softmax", task="write softmax"):
        for way in (F.softmax, F.softmax.default, dispatch.current("softmax")):
            with pytest.raises(Unavailable, match="without calling course.tensor.functional.softmax"):
                way(x)
    assert dispatch.current("softmax") is F.softmax.default  # all put back
    assert np.allclose(F.softmax.default(x).data, dispatch.current("softmax")(x).data)


def test_an_unknown_path_is_a_clear_error():
    from course.exercises import unavailable

    with pytest.raises(LookupError, match="course.optim.no_such_thing does not exist"):
        with unavailable("course.optim.no_such_thing"):
            pass


# ---- every exercise of parts 1-5 --------------------------------------------------------------

PARTS = ("1.", "2.", "3.", "4.", "5.")
NOTHING_TO_RETURN = {"1.3.4", "2.2.6"}  # they change their arguments in place and return nothing


def _ids():
    return [i for i in registered_ids() if i.startswith(PARTS)]


def _known_wrong_tables():
    import importlib.util
    from pathlib import Path

    tables = {}
    for path in sorted(Path(__file__).parent.glob("test_part*_exercises*.py")):
        spec = importlib.util.spec_from_file_location(f"_known_wrong_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        for exercise_id, wrongs in getattr(module, "KNOWN_WRONG", {}).items():
            tables.setdefault(exercise_id, []).extend(wrongs)
    return tables


def test_every_exercise_has_known_wrong_answers_in_the_tests():
    tables = _known_wrong_tables()
    missing = [i for i in _ids() if not tables.get(i)]
    assert not missing, f"add known-wrong answers (with the words of their messages) to a KNOWN_WRONG table " \
                        f"in tests/test_partN_exercises*.py for {missing}"
    for exercise_id, wrongs in tables.items():
        assert all(callable(w) and words and all(isinstance(x, str) and x for x in words) for w, words in wrongs), \
            exercise_id


def _returns_none(exercise_id):
    if exercise_id == "2.2.5":  # the candidate is a class: its forward forgets to return
        import course.nn as nn

        class ForgetsToReturn(nn.Module):
            def __init__(self, *layers):
                super().__init__()
                for i, layer in enumerate(layers):
                    setattr(self, str(i), layer)

            def forward(self, x):
                for _, layer in self.named_children():
                    x = layer(x)

        return ForgetsToReturn
    return lambda *args, **kwargs: None


@pytest.mark.parametrize("exercise_id", _ids())
def test_a_function_that_returns_none_is_told_so(exercise_id, monkeypatch, capsys):
    from course.exercises._core import DEBUG_ENV

    monkeypatch.setenv(DEBUG_ENV, "1")  # a check that crashes on None is a bug: let it raise here
    result = check(exercise_id, _returns_none(exercise_id))
    assert result.status == "failed", result.message
    if exercise_id not in NOTHING_TO_RETURN:
        assert "returned None" in result.message, result.message


@pytest.mark.parametrize("exercise_id", _ids())
@pytest.mark.parametrize("value", [0.5, {"a": 1.0}, {1.0, 2.0}, "text", [[0.5]]],
                         ids=["float", "dict", "set", "str", "nested-list"])
def test_no_value_makes_a_check_raise(exercise_id, value, monkeypatch, capsys):
    from course.exercises._core import DEBUG_ENV

    monkeypatch.delenv(DEBUG_ENV, raising=False)
    result = check(exercise_id, lambda *args, **kwargs: value)  # must not raise
    assert result.status == "failed", result.message
    assert capsys.readouterr().out == result.message + "\n"


@pytest.mark.parametrize("exercise_id", _ids())
def test_forbidden_library_paths_exist(exercise_id):
    from course.exercises._core import _CHECKS, _resolve

    for path in _CHECKS[exercise_id].forbid:
        _resolve(path)


@pytest.mark.parametrize("exercise_id", _ids())
def test_hints_nudge_first(exercise_id):
    from course.exercises._core import _CHECKS

    entry = _CHECKS[exercise_id]
    assert entry.hint, f"{exercise_id} has no hint"
    if entry.answer_hint:
        assert entry.answer_hint not in entry.hint


def test_check_says_it_wants_the_function_not_its_name_or_its_result(capsys):
    result = check("1.1.1", "numerical_derivative")
    assert result.status == "failed" and "without quotes" in result.message and "'numerical_derivative'" in result.message
    result = check("1.1.1", 0.5)
    assert result.status == "failed" and "got a float" in result.message
