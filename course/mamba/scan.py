"""The selective scan of lesson 5.2: Mamba's state-space recurrence, as one autograd operation.

    y = selective_scan(u, delta, A, B, C, D, method="fast")

Shapes are mamba-minimal's: u and delta (b, l, d_in), A (d_in, n), B and C (b, l, n), D (d_in,)
(or None). Every channel d of every sequence carries a state h of n numbers through time:

    h_t = exp(delta_t A) * h_{t-1} + delta_t B_t u_t        (elementwise in n; h_{-1} = 0)
    y_t = <C_t, h_t> + D u_t

`exp(delta A)` is the zero-order-hold discretisation of the continuous A; `delta B` is the
simpler rule mamba-minimal (and the official code) uses for B. Because delta, B and C depend on
the input (they are computed from it by the Mamba block), the model chooses, token by token,
what to write into its state and what to read out of it: that is the "selection".

Three methods compute the same thing:
- "sequential": a loop over time in NumPy, one step after the other, as the equations read.
- "parallel":   the recurrence h_t = a_t h_{t-1} + b_t is a scan with an associative operator, so
                it can be computed in log2(l) vectorised steps (Hillis and Steele's scan), the way
                a GPU computes it.
- "fast":       the sequential loop compiled by Numba (`@njit`), forward and backward, with the
                decays exp(delta A) computed beforehand by NumPy: the one the model uses.

The backward pass is itself a scan, run backwards in time: the gradient reaching the state h_t
comes from y_t (through C_t) and from h_{t+1} (through a_{t+1}):

    dh_t = C_t g_t + a_{t+1} * dh_{t+1}

and from dh_t every input's gradient follows locally (see `_gradients_from_states`).
`selective_scan` is a dispatch point: part 6 swaps a kernel in for it (see course.tensor.dispatch).
"""

import warnings

import numpy as np
from numba import njit

from ..tensor import Tensor, operation
from ..tensor.dispatch import dispatchable

__all__ = ["selective_scan", "METHODS", "linear_recurrence", "combine"]

METHODS = ("sequential", "parallel", "fast")


# ----- the linear recurrence h_t = a_t h_{t-1} + b_t, two ways ------------------------------------
def combine(first, second):
    """Two steps of the recurrence as one: applying (a1, b1), then (a2, b2), maps h to
    a2 (a1 h + b1) + b2 = (a1 a2) h + (a2 b1 + b2). The operator is associative (but not
    commutative), which is all a parallel scan needs."""
    (a1, b1), (a2, b2) = first, second
    return a1 * a2, a2 * b1 + b2


def linear_recurrence(a, b, method="sequential"):
    """All states h_t = a_t h_{t-1} + b_t, h_{-1} = 0, along axis 1 of `a` and `b` (same shape).

    "sequential" takes l steps; "parallel" takes ceil(log2 l) steps of Hillis and Steele's scan:
    after the step with stride s, position t holds the combination of the (up to) 2s steps ending
    at t. It multiplies a's together and never divides by them, so it stays accurate even where a
    product of many a's underflows to 0 (as it does over 1024 steps of decay).
    """
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.ndim < 2:
        raise ValueError(f"linear_recurrence: a {a.shape} and b {b.shape} must have the same shape, with time on "
                         f"axis 1: (batch, length, ...)")
    if method == "sequential":
        h = np.empty_like(b)
        state = np.zeros_like(b[:, 0])
        for t in range(b.shape[1]):
            state = a[:, t] * state + b[:, t]
            h[:, t] = state
        return h
    if method == "parallel":
        a, h = a.copy(), b.copy()
        s = 1
        while s < b.shape[1]:
            # Each position t >= s combines the span ending at t - s (first) with its own (second).
            # The right-hand sides are computed from the old values before anything is written.
            a[:, s:], h[:, s:] = combine((a[:, :-s], h[:, :-s]), (a[:, s:], h[:, s:]))
            s *= 2
        return h
    raise ValueError(f"linear_recurrence: unknown method {method!r}; the known ones are 'sequential', 'parallel'")


