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


def _whole_number(got, on):
    """An int (or an integral float) as an int; anything else, 12.5 included, fails."""
    if isinstance(got, (bool, np.bool_)):
        raise CheckFailed(f"expected a whole number, got {got!r} on {on}")
    try:
        value = float(got)
    except (TypeError, ValueError):
        raise CheckFailed(f"expected a whole number, got {got!r} on {on}") from None
    if not (np.isfinite(value) and value == int(value)):
        raise CheckFailed(f"expected a whole number, got {got!r} on {on}: a count has no fractional part")
    return int(value)


def _same(got, expected, rtol=1e-5, atol=1e-7):
    arr = np.asarray(got, dtype=np.float64)
    return arr.shape == np.shape(expected) and np.allclose(arr, expected, rtol=rtol, atol=atol)


# ---- 5.1 state-space models -----------------------------------------------------------------------


def _ref_zoh(A, B, delta):
    """The zero-order hold for a diagonal A with nonzero entries."""
    A_bar = np.exp(delta * A)
    return A_bar, np.expm1(delta * A) / (delta * A) * delta * B


def _ref_bilinear(A, B, delta):
    inverse = 1 / (1 - delta * A / 2)
    return inverse * (1 + delta * A / 2), inverse * delta * B


@exercise("5.1.1",
          hint="the bilinear rule averages the slope at the start and at the end of the step: solve "
               "x_k - x_{k-1} = delta/2 A (x_k + x_{k-1}) + delta B u_k for x_k; with a diagonal A it is all "
               "entry by entry",
          answer_hint="A_bar = (1 + delta A / 2) / (1 - delta A / 2); B_bar = delta B / (1 - delta A / 2)")
def _(candidate, rng):
    cases = [(np.array([-1.0]), np.array([1.0]), 0.5, "A=[-1], B=[1], delta=0.5"),
             (np.array([-0.5, -2.0]), np.array([1.0, 3.0]), 0.1, "A=[-0.5, -2], B=[1, 3], delta=0.1"),
             (np.array([-1.0, -4.0]), np.array([2.0, -1.0]), 2.0, "A=[-1, -4], B=[2, -1], delta=2 (a large step)"),
             (np.array([0.0, -1.0]), np.array([1.0, 1.0]), 0.5, "A=[0, -1] (a pure integrator), B=[1, 1], delta=0.5")]
    cases += [(-rng.uniform(0.1, 5, size=6), rng.normal(size=6), float(rng.uniform(0.01, 1)),
               "random A (6,), B (6,) and delta")]
    for A, B, delta, on in cases:
        got = _pair(call(candidate, A.copy(), B.copy(), delta, on=on), on, "(A_bar, B_bar)")
        A_bar, B_bar = _ref_bilinear(A, B, delta)
        if _same(got[0], 1 + delta * A) and not _same(got[0], A_bar):
            raise CheckFailed(f"A_bar is 1 + delta A on {on}: that is Euler's rule, which uses the slope at the start "
                              f"of the step only")
        with np.errstate(divide="ignore"):  # A_bar is 0 where delta A = -2
            upside_down = 1 / A_bar
        if _same(got[0], upside_down) and not _same(got[0], A_bar):
            raise CheckFailed(f"A_bar is upside down on {on}: with A < 0 its size must be below 1, the state decays")
        if _same(got[0], np.exp(delta * A)) and not _same(got[0], A_bar):
            raise CheckFailed(f"A_bar is exp(delta A) on {on}: that is the zero-order hold of section 2; the bilinear "
                              f"rule is a ratio")
        expect_close(got[0], A_bar, on=on, rtol=_RTOL, atol=_ATOL, what="A_bar")
        if _same(got[1], delta * B) and not _same(got[1], B_bar):
            raise CheckFailed(f"B_bar is delta * B on {on}: the bilinear rule divides it by 1 - delta A / 2 too")
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


def _ref_kernel_dense(A_bar, B_bar, C, L, start=0):
    K, x = [], B_bar.copy()
    for j in range(start + L):
        if j >= start:
            K.append(C @ x)
        x = A_bar @ x
    return np.array(K)


