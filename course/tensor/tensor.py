"""A tensor that remembers how it was computed, and backpropagates through NumPy.

The same idea as micrograd's Value, for whole arrays. Every operation is written the same way,
with its forward and its backward side by side:

    def exp(x):
        data = np.exp(x.data)                         # forward: the result, with NumPy

        def backward(g):                              # g: d loss / d result, data's shape
            return g * data                           # d loss / d x, x's shape

        return operation("exp", data, (x,), backward)

`operation(name, data, inputs, backward)` is the public way to add an operation to the engine:
`backward(g)` returns one gradient per input (None for an input that needs none), and the engine
adds each to its input's `.grad`. `course.tensor.functional`, Mamba's selective scan and the GPU
kernels of part 6 are all written with it.

Two rules make arrays harder than scalars:
- Broadcasting. `x + b` with x (32, 10) and b (10,) uses b 32 times, so b's gradient is the sum
  of the 32 rows of the result's gradient: `unbroadcast` sums a gradient back to a shape.
- Aliasing. Gradients are never changed in place, so two tensors may safely share one array.

Devices (part 6): `t.to("cuda")` moves a tensor's numbers to a GPU (or Numba's simulator of one);
there `.data` is a device array that behaves like a NumPy array, so the operations below run
unchanged, each array expression a kernel (see `course.tensor.device`).
"""

from contextlib import contextmanager

import numpy as np

from .. import _graph
from . import device as _device
from .dispatch import dispatchable

_grad_enabled = True


@contextmanager
def no_grad():
    """Inside `with no_grad():` operations record no graph: for evaluation and sampling."""
    global _grad_enabled
    previous, _grad_enabled = _grad_enabled, False
    try:
        yield
    finally:
        _grad_enabled = previous


def is_grad_enabled():
    return _grad_enabled


def unbroadcast(grad, shape):
    """Sum `grad` over the axes that broadcasting added or stretched, so it has `shape`."""
    if grad.shape == shape:
        return grad
    extra = grad.ndim - len(shape)
    if extra > 0:
        grad = grad.sum(axis=tuple(range(extra)))
    stretched = tuple(i for i, n in enumerate(shape) if n == 1 and grad.shape[i] != 1)
    if stretched:
        grad = grad.sum(axis=stretched, keepdims=True)
    return grad


def _numbers_array(data):
    """A Python number or a (nested) list as an array: float32, the dtype the course trains in."""
    if data is None:
        raise TypeError("Tensor(None): a Tensor needs numbers (a number, a nested list or a NumPy array)")
    if isinstance(data, np.generic):
        return np.asarray(data)
    if _is_value(data):
        raise TypeError(_mixed_error(data))
    try:
        return np.asarray(data, dtype=np.float32)
    except (TypeError, ValueError) as err:
        raise TypeError(f"a Tensor needs numbers (a number, a nested list or a NumPy array): {err}") from None


def _is_value(x):
    # micrograd's Value, or one like it (a number, the common case, fails the first test)
    return hasattr(x, "_prev") and all(hasattr(x, a) for a in ("_op", "data", "grad"))


def _mixed_error(other):
    if _is_value(other):
        return ("a micrograd Value cannot be mixed with a Tensor: a Value is one number with its own graph. "
                "Use Tensor(value.data) for its number, or build the whole computation from Tensors")
    return f"a Tensor works with numbers, arrays and Tensors, not with a {type(other).__name__}"


def _shape_error(op, a, b, why="cannot be broadcast together"):
    return ValueError(f"{op}: shapes {a.shape} and {b.shape} {why}")


def operation(name, data, inputs, backward):
    """The result of an operation named `name`, recorded so that gradients can flow back through it.

    data:     the result, an array computed from the inputs' arrays (the forward pass).
    inputs:   the tensors it was computed from (None where an optional input is absent).
    backward: `backward(g)` gets the gradient of the loss with respect to the result (an array of
              data's shape) and returns the gradients with respect to the inputs: a tuple with one
              array (or None) per input, each of that input's shape. With one input it may return
              the array alone. It is called only when some input requires a gradient.

    The backward function must not refer to the result tensor (only to arrays and inputs): the
    result holds its backward, so that would make a reference cycle that only the garbage
    collector could free.
    """
    out = Tensor.__new__(Tensor)
    out.data = data if _device.is_array(data) else np.asarray(data)
    out.grad = None
    out.label = ""
    out.op = name
    needs = _grad_enabled and any(t is not None and t.requires_grad for t in inputs)
    out.requires_grad = needs
    out.inputs = tuple(inputs) if needs else ()
    out._backward = backward if needs else None
    return out


