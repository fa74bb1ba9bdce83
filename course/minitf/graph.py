"""The graph: nodes that describe a computation, built first and run later (lesson 3.1).

A `Node` is a promise of a value: an operation name (`op`), the nodes it reads (`inputs`),
fixed settings (`attrs`, such as a reduction axis) and a shape known before anything runs.
A `Graph` keeps its nodes in creation order. Inputs always exist before the node that reads
them, so creation order is already a topological order; `topological_order` finds the smaller
order that one set of outputs needs.
"""

from contextlib import contextmanager

import numpy as np

from .. import _graph
from .shapes import show as show_shape

_DEFAULT_STACK = []


# ---------------------------------------------------------------- the operations a node may have

class OpDef:
    """What the library knows about one operation (ops.py registers each one).

    kind: "pure" (a function of its inputs), "source" (placeholder, Variable, constant) or
    "stateful" (changes a Variable, or only groups other nodes): compiler passes leave the last
    two alone, and the inference runtime refuses "stateful" ones.
    """

    def __init__(self, name, forward, shape, grad=None, elementwise=False, kind="pure"):
        self.name = name
        self.forward = forward
        self.shape = shape
        self.grad = grad
        self.elementwise = elementwise
        self.kind = kind

    def infer_shape(self, input_shapes, attrs, value, op_name):
        if value is not None:
            return tuple(np.shape(value))
        try:
            return self.shape(*input_shapes, **attrs)
        except ValueError as err:
            raise ValueError(f"{err} (while building node '{op_name}')") from None

    def __repr__(self):
        return f"<OpDef {self.name} ({self.kind})>"


# Operation name -> OpDef. Filled by ops.py; a Graph looks operations up here when it adds a node.
OPS = {}


def register(name, forward, shape, grad=None, elementwise=False, kind="pure"):
    OPS[name] = OpDef(name, forward, shape, grad, elementwise, kind)
    return OPS[name]


def _operator(op, reflected=False):
    """The method behind `node + other` (or `other + node`, reflected) for the operation `op`."""
    def method(self, other):
        return self._binary(op, other, reflected)
    return method


class Node:
    """One operation in a graph. Its value exists only inside `Session.run`."""

    # Makes `ndarray + node` call `node.__radd__` instead of NumPy looping over the array.
    __array_ufunc__ = None

    def __init__(self, graph, op, inputs, attrs, name, shape, value=None):
        self.graph = graph
        self.op = op
        self.inputs = tuple(inputs)
        self.attrs = attrs
        self.name = name
        self.shape = shape  # a tuple (None for a dimension unknown until run time), or None: unknown
        self.value = value  # the array of a constant or a Variable; None for every other node

    def __repr__(self):
        return f"<minitf.Node '{self.name}' op={self.op} shape={show_shape(self.shape)}>"

    # The operators add a node to this node's graph, as tf.add, tf.multiply, ... of ops.py do; a
    # number or an array on the other side becomes a constant.
    def _binary(self, op, other, reflected=False):
        other = self.graph.as_node(other)
        return self.graph.add_node(op, (other, self) if reflected else (self, other))

    __add__, __radd__ = _operator("add"), _operator("add", reflected=True)
    __sub__, __rsub__ = _operator("sub"), _operator("sub", reflected=True)
    __mul__, __rmul__ = _operator("mul"), _operator("mul", reflected=True)
    __truediv__, __rtruediv__ = _operator("div"), _operator("div", reflected=True)
    __pow__, __rpow__ = _operator("pow"), _operator("pow", reflected=True)
    __matmul__, __rmatmul__ = _operator("matmul"), _operator("matmul", reflected=True)

    def __neg__(self):
        return self.graph.add_node("neg", (self,))