@exercise("5.1.3",
          hint="unroll the recurrence from a zero state with a full matrix: the input of step k - j has been "
               "multiplied by the matrix A_bar j times when y_k reads it",
          answer_hint="x = B_bar; for j = 0, 1, ..., L-1: K_j = C @ x, then x = A_bar @ x (matrix products)")
def _(candidate, rng):
    rotation = np.array([[0.0, -1.0], [1.0, 0.0]]) * 0.9  # turns the state by 90 degrees each step
    cases = [(np.diag([0.5, 0.25]), np.array([1.0, 1.0]), np.array([2.0, 3.0]), 4,
              "a diagonal A_bar = diag(0.5, 0.25), B_bar=[1, 1], C=[2, 3], L=4 (as in the lesson)"),
             (rotation, np.array([1.0, 0.0]), np.array([1.0, 0.0]), 6,
              "A_bar = 0.9 [[0, -1], [1, 0]] (a rotation), B_bar=[1, 0], C=[1, 0], L=6"),
             (np.array([[0.5, 1.0], [0.0, 0.5]]), np.array([0.0, 1.0]), np.array([1.0, 0.0]), 5,
              "A_bar = [[0.5, 1], [0, 0.5]], B_bar=[0, 1], C=[1, 0], L=5"),
             (np.array([[0.9]]), np.array([2.0]), np.array([1.0]), 1, "n=1, L=1")]
    M = rng.normal(size=(5, 5))
    cases += [(0.8 * M / np.abs(np.linalg.eigvals(M)).max(), rng.normal(size=5), rng.normal(size=5), 12,
               "a random stable 5 x 5 A_bar, random B_bar and C, L=12")]
    for A_bar, B_bar, C, L, on in cases:
        got = call(candidate, A_bar.copy(), B_bar.copy(), C.copy(), L, on=on)
        expected = _ref_kernel_dense(A_bar, B_bar, C, L)
        entrywise = np.array([C @ (A_bar ** j) @ B_bar for j in range(L)])
        if _same(got, _ref_kernel_dense(A_bar, B_bar, C, L, start=1)) and not _same(got, expected):
            raise CheckFailed(f"your kernel starts at A_bar**1 on {on}: K_0 is C B_bar, the input of this very step")
        if _same(got, _ref_kernel_dense(A_bar.T, B_bar, C, L)) and not _same(got, expected):
            raise CheckFailed(f"your kernel uses A_bar transposed on {on}: the state x becomes A_bar @ x")
        diagonal = np.array([C @ (np.diag(A_bar) ** j * B_bar) for j in range(L)])
        if _same(got, diagonal) and not _same(got, expected):
            raise CheckFailed(f"your kernel matches one that uses only A_bar's diagonal on {on}: with a full "
                              f"matrix the state is multiplied by the whole matrix, whose other entries mix its "
                              f"components")
        if _same(got, entrywise) and not _same(got, expected):
            raise CheckFailed(f"A_bar ** j raises each entry to the power j on {on}: the state is multiplied by the "
                              f"matrix j times (np.linalg.matrix_power, or one product per step)")
        expect_close(got, expected, on=on, rtol=_RTOL, atol=_ATOL, what="kernel")


def _ref_varying(A, B, C, D, u, deltas, x0, rule="zoh", read="after"):
    x, ys = np.array(x0, dtype=np.float64), []
    for u_k, delta in zip(u, deltas):
        A_bar, B_bar = _ref_zoh(A, B, delta) if rule == "zoh" else (np.exp(delta * A), delta * B)
        new = A_bar * x + B_bar * u_k
        ys.append(C @ (new if read == "after" else x) + D * u_k)
        x = new
    return np.array(ys), x


@exercise("5.1.4",
          hint="discretise every step with its own delta (the zero-order hold of section 2), start from x0, and "
               "update the state before reading it",
          answer_hint="x = x0; for each u_k, delta_k: A_bar, B_bar = the zero-order hold of (A, B, delta_k); "
                      "x = A_bar * x + B_bar * u_k; y_k = C @ x + D * u_k; return (the y_k, the last x)")
