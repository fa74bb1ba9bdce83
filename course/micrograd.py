"""micrograd: a scalar autograd engine and a tiny neural-network library on top of it.

This is the engine that notebooks/1-micrograd builds step by step; read it after lesson 1.2.

    Value(data, label="")   one number that remembers how it was computed
        .data .grad         its value, and d(root)/d(this value) after root.backward()
        + - * / **          with numbers or Values on either side (the exponent may be a Value)
        relu() tanh() exp() log() sigmoid()
        backward()          fill .grad of every Value the root depends on
    Module, Neuron, Layer, MLP(nin, nouts)   with parameters() and zero_grad()

Gradients and calling backward() twice
--------------------------------------
`root.backward()` seeds d(root)/d(root) = 1 and walks the graph in reverse topological order,
each operation adding (+=) its share of the gradient into its inputs: a Value used twice gets
two contributions, which is the multivariable chain rule.

The grads of the *intermediate* Values (those made by an operation) are scratch space for one
pass: backward() sets them to 0 before it starts, so after the pass each holds d(root)/d(it).
The grads of the *leaves* (Values you made yourself: inputs, weights) are never reset: they
accumulate, as `.grad` does in PyTorch. So calling `loss.backward()` twice doubles every
leaf's grad, and `loss1.backward(); loss2.backward()` leaves d(loss1 + loss2)/d(leaf) in each
leaf. Call `model.zero_grad()` (or set `p.grad = 0`) before each training step.
"""

import math
import numbers
import random

from . import _graph

__all__ = ["Value", "Module", "Neuron", "Layer", "MLP"]


