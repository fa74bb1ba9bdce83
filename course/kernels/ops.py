"""Autograd operations whose forward and backward both run on kernels, and `use_kernels`.

Each operation takes the same arguments as the tensor engine's operation it replaces, plus
`device`: "cpu" (the numba.njit kernels of `course.kernels.cpu`) or "cuda" (the CUDA kernels,
on a GPU or on the simulator). Like every operation of the engine it is written with
`operation(name, data, inputs, backward)`; only the arithmetic moves into kernels:

    matmul       C = A B;              dA = dC B^T,  dB = A^T dC           (three matrix products)
    linear       y = x W^T + b;        dx = dy W,  dW = dy^T x,  db = sum of dy's rows
    softmax      s = softmax(x);       dx = s * (dy - <dy, s>)            (row by row)
    layer_norm   y = xhat w + b;       dx, dw, db from the saved mean and 1/std of each row
    selective_scan                     the backward is a reverse-time scan
    scaled_dot_product_attention       composed: two kernel matmuls around a kernel softmax
    cuda_attention, cuda_cross_entropy the fused CUDA kernels of lesson 6.5 (`fused_cuda`), which
                                       take over attention and cross-entropy under use_kernels("cuda")

What a kernel does not cover goes back to the engine's NumPy version (`fn.default`), so
results never change, only where they are computed:
- softmax over an axis other than the last;
- matmul of a vector, or of batches whose leading axes differ (broadcasting);
- attention with dropout (the engine draws the dropout mask);
- on "cuda", any array that is not float32 (the CUDA kernels are written for float32); on
  "cpu", float16, or inputs of different dtypes.

    with use_kernels("cpu"):
        logits, loss = model(idx, targets)     # GPT or Mamba, unchanged
"""

import functools
import warnings
from contextlib import contextmanager

import numpy as np

from ..tensor import Tensor, dispatch, operation
from ..tensor import functional as F
from ..tensor import tensor as _tensor
from . import basics, cpu, fused, fused_cuda, rows, scan
from ._backend import cuda as _cuda
from .matmul import matmul as cuda_matmul  # the host function (the module has its name too)

DEVICES = ("cpu", "cuda")


class KernelFallbackWarning(UserWarning):
    """Operations inside use_kernels(...) that the kernels cannot take, run by the NumPy path instead."""


_said = {"float64": False}  # said once per use_kernels block


class _Cuda:
    """The CUDA host functions, under the names the operations use (batches are a loop of launches)."""

    @staticmethod
    def supports(*arrays):
        ok = all(a is None or a.dtype == np.float32 for a in arrays)
        if not ok and not _said["float64"] and any(a is not None and a.dtype == np.float64 for a in arrays):
            _said["float64"] = True
            warnings.warn("use_kernels('cuda'): the CUDA kernels take float32, so these float64 tensors run on "
                          "the NumPy path, with no launch; convert the model to float32 (model.astype(np.float32)) "
                          "to run it on the kernels", KernelFallbackWarning, stacklevel=4)
        return ok

    @staticmethod
    def matmul(a, b):
        if a.ndim == 2:
            return cuda_matmul(a, b)
        out = np.empty(a.shape[:-1] + b.shape[-1:], dtype=np.float32)
        for i in np.ndindex(a.shape[:-2]):
            out[i] = cuda_matmul(a[i], b[i])
        return out

    @staticmethod
    def matmul_bt(a, bt):
        return _Cuda.matmul(a, np.ascontiguousarray(np.swapaxes(bt, -1, -2)))

    add_row = staticmethod(basics.add_row)
    reduce_rows = staticmethod(basics.reduce_rows)
    softmax = staticmethod(rows.softmax)
    softmax_backward = staticmethod(rows.softmax_backward)
    layer_norm = staticmethod(rows.layer_norm)
    layer_norm_backward = staticmethod(rows.layer_norm_backward)
    selective_scan = staticmethod(scan.selective_scan)
    selective_scan_backward = staticmethod(scan.selective_scan_backward)


