"""One training step of the same small MLP in course.micrograd and in course.tensor.

The model is 2-16-16-1 with ReLU on 64 points of the two moons, a mean squared error and an SGD
update: forward, backward and update are all timed. The tensor engine starts from micrograd's
own weights, so both do the same arithmetic. Best of several repetitions.

    python -m benchmarks.bench_mlp
"""

import time

import numpy as np

from course.data import make_moons
from course.micrograd import MLP
from course.tensor import Tensor

SIZES = [16, 16, 1]
N_POINTS = 64
LR = 0.05


def _best_of(fn, repeat):
    fn()  # warm up
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


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


def run(repeat=5):
    X, y = make_moons(N_POINTS, noise=0.1, seed=0)
    targets = 2.0 * y - 1
    X_list, t_list = X.tolist(), targets.tolist()
    mlp = MLP(2, SIZES, seed=0)
    params = _tensor_params(mlp)
    # The same model computes the same loss in both engines (checked once, before timing).
    first_tensor = _tensor_step(params, Tensor(X), Tensor(targets))
    first_micro = _micrograd_step(mlp, X_list, t_list)
    assert abs(first_tensor - first_micro) < 1e-9, (first_tensor, first_micro)

    Xt, tt = Tensor(X), Tensor(targets)
    micro_s = _best_of(lambda: _micrograd_step(mlp, X_list, t_list), repeat)
    tensor_s = _best_of(lambda: _tensor_step(params, Xt, tt), repeat * 20)
    return [{
        "name": f"MLP 2-{'-'.join(map(str, SIZES))} train step, {N_POINTS} points",
        "course_s": tensor_s,
        "reference": "course.micrograd",
        "reference_s": micro_s,
        "ratio": tensor_s / micro_s,
        "note": f"course.tensor is {micro_s / tensor_s:.0f}x faster than the scalar engine",
    }]


def main():
    rows = run()
    print(f"{'benchmark':<42} {'course.tensor':>14} {'reference':>28} {'ratio':>8}")
    for r in rows:
        ref = f"{r['reference']} {r['reference_s'] * 1e3:.2f} ms"
        print(f"{r['name']:<42} {r['course_s'] * 1e3:11.3f} ms {ref:>28} {r['ratio']:8.5f}  {r['note']}")
    return rows


if __name__ == "__main__":
    main()
