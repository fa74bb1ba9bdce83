"""The primitive kernels every operation on a `CudaArray` is made of (`course.kernels.device`).

- `elementwise(name, out, operands)`: map (one input), zip (two) or where (three). Each operand is
  read through its own layout (offset and strides; stride 0 on a broadcast axis), so any transpose,
  slice or broadcast works without copying first, and `out` may be a strided view too (in-place
  updates, assignments into slices). One thread per element of `out`, in a grid-stride loop.
  A number (a Python float, the learning rate...) is passed to the kernel by value: no copy.
- `reduce_rows(op, x, out)`: sum, max or min of each row of a 2-D array: one thread per row for
  short rows, one block per row (a tree in shared memory) for long ones.
- `matmul(a, b, c)`: batched C = A B (part 6.3's kernels).
- `gather(table, index, out)` and `scatter_add(table, index, values)`: rows by index, and the
  gradient of that. Two positions of `index` may name one row, so the scatter adds atomically.

Layouts are padded to 4 axes (adjacent axes that are contiguous in every operand are merged
first), so one compiled kernel serves every shape: a thread turns its element number into four
indices, then each operand's address is `offset + sum(index * stride)`.

The functions inside kernels guard the cases where CUDA gives inf or nan (exp of a large number,
log of 0, x / 0): a GPU does that by itself, but the simulator runs them as Python, which raises.
"""

import math

import numpy as np

from ._backend import backend, cuda
from .launch import THREADS_PER_BLOCK, blocks_for, launch
from .matmul import matmul_into

AXES = 4
# A grid-stride loop lets a bounded grid cover any size. Without a GPU each thread is a Python
# call stack that costs more to start than the arithmetic: there one small block does best.
MAX_BLOCKS = 4096 if backend() == "gpu" else 1
THREADS = THREADS_PER_BLOCK if backend() == "gpu" else 4
INF = math.inf


# ----- the functions that map and zip apply ----------------------------------------------------------------------
@cuda.jit(device=True)
def _exp(x):
    return math.exp(x) if x < 709.0 else INF


@cuda.jit(device=True)
def _log(x):
    if x > 0:
        return math.log(x)
    return -INF if x == 0 else math.nan


@cuda.jit(device=True)
def _sqrt(x):
    return math.sqrt(x) if x >= 0 else math.nan


@cuda.jit(device=True)
def _div(a, b):
    if b != 0:
        return a / b
    if a == 0 or a != a:
        return math.nan
    return INF if (a > 0) == (math.copysign(1.0, b) > 0) else -INF


@cuda.jit(device=True)
def _pow(a, b):
    if a < 0 and b != math.floor(b):
        return math.nan
    if a == 0 and b < 0:
        return INF
    if abs(a) > 1 and b * math.log(abs(a)) > 709.0:
        return INF if a > 0 or b % 2 == 0 else -INF
    return a ** b


@cuda.jit(device=True)
def _logaddexp(a, b):
    if a == b:  # also both -inf or both inf
        return a + math.log(2.0)
    m = a if a > b else b
    return m + math.log1p(math.exp(-abs(a - b)))


@cuda.jit(device=True)
def _maximum(a, b):
    return a if a >= b or a != a else b


@cuda.jit(device=True)
def _minimum(a, b):
    return a if a <= b or a != a else b


@cuda.jit(device=True)
def _sign(x):
    if x > 0:
        return 1
    return -1 if x < 0 else 0


