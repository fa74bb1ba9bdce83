"""The "cuda" device of the tensor engine: arrays that live on the GPU, and the kernels they run on.

`Tensor.to("cuda")` puts a tensor's numbers in a `CudaArray`. Like MiniTorch's tensor storage, it
is one flat buffer on the device (a numba device array, on a real GPU or on the simulator) plus
the layout that says where element (i, j, ...) lives:

    element (i0, i1, ...)  is at  buffer[offset + i0 * strides[0] + i1 * strides[1] + ...]

So a transpose, a reshape of contiguous numbers, a slice or a broadcast only make a new layout
over the same buffer: no kernel runs, nothing is copied. A broadcast axis has stride 0.

A CudaArray answers NumPy's own protocols: `a + b`, `np.exp(a)`, `a.sum(axis=0)`,
`np.where(m, a, b)`, `a[idx]` ... each call launches kernels. That is why the engine's operations
(`course.tensor`, written once with NumPy expressions) run on the device without a line changed.
Everything is composed from a few primitive kernels (`course.kernels.primitives`):
- map and zip: one function applied element by element to one, two or three arrays of any layouts,
  broadcast against each other (the ufuncs: add, multiply, exp, tanh, where, ...);
- reduce: sum, max or min over axes;
- matmul (batched), gather (rows picked by index) and scatter-add (the gradient of a gather,
  with atomics, because a repeated index sends two rows to one place).
The operations that deserve one kernel of their own (softmax, layer norm, attention,
cross-entropy, the scan, the optimizer step) are in `course.kernels.device_ops`.

Numbers cross between host and device only in `Tensor.to`, `.numpy()`, `.item()` and when a batch
of indices comes in; each copy is counted: `transfers()`, `reset_transfers()`. Anything that would
need the numbers on the host (`np.asarray(a)`, `float(a)`, `if a > 0:`) is an error that says so,
never a silent copy. Freed buffers are kept and reused (a caching allocator, as PyTorch's): asking
the driver for memory at every operation would cost more than many kernels.
"""

import math
import numbers
import weakref
from collections import defaultdict

import numpy as np
from numpy.lib.mixins import NDArrayOperatorsMixin

from ..tensor import device as _engine_device
from . import primitives as P
from ._backend import cuda

# ----- the transfer counter ---------------------------------------------------------------------------
_transfers = {"to_device": [0, 0], "to_host": [0, 0]}


def transfers():
    """Host-device copies since the last `reset_transfers()`:
    {"to_device": {"count": n, "bytes": b}, "to_host": {"count": n, "bytes": b}}."""
    return {way: {"count": c, "bytes": b} for way, (c, b) in _transfers.items()}


def reset_transfers():
    for counts in _transfers.values():
        counts[:] = [0, 0]


def _count(way, nbytes):
    _transfers[way][0] += 1
    _transfers[way][1] += int(nbytes)


# ----- the caching allocator ----------------------------------------------------------------------------
_pool = defaultdict(list)  # (dtype, number of elements) -> free buffers


def _buffer(n, dtype):
    free = _pool[(dtype, n)]
    return free.pop() if free else cuda.device_array(max(n, 1), dtype=dtype)


def _release(buffer, dtype, n):
    _pool[(dtype, n)].append(buffer)


def empty_cache():
    """Give the kept buffers back to the driver."""
    _pool.clear()


# ----- layouts ------------------------------------------------------------------------------------------------
def _contiguous_strides(shape):
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


def _normalise_axis(axis, ndim, what="axis"):
    if not -ndim <= axis < max(ndim, 1):
        raise np.exceptions.AxisError(f"{what} {axis} is out of bounds for an array of {ndim} axes")
    return axis % max(ndim, 1)


def _broadcast_shape(*shapes):
    try:
        return np.broadcast_shapes(*shapes)
    except ValueError:
        raise ValueError(f"shapes {' and '.join(str(s) for s in shapes)} cannot be broadcast together") from None


