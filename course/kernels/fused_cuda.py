"""Fused CUDA kernels (lesson 6.5): attention by tiles with an online softmax, and cross-entropy.

    out, lse = attention(q, k, v, causal=True)       # float32 (..., T, d) in, as NumPy arrays
    loss, grad = cross_entropy(logits, targets)       # the mean loss and d loss / d logits

Attention: one block per (tile of ATT_BLOCK queries, batch*head), one thread per query row. The
threads load a tile of ATT_BLOCK keys and values into shared memory together (thread t loads key
t of the tile), wait, and then each thread scores its query against the tile and folds the tile
into its running softmax: its maximum m, its sum l and its output acc (a local array) are
rescaled by exp(m_old - m_new) whenever the maximum grows. The (T, T) matrix never exists; each
key is read from global memory once per block instead of once per query. Under the causal mask,
a block stops at the last key its last query may see, and each row at its own position.

Cross-entropy: one block per row, as softmax in rows.py: the row's maximum and sum of
exponentials by block reductions, then the loss of the row and its gradient
(softmax - onehot(target)) / count written in the same kernel.

Sizes are compile-time constants (shared and local arrays must be): head sizes up to MAX_HEAD.
"""

import math

import numpy as np
from numba import float32

from ._backend import backend, cuda
from .launch import THREADS_PER_BLOCK, as_float32, launch
from .rows import block_max, block_sum

__all__ = ["attention", "cross_entropy", "attention_kernel", "cross_entropy_kernel", "ATT_BLOCK", "MAX_HEAD"]

# Queries per block (= threads per block) and keys per shared tile. The simulator runs one OS
# thread per GPU thread, so it gets small blocks.
ATT_BLOCK = 32 if backend() == "gpu" else 8
MAX_HEAD = 64  # the largest head size: the local and shared arrays are this wide


@cuda.jit
def attention_kernel(q, k, v, scale, causal, out, lse):
    ks = cuda.shared.array((ATT_BLOCK, MAX_HEAD), float32)
    vs = cuda.shared.array((ATT_BLOCK, MAX_HEAD), float32)
    qrow = cuda.local.array(MAX_HEAD, float32)
    acc = cuda.local.array(MAX_HEAD, float32)
    scores = cuda.local.array(ATT_BLOCK, float32)
    t, bh = cuda.threadIdx.x, cuda.blockIdx.y
    t_q, d_k = q.shape[1], q.shape[2]
    t_k, d_v = k.shape[1], v.shape[2]
    offset = t_k - t_q  # query i sits at position offset + i
    row = cuda.blockIdx.x * ATT_BLOCK + t
    active = row < t_q
    if active:
        for d in range(d_k):
            qrow[d] = q[bh, row, d] * scale
    for d in range(d_v):
        acc[d] = 0
    m = float32(-math.inf)
    l = float32(0)
    # The same for every thread of the block, so that all of them reach the same barriers.
    last = min(t_q, (cuda.blockIdx.x + 1) * ATT_BLOCK) - 1
    k_end = min(t_k, offset + last + 1) if causal else t_k
    for k0 in range(0, k_end, ATT_BLOCK):
        j = k0 + t  # thread t loads key j of the tile (zeros past the end)
        for d in range(d_k):
            ks[t, d] = k[bh, j, d] if j < t_k else 0
        for d in range(d_v):
            vs[t, d] = v[bh, j, d] if j < t_k else 0
        cuda.syncthreads()  # the tile is complete
        if active:
            n = min(ATT_BLOCK, k_end - k0)
            if causal:
                n = min(n, offset + row - k0 + 1)  # this row's keys: up to its own position
            if n > 0:
                m_new = m
                for jj in range(n):
                    s = float32(0)
                    for d in range(d_k):
                        s += qrow[d] * ks[jj, d]
                    scores[jj] = s
                    m_new = max(m_new, s)
                alpha = math.exp(m - m_new)  # rescales everything summed against the old maximum
                l = l * alpha
                for d in range(d_v):
                    acc[d] = acc[d] * alpha  # the output as well as the sum
                for jj in range(n):
                    p = math.exp(scores[jj] - m_new)
                    l += p
                    for d in range(d_v):
                        acc[d] += p * vs[jj, d]
                m = m_new
        cuda.syncthreads()  # everyone is done with the tile before the next one overwrites it
    if active:
        for d in range(d_v):
            out[bh, row, d] = acc[d] / l
        lse[bh, row] = m + math.log(l)


