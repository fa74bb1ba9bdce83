"""Where a tensor's numbers live: "cpu" (a NumPy array) or another device that a backend adds.

The engine itself only knows NumPy. A backend makes another device by registering three things:
- an array type that behaves like a NumPy array: `+`, `*`, `.sum(axis)`, `.reshape`, `np.exp(x)`,
  `np.where(...)` ... each run by that device (NumPy's own protocols, `__array_ufunc__` and
  `__array_function__`, send those calls to the array). So every operation of the engine, written
  once with NumPy expressions, also runs there: its forward and its backward alike.
- how to copy an array to the device and back (the only places where numbers cross);
- optionally, its own implementations of dispatch points (`course.tensor.dispatch`): a fused
  softmax kernel instead of the five array operations the NumPy version is made of, say.

Part 6's `course.kernels.device` adds "cuda" this way (a GPU, or Numba's simulator): it is imported
the first time a tensor is moved there, so the engine does not import the layer above it.
"""

import importlib

import numpy as np

# The modules that register each device, imported when the device is first asked for.
PROVIDERS = {"cuda": "course.kernels.device"}

_backends = {}


class Backend:
    """What a device provides: its array type, the two copies, and its implementations."""

    def __init__(self, name, array_type, to_device, to_host, implementations=None):
        self.name = name
        self.array_type = array_type
        self.to_device = to_device  # NumPy array -> this device's array
        self.to_host = to_host  # this device's array -> NumPy array
        self.implementations = dict(implementations or {})  # dispatch name -> function


def register(backend):
    _backends[backend.name] = backend


def get(name):
    """The backend of device `name`, importing the module that provides it the first time."""
    if name not in _backends:
        if name not in PROVIDERS:
            known = ", ".join(repr(d) for d in ("cpu", *PROVIDERS))
            raise ValueError(f"unknown device {name!r}; the known ones are {known}")
        importlib.import_module(PROVIDERS[name])
    return _backends[name]


def of(array):
    """The device an array lives on: "cpu" for NumPy arrays and numbers."""
    if isinstance(array, (np.ndarray, np.generic)):
        return "cpu"
    for backend in _backends.values():
        if isinstance(array, backend.array_type):
            return backend.name
    return "cpu"


def is_array(x):
    """Whether `x` is an array the engine can hold: a NumPy array or a registered device's array."""
    if isinstance(x, np.ndarray):
        return True
    for backend in _backends.values():
        if isinstance(x, backend.array_type):
            return True
    return False


def move(array, device):
    """`array` copied to `device` (the same array if it is there already)."""
    source = of(array)
    if source == device:
        return array
    if source != "cpu":
        array = get(source).to_host(array)
    return array if device == "cpu" else get(device).to_device(np.asarray(array))


def implementation(device, name):
    """The device's own implementation of dispatch point `name`, or None (then the NumPy version
    runs on the device's arrays)."""
    backend = _backends.get(device)
    return None if backend is None else backend.implementations.get(name)


def mismatch(op, devices):
    """The error for an operation `op` given tensors on several devices."""
    names = " and ".join(sorted(set(devices)))
    return RuntimeError(f"{op}: the tensors are on different devices ({names}); move them to one "
                        f"device first, with .to({sorted(set(devices))[-1]!r}) or .to('cpu')")
