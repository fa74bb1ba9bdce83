"""Checks of lesson 6.6, tensors on the GPU: a broadcasting elementwise kernel that reads its
operands through an offset and strides (6.6.1), the embedding's backward as a scatter-add with
atomics (6.6.2), a sum along one axis read through strides (6.6.3), and a gradient norm that
copies one number to the host (6.6.4).

The kernels run on the tracer, through part 6's `_trace` (which also compiles them for a GPU where
NVVM is there); the references are NumPy, written here. 6.6.4 runs on the "cuda" device (a GPU or
the simulator) and reads the transfer counter.
"""

import sys

import numpy as np

from ._core import CheckFailed, _show, exercise, expect, expect_close
from . import part6 as _p6

AXES = 4  # the kernels of 6.6.1 take shapes and strides padded to four axes
TPB = 32  # threads per block in the launches of 6.6.2


def _refuse_library(candidate):
    """The course's own kernels (those of the device tensor included) are no answer."""
    _p6._refuse_library(candidate)
    code = _p6._kernel_code(candidate)
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith("course.kernels."):
            continue
        for attr, value in list(vars(module).items()):
            fn = getattr(value, "py_func", None)
            if fn is not None and fn.__code__ is code:
                raise CheckFailed(f"that is the course's own {name}.{attr}: write the kernel yourself")


# ===== 6.6.1 an elementwise kernel that broadcasts =======================================================


