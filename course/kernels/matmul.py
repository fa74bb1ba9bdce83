"""Matrix multiplication on the GPU: naive, then tiled in shared memory.

C = A B with A (m, k) and B (k, n). One thread per element of C, on a 2-D grid: x runs along the
columns of C, so the threads of a warp (consecutive x) read consecutive numbers of B's row and
write consecutive numbers of C's row (coalesced accesses).

The naive kernel reads a whole row of A and a whole column of B from global memory for every
element of C: each number of A is read n times, each number of B m times. The tiled kernel
cuts the k axis into tiles of TILE: the block's TILE x TILE threads first copy one tile of A and
one of B into shared memory (each thread one number of each), wait, then all multiply from shared
memory, and wait again before the next tile overwrites it. Global reads drop by a factor TILE.
Tiles that stick out of the matrices (sizes that are not multiples of TILE) are padded with 0.
"""

import numpy as np
from numba import float32

from ._backend import backend, cuda
from .launch import as_float32, blocks_for, check_launch, launch

# 16 x 16 = 256 threads per block on a GPU; the simulator (one OS thread per GPU thread) gets 8 x 8.
TILE = 16 if backend() == "gpu" else 8
METHODS = ("tiled", "naive")


@cuda.jit
def matmul_naive_kernel(a, b, c):
    col, row = cuda.grid(2)
    if row < c.shape[0] and col < c.shape[1]:
        acc = float32(0)
        for k in range(a.shape[1]):
            acc += a[row, k] * b[k, col]
        c[row, col] = acc


@cuda.jit
def matmul_tiled_kernel(a, b, c):
    tile_a = cuda.shared.array((TILE, TILE), float32)
    tile_b = cuda.shared.array((TILE, TILE), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    col, row = cuda.grid(2)
    acc = float32(0)
    for start in range(0, a.shape[1], TILE):
        # Each thread loads one number of each tile (0 where the tile sticks out of the matrix).
        k = start + tx
        tile_a[ty, tx] = a[row, k] if row < a.shape[0] and k < a.shape[1] else 0
        k = start + ty
        tile_b[ty, tx] = b[k, col] if k < b.shape[0] and col < b.shape[1] else 0
        cuda.syncthreads()  # the tiles are complete
        for j in range(TILE):
            acc += tile_a[ty, j] * tile_b[j, tx]
        cuda.syncthreads()  # everyone is done with these tiles before the next ones overwrite them
    if row < c.shape[0] and col < c.shape[1]:  # after the loop: every thread must reach the barriers
        c[row, col] = acc


_KERNELS = {"tiled": matmul_tiled_kernel, "naive": matmul_naive_kernel}


def matmul_device(a, b, method="tiled"):
    """C = A B for two 2-D float32 arrays already on the device; returns C on the device."""
    (m, k), n = a.shape, b.shape[1]
    c = cuda.device_array((m, n), dtype=np.float32)
    if m and n:
        if k == 0:
            c.copy_to_device(np.zeros((m, n), np.float32))
        else:
            launch(_KERNELS[method], (blocks_for(n, TILE), blocks_for(m, TILE)), (TILE, TILE), a, b, c)
    return c


def _check(a, b, method, name="matmul"):
    if method not in _KERNELS:
        raise ValueError(f"{name}: unknown method {method!r}; the known ones are {', '.join(map(repr, METHODS))}")
    a, b = as_float32(a, name, "a"), as_float32(b, name, "b")
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"{name}: takes two 2-D arrays, got shapes {a.shape} and {b.shape}")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"{name}: shapes {a.shape} and {b.shape} do not match: the inner dimensions "
                         f"{a.shape[1]} and {b.shape[0]} differ")
    check_launch((blocks_for(b.shape[1], TILE) or 1, blocks_for(a.shape[0], TILE) or 1), (TILE, TILE),
                 _KERNELS[method].__name__)
    return a, b


def matmul(a, b, method="tiled"):
    """a @ b for two 2-D float32 arrays of any shapes that fit: method "tiled" or "naive"."""
    a, b = _check(a, b, method)
    return matmul_device(cuda.to_device(a), cuda.to_device(b), method).copy_to_host()
