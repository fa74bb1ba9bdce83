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

Devices come first: a call whose tensors live on another device than "cpu" (part 6's "cuda") runs
that device's own implementation where it has one (`course.tensor.device`), and otherwise the NumPy
version, whose array expressions then run on the device's arrays. Tensors of two devices in one
call are an error naming the operation and both devices. Overrides apply to tensors on the CPU.
"""

import functools
from contextlib import contextmanager

from . import device as _device

_registry = {}  # name -> the dispatching function
_active = {}  # name -> the implementation swapped in, for names that have one


def dispatchable(fn):
    """Register `fn` (under its own name) as the default implementation of an operation."""
    name = fn.__name__
    if name in _registry:
        raise ValueError(f"dispatch: an operation named {name!r} is registered already")

    @functools.wraps(fn)
    def dispatch(*args, **kwargs):
        where = _device_of(name, args, kwargs)
        if where != "cpu":
            impl = _device.implementation(where, name)
        else:
            impl = _active.get(name)
        return fn(*args, **kwargs) if impl is None else impl(*args, **kwargs)

    dispatch.default = fn  # the NumPy implementation, whatever is swapped in
    _registry[name] = dispatch
    return dispatch


def _device_of(name, args, kwargs):
    """The one device of the tensors among the arguments (in lists too; the parameters of an
    optimizer); "cpu" when there are none."""
    found = None
    for value in (*args, *kwargs.values()):
        items = value if isinstance(value, (list, tuple)) else _parameters_of(value)
        for item in items:
            if not hasattr(item, "requires_grad"):  # only tensors: index arrays may come from the host
                continue
            here = item.device
            if here == found or not _counts(item):
                continue
            if found is None:
                found = here
            else:
                raise _device.mismatch(name, (found, here))
    return found or "cpu"


def _parameters_of(value):
    groups = getattr(value, "param_groups", None)  # an optimizer: its parameters' device
    if groups is not None:
        return [p for g in groups for p in g["params"]]
    return (value,)


def _counts(t):
    """A 0-d tensor on the CPU is a number: it may join a tensor on any device (as in PyTorch)."""
    return not (t.device == "cpu" and getattr(t, "ndim", 1) == 0)


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
