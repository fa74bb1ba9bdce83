"""Checks of part 6: the execution model (6.1), shared memory and barriers (6.2), matrix
multiplication (6.3) and kernels in the engine (6.4).

A learner's kernel is run by `course.kernels.trace`, which plays every GPU thread in Python and
records which thread read and wrote which element between barriers. That is how a check can say,
in words, what a kernel got wrong: an element no thread wrote, an element two threads wrote, a
thread that read past the end of an array (a missing guard), a thread that read what another
thread of its block wrote with no `cuda.syncthreads()` between them (a missing barrier), a barrier
that only some threads reach, a read of shared memory (or of an output) that nothing wrote. Every
learner's kernel is traced by one function, `_trace`. On a machine with a GPU the kernel is also
launched there once, to make sure numba compiles it.

The references are written here in NumPy, independently of `course.kernels`. The library's
host functions that an exercise asks the learner to write are listed in its `forbid` (the shared
mechanism of `_core`). Its kernels are refused differently, by `_refuse_library`: they are launched
as `kernel[grid, block]`, which a blocked stand-in could not be, and a learner can hand one over
re-jitted (`cuda.jit(K.reduce_sum_kernel.py_func)`), so they are recognised by their code.
"""

import functools
import sys
import types
import warnings

import numpy as np

from ._core import CheckFailed, _NotAttempted, call, exercise, expect, expect_close

TPB = 32  # threads per block in the exercises of 6.2, the size of their shared arrays
TILE = 4  # the tile of the tiled matmul in 6.3 (the blocks are TILE x TILE threads)


cuda = None  # numba.cuda, once a check has imported course.kernels (for the kernels written here)


def _kernels():
    global cuda
    import course.kernels  # chooses the CUDA backend before numba.cuda is imported
    cuda = course.kernels.cuda
    return course.kernels


def _call(candidate, *args, on="", **kwargs):
    """`call`, and a clear message for a function that returns nothing."""
    got = call(candidate, *args, on=on, **kwargs)
    if got is None:
        raise CheckFailed(f"your function returned None on {on}: did it forget `return`?")
    return got


def _library_kernels():
    """The plain Python functions behind the kernels of course.kernels (to refuse them as answers)."""
    K = _kernels()
    found = {}
    for module_name in ("basics", "rows", "matmul", "scan", "softmax", "layer_norm", "ops"):
        module = getattr(K, module_name, None)
        if module is None:
            try:
                module = __import__(f"course.kernels.{module_name}", fromlist=["_"])
            except ImportError:
                continue
        for name, value in vars(module).items():
            fn = getattr(value, "py_func", None)
            if fn is not None:
                found[fn.__code__] = f"course.kernels.{name}"
    return found


def _kernel_code(candidate):
    fn = getattr(candidate, "py_func", None) or candidate
    return getattr(fn, "__code__", None)


def _refuse_library(candidate):
    code = _kernel_code(candidate)
    name = _library_kernels().get(code)
    if name is not None:
        raise CheckFailed(f"that is the course's own {name}: write the kernel yourself")


# ----- running a learner's kernel on the tracer ---------------------------------------------------


def _thread(report, block, thread):
    """A thread named as the learner thinks of it: its global index in a 1-D launch."""
    if len(report.block) == 1 and len(report.grid) == 1:
        return f"thread {block[0] * report.block[0] + thread[0]}"
    return report.describe(block, thread)


def _element(index):
    return str(index[0]) if len(index) == 1 else str(tuple(index))


LINE_BUDGET = 200_000  # lines one thread may run in a check before we call its loop endless


class _TooLong(Exception):
    pass


def _guard(fn, cuda_, errors, args):
    """Run one thread of the learner's kernel, keeping its exception instead of raising it.

    A thread that raises is recorded and ends; the others go on as they would, so the tracer is
    never left waiting at a barrier. A line budget stops a loop that never ends.
    """
    budget = [LINE_BUDGET]
    learners_file = fn.__code__.co_filename

    def local(frame, event, arg):
        if event == "line":
            budget[0] -= 1
            # Every line run counts, but the loop is stopped only in the learner's own code (the
            # kernel and the device functions beside it): raising from a tracer inside NumPy's or
            # the tracer's frames can crash CPython.
            if ((budget[0] < 0 or (errors and isinstance(errors[0][2], _TooLong)))  # or another thread's loop
                    and frame.f_code.co_filename == learners_file):
                raise _TooLong()
        return local

    try:
        with np.errstate(all="ignore"):  # per thread: a float32 overflow gives inf, as on a GPU
            sys.settrace(lambda frame, event, arg: local)
            try:
                fn(*args)
            finally:
                sys.settrace(None)
    except Exception as err:
        errors.append((tuple(cuda_.blockIdx), tuple(cuda_.threadIdx), err))


class _Holder:
    """Makes a plain function look like a @cuda.jit kernel to the tracer (it follows `py_func`)."""

    def __init__(self, fn):
        self.py_func = fn


def _guarded(candidate):
    """A kernel with the learner's parameter names that runs the learner's kernel under `_guard`."""
    fn = getattr(candidate, "py_func", None) or candidate
    if not isinstance(fn, types.FunctionType):
        raise CheckFailed(f"expected a kernel (a function decorated with @cuda.jit), got {type(candidate).__name__}")
    code = fn.__code__
    params = ", ".join(code.co_varnames[:code.co_argcount])
    errors = []
    glb = {"_learner": _Holder(fn), "_guard": _guard, "_errors": errors, "cuda": cuda}
    source = (f"def {fn.__name__}({params}):\n"
              f"    _guard(_learner, cuda, _errors, ({params}{',' if params else ''}))\n")
    exec(compile(source, "<check>", "exec"), glb)
    return glb[fn.__name__], errors


_said_no_compiler = []  # whether the checks have said that they cannot compile for a GPU here
# Grading sets this in the process that checks a learner's kernel: each launch is compiled for a GPU
# (nopython: no imports, no Python objects) before the tracer runs the kernel's Python code, and a
# kernel that cannot be compiled is not run at all.
COMPILE_FIRST = False


