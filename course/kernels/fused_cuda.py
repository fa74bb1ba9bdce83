"""Fused CUDA kernels (lesson 6.5): attention by tiles with an online softmax, its backward, and
cross-entropy.

    out, lse = attention(q, k, v, causal=True)                 # float32 (..., T, d) NumPy arrays in and out
    dq, dk, dv = attention_backward(q, k, v, out, lse, dout, causal=True)
    loss, grad = cross_entropy(logits, targets)                 # the mean loss and d loss / d logits

Those host functions copy in, call the device functions below and copy out. The device functions
take and return numba device arrays (on a GPU or on the simulator alike) and copy nothing:

    attention_forward_device(q, k, v, causal, scale) -> (out, lse)          q (BH, Tq, D), k, v (BH, Tk, D)
    attention_backward_device(q, k, v, out, lse, dout, causal, scale) -> (dq, dk, dv)
    cross_entropy_forward_device(logits, targets, ignore_index) -> (losses, lse)   logits (N, C)
    cross_entropy_backward_device(logits, targets, lse, ignore_index, scale) -> grad

Attention forward: one block per (tile of ATT_BLOCK queries, batch*head), one thread per query
row. The threads load a tile of ATT_BLOCK keys and values into shared memory together (thread t
loads key t of the tile), wait, and then each thread scores its query against the tile and folds
the tile into its running softmax: its maximum m, its sum l and its output acc (a local array)
are rescaled by exp(m_old - m_new) whenever the maximum grows. The (T, T) matrix never exists;
each key is read from global memory once per block instead of once per query. Under the causal
mask, a block stops at the last key its last query may see, and each row at its own position.
It saves lse = m + log l, the log of each row's softmax denominator, for the backward.

Attention backward (FlashAttention-2): the probabilities are recomputed a tile at a time from q,
k and the saved lse, p_ij = exp(s_ij - lse_i), so the backward stores no (T, T) matrix either.
With D_i = sum_d dout_id out_id (the <dP, P> of the softmax backward, one number per row):

    dv_j = sum_i p_ij dout_i      dp_ij = dout_i . v_j      ds_ij = p_ij (dp_ij - D_i)
    dq_i = scale sum_j ds_ij k_j      dk_j = scale sum_i ds_ij q_i

dq sums over keys, dk and dv over queries. Two kernels give each sum a single owner:
- attention_backward_dq_kernel: one block per query tile (as the forward), one thread per query
  row, looping over key tiles; it also computes and saves D_i for the next kernel;
- attention_backward_dkdv_kernel: one block per key tile, one thread per key, looping over the
  query tiles (q, dout, lse and D loaded into shared memory together).
The other way, one kernel per key tile adding its share of every dq_i with atomicAdd, computes
the scores once instead of twice, but then all the key tiles of a head add into the same dq rows
(they wait for each other there), and float atomics add in whatever order the blocks arrive: the
gradient changes in its last bits from run to run. Recomputing a score is a dot product, cheap
next to that, and two kernels give the same gradient every time with no atomics.

Cross-entropy: one block per row, as softmax in rows.py. The forward finds the row's maximum and
sum of exponentials by block reductions and writes the row's loss lse - x[target] (0 on a row
whose target is ignore_index) and lse. The backward writes (softmax - onehot(target)) * scale[0]
with softmax = exp(x - lse); `scale` is a one-element device array (the caller's dloss / count,
computed on the device, so no number has to come back to the host to finish the step).

Sizes are compile-time constants (shared and local arrays must be): head sizes up to MAX_HEAD.
"""

import math

import numpy as np
from numba import float32

from ._backend import backend, cuda
from .launch import THREADS_PER_BLOCK, as_float32, launch
from .rows import block_max, block_sum

__all__ = ["attention", "attention_backward", "cross_entropy", "attention_forward_device",
           "attention_backward_device", "cross_entropy_forward_device", "cross_entropy_backward_device",
           "attention_kernel", "attention_backward_dq_kernel", "attention_backward_dkdv_kernel",
           "cross_entropy_forward_kernel", "cross_entropy_backward_kernel", "ATT_BLOCK", "MAX_HEAD"]

# Queries per block (= threads per block) and keys per shared tile. The simulator runs one OS
# thread per GPU thread, so it gets small blocks.
ATT_BLOCK = 32 if backend() == "gpu" else 8
MAX_HEAD = 64  # the largest head size: the local and shared arrays are this wide


