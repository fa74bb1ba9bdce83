"""The thread tracer: it finds races, missing guards and early tile loads, and is silent on correct kernels."""

import numpy as np
import pytest

import course.kernels as K
from course.kernels import cuda

pytestmark = pytest.mark.part6

from numba import float32  # noqa: E402  (after course.kernels, which chooses the CUDA backend)


# ----- kernels with the classic bugs, written as a learner would -------------------------------------
@cuda.jit
def add_without_guard(a, b, out):
    i = cuda.grid(1)
    out[i] = a[i] + b[i]


@cuda.jit
def sum_without_barrier(x, partial):
    cache = cuda.shared.array(32, float32)
    t = cuda.threadIdx.x
    i = cuda.grid(1)
    cache[t] = x[i] if i < x.size else 0
    cuda.syncthreads()
    step = cuda.blockDim.x // 2
    while step > 0:
        if t < step:
            cache[t] += cache[t + step]
        step //= 2  # no cuda.syncthreads() here: the next step reads sums not yet written
    if t == 0:
        partial[cuda.blockIdx.x] = cache[0]


@cuda.jit
def everyone_adds_to_one(x, total):
    i = cuda.grid(1)
    if i < x.size:
        total[0] += x[i]  # not atomic


@cuda.jit
def atomic_sum(x, total):
    i = cuda.grid(1)
    if i < x.size:
        cuda.atomic.add(total, 0, x[i])


T = 4


