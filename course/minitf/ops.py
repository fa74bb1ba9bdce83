"""The operations (lessons 3.1 and 3.2): for each one, side by side,

- the function that adds its node to a graph (`exp(x)`, `x + y`, ...),
- its forward kernel, a NumPy function of the input arrays, run by a Session,
- its shape rule, run while the graph is built, so shape errors show up at once,
- its gradient rule, which *adds nodes* for the gradient of each input (used by autodiff.py).

A gradient rule is `rule(node, g, needs) -> [node or None per input]`: `g` is the node holding
dLoss/d(node), and `needs[i]` says whether input i lies on a path to a variable we differentiate
for (no point building nodes nobody will run).
"""

import math

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


def _same(*input_shapes, **attrs):
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


# `dtype` is kept only by placeholders read from an ONNX file (what the file declares); Session and
# the runtime take the array fed as it is.
register("placeholder", _missing_feed, lambda shape=None, dtype=None: None if shape is None else tuple(shape),
         kind="source")


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
    """Matrix product: (n, k) @ (k, m) -> (n, m), or stacks of matrices (B, n, k) @ (k, m) -> (B, n, m)."""
    return _make("matmul", [a, b], name=name)


def transpose(x, perm=None, name=None):
    """Swap the two axes of a matrix; with `perm`, reorder the axes of any array (as np.transpose)."""
    attrs = {} if perm is None else {"perm": [int(p) for p in perm]}
    return _make("transpose", [x], attrs, name=name)


def _swap_last_two(x):
    if x.shape is None or len(x.shape) == 2:
        return transpose(x)
    perm = list(range(len(x.shape)))
    perm[-2], perm[-1] = perm[-1], perm[-2]
    return transpose(x, perm)


def _matmul_grad(node, g, needs):
    a, b = node.inputs
    if all(s is not None and len(s) == 2 for s in (a.shape, b.shape)):
        return [matmul(g, transpose(b)) if needs[0] else None,   # (n, m) @ (m, k)
                matmul(transpose(a), g) if needs[1] else None]   # (k, n) @ (n, m)
    # Stacks of matrices: the same products, matrix by matrix, then summed over the batch axes
    # that broadcasting gave one input and not the other (a weight shared by the whole batch).
    return [unbroadcast(matmul(g, _swap_last_two(b)), a) if needs[0] else None,
            unbroadcast(matmul(_swap_last_two(a), g), b) if needs[1] else None]


def _transpose_kernel(x, perm=None):
    if perm is None and np.ndim(x) != 2:  # checked here too: a graph built without shapes meets it only now
        raise ValueError(f"transpose without perm takes a 2-D matrix, got shape {shapes.show(np.shape(x))}: "
                         f"give perm for more axes")
    return np.transpose(x, perm)


def _transpose_shape(x, perm=None):
    if x is None:
        return None
    if perm is None:
        if len(x) != 2:
            raise ValueError(f"transpose without perm takes a 2-D matrix, got shape {shapes.show(x)}: "
                             f"give perm for more axes")
        return (x[1], x[0])
    if sorted(perm) != list(range(len(x))):
        raise ValueError(f"transpose: perm {list(perm)} is not an order of the {len(x)} axes of shape {shapes.show(x)}")
    return tuple(x[p] for p in perm)


def _transpose_grad(node, g, needs):
    perm = node.attrs.get("perm")
    return [transpose(g) if perm is None else transpose(g, np.argsort(perm).tolist())]


register("matmul", np.matmul, shapes.matmul, _matmul_grad)
register("transpose", _transpose_kernel, _transpose_shape, _transpose_grad)


# ---------------------------------------------------------------- reductions and softmax

def reduce_sum(x, axis=None, keepdims=False, name=None):
    return _make("reduce_sum", [x], {"axis": axis, "keepdims": bool(keepdims)}, name=name)


def reduce_mean(x, axis=None, keepdims=False, name=None):
    return _make("reduce_mean", [x], {"axis": axis, "keepdims": bool(keepdims)}, name=name)


