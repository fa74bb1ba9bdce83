"""Checks of part 5: state-space models (5.1), the selective scan (5.2), the Mamba block (5.3) and
Mamba against GPT (5.4).

Each reference below is written here in NumPy, apart from `course.mamba`: an exercise that asks
for a piece of the library is checked against an independent computation, and while the learner's
code runs the library's own version is unavailable (see `_without_library`).
"""

import sys
from contextlib import contextmanager

import numpy as np

from ._core import CheckFailed, call, exercise, expect, expect_close


def _call(candidate, *args, on="", **kwargs):
    """`call`, and a clear message for a function that returns nothing."""
    got = call(candidate, *args, on=on, **kwargs)
    if got is None:
        raise CheckFailed(f"your function returned None on {on}: did it forget `return`?")
    return got


@contextmanager
def _without_library(*names):
    """While the learner's code runs, the course.mamba functions `names` refuse to run.

    An exercise that asks for a piece of the library must not be passable by calling it. The
    functions are swapped in every loaded course.mamba module, and where one is a dispatchable
    operation its dispatch is overridden too, so a reference imported before the check (with
    `from course.mamba import ...`) is caught as well.
    """
    def refuse(name):
        def refused(*args, **kwargs):
            raise CheckFailed(f"your code called course.mamba's {name}: write it yourself, without "
                              f"course.mamba (that is what the exercise is about)")
        return refused

    try:  # loaded now, so that an import inside the learner's function finds the swapped names
        import course.mamba  # noqa: F401
    except ImportError:
        pass
    swapped, overrides = [], {}
    for mod_name, module in list(sys.modules.items()):
        if module is None or not (mod_name == "course.mamba" or mod_name.startswith("course.mamba.")):
            continue
        for name in names:
            original = getattr(module, name, None)
            if original is not None:
                swapped.append((module, name, original))
                setattr(module, name, refuse(name))
                if hasattr(original, "default"):  # a dispatchable operation
                    overrides[name] = refuse(name)
                    swapped.append((original, "default", original.default))
                    original.default = refuse(name)
    try:
        from ..tensor import dispatch
        known = set(dispatch.names())
        with dispatch.override({n: f for n, f in overrides.items() if n in known}):
            yield
    finally:
        for owner, name, original in reversed(swapped):
            setattr(owner, name, original)


def _pair(got, on, what="(first, second)"):
    if not (isinstance(got, (tuple, list)) and len(got) == 2):
        n = f" of length {len(got)}" if isinstance(got, (tuple, list)) else ""
        raise CheckFailed(f"expected a pair {what}, got {type(got).__name__}{n} on {on}")
    return got


def _array(got, on, what="result"):
    try:
        return np.asarray(got, dtype=np.float64)
    except (TypeError, ValueError):
        raise CheckFailed(f"expected an array as the {what} on {on}, got {type(got).__name__}") from None


def _same(got, expected, rtol=1e-7, atol=1e-10):
    arr = np.asarray(got, dtype=np.float64)
    return arr.shape == np.shape(expected) and np.allclose(arr, expected, rtol=rtol, atol=atol)


# ---- 5.1 state-space models -----------------------------------------------------------------------


def _ref_zoh(A, B, delta):
    A_bar = np.exp(delta * A)
    return A_bar, np.expm1(delta * A) / A * B  # (delta A)^-1 (exp(delta A) - 1) delta B, elementwise


@exercise("5.1.1", hint="both act entry by entry for a diagonal A: A_bar = exp(delta A), and B_bar is "
                        "delta B times (exp(delta A) - 1) / (delta A)")
def _(candidate, rng):
    cases = [(np.array([-1.0]), np.array([1.0]), 0.5, "A=[-1], B=[1], delta=0.5"),
             (np.array([-0.5, -2.0]), np.array([1.0, 3.0]), 0.1, "A=[-0.5, -2], B=[1, 3], delta=0.1"),
             (np.array([-1.0, -4.0]), np.array([2.0, -1.0]), 2.0, "A=[-1, -4], B=[2, -1], delta=2 (a large step)")]
    cases += [(-rng.uniform(0.1, 5, size=6), rng.normal(size=6), float(rng.uniform(0.01, 1)),
               "random A (6,), B (6,) and delta")]
    for A, B, delta, on in cases:
        got = _pair(_call(candidate, A.copy(), B.copy(), delta, on=on), on, "(A_bar, B_bar)")
        A_bar, B_bar = _ref_zoh(A, B, delta)
        expect_close(got[0], A_bar, on=on, rtol=1e-6, what="A_bar")
        if _same(got[1], delta * B):
            raise CheckFailed(f"B_bar is delta * B on {on}: that is mamba-minimal's simple rule; "
                              f"the zero-order hold has an extra factor")
        expect_close(got[1], B_bar, on=on, rtol=1e-6, what="B_bar")


