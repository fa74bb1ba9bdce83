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


# ----- reads of shared memory that no thread wrote ----------------------------------------------------
@cuda.jit
def sum_without_zero_padding(x, partial):
    cache = cuda.shared.array(32, float32)
    t = cuda.threadIdx.x
    i = cuda.grid(1)
    if i < x.size:
        cache[t] = x[i]  # the slots past the end are never written: garbage on a GPU
    cuda.syncthreads()
    step = 16
    while step > 0:
        if t < step:
            cache[t] += cache[t + step]
        cuda.syncthreads()
        step //= 2
    if t == 0:
        partial[cuda.blockIdx.x] = cache[0]


def test_a_read_of_shared_memory_no_thread_wrote_is_reported_and_reads_nan():
    x = np.ones(40, np.float32)
    partial = np.zeros(2, np.float32)
    report = K.trace(sum_without_zero_padding, 2, 32, x, partial)
    assert not report.races and not report.out_of_bounds
    first = report.uninitialised[0]
    assert (first.array, first.index, first.block, first.thread) == ("cache", (16,), (1, 0, 0), (0, 0, 0))
    assert "thread 0 of block 1 read cache[16]" in str(first) and "no thread of its block had written" in str(first)
    assert {u.block for u in report.uninitialised} == {(1, 0, 0)}  # block 0 has all 32 elements
    assert partial[0] == 32 and np.isnan(partial[1])  # shared memory starts as a GPU leaves it, not as zeros
    assert "reads of uninitialised shared memory" in report.summary()


def test_a_read_after_a_barrier_of_what_another_thread_wrote_is_not_uninitialised(rng):
    x = rng.standard_normal(40).astype(np.float32)
    report = K.trace(K.reduce_sum_kernel, 2, 16, x, np.zeros(2, np.float32))
    assert not report.out_of_bounds and not report.uninitialised and "no reads of uninitialised shared memory" in report.summary()


# ----- barriers only some threads reach ------------------------------------------------------------
@cuda.jit
def sum_with_barrier_inside_if(x, partial):
    cache = cuda.shared.array(32, float32)
    t = cuda.threadIdx.x
    i = cuda.grid(1)
    cache[t] = x[i] if i < x.size else 0
    cuda.syncthreads()
    step = 16
    while step > 0:
        if t < step:
            cache[t] += cache[t + step]
            cuda.syncthreads()  # only the threads t < step come here
        step //= 2
    if t == 0:
        partial[cuda.blockIdx.x] = cache[0]


@cuda.jit
def sum_with_early_return(x, partial):
    cache = cuda.shared.array(32, float32)
    t = cuda.threadIdx.x
    i = cuda.grid(1)
    cache[t] = x[i] if i < x.size else 0
    cuda.syncthreads()
    step = 16
    while step > 0:
        if t >= step:
            return  # the threads that have nothing left to add leave: the others wait for them
        cache[t] += cache[t + step]
        cuda.syncthreads()
        step //= 2
    if t == 0:
        partial[cuda.blockIdx.x] = cache[0]


@cuda.jit
def barriers_on_two_branches(x):
    t = cuda.threadIdx.x
    if t % 2 == 0:
        x[t] = 1
        cuda.syncthreads()
    else:
        cuda.syncthreads()
        x[t] = 2


@pytest.mark.parametrize("kernel", [sum_with_barrier_inside_if, sum_with_early_return])
def test_a_barrier_only_some_threads_reach_is_undefined_behaviour_naming_who_skipped_it(kernel):
    report = K.trace(kernel, 1, 32, np.ones(32, np.float32), np.zeros(1, np.float32))
    first = report.barrier_issues[0]
    assert first.skipped == tuple((t, 0, 0) for t in range(16, 32))
    assert first.waiting == tuple((t, 0, 0) for t in range(16))
    text = str(first)
    assert "undefined behaviour" in text and "reached by threads 0-15 but not by threads 16-31" in text
    assert "missing barrier" not in report.summary()
    assert len(report.barrier_issues) == 5  # one for each halving step


def test_barriers_at_different_lines_are_undefined_behaviour():
    report = K.trace(barriers_on_two_branches, 1, 8, np.zeros(8, np.float32))
    assert len(report.barrier_issues) == 1
    issue = report.barrier_issues[0]
    assert not issue.skipped and len(issue.lines) == 2 and "different syncthreads()" in str(issue)


