"""The operations of the "cuda" device that deserve kernels of their own.

Everything else runs on the device by itself: the engine's NumPy expressions become primitive
kernels (`course.kernels.device`). These are the dispatch points where that would be slow
(softmax as five passes instead of one kernel), or impossible without copying to the host (the
causal mask, which NumPy builds on the host; checking token ids; a random dropout mask; deciding
whether to clip), each written as every operation of the engine is: `operation(name, data,
inputs, backward)`, here with device arrays in, device arrays out.

    softmax, layer_norm             the row kernels of lesson 6.2 (one block per row)
    scaled_dot_product_attention    matmuls around a masked row softmax
    cross_entropy                   log-sum-exp per row, the target's logit picked on the device
    embedding                       gather; its backward a scatter-add with atomics
    dropout                         a mask from a counter-based hash: no random state to copy
    selective_scan                  lesson 6.3's scan kernels
    clip_grad_norm_                 the norm and the scale stay on the device
    optimizer_step                  one kernel per parameter for Adam(W) and SGD
"""

import math

import numpy as np

from ..tensor import Tensor, operation
from ..tensor import functional as F
from . import fused_cuda as _fused
from . import rows as _rows
from . import scan as _scan
from ._backend import backend, cuda
from .device import CudaArray, _indices, take_rows, to_device
from .launch import THREADS_PER_BLOCK, blocks_for, launch


# Threads per row for the row kernels: a GPU wants many; the simulator pays for each thread it starts.
ROW_THREADS = THREADS_PER_BLOCK if backend() == "gpu" else 4


def _2d(a):
    return a.reshape(-1, a.shape[-1])


def _float32(*arrays):
    return all(a is None or a.dtype == np.float32 for a in arrays)