class CudaArray(NDArrayOperatorsMixin):
    """An n-dimensional array on the device: a flat buffer, a shape, strides and an offset."""

    __array_priority__ = 2000
    __slots__ = ("buffer", "shape", "dtype", "strides", "offset", "_owner", "known_range", "__weakref__")

    def __init__(self, buffer, shape, dtype, strides=None, offset=0, owner=None):
        self.buffer = buffer  # a 1-D numba device array
        self.shape = tuple(int(n) for n in shape)
        self.dtype = np.dtype(dtype)
        self.strides = tuple(strides) if strides is not None else _contiguous_strides(self.shape)
        self.offset = int(offset)
        # A view keeps the array that owns the buffer alive; the owner gives the buffer back to
        # the pool when the last view of it is gone.
        self._owner = owner
        self.known_range = None  # (min, max) of integers copied from the host: indices are checked without a copy back

    @classmethod
    def empty(cls, shape, dtype=np.float32):
        shape = tuple(int(n) for n in shape)
        n = math.prod(shape)
        dtype = np.dtype(dtype)
        buffer = _buffer(n, dtype)
        out = cls(buffer, shape, dtype)
        # When the array is gone, its buffer goes back to the pool. A finalizer, not __del__: it
        # holds the buffer itself, so the garbage collector never frees the device memory of a
        # buffer that a __del__ would then bring back into the pool (numba frees memory in
        # finalizers of its own).
        weakref.finalize(out, _release, buffer, dtype, n)
        return out

    # ----- what NumPy arrays have ----------------------------------------------------------------------
    device = "cuda"
    ndim = property(lambda self: len(self.shape))
    size = property(lambda self: math.prod(self.shape))
    itemsize = property(lambda self: self.dtype.itemsize)
    nbytes = property(lambda self: self.size * self.dtype.itemsize)
    T = property(lambda self: self.transpose())

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of a 0-d array")
        return self.shape[0]

    def __repr__(self):
        return f"CudaArray(shape={self.shape}, dtype={self.dtype})"

    def is_contiguous(self):
        return all(s == c for s, c, n in zip(self.strides, _contiguous_strides(self.shape), self.shape) if n > 1)

    def view(self, shape, strides, offset):
        return CudaArray(self.buffer, shape, self.dtype, strides, offset, owner=self._owner if self._owner is not None else self)

    def raw(self):
        """The numbers as a C-contiguous numba device array of this shape (a kernel's argument)."""
        a = self if self.is_contiguous() else self.copy()
        flat = a.buffer[a.offset:a.offset + a.size] if a.size else a.buffer[:0]
        raw = flat.reshape(a.shape) if a.shape else flat.reshape((1,))
        raw.course_owner = a  # the buffer stays out of the pool while the kernel argument lives
        return raw

    def _layout(self):
        return self.buffer, self.offset, self.strides

    # ----- copies to the host: explicit only ----------------------------------------------------------------
    def get(self):
        """The numbers copied to the host, as a NumPy array (counted by `transfers()`)."""
        a = self if self.is_contiguous() else self.copy()
        host = a.raw().copy_to_host() if a.size else np.empty(a.shape, a.dtype)
        _count("to_host", a.nbytes)
        return host.reshape(a.shape)

    def item(self):
        if self.size != 1:
            raise ValueError(f"item(): only an array of one element has one number; this one has shape {self.shape}")
        return self.get().item()

    def __array__(self, dtype=None, copy=None):
        raise TypeError("this array lives on the GPU (device 'cuda'): NumPy cannot read it without a copy. "
                        "Copy it on purpose with tensor.numpy() or .item(), or move it with .to('cpu')")

    def __bool__(self):
        raise TypeError("the truth of an array on the GPU needs its numbers on the host: copy them on purpose "
                        "with .item() (or keep the decision on the device, with np.where)")

    def __float__(self):
        raise TypeError("float() of an array on the GPU needs a copy to the host: use .item()")

    __int__ = __index__ = __float__

    # ----- views: a new layout, nothing copied ------------------------------------------------------------
    def reshape(self, *shape, order="C"):
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        shape = list(int(n) for n in shape)
        if shape.count(-1) > 1:
            raise ValueError("reshape: only one axis can be -1")
        if -1 in shape:
            known = math.prod(n for n in shape if n != -1)
            if known == 0 or self.size % known:
                raise ValueError(f"cannot reshape an array of size {self.size} into shape {tuple(shape)}")
            shape[shape.index(-1)] = self.size // known
        shape = tuple(shape)
        if math.prod(shape) != self.size:
            raise ValueError(f"cannot reshape an array of size {self.size} into shape {shape}")
        a = self if self.is_contiguous() else self.copy()
        return a.view(shape, _contiguous_strides(shape), a.offset)

    def transpose(self, *axes):
        if len(axes) == 1 and isinstance(axes[0], (tuple, list, np.ndarray)):
            axes = tuple(int(a) for a in axes[0])
        axes = tuple(a % max(self.ndim, 1) for a in axes) or tuple(reversed(range(self.ndim)))
        if sorted(axes) != list(range(self.ndim)):
            raise ValueError(f"transpose: axes {axes} do not match an array of {self.ndim} axes")
        return self.view([self.shape[a] for a in axes], [self.strides[a] for a in axes], self.offset)

    def swapaxes(self, a, b):
        axes = list(range(self.ndim))
        a, b = _normalise_axis(a, self.ndim), _normalise_axis(b, self.ndim)
        axes[a], axes[b] = axes[b], axes[a]
        return self.transpose(axes)

    def broadcast_to(self, shape):
        shape = tuple(shape)
        extra = len(shape) - self.ndim
        if extra < 0:
            raise ValueError(f"cannot broadcast shape {self.shape} to {shape}")
        strides = [0] * extra
        for n, have, step in zip(shape[extra:], self.shape, self.strides):
            if have == n:
                strides.append(step)
            elif have == 1:
                strides.append(0)
            else:
                raise ValueError(f"cannot broadcast shape {self.shape} to {shape}")
        return self.view(shape, strides, self.offset)

    def expand_dims(self, axis):
        axes = (axis,) if isinstance(axis, numbers.Integral) else tuple(axis)
        ndim = self.ndim + len(axes)
        axes = sorted(_normalise_axis(a, ndim) for a in axes)
        shape, strides = list(self.shape), list(self.strides)
        for a in axes:
            shape.insert(a, 1)
            strides.insert(a, 0)
        return self.view(shape, strides, self.offset)

    def squeeze(self, axis=None):
        axes = [i for i, n in enumerate(self.shape) if n == 1] if axis is None else \
            [_normalise_axis(a, self.ndim) for a in ((axis,) if isinstance(axis, numbers.Integral) else axis)]
        keep = [i for i in range(self.ndim) if i not in axes]
        return self.view([self.shape[i] for i in keep], [self.strides[i] for i in keep], self.offset)

    def __getitem__(self, index):
        index = index if isinstance(index, tuple) else (index,)
        arrays = [i for i in index if isinstance(i, (CudaArray, np.ndarray, list))]
        if arrays:
            if len(index) == 1 or (len(index) == 2 and index[1] == slice(None)) and not isinstance(index[0], bool):
                return take_rows(self, index[0])
            raise IndexError("indexing an array on the GPU takes integers, slices, None and ..., or one "
                             "integer array on the first axis (rows picked by index)")
        return self._basic_view(index)

    def _basic_view(self, index):
        if sum(i is Ellipsis for i in index) > 1:
            raise IndexError("an index can only have one ellipsis (...)")
        used = sum(1 for i in index if i is not None and i is not Ellipsis)
        if used > self.ndim:
            raise IndexError(f"too many indices for an array of {self.ndim} axes")
        if Ellipsis in index:
            at = index.index(Ellipsis)
            index = index[:at] + (slice(None),) * (self.ndim - used) + index[at + 1:]
        else:
            index = index + (slice(None),) * (self.ndim - used)
        shape, strides, offset, axis = [], [], self.offset, 0
        for i in index:
            if i is None:
                shape.append(1)
                strides.append(0)
                continue
            n, step = self.shape[axis], self.strides[axis]
            if isinstance(i, slice):
                start, stop, stride = i.indices(n)
                count = len(range(start, stop, stride))
                shape.append(count)
                strides.append(step * stride)
                offset += start * step if count else 0
            elif isinstance(i, numbers.Integral):
                if not -n <= i < n:
                    raise IndexError(f"index {i} is out of bounds for axis {axis} with size {n}")
                offset += (i % n) * step
            else:
                raise IndexError(f"indexing an array on the GPU with a {type(i).__name__} is not supported")
            axis += 1
        return self.view(shape, strides, offset)

    def __setitem__(self, index, value):
        index = index if isinstance(index, tuple) else (index,)
        if any(isinstance(i, (CudaArray, np.ndarray, list)) for i in index):
            raise IndexError("assigning to an array on the GPU takes integers, slices, None and ... "
                             "(for adding rows by index use np.add.at)")
        target = self._basic_view(index)
        P.elementwise("copy", target, [_operand(value, target.dtype)])

    # ----- copies and casts on the device ------------------------------------------------------------
    def copy(self):
        out = CudaArray.empty(self.shape, self.dtype)
        P.elementwise("copy", out, [self])
        return out

    def astype(self, dtype, copy=True):
        dtype = np.dtype(dtype)
        if dtype == self.dtype and not copy:
            return self
        out = CudaArray.empty(self.shape, dtype)
        P.elementwise("copy", out, [self])
        return out

    def fill(self, value):
        P.elementwise("copy", self, [_operand(value, self.dtype)])

    # ----- reductions ---------------------------------------------------------------------------------------
    def sum(self, axis=None, dtype=None, out=None, keepdims=False):
        return _reduce("sum", self, axis, keepdims, dtype, out)

    def max(self, axis=None, out=None, keepdims=False):
        return _reduce("max", self, axis, keepdims, None, out)

    def min(self, axis=None, out=None, keepdims=False):
        return _reduce("min", self, axis, keepdims, None, out)

    def mean(self, axis=None, dtype=None, out=None, keepdims=False):
        total = _reduce("sum", self, axis, keepdims, dtype if dtype is not None else _float_of(self.dtype), None)
        count = self.size // max(total.size, 1) if self.size else 0
        return np.true_divide(total, count, out=out, dtype=total.dtype)

    def any(self, axis=None, keepdims=False):
        return _reduce("max", self.astype(np.bool_), axis, keepdims, None, None)

    def all(self, axis=None, keepdims=False):
        return _reduce("min", self.astype(np.bool_), axis, keepdims, None, None)

    # ----- NumPy's protocols: ufuncs and functions -------------------------------------------------------
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if ufunc is np.matmul and method == "__call__":
            return matmul(*inputs, **kwargs)
        if method == "at" and ufunc is np.add:
            return scatter_add(*inputs)
        if method != "__call__" or ufunc.__name__ not in P.UFUNCS:
            raise TypeError(f"np.{ufunc.__name__}{'' if method == '__call__' else '.' + method} is not "
                            f"implemented for arrays on the GPU")
        return _ufunc(ufunc, inputs, **kwargs)

    def __array_function__(self, func, types, args, kwargs):
        handler = _FUNCTIONS.get(func)
        if handler is None:
            raise TypeError(f"np.{func.__name__} is not implemented for arrays on the GPU; copy the array to the "
                            f"host on purpose (tensor.numpy()) if you need it there")
        return handler(*args, **kwargs)