# ----- "sequential": the equations, step by step, in NumPy -----------------------------------------
def _sequential_forward(u, delta, A, B, C, D):
    b, l, d = u.shape
    h = np.zeros((b, d, A.shape[1]), dtype=u.dtype)
    hs = np.empty((b, l + 1, d, A.shape[1]), dtype=u.dtype)  # every state, for the backward
    hs[:, 0] = 0
    y = np.empty_like(u)
    for t in range(l):
        dA = np.exp(delta[:, t, :, None] * A)  # (b, d, n): how much of the state survives the step
        dBu = delta[:, t, :, None] * B[:, t, None, :] * u[:, t, :, None]  # (b, d, n): what is written
        h = dA * h + dBu
        hs[:, t + 1] = h
        y[:, t] = np.einsum("bdn,bn->bd", h, C[:, t])
    if D is not None:
        y += u * D
    return y, hs


def _sequential_backward(g, u, delta, A, B, C, D, hs):
    b, l, d = u.shape
    du, ddelta = np.empty_like(u), np.empty_like(u)
    dB, dC = np.empty_like(B), np.empty_like(C)
    dA = np.zeros_like(A)
    dh = np.zeros_like(hs[:, 0])  # d loss / d h_t, arriving from the future (h_{t+1})
    for t in reversed(range(l)):
        a = np.exp(delta[:, t, :, None] * A)
        dh = dh + g[:, t, :, None] * C[:, t, None, :]  # ... plus what y_t = <C_t, h_t> sends back
        dC[:, t] = np.einsum("bd,bdn->bn", g[:, t], hs[:, t + 1])
        # h_t = a h_{t-1} + delta B u with a = exp(delta A): the gradient of delta A is dh h_{t-1} a.
        d_dA = dh * hs[:, t] * a
        dA += np.einsum("bdn,bd->dn", d_dA, delta[:, t])
        dh_B = np.einsum("bdn,bn->bd", dh, B[:, t])
        ddelta[:, t] = np.einsum("bdn,dn->bd", d_dA, A) + dh_B * u[:, t]
        du[:, t] = dh_B * delta[:, t]
        dB[:, t] = np.einsum("bdn,bd->bn", dh, delta[:, t] * u[:, t])
        dh = dh * a  # carried to h_{t-1}: h_t depends on it through a
    dD = None
    if D is not None:
        du += g * D
        dD = (g * u).sum(axis=(0, 1))
    return du, ddelta, dA, dB, dC, dD


# ----- "parallel": whole-sequence arrays and the associative scan -----------------------------------
def _parallel_forward(u, delta, A, B, C, D):
    a = np.exp(delta[..., None] * A)  # (b, l, d, n)
    x = delta[..., None] * B[:, :, None, :] * u[..., None]
    h = linear_recurrence(a, x, "parallel")
    y = np.einsum("bldn,bln->bld", h, C)
    if D is not None:
        y += u * D
    return y, (a, h)


def _parallel_backward(g, u, delta, A, B, C, D, saved):
    a, h = saved
    # dh_t = C_t g_t + a_{t+1} dh_{t+1}: the same recurrence with time reversed, so the same scan.
    a_next = np.zeros_like(a)
    a_next[:, :-1] = a[:, 1:]
    from_y = g[..., None] * C[:, :, None, :]
    dh = linear_recurrence(a_next[:, ::-1], from_y[:, ::-1], "parallel")[:, ::-1]
    h_prev = np.zeros_like(h)
    h_prev[:, 1:] = h[:, :-1]
    return _gradients_from_states(g, u, delta, A, B, C, D, h, h_prev, a, dh)


def _gradients_from_states(g, u, delta, A, B, C, D, h, h_prev, a, dh):
    """Every input's gradient from the states h_t, h_{t-1}, the decays a_t and dh_t, all (b, l, d, n)."""
    d_dA = dh * h_prev * a  # d loss / d (delta_t A), since d a_t / d (delta_t A) = a_t
    dh_B = np.einsum("bldn,bln->bld", dh, B)
    du = dh_B * delta
    ddelta = np.einsum("bldn,dn->bld", d_dA, A) + dh_B * u
    dA = np.einsum("bldn,bld->dn", d_dA, delta)
    dB = np.einsum("bldn,bld->bln", dh, delta * u)
    dC = np.einsum("bldn,bld->bln", h, g)
    dD = None
    if D is not None:
        du += g * D
        dD = (g * u).sum(axis=(0, 1))
    return du, ddelta, dA, dB, dC, dD