def _compiles(candidate, args):
    """Compile the learner's kernel for real GPUs (`course.kernels.compile`) once the tracer has run
    it: the tracer runs Python, which accepts code a GPU would refuse (a shared array sized at run
    time, a list). Called after the tracer, so that a stub is "not attempted" and a call of a
    library function "write this yourself". Where NVVM is missing, the checks say so once."""
    from course.kernels import compile as gpu
    fn = getattr(candidate, "py_func", None) or candidate
    if not isinstance(fn, types.FunctionType) or fn.__module__ == __name__:
        return  # the checks' own kernels are compiled once, by the test suite
    ok, why = gpu.available()
    if not ok and COMPILE_FIRST:
        raise CheckFailed(f"your kernel cannot be compiled for a GPU here ({why}), so it is not run")
    if not ok:
        if not _said_no_compiler:
            _said_no_compiler.append(True)
            print(f"(The checks run kernels on the tracer only: they cannot compile for a GPU here, {why}.)")
        return
    try:
        gpu.compile_ptx(fn, args)
    except gpu.CompileError as err:  # the same for every input: numba's reason and the kernel's line
        raise CheckFailed(str(err)) from None
    except (TypeError, RuntimeError) as err:  # arguments numba cannot type, or the compiling process ended
        if COMPILE_FIRST:
            raise CheckFailed(f"your kernel could not be compiled for a GPU ({err}), so it is not run") from None


def _trace(candidate, grid, block, *args, on=""):
    """Run the learner's kernel on the tracer; a NotImplementedError means not attempted yet."""
    K = _kernels()
    where = f" on {on}" if on else ""
    kernel, errors = _guarded(candidate)
    if COMPILE_FIRST:
        _compiles(candidate, args)
    try:
        report = K.trace(kernel, grid, block, *args)
    except Exception as err:  # a launch the tracer refuses (too many threads...)
        raise CheckFailed(f"{type(err).__name__}: {err}{where}") from None
    if errors:
        b, t, err = errors[0]
        who = _thread(report, b, t)
        if isinstance(err, NotImplementedError):
            raise _NotAttempted()
        if isinstance(err, _TooLong):
            raise CheckFailed(f"{who} ran more than {LINE_BUDGET:,} lines{where}: does a loop never end "
                              f"(a forgotten step such as `i += ...`)?")
        if isinstance(err, OverflowError):
            raise CheckFailed(f"exp overflowed in your kernel ({who}: {err}){where}: "
                              f"subtract the row's maximum before taking exp")
        if isinstance(err, CheckFailed):  # a library function the exercise asks the learner to write
            raise CheckFailed(f"in your kernel, {who}: {err}{where}")
        raise CheckFailed(f"in your kernel, {who} raised {type(err).__name__}: {err}{where}")
    if not COMPILE_FIRST:
        _compiles(candidate, args)
    return report


def _out_of_bounds(report, on):
    if report.out_of_bounds:
        o = report.out_of_bounds[0]
        verb = {"read": "read", "write": "wrote", "atomic": "updated"}[o.kind]
        size = f"length {o.shape[0]}" if len(o.shape) == 1 else f"shape {o.shape}"
        raise CheckFailed(f"{_thread(report, o.block, o.thread)} {verb} {o.array}[{', '.join(map(str, o.index))}] "
                          f"out of bounds ({o.array} has {size}) on {on}: add a guard")


def _races(report, on):
    if not report.races:
        return
    r = report.races[0]
    (b1, t1, k1), (b2, t2, k2) = r.first, r.second
    who1, who2 = _thread(report, b1, t1), _thread(report, b2, t2)
    element = f"{r.array}[{', '.join(map(str, r.index))}]"
    if r.alias is not None:
        element += f" (the same memory as {r.alias[0]}[{', '.join(map(str, r.alias[1]))}])"
    if k1 != "read" and k2 != "read":
        if who1.startswith("thread ") and who2.startswith("thread ") and " of " not in who1 + who2:
            writers = f"threads {who1[7:]} and {who2[7:]}"  # "threads 3 and 4"
        else:
            writers = f"{who1} and by {who2}"
        what = f"element {_element(r.index)} of {r.array} was written by {writers}"
        if r.phase is None:
            raise CheckFailed(f"{what}, in different blocks, which never wait for each other, on {on}: "
                              f"each element should have exactly one writer")
        raise CheckFailed(f"{what} with no barrier between the two writes, on {on}: "
                          f"each element should have one writer, or a cuda.syncthreads() between writers")
    writer, reader = (who1, who2) if k1 != "read" else (who2, who1)
    if r.phase is None:
        raise CheckFailed(f"{reader} read {element} while {writer} wrote it, in another block, on {on}: "
                          f"blocks never wait for each other, so which value it read is left to chance")
    raise CheckFailed(f"a missing barrier: {reader} read {element} and {writer} wrote it with no "
                      f"cuda.syncthreads() between them, on {on}, so which value it read is left to chance")


def _barriers(report, on):
    """A syncthreads() that only some threads of a block reach: undefined behaviour on a GPU (it may
    hang, or go on with some threads not waiting), whatever the result on the tracer."""
    if not report.barrier_issues:
        return
    issue = report.barrier_issues[0]
    waiting = report.threads_in_words(None, issue.waiting)
    block = _element(issue.block[:len(report.grid)])
    if issue.skipped:
        raise CheckFailed(f"a cuda.syncthreads() that only some threads reach, on {on}: {waiting} of block "
                          f"{block} waited at it, but {report.threads_in_words(None, issue.skipped)} "
                          f"had already left the kernel. On a GPU that is undefined behaviour (it may hang or "
                          f"give a wrong sum): every thread of a block must reach every barrier, so keep the "
                          f"barrier outside any `if` on the thread index, and never `return` before one")
    raise CheckFailed(f"the threads of block {block} wait at different cuda.syncthreads() calls "
                      f"(lines {', '.join(map(str, issue.lines))}), on {on}: on a GPU that is undefined behaviour. "
                      f"Put one barrier where every thread passes, outside any `if` on the thread index")


def _warps(report, on):
    if report.warp_issues:
        raise CheckFailed(f"{report.warp_issues[0]}, on {on}")


def _uninitialised_shared(report, on):
    """A read of a shared element that no thread of the block had written: garbage on a GPU."""
    if report.uninitialised:
        u = report.uninitialised[0]
        who = _thread(report, u.block, u.thread)
        raise CheckFailed(f"{who} read {u.array}[{', '.join(map(str, u.index))}] before any thread of its "
                          f"block wrote it, on {on}: shared memory starts with garbage on a GPU, "
                          f"so every slot that is read must be written first (with 0 where there "
                          f"is no element)")