class Graph:
    """A list of nodes with unique names, in the order they were created."""

    def __init__(self):
        self.nodes = []
        self._by_name = {}
        self._counts = {}
        self._scopes = []
        self._reserved = set()  # names a compiler pass will copy over later (never given away)
        self.aliases = {}  # old name -> name of the node that replaced it (a compiler pass merged them)

    def __len__(self):
        return len(self.nodes)

    def __iter__(self):
        return iter(self.nodes)

    def __repr__(self):
        return f"<minitf.Graph with {len(self.nodes)} nodes>"

    @contextmanager
    def as_default(self):
        """Inside `with graph.as_default():` new placeholders, variables and constants go into `graph`."""
        _DEFAULT_STACK.append(self)
        try:
            yield self
        finally:
            _DEFAULT_STACK.pop()

    @contextmanager
    def name_scope(self, scope):
        """Prefix the names of the nodes made inside: `gradients/mul`, `gradients/mul_1`, ..."""
        self._scopes.append(scope)
        try:
            yield
        finally:
            self._scopes.pop()

    def unique_name(self, base):
        """`base` if it is free, else `base_1`, `base_2`, ... (as TensorFlow 1 names nodes)."""
        if self._scopes:
            base = "/".join(self._scopes) + "/" + base
        name = base
        while name in self._by_name or name in self._reserved:
            self._counts[base] = self._counts.get(base, 0) + 1
            name = f"{base}_{self._counts[base]}"
        return name

    def add_node(self, op, inputs=(), attrs=None, name=None, value=None, exact_name=False):
        """Create a node; its shape is inferred now, so shape errors appear while building."""
        if op not in OPS:
            raise ValueError(f"unknown operation {op!r}")
        for node in inputs:
            if node.graph is not self:
                raise ValueError(f"node '{node.name}' belongs to another graph than the node being built ({op})")
        attrs = dict(attrs or {})
        if exact_name:
            if name in self._by_name:
                raise ValueError(f"the graph already has a node named '{name}'")
            self._reserved.discard(name)
        else:
            name = self.unique_name(name or op)
        shape = OPS[op].infer_shape([n.shape for n in inputs], attrs, value, op_name=name)
        node = Node(self, op, inputs, attrs, name, shape, value)
        self.nodes.append(node)
        self._by_name[name] = node
        return node

    def as_node(self, value):
        """Nodes pass through; numbers and arrays become constants of this graph."""
        if isinstance(value, Node):
            return value
        if isinstance(value, Graph):
            raise TypeError("expected a node or a number, got a Graph")
        return self.add_node("constant", (), {}, name="Const", value=as_array(value))

    @contextmanager
    def reserving(self, names):
        """Inside, new nodes never get any of `names` unless asked for by exact name: a compiler
        pass copies nodes over under their old names, and a node it makes on the way (a folded
        constant) must not take a name that a later node will need."""
        self._reserved = set(names)
        try:
            yield self
        finally:
            self._reserved = set()

    def get(self, name):
        """The node called `name` (following the aliases a compiler pass left)."""
        if isinstance(name, Node):
            return name
        seen = 0
        while name not in self._by_name and name in self.aliases and seen < 1000:
            name, seen = self.aliases[name], seen + 1
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"the graph has no node named '{name}'") from None

    def __contains__(self, name):
        try:
            self.get(name)
        except KeyError:
            return False
        return True

    def count_ops(self):
        """How many nodes of each operation: {'add': 3, 'matmul': 2, ...}, sorted by name."""
        counts = {}
        for node in self.nodes:
            counts[node.op] = counts.get(node.op, 0) + 1
        return dict(sorted(counts.items()))


def as_array(value):
    """Arrays keep their dtype; Python numbers and lists become float64 arrays."""
    if isinstance(value, np.ndarray):
        return value
    return np.asarray(value, dtype=np.float64)


_GLOBAL_DEFAULT = Graph()


def get_default_graph():
    """The graph new nodes go into: the innermost `as_default()`, else a global one."""
    return _DEFAULT_STACK[-1] if _DEFAULT_STACK else _GLOBAL_DEFAULT


def reset_default_graph():
    """Start the global default graph afresh (as at the start of a notebook)."""
    global _GLOBAL_DEFAULT
    _GLOBAL_DEFAULT = Graph()
    return _GLOBAL_DEFAULT


def topological_order(targets, stop=()):
    """The nodes `targets` depend on, each after its inputs (iterative: no recursion limit).

    Nodes in `stop` (fed values) are included but their inputs are not followed.
    """
    return _graph.topological_order(targets, _inputs, stop)


def _inputs(node):
    return node.inputs
