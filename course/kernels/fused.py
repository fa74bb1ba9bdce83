"""Fused operations on the CPU (lesson 6.5): one pass over memory where NumPy makes several.

NumPy runs a formula one operation at a time, and each operation reads its inputs from memory
and writes a fresh array back. For `gelu(x + b)` that is six or so full passes over the array;
for attention it is a (T, T) matrix of scores written, masked, exponentiated, normalised and
read again, in forward and again in backward. When the arithmetic per number is small, those
passes, not the arithmetic, set the time. A fused kernel reads each input once, does all the
arithmetic while the numbers sit in registers or in the cache, and writes each output once:

    attention(q, k, v, causal)          FlashAttention: tiles of keys, an online softmax; no (T, T) array
                                        (short sequences: the packed matrix products, (T, T) kept)
    add_layer_norm(x, y, w, b)          the residual add and the layer norm after it, one pass
    bias_gelu(h, b) / linear_gelu       the MLP's bias and GELU, one pass; the backward one pass too
    cross_entropy(logits, targets)      softmax, loss and gradient in one pass over each row
    adamw_step / sgd_step (FusedStep)   every parameter updated by one kernel call

Each is an ordinary operation of the engine (`operation(...)`), swapped in by
`use_kernels("cpu")` (see `course.kernels.ops`), so GPT and Mamba run them unchanged.

Two things make the loops fast. NumPy's exp and tanh use the CPU's vector instructions (16
float32 numbers per instruction on AVX-512); a scalar `math.exp` in a compiled loop is a call
into the C library, about 7x slower, and `math.tanh` 40x. `_exp` (in `cpu`, whose scan uses it
too) is written with only multiplications, additions and integer operations on the bits, so the
compiler vectorises loops that call it; it computes in the precision of its argument (float32:
within 3.1e-7, 8 numbers per AVX2 instruction; float64: within 1e-14, 4), and GELU is written
with it. And the kernels are compiled with `error_model="numpy"`: by default a compiled division
checks for zero to raise Python's ZeroDivisionError, and that check alone stops a loop from
vectorising (4x slower here).
"""

import math
import weakref

import numpy as np
from numba import njit

from ..tensor import Tensor, operation
from ..tensor import functional as F
from . import cpu
from .launch import count

__all__ = ["attention", "attention_forward", "attention_backward", "add_layer_norm", "bias_gelu",
           "linear_gelu", "cross_entropy", "FusedStep", "optimizer_step", "clip_grad_norm_",
           "BLOCK_Q", "BLOCK_K", "DIRECT_T"]

# Tile sizes of the attention kernels: a (BLOCK_Q, BLOCK_K) tile of scores and a key tile of
# BLOCK_K x head size stay in the L1/L2 cache while they are used.
BLOCK_Q = 32
BLOCK_K = 64


# ----- exp that vectorises ------------------------------------------------------------------------------
_exp = cpu._exp  # exp with only multiply-adds and bit operations (see `cpu`): loops that call it vectorise
_microkernel, MR = cpu._microkernel, cpu.MR  # the matrix product's register micro-kernel, MR rows of C at a time


def _same_float(*arrays):
    dtypes = {a.dtype for a in arrays if a is not None}
    return len(dtypes) == 1 and dtypes <= {np.dtype(np.float32), np.dtype(np.float64)}


# ----- attention by tiles (FlashAttention) ----------------------------------------------------------------
@njit(cache=True, fastmath=True, error_model="numpy")
def _tile_product(kc, a, ai, ak, m, b, ncols, c, ci, accumulate, edge):
    """c[ci:ci+m, :ncols] = (c[...] if accumulate else 0) + a[ai:ai+m, ak:ak+kc] @ b[:kc, :ncols], by
    the register micro-kernel of the matrix product (`cpu._microkernel`, lesson 6.5's section 5):
    `a` of any strides, each row of `b` contiguous, ncols a whole number of panels (NR =
    edge.shape[1] columns). A last block of fewer than MR rows is summed in `edge`, so that nothing
    is written past row ci + m."""
    nr = edge.shape[1]
    for p in range(0, m, MR):
        rows = min(MR, m - p)
        for j in range(0, ncols, nr):
            if rows == MR:
                _microkernel(kc, a, ai + p, ak, MR, b, 0, j, c, ci + p, j, accumulate)
            else:
                _microkernel(kc, a, ai + p, ak, rows, b, 0, j, edge, 0, 0, False)
                for r in range(rows):
                    for t in range(nr):
                        c[ci + p + r, j + t] = c[ci + p + r, j + t] + edge[r, t] if accumulate else edge[r, t]


@njit(cache=True, inline="always")
def _panels(n, nr):
    return (n + nr - 1) // nr * nr  # n rounded up to whole panels of nr columns


