"""The checks of lesson 6.6 (course/exercises/part6_device.py): a stub is not attempted, a right
answer passes, and the classic mistakes (strides ignored, an offset ignored, no guard, no grid-stride
loop, a plain += where tokens repeat, a row written instead of added, the wrong axis, an output
read before it is written, every gradient copied to the host, a forgotten return, the library's
own function) fail with a message that says what to fix."""

import numpy as np
import pytest

import known_wrong
from course.exercises import check
from course.kernels import cuda

from numba import float32, int64  # noqa: E402  (after course.kernels, which chooses the CUDA backend)

pytestmark = pytest.mark.part6


@cuda.jit
def stub_kernel(*args):
    raise NotImplementedError  # your code here


# ===== 6.6.1 an elementwise kernel that broadcasts ======================================================


@cuda.jit
def zip_add_kernel(out, shape, a, a_offset, a_strides, b, b_offset, b_strides):
    i = cuda.grid(1)
    while i < out.size:
        rest, pa, pb = i, a_offset, b_offset
        for axis in range(3, -1, -1):  # the last axis varies fastest in out
            k = rest % shape[axis]
            rest //= shape[axis]
            pa += k * a_strides[axis]
            pb += k * b_strides[axis]
        out[i] = a[pa] + b[pb]
        i += cuda.gridsize(1)


