"""Matrix multiplication on the GPU: naive, tiled in shared memory, then blocked in registers.

C = A B with A (m, k) and B (k, n). One thread per element of C, on a 2-D grid: x runs along the
columns of C, so the threads of a warp (consecutive x) read consecutive numbers of B's row and
write consecutive numbers of C's row (coalesced accesses).

The naive kernel reads a whole row of A and a whole column of B from global memory for every
element of C: each number of A is read n times, each number of B m times. The tiled kernel
cuts the k axis into tiles of TILE: the block's TILE x TILE threads first copy one tile of A and
one of B into shared memory (each thread one number of each), wait, then all multiply from shared
memory, and wait again before the next tile overwrites it. Global reads drop by a factor TILE.
Tiles that stick out of the matrices (sizes that are not multiples of TILE) are padded with 0.

Lesson 6.3's last section goes on towards cuBLAS: each thread computes several numbers of C in
registers (`make_thread_tile_kernel`: a column of tm; `make_register_kernel`: a tm x tn block),
the block's threads load the tiles together in coalesced steps, A's tile is stored transposed,
the tiles are aligned to 16 bytes so that the compiler reads 4 floats of shared memory with one
instruction, blocks inside the matrices load without bounds checks, and `choose_tiles` sizes the
tiles from the device's limits. Those kernels are batched
(`matmul_into`: a whole batch in one launch, the arrays already on the device).
"""

from collections import namedtuple

import numpy as np
from numba import float32

from ._backend import backend, cuda
from .launch import as_float32, blocks_for, check_launch, launch

# 16 x 16 = 256 threads per block on a GPU; without one (every thread run in Python) 8 x 8.
TILE = 16 if backend() == "gpu" else 8


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


# ----- more work per thread: register blocking, batched -------------------------------------------------
#
# The tiled kernel does two shared-memory reads for every multiply-add, and shared memory, though
# fast, is far slower than the arithmetic units. The kernels below give each thread several
# outputs, kept in registers (a `cuda.local.array` of constant size, indexed only by unrolled
# loops): a number read once from shared memory into a register then serves TM (or TN) multiply-
# adds. Each block computes a BM x BN block of C from tiles BM x BK of A and BK x BN of B; the
# block's threads load the tiles together, several numbers each, so that at each step the threads
# of a warp read neighbouring addresses (coalesced).
#
# All of them are batched: a (batch, m, k), b (batch, k, n), c (batch, m, n), blockIdx.z the batch
# index, so a whole batch is one launch. The tile sizes are constants when a kernel compiles
# (numba needs shared and local arrays of constant size), so a factory makes one kernel per choice.


@cuda.jit
def matmul_naive_batched_kernel(a, b, c):
    col, row, z = cuda.grid(3)
    if row < c.shape[1] and col < c.shape[2]:
        acc = float32(0)
        for k in range(a.shape[2]):
            acc += a[z, row, k] * b[z, k, col]
        c[z, row, col] = acc


@cuda.jit
def matmul_tiled_batched_kernel(a, b, c):
    tile_a = cuda.shared.array((TILE, TILE), float32)
    tile_b = cuda.shared.array((TILE, TILE), float32)
    tx, ty, z = cuda.threadIdx.x, cuda.threadIdx.y, cuda.blockIdx.z
    col, row, _ = cuda.grid(3)
    acc = float32(0)
    for start in range(0, a.shape[2], TILE):
        k = start + tx
        tile_a[ty, tx] = a[z, row, k] if row < a.shape[1] and k < a.shape[2] else 0
        k = start + ty
        tile_b[ty, tx] = b[z, k, col] if k < b.shape[1] and col < b.shape[2] else 0
        cuda.syncthreads()
        for j in range(TILE):
            acc += tile_a[ty, j] * tile_b[j, tx]
        cuda.syncthreads()
    if row < c.shape[1] and col < c.shape[2]:
        c[z, row, col] = acc