def _(candidate, rng):
    A, B, C = np.array([-1.0, -3.0]), np.array([1.0, 0.5]), np.array([1.0, -1.0])
    impulse = np.array([1.0, 0.0, 0.0, 0.0])
    cases = [(A, B, C, 0.0, impulse, np.array([0.1, 0.1, 0.1, 0.1]), np.zeros(2),
              "A=[-1, -3], B=[1, 0.5], C=[1, -1], D=0, an impulse u=[1, 0, 0, 0], deltas all 0.1, x0=0"),
             (A, B, C, 0.0, impulse, np.array([0.1, 2.0, 0.01, 1.0]), np.zeros(2),
              "the same impulse with deltas [0.1, 2, 0.01, 1], x0=0"),
             (A, B, C, 2.0, np.ones(3), np.array([0.5, 0.05, 0.5]), np.zeros(2),
              "A=[-1, -3], B=[1, 0.5], C=[1, -1], D=2, u=[1, 1, 1], deltas [0.5, 0.05, 0.5], x0=0"),
             (A, B, C, 0.0, np.zeros(3), np.array([0.2, 1.0, 0.2]), np.array([8.0, -4.0]),
              "u=[0, 0, 0], deltas [0.2, 1, 0.2], x0=[8, -4] (the state decays)")]
    cases += [(-rng.uniform(0.2, 4, 6), rng.normal(size=6), rng.normal(size=6), float(rng.normal()),
               rng.normal(size=30), rng.uniform(0.01, 1.5, 30), rng.normal(size=6), "random n=6, L=30, deltas, x0")]
    for A, B, C, D, u, deltas, x0, on in cases:
        got = _pair(call(candidate, A.copy(), B.copy(), C.copy(), D, u.copy(), deltas.copy(), x0.copy(), on=on), on,
                    "(y, x_last)")
        expected, x_last = _ref_varying(A, B, C, D, u, deltas, x0)
        arr = _array(got[0], on, "output y")
        if arr.shape == expected.shape:
            def looks_like(variant):  # the answer is this mistake, and the mistake shows on this input
                return np.allclose(arr, variant) and not np.allclose(variant, expected)

            first = _ref_varying(A, B, C, D, u, np.full_like(deltas, deltas[0]), x0)[0]
            expect(not looks_like(first), f"every step uses the first delta on {on}: each step has its own, "
                                          f"discretise it anew")
            simple = _ref_varying(A, B, C, D, u, deltas, x0, rule="simple")[0]
            expect(not looks_like(simple), f"B_bar is delta * B on {on}: that is mamba-minimal's simple rule; "
                                           f"this exercise asks for the zero-order hold")
            if x0.any():
                zero = _ref_varying(A, B, C, D, u, deltas, 0 * x0)[0]
                expect(not looks_like(zero), f"the outputs ignore x0 on {on}: the recurrence starts from the "
                                             f"given state")
            else:  # from a zero state, reading first shows as outputs one step late
                before = _ref_varying(A, B, C, D, u, deltas, x0, read="before")[0]
                expect(not looks_like(before), f"y_k was read from the state before the update on {on}: "
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
          hint="write out what applying first, then second, does to h, and collect the terms in h and the rest; "
               "matrix products do not commute",
          answer_hint="A2 (A1 h + v1) + v2 = (A2 A1) h + (A2 v1 + v2)",
          forbid=["course.mamba.scan.combine"], task="compose the affine maps in NumPy")
