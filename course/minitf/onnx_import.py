"""Models from elsewhere (lesson 3.4): an ONNX file read as minitf nodes.

ONNX is a graph much like ours, stored as a protocol buffer: the graph's inputs (fed at run time),
its initializers (the weights, as arrays), and its nodes, each an operator (`op_type`) that reads
values by name and writes values by name, in an order where every value is written before it is
read. Reading a file is therefore a translation, node by node:

- each graph input becomes a placeholder and each initializer a constant, keeping their names;
- each ONNX node becomes one minitf operation (or a few: Gemm is a matmul and an add), and the
  last of them takes the name of the value the ONNX node writes, so the file's names still work;
- what ONNX gives as an input but minitf needs as a setting (a Reshape's target shape, the axes
  of a reduction) must be known when the file is read. Exporters with static shapes store them as
  constants; a file with dynamic shapes, where they are computed from an input's size at run
  time, is refused, naming that input.

`read_onnx` gives the nodes in the structure of a saved graph (serialize.py), which both
`from_onnx` (a Graph) and the inference runtime (no Graph) run. It imports no Graph code.
"""

from pathlib import Path

import numpy as np

from . import shapes
from .ops import OPS


def _onnx():
    try:
        import onnx
    except ImportError:  # pragma: no cover - onnx is a dependency of the course
        raise ImportError("reading ONNX files needs the `onnx` package: pip install onnx") from None
    return onnx


def load_model(path):
    """The ModelProto in the file `path`, checked; a clear error for a missing, wrong or damaged file."""
    onnx = _onnx()
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path} is a folder, not an ONNX file (a graph saved by tf.save is read by tf.load)")
    if not path.is_file():
        raise FileNotFoundError(f"no ONNX file at {path}")
    try:
        model = onnx.load(str(path))
    except Exception as err:  # protobuf's DecodeError, or a missing external-data file
        raise ValueError(f"{path.name} is not a readable ONNX model (truncated or corrupt?): "
                         f"{type(err).__name__}: {err}") from None
    if not model.HasField("graph") or not model.graph.output:
        raise ValueError(f"{path.name} is not an ONNX model: it holds no graph with outputs "
                         f"(is it an ONNX file? truncated?)")
    try:
        onnx.checker.check_model(model)
    except Exception as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(f"{path.name} is not a valid ONNX model (truncated or corrupt?): {first}") from None
    return model


def read_onnx(path, input_shapes=None):
    """(spec, arrays): the ONNX model at `path` as minitf nodes, in the structure `serialize.read`
    returns, plus spec["inputs"] and spec["outputs"], the names of the graph's inputs and outputs
    in the file's order. `input_shapes` ({"x": (1, 8, 16)}) fixes the sizes the file leaves open."""
    model = load_model(path)
    return _Reader(model, Path(path).name, input_shapes).read()


def opset_of(model):
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return int(entry.version)
    return 1


