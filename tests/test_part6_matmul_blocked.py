"""The matmuls blocked in registers (lesson 6.3's last section) and the batched `matmul_into`: every
method against NumPy on awkward shapes, the tracer's verdict on each new kernel, the tile choice
from a device's limits. On a GPU where there is one, else on the simulator (small sizes)."""

import sys

import numpy as np
import pytest

import course.kernels as K
from course.kernels import cuda

pytestmark = pytest.mark.part6
mm = sys.modules["course.kernels.matmul"]  # the module; `course.kernels.matmul` is also the host function


def f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


SHAPES = [(1, 1, 1), (17, 33, 9), (5, 0, 3), (16, 4, 16), (3, 20, 40)]


@pytest.mark.parametrize("method", mm.METHODS)
@pytest.mark.parametrize("m,k,n", SHAPES)
def test_every_method_equals_numpy(rng, method, m, k, n):
    a, b = f32(rng, m, k), f32(rng, k, n)
    got = K.matmul(a, b, method=method)
    assert got.shape == (m, n) and got.dtype == np.float32
    np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("method", [*mm.METHODS, None])
def test_matmul_into_a_batch_on_the_device_in_one_launch(rng, method):
    a, b = f32(rng, 3, 17, 33), f32(rng, 3, 33, 9)
    d_a, d_b = cuda.to_device(a), cuda.to_device(b)
    out = cuda.device_array((3, 17, 9), np.float32)
    K.reset_launches()
    assert K.matmul_into(d_a, d_b, out, method=method) is out
    assert sum(K.launches().values()) == 1
    np.testing.assert_allclose(out.copy_to_host(), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


def test_matmul_into_k_zero_writes_zeros_and_empty_shapes_launch_nothing(rng):
    out = cuda.to_device(np.full((2, 4, 5), 7, np.float32))
    K.matmul_into(cuda.to_device(f32(rng, 2, 4, 0)), cuda.to_device(f32(rng, 2, 0, 5)), out)
    np.testing.assert_array_equal(out.copy_to_host(), 0)
    K.reset_launches()
    empty = cuda.device_array((2, 0, 5), np.float32)
    K.matmul_into(cuda.to_device(f32(rng, 2, 0, 3)), cuda.to_device(f32(rng, 2, 3, 5)), empty)
    assert K.launches() == {}


def test_matmul_device_keeps_working_for_every_method(rng):
    a, b = f32(rng, 6, 5), f32(rng, 5, 7)
    for method in mm.METHODS:
        c = mm.matmul_device(cuda.to_device(a), cuda.to_device(b), method)
        assert c.shape == (6, 7)
        np.testing.assert_allclose(c.copy_to_host(), a @ b, rtol=1e-4, atol=1e-4)


def test_bad_methods_and_shapes_are_named(rng):
    a, b, out = f32(rng, 2, 3, 4), f32(rng, 2, 4, 5), np.zeros((2, 3, 5), np.float32)
    with pytest.raises(ValueError, match="unknown method 'fast'.*'register'"):
        K.matmul_into(a, b, out, method="fast")
    with pytest.raises(ValueError, match="unknown method 'fast'.*'thread_tile'"):
        K.matmul(a[0], b[0], method="fast")
    with pytest.raises(ValueError, match=r"\(2, 3, 4\) @ \(2, 5, 5\)"):
        K.matmul_into(a, f32(rng, 2, 5, 5), out)
    with pytest.raises(ValueError, match=r"\(2, 3, 4\) @ \(1, 4, 5\)"):
        K.matmul_into(a, f32(rng, 1, 4, 5), out)
    with pytest.raises(ValueError, match="out must be a 3-D float32"):
        K.matmul_into(a, b, out[0])
    with pytest.raises(ValueError, match="a must be a 3-D float32 array.*float64"):
        K.matmul_into(a.astype(np.float64), b, out)


# ----- the tracer's verdict on the new kernels ---------------------------------------------------------
KERNELS = {
    "naive batched": (lambda: mm.matmul_naive_batched_kernel, 4, 4, (4, 4)),
    "tiled batched": (lambda: mm.matmul_tiled_batched_kernel, mm.TILE, mm.TILE, (mm.TILE, mm.TILE)),
    "thread tile": (lambda: mm.make_thread_tile_kernel(8, 8, 4, 4), 8, 8, (8, 2)),
    "register": (lambda: mm.make_register_kernel(16, 16, 4, 4, 4), 16, 16, (4, 4)),
    "register, contiguous": (lambda: mm.make_register_kernel(8, 8, 4, 2, 4, group=None), 8, 8, (2, 4)),
    "register, A as it is": (lambda: mm.make_register_kernel(8, 16, 4, 2, 2, transpose_a=False), 8, 16, (8, 4)),
    "register, runs of 2, interior": (lambda: mm.make_register_kernel(8, 16, 4, 4, 4, group=2, interior=True), 8, 16,
                                      (4, 2)),
    "the library's": (lambda: mm.matmul_register_kernel, mm.TILES.bm, mm.TILES.bn, mm._BATCHED["register"][2]),
}


@pytest.mark.parametrize("name", list(KERNELS))
def test_the_tracer_finds_no_race_and_no_access_outside(rng, name):
    make, bm, bn, block = KERNELS[name]
    a, b = f32(rng, 2, 17, 6), f32(rng, 2, 6, 11)  # edges in every direction, two tiles along k for bk = 4
    c = np.zeros((2, 17, 11), np.float32)
    grid = ((11 + bn - 1) // bn, (17 + bm - 1) // bm, 2)
    report = K.trace(make(), grid, block, a, b, c)
    assert not report.races and not report.out_of_bounds and not report.uninitialised
    assert not report.barrier_issues
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("group,align", [(1, 16), (2, 16), (4, 16), (None, 16), (4, None)])
def test_interior_blocks_without_bounds_checks_and_edge_blocks_with_them(rng, group, align):
    """Blocks inside the matrices skip the checks: with 8 x 16 blocks and bk = 4, (20, 10) @ (10, 36)
    has inside blocks, blocks across the bottom and right edges, and a last tile of k that sticks
    out (10 = 4 + 4 + 2); every number of C must come out right, and nothing read outside."""
    kernel = mm.make_register_kernel(8, 16, 4, 4, 4, group=group, interior=True, align=align)
    a, b = f32(rng, 2, 20, 10), f32(rng, 2, 10, 36)
    c = np.full((2, 20, 36), np.nan, np.float32)
    report = K.trace(kernel, (3, 3, 2), (4, 2), a, b, c)
    assert not report.races and not report.out_of_bounds and not report.uninitialised
    np.testing.assert_allclose(c, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("group,rows", [(1, [1, 3, 5, 7]), (2, [2, 3, 6, 7]), (4, [4, 5, 6, 7]), (None, [4, 5, 6, 7])])
def test_a_thread_s_rows_come_in_runs_of_group(rng, group, rows):
    """Thread ty = 1 of a block of 2 rows of threads, tm = 4: which rows of C it writes."""
    kernel = mm.make_register_kernel(8, 4, 4, 4, 4, group=group)
    a, b, c = f32(rng, 1, 8, 4), f32(rng, 1, 4, 4), np.zeros((1, 8, 4), np.float32)
    report = K.trace(kernel, (1, 1, 1), (1, 2), a, b, c)
    owner = report.touched_by("c", "write")[0]  # thread numbers: ty = 1 is thread 1
    assert sorted(set(np.nonzero(owner == 1)[0])) == rows and (owner[rows] == 1).all()


def test_register_blocking_cuts_shared_reads_and_the_strided_tile_has_no_bank_conflicts(rng):
    a, b = f32(rng, 1, 32, 8), f32(rng, 1, 8, 32)

    def traced(kernel, grid, block):
        c = np.zeros((1, 32, 32), np.float32)
        report = K.trace(kernel, grid, block, a, b, c)
        np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-4)
        return report

    thread_tile = traced(mm.make_thread_tile_kernel(32, 32, 8, 4), (1, 1, 1), (32, 8))
    register = traced(mm.make_register_kernel(32, 32, 8, 4, 4), (1, 1, 1), (8, 8))
    unpadded = traced(mm.make_register_kernel(32, 32, 8, 4, 4, pad_a=0), (1, 1, 1), (8, 8))
    contiguous = traced(mm.make_register_kernel(32, 32, 8, 4, 4, transpose_a=False, group=None), (1, 1, 1), (8, 8))
    # per thread and tile: thread tile bk * (1 + tm) reads for bk * tm sums; register bk * (tm + tn) for bk * tm * tn
    assert thread_tile.per_thread("shared", "read").max() == 8 * (1 + 4)
    assert register.per_thread("shared", "read").max() == 8 * (4 + 4)
    assert register.bank_conflicts() == 0 and thread_tile.bank_conflicts() == 0
    assert unpadded.bank_conflicts() > 0  # the transposed store, 8 words a row apart in one bank
    assert contiguous.bank_conflicts() > 0 and contiguous.transactions() > register.transactions()


# ----- the tile choice ---------------------------------------------------------------------------------
def test_tiles_from_an_h100_s_limits_and_from_smaller_devices():
    assert mm.choose_tiles(48 * 1024, 1024, 65536) == (128, 128, 8, 8, 8)
    small = mm.choose_tiles(16 * 1024, 256, 16384)
    assert small.bm * small.bn // (small.tm * small.tn) <= 256
    assert mm.shared_bytes(small.bm, small.bn, small.bk) <= 16 * 1024
    assert mm.choose_tiles(simulator=True) == mm.Tiles(16, 16, 4, 4, 4)
    with pytest.raises(ValueError, match="no tiles fit 64 bytes"):
        mm.choose_tiles(64, 1024, 65536)


def test_the_library_uses_tiles_that_fit_this_device():
    t = mm.TILES
    kernel, (rows, cols), block = mm._BATCHED["register"]
    assert (rows, cols) == (t.bm, t.bn) and block == (t.bn // t.tn, t.bm // t.tm)
    K.check_launch((1, 1, 1), block)
    if K.backend() == "gpu":
        assert mm.shared_bytes(t.bm, t.bn, t.bk) <= cuda.get_current_device().MAX_SHARED_MEMORY_PER_BLOCK


def test_the_library_kernel_reads_its_tiles_16_bytes_at_a_time():
    """Aligned tiles and runs of 4: at the GPU's tiles the compiler turns each run of 4 shared
    reads into one 16-byte read, in the PTX for both architectures (where NVVM is installed)."""
    from course.kernels import compile as C

    ok, why = C.available()
    if not ok:
        pytest.skip(f"cannot compile kernels for a GPU here: {why}")
    gpu = mm.make_register_kernel(*mm.choose_tiles(), group=4, interior=True)
    rng = np.random.default_rng(0)
    args = (f32(rng, 1, 9, 9), f32(rng, 1, 9, 9), np.zeros((1, 9, 9), np.float32))
    for arch, ptx in C.compile_ptx(gpu, args).items():
        assert ptx.count("ld.shared.v4.f32") == 4, arch  # (8 of A + 8 of B) / 4 in the loop over p
        assert "ld.shared.f32" not in ptx, arch
    for options in (dict(group=None, align=None), dict(group=1)):  # tiles not aligned; runs of 1
        ptx = C.compile_ptx(mm.make_register_kernel(*mm.choose_tiles(), **options), args, archs=((9, 0),))[(9, 0)]
        assert ptx.count("ld.shared.f32") == 16 and "ld.shared.v4.f32" not in ptx, options
    ptx = C.compile_ptx(mm.make_register_kernel(*mm.choose_tiles(), group=None), args, archs=((9, 0),))[(9, 0)]
    assert ptx.count("ld.shared.v4.f32") == 4 and "ld.shared.f32" not in ptx  # contiguous and aligned


@pytest.mark.parametrize("alignment", [12, 4, 0])
def test_an_alignment_the_gpu_refuses_is_refused_here_too(rng, alignment):
    @cuda.jit
    def aligned(x):
        tile = cuda.shared.array(4, np.float32, alignment=alignment)
        tile[cuda.threadIdx.x] = x[cuda.threadIdx.x]

    with pytest.raises(RuntimeError, match=f"raised ValueError: alignment={alignment}: .*power of two.*multiple of 8"):
        K.trace(aligned, 1, 4, f32(rng, 4))
    if K.backend() == "simulator":  # on a GPU, numba's compiler refuses it in its own words
        with pytest.raises(ValueError, match=f"alignment={alignment}: .*power of two"):
            aligned[1, 4](f32(rng, 4))


def test_the_simulator_and_the_tracer_take_an_alignment_they_can_ignore(rng):
    @cuda.jit
    def aligned(x, out):
        tile = cuda.shared.array(4, np.float32, alignment=16)
        other = cuda.shared.array(4, np.float32, alignment=16)  # two shared arrays: two memories
        plain = cuda.shared.array(4, np.float32)
        mine = cuda.local.array(2, np.float32, alignment=8)
        i = cuda.threadIdx.x
        tile[i] = x[i]
        other[i] = 10 * x[i]
        plain[i] = 100 * x[i]
        mine[0] = 2 * x[i]
        cuda.syncthreads()
        out[i] = tile[3 - i] + mine[0] + other[i] + plain[3 - i]

    x, out = f32(rng, 4), np.zeros(4, np.float32)
    expected = x[::-1] + 2 * x + 10 * x + 100 * x[::-1]
    aligned[1, 4](x, out)
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    out[:] = 0
    report = K.trace(aligned, 1, 4, x, out)
    assert not report.races
    np.testing.assert_allclose(out, expected, rtol=1e-6)


def test_every_thread_of_a_block_gets_the_same_shared_array_however_threads_switch():
    """The simulator's threads are Python threads: with a switch between any two bytecodes, two of
    them used to reach a shared array's first allocation together and make one each, and the block
    no longer shared it."""
    @cuda.jit
    def reverse(x, out):
        tile = cuda.shared.array(32, np.float32)
        i = cuda.threadIdx.x
        tile[i] = x[i]
        cuda.syncthreads()
        out[i] = tile[31 - i]

    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for _ in range(30):
            x, out = np.arange(32, dtype=np.float32), np.zeros(32, np.float32)
            reverse[1, 32](x, out)
            assert np.array_equal(out, x[::-1])
    finally:
        sys.setswitchinterval(before)