def _layout(view, buffer):
    """(offset, strides) of a NumPy view of `buffer`, in elements, padded to AXES axes."""
    item = buffer.itemsize
    offset = (view.__array_interface__["data"][0] - buffer.__array_interface__["data"][0]) // item
    strides = (0,) * (AXES - view.ndim) + tuple(s // item for s in view.strides)
    return int(offset), tuple(int(s) for s in strides)


def _operand(shape, out_shape, rng, transposed=False, offset=0):
    """A flat float32 buffer and a view of it of `shape`, broadcast to `out_shape`.

    `transposed`: the view is the transpose of a contiguous array (its last two axes swapped);
    `offset`: the view starts that many elements into the buffer."""
    size = int(np.prod(shape))
    buffer = rng.integers(-9, 10, size=size + offset + 3).astype(np.float32)  # whole numbers: sums exact
    if transposed:
        inner = shape[:-2] + (shape[-1], shape[-2])
        view = buffer[offset:offset + size].reshape(inner).swapaxes(-1, -2)
    else:
        view = buffer[offset:offset + size].reshape(shape)
    view = np.broadcast_to(view, out_shape)  # stride 0 on the axes it is repeated along
    return buffer, view


def _padded(shape):
    return (1,) * (AXES - len(shape)) + tuple(int(n) for n in shape)


def _describe_operand(name, shape, transposed, offset):
    words = [f"{name} of shape {shape}"]
    if transposed:
        words.append("a transposed view")
    if offset:
        words.append(f"starting {offset} elements into its buffer")
    return ", ".join(words)


def _zip_cases(rng):
    # (a's shape, b's shape, a transposed?, a's offset, blocks, threads): broadcasting both ways, a
    # bias-like row, a transposed operand, an offset, a grid with fewer threads than elements
    cases = [((3, 1), (1, 4), False, 0, 1, 16),
             ((2, 3, 4), (4,), False, 0, 1, 32),
             ((3, 4), (3, 4), True, 0, 1, 16),
             ((2, 3), (3,), False, 5, 1, 8),
             ((2, 3, 4), (3, 1), False, 0, 2, 8),
             ((2, 1, 3, 2), (1, 4, 1, 2), True, 2, 2, 16)]
    n = tuple(int(v) for v in rng.integers(1, 5, size=3))
    cases.append((n, (n[1], 1), bool(rng.integers(2)), int(rng.integers(0, 4)), 1, 8))
    return cases


def _zip_reference(a_buf, a_off, a_str, b_buf, b_off, b_str, shape):
    out = np.zeros(shape, np.float32)
    for index in np.ndindex(*shape):
        pa = a_off + sum(i * s for i, s in zip(index, a_str))
        pb = b_off + sum(i * s for i, s in zip(index, b_str))
        out[index] = a_buf[pa] + b_buf[pb]
    return out.ravel()


@exercise("6.6.1", kernel=True, hint="out is contiguous: element i of out has one index per axis, and the last axis "
                        "varies fastest; each operand's element for that index lies at its offset plus "
                        "the sum of index * stride over the axes (a stride of 0 repeats the operand along "
                        "that axis). The grid may have fewer threads than out has elements")
def _(candidate, rng):
    _refuse_library(candidate)
    for a_shape, b_shape, transposed, offset, blocks, threads in _zip_cases(rng):
        out_shape = np.broadcast_shapes(a_shape, b_shape)
        a_buf, a_view = _operand(a_shape, out_shape, rng, transposed, offset)
        b_buf, b_view = _operand(b_shape, out_shape, rng)
        a_off, a_str = _layout(a_view, a_buf)
        b_off, b_str = _layout(b_view, b_buf)
        shape = _padded(out_shape)
        size = int(np.prod(out_shape))
        out = np.full(size, np.nan, np.float32)
        on = (f"{_describe_operand('a', a_shape, transposed, offset)} + b of shape {b_shape} -> out of shape "
              f"{out_shape} (shape={shape}, a_offset={a_off}, a_strides={a_str}, b_offset={b_off}, "
              f"b_strides={b_str}), {blocks} block(s) of {threads} threads")
        _run_strided(candidate, blocks, threads, (out, shape, a_buf, a_off, a_str, b_buf, b_off, b_str), on)
        expected = (a_view + b_view).ravel()
        if not np.array_equal(out, expected):
            _zip_diagnose(out, expected, a_buf, a_off, a_str, b_buf, b_off, b_str, shape, on)
            expect_close(out, expected, on=on, rtol=0, atol=0, what="out")


def _run_strided(candidate, blocks, threads, args, on):
    """Trace a kernel whose first argument is its contiguous output (filled with nan first, the
    garbage of a GPU), and fail on the first of: a write past the end of the output (a missing
    guard), a read past the end of an operand (an element looked up in the wrong place), a barrier
    or warp misuse, a race, an output read before it was written, an output number never written."""
    out = args[0]
    out[...] = np.nan
    report = _p6._trace(candidate, blocks, threads, *args, on=on)
    name = _p6._params(candidate)[0]
    if report.out_of_bounds:
        writes = [o for o in report.out_of_bounds if o.array == name or o.kind != "read"]
        o = writes[0] if writes else report.out_of_bounds[0]
        who = _p6._thread(report, o.block, o.thread)
        if writes:
            raise CheckFailed(f"{who} wrote {o.array}[{o.index[0]}], past the end of {o.array} (length "
                              f"{o.shape[0]}) on {on}: the grid is rounded up to whole blocks, so some threads have "
                              f"no number to write: add a guard")
        raise CheckFailed(f"{who} read {o.array}[{', '.join(map(str, o.index))}], past the end of {o.array} "
                          f"(length {o.shape[0]}) on {on}: number i of {name} is not number i of {o.array}; "
                          f"find where it lies from the offset and the strides")
    _p6._barriers(report, on)
    _p6._warps(report, on)
    _p6._races(report, on)
    _p6._outputs_read_first(report, [name], on)
    missing = np.argwhere(report.unwritten(name)).ravel()
    if len(missing):
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        few = ""
        if blocks * threads < out.size:
            few = (f": the grid has {blocks * threads} threads for {out.size} numbers, so each thread must do "
                   f"more than one")
        raise CheckFailed(f"number {missing[0]} of {name} was never written{more} on {on}{few}")
    return report


def _zip_diagnose(out, expected, a_buf, a_off, a_str, b_buf, b_off, b_str, shape, on):
    """Name the classic mistakes: strides ignored, offset ignored, axes taken in the wrong order."""
    n = out.size
    idx = np.arange(n)
    if a_off + n <= a_buf.size and b_off + n <= b_buf.size:
        plain = a_buf[a_off + idx] + b_buf[b_off + idx]
        if np.array_equal(out, plain):
            raise CheckFailed(f"expected out {_show(expected)}, got {_show(out)} on {on}: you read the "
                              f"operands as if their elements lay one after the other in out's order; a "
                              f"transposed or broadcast operand does not: use its strides")
    if a_off or b_off:
        no_offset = _zip_reference(a_buf, 0, a_str, b_buf, 0, b_str, shape)
        if np.array_equal(out, no_offset):
            raise CheckFailed(f"expected out {_show(expected)}, got {_show(out)} on {on}: the operand "
                              f"does not start at the beginning of its buffer: add its offset")
    flipped = _zip_reference(a_buf, a_off, a_str[::-1], b_buf, b_off, b_str[::-1], shape[::-1])
    if np.array_equal(out, flipped):
        raise CheckFailed(f"expected out {_show(expected)}, got {_show(out)} on {on}: the axes are taken "
                          f"in the wrong order; in a contiguous out the last axis varies fastest")


# ===== 6.6.2 the embedding's backward: a scatter-add ======================================================


def _embedding_cases(rng):
    # (idx, vocabulary, width): no token twice, a token three times, repeats across blocks, random
    cases = [(np.array([4, 0, 2, 7, 1]), 8, 3),
             (np.array([1, 3, 1, 0, 3, 3]), 4, 5),
             (np.array([2, 0, 2, 5, 0, 2, 1, 5, 2, 4, 3, 0]), 6, 7)]
    cases.append((rng.integers(0, 5, size=int(rng.integers(8, 16))), 5, int(rng.integers(2, 6))))
    return cases


def _positions(idx, token):
    return [int(p) for p in np.flatnonzero(idx == token)]


@exercise("6.6.2", kernel=True, hint="several positions of idx can hold the same token: then several threads add into "
                        "the same element of grad_table. A read, an addition and a write by one thread can "
                        "interleave with another thread's, and an update is lost: the addition must be one "
                        "indivisible step (see 6.2.4)")
def _(candidate, rng):
    _refuse_library(candidate)
    for idx, vocab, width in _embedding_cases(rng):
        idx = idx.astype(np.int64)
        n = len(idx)
        grad_out = rng.integers(-9, 10, size=(n, width)).astype(np.float32)  # whole numbers: sums exact
        grad_table = np.zeros((vocab, width), np.float32)
        blocks = -(-(n * width) // TPB)
        repeats = len(set(idx.tolist())) < n
        on = (f"idx={idx.tolist()}, grad_out of shape {(n, width)}, grad_table of shape {(vocab, width)} "
              f"(zeros), {blocks} block(s) of {TPB} threads")
        report = _p6._trace(candidate, blocks, TPB, grad_table, idx, grad_out, on=on)
        table = _p6._params(candidate)[0]  # the learner's name for grad_table
        _embedding_bounds(report, table, vocab, on)
        expected = np.zeros((vocab, width), np.float32)
        np.add.at(expected, idx, grad_out)
        if not np.array_equal(grad_table, expected):
            _embedding_diagnose(grad_table, expected, idx, grad_out, on)
            expect_close(grad_table, expected, on=on, rtol=0, atol=0, what="grad_table")
        for r in report.races:
            if r.array == table and repeats:
                token = r.index[0]
                where = _positions(idx, token)
                raise CheckFailed(f"{_p6._thread(report, *r.first[:2])} and {_p6._thread(report, *r.second[:2])} "
                                  f"both added into {table}[{token}, {r.index[1]}] with a plain read and "
                                  f"write, on {on}: token {token} is at positions "
                                  f"{', '.join(map(str, where))} of idx. On a GPU those threads run at once, "
                                  f"and the row of a repeated token loses updates (the tracer runs them one "
                                  f"after the other, so the sum happened to come out right here); use an atomic "
                                  f"addition")
        _p6._races(report, on)


def _embedding_bounds(report, table, vocab, on):
    """Past the end of idx or grad_out: a missing guard. Past the end of the table (`table`, the
    learner's name for grad_table): a row of grad_out added into the wrong row."""
    if not report.out_of_bounds:
        return
    inputs = [o for o in report.out_of_bounds if o.array != table]
    if inputs:
        o = inputs[0]
        size = f"length {o.shape[0]}" if len(o.shape) == 1 else f"shape {o.shape}"
        raise CheckFailed(f"{_p6._thread(report, o.block, o.thread)} read {o.array}[{', '.join(map(str, o.index))}] "
                          f"out of bounds ({o.array} has {size}) on {on}: add a guard")
    o = report.out_of_bounds[0]
    raise CheckFailed(f"{_p6._thread(report, o.block, o.thread)} added into {table}[{', '.join(map(str, o.index))}], "
                      f"but {table} has {vocab} rows (one per token of the vocabulary), on {on}: row k of "
                      f"grad_out belongs to the row of its token, idx[k]")


def _embedding_diagnose(got, expected, idx, grad_out, on):
    """A repeated token's row holds one of its rows of grad_out: written, not added."""
    repeated = [t for t in sorted(set(idx.tolist())) if len(_positions(idx, t)) > 1]
    for t in repeated:
        if not np.array_equal(got[t], expected[t]) and any(np.array_equal(got[t], grad_out[p])
                                                           for p in _positions(idx, t)):
            raise CheckFailed(f"row {t} of grad_table should be the sum of rows "
                              f"{', '.join(map(str, _positions(idx, t)))} of grad_out (token {t} is at those "
                              f"positions of idx), but it holds only one of them, on {on}: add into grad_table "
                              f"rather than writing it")
    in_order = np.zeros_like(expected)
    rows = min(len(idx), len(expected))
    in_order[:rows] = grad_out[:rows]
    if np.array_equal(got, in_order):
        raise CheckFailed(f"grad_table holds the rows of grad_out in their order, on {on}: row k of grad_out "
                          f"belongs to the row of its token, idx[k]")


# ===== 6.6.3 a sum along one axis, read through strides ====================================================


def _sum_cases(rng):
    # (a's shape, transposed?, offset, the axis summed in a's own axes, blocks, threads): down the
    # columns of a square (where the wrong axis gives a result of the right size), along the rows, the middle axis, a transposed view, an offset, a grid smaller than out
    cases = [((4, 4), False, 0, 0, 1, 8),
             ((3, 4), False, 0, 0, 1, 8),
             ((3, 4), False, 0, 1, 1, 8),
             ((2, 3, 4), False, 0, 1, 1, 16),
             ((4, 3), True, 0, 0, 1, 8),
             ((2, 5), False, 3, 1, 1, 4),
             ((2, 3, 5), True, 1, 2, 2, 4),
             ((3, 2, 2, 3), False, 0, 3, 1, 8)]
    shape = tuple(int(v) for v in rng.integers(1, 5, size=3))
    cases.append((shape, bool(rng.integers(2)), int(rng.integers(0, 3)), int(rng.integers(0, 3)), 1, 8))
    return cases


def _sum_reference(a_buf, a_off, a_str, shape, axis):
    """The sum along `axis` (keeping it, as 1) of the view (offset, strides) of a_buf, laid out flat."""
    kept = list(shape)
    kept[axis] = 1
    out = np.zeros(kept, np.float64)
    for index in np.ndindex(*shape):
        out[tuple(i if d != axis else 0 for d, i in enumerate(index))] += a_buf[
            a_off + sum(i * s for i, s in zip(index, a_str))]
    return out.ravel()


@exercise("6.6.3", kernel=True, hint="one thread per number of out, each adding up its own line of a in a local "
                        "variable: out has a's shape with the summed axis of length 1, so its index i "
                        "gives one index per other axis (the last axis fastest); the numbers to add lie "
                        "at a_offset + the sum of index * stride, plus k * a_strides[axis] for k along "
                        "the axis")
def _(candidate, rng):
    _refuse_library(candidate)
    for a_shape, transposed, offset, own_axis, blocks, threads in _sum_cases(rng):
        a_buf, a_view = _operand(a_shape, a_shape, rng, transposed, offset)
        a_off, a_str = _layout(a_view, a_buf)
        shape = _padded(a_shape)
        axis = AXES - len(a_shape) + own_axis
        size = int(np.prod(a_shape)) // a_shape[own_axis]
        out = np.zeros(size, np.float32)
        on = (f"{_describe_operand('a', a_shape, transposed, offset)} summed along its axis {own_axis} "
              f"(shape={shape}, a_offset={a_off}, a_strides={a_str}, axis={axis}), out of {size} numbers, "
              f"{blocks} block(s) of {threads} threads")
        _run_strided(candidate, blocks, threads, (out, shape, a_buf, a_off, a_str, axis), on)
        expected = a_view.astype(np.float64).sum(axis=own_axis).ravel()
        if not np.allclose(out, expected, rtol=0, atol=0):
            _sum_diagnose(out, expected, a_buf, a_off, a_str, shape, axis, on)
            expect_close(out, expected, on=on, rtol=0, atol=0, what="out")


def _sum_diagnose(out, expected, a_buf, a_off, a_str, shape, axis, on):
    for other in range(AXES):
        if other != axis and shape[other] > 1 and shape[other] == shape[axis]:
            if np.array_equal(out, _sum_reference(a_buf, a_off, a_str, shape, other)):
                raise CheckFailed(f"expected out {_show(expected)}, got {_show(out)} on {on}: that is the sum "
                                  f"along axis {other}, not along axis {axis}")
    if a_off and np.array_equal(out, _sum_reference(a_buf, 0, a_str, shape, axis)):
        raise CheckFailed(f"expected out {_show(expected)}, got {_show(out)} on {on}: a does not start "
                          f"at the beginning of its buffer: add its offset")
    contiguous = tuple(int(np.prod(shape[d + 1:])) for d in range(AXES))
    if a_str != contiguous and a_off + int(np.prod(shape)) <= a_buf.size and np.array_equal(
            out, _sum_reference(a_buf, a_off, contiguous, shape, axis)):
        raise CheckFailed(f"expected out {_show(expected)}, got {_show(out)} on {on}: you read a as if "
                          f"its numbers lay one after the other in its shape's order; a transposed view does not: "
                          f"use its strides")


# ===== 6.6.4 a gradient norm that copies one number ==========================================================


def _norm_params(rng, device):
    """Parameters with gradients on `device` (one of them without a gradient, as a frozen one has)."""
    from ..tensor import Tensor
    from ..tensor import device as _device
    params = []
    for shape in [(4, 3), (3,), (2, 2, 2), (5,)]:
        p = Tensor(rng.standard_normal(shape).astype(np.float32), requires_grad=True)
        p.grad = rng.standard_normal(shape).astype(np.float32)
        params.append(p)
    params.insert(2, Tensor(np.ones(2, np.float32), requires_grad=True))  # no gradient: counts for nothing
    expected = float(np.sqrt(sum((p.grad.astype(np.float64) ** 2).sum() for p in params if p.grad is not None)))
    for p in params:
        p.data = _device.move(p.data, device)
        if p.grad is not None:
            p.grad = _device.move(p.grad, device)
    return params, expected


def _number(got, on):
    import numbers
    if isinstance(got, numbers.Real) and not isinstance(got, bool):
        return float(got)
    if isinstance(got, np.ndarray) and got.size == 1:
        return float(got.reshape(-1)[0])
    kind = type(got).__name__
    if kind in ("CudaArray", "Tensor"):
        raise CheckFailed(f"your function returned a {kind} on {on}: return a Python number (the one number "
                          f"copied to the host)")
    raise CheckFailed(f"expected a number, got {type(got).__name__} on {on}")


@exercise("6.6.4", inside=True, hint="the squares of every gradient, summed, then the square root: keep all of that on the "
                        "device (a gradient there answers *, .sum() and np.sqrt like a NumPy array), and copy "
                        "only the final number to the host, with .item(). A parameter whose gradient is None "
                        "counts for nothing",
          forbid=["course.optim.clip_grad_norm_"], task="add up the squares of the gradients yourself")
def _(candidate, rng):
    import course.kernels as K
    from ._core import call
    for device in ("cpu", "cuda"):
        params, expected = _norm_params(rng, device)
        on = f"5 parameters on {device!r} (one with no gradient)"
        K.reset_transfers()
        got = _number(call(candidate, params, on=on), on)
        copies = K.transfers()
        if not np.isclose(got, expected, rtol=1e-5):
            if np.isclose(got, expected ** 2, rtol=1e-5):
                raise CheckFailed(f"expected {expected:.6g}, got {got:.6g} on {on}: that is the sum of the squares; "
                                  f"the norm is its square root")
            expect_close(got, expected, on=on, rtol=1e-5, what="gradient norm")
        if device == "cpu":
            continue
        host = copies["to_host"]
        grads = sum(1 for p in params if p.grad is not None)
        grad_bytes = sum(p.grad.nbytes for p in params if p.grad is not None)
        if host["count"] >= grads and host["bytes"] >= grad_bytes:
            raise CheckFailed(f"your function copied {host['count']} arrays ({host['bytes']} bytes) to the host on "
                              f"{on}: every gradient crossed the link. Do the arithmetic on the device, and copy "
                              f"only the result")
        if host["count"] > 1:
            raise CheckFailed(f"your function copied {host['count']} numbers to the host on {on}, one at a time: add "
                              f"them up on the device first, and copy one")
        expect(host["count"] == 1, f"no copy to the host on {on}, yet a number came back: how?")
        expect(copies["to_device"]["count"] == 0,
               f"your function copied {copies['to_device']['count']} array(s) to the device on {on}: the gradients "
               f"are there already, and a number (such as 0 to start a sum) needs no copy")