def _outputs_read_first(report, outputs, on):
    """An output element read before the reading thread (or a barrier) made it: on a GPU an output
    array holds whatever was there before (`c[row, col] += ...` adds to garbage)."""
    for name in outputs:
        written = {}
        for index, acc in report.accesses(name):
            key = (acc.block, index)
            if acc.kind != "write":
                if not any(p < acc.phase or t == acc.thread for p, t in written.get(key, ())):
                    who = _thread(report, acc.block, acc.thread)
                    element = f"{name}[{', '.join(map(str, index))}]"
                    if acc.kind == "atomic":
                        raise CheckFailed(f"{who} added into {element} (an atomic update) before any thread wrote "
                                          f"it, on {on}: the output holds garbage on a GPU before your kernel "
                                          f"runs, so the sum starts from garbage. Write each element of {name} "
                                          f"once, from a sum made in shared memory or a local variable")
                    raise CheckFailed(f"{who} read {element} before writing it, on "
                                      f"{on}: the output holds garbage on a GPU before your kernel runs "
                                      f"(`{name}[...] += ...` adds to it). Add up in a local variable and write "
                                      f"each element of {name} once")
            if acc.kind != "read":
                written.setdefault(key, []).append((acc.phase, acc.thread))


def _unwritten(report, array, on):
    missing = np.argwhere(report.unwritten(array))
    if len(missing):
        first = tuple(int(i) for i in missing[0])
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CheckFailed(f"element {_element(first)} of {array} was never written{more} on {on}")


def _run(candidate, grid, block, args, on, outputs=()):
    """Trace the kernel, then fail on the first of: an out-of-bounds access, a barrier that only some
    threads reach, a wrong use of a warp function, a race, a read of uninitialised shared memory or
    of an output, an output element no thread wrote. `outputs`: the positions of the output arrays
    among the arguments; they start as nan, as garbage would on a GPU. Returns the report."""
    for k in outputs:
        if np.issubdtype(args[k].dtype, np.floating):
            args[k][...] = np.nan
    report = _trace(candidate, grid, block, *args, on=on)
    params = _params(candidate)
    names = [params[k] for k in outputs if k < len(params)]
    _out_of_bounds(report, on)
    _barriers(report, on)
    _warps(report, on)
    _races(report, on)
    _uninitialised_shared(report, on)
    _outputs_read_first(report, names, on)
    for name in names:
        _unwritten(report, name, on)
    return report


def _params(candidate):
    fn = getattr(candidate, "py_func", None) or candidate
    code = fn.__code__
    return list(code.co_varnames[:code.co_argcount])


def _on_device(candidate, grid, block, args, on):
    """On a real GPU, launch the kernel once more there (numba must compile it); returns the arrays
    after the launch, or None on the simulator, where the tracer has already run it faithfully."""
    K = _kernels()
    if K.backend() != "gpu":
        return None
    kernel = candidate if hasattr(candidate, "py_func") else K.cuda.jit(candidate)
    copies = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    try:
        with warnings.catch_warnings():  # numba's advice on occupancy is for real workloads, not these
            warnings.simplefilter("ignore")
            device = [K.cuda.to_device(a) if isinstance(a, np.ndarray) else a for a in copies]
            kernel[grid, block](*device)
            K.cuda.synchronize()
    except Exception as err:
        raise CheckFailed(f"numba could not run your kernel on the GPU ({type(err).__name__}: "
                          f"{str(err).splitlines()[0] if str(err) else ''}) on {on}") from None
    return [d.copy_to_host() if hasattr(d, "copy_to_host") else d for d in device]


