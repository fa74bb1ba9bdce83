"""A course kernel as a PyTorch operator: `course::softmax` and its backward, `course::softmax_backward`.

PyTorch calls code it does not know through *custom operators*. Three registrations make one
that PyTorch treats as its own:

    torch.library.custom_op("course::softmax", mutates_args=())   the real computation, per device
    register_fake                                                  the output's shape, dtype and device
                                                                   from the input's alone (no data), for
                                                                   torch.compile and meta tensors
    register_autograd(backward, setup_context=...)                 the gradient formula: setup_context
                                                                   saves what the backward needs (here
                                                                   the output s), backward returns dx

The computation is the course's: on CPU tensors the Numba kernels of `course.kernels.cpu` (float32
or float64), on CUDA tensors the CUDA kernels of `course.kernels.rows` (float32). Neither copies
the data. A CPU tensor's `.numpy()` is an array over the tensor's own memory, and `torch.from_numpy`
is a tensor over the array's; a CUDA tensor is handed to numba with `cuda.as_cuda_array`, which
reads its address through the CUDA array interface, and the kernel writes straight into a tensor
PyTorch allocated, on PyTorch's current stream. The backward is a second operator on the same
kernels, `dx = s * (g - <g, s>)` row by row. (CUDA tensors on the GPU numba uses, its current
device: with several GPUs, PyTorch's and numba's current devices must be the same one.)

PyTorch is optional for the course, so this module imports it only when an operator is first
asked for: `HAS_TORCH` says whether it is installed, and `operators()` (called by `softmax` and
`softmax_backward`) imports it and registers the operators, once per process.

    from course.kernels import torch_op
    y = torch_op.softmax(x)           # x a torch.Tensor; softmax over its last dimension
    torch.ops.course.softmax(x)       # the same operator, by the name PyTorch knows it under
"""

import functools
import importlib.util
import math

from . import cpu
from ._backend import backend, backend_reason, cuda
from .launch import THREADS_PER_BLOCK, launch
from .rows import softmax_backward_kernel, softmax_kernel

HAS_TORCH = importlib.util.find_spec("torch") is not None


def cuda_ready():
    """True where both PyTorch and numba use a real GPU: what the operators need for CUDA tensors."""
    if not HAS_TORCH or backend() != "gpu":
        return False
    import torch

    return torch.cuda.is_available()


def _check(x, name):
    """Refuse what the kernels cannot take, naming it, before anything runs."""
    import torch

    if x.dim() == 0:
        raise ValueError(f"{name}: softmax runs over the last dimension, and a 0-d tensor has none")
    if x.device.type == "cuda":
        if x.dtype != torch.float32:
            raise TypeError(f"{name}: the CUDA kernels take float32 tensors (the GPU's fast type), got {x.dtype}: "
                            f"pass x.float()")
        if backend() != "gpu":  # the simulator's arrays live in host memory: it cannot read PyTorch's GPU memory
            raise RuntimeError(f"{name}: a CUDA tensor, but the course's CUDA kernels run on the simulator here "
                               f"({backend_reason()})")
    elif x.device.type in ("cpu", "meta"):  # meta: a tensor with no data, to learn the output's shape
        if x.dtype not in (torch.float32, torch.float64):
            raise TypeError(f"{name}: the CPU kernels take float32 or float64 tensors, got {x.dtype}: pass x.float()")
    else:
        raise TypeError(f"{name}: the course's kernels run on CPU and CUDA tensors, got one on {x.device}")


def _rows_shape(x):
    """(rows, n): the tensor as a matrix with one row per softmax (reshape needs the count when n is 0)."""
    return math.prod(x.shape[:-1]), x.shape[-1]


def _on_gpu(t):
    """A numba device array over a contiguous CUDA tensor's memory: no copy, no synchronisation
    (the kernels are launched on PyTorch's current stream, so they run after the work that made t)."""
    return cuda.as_cuda_array(t.detach(), sync=False)


def _torch_stream(device):
    import torch

    return cuda.external_stream(torch.cuda.current_stream(device).cuda_stream)


def _softmax(x):
    import torch

    _check(x, "course::softmax")
    x = x.detach().contiguous()  # a view when x is already contiguous, as it almost always is
    rows, n = _rows_shape(x)
    if x.device.type == "cpu":
        # .numpy() and from_numpy share memory: the kernel reads the tensor and its result becomes one
        return torch.from_numpy(cpu.softmax(x.numpy().reshape(rows, n))).reshape(x.shape)
    out = torch.empty_like(x)
    if x.numel():
        launch(softmax_kernel, rows, THREADS_PER_BLOCK, _on_gpu(x.view(rows, n)), _on_gpu(out.view(rows, n)),
               stream=_torch_stream(x.device))
    return out


def _softmax_backward(s, g):
    import torch

    _check(s, "course::softmax_backward")
    if g.shape != s.shape or g.dtype != s.dtype or g.device != s.device:
        raise ValueError(f"course::softmax_backward: the gradient ({tuple(g.shape)}, {g.dtype}, {g.device}) must match "
                         f"the softmax output ({tuple(s.shape)}, {s.dtype}, {s.device})")
    # a gradient is often not contiguous (the backward of a sum hands on an expanded tensor)
    s, g = s.detach().contiguous(), g.detach().contiguous()
    rows, n = _rows_shape(s)
    if s.device.type == "cpu":
        dx = cpu.softmax_backward(s.numpy().reshape(rows, n), g.numpy().reshape(rows, n))
        return torch.from_numpy(dx).reshape(s.shape)
    dx = torch.empty_like(s)
    if s.numel():
        launch(softmax_backward_kernel, rows, THREADS_PER_BLOCK, _on_gpu(s.view(rows, n)), _on_gpu(g.view(rows, n)),
               _on_gpu(dx.view(rows, n)), stream=_torch_stream(s.device))
    return dx


@functools.cache
def operators():
    """Import PyTorch and register `course::softmax` and `course::softmax_backward` (once).

    Returns the two operators, which are also `torch.ops.course.softmax` and
    `torch.ops.course.softmax_backward`."""
    if not HAS_TORCH:
        raise ImportError("course.kernels.torch_op needs PyTorch: pip install torch")
    import torch

    # The annotations are the operator's schema: PyTorch reads them to know what it takes and returns.
    @torch.library.custom_op("course::softmax", mutates_args=())
    def softmax_op(x: torch.Tensor) -> torch.Tensor:
        return _softmax(x)

    @torch.library.custom_op("course::softmax_backward", mutates_args=())
    def softmax_backward_op(s: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        return _softmax_backward(s, g)

    # What the output looks like, from what the inputs look like: a fake tensor has a shape, a dtype
    # and a device but no data, so torch.compile can trace a model through the operator without running it.
    @softmax_op.register_fake
    def _(x):
        _check(x, "course::softmax")
        return x.new_empty(x.shape)

    @softmax_backward_op.register_fake
    def _(s, g):
        _check(s, "course::softmax_backward")
        return s.new_empty(s.shape)

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output)  # the backward needs only s = softmax(x), not x

    def backward(ctx, grad):
        (s,) = ctx.saved_tensors
        return softmax_backward_op(s, grad)

    softmax_op.register_autograd(backward, setup_context=setup_context)
    return softmax_op, softmax_backward_op


def softmax(x):
    """softmax over the last dimension of a torch.Tensor, on the course's kernels, with autograd."""
    return operators()[0](x)


def softmax_backward(s, g):
    """The gradient of softmax's input from its output `s` and the output's gradient `g`."""
    return operators()[1](s, g)
