"""Saving and loading graphs (lesson 3.3): a folder with a readable `graph.json` (the nodes, in
order, with op, inputs by name, attrs and shape) and `arrays.npz` (the values of constants and
variables, by node name). The same idea as an ONNX file: the model as data, not as code.
"""

import json
from pathlib import Path

import numpy as np

from .graph import Graph
from .ops import OPS

FORMAT = "minitf-graph"
VERSION = 1
GRAPH_FILE = "graph.json"
ARRAYS_FILE = "arrays.npz"


def _jsonable(value):
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def to_dict(graph):
    """The JSON structure of a graph (without the arrays)."""
    nodes = []
    for node in graph.nodes:
        nodes.append({"name": node.name, "op": node.op, "inputs": [i.name for i in node.inputs],
                      "attrs": _jsonable(node.attrs),
                      "shape": None if node.shape is None else list(node.shape)})
    return {"format": FORMAT, "version": VERSION, "nodes": nodes, "aliases": dict(graph.aliases)}


def save(graph, path):
    """Write `graph` into the folder `path` (made if needed): graph.json and arrays.npz."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / GRAPH_FILE).write_text(json.dumps(to_dict(graph), indent=1) + "\n", encoding="utf-8")
    arrays = {n.name: np.asarray(n.value) for n in graph.nodes if n.value is not None}
    np.savez(path / ARRAYS_FILE, **arrays)
    return path


def read(path):
    """The JSON structure and the arrays of a saved graph (used by `load` and by the runtime)."""
    path = Path(path)
    if not (path / GRAPH_FILE).is_file():
        raise FileNotFoundError(f"no saved graph here: {GRAPH_FILE} is missing in the folder given")
    spec = json.loads((path / GRAPH_FILE).read_text(encoding="utf-8"))
    if spec.get("format") != FORMAT:
        raise ValueError(f"{GRAPH_FILE} is not a saved minitf graph (format {spec.get('format')!r})")
    with np.load(path / ARRAYS_FILE, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    for entry in spec["nodes"]:
        if entry["op"] not in OPS:
            raise ValueError(f"the saved graph uses an unknown operation '{entry['op']}' "
                             f"(node '{entry['name']}')")
    return spec, arrays


def attrs_from_json(op, attrs):
    attrs = dict(attrs)
    if op == "placeholder" and attrs.get("shape") is not None:
        attrs["shape"] = tuple(attrs["shape"])
    return attrs


def load(path):
    """The graph saved in the folder `path`, with the same node names (and Variables with their values)."""
    spec, arrays = read(path)
    graph = Graph()
    by_name = {}
    for entry in spec["nodes"]:
        name = entry["name"]
        missing = [i for i in entry["inputs"] if i not in by_name]
        if missing:
            raise ValueError(f"node '{name}' reads '{missing[0]}', which is not saved before it")
        value = None
        if entry["op"] in ("constant", "variable"):
            if name not in arrays:
                raise ValueError(f"the array of node '{name}' is missing from {ARRAYS_FILE}")
            value = arrays[name]
        by_name[name] = graph.add_node(entry["op"], [by_name[i] for i in entry["inputs"]],
                                       attrs_from_json(entry["op"], entry["attrs"]), name=name,
                                       value=value, exact_name=True)
    graph.aliases.update(spec.get("aliases", {}))
    return graph