class Tensor:
    """An n-dimensional array with a gradient.

    `Tensor(data, requires_grad=False)` keeps the dtype of a NumPy array it is given; Python
    numbers and lists become float32, the dtype the course trains in. A tensor made by an
    operation knows its `op` (a name) and its `inputs`.
    """

    __slots__ = ("data", "grad", "requires_grad", "inputs", "op", "_backward", "label", "__weakref__")
    __array_priority__ = 1000  # `ndarray + Tensor` calls Tensor.__radd__ instead of NumPy's add

    def __init__(self, data, requires_grad=False, label=""):
        if isinstance(data, Tensor):
            data = data.data
        if not _device.is_array(data):
            data = _numbers_array(data)
        if data.dtype == object:
            raise TypeError("a Tensor holds numbers, and this array holds Python objects (dtype object): "
                            "convert it to numbers first")
        if requires_grad and not np.issubdtype(data.dtype, np.floating):
            raise TypeError(f"only floating-point tensors can require gradients, got dtype {data.dtype}")
        self.data = data
        self.grad = None
        self.requires_grad = bool(requires_grad)
        self.inputs = ()
        self._backward = None
        self.op = ""
        self.label = label

    # ----- a few conveniences ---------------------------------------------------------------
    shape = property(lambda self: self.data.shape)
    dtype = property(lambda self: self.data.dtype)
    ndim = property(lambda self: self.data.ndim)
    size = property(lambda self: self.data.size)

    def __len__(self):
        return len(self.data)

    def __repr__(self):
        body = np.array2string(self.numpy(), precision=4, separator=", ", threshold=50)
        where = f", device={self.device!r}" if self.device != "cpu" else ""
        grad = ", requires_grad=True" if self.requires_grad else ""
        return f"Tensor({body}{where}{grad})"

    def item(self):
        """The one number of a one-element tensor, as a Python number (copied to the host)."""
        if self.data.size != 1:
            raise ValueError(f"item(): only a tensor with one element has one number; this one has shape {self.shape}")
        return self.numpy().item()

    def numpy(self):
        """The numbers as a NumPy array: the array itself on the CPU, a copy from a device."""
        return _device.move(self.data, "cpu")

    # ----- devices (part 6) -------------------------------------------------------------------
    @property
    def device(self):
        """Where the numbers live: "cpu", or "cuda" after `.to("cuda")`."""
        return _device.of(self.data)

    def to(self, device):
        """This tensor on `device`: itself if it is there already, else a copy that gradients flow
        back through, to this tensor's device (as PyTorch's `.to`)."""
        if device != "cpu":
            _device.get(device)  # an unknown device is named here
        source = self.device
        if device == source:
            return self
        return operation(f"to({device})", _device.move(self.data, device), (self,),
                         lambda g: _device.move(g, source))

    def detach(self):
        """The same data, cut from the graph."""
        return Tensor(self.data)

    def astype(self, dtype):
        source = self.data.dtype
        return operation("astype", self.data.astype(dtype), (self,), lambda g: g.astype(source))

    def _lift(self, other, op="operation"):
        """Wrap a number or array as a constant tensor of this tensor's dtype (float32 stays float32)."""
        if isinstance(other, Tensor):
            if other.device != self.device and not (_is_number(other) or _is_number(self)):
                raise _device.mismatch(op, (self.device, other.device))
            return other
        if other is None or _is_value(other):
            raise TypeError(_mixed_error(other))
        if self.device != "cpu" and np.ndim(other) > 0:
            raise _device.mismatch(op, (self.device, "cpu"))
        if self.data.dtype.kind != "f":
            # An integer tensor times 0.5 must not truncate 0.5 to 0: let NumPy promote.
            return Tensor(np.asarray(other))
        return Tensor(np.asarray(other, dtype=self.data.dtype))

    def _accumulate(self, g):
        """Add `g` to this tensor's gradient. Used twice, a tensor gets the sum of both uses."""
        if self.grad is None:
            # A leaf (a parameter) gets its own copy: optimizers may change it in place.
            self.grad = _own_copy(g, self.data.dtype) if not self.inputs else g
        else:
            self.grad = self.grad + g

    # ----- backpropagation ------------------------------------------------------------------
    def backward(self, grad=None):
        """Fill `.grad` of every tensor this one depends on.

        `grad` is the gradient of the final result with respect to this tensor; it may be left
        out only for a tensor with one element (a loss), where it is 1. Leaf gradients accumulate
        over calls (call `zero_grad` between steps); intermediate ones are recomputed each call.
        """
        if not self.requires_grad:
            raise RuntimeError("backward(): this tensor does not depend on any tensor with requires_grad=True")
        if grad is None:
            if self.data.size != 1:
                raise RuntimeError(f"backward() on a tensor of shape {self.shape} needs a gradient of that "
                                   f"shape: only a single-element tensor (a loss) can start backpropagation alone")
            grad = np.ones_like(self.data)
        else:
            grad = grad.data if isinstance(grad, Tensor) else grad
            grad = _device.move(grad if _device.is_array(grad) else np.asarray(grad), self.device).astype(self.data.dtype)
            if grad.shape != self.shape:
                raise ValueError(f"backward(): the gradient has shape {grad.shape} but the tensor has shape {self.shape}")
        order = self.topological_order()
        for node in order:
            if node.inputs:
                node.grad = None  # recomputed below; only leaves accumulate across calls
        self._accumulate(grad)
        # Reverse topological order: a tensor's gradient is complete (every use has added its
        # share) before its own backward passes it on to its inputs.
        for node in reversed(order):
            if node._backward is None or node.grad is None:
                continue
            grads = node._backward(node.grad)
            inputs = node.inputs
            if not isinstance(grads, (tuple, list)):
                grads = (grads,)
            if len(grads) != len(inputs):
                raise RuntimeError(f"the backward of operation {node.op!r} returned {len(grads)} gradients "
                                   f"for its {len(inputs)} inputs")
            for i, (t, g) in enumerate(zip(inputs, grads)):
                if g is None or t is None or not t.requires_grad:
                    continue
                if np.shape(g) != t.shape:
                    raise RuntimeError(f"the backward of operation {node.op!r} returned a gradient of shape "
                                       f"{np.shape(g)} for input {i}, which has shape {t.shape}")
                t._accumulate(g)

    def topological_order(self):
        """Every tensor this one depends on, each after its inputs (a loop, not recursion, so
        that a graph 100,000 operations deep does not reach Python's recursion limit)."""
        return _graph.topological_order([self], _inputs)

    # ----- elementwise arithmetic, with broadcasting -----------------------------------------
    def __add__(self, other):
        other = self._lift(other, "+")
        try:
            data = self.data + other.data
        except ValueError:
            raise _shape_error("+", self, other) from None

        def backward(g):
            return (unbroadcast(g, self.shape) if self.requires_grad else None,
                    unbroadcast(g, other.shape) if other.requires_grad else None)

        return operation("+", data, (self, other), backward)

    def __sub__(self, other):
        other = self._lift(other, "-")
        try:
            data = self.data - other.data
        except ValueError:
            raise _shape_error("-", self, other) from None

        def backward(g):
            return (unbroadcast(g, self.shape) if self.requires_grad else None,
                    unbroadcast(-g, other.shape) if other.requires_grad else None)

        return operation("-", data, (self, other), backward)

    def __mul__(self, other):
        other = self._lift(other, "*")
        try:
            data = self.data * other.data
        except ValueError:
            raise _shape_error("*", self, other) from None

        def backward(g):
            return (unbroadcast(g * other.data, self.shape) if self.requires_grad else None,
                    unbroadcast(g * self.data, other.shape) if other.requires_grad else None)

        return operation("*", data, (self, other), backward)

    def __truediv__(self, other):
        other = self._lift(other, "/")
        try:
            data = self.data / other.data
        except ValueError:
            raise _shape_error("/", self, other) from None

        def backward(g):
            # d(a/b)/da = 1/b;  d(a/b)/db = -a/b**2 = -result/b
            return (unbroadcast(g / other.data, self.shape) if self.requires_grad else None,
                    unbroadcast(-g * data / other.data, other.shape) if other.requires_grad else None)

        return operation("/", data, (self, other), backward)

    def __pow__(self, exponent):
        if isinstance(exponent, Tensor):
            return self._pow_tensor(exponent)
        p = exponent
        return operation(f"**{p}", self.data ** p, (self,), lambda g: g * (p * self.data ** (p - 1)))

    def _pow_tensor(self, exponent):
        try:
            data = self.data ** exponent.data
        except ValueError:
            raise _shape_error("**", self, exponent) from None

        def backward(g):
            # d(a**b)/da = b a**(b-1);  d(a**b)/db = a**b log(a)
            e = exponent.data
            return (unbroadcast(g * e * self.data ** (e - 1), self.shape) if self.requires_grad else None,
                    unbroadcast(g * data * np.log(self.data), exponent.shape) if exponent.requires_grad else None)

        return operation("**", data, (self, exponent), backward)

    def __neg__(self):
        return operation("neg", -self.data, (self,), lambda g: -g)

    def __radd__(self, other):
        return self._lift(other) + self

    def __rsub__(self, other):
        return self._lift(other) - self

    def __rmul__(self, other):
        return self._lift(other) * self

    def __rtruediv__(self, other):
        return self._lift(other) / self

    def __rpow__(self, other):
        return self._lift(other) ** self

    # ----- matrix multiplication (a dispatch point: part 6 can run it on its kernels) ---------
    def __matmul__(self, other):
        return matmul(self, self._lift(other, "@"))

    def __rmatmul__(self, other):
        return matmul(self._lift(other, "@"), self)

    # ----- unary functions ------------------------------------------------------------------
    def exp(self):
        data = np.exp(self.data)
        return operation("exp", data, (self,), lambda g: g * data)

    def log(self):
        return operation("log", np.log(self.data), (self,), lambda g: g / self.data)

    def sqrt(self):
        data = np.sqrt(self.data)
        return operation("sqrt", data, (self,), lambda g: g * 0.5 / data)

    def tanh(self):
        data = np.tanh(self.data)
        return operation("tanh", data, (self,), lambda g: g * (1 - data * data))

    def relu(self):
        return operation("relu", np.maximum(self.data, 0), (self,), lambda g: g * (self.data > 0))

    def sigmoid(self):
        # exp of a large positive number overflows, so split by sign: both branches stay finite.
        x = self.data
        e = np.exp(-np.abs(x))
        data = np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype, copy=False)
        return operation("sigmoid", data, (self,), lambda g: g * data * (1 - data))

    # ----- reductions ------------------------------------------------------------------------
    def sum(self, axis=None, keepdims=False):
        def backward(g):
            return np.broadcast_to(_keep_axes(g, axis, keepdims, self.ndim), self.shape)

        return operation("sum", self.data.sum(axis=axis, keepdims=keepdims), (self,), backward)

    def mean(self, axis=None, keepdims=False):
        data = self.data.mean(axis=axis, keepdims=keepdims)
        count = self.data.size // max(np.size(data), 1) if self.data.size else 1

        def backward(g):
            g = _keep_axes(g, axis, keepdims, self.ndim) / count
            return np.broadcast_to(g, self.shape).astype(self.dtype, copy=False)

        return operation("mean", data, (self,), backward)

    def max(self, axis=None, keepdims=False):
        data = self.data.max(axis=axis, keepdims=keepdims)

        def backward(g):
            # The gradient goes to the maximum; ties share it equally.
            top = _keep_axes(data, axis, keepdims, self.ndim)
            mask = (self.data == top).astype(self.dtype)
            mask /= mask.sum(axis=axis, keepdims=True)
            return mask * _keep_axes(g, axis, keepdims, self.ndim)

        return operation("max", data, (self,), backward)

    # ----- shapes ----------------------------------------------------------------------------
    def reshape(self, *shape):
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        try:
            data = self.data.reshape(shape)
        except ValueError:
            raise ValueError(f"reshape: a tensor of shape {self.shape} ({self.size} elements) cannot "
                             f"become shape {shape}") from None
        return operation("reshape", data, (self,), lambda g: g.reshape(self.shape))

    def transpose(self, *axes):
        if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
            axes = tuple(axes[0])
        axes = axes or tuple(reversed(range(self.ndim)))
        if sorted(a % max(self.ndim, 1) for a in axes) != list(range(self.ndim)):
            raise ValueError(f"transpose: axes {axes} are not a permutation of the {self.ndim} axes of shape {self.shape}")
        inverse = np.argsort([a % self.ndim for a in axes])
        return operation("transpose", self.data.transpose(axes), (self,), lambda g: g.transpose(inverse))

    @property
    def T(self):
        return self.transpose()

    def __getitem__(self, index):
        index = _plain_index(index)
        try:
            data = self.data[index]
        except IndexError as err:
            raise IndexError(f"indexing a tensor of shape {self.shape}: {err}") from None
        parts = index if isinstance(index, tuple) else (index,)
        basic = all(isinstance(i, (int, np.integer, slice)) or i is None or i is Ellipsis for i in parts)

        def backward(g):
            grad = np.zeros_like(self.data)
            if basic:
                grad[index] = g  # slices and integers pick each element at most once
            else:
                # np.add.at adds once per occurrence: x[[0, 0]] sends two gradients to x[0].
                np.add.at(grad, index, g)
            return grad

        return operation("getitem", data, (self,), backward)


