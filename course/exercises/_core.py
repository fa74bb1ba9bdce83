"""The machinery behind `check`: a registry of checks, and the one line each check prints."""

import contextlib
import functools
import importlib
import inspect
import os
import pkgutil
import sys
import threading
import types
import zlib
from dataclasses import dataclass, field

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


# A developer of the course sets this variable to see the traceback of an exception inside a check
# instead of the one-line failure a learner gets.
DEBUG_ENV = "COURSE_CHECK_DEBUG"

# Grading sets this to a random number: the checks then draw inputs no earlier run has seen (a
# table of answers read off the failure messages of earlier runs is no use). None: the same inputs
# on every run, as a learner expects.
_FRESH = None

# How many failed attempts at an exercise it takes before its hint gives the full answer.
ANSWER_AFTER = 3


@dataclass
class _Exercise:
    fn: object
    hint: str = ""
    answer_hint: str = ""
    forbid: tuple = ()
    task: str = ""
    inside: bool = False
    kernel: bool = False
    failures: int = field(default=0)
    last_tried: object = None     # what the last failed answer's code was: running it again is no new try


def exercise(exercise_id, hint="", answer_hint="", forbid=(), task="", inside=False, kernel=False):
    """Register a check: `fn(candidate, rng)` calls the candidate and raises CheckFailed on a mistake.

    `rng` is a NumPy generator seeded from the id, so random inputs are the same every run.
    `hint` is a nudge printed with every failure; `answer_hint`, the full formula, is added from the
    ANSWER_AFTER-th failed answer of the same exercise on (the same code run again is not another). `forbid` names the library functions, classes
    or methods that the exercise asks the learner to write ("course.optim.warmup_cosine",
    "course.tensor.Tensor.backward"): while the check runs they are `unavailable`, and `task` says
    what to do instead ("compute the gradient by hand"). `inside=True`: the check observes the
    call from within the learner's process (a kernel's traced memory accesses, peak memory, copies
    to the device), so grading runs it there rather than across the sandbox's wall. `kernel=True`:
    the candidate is a CUDA kernel, which grading rebuilds from the notebook's source in a process of
    its own, compiles for a GPU (nopython: no imports, no Python objects), and only then traces.
    """

    def register(fn):
        if exercise_id in _CHECKS:
            raise ValueError(f"exercise {exercise_id} is registered twice")
        _CHECKS[exercise_id] = _Exercise(fn, hint, answer_hint, tuple(forbid), task, inside, kernel)
        return fn

    return register


# The last value a learner's function returned, to say what it was if the check cannot use it (one
# per thread: grading checks several submissions at once).
_NOTHING = object()
_seen = threading.local()


def call(candidate, *args, on="", returns=True, **kwargs):
    """Call the learner's function; an exception it raises becomes a CheckFailed naming the input.

    With `returns=True` (a function that should return something) a None result fails with
    "your function returned None": the usual cause is a forgotten `return`.
    """
    where = f" on {on}" if on else ""
    try:
        got = candidate(*args, **kwargs)
    except NotImplementedError:
        raise _NotAttempted() from None
    except CheckFailed:
        raise
    except Exception as err:  # the learner's code failed: say how, and on what
        raise CheckFailed(f"your code raised {type(err).__name__}: {err}{where}") from None
    if returns and got is None:
        raise CheckFailed(f"your function returned None{where}: did it forget `return`?")
    _seen.returned = got
    return got


def within(candidate, owner, method):
    """`candidate` as a function that runs inside `with owner.method():` (a graph's `as_default`),
    wherever the candidate lives: in this process, or in the one that answers for it when grading."""
    if callable(getattr(type(candidate), "within", None)) and type(candidate).__name__ == "Remote":
        return lambda *args, **kwargs: candidate.within(owner, method, *args, **kwargs)

    def inside(*args, **kwargs):
        with getattr(owner, method)():
            return candidate(*args, **kwargs)
    return inside


def class_names(candidate):
    """"module:qualname" of a class and of each of its ancestors, or None if it is not a class; of
    a class in the process that answers for the learner too."""
    if type(candidate).__name__ == "Remote" and callable(getattr(type(candidate), "classes", None)):
        is_class, names = candidate.classes()
        return list(names) if is_class else None
    if not isinstance(candidate, type):
        return None
    return [f"{c.__module__}:{c.__qualname__}" for c in candidate.__mro__]


# ---- library functions that an exercise asks the learner to write ----

class Unavailable(CheckFailed):
    """Raised when the learner's code calls a library function that its exercise asks it to write."""