# ----- attention: forward ---------------------------------------------------------------------------
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


# ----- attention: backward ------------------------------------------------------------------------------
@cuda.jit
def attention_backward_dq_kernel(q, k, v, out, dout, lse, scale, causal, dq, delta):
    """dq for a tile of queries, one thread per query row, visiting the key tiles as the forward
    does; each thread first computes its row's D_i = dout_i . out_i and saves it in `delta`."""
    ks = cuda.shared.array((ATT_BLOCK, MAX_HEAD), float32)
    vs = cuda.shared.array((ATT_BLOCK, MAX_HEAD), float32)
    qrow = cuda.local.array(MAX_HEAD, float32)
    grow = cuda.local.array(MAX_HEAD, float32)
    acc = cuda.local.array(MAX_HEAD, float32)
    t, bh = cuda.threadIdx.x, cuda.blockIdx.y
    t_q, d_k = q.shape[1], q.shape[2]
    t_k, d_v = k.shape[1], v.shape[2]
    offset = t_k - t_q
    row = cuda.blockIdx.x * ATT_BLOCK + t
    active = row < t_q
    row_lse = float32(0)
    row_delta = float32(0)
    if active:
        for d in range(d_k):
            qrow[d] = q[bh, row, d] * scale
            acc[d] = 0
        for d in range(d_v):
            g = dout[bh, row, d]
            grow[d] = g
            row_delta += g * out[bh, row, d]
        delta[bh, row] = row_delta
        row_lse = lse[bh, row]
    last = min(t_q, (cuda.blockIdx.x + 1) * ATT_BLOCK) - 1
    k_end = min(t_k, offset + last + 1) if causal else t_k
    for k0 in range(0, k_end, ATT_BLOCK):
        j = k0 + t
        for d in range(d_k):
            ks[t, d] = k[bh, j, d] if j < t_k else 0
        for d in range(d_v):
            vs[t, d] = v[bh, j, d] if j < t_k else 0
        cuda.syncthreads()
        if active:
            n = min(ATT_BLOCK, k_end - k0)
            if causal:
                n = min(n, offset + row - k0 + 1)
            for jj in range(n):
                s = float32(0)
                for d in range(d_k):
                    s += qrow[d] * ks[jj, d]
                p = math.exp(s - row_lse)  # the forward's probability, recomputed
                dp = float32(0)
                for d in range(d_v):
                    dp += grow[d] * vs[jj, d]
                ds = p * (dp - row_delta)
                for d in range(d_k):
                    acc[d] += ds * ks[jj, d]
        cuda.syncthreads()
    if active:
        for d in range(d_k):
            dq[bh, row, d] = acc[d] * scale


@cuda.jit
def attention_backward_dkdv_kernel(q, k, v, dout, lse, delta, scale, causal, dk, dv):
    """dk and dv for a tile of keys, one thread per key, visiting the query tiles that see it:
    thread t loads query t of each tile (its q, dout, lse and D) into shared memory."""
    qs = cuda.shared.array((ATT_BLOCK, MAX_HEAD), float32)
    gs = cuda.shared.array((ATT_BLOCK, MAX_HEAD), float32)
    ls = cuda.shared.array(ATT_BLOCK, float32)
    ds_ = cuda.shared.array(ATT_BLOCK, float32)
    krow = cuda.local.array(MAX_HEAD, float32)
    vrow = cuda.local.array(MAX_HEAD, float32)
    dk_acc = cuda.local.array(MAX_HEAD, float32)
    dv_acc = cuda.local.array(MAX_HEAD, float32)
    t, bh = cuda.threadIdx.x, cuda.blockIdx.y
    t_q, d_k = q.shape[1], q.shape[2]
    t_k, d_v = k.shape[1], v.shape[2]
    offset = t_k - t_q
    first_key = cuda.blockIdx.x * ATT_BLOCK
    col = first_key + t  # this thread's key
    active = col < t_k
    if active:
        for d in range(d_k):
            krow[d] = k[bh, col, d] * scale
            dk_acc[d] = 0
        for d in range(d_v):
            vrow[d] = v[bh, col, d]
            dv_acc[d] = 0
    # Under the causal mask, query i sees key j when j <= offset + i: the queries before
    # first_key - offset see none of this tile's keys, and the loop starts after them.
    q_start = max(0, first_key - offset) if causal else 0
    for q0 in range(q_start, t_q, ATT_BLOCK):
        i = q0 + t  # thread t loads query i of the tile (zeros past the end)
        inside = i < t_q
        for d in range(d_k):
            qs[t, d] = q[bh, i, d] if inside else 0
        for d in range(d_v):
            gs[t, d] = dout[bh, i, d] if inside else 0
        ls[t] = lse[bh, i] if inside else 0
        ds_[t] = delta[bh, i] if inside else 0
        cuda.syncthreads()
        if active:
            n = min(ATT_BLOCK, t_q - q0)
            first = max(0, col - offset - q0) if causal else 0  # the first query of the tile that sees this key
            for ii in range(first, n):
                s = float32(0)
                for d in range(d_k):
                    s += krow[d] * qs[ii, d]
                p = math.exp(s - ls[ii])
                dp = float32(0)
                for d in range(d_v):
                    g = gs[ii, d]
                    dp += g * vrow[d]
                    dv_acc[d] += p * g
                ds = p * (dp - ds_[ii])
                for d in range(d_k):
                    dk_acc[d] += ds * qs[ii, d]
        cuda.syncthreads()
    if active:
        for d in range(d_k):
            dk[bh, col, d] = dk_acc[d] * scale
        for d in range(d_v):
            dv[bh, col, d] = dv_acc[d]