class _Cpu:
    @staticmethod
    def supports(*arrays):
        dtypes = {a.dtype for a in arrays if a is not None}
        return len(dtypes) == 1 and dtypes <= {np.dtype(np.float32), np.dtype(np.float64)}

    matmul = staticmethod(cpu.matmul)
    matmul_bt = staticmethod(cpu.matmul_bt)
    matmul_at = staticmethod(cpu.matmul_at)
    add_row = staticmethod(cpu.add_row)
    reduce_rows = staticmethod(cpu.reduce_rows)
    softmax = staticmethod(cpu.softmax)
    softmax_backward = staticmethod(cpu.softmax_backward)
    layer_norm = staticmethod(cpu.layer_norm)
    layer_norm_backward = staticmethod(cpu.layer_norm_backward)
    @staticmethod
    def selective_scan(*arrays, return_states=False):
        """(y, saved): for the backward, the states and the decays exp(delta A) (one exp per step, not two)."""
        if not return_states:
            return cpu.selective_scan(*arrays), None
        y, states, decays = cpu.selective_scan(*arrays, return_states=True, return_decays=True)
        return y, (states, decays)

    @staticmethod
    def selective_scan_backward(g, *args):
        *arrays, (states, decays) = args
        return cpu.selective_scan_backward(g, *arrays, states, decays=decays)


def _lib(device):
    if device == "cpu":
        return _Cpu
    if device == "cuda":
        return _Cuda
    raise ValueError(f"unknown device {device!r}; the known ones are {', '.join(map(repr, DEVICES))}")


def _data(t):
    return None if t is None else t.data


def _swap(x):
    return np.swapaxes(x, -1, -2)


def _matmul_at(lib, at, b):
    """at^T b: the CPU kernel reads at through a transposed view; a library without matmul_at gets
    the transpose made first."""
    if hasattr(lib, "matmul_at"):
        return lib.matmul_at(at, b)
    return lib.matmul(np.ascontiguousarray(_swap(at)), b)


# ----- matrix products --------------------------------------------------------------------------------
def matmul(a, b, *, device="cpu"):
    """a @ b of two tensors (matrices, or batches of them with the same leading axes)."""
    lib = _lib(device)
    x, y = a.data, b.data
    if (x.ndim < 2 or y.ndim < 2 or x.shape[:-2] != y.shape[:-2] or x.shape[-1] != y.shape[-2]
            or not lib.supports(x, y)):
        return _tensor.matmul.default(a, b)
    data = lib.matmul(x, y)

    def backward(g):
        ga = lib.matmul_bt(g, y) if a.requires_grad else None  # dC B^T
        gb = _matmul_at(lib, x, g) if b.requires_grad else None  # A^T dC
        return ga, gb

    return operation("matmul", data, (a, b), backward)


def linear(x, weight, bias=None, *, device="cpu"):
    """x @ weight.T + bias, as the engine's F.linear; weight has shape (out, in)."""
    lib = _lib(device)
    if x.shape[-1] != weight.shape[1] or not lib.supports(x.data, weight.data, _data(bias)):
        return F.linear.default(x, weight, bias)
    x2 = x.data.reshape(-1, x.shape[-1])
    y = lib.matmul_bt(x2, weight.data)  # x W^T: W's rows are already the transposed layout the kernel wants
    if bias is not None:
        y = lib.add_row(y, bias.data)
    out_shape = x.shape[:-1] + (weight.shape[0],)

    def backward(g):
        g2 = g.reshape(-1, g.shape[-1])
        gx = lib.matmul(g2, weight.data).reshape(x.shape) if x.requires_grad else None
        gw = _matmul_at(lib, g2, x2) if weight.requires_grad else None  # dy^T x
        gb = lib.reduce_rows(g2) if bias is not None and bias.requires_grad else None
        return gx, gw, gb

    return operation("linear", y.reshape(out_shape), (x, weight, bias), backward)


# ----- rows: softmax and layer norm ------------------------------------------------------------------------
def softmax(x, axis=-1, *, device="cpu"):
    """softmax over the last axis on kernels; another axis is handed back to the engine's version."""
    lib = _lib(device)
    if axis not in (-1, x.ndim - 1) or x.ndim == 0 or not lib.supports(x.data):
        return F.softmax.default(x, axis)
    shape = x.shape
    s = lib.softmax(x.data.reshape(-1, shape[-1])).reshape(shape)

    def backward(g):
        n = shape[-1]
        return lib.softmax_backward(s.reshape(-1, n), g.reshape(-1, n)).reshape(shape)

    return operation("softmax", s, (x,), backward)