class _Reader:
    def __init__(self, model, filename, input_shapes):
        self.onnx = _onnx()
        self.model = model
        self.filename = filename
        self.opset = opset_of(model)
        self.input_shapes = dict(input_shapes or {})
        self.entries = []     # the spec's nodes
        self.arrays = {}      # constant name -> array
        self.shape = {}       # minitf node name -> shape
        self.known = {}       # minitf node name -> value known while reading (constants and what they alone make)
        self.reads = {}       # minitf node name -> the graph inputs it is computed from
        self.declared = {}    # graph input name -> its shape as the file writes it ('batch' for a named size)
        self.node_of = {}     # ONNX value name -> minitf node name

    # ------------------------------------------------------------ building the spec

    def add(self, op, inputs, attrs=None, name=None, value=None, onnx_node=None):
        """Append a minitf node; its name is `name` if free, else `name` with a suffix."""
        base = name or op
        name, k = base, 0
        while name in self.shape:
            k += 1
            name = f"{base}_{k}"
        attrs = dict(attrs or {})
        try:
            shape = OPS[op].infer_shape([self.shape[i] for i in inputs], attrs, value, op_name=name)
        except ValueError as err:
            where = self.describe(onnx_node) if onnx_node is not None else f"node '{name}'"
            raise ValueError(f"{self.filename}: {where}: {err}") from None
        if value is not None:
            self.arrays[name] = value
            self.known[name] = value
        elif inputs and OPS[op].kind == "pure" and all(i in self.known for i in inputs):
            self.known[name] = np.asarray(OPS[op].forward(*[self.known[i] for i in inputs], **attrs))
        if name in self.known:
            shape = tuple(np.shape(self.known[name]))
        self.shape[name] = shape
        self.reads[name] = frozenset().union(*[self.reads[i] for i in inputs]) if inputs else frozenset()
        self.entries.append({"name": name, "op": op, "inputs": list(inputs), "attrs": attrs})
        return name

    def constant(self, value, name):
        return self.add("constant", [], {}, name=name, value=np.asarray(value))

    def describe(self, node):
        label = node.name or (node.output[0] if node.output else "?")
        return f"node '{label}' ({node.op_type}, opset {self.opset})"

    def static(self, node, name, what):
        """The value of minitf node `name`, which `node` needs while the file is read."""
        if name in self.known:
            return self.known[name]
        dynamic = sorted(i for i in self.reads[name] if self.shape[i] is None or None in self.shape[i])
        if dynamic:
            which = ", ".join(f"'{i}' (shape {self.show_declared(i)})" for i in dynamic)
            raise ValueError(
                f"{self.filename}: the graph has dynamic shapes, which minitf cannot run: {self.describe(node)} "
                f"needs {what} when the file is read, and it is computed at run time from the size of the "
                f"input {which}. Export the model with fixed sizes (no dynamic_axes), or give them: "
                f"from_onnx(path, input_shapes={{'{dynamic[0]}': (...)}})")
        raise ValueError(f"{self.filename}: {self.describe(node)} needs {what} when the file is read, but it is "
                         f"computed at run time (from {sorted(self.reads[name]) or 'the graph'}); minitf needs "
                         f"it as a constant of the file")

    def show_declared(self, name):
        dims = self.declared.get(name)
        if dims is None:
            return "unknown"
        return "(" + ", ".join(repr(d) if isinstance(d, str) else str(d) for d in dims) + ("," if len(dims) == 1 else "") + ")"

    # ------------------------------------------------------------ the file

    def read(self):
        graph = self.model.graph
        numpy_helper = self.onnx.numpy_helper
        initializers = {t.name for t in graph.initializer}
        inputs = []
        for value_info in graph.input:
            if value_info.name in initializers:  # old files list their weights as inputs too
                continue
            inputs.append(self.placeholder(value_info))
        unknown = set(self.input_shapes) - set(inputs)
        if unknown:
            raise KeyError(f"{self.filename} has no input named {sorted(unknown)[0]!r} (its inputs: {inputs})")
        for tensor in graph.initializer:
            self.node_of[tensor.name] = self.constant(np.array(numpy_helper.to_array(tensor)), tensor.name)
        self.refuse_unsupported(graph.node)
        for node in graph.node:
            self.convert(node)
        outputs = []
        for value_info in graph.output:
            if value_info.name not in self.node_of:
                raise ValueError(f"{self.filename}: the output '{value_info.name}' is made by no node")
            outputs.append(self.node_of[value_info.name])
        spec = {"format": "onnx", "opset": self.opset, "nodes": self.entries, "inputs": inputs,
                "outputs": outputs, "aliases": {}}
        return spec, self.arrays

    def placeholder(self, value_info):
        name = value_info.name
        tensor_type = value_info.type.tensor_type
        dtype = None
        if tensor_type.elem_type:
            dtype = np.dtype(self.onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)).name
        shape = None
        if tensor_type.HasField("shape"):
            dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in tensor_type.shape.dim]
            self.declared[name] = tuple(dims)
            shape = tuple(d if isinstance(d, int) else None for d in dims)
        if name in self.input_shapes:
            shape = shapes.merge(shape, self.input_shapes[name], name)
        self.node_of[name] = self.add("placeholder", [], {"shape": shape, "dtype": dtype}, name=name)
        self.reads[name] = frozenset([name])
        return name

    def refuse_unsupported(self, nodes):
        """Every operator of the file that minitf does not implement, named at once (not only the
        first, to be met again after each fix)."""
        foreign = [n for n in nodes if n.domain not in ("", "ai.onnx")]
        missing = [n for n in nodes if n.domain in ("", "ai.onnx") and n.op_type not in CONVERTERS]
        if not foreign and not missing:
            return
        kinds = sorted({n.op_type + (f" (domain '{n.domain}')" if n in foreign else "") for n in foreign + missing})
        more = ""
        if len(kinds) > 1:
            more = (f"; in all the file uses {len(kinds)} operators that minitf does not implement, in "
                    f"{len(foreign) + len(missing)} nodes: {', '.join(kinds)}")
        first = min(foreign + missing, key=list(nodes).index)
        if first in foreign:
            raise ValueError(f"{self.filename}: {self.describe(first)} is in the operator domain '{first.domain}', "
                             f"which minitf does not implement (it reads the standard ONNX operators){more}")
        raise ValueError(f"{self.filename}: {self.describe(first)} is not supported by minitf{more}: it reads "
                         f"{', '.join(sorted(CONVERTERS))}")

    def convert(self, node):
        if node.domain not in ("", "ai.onnx"):
            raise ValueError(f"{self.filename}: {self.describe(node)} is in the operator domain '{node.domain}', "
                             f"which minitf does not implement (it reads the standard ONNX operators)")
        rule = CONVERTERS.get(node.op_type)
        if rule is None:
            raise ValueError(f"{self.filename}: {self.describe(node)} is not supported by minitf: it reads "
                             f"{', '.join(sorted(CONVERTERS))}")
        ins = []
        for value in node.input:
            if value == "":
                ins.append(None)  # an optional input left out
            elif value not in self.node_of:
                raise ValueError(f"{self.filename}: {self.describe(node)} reads '{value}', which no input, "
                                 f"initializer or earlier node makes")
            else:
                ins.append(self.node_of[value])
        attrs = {}
        for attribute in node.attribute:
            value = self.onnx.helper.get_attribute_value(attribute)
            attrs[attribute.name] = value.decode() if isinstance(value, bytes) else value
        outs = rule(self, node, ins, attrs)
        for value, made in zip(node.output, outs):
            if value:
                self.node_of[value] = made

    # helpers for the converters
    def dtype_of(self, name):
        """The dtype of a constant, or of an input the file declares; float32 where neither says."""
        if name in self.known:
            return np.asarray(self.known[name]).dtype
        for entry in self.entries:
            if entry["name"] == name and entry["op"] == "placeholder" and entry["attrs"].get("dtype"):
                return np.dtype(entry["attrs"]["dtype"])
        return np.dtype(np.float32)

    def out(self, node, k=0):
        return node.output[k]

    def ndim(self, node, name):
        shape = self.shape[name]
        if shape is None:
            raise ValueError(f"{self.filename}: {self.describe(node)} needs the number of axes of '{name}', "
                             f"which the file leaves unknown")
        return len(shape)

    def ints(self, node, ins, attrs, k, attr, what):
        """A list of ints given as attribute `attr` (older opsets) or as input k (newer ones); None if neither."""
        if attr in attrs:
            return [int(v) for v in attrs[attr]]
        if len(ins) > k and ins[k] is not None:
            return [int(v) for v in np.atleast_1d(self.static(node, ins[k], what))]
        return None