def _float_of(dtype):
    return dtype if np.issubdtype(dtype, np.floating) else np.dtype(np.float64)


# ----- operands: device arrays, or numbers passed to the kernel by value ---------------------------------------
def _is_number(x):
    return isinstance(x, (numbers.Number, np.generic)) or (isinstance(x, np.ndarray) and x.ndim == 0)


def _operand(x, dtype=None):
    """A device array, or a number (a Python or NumPy scalar, or a 0-d NumPy array: sent by value)."""
    if isinstance(x, CudaArray):
        return x
    if _is_number(x):
        value = x.item() if isinstance(x, (np.ndarray, np.generic)) else x
        return np.dtype(dtype if dtype is not None else np.asarray(x).dtype).type(value)
    if isinstance(x, np.ndarray):
        raise RuntimeError(f"an array on the GPU (device 'cuda') and a NumPy array of shape {x.shape} (device "
                           f"'cpu') in one operation: move them to one device first")
    raise TypeError(f"an array on the GPU cannot be combined with a {type(x).__name__}")


def _weak(x):
    """What NumPy's type promotion sees: a Python number is 'weak' (float32 * 0.5 stays float32)."""
    if isinstance(x, CudaArray):
        return x.dtype
    if isinstance(x, bool):
        return bool
    if isinstance(x, numbers.Integral) and not isinstance(x, np.generic):
        return int
    if isinstance(x, numbers.Real) and not isinstance(x, np.generic):
        return float
    return np.asarray(x).dtype