class Value:
    """One number, the operation that made it, and its gradient."""

    # A fixed set of fields (no per-Value __dict__): a training step makes 100,000s of Values.
    __slots__ = ("data", "grad", "label", "_prev", "_op", "_backward")

    def __init__(self, data, label="", _children=(), _op=""):
        if type(data) is not float:  # the common case skips the slower checks below
            if isinstance(data, Value):
                raise TypeError("Value(...) got a Value: it already is one, use it as it is")
            if not isinstance(data, numbers.Real):
                raise TypeError(f"a Value holds one real number (int or float), "
                                f"got {type(data).__name__}: {data!r:.60}")
            data = float(data)
        self.data = data
        self.grad = 0.0
        self.label = label
        # The inputs of the operation that made this Value, in operand order (a tuple, not a set,
        # so that walking the graph visits nodes in the same order on every run).
        self._prev = tuple(_children)
        self._op = _op
        # How to pass this Value's grad on to its inputs; leaves have nothing to pass on.
        # It is called as `_backward(out.grad)` rather than reading `out.grad` itself: a closure
        # that held on to `out` would make a reference cycle per operation (out -> _backward ->
        # out), so reference counting could never free a graph; only Python's cycle collector
        # could, after walking it, and a training loop would run several times slower.
        self._backward = _no_inputs

    def __repr__(self):
        name = f"{self.label!r}, " if self.label else ""
        return f"Value({name}data={self.data:.4f}, grad={self.grad:.4f})"

    # ---- binary operations: forward, and the local backward right under it ----

    def __add__(self, other):
        other = _as_value(other)
        if other is NotImplemented:
            return NotImplemented
        out = Value(self.data + other.data, _children=(self, other), _op="+")

        def _backward(grad):
            # d(a + b)/da = d(a + b)/db = 1: the sum passes its grad through unchanged.
            # += and not =: `self` may feed other operations too (or be `other` itself).
            self.grad += grad
            other.grad += grad

        out._backward = _backward
        return out

    def __mul__(self, other):
        other = _as_value(other)
        if other is NotImplemented:
            return NotImplemented
        out = Value(self.data * other.data, _children=(self, other), _op="*")

        def _backward(grad):
            # d(a * b)/da = b: each factor's grad is scaled by the *other* factor.
            self.grad += other.data * grad
            other.grad += self.data * grad

        out._backward = _backward
        return out

    def __pow__(self, exponent):
        if isinstance(exponent, Value):
            return self._pow_value(exponent)
        if not isinstance(exponent, numbers.Real):
            return NotImplemented
        base, n = self.data, float(exponent)
        if base == 0 and n < 0:
            raise ZeroDivisionError(f"0 cannot be raised to the negative power {n:g} "
                                    f"(dividing by a Value that is 0 does this)")
        if base < 0 and not n.is_integer():
            raise ValueError(f"a negative base ({base:g}) to a non-integer power ({n:g}) "
                             f"is not a real number")
        out = Value(base ** n, _children=(self,), _op=f"**{n:g}")

        def _backward(grad):
            # The power rule: d(a**n)/da = n * a**(n - 1), with n a constant.
            if n == 0:
                return  # a**0 = 1 whatever a is: no gradient (and 0 * 0**-1 would raise)
            if base == 0 and n < 1:
                # A root such as a**0.5 stands vertical at 0: the slope is infinite, where
                # Python's 0.0 ** -0.5 would raise ZeroDivisionError (PyTorch gives inf too).
                self.grad += math.inf * grad
                return
            self.grad += n * base ** (n - 1) * grad

        out._backward = _backward
        return out

    def _pow_value(self, exponent):
        base, b = self.data, exponent.data
        if base <= 0:
            raise ValueError(f"a Value exponent needs a positive base, got base {base:g}: "
                             f"the exponent's gradient a**b * log(a) needs log(a)")
        result = base ** b
        out = Value(result, _children=(self, exponent), _op="**")

        def _backward(grad):
            # With the base varying: the power rule. With the exponent varying:
            # a**b = exp(b * log(a)), so d(a**b)/db = a**b * log(a).
            self.grad += b * base ** (b - 1) * grad
            exponent.grad += result * math.log(base) * grad

        out._backward = _backward
        return out

    # ---- operations built from the ones above (their backward comes for free) ----

    def __neg__(self):  # -a
        return self * -1

    def __sub__(self, other):  # a - b
        other = _as_value(other)
        if other is NotImplemented:
            return NotImplemented
        return self + (-other)

    def __truediv__(self, other):  # a / b = a * b**-1
        other = _as_value(other)
        if other is NotImplemented:
            return NotImplemented
        return self * other ** -1

    # Reflected operations: Python calls these for `2 + a`, `2 - a`, ... when the left operand
    # is a plain number that does not know about Value.
    def __radd__(self, other):  # other + self
        return self + other

    def __rmul__(self, other):  # other * self
        return self * other

    def __rsub__(self, other):  # other - self
        other = _as_value(other)
        if other is NotImplemented:
            return NotImplemented
        return other + (-self)

    def __rtruediv__(self, other):  # other / self
        other = _as_value(other)
        if other is NotImplemented:
            return NotImplemented
        return other * self ** -1

    def __rpow__(self, other):  # other ** self: a number raised to a Value
        other = _as_value(other)
        if other is NotImplemented:
            return NotImplemented
        return other._pow_value(self)

    # ---- functions of one Value ----

    def relu(self):
        out = Value(max(0.0, self.data), _children=(self,), _op="relu")

        def _backward(grad):
            # The slope is 1 where the input is positive and 0 elsewhere (0 at 0, by convention).
            self.grad += (self.data > 0) * grad

        out._backward = _backward
        return out

    def tanh(self):
        t = math.tanh(self.data)
        out = Value(t, _children=(self,), _op="tanh")

        def _backward(grad):
            # d tanh(x)/dx = 1 - tanh(x)**2: the output is all the backward pass needs.
            self.grad += (1 - t * t) * grad

        out._backward = _backward
        return out

    def exp(self):
        try:
            e = math.exp(self.data)
        except OverflowError:
            raise OverflowError(f"exp({self.data:g}) is too large for a float") from None
        out = Value(e, _children=(self,), _op="exp")

        def _backward(grad):
            # exp is its own derivative: reuse the forward result.
            self.grad += e * grad

        out._backward = _backward
        return out

    def log(self):
        if self.data <= 0:
            raise ValueError(f"log needs a positive number, got {self.data:g}")
        out = Value(math.log(self.data), _children=(self,), _op="log")

        def _backward(grad):
            # d log(x)/dx = 1 / x
            self.grad += grad / self.data

        out._backward = _backward
        return out

    def sigmoid(self):
        x = self.data
        # Two algebraically equal forms, each used where its exp() cannot overflow.
        if x >= 0:
            s = 1.0 / (1.0 + math.exp(-x))
        else:
            z = math.exp(x)
            s = z / (1.0 + z)
        out = Value(s, _children=(self,), _op="sigmoid")

        def _backward(grad):
            # d sigmoid(x)/dx = sigmoid(x) * (1 - sigmoid(x))
            self.grad += s * (1 - s) * grad

        out._backward = _backward
        return out

    # ---- backpropagation ----

    def backward(self):
        """Fill in d(self)/d(v) for every Value v that self depends on (see the module docstring)."""
        order = topological_order(self)
        for node in order:
            if node._prev:  # intermediate grads hold this pass only; leaves accumulate
                node.grad = 0.0
        self.grad += 1.0
        # Reverse topological order: a node passes its grad on only after every node that uses
        # it has added its share, so its grad is complete when it is read.
        for node in reversed(order):
            node._backward(node.grad)