def softmax(x, axis=-1, name=None):
    """exp(x) / sum(exp(x)) along `axis`, computed without overflow."""
    return _make("softmax", [x], {"axis": axis}, name=name)


def _softmax_kernel(x, axis=-1):
    axis = _axis(axis)
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def _softmax_grad(node, g, needs):
    # dL/dx = y * (g - sum(g * y)): the Jacobian diag(y) - y y^T applied to g.
    axis = _axis(node.attrs["axis"])
    return [node * (g - reduce_sum(g * node, axis=axis, keepdims=True))]


def _reduce_grad(mean):
    def rule(node, g, needs):
        return [broadcast_like(g, node.inputs[0], node.attrs["axis"], node.attrs["keepdims"], mean)]
    return rule


def _softmax_shape(x, axis=-1):
    if x is not None:
        shapes.normalize_axis(_axis(axis), len(x), "softmax")
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


# ---------------------------------------------------------------- what imported models need (lesson 3.4)
# PyTorch's ONNX exporter writes MLPs and transformer blocks with these: the maths of GELU and
# LayerNorm, and the operations that move data around (reshape, transpose, split, gather, ...).
# Shapes given as attributes (a reshape's target, the axes of a squeeze) are fixed when the graph
# is built, as in a graph exported with static shapes.

def sqrt(x, name=None):
    return _make("sqrt", [x], name=name)


def erf(x, name=None):
    """The error function, 2/sqrt(pi) times the integral of exp(-t^2) from 0 to x (GELU needs it)."""
    return _make("erf", [x], name=name)


