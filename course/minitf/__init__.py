"""Part 3: a mini TensorFlow. Define the graph first, run it later.

    import course.minitf as tf

    g = tf.Graph()
    with g.as_default():
        x = tf.placeholder((None, 2), name="x")
        w = tf.Variable(np.zeros((2, 1)), name="w")
        y = tf.sigmoid(x @ w)
    tf.Session(g).run(y, {x: data})

Modules, in the order of the lessons:
    graph.py        Graph, Node, the default graph, topological_order          (3.1)
    ops.py          each operation: node builder, forward kernel, shape rule, gradient rule
    session.py      Session.run(fetches, feed_dict)                            (3.1)
    gradients.py    gradients(ys, xs): reverse mode on the graph               (3.2)
    train.py        GradientDescentOptimizer(lr).minimize(loss)                (3.2)
    shapes.py       the shape rules; compiler.py the passes                    (3.3)
    serialize.py    save(graph, path), load(path); runtime.py InferenceSession (3.3)
"""

from . import compiler
from .compiler import (eliminate_common_subexpressions, eliminate_dead_code, fold_constants,
                       fuse_elementwise, infer_shapes, optimize)
from .gradients import gradients
from .graph import Graph, Node, get_default_graph, reset_default_graph, topological_order
from .ops import (Variable, add, constant, divide, exp, log, matmul, multiply, negative, placeholder,
                  pow, reduce_mean, reduce_sum, relu, sigmoid, softmax, square, subtract, tanh, transpose)
from .runtime import InferenceSession
from .serialize import load, save
from .session import Session
from .train import GradientDescentOptimizer

__all__ = [
    "Graph", "Node", "get_default_graph", "reset_default_graph", "topological_order",
    "placeholder", "Variable", "constant",
    "add", "subtract", "multiply", "divide", "pow", "negative", "matmul", "transpose",
    "exp", "log", "sigmoid", "relu", "tanh", "softmax", "square", "reduce_sum", "reduce_mean",
    "Session", "gradients", "GradientDescentOptimizer",
    "compiler", "infer_shapes", "fold_constants", "eliminate_common_subexpressions",
    "eliminate_dead_code", "fuse_elementwise", "optimize",
    "save", "load", "InferenceSession",
]
