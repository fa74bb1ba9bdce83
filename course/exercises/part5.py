"""Checks of part 5: state-space models (5.1), the selective scan (5.2), the Mamba block (5.3) and
Mamba against GPT (5.4).

Each reference below is written here in NumPy, apart from `course.mamba`: an exercise that asks
for a piece of the library is checked against an independent computation, and while the learner's
code runs the library's own version is unavailable (the `forbid` list of its `exercise`).
"""

import numpy as np

from ._core import CheckFailed, call, exercise, expect, expect_close


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


# Answers computed in float32 are right too: the checks compare to within its rounding.
_RTOL, _ATOL = 1e-5, 1e-6


def _same(got, expected, rtol=1e-5, atol=1e-7):
    arr = np.asarray(got, dtype=np.float64)
    return arr.shape == np.shape(expected) and np.allclose(arr, expected, rtol=rtol, atol=atol)


# ---- 5.1 state-space models -----------------------------------------------------------------------


def _ref_zoh(A, B, delta):
    A_bar = np.exp(delta * A)
    factor = np.ones_like(A, dtype=np.float64)  # (exp(delta A) - 1) / (delta A), which tends to 1 as A -> 0
    nonzero = A != 0
    factor[nonzero] = np.expm1(delta * A[nonzero]) / (delta * A[nonzero])
    return A_bar, factor * delta * B


@exercise("5.1.1",
          hint="work entry by entry, as section 2 does; where A is 0 the factor (exp(delta A) - 1) / (delta A) is "
               "0/0: use its limit as A -> 0",
          answer_hint="A_bar = exp(delta A); B_bar = delta B (exp(delta A) - 1) / (delta A) where A != 0 and delta B"
                      " where A == 0 (np.where, or a mask)")
def _(candidate, rng):
    cases = [(np.array([-1.0]), np.array([1.0]), 0.5, "A=[-1], B=[1], delta=0.5"),
             (np.array([-0.5, -2.0]), np.array([1.0, 3.0]), 0.1, "A=[-0.5, -2], B=[1, 3], delta=0.1"),
             (np.array([-1.0, -4.0]), np.array([2.0, -1.0]), 2.0, "A=[-1, -4], B=[2, -1], delta=2 (a large step)"),
             (np.array([0.0, -1.0]), np.array([1.0, 1.0]), 0.5, "A=[0, -1] (a pure integrator), B=[1, 1], delta=0.5")]
    A = -rng.uniform(0.1, 5, size=6)
    A[[1, 4]] = 0.0
    cases += [(A, rng.normal(size=6), float(rng.uniform(0.01, 1)), "random A (6,) with two zeros, B (6,) and delta")]
    for A, B, delta, on in cases:
        with np.errstate(divide="ignore", invalid="ignore"):  # a 0/0 shows as nan in the answer, not as a warning
            got = _pair(call(candidate, A.copy(), B.copy(), delta, on=on), on, "(A_bar, B_bar)")
        A_bar, B_bar = _ref_zoh(A, B, delta)
        expect_close(got[0], A_bar, on=on, rtol=_RTOL, atol=_ATOL, what="A_bar")
        if _same(got[1], delta * B):
            raise CheckFailed(f"B_bar is delta * B on {on}: that is mamba-minimal's simple rule; "
                              f"the zero-order hold has an extra factor")
        got_b = np.asarray(got[1], dtype=np.float64)
        if got_b.shape == B.shape and np.isnan(got_b).any():
            raise CheckFailed(f"B_bar has nan where A = 0 on {on}: there (exp(delta A) - 1) / (delta A) is 0/0; "
                              f"use its limit")
        expect_close(got[1], B_bar, on=on, rtol=_RTOL, atol=_ATOL, what="B_bar")


@exercise("5.1.2",
          hint="give every array the axes (b, l, d_in, n) with [..., None] or [:, :, None, :]; no zero-order-hold "
               "factor here",
          answer_hint="deltaA = exp(delta[..., None] * A); deltaB_u = (delta * u)[..., None] * B[:, :, None, :]")
def _(candidate, rng):
    shapes = [(1, 1, 1, 1), (1, 3, 2, 4), (2, 5, 3, 2), (2, 4, 6, 5)]
    for trial, (b, l, d_in, n) in enumerate(shapes):
        delta = rng.uniform(0.01, 1.0, size=(b, l, d_in))
        A = -np.exp(rng.normal(size=(d_in, n)))
        B = rng.normal(size=(b, l, n))
        u = rng.normal(size=(b, l, d_in))
        on = f"random delta {delta.shape}, A {A.shape}, B {B.shape}, u {u.shape}"
        got = _pair(call(candidate, delta.copy(), A.copy(), B.copy(), u.copy(), on=on), on, "(deltaA, deltaB_u)")
        deltaA = np.exp(delta[..., None] * A)
        deltaB_u = (delta * u)[..., None] * B[:, :, None, :]
        expect_close(got[0], deltaA, on=on, rtol=_RTOL, atol=_ATOL, what="deltaA")
        zoh = deltaB_u * np.expm1(delta[..., None] * A) / (delta[..., None] * A)
        if _same(got[1], zoh):
            raise CheckFailed(f"deltaB_u has the zero-order-hold factor on {on}: this exercise asks for "
                              f"mamba-minimal's plain delta * B")
        expect_close(got[1], deltaB_u, on=on, rtol=_RTOL, atol=_ATOL, what="deltaB_u")


