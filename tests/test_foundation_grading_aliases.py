"""Grading under attack, inside the checks: answers that call the library function their exercise
asks them to write through another way of reaching it (a default argument, `__wrapped__`, a list,
a partial, a class attribute, a method taken before the check), answers that lie about equality,
and answers that are a table of the inputs a check used on an earlier run. Each fails.
"""

import functools
import math
import types

import numpy as np
import pytest

from course.exercises import _core, check
from course.gpt import BPETokenizer, CharTokenizer, tokenizer
from course.micrograd import Value

pytestmark = [pytest.mark.foundation]


def _chain(x, backward):
    v = Value(x)
    loss = (2 * v - 1).tanh() ** 2
    backward(loss)
    return v.grad


def _default_argument(x, _bw=Value.backward):
    return _chain(x, _bw)


_IN_A_LIST = [Value.backward]


def _from_a_list(x):
    return _chain(x, _IN_A_LIST[0])


_PARTIAL = functools.partial(Value.backward)


def _through_a_partial(x):
    return _chain(x, _PARTIAL)


class _Holder:
    backward = Value.backward


def _from_a_class_attribute(x):
    return _chain(x, _Holder.backward)


def _through_wrapped(x):
    return _chain(x, getattr(Value.backward, "__wrapped__", Value.backward))


def _through_a_bound_method(x):
    return _chain(x, lambda loss, _m=Value.backward.__get__: _m(loss)())


ALIASES_OF_BACKWARD = [_default_argument, _from_a_list, _through_a_partial, _from_a_class_attribute,
                       _through_wrapped, _through_a_bound_method]


@pytest.mark.parametrize("answer", ALIASES_OF_BACKWARD, ids=lambda f: f.__name__.strip("_"))
def test_the_forbidden_function_is_blocked_however_it_is_reached(answer):
    result = check("1.1.4", answer)
    assert result.status == "failed" and "write this yourself" in result.message, result.message
    # and it is the library's again afterwards
    assert answer(0.3) == pytest.approx(4 * math.tanh(-0.4) * (1 - math.tanh(-0.4) ** 2))


def _compiled(path):
    """A numba kernel, or a function or class of a compiled extension (safetensors.safe_open): no
    Python code to swap, so `unavailable` replaces it by name, in course and in the learner's globals."""
    import inspect

    from numba.core.dispatcher import Dispatcher
    obj = _core._resolve(path)[0]
    init = getattr(obj, "__init__", None) if inspect.isclass(obj) else None
    return (isinstance(obj, Dispatcher) or inspect.isbuiltin(obj)
            or inspect.isclass(obj) and not isinstance(init, types.FunctionType))


def test_every_forbidden_name_is_blocked_as_an_object():
    """Each `forbid` path of every check is a Python function (or a class with its own __init__),
    so that no other way of reaching it gets past the check."""
    _core.registered_ids()
    paths = sorted({p for entry in _core._CHECKS.values() for p in entry.forbid})
    assert len(paths) > 50
    for path in paths:
        if _compiled(path):
            continue
        own = _own(path)
        assert own is not None and _core._functions_of(own), f"{path} would only be replaced by name"
    # and each check's list can be blocked and put back
    for exercise_id, entry in _core._CHECKS.items():
        functions = [f for path in entry.forbid if not _compiled(path) for f in _core._functions_of(_own(path))]
        codes = [f.__code__ for f in functions]
        with _core.unavailable(*entry.forbid):
            assert all(f.__code__ is not code for f, code in zip(functions, codes)), exercise_id
        assert all(f.__code__ is code for f, code in zip(functions, codes)), exercise_id


def _own(path):
    import inspect

    obj, owner, name = _core._resolve(path)
    if inspect.isclass(obj):
        owner, name = obj, "__init__"
    return owner.__dict__.get(name) if owner is not None else obj