# ----- softmax and layer norm ----------------------------------------------------------------------------------------
def softmax(x, axis=-1):
    if axis not in (-1, x.ndim - 1) or x.ndim == 0 or not _float32(x.data) or x.size == 0:
        return F.softmax.default(x, axis)
    s = CudaArray.empty(x.shape, np.float32)
    launch(_rows.softmax_kernel, s.size // x.shape[-1], ROW_THREADS, _2d(x.data).raw(), _2d(s).raw())

    def backward(g):
        dx = CudaArray.empty(x.shape, np.float32)
        launch(_rows.softmax_backward_kernel, dx.size // x.shape[-1], ROW_THREADS, _2d(s).raw(),
               _2d(g).raw(), _2d(dx).raw())
        return dx

    return operation("softmax", s, (x,), backward)


def _filled(n, value):
    out = CudaArray.empty((n,), np.float32)
    out.fill(value)
    return out


def layer_norm(x, weight, bias, eps=1e-5):
    n = x.shape[-1] if x.ndim else 0
    params = [p.data if p is not None else None for p in (weight, bias)]
    if x.ndim == 0 or x.size == 0 or not _float32(x.data, *params) or any(p is not None and p.shape != (n,) for p in params):
        return F.layer_norm.default(x, weight, bias, eps)
    w = params[0] if params[0] is not None else _filled(n, 1.0)
    b = params[1] if params[1] is not None else _filled(n, 0.0)
    x2 = _2d(x.data)
    rows = x2.shape[0]
    y, mean, rstd = CudaArray.empty(x.shape, np.float32), CudaArray.empty((rows,), np.float32), \
        CudaArray.empty((rows,), np.float32)
    launch(_rows.layer_norm_kernel, rows, ROW_THREADS, x2.raw(), w.raw(), b.raw(), np.float32(eps),
           _2d(y).raw(), mean.raw(), rstd.raw())

    def backward(g):
        g2 = _2d(g)
        dx = CudaArray.empty(x.shape, np.float32)
        dw, db = CudaArray.empty((n,), np.float32), CudaArray.empty((n,), np.float32)
        launch(_rows.layer_norm_backward_kernel, rows, ROW_THREADS, x2.raw(), w.raw(), mean.raw(),
               rstd.raw(), g2.raw(), _2d(dx).raw())
        launch(_rows.layer_norm_params_backward_kernel, blocks_for(n, THREADS_PER_BLOCK), THREADS_PER_BLOCK,
               x2.raw(), mean.raw(), rstd.raw(), g2.raw(), dw.raw(), db.raw())
        return (dx if x.requires_grad else None,
                dw if weight is not None and weight.requires_grad else None,
                db if bias is not None and bias.requires_grad else None)

    return operation("layer_norm", y, (x, weight, bias), backward)


# ----- attention ------------------------------------------------------------------------------------------------------
@cuda.jit
def causal_fill_kernel(scores, offset):
    """scores[z, i, j] = -inf where key j lies in the future of query i (j > i + offset): the
    mask is made where it is used, not built on the host and copied."""
    j, i, z = cuda.grid(3)
    if z < scores.shape[0] and i < scores.shape[1] and j < scores.shape[2] and j > i + offset:
        scores[z, i, j] = -math.inf


def _rows_softmax(scores):
    out = CudaArray.empty(scores.shape, np.float32)
    launch(_rows.softmax_kernel, out.size // scores.shape[-1], ROW_THREADS, _2d(scores).raw(), _2d(out).raw())
    return out


def _softmax_backward(s, g):
    dx = CudaArray.empty(s.shape, np.float32)
    launch(_rows.softmax_backward_kernel, dx.size // s.shape[-1], ROW_THREADS, _2d(s).raw(), _2d(g).raw(),
           _2d(dx).raw())
    return dx


def scaled_dot_product_attention(q, k, v, causal=True, dropout_p=0.0, training=True):
    fits = (q.ndim >= 2 and q.shape[:-2] == k.shape[:-2] == v.shape[:-2] and q.shape[-1] == k.shape[-1]
            and k.shape[-2] == v.shape[-2] and not (causal and q.shape[-2] > k.shape[-2])
            and _float32(q.data, k.data, v.data) and q.size and k.size)
    if not fits or (dropout_p and training):
        return _composed_attention(q, k, v, causal, dropout_p, training)
    scale = 1 / math.sqrt(q.shape[-1])
    tq, tk = q.shape[-2], k.shape[-2]
    batch = q.shape[:-2]
    qd, kd, vd = (t.data.reshape(-1, *t.shape[-2:]) for t in (q, k, v))
    scores = (qd * np.float32(scale)) @ kd.swapaxes(-1, -2)  # (z, tq, tk)
    if causal and tq > 1:
        side = 16 if THREADS_PER_BLOCK >= 256 else 4
        launch(causal_fill_kernel, (blocks_for(tk, side), blocks_for(tq, side), scores.shape[0]), (side, side, 1),
               scores.raw(), tk - tq)
    p = _rows_softmax(scores)
    out = (p @ vd).reshape(*batch, tq, v.shape[-1])

    def backward(g):
        g3 = g.reshape(-1, tq, v.shape[-1])
        gq = gk = gv = None
        if v.requires_grad:  # y = P v  ->  dv = P^T dy
            gv = (p.swapaxes(-1, -2) @ g3).reshape(v.shape)
        if q.requires_grad or k.requires_grad:
            ds = _softmax_backward(p, g3 @ vd.swapaxes(-1, -2))  # masked entries have P = 0: no gradient
            ds *= np.float32(scale)
            if q.requires_grad:
                gq = (ds @ kd).reshape(q.shape)
            if k.requires_grad:
                gk = (ds.swapaxes(-1, -2) @ qd).reshape(k.shape)
        return gq, gk, gv

    return operation("attention", out, (q, k, v), backward)


def _composed_attention(q, k, v, causal, dropout_p, training):
    """Attention from engine operations (the shapes or dtypes the kernel path does not take,
    or dropout on the weights)."""
    scale = 1 / math.sqrt(q.shape[-1])
    axes = tuple(range(k.ndim - 2)) + (k.ndim - 1, k.ndim - 2)
    scores = (q * scale) @ k.transpose(*axes)
    tq, tk = q.shape[-2], k.shape[-2]
    if causal and tq > 1:
        if tq > tk:
            raise ValueError(f"scaled_dot_product_attention: causal attention of {tq} queries over {tk} keys")
        mask = CudaArray.empty((tq, tk), q.dtype)
        mask.fill(0)
        m3 = mask.reshape(1, tq, tk)
        side = 16 if THREADS_PER_BLOCK >= 256 else 4
        launch(causal_fill_kernel, (blocks_for(tk, side), blocks_for(tq, side), 1), (side, side, 1), m3.raw(), tk - tq)
        scores = scores + Tensor(mask)
    weights = F.softmax(scores, axis=-1)
    return F.dropout(weights, dropout_p, training) @ v


# ----- cross-entropy -------------------------------------------------------------------------------------------------
@cuda.jit
def pick_kernel(x, targets, ignore, out):
    """out[i] = x[i, targets[i]] (0 where the target is ignored)."""
    i = cuda.grid(1)
    if i < x.shape[0]:
        t = targets[i]
        out[i] = 0 if t == ignore else x[i, t]


@cuda.jit
def add_at_targets_kernel(x, targets, ignore, value):
    """x[i, targets[i]] += value: the -1 of (softmax - one_hot)."""
    i = cuda.grid(1)
    if i < x.shape[0]:
        t = targets[i]
        if t != ignore:
            x[i, t] += value


def _targets_on_device(targets, shape, n_classes, ignore_index):
    """The targets as int64 on the device, checked as F.cross_entropy checks them on the host."""
    t = targets.data if isinstance(targets, Tensor) else targets
    if isinstance(t, CudaArray):
        if not np.issubdtype(t.dtype, np.integer):
            raise TypeError(f"cross_entropy: targets must be integers (class indices), got dtype {t.dtype}")
        if t.shape != shape:
            raise ValueError(f"cross_entropy: logits of shape {shape + (n_classes,)} need targets of shape "
                             f"{shape}, got targets of shape {t.shape}")
        if t.known_range is not None:
            low, high = t.known_range
            for bad in (low, high):
                if bad != ignore_index and not 0 <= bad < n_classes:
                    raise ValueError(f"cross_entropy: target {bad} is out of range for {n_classes} classes")
        return t.astype(np.int64, copy=False)
    t = np.asarray(t)
    if not np.issubdtype(t.dtype, np.integer):
        raise TypeError(f"cross_entropy: targets must be integers (class indices), got dtype {t.dtype}")
    if t.shape != shape:
        raise ValueError(f"cross_entropy: logits of shape {shape + (n_classes,)} need targets of shape "
                         f"{shape}, got targets of shape {t.shape}")
    keep = np.ones(t.shape, bool) if ignore_index is None else t != ignore_index
    if not keep.any():
        raise ValueError(f"cross_entropy: every target equals ignore_index={ignore_index}: nothing to average")
    bad = keep & ((t < 0) | (t >= n_classes))
    if bad.any():
        raise ValueError(f"cross_entropy: target {t[bad][0]} is out of range for {n_classes} classes")
    return to_device(t.astype(np.int64))  # the batch's targets coming in


def cross_entropy(logits, targets, ignore_index=None):
    F._need_tensor(logits, "cross_entropy", "logits")
    n_classes = logits.shape[-1]
    t = _targets_on_device(targets, logits.shape[:-1], n_classes, ignore_index)
    ignore = np.int64(-(2 ** 62) if ignore_index is None else ignore_index)
    if logits.dtype != np.float32:
        return _composed_cross_entropy(logits, t, ignore)
    x, flat_t = _contiguous(_2d(logits.data)), _contiguous(t.reshape(-1))
    rows = x.shape[0]
    # Lesson 6.5's kernels: one block per row finds its log-sum-exp and its loss in one pass.
    losses, lse = CudaArray.empty((rows,), np.float32), CudaArray.empty((rows,), np.float32)
    launch(_fused.cross_entropy_forward_kernel, rows, ROW_THREADS, x.raw(), flat_t.raw(), ignore, losses.raw(), lse.raw())
    count = (flat_t != ignore).sum().astype(np.float32)  # on the device: the mean's denominator never crosses
    loss = losses.sum() / count

    def backward(g):
        scale = (g / count).reshape(1)
        grad = CudaArray.empty(x.shape, np.float32)
        launch(_fused.cross_entropy_backward_kernel, rows, ROW_THREADS, x.raw(), flat_t.raw(), lse.raw(), ignore,
               scale.raw(), grad.raw())
        return grad.reshape(logits.shape)

    return operation("cross_entropy", loss, (logits,), backward)


def _composed_cross_entropy(logits, t, ignore):
    """Other dtypes (the kernels are float32): the same from array operations, and two small kernels."""
    x = _2d(logits.data)
    flat_t = _contiguous(t.reshape(-1))
    rows = x.shape[0]
    m = x.max(axis=1, keepdims=True)
    lse = np.log(np.exp(x - m).sum(axis=1, keepdims=True)) + m  # (rows, 1): log of each row's sum of exp
    picked = CudaArray.empty((rows,), x.dtype)
    launch(pick_kernel, blocks_for(rows, THREADS_PER_BLOCK), THREADS_PER_BLOCK, x.raw(), flat_t.raw(), ignore,
           picked.raw())
    keep = (flat_t != ignore).astype(x.dtype)
    count = keep.sum()
    loss = ((lse.reshape(-1) - picked) * keep).sum() / count

    def backward(g):
        grad = np.exp(x - lse)
        launch(add_at_targets_kernel, blocks_for(rows, THREADS_PER_BLOCK), THREADS_PER_BLOCK, grad.raw(),
               flat_t.raw(), ignore, grad.dtype.type(-1))
        grad *= (keep * (g / count)).reshape(rows, 1)
        return grad.reshape(logits.shape)

    return operation("cross_entropy", loss, (logits,), backward)


# ----- embedding ----------------------------------------------------------------------------------------------------
def embedding(indices, weight):
    idx = indices.data if isinstance(indices, Tensor) else indices
    if not isinstance(idx, CudaArray):
        idx = np.asarray(idx)
        if not np.issubdtype(idx.dtype, np.integer):
            raise TypeError(f"embedding: indices must be integers, got dtype {idx.dtype}")
    try:
        idx = _indices(idx, weight.shape[0])  # host ids are checked there, then copied in: the batch
    except IndexError as err:
        raise IndexError(f"embedding: {err} (a table of {weight.shape[0]} rows)") from None
    if not np.issubdtype(idx.dtype, np.integer):
        raise TypeError(f"embedding: indices must be integers, got dtype {idx.dtype}")
    if idx.known_range is not None and idx.size and (idx.known_range[0] < 0):
        raise IndexError(f"embedding: index {idx.known_range[0]} is out of range for a table of {weight.shape[0]} rows")

    def backward(g):
        grad = np.zeros_like(weight.data)
        np.add.at(grad, idx.reshape(-1), g.reshape(-1, weight.shape[1]))  # repeated tokens add up: atomics
        return grad

    return operation("embedding", take_rows(weight.data, idx), (weight,), backward)


# ----- dropout --------------------------------------------------------------------------------------------------------
@cuda.jit
def dropout_mask_kernel(mask, seed, p, scale):
    """mask[i] = scale or 0, from a hash of (seed, i): the same numbers on any grid, and no random
    state to keep on the device. Every product stays below 2**63, so it is exact in int64."""
    i = cuda.grid(1)
    if i < mask.size:
        h = (seed ^ (i * 0x27D4EB2D)) & 0xFFFFFFFF
        h = ((h ^ (h >> 16)) * 0x45D9F3B) & 0xFFFFFFFF
        h = ((h ^ (h >> 16)) * 0x45D9F3B) & 0xFFFFFFFF
        h = h ^ (h >> 16)
        u = h / 4294967296.0  # uniform in [0, 1), 32 bits
        mask[i] = scale if u >= p else 0


def dropout(x, p, training=True):
    F._need_tensor(x, "dropout")
    if not 0 <= p < 1:
        raise ValueError(f"dropout: p must be in [0, 1), got {p}")
    if not training or p == 0:
        return x
    seed = int(F.get_rng().integers(0, 2 ** 32))  # drawn on the host, passed by value
    keep = CudaArray.empty(x.shape, x.dtype)
    launch(dropout_mask_kernel, blocks_for(keep.size, THREADS_PER_BLOCK), THREADS_PER_BLOCK,
           keep.reshape(-1).raw(), np.int64(seed), float(p), float(1 / (1 - p)))
    return operation("dropout", x.data * keep, (x,), lambda g: g * keep)


# ----- Mamba's scan -------------------------------------------------------------------------------------------------------
def selective_scan(u, delta, A, B, C, D=None, method=None):
    inputs = (u, delta, A, B, C, D)
    arrays = [None if t is None else (t.data if isinstance(t, Tensor) else t) for t in inputs]
    if not all(a is None or isinstance(a, CudaArray) for a in arrays) or not _float32(*arrays) \
            or arrays[2].shape[1] > _scan.MAX_STATE:
        from course.mamba import selective_scan as engine_scan
        return engine_scan.default(u, delta, A, B, C, D, **({} if method is None else {"method": method}))
    ud, dd, Ad, Bd, Cd, Dd = arrays
    _scan._check(*(np.empty(a.shape, np.float32) if a is not None else None for a in arrays))  # shapes only
    if Dd is None:
        Dd = _filled(ud.shape[2], 0.0)
    (b, l, d), n = ud.shape, Ad.shape[1]
    tensors = tuple(t if isinstance(t, Tensor) or t is None else Tensor(t) for t in inputs)
    need = any(t is not None and t.requires_grad for t in tensors)
    y = CudaArray.empty(ud.shape, np.float32)
    states = CudaArray.empty((b, l, d, n) if need else (1, 1, 1, 1), np.float32)
    raws = [a.raw() for a in (ud, dd, Ad, Bd, Cd, Dd)]
    if ud.size:
        launch(_scan.selective_scan_kernel, blocks_for(b * d, THREADS_PER_BLOCK), THREADS_PER_BLOCK,
               *raws, y.raw(), states.raw(), need)

    def backward(g):
        du, ddelta = CudaArray.empty(ud.shape, np.float32), CudaArray.empty(ud.shape, np.float32)
        dA, dD = np.zeros_like(Ad, shape=(b, d, n)), CudaArray.empty((b, d), np.float32)
        dB, dC = np.zeros_like(Bd), np.zeros_like(Cd)
        if ud.size:
            launch(_scan.selective_scan_backward_kernel, blocks_for(b * d, THREADS_PER_BLOCK), THREADS_PER_BLOCK,
                   _contiguous(g).raw(), *raws, states.raw(), du.raw(), ddelta.raw(), dA.raw(), dB.raw(),
                   dC.raw(), dD.raw())
        grads = (du, ddelta, dA.sum(axis=0), dB, dC, dD.sum(axis=0))  # dA, dD: one row per sequence, summed
        return tuple(None if t is None or not t.requires_grad else gr for gr, t in zip(grads, tensors))

    return operation("selective_scan", y, tensors, backward)


def _contiguous(a):
    return a if a.is_contiguous() else a.copy()


# ----- the optimizer: clipping and the step ---------------------------------------------------------------------------------
def clip_grad_norm_(params, max_norm):
    """As course.optim.clip_grad_norm_, with the norm kept on the device: every gradient is
    multiplied by min(1, max_norm / norm) (a number on the device), so no decision needs the host.
    Returns the norm as a 0-d tensor on the device (`.item()` copies it)."""
    params = list(params)
    grads = [p.grad for p in params if p.grad is not None]
    total = None
    for g in grads:
        square = (g.reshape(-1) * g.reshape(-1)).sum()
        total = square if total is None else total + square
    if total is None:
        return 0.0
    norm = np.sqrt(total)
    scale = np.minimum(max_norm / (norm + 1e-6), 1.0).astype(grads[0].dtype)
    for p in params:
        if p.grad is not None:
            p.grad = p.grad * scale
    return Tensor(norm)


@cuda.jit
def adam_kernel(p, g, m, v, lr, beta1, beta2, eps, weight_decay, decoupled, correction1, root_correction2):
    """One Adam (or AdamW, `decoupled`) step of one parameter, each thread one number: the decay,
    both running averages and the update in one pass over memory, instead of a dozen array operations."""
    i = cuda.grid(1)
    if i < p.size:
        grad = g[i]
        if weight_decay != 0:
            if decoupled:
                p[i] *= 1 - lr * weight_decay
            else:
                grad += weight_decay * p[i]
        m[i] = beta1 * m[i] + (1 - beta1) * grad
        v[i] = beta2 * v[i] + (1 - beta2) * (grad * grad)
        p[i] -= (lr / correction1) * m[i] / (math.sqrt(v[i]) / root_correction2 + eps)


@cuda.jit
def sgd_kernel(p, g, velocity, lr, momentum, weight_decay, first):
    i = cuda.grid(1)
    if i < p.size:
        grad = g[i]
        if weight_decay != 0:
            grad += weight_decay * p[i]
        if momentum != 0:
            grad = grad if first else momentum * velocity[i] + grad
            velocity[i] = grad
        p[i] -= lr * grad


def _state_array(state, key, like):
    if key not in state or not isinstance(state[key], CudaArray):  # made on the host before the model moved
        state[key] = np.zeros_like(like) if key not in state else to_device(np.asarray(state[key]))
    return state[key]


def optimizer_step(optimizer):
    """course.optim's step for parameters on the device: one kernel per parameter for Adam, AdamW
    and SGD (any other optimizer runs its own update, as array operations on the device)."""
    from course import optim

    if type(optimizer) not in (optim.Adam, optim.AdamW, optim.SGD):
        return optim.optimizer_step.default(optimizer)
    optimizer.steps += 1
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.grad is None:
                continue
            state = optimizer.state.setdefault(id(p), {})
            data, grad = p.data.reshape(-1), _contiguous(p.grad).reshape(-1)
            dtype = data.dtype.type
            blocks = blocks_for(data.size, THREADS_PER_BLOCK)
            if isinstance(optimizer, optim.Adam):
                state.setdefault("t", 0)
                state["t"] += 1
                m, v = _state_array(state, "m", p.data), _state_array(state, "v", p.data)
                beta1, beta2 = group["betas"]
                launch(adam_kernel, blocks, THREADS_PER_BLOCK, data.raw(), grad.raw(), m.reshape(-1).raw(),
                       v.reshape(-1).raw(), dtype(group["lr"]), dtype(beta1), dtype(beta2), dtype(group["eps"]),
                       dtype(group["weight_decay"]), isinstance(optimizer, optim.AdamW),
                       dtype(1 - beta1 ** state["t"]), dtype(math.sqrt(1 - beta2 ** state["t"])))
            else:
                first = group["momentum"] and "velocity" not in state
                velocity = _state_array(state, "velocity", p.data) if group["momentum"] else data
                launch(sgd_kernel, blocks, THREADS_PER_BLOCK, data.raw(), grad.raw(), velocity.reshape(-1).raw(),
                       dtype(group["lr"]), dtype(group["momentum"]), dtype(group["weight_decay"]), bool(first))


IMPLEMENTATIONS = {
    "softmax": softmax, "layer_norm": layer_norm, "scaled_dot_product_attention": scaled_dot_product_attention,
    "cross_entropy": cross_entropy, "embedding": embedding, "dropout": dropout, "selective_scan": selective_scan,
    "clip_grad_norm_": clip_grad_norm_, "optimizer_step": optimizer_step,
}
