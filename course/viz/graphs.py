"""Drawing computation graphs with graphviz.

`draw_graph(root)` walks the graph that produced `root` and returns a `Drawing`, which a notebook
shows as a PNG. Node names are numbered in a fixed order (never `id()`), so the same graph gives
the same drawing source on every run. Each engine has its own small walker that lists the nodes:
course/viz/value_graph.py for micrograd's Value, and one module per later engine.
"""

import importlib
import shutil

import graphviz

DOT_HINT = ("graphviz's `dot` program is not installed, so graphs cannot be drawn: install it "
            "(apt-get install graphviz, brew install graphviz, or conda install graphviz).")

# The module of the engine -> the module of course.viz that knows how to walk its graphs.
WALKERS = {
    "course.micrograd": "course.viz.value_graph",
    "course.tensor": "course.viz.tensor_graph",
    "course.minitf": "course.viz.minitf_graph",
}


def dot_available():
    return shutil.which("dot") is not None


class Drawing:
    """A graphviz drawing that Jupyter shows as a PNG (not SVG: SVG differs between graphviz versions)."""

    def __init__(self, digraph, n_nodes):
        self.digraph = digraph
        self.n_nodes = n_nodes

    @property
    def source(self):
        """The DOT text of the drawing: deterministic, so it can be compared."""
        return self.digraph.source

    def _repr_png_(self):
        if not dot_available():
            print(DOT_HINT)
            return None
        return self.digraph.pipe(format="png")

    def save(self, path, format="png"):
        """Write the drawing to `path` (PNG by default)."""
        if not dot_available():
            raise RuntimeError(DOT_HINT)
        with open(path, "wb") as f:
            f.write(self.digraph.pipe(format=format))
        return path

    def __repr__(self):
        return f"<Drawing of a graph with {self.n_nodes} nodes>"


def new_digraph(rankdir="LR"):
    g = graphviz.Digraph(graph_attr={"rankdir": rankdir}, node_attr={"fontname": "Helvetica", "fontsize": "11"})
    return g


def draw_graph(root, rankdir="LR", **options):
    """Draw the computation graph that produced `root` (a Value, a Tensor, or a minitf node or Graph).

    Value and Tensor nodes show their data and grad; operations are small ellipses between them.
    Where `dot` is missing the drawing still builds (its `.source` works) and showing it prints a hint.
    """
    module = type(root).__module__
    for prefix, walker in WALKERS.items():
        if module == prefix or module.startswith(prefix + "."):
            digraph, n_nodes = importlib.import_module(walker).build(root, new_digraph(rankdir), **options)
            return Drawing(digraph, n_nodes)
    if all(hasattr(root, a) for a in ("_prev", "_op", "data", "grad")):
        # A Value-like class built in a notebook draws like course.micrograd's Value.
        digraph, n_nodes = importlib.import_module(WALKERS["course.micrograd"]).build(root, new_digraph(rankdir), **options)
        return Drawing(digraph, n_nodes)
    raise TypeError(f"draw_graph cannot draw a {type(root).__name__}: give it a Value, a Tensor or a minitf node")