def _ufunc(ufunc, inputs, out=None, dtype=None, **kwargs):
    if kwargs.get("where", True) is not True or kwargs.get("casting", "same_kind") != "same_kind":
        raise TypeError(f"np.{ufunc.__name__}: the arguments where= and casting= are not supported on the GPU")
    for x in inputs:
        if isinstance(x, np.ndarray) and x.ndim:
            raise RuntimeError(f"np.{ufunc.__name__}: an array on the GPU (device 'cuda') and a NumPy array of "
                               f"shape {x.shape} (device 'cpu'): move them to one device first")
    if dtype is not None:
        types = (np.dtype(dtype),) * ufunc.nin
        result = ufunc.resolve_dtypes(types + (None,))[-1]
    else:
        resolved = ufunc.resolve_dtypes(tuple(_weak(x) for x in inputs) + (None,))
        types, result = resolved[:-1], resolved[-1]
    operands = [_operand(x, t) for x, t in zip(inputs, types)]
    shape = _broadcast_shape(*(np.shape(x) if not isinstance(x, CudaArray) else x.shape
                               for x in operands))
    if out is not None:
        out = out[0] if isinstance(out, tuple) else out
        if not isinstance(out, CudaArray):
            raise TypeError(f"np.{ufunc.__name__}: out= must be an array on the GPU")
        if out.shape != shape:
            raise ValueError(f"np.{ufunc.__name__}: out has shape {out.shape}, the result {shape}")
    else:
        out = CudaArray.empty(shape, result)
    P.elementwise(ufunc.__name__, out, operands)
    return out