def test_the_library_kernels_have_no_barrier_warp_or_uninitialised_issue(rng):
    for name, (kernel, grid, block, args) in _library_launches(rng).items():
        report = K.trace(kernel, grid, block, *args)
        assert not (report.uninitialised or report.barrier_issues or report.warp_issues), (name, report.summary())


# ----- the same memory under two names ----------------------------------------------------------------
@cuda.jit
def smooth(x, out):
    i = cuda.grid(1)
    if 0 < i < x.size - 1:
        out[i] = (x[i - 1] + x[i] + x[i + 1]) / 3


def test_one_array_passed_twice_races_and_is_reported_under_both_names():
    a = np.arange(10, dtype=np.float32)
    report = K.trace(smooth, 1, 10, a, a)
    assert report.races
    race = next(r for r in report.races if r.alias is not None)
    assert {race.array, race.alias[0]} == {"x", "out"} and race.index == race.alias[1]
    assert "the same memory as" in str(race)
    b = np.arange(10, dtype=np.float32)
    assert not K.trace(smooth, 1, 10, b, np.zeros_like(b)).races
    c = np.arange(20, dtype=np.float32)  # overlapping views: out is x shifted by one element
    assert K.trace(smooth, 1, 10, c[:10], c[1:11]).races


# ----- one copy of a shared array per block -------------------------------------------------------------
def test_each_block_has_its_own_shared_array_in_the_report_and_the_picture(rng):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = K.THREADS_PER_BLOCK  # the kernel's shared array has a slot per thread of a full block (16 or 256)
    x = rng.standard_normal(5 * t).astype(np.float32)
    report = K.trace(K.reduce_sum_kernel, 3, t, x, np.zeros(3, np.float32))
    owner = report.touched_by("cache", phase=0)
    assert owner.shape == (3, t)
    np.testing.assert_array_equal(owner, np.arange(3 * t).reshape(3, t))  # block b's copy: its own threads
    np.testing.assert_array_equal(report.touched_by("cache", phase=0, block=2), np.arange(2 * t, 3 * t))
    assert report.counts("cache", "write").shape == (3, t)
    copies = report.shared_copies("cache")
    assert sorted(copies) == [(0, 0, 0), (1, 0, 0), (2, 0, 0)] and copies[(1, 0, 0)] is not copies[(0, 0, 0)]
    with pytest.raises(KeyError, match="the kernel made cache"):
        report.shared_copies("tile")
    ax = report.draw("cache", phase=0)
    assert len(ax.patches) == 3 * t and "one row per block" in ax.get_title()
    assert not any(p.get_facecolor()[:3] == (0, 0, 0) for p in ax.patches)  # no slot "written by several"
    plt.close("all")


def test_a_2d_shared_array_of_several_blocks_is_drawn_one_panel_per_block(rng):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    a, b = rng.standard_normal((5, 3)).astype(np.float32), rng.standard_normal((3, 2)).astype(np.float32)
    report = K.trace(K.matmul_tiled_kernel, (1, 2), (K.TILE, K.TILE), a, b, np.zeros((5, 2), np.float32))
    name = report.shared_arrays[0]
    assert report.touched_by(name, phase=0).shape == (2, K.TILE, K.TILE)
    axes = report.draw(name, phase=0)
    assert len(axes) == 2 and axes[1].get_title() == "block (0, 1)"
    plt.close("all")


# ----- atomics and warp functions -----------------------------------------------------------------------
@cuda.jit
def first_thread_claims(flag, winner):
    t = cuda.threadIdx.x
    if cuda.atomic.cas(flag, 0, 0, 1) == 0:  # only the first thread finds 0 and swaps in 1
        winner[0] = t


def test_atomic_compare_and_swap_lets_exactly_one_thread_win():
    flag, winner = np.zeros(1, np.int32), np.full(1, -1, np.int32)
    report = K.trace(first_thread_claims, 1, 8, flag, winner)
    assert flag[0] == 1 and winner[0] == 0 and not report.races
    assert report.per_thread("global", "atomic").tolist() == [1] * 8


@cuda.jit
def warp_sum(x, out):
    i = cuda.grid(1)
    v = x[i] if i < x.size else float32(0)
    offset = 16
    while offset > 0:
        v += cuda.shfl_down_sync(0xFFFFFFFF, v, offset)
        offset //= 2
    if cuda.threadIdx.x % 32 == 0:
        cuda.atomic.add(out, 0, v)


@cuda.jit
def warp_all_reduce(x, out):
    i = cuda.grid(1)
    v = x[i]
    mask = 1
    while mask < 32:
        v += cuda.shfl_xor_sync(0xFFFFFFFF, v, mask)
        mask *= 2
    out[i] = v  # every lane holds the warp's total


