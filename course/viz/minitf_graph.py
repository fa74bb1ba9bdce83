"""Drawing minitf graphs: placeholders, variables and constants as boxes, operations as ellipses.

`build(root, digraph, ...)` takes a Graph (draw all of it) or a node (draw what it depends on).
DOT names are n0, n1, ... in the graph's creation order, never `id()`, so the source is the same
on every run. Gradient nodes (those made by `gradients`, named "gradients/...") can be
highlighted, and the training nodes ("GradientDescent/...") get their own colour.
"""

import numpy as np

from course.minitf.shapes import show as _shape_text  # loaded only to draw a minitf graph

SOURCE_STYLE = {
    "placeholder": {"shape": "box", "style": "filled,rounded", "fillcolor": "#cfe2ff"},
    "variable": {"shape": "box", "style": "filled", "fillcolor": "#ffe0b3"},
    "constant": {"shape": "box", "style": "filled", "fillcolor": "#e6e6e6", "fontsize": "10"},
}
OP_STYLE = {"shape": "ellipse"}
GRADIENT_STYLE = {"style": "filled", "fillcolor": "#f8c8d0"}
TRAIN_STYLE = {"style": "filled", "fillcolor": "#c9f0c9"}
FUSED_STYLE = {"shape": "octagon", "style": "filled", "fillcolor": "#fff3b0"}


def _value_text(value):
    v = np.asarray(value)
    if v.size == 1:
        return f"{v.item():.4g}"
    return f"array{_shape_text(v.shape)}"


def _label(node, show_shapes):
    if node.op == "placeholder":
        text = f"{node.name}\nplaceholder"
    elif node.op == "variable":
        text = f"{node.name}\nVariable"
    elif node.op == "constant":
        text = f"{node.name}\n{_value_text(node.value)}"
    elif node.op == "fused":
        text = f"{node.name}\nfused: " + " > ".join(st["op"] for st in node.attrs["steps"])
    else:
        base = node.name.split("/")[-1]
        same = base == node.op or (base.startswith(node.op + "_") and base[len(node.op) + 1:].isdigit())
        text = node.name if same else f"{node.name}\n{node.op}"  # "add_1" already says add
    if show_shapes and node.op not in ("constant", "group"):
        text += f"\n{_shape_text(node.shape)}"
    return text


def build(root, digraph, highlight_gradients=True, show_shapes=True):
    """Add the nodes and edges of `root` (a Graph or a node) to `digraph`; return (digraph, n_nodes)."""
    from course.minitf.graph import Graph, topological_order

    if isinstance(root, Graph):
        nodes = list(root.nodes)
    else:
        order = set(topological_order([root]))
        nodes = [n for n in root.graph.nodes if n in order]  # creation order: stable numbering
    ids = {node: f"n{i}" for i, node in enumerate(nodes)}
    for node in nodes:
        style = dict(SOURCE_STYLE.get(node.op, OP_STYLE))
        if node.op == "fused":
            style = dict(FUSED_STYLE)
        if highlight_gradients and node.name.startswith("gradients/"):
            style.update(GRADIENT_STYLE)
        elif highlight_gradients and node.name.split("/")[0] == "GradientDescent":
            style.update(TRAIN_STYLE)
        digraph.node(ids[node], _label(node, show_shapes), **style)
    for node in nodes:
        for inp in node.inputs:
            if inp in ids:
                digraph.edge(ids[inp], ids[node])
    return digraph, len(nodes)