def _ref_kernel(A_bar, B_bar, C, L):
    return np.array([np.sum(C * A_bar ** j * B_bar) for j in range(L)])


@exercise("5.1.3",
          hint="unroll the recurrence from a zero state: which power of A_bar multiplies the input of this very "
               "step?",
          answer_hint="K_j = sum over the state of C * A_bar**j * B_bar, for j = 0, 1, ..., L-1")
def _(candidate, rng):
    cases = [(np.array([0.5]), np.array([1.0]), np.array([1.0]), 4, "A_bar=[0.5], B_bar=[1], C=[1], L=4"),
             (np.array([0.9, 0.1]), np.array([1.0, 2.0]), np.array([1.0, -1.0]), 5,
              "A_bar=[0.9, 0.1], B_bar=[1, 2], C=[1, -1], L=5"),
             (np.array([0.5, 0.25]), np.array([1.0, 1.0]), np.array([2.0, 3.0]), 1, "L=1"),
             (rng.uniform(0.1, 0.99, 8), rng.normal(size=8), rng.normal(size=8), 20, "random n=8, L=20")]
    for A_bar, B_bar, C, L, on in cases:
        got = call(candidate, A_bar.copy(), B_bar.copy(), C.copy(), L, on=on)
        expected = _ref_kernel(A_bar, B_bar, C, L)
        if _same(got, _ref_kernel(A_bar, B_bar, C, L + 1)[1:]):
            raise CheckFailed(f"your kernel starts at A_bar**1 on {on}: K_0 is C * B_bar, the input "
                              f"of this very step")
        expect_close(got, expected, on=on, rtol=_RTOL, atol=_ATOL, what="kernel")


def _ref_recurrence(A_bar, B_bar, C, D, u, x0):
    x, ys = np.array(x0, dtype=np.float64), []
    for u_k in u:
        x = A_bar * x + B_bar * u_k
        ys.append(C @ x + D * u_k)
    return np.array(ys), x


@exercise("5.1.4",
          hint="start from x0, not from zeros; at each step the state takes in u_k before the output reads it, and "
               "the output has a skip term",
          answer_hint="x = x0; for each u_k: x = A_bar * x + B_bar * u_k, then y_k = C . x + D * u_k; return (the "
                      "y_k, the last x)")
def _(candidate, rng):
    cases = [(np.array([0.5]), np.array([1.0]), np.array([1.0]), 0.0, np.array([1.0, 0.0, 0.0, 0.0]), np.zeros(1),
              "A_bar=[0.5], B_bar=[1], C=[1], D=0, an impulse u=[1, 0, 0, 0], x0=[0]"),
             (np.array([0.5]), np.array([1.0]), np.array([1.0]), 2.0, np.array([1.0, 1.0, 1.0]), np.zeros(1),
              "A_bar=[0.5], B_bar=[1], C=[1], D=2, u=[1, 1, 1], x0=[0]"),
             (np.array([0.5]), np.array([1.0]), np.array([1.0]), 0.0, np.zeros(3), np.array([8.0]),
              "A_bar=[0.5], B_bar=[1], C=[1], D=0, u=[0, 0, 0], x0=[8] (the state decays)"),
             (np.array([0.9, 0.2]), np.array([0.3, 1.0]), np.array([1.0, -2.0]), 0.5,
              np.array([1.0, -1.0, 2.0, 0.0, 3.0]), np.array([1.0, -1.0]),
              "A_bar=[0.9, 0.2], B_bar=[0.3, 1], C=[1, -2], D=0.5, u=[1, -1, 2, 0, 3], x0=[1, -1]")]
    cases += [(rng.uniform(0.1, 0.99, 6), rng.normal(size=6), rng.normal(size=6), float(rng.normal()),
               rng.normal(size=30), rng.normal(size=6), "random n=6, L=30, x0")]
    for A_bar, B_bar, C, D, u, x0, on in cases:
        got = _pair(call(candidate, A_bar.copy(), B_bar.copy(), C.copy(), D, u.copy(), x0.copy(), on=on), on,
                    "(y, x_last)")
        expected, x_last = _ref_recurrence(A_bar, B_bar, C, D, u, x0)
        arr = _array(got[0], on, "output y")
        if arr.shape == expected.shape:
            if x0.any():
                expect(not np.allclose(arr, _ref_recurrence(A_bar, B_bar, C, D, u, 0 * x0)[0]),
                       f"the outputs ignore x0 on {on}: the recurrence starts from the given state")
            states = [x0] + [None] * len(u)
            for k, u_k in enumerate(u):
                states[k + 1] = A_bar * states[k] + B_bar * u_k
            old = np.array([C @ states[k] + D * u[k] for k in range(len(u))])  # read before the update
            expect(not np.allclose(arr, old), f"y_k was read from the state before the update on {on}: "
                                              f"update the state with u_k first, then read it")
            expect(D == 0 or not np.allclose(arr, expected - D * u), f"the output lacks the skip term D * u_k on {on}")
        expect_close(got[0], expected, on=on, rtol=_RTOL, atol=_ATOL, what="output y")
        expect_close(got[1], x_last, on=on, rtol=_RTOL, atol=_ATOL, what="last state")


