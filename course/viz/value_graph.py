"""Drawing the graph of a micrograd `Value` (course.micrograd), for `course.viz.draw_graph`.

It reads only `data`, `grad`, `_op`, `_prev` and, where there is one, `label`: so the Value a
learner builds in lesson 1.2 draws the same way as course.micrograd's.

Each Value is a record node `label | data | grad`; each operation is a small ellipse between its
inputs and its output. Nodes are named by their position in a fixed walk of the graph (v0, v1,
...; the operation that made v3 is op3), never by id(), so the same graph gives the same DOT
text on every run. The walk uses an explicit stack: deep graphs do not hit the recursion limit.
"""

from course._graph import topological_order


def _walk(root):
    """Every Value under `root` once, inputs before outputs, inputs in operand order."""
    return topological_order([root], lambda v: v._prev)


def _escape(text):
    # These characters structure a graphviz record label; in a name they must be escaped.
    for ch in "\\{}|<>\"":
        text = text.replace(ch, "\\" + ch)
    return text


def _number(x, precision):
    # round() then + 0.0 turns a tiny negative into 0.0, so no "-0.0000" appears.
    return f"{round(x, precision) + 0.0:.{precision}f}"


def build(root, digraph, precision=4, max_nodes=500):
    """Add the graph of `root` to `digraph`; return (digraph, number of Values drawn).

    precision: digits after the point for data and grad. max_nodes: a graph bigger than this is
    refused with a ValueError, since graphviz would take minutes to lay it out and the picture
    would be unreadable anyway.
    """
    nodes = _walk(root)
    if len(nodes) > max_nodes:
        raise ValueError(f"this graph has {len(nodes)} Values, more than max_nodes={max_nodes}: "
                         f"draw a smaller one, or pass max_nodes=... to draw it anyway")
    name = {id(v): f"v{i}" for i, v in enumerate(nodes)}
    for i, v in enumerate(nodes):
        label = getattr(v, "label", "")
        fields = [_escape(label)] if label else []
        fields += [f"data {_number(v.data, precision)}", f"grad {_number(v.grad, precision)}"]
        digraph.node(f"v{i}", label="{ " + " | ".join(fields) + " }", shape="record")
        if v._prev:
            op = f"op{i}"
            digraph.node(op, label=_escape(v._op) or "?", shape="ellipse", width="0.3", height="0.3",
                         fontsize="10")
            # One edge per operand: `a + a` shows two arrows from a, the two gradient contributions.
            for child in v._prev:
                digraph.edge(name[id(child)], op)
            digraph.edge(op, f"v{i}")
    return digraph, len(nodes)
