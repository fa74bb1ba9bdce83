"""The two operations of the Mamba block besides the scan (lesson 5.3), forward and backward side by side.

    y = rms_norm(x, weight, eps=1e-5)        # x (..., d), weight (d,)
    y = causal_conv1d(x, weight, bias)       # x (b, l, d), weight (d, 1, k) or (d, k), bias (d,) or None

Both work on Tensors; each is one operation, checked against finite differences in tests/.
"""

import numpy as np

from ..tensor import Tensor, operation

__all__ = ["rms_norm", "causal_conv1d"]


def _need_tensors(fn, **args):
    """A clear error for an array where a Tensor is expected (the operations record a gradient)."""
    for name, value in args.items():
        if value is not None and not isinstance(value, Tensor):
            raise TypeError(f"{fn}: `{name}` must be a Tensor, got {type(value).__name__}: wrap it first, "
                            f"Tensor({name})")


def rms_norm(x, weight, eps=1e-5):
    """x / sqrt(mean(x^2) + eps) * weight over the last axis.

    LayerNorm without the mean: it only rescales each vector to unit root-mean-square, which is
    cheaper and works as well in practice (Mamba and most recent language models use it).
    """
    _need_tensors("rms_norm", x=x, weight=weight)
    if weight is not None and weight.shape != x.shape[-1:]:
        raise ValueError(f"rms_norm: weight of shape {weight.shape} does not fit input of shape {x.shape} "
                         f"(it needs shape ({x.shape[-1]},))")
    d = x.data
    rstd = 1 / np.sqrt((d * d).mean(axis=-1, keepdims=True) + eps)
    xhat = d * rstd
    y = xhat * weight.data if weight is not None else xhat

    def backward(g):
        lead = tuple(range(g.ndim - 1))
        gw = (g * xhat).sum(axis=lead) if weight is not None and weight.requires_grad else None
        gx = None
        if x.requires_grad:
            gy = g * weight.data if weight is not None else g
            # xhat = x * rstd and rstd depends on every x of the row:
            # dx = rstd * (gy - xhat * mean(gy * xhat)), LayerNorm's formula without the mean term.
            gx = rstd * (gy - xhat * (gy * xhat).mean(axis=-1, keepdims=True))
        return gx, gw

    return operation("rms_norm", y.astype(d.dtype, copy=False), (x, weight), backward)


def causal_conv1d(x, weight, bias=None):
    """A depthwise causal convolution along time: each channel has its own filter of k taps.

        y[b, t, c] = bias[c] + sum_j weight[c, j] * x[b, t - (k - 1) + j, c]    (x = 0 before t = 0)

    x is (b, l, d) (time on axis 1, channels last, as everywhere in the block); weight is
    PyTorch's Conv1d layout for groups=d, (d, 1, k), or simply (d, k). This equals PyTorch's
    Conv1d(d, d, k, groups=d, padding=k-1) followed by keeping the first l outputs, which is how
    mamba-minimal writes it: position t sees only positions t-k+1..t, never the future.
    """
    _need_tensors("causal_conv1d", x=x, weight=weight, bias=bias)
    w_shape = weight.shape
    w = weight.data.reshape(w_shape[0], w_shape[-1]) if weight.ndim == 3 and w_shape[1] == 1 else weight.data
    bias_shape = None if bias is None else bias.shape
    if x.ndim != 3 or w.ndim != 2 or w.shape[0] != x.shape[2] or bias_shape not in (None, (x.shape[2],)):
        raise ValueError(f"causal_conv1d: x {x.shape}, weight {w_shape} and bias {bias_shape} do not fit: "
                         f"expected x (b, l, d), weight (d, 1, k) or (d, k), bias (d,)")
    b, l, d = x.shape
    k = w.shape[1]
    xp = np.concatenate([np.zeros_like(x.data, shape=(b, k - 1, d)), x.data], axis=1)  # k-1 zeros before t=0
    y = xp[:, k - 1:] * w[:, k - 1] if bias is None else xp[:, k - 1:] * w[:, k - 1] + bias.data
    for j in range(k - 1):  # tap j looks k-1-j steps back
        y += xp[:, j:j + l] * w[:, j]

    def backward(g):
        gx = gw = gb = None
        if x.requires_grad:
            # Each input position feeds k outputs (itself and the k-1 after it), with the same taps.
            gp = np.concatenate([g, np.zeros_like(g, shape=(b, k - 1, d))], axis=1)
            gx = g * w[:, k - 1]
            for j in range(k - 1):
                gx = gx + gp[:, k - 1 - j:k - 1 - j + l] * w[:, j]
        if weight.requires_grad:
            gw = np.stack([(g * xp[:, j:j + l]).sum(axis=(0, 1)) for j in range(k)], axis=1).reshape(w_shape)
        if bias is not None and bias.requires_grad:
            gb = g.sum(axis=(0, 1))
        return gx, gw, gb

    return operation("causal_conv1d", y.astype(x.dtype, copy=False), (x, weight, bias), backward)
