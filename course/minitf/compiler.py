"""A small graph compiler (lesson 3.3). Each pass takes a graph and returns a new graph that
computes the same outputs with fewer or cheaper nodes; the input graph is left as it was.

    infer_shapes(graph, input_shapes)    fix the placeholders' shapes, recompute every shape
    fold_constants(graph)                nodes whose inputs are all constants become constants
    eliminate_common_subexpressions(g)   two nodes with the same op, inputs and attrs become one
    eliminate_dead_code(graph, outputs)  drop what the outputs do not need
    fuse_elementwise(graph, outputs)     chains of elementwise ops become one "fused" node
    optimize(graph, outputs)             all of them, in that order

Nodes keep their names, so an output can be found by name in the new graph (`graph.get(name)`);
where a pass merges a node into another, `graph.aliases` maps the old name to the survivor.
Variables of the new graph start from the same arrays as the old graph's.
"""

import json

import numpy as np

from . import shapes
from .graph import Graph, topological_order
from .ops import OPS


def copy_node(node, inputs, graph):
    """Add to `graph` a node like `node` (same op, attrs, value and name) reading `inputs`."""
    return graph.add_node(node.op, inputs, dict(node.attrs), name=node.name, value=node.value, exact_name=True)


# What `visit` returns for a node that the new graph computes inside another one (fusion).
DROP = object()


def rewrite(graph, visit=None, keep=None, mapping=None):
    """Copy `graph` into a new graph, node by node, in creation order.

    `visit(node, inputs, new_graph)` sees each old node with its inputs already in the new graph
    and may return a node of the new graph to stand for it (a new one or an existing one);
    returning None copies the node unchanged, and returning DROP leaves it out (its value is
    computed inside the node that reads it; no other node may read it). `keep`: copy only what
    these nodes need. `mapping`: a dict that the copy fills with old node -> new node, for a
    visit that needs the new node of something other than its inputs.
    Inside `visit`, new constants and variables go into the new graph.
    """
    new = Graph()
    needed = None if keep is None else set(topological_order([graph.get(k) for k in keep]))
    mapping = {} if mapping is None else mapping
    with new.as_default(), new.reserving(n.name for n in graph.nodes):
        for node in graph.nodes:
            if needed is not None and node not in needed:
                continue
            inputs = [mapping.get(i) for i in node.inputs]
            out = visit(node, inputs, new) if visit is not None else None
            if out is DROP:
                continue
            if out is None:
                dropped = [i.name for i, new_i in zip(node.inputs, inputs) if new_i is None]
                if dropped:
                    raise ValueError(f"node '{node.name}' reads '{dropped[0]}', which the pass dropped")
                out = copy_node(node, inputs, new)
            mapping[node] = out
            if out.name != node.name:
                new.aliases[node.name] = out.name
    _carry_aliases(graph, new, mapping)
    return new


def _carry_aliases(old, new, mapping):
    for name, target in old.aliases.items():
        try:
            node = old.get(target)
        except KeyError:
            continue
        if node in mapping:
            new.aliases[name] = mapping[node].name


def _is_pure(node):
    return OPS[node.op].kind == "pure"


# ---------------------------------------------------------------- shape inference

def infer_shapes(graph, input_shapes=None):
    """A copy whose placeholders take the shapes given by name ({"x": (32, 2)}), with every
    node's shape worked out again from them: a shape error shows up here, before any run."""
    input_shapes = dict(input_shapes or {})
    unknown = set(input_shapes) - {n.name for n in graph.nodes if n.op == "placeholder"}
    if unknown:
        raise KeyError(f"no placeholder named {sorted(unknown)[0]!r} in the graph")

    def visit(node, inputs, new):
        if node.op == "placeholder" and node.name in input_shapes:
            shape = shapes.merge(node.shape, input_shapes[node.name], node.name)
            return new.add_node("placeholder", (), {"shape": shape}, name=node.name, exact_name=True)
        return None

    return rewrite(graph, visit)


# ---------------------------------------------------------------- constant folding

