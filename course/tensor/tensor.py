"""A tensor that remembers how it was computed, and backpropagates through NumPy.

The same idea as micrograd's Value, for whole arrays: every operation computes its result with
NumPy and, when a gradient will be needed, records its inputs and a `backward(g)` function that
turns the gradient of the result into gradients of the inputs. Each operation below defines its
forward and its backward side by side.

Two rules make arrays harder than scalars:
- Broadcasting. `x + b` with x (32, 10) and b (10,) uses b 32 times, so b's gradient is the sum
  of the 32 rows of the result's gradient: `unbroadcast` sums a gradient back to a shape.
- Aliasing. Gradients are never changed in place, so two tensors may safely share one array.
"""

from contextlib import contextmanager

import numpy as np

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


def _shape_error(op, a, b, why="cannot be broadcast together"):
    return ValueError(f"{op}: shapes {a.shape} and {b.shape} {why}")


class Tensor:
    """An n-dimensional array with a gradient.

    `Tensor(data, requires_grad=False)` keeps the dtype of a NumPy array it is given; Python
    numbers and lists become float32, the dtype the course trains in.
    """

    __slots__ = ("data", "grad", "requires_grad", "_parents", "_backward", "_op", "label", "__weakref__")
    __array_priority__ = 1000  # `ndarray + Tensor` calls Tensor.__radd__ instead of NumPy's add

    def __init__(self, data, requires_grad=False, label=""):
        if isinstance(data, Tensor):
            data = data.data
        if not isinstance(data, np.ndarray):
            data = np.asarray(data) if isinstance(data, np.generic) else np.asarray(data, dtype=np.float32)
        if requires_grad and not np.issubdtype(data.dtype, np.floating):
            raise TypeError(f"only floating-point tensors can require gradients, got dtype {data.dtype}")
        self.data = data
        self.grad = None
        self.requires_grad = bool(requires_grad)
        self._parents = ()
        self._backward = None
        self._op = ""
        self.label = label

    # ----- a few conveniences ---------------------------------------------------------------
    shape = property(lambda self: self.data.shape)
    dtype = property(lambda self: self.data.dtype)
    ndim = property(lambda self: self.data.ndim)
    size = property(lambda self: self.data.size)

    def __len__(self):
        return len(self.data)

    def __repr__(self):
        body = np.array2string(self.data, precision=4, separator=", ", threshold=50)
        grad = ", requires_grad=True" if self.requires_grad else ""
        return f"Tensor({body}{grad})"

    def item(self):
        return self.data.item()

    def numpy(self):
        return self.data

    def detach(self):
        """The same data, cut from the graph."""
        return Tensor(self.data)

    def astype(self, dtype):
        out = _result(self.data.astype(dtype), (self,), "astype")
        if out.requires_grad:
            def backward(g):
                self._accumulate(g.astype(self.data.dtype))
            out._backward = backward
        return out

    def _lift(self, other):
        """Wrap a number or array as a constant tensor of this tensor's dtype (float32 stays float32)."""
        if isinstance(other, Tensor):
            return other
        if not np.issubdtype(self.data.dtype, np.floating):
            # An integer tensor times 0.5 must not truncate 0.5 to 0: let NumPy promote.
            return Tensor(np.asarray(other))
        return Tensor(np.asarray(other, dtype=self.data.dtype))

    def _accumulate(self, g):
        """Add `g` to this tensor's gradient. Used twice, a tensor gets the sum of both uses."""
        if self.grad is None:
            # A leaf (a parameter) gets its own copy: optimizers may change it in place.
            self.grad = np.array(g, dtype=self.data.dtype) if not self._parents else g
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
            grad = np.asarray(grad.data if isinstance(grad, Tensor) else grad, dtype=self.data.dtype)
            if grad.shape != self.shape:
                raise ValueError(f"backward(): the gradient has shape {grad.shape} but the tensor has shape {self.shape}")
        order = self._topological_order()
        for node in order:
            if node._parents:
                node.grad = None  # recomputed below; only leaves accumulate across calls
        self._accumulate(grad)
        for node in reversed(order):
            if node._backward is not None and node.grad is not None:
                node._backward(node.grad)

    def _topological_order(self):
        """Every tensor this one depends on, each after its inputs (a loop, not recursion, so
        that a graph 100,000 operations deep does not reach Python's recursion limit)."""
        order, visited = [], set()
        stack = [(self, False)]
        while stack:
            node, inputs_done = stack.pop()
            if inputs_done:
                order.append(node)
                continue
            if id(node) in visited:
                continue
            visited.add(id(node))
            stack.append((node, True))
            for parent in node._parents:
                if id(parent) not in visited:
                    stack.append((parent, False))
        return order

    # ----- elementwise arithmetic, with broadcasting -----------------------------------------
    def __add__(self, other):
        other = self._lift(other)
        try:
            data = self.data + other.data
        except ValueError:
            raise _shape_error("+", self, other) from None
        out = _result(data, (self, other), "+")
        if out.requires_grad:
            def backward(g):
                if self.requires_grad:
                    self._accumulate(unbroadcast(g, self.shape))
                if other.requires_grad:
                    other._accumulate(unbroadcast(g, other.shape))
            out._backward = backward
        return out

    def __sub__(self, other):
        other = self._lift(other)
        try:
            data = self.data - other.data
        except ValueError:
            raise _shape_error("-", self, other) from None
        out = _result(data, (self, other), "-")
        if out.requires_grad:
            def backward(g):
                if self.requires_grad:
                    self._accumulate(unbroadcast(g, self.shape))
                if other.requires_grad:
                    other._accumulate(unbroadcast(-g, other.shape))
            out._backward = backward
        return out

    def __mul__(self, other):
        other = self._lift(other)
        try:
            data = self.data * other.data
        except ValueError:
            raise _shape_error("*", self, other) from None
        out = _result(data, (self, other), "*")
        if out.requires_grad:
            def backward(g):
                if self.requires_grad:
                    self._accumulate(unbroadcast(g * other.data, self.shape))
                if other.requires_grad:
                    other._accumulate(unbroadcast(g * self.data, other.shape))
            out._backward = backward
        return out

    def __truediv__(self, other):
        other = self._lift(other)
        try:
            data = self.data / other.data
        except ValueError:
            raise _shape_error("/", self, other) from None
        out = _result(data, (self, other), "/")
        if out.requires_grad:
            def backward(g):
                if self.requires_grad:
                    self._accumulate(unbroadcast(g / other.data, self.shape))
                if other.requires_grad:  # d(a/b)/db = -a/b**2 = -out/b
                    other._accumulate(unbroadcast(-g * data / other.data, other.shape))
            out._backward = backward
        return out

    def __pow__(self, exponent):
        if isinstance(exponent, Tensor):
            return self._pow_tensor(exponent)
        p = exponent
        data = self.data ** p
        out = _result(data, (self,), f"**{p}")
        if out.requires_grad:
            def backward(g):
                self._accumulate(g * (p * self.data ** (p - 1)))
            out._backward = backward
        return out

    def _pow_tensor(self, exponent):
        try:
            data = self.data ** exponent.data
        except ValueError:
            raise _shape_error("**", self, exponent) from None
        out = _result(data, (self, exponent), "**")
        if out.requires_grad:
            def backward(g):
                if self.requires_grad:
                    self._accumulate(unbroadcast(g * exponent.data * self.data ** (exponent.data - 1), self.shape))
                if exponent.requires_grad:  # d(a**b)/db = a**b * log(a)
                    exponent._accumulate(unbroadcast(g * data * np.log(self.data), exponent.shape))
            out._backward = backward
        return out

    def __neg__(self):
        out = _result(-self.data, (self,), "neg")
        if out.requires_grad:
            out._backward = lambda g: self._accumulate(-g)
        return out

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

    # ----- matrix multiplication ------------------------------------------------------------
    def __matmul__(self, other):
        other = self._lift(other)
        a, b = self.data, other.data
        if a.ndim == 0 or b.ndim == 0:
            raise _shape_error("@", self, other, "cannot be multiplied: @ needs at least one axis on each side")
        if a.shape[-1] != b.shape[-2 if b.ndim > 1 else 0]:
            k_b = b.shape[-2 if b.ndim > 1 else 0]
            raise _shape_error("@", self, other, f"do not match: the inner dimensions {a.shape[-1]} and {k_b} differ")
        try:
            data = a @ b
        except ValueError:
            raise _shape_error("@", self, other, "have batch dimensions that cannot be broadcast together") from None
        out = _result(data, (self, other), "@")
        if out.requires_grad:
            def backward(g):
                # Treat vectors as 1-row / 1-column matrices, then C = A B gives
                # dA = dC B^T and dB = A^T dC, summed over any broadcast batch axes.
                a2 = a[None, :] if a.ndim == 1 else a
                b2 = b[:, None] if b.ndim == 1 else b
                g2 = g
                if b.ndim == 1:  # first: for vector @ vector, g is 0-d and needs its column axis first
                    g2 = np.expand_dims(g2, -1)
                if a.ndim == 1:
                    g2 = np.expand_dims(g2, -2)
                if self.requires_grad:
                    ga = g2 @ np.swapaxes(b2, -1, -2)
                    if a.ndim == 1:
                        ga = ga[..., 0, :]
                    self._accumulate(unbroadcast(ga, a.shape))
                if other.requires_grad:
                    gb = np.swapaxes(a2, -1, -2) @ g2
                    if b.ndim == 1:
                        gb = gb[..., 0]
                    other._accumulate(unbroadcast(gb, b.shape))
            out._backward = backward
        return out

    def __rmatmul__(self, other):
        return self._lift(other) @ self

    # ----- unary functions ------------------------------------------------------------------
    def exp(self):
        data = np.exp(self.data)
        out = _result(data, (self,), "exp")
        if out.requires_grad:
            out._backward = lambda g: self._accumulate(g * data)
        return out

    def log(self):
        out = _result(np.log(self.data), (self,), "log")
        if out.requires_grad:
            out._backward = lambda g: self._accumulate(g / self.data)
        return out

    def sqrt(self):
        data = np.sqrt(self.data)
        out = _result(data, (self,), "sqrt")
        if out.requires_grad:
            out._backward = lambda g: self._accumulate(g * 0.5 / data)
        return out

    def tanh(self):
        data = np.tanh(self.data)
        out = _result(data, (self,), "tanh")
        if out.requires_grad:
            out._backward = lambda g: self._accumulate(g * (1 - data * data))
        return out

    def relu(self):
        data = np.maximum(self.data, 0)
        out = _result(data, (self,), "relu")
        if out.requires_grad:
            out._backward = lambda g: self._accumulate(g * (self.data > 0))
        return out

    def sigmoid(self):
        # exp of a large positive number overflows, so split by sign: both branches stay finite.
        x = self.data
        e = np.exp(-np.abs(x))
        data = np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype, copy=False)
        out = _result(data, (self,), "sigmoid")
        if out.requires_grad:
            out._backward = lambda g: self._accumulate(g * data * (1 - data))
        return out

    # ----- reductions ------------------------------------------------------------------------
    def sum(self, axis=None, keepdims=False):
        out = _result(self.data.sum(axis=axis, keepdims=keepdims), (self,), "sum")
        if out.requires_grad:
            def backward(g):
                self._accumulate(np.broadcast_to(_keep_axes(g, axis, keepdims, self.ndim), self.shape))
            out._backward = backward
        return out

    def mean(self, axis=None, keepdims=False):
        data = self.data.mean(axis=axis, keepdims=keepdims)
        count = self.data.size // max(np.size(data), 1) if self.data.size else 1
        out = _result(data, (self,), "mean")
        if out.requires_grad:
            def backward(g):
                g = _keep_axes(g, axis, keepdims, self.ndim) / count
                self._accumulate(np.broadcast_to(g, self.shape).astype(self.dtype, copy=False))
            out._backward = backward
        return out

    def max(self, axis=None, keepdims=False):
        data = self.data.max(axis=axis, keepdims=keepdims)
        out = _result(data, (self,), "max")
        if out.requires_grad:
            def backward(g):
                # The gradient goes to the maximum; ties share it equally.
                top = _keep_axes(data, axis, keepdims, self.ndim)
                mask = (self.data == top).astype(self.dtype)
                mask /= mask.sum(axis=axis, keepdims=True)
                self._accumulate(mask * _keep_axes(g, axis, keepdims, self.ndim))
            out._backward = backward
        return out

    # ----- shapes ----------------------------------------------------------------------------
    def reshape(self, *shape):
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        try:
            data = self.data.reshape(shape)
        except ValueError:
            raise ValueError(f"reshape: a tensor of shape {self.shape} ({self.size} elements) cannot "
                             f"become shape {shape}") from None
        out = _result(data, (self,), "reshape")
        if out.requires_grad:
            out._backward = lambda g: self._accumulate(g.reshape(self.shape))
        return out

    def transpose(self, *axes):
        if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
            axes = tuple(axes[0])
        axes = axes or tuple(reversed(range(self.ndim)))
        if sorted(a % max(self.ndim, 1) for a in axes) != list(range(self.ndim)):
            raise ValueError(f"transpose: axes {axes} are not a permutation of the {self.ndim} axes of shape {self.shape}")
        out = _result(self.data.transpose(axes), (self,), "transpose")
        if out.requires_grad:
            inverse = np.argsort([a % self.ndim for a in axes])
            out._backward = lambda g: self._accumulate(g.transpose(inverse))
        return out

    @property
    def T(self):
        return self.transpose()

    def __getitem__(self, index):
        index = _plain_index(index)
        try:
            data = self.data[index]
        except IndexError as err:
            raise IndexError(f"indexing a tensor of shape {self.shape}: {err}") from None
        out = _result(data, (self,), "getitem")
        if out.requires_grad:
            parts = index if isinstance(index, tuple) else (index,)
            basic = all(isinstance(i, (int, np.integer, slice)) or i is None or i is Ellipsis for i in parts)
            def backward(g):
                grad = np.zeros_like(self.data)
                if basic:
                    grad[index] = g  # slices and integers pick each element at most once
                else:
                    # np.add.at adds once per occurrence: x[[0, 0]] sends two gradients to x[0].
                    np.add.at(grad, index, g)
                self._accumulate(grad)
            out._backward = backward
        return out


def _result(data, parents, op):
    """A new tensor computed from `parents`. It records them only when a gradient is needed."""
    out = Tensor.__new__(Tensor)
    out.data = data if isinstance(data, np.ndarray) else np.asarray(data)
    out.grad = None
    out.label = ""
    out._op = op
    out._backward = None
    needs = _grad_enabled and any(p.requires_grad for p in parents)
    out.requires_grad = needs
    out._parents = parents if needs else ()
    return out


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