def _resolve(path):
    """The object at a dotted path, and where it lives: (obj, owner, name); owner is a class for a
    method (and then it is patched there), None for a module-level function or class."""
    parts = path.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        owner = None
        for name in parts[cut:]:
            try:
                owner, obj = obj, getattr(obj, name)
            except AttributeError:
                raise LookupError(f"{path} does not exist: fix the `forbid` list of the check") from None
        return obj, (owner if inspect.isclass(owner) else None), parts[-1]
    raise LookupError(f"{path} does not exist: fix the `forbid` list of the check")


def _from_course(frame):
    name = frame.f_globals.get("__name__", "")
    return name == "course" or name.startswith("course.")


def _blocked(original, message):
    """A stand-in for `original`: the course's own code still reaches the original (a library function
    the learner may use can call it), any other caller gets `message`."""

    @functools.wraps(original)
    def stand_in(*args, **kwargs):
        if _from_course(sys._getframe(1)):
            return original(*args, **kwargs)
        raise Unavailable(message)

    del stand_in.__wrapped__  # no way back to the original through the stand-in
    stand_in.blocked = True
    if callable(getattr(original, "default", None)):  # a dispatchable operation: its NumPy version too
        stand_in.default = _blocked(original.default, message)
    return stand_in


_GATES = {}


def _gate_code(free):
    """The code of a function `(*args, __course_gate__, **kwargs)` that hands its arguments to
    `__course_gate__`, with `free` unused free variables: it can replace the code of any Python
    function whose closure has that many cells."""
    if free not in _GATES:
        names = [f"_free{i}" for i in range(free)]
        source = (f"def outer({', '.join(names)}):\n"
                  f"    def gate(*args, __course_gate__=None, **kwargs):\n"
                  f"        if __course_gate__ is None:\n"
                  f"            return ({''.join(n + ', ' for n in names)})\n"
                  f"        return __course_gate__(args, kwargs)\n"
                  f"    return gate\n")
        space = {}
        exec(compile(source, "<course gate>", "exec"), space)
        _GATES[free] = space["outer"](*range(free)).__code__
    return _GATES[free]


def _gate(function, message, restore):
    """Block the function object itself, wherever it is reached from (another name, a default
    argument, a list, a partial, a class attribute, `__wrapped__`): its code is swapped for a gate
    that lets only the course's own code through, to a copy of the original. `restore` gets what
    puts it back."""
    original = function.__code__, function.__defaults__, function.__kwdefaults__
    copy = types.FunctionType(function.__code__, function.__globals__, function.__name__,
                              function.__defaults__, function.__closure__)
    copy.__kwdefaults__ = function.__kwdefaults__
    copy.__qualname__ = function.__qualname__

    def gate(args, kwargs):
        if _from_course(sys._getframe(2)):  # 0: here, 1: the gate, 2: whoever called the function
            return copy(*args, **kwargs)
        raise Unavailable(message)

    function.__code__ = _gate_code(len(function.__closure__ or ()))
    function.__defaults__, function.__kwdefaults__ = None, {"__course_gate__": gate}
    restore.append((_put_back, function, original, None))


def _put_back(function, original):
    function.__code__, function.__defaults__, function.__kwdefaults__ = original


def _functions_of(obj):
    """The Python functions that make up `obj`: itself, the functions it wraps, its NumPy version."""
    found, todo = [], [obj]
    while todo:
        f = todo.pop()
        f = getattr(f, "__func__", f)  # classmethod, staticmethod, bound method
        if isinstance(f, types.FunctionType) and all(f is not g for g in found):
            found.append(f)
            todo += [getattr(f, "__wrapped__", None), getattr(f, "default", None)]
    return found