def fold_constants(graph):
    """A pure node whose inputs are all constants is computed now and becomes a constant."""

    def visit(node, inputs, new):
        if node.inputs and _is_pure(node) and all(i.op == "constant" for i in inputs):
            value = np.asarray(OPS[node.op].forward(*[i.value for i in inputs], **node.attrs))
            return new.add_node("constant", (), {}, name=node.name, value=value, exact_name=True)
        return None

    return rewrite(graph, visit)


# ---------------------------------------------------------------- common subexpressions

def _key(node, inputs):
    if node.op == "constant":
        v = np.asarray(node.value)
        return ("constant", v.dtype.str, v.shape, v.tobytes())
    return (node.op, tuple(id(i) for i in inputs), json.dumps(node.attrs, sort_keys=True, default=str))


def eliminate_common_subexpressions(graph):
    """Two pure nodes (or constants) with the same op, the same inputs and the same attrs compute
    the same value: keep the first one and let the readers of the second read it."""
    seen = {}

    def visit(node, inputs, new):
        if not (_is_pure(node) or node.op == "constant"):
            return None  # two placeholders or two variables are different things
        key = _key(node, inputs)
        if key in seen:
            return seen[key]
        seen[key] = copy_node(node, inputs, new)
        return seen[key]

    return rewrite(graph, visit)


# ---------------------------------------------------------------- dead code

def eliminate_dead_code(graph, outputs):
    """Only the nodes that `outputs` (nodes or names) depend on."""
    return rewrite(graph, keep=[o if isinstance(o, str) else o.name for o in outputs])


# ---------------------------------------------------------------- elementwise fusion

def fuse_elementwise(graph, outputs=None):
    """Every tree of elementwise nodes whose inner results nobody else reads becomes one "fused"
    node: one dispatch instead of several, and the inner results reuse one buffer.

    The fused node keeps the name of the last node of the tree. `outputs` are never fused away.
    """
    keep = {graph.get(o if isinstance(o, str) else o.name) for o in (outputs or [])}
    readers = {}
    for node in graph.nodes:
        for i in node.inputs:
            readers[i] = readers.get(i, 0) + 1

    def fusable(n):
        return OPS[n.op].elementwise and OPS[n.op].kind == "pure"

    root_of, members = {}, {}
    for node in reversed(graph.nodes):  # from the outputs down: the root of each tree comes first
        if not fusable(node) or node in root_of:
            continue
        root_of[node] = node
        group, frontier = [node], [node]
        while frontier:
            m = frontier.pop()
            for p in m.inputs:
                if fusable(p) and p not in root_of and readers.get(p) == 1 and p not in keep:
                    root_of[p] = node
                    group.append(p)
                    frontier.append(p)
        members[node] = group

    index = {n: i for i, n in enumerate(graph.nodes)}
    mapping = {}

    def visit(node, inputs, new):
        root = root_of.get(node)
        if root is None or len(members[root]) == 1:
            return None           # not elementwise, or alone: copied as it is
        if root is not node:
            return DROP           # an inner node: computed inside its root's fused node
        group = sorted(members[node], key=index.__getitem__)
        step_of = {m: j for j, m in enumerate(group)}
        outside, steps = [], []
        for m in group:
            args = []
            for i in m.inputs:
                if i in step_of:
                    args.append(["step", step_of[i]])
                else:
                    if i not in outside:
                        outside.append(i)
                    args.append(["in", outside.index(i)])
            steps.append({"op": m.op, "attrs": dict(m.attrs), "args": args})
        return new.add_node("fused", [mapping[i] for i in outside], {"steps": steps},
                            name=node.name, exact_name=True)

    return rewrite(graph, visit, mapping=mapping)


def describe_fused(node):
    """'sub > exp > mul': the operations a fused node runs."""
    return " > ".join(st["op"] for st in node.attrs["steps"])


# ---------------------------------------------------------------- all passes

def optimize(graph, outputs, input_shapes=None):
    """Shape inference, constant folding, CSE, dead-code elimination and fusion, in that order."""
    names = [o if isinstance(o, str) else o.name for o in outputs]
    g = infer_shapes(graph, input_shapes)
    g = fold_constants(g)
    g = eliminate_common_subexpressions(g)
    g = eliminate_dead_code(g, names)
    return fuse_elementwise(g, names)
