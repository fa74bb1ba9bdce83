"""Part 2: modules, the building blocks of networks.

A `Module` holds parameters and other modules as attributes; `named_parameters()` walks them in
the order they were assigned and names them with dotted paths (`layers.0.weight`), the names a
`state_dict` uses, so weights can be saved, loaded and compared by name.
"""

import math
from collections import OrderedDict
from contextlib import contextmanager

import numpy as np

from .tensor import Tensor
from .tensor import device as _device
from .tensor import functional as F


class Parameter(Tensor):
    """A tensor that a module trains: it always requires a gradient."""

    __slots__ = ()

    def __init__(self, data, label=""):
        data = np.asarray(data.data if isinstance(data, Tensor) else data)
        if not np.issubdtype(data.dtype, np.floating):
            data = data.astype(np.float32)
        super().__init__(data, requires_grad=True, label=label)


class Module:
    """Base class: subclasses assign Parameters and Modules as attributes and define `forward`."""

    def __init__(self):
        self.training = True

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} must define forward()")

    def named_children(self):
        for name, value in vars(self).items():
            if isinstance(value, Module):
                yield name, value

    def named_parameters(self, prefix=""):
        """(dotted name, Parameter) for every parameter, each once, in assignment order."""
        seen = set()
        stack = [(prefix, self)]
        out = []
        # Depth first, in attribute order, without recursion.
        while stack:
            path, module = stack.pop()
            children = []
            for name, value in vars(module).items():
                full = f"{path}{name}"
                if isinstance(value, Parameter):
                    if id(value) not in seen:
                        seen.add(id(value))
                        out.append((full, value))
                elif isinstance(value, Module):
                    children.append((full + ".", value))
            stack.extend(reversed(children))
        return out

    def parameters(self):
        return [p for _, p in self.named_parameters()]

    def modules(self):
        found, stack = [], [self]
        while stack:
            m = stack.pop()
            found.append(m)
            stack.extend(reversed([c for _, c in m.named_children()]))
        return found

    def zero_grad(self):
        for p in self.parameters():
            p.grad = None

    def train(self, mode=True):
        for m in self.modules():
            m.training = mode
        return self

    def eval(self):
        return self.train(False)

    def to(self, device):
        """Move every parameter, and its gradient, to `device` ("cpu" or "cuda"), in place; returns
        the module. An optimizer made afterwards keeps its state there too."""
        if device != "cpu":
            _device.get(device)  # an unknown device is named before anything moves
        for p in self.parameters():
            p.data = _device.move(p.data, device)
            if p.grad is not None:
                p.grad = _device.move(p.grad, device)
        return self

    @property
    def device(self):
        """Where the parameters live (that of the first; "cpu" for a module without any)."""
        params = self.parameters()
        return params[0].device if params else "cpu"

    def state_dict(self):
        """Name -> a copy of the parameter's array, as a NumPy array (copied from the device if there)."""
        return OrderedDict((name, p.data.copy() if p.device == "cpu" else p.numpy())
                           for name, p in self.named_parameters())

    def load_state_dict(self, state, strict=True):
        """Copy arrays into the parameters by name. With strict=True every name must match both ways.

        Shapes must always match; the error lists every name that is missing, unexpected or misshapen.
        """
        params = dict(self.named_parameters())
        missing = [n for n in params if n not in state]
        unexpected = [n for n in state if n not in params]
        misshapen = [f"{n}: expected {params[n].shape}, got {np.shape(state[n])}"
                     for n in params if n in state and tuple(np.shape(state[n])) != params[n].shape]
        problems = []
        if strict and missing:
            problems.append("missing: " + ", ".join(missing))
        if strict and unexpected:
            problems.append("unexpected: " + ", ".join(unexpected))
        if misshapen:
            problems.append("wrong shape: " + "; ".join(misshapen))
        if problems:
            raise ValueError(f"load_state_dict into {type(self).__name__}: " + " | ".join(problems))
        for name, p in params.items():
            if name in state:
                p.data = _device.move(np.array(state[name], dtype=p.data.dtype), p.device)
        return self

    def num_parameters(self):
        return sum(p.size for p in self.parameters())

    def __repr__(self):
        lines = [f"{type(self).__name__}({self.extra_repr()}"]
        children = list(self.named_children())
        if not children:
            return lines[0] + ")"
        for name, child in children:
            body = repr(child).replace("\n", "\n  ")
            lines.append(f"  ({name}): {body}")
        return "\n".join(lines) + "\n)"

    def extra_repr(self):
        return ""


_SKIP_INIT = [False]


def merge_tied(state, alias, target, shape, owner, why="the two are tied (one array)"):
    """A state dict that may name a tied parameter twice (minGPT's and mamba-minimal's `lm_head.weight`
    beside the embedding), reduced to the one name the model holds: `alias` of the right shape fills
    `target` when that is missing, and must equal it when both are given."""
    state = dict(state)
    head = state.pop(alias, None)
    if head is None:
        return state
    if tuple(np.shape(head)) != tuple(shape):
        raise ValueError(f"load_state_dict into {owner}: wrong shape: {alias}: expected {tuple(shape)}, "
                         f"got {np.shape(head)}")
    if target not in state:
        state[target] = head
    elif tuple(np.shape(state[target])) == tuple(shape) and not np.array_equal(head, state[target]):
        raise ValueError(f"load_state_dict into {owner}: {alias} differs from {target}, but {why}: "
                         f"give them equal, or only {target}")
    return state