def gelu(x, approximate="none", name=None):
    """x * Phi(x) (Phi: the normal distribution's CDF); approximate="tanh" is GPT-2's formula."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate is 'none' or 'tanh', got {approximate!r}")
    return _make("gelu", [x], {"approximate": approximate}, name=name)


_erf_scalar = np.frompyfunc(math.erf, 1, 1)  # the C library's erf, element by element (NumPy has none)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _float_dtype(x):
    return x.dtype if x.dtype.kind == "f" else np.dtype(np.float64)


def _erf_kernel(x, out=None):
    x = np.asarray(x)
    result = np.asarray(_erf_scalar(x), dtype=_float_dtype(x))
    if out is None:
        return result
    out[...] = result
    return out


def _gelu_kernel(x, approximate="none", out=None):
    x = np.asarray(x)
    if approximate == "tanh":
        inner = np.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x ** 3))
    else:
        inner = _erf_kernel(x * (1.0 / math.sqrt(2.0)))
    return np.multiply(0.5 * x, 1.0 + inner, out=out)


def _erf_grad(node, g, needs):
    x = node.inputs[0]
    return [g * (exp(negative(square(x))) * (2.0 / math.sqrt(math.pi)))]


def _gelu_grad(node, g, needs):
    x = node.inputs[0]
    if node.attrs.get("approximate") == "tanh":
        # d/dx of 0.5 x (1 + tanh(u)), u = c (x + 0.044715 x^3)
        t = tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x ** 3))
        du = _SQRT_2_OVER_PI * (1.0 + 3 * 0.044715 * square(x))
        return [g * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - square(t)) * du)]
    # d/dx of x Phi(x) = Phi(x) + x phi(x)
    cdf = 0.5 * (1.0 + erf(x * (1.0 / math.sqrt(2.0))))
    pdf = exp(-0.5 * square(x)) * (1.0 / math.sqrt(2.0 * math.pi))
    return [g * (cdf + x * pdf)]


register("sqrt", np.sqrt, _same, lambda node, g, needs: [g / (2.0 * node)], elementwise=True)
register("erf", _erf_kernel, _same, _erf_grad, elementwise=True)
register("gelu", _gelu_kernel, _same, _gelu_grad, elementwise=True)


def layer_norm(x, scale, bias, axis=-1, epsilon=1e-5, name=None):
    """(x - mean) / sqrt(var + epsilon) * scale + bias, with mean and variance over the axes from `axis` on."""
    return _make("layer_norm", [x, scale, bias], {"axis": int(axis), "epsilon": float(epsilon)}, name=name)


def _norm_axes(ndim, axis):
    return tuple(range(axis % ndim, ndim))


def _layer_norm_kernel(x, scale, bias, axis=-1, epsilon=1e-5):
    axes = _norm_axes(x.ndim, axis)
    centered = x - x.mean(axis=axes, keepdims=True)
    var = np.mean(centered * centered, axis=axes, keepdims=True)
    return centered / np.sqrt(var + epsilon) * scale + bias


def _layer_norm_shape(x, scale, bias, axis=-1, epsilon=1e-5):
    if x is not None:
        shapes.normalize_axis(axis, len(x), "layer_norm")
        for what, s in (("scale", scale), ("bias", bias)):
            if s is not None and shapes.broadcast(x, s, f"layer_norm ({what})") != x:
                raise ValueError(f"layer_norm: a {what} of shape {shapes.show(s)} does not fit x of shape {shapes.show(x)}")
    return x


def _layer_norm_grad(node, g, needs):
    x, scale, bias = node.inputs
    if x.shape is None:
        raise ValueError(f"layer_norm node '{node.name}': its gradient needs the number of axes of its input")
    axes = _norm_axes(len(x.shape), node.attrs.get("axis", -1))
    centered = x - reduce_mean(x, axis=axes, keepdims=True)
    inv_std = 1.0 / sqrt(reduce_mean(square(centered), axis=axes, keepdims=True) + node.attrs.get("epsilon", 1e-5))
    x_hat = centered * inv_std
    gx = g * scale
    # the normalisation's Jacobian: remove the mean of gx and its component along x_hat, then scale
    dx = inv_std * (gx - reduce_mean(gx, axis=axes, keepdims=True)
                    - x_hat * reduce_mean(gx * x_hat, axis=axes, keepdims=True))
    return [dx if needs[0] else None,
            unbroadcast(g * x_hat, scale) if needs[1] else None,
            unbroadcast(g, bias) if needs[2] else None]


register("layer_norm", _layer_norm_kernel, _layer_norm_shape, _layer_norm_grad)


# ---- moving data: reshape, expand_dims, squeeze, concat, slice, gather, cast, where, identity

def reshape(x, shape, name=None):
    """The same values in a new shape (one size may be -1: whatever is left)."""
    return _make("reshape", [x], {"shape": [int(d) for d in shape]}, name=name)


def _reshape_shape(x, shape):
    shape = [int(d) for d in shape]
    if shape.count(-1) > 1 or any(d < -1 for d in shape):
        raise ValueError(f"reshape: target {tuple(shape)} may hold sizes and one -1")
    if x is None:
        return tuple(None if d == -1 else d for d in shape)
    if None in x:
        return tuple(None if d == -1 else d for d in shape)
    total, known = int(np.prod(x)), int(np.prod([d for d in shape if d != -1]))
    if -1 in shape:
        if known == 0 or total % known:
            raise ValueError(f"reshape: shape {shapes.show(x)} cannot be reshaped to {tuple(shape)}")
        return tuple(total // known if d == -1 else d for d in shape)
    if known != total:
        raise ValueError(f"reshape: shape {shapes.show(x)} ({total} values) cannot be reshaped to "
                         f"{tuple(shape)} ({known} values)")
    return tuple(shape)


def reshape_like(x, like, name=None):
    """`x` reshaped to the shape `like` has when the graph runs (gradients of reshapes use it)."""
    return _make("reshape_like", [x, like], name=name)


def _back_to_input_shape(node, g, needs):
    return [reshape_like(g, node.inputs[0])]


register("reshape", lambda x, shape: np.reshape(x, shape), _reshape_shape, _back_to_input_shape)
register("reshape_like", lambda x, like: np.reshape(x, np.shape(like)), lambda x, like: like,
         lambda node, g, needs: [reshape_like(g, node.inputs[0]), None])


def expand_dims(x, axes, name=None):
    """Insert axes of size 1 at `axes` (positions in the result), as ONNX's Unsqueeze."""
    return _make("expand_dims", [x], {"axes": [int(a) for a in np.atleast_1d(axes)]}, name=name)