# ----- reductions -------------------------------------------------------------------------------------------------
def _reduce(op, a, axis, keepdims, dtype, out):
    axes = tuple(range(a.ndim)) if axis is None else \
        tuple(sorted({_normalise_axis(ax, a.ndim) for ax in ((axis,) if isinstance(axis, numbers.Integral) else axis)}))
    kept = [i for i in range(a.ndim) if i not in axes]
    rows = math.prod(a.shape[i] for i in kept)
    length = math.prod(a.shape[i] for i in axes)
    if length == 0 and op != "sum":
        raise ValueError(f"{op} of an empty array has no value")
    result_dtype = np.dtype(dtype) if dtype is not None else \
        (np.dtype(np.int64) if op == "sum" and (a.dtype == np.bool_ or np.issubdtype(a.dtype, np.integer)) else a.dtype)
    # The reduced axes last, as rows of `length` contiguous numbers (a copy only if the layout needs one).
    moved = a.transpose(kept + list(axes))
    flat = moved.reshape(rows, length) if length else None
    result = CudaArray.empty((rows,), result_dtype)
    if rows:
        if length:
            P.reduce_rows(op, flat, result)
        else:
            result.fill(0)
    shape = tuple(1 if i in axes else n for i, n in enumerate(a.shape)) if keepdims else \
        tuple(a.shape[i] for i in kept)
    result = result.reshape(shape)
    if out is not None:
        out[...] = result
        return out
    return result


