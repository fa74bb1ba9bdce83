"""The operations (lessons 3.1 and 3.2): for each one, side by side,

- the function that adds its node to a graph (`exp(x)`, `x + y`, ...),
- its forward kernel, a NumPy function of the input arrays, run by a Session,
- its shape rule, run while the graph is built, so shape errors show up at once,
- its gradient rule, which *adds nodes* for the gradient of each input (used by autodiff.py).

A gradient rule is `rule(node, g, needs) -> [node or None per input]`: `g` is the node holding
dLoss/d(node), and `needs[i]` says whether input i lies on a path to a variable we differentiate
for (no point building nodes nobody will run).
"""

import numpy as np

from ..tensor import unbroadcast as sum_to_shape
from . import shapes
from .graph import OPS, Node, as_array, get_default_graph, register



# ---------------------------------------------------------------- helpers

def _graph_of(*values):
    for v in values:
        if isinstance(v, Node):
            return v.graph
    return get_default_graph()


def _make(op, inputs, attrs=None, name=None):
    graph = _graph_of(*inputs)
    return graph.add_node(op, [graph.as_node(x) for x in inputs], attrs, name=name)


def _same(*input_shapes):
    return input_shapes[0]


def _fully_known(shape):
    return shape is not None and None not in shape


def _sum_to_input(g, x, node):
    """dL/dx from dL/d(node) when x was broadcast: sum over the axes broadcasting added.

    When the shapes say no broadcasting can have happened, `g` is already right.
    """
    if x.shape is not None and x.shape == node.shape:
        others = [i for i in node.inputs if i is not x]
        if all(_fully_known(o.shape) for o in others):
            return g
    return unbroadcast(g, x)


def _axis(axis):
    return tuple(axis) if isinstance(axis, list) else axis  # JSON gives lists back


# ---------------------------------------------------------------- sources

def placeholder(shape=None, name=None):
    """An input fed at run time: `placeholder((None, 2), name="x")` (None: any size there)."""
    if shape is not None:
        shape = _placeholder_shape(shape, name)
    if name is not None and not isinstance(name, str):
        raise TypeError(f"placeholder: name must be a string, got {name!r}")
    return get_default_graph().add_node("placeholder", (), {"shape": shape}, name=name or "Placeholder")


def _placeholder_shape(shape, name):
    if isinstance(shape, (type, np.dtype, str)):
        # TensorFlow 1's placeholder(tf.float32, (None, 3)) puts the dtype first; here the array fed
        # keeps its own dtype, so the shape comes first.
        example = f"tf.placeholder({name!r})" if isinstance(name, (tuple, list)) else "tf.placeholder((None, 3))"
        raise TypeError(f"placeholder: the first argument is the shape, and {getattr(shape, '__name__', shape)} "
                        f"is a dtype. minitf placeholders take no dtype (the array fed keeps its own): "
                        f"write {example}")
    if not isinstance(shape, (tuple, list)):
        raise TypeError(f"placeholder: shape must be a tuple of sizes (None for any size), got {shape!r}")
    for d in shape:
        if d is not None and (isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 0):
            raise ValueError(f"placeholder: shape {tuple(shape)} may hold sizes (0 or more) and None, not {d!r}")
    return tuple(None if d is None else int(d) for d in shape)


def _missing_feed(*_, **__):
    raise RuntimeError("a placeholder needs a value in feed_dict")  # Session checks this first


register("placeholder", _missing_feed, lambda shape=None: None if shape is None else tuple(shape), kind="source")


def Variable(value, name=None):
    """A trainable array that keeps its value between runs (TF1 kept it in the Session)."""
    value = np.array(as_array(value), copy=True)
    return get_default_graph().add_node("variable", (), {}, name=name or "Variable", value=value)


def constant(value, name=None):
    """A fixed array, stored in the graph."""
    return get_default_graph().add_node("constant", (), {}, name=name or "Const", value=as_array(value))


register("variable", lambda node: node.value, lambda: None, kind="source")
register("constant", lambda node: node.value, lambda: None, kind="source")


# ---------------------------------------------------------------- elementwise, two inputs

def add(a, b, name=None):
    return _make("add", [a, b], name=name)


