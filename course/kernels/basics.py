"""The first kernels: one thread per element (vector add), and threads that cooperate (a sum).

A kernel is a function that every thread of the grid runs. Each thread finds its own element
from its position: `cuda.grid(1)` is blockIdx.x * blockDim.x + threadIdx.x. The grid is rounded
up to whole blocks, so the last block has threads past the end of the array: the guard
`if i < out.size` keeps them from writing there.

The host function next to each kernel does what the CPU must: check the input, copy it to the
GPU, pick the launch configuration, launch, and copy the result back.
"""

import numpy as np
from numba import float32

from ._backend import backend, cuda
from .launch import THREADS_PER_BLOCK, as_float32, blocks_for, check_launch, launch


# ----- vector add: one thread per element ---------------------------------------------------------
@cuda.jit
def vector_add_kernel(a, b, out):
    i = cuda.grid(1)
    if i < out.size:  # the last block may run past the end
        out[i] = a[i] + b[i]


def vector_add(a, b, threads_per_block=THREADS_PER_BLOCK):
    """a + b for two float32 arrays of one shape, one GPU thread per element."""
    a, b = as_float32(a, "vector_add", "a"), as_float32(b, "vector_add", "b")
    if a.shape != b.shape:
        raise ValueError(f"vector_add: shapes {a.shape} and {b.shape} differ")
    check_launch(1, threads_per_block, "vector_add_kernel")
    if a.size == 0:
        return np.empty_like(a)
    out = cuda.device_array(a.size, dtype=np.float32)
    launch(vector_add_kernel, blocks_for(a.size, threads_per_block), threads_per_block,
           cuda.to_device(a.ravel()), cuda.to_device(b.ravel()), out)
    return out.copy_to_host().reshape(a.shape)


# ----- a sum: threads cooperate through shared memory -----------------------------------------------
# Enough blocks to keep a GPU busy; the rest of the work is the grid-stride loop. The simulator
# runs blocks one after another, so there a few blocks do as well and take less time.
MAX_SUM_BLOCKS = 1024 if backend() == "gpu" else 4

@cuda.jit
def reduce_sum_kernel(x, partial):
    """Each block adds up its share of x into partial[blockIdx.x].

    First every thread sums a strided slice of x (a grid-stride loop: any length fits any grid).
    Then the block halves its sums in shared memory: at each step, thread t adds the value of
    thread t + step; the barrier makes sure those values are written before anyone reads them.
    """
    cache = cuda.shared.array(THREADS_PER_BLOCK, float32)
    t = cuda.threadIdx.x
    total = float32(0)
    i = cuda.grid(1)
    while i < x.size:
        total += x[i]
        i += cuda.gridsize(1)
    cache[t] = total
    cuda.syncthreads()
    step = cuda.blockDim.x // 2
    while step > 0:
        if t < step:
            cache[t] += cache[t + step]
        cuda.syncthreads()
        step //= 2
    if t == 0:
        partial[cuda.blockIdx.x] = cache[0]


def reduce_sum(x, threads_per_block=THREADS_PER_BLOCK, blocks=None):
    """The sum of all elements of a float32 array, in two launches.

    The first launch leaves one partial sum per block; the second, one block, adds those up.
    `threads_per_block` must be a power of two (the tree halves it) and at most
    THREADS_PER_BLOCK (the size of the shared array).
    """
    x = as_float32(x, "reduce_sum").ravel()
    t = threads_per_block
    if not (isinstance(t, (int, np.integer)) and t >= 1 and t & (t - 1) == 0 and t <= THREADS_PER_BLOCK):
        check_launch(1, t, "reduce_sum_kernel")  # says it in CUDA's terms when it is simply impossible
        raise ValueError(f"reduce_sum: threads_per_block={t} must be a power of two of at most "
                         f"{THREADS_PER_BLOCK} (the tree halves the block; the shared array has "
                         f"{THREADS_PER_BLOCK} slots)")
    if x.size == 0:
        return np.float32(0)
    if blocks is None:
        blocks = min(blocks_for(x.size, t), MAX_SUM_BLOCKS)
    check_launch(blocks, t, "reduce_sum_kernel")
    partial = cuda.device_array(blocks, dtype=np.float32)
    launch(reduce_sum_kernel, blocks, t, cuda.to_device(x), partial)
    if blocks == 1:
        return partial.copy_to_host()[0]
    total = cuda.device_array(1, dtype=np.float32)
    launch(reduce_sum_kernel, 1, t, partial, total)
    return total.copy_to_host()[0]


# ----- sums along the first axis, and adding a row to every row -------------------------------------
@cuda.jit
def column_sum_kernel(x, out):
    """out[j] = sum of column j of x: one thread per column, walking down the rows (neighbouring
    threads read neighbouring numbers of each row: coalesced)."""
    j = cuda.grid(1)
    if j < x.shape[1]:
        acc = float32(0)
        for i in range(x.shape[0]):
            acc += x[i, j]
        out[j] = acc


@cuda.jit
def add_row_kernel(x, row):
    """x[i, j] += row[j] for every i: a bias added to every row, one thread per element."""
    j, i = cuda.grid(2)
    if i < x.shape[0] and j < x.shape[1]:
        x[i, j] += row[j]


def reduce_rows(x):
    """x.sum(axis=0) of a float32 array (its other axes kept), by a kernel."""
    x = as_float32(x, "reduce_rows")
    if x.ndim == 0:
        raise ValueError("reduce_rows: takes an array with at least one axis")
    flat = x.reshape(x.shape[0], int(np.prod(x.shape[1:])))  # not -1: that fails on zero rows
    out = cuda.device_array(flat.shape[1], dtype=np.float32)
    if flat.shape[1]:
        if flat.shape[0] == 0:
            return np.zeros(x.shape[1:], np.float32)
        launch(column_sum_kernel, blocks_for(flat.shape[1], THREADS_PER_BLOCK), THREADS_PER_BLOCK,
               cuda.to_device(flat), out)
    return out.copy_to_host().reshape(x.shape[1:])


def add_row_device(x, row):
    """Add the vector `row` (on the device) to every row of the 2-D device array `x`, in place."""
    side = 16 if THREADS_PER_BLOCK >= 256 else 8
    launch(add_row_kernel, (blocks_for(x.shape[1], side), blocks_for(x.shape[0], side)), (side, side), x, row)
    return x


def add_row(x, row):
    """x + row for a 2-D float32 array x and a vector row of x.shape[1] numbers (a bias), by a kernel."""
    x, row = as_float32(x, "add_row", "x"), as_float32(row, "add_row", "row")
    if x.ndim != 2 or row.shape != x.shape[1:]:
        raise ValueError(f"add_row: shapes {x.shape} and {row.shape} do not fit: it takes (m, n) and (n,)")
    d_x = cuda.to_device(x)
    if x.size:
        add_row_device(d_x, cuda.to_device(row))
    return d_x.copy_to_host()
