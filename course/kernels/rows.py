"""Softmax and layer norm over the rows of a matrix: one block per row.

Each row needs a reduction (softmax: its maximum, then the sum of exponentials; layer norm: the
mean, then the variance) and then an elementwise pass that uses the result. One block per row
lets the threads of the block share those numbers through shared memory. A row may be longer than
the block: each thread then handles the elements t, t + blockDim.x, t + 2 blockDim.x, ... (a
block-stride loop), keeping its partial result in a register until the block combines them.

Softmax subtracts the row's maximum before exponentiating, so exp never overflows float32 (its
largest argument is 0), whatever the size of the logits.
"""

import math

import numpy as np
from numba import float32

from ._backend import cuda
from .launch import THREADS_PER_BLOCK, as_float32, launch


# ----- block-wide reductions (device functions: called by kernels, not launched) ------------------
@cuda.jit(device=True)
def block_sum(cache, value):
    """The sum of `value` over the threads of the block, handed to every thread.

    Tree reduction: each step halves the threads that add, with a barrier between steps. The
    last barrier lets everyone read the total before the cache is used again.
    """
    t = cuda.threadIdx.x
    cache[t] = value
    cuda.syncthreads()
    step = cuda.blockDim.x // 2
    while step > 0:
        if t < step:
            cache[t] += cache[t + step]
        cuda.syncthreads()
        step //= 2
    total = cache[0]
    cuda.syncthreads()  # everyone has read cache[0] before anyone writes the cache again
    return total


@cuda.jit(device=True)
def block_max(cache, value):
    t = cuda.threadIdx.x
    cache[t] = value
    cuda.syncthreads()
    step = cuda.blockDim.x // 2
    while step > 0:
        if t < step:
            cache[t] = max(cache[t], cache[t + step])
        cuda.syncthreads()
        step //= 2
    result = cache[0]
    cuda.syncthreads()
    return result


# ----- softmax ------------------------------------------------------------------------------------
@cuda.jit
def softmax_kernel(x, out):
    cache = cuda.shared.array(THREADS_PER_BLOCK, float32)
    row, t, n = cuda.blockIdx.x, cuda.threadIdx.x, x.shape[1]
    m = float32(-math.inf)
    for j in range(t, n, cuda.blockDim.x):
        m = max(m, x[row, j])
    m = block_max(cache, m)
    s = float32(0)
    for j in range(t, n, cuda.blockDim.x):
        e = math.exp(x[row, j] - m)  # <= 1: never overflows
        out[row, j] = e
        s += e
    s = block_sum(cache, s)
    for j in range(t, n, cuda.blockDim.x):  # each thread rescales the elements it wrote itself
        out[row, j] = out[row, j] / s


@cuda.jit
def softmax_backward_kernel(s, g, dx):
    """dx = s * (g - <g, s>) row by row: the softmax Jacobian diag(s) - s s^T applied to g."""
    cache = cuda.shared.array(THREADS_PER_BLOCK, float32)
    row, t, n = cuda.blockIdx.x, cuda.threadIdx.x, s.shape[1]
    dot = float32(0)
    for j in range(t, n, cuda.blockDim.x):
        dot += g[row, j] * s[row, j]
    dot = block_sum(cache, dot)
    for j in range(t, n, cuda.blockDim.x):
        dx[row, j] = s[row, j] * (g[row, j] - dot)


# ----- layer norm ---------------------------------------------------------------------------------
@cuda.jit
def layer_norm_kernel(x, weight, bias, eps, out, mean, rstd):
    """out = (x - mean) / sqrt(var + eps) * weight + bias per row; keeps mean and 1/std for the backward."""
    cache = cuda.shared.array(THREADS_PER_BLOCK, float32)
    row, t, n = cuda.blockIdx.x, cuda.threadIdx.x, x.shape[1]
    s = float32(0)
    for j in range(t, n, cuda.blockDim.x):
        s += x[row, j]
    inv_n = float32(1) / float32(n)  # float32 all the way: float64 is slow on most GPUs
    mu = block_sum(cache, s) * inv_n
    # Two passes: sum((x - mu)^2) loses less than sum(x^2) - n mu^2. The squares are taken of
    # (x - mu) / m, m the largest |x - mu| of the row, so that they cannot overflow float32 (a row
    # such as [3e38, -3e38, 1] would give inf, then zeros).
    m = float32(0)
    for j in range(t, n, cuda.blockDim.x):
        m = max(m, abs(x[row, j] - mu))
    m = block_max(cache, m)
    s = float32(0)
    if m > 0:
        for j in range(t, n, cuda.blockDim.x):
            d = (x[row, j] - mu) / m
            s += d * d
    q = block_sum(cache, s) * inv_n  # the variance is m^2 q, with 1/n <= q <= 1 (or 0 when m = 0)
    if m < float32(1e18):  # m^2 q fits float32
        r = float32(1) / math.sqrt(m * m * q + eps)
    else:  # m^2 q is far above eps: leave eps out, and never form m^2
        r = float32(1) / (m * math.sqrt(q))
    for j in range(t, n, cuda.blockDim.x):
        out[row, j] = (x[row, j] - mu) * r * weight[j] + bias[j]
    if t == 0:
        mean[row] = mu
        rstd[row] = r


