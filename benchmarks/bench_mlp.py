"""One training step of the same small MLP in course.micrograd and in course.tensor.

The model is 2-16-16-1 with ReLU on 64 points of the two moons, a mean squared error and an SGD
update: forward, backward and update are all timed. The tensor engine starts from micrograd's
own weights, so both do the same arithmetic (their first losses agree).

    python -m benchmarks mlp
"""

import numpy as np

from course.data import make_moons
from course.micrograd import MLP
from course.tensor import Tensor

from .harness import Row

SIZES = [16, 16, 1]
N_POINTS = 64
LR = 0.05


def _micrograd_step(mlp, X, t):
    scores = [mlp(x) for x in X]
    loss = sum((s - ti) ** 2 for s, ti in zip(scores, t)) * (1 / len(X))
    mlp.zero_grad()
    loss.backward()
    for p in mlp.parameters():
        p.data -= LR * p.grad
    return loss.data


def _tensor_params(mlp):
    params = []
    for layer in mlp.layers:
        W = np.array([[w.data for w in n.w] for n in layer.neurons]).T  # (inputs, outputs)
        b = np.array([n.b.data for n in layer.neurons])
        params += [Tensor(W, requires_grad=True), Tensor(b, requires_grad=True)]
    return params


def _tensor_step(params, X, t):
    h = X
    for i in range(0, len(params), 2):
        h = h @ params[i] + params[i + 1]
        if i + 2 < len(params):
            h = h.relu()
    loss = ((h.reshape(-1) - t) ** 2).mean()
    for p in params:
        p.grad = None
    loss.backward()
    for p in params:
        p.data -= LR * p.grad
    return loss.item()


def _setup():
    X, y = make_moons(N_POINTS, noise=0.1, seed=0)
    return X, 2.0 * y - 1, MLP(2, SIZES, seed=0)


def tensor_step(threads):
    X, targets, mlp = _setup()
    params = _tensor_params(mlp)  # the tensor engine starts from micrograd's own weights
    Xt, tt = Tensor(X), Tensor(targets)
    return lambda: _tensor_step(params, Xt, tt)


def micrograd_step(threads):
    X, targets, mlp = _setup()
    X_list, t_list = X.tolist(), targets.tolist()
    return lambda: _micrograd_step(mlp, X_list, t_list)


# Both first steps compute the same loss from the same weights (checked by `same`).
ROWS = [Row("mlp", f"MLP 2-{'-'.join(map(str, SIZES))} training step on `course.tensor`, {N_POINTS} points",
            "tensor_step", "micrograd_step", reference_label="course.micrograd", steps=200, warmup=2,
            reference_steps=5, same=1e-9, threads=1, note="one thread: the scalar engine has no use for more"),
]