# ----- "fast": the sequential loops, compiled ----------------------------------------------------------
# Loop order: batch, time, channel, state. The n states of a channel sit side by side in memory,
# so the innermost loop runs over contiguous numbers. The decays a = exp(delta A) are computed
# first, for all positions at once: NumPy's exp works on several numbers per instruction, several
# times faster than calling exp one number at a time in the loop. The forward keeps the decays
# and the states for the backward, trading memory for not computing them again. It runs on one
# thread (the sequences of a batch could run in parallel: part 6's CPU kernels do that).
@njit(cache=True, fastmath=True)
def _outer_kernel(delta, A, out):
    """out[b, t, d, n] = delta[b, t, d] * A[d, n]."""
    b, l, d = delta.shape
    n = A.shape[1]
    for bi in range(b):
        for t in range(l):
            for di in range(d):
                for ni in range(n):
                    out[bi, t, di, ni] = delta[bi, t, di] * A[di, ni]


@njit(cache=True, fastmath=True)
def _fast_forward_kernel(u, delta, B, C, D, a, y, h):
    b, l, d = u.shape
    n = B.shape[2]
    for bi in range(b):
        for t in range(l):
            for di in range(d):
                dt = delta[bi, t, di]
                x = u[bi, t, di]
                acc = x * D[di]
                for ni in range(n):
                    ht = a[bi, t, di, ni] * h[bi, t, di, ni] + dt * B[bi, t, ni] * x  # h[:, t] is h_{t-1}
                    h[bi, t + 1, di, ni] = ht
                    acc += ht * C[bi, t, ni]
                y[bi, t, di] = acc


@njit(cache=True, fastmath=True)
def _fast_backward_kernel(g, u, delta, A, B, C, D, a, h, du, ddelta, dA, dB, dC, dD):
    b, l, d = u.shape
    n = A.shape[1]
    carry = np.zeros((d, n), dtype=h.dtype)  # a_{t+1} dh_{t+1}: what reaches h_t from the future
    for bi in range(b):
        carry[:] = 0
        for t in range(l - 1, -1, -1):
            for ni in range(n):
                dB[bi, t, ni] = 0
                dC[bi, t, ni] = 0
            for di in range(d):
                gt = g[bi, t, di]
                dt = delta[bi, t, di]
                x = u[bi, t, di]
                s_delta = gt * 0
                s_B = gt * 0
                for ni in range(n):
                    dh = carry[di, ni] + gt * C[bi, t, ni]
                    at = a[bi, t, di, ni]
                    d_dA = dh * h[bi, t, di, ni] * at  # d loss / d (delta A), as a = exp(delta A)
                    dC[bi, t, ni] += gt * h[bi, t + 1, di, ni]
                    dB[bi, t, ni] += dh * dt * x
                    dA[di, ni] += d_dA * dt
                    s_delta += d_dA * A[di, ni]
                    s_B += dh * B[bi, t, ni]
                    carry[di, ni] = at * dh
                ddelta[bi, t, di] = s_delta + s_B * x
                du[bi, t, di] = s_B * dt + D[di] * gt
                dD[di] += gt * x


def _fast_forward(u, delta, A, B, C, D):
    b, l, d = u.shape
    n = A.shape[1]
    y = np.empty_like(u)
    a = np.empty((b, l, d, n), dtype=u.dtype)
    _outer_kernel(delta, A, a)
    np.exp(a, out=a)
    h = np.empty((b, l + 1, d, n), dtype=u.dtype)
    h[:, 0] = 0
    D_ = np.zeros(d, dtype=u.dtype) if D is None else D
    _fast_forward_kernel(u, delta, B, C, D_, a, y, h)
    # Compiled loops raise no floating-point warnings: say what NumPy says for the other methods when
    # the state overflows (A > 0 makes exp(delta A) > 1, and the state grows at every step).
    if not np.isfinite(y).all() and all(np.isfinite(x).all() for x in (u, delta, A, B, C, D_)):
        growing = " (A has positive entries: exp(delta A) > 1 makes the state grow at every step)" \
            if (A > 0).any() else ""
        warnings.warn(f"selective_scan: overflow encountered in the scan, the output holds inf or nan{growing}",
                      RuntimeWarning, stacklevel=4)
    return y, (a, h)


