"""The machinery behind `check`: a registry of checks, and the one line each check prints."""

import importlib
import os
import pkgutil
import zlib
from dataclasses import dataclass

import numpy as np

_CHECKS = {}


@dataclass(frozen=True)
class CheckResult:
    exercise_id: str
    status: str  # "passed", "failed" or "not attempted"
    message: str

    @property
    def passed(self):
        return self.status == "passed"

    def __str__(self):
        return self.message

    def _ipython_display_(self):
        # `check(...)` already printed its line: showing the returned value again would repeat it.
        pass


class CheckFailed(Exception):
    """Raised inside a check to say what went wrong, on which input."""


class _NotAttempted(Exception):
    pass


def exercise(exercise_id, hint=""):
    """Register a check: `fn(candidate, rng)` calls the candidate and raises CheckFailed on a mistake.

    `rng` is a NumPy generator seeded from the exercise id, so random inputs are the same every run.
    """

    def register(fn):
        if exercise_id in _CHECKS:
            raise ValueError(f"exercise {exercise_id} is registered twice")
        _CHECKS[exercise_id] = (fn, hint)
        return fn

    return register


def call(candidate, *args, on="", **kwargs):
    """Call the learner's function; an exception it raises becomes a CheckFailed naming the input."""
    try:
        return candidate(*args, **kwargs)
    except NotImplementedError:
        raise _NotAttempted() from None
    except CheckFailed:
        raise
    except Exception as err:  # the learner's code failed: say how, and on what
        where = f" on {on}" if on else ""
        raise CheckFailed(f"your code raised {type(err).__name__}: {err}{where}") from None


def _show(value, limit=120):
    if isinstance(value, np.ndarray):
        text = np.array2string(value, precision=6, threshold=20, separator=", ")
        text = f"array(shape={value.shape}) {text}" if value.size > 1 else text
    elif isinstance(value, float):
        text = f"{value:.6g}"
    else:
        text = repr(value)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def expect_close(got, expected, on="", rtol=1e-5, atol=1e-8, what="result"):
    """Fail unless `got` equals `expected` within tolerance (numbers or arrays, shapes included)."""
    where = f" on {on}" if on else ""
    try:
        got_arr = np.asarray(got, dtype=np.float64)
    except (TypeError, ValueError):
        raise CheckFailed(f"expected a number or an array as the {what}{where}, got {_show(got)}") from None
    exp_arr = np.asarray(expected, dtype=np.float64)
    if got_arr.shape != exp_arr.shape:
        raise CheckFailed(f"the {what}{where} has shape {got_arr.shape}, expected shape {exp_arr.shape}")
    if not np.allclose(got_arr, exp_arr, rtol=rtol, atol=atol, equal_nan=True):
        raise CheckFailed(f"expected {what} {_show(expected)}, got {_show(got)}{where}")


def expect(condition, message):
    """Fail with `message` unless `condition` holds."""
    if not condition:
        raise CheckFailed(message)


def _load_part(exercise_id):
    part = exercise_id.split(".")[0]
    if exercise_id not in _CHECKS:
        try:
            importlib.import_module(f"course.exercises.part{part}")
        except ModuleNotFoundError as err:
            if err.name != f"course.exercises.part{part}":
                raise
    return _CHECKS.get(exercise_id)


def registered_ids():
    """Every exercise id that has a check, loading the checks of every part."""
    for info in pkgutil.iter_modules([os.path.dirname(__file__)]):
        if info.name.startswith("part"):
            importlib.import_module(f"course.exercises.{info.name}")
    return sorted(_CHECKS, key=lambda s: [int(p) if p.isdigit() else p for p in s.split(".")])


def check(exercise_id, candidate):
    """Check the learner's `candidate` for an exercise; print one line and return a CheckResult."""
    entry = _load_part(str(exercise_id))
    if entry is None:
        raise KeyError(f"there is no exercise {exercise_id!r}: look at the id in the cell")
    fn, hint = entry
    rng = np.random.default_rng(zlib.crc32(exercise_id.encode()))
    try:
        fn(candidate, rng)
    except (_NotAttempted, NotImplementedError):
        result = CheckResult(exercise_id, "not attempted",
                             f"[{exercise_id}] not attempted yet: replace `raise NotImplementedError` "
                             f"with your code and run the cell again.")
    except CheckFailed as failure:
        tail = f" Hint: {hint}" if hint else ""
        text = str(failure).rstrip(".")
        result = CheckResult(exercise_id, "failed", f"[{exercise_id}] failed: {text}.{tail}")
    else:
        result = CheckResult(exercise_id, "passed", f"[{exercise_id}] passed.")
    print(result.message)
    return result
