"""course.micrograd: every operation's gradient against central finite differences (float64),
the graph edge cases, deep graphs, the modules, the errors, and drawing a Value graph."""

import math
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from course.micrograd import MLP, Layer, Module, Neuron, Value, topological_order

pytestmark = pytest.mark.part1


def numeric_grads(f, xs, h=1e-6):
    """Central differences of f(list of floats) -> float, one input at a time."""
    grads = []
    for i in range(len(xs)):
        up, down = list(xs), list(xs)
        up[i] += h
        down[i] -= h
        grads.append((f(up) - f(down)) / (2 * h))
    return grads


def autograd(f, xs):
    vs = [Value(x) for x in xs]
    out = f(vs)
    out.backward()
    return out.data, [v.grad for v in vs]


def as_float(f):
    """Run an expression written for Values on plain floats through Values (no graph needed)."""
    return lambda xs: f([Value(x) for x in xs]).data


# name, expression of a list of Values, points where it is smooth
OPERATIONS = [
    ("a + b", lambda v: v[0] + v[1], [[1.5, -2.0]]),
    ("a - b", lambda v: v[0] - v[1], [[1.5, -2.0]]),
    ("a * b", lambda v: v[0] * v[1], [[1.5, -2.0]]),
    ("a / b", lambda v: v[0] / v[1], [[1.5, -2.0], [-0.3, 0.7]]),
    ("-a", lambda v: -v[0], [[0.8]]),
    ("a ** 3", lambda v: v[0] ** 3, [[1.3], [-0.7]]),
    ("a ** -2", lambda v: v[0] ** -2, [[1.3], [-0.7]]),
    ("a ** 0.5", lambda v: v[0] ** 0.5, [[2.0]]),
    ("a ** b (Value exponent)", lambda v: v[0] ** v[1], [[1.7, 2.3], [0.4, -1.5]]),
    ("2 ** a (number base)", lambda v: 2 ** v[0], [[0.3], [-1.2]]),
    ("3 + a", lambda v: 3 + v[0], [[0.3]]),
    ("3 - a", lambda v: 3 - v[0], [[0.3]]),
    ("3 * a", lambda v: 3 * v[0], [[0.3]]),
    ("3 / a", lambda v: 3 / v[0], [[0.3], [-2.0]]),
    ("a + 3, a - 3, a * 3, a / 3", lambda v: (v[0] + 3) * (v[0] - 3) + v[0] * 3 + v[0] / 3, [[0.7]]),
    ("relu(a)", lambda v: v[0].relu(), [[0.7], [-0.7]]),
    ("tanh(a)", lambda v: v[0].tanh(), [[0.7], [-2.0]]),
    ("exp(a)", lambda v: v[0].exp(), [[0.7], [-2.0]]),
    ("log(a)", lambda v: v[0].log(), [[0.7], [5.0]]),
    ("sigmoid(a)", lambda v: v[0].sigmoid(), [[0.7], [-3.0], [30.0], [-30.0]]),
    ("a composite", lambda v: ((v[0] * v[1] + v[2]).tanh() ** 2 + (v[0] / v[2]).exp()).log()
     - v[1].sigmoid() * v[0].relu(), [[0.5, -1.2, 2.0], [1.1, 0.3, -0.9]]),
]


@pytest.mark.parametrize("name,f,points", OPERATIONS, ids=[op[0] for op in OPERATIONS])
def test_gradient_matches_finite_differences(name, f, points):
    for xs in points:
        value, grads = autograd(f, xs)
        assert value == pytest.approx(as_float(f)(xs), rel=1e-12)
        expected = numeric_grads(as_float(f), xs)
        assert grads == pytest.approx(expected, rel=1e-6, abs=1e-8), f"{name} at {xs}"


def test_forward_values():
    a, b = Value(2.0), Value(-3.0)
    assert (a + b).data == -1.0 and (a - b).data == 5.0 and (a * b).data == -6.0
    assert (a / b).data == pytest.approx(-2 / 3) and (a ** 3).data == 8.0 and (-a).data == -2.0
    assert (a ** Value(0.5)).data == pytest.approx(math.sqrt(2)) and (2 ** b).data == 0.125
    assert (1 - a).data == -1.0 and (1 / a).data == 0.5
    assert b.relu().data == 0.0 and a.relu().data == 2.0
    assert a.tanh().data == pytest.approx(math.tanh(2)) and a.exp().data == pytest.approx(math.exp(2))
    assert a.log().data == pytest.approx(math.log(2))
    assert b.sigmoid().data == pytest.approx(1 / (1 + math.exp(3)))
    assert Value(-1000.0).sigmoid().data == 0.0 and Value(1000.0).sigmoid().data == 1.0


def test_reused_value_accumulates():
    a = Value(3.0)
    b = a + a
    c = b + b
    c.backward()
    assert (c.data, b.grad, a.grad) == (12.0, 2.0, 4.0)


