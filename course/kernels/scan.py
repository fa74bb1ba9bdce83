"""Mamba's selective scan as a CUDA kernel: one thread per (sequence, channel).

Shapes are mamba-minimal's: u and delta (b, l, d), A (d, n), B and C (b, l, n), D (d,).

    h_t = exp(delta_t A) * h_{t-1} + delta_t B_t u_t        h: n numbers per (sequence, channel)
    y_t = <C_t, h_t> + D u_t

Time is sequential, but the b * d channels are independent: each gets a thread, which carries
its state h in local memory (registers, for small n) through the l steps. Neighbouring threads
are neighbouring channels, so their reads of u and delta at one time step are coalesced.

The backward is the same loop run backwards in time. The gradient reaching h_t comes from y_t
(through C_t) and from h_{t+1} (through its decay): dh_t = C_t g_t + exp(delta_{t+1} A) dh_{t+1}.
It needs the states h_t, which the forward stores when a gradient will be wanted. dB and dC sum
over the channels, which are different threads: those sums use atomic adds.
"""

import math

import numpy as np
from numba import float32

from ._backend import cuda
from .basics import reduce_rows
from .launch import THREADS_PER_BLOCK, as_float32, blocks_for, launch

MAX_STATE = 64  # n: the size of the local arrays, fixed when the kernel is compiled


@cuda.jit
def selective_scan_kernel(u, delta, A, B, C, D, y, states, keep_states):
    i = cuda.grid(1)
    batch, length, channels = u.shape
    n = A.shape[1]
    if i < batch * channels:
        bi, d = i // channels, i % channels
        h = cuda.local.array(MAX_STATE, float32)
        for s in range(n):
            h[s] = 0
        for t in range(length):
            dt, x = delta[bi, t, d], u[bi, t, d]
            acc = D[d] * x
            for s in range(n):
                h[s] = math.exp(dt * A[d, s]) * h[s] + dt * B[bi, t, s] * x
                acc += C[bi, t, s] * h[s]
                if keep_states:
                    states[bi, t, d, s] = h[s]
            y[bi, t, d] = acc


@cuda.jit
def selective_scan_backward_kernel(g, u, delta, A, B, C, D, states, du, ddelta, dA, dB, dC, dD):
    """dA and dD get one row per sequence (dA[bi, d, s]): only this thread writes there.
    dB and dC (b, l, n) sum over channels, so every thread of a sequence adds to them: atomics."""
    i = cuda.grid(1)
    batch, length, channels = u.shape
    n = A.shape[1]
    if i < batch * channels:
        bi, d = i // channels, i % channels
        dh = cuda.local.array(MAX_STATE, float32)  # what reaches h_t from the future
        for s in range(n):
            dh[s] = 0
        d_D = float32(0)
        for t in range(length - 1, -1, -1):
            gt, dt, x = g[bi, t, d], delta[bi, t, d], u[bi, t, d]
            d_delta = float32(0)
            s_B = float32(0)  # sum over the state of dh * B: the gradient of the input term delta B u
            for s in range(n):
                decay = math.exp(dt * A[d, s])
                h_prev = states[bi, t - 1, d, s] if t > 0 else float32(0)
                dh_t = dh[s] + gt * C[bi, t, s]
                cuda.atomic.add(dC, (bi, t, s), gt * states[bi, t, d, s])
                cuda.atomic.add(dB, (bi, t, s), dh_t * dt * x)
                # h_t = decay * h_prev + dt B x with decay = exp(dt A):  d/d(dt A) = dh_t h_prev decay
                d_exp = dh_t * h_prev * decay
                dA[bi, d, s] += d_exp * dt
                d_delta += d_exp * A[d, s]
                s_B += dh_t * B[bi, t, s]
                dh[s] = decay * dh_t  # carried to h_{t-1}
            ddelta[bi, t, d] = d_delta + s_B * x
            du[bi, t, d] = s_B * dt + D[d] * gt
            d_D += gt * x
        dD[bi, d] = d_D


