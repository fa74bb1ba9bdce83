"""Shapes known before running (lesson 3.3): each operation says what shape it makes.

A shape is a tuple whose entries are sizes or None (a size known only when the graph runs,
such as the batch size), or None for "not even the number of axes is known".
"""


def show(shape):
    if shape is None:
        return "(unknown)"
    return "(" + ", ".join("None" if d is None else str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def broadcast(a, b, op="add"):
    """The shape of `a op b` under NumPy's broadcasting, or a ValueError naming both shapes."""
    if a is None or b is None:
        return None
    out = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else 1
        y = b[-i] if i <= len(b) else 1
        if x == 1:
            out.append(y)
        elif y == 1:
            out.append(x)
        elif x is None:
            out.append(y)  # None must turn out to be 1 or y
        elif y is None or x == y:
            out.append(x)
        else:
            raise ValueError(f"{op}: shapes {show(a)} and {show(b)} cannot be broadcast together "
                             f"(sizes {x} and {y} on axis {-i})")
    return tuple(reversed(out))


def matmul(a, b):
    """(n, k) @ (k, m) -> (n, m); stacks of matrices broadcast over their leading axes, as in NumPy:
    (B, n, k) @ (k, m) -> (B, n, m). A ValueError with both shapes when the inner sizes differ."""
    for s in (a, b):
        if s is not None and len(s) < 2:
            raise ValueError(f"matmul takes matrices (2 axes or more), got shapes {show(a)} and {show(b)}")
    if a is None or b is None:
        if a is None and b is None:
            return None
        known = a if b is None else b
        if len(known) > 2:
            return None  # the other side might add leading axes
        return (a[0], None) if b is None else (None, b[1])
    if a[-1] is not None and b[-2] is not None and a[-1] != b[-2]:
        raise ValueError(f"matmul: shapes {show(a)} and {show(b)} do not fit: "
                         f"the inner sizes {a[-1]} and {b[-2]} differ")
    try:
        batch = broadcast(a[:-2], b[:-2], "matmul")
    except ValueError:
        raise ValueError(f"matmul: shapes {show(a)} and {show(b)} do not fit: their leading (batch) axes "
                         f"{show(a[:-2])} and {show(b[:-2])} cannot be broadcast together") from None
    return batch + (a[-2], b[-1])


def normalize_axis(axis, ndim, op="reduce"):
    """A tuple of non-negative axes (all axes for None)."""
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    out = []
    for ax in axes:
        if not -ndim <= ax < ndim:
            raise ValueError(f"{op}: axis {ax} is out of range for a shape with {ndim} axes")
        out.append(ax % ndim)
    return tuple(sorted(out))


def reduce(shape, axis=None, keepdims=False, op="reduce_sum"):
    """The shape after summing (or averaging) over `axis`."""
    if shape is None:
        return None
    axes = normalize_axis(axis, len(shape), op)
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def compatible(declared, actual):
    """Does an array of shape `actual` fit a declared shape with None entries?"""
    if declared is None:
        return True
    return len(declared) == len(actual) and all(d is None or d == a for d, a in zip(declared, actual))


def merge(declared, given, name="node"):
    """The more precise of two compatible shapes (used when a compiler pass is told input shapes)."""
    if declared is None:
        return None if given is None else tuple(given)
    if given is None:
        return declared
    given = tuple(given)
    if len(declared) != len(given) or any(d is not None and g is not None and d != g
                                          for d, g in zip(declared, given)):
        raise ValueError(f"'{name}' is declared with shape {show(declared)}, which does not fit shape {show(given)}")
    return tuple(d if d is not None else g for d, g in zip(declared, given))