@cuda.jit
def warp_inclusive_scan(x, out):
    i = cuda.grid(1)
    lane = cuda.laneid
    v = x[i]
    delta = 1
    while delta < 32:
        up = cuda.shfl_up_sync(0xFFFFFFFF, v, delta)
        if lane >= delta:
            v += up
        delta *= 2
    out[i] = v


@cuda.jit
def warp_votes(x, out):
    i = cuda.grid(1)
    positive = x[i] > 0
    out[i, 0] = cuda.ballot_sync(0xFFFFFFFF, positive)
    out[i, 1] = cuda.all_sync(0xFFFFFFFF, positive)
    out[i, 2] = cuda.any_sync(0xFFFFFFFF, positive)
    out[i, 3] = cuda.shfl_sync(0xFFFFFFFF, i, 5)  # lane 5's value, broadcast
    if cuda.laneid < 10:
        out[i, 4] = cuda.activemask()  # only the lanes that took the branch


def test_a_warp_shuffle_reduction_works_as_on_a_gpu():
    x = np.arange(50, dtype=np.float32)
    out = np.zeros(1, np.float32)
    report = K.trace(warp_sum, 2, 32, x, out)
    assert out[0] == x.sum() and not report.warp_issues and not report.races
    y = np.zeros(64, np.float32)
    x = np.arange(64, dtype=np.float32)
    assert not K.trace(warp_all_reduce, 1, 64, x, y).warp_issues
    np.testing.assert_array_equal(y, np.repeat([x[:32].sum(), x[32:].sum()], 32))
    assert not K.trace(warp_inclusive_scan, 1, 64, x, y).warp_issues
    np.testing.assert_array_equal(y, np.concatenate([np.cumsum(x[:32]), np.cumsum(x[32:])]))


def test_votes_broadcast_and_activemask():
    x = np.where(np.arange(32) % 3 == 0, 1.0, -1.0).astype(np.float32)
    out = np.zeros((32, 5), np.int64)
    report = K.trace(warp_votes, 1, 32, x, out)
    assert not report.warp_issues
    assert out[0, 0] == sum(1 << k for k in range(0, 32, 3))
    assert (out[:, 1] == 0).all() and (out[:, 2] == 1).all() and (out[:, 3] == 5).all()
    assert (out[:10, 4] == (1 << 10) - 1).all() and (out[10:, 4] == 0).all()


@cuda.jit
def shuffle_in_a_branch(x, out):
    i = cuda.grid(1)
    v = x[i]
    if cuda.laneid < 16:
        v += cuda.shfl_down_sync(0xFFFFFFFF, v, 16)  # lanes 16-31 never come: undefined
    out[i] = v


def test_wrong_use_of_warp_functions_is_reported():
    x = np.arange(32, dtype=np.float32)
    report = K.trace(shuffle_in_a_branch, 1, 32, x, np.zeros(32, np.float32))
    assert report.warp_issues and "lanes 16-31 had exited" in str(report.warp_issues[0])
    assert "shfl_down_sync" in str(report.warp_issues[0])
    # a full mask in a block of 16 threads names lanes that do not exist
    report = K.trace(warp_sum, 1, 16, x[:16].copy(), np.zeros(1, np.float32))
    assert "lanes 16-31 do not exist (the block has 16 threads)" in str(report.warp_issues[0])
    assert any("lanes 0-15 read the values of lanes 16-31" in str(w) for w in report.warp_issues)
    assert "wrong uses of warp functions" in report.summary()


@cuda.jit
def warp_exchange(x, out, sync):
    buf = cuda.shared.array(32, float32)
    t = cuda.threadIdx.x
    buf[t] = x[t]
    if sync:
        cuda.syncwarp(0xFFFFFFFF)
    out[t] = buf[31 - t]


def test_syncwarp_orders_shared_memory_within_a_warp():
    x = np.arange(32, dtype=np.float32)
    out = np.zeros(32, np.float32)
    report = K.trace(warp_exchange, 1, 32, x, out, True)
    assert not report.races and not report.uninitialised
    np.testing.assert_array_equal(out, x[::-1])
    report = K.trace(warp_exchange, 1, 32, x, out, False)
    assert report.races and report.uninitialised