# ----- host functions ---------------------------------------------------------------------------------
def _check(u, delta, A, B, C, D):
    names = ("u", "delta", "A", "B", "C", "D")
    arrays = [None if x is None else as_float32(x, "selective_scan", name)
              for name, x in zip(names, (u, delta, A, B, C, D))]
    u, delta, A, B, C, D = arrays
    fits = (u.ndim == 3 and delta.shape == u.shape and A.ndim == 2 and A.shape[0] == u.shape[2]
            and B.shape == u.shape[:2] + (A.shape[1],) and C.shape == B.shape
            and (D is None or D.shape == (u.shape[2],)))
    if not fits:
        shapes = ", ".join(f"{name} {None if x is None else x.shape}" for name, x in zip(names, arrays))
        raise ValueError(f"selective_scan: the shapes do not fit: {shapes}; expected u and delta (b, l, d), "
                         f"A (d, n), B and C (b, l, n), D (d,) or None")
    if A.shape[1] > MAX_STATE:
        raise ValueError(f"selective_scan: a state of {A.shape[1]} numbers is more than the kernel's local "
                         f"array of MAX_STATE={MAX_STATE}")
    if D is None:
        D = np.zeros(u.shape[2], np.float32)
    return u, delta, A, B, C, D


def selective_scan(u, delta, A, B, C, D=None, return_states=False):
    """y (b, l, d) of the selective scan of float32 arrays; with return_states, also the states
    h (b, l, d, n) that the backward needs."""
    u, delta, A, B, C, D = _check(u, delta, A, B, C, D)
    (b, l, d), n = u.shape, A.shape[1]
    y = cuda.device_array(u.shape, dtype=np.float32)
    states = cuda.device_array((b, l, d, n) if return_states else (1, 1, 1, 1), dtype=np.float32)
    if u.size:
        launch(selective_scan_kernel, blocks_for(b * d, THREADS_PER_BLOCK), THREADS_PER_BLOCK,
               *[cuda.to_device(x) for x in (u, delta, A, B, C, D)], y, states, return_states)
    if return_states:
        return y.copy_to_host(), states.copy_to_host()
    return y.copy_to_host()


def selective_scan_backward(g, u, delta, A, B, C, D, states):
    """The gradients (du, ddelta, dA, dB, dC, dD) of sum(g * selective_scan(...)), from the states."""
    u, delta, A, B, C, D = _check(u, delta, A, B, C, D)
    g = as_float32(g, "selective_scan_backward", "g")
    (b, l, d), n = u.shape, A.shape[1]
    if g.shape != u.shape or states.shape != (b, l, d, n):
        raise ValueError(f"selective_scan_backward: g {g.shape} and states {states.shape} need shapes "
                         f"{u.shape} and {(b, l, d, n)}")
    du, ddelta = cuda.device_array(u.shape, np.float32), cuda.device_array(u.shape, np.float32)
    dA, dD = cuda.to_device(np.zeros((b, d, n), np.float32)), cuda.device_array((b, d), np.float32)
    dB, dC = cuda.to_device(np.zeros(B.shape, np.float32)), cuda.to_device(np.zeros(C.shape, np.float32))
    if u.size:
        launch(selective_scan_backward_kernel, blocks_for(b * d, THREADS_PER_BLOCK), THREADS_PER_BLOCK,
               *[cuda.to_device(x) for x in (g, u, delta, A, B, C, D, as_float32(states, "selective_scan", "states"))],
               du, ddelta, dA, dB, dC, dD)
    # dA and dD come as one row per sequence: a kernel sums them too.
    return (du.copy_to_host(), ddelta.copy_to_host(), reduce_rows(dA.copy_to_host()), dB.copy_to_host(),
            dC.copy_to_host(), reduce_rows(dD.copy_to_host()))