def _no_inputs(grad):
    pass


def _as_value(x):
    """Wrap a number in a Value; anything else gives NotImplemented, so Python raises a TypeError
    that names both types (`unsupported operand type(s) for +: 'Value' and 'str'`)."""
    if isinstance(x, Value):
        return x
    if isinstance(x, (int, float)) or isinstance(x, numbers.Real):  # fast path first
        return Value(x)
    return NotImplemented


def topological_order(root):
    """Every Value `root` depends on, each once, inputs before the Values made from them.

    Depth-first search with an explicit stack instead of recursion (course/_graph.py), so a graph
    100,000 nodes deep does not hit Python's recursion limit; inputs are visited in operand order.
    """
    return _graph.topological_order([root], _inputs)


def _inputs(value):
    return value._prev


# ---- a neural-network library of Values ----

class Module:
    """Something with parameters (Values to be trained)."""

    def parameters(self):
        return []

    def zero_grad(self):
        # Leaves accumulate their grads over backward() calls: start each step from 0.
        for p in self.parameters():
            p.grad = 0.0


def _make_rng(seed, rng):
    # A given generator is shared (so the neurons of a layer differ); otherwise seed a new one,
    # so the same seed builds the same network on every run and machine.
    return rng if rng is not None else random.Random(seed)


class Neuron(Module):
    """w . x + b, followed by a ReLU unless nonlin=False (the output layer stays linear)."""

    def __init__(self, nin, nonlin=True, seed=0, rng=None):
        rng = _make_rng(seed, rng)
        self.w = [Value(rng.uniform(-1, 1), label=f"w{i}") for i in range(nin)]
        self.b = Value(0.0, label="b")
        self.nonlin = nonlin

    def __call__(self, x):
        if len(x) != len(self.w):
            raise ValueError(f"this neuron takes {len(self.w)} inputs, got {len(x)}")
        act = sum((wi * xi for wi, xi in zip(self.w, x)), self.b)
        return act.relu() if self.nonlin else act

    def parameters(self):
        return self.w + [self.b]

    def __repr__(self):
        return f"{'ReLU' if self.nonlin else 'Linear'}Neuron({len(self.w)})"


class Layer(Module):
    """nout neurons that all read the same inputs."""

    def __init__(self, nin, nout, nonlin=True, seed=0, rng=None):
        rng = _make_rng(seed, rng)
        self.neurons = [Neuron(nin, nonlin=nonlin, rng=rng) for _ in range(nout)]

    def __call__(self, x):
        out = [n(x) for n in self.neurons]
        return out[0] if len(out) == 1 else out  # one output: a Value, not a list of one

    def parameters(self):
        return [p for n in self.neurons for p in n.parameters()]

    def __repr__(self):
        return f"Layer of [{', '.join(str(n) for n in self.neurons)}]"


class MLP(Module):
    """Layers of sizes nin -> nouts[0] -> ... -> nouts[-1]; ReLU between them, a linear output."""

    def __init__(self, nin, nouts, seed=0, rng=None):
        rng = _make_rng(seed, rng)
        sizes = [nin] + list(nouts)
        self.layers = [Layer(sizes[i], sizes[i + 1], nonlin=i != len(nouts) - 1, rng=rng)
                       for i in range(len(nouts))]

    def __call__(self, x):
        for layer in self.layers:
            if isinstance(x, Value):  # a one-neuron layer gave a Value: the next layer wants a list
                x = [x]
            x = layer(x)
        return x

    def parameters(self):
        return [p for layer in self.layers for p in layer.parameters()]

    def __repr__(self):
        return f"MLP of [{', '.join(str(layer) for layer in self.layers)}]"
