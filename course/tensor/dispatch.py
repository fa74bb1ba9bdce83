"""The dispatch point: one place where an operation's implementation can be swapped.

A few operations do nearly all of a network's work: matrix products (`matmul`, `linear`),
`softmax`, `layer_norm`, attention, and Mamba's `selective_scan`. Each is written once, with
NumPy, and marked `@dispatchable`: calling it then looks up which implementation is in use and
calls that one. Normally that is the NumPy version itself; inside

    with dispatch.override({"softmax": my_softmax}):
        ...

every call of `softmax` goes to `my_softmax` instead (same arguments, same result). Part 6 runs
GPT and Mamba on its GPU and CPU kernels this way, without changing a line of either model.

A replacement may hand a call it does not support back to the NumPy version, `fn.default`.
"""

import functools
from contextlib import contextmanager

_registry = {}  # name -> the dispatching function
_active = {}  # name -> the implementation swapped in, for names that have one


def dispatchable(fn):
    """Register `fn` (under its own name) as the default implementation of an operation."""
    name = fn.__name__
    if name in _registry:
        raise ValueError(f"dispatch: an operation named {name!r} is registered already")

    @functools.wraps(fn)
    def dispatch(*args, **kwargs):
        impl = _active.get(name)
        return fn(*args, **kwargs) if impl is None else impl(*args, **kwargs)

    dispatch.default = fn  # the NumPy implementation, whatever is swapped in
    _registry[name] = dispatch
    return dispatch


def names():
    """The operations whose implementation can be swapped, in alphabetical order."""
    return sorted(_registry)


def current(name):
    """The implementation that a call of operation `name` runs now."""
    if name not in _registry:
        raise KeyError(f"dispatch: no operation named {name!r}; the known ones are {', '.join(names())}")
    return _active.get(name, _registry[name].default)


@contextmanager
def override(replacements):
    """Inside `with override({name: function, ...}):` calls of those operations go to the functions.

    Overrides nest: leaving the block restores whatever was in use before it.
    """
    unknown = [n for n in replacements if n not in _registry]
    if unknown:
        raise KeyError(f"dispatch.override: no operation named {', '.join(map(repr, unknown))}; "
                       f"the known ones are {', '.join(names())}")
    previous = {n: _active.get(n) for n in replacements}
    _active.update(replacements)
    try:
        yield
    finally:
        for n, impl in previous.items():
            if impl is None:
                _active.pop(n, None)
            else:
                _active[n] = impl