# name -> (number of inputs, the function). Names are NumPy's ufunc names.
FUNCTIONS = {
    "copy": (1, lambda x: x),
    "negative": (1, lambda x: -x),
    "positive": (1, lambda x: x),
    "absolute": (1, lambda x: abs(x)),
    "exp": (1, _exp),
    "log": (1, _log),
    "log1p": (1, lambda x: math.log1p(x) if x > -1 else (-INF if x == -1 else math.nan)),
    "expm1": (1, lambda x: math.expm1(x) if x < 709.0 else INF),
    "sqrt": (1, _sqrt),
    "tanh": (1, lambda x: math.tanh(x)),
    "square": (1, lambda x: x * x),
    "reciprocal": (1, lambda x: _div(1.0, x)),
    "sign": (1, _sign),
    "logical_not": (1, lambda x: not x),
    "isfinite": (1, lambda x: x == x and abs(x) != INF),
    "add": (2, lambda a, b: a + b),
    "subtract": (2, lambda a, b: a - b),
    "multiply": (2, lambda a, b: a * b),
    "true_divide": (2, _div),
    "divide": (2, _div),
    "power": (2, _pow),
    "maximum": (2, _maximum),
    "minimum": (2, _minimum),
    "logaddexp": (2, _logaddexp),
    "greater": (2, lambda a, b: a > b),
    "greater_equal": (2, lambda a, b: a >= b),
    "less": (2, lambda a, b: a < b),
    "less_equal": (2, lambda a, b: a <= b),
    "equal": (2, lambda a, b: a == b),
    "not_equal": (2, lambda a, b: a != b),
    "logical_and": (2, lambda a, b: a and b),
    "logical_or": (2, lambda a, b: a or b),
    "where": (3, lambda c, a, b: a if c else b),
}
UFUNCS = {name for name in FUNCTIONS if name not in ("copy", "where")}


# ----- the kernels, one per function, made by a factory -----------------------------------------------------------------
_DEVICE_FUNCTIONS = {_exp, _log, _sqrt, _div, _pow, _logaddexp, _maximum, _minimum, _sign}


@cuda.jit(device=True)
def _index(i, shape):
    """Element number i of a (padded) 4-axis shape as four indices, the last axis fastest."""
    i3 = i % shape[3]
    r = i // shape[3]
    i2 = r % shape[2]
    r = r // shape[2]
    return r // shape[1], r % shape[1], i2, i3


@cuda.jit(device=True)
def _at(offset, strides, i0, i1, i2, i3):
    """Where element (i0, i1, i2, i3) of a layout lies in its buffer."""
    return offset + i0 * strides[0] + i1 * strides[1] + i2 * strides[2] + i3 * strides[3]


def _make(name, arity, fn):
    f = fn if fn in _DEVICE_FUNCTIONS else cuda.jit(device=True)(fn)

    # Each operand: buffer, offset, strides, whether it is a number, and the number.
    if arity == 1:
        def kernel(out, oo, os, shape, a, ao, ast, asc, av):
            i = cuda.grid(1)
            while i < shape[0] * shape[1] * shape[2] * shape[3]:
                i0, i1, i2, i3 = _index(i, shape)
                x = av if asc else a[_at(ao, ast, i0, i1, i2, i3)]
                out[_at(oo, os, i0, i1, i2, i3)] = f(x)
                i += cuda.gridsize(1)
    elif arity == 2:
        def kernel(out, oo, os, shape, a, ao, ast, asc, av, b, bo, bst, bsc, bv):
            i = cuda.grid(1)
            while i < shape[0] * shape[1] * shape[2] * shape[3]:
                i0, i1, i2, i3 = _index(i, shape)
                x = av if asc else a[_at(ao, ast, i0, i1, i2, i3)]
                y = bv if bsc else b[_at(bo, bst, i0, i1, i2, i3)]
                out[_at(oo, os, i0, i1, i2, i3)] = f(x, y)
                i += cuda.gridsize(1)
    else:
        def kernel(out, oo, os, shape, c, co, cst, csc, cv, a, ao, ast, asc, av, b, bo, bst, bsc, bv):
            i = cuda.grid(1)
            while i < shape[0] * shape[1] * shape[2] * shape[3]:
                i0, i1, i2, i3 = _index(i, shape)
                z = cv if csc else c[_at(co, cst, i0, i1, i2, i3)]
                x = av if asc else a[_at(ao, ast, i0, i1, i2, i3)]
                y = bv if bsc else b[_at(bo, bst, i0, i1, i2, i3)]
                out[_at(oo, os, i0, i1, i2, i3)] = f(z, x, y)
                i += cuda.gridsize(1)

    kernel.__name__ = kernel.__qualname__ = {1: "map", 2: "zip", 3: "where"}[arity] + "_" + name
    return cuda.jit(kernel)