# ----- matmul -----------------------------------------------------------------------------------------------------
def matmul(a, b, out=None, **kwargs):
    """a @ b as NumPy's matmul: batched over leading axes, which broadcast."""
    for x in (a, b):
        if not isinstance(x, CudaArray):
            raise _engine_device.mismatch("@", ("cuda", "cpu"))
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError("matmul: both operands need at least one axis")
    vector_a, vector_b = a.ndim == 1, b.ndim == 1  # as NumPy: a vector is a 1-row / 1-column matrix, then squeezed
    if vector_a:
        a = a.expand_dims(0)
    if vector_b:
        b = b.expand_dims(-1)
    (m, k), (k2, n) = a.shape[-2:], b.shape[-2:]
    if k != k2:
        raise ValueError(f"matmul: shapes {a.shape} and {b.shape} do not match: the inner dimensions {k} and {k2} differ")
    dtype = np.result_type(a.dtype, b.dtype)
    batch = _broadcast_shape(a.shape[:-2], b.shape[:-2])
    count = math.prod(batch)
    if count > 1 and b.ndim == 2 and a.ndim > 2:
        # (..., m, k) @ (k, n): one product of all rows of a, (count * m, k) @ (k, n).
        c = matmul(a.reshape(count * m, k), b).reshape(*batch, m, n)
    else:
        a3 = _contiguous(a.broadcast_to(batch + (m, k)), dtype).reshape(count, m, k)
        b3 = _contiguous(b.broadcast_to(batch + (k, n)), dtype).reshape(count, k, n)
        c = CudaArray.empty((count, m, n), dtype)
        P.matmul(a3, b3, c)
        c = c.reshape(*batch, m, n)
    if vector_b:
        c = c.squeeze(-1)
    if vector_a:
        c = c.squeeze(-1 if vector_b else -2)
    if out is not None:
        out = out[0] if isinstance(out, tuple) else out
        out[...] = c
        return out
    return c


def _contiguous(a, dtype):
    return a if a.is_contiguous() and a.dtype == dtype else a.astype(dtype)


# ----- gather and scatter-add: rows picked by index, and the gradient of that -----------------------------------------
def _indices(index, rows):
    """Integer indices on the device, checked against `rows` where their range is known."""
    if isinstance(index, list):
        index = np.asarray(index)
    if isinstance(index, np.ndarray):  # a batch of indices coming in from the host: checked there, then copied
        if not np.issubdtype(index.dtype, np.integer):
            raise IndexError(f"indices must be integers, got dtype {index.dtype}")
        index = to_device(index.astype(np.int64, copy=False))
    if not np.issubdtype(index.dtype, np.integer):
        raise IndexError(f"indices must be integers, got dtype {index.dtype}")
    low, high = index.known_range or (0, 0)
    if index.known_range is not None and index.size and (low < -rows or high >= rows):
        bad = high if high >= rows else low
        raise IndexError(f"index {bad} is out of bounds for an axis of size {rows}")
    return index


def take_rows(table, index):
    """table[index] for integer indices (any shape) picking rows of `table`."""
    index = _indices(index, table.shape[0])
    out = CudaArray.empty(index.shape + table.shape[1:], table.dtype)
    if out.size:
        width = math.prod(table.shape[1:])
        P.gather(_contiguous(table, table.dtype).reshape(table.shape[0], width),
                 _contiguous(index, np.dtype(np.int64)).reshape(-1), out.reshape(index.size, width))
    return out