def _(candidate, rng):
    eye = np.eye(2)
    cases = [((np.array([[2.0]]), np.array([1.0])), (np.array([[3.0]]), np.array([0.0])),
              "1 x 1: first (2, 1), second (3, 0)"),
             ((eye, np.array([1.0, 2.0])), (2 * eye, np.array([0.0, -1.0])),
              "first (I, [1, 2]), second (2I, [0, -1])"),
             ((np.array([[0.0, 1.0], [0.0, 0.0]]), np.zeros(2)), (np.array([[1.0, 0.0], [1.0, 1.0]]), np.zeros(2)),
              "first A1=[[0, 1], [0, 0]], second A2=[[1, 0], [1, 1]], v = 0 (A1 A2 and A2 A1 differ)")]
    cases += [((rng.normal(size=(3, 3)), rng.normal(size=3)), (rng.normal(size=(3, 3)), rng.normal(size=3)),
               "random 3 x 3 matrices and offsets")]
    for first, second, on in cases:
        got = _pair(call(candidate, first, second, on=on), on, "(A, v)")
        A, b = _ref_combine_affine(first, second)
        if _same(got[0], first[0] @ second[0]) and not _same(got[0], A):
            raise CheckFailed(f"the matrices are multiplied in the wrong order on {on}: `first` acts first, "
                              f"so it stands on the right of the product")
        expect_close(got[0], A, on=on, rtol=_RTOL, atol=_ATOL, what="A")
        if _same(got[1], first[0] @ second[1] + first[1]) and not _same(got[1], b):
            raise CheckFailed(f"v is second applied first on {on}: the offset of `first` goes through "
                              f"`second`'s matrix, not the other way round")
        expect_close(got[1], b, on=on, rtol=_RTOL, atol=_ATOL, what="v")


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
          answer_hint="h_new = exp(delta_t[..., None] * A) * h + (delta_t * u_t)[..., None] * B_t[:, None, :]; y_t ="
                      " (h_new * C_t[:, None, :]).sum(-1) + D * u_t")
def _(candidate, rng):
    shapes = [(1, 1, 1), (1, 2, 3), (2, 3, 4), (3, 5, 2)]
    for b, d_in, n in shapes:
        x = rng.normal(size=(b, d_in, n))
        u_t, delta_t = rng.normal(size=(b, d_in)), rng.uniform(0.05, 1.5, size=(b, d_in))
        A = -rng.uniform(0.5, 4, size=(d_in, n))
        B_t, C_t = rng.normal(size=(b, n)), rng.normal(size=(b, n))
        D = rng.normal(size=d_in)
        on = f"a random state h {x.shape}, u_t {u_t.shape}, A {A.shape}, B_t {B_t.shape}"
        got = _pair(call(candidate, x.copy(), u_t.copy(), delta_t.copy(), A.copy(), B_t.copy(), C_t.copy(),
                          D.copy(), on=on), on, "(h_new, y_t)")
        x_new, y = _ref_step(x, u_t, delta_t, A, B_t, C_t, D)
        expect_close(got[0], x_new, on=on, rtol=_RTOL, atol=_ATOL, what="new state h_new")
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