@contextmanager
def skip_init():
    """Inside the block, Linear and Embedding start as zeros instead of random draws.

    For a model whose every weight is about to be overwritten (loading a checkpoint): drawing
    124 million random numbers only to throw them away takes longer than reading the file.
    """
    old = _SKIP_INIT[0]
    _SKIP_INIT[0] = True
    try:
        yield
    finally:
        _SKIP_INIT[0] = old


def initialising():
    """False inside `skip_init()`: modules that draw their own initial values skip them there too."""
    return not _SKIP_INIT[0]


def _generator(rng):
    """A NumPy generator from `rng`: a generator, a seed, or None for the one `manual_seed` sets."""
    if rng is None:
        return F.get_rng()
    if isinstance(rng, np.random.Generator):
        return rng
    return np.random.default_rng(rng)


class Linear(Module):
    """y = x @ W.T + b, with W of shape (out_features, in_features) as in PyTorch.

    `rng` (a NumPy generator or a seed) draws the initial weights; without it they come from the
    generator that `course.tensor.manual_seed` seeds.
    """

    def __init__(self, in_features, out_features, bias=True, rng=None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        # Uniform in +-1/sqrt(fan_in) keeps the output's scale near the input's, as PyTorch does.
        bound = 1 / math.sqrt(in_features)
        if not initialising():
            self.weight = Parameter(np.zeros((out_features, in_features), dtype=np.float32))
            self.bias = Parameter(np.zeros(out_features, dtype=np.float32)) if bias else None
            return
        rng = _generator(rng)
        self.weight = Parameter(rng.uniform(-bound, bound, (out_features, in_features)).astype(np.float32))
        self.bias = Parameter(rng.uniform(-bound, bound, out_features).astype(np.float32)) if bias else None

    def forward(self, x):
        # Integer or boolean features (counts, one-hot flags) are read as the weights' floats: NumPy
        # would otherwise promote int64 @ float32 to float64, and the layer would answer in float64.
        if (isinstance(x, Tensor) and isinstance(x.data, np.ndarray) and x.data.dtype.kind in "biu"
                and self.weight.data.dtype.kind == "f"):
            x = Tensor(x.data.astype(self.weight.data.dtype))
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self):
        return f"{self.in_features}, {self.out_features}, bias={self.bias is not None}"


class Embedding(Module):
    """A table of vectors looked up by integer index (initially standard normal, drawn from `rng`
    as in Linear)."""

    def __init__(self, num_embeddings, embedding_dim, rng=None):
        super().__init__()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        if not initialising():
            self.weight = Parameter(np.zeros((num_embeddings, embedding_dim), dtype=np.float32))
            return
        table = _generator(rng).standard_normal((num_embeddings, embedding_dim))
        self.weight = Parameter(table.astype(np.float32))

    def forward(self, indices):
        return F.embedding(indices, self.weight)

    def extra_repr(self):
        return f"{self.num_embeddings}, {self.embedding_dim}"


class LayerNorm(Module):
    """Normalise the last axis, then scale and shift it by learned weight and bias."""

    def __init__(self, dim, eps=1e-5, bias=True):
        super().__init__()
        self.dim, self.eps = dim, eps
        self.weight = Parameter(np.ones(dim, dtype=np.float32))
        self.bias = Parameter(np.zeros(dim, dtype=np.float32)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return f"{self.dim}, eps={self.eps}"


class Dropout(Module):
    """Zero a fraction p of the activations while training; do nothing in eval mode."""

    def __init__(self, p=0.5):
        super().__init__()
        self.p = p

    def forward(self, x):
        return F.dropout(x, self.p, training=self.training)

    def extra_repr(self):
        return f"p={self.p}"


def _module(m, where, i):
    """`m` if it is a Module instance; otherwise a TypeError (a plain function would be dropped silently)."""
    if isinstance(m, Module):
        return m
    if isinstance(m, type) and issubclass(m, Module):
        raise TypeError(f"{where}: item {i} is the class {m.__name__}, not a module: write {m.__name__}()")
    hint = ": use a module such as nn.ReLU() or nn.GELU(), or write a Module whose forward calls it" if callable(m) else ""
    raise TypeError(f"{where}: item {i} is a {type(m).__name__}, not a Module{hint}")


class Sequential(Module):
    """Modules applied one after the other; their parameters are named 0.weight, 1.weight, ..."""

    def __init__(self, *modules):
        super().__init__()
        for i, m in enumerate(modules):
            setattr(self, str(i), _module(m, "Sequential", i))

    def __iter__(self):
        return iter(m for _, m in self.named_children())

    def __getitem__(self, i):
        return list(self)[i]

    def __len__(self):
        return len(list(self.named_children()))

    def forward(self, x):
        for m in self:
            x = m(x)
        return x


class ModuleList(Module):
    """A list of modules whose parameters are named 0..., 1..., like Sequential but not called."""

    def __init__(self, modules=()):
        super().__init__()
        self._n = 0
        for m in modules:
            self.append(m)

    def append(self, module):
        setattr(self, str(self._n), _module(module, "ModuleList", self._n))
        self._n += 1

    def __iter__(self):
        return iter(getattr(self, str(i)) for i in range(self._n))

    def __getitem__(self, i):
        return getattr(self, str(range(self._n)[i]))

    def __len__(self):
        return self._n


class ReLU(Module):
    def forward(self, x):
        return x.relu()


class Tanh(Module):
    def forward(self, x):
        return x.tanh()


class GELU(Module):
    """GELU with the tanh approximation."""

    def forward(self, x):
        return F.gelu(x)


__all__ = ["Parameter", "Module", "Linear", "Embedding", "LayerNorm", "Dropout", "Sequential",
           "ModuleList", "ReLU", "Tanh", "GELU", "Tensor", "skip_init", "merge_tied"]