# ----- counts and memory figures -------------------------------------------------------------------------
def test_per_thread_counts_of_global_and_shared_accesses(rng):
    a, b = _vectors(40, rng)
    report = K.trace(K.vector_add_kernel, 2, 32, a, b, np.zeros(40, np.float32))
    reads = report.per_thread("global", "read")
    assert reads.shape == (64,) and reads[:40].tolist() == [2] * 40 and reads[40:].tolist() == [0] * 24
    assert report.per_thread("global", "write").max() == 1 and report.per_thread("shared", "any").max() == 0
    assert "per thread, at most: 2 global reads, 1 global write" in report.summary()
    report = K.trace(K.reduce_sum_kernel, 1, 16, a[:16].copy(), np.zeros(1, np.float32))
    assert report.per_thread("global", "read").max() == 1
    assert report.per_thread("shared", "read")[0] == 2 * 4 + 1  # two reads per halving, then the result
    with pytest.raises(ValueError, match="per_thread"):
        report.per_thread("local")


@cuda.jit
def read_column(m, out, stride):
    tile = cuda.shared.array((32, 33), float32)
    t = cuda.threadIdx.x
    for j in range(32):
        tile[t, j] = m[t, j]  # each lane a row: stride between lanes = one row of the tile
    cuda.syncthreads()
    if stride == 32:
        out[t] = tile[t, 0] + tile[0, 0] * 0  # lanes t*33 words apart: 33 % 32 = 1, different banks
    else:
        out[t] = tile[0, t]


@cuda.jit
def column_of_square_tile(out):
    tile = cuda.shared.array((32, 32), float32)
    t = cuda.threadIdx.x
    tile[t, 0] = t  # 32 lanes, 32 words apart: all in bank 0, 32 passes
    cuda.syncthreads()
    out[t] = tile[t, 0]


@cuda.jit
def row_of_square_tile(out):
    tile = cuda.shared.array((32, 32), float32)
    t = cuda.threadIdx.x
    tile[0, t] = t  # 32 neighbouring words: one per bank
    cuda.syncthreads()
    out[t] = tile[0, t]


def test_bank_conflicts_of_a_column_and_a_row_of_a_shared_tile():
    out = np.zeros(32, np.float32)
    column = K.trace(column_of_square_tile, 1, 32, out)
    assert [p.bank_conflicts for p in column.memory()] == [31, 31] and column.memory()[0].max_ways == 32
    assert column.shared_bytes == 32 * 32 * 4
    row = K.trace(row_of_square_tile, 1, 32, out)
    assert row.bank_conflicts() == 0 and row.memory()[0].max_ways == 1
    m = np.arange(32 * 32, dtype=np.float32).reshape(32, 32)
    padded = K.trace(read_column, 1, 32, m, out, 32)  # a (32, 33) tile: the column spreads over the banks
    assert padded.memory()[1].bank_conflicts == 0  # tile[0, 0] is one word read by all: a broadcast
    assert "bank conflict" in column.summary()


@cuda.jit
def copy_strided(x, out, stride):
    i = cuda.grid(1)
    out[i] = x[i * stride]


def test_global_transactions_of_coalesced_and_strided_reads():
    x = np.arange(32 * 32, dtype=np.float32)
    out = np.zeros(32, np.float32)
    coalesced = K.trace(copy_strided, 1, 32, x, out, 1)
    assert coalesced.memory()[0].global_requests == 2 and coalesced.transactions() == 4 + 4  # 128 bytes each
    strided = K.trace(copy_strided, 1, 32, x, out, 32)
    assert strided.transactions() == 32 + 4  # each lane's float in a sector of its own
    doubles = K.trace(copy_strided, 1, 32, x.astype(np.float64), out, 1)
    assert doubles.transactions() == 8 + 4


@cuda.jit
def different_warp_functions_in_two_branches(x, out):
    i = cuda.grid(1)
    if cuda.laneid < 16:
        out[i] = cuda.shfl_down_sync(0xFFFFFFFF, x[i], 1)
    else:
        out[i] = cuda.ballot_sync(0xFFFFFFFF, x[i] > 0)


@cuda.jit
def mask_without_itself(x, out):
    i = cuda.grid(1)
    if cuda.laneid == 0:
        out[i] = cuda.shfl_sync(0x2, x[i], 1)  # lane 0 names only lane 1 in its mask
    else:
        out[i] = x[i]