# ---------------------------------------------------------------- one converter per operator
# rule(reader, node, inputs, attrs) -> the minitf names of the node's outputs. `inputs` are minitf
# node names (None for an optional input left out), `attrs` the ONNX attributes as Python values.

def _simple(op):
    def rule(r, node, ins, attrs):
        return [r.add(op, ins, name=r.out(node), onnx_node=node)]
    return rule


def _matmul(r, node, ins, attrs):
    a, b = ins
    # ONNX follows NumPy: a 1-D side is a row (left) or a column (right), removed again afterwards.
    a_1d, b_1d = r.ndim(node, a) == 1, r.ndim(node, b) == 1
    if a_1d:
        a = r.add("expand_dims", [a], {"axes": [0]}, name=f"{r.out(node)}/row")
    if b_1d:
        b = r.add("expand_dims", [b], {"axes": [1]}, name=f"{r.out(node)}/column")
    if not (a_1d or b_1d):
        return [r.add("matmul", [a, b], name=r.out(node), onnx_node=node)]
    y = r.add("matmul", [a, b], name=f"{r.out(node)}/matmul", onnx_node=node)
    axes = ([-2] if a_1d else []) + ([-1] if b_1d else [])
    return [r.add("squeeze", [y], {"axes": axes}, name=r.out(node))]