# the scan and every function of the library that computes one, private ones included (a learner may
# find them with dir(); tests/test_part5_exercises.py checks that no forward of course.mamba.scan is missing)
_SCANS = ["course.mamba.selective_scan", "course.mamba.scan.linear_recurrence", "course.mamba.scan._sequential_forward",
          "course.mamba.scan._parallel_forward", "course.mamba.scan._fast_forward",
          "course.mamba.scan._fast_forward_kernel"]


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
    cases = [(np.array([2.0]), np.array([1.0]), "a=[2], v=[1]"),
             (np.array([1.0, 2.0, 3.0]), np.array([1.0, 1.0, 1.0]), "a=[1, 2, 3], v=[1, 1, 1]"),
             (np.full(8, 0.5), np.arange(8.0), "a = 0.5 everywhere, v=[0, 1, ..., 7]")]
    cases += [(rng.uniform(0.5, 1, size=(L, 3)), rng.normal(size=(L, 3)), f"random a, v of shape ({L}, 3)")
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

# The backward exercises ask for the derivation: the library's finite differences are refused, and
# inputs of very different sizes side by side (below) make a learner's own finite differences fail:
# rounding on the large entries, divided by a small step, swamps the gradient of the small ones.
_NUMERICAL = ["course.tensor.numerical_gradient", "course.tensor.gradcheck"]


_MIXED = "among numbers near 1"  # in the description of the inputs of very different sizes


def _expect_gradient(got, expected, on, what):
    """Within float32's rounding of the largest entry: tiny gradients next to large ones count too."""
    scale = max(1e-300, float(np.abs(expected).max(initial=0.0)))
    try:
        expect_close(got, expected, on=on, rtol=_RTOL, atol=min(_ATOL, _RTOL * scale), what=what)
    except CheckFailed as failure:
        if _MIXED not in on:
            raise
        raise CheckFailed(f"{failure}. Right on the earlier inputs but not here, where a finite difference loses "
                          f"the small entries' gradients to the rounding of the large ones: the exercise asks for "
                          f"the derivative worked out by hand") from None


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
          forbid=["course.mamba.rms_norm", "course.mamba.RMSNorm", "course.tensor.Tensor.backward",
                  *_NUMERICAL], task="write the backward by hand in NumPy")
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
    mixed, w_mixed, g_mixed = rng.normal(size=(2, 6)), rng.normal(size=6), rng.normal(size=(2, 6))
    mixed[:, 0], w_mixed[0], g_mixed[:, 0] = [1e5, -3e5], 2.0, [10.0, -10.0]  # one large entry per vector
    cases += [(mixed, w_mixed, g_mixed, 1e-5, "x (2, 6) with one large entry per row (1e5 and -3e5) among numbers "
                                              "near 1, weight and grad random but for their first entries (2; 10, -10)")]
    for x, w, g, eps, on in cases:
        got = _pair(call(candidate, x.copy(), w.copy(), g.copy(), eps, on=on), on, "(dx, dweight)")
        dx, dw = _ref_rms_backward(x, w, g, eps)
        r = 1 / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)
        if _same(got[0], g * w * r, rtol=1e-5, atol=1e-8) and not _same(got[0], dx, rtol=1e-5, atol=1e-8):
            raise CheckFailed(f"dx treats the root mean square as a constant on {on}: it depends on every x of "
                              f"the vector, which adds a second term")
        if eps != 1e-5 and _same(got[0], _ref_rms_backward(x, w, g)[0]) and not _same(got[0], dx):
            raise CheckFailed(f"dx ignores the eps it is given on {on}: use the argument, not 1e-5")
        _expect_gradient(got[0], dx, on, "dx")
        _expect_gradient(got[1], dw, on, "dweight")


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
          forbid=["course.mamba.causal_conv1d", "course.mamba.CausalConv1d", "course.tensor.Tensor.backward",
                  *_NUMERICAL], task="write the backward by hand in NumPy")
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
    big = rng.normal(size=(1, 6, 2))
    big[0, 2, 0] = 1e12  # a large input next to small ones
    cases += [(big, rng.normal(size=(2, 3)), rng.normal(size=(1, 6, 2)),
               "x (1, 6, 2) holding 1e12 at [0, 2, 0] among numbers near 1, random weight (2, 3) and grad")]
    for x, w, g, on in cases:
        got = _pair(call(candidate, x.copy(), w.copy(), g.copy(), on=on), on, "(dx, dweight)")
        dx, dw = _ref_conv_backward(x, w, g)
        forward_in_time = _ref_conv(g, w, np.zeros(w.shape[0]))
        if _same(got[0], forward_in_time) and not _same(got[0], dx):
            raise CheckFailed(f"dx runs the convolution forward in time on {on}: the gradient flows backward, "
                              f"x_s reaches the outputs s to s + k - 1")
        _expect_gradient(got[0], dx, on, "dx")
        if _same(got[1], dw[:, ::-1]) and not _same(got[1], dw):
            raise CheckFailed(f"dweight has its taps reversed on {on}: tap j multiplies x[t - (k - 1) + j]")
        _expect_gradient(got[1], dw, on, "dweight")


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