def test_square_by_multiplication():
    x = Value(-1.5)
    y = x * x
    y.backward()
    assert x.grad == pytest.approx(2 * -1.5)


def test_skip_connection():
    x = Value(0.4)
    h = (3 * x).tanh()
    y = h + x  # the residual path adds 1 to dy/dx
    y.backward()
    assert x.grad == pytest.approx(3 * (1 - math.tanh(1.2) ** 2) + 1)


def test_node_not_leading_to_the_loss_is_untouched():
    a, b = Value(1.0), Value(2.0)
    side = a * 10  # computed but not part of the loss
    loss = a * b
    loss.backward()
    assert side.grad == 0.0
    assert (a.grad, b.grad) == (2.0, 1.0)
    unrelated = Value(5.0)
    assert unrelated.grad == 0.0


def test_backward_twice_accumulates_leaves_exactly():
    a = Value(1.5)
    b = 2 * a
    c = 3 * b
    c.backward()
    first = (a.grad, b.grad, c.grad)
    c.backward()
    assert first == (6.0, 3.0, 1.0)
    # leaves accumulate (as in PyTorch); intermediate grads are recomputed, not doubled
    assert (a.grad, b.grad, c.grad) == (12.0, 3.0, 1.0)


def test_two_losses_sum_their_gradients():
    w = Value(0.5)
    h = w * 4
    loss1, loss2 = h * h, h.exp()
    loss1.backward()
    loss2.backward()
    w_sum = Value(0.5)
    h_sum = w_sum * 4
    (h_sum * h_sum + h_sum.exp()).backward()
    assert w.grad == pytest.approx(w_sum.grad)


def test_backward_of_a_leaf_and_of_an_intermediate():
    x = Value(2.0)
    x.backward()
    assert x.grad == 1.0
    y = Value(3.0)
    z = y * y
    w = z + 1
    z.backward()  # a Value in the middle of a graph can be a root too
    assert (z.grad, y.grad, w.grad) == (1.0, 6.0, 0.0)


def test_hundred_thousand_node_chain():
    x = Value(1.0)
    y = x
    for _ in range(100_000):
        y = y + 1e-6
    assert len(topological_order(y)) > 100_000
    y.backward()  # no RecursionError
    assert x.grad == 1.0
    assert sys.getrecursionlimit() < 100_000


def test_topological_order_is_deterministic_and_valid():
    a, b = Value(1.0), Value(2.0)
    c = a * b + a
    d = c.tanh() * b
    order = topological_order(d)
    assert len(order) == len({id(v) for v in order})
    pos = {id(v): i for i, v in enumerate(order)}
    assert all(pos[id(ch)] < pos[id(v)] for v in order for ch in v._prev)
    assert order[0] is a and order[-1] is d
    assert [v._op for v in order] == [v._op for v in topological_order(d)]


def test_children_and_ops_are_recorded():
    a, b = Value(1.0, label="a"), Value(2.0, label="b")
    c = a * b
    assert c._prev == (a, b) and c._op == "*"
    assert (a + a)._prev == (a, a)
    assert a._prev == () and a._op == ""
    assert repr(a) == "Value('a', data=1.0000, grad=0.0000)"
    assert "0x" not in repr(c)


@given(st.lists(st.floats(-2, 2), min_size=3, max_size=3))
def test_random_expressions_match_finite_differences(xs):
    def f(v):
        return (v[0] * v[1] - v[2]).tanh() * v[0] + (v[1] * 0.5).exp() / (1 + v[2] * v[2]) + v[0].sigmoid()

    _, grads = autograd(f, xs)
    assert grads == pytest.approx(numeric_grads(as_float(f), xs), rel=1e-5, abs=1e-7)


@given(st.floats(-50, 50), st.floats(-50, 50))
def test_arithmetic_matches_floats(x, y):
    a, b = Value(x), Value(y)
    assert (a + b).data == x + y and (a - b).data == x - y and (a * b).data == x * y
    assert (x + b).data == x + y and (x - b).data == x - y and (x * b).data == x * y
    if y != 0:
        assert (a / b).data == pytest.approx(x / y, rel=1e-12, abs=1e-300)


# ---- errors ----

@pytest.mark.parametrize("bad", ["a", None, [1.0], 1j])
def test_value_of_a_non_number_is_a_type_error(bad):
    with pytest.raises(TypeError, match=type(bad).__name__):
        Value(bad)


def test_value_of_a_value_is_a_type_error():
    with pytest.raises(TypeError, match="already"):
        Value(Value(1.0))


def test_operation_with_a_non_number_names_the_type():
    with pytest.raises(TypeError, match="str"):
        Value(1.0) + "a"
    with pytest.raises(TypeError, match="str"):
        Value(2.0) ** "a"
    with pytest.raises(TypeError, match="str"):
        "a" - Value(1.0)


@pytest.mark.parametrize("x", [0.0, -2.5])
def test_log_of_non_positive_names_the_value(x):
    with pytest.raises(ValueError, match=f"{x:g}"):
        Value(x).log()


