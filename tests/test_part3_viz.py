"""Drawing minitf graphs."""

import numpy as np
import pytest

import course.minitf as tf
from course.viz import draw_graph

pytestmark = pytest.mark.part3


def build():
    g = tf.Graph()
    with g.as_default():
        x = tf.placeholder((None, 2), name="x")
        w = tf.Variable(np.ones((2, 1)), name="w")
        loss = tf.reduce_mean(tf.square(x @ w - 1.0), name="loss")
        tf.gradients(loss, [w])
    return g, loss


def test_draw_graph_source_is_deterministic():
    g1, loss1 = build()
    g2, loss2 = build()
    assert draw_graph(g1).source == draw_graph(g2).source
    assert draw_graph(loss1).source == draw_graph(loss2).source
    assert "0x" not in draw_graph(g1).source


def test_draw_a_node_draws_only_what_it_depends_on():
    g, loss = build()
    whole, part = draw_graph(g), draw_graph(loss)
    assert part.n_nodes < whole.n_nodes == len(g)
    assert "gradients/" not in part.source and "gradients/" in whole.source


def test_styles_and_gradient_highlight():
    g, _ = build()
    src = draw_graph(g).source
    assert "placeholder" in src and "Variable" in src
    assert "#f8c8d0" in src                            # gradient nodes highlighted
    assert "#f8c8d0" not in draw_graph(g, highlight_gradients=False).source