def _gemm(r, node, ins, attrs):
    # Y = alpha * A' @ B' + beta * C, with A' = A.T when transA, B' = B.T when transB.
    a, b = ins[0], ins[1]
    c = ins[2] if len(ins) > 2 else None
    out = r.out(node)
    if attrs.get("transA", 0):
        a = r.add("transpose", [a], name=f"{out}/transA")
    if attrs.get("transB", 0):
        b = r.add("transpose", [b], name=f"{out}/transB")
    alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
    dtype = r.dtype_of(b)
    y = r.add("matmul", [a, b], name=out if c is None and alpha == 1.0 else f"{out}/matmul", onnx_node=node)
    if alpha != 1.0:
        y = r.add("mul", [y, r.constant(np.asarray(alpha, dtype), f"{out}/alpha")],
                  name=out if c is None else f"{out}/scaled")
    if c is not None:
        if beta != 1.0:
            c = r.add("mul", [c, r.constant(np.asarray(beta, dtype), f"{out}/beta")], name=f"{out}/beta_c")
        y = r.add("add", [y, c], name=out, onnx_node=node)
    return [y]


def _gelu(r, node, ins, attrs):
    return [r.add("gelu", ins, {"approximate": attrs.get("approximate", "none")}, name=r.out(node), onnx_node=node)]


def _softmax(r, node, ins, attrs):
    (x,) = ins
    if r.opset >= 13:
        axis = int(attrs.get("axis", -1))
    else:
        # Before opset 13, Softmax flattened the axes from `axis` on into one: a softmax over all of them.
        ndim = r.ndim(node, x)
        axis = list(range(int(attrs.get("axis", 1)) % ndim, ndim))
        axis = axis[0] if len(axis) == 1 else axis
    return [r.add("softmax", [x], {"axis": axis}, name=r.out(node), onnx_node=node)]


def _reduce(op):
    def rule(r, node, ins, attrs):
        # axes: an attribute up to opset 12 (ReduceSum) or 17 (ReduceMean), an input from then on
        axes = r.ints(node, ins, attrs, 1, "axes", "the axes to reduce")
        keepdims = bool(attrs.get("keepdims", 1))
        if not axes:
            if attrs.get("noop_with_empty_axes", 0):
                return [r.add("identity", [ins[0]], name=r.out(node))]
            axes = None
        return [r.add(op, [ins[0]], {"axis": axes, "keepdims": keepdims}, name=r.out(node), onnx_node=node)]
    return rule