@cuda.jit
def layer_norm_backward_kernel(x, weight, mean, rstd, g, dx):
    """dx = rstd * (gy - mean(gy) - xhat * mean(gy * xhat)) with gy = g * weight, row by row."""
    cache = cuda.shared.array(THREADS_PER_BLOCK, float32)
    row, t, n = cuda.blockIdx.x, cuda.threadIdx.x, x.shape[1]
    mu, r = mean[row], rstd[row]
    s1 = float32(0)
    s2 = float32(0)
    for j in range(t, n, cuda.blockDim.x):
        gy = g[row, j] * weight[j]
        s1 += gy
        s2 += gy * (x[row, j] - mu) * r
    inv_n = float32(1) / float32(n)
    s1 = block_sum(cache, s1) * inv_n
    s2 = block_sum(cache, s2) * inv_n
    for j in range(t, n, cuda.blockDim.x):
        xhat = (x[row, j] - mu) * r
        dx[row, j] = r * (g[row, j] * weight[j] - s1 - xhat * s2)


@cuda.jit
def layer_norm_params_backward_kernel(x, mean, rstd, g, dweight, dbias):
    """dweight = sum over rows of g * xhat, dbias = sum of g: one thread per column, looping over
    the rows (neighbouring threads read neighbouring columns: coalesced)."""
    j = cuda.grid(1)
    if j < x.shape[1]:
        sw = float32(0)
        sb = float32(0)
        for row in range(x.shape[0]):
            sw += g[row, j] * (x[row, j] - mean[row]) * rstd[row]
            sb += g[row, j]
        dweight[j] = sw
        dbias[j] = sb


# ----- host functions -----------------------------------------------------------------------------
def _rows(x, name):
    x = as_float32(x, name)
    if x.ndim != 2:
        raise ValueError(f"{name}: takes a 2-D array (one row per block), got shape {x.shape}")
    return x


def softmax(x):
    """softmax over each row of a 2-D float32 array (one block per row)."""
    x = _rows(x, "softmax")
    out = cuda.device_array(x.shape, dtype=np.float32)
    if x.size:
        launch(softmax_kernel, x.shape[0], THREADS_PER_BLOCK, cuda.to_device(x), out)
    return out.copy_to_host()


def softmax_backward(s, g):
    """The gradient of softmax's input, from its output `s` and the gradient `g` of that output."""
    s, g = _rows(s, "softmax_backward"), _rows(g, "softmax_backward")
    if s.shape != g.shape:
        raise ValueError(f"softmax_backward: shapes {s.shape} and {g.shape} differ")
    dx = cuda.device_array(s.shape, dtype=np.float32)
    if s.size:
        launch(softmax_backward_kernel, s.shape[0], THREADS_PER_BLOCK, cuda.to_device(s), cuda.to_device(g), dx)
    return dx.copy_to_host()


def _params(weight, bias, n):
    weight = np.ones(n, np.float32) if weight is None else as_float32(weight, "layer_norm", "weight")
    bias = np.zeros(n, np.float32) if bias is None else as_float32(bias, "layer_norm", "bias")
    for what, p in (("weight", weight), ("bias", bias)):
        if p.shape != (n,):
            raise ValueError(f"layer_norm: rows of {n} numbers need a {what} of shape ({n},), got shape {p.shape}")
    return weight, bias


def layer_norm(x, weight=None, bias=None, eps=1e-5, return_stats=False):
    """Layer norm over each row of a 2-D float32 array; with return_stats, also (mean, rstd) per row."""
    x = _rows(x, "layer_norm")
    weight, bias = _params(weight, bias, x.shape[1])
    rows = x.shape[0]
    out = cuda.device_array(x.shape, dtype=np.float32)
    mean, rstd = cuda.device_array(rows, dtype=np.float32), cuda.device_array(rows, dtype=np.float32)
    if x.size:
        launch(layer_norm_kernel, rows, THREADS_PER_BLOCK, cuda.to_device(x), cuda.to_device(weight),
               cuda.to_device(bias), np.float32(eps), out, mean, rstd)
    if return_stats:
        return out.copy_to_host(), mean.copy_to_host(), rstd.copy_to_host()
    return out.copy_to_host()


def layer_norm_backward(x, weight, mean, rstd, g):
    """(dx, dweight, dbias) of layer norm, from the input, the saved statistics and the gradient g."""
    x, g = _rows(x, "layer_norm_backward"), _rows(g, "layer_norm_backward")
    if x.shape != g.shape:
        raise ValueError(f"layer_norm_backward: shapes {x.shape} and {g.shape} differ")
    weight, _ = _params(weight, None, x.shape[1])
    dx = cuda.device_array(x.shape, dtype=np.float32)
    dw, db = cuda.device_array(x.shape[1], dtype=np.float32), cuda.device_array(x.shape[1], dtype=np.float32)
    if x.size:
        d_x, d_g = cuda.to_device(x), cuda.to_device(g)
        d_mean, d_rstd = cuda.to_device(as_float32(mean, "layer_norm_backward", "mean")), \
            cuda.to_device(as_float32(rstd, "layer_norm_backward", "rstd"))
        launch(layer_norm_backward_kernel, x.shape[0], THREADS_PER_BLOCK, d_x, cuda.to_device(weight),
               d_mean, d_rstd, d_g, dx)
        cols = x.shape[1]
        launch(layer_norm_params_backward_kernel, (cols + THREADS_PER_BLOCK - 1) // THREADS_PER_BLOCK,
               THREADS_PER_BLOCK, d_x, d_mean, d_rstd, d_g, dw, db)
    return dx.copy_to_host(), dw.copy_to_host(), db.copy_to_host()
