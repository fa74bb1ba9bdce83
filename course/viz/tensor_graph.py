"""Walking a course.tensor graph for `course.viz.draw_graph`.

Each tensor is a box with its label (if it has one), shape and dtype; its values and gradient are
shown only when it is small (a drawing of a 64x64 matrix would be unreadable). Each operation is a
small ellipse between its inputs and its result. Nodes are named t0, t1, ... and op0, op1, ... in
the order of the engine's topological walk, never by id(), so one graph gives one DOT text on every run.
"""

import numpy as np

__all__ = ["build"]


def _values(array, max_values):
    flat = np.asarray(array).ravel()
    if flat.size == 0 or flat.size > max_values:
        return None
    body = ", ".join(f"{v:.4g}" for v in flat.tolist())
    return body if flat.size == 1 else f"[{body}]"


def _label(t, show_values, max_values):
    lines = []
    if t.label:
        lines.append(t.label)
    lines.append(f"{tuple(t.shape)} {t.dtype}")
    if show_values:
        data = _values(t.data, max_values)
        if data is not None:
            lines.append(f"data {data}")
        if t.grad is not None:
            grad = _values(t.grad, max_values)
            if grad is not None:
                lines.append(f"grad {grad}")
    return "\\n".join(lines)


def build(root, digraph, show_values=True, max_values=4, max_nodes=500):
    """Add the graph that produced `root` to `digraph`; return (digraph, number of tensor nodes).

    show_values: print data (and grad, once computed) of tensors with at most `max_values` elements.
    max_nodes: refuse to draw bigger graphs (graphviz would take minutes), with a clear error.
    """
    # The engine's own walk: every tensor the root depends on, inputs first, without recursion.
    order = root.topological_order()
    if len(order) > max_nodes:
        raise ValueError(f"draw_graph: the graph has {len(order)} tensors, more than max_nodes={max_nodes}: "
                         f"draw a smaller piece, or pass a larger max_nodes")
    names = {}
    n_ops = 0
    for i, t in enumerate(order):
        name = f"t{i}"
        names[id(t)] = name
        style = {"style": "filled", "fillcolor": "#dde8f8"} if t.requires_grad and not t.inputs else {}
        digraph.node(name, _label(t, show_values, max_values), shape="box", **style)
        if t.inputs:
            op = f"op{n_ops}"
            n_ops += 1
            digraph.node(op, t.op or "?", shape="ellipse", fontsize="10")
            for parent in t.inputs:
                if parent is None:
                    continue
                digraph.edge(names[id(parent)], op)
            digraph.edge(op, name)
    return digraph, len(order)
