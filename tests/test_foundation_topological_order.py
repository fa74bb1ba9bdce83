"""The one topological sort that micrograd, the tensor engine, minitf and the drawings share."""

import pytest

from course import _graph

pytestmark = pytest.mark.foundation


class N:
    def __init__(self, name, *inputs):
        self.name, self.inputs = name, inputs

    def __repr__(self):
        return self.name


def names(order):
    return [n.name for n in order]


def test_inputs_come_first_in_operand_order_each_node_once():
    a, b = N("a"), N("b")
    c = N("c", a, b)
    d = N("d", c, a, c)          # a node used twice, and an input read by two nodes
    order = _graph.topological_order([d], lambda n: n.inputs)
    assert names(order) == ["a", "b", "c", "d"]


def test_several_roots_none_inputs_and_stop_nodes():
    a, b = N("a"), N("b")
    c = N("c", a, None)          # an absent optional input
    d = N("d", b)
    e = N("e", c, d)
    assert names(_graph.topological_order([e], lambda n: n.inputs)) == ["a", "c", "b", "d", "e"]
    assert names(_graph.topological_order([d, c], lambda n: n.inputs)) == ["b", "d", "a", "c"]
    # c is fed: included, its inputs are not followed
    assert names(_graph.topological_order([e], lambda n: n.inputs, stop=[c])) == ["c", "b", "d", "e"]


def test_a_deep_chain_does_not_reach_the_recursion_limit():
    node = N("x0")
    for i in range(100_000):
        node = N(f"x{i + 1}", node)
    order = _graph.topological_order([node], lambda n: n.inputs)
    assert len(order) == 100_001 and order[0].name == "x0" and order[-1] is node


def test_every_engine_walks_with_it():
    import course.micrograd as micrograd
    import course.minitf as tf
    from course.tensor import Tensor
    from course.viz import value_graph

    x = micrograd.Value(2.0)
    y = x * x + 1
    assert micrograd.topological_order(y) == _graph.topological_order([y], lambda v: v._prev)
    assert value_graph._walk(y) == micrograd.topological_order(y)
    t = Tensor([1.0, 2.0], requires_grad=True)
    u = (t * t).sum()
    assert u.topological_order() == _graph.topological_order([u], lambda v: v.inputs)
    with tf.Graph().as_default():
        p = tf.placeholder((2,), name="p")
        q = tf.exp(p) + p
    assert tf.topological_order([q]) == _graph.topological_order([q], lambda n: n.inputs)