def scatter_add(target, index, values):
    """np.add.at(target, index, values): adds each row of values into the row of target that its
    index names; repeated indices add up (atomics on the device)."""
    if isinstance(index, tuple):
        if len(index) != 1:
            raise IndexError("np.add.at on the GPU takes one integer array of row indices")
        index = index[0]
    index = _indices(index, target.shape[0])
    if not target.is_contiguous():
        raise ValueError("np.add.at on the GPU needs a contiguous target")
    width = math.prod(target.shape[1:])
    values = _operand(values, target.dtype)
    if not isinstance(values, CudaArray):
        raise TypeError("np.add.at on the GPU takes an array of values")
    values = _contiguous(values.broadcast_to(index.shape + target.shape[1:]), target.dtype)
    if index.size:
        P.scatter_add(target.reshape(target.shape[0], width), _contiguous(index, np.dtype(np.int64)).reshape(-1),
                      values.reshape(index.size, width))


# ----- NumPy functions ---------------------------------------------------------------------------------------------
def _like(fill):
    def make(a, dtype=None, order="K", subok=True, shape=None, **kwargs):
        out = CudaArray.empty(a.shape if shape is None else ((shape,) if isinstance(shape, int) else shape),
                              a.dtype if dtype is None else dtype)
        if fill is not None:
            out.fill(fill)
        return out
    return make


def _full_like(a, fill_value, dtype=None, shape=None, **kwargs):
    out = CudaArray.empty(a.shape if shape is None else shape, a.dtype if dtype is None else dtype)
    out.fill(fill_value)
    return out


def _where(condition, a=None, b=None):
    if a is None or b is None:
        raise TypeError("np.where(condition) (the positions) is not implemented on the GPU")
    dtype = np.result_type(_weak(a), _weak(b))
    ops = [_operand(condition, np.bool_), _operand(a, dtype), _operand(b, dtype)]
    shape = _broadcast_shape(*(o.shape if isinstance(o, CudaArray) else () for o in ops))
    out = CudaArray.empty(shape, dtype)
    P.elementwise("where", out, ops)
    return out


def _concatenate(arrays, axis=0, out=None, dtype=None, **kwargs):
    arrays = [a if isinstance(a, CudaArray) else _need_device(a, "concatenate") for a in arrays]
    first = arrays[0]
    axis = _normalise_axis(axis, first.ndim)
    shape = list(first.shape)
    shape[axis] = sum(a.shape[axis] for a in arrays)
    result = CudaArray.empty(shape, dtype or np.result_type(*[a.dtype for a in arrays]))
    start = 0
    for a in arrays:
        index = (slice(None),) * axis + (slice(start, start + a.shape[axis]),)
        result[index] = a
        start += a.shape[axis]
    return result


def _need_device(a, name):
    if isinstance(a, np.ndarray):
        raise _engine_device.mismatch(f"np.{name}", ("cuda", "cpu"))
    raise TypeError(f"np.{name}: expected arrays on the GPU, got a {type(a).__name__}")


def _stack(arrays, axis=0, out=None, **kwargs):
    arrays = [a if isinstance(a, CudaArray) else _need_device(a, "stack") for a in arrays]
    axis = _normalise_axis(axis, arrays[0].ndim + 1)
    return _concatenate([a.expand_dims(axis) for a in arrays], axis=axis)


def _split(a, indices_or_sections, axis=0):
    axis = _normalise_axis(axis, a.ndim)
    n = a.shape[axis]
    if isinstance(indices_or_sections, numbers.Integral):
        if n % indices_or_sections:
            raise ValueError("array split does not result in an equal division")
        step = n // indices_or_sections
        cuts = list(range(step, n, step))
    else:
        cuts = [int(i) for i in indices_or_sections]
    edges = [0] + cuts + [n]
    return [a[(slice(None),) * axis + (slice(lo, hi),)] for lo, hi in zip(edges[:-1], edges[1:])]


