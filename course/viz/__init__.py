"""Pictures for the lessons: computation graphs (graphviz), plots and thread maps (matplotlib)."""

from .graphs import Drawing, draw_graph
from .plots import plot_decision_boundary, plot_losses
from .threads import draw_thread_map

__all__ = ["draw_graph", "Drawing", "plot_decision_boundary", "plot_losses", "draw_thread_map"]