def layer_norm(x, weight, bias, eps=1e-5, *, device="cpu"):
    """Layer norm over the last axis, as F.layer_norm (weight and bias may be None)."""
    lib = _lib(device)
    n = x.shape[-1] if x.ndim else 0
    fits = all(p is None or p.shape == (n,) for p in (weight, bias))
    if x.ndim == 0 or not fits or not lib.supports(x.data, _data(weight), _data(bias)):
        return F.layer_norm.default(x, weight, bias, eps)
    x2 = x.data.reshape(-1, n)
    y, mean, rstd = lib.layer_norm(x2, _data(weight), _data(bias), eps, return_stats=True)

    def backward(g):
        gx, gw, gb = lib.layer_norm_backward(x2, _data(weight), mean, rstd, g.reshape(-1, n))
        return (gx.reshape(x.shape) if x.requires_grad else None,
                gw if weight is not None and weight.requires_grad else None,
                gb if bias is not None and bias.requires_grad else None)

    return operation("layer_norm", y.reshape(x.shape), (x, weight, bias), backward)


# ----- attention, composed from the kernels above ------------------------------------------------------------
def scaled_dot_product_attention(q, k, v, causal=True, dropout_p=0.0, training=True, *, device="cpu"):
    """softmax(q k^T / sqrt(d)) v as in the engine, built from kernel operations: the two matrix
    products and the softmax run on kernels; scaling and the causal mask are engine operations
    (cheap, elementwise), so autograd strings the backwards together by itself."""
    lib = _lib(device)
    if ((dropout_p and training) or q.ndim < 2 or q.shape[:-2] != k.shape[:-2] or k.shape[:-2] != v.shape[:-2]
            or q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2] or (causal and q.shape[-2] > k.shape[-2])
            or not lib.supports(q.data, k.data, v.data)):
        return F.scaled_dot_product_attention.default(q, k, v, causal, dropout_p, training)
    axes = tuple(range(k.ndim - 2)) + (k.ndim - 1, k.ndim - 2)
    scores = matmul(q, k.transpose(*axes), device=device) * (1 / np.sqrt(q.shape[-1]))
    t_query, t_key = q.shape[-2], k.shape[-2]
    if causal and t_query > 1:
        scores = F.masked_fill(scores, F.causal_mask(t_query, t_key), -np.inf)
    return matmul(softmax(scores, device=device), v, device=device)


# ----- Mamba's scan -----------------------------------------------------------------------------------------------
def selective_scan(u, delta, A, B, C, D=None, method=None, *, device="cpu"):
    """The selective scan of course.mamba on kernels (arrays or Tensors, mamba-minimal's shapes).

    `method` is accepted for the same call signature and ignored: the kernel is the method.
    """
    lib = _lib(device)
    inputs = (u, delta, A, B, C, D)
    any_tensor = any(isinstance(t, Tensor) for t in inputs)
    arrays = [None if t is None else np.asarray(t.data if isinstance(t, Tensor) else t) for t in inputs]
    if not lib.supports(*arrays):
        from course.mamba import selective_scan as engine_scan
        return engine_scan.default(u, delta, A, B, C, D, **({} if method is None else {"method": method}))
    y, states = lib.selective_scan(*arrays, return_states=any_tensor)
    if not any_tensor:
        return y
    tensors = tuple(t if isinstance(t, Tensor) or t is None else Tensor(np.asarray(t)) for t in inputs)

    def backward(g):
        grads = lib.selective_scan_backward(g, *arrays, states)
        return tuple(None if gr is None or t is None or not t.requires_grad else gr.astype(t.dtype, copy=False)
                     for gr, t in zip(grads, tensors))

    return operation("selective_scan", y, tensors, backward)


# ----- fused CUDA operations (lesson 6.5): attention by tiles, cross-entropy ------------------------------------
def cuda_attention(q, k, v, causal=True, dropout_p=0.0, training=True):
    """F.scaled_dot_product_attention on the kernels of `fused_cuda`: the forward by tiles with an
    online softmax saves each row's lse, the backward recomputes the probabilities tile by tile from
    it (FlashAttention-2); no (T, T) array in either. Dropout, head sizes over MAX_HEAD and empty or
    ill-fitting shapes go to the composed version above, which hands on what it cannot take."""
    if (not all(isinstance(t, Tensor) for t in (q, k, v)) or (dropout_p and training) or q.ndim < 2
            or q.ndim != k.ndim or k.ndim != v.ndim or q.shape[:-2] != k.shape[:-2] or k.shape[:-2] != v.shape[:-2]
            or q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2] or (causal and q.shape[-2] > k.shape[-2])
            or 0 in q.shape + k.shape + v.shape or max(q.shape[-1], v.shape[-1]) > fused_cuda.MAX_HEAD
            or not _Cuda.supports(q.data, k.data, v.data)):
        return scaled_dot_product_attention(q, k, v, causal, dropout_p, training, device="cuda")
    out, lse = fused_cuda.attention(q.data, k.data, v.data, causal)

    def backward(g):
        dq, dk, dv = fused_cuda.attention_backward(q.data, k.data, v.data, out, lse,
                                                   g.astype(np.float32, copy=False), causal)
        return (dq if q.requires_grad else None, dk if k.requires_grad else None, dv if v.requires_grad else None)

    return operation("attention", out, (q, k, v), backward)