def squeeze(x, axes=None, name=None):
    """Remove axes of size 1 (those in `axes`, or all of them)."""
    attrs = {"axes": None if axes is None else [int(a) for a in np.atleast_1d(axes)]}
    return _make("squeeze", [x], attrs, name=name)


def _expand_dims_shape(x, axes):
    if x is None:
        return None
    n = len(x) + len(axes)
    new = shapes.normalize_axis(tuple(axes), n, "expand_dims")
    rest = iter(x)
    return tuple(1 if i in new else next(rest) for i in range(n))


def _squeeze_shape(x, axes=None):
    if x is None:
        return None
    if axes is None:
        if None in x:
            return None
        return tuple(d for d in x if d != 1)
    gone = shapes.normalize_axis(tuple(axes), len(x), "squeeze")
    for a in gone:
        if x[a] not in (1, None):
            raise ValueError(f"squeeze: axis {a} of shape {shapes.show(x)} has size {x[a]}, not 1")
    return tuple(d for i, d in enumerate(x) if i not in gone)


register("expand_dims", lambda x, axes: np.expand_dims(x, tuple(axes)), _expand_dims_shape, _back_to_input_shape)
register("squeeze", lambda x, axes=None: np.squeeze(x, None if axes is None else tuple(axes)), _squeeze_shape,
         _back_to_input_shape)


def concat(values, axis, name=None):
    """Join arrays along `axis` (the other sizes must agree)."""
    values = list(values)
    return _make("concat", values, {"axis": int(axis)}, name=name)


def _concat_shape(*xs, axis):
    if any(x is None for x in xs):
        return None
    ndim = len(xs[0])
    if any(len(x) != ndim for x in xs):
        raise ValueError(f"concat: shapes {', '.join(shapes.show(x) for x in xs)} differ in their number of axes")
    (ax,) = shapes.normalize_axis(axis, ndim, "concat")
    out = []
    for i in range(ndim):
        sizes = [x[i] for x in xs]
        if i == ax:
            out.append(None if None in sizes else sum(sizes))
            continue
        known = {d for d in sizes if d is not None}
        if len(known) > 1:
            raise ValueError(f"concat along axis {axis}: shapes {', '.join(shapes.show(x) for x in xs)} "
                             f"differ on axis {i}")
        out.append(known.pop() if known else None)
    return tuple(out)


def _concat_grad(node, g, needs):
    axis = node.attrs["axis"]
    start, grads = 0, []
    for x, need in zip(node.inputs, needs):
        size = None if x.shape is None else x.shape[axis]
        if size is None:
            raise ValueError(f"concat node '{node.name}': its gradient needs the sizes of its inputs along axis {axis}")
        grads.append(slice_along(g, [start], [start + size], [axis]) if need else None)
        start += size
    return grads


register("concat", lambda *xs, axis: np.concatenate(xs, axis=axis), _concat_shape, _concat_grad)


def slice_along(x, starts, ends, axes, name=None):
    """x[start:end] along each of `axes` (Python's rules for negative and too large bounds)."""
    attrs = {"starts": [int(v) for v in starts], "ends": [int(v) for v in ends], "axes": [int(v) for v in axes]}
    return _make("slice", [x], attrs, name=name)


def _index(ndim, starts, ends, axes):
    index = [slice(None)] * ndim
    for start, end, axis in zip(starts, ends, axes):
        index[axis] = slice(start, end)
    return tuple(index)


def _slice_shape(x, starts, ends, axes):
    if x is None:
        return None
    out = list(x)
    for start, end, axis in zip(starts, ends, axes):
        (axis,) = shapes.normalize_axis(axis, len(x), "slice")
        out[axis] = None if x[axis] is None else len(range(x[axis])[start:end])
    return tuple(out)