def test_bad_powers_and_division():
    with pytest.raises(ZeroDivisionError, match="0"):
        Value(1.0) / Value(0.0)
    with pytest.raises(ValueError, match="-8"):
        Value(-8.0) ** (1 / 3)
    with pytest.raises(ValueError, match="positive base"):
        Value(-2.0) ** Value(2.0)
    with pytest.raises(ValueError, match="positive base"):
        (-2) ** Value(2.0)


def test_exp_overflow_is_clear():
    with pytest.raises(OverflowError, match="1000"):
        Value(1000.0).exp()


def test_numpy_numbers_are_accepted():
    np = pytest.importorskip("numpy")
    v = Value(np.float32(1.5)) * np.int64(2)
    assert type(v.data) is float and v.data == 3.0


# ---- modules ----

def test_mlp_parameter_count_and_shapes():
    model = MLP(2, [16, 16, 1])
    assert len(model.parameters()) == (2 * 16 + 16) + (16 * 16 + 16) + (16 + 1)
    out = model([0.5, -1.0])
    assert isinstance(out, Value)
    assert isinstance(Layer(3, 4)([1.0, 2.0, 3.0]), list)
    assert len(Neuron(5).parameters()) == 6
    assert Module().parameters() == []
    assert isinstance(MLP(3, [1, 2])([1.0, 2.0, 3.0]), list)  # a one-neuron hidden layer works


def test_mlp_is_seeded():
    a, b, c = MLP(2, [4, 1], seed=3), MLP(2, [4, 1], seed=3), MLP(2, [4, 1], seed=4)
    data = lambda m: [p.data for p in m.parameters()]  # noqa: E731
    assert data(a) == data(b) != data(c)
    import random
    assert data(MLP(2, [4, 1], rng=random.Random(3))) == data(a)
    neurons = Layer(2, 3).neurons
    assert neurons[0].w[0].data != neurons[1].w[0].data  # one generator shared by the layer


def test_output_layer_is_linear_and_hidden_layers_relu():
    model = MLP(2, [3, 1])
    assert all(n.nonlin for n in model.layers[0].neurons)
    assert not model.layers[-1].neurons[0].nonlin


def test_zero_grad():
    model = MLP(3, [4, 1])
    loss = model([1.0, -2.0, 0.5]) ** 2
    loss.backward()
    assert any(p.grad != 0 for p in model.parameters())
    model.zero_grad()
    assert all(p.grad == 0 for p in model.parameters())


def test_neuron_checks_input_size():
    with pytest.raises(ValueError, match="3 inputs, got 2"):
        Neuron(3)([1.0, 2.0])


def test_training_step_lowers_the_loss():
    model = MLP(2, [4, 1], seed=1)
    xs, ys = [[1.0, 0.5], [-1.0, -0.5], [0.3, -0.8]], [1.0, -1.0, 1.0]

    def loss_fn():
        return sum((model(x) - y) ** 2 for x, y in zip(xs, ys))

    before = loss_fn()
    model.zero_grad()
    before.backward()
    for p in model.parameters():
        p.data -= 0.01 * p.grad
    assert loss_fn().data < before.data


# ---- drawing ----

def test_value_graph_dot_is_deterministic():
    from course.viz import draw_graph

    def make():
        a, b = Value(2.0, label="a"), Value(-3.0, label="b")
        c = a * b + a
        c.label = "c"
        d = c.tanh()
        d.backward()
        return d

    first, second = draw_graph(make()), draw_graph(make())
    assert first.source == second.source
    assert "0x" not in first.source
    assert first.n_nodes == 5  # a, b, a*b, c, d
    assert first.source.count("shape=record") == 5
    assert first.source.count("shape=ellipse") == 3  # *, +, tanh
    assert "data 2.0000" in first.source and "grad " in first.source
    assert "{ a | data 2.0000 |" in first.source


def test_value_graph_of_a_deep_chain_and_its_limit():
    from course.viz import draw_graph
    from course.viz.value_graph import build

    import graphviz

    x = Value(1.0)
    for _ in range(5000):
        x = x.relu()
    _, n = build(x, graphviz.Digraph(), max_nodes=10_000)
    assert n == 5001
    with pytest.raises(ValueError, match="5001 Values"):
        draw_graph(x)


def test_value_graph_escapes_record_characters():
    from course.viz import draw_graph

    v = Value(1.0, label="a|b{c}")
    assert "a\\|b\\{c\\}" in draw_graph(v).source


def test_power_gradient_at_zero_does_not_raise():
    # a**0 is constant (grad 0); a**0.5 has an infinite slope at 0 (as in PyTorch); a**2 has slope 0.
    for n, expected in [(0, 0.0), (0.5, math.inf), (1, 1.0), (2, 0.0), (3.0, 0.0)]:
        a = Value(0.0)
        (a ** n).backward()
        assert a.grad == expected, (n, a.grad)
