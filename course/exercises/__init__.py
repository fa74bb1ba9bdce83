"""Exercises that check themselves.

In a notebook::

    def numerical_derivative(f, x, h=1e-6):
        raise NotImplementedError   # your code here

    check("1.1.1", numerical_derivative)

`check` prints one line (not attempted yet, passed, or what failed on which input, with a hint)
and returns a `CheckResult`. The checks of part N live in
`course/exercises/partN.py` and are loaded the first time one of them is asked for. While a check
runs, the library functions its exercise asks the learner to write are `unavailable`.
"""

from ._core import (CheckFailed, CheckResult, call, check, exercise, expect, expect_close, registered_ids,
                    unavailable)

__all__ = ["check", "CheckResult", "CheckFailed", "exercise", "expect", "expect_close", "call",
           "registered_ids", "unavailable"]