def cuda_cross_entropy(logits, targets, ignore_index=None):
    """F.cross_entropy on the kernels of `fused_cuda`: each row's loss and lse in the forward, the
    gradient (softmax - onehot) * dloss / count in the backward, from the logits and targets left on
    the device by the forward. Targets are checked on the host first, by the engine's own version
    when one is wrong, so the messages are the engine's."""
    default = F.cross_entropy.default
    t = np.asarray(targets.data if isinstance(targets, Tensor) else targets)
    if (not isinstance(logits, Tensor) or logits.ndim == 0 or not np.issubdtype(t.dtype, np.integer)
            or t.shape != logits.shape[:-1] or logits.shape[-1] == 0 or not _Cuda.supports(logits.data)):
        return default(logits, targets, ignore_index)
    c = logits.shape[-1]
    keep = np.ones(t.shape, dtype=bool) if ignore_index is None else t != ignore_index
    count = int(np.count_nonzero(keep))
    if count == 0 or (keep & ((t < 0) | (t >= c))).any():
        return default(logits, targets, ignore_index)  # it raises, naming the problem
    ignore = -1 if ignore_index is None else int(ignore_index)  # every target is in range: -1 ignores none
    x = _cuda.to_device(np.ascontiguousarray(logits.data).reshape(-1, c))
    t_dev = _cuda.to_device(t.reshape(-1).astype(np.int64))
    losses, lse = fused_cuda.cross_entropy_forward_device(x, t_dev, ignore)
    loss = np.asarray(losses.copy_to_host().astype(np.float64).sum() / count, dtype=logits.dtype)

    def backward(g):
        scale = _cuda.to_device(np.array([float(g) / count], np.float32))
        grad = fused_cuda.cross_entropy_backward_device(x, t_dev, lse, ignore, scale)
        return grad.copy_to_host().reshape(logits.shape)

    return operation("cross_entropy", loss, (logits,), backward)


# ----- swapping them into the engine -----------------------------------------------------------------------------
OPERATIONS = {"matmul": matmul, "linear": linear, "softmax": softmax, "layer_norm": layer_norm,
              "scaled_dot_product_attention": scaled_dot_product_attention, "selective_scan": selective_scan}

# On the CPU, the fused operations of `course.kernels.fused` (lesson 6.5) take over attention
# (by tiles, with an online softmax), add the ones the engine has only there (the residual add
# with its layer norm, bias + GELU, cross-entropy) and make the optimizer step one kernel call.
FUSED = {"scaled_dot_product_attention": fused.attention, "add_layer_norm": fused.add_layer_norm,
         "linear_gelu": fused.linear_gelu, "cross_entropy": fused.cross_entropy,
         "optimizer_step": fused.optimizer_step, "clip_grad_norm_": fused.clip_grad_norm_}

# On "cuda", attention by tiles and cross-entropy run on the fused kernels of `fused_cuda`.
FUSED_CUDA = {"scaled_dot_product_attention": cuda_attention, "cross_entropy": cuda_cross_entropy}


def replacements(device):
    """{operation name: implementation} that `use_kernels(device)` swaps in."""
    import course.mamba  # noqa: F401  (registers selective_scan, so that it can be swapped too)
    import course.optim  # noqa: F401  (registers the optimizer step)

    known = set(dispatch.names())
    chosen = {name: functools.partial(op, device=device) for name, op in OPERATIONS.items()}
    if device == "cpu":
        chosen.update(FUSED)
    if device == "cuda":
        chosen.update(FUSED_CUDA)
    return {name: op for name, op in chosen.items() if name in known}


@contextmanager
def use_kernels(device):
    """Inside `with use_kernels("cpu"):` (or "cuda") the engine's matmul, linear, softmax,
    layer_norm, attention and Mamba's selective_scan run on this package's kernels; on "cpu" also
    the fused operations (attention by tiles, add + layer norm, bias + GELU, cross-entropy, the
    optimizer step and gradient clipping) of `course.kernels.fused`; on "cuda" attention by tiles
    and cross-entropy of `course.kernels.fused_cuda`."""
    _lib(device)  # an unknown device is refused here, before anything changes
    _said["float64"] = False
    with dispatch.override(replacements(device)):
        yield