def make_thread_tile_kernel(bm, bn, bk, tm):
    """1-D register blocking: blocks of (bn, bm // tm) threads; thread (tx, ty) computes the tm
    numbers of column tx of the block's C at rows ty, ty + bm // tm, ... (strided, so that the
    threads of a warp, neighbours in tx, read and write neighbouring addresses)."""
    rows_per_pass = bm // tm  # = blockDim.y
    threads = bn * rows_per_pass
    a_loads, b_loads = bm * bk // threads, bk * bn // threads  # numbers each thread loads per tile
    assert bm % tm == 0 and (bm * bk) % threads == 0 and (bk * bn) % threads == 0, "tiles the threads cannot share"

    @cuda.jit
    def matmul_thread_tile_kernel(a, b, c):
        tile_a = cuda.shared.array((bm, bk), float32)
        tile_b = cuda.shared.array((bk, bn), float32)
        tx, ty, z = cuda.threadIdx.x, cuda.threadIdx.y, cuda.blockIdx.z
        t = ty * bn + tx  # the thread's number in its block: neighbours in a warp
        row0, col0 = cuda.blockIdx.y * bm, cuda.blockIdx.x * bn
        m, k, n = a.shape[1], a.shape[2], b.shape[2]
        acc = cuda.local.array(tm, float32)  # this thread's tm numbers of C, in registers
        for i in range(tm):
            acc[i] = 0
        for start in range(0, k, bk):
            for s in range(a_loads):  # number e of the tile: neighbouring threads, neighbouring addresses
                e = t + s * threads
                r, q = e // bk, e % bk
                tile_a[r, q] = a[z, row0 + r, start + q] if row0 + r < m and start + q < k else 0
            for s in range(b_loads):
                e = t + s * threads
                r, q = e // bn, e % bn
                tile_b[r, q] = b[z, start + r, col0 + q] if start + r < k and col0 + q < n else 0
            cuda.syncthreads()
            for p in range(bk):
                b_p = tile_b[p, tx]  # one shared read, used tm times from a register
                for i in range(tm):
                    acc[i] += tile_a[ty + i * rows_per_pass, p] * b_p
            cuda.syncthreads()
        col = col0 + tx
        for i in range(tm):
            row = row0 + ty + i * rows_per_pass
            if row < m and col < n:
                c[z, row, col] = acc[i]

    return matmul_thread_tile_kernel


