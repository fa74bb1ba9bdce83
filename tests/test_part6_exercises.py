"""The checks of part 6: a stub is not attempted, the classic mistakes (a race, a missing guard, an
off-by-one index, a forgotten barrier, a forgotten return) fail with a message in words, and a
right answer passes."""

import math

import numpy as np
import pytest

import course.kernels as K
from course.exercises import check
from course.kernels import cuda
from course.tensor import operation

from numba import float32  # noqa: E402  (after course.kernels, which chooses the CUDA backend)

pytestmark = pytest.mark.part6

TPB = 32
TILE = 4


def stub(*args, **kwargs):
    raise NotImplementedError


@cuda.jit
def stub_kernel(*args):
    raise NotImplementedError  # your code here


# ===== 6.1 ===========================================================================================


def global_index_2d(block_idx, block_dim, thread_idx):
    return tuple(b * d + t for b, d, t in zip(block_idx, block_dim, thread_idx))


def global_index_2d_no_block_dim(block_idx, block_dim, thread_idx):
    return tuple(b + t for b, t in zip(block_idx, thread_idx))


def global_index_2d_swapped(block_idx, block_dim, thread_idx):
    return global_index_2d(block_idx, block_dim, thread_idx)[::-1]


@cuda.jit
def scale(x, alpha, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = alpha * x[i]


@cuda.jit
def scale_no_guard(x, alpha, out):
    i = cuda.grid(1)
    out[i] = alpha * x[i]


@cuda.jit
def scale_guard_off_by_one(x, alpha, out):
    i = cuda.grid(1)
    if i <= x.size:
        out[i] = alpha * x[i]


@cuda.jit
def scale_block_index_only(x, alpha, out):
    i = cuda.threadIdx.x  # forgets the blocks before this one: every block writes the first elements
    if i < x.size:
        out[i] = alpha * x[i]


def grid_for(shape, block):
    rows, cols = shape
    return ((cols + block[0] - 1) // block[0], (rows + block[1] - 1) // block[1])


def grid_for_floor(shape, block):
    rows, cols = shape
    return (cols // block[0], rows // block[1])


def grid_for_one_extra(shape, block):
    rows, cols = shape
    return (cols // block[0] + 1, rows // block[1] + 1)


def grid_for_axes_swapped(shape, block):
    return tuple((s + b - 1) // b for s, b in zip(shape, block))


@cuda.jit
def add_matrices(a, b, out):
    col, row = cuda.grid(2)
    if row < out.shape[0] and col < out.shape[1]:
        out[row, col] = a[row, col] + b[row, col]


@cuda.jit
def add_matrices_guard_rows_only(a, b, out):
    col, row = cuda.grid(2)
    if row < out.shape[0]:
        out[row, col] = a[row, col] + b[row, col]


@cuda.jit
def add_matrices_swapped(a, b, out):
    row, col = cuda.grid(2)  # x taken as the row: the grid was sized for x along the columns
    if row < out.shape[0] and col < out.shape[1]:
        out[row, col] = a[row, col] + b[row, col]


@cuda.jit
def scale_strided(x, alpha, out):
    i = cuda.grid(1)
    while i < x.size:
        out[i] = alpha * x[i]
        i += cuda.gridsize(1)


@cuda.jit
def scale_strided_by_block(x, alpha, out):
    i = cuda.grid(1)
    while i < x.size:
        out[i] = alpha * x[i]
        i += cuda.blockDim.x  # the step of one block, not the grid: blocks overwrite each other


# ===== 6.2 ===========================================================================================


@cuda.jit
def reverse_in_place(x):
    t = cuda.threadIdx.x
    v = x[x.size - 1 - t]
    cuda.syncthreads()
    x[t] = v


@cuda.jit
def reverse_in_place_no_barrier(x):
    t = cuda.threadIdx.x
    v = x[x.size - 1 - t]
    x[t] = v


@cuda.jit
def reverse_off_by_one(x):
    t = cuda.threadIdx.x
    v = x[x.size - t]
    cuda.syncthreads()
    x[t] = v


@cuda.jit
def block_sum(x, partial):
    cache = cuda.shared.array(TPB, float32)
    t = cuda.threadIdx.x
    i = cuda.grid(1)
    cache[t] = x[i] if i < x.size else 0
    cuda.syncthreads()
    step = cuda.blockDim.x // 2
    while step > 0:
        if t < step:
            cache[t] += cache[t + step]
        cuda.syncthreads()
        step //= 2
    if t == 0:
        partial[cuda.blockIdx.x] = cache[0]


@cuda.jit
def block_sum_no_barrier(x, partial):
    cache = cuda.shared.array(TPB, float32)
    t = cuda.threadIdx.x
    i = cuda.grid(1)
    cache[t] = x[i] if i < x.size else 0
    cuda.syncthreads()
    step = cuda.blockDim.x // 2
    while step > 0:
        if t < step:
            cache[t] += cache[t + step]
        step //= 2
    if t == 0:
        partial[cuda.blockIdx.x] = cache[0]


@cuda.jit
def block_sum_no_padding(x, partial):
    cache = cuda.shared.array(TPB, float32)
    t = cuda.threadIdx.x
    i = cuda.grid(1)
    if i < x.size:
        cache[t] = x[i]
    cuda.syncthreads()
    step = cuda.blockDim.x // 2
    while step > 0:
        if t < step:
            cache[t] += cache[t + step]
        cuda.syncthreads()
        step //= 2
    if t == 0:
        partial[cuda.blockIdx.x] = cache[0]


@cuda.jit
def block_sum_load_unguarded(x, partial):
    cache = cuda.shared.array(TPB, float32)
    t = cuda.threadIdx.x
    cache[t] = x[cuda.grid(1)]
    cuda.syncthreads()
    step = cuda.blockDim.x // 2
    while step > 0:
        if t < step:
            cache[t] += cache[t + step]
        cuda.syncthreads()
        step //= 2
    if t == 0:
        partial[cuda.blockIdx.x] = cache[0]


@cuda.jit
def rms_norm_rows(x, weight, eps, out):
    cache = cuda.shared.array(TPB, float32)
    row, t, n = cuda.blockIdx.x, cuda.threadIdx.x, x.shape[1]
    s = float32(0)
    for j in range(t, n, cuda.blockDim.x):
        s += x[row, j] * x[row, j]
    cache[t] = s
    cuda.syncthreads()
    step = cuda.blockDim.x // 2
    while step > 0:
        if t < step:
            cache[t] += cache[t + step]
        cuda.syncthreads()
        step //= 2
    r = 1 / math.sqrt(cache[0] / n + eps)
    for j in range(t, n, cuda.blockDim.x):
        out[row, j] = x[row, j] * r * weight[j]


@cuda.jit
def rms_norm_one_thread(x, weight, eps, out):
    # right, if slow: thread 0 of each block does the whole row
    row = cuda.blockIdx.x
    if cuda.threadIdx.x == 0:
        s = 0.0
        for j in range(x.shape[1]):
            s += x[row, j] * x[row, j]
        r = 1 / math.sqrt(s / x.shape[1] + eps)
        for j in range(x.shape[1]):
            out[row, j] = x[row, j] * r * weight[j]


@cuda.jit
def rms_norm_no_barrier(x, weight, eps, out):
    cache = cuda.shared.array(TPB, float32)
    row, t, n = cuda.blockIdx.x, cuda.threadIdx.x, x.shape[1]
    s = float32(0)
    for j in range(t, n, cuda.blockDim.x):
        s += x[row, j] * x[row, j]
    cache[t] = s
    step = cuda.blockDim.x // 2
    while step > 0:
        if t < step:
            cache[t] += cache[t + step]
        step //= 2
    r = 1 / math.sqrt(cache[0] / n + eps)
    for j in range(t, n, cuda.blockDim.x):
        out[row, j] = x[row, j] * r * weight[j]


@cuda.jit
def rms_norm_one_column_per_thread(x, weight, eps, out):
    cache = cuda.shared.array(TPB, float32)
    row, t, n = cuda.blockIdx.x, cuda.threadIdx.x, x.shape[1]
    cache[t] = x[row, t] * x[row, t] if t < n else 0
    cuda.syncthreads()
    step = cuda.blockDim.x // 2
    while step > 0:
        if t < step:
            cache[t] += cache[t + step]
        cuda.syncthreads()
        step //= 2
    if t < n:
        out[row, t] = x[row, t] / math.sqrt(cache[0] / n + eps) * weight[t]


@cuda.jit
def rms_norm_eps_outside(x, weight, eps, out):
    row = cuda.blockIdx.x
    if cuda.threadIdx.x == 0:
        s = 0.0
        for j in range(x.shape[1]):
            s += x[row, j] * x[row, j]
        r = 1 / (math.sqrt(s / x.shape[1]) + eps)
        for j in range(x.shape[1]):
            out[row, j] = x[row, j] * r * weight[j]


# ===== 6.3 ===========================================================================================


@cuda.jit
def matmul_bt(a, bt, c):
    col, row = cuda.grid(2)
    if row < c.shape[0] and col < c.shape[1]:
        acc = float32(0)
        for k in range(a.shape[1]):
            acc += a[row, k] * bt[col, k]
        c[row, col] = acc


@cuda.jit
def matmul_bt_not_transposed(a, bt, c):
    col, row = cuda.grid(2)
    if row < c.shape[0] and col < c.shape[1]:
        acc = float32(0)
        for k in range(a.shape[1]):
            acc += a[row, k] * bt[k, col]  # as if bt were B
        c[row, col] = acc


@cuda.jit
def matmul_bt_guard_off_by_one(a, bt, c):
    col, row = cuda.grid(2)
    if row <= c.shape[0] and col <= c.shape[1]:
        acc = float32(0)
        for k in range(a.shape[1]):
            acc += a[row, k] * bt[col, k]
        c[row, col] = acc


@cuda.jit
def matmul_bt_tiled(a, bt, c):
    tile_a = cuda.shared.array((TILE, TILE), float32)
    tile_b = cuda.shared.array((TILE, TILE), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    col, row = cuda.grid(2)
    acc = float32(0)
    for start in range(0, a.shape[1], TILE):
        tile_a[ty, tx] = a[row, start + tx] if row < a.shape[0] and start + tx < a.shape[1] else 0
        tile_b[ty, tx] = bt[col, start + ty] if col < bt.shape[0] and start + ty < bt.shape[1] else 0
        cuda.syncthreads()
        for j in range(TILE):
            acc += tile_a[ty, j] * tile_b[j, tx]
        cuda.syncthreads()
    if row < c.shape[0] and col < c.shape[1]:
        c[row, col] = acc


@cuda.jit
def matmul_bt_tiled_load_unguarded(a, bt, c):
    tile_a = cuda.shared.array((TILE, TILE), float32)
    tile_b = cuda.shared.array((TILE, TILE), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    col, row = cuda.grid(2)
    acc = float32(0)
    for start in range(0, a.shape[1], TILE):
        tile_a[ty, tx] = a[row, start + tx]
        tile_b[ty, tx] = bt[col, start + ty]
        cuda.syncthreads()
        for j in range(TILE):
            acc += tile_a[ty, j] * tile_b[j, tx]
        cuda.syncthreads()
    if row < c.shape[0] and col < c.shape[1]:
        c[row, col] = acc


@cuda.jit
def matmul_bt_tiled_no_zero(a, bt, c):
    tile_a = cuda.shared.array((TILE, TILE), float32)
    tile_b = cuda.shared.array((TILE, TILE), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    col, row = cuda.grid(2)
    acc = float32(0)
    for start in range(0, a.shape[1], TILE):
        if row < a.shape[0] and start + tx < a.shape[1]:
            tile_a[ty, tx] = a[row, start + tx]
        if col < bt.shape[0] and start + ty < bt.shape[1]:
            tile_b[ty, tx] = bt[col, start + ty]
        cuda.syncthreads()
        for j in range(TILE):
            acc += tile_a[ty, j] * tile_b[j, tx]
        cuda.syncthreads()
    if row < c.shape[0] and col < c.shape[1]:
        c[row, col] = acc


@cuda.jit
def matmul_bt_tiled_no_second_barrier(a, bt, c):
    tile_a = cuda.shared.array((TILE, TILE), float32)
    tile_b = cuda.shared.array((TILE, TILE), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    col, row = cuda.grid(2)
    acc = float32(0)
    for start in range(0, a.shape[1], TILE):
        tile_a[ty, tx] = a[row, start + tx] if row < a.shape[0] and start + tx < a.shape[1] else 0
        tile_b[ty, tx] = bt[col, start + ty] if col < bt.shape[0] and start + ty < bt.shape[1] else 0
        cuda.syncthreads()
        for j in range(TILE):
            acc += tile_a[ty, j] * tile_b[j, tx]
    if row < c.shape[0] and col < c.shape[1]:
        c[row, col] = acc


def tiled_reads(m, k, n, tile):
    return math.ceil(n / tile) * m * k + math.ceil(m / tile) * k * n


def tiled_reads_divisible_only(m, k, n, tile):
    return 2 * m * k * n / tile


def naive_reads(m, k, n, tile):
    return 2 * m * k * n


MAX_N = 16


@cuda.jit
def scan_kernel(u, delta, A, B, C, D, y):
    i = cuda.grid(1)
    batch, length, channels = u.shape
    n = A.shape[1]
    if i < batch * channels:
        bi, d = i // channels, i % channels
        h = cuda.local.array(MAX_N, float32)
        for s in range(n):
            h[s] = 0
        for t in range(length):
            dt, x = delta[bi, t, d], u[bi, t, d]
            acc = D[d] * x
            for s in range(n):
                h[s] = math.exp(dt * A[d, s]) * h[s] + dt * B[bi, t, s] * x
                acc += C[bi, t, s] * h[s]
            y[bi, t, d] = acc


@cuda.jit
def scan_kernel_state_by_state(u, delta, A, B, C, D, y):
    # right too: one state number at a time, adding its share into y
    i = cuda.grid(1)
    batch, length, channels = u.shape
    if i < batch * channels:
        bi, d = i // channels, i % channels
        for t in range(length):
            y[bi, t, d] = D[d] * u[bi, t, d]
        for s in range(A.shape[1]):
            h = 0.0
            for t in range(length):
                h = math.exp(delta[bi, t, d] * A[d, s]) * h + delta[bi, t, d] * B[bi, t, s] * u[bi, t, d]
                y[bi, t, d] += C[bi, t, s] * h


@cuda.jit
def scan_kernel_no_guard(u, delta, A, B, C, D, y):
    i = cuda.grid(1)
    batch, length, channels = u.shape
    n = A.shape[1]
    bi, d = i // channels, i % channels
    h = cuda.local.array(MAX_N, float32)
    for s in range(n):
        h[s] = 0
    for t in range(length):
        dt, x = delta[bi, t, d], u[bi, t, d]
        acc = D[d] * x
        for s in range(n):
            h[s] = math.exp(dt * A[d, s]) * h[s] + dt * B[bi, t, s] * x
            acc += C[bi, t, s] * h[s]
        y[bi, t, d] = acc


@cuda.jit
def scan_kernel_forgets_D(u, delta, A, B, C, D, y):
    i = cuda.grid(1)
    batch, length, channels = u.shape
    n = A.shape[1]
    if i < batch * channels:
        bi, d = i // channels, i % channels
        h = cuda.local.array(MAX_N, float32)
        for s in range(n):
            h[s] = 0
        for t in range(length):
            dt, x = delta[bi, t, d], u[bi, t, d]
            acc = float32(0)
            for s in range(n):
                h[s] = math.exp(dt * A[d, s]) * h[s] + dt * B[bi, t, s] * x
                acc += C[bi, t, s] * h[s]
            y[bi, t, d] = acc


# ===== 6.4 ===========================================================================================


@cuda.jit
def softmax_backward_rows(s, g, dx):
    cache = cuda.shared.array(TPB, float32)
    row, t, n = cuda.blockIdx.x, cuda.threadIdx.x, s.shape[1]
    dot = float32(0)
    for j in range(t, n, cuda.blockDim.x):
        dot += g[row, j] * s[row, j]
    cache[t] = dot
    cuda.syncthreads()
    step = cuda.blockDim.x // 2
    while step > 0:
        if t < step:
            cache[t] += cache[t + step]
        cuda.syncthreads()
        step //= 2
    dot = cache[0]
    for j in range(t, n, cuda.blockDim.x):
        dx[row, j] = s[row, j] * (g[row, j] - dot)


@cuda.jit
def softmax_backward_elementwise(s, g, dx):
    # the diagonal of the Jacobian only: forgets that every output depends on every input
    row, t, n = cuda.blockIdx.x, cuda.threadIdx.x, s.shape[1]
    for j in range(t, n, cuda.blockDim.x):
        dx[row, j] = s[row, j] * (1 - s[row, j]) * g[row, j]


@cuda.jit
def softmax_backward_no_barrier(s, g, dx):
    cache = cuda.shared.array(TPB, float32)
    row, t, n = cuda.blockIdx.x, cuda.threadIdx.x, s.shape[1]
    dot = float32(0)
    for j in range(t, n, cuda.blockDim.x):
        dot += g[row, j] * s[row, j]
    cache[t] = dot
    step = cuda.blockDim.x // 2
    while step > 0:
        if t < step:
            cache[t] += cache[t + step]
        step //= 2
    dot = cache[0]
    for j in range(t, n, cuda.blockDim.x):
        dx[row, j] = s[row, j] * (g[row, j] - dot)


def kernel_relu(x, forward_kernel, backward_kernel):
    blocks = (x.data.size + 31) // 32
    out = np.empty_like(x.data)
    forward_kernel[blocks, 32](x.data, out)

    def backward(g):
        dx = np.empty_like(x.data)
        backward_kernel[blocks, 32](x.data, np.ascontiguousarray(g, dtype=x.data.dtype), dx)
        return dx

    return operation("kernel_relu", out, (x,), backward)


def kernel_relu_float64_out(x, forward_kernel, backward_kernel):  # np.empty's default dtype
    blocks = (x.data.size + 31) // 32
    out = np.empty(x.data.shape)
    forward_kernel[blocks, 32](x.data, out)
    return operation("kernel_relu", out, (x,), lambda g: g * (x.data > 0))


def kernel_relu_without_x(x, forward_kernel, backward_kernel):  # x not among the operation's inputs
    blocks = (x.data.size + 31) // 32
    out = np.empty_like(x.data)
    forward_kernel[blocks, 32](x.data, out)
    return operation("kernel_relu", out, (), lambda g: ())


def kernel_relu_backward_in_numpy(x, forward_kernel, backward_kernel):
    blocks = (x.data.size + 31) // 32
    out = np.empty_like(x.data)
    forward_kernel[blocks, 32](x.data, out)
    return operation("kernel_relu", out, (x,), lambda g: (g * (x.data > 0)).astype(x.data.dtype))


def kernel_relu_named_relu(x, forward_kernel, backward_kernel):
    y = kernel_relu(x, forward_kernel, backward_kernel)
    y.op = "relu"
    return y


def kernel_relu_by_ceil(x, forward_kernel, backward_kernel):  # right: zeros_like, blocks by math.ceil
    blocks = math.ceil(x.data.size / 32)
    out = np.zeros_like(x.data)
    forward_kernel[blocks, 32](x.data, out)

    def backward(g):
        dx = np.zeros_like(x.data)
        backward_kernel[blocks, 32](x.data, np.asarray(g, dtype=x.data.dtype), dx)
        return (dx,)

    return operation("kernel_relu", out, [x], backward)


def kernel_relu_forgot_return(x, forward_kernel, backward_kernel):
    kernel_relu(x, forward_kernel, backward_kernel)


def kernel_relu_one_block(x, forward_kernel, backward_kernel):
    out = np.empty_like(x.data)
    forward_kernel[1, 32](x.data, out)

    def backward(g):
        dx = np.empty_like(x.data)
        backward_kernel[1, 32](x.data, g, dx)
        return dx

    return operation("kernel_relu", out, (x,), backward)


def kernel_relu_numpy(x, forward_kernel, backward_kernel):
    return operation("kernel_relu", np.maximum(x.data, 0), (x,), lambda g: g * (x.data > 0))


def matmul_backward(a, b, g, matmul):
    return matmul(g, b.T), matmul(a.T, g)


def matmul_backward_no_transpose(a, b, g, matmul):
    return matmul(g, b), matmul(a, g)


def matmul_backward_numpy(a, b, g, matmul):
    return g @ b.T, a.T @ g


@cuda.jit
def matmul_bt_row_from_x(a, bt, c):
    row, col = cuda.grid(2)  # x taken for the row: on a tall c, the grid's x does not reach every row
    if row < c.shape[0] and col < c.shape[1]:
        acc = float32(0)
        for k in range(a.shape[1]):
            acc += a[row, k] * bt[col, k]
        c[row, col] = acc


@cuda.jit
def scan_kernel_state_not_zeroed(u, delta, A, B, C, D, y):
    i = cuda.grid(1)
    batch, length, channels = u.shape
    n = A.shape[1]
    if i < batch * channels:
        bi, d = i // channels, i % channels
        h = cuda.local.array(MAX_N, float32)  # never set to 0: garbage on a GPU
        for t in range(length):
            dt, x = delta[bi, t, d], u[bi, t, d]
            acc = D[d] * x
            for s in range(n):
                h[s] = math.exp(dt * A[d, s]) * h[s] + dt * B[bi, t, s] * x
                acc += C[bi, t, s] * h[s]
            y[bi, t, d] = acc


# ----- right answers written otherwise than the worked solutions

@cuda.jit
def block_sum_interleaved(x, partial):
    # neighbours first (steps 1, 2, 4, ...), thread t busy when t is a multiple of twice the step
    cache = cuda.shared.array(TPB, float32)
    t = cuda.threadIdx.x
    i = cuda.blockIdx.x * cuda.blockDim.x + t
    cache[t] = 0
    if i < x.size:
        cache[t] = x[i]
    cuda.syncthreads()
    step = 1
    while step < cuda.blockDim.x:
        if t % (2 * step) == 0:
            cache[t] += cache[t + step]
        cuda.syncthreads()
        step *= 2
    if t == 0:
        partial[cuda.blockIdx.x] = cache[0]


@cuda.jit
def matmul_bt_tiled_bt_layout(a, bt, c):
    # the tile of bt kept in bt's own layout: tile_b[i, j] = bt[block's column i, start + j]
    tile_a = cuda.shared.array((TILE, TILE), float32)
    tile_b = cuda.shared.array((TILE, TILE), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    row = cuda.blockIdx.y * TILE + ty
    col = cuda.blockIdx.x * TILE + tx
    b_row = cuda.blockIdx.x * TILE + ty
    acc = float32(0)
    for step in range((a.shape[1] + TILE - 1) // TILE):
        start = step * TILE
        tile_a[ty, tx] = 0
        tile_b[ty, tx] = 0
        if row < a.shape[0] and start + tx < a.shape[1]:
            tile_a[ty, tx] = a[row, start + tx]
        if b_row < bt.shape[0] and start + tx < bt.shape[1]:
            tile_b[ty, tx] = bt[b_row, start + tx]
        cuda.syncthreads()
        for j in range(TILE):
            acc += tile_a[ty, j] * tile_b[tx, j]
        cuda.syncthreads()
    if row < c.shape[0] and col < c.shape[1]:
        c[row, col] = acc


@cuda.jit
def softmax_backward_thread_zero_adds(s, g, dx):
    # thread 0 adds up the block's partial sums alone, then shares the total through shared memory
    cache = cuda.shared.array(TPB, float32)
    total = cuda.shared.array(1, float32)
    row, t, n = cuda.blockIdx.x, cuda.threadIdx.x, s.shape[1]
    p = float32(0)
    for j in range(t, n, TPB):
        p += g[row, j] * s[row, j]
    cache[t] = p
    cuda.syncthreads()
    if t == 0:
        q = float32(0)
        for j in range(TPB):
            q += cache[j]
        total[0] = q
    cuda.syncthreads()
    for j in range(t, n, TPB):
        dx[row, j] = s[row, j] * g[row, j] - s[row, j] * total[0]


def kernel_relu_blocks_of_64(x, forward_kernel, backward_kernel):
    blocks = -(-x.data.size // 64)
    out = np.zeros_like(x.data)
    forward_kernel[blocks, 64](x.data, out)

    def backward(g):
        dx = np.zeros_like(x.data)
        backward_kernel[blocks, 64](x.data, np.ascontiguousarray(g, dtype=x.data.dtype), dx)
        return (dx,)

    return operation("kernel_relu", out, (x,), backward)


def matmul_backward_by_transposes(a, b, g, matmul):
    return [matmul(b, g.T).T, matmul(g.T, a).T]


# ----- known-wrong answers that call the library function the exercise asks for

@cuda.jit
def block_sum_library(x, partial):
    if cuda.threadIdx.x == 0:
        start = cuda.blockIdx.x * TPB
        values = np.array([x[j] for j in range(start, min(start + TPB, x.size))], np.float32)
        partial[cuda.blockIdx.x] = K.cpu.reduce_sum(values)


@cuda.jit
def softmax_backward_library(s, g, dx):
    if cuda.threadIdx.x == 0:
        r, n = cuda.blockIdx.x, s.shape[1]
        got = K.softmax_backward(np.array([[s[r, j] for j in range(n)]]), np.array([[g[r, j] for j in range(n)]]))
        for j in range(n):
            dx[r, j] = got[0, j]


# ----- answers the tracer once got wrong ---------------------------------------------------------------


def global_index_2d_half(block_idx, block_dim, thread_idx):
    return tuple(b * d + t + 0.5 for b, d, t in zip(block_idx, block_dim, thread_idx))


@cuda.jit
def reverse_swap_pairs(x):
    # right: the textbook in-place reverse, each thread of the first half swaps a pair (the middle
    # element of an odd length stays where it is)
    t = cuda.threadIdx.x
    n = x.size
    if t < n // 2:
        v = x[t]
        x[t] = x[n - 1 - t]
        x[n - 1 - t] = v


@cuda.jit
def block_sum_warp_shuffle(x, partial):
    # right: one warp per block adds its values with shuffles, no shared memory needed
    i = cuda.grid(1)
    v = x[i] if i < x.size else float32(0)
    offset = 16
    while offset > 0:
        v += cuda.shfl_down_sync(0xFFFFFFFF, v, offset)
        offset //= 2
    if cuda.threadIdx.x == 0:
        partial[cuda.blockIdx.x] = v


@cuda.jit
def block_sum_atomic_into_partial(x, partial):
    i = cuda.grid(1)
    if i < x.size:
        cuda.atomic.add(partial, cuda.blockIdx.x, x[i])  # adds to whatever partial held before


@cuda.jit
def block_sum_barrier_inside_if(x, partial):
    cache = cuda.shared.array(TPB, float32)
    t = cuda.threadIdx.x
    i = cuda.grid(1)
    cache[t] = x[i] if i < x.size else 0
    cuda.syncthreads()
    step = cuda.blockDim.x // 2
    while step > 0:
        if t < step:
            cache[t] += cache[t + step]
            cuda.syncthreads()  # only the threads t < step reach it
        step //= 2
    if t == 0:
        partial[cuda.blockIdx.x] = cache[0]


@cuda.jit
def block_sum_early_return(x, partial):
    cache = cuda.shared.array(TPB, float32)
    t = cuda.threadIdx.x
    i = cuda.grid(1)
    cache[t] = x[i] if i < x.size else 0
    cuda.syncthreads()
    step = cuda.blockDim.x // 2
    while step > 0:
        if t >= step:
            return  # nothing left to add: but the others still wait at the barrier below
        cache[t] += cache[t + step]
        cuda.syncthreads()
        step //= 2
    partial[cuda.blockIdx.x] = cache[0]


@cuda.jit
def block_sum_shared_by_block_dim(x, partial):
    cache = cuda.shared.array(cuda.blockDim.x, float32)  # a GPU needs the size when it compiles
    t = cuda.threadIdx.x
    i = cuda.grid(1)
    cache[t] = x[i] if i < x.size else 0
    cuda.syncthreads()
    step = cuda.blockDim.x // 2
    while step > 0:
        if t < step:
            cache[t] += cache[t + step]
        cuda.syncthreads()
        step //= 2
    if t == 0:
        partial[cuda.blockIdx.x] = cache[0]


@cuda.jit
def block_sum_python_list(x, partial):
    t = cuda.threadIdx.x
    i = cuda.grid(1)
    values = [x[i] if i < x.size else 0]  # a Python list: numba cannot compile it for a GPU
    if t == 0:
        partial[cuda.blockIdx.x] = values[0]


@cuda.jit
def rms_norm_barrier_inside_if(x, weight, eps, out):
    cache = cuda.shared.array(TPB, float32)
    row, t, n = cuda.blockIdx.x, cuda.threadIdx.x, x.shape[1]
    s = float32(0)
    for j in range(t, n, cuda.blockDim.x):
        s += x[row, j] * x[row, j]
    cache[t] = s
    cuda.syncthreads()
    step = cuda.blockDim.x // 2
    while step > 0:
        if t < step:
            cache[t] += cache[t + step]
            cuda.syncthreads()
        step //= 2
    r = 1 / math.sqrt(cache[0] / n + eps)
    for j in range(t, n, cuda.blockDim.x):
        out[row, j] = x[row, j] * r * weight[j]


@cuda.jit
def rms_norm_shared_by_block_dim(x, weight, eps, out):
    cache = cuda.shared.array(cuda.blockDim.x, float32)
    row, t, n = cuda.blockIdx.x, cuda.threadIdx.x, x.shape[1]
    s = float32(0)
    for j in range(t, n, cuda.blockDim.x):
        s += x[row, j] * x[row, j]
    cache[t] = s
    cuda.syncthreads()
    step = cuda.blockDim.x // 2
    while step > 0:
        if t < step:
            cache[t] += cache[t + step]
        cuda.syncthreads()
        step //= 2
    r = 1 / math.sqrt(cache[0] / n + eps)
    for j in range(t, n, cuda.blockDim.x):
        out[row, j] = x[row, j] * r * weight[j]


@cuda.jit
def matmul_bt_accumulates_in_c(a, bt, c):
    col, row = cuda.grid(2)
    if row < c.shape[0] and col < c.shape[1]:
        for k in range(a.shape[1]):
            c[row, col] += a[row, k] * bt[col, k]  # c is not zero on a GPU


@cuda.jit
def matmul_bt_tiled_clamped(a, bt, c):
    tile_a = cuda.shared.array((TILE, TILE), float32)
    tile_b = cuda.shared.array((TILE, TILE), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    col, row = cuda.grid(2)
    acc = float32(0)
    for start in range(0, a.shape[1], TILE):
        r, cl = min(row, a.shape[0] - 1), min(col, bt.shape[0] - 1)  # clamped: reads a real element again
        tile_a[ty, tx] = a[r, start + tx] if start + tx < a.shape[1] else 0
        tile_b[ty, tx] = bt[cl, start + ty] if start + ty < bt.shape[1] else 0
        cuda.syncthreads()
        for j in range(TILE):
            acc += tile_a[ty, j] * tile_b[j, tx]
        cuda.syncthreads()
    if row < c.shape[0] and col < c.shape[1]:
        c[row, col] = acc


@cuda.jit
def scan_kernel_thread_idx_only(u, delta, A, B, C, D, y):
    i = cuda.threadIdx.x  # forgets the blocks: the second block redoes the first one's channels
    batch, length, channels = u.shape
    n = A.shape[1]
    if i < batch * channels:
        bi, d = i // channels, i % channels
        h = cuda.local.array(MAX_N, float32)
        for s in range(n):
            h[s] = 0
        for t in range(length):
            dt, x = delta[bi, t, d], u[bi, t, d]
            acc = D[d] * x
            for s in range(n):
                h[s] = math.exp(dt * A[d, s]) * h[s] + dt * B[bi, t, s] * x
                acc += C[bi, t, s] * h[s]
            y[bi, t, d] = acc


@cuda.jit
def scan_kernel_local_array_runtime_size(u, delta, A, B, C, D, y):
    i = cuda.grid(1)
    batch, length, channels = u.shape
    n = A.shape[1]
    if i < batch * channels:
        bi, d = i // channels, i % channels
        h = cuda.local.array(n, float32)  # a GPU needs the size when it compiles
        for s in range(n):
            h[s] = 0
        for t in range(length):
            dt, x = delta[bi, t, d], u[bi, t, d]
            acc = D[d] * x
            for s in range(n):
                h[s] = math.exp(dt * A[d, s]) * h[s] + dt * B[bi, t, s] * x
                acc += C[bi, t, s] * h[s]
            y[bi, t, d] = acc


@cuda.jit
def softmax_backward_barrier_inside_if(s, g, dx):
    cache = cuda.shared.array(TPB, float32)
    row, t, n = cuda.blockIdx.x, cuda.threadIdx.x, s.shape[1]
    dot = float32(0)
    for j in range(t, n, cuda.blockDim.x):
        dot += g[row, j] * s[row, j]
    cache[t] = dot
    cuda.syncthreads()
    step = cuda.blockDim.x // 2
    while step > 0:
        if t < step:
            cache[t] += cache[t + step]
            cuda.syncthreads()
        step //= 2
    dot = cache[0]
    for j in range(t, n, cuda.blockDim.x):
        dx[row, j] = s[row, j] * (g[row, j] - dot)


@cuda.jit
def total_by_warps(x, total):
    i = cuda.grid(1)
    v = x[i] if i < x.size else float32(0)
    delta = 16
    while delta > 0:
        v += cuda.shfl_down_sync(0xFFFFFFFF, v, delta)
        delta //= 2
    if cuda.laneid == 0:
        cuda.atomic.add(total, 0, v)


@cuda.jit
def total_by_one_lane_per_warp(x, total):
    # one atomic per warp, but no shuffle: lane 0 reads its 31 neighbours' elements itself
    i = cuda.grid(1)
    if cuda.laneid == 0:
        s = float32(0)
        for j in range(32):
            if i + j < x.size:
                s += x[i + j]
        cuda.atomic.add(total, 0, s)


@cuda.jit
def total_by_warps_zeroing(x, total):
    # total set to 0 inside the kernel: other warps may have added into it already
    i = cuda.grid(1)
    if i == 0:
        total[0] = 0
    v = x[i] if i < x.size else float32(0)
    delta = 16
    while delta > 0:
        v += cuda.shfl_down_sync(0xFFFFFFFF, v, delta)
        delta //= 2
    if cuda.laneid == 0:
        cuda.atomic.add(total, 0, v)


@cuda.jit
def total_by_warps_half_shuffles(x, total):
    # the shuffles stop at delta 2: lane 0 holds the sum of half its warp
    i = cuda.grid(1)
    v = x[i] if i < x.size else float32(0)
    delta = 16
    while delta > 1:
        v += cuda.shfl_down_sync(0xFFFFFFFF, v, delta)
        delta //= 2
    if cuda.laneid == 0:
        cuda.atomic.add(total, 0, v)


@cuda.jit
def total_by_warps_every_block_lane(x, total):
    # the block's thread 0 adds, not each warp's lane 0: the second warp's sum is lost
    i = cuda.grid(1)
    v = x[i] if i < x.size else float32(0)
    delta = 16
    while delta > 0:
        v += cuda.shfl_down_sync(0xFFFFFFFF, v, delta)
        delta //= 2
    if cuda.threadIdx.x == 0:
        cuda.atomic.add(total, 0, v)


@cuda.jit
def total_by_warps_up(x, total):
    # right too: shfl_up gathers the warp's sum in its last lane
    i = cuda.grid(1)
    v = x[i] if i < x.size else float32(0)
    delta = 1
    while delta < 32:
        up = cuda.shfl_up_sync(0xFFFFFFFF, v, delta)
        if cuda.laneid >= delta:
            v += up
        delta *= 2
    if cuda.laneid == 31:
        cuda.atomic.add(total, 0, v)


@cuda.jit
def total_by_warps_xor(x, total):
    # right too: the butterfly leaves the warp's sum in every lane
    i = cuda.grid(1)
    v = x[i] if i < x.size else float32(0)
    mask = 1
    while mask < 32:
        v += cuda.shfl_xor_sync(0xFFFFFFFF, v, mask)
        mask *= 2
    if cuda.threadIdx.x % 32 == 0:
        cuda.atomic.add(total, 0, v)


@cuda.jit
def total_by_warps_not_atomic(x, total):
    i = cuda.grid(1)
    v = x[i] if i < x.size else float32(0)
    delta = 16
    while delta > 0:
        v += cuda.shfl_down_sync(0xFFFFFFFF, v, delta)
        delta //= 2
    if cuda.laneid == 0:
        total[0] += v


@cuda.jit
def total_by_warps_every_lane_adds(x, total):
    i = cuda.grid(1)
    v = x[i] if i < x.size else float32(0)
    delta = 16
    while delta > 0:
        v += cuda.shfl_down_sync(0xFFFFFFFF, v, delta)
        delta //= 2
    cuda.atomic.add(total, 0, v)  # every lane: partial sums counted several times


@cuda.jit
def total_by_atomics_only(x, total):
    i = cuda.grid(1)
    if i < x.size:
        cuda.atomic.add(total, 0, x[i])  # right sum, but one atomic per element


@cuda.jit
def total_by_warps_guarded_shuffle(x, total):
    i = cuda.grid(1)
    if i < x.size:  # the lanes past the end skip the shuffles their warp's mask names
        v = x[i]
        delta = 16
        while delta > 0:
            v += cuda.shfl_down_sync(0xFFFFFFFF, v, delta)
            delta //= 2
        if cuda.laneid == 0:
            cuda.atomic.add(total, 0, v)


T32, ROWS = 32, 8
PADDED = T32 + 1


@cuda.jit
def transpose_tiles(x, out):
    tile = cuda.shared.array((T32, PADDED), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    for r in range(ty, T32, ROWS):
        row, col = cuda.blockIdx.y * T32 + r, cuda.blockIdx.x * T32 + tx
        if row < x.shape[0] and col < x.shape[1]:
            tile[r, tx] = x[row, col]
    cuda.syncthreads()
    for r in range(ty, T32, ROWS):
        row, col = cuda.blockIdx.x * T32 + r, cuda.blockIdx.y * T32 + tx
        if row < out.shape[0] and col < out.shape[1]:
            out[row, col] = tile[tx, r]


@cuda.jit
def transpose_tiles_literal_width(x, out):
    tile = cuda.shared.array((32, 33), float32)  # the padded width written as a number
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    r = ty
    while r < 32:
        if cuda.blockIdx.y * 32 + r < x.shape[0] and cuda.blockIdx.x * 32 + tx < x.shape[1]:
            tile[r, tx] = x[cuda.blockIdx.y * 32 + r, cuda.blockIdx.x * 32 + tx]
        r += cuda.blockDim.y
    cuda.syncthreads()
    r = ty
    while r < 32:
        if cuda.blockIdx.x * 32 + r < out.shape[0] and cuda.blockIdx.y * 32 + tx < out.shape[1]:
            out[cuda.blockIdx.x * 32 + r, cuda.blockIdx.y * 32 + tx] = tile[tx, r]
        r += cuda.blockDim.y


@cuda.jit
def transpose_tiles_padded_inside(x, out):
    tile = cuda.shared.array((T32, T32 + 1), float32)  # an expression: not a constant to numba
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    for r in range(ty, T32, ROWS):
        row, col = cuda.blockIdx.y * T32 + r, cuda.blockIdx.x * T32 + tx
        if row < x.shape[0] and col < x.shape[1]:
            tile[r, tx] = x[row, col]
    cuda.syncthreads()
    for r in range(ty, T32, ROWS):
        row, col = cuda.blockIdx.x * T32 + r, cuda.blockIdx.y * T32 + tx
        if row < out.shape[0] and col < out.shape[1]:
            out[row, col] = tile[tx, r]


@cuda.jit
def transpose_tiles_unpadded(x, out):
    tile = cuda.shared.array((T32, T32), float32)  # a column of the tile: one bank
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    for r in range(ty, T32, ROWS):
        row, col = cuda.blockIdx.y * T32 + r, cuda.blockIdx.x * T32 + tx
        if row < x.shape[0] and col < x.shape[1]:
            tile[r, tx] = x[row, col]
    cuda.syncthreads()
    for r in range(ty, T32, ROWS):
        row, col = cuda.blockIdx.x * T32 + r, cuda.blockIdx.y * T32 + tx
        if row < out.shape[0] and col < out.shape[1]:
            out[row, col] = tile[tx, r]


@cuda.jit
def transpose_without_tile(x, out):
    col = cuda.blockIdx.x * T32 + cuda.threadIdx.x
    for r in range(cuda.threadIdx.y, T32, ROWS):
        row = cuda.blockIdx.y * T32 + r
        if row < x.shape[0] and col < x.shape[1]:
            out[col, row] = x[row, col]  # writes down a column of out: not coalesced


@cuda.jit
def transpose_tiles_no_barrier(x, out):
    tile = cuda.shared.array((T32, PADDED), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    for r in range(ty, T32, ROWS):
        row, col = cuda.blockIdx.y * T32 + r, cuda.blockIdx.x * T32 + tx
        if row < x.shape[0] and col < x.shape[1]:
            tile[r, tx] = x[row, col]
    for r in range(ty, T32, ROWS):
        row, col = cuda.blockIdx.x * T32 + r, cuda.blockIdx.y * T32 + tx
        if row < out.shape[0] and col < out.shape[1]:
            out[row, col] = tile[tx, r]


BM, BN, BK, TM, TN = 16, 16, 4, 4, 4  # 6.3.6
THREADS = (BM // TM) * (BN // TN)


def _register_kernel(step):
    """The exercise's kernel around an inner step `step(p, tile_a, tile_b, a_reg, b_reg, acc, tx, ty)`."""
    @cuda.jit
    def kernel(a, b, c):
        tile_a = cuda.shared.array((BK, BM), float32)
        tile_b = cuda.shared.array((BK, BN), float32)
        tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
        t = ty * (BN // TN) + tx
        row0, col0 = cuda.blockIdx.y * BM, cuda.blockIdx.x * BN
        m, k, n = a.shape[0], a.shape[1], b.shape[1]
        acc = cuda.local.array((TM, TN), float32)
        a_reg = cuda.local.array(TM, float32)
        b_reg = cuda.local.array(TN, float32)
        for i in range(TM):
            for j in range(TN):
                acc[i, j] = 0
        for start in range(0, k, BK):
            for s in range(BM * BK // THREADS):
                e = t + s * THREADS
                r, q = e // BK, e % BK
                tile_a[q, r] = a[row0 + r, start + q] if row0 + r < m and start + q < k else 0
            for s in range(BK * BN // THREADS):
                e = t + s * THREADS
                r, q = e // BN, e % BN
                tile_b[r, q] = b[start + r, col0 + q] if start + r < k and col0 + q < n else 0
            cuda.syncthreads()
            for p in range(BK):
                step(p, tile_a, tile_b, a_reg, b_reg, acc, tx, ty)
            cuda.syncthreads()
        for i in range(TM):
            for j in range(TN):
                row, col = row0 + ty + i * (BM // TM), col0 + tx + j * (BN // TN)
                if row < m and col < n:
                    c[row, col] = acc[i, j]
    return kernel


@cuda.jit(device=True)
def _outer_product(p, tile_a, tile_b, a_reg, b_reg, acc, tx, ty):
    for i in range(TM):
        a_reg[i] = tile_a[p, ty + i * (BM // TM)]
    for j in range(TN):
        b_reg[j] = tile_b[p, tx + j * (BN // TN)]
    for i in range(TM):
        for j in range(TN):
            acc[i, j] += a_reg[i] * b_reg[j]


@cuda.jit(device=True)
def _from_shared(p, tile_a, tile_b, a_reg, b_reg, acc, tx, ty):
    for i in range(TM):
        for j in range(TN):
            acc[i, j] += tile_a[p, ty + i * (BM // TM)] * tile_b[p, tx + j * (BN // TN)]


@cuda.jit(device=True)
def _contiguous_rows(p, tile_a, tile_b, a_reg, b_reg, acc, tx, ty):
    for i in range(TM):
        a_reg[i] = tile_a[p, ty * TM + i]  # not the rows the final write uses
    for j in range(TN):
        b_reg[j] = tile_b[p, tx + j * (BN // TN)]
    for i in range(TM):
        for j in range(TN):
            acc[i, j] += a_reg[i] * b_reg[j]


@cuda.jit(device=True)
def _overwrites(p, tile_a, tile_b, a_reg, b_reg, acc, tx, ty):
    for i in range(TM):
        a_reg[i] = tile_a[p, ty + i * (BM // TM)]
    for j in range(TN):
        b_reg[j] = tile_b[p, tx + j * (BN // TN)]
    for i in range(TM):
        for j in range(TN):
            acc[i, j] = a_reg[i] * b_reg[j]  # = instead of +=: only the last step of k is left


@cuda.jit(device=True)
def _b_first_column_outer(p, tile_a, tile_b, a_reg, b_reg, acc, tx, ty):
    for j in range(TN):  # the same products, B's registers first and the outer loop over columns
        b_reg[j] = tile_b[p, tx + j * (BN // TN)]
    for i in range(TM):
        a_reg[i] = tile_a[p, ty + i * (BM // TM)]
    for j in range(TN):
        bj = b_reg[j]
        for i in range(TM):
            acc[i, j] += a_reg[i] * bj


matmul_register_step = _register_kernel(_outer_product)
matmul_register_overwrites = _register_kernel(_overwrites)
matmul_register_columns_first = _register_kernel(_b_first_column_outer)
matmul_register_from_shared = _register_kernel(_from_shared)
matmul_register_contiguous_rows = _register_kernel(_contiguous_rows)


# numba refuses these kernels when it compiles them for a GPU; the tracer runs Python, so only the
# checks' GPU compile step (numba.cuda.compile_ptx, where NVVM is installed) catches them. The mark
# skips a case where NVVM is missing (tests/conftest.py).
NEEDS_PTX = pytest.mark.needs_ptx


CASES = [
    ("6.1.1", global_index_2d, global_index_2d_no_block_dim, "expected (x, y) = (37, 5)"),
    ("6.1.1", global_index_2d, global_index_2d_swapped, "x and y are swapped"),
    ("6.1.2", scale, scale_no_guard, "thread 37 read x[37] out of bounds (x has length 37)"),
    ("6.1.2", scale, scale_guard_off_by_one, "thread 37 read x[37] out of bounds"),
    ("6.1.2", scale, scale_block_index_only, "element 0 of out was written by threads 0 and 32"),
    ("6.1.3", grid_for, grid_for_floor, "element (0, 4) of out was never written"),
    ("6.1.3", grid_for, grid_for_one_extra, "the extra blocks have no element"),
    ("6.1.3", grid_for, grid_for_axes_swapped, "was never written"),
    ("6.1.4", add_matrices, add_matrices_guard_rows_only, "out of bounds (a has shape (5, 7))"),
    ("6.1.4", add_matrices, add_matrices_swapped, "was never written"),
    ("6.1.5", scale_strided, scale_no_guard, "element 8 of out was never written"),
    ("6.1.5", scale_strided, scale_strided_by_block, "of out was written by threads"),
    ("6.2.1", reverse_in_place, reverse_in_place_no_barrier, "a missing barrier"),
    ("6.2.1", reverse_in_place, reverse_off_by_one, "read x[8] out of bounds (x has length 8)"),
    ("6.2.2", block_sum, block_sum_no_barrier, "a missing barrier"),
    ("6.2.2", block_sum, block_sum_no_padding, "before any thread of its block wrote it"),
    ("6.2.2", block_sum, block_sum_load_unguarded, "read x[37] out of bounds"),
    ("6.2.2", block_sum, block_sum_library, "write this yourself"),
    ("6.2.3", rms_norm_rows, rms_norm_no_barrier, "a missing barrier"),
    ("6.2.3", rms_norm_rows, rms_norm_one_column_per_thread, "element (0, 32) of out was never written"),
    ("6.2.3", rms_norm_rows, rms_norm_eps_outside, "below eps"),
    ("6.3.6", matmul_register_step, matmul_register_from_shared, "read shared memory 128 times, where reading each number it needs once takes 32"),
    ("6.3.6", matmul_register_step, matmul_register_contiguous_rows, "expected c"),
    ("6.3.6", matmul_register_step, matmul_register_overwrites, "expected c"),
    ("6.3.1", matmul_bt, matmul_bt_not_transposed, "out of bounds"),
    ("6.3.1", matmul_bt, matmul_bt_guard_off_by_one, "out of bounds"),
    ("6.3.1", matmul_bt, matmul_bt_row_from_x, "element (4, 0) of c was never written"),
    ("6.3.2", matmul_bt_tiled, matmul_bt_tiled_load_unguarded, "read a[0, 3] out of bounds (a has shape (5, 3))"),
    ("6.3.2", matmul_bt_tiled, matmul_bt_tiled_no_zero, "before any thread of its block wrote it"),
    ("6.3.2", matmul_bt_tiled, matmul_bt_tiled_no_second_barrier, "a missing barrier"),
    ("6.3.2", matmul_bt_tiled, matmul_bt, "where loading each tile element once takes"),
    ("6.3.3", tiled_reads, tiled_reads_divisible_only, "expected 72 reads, got 52.5 on a of shape (5, 3)"),
    ("6.3.3", tiled_reads, naive_reads, "the number of reads of the naive kernel"),
    ("6.3.4", scan_kernel, scan_kernel_no_guard, "out of bounds"),
    ("6.3.4", scan_kernel, scan_kernel_forgets_D, "expected y"),
    ("6.3.4", scan_kernel, scan_kernel_state_not_zeroed, "starts with garbage on a GPU"),
    ("6.4.1", softmax_backward_rows, softmax_backward_elementwise, "expected dx"),
    ("6.4.1", softmax_backward_rows, softmax_backward_no_barrier, "a missing barrier"),
    ("6.4.1", softmax_backward_rows, softmax_backward_library, "write this yourself"),
    ("6.4.2", kernel_relu, kernel_relu_forgot_return, "did it forget `return`"),
    ("6.4.2", kernel_relu, kernel_relu_one_block, "element 32 of out was never written"),
    ("6.4.2", kernel_relu, kernel_relu_numpy, "never launched forward_kernel"),
    ("6.4.2", kernel_relu, kernel_relu_float64_out, "the result is float64 for a float32 x"),
    ("6.4.2", kernel_relu, kernel_relu_without_x, "does not depend on any tensor with requires_grad"),
    ("6.4.2", kernel_relu, kernel_relu_backward_in_numpy, "never launched backward_kernel"),
    ("6.4.2", kernel_relu, kernel_relu_named_relu, "expected 'kernel_relu'"),
    ("6.4.3", matmul_backward, matmul_backward_no_transpose, "do not fit"),
    ("6.4.3", matmul_backward, matmul_backward_numpy, "make both products with the matmul you are given"),
    ("6.1.1", global_index_2d, global_index_2d_half, "whole numbers"),
    ("6.2.2", block_sum, block_sum_barrier_inside_if, "only some threads reach"),
    ("6.2.2", block_sum, block_sum_early_return, "had already left the kernel"),
    ("6.2.2", block_sum, block_sum_atomic_into_partial, "(an atomic update) before any thread wrote it"),
    pytest.param("6.2.2", block_sum, block_sum_shared_by_block_dim, "cannot compile", marks=NEEDS_PTX),
    pytest.param("6.2.2", block_sum, block_sum_python_list, "cannot compile", marks=NEEDS_PTX),
    ("6.2.3", rms_norm_rows, rms_norm_barrier_inside_if, "only some threads reach"),
    pytest.param("6.2.3", rms_norm_rows, rms_norm_shared_by_block_dim, "cannot compile", marks=NEEDS_PTX),
    ("6.3.1", matmul_bt, matmul_bt_accumulates_in_c, "before writing it"),
    ("6.3.2", matmul_bt_tiled, matmul_bt_tiled_clamped, "store 0 without reading anything"),
    ("6.3.4", scan_kernel, scan_kernel_thread_idx_only, "in different blocks"),
    pytest.param("6.3.4", scan_kernel, scan_kernel_local_array_runtime_size, "cannot compile", marks=NEEDS_PTX),
    ("6.4.1", softmax_backward_rows, softmax_backward_barrier_inside_if, "only some threads reach"),
    ("6.2.4", total_by_warps, total_by_warps_not_atomic, "Use cuda.atomic.add"),
    ("6.2.4", total_by_warps, total_by_warps_every_lane_adds, "expected total[0] = "),
    ("6.2.4", total_by_warps, total_by_atomics_only, "where one per warp (2) is enough"),
    ("6.2.4", total_by_warps, total_by_warps_guarded_shuffle, "lanes 5-31 had exited"),
    ("6.2.4", total_by_warps, total_by_one_lane_per_warp, "rather than one lane reading the others' values"),
    ("6.2.4", total_by_warps, total_by_warps_zeroing, "does your kernel set total[0] itself?"),
    ("6.2.4", total_by_warps, total_by_warps_half_shuffles, "expected total[0] = "),
    ("6.2.4", total_by_warps, total_by_warps_every_block_lane, "expected total[0] = "),
    pytest.param("6.3.5", transpose_tiles, transpose_tiles_padded_inside, "must be a constant", marks=NEEDS_PTX),
    ("6.3.5", transpose_tiles, transpose_tiles_unpadded, "bank conflicts on x of shape (40, 33)"),
    ("6.3.5", transpose_tiles, transpose_without_tile, "transactions of 32 bytes where"),
    ("6.3.5", transpose_tiles, transpose_tiles_no_barrier, "a missing barrier"),
]


def _case(c):
    return c.values if hasattr(c, "values") else c


def test_every_exercise_of_part_6_has_a_known_wrong_answer():
    from course.exercises import registered_ids

    from test_part6_exercises_device import KNOWN_WRONG as DEVICE  # lessons 6.5 and 6.6 have their own files
    from test_part6_exercises_fusion import KNOWN_WRONG as FUSION

    covered = {_case(case)[0] for case in CASES} | set(FUSION) | set(DEVICE)
    missing = [i for i in registered_ids() if i.startswith("6.") and i not in covered]
    assert not missing, f"add a known-wrong answer to CASES for {missing}"


# Each exercise's solution, once: a full check of a right answer traces every case, where a wrong
# answer is usually stopped by the first.
SOLVED = list({(_case(c)[0], _case(c)[1]): None for c in CASES})


@pytest.mark.parametrize("exercise_id,right", SOLVED, ids=[i for i, _ in SOLVED])
def test_the_stub_is_not_attempted_and_the_solution_passes(exercise_id, right, capsys):
    is_kernel = hasattr(right, "py_func")
    assert check(exercise_id, stub_kernel if is_kernel else stub).status == "not attempted"
    result = check(exercise_id, right)
    assert result.status == "passed", result.message
    assert capsys.readouterr().out.strip().splitlines()[-1] == f"[{exercise_id}] passed."


@pytest.mark.parametrize("exercise_id,right,wrong,named", CASES,
                         ids=[f"{_case(c)[0]}-{_case(c)[2].__name__}" for c in CASES])
def test_a_known_wrong_answer_fails_naming_the_mistake(exercise_id, right, wrong, named):
    failed = check(exercise_id, wrong)
    assert failed.status == "failed"
    assert named in failed.message, failed.message
    assert "Hint:" in failed.message


@pytest.mark.parametrize("exercise_id,candidate", [
    ("6.1.1", lambda bi, bd, ti: np.array(global_index_2d(bi, bd, ti))),
    ("6.1.2", scale.py_func),  # a plain function, not decorated: the tracer runs it all the same
    ("6.1.3", lambda shape, block: [math.ceil(shape[1] / block[0]), math.ceil(shape[0] / block[1])]),
    ("6.2.3", rms_norm_one_thread),
    ("6.3.4", scan_kernel_state_by_state),
    ("6.2.2", block_sum_interleaved),
    ("6.3.2", matmul_bt_tiled_bt_layout),
    ("6.4.1", softmax_backward_thread_zero_adds),
    ("6.4.2", kernel_relu_blocks_of_64),
    ("6.4.3", matmul_backward_by_transposes),
    ("6.2.1", reverse_swap_pairs),
    ("6.2.2", block_sum_warp_shuffle),
    ("6.2.4", total_by_warps_xor),
    ("6.2.4", total_by_warps_up),
    ("6.4.2", kernel_relu_by_ceil),
    ("6.3.5", transpose_tiles_literal_width),
    ("6.3.6", matmul_register_columns_first),
], ids=["6.1.1-array", "6.1.2-undecorated", "6.1.3-list", "6.2.3-one-thread", "6.3.4-state-by-state",
        "6.2.2-interleaved", "6.3.2-bt-layout", "6.4.1-thread-zero", "6.4.2-blocks-of-64", "6.4.3-transposes",
        "6.2.1-swap-pairs", "6.2.2-warp-shuffle", "6.2.4-xor", "6.2.4-up", "6.4.2-ceil", "6.3.5-literal-width",
        "6.3.6-columns-first"])
def test_other_right_answers_pass(exercise_id, candidate):
    assert check(exercise_id, candidate).status == "passed"


@pytest.mark.parametrize("exercise_id,kernel", [("6.2.2", K.reduce_sum_kernel),
                                                ("6.4.1", K.rows.softmax_backward_kernel)])
def test_the_library_kernel_is_refused(exercise_id, kernel):
    result = check(exercise_id, kernel)
    assert result.status == "failed" and "course's own" in result.message


@pytest.mark.parametrize("exercise_id,path", [("6.2.2", "course.kernels.reduce_sum"),
                                              ("6.3.1", "course.kernels.cpu.matmul"),
                                              ("6.4.1", "course.kernels.cpu.softmax_backward")])
def test_the_library_host_function_passed_as_the_answer_is_refused(exercise_id, path):
    module, name = path.rsplit(".", 1)
    result = check(exercise_id, getattr(__import__(module, fromlist=["_"]), name))
    assert result.status == "failed" and "write this yourself" in result.message, result.message


def test_a_function_that_forgot_return_is_told_so():
    def forgot(block_idx, block_dim, thread_idx):
        (block_idx[0] * block_dim[0] + thread_idx[0], block_idx[1] * block_dim[1] + thread_idx[1])

    result = check("6.1.1", forgot)
    assert result.status == "failed" and "forget `return`" in result.message


def test_a_crash_in_a_kernel_names_the_thread_and_the_input():
    @cuda.jit
    def broken(x, alpha, out):
        i = cuda.grid(1)
        if i == 3:
            out[i] = undefined_name  # noqa: F821

    result = check("6.1.2", broken)
    assert result.status == "failed"
    assert "thread 3 raised NameError" in result.message and "x of length 37" in result.message


def test_the_reads_formula_counts_what_the_tracer_records():
    # the reference of 6.3.3 agrees with the reads the tracer records for the tiled kernel
    rng = np.random.default_rng(1)
    for m, k, n in [(5, 3, 7), (8, 8, 8), (1, 9, 2), (6, 5, 4)]:
        a = rng.standard_normal((m, k)).astype(np.float32)
        bt = rng.standard_normal((n, k)).astype(np.float32)
        grid = (math.ceil(n / TILE), math.ceil(m / TILE))
        report = K.trace(matmul_bt_tiled, grid, (TILE, TILE), a, bt, np.zeros((m, n), np.float32))
        reads = sum(1 for name in ("a", "bt") for _, acc in report.accesses(name) if acc.kind == "read")
        assert reads == tiled_reads(m, k, n, TILE)


def test_the_scan_reference_matches_course_mamba():
    from course.exercises.part6 import _scan_reference
    from course.mamba import selective_scan
    rng = np.random.default_rng(2)
    b, l, d, n = 2, 6, 3, 4
    u, delta = rng.standard_normal((b, l, d)), 0.1 + rng.random((b, l, d))
    A = -rng.random((d, n)) - 0.5
    B, C, D = rng.standard_normal((b, l, n)), rng.standard_normal((b, l, n)), rng.standard_normal(d)
    np.testing.assert_allclose(_scan_reference(u, delta, A, B, C, D), selective_scan(u, delta, A, B, C, D),
                               rtol=1e-10, atol=1e-12)


def test_a_thread_that_raises_before_a_barrier_is_reported_not_waited_for():
    @cuda.jit
    def raises_then_waits(x):
        t = cuda.threadIdx.x
        if t == 0:
            raise ValueError("boom")
        cuda.syncthreads()
        v = x[x.size - 1 - t]
        cuda.syncthreads()
        x[t] = v

    result = check("6.2.1", raises_then_waits)
    assert result.status == "failed" and "thread 0 raised ValueError: boom" in result.message


def test_a_loop_that_never_ends_is_stopped_and_named():
    @cuda.jit
    def forgets_the_step(x, alpha, out):
        i = cuda.grid(1)
        while i < x.size:
            out[i] = alpha * x[i]  # no i += ...

    result = check("6.1.5", forgets_the_step)
    assert result.status == "failed" and "does a loop never end" in result.message


@pytest.mark.parametrize("exercise_id,right", [("6.1.2", scale), ("6.1.2", scale.py_func),
                                               ("6.1.4", add_matrices)], ids=["6.1.2", "6.1.2-plain", "6.1.4"])
def test_the_launch_on_a_gpu_runs_the_kernel_there(exercise_id, right, monkeypatch):
    # Where there is a GPU the check also launches the kernel on it. Here the simulator stands in
    # for the GPU, so that this path runs everywhere.
    launched = []
    original = K.cuda.synchronize
    monkeypatch.setattr(K, "backend", lambda: "gpu")
    monkeypatch.setattr(K.cuda, "synchronize", lambda: launched.append(1) or original())
    assert check(exercise_id, right).status == "passed"
    assert launched