@cuda.jit
def cross_entropy_kernel(x, targets, keep, inv_count, grad, losses):
    cache = cuda.shared.array(THREADS_PER_BLOCK, float32)
    row, t, n = cuda.blockIdx.x, cuda.threadIdx.x, x.shape[1]
    if keep[row] == 0:  # the same for the whole block: no barrier is skipped by only some threads
        for j in range(t, n, cuda.blockDim.x):
            grad[row, j] = 0
        if t == 0:
            losses[row] = 0
        return
    m = float32(-math.inf)
    for j in range(t, n, cuda.blockDim.x):
        m = max(m, x[row, j])
    m = block_max(cache, m)
    s = float32(0)
    for j in range(t, n, cuda.blockDim.x):
        e = math.exp(x[row, j] - m)
        grad[row, j] = e
        s += e
    s = block_sum(cache, s)
    target = targets[row]
    for j in range(t, n, cuda.blockDim.x):  # each thread finishes the elements it wrote itself
        g = grad[row, j] / s
        if j == target:
            g -= 1
        grad[row, j] = g * inv_count
    if t == 0:
        losses[row] = m + math.log(s) - x[row, target]


# ----- host functions ---------------------------------------------------------------------------------
def attention(q, k, v, causal=True):
    """softmax(q k^T / sqrt(d)) v by tiles on the GPU: returns (out, lse), lse = the log of each row's
    softmax denominator (what a backward needs). q (..., Tq, d), k (..., Tk, d), v (..., Tk, dv)."""
    q, k, v = (as_float32(a, "attention", name) for a, name in ((q, "q"), (k, "k"), (v, "v")))
    if (q.ndim < 2 or q.ndim != k.ndim or k.ndim != v.ndim or q.shape[:-2] != k.shape[:-2]
            or k.shape[:-2] != v.shape[:-2] or q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]):
        raise ValueError(f"attention: q {q.shape}, k {k.shape} and v {v.shape} do not fit: expected "
                         f"(..., Tq, d), (..., Tk, d) and (..., Tk, dv) with the same leading axes")
    if max(q.shape[-1], v.shape[-1]) > MAX_HEAD:
        raise ValueError(f"attention: head sizes {q.shape[-1]} and {v.shape[-1]} must be at most "
                         f"MAX_HEAD={MAX_HEAD} (the kernel's local arrays have that many slots)")
    if causal and q.shape[-2] > k.shape[-2]:
        raise ValueError(f"attention: {q.shape[-2]} causal queries need at least as many keys, got {k.shape[-2]}")
    lead, t_q = q.shape[:-2], q.shape[-2]
    q3, k3, v3 = (a.reshape((-1,) + a.shape[-2:]) for a in (q, k, v))
    out = cuda.device_array(q3.shape[:2] + v3.shape[2:], dtype=np.float32)
    lse = cuda.device_array(q3.shape[:2], dtype=np.float32)
    if q3.size and k3.shape[1]:
        grid = ((t_q + ATT_BLOCK - 1) // ATT_BLOCK, q3.shape[0])
        launch(attention_kernel, grid, ATT_BLOCK, cuda.to_device(q3), cuda.to_device(k3), cuda.to_device(v3),
               np.float32(1 / np.sqrt(q.shape[-1])), bool(causal), out, lse)
    return (out.copy_to_host().reshape(lead + (t_q, v.shape[-1])), lse.copy_to_host().reshape(lead + (t_q,)))


def cross_entropy(logits, targets, ignore_index=None):
    """(mean loss, gradient of the loss with respect to the logits) for float32 logits (..., C) and
    integer targets of shape logits.shape[:-1]; targets equal to ignore_index count for nothing."""
    x = as_float32(logits, "cross_entropy", "logits")
    t = np.asarray(targets)
    if not np.issubdtype(t.dtype, np.integer):
        raise TypeError(f"cross_entropy: targets must be integers (class indices), got dtype {t.dtype}")
    if x.ndim == 0 or t.shape != x.shape[:-1]:
        raise ValueError(f"cross_entropy: logits of shape {x.shape} need targets of shape {x.shape[:-1]}, "
                         f"got targets of shape {t.shape}")
    c = x.shape[-1]
    keep = np.ones(t.shape, bool) if ignore_index is None else t != ignore_index
    n_keep = int(keep.sum())
    if n_keep == 0:
        raise ValueError(f"cross_entropy: every target equals ignore_index={ignore_index}: nothing to average")
    bad = keep & ((t < 0) | (t >= c))
    if bad.any():
        raise ValueError(f"cross_entropy: target {t[bad][0]} is out of range for {c} classes")
    x2 = x.reshape(-1, c)
    rows = len(x2)
    grad = cuda.device_array(x2.shape, dtype=np.float32)
    losses = cuda.device_array(rows, dtype=np.float32)
    launch(cross_entropy_kernel, rows, THREADS_PER_BLOCK, cuda.to_device(x2),
           cuda.to_device(np.where(keep, t, 0).reshape(-1).astype(np.int32)),
           cuda.to_device(keep.reshape(-1).astype(np.int8)), np.float32(1 / n_keep), grad, losses)
    loss = np.float32(losses.copy_to_host().astype(np.float64).sum() / n_keep)
    return loss, grad.copy_to_host().reshape(x.shape)
