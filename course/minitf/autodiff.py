"""Symbolic differentiation (lesson 3.2): `gradients(ys, xs)` adds the gradient nodes to the graph.

Reverse mode, on the graph rather than on values:
1. the nodes `ys` depend on, in topological order;
2. of those, the ones that lie on a path from some x to ys (the others get no gradient);
3. walk them in reverse order: by the time a node is reached, every node that reads it has
   already been walked, so its gradient is complete: the sum of what each reader sent back.

Step 3 is what breadth-first versions get wrong: they wait for every reader of a node, including
readers that do not lead to ys (a variable that also feeds a dead branch), or they overwrite
instead of summing (a node used twice, `x * x`, a skip connection).
"""

from .graph import Node, topological_order
from .ops import OPS, add, constant, ones_like


def gradients(ys, xs, grad_ys=None):
    """Nodes for d(sum of ys)/dx for each x in `xs` (a list of nodes, or None where x does not reach ys).

    `ys` is a node or a list of nodes; a node that is not a scalar starts from ones, as if its
    elements were summed (or from `grad_ys`). Given one node as `xs`, returns one node.
    """
    single = isinstance(xs, Node)
    xs = [xs] if single else list(xs)
    ys = [ys] if isinstance(ys, Node) else list(ys)
    if grad_ys is not None:
        grad_ys = [grad_ys] if isinstance(grad_ys, Node) else list(grad_ys)
    graph = ys[0].graph

    order = topological_order(ys)
    # The nodes that some x reaches: only they get (and pass on) gradients.
    on_path = set(xs)
    for node in order:
        if any(i in on_path for i in node.inputs):
            on_path.add(node)

    with graph.as_default(), graph.name_scope("gradients"):
        contributions = {}  # node -> list of gradient nodes sent back by its readers
        for k, y in enumerate(ys):
            if grad_ys is not None:
                seed = grad_ys[k]
            elif y.shape == ():
                seed = constant(1.0, name="ones")
            else:
                seed = ones_like(y, name="ones")
            contributions.setdefault(y, []).append(seed)

        grads = {}
        for node in reversed(order):
            if node not in on_path or node not in contributions:
                continue
            parts = contributions.pop(node)
            g = parts[0]
            for part in parts[1:]:  # a node read several times: the contributions add up
                g = add(g, part)
            grads[node] = g
            if not node.inputs:
                continue
            needs = [i in on_path for i in node.inputs]
            rule = OPS[node.op].grad
            if rule is None:
                raise ValueError(f"operation '{node.op}' (node '{node.name}') has no gradient rule")
            for inp, need, gi in zip(node.inputs, needs, rule(node, g, needs)):
                if need and gi is not None:
                    contributions.setdefault(inp, []).append(gi)

    result = [grads.get(x) for x in xs]
    return result[0] if single else result