def make_register_kernel(bm, bn, bk, tm, tn, transpose_a=True, pad_a=None, group=1, pad_b=4, interior=False,
                         align=16):
    """2-D register blocking: blocks of (bn // tn, bm // tm) threads; thread (tx, ty) computes a
    tm x tn block of C.

    `group`: a thread's rows (and columns) come in runs of `group` neighbours. group=1 (the
    default) strides them, rows ty, ty + bm // tm, ..., so that the threads of a warp read
    neighbouring words of shared memory (no bank conflicts) and write neighbouring numbers of C;
    group=None makes the thread's block contiguous (rows ty * tm ... ty * tm + tm - 1); group=4
    gives it runs of 4 neighbours, 4 * (bm // tm) rows apart. Both tiles are aligned to `align`
    bytes (16; None leaves it to the compiler, 4 for float32), so the compiler can read a run of 4
    floats of shared memory with one 16-byte instruction (ld.shared.v4 in PTX) instead of four:
    with group=4 a warp's 16-byte reads of B's tile are neighbours, without a bank conflict.

    A's tile is stored transposed, (bk, bm), unless transpose_a is False, so that the inner loop
    reads along a row of it; `pad_a` extra columns (by default 32 // bk when transposed) spread
    the transposed store over the banks. `pad_b` extra columns of B's tile change no bank, but let
    the compiler address a thread's numbers of a row as one register plus constants (with rows of
    128 words it spends 40 more integer instructions per 64 multiply-adds to add the offsets).

    `interior`: a block whose tiles lie inside the matrices loads them without the bounds checks
    (only the blocks at the edges, and the last tile of k when bk does not divide it, test each
    index)."""
    ty_count, tx_count = bm // tm, bn // tn  # = blockDim.y, blockDim.x
    threads = tx_count * ty_count
    a_loads, b_loads = bm * bk // threads, bk * bn // threads
    gm, gn = (tm, tn) if group is None else (group, group)  # a run of rows, of columns
    assert bm % tm == 0 and bn % tn == 0, "the thread tile must divide the block tile"
    assert tm % gm == 0 and tn % gn == 0, "the runs of neighbours must divide the thread tile"
    assert (bm * bk) % threads == 0 and (bk * bn) % threads == 0, "tiles the threads cannot share"
    if pad_a is None:
        pad_a = max(32 // bk, 1) if transpose_a else 0
    shape_a = (bk, bm + pad_a) if transpose_a else (bm, bk + pad_a)
    shape_b = (bk, bn + pad_b)

    @cuda.jit(device=True, inline=True)
    def row_of(ty, i):  # the block's row of the thread's i-th row
        return (i // gm) * (ty_count * gm) + ty * gm + i % gm

    @cuda.jit(device=True, inline=True)
    def col_of(tx, j):
        return (j // gn) * (tx_count * gn) + tx * gn + j % gn

    @cuda.jit
    def matmul_register_kernel(a, b, c):
        tile_a = cuda.shared.array(shape_a, float32, alignment=align)
        tile_b = cuda.shared.array(shape_b, float32, alignment=align)
        tx, ty, z = cuda.threadIdx.x, cuda.threadIdx.y, cuda.blockIdx.z
        t = ty * tx_count + tx
        row0, col0 = cuda.blockIdx.y * bm, cuda.blockIdx.x * bn
        m, k, n = a.shape[1], a.shape[2], b.shape[2]
        inside = interior and row0 + bm <= m and col0 + bn <= n
        acc = cuda.local.array((tm, tn), float32)  # the thread's tm x tn block of C
        a_reg = cuda.local.array(tm, float32)  # a column of A's tile and a row of B's, in registers
        b_reg = cuda.local.array(tn, float32)
        for i in range(tm):
            for j in range(tn):
                acc[i, j] = 0
        for start in range(0, k, bk):
            unchecked = inside and start + bk <= k  # the same for every thread of the block: no divergence
            for s in range(a_loads):  # coalesced: neighbouring threads read neighbouring numbers of A's rows
                e = t + s * threads
                r, q = e // bk, e % bk
                if unchecked:
                    v = a[z, row0 + r, start + q]
                else:
                    v = a[z, row0 + r, start + q] if row0 + r < m and start + q < k else float32(0)
                if transpose_a:
                    tile_a[q, r] = v
                else:
                    tile_a[r, q] = v
            for s in range(b_loads):
                e = t + s * threads
                r, q = e // bn, e % bn
                if unchecked:
                    tile_b[r, q] = b[z, start + r, col0 + q]
                else:
                    tile_b[r, q] = b[z, start + r, col0 + q] if start + r < k and col0 + q < n else float32(0)
            cuda.syncthreads()
            for p in range(bk):
                for i in range(tm):
                    r = row_of(ty, i)
                    a_reg[i] = tile_a[p, r] if transpose_a else tile_a[r, p]
                for j in range(tn):
                    b_reg[j] = tile_b[p, col_of(tx, j)]
                for i in range(tm):  # tm * tn multiply-adds from tm + tn shared reads
                    for j in range(tn):
                        acc[i, j] += a_reg[i] * b_reg[j]
            cuda.syncthreads()
        for i in range(tm):
            row = row0 + row_of(ty, i)
            for j in range(tn):
                col = col0 + col_of(tx, j)
                if row < m and col < n:
                    c[z, row, col] = acc[i, j]

    return matmul_register_kernel


# ----- tile sizes from the hardware's limits ------------------------------------------------------------
Tiles = namedtuple("Tiles", "bm bn bk tm tn")
MAX_REGISTERS_PER_THREAD = 255  # a limit of the instruction set: beyond it, values spill to memory
OTHER_REGISTERS = 32  # about what a thread needs besides its tiles: indices, addresses, loop counters


def registers_per_thread(tm, tn):
    """Registers a thread of the register kernel needs: its tm x tn sums, a column of A's tile and a
    row of B's, and the rest (an estimate: the compiler decides)."""
    return tm * tn + tm + tn + OTHER_REGISTERS


def shared_bytes(bm, bn, bk):
    return 4 * (bk * (bm + max(32 // bk, 1)) + bk * (bn + 4))  # A's tile transposed and padded, then B's


def choose_tiles(shared_per_block=48 * 1024, threads_per_block=1024, registers_per_block=65536,
                 simulator=False):
    """The tiles (bm, bn, bk, tm, tn) of the register kernel for a device with these limits.

    The first that fits, in this order of preference: the largest thread tile (more multiply-adds
    per shared read) whose registers stay under the per-thread limit; then the largest block tile
    (more reuse of each number loaded from global memory) whose threads, registers and shared
    memory fit in a block; bk = 8 first, enough numbers per tile load to keep every thread busy.
    On the simulator, which runs each GPU thread as a Python thread, small tiles and few threads.
    """
    if simulator:
        return Tiles(16, 16, 4, 4, 4)  # 16 threads per block, each a 4 x 4 block of C
    for t in (8, 4, 2, 1):
        regs = registers_per_thread(t, t)
        if regs > MAX_REGISTERS_PER_THREAD:
            continue
        for bm in (128, 64, 32, 16):
            threads = (bm // t) ** 2
            if bm < t or threads > threads_per_block or threads * regs > registers_per_block or threads < 32:
                continue
            for bk in (8, 16, 4):
                fits = shared_bytes(bm, bm, bk) <= shared_per_block
                shares = (bm * bk) % threads == 0  # every thread loads as many numbers of each tile
                if fits and shares:
                    return Tiles(bm, bm, bk, t, t)
    raise ValueError(f"choose_tiles: no tiles fit {shared_per_block} bytes of shared memory, {threads_per_block} "
                     f"threads and {registers_per_block} registers per block")


def device_limits():
    """This GPU's limits for `choose_tiles` ({} on the simulator, which has none to ask)."""
    if backend() != "gpu":
        return {}
    device = cuda.get_current_device()
    return {"shared_per_block": device.MAX_SHARED_MEMORY_PER_BLOCK,
            "threads_per_block": device.MAX_THREADS_PER_BLOCK,
            "registers_per_block": getattr(device, "MAX_REGISTERS_PER_BLOCK", 65536)}


TILES = choose_tiles(**device_limits(), simulator=backend() != "gpu")
THREAD_TILE = (64, 64, 8, 8) if backend() == "gpu" else (8, 8, 4, 4)  # (bm, bn, bk, tm): 512 or 16 threads
matmul_thread_tile_kernel = make_thread_tile_kernel(*THREAD_TILE)
# Runs of 4 neighbours, read 16 bytes at a time, and no bounds checks inside the matrices: on an
# H100 at 4096 x 4096, 7.1 ms with the contiguous 8 x 8 thread tiles of before (four-byte reads,
# bank conflicts on B's tile), 5.9 ms with those tiles read 16 bytes at a time, 5.3 ms with runs
# of 4 and the interior without checks (cuBLAS: 2.7 ms). Lesson 6.3's last section has the steps.
matmul_register_kernel = make_register_kernel(*TILES, group=4, interior=True)

METHODS = ("tiled", "naive", "thread_tile", "register")
BEST_METHOD = "register"
# method -> (batched kernel, (rows, columns) of C per block, threads per block (x, y))
_BATCHED = {
    "naive": (matmul_naive_batched_kernel, (TILE, TILE), (TILE, TILE)),
    "tiled": (matmul_tiled_batched_kernel, (TILE, TILE), (TILE, TILE)),
    "thread_tile": (matmul_thread_tile_kernel, THREAD_TILE[:2],
                    (THREAD_TILE[1], THREAD_TILE[0] // THREAD_TILE[3])),
    "register": (matmul_register_kernel, (TILES.bm, TILES.bn), (TILES.bn // TILES.tn, TILES.bm // TILES.tm)),
}


def _method(method, name):
    if method not in METHODS:
        raise ValueError(f"{name}: unknown method {method!r}; the known ones are {', '.join(map(repr, METHODS))}")
    return method


def matmul_into(a, b, out, method=None):
    """out[i] = a[i] @ b[i] for a (batch, m, k), b (batch, k, n), out (batch, m, n), float32 arrays
    already on the device: one launch (the batch on the grid's z axis), no copies; returns out.
    method None: the fastest here (BEST_METHOD)."""
    method = _method(BEST_METHOD if method is None else method, "matmul_into")
    for what, x in (("a", a), ("b", b), ("out", out)):
        if len(x.shape) != 3 or x.dtype != np.float32:
            raise ValueError(f"matmul_into: {what} must be a 3-D float32 array (batch, rows, columns), "
                             f"got shape {tuple(x.shape)} and dtype {x.dtype}")
    batch, m, k = a.shape
    n = b.shape[2]
    if b.shape[:2] != (batch, k) or tuple(out.shape) != (batch, m, n):
        raise ValueError(f"matmul_into: shapes {tuple(a.shape)} @ {tuple(b.shape)} -> {tuple(out.shape)} do not "
                         f"match: it takes (batch, m, k) @ (batch, k, n) -> (batch, m, n)")
    kernel, (rows, cols), block = _BATCHED[method]
    if batch and m and n:  # k == 0 runs too: no term in the sums, so the kernel writes zeros
        launch(kernel, (blocks_for(n, cols), blocks_for(m, rows), batch), block, a, b, out)
    return out


_KERNELS = {"tiled": matmul_tiled_kernel, "naive": matmul_naive_kernel}  # the 2-D kernels above


def matmul_device(a, b, method="tiled"):
    """C = A B for two 2-D float32 arrays already on the device; returns C on the device."""
    (m, k), n = a.shape, b.shape[1]
    c = cuda.device_array((m, n), dtype=np.float32)
    if method not in _KERNELS:  # the batched kernels, on a batch of one
        matmul_into(a.reshape(1, m, k), b.reshape(1, k, n), c.reshape(1, m, n), method)
    elif m and n:
        if k == 0:
            c.copy_to_device(np.zeros((m, n), np.float32))
        else:
            launch(_KERNELS[method], (blocks_for(n, TILE), blocks_for(m, TILE)), (TILE, TILE), a, b, c)
    return c


def _check(a, b, method, name="matmul"):
    _method(method, name)
    a, b = as_float32(a, name, "a"), as_float32(b, name, "b")
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"{name}: takes two 2-D arrays, got shapes {a.shape} and {b.shape}")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"{name}: shapes {a.shape} and {b.shape} do not match: the inner dimensions "
                         f"{a.shape[1]} and {b.shape[0]} differ")
    kernel, (rows, cols), block = _BATCHED[method]
    check_launch((blocks_for(b.shape[1], cols) or 1, blocks_for(a.shape[0], rows) or 1), block,
                 _KERNELS.get(method, kernel).__name__)
    return a, b


def matmul(a, b, method="tiled"):
    """a @ b for two 2-D float32 arrays of any shapes that fit: method one of METHODS."""
    a, b = _check(a, b, method)
    return matmul_device(cuda.to_device(a), cuda.to_device(b), method).copy_to_host()