def _unslice_kernel(g, x, starts, ends, axes):
    out = np.zeros(np.shape(x), dtype=np.result_type(g))
    out[_index(out.ndim, starts, ends, axes)] = g
    return out


register("slice", lambda x, starts, ends, axes: x[_index(np.ndim(x), starts, ends, axes)], _slice_shape,
         lambda node, g, needs: [_make("unslice", [g, node.inputs[0]], dict(node.attrs))])
register("unslice", _unslice_kernel, lambda g, x, **attrs: x)  # the gradient of slice: zeros around g


def gather(x, indices, axis=0, name=None):
    """np.take(x, indices, axis): rows of an embedding table, or one position of a sequence."""
    return _make("gather", [x, indices], {"axis": int(axis)}, name=name)


def _gather_shape(x, indices, axis=0):
    if x is None or indices is None:
        return None
    (ax,) = shapes.normalize_axis(axis, len(x), "gather")
    return x[:ax] + tuple(indices) + x[ax + 1:]


def _scatter_add_kernel(g, indices, x, axis=0):
    # The gradient of gather: each gathered slice adds back where it came from (an index taken
    # twice gets both gradients, hence np.add.at and not assignment).
    out = np.zeros(np.shape(x), dtype=np.result_type(g))
    axis = axis % out.ndim
    indices = np.asarray(indices)
    moved = np.moveaxis(g, list(range(axis, axis + indices.ndim)), list(range(indices.ndim)))
    np.add.at(np.moveaxis(out, axis, 0), indices, moved)
    return out


register("gather", lambda x, indices, axis=0: np.take(x, indices, axis=axis), _gather_shape,
         lambda node, g, needs: [_make("scatter_add", [g, node.inputs[1], node.inputs[0]], dict(node.attrs)), None])
register("scatter_add", _scatter_add_kernel, lambda g, indices, x, axis=0: x)


def cast(x, dtype, name=None):
    """The values converted to `dtype` ("float32", "int64", "bool", ...)."""
    return _make("cast", [x], {"dtype": np.dtype(dtype).name}, name=name)


def _cast_grad(node, g, needs):
    # Between float types the gradient passes through; a cast to integers or booleans has none.
    return [g if np.dtype(node.attrs["dtype"]).kind == "f" else None]


register("cast", lambda x, dtype: np.asarray(x).astype(dtype), _same, _cast_grad)


def where(condition, a, b, name=None):
    """a where condition is true, else b (all three broadcast together)."""
    return _make("where", [condition, a, b], name=name)


def zeros_like(x, name=None):
    return _make("zeros_like", [x], name=name)


def _where_shape(c, a, b):
    return shapes.broadcast(shapes.broadcast(c, a, "where"), b, "where")


def _where_grad(node, g, needs):
    c, a, b = node.inputs
    zeros = zeros_like(g)
    return [None,
            unbroadcast(where(c, g, zeros), a) if needs[1] else None,
            unbroadcast(where(c, zeros, g), b) if needs[2] else None]


register("where", np.where, _where_shape, _where_grad)
register("zeros_like", lambda x: np.zeros_like(x, dtype=np.result_type(x, np.float32)), _same)


def identity(x, name=None):
    """The same value under another name."""
    return _make("identity", [x], name=name)


register("identity", lambda x: x, _same, lambda node, g, needs: [g])


def equal(a, b, name=None):
    """True where a == b (a mask, as in `mask == 0`); comparisons have no gradient."""
    return _make("equal", [a, b], name=name)


def greater(a, b, name=None):
    return _make("greater", [a, b], name=name)


def less(a, b, name=None):
    return _make("less", [a, b], name=name)


def _no_grad(node, g, needs):
    return [None] * len(node.inputs)


register("equal", np.equal, _binary_shape("equal"), _no_grad)
register("greater", np.greater, _binary_shape("greater"), _no_grad)
register("less", np.less, _binary_shape("less"), _no_grad)
