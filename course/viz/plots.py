"""Plots used across the lessons."""

import numpy as np


def plot_losses(curves, ax=None, title=None, xlabel="step", ylabel="loss", logy=False):
    """Plot one or more loss curves: `curves` is a list of numbers or a dict name -> list."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 3.5))
    if not isinstance(curves, dict):
        curves = {None: curves}
    for name, values in curves.items():
        ax.plot(np.arange(len(values)), values, label=name)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    if any(name is not None for name in curves):
        ax.legend()
    ax.grid(alpha=0.3)
    return ax


def plot_decision_boundary(predict, X, y, ax=None, resolution=200, padding=0.5, title=None,
                           xlabel="$x_1$", ylabel="$x_2$"):
    """Shade the plane by the class `predict` gives each point, and draw the data on top.

    `predict` takes an array of points of shape (n, 2) and returns a score per point: a score
    above 0 (or the class 1) is one side of the boundary.
    """
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(5, 4))
    x_min, x_max = X[:, 0].min() - padding, X[:, 0].max() + padding
    y_min, y_max = X[:, 1].min() - padding, X[:, 1].max() + padding
    xx, yy = np.meshgrid(np.linspace(x_min, x_max, resolution), np.linspace(y_min, y_max, resolution))
    grid = np.stack([xx.ravel(), yy.ravel()], axis=1)
    scores = np.asarray(predict(grid), dtype=np.float64).reshape(xx.shape)
    ax.contourf(xx, yy, scores > 0, levels=[-0.5, 0.5, 1.5], colors=["#f4b6b6", "#b6c8f4"], alpha=0.6)
    ax.scatter(X[:, 0], X[:, 1], c=y, cmap="bwr_r", edgecolors="k", s=20)
    ax.set_xlim(x_min, x_max)
    ax.set_ylim(y_min, y_max)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    return ax
