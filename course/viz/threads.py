"""Pictures of GPU threads over an array: which thread touched which element (part 6).

`course.kernels.trace` records the accesses; `draw_thread_map` draws the result of its
`touched_by`: an integer array of the array's shape holding, per element, the number of the
thread that touched it (block * threads_per_block + thread), -1 for none, -2 for several.
"""

import numpy as np

NONE, SEVERAL = -1, -2


def _colour(who, threads_per_block):
    """One colour per thread; the threads of a block share a hue family so blocks stand out."""
    import matplotlib

    block, thread = divmod(int(who), threads_per_block)
    families = ["Blues", "Oranges", "Greens", "Purples", "Reds", "Greys", "YlOrBr", "PuRd"]
    cmap = matplotlib.colormaps[families[block % len(families)]]
    return cmap(0.3 + 0.6 * thread / max(threads_per_block - 1, 1))


def draw_thread_map(owner, threads_per_block, block_shape=None, ax=None, title=None, labels=None, grid_shape=None):
    """Draw a 1-D or 2-D array of thread numbers as coloured cells, each labelled with its thread.

    owner: from `TraceReport.touched_by`. block_shape: the launch's block (an int or a tuple),
    used to label a thread by its threadIdx. grid_shape: the launch's grid, to name a block of a 2-D
    or 3-D grid by its blockIdx (x, y) in the legend. labels: write the thread in each cell (default: when
    there are at most 400 cells). Unvisited elements are white, elements touched by several
    threads are black: both are what a picture of a correct kernel should not have.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch, Rectangle

    owner = np.asarray(owner)
    grid = owner.reshape(1, -1) if owner.ndim == 1 else owner
    if grid.ndim != 2:
        raise ValueError(f"draw_thread_map draws 1-D and 2-D arrays, got shape {owner.shape}")
    rows, cols = grid.shape
    if ax is None:
        _, ax = plt.subplots(figsize=(min(0.45 * cols + 1, 14), min(0.45 * rows + 1.2, 10)))
    block_shape = (threads_per_block,) if block_shape is None else (
        (block_shape,) if np.ndim(block_shape) == 0 else tuple(block_shape))
    if labels is None:
        labels = grid.size <= 400
    for r in range(rows):
        for c in range(cols):
            who = grid[r, c]
            face = "white" if who == NONE else "black" if who == SEVERAL else _colour(who, threads_per_block)
            ax.add_patch(Rectangle((c, r), 1, 1, facecolor=face, edgecolor="0.6", linewidth=0.5))
            if labels and who >= 0:
                t = int(who) % threads_per_block
                idx = np.unravel_index(t, block_shape[::-1])[::-1] if len(block_shape) > 1 else (t,)
                text = ",".join(str(i) for i in idx)
                dark = sum(face[:3]) < 1.5  # white text on dark cells
                ax.text(c + 0.5, r + 0.5, text, ha="center", va="center", fontsize=7 if len(text) < 4 else 5,
                        color="white" if dark else "black")
    ax.set_xlim(0, cols)
    ax.set_ylim(rows, 0)
    ax.set_aspect("equal")
    ax.set_xticks(np.arange(cols) + 0.5, [str(c) for c in range(cols)] if cols <= 40 else [""] * cols)
    ax.set_yticks(np.arange(rows) + 0.5, [str(r) for r in range(rows)] if owner.ndim == 2 else [""])
    ax.tick_params(length=0, labelsize=7)
    if title:
        ax.set_title(title)
    blocks = sorted({int(w) // threads_per_block for w in np.unique(grid) if w >= 0})
    n_blocks = len(blocks)
    grid_shape = tuple(np.atleast_1d(grid_shape)) if grid_shape is not None else ()
    while len(grid_shape) > 1 and grid_shape[-1] == 1:
        grid_shape = grid_shape[:-1]

    def block_name(b):  # blocks are numbered with x fastest, as in a launch
        if len(grid_shape) < 2:
            return f"block {b}"
        return "block (" + ", ".join(str(int(i)) for i in np.unravel_index(b, grid_shape[::-1])[::-1]) + ")"

    legend = [Patch(facecolor=_colour(b * threads_per_block + threads_per_block // 2, threads_per_block),
                    label=block_name(b)) for b in blocks[:8]]
    if (grid == NONE).any():
        legend.append(Patch(facecolor="white", edgecolor="0.6", label="no thread"))
    if (grid == SEVERAL).any():
        legend.append(Patch(facecolor="black", label="several threads"))
    if legend and (n_blocks > 1 or len(legend) > n_blocks):
        ax.legend(handles=legend, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=7, frameon=False)
    return ax