def test_a_function_with_a_closure_is_blocked_and_put_back():
    from course.exercises._core import Unavailable, unavailable

    original = tokenizer._merge
    code = original.__code__
    keep = [original]
    with unavailable("course.gpt.tokenizer._merge", task="write the merge"):
        with pytest.raises(Unavailable, match="without calling course.gpt.tokenizer._merge"):
            keep[0]([1, 2], (1, 2), 3)
        # the course's own code still reaches it
        assert BPETokenizer([(104, 105)], pattern=None).encode("hihi") == [256, 256]
    assert tokenizer._merge is original and original.__code__ is code
    assert keep[0]([1, 2, 1, 2], (1, 2), 3) == [3, 3]


_INIT = CharTokenizer.__init__


def _vocab_through_init(text):
    tok = CharTokenizer.__new__(CharTokenizer)
    _INIT(tok, text)
    return tok.stoi, tok.itos


def _merge_through_an_alias(ids, pair, new_id, _merge=tokenizer._merge):
    return _merge(list(ids), pair, new_id)


def _merge_through_the_encoder(ids, pair, new_id):
    # a byte tokenizer that knows this one merge does the merging (the ids of the check are small)
    merged = BPETokenizer([pair], pattern=None).encode(bytes(ids).decode("latin-1"))
    return [new_id if i == 256 else i for i in merged]


_ENCODE = BPETokenizer.encode


def _encode_through_a_method_taken_earlier(text, merges):
    tok = BPETokenizer([p for p, _ in sorted(merges.items(), key=lambda kv: kv[1])], pattern=None)
    return _ENCODE(tok, text)


@pytest.mark.parametrize("exercise_id,answer", [("4.1.1", _vocab_through_init), ("4.1.3", _merge_through_an_alias),
                                                ("4.1.3", _merge_through_the_encoder),
                                                ("4.1.4", _encode_through_a_method_taken_earlier)],
                         ids=["CharTokenizer.__init__", "tokenizer._merge", "BPETokenizer.encode-for-4.1.3",
                              "BPETokenizer.encode"])
def test_the_tokenizers_own_code_is_blocked_through_names_taken_before_the_check(exercise_id, answer):
    result = check(exercise_id, answer)
    assert result.status == "failed" and "write this yourself" in result.message, result.message


class _EqualToAnything:
    def __eq__(self, other):
        return True

    __hash__ = object.__hash__


class _Liar(str):
    def __eq__(self, other):
        return True

    __hash__ = str.__hash__


def _vocab_equal_to_anything(text):
    # The right keys (easy), and values that say they are whatever they are compared with.
    chars = set(text)
    return {c: _EqualToAnything() for c in chars}, {i: _EqualToAnything() for i in range(len(chars))}


def _vocab_of_liars(text):
    # stoi done right, itos made of strings that say they equal anything
    chars = sorted(set(text))
    return {c: i for i, c in enumerate(chars)}, {i: _Liar("?") for i in range(len(chars))}


def _counts_equal_to_anything(ids):
    return {pair: _EqualToAnything() for pair in zip(ids, ids[1:])}


@pytest.mark.parametrize("exercise_id,answer", [("4.1.1", _vocab_equal_to_anything), ("4.1.1", _vocab_of_liars),
                                                ("4.1.2", _counts_equal_to_anything)],
                         ids=["4.1.1-equal-to-anything", "4.1.1-str-that-lies", "4.1.2-equal-to-anything"])
def test_an_answer_that_says_it_equals_anything_fails(exercise_id, answer):
    assert check(exercise_id, answer).status == "failed"


def test_a_table_of_the_inputs_of_an_earlier_run_fails_when_graded(monkeypatch):
    """1.1.4 told its inputs and answers through its messages: a table of them answers them all on a
    learner's machine, but grading draws other inputs."""
    seen = {}

    def solution(x):
        t = math.tanh(2 * x - 1)
        seen[x] = 4 * t * (1 - t * t)
        return seen[x]

    assert check("1.1.4", solution).passed
    table = dict(seen)

    def from_the_table(x):
        return table[x]

    assert check("1.1.4", from_the_table).passed
    monkeypatch.setattr(_core, "_FRESH", int(np.random.default_rng().integers(2**63)))
    assert check("1.1.4", solution).passed
    result = check("1.1.4", from_the_table)
    assert result.status == "failed" and "KeyError" in result.message