def _f32(*shape, rng, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


# ===== 6.1 the execution model =====================================================================


@exercise("6.1.1", hint="along each axis the blocks before this one hold block_idx * block_dim threads; "
                        "the thread's place inside its own block comes on top")
def _(candidate, rng):
    cases = [((0, 0), (4, 4), (0, 0)), ((0, 0), (8, 4), (3, 1)), ((1, 0), (32, 8), (5, 5)),
             ((2, 3), (16, 4), (7, 2)), ((0, 5), (4, 8), (3, 7))]
    for _ in range(4):
        bd = tuple(int(v) for v in rng.integers(1, 33, size=2))
        cases.append((tuple(int(v) for v in rng.integers(0, 20, size=2)), bd,
                      tuple(int(rng.integers(0, d)) for d in bd)))
    for bi, bd, ti in cases:
        on = f"block_idx={bi}, block_dim={bd}, thread_idx={ti}"
        got = _call(candidate, bi, bd, ti, on=on)
        expected = (bi[0] * bd[0] + ti[0], bi[1] * bd[1] + ti[1])
        try:
            values = [float(v) for v in got]
        except (TypeError, ValueError):
            raise CheckFailed(f"expected a pair (x, y) of whole numbers, got {got!r} on {on}") from None
        if any(v != int(v) for v in values):
            raise CheckFailed(f"expected a pair (x, y) of whole numbers, got {got!r} on {on}: a thread "
                              f"index counts threads, so it has no fraction")
        pair = tuple(int(v) for v in values)
        if len(pair) != 2:
            raise CheckFailed(f"expected a pair (x, y), got {len(pair)} numbers on {on}")
        if pair == expected[::-1] and pair != expected:
            raise CheckFailed(f"x and y are swapped: expected {expected}, got {pair} on {on}")
        expect(pair == expected, f"expected (x, y) = {expected}, got {pair} on {on}")


def _scale_cases(rng):
    # (n, blocks, threads): sizes that are not multiples of the block, and one that is
    return [(37, 2, 32), (5, 1, 8), (32, 1, 32), (50, 4, 16), (int(rng.integers(10, 60)), None, 16)]


@exercise("6.1.2", kernel=True, hint="the grid is rounded up to whole blocks, so some threads have an index past the "
                        "end of the array: let only the threads with an element do the work")
def _(candidate, rng):
    _refuse_library(candidate)
    for n, blocks, threads in _scale_cases(rng):
        blocks = blocks or -(-n // threads)
        x = _f32(n, rng=rng)
        out = np.zeros(n, np.float32)
        alpha = np.float32(rng.choice([2.0, -0.5, 3.0]))
        on = f"x of length {n}, alpha={alpha:g}, {blocks} block(s) of {threads} threads"
        _run(candidate, blocks, threads, (x, alpha, out), on, outputs=(2,))
        expect_close(out, alpha * x, on=on, rtol=1e-6, atol=1e-6, what="out")
    n = 37
    x, out = _f32(n, rng=rng), np.zeros(n, np.float32)
    device = _on_device(candidate, 2, 32, (x, np.float32(2), out), "x of length 37 on the GPU")
    if device is not None:
        expect_close(device[2], 2 * x, on="x of length 37 on the GPU", rtol=1e-6, atol=1e-6, what="out")


@exercise("6.1.3", hint="x runs along the columns and y along the rows; along each, how many blocks of "
                        "that many threads cover the matrix? Round up: the last block may be only partly used")
def _(candidate, rng):
    K = _kernels()
    cases = [((5, 7), (4, 4)), ((32, 32), (16, 16)), ((1, 1), (8, 8)), ((2, 33), (32, 4)), ((40, 8), (8, 8)),
             ((3, 20), (8, 2))]
    cases += [((int(rng.integers(1, 50)), int(rng.integers(1, 50))), (8, 4)) for _ in range(3)]
    for shape, block in cases:
        on = f"a matrix of shape {shape} (rows, columns), blocks of {block} threads (x, y)"
        got = _call(candidate, shape, block, on=on)
        try:
            grid = tuple(int(v) for v in got)
        except (TypeError, ValueError):
            raise CheckFailed(f"expected a pair of block counts (x, y), got {got!r} on {on}") from None
        expect(len(grid) == 2, f"expected a pair of block counts (x, y), got {len(grid)} numbers on {on}")
        expected = _grid2(shape, block)
        if grid == expected:
            continue
        if min(grid) < 1:
            raise CheckFailed(f"a grid of {grid} blocks has no blocks on {on}")
        out = np.zeros(shape, np.float32)
        report = _trace(_fill, grid, block, out, on=on + f", launched with your grid {grid}")
        _unwritten(report, "out", on + f", launched with your grid {grid}")
        raise CheckFailed(f"your grid {grid} covers every element, but {expected} is the smallest grid that "
                          f"does; the extra blocks have no element to work on, on {on}")


def _fill(out):
    col, row = cuda.grid(2)
    if row < out.shape[0] and col < out.shape[1]:
        out[row, col] = 1


def _grid2(shape, block):
    """The grid (x, y) that covers a (rows, cols) matrix with blocks (x, y), x along the columns."""
    return (-(-shape[1] // block[0]), -(-shape[0] // block[1]))


@exercise("6.1.4", kernel=True, hint="col, row = cuda.grid(2): x runs along the columns, y along the rows; a thread "
                        "whose (row, col) is outside the matrix along either axis must do nothing",
          forbid=["course.kernels.vector_add", "course.kernels.cpu.vector_add"],
          task="add the matrices one element per thread")
def _(candidate, rng):
    _refuse_library(candidate)
    cases = [((5, 7), (4, 4)), ((2, 9), (8, 2)), ((3, 3), (4, 4)), ((8, 8), (4, 4)), ((6, 2), (4, 4)),
             ((9, 2), (2, 8))]
    cases += [((int(rng.integers(1, 12)), int(rng.integers(1, 12))), (4, 4))]
    for shape, block in cases:
        a, b = _f32(*shape, rng=rng), _f32(*shape, rng=rng)
        out = np.zeros(shape, np.float32)
        grid = _grid2(shape, block)
        on = f"matrices of shape {shape}, a grid of {grid} blocks of {block} threads"
        _run(candidate, grid, block, (a, b, out), on, outputs=(2,))
        expect_close(out, a + b, on=on, rtol=1e-6, atol=1e-6, what="out")
    shape = (5, 7)
    a, b, out = _f32(*shape, rng=rng), _f32(*shape, rng=rng), np.zeros(shape, np.float32)
    device = _on_device(candidate, (2, 2), (4, 4), (a, b, out), "shape (5, 7) on the GPU")
    if device is not None:
        expect_close(device[2], a + b, on="shape (5, 7) on the GPU", rtol=1e-6, atol=1e-6, what="out")


@exercise("6.1.5", kernel=True, hint="there are fewer threads than elements: each thread starts at its own index and "
                        "steps forward by the number of threads in the whole grid until it passes the end")
def _(candidate, rng):
    _refuse_library(candidate)
    for n, blocks, threads in [(37, 1, 8), (100, 2, 16), (5, 1, 8), (64, 2, 32), (int(rng.integers(20, 90)), 3, 4)]:
        x = _f32(n, rng=rng)
        out = np.zeros(n, np.float32)
        alpha = np.float32(rng.choice([2.0, -1.5]))
        on = f"x of length {n}, alpha={alpha:g}, only {blocks} block(s) of {threads} threads"
        _run(candidate, blocks, threads, (x, alpha, out), on, outputs=(2,))
        expect_close(out, alpha * x, on=on, rtol=1e-6, atol=1e-6, what="out")


# ===== 6.2 shared memory and synchronisation ============================================================


@exercise("6.2.1", kernel=True, hint="every thread must have read its value before any thread overwrites it: keep the "
                        "value in a local variable and make all threads wait for each other in between")
def _(candidate, rng):
    _refuse_library(candidate)
    for n in [8, 5, 32, 1, int(rng.integers(2, 33))]:
        x = _f32(n, rng=rng)
        original = x.copy()
        on = f"x of length {n}, one block of {n} threads"
        _run(candidate, 1, n, (x,), on)  # x is read and written: the middle element may stay
        expect_close(x, original[::-1], on=on, rtol=0, atol=0, what="x after the kernel")


@exercise("6.2.2", kernel=True, hint="load one element per thread into shared memory (0 past the end), then halve: "
                        "at each step thread t adds slot t + step when t < step, and every thread waits "
                        "at a barrier before the next step reads those sums",
          forbid=["course.kernels.reduce_sum", "course.kernels.cpu.reduce_sum"],
          task="add up each block's elements in shared memory")
def _(candidate, rng):
    _refuse_library(candidate)
    for n in [32, 37, 5, 64, 100, int(rng.integers(1, 130))]:
        blocks = -(-n // TPB)
        x = (rng.integers(-8, 9, size=n)).astype(np.float32)  # whole numbers: sums exact in any order
        partial = np.zeros(blocks, np.float32)
        on = f"x of length {n}, {blocks} block(s) of {TPB} threads"
        _run(candidate, blocks, TPB, (x, partial), on, outputs=(1,))
        padded = np.zeros(blocks * TPB, np.float32)
        padded[:n] = x
        expect_close(partial, padded.reshape(blocks, TPB).sum(axis=1), on=on, rtol=0, atol=0,
                     what="partial (one sum per block)")


def _rms_norm_rows(x, weight, eps):
    x = x.astype(np.float64)
    return x / np.sqrt((x * x).mean(axis=1, keepdims=True) + eps) * weight


@exercise("6.2.3", kernel=True, hint="a block per row: each thread adds up x * x over the columns t, t + blockDim, ... "
                        "(rows can be longer than the block), the block combines those sums in shared "
                        "memory with barriers, and every thread then scales its own columns",
          forbid=["course.mamba.rms_norm"], task="normalise each row in your kernel")
def _(candidate, rng):
    _refuse_library(candidate)
    eps = np.float32(1e-5)
    cases = [(np.array([[3.0, 4.0]]), np.ones(2), "x=[[3, 4]], weight 1"),
             (np.array([[1.0, -1.0, 1.0, -1.0], [2.0, 0.0, 0.0, 0.0]]), np.array([1.0, 2.0, 3.0, 4.0]),
              "x=[[1, -1, 1, -1], [2, 0, 0, 0]], weight [1, 2, 3, 4]"),
             (np.full((1, 3), 1e-3), np.ones(3), "x=[[0.001, 0.001, 0.001]] (mean square 1e-6, below eps)"),
             (rng.standard_normal((3, 45)) * 3, rng.standard_normal(45), "random x of shape (3, 45) (more columns than threads)"),
             (rng.standard_normal((2, 7)), rng.standard_normal(7), "random x of shape (2, 7)")]
    for x, w, on in cases:
        x, w = x.astype(np.float32), w.astype(np.float32)
        out = np.zeros_like(x)
        on = f"{on}, one block of {TPB} threads per row"
        _run(candidate, x.shape[0], TPB, (x, w, eps, out), on, outputs=(3,))
        expect_close(out, _rms_norm_rows(x, w, 1e-5), on=on, rtol=1e-4, atol=1e-5, what="out")


WARP_BLOCK = 64  # threads per block in 6.2.4: two warps


@exercise("6.2.4", kernel=True, hint="each warp adds its 32 values with cuda.shfl_down_sync(0xFFFFFFFF, v, delta) for delta = "
                        "16, 8, 4, 2, 1 (every lane takes part in every shuffle, 0 past the end), then its lane 0 "
                        "adds the warp's sum into total[0] with cuda.atomic.add")
def _(candidate, rng):
    _refuse_library(candidate)
    for n in [64, 37, 100, 130, int(rng.integers(1, 200))]:
        blocks = -(-n // WARP_BLOCK)
        x = rng.integers(-8, 9, size=n).astype(np.float32)  # whole numbers: sums exact in any order
        total = np.zeros(1, np.float32)
        on = f"x of length {n}, {blocks} block(s) of {WARP_BLOCK} threads, total = [0] before the launch"
        report = _trace(candidate, blocks, WARP_BLOCK, x, total, on=on)
        _out_of_bounds(report, on)
        _barriers(report, on)
        _warps(report, on)
        if report.races:
            r = report.races[0]
            if r.array in _params(candidate)[1:2]:
                kinds = {r.first[2], r.second[2]}
                if "atomic" in kinds and "write" in kinds:  # total set (to 0, say) while others add into it
                    raise CheckFailed(f"{_thread(report, *r.first[:2])} and {_thread(report, *r.second[:2])} touch "
                                      f"{r.array}[0] at once on {on}, one of them with a plain write: does your "
                                      f"kernel set {r.array}[0] itself? It is [0] before the launch; only add into it")
                raise CheckFailed(f"{_thread(report, *r.first[:2])} and {_thread(report, *r.second[:2])} both "
                                  f"updated {r.array}[0] with a plain read and write, on {on}: when two warps do "
                                  f"that at once, one addition is lost. Use cuda.atomic.add")
            _races(report, on)
        _uninitialised_shared(report, on)
        expect(total[0] == x.sum(), f"expected total[0] = {x.sum():g}, got {total[0]:g} on {on}")
        adds = int(report.per_thread("global", "atomic").sum())
        warps = blocks * WARP_BLOCK // 32
        expect(adds <= warps, f"your kernel made {adds} atomic additions on {on}, where one per warp "
                                  f"({warps}) is enough: add up within the warp with shuffles first")
        shuffles = sum(count for name, count in report.warp_calls.items() if name.startswith("shfl"))
        expect(shuffles >= warps * 32, f"your kernel made {shuffles} warp shuffles on {on}: the exercise asks each "
                                       f"warp to add its values by passing them between its lanes, every lane "
                                       f"taking part, rather than one lane reading the others' values")


# ===== 6.3 matrix multiplication ===================================================================


def _matmul_cases(rng):
    # (m, k, n): awkward shapes, a single row, a single column, one multiple of the tile, and one
    # much taller than wide (there, a kernel that takes x for the row misses rows)
    return [(5, 3, 7), (1, 4, 1), (8, 8, 8), (3, 9, 2), (6, 1, 5), (10, 3, 2),
            (int(rng.integers(1, 10)), int(rng.integers(1, 10)), int(rng.integers(1, 10)))]


def _run_matmul(candidate, rng):
    """Run a learner's c = a @ bt.T kernel on each case and check c; yield each case's shape, its
    description and the tracer's report."""
    _refuse_library(candidate)
    for m, k, n in _matmul_cases(rng):
        a, bt = _f32(m, k, rng=rng), _f32(n, k, rng=rng)
        c = np.zeros((m, n), np.float32)
        grid = _grid2((m, n), (TILE, TILE))
        on = f"a of shape {(m, k)}, bt of shape {(n, k)}, a grid of {grid} blocks of {(TILE, TILE)} threads"
        report = _run(candidate, grid, (TILE, TILE), (a, bt, c), on, outputs=(2,))
        expect_close(c, a.astype(np.float64) @ bt.T.astype(np.float64), on=on, rtol=1e-4, atol=1e-5, what="c")
        yield (m, k, n), on, report


@exercise("6.3.1", kernel=True, hint="bt holds B transposed: a column of B is a row of bt. Which element of bt is B[k, col]? "
                        "And the guard must cover both axes of c",
          forbid=["course.kernels.matmul", "course.kernels.cpu.matmul", "course.kernels.cpu.matmul_bt",
                  "course.kernels.cpu.matmul_at"],
          task="compute one element of c per thread")
def _(candidate, rng):
    for _ in _run_matmul(candidate, rng):
        pass


def _tiled_reads(m, k, n, tile):
    """Global reads of a (m, k) @ (k, n) tiled product with tile x tile blocks, x along the columns.

    Every block loads each of its tiles once, one element per thread, and only the elements
    inside the matrices: a block column reads all of A once, a block row all of B once."""
    return -(-n // tile) * m * k + -(-m // tile) * k * n


@exercise("6.3.2", kernel=True, hint="each thread stores one element of each tile, at its own [ty, tx]: the one the "
                        "compute loop expects there for this step (tile_b[j, tx] stands for B[start + j, col]); "
                        "0 where that element lies outside the matrix",
          forbid=["course.kernels.matmul", "course.kernels.cpu.matmul", "course.kernels.cpu.matmul_bt",
                  "course.kernels.cpu.matmul_at"],
          task="compute c from tiles in shared memory")
def _(candidate, rng):
    for (m, k, n), on, report in _run_matmul(candidate, rng):
        names = _params(candidate)[:2]
        reads = sum(1 for name in names for _, acc in report.accesses(name) if acc.kind == "read")
        expected = _tiled_reads(m, k, n, TILE)
        if reads <= expected:
            continue
        per_thread = {}  # reads of each array by each thread in each phase: 1 in a tile load
        for name in names:
            for _, acc in report.accesses(name):
                key = (name, acc.block, acc.phase, acc.thread)
                per_thread[key] = per_thread.get(key, 0) + 1
        seen = {}
        for name in names:  # two threads of a block each loading one element, the same one: clamping
            for index, acc in report.accesses(name):
                key = (name, acc.block, acc.phase, index)
                if (acc.kind == "read" and key in seen and seen[key] != acc.thread
                        and per_thread[(name, acc.block, acc.phase, acc.thread)] == 1
                        and per_thread[(name, acc.block, acc.phase, seen[key])] == 1):
                    raise CheckFailed(
                        f"your kernel read {names[0]} and {names[1]} {reads} times from global memory, where "
                        f"loading each tile element once takes {expected}, on {on}: "
                        f"{_thread(report, acc.block, seen[key])} and {_thread(report, acc.block, acc.thread)} "
                        f"both read {name}[{', '.join(map(str, index))}] for one tile. A thread whose element "
                        f"lies outside the matrix should store 0 without reading anything (a clamped index "
                        f"reads a real element once more)")
                seen.setdefault(key, acc.thread)
        raise CheckFailed(f"your kernel read {names[0]} and {names[1]} {reads} times from global memory, where "
                          f"loading each tile element once takes {expected}, on {on}: read them only in the "
                          f"tile load, and compute from the tiles")


@exercise("6.3.3", hint="each block loads its tiles one element per thread, only the elements inside the "
                        "matrices: every block in a column of blocks reads all of its rows of A; how many "
                        "block columns are there? And the same for B with the block rows")
def _(candidate, rng):
    cases = [(8, 8, 8, 4), (5, 3, 7, 4), (16, 16, 16, 8), (1, 1, 1, 4), (3, 10, 2, 2), (64, 32, 48, 16)]
    cases += [tuple(int(v) for v in rng.integers(1, 40, size=3)) + (int(rng.choice([2, 4, 8])),) for _ in range(3)]
    for m, k, n, tile in cases:
        on = f"a of shape {(m, k)}, b of shape {(k, n)}, tile={tile}"
        got = _call(candidate, m, k, n, tile, on=on)
        expected = _tiled_reads(m, k, n, tile)
        try:
            value = float(got)
        except (TypeError, ValueError):
            raise CheckFailed(f"expected a number of reads, got {got!r} on {on}") from None
        if value == 2 * m * k * n != expected:
            raise CheckFailed(f"{int(value)} is the number of reads of the naive kernel, on {on}")
        expect(value == expected, f"expected {expected} reads, got {got!r} on {on}")


T32, ROWS = 32, 8  # 6.3.5: 32 x 32 tiles, blocks of 32 x 8 threads
T33 = T32 + 1  # the padded tile's width: a shared array's shape must be constants, not an expression


def _transpose_reference(x, out):
    """The transpose of lesson 6.3 through a padded tile, with guards for any shape: the figures a
    learner's kernel is held to."""
    tile = cuda.shared.array((T32, T33), np.float32)
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


@functools.lru_cache(maxsize=None)
def _transpose_transactions(m, n):
    """The global-memory transactions of the reference transpose of an (m, n) matrix. They depend on
    the shape alone (the tracer counts sectors from the start of each array), so each shape is
    traced once."""
    grid = (-(-n // T32), -(-m // T32))
    x, out = np.zeros((m, n), np.float32), np.zeros((n, m), np.float32)
    return _trace(_transpose_reference, grid, (T32, ROWS), x, out, on=f"x of shape {(m, n)}").transactions()


@exercise("6.3.5", kernel=True, hint="load the block's 32 x 32 tile of x row by row (thread x along the columns of x), "
                        "then write out row by row (thread x along the columns of out) from a column of the "
                        "tile; give the tile 33 columns, and guard both loops against the matrix's edges")
def _(candidate, rng):
    _refuse_library(candidate)
    cases = [(40, 33), (5, 70), (int(rng.integers(1, 40)), int(rng.integers(1, 40)))]  # edges on both axes
    for m, n in cases:
        x = _f32(m, n, rng=rng)
        out = np.zeros((n, m), np.float32)
        grid = (-(-n // T32), -(-m // T32))
        on = f"x of shape {(m, n)}, a grid of {grid} blocks of {(T32, ROWS)} threads"
        report = _run(candidate, grid, (T32, ROWS), (x, out), on, outputs=(1,))
        expect_close(out, x.T, on=on, rtol=0, atol=0, what="out")
        conflicts = report.bank_conflicts()
        expect(conflicts == 0, f"the warps' accesses to your shared tile had {conflicts} bank conflicts on {on}: "
                               f"a column of a tile 32 floats wide lies in one bank; one more column spreads it")
        got, best = report.transactions(), _transpose_transactions(m, n)
        expect(got <= best, f"your kernel's warps needed {got} transactions of 32 bytes where {best} suffice, on "
                            f"{on}: neighbouring threads (threadIdx.x) should read neighbouring numbers of x and "
                            f"write neighbouring numbers of out")


# 6.3.6: the 2-D register-blocked kernel of section 9, with the tiles the exercise cell defines
BM, BN, BK, TM, TN = 16, 16, 4, 4, 4
REGISTER_BLOCK = (BN // TN, BM // TM)  # 4 x 4 threads, each a 4 x 4 block of C


@exercise("6.3.6", kernel=True, hint="for each p of the tile, copy the thread's TM numbers of row p of tile_a (A's tile is "
                        "transposed) into a_reg and its TN numbers of row p of tile_b into b_reg, at the rows and "
                        "columns the final write uses; then every acc[i, j] gains a_reg[i] * b_reg[j]",
          forbid=["course.kernels.matmul", "course.kernels.cpu.matmul"],
          task="multiply from registers")
def _(candidate, rng):
    _refuse_library(candidate)
    cases = [(5, 3, 7), (16, 4, 16), (17, 9, 20), (1, 1, 1), (33, 6, 18),
             (int(rng.integers(1, 40)), int(rng.integers(1, 12)), int(rng.integers(1, 40)))]
    for m, k, n in cases:
        a, b = _f32(m, k, rng=rng), _f32(k, n, rng=rng)
        c = np.zeros((m, n), np.float32)
        grid = (-(-n // BN), -(-m // BM))
        on = f"a of shape {(m, k)}, b of shape {(k, n)}, a grid of {grid} blocks of {REGISTER_BLOCK} threads"
        report = _run(candidate, grid, REGISTER_BLOCK, (a, b, c), on, outputs=(2,))
        expect_close(c, a.astype(np.float64) @ b.astype(np.float64), on=on, rtol=1e-4, atol=1e-5, what="c")
        allowed = -(-k // BK) * BK * (TM + TN)  # per tile and p: a column of A's tile and a row of B's, once
        reads = int(report.per_thread("shared", "read").max())
        expect(reads <= allowed, f"a thread of your kernel read shared memory {reads} times, where reading each "
                                 f"number it needs once takes {allowed}, on {on}: each number read from a tile "
                                 f"should serve several multiply-adds from a register")


def _scan_reference(u, delta, A, B, C, D):
    """mamba-minimal's selective scan, step by step in float64."""
    b, l, d = u.shape
    h = np.zeros((b, d, A.shape[1]))
    y = np.zeros((b, l, d))
    for t in range(l):
        dt = delta[:, t, :, None].astype(np.float64)
        h = np.exp(dt * A) * h + dt * B[:, t, None, :] * u[:, t, :, None]
        y[:, t] = (h * C[:, t, None, :]).sum(-1) + D * u[:, t]
    return y


@exercise("6.3.4", kernel=True, hint="thread i = cuda.grid(1) owns sequence i // d_in, channel i % d_in (guard i < b * d_in); "
                        "it keeps its n state numbers in cuda.local.array and walks forward in time: "
                        "h = exp(delta A) h + delta B u, then y = <C, h> + D u",
          forbid=["course.kernels.selective_scan", "course.kernels.cpu.selective_scan", "course.mamba.selective_scan"],
          task="run the recurrence of one (sequence, channel) per thread")
def _(candidate, rng):
    _refuse_library(candidate)
    # b * d_in of 48 and 74: two and three blocks, the last one partly used
    cases = [(1, 1, 1, 1), (2, 5, 3, 4), (1, 7, 5, 2), (3, 4, 2, 16), (3, 2, 16, 2), (2, 2, 37, 3)]
    cases += [tuple(int(v) for v in rng.integers(1, 6, size=4))]
    for b, l, d, n in cases:
        u = _f32(b, l, d, rng=rng)
        delta = (0.05 + 0.5 * rng.random((b, l, d))).astype(np.float32)
        A = (-np.tile(np.arange(1, n + 1), (d, 1)) * (0.5 + rng.random((d, 1)))).astype(np.float32)
        B, C = _f32(b, l, n, rng=rng), _f32(b, l, n, rng=rng)
        D = _f32(d, rng=rng)
        y = np.zeros((b, l, d), np.float32)
        blocks = -(-(b * d) // TPB)
        on = f"b={b}, l={l}, d_in={d}, n={n}, {blocks} block(s) of {TPB} threads"
        _run(candidate, blocks, TPB, (u, delta, A, B, C, D, y), on, outputs=(6,))
        expect(not np.isnan(y).any(), f"y has nan on {on}: a cuda.local.array starts with garbage on a GPU (the "
                                      f"tracer fills it with nan), so write each slot before the first read")
        expect_close(y, _scan_reference(u, delta, A, B, C, D), on=on, rtol=1e-4, atol=1e-5, what="y")


# ===== 6.4 kernels in the engine ===================================================================


def _softmax_backward_reference(s, g):
    s, g = s.astype(np.float64), g.astype(np.float64)
    return s * (g - (g * s).sum(axis=1, keepdims=True))


@exercise("6.4.1", kernel=True, hint="dx = s * (g - <g, s>) row by row: the block first adds up g * s over its row (each "
                        "thread its columns t, t + blockDim, ..., then a tree in shared memory with barriers), "
                        "then every thread writes its own columns of dx",
          forbid=["course.kernels.softmax_backward", "course.kernels.cpu.softmax_backward"],
          task="compute dx with one block per row")
def _(candidate, rng):
    _refuse_library(candidate)
    cases = [(np.array([[0.2, 0.3, 0.5]]), np.array([[1.0, 0.0, 0.0]]), "s=[[0.2, 0.3, 0.5]], g=[[1, 0, 0]]"),
             (np.array([[0.5, 0.5], [0.1, 0.9]]), np.array([[1.0, 1.0], [2.0, -1.0]]),
              "s=[[0.5, 0.5], [0.1, 0.9]], g=[[1, 1], [2, -1]] (a constant g gives dx = 0)")]
    for shape in [(3, 45), (2, 7), (4, 1)]:
        z = rng.standard_normal(shape) * 2
        s = np.exp(z - z.max(axis=1, keepdims=True))
        cases.append((s / s.sum(axis=1, keepdims=True), rng.standard_normal(shape), f"random rows of shape {shape}"))
    for s, g, on in cases:
        s, g = s.astype(np.float32), g.astype(np.float32)
        dx = np.zeros_like(s)
        on = f"{on}, one block of {TPB} threads per row"
        _run(candidate, s.shape[0], TPB, (s, g, dx), on, outputs=(2,))
        expect_close(dx, _softmax_backward_reference(s, g), on=on, rtol=1e-4, atol=1e-6, what="dx")


class _WatchedKernel:
    """Stands in for a kernel the learner launches: each launch `k[grid, block](*args)` runs on the
    tracer (which follows every thread), and is remembered, so the check can say what went wrong."""

    def __init__(self, fn, name, output):
        self.py_func, self.__name__, self.output = fn, name, output
        self.launches = []

    def __getitem__(self, config):
        if not (isinstance(config, tuple) and len(config) == 2):
            raise CheckFailed(f"launch {self.__name__} as {self.__name__}[blocks, threads_per_block](...)")
        grid, block = config

        def launch(*args):
            K = _kernels()
            host = []
            for a in args:
                if hasattr(a, "copy_to_host") and not isinstance(a, np.ndarray):
                    raise CheckFailed(f"pass NumPy arrays to {self.__name__} (numba copies them to the GPU and "
                                      f"back); the check follows what each thread does with them")
                host.append(a)
            try:
                report = _trace(self.py_func, grid, block, *host)
            except CheckFailed as err:
                raise CheckFailed(f"{self.__name__} could not be launched: {err}") from None
            self.launches.append((grid, block))
            on = f"your launch {self.__name__}[{grid}, {block}] on an array of shape {np.shape(host[0])}"
            _out_of_bounds(report, on)
            _unwritten(report, self.output, on)

        return launch


def _relu_forward(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = x[i] if x[i] > 0 else 0


def _relu_backward(x, g, dx):
    i = cuda.grid(1)
    if i < x.size:
        dx[i] = g[i] if x[i] > 0 else 0


@exercise("6.4.2", hint="launch forward_kernel on x.data into a new output array, and give operation(...) a "
                        "backward(g) that launches backward_kernel into a new gradient array and returns it; "
                        "enough blocks for every element")
def _(candidate, rng):
    from ..tensor import Tensor
    _kernels()
    cases = [(np.array([-1.0, 2.0, 0.5, -3.0]), "x=[-1, 2, 0.5, -3]"),
             (rng.standard_normal(37), "random x of length 37"),
             (rng.standard_normal(100), "random x of length 100")]
    for data, on in cases:
        data = data.astype(np.float32)
        forward = _WatchedKernel(_relu_forward, "forward_kernel", "out")
        backward = _WatchedKernel(_relu_backward, "backward_kernel", "dx")
        x = Tensor(data.copy(), requires_grad=True)
        y = _call(candidate, x, forward, backward, on=on)
        if not isinstance(y, Tensor):
            raise CheckFailed(f"expected a Tensor (made with operation(...)), got {type(y).__name__} on {on}")
        expect(y.op == "kernel_relu", f"the result's operation is named {y.op!r}, expected 'kernel_relu' on {on}")
        expect(forward.launches, f"your function never launched forward_kernel on {on}")
        expect(np.asarray(y.data).dtype == data.dtype,
               f"the result is {np.asarray(y.data).dtype} for a {data.dtype} x on {on}: make the output array in "
               f"x's dtype")
        expect_close(y.data, np.maximum(data, 0), on=on, rtol=0, atol=0, what="forward result")
        g = rng.standard_normal(data.shape).astype(np.float32)
        try:
            y.backward(g)
        except CheckFailed:
            raise
        except Exception as err:
            raise CheckFailed(f"y.backward(g) raised {type(err).__name__}: {err} on {on}") from None
        expect(backward.launches, f"the backward never launched backward_kernel on {on}")
        expect(x.grad is not None, f"x.grad is None after y.backward(g) on {on}: pass x among the inputs of operation")
        expect(np.asarray(x.grad).dtype == data.dtype,
               f"x.grad is {np.asarray(x.grad).dtype} for a {data.dtype} x on {on}: make the gradient array in "
               f"x's dtype")
        expect_close(x.grad, np.where(data > 0, g, 0), on=on, rtol=0, atol=0, what="x.grad")


class _CountingMatmul:
    """The matmul the learner is handed: a product of two matrices that says when shapes do not fit."""

    def __init__(self):
        self.calls = 0

    def __call__(self, a, b):
        a, b = np.asarray(a), np.asarray(b)
        self.calls += 1
        if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
            raise CheckFailed(f"matmul got shapes {a.shape} and {b.shape}, which do not fit: the inner "
                              f"dimensions must be equal (a transpose missing, or the order swapped?)")
        return a @ b


@exercise("6.4.3", hint="da must have a's shape and db b's shape: which product of g with b (or a), "
                        "transposed or not, has that shape? Make both with the matmul you are given")
def _(candidate, rng):
    for m, k, n in [(2, 3, 4), (1, 5, 1), (3, 3, 3), (4, 1, 2)]:
        a, b, g = rng.standard_normal((m, k)), rng.standard_normal((k, n)), rng.standard_normal((m, n))
        on = f"a of shape {(m, k)}, b of shape {(k, n)}, g of shape {(m, n)}"
        mm = _CountingMatmul()
        got = _call(candidate, a.copy(), b.copy(), g.copy(), mm, on=on)
        if not (isinstance(got, (tuple, list)) and len(got) == 2):
            raise CheckFailed(f"expected a pair (da, db), got {type(got).__name__} on {on}")
        expect_close(got[0], g @ b.T, on=on, rtol=1e-10, atol=1e-12, what="da")
        expect_close(got[1], a.T @ g, on=on, rtol=1e-10, atol=1e-12, what="db")
        expect(mm.calls >= 2, f"make both products with the matmul you are given (it ran {mm.calls} time(s)) "
                              f"on {on}: that is what puts the backward on the kernels")


from . import part6_fusion  # noqa: E402,F401  (the checks of lesson 6.5: importing registers them)
from . import part6_device  # noqa: E402,F401  (the checks of lesson 6.6)