def _einsum(subscripts, *operands, **kwargs):
    """The contractions the engine uses: a dot product per row."""
    spec = subscripts.replace(" ", "")
    a, b = operands if len(operands) == 2 else (None, None)
    if spec == "...i,...i->...":
        return (a * b).sum(axis=-1)
    if spec == "ij,ij->j":
        return (a * b).sum(axis=0)
    if spec == "ij,ij->i":
        return (a * b).sum(axis=1)
    raise TypeError(f"np.einsum({subscripts!r}) is not implemented on the GPU")


def _moveaxis(a, source, destination):
    source, destination = _normalise_axis(source, a.ndim), _normalise_axis(destination, a.ndim)
    order = [i for i in range(a.ndim) if i != source]
    order.insert(destination, source)
    return a.transpose(order)


_FUNCTIONS = {
    np.zeros_like: _like(0), np.ones_like: _like(1), np.empty_like: _like(None), np.full_like: _full_like,
    np.where: _where, np.concatenate: _concatenate, np.stack: _stack, np.split: _split, np.einsum: _einsum,
    np.broadcast_to: lambda a, shape, subok=False: a.broadcast_to((shape,) if isinstance(shape, int) else shape),
    np.expand_dims: lambda a, axis: a.expand_dims(axis),
    np.squeeze: lambda a, axis=None: a.squeeze(axis),
    np.swapaxes: lambda a, axis1, axis2: a.swapaxes(axis1, axis2),
    np.transpose: lambda a, axes=None: a.transpose(*(axes or ())),
    np.moveaxis: _moveaxis,
    np.reshape: lambda a, shape=None, order="C", **kw: a.reshape(shape if shape is not None else kw["newshape"]),
    np.shape: lambda a: a.shape, np.ndim: lambda a: a.ndim, np.size: lambda a, axis=None: a.size if axis is None else a.shape[axis],
    np.sum: lambda a, axis=None, dtype=None, out=None, keepdims=False, **kw: a.sum(axis, dtype, out, keepdims),
    np.mean: lambda a, axis=None, dtype=None, out=None, keepdims=False, **kw: a.mean(axis, dtype, out, keepdims),
    np.max: lambda a, axis=None, out=None, keepdims=False, **kw: a.max(axis, out, keepdims),
    np.min: lambda a, axis=None, out=None, keepdims=False, **kw: a.min(axis, out, keepdims),
    np.amax: lambda a, axis=None, out=None, keepdims=False, **kw: a.max(axis, out, keepdims),
    np.amin: lambda a, axis=None, out=None, keepdims=False, **kw: a.min(axis, out, keepdims),
    np.vdot: lambda a, b: (a.reshape(-1) * b.reshape(-1)).sum(),
    np.copyto: lambda dst, src, **kw: dst.__setitem__(Ellipsis, src),
    np.result_type: lambda *args: np.result_type(*[a.dtype if isinstance(a, CudaArray) else a for a in args]),
}


# ----- host <-> device ------------------------------------------------------------------------------------------------
def to_device(host):
    """A NumPy array copied to the device (counted by `transfers()`)."""
    host = np.asarray(host)
    if not host.flags.c_contiguous:
        host = host.copy(order="C")  # (np.ascontiguousarray would make a 0-d array 1-d)
    out = CudaArray.empty(host.shape, host.dtype)
    if host.size:
        out.buffer[:host.size].copy_to_device(host.reshape(-1))
        if np.issubdtype(host.dtype, np.integer):
            out.known_range = (int(host.min()), int(host.max()))
    _count("to_device", host.nbytes)
    return out


def to_host(array):
    return array.get()


def _implementations():
    from . import device_ops
    return device_ops.IMPLEMENTATIONS


_engine_device.register(_engine_device.Backend("cuda", CudaArray, to_device, to_host, _implementations()))
