"""A minitf graph written as an ONNX file (lesson 3.4), for onnxruntime or any other ONNX runtime.

The translation is the import's, backwards: placeholders become the graph's inputs, constants and
Variables (frozen at their current values) its initializers, and each operation one ONNX node (or
a few: `square` is Mul(x, x)) that writes a value named after the minitf node, so outputs keep
their names. A fused node is written as the steps it runs.

Two things ONNX says and minitf leaves to the arrays fed: the element type of every value, and
that both sides of an Add have the same one. The file gets one float type (`dtype`; by default
float32 when the graph's float arrays with axes all are, else float64); constants are converted to
it, except integer indices (of a gather) and boolean conditions (of a where). So a float32 model
with a Python number in it (`h * 2.0`, which NumPy computes in float64 in a Session) runs in
float32 in the file: the same results up to float32 rounding.
"""

from pathlib import Path

import numpy as np

from .graph import topological_order
from .ops import OPS

OPSET = 20  # Gelu is a standard operator from opset 20 on
IR_VERSION = 9  # the file format version that goes with opset 20 (older runtimes refuse newer ones)

_SAME_NAME = {
    "add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div", "pow": "Pow", "neg": "Neg", "exp": "Exp",
    "log": "Log", "sigmoid": "Sigmoid", "relu": "Relu", "tanh": "Tanh", "sqrt": "Sqrt", "erf": "Erf",
    "identity": "Identity", "matmul": "MatMul", "where": "Where", "equal": "Equal", "greater": "Greater",
    "less": "Less",
}
_GRADIENT_HELPERS = {"unbroadcast", "broadcast_like", "unslice", "scatter_add"}


def to_onnx(graph, outputs, path, inputs=None, dtype=None):
    """Write what `outputs` (nodes or names) need from `graph` into the ONNX file `path`.

    `inputs` (placeholders or their names) are the file's inputs, in that order; by default the
    placeholders the outputs need, in the graph's order. Returns the path.
    """
    onnx = _onnx()
    outputs = [graph.get(o if isinstance(o, str) else o.name) for o in outputs]
    needed = set(topological_order(outputs))
    nodes = [n for n in graph.nodes if n in needed]
    needed_inputs = [n for n in nodes if n.op == "placeholder"]
    if inputs is None:
        inputs = needed_inputs
    else:
        inputs = [graph.get(i if isinstance(i, str) else i.name) for i in inputs]
        for node in inputs:
            if node.op != "placeholder":
                raise ValueError(f"to_onnx: the input '{node.name}' is a {node.op}, not a placeholder")
        missing = [n.name for n in needed_inputs if n not in inputs]
        if missing:
            raise ValueError(f"to_onnx: the outputs need the placeholder '{missing[0]}', which is not among the "
                             f"inputs {[n.name for n in inputs]}")
    for node in nodes:
        if OPS[node.op].kind == "stateful":
            raise ValueError(f"to_onnx: node '{node.name}' is a training operation ({node.op}); export the "
                             f"graph's outputs for inference (its variables are written at their current values)")
    writer = _Writer(onnx, nodes, _float_type(nodes, dtype))
    for node in inputs:
        writer.declare_input(node)
    for node in nodes:
        if node.op != "placeholder":
            writer.write(node)
    helper = onnx.helper
    value_infos = [writer.value_info(n) for n in outputs]
    onnx_graph = helper.make_graph(writer.onnx_nodes, "minitf", [writer.value_info(n) for n in inputs],
                                   value_infos, initializer=writer.initializers)
    model = helper.make_model(onnx_graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="course.minitf", ir_version=IR_VERSION)
    onnx.checker.check_model(model)
    path = Path(path)
    onnx.save(model, str(path))
    return path


def _onnx():
    try:
        import onnx
    except ImportError:  # pragma: no cover - onnx is a dependency of the course
        raise ImportError("writing ONNX files needs the `onnx` package: pip install onnx") from None
    return onnx