# ---- 5.2 selectivity and the scan ------------------------------------------------------------------


def _ref_combine(first, second):
    (a1, b1), (a2, b2) = first, second
    return a1 * a2, a2 * b1 + b2


def _ref_combine_affine(first, second):
    (A1, b1), (A2, b2) = first, second
    return A2 @ A1, A2 @ b1 + b2


@exercise("5.2.1",
          hint="write out what applying first, then second, does to x, and collect the terms in x and the rest; "
               "matrix products do not commute",
          answer_hint="A2 (A1 x + b1) + b2 = (A2 A1) x + (A2 b1 + b2)",
          forbid=["course.mamba.scan.combine"], task="compose the affine maps in NumPy")
def _(candidate, rng):
    eye = np.eye(2)
    cases = [((np.array([[2.0]]), np.array([1.0])), (np.array([[3.0]]), np.array([0.0])),
              "1 x 1: first (2, 1), second (3, 0)"),
             ((eye, np.array([1.0, 2.0])), (2 * eye, np.array([0.0, -1.0])),
              "first (I, [1, 2]), second (2I, [0, -1])"),
             ((np.array([[0.0, 1.0], [0.0, 0.0]]), np.zeros(2)), (np.array([[1.0, 0.0], [1.0, 1.0]]), np.zeros(2)),
              "first A1=[[0, 1], [0, 0]], second A2=[[1, 0], [1, 1]], b = 0 (A1 A2 and A2 A1 differ)")]
    cases += [((rng.normal(size=(3, 3)), rng.normal(size=3)), (rng.normal(size=(3, 3)), rng.normal(size=3)),
               "random 3 x 3 matrices and offsets")]
    for first, second, on in cases:
        got = _pair(call(candidate, first, second, on=on), on, "(A, b)")
        A, b = _ref_combine_affine(first, second)
        if _same(got[0], first[0] @ second[0]) and not _same(got[0], A):
            raise CheckFailed(f"the matrices are multiplied in the wrong order on {on}: `first` acts first, "
                              f"so it stands on the right of the product")
        expect_close(got[0], A, on=on, rtol=_RTOL, atol=_ATOL, what="A")
        if _same(got[1], first[0] @ second[1] + first[1]) and not _same(got[1], b):
            raise CheckFailed(f"b is second applied first on {on}: the offset of `first` goes through "
                              f"`second`'s matrix, not the other way round")
        expect_close(got[1], b, on=on, rtol=_RTOL, atol=_ATOL, what="b")


def _ref_step(x, u_t, delta_t, A, B_t, C_t, D):
    b, d_in, n = x.shape
    x_new = np.empty_like(x)
    for i in range(b):
        for d in range(d_in):
            x_new[i, d] = np.exp(delta_t[i, d] * A[d]) * x[i, d] + delta_t[i, d] * B_t[i] * u_t[i, d]
    y = np.einsum("bdn,bn->bd", x_new, C_t) + D * u_t
    return x_new, y


@exercise("5.2.2",
          hint="line everything up on (b, d_in, n) with None axes; update the state first, then read it",
          answer_hint="x_new = exp(delta_t[..., None] * A) * x + (delta_t * u_t)[..., None] * B_t[:, None, :]; y_t ="
                      " (x_new * C_t[:, None, :]).sum(-1) + D * u_t")
def _(candidate, rng):
    shapes = [(1, 1, 1), (1, 2, 3), (2, 3, 4), (3, 5, 2)]
    for b, d_in, n in shapes:
        x = rng.normal(size=(b, d_in, n))
        u_t, delta_t = rng.normal(size=(b, d_in)), rng.uniform(0.05, 1.5, size=(b, d_in))
        A = -rng.uniform(0.5, 4, size=(d_in, n))
        B_t, C_t = rng.normal(size=(b, n)), rng.normal(size=(b, n))
        D = rng.normal(size=d_in)
        on = f"random x {x.shape}, u_t {u_t.shape}, A {A.shape}, B_t {B_t.shape}"
        got = _pair(call(candidate, x.copy(), u_t.copy(), delta_t.copy(), A.copy(), B_t.copy(), C_t.copy(),
                          D.copy(), on=on), on, "(x_new, y_t)")
        x_new, y = _ref_step(x, u_t, delta_t, A, B_t, C_t, D)
        expect_close(got[0], x_new, on=on, rtol=_RTOL, atol=_ATOL, what="new state x_new")
        if _same(got[1], np.einsum("bdn,bn->bd", x, C_t) + D * u_t):
            raise CheckFailed(f"y_t reads the old state on {on}: read the state after the update")
        expect(not _same(got[1], y - D * u_t), f"y_t lacks the skip term D * u_t on {on}")
        expect_close(got[1], y, on=on, rtol=_RTOL, atol=_ATOL, what="output y_t")


def _ref_selective_scan(u, delta, A, B, C, D, h0):
    x = np.array(h0, dtype=np.float64)
    ys = []
    for k in range(u.shape[1]):
        x, y = _ref_step(x, u[:, k], delta[:, k], A, B[:, k], C[:, k], D)
        ys.append(y)
    return np.stack(ys, axis=1), x