@contextlib.contextmanager
def unavailable(*paths, task="", namespaces=()):
    """Inside the block, calling any of `paths` from outside `course` raises Unavailable: "write this
    yourself: the exercise asks you to ... without calling course.optim.warmup_cosine".

    A path names a function, a class (its `__init__` is blocked) or a method
    ("course.tensor.Tensor.backward"). A Python function is blocked as an object, under every name
    and in every place that holds it; anything else (a compiled kernel) is replaced by a stand-in in
    every module of `course` and every dict of `namespaces`, such as the learner's globals, that
    holds it. Everything is put back on leaving, even after an exception.
    """
    restore = []  # (setter, target, name, old value or _NOTHING)
    originals = []
    gated = set()
    try:
        for path in paths:
            obj, owner, name = _resolve(path)
            if getattr(obj, "blocked", False) or any(obj is o for o, _ in originals):
                continue  # another name of something blocked already
            originals.append((obj, path))
            message = (f"write this yourself: the exercise asks you to {task or 'write it'} "
                       f"without calling {path}")
            if inspect.isclass(obj):  # block construction, keep isinstance working
                owner, name, obj = obj, "__init__", obj.__init__
            own = owner.__dict__.get(name) if owner is not None else obj
            # An inherited __init__ is left alone: blocking it would block every class that has it.
            functions = _functions_of(own) if own is not None else []
            if functions:
                for f in functions:
                    if id(f) not in gated:
                        gated.add(id(f))
                        _gate(f, message, restore)
                continue
            if owner is not None:
                raw = owner.__dict__.get(name, _NOTHING)
                if isinstance(raw, (classmethod, staticmethod)):
                    stand_in = type(raw)(_blocked(raw.__func__, message))
                else:
                    stand_in = _blocked(obj, message)
                restore.append((owner, name, raw))
                setattr(owner, name, stand_in)
                continue
            stand_in = _blocked(obj, message)
            dicts = [vars(m) for n, m in list(sys.modules.items())
                     if m is not None and (n == "course" or n.startswith("course."))]
            main = sys.modules.get("__main__")
            home = sys.modules.get(getattr(obj, "__module__", None) or "")  # a library outside course (safetensors)
            dicts += [d for d in (*namespaces, vars(main) if main else None, vars(home) if home else None)
                      if d is not None and all(d is not x for x in dicts)]
            # tables that hold it by name, such as the dispatch table that `dispatch.current` reads
            dicts += [v for d in list(dicts) for v in list(d.values())
                      if isinstance(v, dict) and any(x is obj for x in list(v.values()))]
            for d in dicts:
                for key, value in list(d.items()):
                    if value is obj:
                        restore.append((d, key, value))
                        d[key] = stand_in
        yield tuple(originals)
    finally:
        for target, name, old, *rest in reversed(restore):
            if target is _put_back:
                _put_back(name, old)
            elif isinstance(target, dict):
                target[name] = old
            elif old is _NOTHING:
                delattr(target, name)
            else:
                setattr(target, name, old)


def _library_path(candidate, originals):
    """The path of the blocked library function that `candidate` is, or None."""
    inner = candidate.func if isinstance(candidate, functools.partial) else candidate
    inner = getattr(inner, "__func__", inner)  # a bound method
    for obj, path in originals:
        if inner is obj or inner is getattr(obj, "__func__", None):
            return path
    return None


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


def _show_pair(got_arr, exp_arr):
    """`expected ..., got ...` with enough digits to tell them apart, and the relative error."""
    if exp_arr.size == 1:
        g, e = float(got_arr.ravel()[0]), float(exp_arr.ravel()[0])
        short = f"{e:.6g}" != f"{g:.6g}"
        text = f"{e:.6g}, got {g:.6g}" if short else f"{e:.15g}, got {g:.15g}"
        if e != 0 and np.isfinite(e) and np.isfinite(g):
            text += f" (relative error {abs(g - e) / abs(e):.1e})"
        return text
    diff = np.abs(got_arr - exp_arr)
    diff = np.where(np.isnan(got_arr) & np.isnan(exp_arr), 0.0, np.nan_to_num(diff, nan=np.inf))
    worst = np.unravel_index(int(np.argmax(diff)), diff.shape)
    g, e = float(got_arr[worst]), float(exp_arr[worst])
    at = f"at index {tuple(int(i) for i in worst)}: expected {e:.6g}, got {g:.6g}"
    if f"{e:.6g}" == f"{g:.6g}":
        at = f"at index {tuple(int(i) for i in worst)}: expected {e:.15g}, got {g:.15g}"
    rel = f", relative error {abs(g - e) / abs(e):.1e}" if e != 0 and np.isfinite(e) and np.isfinite(g) else ""
    return f"{_show(exp_arr)}, got {_show(got_arr)} (the largest difference is {at}{rel})"


def expect_close(got, expected, on="", rtol=1e-5, atol=1e-8, what="result"):
    """Fail unless `got` equals `expected` within tolerance (numbers or arrays, shapes included)."""
    where = f" on {on}" if on else ""
    if got is None:
        raise CheckFailed(f"your function returned None as the {what}{where}: did it forget `return`?")
    try:
        got_arr = np.asarray(got, dtype=np.float64)
    except (TypeError, ValueError):
        raise CheckFailed(f"expected a number or an array as the {what}{where}, got {_show(got)}") from None
    exp_arr = np.asarray(expected, dtype=np.float64)
    if got_arr.shape != exp_arr.shape:
        raise CheckFailed(f"the {what}{where} has shape {got_arr.shape}, expected shape {exp_arr.shape}")
    if not np.allclose(got_arr, exp_arr, rtol=rtol, atol=atol, equal_nan=True):
        raise CheckFailed(f"expected {what} {_show_pair(got_arr, exp_arr)}{where}")


def expect(condition, message):
    """Fail with `message` unless `condition` holds."""
    if not condition:
        raise CheckFailed(message)


