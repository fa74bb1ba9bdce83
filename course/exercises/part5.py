"""Checks of part 5: state-space models (5.1), the selective scan (5.2), the Mamba block (5.3) and
Mamba against GPT (5.4).

Each reference below is written here in NumPy, apart from `course.mamba`: an exercise that asks
for a piece of the library is checked against an independent computation, and while the learner's
code runs the library's own version is unavailable (see `_without_library`).
"""

import numpy as np

from ._core import CheckFailed, call, exercise, expect, expect_close


def _call(candidate, *args, on="", **kwargs):
    """`call`, and a clear message for a function that returns nothing."""
    got = call(candidate, *args, on=on, **kwargs)
    if got is None:
        raise CheckFailed(f"your function returned None on {on}: did it forget `return`?")
    return got


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
