"""Part 3: a mini TensorFlow. Define the graph first, run it later.

    import course.minitf as tf

    g = tf.Graph()
    with g.as_default():
        x = tf.placeholder((None, 2), name="x")
        w = tf.Variable(np.zeros((2, 1)), name="w")
        y = tf.sigmoid(x @ w)
    tf.Session(g).run(y, {x: data})

Modules, in the order of the lessons:
    graph.py        Graph, Node (with its operators), the default graph, topological_order,
                    and the registry of operations (OPS)                        (3.1)
    ops.py          each operation: node builder, forward kernel, shape rule, gradient rule,
                    registered in graph.py's OPS (ops.py imports graph.py, never the reverse)
    session.py      Session.run(fetches, feed_dict)                            (3.1)
    autodiff.py     gradients(ys, xs): reverse mode on the graph               (3.2)
    train.py        GradientDescentOptimizer(lr).minimize(loss)                (3.2)
    shapes.py       the shape rules; compiler.py the passes                    (3.3)
    serialize.py    save(graph, path), load(path); runtime.py InferenceSession (3.3)
    onnx_import.py  from_onnx(path): an ONNX file as a Graph (and as the runtime's nodes)  (3.4)
    onnx_export.py  to_onnx(graph, outputs, path): a graph as an ONNX file              (3.4)

`tf.Graph`, `tf.Session`, ... are looked up in their module on first use (PEP 562's module
`__getattr__`), not all imported here. That keeps the inference runtime honest: a server that
does `from course.minitf.runtime import InferenceSession` loads the operations' kernels and the
file format, and never the gradients, the optimizer, the Session or the compiler.
"""

import importlib

# Each public name, and the module of this package that defines it.
_WHERE = {
    "graph": ["Graph", "Node", "get_default_graph", "reset_default_graph", "topological_order"],
    "ops": ["placeholder", "Variable", "constant", "add", "subtract", "multiply", "divide", "pow",
            "negative", "matmul", "transpose", "exp", "log", "sigmoid", "relu", "tanh", "softmax",
            "square", "reduce_sum", "reduce_mean", "sqrt", "erf", "gelu", "layer_norm", "reshape",
            "expand_dims", "squeeze", "concat", "slice_along", "gather", "cast", "where", "identity",
            "equal", "greater", "less"],
    "session": ["Session"],
    "autodiff": ["gradients"],
    "train": ["GradientDescentOptimizer"],
    "compiler": ["infer_shapes", "fold_constants", "eliminate_common_subexpressions",
                 "eliminate_dead_code", "fuse_elementwise", "optimize"],
    "serialize": ["save", "load"],
    "runtime": ["InferenceSession"],
    "onnx_import": ["from_onnx"],
    "onnx_export": ["to_onnx"],
}
_MODULE_OF = {name: module for module, names in _WHERE.items() for name in names}
_SUBMODULES = {"graph", "ops", "session", "autodiff", "train", "shapes", "compiler", "serialize", "runtime",
               "onnx_import", "onnx_export"}

__all__ = [name for names in _WHERE.values() for name in names] + ["compiler"]


def __getattr__(name):
    # Called only for names not defined yet: import the module that has it, then remember it.
    if name in _SUBMODULES:
        value = importlib.import_module(f"{__name__}.{name}")
    elif name in _MODULE_OF:
        value = getattr(importlib.import_module(f"{__name__}.{_MODULE_OF[name]}"), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