def test_divergent_warp_functions_and_a_mask_leaving_out_the_caller_are_reported():
    x = np.arange(32, dtype=np.float32)
    report = K.trace(different_warp_functions_in_two_branches, 1, 32, x, np.zeros(32, np.float32))
    assert any("called different warp functions" in str(w) for w in report.warp_issues)
    report = K.trace(mask_without_itself, 1, 32, x, np.zeros(32, np.float32))
    assert any("which leaves itself out" in str(w) for w in report.warp_issues)


@cuda.jit
def block_votes(x, out):
    t = cuda.threadIdx.x
    positive = x[t] > 0
    out[t, 0] = cuda.syncthreads_count(positive)
    out[t, 1] = cuda.syncthreads_and(positive)
    out[t, 2] = cuda.syncthreads_or(positive)
    out[t, 3] = cuda.eq_sync(0xFFFFFFFF, t // 40)  # the same in every lane of a block of 32


@cuda.jit
def atomic_updates(counters):
    t = cuda.threadIdx.x
    cuda.atomic.max(counters, 0, t)
    cuda.atomic.min(counters, 1, t)
    cuda.atomic.inc(counters, 2, 4)  # counts 0, 1, 2, 3, 4, then wraps to 0
    cuda.atomic.exch(counters, 3, 7)


def test_block_votes_and_other_atomics():
    x = np.where(np.arange(32) < 5, 1.0, -1.0).astype(np.float32)
    out = np.zeros((32, 4), np.int64)
    report = K.trace(block_votes, 1, 32, x, out)
    assert not report.barrier_issues and not report.warp_issues
    assert (out[:, 0] == 5).all() and (out[:, 1] == 0).all() and (out[:, 2] == 1).all() and (out[:, 3] == 1).all()
    counters = np.array([-1, 99, 0, 0], np.int64)
    report = K.trace(atomic_updates, 1, 8, counters)
    assert counters.tolist() == [7, 0, 8 % 5, 7] and not report.races


# ----- execute: the kernels run in Python without a GPU, nothing recorded ---------------------------
@cuda.jit(device=True)
def _square(v):
    return v * v


def _make_sum_of(fn):
    @cuda.jit
    def sum_of(x, total):  # a device function held in a closure (as a factory's kernels hold theirs), atomics
        i = cuda.grid(1)
        if i < x.size:
            cuda.atomic.add(total, 0, fn(x[i]))

    return sum_of


def test_execute_computes_what_numbas_simulator_computes_on_host_and_device_arrays():
    from course.kernels.trace import execute
    x = np.random.default_rng(0).standard_normal(100).astype(np.float32)
    sum_of = _make_sum_of(_square)
    runs = [("host", lambda a: a, lambda a: a)]
    if K.backend() == "simulator":  # device arrays of the simulator are used in place
        runs.append(("device", cuda.to_device, lambda d: d.copy_to_host()))
    for where, to, back in runs:
        partial, total = to(np.zeros(4, np.float32)), to(np.zeros(1, np.float32))
        execute(K.reduce_sum_kernel, 4, K.THREADS_PER_BLOCK, to(x), partial)  # shared memory and barriers
        execute(sum_of, 4, 32, to(x), total)
        np.testing.assert_allclose(back(partial).sum(), x.sum(dtype=np.float64), rtol=1e-5, err_msg=where)
        np.testing.assert_allclose(back(total), [np.sum(x.astype(np.float64) ** 2)], rtol=1e-5, err_msg=where)
        if K.backend() == "simulator":  # numba's own simulator gives the same partial sums
            sim_partial = np.zeros(4, np.float32)
            K.reduce_sum_kernel[4, K.THREADS_PER_BLOCK](x, sim_partial)
            np.testing.assert_allclose(back(partial), sim_partial, rtol=1e-6, err_msg=where)


def test_execute_names_the_thread_that_failed():
    from course.kernels.trace import execute
    x, out = np.ones(40, np.float32), np.zeros(40, np.float32)
    with pytest.raises(RuntimeError, match=r"thread 8 of block 1 raised IndexError"):
        execute(add_without_guard, 2, 32, x, x, out)


def test_launch_runs_kernels_through_execute_without_a_gpu(monkeypatch):
    if K.backend() != "simulator":
        pytest.skip("on a GPU, launch runs the kernel there")
    import sys
    T = sys.modules["course.kernels.trace"]  # the module: `course.kernels.trace` is the function
    calls = []
    monkeypatch.setattr(T, "execute", lambda kernel, grid, block, *args: calls.append((grid, block)))
    K.launch(add_without_guard, 2, 16, np.ones(32, np.float32), np.ones(32, np.float32), np.zeros(32, np.float32))
    assert calls == [((2,), (16,))]
