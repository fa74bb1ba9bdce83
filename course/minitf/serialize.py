"""Saving and loading graphs (lesson 3.3): a folder with a readable `graph.json` (the nodes, in
order, with op, inputs by name, attrs and shape) and `arrays.npz` (the values of constants and
variables, by node name). The same idea as an ONNX file: the model as data, not as code.
"""

import json
import zipfile
from pathlib import Path

import numpy as np

from .graph import Graph
from .ops import OPS  # importing ops registers every operation

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
    """The JSON structure and the arrays of a saved graph (used by `load` and by the runtime).

    A file that is missing, truncated or corrupt, or a node that reads a node not saved before
    it, is a ValueError (FileNotFoundError) naming the file and the node.
    """
    path = Path(path)
    graph_file, arrays_file = path / GRAPH_FILE, path / ARRAYS_FILE
    where = f"{path.name}/{GRAPH_FILE}"
    if not graph_file.is_file():
        raise FileNotFoundError(f"no saved graph in {path}: {GRAPH_FILE} is missing in that folder")
    try:
        spec = json.loads(graph_file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{where} is not a readable saved graph (truncated or corrupt?): {err}") from None
    if not isinstance(spec, dict) or spec.get("format") != FORMAT:
        found = spec.get("format") if isinstance(spec, dict) else None
        raise ValueError(f"{where} is not a saved minitf graph (format {found!r})")
    if not arrays_file.is_file():
        raise FileNotFoundError(f"{path.name}/{ARRAYS_FILE} is missing: a saved graph is both files")
    try:
        with np.load(arrays_file, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except (zipfile.BadZipFile, EOFError, OSError, ValueError, KeyError) as err:
        # NumPy reads a file that is not a zip archive as a pickle and then advises allow_pickle:
        # a saved graph never holds pickles, so the file is damaged.
        why = "it is not a NumPy .npz archive" if "pickle" in str(err) else f"{type(err).__name__}: {err}"
        raise ValueError(f"{path.name}/{ARRAYS_FILE} is not readable (truncated or corrupt?): {why}") from None
    _check_nodes(spec, where)
    return spec, arrays


def _check_nodes(spec, where):
    nodes = spec.get("nodes")
    if not isinstance(nodes, list):
        raise ValueError(f"{where} has no list of nodes")
    saved = set()
    for k, entry in enumerate(nodes):
        if not isinstance(entry, dict) or not {"name", "op", "inputs"} <= set(entry):
            raise ValueError(f"{where}: node {k} lacks its name, op or inputs")
        name = entry["name"]
        if entry["op"] not in OPS:
            raise ValueError(f"the saved graph uses an unknown operation '{entry['op']}' (node '{name}')")
        missing = [i for i in entry["inputs"] if i not in saved]
        if missing:
            raise ValueError(f"{where}: node '{name}' reads '{missing[0]}', which is not saved before it "
                             f"(a dangling input: the graph was edited or saved incompletely)")
        if name in saved:
            raise ValueError(f"{where}: two nodes are named '{name}'")
        saved.add(name)


def attrs_from_json(op, attrs):
    attrs = dict(attrs)
    if op == "placeholder" and attrs.get("shape") is not None:
        attrs["shape"] = tuple(attrs["shape"])
    return attrs


def load(path):
    """The graph saved in the folder `path`, with the same node names (and Variables with their values)."""
    spec, arrays = read(path)
    return build(spec, arrays)


def build(spec, arrays):
    """A Graph from the structure `read` returns (an ONNX file read by onnx_import gives the same)."""
    graph = Graph()
    by_name = {}
    for entry in spec["nodes"]:
        name = entry["name"]
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