@cuda.jit
def zip_add_unrolled(out, shape, a, a_offset, a_strides, b, b_offset, b_strides):
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        i3 = i % shape[3]
        i2 = (i // shape[3]) % shape[2]
        i1 = (i // (shape[3] * shape[2])) % shape[1]
        i0 = i // (shape[3] * shape[2] * shape[1])
        pa = a_offset + i0 * a_strides[0] + i1 * a_strides[1] + i2 * a_strides[2] + i3 * a_strides[3]
        pb = b_offset + i0 * b_strides[0] + i1 * b_strides[1] + i2 * b_strides[2] + i3 * b_strides[3]
        out[i] = a[pa] + b[pb]


@cuda.jit
def zip_add_contiguous(out, shape, a, a_offset, a_strides, b, b_offset, b_strides):
    i = cuda.grid(1)
    while i < out.size:
        out[i] = a[a_offset + i] + b[b_offset + i]  # as if both were laid out as out is
        i += cuda.gridsize(1)


@cuda.jit
def zip_add_no_offset(out, shape, a, a_offset, a_strides, b, b_offset, b_strides):
    i = cuda.grid(1)
    while i < out.size:
        rest, pa, pb = i, 0, 0
        for axis in range(3, -1, -1):
            k = rest % shape[axis]
            rest //= shape[axis]
            pa += k * a_strides[axis]
            pb += k * b_strides[axis]
        out[i] = a[pa] + b[pb]
        i += cuda.gridsize(1)


@cuda.jit
def zip_add_axes_reversed(out, shape, a, a_offset, a_strides, b, b_offset, b_strides):
    i = cuda.grid(1)
    while i < out.size:
        rest, pa, pb = i, a_offset, b_offset
        for axis in range(4):  # the first axis taken as the fastest
            k = rest % shape[axis]
            rest //= shape[axis]
            pa += k * a_strides[axis]
            pb += k * b_strides[axis]
        out[i] = a[pa] + b[pb]
        i += cuda.gridsize(1)


@cuda.jit
def zip_add_no_guard(out, shape, a, a_offset, a_strides, b, b_offset, b_strides):
    i = cuda.grid(1)
    rest, pa, pb = i, a_offset, b_offset
    for axis in range(3, -1, -1):
        k = rest % shape[axis]
        rest //= shape[axis]
        pa += k * a_strides[axis]
        pb += k * b_strides[axis]
    out[i] = a[pa] + b[pb]


@cuda.jit
def zip_add_one_element_per_thread(out, shape, a, a_offset, a_strides, b, b_offset, b_strides):
    i = cuda.grid(1)
    if i < out.size:  # guarded, but a grid smaller than out leaves elements undone
        rest, pa, pb = i, a_offset, b_offset
        for axis in range(3, -1, -1):
            k = rest % shape[axis]
            rest //= shape[axis]
            pa += k * a_strides[axis]
            pb += k * b_strides[axis]
        out[i] = a[pa] + b[pb]


@cuda.jit
def zip_add_times(out, shape, a, a_offset, a_strides, b, b_offset, b_strides):
    i = cuda.grid(1)
    while i < out.size:
        rest, pa, pb = i, a_offset, b_offset
        for axis in range(3, -1, -1):
            k = rest % shape[axis]
            rest //= shape[axis]
            pa += k * a_strides[axis]
            pb += k * b_strides[axis]
        out[i] = a[pa] * b[pb]
        i += cuda.gridsize(1)


# ===== 6.6.2 the embedding's backward ======================================================================


@cuda.jit
def embedding_backward_kernel(grad_table, idx, grad_out):
    i = cuda.grid(1)
    if i < grad_out.size:
        t, j = i // grad_out.shape[1], i % grad_out.shape[1]
        cuda.atomic.add(grad_table, (idx[t], j), grad_out[t, j])


@cuda.jit
def embedding_backward_strided(grad_table, idx, grad_out):
    width = grad_out.shape[1]
    for i in range(cuda.grid(1), idx.size * width, cuda.gridsize(1)):
        cuda.atomic.add(grad_table, (idx[i // width], i % width), grad_out[i // width, i % width])


@cuda.jit
def embedding_backward_plain_add(grad_table, idx, grad_out):
    i = cuda.grid(1)
    if i < grad_out.size:
        t, j = i // grad_out.shape[1], i % grad_out.shape[1]
        grad_table[idx[t], j] += grad_out[t, j]


@cuda.jit
def embedding_backward_plain_add_other_names(table, tokens, g):
    i = cuda.grid(1)
    if i < g.size:
        t, j = i // g.shape[1], i % g.shape[1]
        table[tokens[t], j] += g[t, j]


@cuda.jit
def embedding_backward_written(grad_table, idx, grad_out):
    i = cuda.grid(1)
    if i < grad_out.size:
        t, j = i // grad_out.shape[1], i % grad_out.shape[1]
        grad_table[idx[t], j] = grad_out[t, j]


@cuda.jit
def embedding_backward_no_guard(grad_table, idx, grad_out):
    i = cuda.grid(1)
    t, j = i // grad_out.shape[1], i % grad_out.shape[1]
    cuda.atomic.add(grad_table, (idx[t], j), grad_out[t, j])


@cuda.jit
def embedding_backward_ignores_idx(grad_table, idx, grad_out):
    i = cuda.grid(1)
    if i < grad_out.size:
        t, j = i // grad_out.shape[1], i % grad_out.shape[1]
        cuda.atomic.add(grad_table, (t, j), grad_out[t, j])


# ===== 6.6.3 a sum along one axis ============================================================================


@cuda.jit
def sum_axis_kernel(out, shape, a, a_offset, a_strides, axis):
    i = cuda.grid(1)
    while i < out.size:
        rest, pa = i, a_offset
        for d in range(3, -1, -1):  # out has a's shape with shape[axis] = 1: skip that axis
            if d != axis:
                pa += (rest % shape[d]) * a_strides[d]
                rest //= shape[d]
        total = float32(0)
        for k in range(shape[axis]):
            total += a[pa + k * a_strides[axis]]
        out[i] = total
        i += cuda.gridsize(1)


@cuda.jit
def sum_axis_by_index(out, shape, a, a_offset, a_strides, axis):
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        index = cuda.local.array(4, int64)
        rest = i
        for d in range(3, -1, -1):
            n = 1 if d == axis else shape[d]
            index[d] = rest % n
            rest //= n
        total = float32(0)
        for k in range(shape[axis]):
            index[axis] = k
            p = a_offset
            for d in range(4):
                p += index[d] * a_strides[d]
            total += a[p]
        out[i] = total


@cuda.jit
def sum_axis_ignores_strides(out, shape, a, a_offset, a_strides, axis):
    i = cuda.grid(1)
    while i < out.size:
        rest, pa, step = i, a_offset, 1
        contiguous = cuda.local.array(4, int64)
        for d in range(3, -1, -1):  # the strides a would have if it were contiguous
            contiguous[d] = step
            step *= shape[d]
        for d in range(3, -1, -1):
            if d != axis:
                pa += (rest % shape[d]) * contiguous[d]
                rest //= shape[d]
        total = float32(0)
        for k in range(shape[axis]):
            total += a[pa + k * contiguous[axis]]
        out[i] = total
        i += cuda.gridsize(1)


@cuda.jit
def sum_axis_wrong_axis(out, shape, a, a_offset, a_strides, axis):
    i = cuda.grid(1)
    axis = 3 if axis == 2 else 2  # the other of the last two axes
    while i < out.size:
        rest, pa = i, a_offset
        for d in range(3, -1, -1):
            if d != axis:
                pa += (rest % shape[d]) * a_strides[d]
                rest //= shape[d]
        total = float32(0)
        for k in range(shape[axis]):
            total += a[pa + k * a_strides[axis]]
        out[i] = total
        i += cuda.gridsize(1)


@cuda.jit
def sum_axis_no_offset(out, shape, a, a_offset, a_strides, axis):
    i = cuda.grid(1)
    while i < out.size:
        rest, pa = i, 0
        for d in range(3, -1, -1):
            if d != axis:
                pa += (rest % shape[d]) * a_strides[d]
                rest //= shape[d]
        total = float32(0)
        for k in range(shape[axis]):
            total += a[pa + k * a_strides[axis]]
        out[i] = total
        i += cuda.gridsize(1)


@cuda.jit
def sum_axis_per_input_atomic(out, shape, a, a_offset, a_strides, axis):
    j = cuda.grid(1)  # one thread per number of a, adding it into its place in out
    size = shape[0] * shape[1] * shape[2] * shape[3]
    while j < size:
        rest, pa, po, step = j, a_offset, 0, 1
        for d in range(3, -1, -1):
            k = rest % shape[d]
            rest //= shape[d]
            pa += k * a_strides[d]
            if d != axis:
                po += k * step
                step *= shape[d]
        cuda.atomic.add(out, po, a[pa])
        j += cuda.gridsize(1)


@cuda.jit
def sum_axis_no_grid_stride(out, shape, a, a_offset, a_strides, axis):
    i = cuda.grid(1)
    if i < out.size:
        rest, pa = i, a_offset
        for d in range(3, -1, -1):
            if d != axis:
                pa += (rest % shape[d]) * a_strides[d]
                rest //= shape[d]
        total = float32(0)
        for k in range(shape[axis]):
            total += a[pa + k * a_strides[axis]]
        out[i] = total


# ===== 6.6.4 a gradient norm that copies one number =============================================================


def grad_norm(params):
    total = sum((p.grad * p.grad).sum() for p in params if p.grad is not None)  # on the parameters' device
    return np.sqrt(total).item()  # the one copy to the host


def grad_norm_by_squares(params):
    squares = [np.square(p.grad).sum() for p in params if p.grad is not None]
    total = squares[0]
    for s in squares[1:]:
        total = total + s
    return float(np.sqrt(total).item())


def grad_norm_on_the_host(params):
    grads = [p.grad if isinstance(p.grad, np.ndarray) else p.grad.get() for p in params if p.grad is not None]
    return float(np.sqrt(sum((g.astype(np.float64) ** 2).sum() for g in grads)))


def grad_norm_item_per_parameter(params):
    return float(np.sqrt(sum((p.grad * p.grad).sum().item() for p in params if p.grad is not None)))


def grad_norm_no_sqrt(params):
    return sum((p.grad * p.grad).sum() for p in params if p.grad is not None).item()


def grad_norm_on_the_device(params):
    return np.sqrt(sum((p.grad * p.grad).sum() for p in params if p.grad is not None))  # never copied out


def grad_norm_counts_none(params):
    return np.sqrt(sum((p.grad * p.grad).sum() for p in params)).item()


def grad_norm_no_return(params):
    np.sqrt(sum((p.grad * p.grad).sum() for p in params if p.grad is not None)).item()


def grad_norm_by_clipping(params):
    from course.optim import clip_grad_norm_
    return float(clip_grad_norm_(params, 1e9))


RIGHT = {"6.6.1": zip_add_kernel, "6.6.2": embedding_backward_kernel, "6.6.3": sum_axis_kernel, "6.6.4": grad_norm}

KNOWN_WRONG = {
    "6.6.1": [(zip_add_contiguous, ["past the end of a", "offset and the strides"]),
              (zip_add_no_offset, ["add its offset"]),
              (zip_add_axes_reversed, ["last axis varies fastest"]),
              (zip_add_no_guard, ["wrote out[", "add a guard"]),
              (zip_add_one_element_per_thread, ["never written", "each thread must do more than one"]),
              (zip_add_times, ["expected out"])],
    "6.6.2": [(embedding_backward_plain_add, ["plain read and write", "loses updates", "atomic"]),
              (embedding_backward_plain_add_other_names, ["both added into table[", "loses updates"]),
              (embedding_backward_written, ["holds only one of them", "add into grad_table"]),
              (embedding_backward_no_guard, ["out of bounds", "add a guard"]),
              (embedding_backward_ignores_idx, ["belongs to the row of its token"])],
    "6.6.3": [(sum_axis_ignores_strides, ["use its strides"]),
              (sum_axis_wrong_axis, ["that is the sum along axis 3, not along axis 2"]),
              (sum_axis_no_offset, ["add its offset"]),
              (sum_axis_per_input_atomic, ["before any thread wrote it", "local variable"]),
              (sum_axis_no_grid_stride, ["never written", "each thread must do more than one"])],
    "6.6.4": [(grad_norm_on_the_host, ["every gradient crossed the link"]),
              (grad_norm_item_per_parameter, ["copied 4 numbers to the host", "add them up on the device first"]),
              (grad_norm_no_sqrt, ["sum of the squares", "square root"]),
              (grad_norm_on_the_device, ["returned a CudaArray", "return a Python number"]),
              (grad_norm_counts_none, ["your code raised"]),
              (grad_norm_no_return, ["returned None"]),
              (grad_norm_by_clipping, ["write this yourself"])],
}


def stub(*args, **kwargs):
    raise NotImplementedError


@pytest.mark.parametrize("exercise_id", sorted(RIGHT))
def test_stub_is_not_attempted_and_the_solution_passes(exercise_id):
    assert check(exercise_id, stub if exercise_id == "6.6.4" else stub_kernel).status == "not attempted"
    result = check(exercise_id, RIGHT[exercise_id])
    assert result.status == "passed", result.message


@pytest.mark.parametrize("exercise_id,wrong,words", known_wrong.cases(KNOWN_WRONG))
def test_known_wrong_answer_fails_saying_why(exercise_id, wrong, words):
    known_wrong.assert_fails_saying(exercise_id, wrong, words)


@pytest.mark.parametrize("exercise_id,candidate", [("6.6.1", zip_add_unrolled),
                                                   ("6.6.2", embedding_backward_strided),
                                                   ("6.6.3", sum_axis_by_index),
                                                   ("6.6.4", grad_norm_by_squares)])
def test_right_answers_written_otherwise_pass(exercise_id, candidate):
    result = check(exercise_id, candidate)
    assert result.status == "passed", result.message


def test_the_hints_do_not_give_the_code_away():
    from course.exercises._core import _CHECKS
    check("6.6.1", stub_kernel)  # loads the checks
    for exercise_id in ("6.6.1", "6.6.2", "6.6.3"):
        hint = _CHECKS[exercise_id].hint
        assert "cuda.atomic" not in hint and "gridsize" not in hint, hint


def test_the_race_message_does_not_give_the_code_away():
    result = check("6.6.2", embedding_backward_plain_add)
    assert "cuda.atomic.add" not in result.message, result.message


def test_the_plain_add_is_right_where_no_token_repeats():
    """Without a repeated token no two threads share an element: the race is only where tokens repeat."""
    from course.kernels import trace
    idx = np.array([3, 0, 1])
    grad_table, grad_out = np.zeros((4, 2), np.float32), np.ones((3, 2), np.float32)
    report = trace(embedding_backward_plain_add, 1, 32, grad_table, idx, grad_out)
    assert not report.races
    report = trace(embedding_backward_plain_add, 1, 32, np.zeros((4, 2), np.float32), np.array([3, 0, 3]), grad_out)
    assert report.races and report.races[0].array == "grad_table"


def test_the_library_s_scatter_add_kernel_is_no_answer():
    from course.kernels import primitives
    result = check("6.6.2", primitives.scatter_add_kernel)
    assert result.status == "failed" and "write the kernel yourself" in result.message, result.message
