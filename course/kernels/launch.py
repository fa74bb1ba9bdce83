"""Launching a kernel: check the configuration first, count the launch, name the kernel if it fails.

`kernel[griddim, blockdim](*args)` on a real GPU fails with a terse driver error (or not at
all) when the configuration is impossible; here every launch goes through `launch`, which says
what is wrong in words before anything runs. Each launch is counted per kernel name, so a
learner can see which kernels a model used: `launches()` and `reset_launches()`.
"""

from collections import Counter

import numpy as np

from ._backend import backend, cuda

# CUDA's limits (the same on every GPU since compute capability 3.0); a real device is asked.
MAX_THREADS_PER_BLOCK = 1024
MAX_BLOCK_DIM = (1024, 1024, 64)
MAX_DYNAMIC_SHARED = 48 * 1024  # bytes of dynamic shared memory per block, without opting in
MAX_GRID_DIM = (2 ** 31 - 1, 65535, 65535)
if backend() == "gpu":
    _device = cuda.get_current_device()
    MAX_THREADS_PER_BLOCK = _device.MAX_THREADS_PER_BLOCK
    MAX_BLOCK_DIM = (_device.MAX_BLOCK_DIM_X, _device.MAX_BLOCK_DIM_Y, _device.MAX_BLOCK_DIM_Z)
    MAX_GRID_DIM = (_device.MAX_GRID_DIM_X, _device.MAX_GRID_DIM_Y, _device.MAX_GRID_DIM_Z)

# The block size the host functions use. Without a GPU every thread runs as Python (`execute`),
# so small blocks do; a GPU wants enough threads per block to hide memory latency.
THREADS_PER_BLOCK = 256 if backend() == "gpu" else 16

_launches = Counter()


def launches():
    """How many times each kernel was launched since the last `reset_launches()`: {name: count}."""
    return dict(_launches)


def reset_launches():
    _launches.clear()


def count(name, n=1):
    """Count `n` launches of `name` (the CPU kernels count their calls here too)."""
    _launches[name] += n


def _dims(value, what, name):
    dims = (value,) if np.ndim(value) == 0 else tuple(value)
    if not 1 <= len(dims) <= 3:
        raise ValueError(f"{name}: {what} {value!r} needs 1 to 3 dimensions (x, y, z)")
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)):
            raise TypeError(f"{name}: {what} {value!r} must be whole numbers")
    return tuple(int(d) for d in dims)


def check_launch(griddim, blockdim, name="kernel"):
    """Raise a clear error if <<<griddim, blockdim>>> cannot be launched; return both as tuples."""
    grid = _dims(griddim, "the grid", name)
    block = _dims(blockdim, "the block", name)
    if any(d <= 0 for d in grid):
        raise ValueError(f"{name}: a grid of {grid} blocks has no blocks: every dimension must be at least 1")
    if any(d <= 0 for d in block):
        raise ValueError(f"{name}: a block of {block} threads has no threads: every dimension must be at least 1")
    threads = int(np.prod(block))
    if threads > MAX_THREADS_PER_BLOCK:
        raise ValueError(f"{name}: a block of {block} = {threads} threads is more than the "
                         f"{MAX_THREADS_PER_BLOCK} threads per block this device allows")
    for axis, (d, limit) in enumerate(zip(block, MAX_BLOCK_DIM)):
        if d > limit:
            raise ValueError(f"{name}: the block's {'xyz'[axis]} dimension {d} is over the limit of {limit}")
    for axis, (d, limit) in enumerate(zip(grid, MAX_GRID_DIM)):
        if d > limit:
            raise ValueError(f"{name}: the grid's {'xyz'[axis]} dimension {d} is over the limit of {limit}")
    return grid, block


def kernel_name(kernel):
    """The name a kernel was written under (of its Python function, on a GPU or the simulator)."""
    return getattr(getattr(kernel, "py_func", kernel), "__name__", "kernel")


def launch(kernel, griddim, blockdim, *args, stream=None):
    """Run `kernel[griddim, blockdim](*args)` after checking the configuration; count it.

    `stream`: a numba stream to launch on (another library's, through `cuda.external_stream`, so
    that the kernel runs in order with that library's work); None launches on the default stream."""
    name = kernel_name(kernel)
    grid, block = check_launch(griddim, blockdim, name)
    _launches[name] += 1
    try:
        if backend() == "simulator":
            # No GPU: the kernel runs in Python, each CUDA thread a greenlet (`trace.execute`),
            # which is 6-22x faster than numba's simulator and computes the same.
            from .trace import execute
            execute(kernel, grid, block, *args)
        else:
            config = (grid, block) if stream is None else (grid, block, stream)
            kernel[config](*args)
    except Exception as err:
        raise RuntimeError(f"kernel {name} failed on a grid of {grid} blocks of {block} threads: {err}") from err


def as_float32(x, name, what="x"):
    """The array as a contiguous float32 array: the type the CUDA kernels are written for.

    Other floating types and integers would silently lose precision or be cut, so they are
    refused with a message that says what to pass.
    """
    x = np.asarray(x)
    if x.dtype != np.float32:
        raise TypeError(f"{name}: {what} has dtype {x.dtype}, but the CUDA kernels take float32 arrays "
                        f"(the GPU's fast type): pass {what}.astype(np.float32)")
    return np.ascontiguousarray(x)


def blocks_for(n, threads):
    """How many blocks of `threads` threads cover `n` elements (rounded up)."""
    return (n + threads - 1) // threads