def subtract(a, b, name=None):
    return _make("sub", [a, b], name=name)


def multiply(a, b, name=None):
    return _make("mul", [a, b], name=name)


def divide(a, b, name=None):
    return _make("div", [a, b], name=name)


def pow(a, b, name=None):  # noqa: A001 (the name TensorFlow uses)
    return _make("pow", [a, b], name=name)


def _add_grad(node, g, needs):
    a, b = node.inputs
    return [_sum_to_input(g, a, node) if needs[0] else None,
            _sum_to_input(g, b, node) if needs[1] else None]


def _sub_grad(node, g, needs):
    a, b = node.inputs
    return [_sum_to_input(g, a, node) if needs[0] else None,
            _sum_to_input(negative(g), b, node) if needs[1] else None]


def _mul_grad(node, g, needs):
    a, b = node.inputs
    return [_sum_to_input(g * b, a, node) if needs[0] else None,
            _sum_to_input(g * a, b, node) if needs[1] else None]


def _div_grad(node, g, needs):
    a, b = node.inputs
    return [_sum_to_input(g / b, a, node) if needs[0] else None,
            _sum_to_input(negative(g * node / b), b, node) if needs[1] else None]  # -g a/b^2 = -g y/b


def _pow_grad(node, g, needs):
    a, p = node.inputs
    if p.op == "constant":  # the usual x ** 2: build p - 1 as a number, not as a node
        p_minus_1 = node.graph.as_node(p.value - 1)
    else:
        p_minus_1 = p - 1
    return [_sum_to_input(g * (p * a ** p_minus_1), a, node) if needs[0] else None,
            _sum_to_input(g * (node * log(a)), p, node) if needs[1] else None]


def _binary_shape(op):
    return lambda a, b: shapes.broadcast(a, b, op)


register("add", np.add, _binary_shape("add"), _add_grad, elementwise=True)
register("sub", np.subtract, _binary_shape("sub"), _sub_grad, elementwise=True)
register("mul", np.multiply, _binary_shape("mul"), _mul_grad, elementwise=True)
register("div", np.true_divide, _binary_shape("div"), _div_grad, elementwise=True)
register("pow", np.power, _binary_shape("pow"), _pow_grad, elementwise=True)


# ---------------------------------------------------------------- elementwise, one input

def negative(x, name=None):
    return _make("neg", [x], name=name)


def exp(x, name=None):
    return _make("exp", [x], name=name)


def log(x, name=None):
    return _make("log", [x], name=name)


def sigmoid(x, name=None):
    return _make("sigmoid", [x], name=name)


def relu(x, name=None):
    return _make("relu", [x], name=name)


def tanh(x, name=None):
    return _make("tanh", [x], name=name)


def square(x, name=None):
    return _make("square", [x], name=name)


def step(x, name=None):
    """1 where x > 0, else 0: the slope of relu (its own gradient is zero)."""
    return _make("step", [x], name=name)


def _sigmoid_kernel(x, out=None):
    # 1 / (1 + e^-x) overflows for very negative x; 0.5 (1 + tanh(x / 2)) is the same and never does.
    out = np.multiply(x, 0.5, out=out)
    np.tanh(out, out=out)
    out *= 0.5
    out += 0.5
    return out


def _relu_kernel(x, out=None):
    return np.maximum(x, 0, out=out)


def _step_kernel(x, out=None):
    return np.greater(x, 0, out=out) if out is not None else (x > 0).astype(np.result_type(x, np.float32))


register("neg", np.negative, _same, lambda node, g, needs: [negative(g)], elementwise=True)
register("exp", np.exp, _same, lambda node, g, needs: [g * node], elementwise=True)
register("log", np.log, _same, lambda node, g, needs: [g / node.inputs[0]], elementwise=True)
register("sigmoid", _sigmoid_kernel, _same, lambda node, g, needs: [g * (node * (1 - node))], elementwise=True)
register("relu", _relu_kernel, _same, lambda node, g, needs: [g * step(node.inputs[0])], elementwise=True)
register("tanh", np.tanh, _same, lambda node, g, needs: [g * (1 - square(node))], elementwise=True)
register("square", np.square, _same, lambda node, g, needs: [g * (2 * node.inputs[0])], elementwise=True)
register("step", _step_kernel, _same, lambda node, g, needs: [None], elementwise=True)