@cpu.range_kernel(fastmath=True, error_model="numpy")
def _attention_forward(q, k, v, scale, causal, out, lse, job0, job1):
    """out = softmax(q k^T * scale) v, for the jobs job0 .. job1 - 1: a job is one (batch*head,
    query tile), and `cpu._share` hands each thread a range of them.

    The keys are visited a tile at a time. Each query row keeps its running maximum m, its
    running sum l of exp(score - m), and its running output acc = sum exp(score - m) v. When a
    new tile raises the maximum from m to m', everything summed so far was scaled by exp(-m)
    instead of exp(-m'): both l and acc are multiplied by exp(m - m'). After the last tile,
    out = acc / l, and lse = m + log l (the log of the softmax's denominator) is saved for the
    backward. Under the causal mask a row stops at its own position (its probabilities past it
    are 0), and tiles wholly in the future are never visited. The two products of a tile, the
    scores Q K^T and the output's P V, run on the matrix product's register micro-kernel: the key
    tile is copied transposed and the value tile with its rows padded to whole vectors, so that
    each row the micro-kernel reads is contiguous.
    """
    n_bh, t_q, d_k = q.shape
    t_k, d_v = k.shape[1], v.shape[2]
    offset = t_k - t_q  # query i sits at position offset + i
    tiles = (t_q + BLOCK_Q - 1) // BLOCK_Q
    nr = cpu._panel_width(q.itemsize)
    d_vp = _panels(d_v, nr)
    kt = np.zeros((d_k, BLOCK_K), dtype=q.dtype)  # the key tile, transposed
    vp = np.zeros((BLOCK_K, d_vp), dtype=q.dtype)  # the value tile, rows padded with zeros
    s = np.empty((BLOCK_Q, BLOCK_K), dtype=q.dtype)  # a tile of scores, then of probabilities
    acc = np.empty((BLOCK_Q, d_vp), dtype=q.dtype)
    edge = np.empty((MR, nr), dtype=q.dtype)
    m = np.empty(BLOCK_Q)
    l = np.empty(BLOCK_Q)
    for job in range(job0, job1):
        bh, q0 = job // tiles, (job % tiles) * BLOCK_Q
        nq = min(BLOCK_Q, t_q - q0)
        acc[:] = 0
        m[:] = -1e300
        l[:] = 0
        k_end = min(t_k, offset + q0 + nq) if causal else t_k
        for k0 in range(0, k_end, BLOCK_K):
            nk = min(BLOCK_K, k_end - k0)
            cols = _panels(nk, nr)
            for j in range(nk):
                for d in range(d_k):
                    kt[d, j] = k[bh, k0 + j, d]
                for d in range(d_v):
                    vp[j, d] = v[bh, k0 + j, d]
            for j in range(nk, cols):
                for d in range(d_k):
                    kt[d, j] = 0
            _tile_product(d_k, q[bh], q0, 0, nq, kt, cols, s, 0, False, edge)  # S = Q K^T
            for i in range(nq):
                n = min(nk, offset + q0 + i - k0 + 1) if causal else nk  # keys this row may see
                if n > 0:
                    m_new = m[i]
                    for j in range(n):
                        m_new = max(m_new, np.float64(s[i, j] * scale))
                    alpha = _exp(m[i] - m_new)  # rescales what was summed against the old maximum
                    total = 0.0
                    for j in range(n):
                        p = _exp(s[i, j] * scale - m_new)
                        s[i, j] = p
                        total += p
                    l[i] = l[i] * alpha + total
                    m[i] = m_new
                    for d in range(d_v):
                        acc[i, d] *= alpha  # the output too, not only the sum
                for j in range(max(n, 0), nk):
                    s[i, j] = 0  # masked: no part in P V
            _tile_product(nk, s, 0, 0, nq, vp, d_vp, acc, 0, True, edge)  # acc += P V
        for i in range(nq):
            inv = 1.0 / l[i]
            for d in range(d_v):
                out[bh, q0 + i, d] = acc[i, d] * inv
            lse[bh, q0 + i] = m[i] + math.log(l[i])