def _layer_norm(r, node, ins, attrs):
    if len([o for o in node.output if o]) > 1:
        raise ValueError(f"{r.filename}: {r.describe(node)} asks for its mean and inverse standard deviation "
                         f"too; minitf's layer_norm gives only Y (export for inference)")
    x, scale = ins[0], ins[1]
    bias = ins[2] if len(ins) > 2 else None
    if bias is None:
        bias = r.constant(np.zeros(r.shape[scale] or (), r.dtype_of(scale)), f"{r.out(node)}/bias")
    attrs = {"axis": int(attrs.get("axis", -1)), "epsilon": float(attrs.get("epsilon", 1e-5))}
    return [r.add("layer_norm", [x, scale, bias], attrs, name=r.out(node), onnx_node=node)]


def _transpose(r, node, ins, attrs):
    perm = attrs.get("perm")
    if perm is None:
        perm = list(range(r.ndim(node, ins[0])))[::-1]
    return [r.add("transpose", ins, {"perm": [int(p) for p in perm]}, name=r.out(node), onnx_node=node)]


def _reshape(r, node, ins, attrs):
    x = ins[0]
    target = [int(d) for d in (attrs["shape"] if "shape" in attrs else r.static(node, ins[1], "its target shape"))]
    if 0 in target and not attrs.get("allowzero", 0):
        # ONNX: a 0 copies the input's size on that axis.
        shape = r.shape[x]
        for axis, d in enumerate(target):
            if d == 0:
                if shape is None or axis >= len(shape) or shape[axis] is None:
                    r.static(node, x, f"the size of axis {axis} of '{x}' (its shape holds a 0)")
                target[axis] = shape[axis]
    return [r.add("reshape", [x], {"shape": target}, name=r.out(node), onnx_node=node)]


def _unsqueeze(r, node, ins, attrs):
    axes = r.ints(node, ins, attrs, 1, "axes", "the axes to insert")
    return [r.add("expand_dims", [ins[0]], {"axes": axes}, name=r.out(node), onnx_node=node)]


def _squeeze(r, node, ins, attrs):
    axes = r.ints(node, ins, attrs, 1, "axes", "the axes to remove")
    return [r.add("squeeze", [ins[0]], {"axes": axes}, name=r.out(node), onnx_node=node)]


def _concat(r, node, ins, attrs):
    return [r.add("concat", [i for i in ins if i is not None], {"axis": int(attrs["axis"])}, name=r.out(node),
                  onnx_node=node)]