def _scan_inputs(rng, b, l, d_in, n):
    u = rng.normal(size=(b, l, d_in))
    delta = rng.uniform(0.05, 1.5, size=(b, l, d_in))
    A = -rng.uniform(0.5, 4, size=(d_in, n))
    return u, delta, A, rng.normal(size=(b, l, n)), rng.normal(size=(b, l, n)), rng.normal(size=d_in)


# the scan and every function of the library that computes one
_SCANS = ["course.mamba.selective_scan", "course.mamba.scan.linear_recurrence", "course.mamba.scan._sequential_forward",
          "course.mamba.scan._parallel_forward", "course.mamba.scan._fast_forward"]


@exercise("5.2.3",
          hint="section 3's loop, started from h0 instead of zeros, and keeping the state after the last position",
          answer_hint="h = h0; for each position k: h = exp(delta_k A) * h + delta_k B_k u_k (lined up on (b, d_in, "
                      "n)), y_k = sum over n of h * C_k, plus D * u_k; return all the y_k and the last h",
          forbid=_SCANS, task="write the scan loop in NumPy")
def _(candidate, rng):
    for b, l, d_in, n in [(1, 1, 1, 1), (1, 4, 2, 3), (2, 7, 3, 4), (2, 12, 4, 2)]:
        args = _scan_inputs(rng, b, l, d_in, n)
        h0 = rng.normal(size=(b, d_in, n))
        on = f"random u {args[0].shape}, A {args[2].shape}, B {args[3].shape}, h0 {h0.shape}"
        got = _pair(call(candidate, *(a.copy() for a in args), h0.copy(), on=on), on, "(y, h_last)")
        expected, h_last = _ref_selective_scan(*args, h0)
        expect(not _same(got[0], _ref_selective_scan(*args, 0 * h0)[0]),
               f"y is the scan from a zero state on {on}: start from h0")
        expect(not _same(got[0], expected - args[0] * args[5]), f"y lacks the skip term D * u on {on}")
        expect_close(got[0], expected, on=on, rtol=_RTOL, atol=_ATOL, what="output y")
        expect_close(got[1], h_last, on=on, rtol=_RTOL, atol=_ATOL, what="last state h_last")


def _scan_swapped(a, b):
    """The log-depth scan with the later pair given to combine first: the classic mix-up of the order."""
    a, b = np.array(a, dtype=np.float64), np.array(b, dtype=np.float64)
    offset = 1
    while offset < len(a):
        a[offset:], b[offset:] = _ref_combine((a[offset:], b[offset:]), (a[:-offset], b[:-offset]))
        offset *= 2
    return b


class _CountingCombine:
    def __init__(self):
        self.calls = 0

    def __call__(self, first, second):
        self.calls += 1
        return _ref_combine(first, second)


@exercise("5.2.4",
          hint="section 5's rounds: one call of combine per round, on whole slices of the arrays",
          answer_hint="offset = 1, 2, 4, ... while offset < L: combine the pairs at [:-offset] (earlier) with those "
                      "at [offset:] (later) in one call, and store the result at [offset:]",
          forbid=[*_SCANS, "course.mamba.scan.combine"], task="write the log-depth scan with the given combine")
def _(candidate, rng):
    cases = [(np.array([2.0]), np.array([1.0]), "a=[2], b=[1]"),
             (np.array([1.0, 2.0, 3.0]), np.array([1.0, 1.0, 1.0]), "a=[1, 2, 3], b=[1, 1, 1]"),
             (np.full(8, 0.5), np.arange(8.0), "a = 0.5 everywhere, b=[0, 1, ..., 7]")]
    cases += [(rng.uniform(0.5, 1, size=(L, 3)), rng.normal(size=(L, 3)), f"random a, b of shape ({L}, 3)")
              for L in (5, 64, 100)]
    for a, b, on in cases:
        combine = _CountingCombine()
        got = call(candidate, a.copy(), b.copy(), combine, on=on)
        h, x = np.empty_like(b), np.zeros_like(b[0])
        for t in range(len(a)):
            x = a[t] * x + b[t]
            h[t] = x
        if _same(got, _scan_swapped(a, b), rtol=_RTOL, atol=_ATOL) and not _same(got, h, rtol=_RTOL, atol=_ATOL):
            raise CheckFailed(f"the pairs go into combine in the wrong order on {on}: its first argument is the "
                              f"earlier pair (the steps that happen first)")
        expect_close(got, h, on=on, rtol=_RTOL, atol=_ATOL, what="h")
        L = len(a)
        rounds = int(np.ceil(np.log2(L))) if L > 1 else 0
        expect(combine.calls >= rounds, f"your scan called the given combine {combine.calls} times on {on}: "
                                        f"combine pairs with it, on whole slices at a time")
        expect(combine.calls <= 2 * rounds + 1,
               f"your scan called combine {combine.calls} times on {on}; a log-depth scan needs about "
               f"log2(L) = {np.log2(L):.1f} calls, each on whole slices of the arrays")


# ---- 5.3 the Mamba block and model ---------------------------------------------------------------