@dispatchable
def matmul(a, b):
    """a @ b for tensors, as NumPy's matmul: batched, and broadcast over the leading axes."""
    x, y = a.data, b.data
    if x.ndim == 0 or y.ndim == 0:
        raise _shape_error("@", a, b, "cannot be multiplied: @ needs at least one axis on each side")
    k_b = y.shape[-2 if y.ndim > 1 else 0]
    if x.shape[-1] != k_b:
        raise _shape_error("@", a, b, f"do not match: the inner dimensions {x.shape[-1]} and {k_b} differ")
    try:
        data = x @ y
    except ValueError:
        raise _shape_error("@", a, b, "have batch dimensions that cannot be broadcast together") from None

    def backward(g):
        # Treat vectors as 1-row / 1-column matrices, then C = A B gives
        # dA = dC B^T and dB = A^T dC, summed over any broadcast batch axes.
        x2 = x[None, :] if x.ndim == 1 else x
        y2 = y[:, None] if y.ndim == 1 else y
        g2 = g
        if y.ndim == 1:  # first: for vector @ vector, g is 0-d and needs its column axis first
            g2 = np.expand_dims(g2, -1)
        if x.ndim == 1:
            g2 = np.expand_dims(g2, -2)
        ga = gb = None
        if a.requires_grad:
            ga = g2 @ np.swapaxes(y2, -1, -2)
            ga = unbroadcast(ga[..., 0, :] if x.ndim == 1 else ga, x.shape)
        if b.requires_grad:
            gb = np.swapaxes(x2, -1, -2) @ g2
            gb = unbroadcast(gb[..., 0] if y.ndim == 1 else gb, y.shape)
        return ga, gb

    return operation("@", data, (a, b), backward)


def _inputs(t):
    return t.inputs


def _is_number(t):
    """A 0-d tensor on the CPU acts as a number beside a tensor on any device (as in PyTorch)."""
    return t.ndim == 0 and t.device == "cpu"


def _own_copy(g, dtype):
    """A fresh array of `dtype` holding g (NumPy's np.array only makes NumPy arrays)."""
    return np.array(g, dtype=dtype) if not _device.is_array(g) or isinstance(g, np.ndarray) else g.astype(dtype)


def _keep_axes(g, axis, keepdims, ndim):
    """Put back the reduced axes (as size 1) so `g` broadcasts against the input."""
    if axis is None:
        return np.reshape(g, (1,) * ndim) if not keepdims else g
    if keepdims:
        return g
    return np.expand_dims(g, axis)


def _plain_index(index):
    """Turn Tensors inside an index into their arrays."""
    if isinstance(index, Tensor):
        return index.data
    if isinstance(index, tuple):
        return tuple(i.data if isinstance(i, Tensor) else i for i in index)
    return index
