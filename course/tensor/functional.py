"""Functions of tensors used by neural networks (imported as `F`).

Each is one operation with its own backward (written with `operation`, the engine's public way
to add one), rather than a chain of smaller ones: softmax, log_softmax and cross_entropy are then
numerically stable (they never exponentiate a large number), and a network runs fewer, larger
NumPy calls. The heaviest ones (`linear`, `softmax`, `layer_norm`, attention) are dispatch points:
part 6 can swap its kernels in for them (see `course.tensor.dispatch`).
"""

import numpy as np

from .device import is_array
from .dispatch import dispatchable
from .tensor import Tensor, operation, unbroadcast

_rng = np.random.default_rng(0)


def manual_seed(seed):
    """Seed the generator used by `dropout` (and by modules that draw random numbers)."""
    global _rng
    _rng = np.random.default_rng(seed)


def get_rng():
    return _rng


def _need_tensor(x, fn, arg="x"):
    """`x` itself if it is a Tensor; otherwise a TypeError saying what was given and how to fix it."""
    if isinstance(x, Tensor):
        return x
    got = "a NumPy array" if isinstance(x, np.ndarray) else f"a {type(x).__name__}"
    raise TypeError(f"{fn}: `{arg}` must be a Tensor, got {got}: wrap it first, Tensor({arg})")


def _tensor(x, like=None):
    if isinstance(x, Tensor):
        return x
    dtype = like.dtype if like is not None else None
    return Tensor(np.asarray(x, dtype=dtype))


# ----- activations ----------------------------------------------------------------------------
_GELU_C = float(np.sqrt(2 / np.pi))  # a Python float: a NumPy float64 scalar would turn float32 into float64