_kernels = {}


def kernel(name):
    if name not in _kernels:
        arity, fn = FUNCTIONS[name]
        _kernels[name] = _make(name, arity, fn)
    return _kernels[name]


_dummies = {}


def _dummy(dtype):
    """A one-element device array standing in for an operand that is a number (never read)."""
    if dtype not in _dummies:
        _dummies[dtype] = cuda.device_array(1, dtype=dtype)
    return _dummies[dtype]


def _merge(shape, layouts):
    """Merge adjacent axes that are contiguous in every layout; drop axes of size 1."""
    keep = [i for i, n in enumerate(shape) if n != 1]
    shape = [shape[i] for i in keep]
    layouts = [[s[i] for i in keep] for s in layouts]
    i = len(shape) - 2
    while i >= 0:
        if all(s[i] == s[i + 1] * shape[i + 1] for s in layouts):
            shape[i:i + 2] = [shape[i] * shape[i + 1]]
            for s in layouts:
                s[i:i + 2] = [s[i + 1]]
        i -= 1
    return shape, layouts


def elementwise(name, out, operands):
    """out[...] = f(operands...) element by element, broadcasting the operands to out's shape."""
    arity = FUNCTIONS[name][0]
    if len(operands) != arity:
        raise TypeError(f"{name} takes {arity} operands, got {len(operands)}")
    if out.size == 0:
        return out
    arrays = [x for x in operands if hasattr(x, "buffer")]
    layouts = [list(out.strides)] + [list(x.broadcast_to(out.shape).strides) for x in arrays]
    shape, layouts = _merge(list(out.shape), layouts)
    if len(shape) > AXES:
        raise ValueError(f"{name}: arrays of shape {out.shape} need more than {AXES} axes after merging; "
                         f"make one of them contiguous first")
    pad = AXES - len(shape)
    shape = (1,) * pad + tuple(shape)
    layouts = [(0,) * pad + tuple(s) for s in layouts]
    args = [out.buffer, out.offset, layouts[0], shape]
    strides = iter(layouts[1:])
    for x in operands:
        if hasattr(x, "buffer"):
            args += [x.buffer, x.offset, next(strides), False, x.dtype.type(0)]
        else:
            args += [_dummy(np.dtype(type(x))), 0, (0,) * AXES, True, x]
    n = out.size
    launch(kernel(name), min(blocks_for(n, THREADS), MAX_BLOCKS), THREADS, *args)
    return out


# ----- reductions over rows --------------------------------------------------------------------------------------------
SUM, MAX, MIN = 0, 1, 2
_OPS = {"sum": SUM, "max": MAX, "min": MIN}


@cuda.jit(device=True)
def _combine(op, a, b):
    if op == SUM:
        return a + b
    if op == MAX:
        return a if a >= b or a != a else b
    return a if a <= b or a != a else b


@cuda.jit
def reduce_rows_kernel(x, out, op):
    """One thread per row: fine for many short rows."""
    row = cuda.grid(1)
    if row < x.shape[0]:
        acc = x[row, 0]
        for j in range(1, x.shape[1]):
            acc = _combine(op, acc, x[row, j])
        out[row] = acc


def _block_kernel(dtype):
    numba_type = {np.dtype(np.float32): "float32", np.dtype(np.float64): "float64",
                  np.dtype(np.int64): "int64", np.dtype(np.bool_): "boolean"}[dtype]
    import numba

    kind = getattr(numba, numba_type)

    @cuda.jit
    def reduce_long_rows_kernel(x, out, op):
        """One block per row: each thread combines a strided share, then a tree in shared memory."""
        cache = cuda.shared.array(THREADS_PER_BLOCK, kind)
        row, t = cuda.blockIdx.x, cuda.threadIdx.x
        acc = x[row, 0]
        j = t
        first = True
        while j < x.shape[1]:
            acc = x[row, j] if first else _combine(op, acc, x[row, j])
            first = False
            j += cuda.blockDim.x
        cache[t] = acc  # threads past the row's end hold x[row, 0]: harmless for max and min
        if first and op == SUM:
            cache[t] = 0
        cuda.syncthreads()
        step = cuda.blockDim.x // 2
        while step > 0:
            if t < step:
                cache[t] = _combine(op, cache[t], cache[t + step])
            cuda.syncthreads()
            step //= 2
        if t == 0:
            out[row] = cache[0]

    return reduce_long_rows_kernel