# ----- cross-entropy ------------------------------------------------------------------------------------
@cuda.jit
def cross_entropy_forward_kernel(x, targets, ignore_index, losses, lse):
    cache = cuda.shared.array(THREADS_PER_BLOCK, float32)
    row, t, n = cuda.blockIdx.x, cuda.threadIdx.x, x.shape[1]
    m = float32(-math.inf)
    for j in range(t, n, cuda.blockDim.x):
        m = max(m, x[row, j])
    m = block_max(cache, m)
    s = float32(0)
    for j in range(t, n, cuda.blockDim.x):
        s += math.exp(x[row, j] - m)
    s = block_sum(cache, s)
    if t == 0:
        row_lse = m + math.log(s)
        lse[row] = row_lse
        target = targets[row]
        if target == ignore_index:
            losses[row] = 0
        elif 0 <= target < n:
            losses[row] = row_lse - x[row, target]
        else:
            losses[row] = float32(math.nan)  # a target out of range: never read outside the row


@cuda.jit
def cross_entropy_backward_kernel(x, targets, lse, ignore_index, scale, grad):
    row, t, n = cuda.blockIdx.x, cuda.threadIdx.x, x.shape[1]
    target = targets[row]
    keep = target != ignore_index
    row_lse = lse[row]
    g = scale[0]
    for j in range(t, n, cuda.blockDim.x):
        value = float32(0)
        if keep:
            value = math.exp(x[row, j] - row_lse)
            if j == target:
                value -= 1
            value *= g
        grad[row, j] = value


# ----- device functions: device arrays in, device arrays out ----------------------------------------------
def _need(a, name, what, ndim, kind="float32"):
    """Refuse an array of the wrong type or number of axes, naming it."""
    dtype = np.dtype(getattr(a, "dtype", np.float64))
    ok = dtype == np.float32 if kind == "float32" else np.issubdtype(dtype, np.integer)
    if not ok:
        raise TypeError(f"{name}: {what} has dtype {dtype}, but the CUDA kernels take {kind} arrays")
    if len(a.shape) != ndim:
        raise ValueError(f"{name}: {what} must have {ndim} axes, got shape {tuple(a.shape)}")


def _scale(scale, d):
    return np.float32(1 / math.sqrt(d) if scale is None else scale)


def _check_attention(name, q, k, v, causal):
    for a, what in ((q, "q"), (k, "k"), (v, "v")):
        _need(a, name, what, 3)
    if q.shape[0] != k.shape[0] or k.shape[0] != v.shape[0] or q.shape[2] != k.shape[2] or k.shape[1] != v.shape[1]:
        raise ValueError(f"{name}: q {tuple(q.shape)}, k {tuple(k.shape)} and v {tuple(v.shape)} do not fit: "
                         f"expected (BH, Tq, d), (BH, Tk, d) and (BH, Tk, dv)")
    if max(q.shape[2], v.shape[2]) > MAX_HEAD:
        raise ValueError(f"{name}: head sizes {q.shape[2]} and {v.shape[2]} must be at most "
                         f"MAX_HEAD={MAX_HEAD} (the kernel's local arrays have that many slots)")
    if causal and q.shape[1] > k.shape[1]:
        raise ValueError(f"{name}: {q.shape[1]} causal queries need at least as many keys, got {k.shape[1]}")
    if q.shape[1] and not k.shape[1]:
        raise ValueError(f"{name}: {q.shape[1]} queries and no keys: a softmax over nothing is undefined")