def _ref_rms_backward(x, weight, g, eps=1e-5):
    d = x.shape[-1]
    dx, dw = np.zeros_like(x, dtype=np.float64), np.zeros(d)
    for idx in np.ndindex(*x.shape[:-1]):  # one vector at a time, with the Jacobian written out
        v = x[idx]
        r = 1 / np.sqrt((v * v).mean() + eps)
        # y_i = v_i r w_i, and d r / d v_j = -r^3 v_j / d
        jac = (np.diag(np.full(d, r)) - np.outer(v, v) * r ** 3 / d) * weight[:, None]
        dx[idx] = jac.T @ g[idx]
        dw += g[idx] * v * r
    return dx, dw


@exercise("5.3.1",
          hint="the root mean square of a vector depends on every entry of it, so dx has a second term; dweight sums"
               " over all the leading axes",
          answer_hint="with r = 1 / sqrt(mean(x**2) + eps) per vector, xhat = x r and gw = grad * weight: dx = r * "
                      "(gw - xhat * mean(gw * xhat)), dweight = the sum of grad * xhat over the leading axes",
          forbid=["course.mamba.rms_norm", "course.mamba.RMSNorm", "course.tensor.Tensor.backward"],
          task="write the backward by hand in NumPy")
def _(candidate, rng):
    cases = [(np.array([[3.0, 4.0]]), np.ones(2), np.array([[1.0, 0.0]]), 1e-5, "x=[[3, 4]], weight 1, grad [[1, 0]]"),
             (np.array([[1.0, 2.0, 3.0, 4.0]]), np.array([1.0, 2.0, 0.5, -1.0]), np.ones((1, 4)), 1e-5,
              "x=[[1, 2, 3, 4]], weight [1, 2, 0.5, -1], grad of ones"),
             (np.array([[0.001, -0.002]]), np.ones(2), np.array([[1.0, 2.0]]), 1e-5,
              "x=[[0.001, -0.002]] (mean square below eps)"),
             (np.array([[0.3, -0.4]]), np.array([1.0, -2.0]), np.array([[1.0, 2.0]]), 0.1,
              "x=[[0.3, -0.4]], weight [1, -2], grad [[1, 2]], eps=0.1")]
    cases += [(rng.normal(size=(2, 3, 8)) * 3 + 1, rng.normal(size=8), rng.normal(size=(2, 3, 8)), 1e-5,
               "random x (2, 3, 8), weight (8,) and grad (2, 3, 8)")]
    for x, w, g, eps, on in cases:
        got = _pair(call(candidate, x.copy(), w.copy(), g.copy(), eps, on=on), on, "(dx, dweight)")
        dx, dw = _ref_rms_backward(x, w, g, eps)
        r = 1 / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)
        if _same(got[0], g * w * r, rtol=1e-5, atol=1e-8) and not _same(got[0], dx, rtol=1e-5, atol=1e-8):
            raise CheckFailed(f"dx treats the root mean square as a constant on {on}: it depends on every x of "
                              f"the vector, which adds a second term")
        if eps != 1e-5 and _same(got[0], _ref_rms_backward(x, w, g)[0]) and not _same(got[0], dx):
            raise CheckFailed(f"dx ignores the eps it is given on {on}: use the argument, not 1e-5")
        expect_close(got[0], dx, on=on, rtol=_RTOL, atol=_ATOL, what="dx")
        expect_close(got[1], dw, on=on, rtol=_RTOL, atol=_ATOL, what="dweight")


def _ref_conv(x, weight, bias):
    b, l, d = x.shape
    k = weight.shape[1]
    y = np.tile(bias, (b, l, 1)).astype(np.float64)
    for t in range(l):
        for j in range(k):
            s = t - (k - 1) + j  # tap j reads k - 1 - j steps back
            if s >= 0:
                y[:, t] += weight[:, j] * x[:, s]
    return y


def _ref_conv_backward(x, weight, g):
    b, l, d = x.shape
    k = weight.shape[1]
    dx, dw = np.zeros(x.shape), np.zeros(weight.shape)
    for t in range(l):  # y[t] = sum_j weight[:, j] x[t - (k - 1) + j]: send g[t] back along each term
        for j in range(k):
            s = t - (k - 1) + j
            if s >= 0:
                dx[:, s] += weight[:, j] * g[:, t]
                dw[:, j] += (g[:, t] * x[:, s]).sum(axis=0)
    return dx, dw


@exercise("5.3.2",
          hint="the input at position s reaches the outputs s to s + k - 1: send the gradient back along each "
               "of them; a tap's weight gradient sums over batch and time",
          answer_hint="dx[:, s] = sum_j weight[:, j] * grad[:, s + k - 1 - j] (zero past the end); dweight[:, j] = "
                      "the sum over b and t of grad[:, t] * x[:, t - (k - 1) + j] (zero before 0)",
          forbid=["course.mamba.causal_conv1d", "course.mamba.CausalConv1d", "course.tensor.Tensor.backward"],
          task="write the backward by hand in NumPy")