def _fast_backward(g, u, delta, A, B, C, D, saved):
    a, h = saved
    b, l, d = u.shape
    du, ddelta = np.empty_like(u), np.empty_like(u)
    dB, dC = np.empty_like(B), np.empty_like(C)
    dA = np.zeros_like(A)
    dD = np.zeros(d, dtype=u.dtype)
    D_ = np.zeros(d, dtype=u.dtype) if D is None else D
    _fast_backward_kernel(np.ascontiguousarray(g), u, delta, A, B, C, D_, a, h, du, ddelta, dA, dB, dC, dD)
    return du, ddelta, dA, dB, dC, (None if D is None else dD)


_FORWARD = {"sequential": _sequential_forward, "parallel": _parallel_forward, "fast": _fast_forward}
_BACKWARD = {"sequential": _sequential_backward, "parallel": _parallel_backward, "fast": _fast_backward}


# ----- the operation -------------------------------------------------------------------------------
def _check(arrays, method):
    if method not in _FORWARD:
        raise ValueError(f"selective_scan: unknown method {method!r}; the known ones are "
                         f"{', '.join(repr(m) for m in METHODS)}")
    names = ("u", "delta", "A", "B", "C", "D")
    for name, x in zip(names, arrays):
        if x is not None and not np.issubdtype(x.dtype, np.floating):
            raise TypeError(f"selective_scan: {name} must hold floating-point numbers, got dtype {x.dtype}")
    if method == "fast":
        dtype = np.result_type(*[x for x in arrays if x is not None])
        if dtype not in (np.float32, np.float64):
            raise TypeError(f"selective_scan: method 'fast' (compiled by Numba) computes in float32 or float64, not "
                            f"{dtype}: cast the inputs to float32, or use method='sequential' or 'parallel' (for a "
                            f"Mamba: model.scan_method = 'sequential')")
    u, delta, A, B, C, D = arrays
    fits = (u.ndim == 3 and delta.shape == u.shape and A.ndim == 2 and A.shape[0] == u.shape[2]
            and B.shape == u.shape[:2] + (A.shape[1],) and C.shape == B.shape
            and (D is None or D.shape == (u.shape[2],)))
    if not fits:
        shapes = ", ".join(f"{name} {None if x is None else x.shape}" for name, x in zip(names, arrays))
        raise ValueError(f"selective_scan: the shapes do not fit: {shapes}; expected u and delta (b, l, d_in), "
                         f"A (d_in, n), B and C (b, l, n), D (d_in,) or None")


@dispatchable
def selective_scan(u, delta, A, B, C, D=None, method="sequential"):
    """y (b, l, d_in) = the selective scan of u with step sizes delta and parameters A, B, C, D.

    Takes NumPy arrays or Tensors (or a mix). With any Tensor among them the result is a Tensor
    recorded as one operation (its backward a reverse-time scan giving all six gradients);
    with arrays only it is an array. The result has the dtype the inputs share (NumPy's
    promotion where they differ). method: "sequential", "parallel" or "fast" (see the module).
    """
    inputs = (u, delta, A, B, C, D)
    any_tensor = any(isinstance(x, Tensor) for x in inputs)
    arrays = [None if x is None else np.asarray(x.data if isinstance(x, Tensor) else x) for x in inputs]
    _check(arrays, method)
    dtype = np.result_type(*[x for x in arrays if x is not None])
    arrays = [None if x is None else np.ascontiguousarray(x, dtype=dtype) for x in arrays]
    y, saved = _FORWARD[method](*arrays)
    if not any_tensor:
        return y
    tensors = tuple(x if isinstance(x, Tensor) or x is None else Tensor(np.asarray(x)) for x in inputs)

    def backward(g):
        grads = _BACKWARD[method](np.asarray(g, dtype=dtype), *arrays, saved)
        return tuple(None if gr is None or t is None or not t.requires_grad else gr.astype(t.dtype, copy=False)
                     for gr, t in zip(grads, tensors))

    return operation("selective_scan", y, tensors, backward)
