"""Running a graph (lesson 3.1): `Session(graph).run(fetches, feed_dict)`.

A run works out which nodes the fetches need (stopping at fed nodes), orders them so that every
node comes after its inputs, and evaluates each one once, keeping the values in a dict for the
length of the run. The plan is remembered, so running the same fetches again skips the search.
"""

import numpy as np

from . import shapes
from .graph import Node, get_default_graph, topological_order
from .ops import OPS, check_feed


class Session:
    """Evaluates nodes of one graph. `with Session() as sess:` works as in TensorFlow 1."""

    def __init__(self, graph=None):
        self.graph = graph if graph is not None else get_default_graph()
        self._plans = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def _node(self, x, role):
        if isinstance(x, str):
            return self.graph.get(x)
        if not isinstance(x, Node):
            raise TypeError(f"{role} must be nodes (or their names), got {type(x).__name__}")
        if x.graph is not self.graph:
            raise ValueError(f"node '{x.name}' belongs to another graph than this session's")
        return x

    def run(self, fetches, feed_dict=None):
        """The values of `fetches` (a node, a name, or a list of them) as NumPy arrays."""
        single = not isinstance(fetches, (list, tuple))
        targets = [self._node(f, "fetches") for f in ([fetches] if single else fetches)]
        feeds = {}
        for key, value in (feed_dict or {}).items():
            node = self._node(key, "feed_dict keys")
            value = np.asarray(value)
            if node.op == "placeholder":
                check_feed(node.name, node.shape, value)
            elif node.shape is not None and not shapes.compatible(node.shape, value.shape):
                raise ValueError(f"node '{node.name}' has shape {shapes.show(node.shape)}, but the array fed "
                                 f"for it has shape {shapes.show(value.shape)}")
            feeds[node] = value

        key = (tuple(targets), frozenset(feeds))
        plan = self._plans.get(key)
        if plan is None:
            plan = [n for n in topological_order(targets, stop=feeds) if n not in feeds]
            for node in plan:
                if node.op == "placeholder":
                    raise ValueError(f"placeholder '{node.name}' was not fed: give it a value in feed_dict "
                                     f"(shape {shapes.show(node.shape)})")
            self._plans[key] = plan

        values = dict(feeds)
        for node in plan:
            values[node] = self._evaluate(node, values)
        out = [values[t] for t in targets]
        return out[0] if single else out

    @staticmethod
    def _evaluate(node, values):
        opdef = OPS[node.op]
        args = [values[i] for i in node.inputs]
        try:
            if opdef.kind == "pure":
                return opdef.forward(*args, **node.attrs)
            return opdef.forward(node, *args)  # sources and stateful operations look at the node itself
        except Exception as err:
            raise RuntimeError(f"while running node '{node.name}' ({node.op}): {err}") from err