def gelu(x):
    """GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    _need_tensor(x, "gelu")
    d = x.data
    d2 = d * d  # not d ** 3 below: pow is ~50x slower on negative floats
    # In-place steps (out=...) on these large arrays spare a fresh allocation per operation.
    t = d2 * 0.044715
    t += 1
    t *= d
    t *= _GELU_C
    t = np.tanh(t)  # tanh(c (x + 0.044715 x^3))
    y = t + 1
    y *= d
    y *= 0.5

    def backward(g):
        # d/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 * 0.044715 x^2)
        slope = d2 * (3 * 0.044715 * _GELU_C)
        slope += _GELU_C
        slope *= d
        slope *= 1 - t * t
        slope += 1 + t
        slope *= 0.5
        slope *= g
        return slope

    return operation("gelu", y, (x,), backward)


def _sigmoid(d):
    # The same numbers as Tensor.sigmoid's split by sign, and as safe from overflow (tanh stays in
    # [-1, 1]): sigmoid(d) = (1 + tanh(d / 2)) / 2, in four passes over the array where the split
    # takes nine, and about eight times faster in float32 (Mamba's SiLU gates and softplus).
    s = np.tanh(d * 0.5)
    s += 1
    s *= 0.5
    return s


def silu(x):
    """SiLU (swish): x * sigmoid(x)."""
    _need_tensor(x, "silu")
    d = x.data
    s = _sigmoid(d)
    return operation("silu", d * s, (x,), lambda g: g * (s * (1 + d * (1 - s))))


def softplus(x):
    """log(1 + exp(x)), computed without overflow; its derivative is sigmoid(x)."""
    _need_tensor(x, "softplus")
    d = x.data
    # log(1 + e^d) = max(d, 0) + log(1 + e^-|d|): e^-|d| is at most 1, so nothing overflows. The
    # same as np.logaddexp(0, d), and about eight times faster in float32.
    data = np.maximum(d, 0) + np.log1p(np.exp(-np.abs(d)))
    return operation("softplus", data, (x,), lambda g: g * _sigmoid(d))


# ----- softmax and the losses built on it ------------------------------------------------------
@dispatchable
def softmax(x, axis=-1):
    """exp(x) / sum(exp(x)) along `axis`; the maximum is subtracted first so exp never overflows."""
    _need_tensor(x, "softmax")
    d = x.data
    e = np.exp(d - d.max(axis=axis, keepdims=True))
    s = e / e.sum(axis=axis, keepdims=True)
    # The Jacobian is diag(s) - s s^T, so the backward is s * (g - <g, s>).
    return operation("softmax", s, (x,), lambda g: s * (g - (g * s).sum(axis=axis, keepdims=True)))


def _log_softmax(d, axis):
    shifted = d - d.max(axis=axis, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))


def log_softmax(x, axis=-1):
    """log(softmax(x)) as x - logsumexp(x): finite even where softmax underflows to 0."""
    _need_tensor(x, "log_softmax")
    logp = _log_softmax(x.data, axis)
    return operation("log_softmax", logp, (x,), lambda g: g - np.exp(logp) * g.sum(axis=axis, keepdims=True))


@dispatchable
def cross_entropy(logits, targets, ignore_index=None):
    """Mean negative log-likelihood of integer `targets` under `softmax(logits)`.

    logits: (..., C). targets: integers of shape logits.shape[:-1], an array or a Tensor.
    Targets equal to `ignore_index` count for nothing, and the mean is over the others.
    """
    _need_tensor(logits, "cross_entropy", "logits")
    t = np.asarray(targets.data if isinstance(targets, Tensor) else targets)
    if not np.issubdtype(t.dtype, np.integer):
        raise TypeError(f"cross_entropy: targets must be integers (class indices), got dtype {t.dtype}")
    if t.shape != logits.shape[:-1]:
        raise ValueError(f"cross_entropy: logits of shape {logits.shape} need targets of shape "
                         f"{logits.shape[:-1]}, got targets of shape {t.shape}")
    n_classes = logits.shape[-1]
    keep = np.ones(t.shape, dtype=bool) if ignore_index is None else t != ignore_index
    count = int(keep.sum())
    if count == 0:
        raise ValueError(f"cross_entropy: every target equals ignore_index={ignore_index}: nothing to average")
    bad = keep & ((t < 0) | (t >= n_classes))
    if bad.any():
        raise ValueError(f"cross_entropy: target {t[bad][0]} is out of range for {n_classes} classes")
    flat = logits.data.reshape(-1, n_classes)
    t_flat = np.where(keep, t, 0).reshape(-1)
    keep_flat = keep.reshape(-1)
    logp = _log_softmax(flat, -1)
    picked = logp[np.arange(len(t_flat)), t_flat]
    loss = -(picked * keep_flat).sum() / count

    def backward(g):
        # d loss / d logits = (softmax - one_hot(target)) / count, on the rows that count.
        grad = np.exp(logp)
        grad[np.arange(len(t_flat)), t_flat] -= 1
        grad *= (keep_flat * (g / count))[:, None].astype(grad.dtype)
        return grad.reshape(logits.shape)

    return operation("cross_entropy", np.asarray(loss, dtype=logits.dtype), (logits,), backward)


# ----- normalisation and lookup ----------------------------------------------------------------
@dispatchable
def layer_norm(x, weight, bias, eps=1e-5):
    """Normalise the last axis to mean 0 and variance 1, then scale by `weight` and shift by `bias`."""
    _need_tensor(x, "layer_norm")
    d = x.data
    n = d.shape[-1]
    mu = d.mean(axis=-1, keepdims=True)
    xhat = d - mu  # centred now; normalised in place below (one array instead of three)
    # The variance as a row-by-row dot product: one pass, without an (x - mu)**2 temporary.
    var = np.einsum("...i,...i->...", xhat, xhat)[..., None] / n
    rstd = 1 / np.sqrt(var + eps)
    xhat *= rstd
    y = xhat * weight.data if weight is not None else xhat.copy()
    if bias is not None:
        y += bias.data

    def backward(g):
        g2, xhat2 = g.reshape(-1, n), xhat.reshape(-1, n)  # (rows, n): sums over rows below
        gw = np.einsum("ij,ij->j", g2, xhat2) if weight is not None and weight.requires_grad else None
        gb = g2.sum(axis=0) if bias is not None and bias.requires_grad else None
        gx = None
        if x.requires_grad:
            gy = g * weight.data if weight is not None else g.copy()
            # The gradient through the mean and the variance, in one line:
            #   dx = rstd * (gy - mean(gy) - xhat * mean(gy * xhat))
            # computed in place in gy, with the second mean as a dot product per row.
            gy_xhat = np.einsum("...i,...i->...", gy, xhat)[..., None] / n
            gy -= gy.mean(axis=-1, keepdims=True)
            gy -= xhat * gy_xhat
            gy *= rstd
            gx = gy
        return gx, gw, gb

    return operation("layer_norm", y, (x, weight, bias), backward)


@dispatchable
def add_layer_norm(x, y, weight, bias, eps=1e-5):
    """(x + y, layer_norm(x + y, weight, bias, eps)): a residual add and the layer norm that reads it.

    A transformer block does this twice per layer; as one dispatch point, part 6 can compute both
    in one pass over memory (`course.kernels.fused`). Here it is the two operations, unchanged.
    """
    total = x + y
    return total, layer_norm(total, weight, bias, eps)


@dispatchable
def embedding(indices, weight):
    """Rows of `weight` picked by integer `indices`: the result has shape indices.shape + (dim,)."""
    idx = np.asarray(indices.data if isinstance(indices, Tensor) else indices)
    if not np.issubdtype(idx.dtype, np.integer):
        raise TypeError(f"embedding: indices must be integers, got dtype {idx.dtype}")
    n = weight.shape[0]
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        bad = idx[(idx < 0) | (idx >= n)][0]
        raise IndexError(f"embedding: index {bad} is out of range for a table of {n} rows")

    def backward(g):
        grad = np.zeros_like(weight.data)
        np.add.at(grad, idx.reshape(-1), g.reshape(-1, weight.shape[1]))  # repeated tokens add up
        return grad

    return operation("embedding", weight.data[idx], (weight,), backward)


# ----- selection and joining -------------------------------------------------------------------
def _bool_array(mask):
    """A mask as booleans, where it lives (a device's array stays on its device)."""
    m = mask.data if isinstance(mask, Tensor) else mask
    return m.astype(bool, copy=False) if is_array(m) and not isinstance(m, np.ndarray) else np.asarray(m, dtype=bool)


def masked_fill(x, mask, value):
    """`x` with `value` wherever `mask` is True (the mask broadcasts against x)."""
    _need_tensor(x, "masked_fill")
    m = _bool_array(mask)
    try:
        data = np.where(m, np.asarray(value, dtype=x.dtype), x.data)
    except ValueError:
        raise ValueError(f"masked_fill: mask of shape {m.shape} does not broadcast to shape {x.shape}") from None
    if data.shape != x.shape:
        raise ValueError(f"masked_fill: mask of shape {m.shape} would change the shape {x.shape}")
    return operation("masked_fill", data, (x,), lambda g: np.where(m, 0, g).astype(x.dtype, copy=False))


def where(condition, a, b):
    """Elementwise `a` where `condition` is True, else `b` (numbers or tensors, broadcasting)."""
    c = _bool_array(condition)
    like = a if isinstance(a, Tensor) else b if isinstance(b, Tensor) else None
    a, b = _tensor(a, like), _tensor(b, like)
    try:
        data = np.where(c, a.data, b.data)
    except ValueError:
        raise ValueError(f"where: shapes {c.shape}, {a.shape} and {b.shape} cannot be broadcast together") from None

    def backward(g):
        ga = unbroadcast(np.where(c, g, 0), a.shape).astype(a.dtype, copy=False) if a.requires_grad else None
        gb = unbroadcast(np.where(c, 0, g), b.shape).astype(b.dtype, copy=False) if b.requires_grad else None
        return ga, gb

    return operation("where", data, (a, b), backward)


def concatenate(tensors, axis=0):
    """Join tensors along an existing axis; the gradient is cut back into the pieces."""
    tensors = [_tensor(t) for t in tensors]
    try:
        data = np.concatenate([t.data for t in tensors], axis=axis)
    except ValueError:
        shapes = ", ".join(str(t.shape) for t in tensors)
        raise ValueError(f"concatenate: shapes {shapes} cannot be joined along axis {axis}") from None
    ends = np.cumsum([t.shape[axis] for t in tensors])[:-1]
    return operation("concatenate", data, tuple(tensors), lambda g: tuple(np.split(g, ends, axis=axis)))


def stack(tensors, axis=0):
    """Join tensors of one shape along a new axis."""
    tensors = [_tensor(t) for t in tensors]
    shapes = {t.shape for t in tensors}
    if len(shapes) > 1:
        raise ValueError(f"stack: all tensors need the same shape, got {', '.join(str(s) for s in shapes)}")
    data = np.stack([t.data for t in tensors], axis=axis)
    return operation("stack", data, tuple(tensors), lambda g: tuple(np.moveaxis(g, axis, 0)))


@dispatchable
def dropout(x, p, training=True):
    """Zero each element with probability p and scale the rest by 1/(1-p), so the expected value is unchanged."""
    _need_tensor(x, "dropout")
    if not 0 <= p < 1:
        raise ValueError(f"dropout: p must be in [0, 1), got {p}")
    if not training or p == 0:
        return x
    keep = (_rng.random(x.shape) >= p).astype(x.dtype) / (1 - p)
    return operation("dropout", x.data * keep, (x,), lambda g: g * keep)


# ----- the layer every network is full of --------------------------------------------------------
@dispatchable
def linear(x, weight, bias=None):
    """x @ weight.T + bias, as one operation: weight has shape (out, in) as in PyTorch.

    Written as a single op (rather than transpose, matmul and add) because networks spend most
    of their time here: the backward folds all leading axes into one matrix product.
    """
    _need_tensor(x, "linear")
    if x.shape[-1] != weight.shape[1]:
        raise ValueError(f"linear: input of shape {x.shape} has {x.shape[-1]} features but the weight "
                         f"of shape {weight.shape} expects {weight.shape[1]}")
    # One 2-D matrix product over all leading axes: NumPy runs a 3-D @ 2-D product as a loop of
    # small products, about 3x slower.
    y = (x.data.reshape(-1, x.shape[-1]) @ weight.data.T).reshape(*x.shape[:-1], weight.shape[0])
    if bias is not None:
        y += bias.data

    def backward(g):
        g2 = g.reshape(-1, g.shape[-1])
        gx = (g2 @ weight.data).reshape(x.shape) if x.requires_grad else None
        gw = g2.T @ x.data.reshape(-1, x.shape[-1]) if weight.requires_grad else None
        gb = g2.sum(axis=0) if bias is not None and bias.requires_grad else None
        return gx, gw, gb

    return operation("linear", y, (x, weight, bias), backward)


@dispatchable
def linear_gelu(x, weight, bias=None):
    """gelu(linear(x, weight, bias)), the first half of a transformer's MLP, as one dispatch point:
    part 6 adds the bias and applies GELU in one pass (`course.kernels.fused`)."""
    return gelu(linear(x, weight, bias))


# ----- attention, as one operation (part 4) ------------------------------------------------------
def causal_mask(t_query, t_key):
    """True where query i may NOT look at key j: j lies in its future.

    The queries are the last `t_query` of `t_key` positions (t_query < t_key when earlier keys
    come from a cache), so query i sits at position t_key - t_query + i.
    """
    offset = t_key - t_query
    return np.arange(t_key)[None, :] > np.arange(offset, offset + t_query)[:, None]


@dispatchable
def scaled_dot_product_attention(q, k, v, causal=True, dropout_p=0.0, training=True):
    """softmax(q @ k^T / sqrt(d)) @ v over the last two axes, with a causal mask, as one operation.

    q: (..., Tq, d), k: (..., Tk, d), v: (..., Tk, dv); the result has shape (..., Tq, dv).
    Written as one op (rather than matmul, scale, masked_fill, softmax, matmul) because it runs
    once per layer on the largest arrays of a transformer: one forward and one backward here
    make three fewer copies of the (T, T) attention matrix, and skip their graph bookkeeping.
    With dropout_p > 0 (and training), attention weights are dropped after the softmax.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        _need_tensor(t, "scaled_dot_product_attention", name)
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise ValueError(f"scaled_dot_product_attention: q {q.shape}, k {k.shape} and v {v.shape} "
                         f"need q and k to share the last axis and k and v the second to last")
    t_query, t_key = q.shape[-2], k.shape[-2]
    if causal and t_query > t_key:
        raise ValueError(f"scaled_dot_product_attention: {t_query} causal queries need at least as "
                         f"many keys, got {t_key}")
    scale = np.asarray(1 / np.sqrt(q.shape[-1]), dtype=q.dtype)
    # Heads cut from a (B, T, C) array are strided views; BLAS can be many times slower on those
    # than on a compact copy, and the copies are small next to the (T, T) scores.
    qd, kd, vd = (np.ascontiguousarray(t.data) for t in (q, k, v))
    # Forward: scores, masked, softmax (in place, to spare copies), weighted sum of values.
    att = (qd * scale) @ np.swapaxes(kd, -1, -2)  # scaling q is cheaper than scaling (T, T)
    if causal and t_query > 1:
        # Adding -inf is one pass over the scores (indexing with a boolean mask is ~20x slower);
        # exp(-inf) = 0, so the future gets no weight.
        att += np.where(causal_mask(t_query, t_key), -np.inf, 0).astype(att.dtype)
    att -= att.max(axis=-1, keepdims=True)
    np.exp(att, out=att)
    att /= att.sum(axis=-1, keepdims=True)
    weights = att
    if dropout_p and training:
        keep = (_rng.random(att.shape) >= dropout_p).astype(att.dtype) / (1 - dropout_p)
        weights = att * keep

    def backward(g):
        g = np.ascontiguousarray(g)
        gq = gk = gv = None
        if v.requires_grad:  # y = P v  ->  dv = P^T dy
            gv = unbroadcast(np.swapaxes(weights, -1, -2) @ g, v.shape)
        if q.requires_grad or k.requires_grad:
            dp = g @ np.swapaxes(vd, -1, -2)  # dP = dy v^T
            if weights is not att:
                dp *= keep
            # Softmax backward, row by row: dS = P * (dP - sum(dP * P)). Masked entries have
            # P = 0, so they get no gradient without looking at the mask again.
            ds = dp
            ds -= (dp * att).sum(axis=-1, keepdims=True)
            ds *= att
            ds *= scale
            if q.requires_grad:  # S = q k^T * scale  ->  dq = dS k,  dk = dS^T q
                gq = unbroadcast(ds @ kd, q.shape)
            if k.requires_grad:
                gk = unbroadcast(np.swapaxes(ds, -1, -2) @ qd, k.shape)
        return gq, gk, gv

    return operation("attention", weights @ vd, (q, k, v), backward)