def attention_forward_device(q, k, v, causal=True, scale=None):
    """(out, lse) on the device for q (BH, Tq, d), k (BH, Tk, d), v (BH, Tk, dv) on the device:
    out = softmax(q k^T * scale) v, scale 1/sqrt(d) by default; lse (BH, Tq) = the log of each
    row's softmax denominator. Causal, query i sits at position Tk - Tq + i."""
    _check_attention("attention", q, k, v, causal)
    (bh, t_q, d), d_v = q.shape, v.shape[2]
    out = cuda.device_array((bh, t_q, d_v), dtype=np.float32)
    lse = cuda.device_array((bh, t_q), dtype=np.float32)
    if bh and t_q:
        grid = ((t_q + ATT_BLOCK - 1) // ATT_BLOCK, bh)
        launch(attention_kernel, grid, ATT_BLOCK, q, k, v, _scale(scale, d), bool(causal), out, lse)
    return out, lse


def attention_backward_device(q, k, v, out, lse, dout, causal=True, scale=None):
    """(dq, dk, dv) on the device, from the inputs, the forward's out and lse, and dout = d loss / d out."""
    name = "attention_backward"
    _check_attention(name, q, k, v, causal)
    (bh, t_q, d), (t_k, d_v) = q.shape, v.shape[1:]
    for a, what, shape in ((out, "out", (bh, t_q, d_v)), (dout, "dout", (bh, t_q, d_v)), (lse, "lse", (bh, t_q))):
        _need(a, name, what, len(shape))
        if tuple(a.shape) != shape:
            raise ValueError(f"{name}: {what} has shape {tuple(a.shape)}, expected {shape} for these q, k and v")
    scale = _scale(scale, d)
    dq = cuda.device_array((bh, t_q, d), dtype=np.float32)
    dk = cuda.device_array((bh, t_k, d), dtype=np.float32)
    dv = cuda.device_array((bh, t_k, d_v), dtype=np.float32)
    delta = cuda.device_array((bh, t_q), dtype=np.float32)  # D_i, written by the first kernel, read by the second
    if bh and t_q:
        launch(attention_backward_dq_kernel, ((t_q + ATT_BLOCK - 1) // ATT_BLOCK, bh), ATT_BLOCK,
               q, k, v, out, dout, lse, scale, bool(causal), dq, delta)
    if bh and t_k:  # with no queries, the loop over them is empty and dk = dv = 0
        launch(attention_backward_dkdv_kernel, ((t_k + ATT_BLOCK - 1) // ATT_BLOCK, bh), ATT_BLOCK,
               q, k, v, dout, lse, delta, scale, bool(causal), dk, dv)
    return dq, dk, dv


def _check_rows(name, logits, targets):
    _need(logits, name, "logits", 2)
    _need(targets, name, "targets", 1, kind="integer")
    if targets.shape[0] != logits.shape[0]:
        raise ValueError(f"{name}: logits of shape {tuple(logits.shape)} need targets of shape "
                         f"({logits.shape[0]},), got targets of shape {tuple(targets.shape)}")
    if logits.shape[0] and not logits.shape[1]:
        raise ValueError(f"{name}: logits of shape {tuple(logits.shape)} have no classes")


def cross_entropy_forward_device(logits, targets, ignore_index=-100):
    """(losses, lse) on the device for logits (N, C) float32 and targets (N,) integers on the
    device: losses[r] = lse[r] - logits[r, targets[r]], 0 where targets[r] == ignore_index (nan
    where a target is out of range: check them before, as the engine does)."""
    _check_rows("cross_entropy", logits, targets)
    rows = logits.shape[0]
    losses = cuda.device_array(rows, dtype=np.float32)
    lse = cuda.device_array(rows, dtype=np.float32)
    if rows:
        launch(cross_entropy_forward_kernel, rows, THREADS_PER_BLOCK, logits, targets, np.int64(ignore_index),
               losses, lse)
    return losses, lse


def cross_entropy_backward_device(logits, targets, lse, ignore_index, scale):
    """grad (N, C) on the device: (softmax(logits) - onehot(targets)) * scale[0] on the rows that
    count, 0 on the rows whose target is ignore_index; lse from the forward, scale a float32
    device array of shape (1,)."""
    name = "cross_entropy_backward"
    _check_rows(name, logits, targets)
    _need(lse, name, "lse", 1)
    _need(scale, name, "scale", 1)
    if tuple(lse.shape) != (logits.shape[0],) or tuple(scale.shape) != (1,):
        raise ValueError(f"{name}: lse of shape {tuple(lse.shape)} and scale of shape {tuple(scale.shape)} "
                         f"must be ({logits.shape[0]},) and (1,)")
    grad = cuda.device_array(logits.shape, dtype=np.float32)
    if logits.shape[0]:
        launch(cross_entropy_backward_kernel, logits.shape[0], THREADS_PER_BLOCK, logits, targets, lse,
               np.int64(ignore_index), scale, grad)
    return grad


# ----- host functions: NumPy arrays in, NumPy arrays out ----------------------------------------------------
def _check_host_attention(name, q, k, v):
    q, k, v = (as_float32(a, name, what) for a, what in ((q, "q"), (k, "k"), (v, "v")))
    if (q.ndim < 2 or q.ndim != k.ndim or k.ndim != v.ndim or q.shape[:-2] != k.shape[:-2]
            or k.shape[:-2] != v.shape[:-2] or q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]):
        raise ValueError(f"{name}: q {q.shape}, k {k.shape} and v {v.shape} do not fit: expected "
                         f"(..., Tq, d), (..., Tk, d) and (..., Tk, dv) with the same leading axes")
    return q, k, v


def _to_device3(a):
    return cuda.to_device(a.reshape((-1,) + a.shape[-2:]))


def attention(q, k, v, causal=True):
    """softmax(q k^T / sqrt(d)) v by tiles on the GPU: returns (out, lse), lse = the log of each row's
    softmax denominator (what a backward needs). q (..., Tq, d), k (..., Tk, d), v (..., Tk, dv)."""
    q, k, v = _check_host_attention("attention", q, k, v)
    out, lse = attention_forward_device(_to_device3(q), _to_device3(k), _to_device3(v), causal)
    lead = q.shape[:-2]
    return out.copy_to_host().reshape(lead + out.shape[1:]), lse.copy_to_host().reshape(lead + lse.shape[1:])


def attention_backward(q, k, v, out, lse, dout, causal=True):
    """(dq, dk, dv) of attention by tiles, from the forward's out and lse and dout = d loss / d out."""
    name = "attention_backward"
    q, k, v = _check_host_attention(name, q, k, v)
    out, dout, lse = (as_float32(a, name, what) for a, what in ((out, "out"), (dout, "dout"), (lse, "lse")))
    if out.shape != q.shape[:-1] + v.shape[-1:] or dout.shape != out.shape or lse.shape != q.shape[:-1]:
        raise ValueError(f"{name}: out {out.shape}, dout {dout.shape} and lse {lse.shape} do not fit q {q.shape} "
                         f"and v {v.shape}")
    grads = attention_backward_device(*(_to_device3(a) for a in (q, k, v, out)),
                                      cuda.to_device(lse.reshape((-1, lse.shape[-1]))), _to_device3(dout), causal)
    return tuple(g.copy_to_host().reshape(a.shape) for g, a in zip(grads, (q, k, v)))


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
    # Every target is in range now, so without an ignore_index a negative number ignores nothing.
    ignore = -1 if ignore_index is None else int(ignore_index)
    d_x, d_t = cuda.to_device(x.reshape(-1, c)), cuda.to_device(t.reshape(-1).astype(np.int64))
    losses, lse = cross_entropy_forward_device(d_x, d_t, ignore)
    grad = cross_entropy_backward_device(d_x, d_t, lse, ignore, cuda.to_device(np.array([1 / n_keep], np.float32)))
    loss = np.float32(losses.copy_to_host().astype(np.float64).sum() / n_keep)
    return loss, grad.copy_to_host().reshape(x.shape)
