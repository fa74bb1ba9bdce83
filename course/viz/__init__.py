"""Pictures for the lessons: computation graphs (graphviz) and plots (matplotlib)."""

from .graphs import Drawing, draw_graph
from .plots import plot_decision_boundary, plot_losses

__all__ = ["draw_graph", "Drawing", "plot_decision_boundary", "plot_losses"]