def _(candidate, rng):
    ramp = np.arange(1.0, 6.0).reshape(1, 5, 1)
    impulse = np.zeros((1, 5, 1))
    impulse[0, 2, 0] = 1.0
    cases = [(ramp, np.array([[0.0, 0.0, 1.0]]), impulse, "x=[1, 2, 3, 4, 5], weight [[0, 0, 1]], grad 1 at t=2 only"),
             (ramp, np.array([[1.0, 2.0, 3.0]]), impulse, "x=[1, 2, 3, 4, 5], weight [[1, 2, 3]], grad 1 at t=2 only"),
             (ramp, np.array([[1.0, 2.0, 3.0]]), np.ones((1, 5, 1)),
              "x=[1, 2, 3, 4, 5], weight [[1, 2, 3]], grad of ones")]
    cases += [(rng.normal(size=(2, 7, 3)), rng.normal(size=(3, 4)), rng.normal(size=(2, 7, 3)),
               "random x (2, 7, 3), weight (3, 4), grad (2, 7, 3)")]
    for x, w, g, on in cases:
        got = _pair(call(candidate, x.copy(), w.copy(), g.copy(), on=on), on, "(dx, dweight)")
        dx, dw = _ref_conv_backward(x, w, g)
        forward_in_time = _ref_conv(g, w, np.zeros(w.shape[0]))
        if _same(got[0], forward_in_time) and not _same(got[0], dx):
            raise CheckFailed(f"dx runs the convolution forward in time on {on}: the gradient flows backward, "
                              f"x_s reaches the outputs s to s + k - 1")
        expect_close(got[0], dx, on=on, rtol=_RTOL, atol=_ATOL, what="dx")
        if _same(got[1], dw[:, ::-1]) and not _same(got[1], dw):
            raise CheckFailed(f"dweight has its taps reversed on {on}: tap j multiplies x[t - (k - 1) + j]")
        expect_close(got[1], dw, on=on, rtol=_RTOL, atol=_ATOL, what="dweight")


@exercise("5.3.3",
          hint="put the new input at the end of the window (time axis 1), apply the filter to the window, and keep "
               "the newest k - 1 inputs for the next step",
          answer_hint="window = concatenate(state, u_t[:, None]) on axis 1; out_t = (window * weight.T).sum(axis=1) "
                      "+ bias; new_state = window[:, 1:]",
          forbid=["course.mamba.Mamba._mixer_step", "course.mamba.causal_conv1d", "course.mamba.CausalConv1d"],
          task="write the convolution step in NumPy")
def _(candidate, rng):
    for b, k, d in [(1, 2, 1), (1, 4, 2), (2, 4, 3), (3, 3, 5)]:
        state, u_t = rng.normal(size=(b, k - 1, d)), rng.normal(size=(b, d))
        w, bias = rng.normal(size=(d, k)), rng.normal(size=d)
        on = f"random conv_state {state.shape}, u_t {u_t.shape}, weight {w.shape}"
        got = _pair(call(candidate, state.copy(), u_t.copy(), w.copy(), bias.copy(), on=on), on,
                    "(out_t, new_state)")
        window = np.concatenate([state, u_t[:, None]], axis=1)
        out_t = _ref_conv(window, w, bias)[:, -1]
        if _same(got[0], _ref_conv(window, w[:, ::-1], bias)[:, -1]) and not _same(got[0], out_t):
            raise CheckFailed(f"out_t applies the taps in reverse order on {on}: as in section 3, the last tap "
                              f"multiplies the newest input")
        expect_close(got[0], out_t, on=on, rtol=_RTOL, atol=_ATOL, what="out_t")
        if _same(got[1], state):
            raise CheckFailed(f"the state did not move on, on {on}: the next step needs the newest input in it")
        expect_close(got[1], window[:, 1:], on=on, rtol=_RTOL, atol=_ATOL, what="new state")


@exercise("5.3.4",
          hint="section 4: x_proj gives delta (low rank), B and C in that order; delta then goes through dt_proj and"
               " something that makes it positive",
          answer_hint="dbc = u @ x_proj_weight.T, split into dbc[..., :r], dbc[..., r:r + n], dbc[..., r + n:] (r = "
                      "dt_rank); delta = softplus(dbc[..., :r] @ dt_proj_weight.T + dt_proj_bias)",
          forbid=["course.mamba.MambaBlock.ssm_parameters"], task="compute them in NumPy")
def _(candidate, rng):
    for b, l, d_in, r, n in [(1, 1, 2, 1, 1), (1, 3, 4, 1, 2), (2, 5, 8, 2, 4)]:
        u = rng.normal(size=(b, l, d_in))
        xw, dw, db = rng.normal(size=(r + 2 * n, d_in)), rng.normal(size=(d_in, r)), rng.normal(size=d_in)
        on = f"random u {u.shape}, x_proj_weight {xw.shape}, dt_proj_weight {dw.shape}, n={n}"
        got = call(candidate, u.copy(), xw.copy(), dw.copy(), db.copy(), n, on=on)
        if not (isinstance(got, (tuple, list)) and len(got) == 3):
            raise CheckFailed(f"expected a triple (delta, B, C), got {type(got).__name__} on {on}")
        dbc = u @ xw.T
        pre = dbc[..., :r] @ dw.T + db
        delta = np.logaddexp(0.0, pre)
        B, C = dbc[..., r:r + n], dbc[..., r + n:]
        if _same(got[0], pre):
            raise CheckFailed(f"delta can be negative on {on}: the steps go through softplus")
        expect_close(got[0], delta, on=on, rtol=_RTOL, atol=_ATOL, what="delta")
        if _same(got[1], C) and _same(got[2], B):
            raise CheckFailed(f"B and C are swapped on {on}: after delta come B, then C")
        expect_close(got[1], B, on=on, rtol=_RTOL, atol=_ATOL, what="B")
        expect_close(got[2], C, on=on, rtol=_RTOL, atol=_ATOL, what="C")