@cuda.jit
def tiled_matmul_early_load(a, b, c):
    """The tiled matmul with the second barrier missing: a fast thread loads the next tile while
    the others are still reading the current one."""
    sa = cuda.shared.array((T, T), float32)
    sb = cuda.shared.array((T, T), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    row, col = cuda.grid(2)[1], cuda.grid(2)[0]
    acc = float32(0)
    for tile in range((a.shape[1] + T - 1) // T):
        k = tile * T
        sa[ty, tx] = a[row, k + tx] if row < a.shape[0] and k + tx < a.shape[1] else 0
        sb[ty, tx] = b[k + ty, col] if k + ty < b.shape[0] and col < b.shape[1] else 0
        cuda.syncthreads()
        for j in range(T):
            acc += sa[ty, j] * sb[j, tx]
        # missing: cuda.syncthreads()
    if row < c.shape[0] and col < c.shape[1]:
        c[row, col] = acc


def _vectors(n, rng):
    return rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)


# ----- the bugs are found -----------------------------------------------------------------------------
def test_missing_guard_is_reported_with_thread_and_element(rng):
    a, b = _vectors(33, rng)
    out = np.zeros(33, np.float32)
    report = K.trace(add_without_guard, 2, 32, a, b, out)
    assert not report.races
    bad = {(o.array, o.index, o.kind) for o in report.out_of_bounds}
    assert ("out", (33,), "write") in bad and ("a", (63,), "read") in bad
    first = next(o for o in report.out_of_bounds if o.array == "out")
    assert first.block == (1, 0, 0) and first.thread == (1, 0, 0)
    assert "thread 1 of block 1" in str(first) and "out[33]" in str(first) and "(33,)" in str(first)
    np.testing.assert_allclose(out, a + b)  # the elements inside were still computed
    assert "out-of-bounds" in report.summary()


def test_reduction_without_barrier_races(rng):
    x = rng.standard_normal(32).astype(np.float32)
    report = K.trace(sum_without_barrier, 2, 16, x, np.zeros(2, np.float32))
    assert report.races and not report.out_of_bounds
    race = report.races[0]
    assert race.array == "cache" and race.phase == 1 and report.shared_arrays == ["cache"]
    kinds = {race.first[2], race.second[2]}
    assert "write" in kinds and race.first[:2] != race.second[:2]
    assert "race on cache[" in str(race) and "of block 0" in str(race)


def test_non_atomic_update_across_blocks_races_and_atomic_does_not(rng):
    x = rng.standard_normal(12).astype(np.float32)
    racy = K.trace(everyone_adds_to_one, 3, 4, x, np.zeros(1, np.float32))
    assert racy.races and racy.races[0].array == "total"
    total = np.zeros(1, np.float32)
    clean = K.trace(atomic_sum, 3, 4, x, total)
    assert not clean.races and not clean.out_of_bounds
    np.testing.assert_allclose(total[0], x.sum(), rtol=1e-5)


def test_tile_loaded_before_others_finished_reading_is_a_race(rng):
    a = rng.standard_normal((5, 7)).astype(np.float32)
    b = rng.standard_normal((7, 3)).astype(np.float32)
    c = np.zeros((5, 3), np.float32)
    report = K.trace(tiled_matmul_early_load, (1, 2), (T, T), a, b, c)
    assert not report.out_of_bounds
    arrays = {r.array for r in report.races}
    assert arrays <= {"sa", "sb"} and arrays
    assert all(r.phase is not None for r in report.races)


# ----- and the correct kernels are clean ------------------------------------------------------------
def test_correct_vector_add_is_clean_and_covers_every_element(rng):
    a, b = _vectors(33, rng)
    out = np.zeros(33, np.float32)
    report = K.trace(K.vector_add_kernel, 2, 32, a, b, out)
    assert not report.races and not report.out_of_bounds
    assert not report.unwritten("out").any() and not report.unwritten(2).any() and not report.unwritten(out).any()
    np.testing.assert_allclose(out, a + b)
    owner = report.touched_by("out")
    assert owner[0] == 0 and owner[32] == 32  # thread 0 of block 1 is thread number 32
    assert "no data races" in report.summary() and "no out-of-bounds accesses" in report.summary()


def test_correct_reduction_is_clean(rng):
    x = rng.standard_normal(45).astype(np.float32)
    partial = np.zeros(2, np.float32)
    report = K.trace(K.reduce_sum_kernel, 2, 16, x, partial)
    assert not report.races and not report.out_of_bounds
    assert report.phases() == 1 + 1 + 4  # the load, then log2(16) halvings
    np.testing.assert_allclose(partial.sum(), x.sum(), rtol=1e-5)


def test_unwritten_finds_elements_no_thread_wrote(rng):
    a, b = _vectors(33, rng)
    out = np.zeros(33, np.float32)
    report = K.trace(K.vector_add_kernel, 1, 32, a, b, out)  # one block too few
    assert report.unwritten("out").tolist() == [False] * 32 + [True]


def test_trace_errors_name_the_problem(rng):
    a, b = _vectors(4, rng)
    out = np.zeros(4, np.float32)
    with pytest.raises(ValueError, match="1025 threads"):
        K.trace(K.vector_add_kernel, 1, 1025, a, b, out)
    with pytest.raises(ValueError, match="no blocks"):
        K.trace(K.vector_add_kernel, 0, 4, a, b, out)
    report = K.trace(K.vector_add_kernel, 1, 4, a, b, out)
    with pytest.raises(KeyError, match="the traced ones are a, b, out"):
        report.unwritten("c")


@cuda.jit
def fails_on_thread_three(x):
    i = cuda.grid(1)
    if i == 3:
        x[i] = 1.0 / 0.0 if x[i] > 1e30 else x[i] + unknown_name  # noqa: F821
    x[i] = x[i]


def test_an_exception_in_a_thread_names_the_thread_and_the_next_trace_works(rng):
    x = np.zeros(8, np.float32)
    with pytest.raises(RuntimeError, match=r"thread 3 raised NameError"):
        K.trace(fails_on_thread_three, 1, 8, x)
    a, b = _vectors(8, rng)
    out = np.zeros(8, np.float32)
    assert not K.trace(K.vector_add_kernel, 1, 8, a, b, out).races
    np.testing.assert_allclose(out, a + b)


def test_draw_colours_elements_by_thread(rng):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    a, b = _vectors(10, rng)
    report = K.trace(K.vector_add_kernel, 2, 8, a, b, np.zeros(10, np.float32))
    ax = report.draw("out")
    assert len(ax.patches) == 10 and "which thread wrote" in ax.get_title()
    texts = [t.get_text() for t in ax.texts]
    assert texts[:2] == ["0", "1"] and texts[8] == "0"  # element 8 is thread 0 of block 1
    plt.close(ax.figure)


def _library_launches(rng):
    """Each kernel of course.kernels with small arguments and an awkward launch: (kernel, grid, block, args)."""
    from course.kernels import basics, rows, scan

    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    z = lambda *s: np.zeros(s, np.float32)  # noqa: E731
    x, g = f(2, 19), f(2, 19)
    mean, rstd = x.mean(1).astype(np.float32), (1 / x.std(1)).astype(np.float32)
    u, delta = f(2, 3, 5), np.abs(f(2, 3, 5))
    A, B, C, D = -np.abs(f(5, 2)), f(2, 3, 2), f(2, 3, 2), f(5)
    states = z(2, 3, 5, 2)
    return {
        "softmax": (rows.softmax_kernel, 2, 8, (x, z(2, 19))),
        "softmax_backward": (rows.softmax_backward_kernel, 2, 8, (np.abs(x), g, z(2, 19))),
        "layer_norm": (rows.layer_norm_kernel, 2, 8, (x, f(19), f(19), np.float32(1e-5), z(2, 19), z(2), z(2))),
        "layer_norm_backward": (rows.layer_norm_backward_kernel, 2, 8, (x, f(19), mean, rstd, g, z(2, 19))),
        "layer_norm_params_backward": (rows.layer_norm_params_backward_kernel, 3, 8, (x, mean, rstd, g, z(19), z(19))),
        "matmul_tiled": (K.matmul_tiled_kernel, (1, 2), (K.TILE, K.TILE),
                         (f(K.TILE + 1, 3), f(3, 2), z(K.TILE + 1, 2))),
        "matmul_naive": (K.matmul_naive_kernel, (1, 2), (4, 4), (f(5, 3), f(3, 2), z(5, 2))),
        "column_sum": (basics.column_sum_kernel, 2, 8, (x, z(19))),
        "add_row": (basics.add_row_kernel, (3, 1), (8, 2), (x.copy(), f(19))),
        "selective_scan": (scan.selective_scan_kernel, 2, 8, (u, delta, A, B, C, D, z(2, 3, 5), states, True)),
        "selective_scan_backward": (scan.selective_scan_backward_kernel, 2, 8,
                                    (f(2, 3, 5), u, delta, A, B, C, D, f(2, 3, 5, 2), z(2, 3, 5), z(2, 3, 5),
                                     z(2, 5, 2), z(2, 3, 2), z(2, 3, 2), z(2, 5))),
    }


@pytest.mark.parametrize("name", list(_library_launches(np.random.default_rng(0))))
def test_every_library_kernel_is_clean_under_the_tracer(rng, name):
    kernel, grid, block, args = _library_launches(rng)[name]
    report = K.trace(kernel, grid, block, *args)
    assert not report.races, report.summary()
    assert not report.out_of_bounds, report.summary()


def test_traced_kernels_compute_what_the_launch_computes(rng):
    launches = _library_launches(rng)
    kernel, grid, block, (x, out) = launches["softmax"]
    K.trace(kernel, grid, block, x, out)
    np.testing.assert_allclose(out, K.softmax(x), rtol=1e-5, atol=1e-7)
    kernel, grid, block, (a, b, c) = launches["matmul_tiled"]
    report = K.trace(kernel, grid, block, a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-6)
    assert report.phases() == 3  # load, multiply (one tile of k), then the last barrier
    # From global memory, each number of a is read once per block column of the grid (1 here) and each
    # of b once per block row (2 here), not once per column or row of c.
    assert (report.counts("a") == 1).all() and (report.counts("b") == 2).all()
    assert (report.counts("c", "write") == 1).all()


@cuda.jit
def fails_before_a_barrier(x):
    t = cuda.threadIdx.x
    if t == 0:
        raise ValueError("thread 0 gives up")
    cuda.syncthreads()  # the other threads wait here for a thread that will never come
    x[t] = 1


def test_a_thread_that_raises_before_a_barrier_is_named_and_the_others_are_released():
    import threading

    outcome = {}

    def run():
        try:
            K.trace(fails_before_a_barrier, 1, 4, np.zeros(4, np.float32))
        except RuntimeError as err:
            outcome["error"] = str(err)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive(), "trace hung: threads waiting at a barrier were never released"
    assert "thread 0 raised ValueError: thread 0 gives up" in outcome["error"]


def test_the_legend_of_a_2d_grid_names_blocks_by_their_block_idx():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    @cuda.jit
    def copy2d(a, out):
        col, row = cuda.grid(2)
        if row < out.shape[0] and col < out.shape[1]:
            out[row, col] = a[row, col]

    a = np.ones((6, 10), np.float32)
    ax = K.trace(copy2d, (3, 2), (4, 4), a, np.zeros_like(a)).draw("out")
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    plt.close("all")
    assert labels == ["block (0, 0)", "block (1, 0)", "block (2, 0)", "block (0, 1)", "block (1, 1)", "block (2, 1)"]


def test_a_local_array_starts_as_nan_as_a_reminder_that_a_gpu_leaves_it_uninitialised():
    @cuda.jit
    def reads_before_writing(out):
        h = cuda.local.array(2, float32)
        h[1] = 1
        out[0], out[1] = h[0], h[1]

    out = np.zeros(2, np.float32)
    K.trace(reads_before_writing, 1, 1, out)
    assert np.isnan(out[0]) and out[1] == 1