@exercise("5.1.2", hint="give every array the axes (b, l, d_in, n) with [..., None] or [:, :, None, :]; "
                        "deltaA = exp(delta * A), deltaB_u = delta * B * u, no zero-order-hold factor")
def _(candidate, rng):
    shapes = [(1, 1, 1, 1), (1, 3, 2, 4), (2, 5, 3, 2), (2, 4, 6, 5)]
    for trial, (b, l, d_in, n) in enumerate(shapes):
        delta = rng.uniform(0.01, 1.0, size=(b, l, d_in))
        A = -np.exp(rng.normal(size=(d_in, n)))
        B = rng.normal(size=(b, l, n))
        u = rng.normal(size=(b, l, d_in))
        on = f"random delta {delta.shape}, A {A.shape}, B {B.shape}, u {u.shape}"
        got = _pair(_call(candidate, delta.copy(), A.copy(), B.copy(), u.copy(), on=on), on, "(deltaA, deltaB_u)")
        deltaA = np.exp(delta[..., None] * A)
        deltaB_u = (delta * u)[..., None] * B[:, :, None, :]
        expect_close(got[0], deltaA, on=on, rtol=1e-6, what="deltaA")
        zoh = deltaB_u * np.expm1(delta[..., None] * A) / (delta[..., None] * A)
        if _same(got[1], zoh):
            raise CheckFailed(f"deltaB_u has the zero-order-hold factor on {on}: this exercise asks for "
                              f"mamba-minimal's plain delta * B")
        expect_close(got[1], deltaB_u, on=on, rtol=1e-6, what="deltaB_u")


def _ref_kernel(A_bar, B_bar, C, L):
    return np.array([np.sum(C * A_bar ** j * B_bar) for j in range(L)])


@exercise("5.1.3", hint="K_j = sum over the state of C * A_bar**j * B_bar, for j = 0, 1, ..., L-1: "
                        "the first entry has no A_bar at all")
def _(candidate, rng):
    cases = [(np.array([0.5]), np.array([1.0]), np.array([1.0]), 4, "A_bar=[0.5], B_bar=[1], C=[1], L=4"),
             (np.array([0.9, 0.1]), np.array([1.0, 2.0]), np.array([1.0, -1.0]), 5,
              "A_bar=[0.9, 0.1], B_bar=[1, 2], C=[1, -1], L=5"),
             (np.array([0.5, 0.25]), np.array([1.0, 1.0]), np.array([2.0, 3.0]), 1, "L=1"),
             (rng.uniform(0.1, 0.99, 8), rng.normal(size=8), rng.normal(size=8), 20, "random n=8, L=20")]
    for A_bar, B_bar, C, L, on in cases:
        got = _call(candidate, A_bar.copy(), B_bar.copy(), C.copy(), L, on=on)
        expected = _ref_kernel(A_bar, B_bar, C, L)
        if _same(got, _ref_kernel(A_bar, B_bar, C, L + 1)[1:]):
            raise CheckFailed(f"your kernel starts at A_bar**1 on {on}: K_0 is C * B_bar, the input "
                              f"of this very step")
        expect_close(got, expected, on=on, rtol=1e-6, atol=1e-12, what="kernel")


def _ref_recurrence(A_bar, B_bar, C, D, u):
    x, ys = np.zeros(len(A_bar)), []
    for u_k in u:
        x = A_bar * x + B_bar * u_k
        ys.append(C @ x + D * u_k)
    return np.array(ys)


@exercise("5.1.4", hint="from x = 0: for each u_k, first x = A_bar * x + B_bar * u_k, then "
                        "y_k = C . x + D * u_k (the new state, and the skip term D)")
