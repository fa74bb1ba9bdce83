"""The checks of the modules that lesson 2.2 has the learner write (2.2.5 Sequential, 2.2.6
load_state): the solution passes, and the classic mistakes fail with a message that says what to fix."""

import numpy as np
import pytest

import course.nn as nn
from course.exercises import check

pytestmark = pytest.mark.part2


# ----- 2.2.5 Sequential ------------------------------------------------------------------------


class Sequential(nn.Module):
    def __init__(self, *layers):
        super().__init__()
        for i, layer in enumerate(layers):
            setattr(self, str(i), layer)

    def forward(self, x):
        for _, layer in self.named_children():
            x = layer(x)
        return x


class Stub(nn.Module):
    def __init__(self, *layers):
        raise NotImplementedError


class InAList(nn.Module):  # a plain list hides the layers from Module
    def __init__(self, *layers):
        super().__init__()
        self.layers = list(layers)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


class NoSuperInit(nn.Module):
    def __init__(self, *layers):
        for i, layer in enumerate(layers):
            setattr(self, str(i), layer)

    def forward(self, x):
        for _, layer in self.named_children():
            x = layer(x)
        return x


class Reversed(Sequential):
    def forward(self, x):
        for _, layer in reversed(list(self.named_children())):
            x = layer(x)
        return x


class NoReturn(Sequential):
    def forward(self, x):
        for _, layer in self.named_children():
            x = layer(x)


class OnTheLibrary(nn.Sequential):
    pass


class WrapsTheLibrary(nn.Module):
    def __init__(self, *layers):
        super().__init__()
        self.inner = nn.Sequential(*layers)

    def forward(self, x):
        return self.inner(x)


class SkipsTheLast(Sequential):
    def forward(self, x):
        for _, layer in list(self.named_children())[:-1]:
            x = layer(x)
        return x


def test_sequential_solution_passes():
    assert check("2.2.5", Sequential).passed


def test_sequential_stub_is_not_attempted():
    assert check("2.2.5", Stub).status == "not attempted"


SEQUENTIAL_WRONG = [
    (InAList, "named_parameters() gives []"),
    (NoSuperInit, "super().__init__()"),
    (Reversed, "called on a (4, 3) batch"),
    (NoReturn, "returned None"),
    (OnTheLibrary, "subclass nn.Module"),
    (WrapsTheLibrary, "write this yourself"),
    (SkipsTheLast, "output"),
]


@pytest.mark.parametrize("wrong, words", SEQUENTIAL_WRONG)
def test_sequential_mistakes_fail_with_a_useful_message(wrong, words):
    result = check("2.2.5", wrong)
    assert result.status == "failed"
    assert words in result.message


def test_sequential_instance_instead_of_class_fails():
    result = check("2.2.5", Sequential(nn.ReLU()))
    assert result.status == "failed" and "class itself" in result.message


def test_the_library_sequential_is_back_after_the_check():
    check("2.2.5", WrapsTheLibrary)
    assert nn.Sequential(nn.ReLU()) is not None and isinstance(nn.Sequential, type)


# ----- 2.2.6 load_state --------------------------------------------------------------------------


def load_state(module, state):
    params = dict(module.named_parameters())
    missing = [n for n in params if n not in state]
    unexpected = [n for n in state if n not in params]
    misshapen = [n for n in params if n in state and np.shape(state[n]) != params[n].shape]
    if missing or unexpected or misshapen:
        raise ValueError(f"missing {missing}, unexpected {unexpected}, wrong shape {misshapen}")
    for name, p in params.items():
        p.data = np.array(state[name], dtype=p.data.dtype)


def load_stub(module, state):
    raise NotImplementedError


def load_no_checks(module, state):
    params = dict(module.named_parameters())
    for name, value in state.items():
        if name in params:
            params[name].data = np.array(value, dtype=np.float32)


def load_float64(module, state):
    load_state(module, {k: np.asarray(v, dtype=np.float64) for k, v in state.items()})
    for name, p in module.named_parameters():
        p.data = np.array(state[name], dtype=np.float64)


def load_aliasing(module, state):
    load_state(module, state)
    for name, p in module.named_parameters():
        p.data = np.asarray(state[name], dtype=p.data.dtype)  # no copy for a float32 array


def load_checks_while_copying(module, state):  # copies the good ones before it finds the bad one
    params = dict(module.named_parameters())
    for name, p in params.items():
        if name not in state or np.shape(state[name]) != p.shape:
            raise ValueError(f"bad {name}")
        p.data = np.array(state[name], dtype=p.data.dtype)
    extra = [n for n in state if n not in params]
    if extra:
        raise ValueError(f"unexpected {extra}")


def load_unnamed_error(module, state):
    params = dict(module.named_parameters())
    if set(params) != set(state) or any(np.shape(state[n]) != p.shape for n, p in params.items()):
        raise ValueError("the state does not fit")
    load_state(module, state)


def load_with_the_library(module, state):
    module.load_state_dict(state)


def load_key_error(module, state):
    for name, p in module.named_parameters():
        p.data = np.array(state[name], dtype=p.data.dtype)  # KeyError on a missing name


def test_load_state_solution_passes():
    assert check("2.2.6", load_state).passed


def test_load_state_stub_is_not_attempted():
    assert check("2.2.6", load_stub).status == "not attempted"


LOAD_STATE_WRONG = [
    (load_no_checks, "without one"),
    (load_float64, "keeps its dtype"),
    (load_aliasing, "own copy"),
    (load_checks_while_copying, "should change nothing"),
    (load_unnamed_error, "should name"),
    (load_with_the_library, "write this yourself"),
    (load_key_error, "raised KeyError"),
]
# Every exercise's known-wrong answers, with the words of their messages (tests/test_foundation_exercises.py
# checks that each exercise of parts 1-4 has some).
KNOWN_WRONG = {"2.2.5": [(w, [words]) for w, words in SEQUENTIAL_WRONG],
               "2.2.6": [(w, [words]) for w, words in LOAD_STATE_WRONG]}


@pytest.mark.parametrize("wrong, words", LOAD_STATE_WRONG)
def test_load_state_mistakes_fail_with_a_useful_message(wrong, words):
    result = check("2.2.6", wrong)
    assert result.status == "failed"
    assert words in result.message


def test_the_library_load_state_dict_is_back_after_the_check():
    check("2.2.6", load_with_the_library)
    a, b = nn.Linear(2, 2, rng=0), nn.Linear(2, 2, rng=1)
    b.load_state_dict(a.state_dict())
    assert np.array_equal(a.weight.data, b.weight.data)


# The table that tests/test_foundation_exercises.py gathers from every test_partN_exercises*.py.
KNOWN_WRONG = {
    "2.2.5": [(wrong, [words]) for wrong, words in SEQUENTIAL_WRONG],
    "2.2.6": [(wrong, [words]) for wrong, words in LOAD_STATE_WRONG],
}