@cpu.range_kernel(fastmath=True, error_model="numpy")
def _attention_backward(q, k, v, out, dout, lse, scale, causal, dq, dk, dv, job0, job1):
    """The gradients, recomputing each tile of probabilities from the saved lse: p = exp(s - lse).

    With D_i = sum_d dout[i, d] out[i, d] (the softmax backward's <dP, P> of row i):
        dv_j += p_ij dout_i,   dp_ij = dout_i . v_j,   ds_ij = p_ij (dp_ij - D_i) * scale,
        dq_i += ds_ij k_j,     dk_j += ds_ij q_i.
    One (batch*head) per job (job0 .. job1 - 1), so dk and dv have a single writer. For each tile of
    keys, the query tiles that see it pass by; a tile's five products (S = Q K^T, dP = dO V^T,
    dV += P^T dO, dK += dS^T Q, dQ += dS K) run on the register micro-kernel, each from copies
    whose rows are contiguous and padded to whole vectors. dk and dv of the tile, and dq of the
    whole head, are summed in such padded arrays and written once at the end.
    """
    n_bh, t_q, d_k = q.shape
    t_k, d_v = k.shape[1], v.shape[2]
    offset = t_k - t_q
    nr = cpu._panel_width(q.itemsize)
    d_kp, d_vp = _panels(d_k, nr), _panels(d_v, nr)
    kt = np.zeros((d_k, BLOCK_K), dtype=q.dtype)  # K's tile transposed, for S = Q K^T
    vt = np.zeros((d_v, BLOCK_K), dtype=q.dtype)  # V's tile transposed, for dP = dO V^T
    kp = np.zeros((BLOCK_K, d_kp), dtype=q.dtype)  # K's tile, rows padded, for dQ += dS K
    qp = np.zeros((BLOCK_Q, d_kp), dtype=q.dtype)  # Q's tile, rows padded, for dK += dS^T Q
    gp = np.zeros((BLOCK_Q, d_vp), dtype=q.dtype)  # dO's tile, rows padded, for dV += P^T dO
    p = np.empty((BLOCK_Q, BLOCK_K), dtype=q.dtype)  # a tile of probabilities
    ds = np.empty((BLOCK_Q, BLOCK_K), dtype=q.dtype)  # and of the scores' gradients
    dk_acc = np.empty((BLOCK_K, d_kp), dtype=q.dtype)
    dv_acc = np.empty((BLOCK_K, d_vp), dtype=q.dtype)
    dq_acc = np.empty((t_q, d_kp), dtype=q.dtype)
    edge = np.empty((MR, nr), dtype=q.dtype)
    delta = np.empty(t_q)
    for bh in range(job0, job1):
        for i in range(t_q):
            acc = 0.0
            for d in range(d_v):
                acc += dout[bh, i, d] * out[bh, i, d]
            delta[i] = acc
        dq_acc[:] = 0
        for k0 in range(0, t_k, BLOCK_K):
            nk = min(BLOCK_K, t_k - k0)
            cols = _panels(nk, nr)
            for j in range(nk):
                for d in range(d_k):
                    kt[d, j] = k[bh, k0 + j, d]
                    kp[j, d] = k[bh, k0 + j, d]
                for d in range(d_v):
                    vt[d, j] = v[bh, k0 + j, d]
            for j in range(nk, cols):
                for d in range(d_k):
                    kt[d, j] = 0
                for d in range(d_v):
                    vt[d, j] = 0
            dk_acc[:nk] = 0
            dv_acc[:nk] = 0
            # under the causal mask, query rows before position k0 see none of these keys
            first = max(0, k0 - offset) if causal else 0
            for q0 in range((first // BLOCK_Q) * BLOCK_Q, t_q, BLOCK_Q):
                nq = min(BLOCK_Q, t_q - q0)
                for i in range(nq):
                    for d in range(d_k):
                        qp[i, d] = q[bh, q0 + i, d]
                    for d in range(d_v):
                        gp[i, d] = dout[bh, q0 + i, d]
                _tile_product(d_k, q[bh], q0, 0, nq, kt, cols, p, 0, False, edge)  # S = Q K^T
                _tile_product(d_v, dout[bh], q0, 0, nq, vt, cols, ds, 0, False, edge)  # dP = dO V^T
                for i in range(nq):
                    row = q0 + i
                    n = max(0, min(nk, offset + row - k0 + 1)) if causal else nk
                    mm, dl = lse[bh, row], delta[row]
                    for j in range(n):
                        pij = _exp(p[i, j] * scale - mm)
                        p[i, j] = pij
                        ds[i, j] = pij * (ds[i, j] - dl) * scale
                    for j in range(n, nk):  # masked: no part in the three products below
                        p[i, j] = 0
                        ds[i, j] = 0
                _tile_product(nq, p.T, 0, 0, nk, gp, d_vp, dv_acc, 0, True, edge)  # dV += P^T dO
                _tile_product(nq, ds.T, 0, 0, nk, qp, d_kp, dk_acc, 0, True, edge)  # dK += dS^T Q
                _tile_product(nk, ds, 0, 0, nq, kp, d_kp, dq_acc, q0, True, edge)  # dQ += dS K
            for j in range(nk):
                for d in range(d_k):
                    dk[bh, k0 + j, d] = dk_acc[j, d]
                for d in range(d_v):
                    dv[bh, k0 + j, d] = dv_acc[j, d]
        for i in range(t_q):
            for d in range(d_k):
                dq[bh, i, d] = dq_acc[i, d]


def _as3d(a):
    return np.ascontiguousarray(a.reshape((-1,) + a.shape[-2:]))


def attention_forward(q, k, v, causal=True, scale=None):
    """Arrays in, arrays out: (out, lse) for q (..., Tq, d), k (..., Tk, d), v (..., Tk, dv)."""
    lead = q.shape[:-2]
    q3, k3, v3 = _as3d(q), _as3d(k), _as3d(v)
    scale = q.dtype.type(1 / np.sqrt(q.shape[-1]) if scale is None else scale)
    out = np.empty(q3.shape[:2] + v3.shape[2:], dtype=q.dtype)
    lse = np.empty(q3.shape[:2], dtype=np.float64)
    tiles = -(-q3.shape[1] // BLOCK_Q)
    cpu._share(_attention_forward, q3.shape[0] * q3.shape[1] * k3.shape[1] * (q3.shape[2] + v3.shape[2]),
               q3.shape[0] * tiles, q3, k3, v3, scale, bool(causal), out, lse)
    count("cpu.attention_forward")
    return out.reshape(lead + out.shape[1:]), lse.reshape(lead + lse.shape[1:])


def attention_backward(q, k, v, out, lse, dout, causal=True, scale=None):
    """(dq, dk, dv) from the forward's output and lse, recomputing the probabilities by tiles."""
    q3, k3, v3, o3, g3 = _as3d(q), _as3d(k), _as3d(v), _as3d(out), _as3d(dout.astype(q.dtype, copy=False))
    scale = q.dtype.type(1 / np.sqrt(q.shape[-1]) if scale is None else scale)
    dq, dk, dv = np.empty_like(q3), np.empty_like(k3), np.empty_like(v3)
    cpu._share(_attention_backward, 2 * q3.shape[0] * q3.shape[1] * k3.shape[1] * (q3.shape[2] + v3.shape[2]),
               q3.shape[0], q3, k3, v3, o3, g3, np.ascontiguousarray(lse.reshape(q3.shape[:2])), scale,
               bool(causal), dq, dk, dv)
    count("cpu.attention_backward")
    return dq.reshape(q.shape), dk.reshape(k.shape), dv.reshape(v.shape)


# ----- short sequences: the (T, T) matrix of a head is small, so keep it ---------------------------------------
# Up to DIRECT_T keys, a head's scores take at most 16 KB (float32), so tiles save no memory worth
# having, while they cost copies of every tile and of the heads, and the online softmax's
# rescaling: at the bench GPT's size (32 x 4 heads x 64 tokens x 32, 2 threads) forward and
# backward took 7.7-8.5 ms direct against 8.9-9.0 by tiles. So short sequences take the direct route: S = q k^T,
# P = softmax(S scale) (causal mask, in place), out = P v; and back, with P kept:
#   dv = P^T dout,  dP = dout v^T,  dS = P (dP - <P, dP>) scale,  dq = dS k,  dk = dS^T q.
DIRECT_T = 64


@cpu.range_kernel(fastmath=True, error_model="numpy")
def _masked_softmax(s, scale, causal, offset, job0, job1):
    """s (heads, t_q, t_k) becomes softmax(s * scale) row by row, 0 past each row's position under the
    mask: heads job0 .. job1 - 1."""
    for bh in range(job0, job1):
        for i in range(s.shape[1]):
            n = min(s.shape[2], offset + i + 1) if causal else s.shape[2]
            m = s[bh, i, 0] * scale  # scale has the dtype of s: the exp runs in that precision
            for j in range(1, n):
                m = max(m, s[bh, i, j] * scale)
            total = 0.0
            for j in range(n):
                e = _exp(s[bh, i, j] * scale - m)
                s[bh, i, j] = e
                total += e
            inv = s.dtype.type(1.0 / total)
            for j in range(n):
                s[bh, i, j] *= inv
            for j in range(n, s.shape[2]):
                s[bh, i, j] = 0


@cpu.range_kernel(fastmath=True, error_model="numpy")
def _softmax_backward_in_place(p, dp, scale, job0, job1):
    """dp becomes dS = P (dP - <P, dP>) scale, row by row: heads job0 .. job1 - 1."""
    for bh in range(job0, job1):
        for i in range(p.shape[1]):
            dot = 0.0
            for j in range(p.shape[2]):
                dot += p[bh, i, j] * dp[bh, i, j]
            for j in range(p.shape[2]):
                dp[bh, i, j] = p[bh, i, j] * (dp[bh, i, j] - dot) * scale


def _t(x):
    return np.swapaxes(x, -1, -2)  # a view: the products read it through its strides


def _like(x, shape):
    """An empty array of `shape` with the order of x's axes in memory (np.empty_like's order "K"): the
    gradient of q comes out laid out as q is, and attention's output as q is. GPT's q, k and v are
    the heads of a (B, T, C) array seen as (B, H, T, D); so are their gradients and the output, and
    putting the heads side by side again, (B, T, H, D) -> (B, T, C), is a view, not a copy."""
    return np.empty_like(x, shape=shape) if x.ndim <= 4 else np.empty(shape, x.dtype)


def _attention_direct(q, k, v, causal):
    """The direct route for short sequences, as an operation of the engine. The products read q, k
    and v through their strides, the heads where the model left them, and write the output and the
    gradients laid out as q, k and v are: no copies to make the heads contiguous and back."""
    qd, kd, vd = q.data, k.data, v.data
    t_q, t_k = qd.shape[-2], kd.shape[-2]
    scale = 1 / np.sqrt(q.shape[-1])
    p = cpu._product(qd, _t(kd))  # the products count as part of this one attention call
    p3 = p.reshape(-1, t_q, t_k)
    cpu._share(_masked_softmax, p.size * 8, p3.shape[0], p3, p.dtype.type(scale), bool(causal), t_k - t_q)
    out = cpu._product(p, vd, out=_like(qd, qd.shape[:-1] + vd.shape[-1:]))
    count("cpu.attention_forward")

    def backward(g):
        g = g.astype(p.dtype, copy=False)
        dv = cpu._product(_t(p), g, out=_like(vd, vd.shape)) if v.requires_grad else None
        ds = cpu._product(g, _t(vd))
        cpu._share(_softmax_backward_in_place, p.size * 4, p3.shape[0], p3, ds.reshape(p3.shape), ds.dtype.type(scale))
        dq = cpu._product(ds, kd, out=_like(qd, qd.shape)) if q.requires_grad else None
        dk = cpu._product(_t(ds), qd, out=_like(kd, kd.shape)) if k.requires_grad else None
        count("cpu.attention_backward")
        return dq, dk, dv

    return operation("attention", out, (q, k, v), backward)


def attention(q, k, v, causal=True, dropout_p=0.0, training=True):
    """F.scaled_dot_product_attention by tiles with an online softmax (FlashAttention's forward and
    backward): memory grows with T, not T^2. Up to DIRECT_T keys, the direct route above instead.
    Dropout, broadcasting between q, k and v, mixed or other dtypes, and wrong shapes go to the
    engine's version (which names a shape error)."""
    default = F.scaled_dot_product_attention.default
    tensors = all(isinstance(t, Tensor) for t in (q, k, v))
    if (not tensors or (dropout_p and training) or q.ndim < 2 or q.ndim != k.ndim or k.ndim != v.ndim
            or q.shape[:-2] != k.shape[:-2] or k.shape[:-2] != v.shape[:-2] or q.shape[-1] != k.shape[-1]
            or k.shape[-2] != v.shape[-2] or (causal and q.shape[-2] > k.shape[-2]) or 0 in q.shape + k.shape + v.shape
            or not _same_float(q.data, k.data, v.data)):
        return default(q, k, v, causal, dropout_p, training)
    if k.shape[-2] <= DIRECT_T:
        return _attention_direct(q, k, v, causal)
    out, lse = attention_forward(q.data, k.data, v.data, causal)

    def backward(g):
        dq, dk, dv = attention_backward(q.data, k.data, v.data, out, lse, g, causal)
        return (dq if q.requires_grad else None, dk if k.requires_grad else None, dv if v.requires_grad else None)

    return operation("attention", out, (q, k, v), backward)


# ----- the residual add and the layer norm after it -----------------------------------------------------
# The row kernels below share their rows between the CPU's threads as `cpu._share` does: a job is a
# block of ROWS rows. Sums over rows (the gradients of the weight and the bias) are summed per
# block, then the blocks' sums are added: the same numbers on one thread or several.
ROWS = 64


@cpu.range_kernel(fastmath=True, error_model="numpy")
def _add_layer_norm(x, y, weight, bias, eps, total, out, mean, rstd, job0, job1):
    n = x.shape[1]
    for r in range(job0 * ROWS, min(job1 * ROWS, x.shape[0])):
        acc = 0.0
        for j in range(n):
            s = x[r, j] + y[r, j]
            total[r, j] = s
            acc += s
        mu = acc / n
        acc = 0.0
        for j in range(n):
            c = total[r, j] - mu
            acc += c * c
        rs = 1 / np.sqrt(acc / n + eps)
        for j in range(n):
            out[r, j] = (total[r, j] - mu) * rs * weight[j] + bias[j]
        mean[r] = mu
        rstd[r] = rs


@cpu.range_kernel(fastmath=True, error_model="numpy")
def _layer_norm_backward(x, weight, mean, rstd, g, dx, dweight, dbias, job0, job1):
    """dx, and a row of dweight and dbias per block of rows, in one pass over the rows (cpu.py makes two)."""
    n = x.shape[1]
    for job in range(job0, job1):
        dweight[job, :] = 0
        dbias[job, :] = 0
        for r in range(job * ROWS, min((job + 1) * ROWS, x.shape[0])):
            mu, rs = mean[r], rstd[r]
            s1 = 0.0
            s2 = 0.0
            for j in range(n):
                xhat = (x[r, j] - mu) * rs
                gy = g[r, j] * weight[j]
                s1 += gy
                s2 += gy * xhat
                dweight[job, j] += g[r, j] * xhat
                dbias[job, j] += g[r, j]
            s1 /= n
            s2 /= n
            for j in range(n):
                dx[r, j] = rs * (g[r, j] * weight[j] - s1 - (x[r, j] - mu) * rs * s2)


def _row_jobs(rows):
    return -(-rows // ROWS)


def add_layer_norm(x, y, weight, bias, eps=1e-5):
    """(x + y, layer_norm(x + y, weight, bias, eps)) with one kernel: the sum is written once and
    normalised while its row is still in the cache. Anything but two same-shape tensors and a
    weight and bias of the last axis's size goes to the engine's version."""
    default = F.add_layer_norm.default
    if (not isinstance(x, Tensor) or not isinstance(y, Tensor) or x.shape != y.shape or x.ndim == 0
            or weight is None or bias is None or weight.shape != x.shape[-1:] or bias.shape != x.shape[-1:]
            or not _same_float(x.data, y.data, weight.data, bias.data)):
        return default(x, y, weight, bias, eps)
    n = x.shape[-1]
    x2, y2 = np.ascontiguousarray(x.data).reshape(-1, n), np.ascontiguousarray(y.data).reshape(-1, n)
    total, out = np.empty_like(x2), np.empty_like(x2)
    mean, rstd = np.empty(len(x2), x2.dtype), np.empty(len(x2), x2.dtype)
    cpu._share(_add_layer_norm, x2.size * 8, _row_jobs(len(x2)), x2, y2, weight.data, bias.data, x2.dtype.type(eps),
               total, out, mean, rstd)
    count("cpu.add_layer_norm")
    s = operation("add", total.reshape(x.shape), (x, y), lambda g: (g, g))

    def backward(g):
        g2 = np.ascontiguousarray(g, dtype=total.dtype).reshape(-1, n)
        jobs = _row_jobs(len(total))
        dx, dw, db = np.empty_like(total), np.empty((jobs, n), total.dtype), np.empty((jobs, n), total.dtype)
        cpu._share(_layer_norm_backward, total.size * 8, jobs, total, weight.data, mean, rstd, g2, dx, dw, db)
        count("cpu.layer_norm_backward")
        return (dx.reshape(x.shape), cpu.reduce_rows(dw) if weight.requires_grad else None,
                cpu.reduce_rows(db) if bias.requires_grad else None)

    return s, operation("layer_norm", out.reshape(x.shape), (s, weight, bias), backward)


# ----- bias + GELU ------------------------------------------------------------------------------------------
_GELU_C = math.sqrt(2 / math.pi)
_GELU_A = 0.044715


# gelu(x) = x (1 + tanh(u)) / 2 with u = C (x + A x^3), and (1 + tanh(u)) / 2 = sigmoid(2u): the
# kernels compute x * sigmoid(2u) = x / (1 + exp(-2u)). Written with tanh, 1 + tanh(u) cancels for
# x below about -4 (float32 keeps 7 digits of tanh's -0.9999...), and a fast reciprocal turns 0 into
# 1e-7; the sigmoid has no cancellation. The loops are elementwise, so they vectorise without
# fastmath's licence to reorder sums: GELU_FASTMATH only lets the compiler fuse multiply-adds. With
# all of fastmath, divisions became approximate reciprocals (1 / 1 = 0.99999994) and a reordered
# product overflowed to inf times 0 = nan far below zero.
GELU_FASTMATH = {"contract", "nsz"}


@cpu.range_kernel(fastmath=GELU_FASTMATH, error_model="numpy")
def _bias_gelu(h, b, y, job0, job1):
    """y = gelu(h + b), in the dtype of h: its constants are made of that type, since a float32 times
    a Python float is a float64 in compiled code, and float64 numbers fill half as many lanes."""
    f = h.dtype.type
    one, c2, a = f(1.0), f(2 * _GELU_C), f(_GELU_A)
    for r in range(job0 * ROWS, min(job1 * ROWS, h.shape[0])):
        for j in range(h.shape[1]):
            x = h[r, j] + b[j]
            y[r, j] = x / (one + _exp(-c2 * (x + a * x * x * x)))


@cpu.range_kernel(fastmath=GELU_FASTMATH, error_model="numpy")
def _bias_gelu_backward(h, b, g, dh, db, job0, job1):
    """dh = g * gelu'(h + b), recomputing the sigmoid s rather than storing it; a row of db (the
    column sums of dh) per block of rows. gelu'(x) = s + x s (1 - s) v' with v = 2u, and 1 - s = e s
    where e = exp(-v)."""
    f = h.dtype.type
    one, c2, a, a3 = f(1.0), f(2 * _GELU_C), f(_GELU_A), f(3 * _GELU_A)
    for job in range(job0, job1):
        db[job, :] = 0
        for r in range(job * ROWS, min((job + 1) * ROWS, h.shape[0])):
            for j in range(h.shape[1]):
                x = h[r, j] + b[j]
                e = _exp(-c2 * (x + a * x * x * x))
                s = one / (one + e)
                d = g[r, j] * (s + x * s * (e * s) * c2 * (one + a3 * x * x))
                dh[r, j] = d
                db[job, j] += d


def bias_gelu(h, bias):
    """gelu(h + bias) (tanh approximation) over the last axis of h, in one pass forward and one
    backward; nothing but h is kept for the backward."""
    if (not isinstance(h, Tensor) or not isinstance(bias, Tensor) or h.ndim == 0 or bias.shape != h.shape[-1:]
            or not _same_float(h.data, bias.data)):
        return F.gelu(h + bias)
    n = h.shape[-1]
    h2 = np.ascontiguousarray(h.data).reshape(-1, n)
    y = np.empty_like(h2)
    jobs = _row_jobs(len(h2))
    cpu._share(_bias_gelu, h2.size * 16, jobs, h2, bias.data, y)
    count("cpu.bias_gelu")

    def backward(g):
        dh, db = np.empty_like(h2), np.empty((jobs, n), h2.dtype)
        cpu._share(_bias_gelu_backward, h2.size * 24, jobs, h2, bias.data,
                   np.ascontiguousarray(g, dtype=h2.dtype).reshape(-1, n), dh, db)
        count("cpu.bias_gelu_backward")
        return dh.reshape(h.shape), cpu.reduce_rows(db) if bias.requires_grad else None

    return operation("bias_gelu", y.reshape(h.shape), (h, bias), backward)


def linear_gelu(x, weight, bias=None):
    """gelu(x @ weight.T + bias): the product on the CPU kernel, then bias and GELU fused."""
    from .ops import linear  # the kernel linear (ops imports this module)

    if bias is None or not isinstance(x, Tensor) or x.ndim == 0 or x.shape[-1] != weight.shape[1]:
        return F.linear_gelu.default(x, weight, bias)
    return bias_gelu(linear(x, weight, None, device="cpu"), bias)


# ----- cross-entropy from logits ------------------------------------------------------------------------
@njit(cache=True, fastmath=True, error_model="numpy")
def _cross_entropy(x, t, keep, inv_count, grad, losses):
    """Per row: the loss lse - x[t] and the gradient (softmax - onehot(t)) / count, in one visit.
    Returns the number of rows whose target is out of range (then nothing is trusted)."""
    rows, c = x.shape
    bad = 0
    for r in range(rows):
        if not keep[r]:
            grad[r, :] = 0
            losses[r] = 0
            continue
        target = t[r]
        if target < 0 or target >= c:
            bad += 1
            continue
        m = np.float64(x[r, 0])
        for j in range(1, c):
            m = max(m, np.float64(x[r, j]))
        total = 0.0
        for j in range(c):
            e = _exp(x[r, j] - m)
            grad[r, j] = e
            total += e
        losses[r] = m + math.log(total) - x[r, target]
        scale = inv_count / total
        for j in range(c):
            grad[r, j] *= scale
        grad[r, target] -= inv_count
    return bad


def cross_entropy(logits, targets, ignore_index=None):
    """F.cross_entropy in one kernel: loss and gradient computed together in the forward, so the
    backward is a multiplication by the incoming gradient (a scalar). Bad input goes to the engine's
    version, which names the problem."""
    default = F.cross_entropy.default
    t = np.asarray(targets.data if isinstance(targets, Tensor) else targets)
    if (not isinstance(logits, Tensor) or logits.ndim == 0 or not np.issubdtype(t.dtype, np.integer)
            or t.shape != logits.shape[:-1] or not _same_float(logits.data) or logits.shape[-1] == 0):
        return default(logits, targets, ignore_index)
    c = logits.shape[-1]
    t_flat = t.reshape(-1).astype(np.int64, copy=False)
    keep = np.ones(len(t_flat), dtype=np.bool_) if ignore_index is None else t_flat != ignore_index
    n_keep = int(np.count_nonzero(keep))
    if n_keep == 0:
        return default(logits, targets, ignore_index)
    x = np.ascontiguousarray(logits.data).reshape(-1, c)
    grad = np.empty_like(x)
    losses = np.empty(len(x))
    if _cross_entropy(x, t_flat, keep, 1.0 / n_keep, grad, losses):
        return default(logits, targets, ignore_index)  # it raises, naming the target out of range
    count("cpu.cross_entropy")
    loss = np.asarray(losses.sum() / n_keep, dtype=logits.dtype)
    shape = logits.shape

    def backward(g):
        g = float(g)
        return (grad if g == 1.0 else grad * grad.dtype.type(g)).reshape(shape)

    return operation("cross_entropy", loss, (logits,), backward)


# ----- the optimizer step: every parameter in one kernel call --------------------------------------------
@njit(cache=True, fastmath=True, error_model="numpy")
def _adam_chunk(p, g, m, v, step, decay, l2, c2, beta1, beta2, eps, grad_scale):
    """One stretch of the flat arrays, with the arithmetic in float64 (the scalars are): about 3x
    slower than float32 arithmetic, still well ahead of the unfused step, and rounded only where
    the arrays store their numbers."""
    for j in range(p.size):
        pj = p[j] * decay
        gj = g[j] * grad_scale + l2 * pj
        mj = beta1 * m[j] + (1 - beta1) * gj
        vj = beta2 * v[j] + (1 - beta2) * gj * gj
        m[j] = mj
        v[j] = vj
        p[j] = pj - step * mj / (np.sqrt(vj) * c2 + eps)


@cpu.range_kernel()
def _adam_kernel(p, g, m, v, starts, ends, seg, lr, decay, l2, c1, c2, beta1, beta2, eps, grad_scale, job0, job1):
    """Adam(W) on one flat array of every parameter. Chunk i covers p[starts[i]:ends[i]], part of
    parameter seg[i], whose settings are lr, decay (1 - lr wd for AdamW, else 1), l2 (Adam's wd),
    c1 = 1 / (1 - beta1^t) and c2 = 1 / sqrt(1 - beta2^t). Each chunk's loop is a function of its
    own, which the compiler vectorises. Chunks job0 .. job1 - 1."""
    for i in range(job0, job1):
        s, a, b = seg[i], starts[i], ends[i]
        _adam_chunk(p[a:b], g[a:b], m[a:b], v[a:b], lr[s] * c1[s], decay[s], l2[s], c2[s],
                    beta1, beta2, eps, grad_scale)


@njit(cache=True, fastmath=True, error_model="numpy")
def _sgd_chunk(p, g, buf, rate, decay, mom, fresh, grad_scale):
    f = p.dtype.type
    rate, decay, mom, grad_scale = f(rate), f(decay), f(mom), f(grad_scale)
    if mom == 0:
        for j in range(p.size):
            p[j] -= rate * (g[j] * grad_scale + decay * p[j])
    elif fresh:
        for j in range(p.size):
            gj = g[j] * grad_scale + decay * p[j]
            buf[j] = gj
            p[j] -= rate * gj
    else:
        for j in range(p.size):
            gj = mom * buf[j] + g[j] * grad_scale + decay * p[j]
            buf[j] = gj
            p[j] -= rate * gj


@cpu.range_kernel()
def _sgd_kernel(p, g, buf, starts, ends, seg, lr, wd, momentum, first, grad_scale, job0, job1):
    """SGD with momentum on the flat array: buf = momentum buf + (g + wd p) (buf = g the first time);
    chunks job0 .. job1 - 1."""
    for i in range(job0, job1):
        s, a, b = seg[i], starts[i], ends[i]
        _sgd_chunk(p[a:b], g[a:b], buf[a:b], lr[s], wd[s], momentum[s], first[s], grad_scale)


CHUNK = 1 << 14  # elements per parallel work item
# The update reads and writes a few numbers per parameter and does little arithmetic: memory sets its
# speed, and a second thread (which may wait for a busy core) pays only for millions of parameters,
# so `_run` is told the work is one unit per parameter.


class FusedStep:
    """Every parameter of an optimizer packed into one flat array, so that a step is one kernel call.

    On the first step the parameters' arrays become views into `flat` (the values are copied in
    once), and the optimizer's per-parameter state (`m`, `v`, `velocity`) becomes views into flat
    state arrays, so the unfused step and the fused one can take turns. The gradients, separate
    arrays made by backward, are copied into `grad` each step (one pass), unless they are already
    views of it (`clip_grad_norm_` below leaves them so).
    """

    def __init__(self, params, dtype):
        self.params = list(params)
        self.shapes = [p.shape for p in self.params]
        sizes = [int(np.prod(s)) for s in self.shapes]
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.flat = np.empty(int(self.offsets[-1]), dtype=dtype)
        self.grad = np.zeros_like(self.flat)
        self.state = {}  # name -> flat array
        starts, ends, seg = [], [], []
        for i, (a, b) in enumerate(zip(self.offsets[:-1], self.offsets[1:])):
            for c in range(int(a), int(b), CHUNK):
                starts.append(c)
                ends.append(min(c + CHUNK, int(b)))
                seg.append(i)
        self.starts, self.ends, self.seg = (np.array(x, dtype=np.int64) for x in (starts, ends, seg))
        for i in range(len(self.params)):
            self._adopt(i)

    def view(self, array, i):
        return array[self.offsets[i]:self.offsets[i + 1]].reshape(self.shapes[i])

    def _is_view(self, array, flat, i):
        """Whether `array` is piece i of `flat` (and not some other array of the same shape)."""
        return (array.base is flat and array.shape == self.shapes[i]
                and array.ctypes.data == flat.ctypes.data + int(self.offsets[i]) * flat.itemsize)

    def _adopt(self, i):
        p = self.params[i]
        self.view(self.flat, i)[...] = p.data
        p.data = self.view(self.flat, i)

    def sync(self):
        """Re-adopt parameters whose array was replaced (load_state_dict, astype, p.data = ...)."""
        for i, p in enumerate(self.params):
            d = p.data
            if not self._is_view(d, self.flat, i):
                if d.shape != self.shapes[i] or d.dtype != self.flat.dtype:
                    return False
                self._adopt(i)
        return True

    def gather_grads(self):
        """Copy the gradients into `grad` (zeros for parameters without one); returns which have one."""
        has = np.zeros(len(self.params), dtype=np.bool_)
        for i, p in enumerate(self.params):
            g = p.grad
            if g is None:
                self.view(self.grad, i)[...] = 0
                continue
            has[i] = True
            if self._is_view(g, self.grad, i):
                continue
            self.view(self.grad, i)[...] = g
        return has

    def state_array(self, name, states, key):
        """The flat state `name`, its pieces taken from (and given back to) each parameter's state dict."""
        if name not in self.state:
            self.state[name] = np.zeros_like(self.flat)
        flat = self.state[name]
        for i, st in enumerate(states):
            old = st.get(key)
            piece = self.view(flat, i)
            if old is None:  # a fresh state (the optimizer's was cleared): start from zeros, as the unfused step does
                piece[...] = 0
            elif old is not piece and not (isinstance(old, np.ndarray) and old.base is flat):
                piece[...] = old
            st[key] = piece
        return flat


def _packed(optimizer):
    """The FusedStep of `optimizer`, made on first use; None where the parameters cannot be packed."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if len({id(p) for p in params}) != len(params) or not params:
        return None
    dtypes = {p.data.dtype for p in params}
    if len(dtypes) != 1 or not dtypes <= {np.dtype(np.float32), np.dtype(np.float64)}:
        return None
    if any(p.grad is not None and (p.grad.shape != p.shape or p.grad.dtype != p.data.dtype) for p in params):
        return None
    pack = getattr(optimizer, "_fused", None)
    if pack is None or [id(p) for p in pack.params] != [id(p) for p in params] or pack.flat.dtype not in dtypes:
        pack = FusedStep(params, dtypes.pop())
        optimizer._fused = pack
        _PACKS[id(optimizer)] = pack
    elif not pack.sync():
        return None
    return pack


_PACKS = weakref.WeakValueDictionary()  # id(optimizer) -> its FusedStep, for clip_grad_norm_ to find


def _group_settings(optimizer, names):
    """Per-parameter arrays of the group settings in `names`."""
    values = {n: [] for n in names}
    for group in optimizer.param_groups:
        for _ in group["params"]:
            for n in names:
                values[n].append(group[n])
    return values


def optimizer_step(optimizer):
    """optim's step for SGD, Adam and AdamW as one kernel call over every parameter; any other
    optimizer (or one whose parameters differ in dtype) takes the unfused step."""
    from .. import optim

    kind = type(optimizer)
    pack = _packed(optimizer) if kind in (optim.SGD, optim.Adam, optim.AdamW) else None
    if pack is None:
        return optim.optimizer_step.default(optimizer)
    optimizer.steps += 1
    has = pack.gather_grads()
    states = [optimizer.state.setdefault(id(p), {}) for p in pack.params]
    # A parameter without a gradient must not move and its state must not change: its chunks are left out.
    chunks = has[pack.seg]
    starts, ends, seg = (pack.starts, pack.ends, pack.seg) if chunks.all() else (
        pack.starts[chunks], pack.ends[chunks], pack.seg[chunks])
    if kind is optim.SGD:
        s = _group_settings(optimizer, ("lr", "weight_decay", "momentum"))
        momentum = np.array(s["momentum"], dtype=np.float64)
        first = np.array([("velocity" not in st) for st in states], dtype=np.bool_)
        buf = pack.state_array("velocity", [st if m and (h or "velocity" in st) else {}
                                            for st, m, h in zip(states, momentum, has)], "velocity")
        cpu._share(_sgd_kernel, pack.flat.size, len(starts), pack.flat, pack.grad, buf, starts, ends, seg,
                   np.array(s["lr"], dtype=np.float64), np.array(s["weight_decay"], dtype=np.float64),
                   momentum, first, 1.0)
        count("cpu.sgd_step")
        return None
    s = _group_settings(optimizer, ("lr", "betas", "eps", "weight_decay"))
    betas, epss = set(s["betas"]), set(s["eps"])
    if len(betas) != 1 or len(epss) != 1:
        return optim.optimizer_step.default(optimizer)  # the kernel takes one beta1, beta2 and eps
    (beta1, beta2), eps = betas.pop(), epss.pop()
    live = [st if (h or "m" in st) else {} for st, h in zip(states, has)]  # Adam's state starts with a gradient
    m = pack.state_array("m", live, "m")
    v = pack.state_array("v", live, "v")
    t = np.array([st.get("t", 0) + h for st, h in zip(states, has)], dtype=np.float64)
    for st, ti, h in zip(states, t, has):
        if h:
            st["t"] = int(ti)
    t = np.maximum(t, 1)
    lr = np.array(s["lr"], dtype=np.float64)
    wd = np.array(s["weight_decay"], dtype=np.float64)
    decoupled = kind is optim.AdamW
    decay = np.where(has & decoupled, 1 - lr * wd, 1.0)
    l2 = np.where(has & (not decoupled), wd, 0.0)
    c1 = 1 / (1 - beta1 ** t)
    c2 = 1 / np.sqrt(1 - beta2 ** t)
    cpu._share(_adam_kernel, pack.flat.size, len(starts), pack.flat, pack.grad, m, v, starts, ends, seg,
               lr, decay, l2, c1, c2, float(beta1), float(beta2), float(eps), 1.0)
    count("cpu.adam_step")
    return None


def clip_grad_norm_(params, max_norm):
    """optim.clip_grad_norm_ for parameters packed by a fused optimizer: the gradients are copied into
    the optimizer's flat gradient array once, its norm taken there and the scale applied there; each
    p.grad becomes a view of it, so the next fused step finds them in place. Other parameters take
    the unfused clip."""
    from .. import optim

    params = list(params)
    ids = {id(p) for p in params}
    pack = next((pk for pk in _PACKS.values() if len(pk.params) == len(params) and {id(p) for p in pk.params} == ids),
                None)
    if pack is None or any(p.grad is not None and (p.grad.shape != p.shape or p.grad.dtype != pack.flat.dtype)
                           for p in params):
        return optim.clip_grad_norm_.default(params, max_norm)
    has = pack.gather_grads()
    total = math.sqrt(float(np.dot(pack.grad, pack.grad)))
    scale = max_norm / (total + 1e-6)
    if scale < 1:
        pack.grad *= pack.grad.dtype.type(scale)
    for i, p in enumerate(pack.params):
        if has[i]:
            p.grad = pack.view(pack.grad, i)
        else:
            pack.view(pack.grad, i)[...] = 0
    count("cpu.clip_grad_norm")
    return total
