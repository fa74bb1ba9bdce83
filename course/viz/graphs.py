"""Drawing computation graphs with graphviz.

`draw_graph(root)` walks the graph that produced `root` and returns a `Drawing`, which a notebook
shows as a PNG. Node names are numbered in a fixed order (never `id()`), so the same graph gives
the same drawing source on every run. Each engine has its own small walker that lists the nodes:
course/viz/value_graph.py for micrograd's Value, and one module per later engine.

The layout is done by a `dot` program: the system's Graphviz where it is installed, otherwise the
one in the `graphviz-pure` wheel that `pip install` brings on the common platforms (same flags,
same output on every machine). Where neither is there, showing a drawing prints a one-line hint.
"""

import importlib
import os
import shutil
import subprocess
import sys
import sysconfig

import graphviz

DOT_HINT = ("graphviz's `dot` program is not installed, so graphs cannot be drawn: install it "
            "(apt-get install graphviz, brew install graphviz, conda install graphviz, or pip install graphviz-pure).")

# Programs that lay out a DOT text, in order of preference. graphviz-pure never installs a command
# named `dot`, so a system Graphviz is always found first.
DOT_PROGRAMS = ("dot", "graphviz-pure")

# A drawing wider than this (in pixels, at graphviz's 96 dpi) is shrunk by the browser to the width
# of the notebook, and its numbers become too small to read: such a graph is drawn top to bottom.
MAX_WIDTH_PX = 1000

# The module of the engine -> the module of course.viz that knows how to walk its graphs.
WALKERS = {
    "course.micrograd": "course.viz.value_graph",
    "course.tensor": "course.viz.tensor_graph",
    "course.minitf": "course.viz.minitf_graph",
}


def find_dot():
    """The path of the program that lays out drawings, or None.

    Looks on PATH, then next to the running Python: a notebook kernel started from a virtual
    environment that was never activated does not have the environment's scripts on its PATH.
    """
    here = [sysconfig.get_path("scripts"), os.path.dirname(sys.executable)]
    for name in DOT_PROGRAMS:
        found = shutil.which(name) or shutil.which(name, path=os.pathsep.join(here))
        if found:
            return found
    return None


def dot_available():
    return find_dot() is not None


def render(source, format="png", program=None):
    """Lay out the DOT text `source` and return the bytes of the picture in `format`."""
    program = program or find_dot()
    if program is None:
        raise RuntimeError(DOT_HINT)
    done = subprocess.run([program, f"-T{format}"], input=source.encode(),
                          capture_output=True)
    if done.returncode != 0:
        message = done.stderr.decode(errors="replace").strip()
        raise RuntimeError(f"{os.path.basename(program)} could not draw the graph: {message}")
    return done.stdout


def layout_width_px(source, program=None):
    """The width in pixels that `source` takes once laid out (from dot's plain output, in inches)."""
    first = render(source, "plain", program).split(b"\n", 1)[0].split()
    return float(first[2]) * 96  # "graph <scale> <width> <height>"


class Drawing:
    """A graphviz drawing that Jupyter shows as a PNG (not SVG: SVG differs between graphviz versions).

    rankdir: "LR" (left to right), "TB" (top to bottom), or None to draw left to right unless that
    is wider than MAX_WIDTH_PX, and top to bottom then (a deep graph drawn sideways is too wide to read).
    """

    def __init__(self, digraph, n_nodes, rankdir=None):
        self.digraph = digraph
        self.n_nodes = n_nodes
        self.rankdir = rankdir

    @property
    def source(self):
        """The DOT text of the drawing: deterministic, so it can be compared."""
        return self.digraph.source

    def _source_to_draw(self, program):
        if self.rankdir is not None or layout_width_px(self.source, program) <= MAX_WIDTH_PX:
            return self.source
        tall = self.digraph.copy()
        tall.graph_attr["rankdir"] = "TB"
        return tall.source

    def pipe(self, format="png"):
        """The bytes of the drawing in `format` (png, svg, ...)."""
        program = find_dot()
        if program is None:
            raise RuntimeError(DOT_HINT)
        return render(self._source_to_draw(program), format, program)

    def _repr_png_(self):
        if not dot_available():
            print(DOT_HINT)
            return None
        return self.pipe("png")

    def save(self, path, format="png"):
        """Write the drawing to `path` (PNG by default)."""
        data = self.pipe(format)
        with open(path, "wb") as f:
            f.write(data)
        return path

    def __repr__(self):
        return f"<Drawing of a graph with {self.n_nodes} nodes>"


def new_digraph(rankdir="LR"):
    g = graphviz.Digraph(graph_attr={"rankdir": rankdir}, node_attr={"fontname": "Helvetica", "fontsize": "11"})
    return g


def draw_graph(root, rankdir=None, **options):
    """Draw the computation graph that produced `root` (a Value, a Tensor, or a minitf node or Graph).

    Value and Tensor nodes show their data and grad; operations are small ellipses between them.
    rankdir: "LR", "TB", or None (left to right, or top to bottom when that would be too wide).
    Where `dot` is missing the drawing still builds (its `.source` works) and showing it prints a hint.
    """
    if rankdir not in (None, "LR", "TB", "RL", "BT"):
        raise ValueError(f"draw_graph: rankdir must be None, 'LR', 'TB', 'RL' or 'BT', not {rankdir!r}")
    module = type(root).__module__
    walker = None
    for prefix, name in WALKERS.items():
        if module == prefix or module.startswith(prefix + "."):
            walker = name
    if walker is None and all(hasattr(root, a) for a in ("_prev", "_op", "data", "grad")):
        walker = WALKERS["course.micrograd"]  # a Value-like class built in a notebook draws like Value
    if walker is None:
        raise TypeError(f"draw_graph cannot draw a {type(root).__name__}: give it a Value, a Tensor or a minitf node")
    digraph, n_nodes = importlib.import_module(walker).build(root, new_digraph(rankdir or "LR"), **options)
    return Drawing(digraph, n_nodes, rankdir)
