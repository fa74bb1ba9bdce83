"""Checking gradients against finite differences."""

import numpy as np

from .tensor import Tensor


def numerical_gradient(f, arrays, index, eps=1e-6):
    """d f(*arrays) / d arrays[index] by central differences: (f(x + eps) - f(x - eps)) / (2 eps).

    `f` returns a number (or a one-element array); the arrays are float64 for accuracy.
    """
    x = arrays[index]
    grad = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        old = x[i]
        x[i] = old + eps
        plus = float(np.sum(f(*arrays)))
        x[i] = old - eps
        minus = float(np.sum(f(*arrays)))
        x[i] = old
        grad[i] = (plus - minus) / (2 * eps)
    return grad


def gradcheck(fn, *arrays, eps=1e-6, rtol=1e-5, atol=1e-7):
    """Compare the engine's gradients of `fn(*tensors).sum()` with finite differences, in float64.

    Returns True, or raises AssertionError naming the input whose gradient differs.
    """
    arrays = [np.array(a, dtype=np.float64) for a in arrays]
    tensors = [Tensor(a.copy(), requires_grad=True) for a in arrays]
    fn(*tensors).sum().backward()

    def value(*xs):
        return fn(*[Tensor(x) for x in xs]).data

    for i, t in enumerate(tensors):
        expected = numerical_gradient(value, arrays, i, eps)
        got = t.grad if t.grad is not None else np.zeros_like(arrays[i])
        if not np.allclose(got, expected, rtol=rtol, atol=atol):
            worst = np.abs(got - expected).max()
            raise AssertionError(f"gradient of input {i} (shape {arrays[i].shape}) differs from finite "
                                 f"differences by up to {worst:.3g}")
    return True