_block_kernels = {}
LONG_ROW = 4 * THREADS_PER_BLOCK


def reduce_rows(op, x, out):
    """out[i] = op over row i of the 2-D array x (rows not empty); out has x.shape[0] numbers."""
    rows, length = x.shape
    if x.dtype != out.dtype:
        x = x.astype(out.dtype)
    code = _OPS[op]
    raw, target = x.raw(), out.raw()
    if length >= LONG_ROW and x.dtype in (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int64)):
        if x.dtype not in _block_kernels:
            _block_kernels[x.dtype] = _block_kernel(x.dtype)
        launch(_block_kernels[x.dtype], rows, THREADS_PER_BLOCK, raw, target, code)
    else:
        launch(reduce_rows_kernel, blocks_for(rows, THREADS), THREADS, raw, target, code)
    return out


# ----- rows by index -----------------------------------------------------------------------------------------------------
@cuda.jit
def gather_kernel(table, index, out):
    """out[i, j] = table[index[i], j]: one thread per element, neighbours along a row (coalesced)."""
    j, i = cuda.grid(2)
    if i < out.shape[0] and j < out.shape[1]:
        r = index[i]
        if r < 0:
            r += table.shape[0]
        out[i, j] = table[r, j]


@cuda.jit
def scatter_add_kernel(table, index, values):
    """table[index[i], j] += values[i, j]. Two positions i may name one row: atomic adds, or one
    thread's update could overwrite the other's."""
    j, i = cuda.grid(2)
    if i < values.shape[0] and j < values.shape[1]:
        r = index[i]
        if r < 0:
            r += table.shape[0]
        cuda.atomic.add(table, (r, j), values[i, j])


def _grid2(rows, cols):
    side = 16 if backend() == "gpu" else 2
    return (blocks_for(cols, side), blocks_for(rows, side)), (side, side)


def gather(table, index, out):
    grid, block = _grid2(*out.shape)
    launch(gather_kernel, grid, block, table.raw(), index.raw(), out.raw())


def scatter_add(table, index, values):
    grid, block = _grid2(*values.shape)
    launch(scatter_add_kernel, grid, block, table.raw(), index.raw(), values.raw())


# ----- batched matrix products ------------------------------------------------------------------------------------------------
@cuda.jit
def batched_matmul_kernel(a, b, c):
    """c[z] = a[z] @ b[z], one output element per step of a grid-stride loop (any dtype; the fast
    float32 kernels on a GPU are lesson 6.3's)."""
    i = cuda.grid(1)
    count, m, n = c.shape
    while i < count * m * n:
        col = i % n
        row = (i // n) % m
        z = i // (m * n)
        if a.shape[2] == 0:
            c[z, row, col] = 0
        else:
            acc = a[z, row, 0] * b[z, 0, col]
            for k in range(1, a.shape[2]):
                acc += a[z, row, k] * b[z, k, col]
            c[z, row, col] = acc
        i += cuda.gridsize(1)


def matmul(a, b, c):
    """c = a @ b for contiguous 3-D device arrays (batch, m, k) @ (batch, k, n)."""
    if not c.size:
        return c
    if backend() == "gpu" and a.dtype == b.dtype == c.dtype == np.dtype(np.float32):
        matmul_into(a.raw(), b.raw(), c.raw())  # lesson 6.3's fastest kernel
        return c
    # The simulator runs the simple kernel: its tiles would start many threads per launch.
    launch(batched_matmul_kernel, min(blocks_for(c.size, THREADS), MAX_BLOCKS), THREADS, a.raw(), b.raw(), c.raw())
    return c