def _float_type(nodes, dtype):
    if dtype is not None:
        dtype = np.dtype(dtype)
        if dtype.kind != "f":
            raise ValueError(f"to_onnx: dtype is the file's float type (float32, float64), got {dtype}")
        return dtype
    # The arrays with axes vote (weights, tables); a Python number in the graph (`x * 2.0`) is a
    # float64 scalar that would otherwise turn every float32 model into a float64 file.
    arrays = [np.asarray(n.value) for n in nodes if n.value is not None]
    voters = [a for a in arrays if a.ndim > 0] or arrays
    floats = {a.dtype for a in voters if a.dtype.kind == "f"}
    floats |= {np.dtype(n.attrs["dtype"]) for n in nodes if n.op == "placeholder" and n.attrs.get("dtype")
               and np.dtype(n.attrs["dtype"]).kind == "f"}
    return np.dtype(np.float32) if floats == {np.dtype(np.float32)} else np.dtype(np.float64)


class _Writer:
    def __init__(self, onnx, nodes, float_type):
        self.onnx = onnx
        self.float_type = float_type
        self.onnx_nodes, self.initializers = [], []
        self.dtype = {}  # minitf node -> the element type of its value in the file
        # What each node is read as: indices of a gather and conditions of a where keep their type.
        self.role = {}
        for node in nodes:
            if node.op == "gather":
                self.role[node.inputs[1]] = "indices"
            elif node.op == "where":
                self.role[node.inputs[0]] = "condition"

    # ---------------------------------------------------------------- values

    def declare_input(self, node):
        declared = node.attrs.get("dtype")
        if declared:
            self.dtype[node] = np.dtype(declared)
        elif self.role.get(node) == "indices":
            self.dtype[node] = np.dtype(np.int64)
        elif self.role.get(node) == "condition":
            self.dtype[node] = np.dtype(bool)
        else:
            self.dtype[node] = self.float_type

    def value_info(self, node):
        helper = self.onnx.helper
        shape = None
        if node.shape is not None:
            shape = [d if d is not None else f"{node.name}_dim{i}" for i, d in enumerate(node.shape)]
        elem = helper.np_dtype_to_tensor_dtype(self.dtype.get(node, self.float_type))
        return helper.make_tensor_value_info(node.name, elem, shape)

    def constant(self, value, name):
        self.initializers.append(self.onnx.numpy_helper.from_array(np.asarray(value), name))
        return name

    def emit(self, op_type, inputs, output, **attrs):
        self.onnx_nodes.append(self.onnx.helper.make_node(op_type, list(inputs), [output], name=output, **attrs))
        return output

    # ---------------------------------------------------------------- nodes

    def write(self, node):
        if node.op in ("constant", "variable"):
            value = np.asarray(node.value)
            keep = (self.role.get(node) == "indices" and value.dtype.kind in "iu") or \
                   (self.role.get(node) == "condition" and value.dtype.kind == "b")
            if not keep:
                value = value.astype(self.float_type)
            elif value.dtype.kind in "iu":
                value = value.astype(np.int64)
            self.constant(value, node.name)
            self.dtype[node] = value.dtype
            return
        if node.op in _GRADIENT_HELPERS:
            raise ValueError(f"to_onnx: node '{node.name}' ({node.op}) only computes gradients, and ONNX files "
                             f"describe inference: export outputs that do not need it")
        names = [i.name for i in node.inputs]
        if node.op == "fused":
            self.write_fused(node, names)
        else:
            self.write_op(node.op, node.attrs, names, node.name, [i.shape for i in node.inputs])
        self.dtype[node] = self.result_type(node.op, node.attrs, [self.dtype.get(i, self.float_type) for i in node.inputs])

    def result_type(self, op, attrs, in_types):
        if op == "cast":
            return np.dtype(attrs["dtype"])
        if op == "where":
            return in_types[1]
        if op in ("step", "ones_like", "zeros_like"):
            return self.float_type
        if op in ("equal", "greater", "less"):
            return np.dtype(bool)
        return in_types[0] if in_types else self.float_type

    def write_fused(self, node, names):
        results = []
        for k, step in enumerate(node.attrs["steps"]):
            args = [names[j] if kind == "in" else results[j] for kind, j in step["args"]]
            out = node.name if k == len(node.attrs["steps"]) - 1 else f"{node.name}/{k}_{step['op']}"
            self.write_op(step["op"], step.get("attrs") or {}, args, out, [None] * len(args))
            results.append(out)

    def write_op(self, op, attrs, ins, out, in_shapes):
        if op in _SAME_NAME:
            return self.emit(_SAME_NAME[op], ins, out)
        ints = lambda values, suffix: self.constant(np.asarray(values, np.int64), f"{out}/{suffix}")  # noqa: E731
        if op == "square":
            return self.emit("Mul", [ins[0], ins[0]], out)
        if op == "gelu":
            return self.emit("Gelu", ins, out, approximate=attrs.get("approximate", "none"))
        if op == "step":
            zero = self.constant(np.zeros((), self.float_type), f"{out}/zero")
            positive = self.emit("Greater", [ins[0], zero], f"{out}/positive")
            return self.emit("Cast", [positive], out, to=self._elem(self.float_type))
        if op == "transpose":
            perm = attrs.get("perm")
            if perm is None:
                ndim = len(in_shapes[0]) if in_shapes[0] is not None else 2
                perm = list(range(ndim))[::-1]
            return self.emit("Transpose", ins, out, perm=[int(p) for p in perm])
        if op in ("reduce_sum", "reduce_mean"):
            axis = attrs.get("axis")
            onnx_op = "ReduceSum" if op == "reduce_sum" else "ReduceMean"
            args = list(ins) + ([] if axis is None else [ints(np.atleast_1d(axis), "axes")])
            return self.emit(onnx_op, args, out, keepdims=int(bool(attrs.get("keepdims", False))))
        if op == "softmax":
            axis = attrs.get("axis", -1)
            if isinstance(axis, (list, tuple)):
                if len(axis) != 1:
                    raise ValueError(f"to_onnx: node '{out}' is a softmax over several axes {list(axis)}, which "
                                     f"ONNX's Softmax (one axis) cannot write")
                axis = axis[0]
            return self.emit("Softmax", ins, out, axis=int(axis))
        if op == "layer_norm":
            return self.emit("LayerNormalization", ins, out, axis=int(attrs.get("axis", -1)),
                             epsilon=float(attrs.get("epsilon", 1e-5)))
        if op == "reshape":
            return self.emit("Reshape", [ins[0], ints(attrs["shape"], "shape")], out)
        if op == "reshape_like":
            shape = self.emit("Shape", [ins[1]], f"{out}/shape")
            return self.emit("Reshape", [ins[0], shape], out)
        if op in ("ones_like", "zeros_like"):
            shape = self.emit("Shape", [ins[0]], f"{out}/shape")
            fill = self.onnx.numpy_helper.from_array(np.full(1, 1.0 if op == "ones_like" else 0.0, self.float_type))
            return self.emit("ConstantOfShape", [shape], out, value=fill)
        if op == "expand_dims":
            return self.emit("Unsqueeze", [ins[0], ints(attrs["axes"], "axes")], out)
        if op == "squeeze":
            axes = attrs.get("axes")
            return self.emit("Squeeze", [ins[0]] + ([] if axes is None else [ints(axes, "axes")]), out)
        if op == "concat":
            return self.emit("Concat", ins, out, axis=int(attrs["axis"]))
        if op == "slice":
            return self.emit("Slice", [ins[0], ints(attrs["starts"], "starts"), ints(attrs["ends"], "ends"),
                                       ints(attrs["axes"], "axes")], out)
        if op == "gather":
            return self.emit("Gather", ins, out, axis=int(attrs.get("axis", 0)))
        if op == "cast":
            return self.emit("Cast", ins, out, to=self._elem(np.dtype(attrs["dtype"])))
        raise ValueError(f"to_onnx: node '{out}' is a '{op}', which has no ONNX form here")

    def _elem(self, dtype):
        return self.onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