# ---------------------------------------------------------------- matrices

def matmul(a, b, name=None):
    """Matrix product of two 2-D nodes: (n, k) @ (k, m) -> (n, m)."""
    return _make("matmul", [a, b], name=name)


def transpose(x, name=None):
    """Swap the two axes of a matrix."""
    return _make("transpose", [x], name=name)


def _matmul_grad(node, g, needs):
    a, b = node.inputs
    return [matmul(g, transpose(b)) if needs[0] else None,   # (n, m) @ (m, k)
            matmul(transpose(a), g) if needs[1] else None]   # (k, n) @ (n, m)


def _transpose_shape(x):
    if x is not None and len(x) != 2:
        raise ValueError(f"transpose takes a 2-D matrix, got shape {shapes.show(x)}")
    return None if x is None else (x[1], x[0])


register("matmul", np.matmul, shapes.matmul, _matmul_grad)
register("transpose", np.transpose, _transpose_shape, lambda node, g, needs: [transpose(g)])


# ---------------------------------------------------------------- reductions and softmax

def reduce_sum(x, axis=None, keepdims=False, name=None):
    return _make("reduce_sum", [x], {"axis": axis, "keepdims": bool(keepdims)}, name=name)


def reduce_mean(x, axis=None, keepdims=False, name=None):
    return _make("reduce_mean", [x], {"axis": axis, "keepdims": bool(keepdims)}, name=name)


def softmax(x, axis=-1, name=None):
    """exp(x) / sum(exp(x)) along `axis`, computed without overflow."""
    return _make("softmax", [x], {"axis": axis}, name=name)


def _softmax_kernel(x, axis=-1):
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def _softmax_grad(node, g, needs):
    # dL/dx = y * (g - sum(g * y)): the Jacobian diag(y) - y y^T applied to g.
    axis = node.attrs["axis"]
    return [node * (g - reduce_sum(g * node, axis=axis, keepdims=True))]


def _reduce_grad(mean):
    def rule(node, g, needs):
        return [broadcast_like(g, node.inputs[0], node.attrs["axis"], node.attrs["keepdims"], mean)]
    return rule


def _softmax_shape(x, axis=-1):
    if x is not None:
        shapes.normalize_axis(axis, len(x), "softmax")
    return x


register("reduce_sum", lambda x, axis=None, keepdims=False: np.sum(x, axis=_axis(axis), keepdims=keepdims),
         lambda x, axis=None, keepdims=False: shapes.reduce(x, _axis(axis), keepdims, "reduce_sum"),
         _reduce_grad(mean=False))
register("reduce_mean", lambda x, axis=None, keepdims=False: np.mean(x, axis=_axis(axis), keepdims=keepdims),
         lambda x, axis=None, keepdims=False: shapes.reduce(x, _axis(axis), keepdims, "reduce_mean"),
         _reduce_grad(mean=True))
register("softmax", _softmax_kernel, _softmax_shape, _softmax_grad)


# ---------------------------------------------------------------- helpers the gradients use

def unbroadcast(g, like, name=None):
    """Sum `g` over the axes that broadcasting added or stretched, down to the shape of `like`."""
    return _make("unbroadcast", [g, like], name=name)


def broadcast_like(g, x, axis=None, keepdims=False, mean=False, name=None):
    """Spread the gradient of a reduction back over the shape of its input `x`."""
    return _make("broadcast_like", [g, x], {"axis": axis, "keepdims": bool(keepdims), "mean": bool(mean)},
                 name=name)


def _broadcast_like_kernel(g, x, axis=None, keepdims=False, mean=False):
    x_shape = np.shape(x)
    axes = shapes.normalize_axis(_axis(axis), len(x_shape))
    if not keepdims:
        g = np.expand_dims(g, axes)
    if mean:
        g = g / max(1, int(np.prod([x_shape[i] for i in axes])))
    return np.broadcast_to(g, x_shape)


def ones_like(x, name=None):
    return _make("ones_like", [x], name=name)