def _describe(value):
    kind = type(value).__name__
    shape = f" of shape {value.shape}" if isinstance(value, np.ndarray) else (
        f" of length {len(value)}" if isinstance(value, (list, tuple, dict, set, str)) else "")
    return f"a {kind}{shape} ({_show(value, 60)})"


def _could_not_use(err):
    error = f"{type(err).__name__}: {err}"
    returned = getattr(_seen, "returned", _NOTHING)
    if returned is _NOTHING:
        return f"the check could not run your function ({error})"
    return (f"your function returned {_describe(returned)}, which the check could not use ({error}): "
            f"return what the exercise asks for")


def _tried(candidate):
    """What a learner's answer is, as code: the same function run again (the cell re-run unchanged)
    gives the same key, whatever file name the notebook gives each run."""
    fn = inspect.unwrap(candidate)
    code = getattr(fn, "__code__", None) or getattr(getattr(fn, "py_func", None), "__code__", None)
    if code is None:
        return id(candidate)

    def key(c):
        return (c.co_code, c.co_names, c.co_varnames,
                tuple(key(k) if isinstance(k, types.CodeType) else repr(k) for k in c.co_consts))
    return key(code)


def _failed(exercise_id, entry, text, reveal=True, candidate=None):
    if reveal:
        tried = _tried(candidate)
        entry.failures += tried != entry.last_tried  # only a changed answer counts as another try
        entry.last_tried = tried
    hint = entry.hint
    if reveal and entry.answer_hint and (entry.failures >= ANSWER_AFTER or not hint):
        hint = f"{hint.rstrip('.')}. In full: {entry.answer_hint}" if hint else entry.answer_hint
    tail = f" Hint: {_sentence(hint)}" if hint else ""
    return CheckResult(exercise_id, "failed", f"[{exercise_id}] failed: {_sentence(text)}{tail}")


def _sentence(text):
    text = text.rstrip()
    return text if text.endswith(("?", "!")) else text.rstrip(".") + "."


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


def entry(exercise_id):
    """The registered check of an exercise (loading its part), or a KeyError naming the id."""
    found = _load_part(str(exercise_id))
    if found is None:
        raise KeyError(f"there is no exercise {exercise_id!r}: look at the id in the cell")
    return found


def check(exercise_id, candidate):
    """Check the learner's `candidate` for an exercise; print one line and return a CheckResult."""
    result = run(exercise_id, candidate, gate=True)
    print(result.message)
    return result


def not_attempted(exercise_id):
    return (f"[{exercise_id}] not attempted yet: replace `raise NotImplementedError` with your code and run the "
            f"cell again.")


def run(exercise_id, candidate, gate=True, fresh=None):
    """The CheckResult of one exercise, printing nothing.

    Grading passes `gate=False` and a `fresh` seed: the candidate lives in another process, where
    the library functions it must not call do not exist; the inputs are drawn afresh (answers read
    off the messages of earlier runs are no use); the hint never grows into the full answer."""
    entry_ = entry(exercise_id)
    seed = zlib.crc32(exercise_id.encode())
    fresh = _FRESH if fresh is None else fresh
    rng = np.random.default_rng(seed if fresh is None else [fresh, seed])
    _seen.returned = _NOTHING
    if not callable(candidate):  # check("4.2.1", "np.triu"), or a value the function returned
        what = f"the string {candidate!r}" if isinstance(candidate, str) else _describe(candidate)
        return CheckResult(exercise_id, "failed",
                           f"[{exercise_id}] failed: check wants the function you wrote (its name, without quotes "
                           f"or parentheses), got {what}.")
    try:
        if not gate:
            entry_.fn(candidate, rng)
        else:
            namespaces = [getattr(inspect.unwrap(candidate), "__globals__", None)]
            with unavailable(*entry_.forbid, task=entry_.task, namespaces=namespaces) as originals:
                library = _library_path(candidate, originals)
                if library:
                    raise CheckFailed(f"you passed {library}, the library's own function: write this yourself, "
                                      f"the exercise asks you to {entry_.task or 'write it'}")
                entry_.fn(candidate, rng)
    except (_NotAttempted, NotImplementedError):
        result = CheckResult(exercise_id, "not attempted", not_attempted(exercise_id))
    except CheckFailed as failure:
        result = _failed(exercise_id, entry_, str(failure), reveal=gate, candidate=candidate)
    except Exception as err:  # the check tripped over what the learner's function returned
        if os.environ.get(DEBUG_ENV):
            raise
        result = _failed(exercise_id, entry_, _could_not_use(err), reveal=gate, candidate=candidate)
    else:
        if gate:
            entry_.failures, entry_.last_tried = 0, None
        result = CheckResult(exercise_id, "passed", f"[{exercise_id}] passed.")
    return result