def _ref_mamba_count(d_model, n_layer, vocab_size, d_state, expand, d_conv, tied=True, pad=True):
    E, d, n, k = d_model, expand * d_model, d_state, d_conv
    r = -(-d_model // 16)
    layer = E + 2 * d * E + d * k + d + d * (r + 2 * n) + r * d + d + d * n + d + d * E
    V = -(-vocab_size // 8) * 8 if pad else vocab_size
    return n_layer * layer + V * E * (1 if tied else 2) + E


@exercise("5.3.5",
          hint="section 7's table, one module at a time; the head shares the embedding, whose rows are the "
               "padded vocabulary",
          answer_hint="per layer: norm E, in_proj 2dE, conv1d dk + d, x_proj d(r + 2n), dt_proj rd + d, A_log dn, D "
                      "d, out_proj dE (d = expand E, r = ceil(E / 16)); plus padded_vocab E and norm_f E",
          forbid=["course.mamba.Mamba", "course.mamba.MambaConfig"], task="count them with a formula")
def _(candidate, rng):
    cases = [(64, 2, 65, 16, 2, 4), (16, 1, 8, 4, 2, 3), (768, 24, 50277, 16, 2, 4), (40, 3, 10, 8, 1, 2)]
    cases += [(8 * int(rng.integers(1, 20)), int(rng.integers(1, 5)), int(rng.integers(2, 300)),
               int(rng.integers(1, 20)), int(rng.integers(1, 4)), int(rng.integers(2, 6)))]
    for E, L, V, n, expand, k in cases:
        on = f"d_model={E}, n_layer={L}, vocab_size={V}, d_state={n}, expand={expand}, d_conv={k}"
        got = call(candidate, E, L, V, n, expand, k, on=on)
        try:
            got = int(got)
        except (TypeError, ValueError):
            raise CheckFailed(f"expected a whole number, got {got!r} on {on}") from None
        expected = _ref_mamba_count(E, L, V, n, expand, k)
        if got == _ref_mamba_count(E, L, V, n, expand, k, tied=False) != expected:
            raise CheckFailed(f"you counted lm_head on its own on {on}: it is the embedding table itself (tied)")
        if got == _ref_mamba_count(E, L, V, n, expand, k, pad=False) != expected:
            raise CheckFailed(f"the embedding has padded_vocab_size rows (vocab_size rounded up to a multiple "
                              f"of 8), on {on}")
        expect(got == expected, f"expected {expected:,} parameters, got {got:,} on {on}")



# ---- 5.4 Mamba against GPT ------------------------------------------------------------------------


def _ref_masked(logits, targets, vocab_size):
    keep = targets != -1
    return float((logits[..., :vocab_size].argmax(-1)[keep] == targets[keep]).mean())


def _task_logits(rng, b, t, V, padded, answer_from):
    """Random logits (b, t, padded) and targets with -1 before `answer_from`; some answers right."""
    logits = rng.normal(size=(b, t, padded))
    targets = np.full((b, t), -1)
    targets[:, answer_from:] = rng.integers(0, V, (b, t - answer_from))
    right = rng.random((b, t)) < 0.5
    rows, cols = np.nonzero(right & (targets != -1))
    logits[rows, cols, targets[rows, cols]] += 10.0  # these positions predict their target
    return logits, targets


@exercise("5.4.1",
          hint="only positions whose target is not -1 count, and padding ids are never a prediction",
          answer_hint="keep = targets != -1; prediction = logits[..., :vocab_size].argmax(-1); the mean of "
                      "(prediction == targets)[keep]",
          forbid=["course.data.tasks.masked_accuracy"], task="write the accuracy in NumPy")
def _(candidate, rng):
    easy = np.zeros((1, 3, 8))
    easy[0, 0, 5] = easy[0, 1, 2] = easy[0, 2, 2] = 1.0
    cases = [(easy, np.array([[-1, 2, 3]]), 8, "logits (1, 3, 8) predicting [5, 2, 2], targets [[-1, 2, 3]]")]
    padded = np.zeros((1, 2, 8))
    padded[0, :, 7] = 5.0  # a padding id has the largest logit: it must not count
    padded[0, 0, 4] = padded[0, 1, 1] = 1.0
    cases += [(padded, np.array([[4, 3]]), 6, "logits (1, 2, 8) whose largest is at padding id 7, vocab_size=6, "
                                              "targets [[4, 3]]")]
    for b, t, a in [(4, 10, 6), (16, 36, 32)]:
        logits, targets = _task_logits(rng, b, t, 10, 16, a)
        cases.append((logits, targets, 10, f"random logits {logits.shape}, targets {targets.shape} with -1 "
                                           f"before position {a}, vocab_size=10"))
    for logits, targets, V, on in cases:
        got = call(candidate, logits.copy(), targets.copy(), V, on=on)
        keep_all = float((logits[..., :V].argmax(-1) == targets).mean())
        right = _ref_masked(logits, targets, V)
        if np.ndim(got) == 0 and np.isclose(float(got), keep_all) and not np.isclose(keep_all, right):
            raise CheckFailed(f"you averaged over every position on {on}: only targets that are not -1 count")
        with_padding = _ref_masked(logits, targets, logits.shape[-1])
        if np.ndim(got) == 0 and np.isclose(float(got), with_padding) and not np.isclose(with_padding, right):
            raise CheckFailed(f"your prediction can be a padding id on {on}: only the first vocab_size logits are "
                              f"tokens")
        expect_close(got, _ref_masked(logits, targets, V), on=on, rtol=1e-6, what="accuracy")


def _ref_exact(logits, targets, vocab_size):
    keep = targets != -1
    right = (logits[..., :vocab_size].argmax(-1) == targets) | ~keep
    return float(right.all(axis=-1).mean())


def _ref_exact_counting_blanks(logits, targets, vocab_size):
    return float((logits[..., :vocab_size].argmax(-1) == targets).all(axis=-1).mean())


@exercise("5.4.2",
          hint="a sequence counts when every position with a target (not -1) is predicted right; positions without a"
               " target do not spoil it",
          answer_hint="right = (logits[..., :vocab_size].argmax(-1) == targets) | (targets == -1); "
                      "right.all(axis=-1).mean()")
def _(candidate, rng):
    cases = []
    two = np.zeros((2, 3, 4))
    two[0, 1, 2] = two[0, 2, 3] = 1.0  # row 0: both answers right
    two[1, 1, 2] = two[1, 2, 0] = 1.0  # row 1: one of two right
    cases.append((two, np.array([[-1, 2, 3], [-1, 2, 3]]), 4, "2 sequences with answers [2, 3]: one all right, "
                                                            "one half right"))
    for b, t, a in [(5, 8, 5), (40, 36, 32)]:
        logits, targets = _task_logits(rng, b, t, 10, 16, a)
        cases.append((logits, targets, 10, f"random logits {logits.shape}, targets with -1 before position {a}"))
    for logits, targets, V, on in cases:
        got = call(candidate, logits.copy(), targets.copy(), V, on=on)
        if np.ndim(got) == 0 and np.isclose(float(got), _ref_masked(logits, targets, V)) and \
                not np.isclose(_ref_masked(logits, targets, V), _ref_exact(logits, targets, V)):
            raise CheckFailed(f"that is the accuracy per answer token on {on}; here a sequence counts only "
                              f"when all its answers are right")
        if np.ndim(got) == 0 and np.isclose(float(got), _ref_exact_counting_blanks(logits, targets, V)) and \
                not np.isclose(_ref_exact_counting_blanks(logits, targets, V), _ref_exact(logits, targets, V)):
            raise CheckFailed(f"your score counts the positions without a target (-1) as wrong on {on}: only "
                              f"the positions with a target decide")
        expect_close(got, _ref_exact(logits, targets, V), on=on, rtol=1e-6, what="accuracy")


def _gpt_count(vocab_size, block_size, n_layer, C):
    return (vocab_size + block_size) * C + n_layer * (12 * C * C + 13 * C) + 2 * C + vocab_size * C


def _ref_width(n_params, vocab_size, block_size, n_layer, n_head):
    widths = range(n_head, 64 * n_head * 64 + 1, n_head)
    return min(widths, key=lambda C: (abs(_gpt_count(vocab_size, block_size, n_layer, C) - n_params), C))


@exercise("5.4.3",
          hint="try the widths n_head, 2 n_head, 3 n_head, ... and compare each one's GPT parameter count "
               "(lesson 4.3) with n_params",
          answer_hint="keep the multiple of n_head whose count (vocab_size + block_size) C + n_layer (12 C^2 + 13 C)"
                      " + 2 C + vocab_size C is closest to n_params, the smaller one on a tie")
def _(candidate, rng):
    cases = [(20_448, 10, 36, 2, 4), (70_080, 65, 64, 2, 4), (1_000_000, 65, 256, 4, 4), (5_000, 10, 36, 1, 2)]
    cases += [(int(rng.integers(10_000, 400_000)), int(rng.integers(5, 80)), int(rng.integers(8, 128)),
               int(rng.integers(1, 4)), int(rng.choice([1, 2, 4, 8])))]
    for n, V, T, L, H in cases:
        on = f"n_params={n:,}, vocab_size={V}, block_size={T}, n_layer={L}, n_head={H}"
        got = call(candidate, n, V, T, L, H, on=on)
        try:
            got = int(got)
        except (TypeError, ValueError):
            raise CheckFailed(f"expected a whole number, got {got!r} on {on}") from None
        expect(got > 0 and got % H == 0, f"n_embd={got} is not a positive multiple of n_head={H} on {on}")
        expected = _ref_width(n, V, T, L, H)
        expect(got == expected, f"expected n_embd={expected} ({_gpt_count(V, T, L, expected):,} parameters), "
                                f"got {got} ({_gpt_count(V, T, L, got):,} parameters) on {on}")


from . import part5_pretrained  # noqa: E402, F401  (lesson 5.5: importing it registers its checks)