def _split(r, node, ins, attrs):
    x = ins[0]
    axis = int(attrs.get("axis", 0))
    outputs = list(node.output)
    sizes = r.ints(node, ins, attrs, 1, "split", "the sizes of its parts")
    if sizes is None:
        size = r.shape[x][axis] if r.shape[x] is not None else None
        if size is None:
            r.static(node, x, f"the size of axis {axis} of '{x}'")
        n = len(outputs)
        chunk = -(-size // n)  # the last part is smaller when the size does not divide (opset 18)
        sizes = [min(chunk, size - k * chunk) for k in range(n)]
    made, start = [], 0
    for value, size in zip(outputs, sizes):
        made.append(r.add("slice", [x], {"starts": [start], "ends": [start + size], "axes": [axis]}, name=value,
                          onnx_node=node))
        start += size
    return made


def _slice(r, node, ins, attrs):
    if r.opset < 10:
        starts, ends = [int(v) for v in attrs["starts"]], [int(v) for v in attrs["ends"]]
        axes, steps = attrs.get("axes"), None
    else:
        starts = r.ints(node, ins, attrs, 1, "starts", "where it starts")
        ends = r.ints(node, ins, attrs, 2, "ends", "where it ends")
        axes = r.ints(node, ins, attrs, 3, "axes", "its axes")
        steps = r.ints(node, ins, attrs, 4, "steps", "its steps")
    if steps is not None and any(s != 1 for s in steps):
        raise ValueError(f"{r.filename}: {r.describe(node)} takes steps {steps}; minitf slices with step 1 only")
    axes = list(range(len(starts))) if axes is None else [int(a) for a in axes]
    attrs = {"starts": starts, "ends": ends, "axes": axes}
    return [r.add("slice", [ins[0]], attrs, name=r.out(node), onnx_node=node)]


def _gather(r, node, ins, attrs):
    return [r.add("gather", ins, {"axis": int(attrs.get("axis", 0))}, name=r.out(node), onnx_node=node)]


def _constant(r, node, ins, attrs):
    numpy_helper = r.onnx.numpy_helper
    if "value" in attrs:
        value = np.array(numpy_helper.to_array(attrs["value"]))
    elif "value_float" in attrs:
        value = np.asarray(attrs["value_float"], np.float32)
    elif "value_floats" in attrs:
        value = np.asarray(attrs["value_floats"], np.float32)
    elif "value_int" in attrs:
        value = np.asarray(attrs["value_int"], np.int64)
    elif "value_ints" in attrs:
        value = np.asarray(attrs["value_ints"], np.int64)
    else:
        raise ValueError(f"{r.filename}: {r.describe(node)} holds its value as {sorted(attrs)}, which minitf "
                         f"does not read")
    return [r.constant(value, r.out(node))]


def _cast(r, node, ins, attrs):
    dtype = np.dtype(r.onnx.helper.tensor_dtype_to_np_dtype(int(attrs["to"]))).name
    return [r.add("cast", ins, {"dtype": dtype}, name=r.out(node), onnx_node=node)]


def _shape(r, node, ins, attrs):
    x = ins[0]
    shape = r.shape[x]
    if shape is None or None in shape:
        r.static(node, x, f"the shape of '{x}'")
    dims = np.asarray(shape, dtype=np.int64)[int(attrs.get("start", 0)):attrs.get("end")]
    return [r.constant(dims, r.out(node))]


def _dropout(r, node, ins, attrs):
    # At inference a dropout passes its input through; a training-mode dropout is refused.
    if len(ins) > 2 and ins[2] is not None and bool(r.static(node, ins[2], "whether it trains")):
        raise ValueError(f"{r.filename}: {r.describe(node)} is in training mode; export the model in eval mode")
    return [r.add("identity", [ins[0]], name=r.out(node))]


CONVERTERS = {
    "Add": _simple("add"), "Sub": _simple("sub"), "Mul": _simple("mul"), "Div": _simple("div"),
    "Pow": _simple("pow"), "Neg": _simple("neg"), "Sqrt": _simple("sqrt"), "Exp": _simple("exp"),
    "Log": _simple("log"), "Relu": _simple("relu"), "Tanh": _simple("tanh"), "Sigmoid": _simple("sigmoid"),
    "Erf": _simple("erf"), "Gelu": _gelu, "Softmax": _softmax,
    "MatMul": _matmul, "Gemm": _gemm,
    "ReduceMean": _reduce("reduce_mean"), "ReduceSum": _reduce("reduce_sum"),
    "LayerNormalization": _layer_norm,
    "Transpose": _transpose, "Reshape": _reshape, "Unsqueeze": _unsqueeze, "Squeeze": _squeeze,
    "Concat": _concat, "Split": _split, "Slice": _slice, "Gather": _gather,
    "Constant": _constant, "Identity": _simple("identity"), "Cast": _cast, "Where": _simple("where"),
    "Shape": _shape, "Dropout": _dropout,
    "Equal": _simple("equal"), "Greater": _simple("greater"), "Less": _simple("less"),
}


def from_onnx(path, input_shapes=None):
    """(graph, inputs, outputs): the ONNX model at `path` as a minitf Graph, with its inputs as
    placeholders and its outputs as nodes, both in the file's order and with the file's names.
    `input_shapes` ({"x": (1, 8, 16)}) fixes sizes that the file leaves open."""
    from .serialize import build  # the Graph side: the runtime reads files without it

    spec, arrays = read_onnx(path, input_shapes)
    graph = build(spec, arrays)
    return graph, [graph.get(n) for n in spec["inputs"]], [graph.get(n) for n in spec["outputs"]]