def _(candidate, rng):
    cases = [(np.array([0.5]), np.array([1.0]), np.array([1.0]), 0.0, np.array([1.0, 0.0, 0.0, 0.0]),
              "A_bar=[0.5], B_bar=[1], C=[1], D=0, an impulse u=[1, 0, 0, 0]"),
             (np.array([0.5]), np.array([1.0]), np.array([1.0]), 2.0, np.array([1.0, 1.0, 1.0]),
              "A_bar=[0.5], B_bar=[1], C=[1], D=2, u=[1, 1, 1]"),
             (np.array([0.9, 0.2]), np.array([0.3, 1.0]), np.array([1.0, -2.0]), 0.5, np.array([1.0, -1.0, 2.0, 0.0, 3.0]),
              "A_bar=[0.9, 0.2], B_bar=[0.3, 1], C=[1, -2], D=0.5, u=[1, -1, 2, 0, 3]")]
    cases += [(rng.uniform(0.1, 0.99, 6), rng.normal(size=6), rng.normal(size=6), float(rng.normal()),
               rng.normal(size=30), "random n=6, L=30")]
    for A_bar, B_bar, C, D, u, on in cases:
        got = _call(candidate, A_bar.copy(), B_bar.copy(), C.copy(), D, u.copy(), on=on)
        expected = _ref_recurrence(A_bar, B_bar, C, D, u)
        arr = _array(got, on)
        if arr.shape == expected.shape:
            old_state = np.concatenate([[0.0], expected[:-1] - D * u[:-1]]) + D * u  # read before the update
            expect(not np.allclose(arr, old_state), f"y_k was read from the state before the update on {on}: "
                                                    f"update the state with u_k first, then read it")
            expect(D == 0 or not np.allclose(arr, expected - D * u), f"the output lacks the skip term D * u_k on {on}")
        expect_close(got, expected, on=on, rtol=1e-6, atol=1e-10, what="output y")


# ---- 5.2 selectivity and the scan ------------------------------------------------------------------


def _ref_combine(first, second):
    (a1, b1), (a2, b2) = first, second
    return a1 * a2, a2 * b1 + b2


@exercise("5.2.1", hint="apply first, then second: second(first(x)) = a2 * (a1 * x + b1) + b2; "
                        "collect the terms in x and the rest")
def _(candidate, rng):
    cases = [((2.0, 1.0), (3.0, 0.0), "first=(2, 1), second=(3, 0)"),
             ((1.0, 5.0), (0.5, 1.0), "first=(1, 5), second=(0.5, 1)"),
             ((0.0, 4.0), (2.0, -1.0), "first=(0, 4), second=(2, -1)")]
    cases += [((rng.uniform(0, 1, (3, 4)), rng.normal(size=(3, 4))), (rng.uniform(0, 1, (3, 4)), rng.normal(size=(3, 4))),
               "random arrays of shape (3, 4)")]
    for first, second, on in cases:
        with _without_library("combine"):
            got = _pair(_call(candidate, first, second, on=on), on, "(a, b)")
        a, b = _ref_combine(first, second)
        expect_close(got[0], a, on=on, rtol=1e-9, what="a")
        if _same(got[1], _ref_combine(second, first)[1]) and not _same(got[1], b):
            raise CheckFailed(f"b is second applied first on {on}: the offset of `first` goes through "
                              f"`second`'s slope, not the other way round")
        expect_close(got[1], b, on=on, rtol=1e-9, what="b")


def _ref_step(x, u_t, delta_t, A, B_t, C_t, D):
    b, d_in, n = x.shape
    x_new = np.empty_like(x)
    for i in range(b):
        for d in range(d_in):
            x_new[i, d] = np.exp(delta_t[i, d] * A[d]) * x[i, d] + delta_t[i, d] * B_t[i] * u_t[i, d]
    y = np.einsum("bdn,bn->bd", x_new, C_t) + D * u_t
    return x_new, y


@exercise("5.2.2", hint="line everything up on (b, d_in, n): delta_t[..., None], B_t[:, None, :]; update the "
                        "state first, then y_t = (x_new * C_t[:, None, :]).sum(-1) + D * u_t")
def _(candidate, rng):
    shapes = [(1, 1, 1), (1, 2, 3), (2, 3, 4), (3, 5, 2)]
    for b, d_in, n in shapes:
        x = rng.normal(size=(b, d_in, n))
        u_t, delta_t = rng.normal(size=(b, d_in)), rng.uniform(0.05, 1.5, size=(b, d_in))
        A = -rng.uniform(0.5, 4, size=(d_in, n))
        B_t, C_t = rng.normal(size=(b, n)), rng.normal(size=(b, n))
        D = rng.normal(size=d_in)
        on = f"random x {x.shape}, u_t {u_t.shape}, A {A.shape}, B_t {B_t.shape}"
        got = _pair(_call(candidate, x.copy(), u_t.copy(), delta_t.copy(), A.copy(), B_t.copy(), C_t.copy(),
                          D.copy(), on=on), on, "(x_new, y_t)")
        x_new, y = _ref_step(x, u_t, delta_t, A, B_t, C_t, D)
        expect_close(got[0], x_new, on=on, rtol=1e-7, atol=1e-10, what="new state x_new")
        if _same(got[1], np.einsum("bdn,bn->bd", x, C_t) + D * u_t):
            raise CheckFailed(f"y_t reads the old state on {on}: read the state after the update")
        expect(not _same(got[1], y - D * u_t), f"y_t lacks the skip term D * u_t on {on}")
        expect_close(got[1], y, on=on, rtol=1e-7, atol=1e-10, what="output y_t")