register("unbroadcast", lambda g, like: sum_to_shape(np.asarray(g), np.shape(like)), lambda g, like: like)
register("broadcast_like", _broadcast_like_kernel, lambda g, x, **attrs: x)
register("ones_like", lambda x: np.ones_like(x, dtype=np.result_type(x, np.float32)), _same)


# ---------------------------------------------------------------- training (stateful)

def assign_sub(variable, delta, name=None):
    """When run: variable <- variable - delta. Returns the new value."""
    if variable.op != "variable":
        raise TypeError(f"assign_sub changes a Variable, and '{variable.name}' is a {variable.op}")
    return _make("assign_sub", [variable, delta], name=name)


def _assign_sub_kernel(node, value, delta):
    # A new array rather than `-=`: nodes that read the old value in this run keep seeing it.
    var = node.inputs[0]
    var.value = value - delta
    return var.value


def _assign_sub_shape(var, delta):
    if var is not None and delta is not None and shapes.broadcast(var, delta, "assign_sub") != var:
        raise ValueError(f"assign_sub: an update of shape {shapes.show(delta)} does not fit "
                         f"a variable of shape {shapes.show(var)}")
    return var


def group(inputs, name=None):
    """A node that runs all of `inputs` and gives nothing back (a training step)."""
    inputs = list(inputs)
    graph = _graph_of(*inputs)
    return graph.add_node("group", inputs, {}, name=name or "group")


register("assign_sub", _assign_sub_kernel, _assign_sub_shape, kind="stateful")
register("group", lambda node, *values: None, lambda *input_shapes: None, kind="stateful")


# ---------------------------------------------------------------- fused (made by compiler.fuse_elementwise)

def _fits_in(buffer, args):
    """Can `op(*args)` be written into `buffer`? Same dtype, and broadcasting keeps buffer's shape."""
    for a in args:
        if a is buffer:
            continue
        if not isinstance(a, np.ndarray) or a.dtype != buffer.dtype or a.ndim > buffer.ndim:
            return False
        if any(d != 1 and d != b for d, b in zip(a.shape[::-1], buffer.shape[::-1])):
            return False
    return True


_COMPILED = {}


def _compiled(steps):
    # Look the kernels up once per fused node, not on every run.
    hit = _COMPILED.get(id(steps))
    if hit is None or hit[0] is not steps:
        plan = [(OPS[st["op"]].forward, st.get("attrs") or {}, [(kind == "step", k) for kind, k in st["args"]],
                 st["op"] != "step") for st in steps]
        hit = _COMPILED[id(steps)] = (steps, plan)
    return hit[1]


def _fused_kernel(*inputs, steps):
    """Run a tree of elementwise steps in one go, writing into buffers this node made itself.

    A step is {"op", "attrs", "args"} with args ["in", k] (input k) or ["step", j] (step j's result).
    Every step's result is read once, by a later step, so that step may overwrite it (NumPy's `out=`):
    one array is allocated for the whole chain instead of one per operation.
    """
    results = []
    for forward, attrs, spec, may_reuse in _compiled(steps):
        args = [results[k] if from_step else inputs[k] for from_step, k in spec]
        out = None
        if may_reuse:
            for (from_step, _), arr in zip(spec, args):
                if from_step and isinstance(arr, np.ndarray) and arr.ndim and _fits_in(arr, args):
                    out = arr
                    break
        results.append(forward(*args, out=out, **attrs) if out is not None else forward(*args, **attrs))
    return results[-1]


def _fused_shape(*input_shapes, steps):
    results = []
    for st in steps:
        args = [input_shapes[k] if kind == "in" else results[k] for kind, k in st["args"]]
        results.append(OPS[st["op"]].shape(*args, **st.get("attrs", {})))
    return results[-1]


register("fused", _fused_kernel, _fused_shape)


def check_feed(name, declared, array):
    """Raise a ValueError naming the placeholder and both shapes when `array` does not fit."""
    if not shapes.compatible(declared, np.shape(array)):
        raise ValueError(f"placeholder '{name}' has shape {shapes.show(declared)}, but the array fed for it "
                         f"has shape {shapes.show(np.shape(array))}")