def _ref_mamba_count(d_model, n_layer, vocab_size, d_state, expand, d_conv, tied=True, pad="up", rank="ceil"):
    E, d, n, k = d_model, expand * d_model, d_state, d_conv
    r = -(-d_model // 16) if rank == "ceil" else d_model // 16
    layer = E + 2 * d * E + d * k + d + d * (r + 2 * n) + r * d + d + d * n + d + d * E
    V = {"up": -(-vocab_size // 8) * 8, "none": vocab_size, "past": (vocab_size // 8 + 1) * 8}[pad]
    return n_layer * layer + V * E * (1 if tied else 2) + E


# The classic mistakes of 5.3.5, each with what to fix. Where one count matches several, all are named.
_COUNT_MISTAKES = [
    (dict(tied=False), "you counted lm_head on its own: it is the embedding table itself (tied)"),
    (dict(pad="none"), "the embedding has padded_vocab_size rows (vocab_size rounded up to a multiple of 8)"),
    (dict(pad="past"), "a vocab_size that is already a multiple of 8 needs no padding: round up only to the next "
                       "multiple, which may be vocab_size itself"),
    (dict(rank="floor"), "dt_rank='auto' is d_model / 16 rounded up, not down"),
]


@exercise("5.3.5",
          hint="section 7's table, one module at a time; the head shares the embedding, whose rows are the "
               "padded vocabulary",
          answer_hint="per layer: norm E, in_proj 2dE, conv1d dk + d, x_proj d(r + 2n), dt_proj rd + d, A_log dn, D "
                      "d, out_proj dE (d = expand E, r = ceil(E / 16)); plus padded_vocab E and norm_f E",
          forbid=["course.mamba.Mamba", "course.mamba.MambaConfig"], task="count them with a formula")
def _(candidate, rng):
    # the first cases tell the mistakes apart (each one's count differs from the others'); later ones
    # (vocab_size 8 with d_model 16, d_model 40 with vocab_size 10) are where two of them coincide
    cases = [(64, 2, 65, 16, 2, 4), (24, 3, 16, 4, 2, 4), (16, 1, 8, 4, 2, 3), (768, 24, 50277, 16, 2, 4),
             (40, 3, 10, 8, 1, 2)]
    cases += [(8 * int(rng.integers(1, 20)), int(rng.integers(1, 5)), int(rng.integers(2, 300)),
               int(rng.integers(1, 20)), int(rng.integers(1, 4)), int(rng.integers(2, 6)))]
    for E, L, V, n, expand, k in cases:
        on = f"d_model={E}, n_layer={L}, vocab_size={V}, d_state={n}, expand={expand}, d_conv={k}"
        got = _whole_number(call(candidate, E, L, V, n, expand, k, on=on), on)
        expected = _ref_mamba_count(E, L, V, n, expand, k)
        named = [text for kind, text in _COUNT_MISTAKES
                 if got == _ref_mamba_count(E, L, V, n, expand, k, **kind) != expected]
        if named:
            raise CheckFailed(f"{'; or '.join(named)} (on {on})")
        expect(got == expected, f"expected {expected:,} parameters, got {got:,} on {on}")



def _ref_silu(z):
    return z / (1 + np.exp(-z))


def _check_mix(u):
    """The stand-in for the conv + SiLU + scan of the main branch: causal, nonlinear, and shape-keeping."""
    return 0.5 * np.cumsum(u, axis=1) + np.tanh(u)


def _ref_residual_block(x, norm_weight, in_proj_weight, mix, out_proj_weight, eps=1e-5, gate="silu", split="ur",
                        residual=True, normed_residual=False):
    h = x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * norm_weight
    first, second = np.split(h @ in_proj_weight.T, 2, axis=-1)
    u, res = (first, second) if split == "ur" else (second, first)
    g = {"silu": _ref_silu(res), "none": res, "sigmoid": 1 / (1 + np.exp(-res))}[gate]
    out = (mix(u) * g) @ out_proj_weight.T
    return out + (h if normed_residual else x) if residual else out


@exercise("5.3.6",
          hint="section 5 and section 6 together: normalise, project, split into the main branch and the gate, run "
               "the main branch through mix, gate it with SiLU of the other half, project back, and add what came in",
          answer_hint="h = rms_norm(x) * norm_weight; u, res = split(h @ in_proj_weight.T, 2, axis=-1); "
                      "out = (mix(u) * silu(res)) @ out_proj_weight.T; return x + out",
          forbid=["course.mamba.ResidualBlock", "course.mamba.MambaBlock", "course.mamba.Mamba"],
          task="assemble the block in NumPy")
def _(candidate, rng):
    shapes = [(1, 1, 2, 2), (1, 4, 3, 2), (2, 6, 4, 3), (3, 5, 8, 16)]
    for b, l, d_model, expand in shapes:
        d_in = expand * d_model
        x = rng.normal(size=(b, l, d_model)) * 2 + 0.5
        norm_w = 1 + rng.normal(0, 0.3, d_model)
        w_in, w_out = rng.normal(size=(2 * d_in, d_model)) / np.sqrt(d_model), rng.normal(size=(d_model, d_in))
        eps = 1e-5 if b < 3 else 0.5
        on = (f"random x {x.shape}, norm_weight ({d_model},), in_proj_weight {w_in.shape}, out_proj_weight "
              f"{w_out.shape}, eps={eps}")
        calls = []

        def mix(u):
            calls.append(np.shape(u))
            return _check_mix(np.asarray(u, dtype=np.float64))

        got = call(candidate, x.copy(), norm_w.copy(), w_in.copy(), mix, w_out.copy(), eps, on=on)
        expected = _ref_residual_block(x, norm_w, w_in, _check_mix, w_out, eps)
        expect(bool(calls), f"your block never called mix on {on}: the main branch goes through it")
        expect(calls[0] == (b, l, d_in), f"mix got an input of shape {calls[0]} on {on}; the main branch is "
                                         f"(b, l, d_inner) = {(b, l, d_in)}, one half of in_proj's output")
        arr = _array(got, on, "block output")
        if arr.shape == expected.shape:
            args = (x, norm_w, w_in, _check_mix, w_out, eps)
            for kind, message in [
                (dict(residual=False), "the output lacks the residual: the block adds its input x back"),
                (dict(normed_residual=True), "you added the normalised input back: the residual adds x itself, as "
                                             "it came in"),
                (dict(split="ru"), "the two halves of in_proj are swapped: the first is the main branch u, the "
                                   "second the gate"),
                (dict(gate="none"), "the gate is not passed through SiLU"),
                (dict(gate="sigmoid"), "the gate is sigmoid(res); SiLU is res * sigmoid(res)")]:
                variant = _ref_residual_block(*args, **kind)
                expect(not (np.allclose(arr, variant) and not np.allclose(variant, expected)), f"{message} (on {on})")
            if eps != 1e-5:
                expect(not np.allclose(arr, _ref_residual_block(x, norm_w, w_in, _check_mix, w_out)),
                       f"the normalisation ignores the eps it is given on {on}")
        expect_close(got, expected, on=on, rtol=_RTOL, atol=_ATOL, what="block output")


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
    uneven = np.zeros((2, 4, 8))
    uneven[0, 3, 1] = 1.0  # row 0: one target, right
    uneven[1, :, 5] = 1.0  # row 1: four targets, one right (5)
    cases += [(uneven, np.array([[-1, -1, -1, 1], [5, 2, 3, 4]]), 8,
               "2 rows with 1 and 4 targets: targets [[-1, -1, -1, 1], [5, 2, 3, 4]], predictions [[., ., ., 1], "
               "[5, 5, 5, 5]]")]
    for b, t, a in [(4, 10, 6), (16, 36, 32)]:
        logits, targets = _task_logits(rng, b, t, 10, 16, a)
        cases.append((logits, targets, 10, f"random logits {logits.shape}, targets {targets.shape} with -1 "
                                           f"before position {a}, vocab_size=10"))
    logits, targets = _task_logits(rng, 6, 12, 10, 16, 2)
    targets[rng.random(targets.shape) < 0.5] = -1  # a different number of targets in every row
    cases.append((logits, targets, 10, f"random logits {logits.shape}, targets {targets.shape} with -1 at random "
                                       f"places, vocab_size=10"))
    for logits, targets, V, on in cases:
        got = call(candidate, logits.copy(), targets.copy(), V, on=on)
        keep = targets != -1
        hits = logits[..., :V].argmax(-1) == targets
        per_row = float(np.mean([hits[i][keep[i]].mean() for i in range(len(targets)) if keep[i].any()]))
        if np.ndim(got) == 0 and np.isclose(float(got), per_row) and not np.isclose(per_row, _ref_masked(
                logits, targets, V)):
            raise CheckFailed(f"you averaged the rows' accuracies on {on}: rows with more targets must weigh more, "
                              f"every target counts once")
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
    padded = np.zeros((2, 2, 8))
    padded[:, :, 7] = 5.0  # a padding id has the largest logit: it must not count
    padded[:, 0, 1] = padded[:, 1, 2] = 1.0
    cases.append((padded, np.array([[-1, 2], [1, 2]]), 6, "logits (2, 2, 8) whose largest is at padding id 7, "
                                                         "vocab_size=6, targets [[-1, 2], [1, 2]]"))
    for b, t, a in [(5, 8, 5), (40, 36, 32)]:
        logits, targets = _task_logits(rng, b, t, 10, 16, a)
        cases.append((logits, targets, 10, f"random logits {logits.shape}, targets with -1 before position {a}"))
    for logits, targets, V, on in cases:
        got = call(candidate, logits.copy(), targets.copy(), V, on=on)
        with_padding = _ref_exact(logits, targets, logits.shape[-1])
        if np.ndim(got) == 0 and np.isclose(float(got), with_padding) and \
                not np.isclose(with_padding, _ref_exact(logits, targets, V)):
            raise CheckFailed(f"your prediction can be a padding id on {on}: only the first vocab_size logits are "
                              f"tokens")
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


def _rounded_root(n_params, vocab_size, block_size, n_layer, n_head):
    """The classic shortcut: solve count(C) = n_params for C and round it to a multiple of n_head."""
    a, b = 12 * n_layer, 2 * vocab_size + block_size + 13 * n_layer + 2
    root = (-b + np.sqrt(b * b + 4 * a * n_params)) / (2 * a)
    return max(n_head, int(np.round(root / n_head)) * n_head)


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
    # where rounding the root of the quadratic count(C) = n_params to a multiple of n_head is not the
    # closest count (the counts grow faster above the root than they fall below it)
    cases += [(143_505, 67, 49, 3, 8), (220_003, 59, 37, 2, 8)]
    # ties: n_params exactly halfway between the counts of two widths
    cases += [(643_560, 10, 36, 2, 4), (85_791, 20, 32, 1, 2)]
    cases += [(int(rng.integers(10_000, 400_000)), int(rng.integers(5, 80)), int(rng.integers(8, 128)),
               int(rng.integers(1, 4)), int(rng.choice([1, 2, 4, 8])))]
    for n, V, T, L, H in cases:
        on = f"n_params={n:,}, vocab_size={V}, block_size={T}, n_layer={L}, n_head={H}"
        got = _whole_number(call(candidate, n, V, T, L, H, on=on), on)
        expect(got > 0 and got % H == 0, f"n_embd={got} is not a positive multiple of n_head={H} on {on}")
        expected = _ref_width(n, V, T, L, H)
        distance = abs(_gpt_count(V, T, L, expected) - n)
        if got != expected and abs(_gpt_count(V, T, L, got) - n) == distance:
            raise CheckFailed(f"n_embd={expected} and n_embd={got} are equally close to n_params on {on}: on a tie, "
                              f"the smaller width")
        if got != expected and got == _rounded_root(n, V, T, L, H):
            raise CheckFailed(f"n_embd={got} is the root of count(C) = n_params rounded to a multiple of n_head, but "
                              f"n_embd={expected} has the closer count ({_gpt_count(V, T, L, expected):,} against "
                              f"{_gpt_count(V, T, L, got):,}) on {on}: compare the counts, not the widths")
        expect(got == expected, f"expected n_embd={expected} ({_gpt_count(V, T, L, expected):,} parameters), "
                                f"got {got} ({_gpt_count(V, T, L, got):,} parameters) on {on}")


from . import part5_pretrained  # noqa: E402, F401  (lesson 5.5: importing it registers its checks)