def _ref_selective_scan(u, delta, A, B, C, D):
    b, l, d_in = u.shape
    x = np.zeros((b, d_in, A.shape[1]))
    ys = []
    for k in range(l):
        x, y = _ref_step(x, u[:, k], delta[:, k], A, B[:, k], C[:, k], D)
        ys.append(y)
    return np.stack(ys, axis=1)


def _scan_inputs(rng, b, l, d_in, n):
    u = rng.normal(size=(b, l, d_in))
    delta = rng.uniform(0.05, 1.5, size=(b, l, d_in))
    A = -rng.uniform(0.5, 4, size=(d_in, n))
    return u, delta, A, rng.normal(size=(b, l, n)), rng.normal(size=(b, l, n)), rng.normal(size=d_in)


_SCANS = ("selective_scan", "linear_recurrence", "_sequential_forward", "_parallel_forward", "_fast_forward")


@exercise("5.2.3", hint="x starts at zeros (b, d_in, n); for each position k: x = exp(delta_k A) * x + "
                        "delta_k B_k u_k (lined up on (b, d_in, n)), then y_k = sum over n of x * C_k, "
                        "plus D * u_k")
def _(candidate, rng):
    for b, l, d_in, n in [(1, 1, 1, 1), (1, 4, 2, 3), (2, 7, 3, 4), (2, 12, 4, 2)]:
        args = _scan_inputs(rng, b, l, d_in, n)
        on = f"random u {args[0].shape}, A {args[2].shape}, B {args[3].shape}"
        with _without_library(*_SCANS):
            got = _call(candidate, *(a.copy() for a in args), on=on)
        expected = _ref_selective_scan(*args)
        expect(not _same(got, expected - args[0] * args[5]), f"y lacks the skip term D * u on {on}")
        expect_close(got, expected, on=on, rtol=1e-7, atol=1e-10, what="output y")


class _CountingCombine:
    def __init__(self):
        self.calls = 0

    def __call__(self, first, second):
        self.calls += 1
        return _ref_combine(first, second)


@exercise("5.2.4", hint="in round r (offset = 1, 2, 4, ...) combine every pair with the pair `offset` "
                        "places before it, all of them in one call on array slices; stop when offset >= L")
def _(candidate, rng):
    cases = [(np.array([2.0]), np.array([1.0]), "a=[2], b=[1]"),
             (np.array([1.0, 2.0, 3.0]), np.array([1.0, 1.0, 1.0]), "a=[1, 2, 3], b=[1, 1, 1]"),
             (np.full(8, 0.5), np.arange(8.0), "a = 0.5 everywhere, b=[0, 1, ..., 7]")]
    cases += [(rng.uniform(0.5, 1, size=(L, 3)), rng.normal(size=(L, 3)), f"random a, b of shape ({L}, 3)")
              for L in (5, 64, 100)]
    for a, b, on in cases:
        combine = _CountingCombine()
        with _without_library(*_SCANS, "combine"):
            got = _call(candidate, a.copy(), b.copy(), combine, on=on)
        h, x = np.empty_like(b), np.zeros_like(b[0])
        for t in range(len(a)):
            x = a[t] * x + b[t]
            h[t] = x
        expect_close(got, h, on=on, rtol=1e-8, atol=1e-10, what="h")
        L = len(a)
        rounds = int(np.ceil(np.log2(L))) if L > 1 else 0
        expect(combine.calls >= rounds, f"your scan called the given combine {combine.calls} times on {on}: "
                                        f"combine pairs with it, on whole slices at a time")
        expect(combine.calls <= 2 * rounds + 1,
               f"your scan called combine {combine.calls} times on {on}; a log-depth scan needs about "
               f"log2(L) = {np.log2(L):.1f} calls, each on whole slices of the arrays")
