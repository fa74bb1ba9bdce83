"""An inference-only runtime (lesson 3.3): run a saved graph without the library that built it.

It reads graph.json and arrays.npz (or an ONNX file, lesson 3.4), looks up each node's forward kernel, and runs the nodes the
requested outputs need. No Graph objects, no gradients, no optimizer, no Session: variables are
frozen into constants, and a training operation in the file is refused. This is what an ONNX
runtime or TensorFlow Lite interpreter does, at toy size.
"""

import numpy as np

from . import shapes
from .ops import OPS, check_feed
from .serialize import attrs_from_json, read


class InferenceSession:
    """`InferenceSession(path).run(outputs, inputs)`: outputs by name, inputs a dict name -> array.

    `path` is a folder written by `save`, or an `.onnx` file (read by onnx_import.read_onnx, which
    gives the same list of nodes). `input_names` and `output_names` are the file's inputs and
    outputs (a saved folder lists its placeholders and no outputs).
    """

    def __init__(self, path):
        if str(path).lower().endswith(".onnx"):
            from .onnx_import import read_onnx  # only when serving an ONNX file (it needs the onnx package)

            spec, arrays = read_onnx(path)
        else:
            spec, arrays = read(path)
        self._dtypes = {}  # input name -> the dtype an ONNX file declares for it
        self._index = {}
        self._ops, self._inputs, self._attrs, self._values = [], [], [], []
        self.input_shapes = {}  # placeholder name -> declared shape
        for k, entry in enumerate(spec["nodes"]):
            name, op = entry["name"], entry["op"]
            opdef = OPS[op]
            if opdef.kind == "stateful":
                raise ValueError(f"node '{name}' is a training operation ('{op}'), which the inference "
                                 f"runtime does not run: save the graph pruned to its outputs")
            self._index[name] = k
            self._ops.append(opdef)
            self._inputs.append([self._index[i] for i in entry["inputs"]])
            attrs = attrs_from_json(op, entry["attrs"])
            self._attrs.append(attrs)
            self._values.append(arrays.get(name) if op in ("constant", "variable") else None)
            if op == "placeholder":
                self.input_shapes[name] = attrs.get("shape")
                if attrs.get("dtype"):
                    self._dtypes[name] = np.dtype(attrs["dtype"])
        self._names = [entry["name"] for entry in spec["nodes"]]
        self.input_names = spec.get("inputs", list(self.input_shapes))
        self.output_names = spec.get("outputs", [])
        for old, new in spec.get("aliases", {}).items():
            if old not in self._index and new in self._index:
                self._index[old] = self._index[new]
        self._plans = {}

    def _plan(self, targets):
        # Nodes are saved in topological order: one backward sweep marks what the targets need.
        needed = set(targets)
        for k in range(max(targets), -1, -1):
            if k in needed:
                needed.update(self._inputs[k])
        return sorted(needed)

    def run(self, outputs, inputs=None):
        """The values of `outputs` (a name or a list of names; None: the outputs an ONNX file names)
        given `inputs` {placeholder name: array}."""
        if outputs is None:
            if not self.output_names:
                raise ValueError("a graph saved by tf.save does not name its outputs: give their names")
            outputs = list(self.output_names)
        single = isinstance(outputs, str)
        names = [outputs] if single else list(outputs)
        for name in names:
            if name not in self._index:
                raise KeyError(f"the saved graph has no node named '{name}'")
        feeds = {}
        for name, value in (inputs or {}).items():
            if name not in self.input_shapes:
                raise KeyError(f"the saved graph has no input (placeholder) named '{name}'")
            value = np.asarray(value)
            declared = self._dtypes.get(name)
            if declared is not None and value.dtype != declared and value.dtype.kind == declared.kind:
                value = value.astype(declared)  # float64 fed to a float32 model: computed in float32, as the file says
            check_feed(name, self.input_shapes[name], value)
            feeds[self._index[name]] = value
        targets = tuple(self._index[n] for n in names)
        plan = self._plans.get(targets) or self._plans.setdefault(targets, self._plan(targets))
        values = {}
        for k in plan:
            opdef = self._ops[k]
            if opdef.kind == "source":
                if self._values[k] is not None:
                    values[k] = self._values[k]
                elif k in feeds:
                    values[k] = feeds[k]
                else:
                    raise ValueError(f"placeholder '{self._names[k]}' was not fed: give it in `inputs` "
                                     f"(shape {shapes.show(self.input_shapes[self._names[k]])})")
            else:
                values[k] = opdef.forward(*[values[i] for i in self._inputs[k]], **self._attrs[k])
        out = [values[t] for t in targets]
        return out[0] if single else out
