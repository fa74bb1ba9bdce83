"""course.micrograd against PyTorch: the same expressions give the same values and gradients."""

import math

import pytest

from course.micrograd import MLP, Value

pytestmark = [pytest.mark.part1, pytest.mark.reference]

torch = pytest.importorskip("torch", reason="PyTorch is not installed (optional `reference` extra)")


def both(f, xs):
    vs = [Value(x) for x in xs]
    out = f(vs, lambda v, name: getattr(v, name)())
    out.backward()
    ts = [torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in xs]
    t_out = f(ts, lambda t, name: getattr(torch, name)(t))
    t_out.backward()
    return (out.data, [v.grad for v in vs]), (t_out.item(), [t.grad.item() if t.grad is not None else 0.0 for t in ts])


EXPRESSIONS = {
    "arithmetic": lambda v, fn: (v[0] * v[1] - v[2]) / (v[1] + 3) + 2 / v[0] - 1 - v[2] * 4,
    "powers": lambda v, fn: v[0] ** 3 + v[1] ** v[0] * 0 + v[1] ** -2 + 2 ** v[2],
    "value exponent": lambda v, fn: v[1] ** v[0],
    "functions": lambda v, fn: fn(v[0], "tanh") + fn(v[1], "exp") * fn(v[2], "sigmoid") + fn(v[1], "log")
    + fn(v[2], "relu"),
    "reuse": lambda v, fn: (v[0] + v[0]) * v[0] + fn(v[0] * v[1], "tanh") * v[0],
}


@pytest.mark.parametrize("name", sorted(EXPRESSIONS))
@pytest.mark.parametrize("xs", [[0.7, 1.3, -0.4], [-1.1, 0.6, 2.2]])
def test_matches_pytorch(name, xs):
    (value, grads), (t_value, t_grads) = both(EXPRESSIONS[name], xs)
    assert value == pytest.approx(t_value, rel=1e-12)
    assert grads == pytest.approx(t_grads, rel=1e-10, abs=1e-12)


def test_mlp_matches_pytorch():
    model = MLP(3, [4, 4, 1], seed=0)
    x = [0.5, -1.2, 2.0]
    out = model(x)
    loss = (out - 1) ** 2
    model.zero_grad()
    loss.backward()

    tx = torch.tensor(x, dtype=torch.float64)
    grads = []
    for i, layer in enumerate(model.layers):
        w = torch.tensor([[p.data for p in n.w] for n in layer.neurons], dtype=torch.float64,
                         requires_grad=True)
        b = torch.tensor([n.b.data for n in layer.neurons], dtype=torch.float64, requires_grad=True)
        tx = w @ tx + b
        if i < len(model.layers) - 1:
            tx = torch.relu(tx)
        grads.append((layer, w, b))
    t_loss = ((tx[0] - 1) ** 2)
    t_loss.backward()
    assert loss.data == pytest.approx(t_loss.item(), rel=1e-12)
    for layer, w, b in grads:
        for j, n in enumerate(layer.neurons):
            assert [p.grad for p in n.w] == pytest.approx(w.grad[j].tolist(), rel=1e-10, abs=1e-12)
            assert n.b.grad == pytest.approx(b.grad[j].item(), rel=1e-10, abs=1e-12)
    assert math.isfinite(loss.data)
