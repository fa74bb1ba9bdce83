"""Watching the threads of a kernel: which thread read and wrote which element, and when.

    report = trace(vector_add_kernel, 2, 32, a, b, out)   # <<<2 blocks, 32 threads>>>
    print(report.summary())      # races, out-of-bounds accesses, elements never written
    report.draw("out")           # each element coloured by the thread that wrote it

`trace` runs a kernel written for `numba.cuda` on the CPU, in plain Python: it calls the
kernel's Python function (`kernel.py_func`) with the name `cuda` pointing at a stand-in that
knows which thread is running (threadIdx, blockIdx, blockDim, gridDim, grid, shared.array,
syncthreads, atomic; a float `local.array` starts as nan, where a GPU leaves garbage). Every
array argument is wrapped in a `TracedArray`, whose [] records the thread, the element, read or
write, and the *phase*: how many `syncthreads()` barriers that thread has passed. The threads of a block take turns, each running until its next barrier, so a run is
the same every time.

From the records the report finds two classic bugs:
- a data race: two threads of one block touch the same element in the same phase (no barrier
  between them), at least one writing; or two blocks touch the same global element, at least one
  writing (blocks never wait for each other). Atomic updates do not race with each other.
- an out-of-bounds access: an index outside the array (a missing `if i < n:`). On a GPU that
  reads garbage or crashes; here it is recorded, the write dropped and the read returns 0.

It is slow (Python, one OS thread per CUDA thread): meant for grids of tens to hundreds of threads.
"""

import re
import sys
import threading
import types
from collections import namedtuple
from dataclasses import dataclass, field

import numpy as np

from .launch import check_launch, kernel_name

Dim3 = namedtuple("Dim3", "x y z")
MAX_TRACED_THREADS = 1 << 14


def _where(dims, value):
    """A thread or block index as the learner wrote the launch: 3, or (1, 2)."""
    v = tuple(value[:len(dims)])
    return v[0] if len(v) == 1 else v


@dataclass(frozen=True)
class Access:
    block: tuple  # blockIdx (x, y, z)
    thread: tuple  # threadIdx (x, y, z)
    phase: int  # barriers this thread had passed
    kind: str  # "read", "write" or "atomic"


@dataclass(frozen=True)
class Race:
    array: str
    index: tuple
    phase: object  # the phase of both accesses, or None for two different blocks
    first: tuple  # (block, thread, kind)
    second: tuple
    report: object = field(default=None, repr=False, compare=False)

    def __str__(self):
        (b1, t1, k1), (b2, t2, k2) = self.first, self.second
        d = self.report
        who1 = d.describe(b1, t1) if d else f"thread {t1} of block {b1}"
        who2 = d.describe(b2, t2) if d else f"thread {t2} of block {b2}"
        where = (f"in phase {self.phase} (after {self.phase} syncthreads)" if self.phase is not None
                 else "with no barrier between blocks")
        return (f"race on {self.array}{list(self.index)} {where}: {who1} {_verb(k1)} it and "
                f"{who2} {_verb(k2)} it")


@dataclass(frozen=True)
class OutOfBounds:
    array: str
    index: tuple
    shape: tuple
    block: tuple
    thread: tuple
    kind: str
    report: object = field(default=None, repr=False, compare=False)

    def __str__(self):
        who = self.report.describe(self.block, self.thread) if self.report else f"thread {self.thread}"
        return (f"out of bounds: {who} {_verb(self.kind)} {self.array}{list(self.index)}, but "
                f"{self.array} has shape {self.shape} (a missing guard such as `if i < n:`?)")


def _verb(kind):
    return {"read": "reads", "write": "writes", "atomic": "atomically updates"}[kind]


class TracedArray:
    """A NumPy array as a kernel sees it: every element read or written is recorded."""

    def __init__(self, data, name, tracer, prefix=()):
        self._data, self.name, self._tracer, self._prefix = data, name, tracer, prefix

    shape = property(lambda self: self._data.shape[len(self._prefix):])
    ndim = property(lambda self: self._data.ndim - len(self._prefix))
    size = property(lambda self: int(np.prod(self.shape)))
    dtype = property(lambda self: self._data.dtype)

    def __len__(self):
        return self.shape[0]

    def __repr__(self):
        return f"TracedArray({self.name}, shape={self.shape}, dtype={self.dtype})"

    def _index(self, key):
        key = key if isinstance(key, tuple) else (key,)
        for k in key:
            if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)):
                raise TypeError(f"the tracer follows single elements, x[i] or x[i, j]; {self.name} was "
                                f"indexed with {key!r}")
        if len(key) > self.ndim:
            raise IndexError(f"{self.name} has {self.ndim} axes but was indexed with {len(key)} indices")
        return self._prefix + tuple(int(k) for k in key)

    def _inside(self, index):
        return all(0 <= i < n for i, n in zip(index, self._data.shape))

    def __getitem__(self, key):
        index = self._index(key)
        if len(index) < self._data.ndim:  # a row: x[i] of a matrix, indexed again later
            if not self._inside(index):
                self._tracer._out_of_bounds(self, index, "read")
            return TracedArray(self._data, self.name, self._tracer, index)
        if not self._inside(index):
            self._tracer._out_of_bounds(self, index, "read")
            return self._data.dtype.type(0)
        self._tracer._record(self.name, index, "read")
        return self._data[index]

    def __setitem__(self, key, value):
        index = self._index(key)
        if len(index) < self._data.ndim:
            raise TypeError(f"the tracer follows single elements: {self.name}[{key!r}] = ... sets a whole row")
        if not self._inside(index):
            self._tracer._out_of_bounds(self, index, "write")
            return
        self._tracer._record(self.name, index, "write")
        self._data[index] = value

    def _atomic(self, key, update):
        index = self._index(key)
        if not self._inside(index):
            self._tracer._out_of_bounds(self, index, "atomic")
            return self._data.dtype.type(0)
        self._tracer._record(self.name, index, "atomic")
        old = self._data[index]
        self._data[index] = update(old)
        return old


class _Abort(BaseException):
    """Unwinds the other threads of a block when one of them fails."""


class _Thread:
    def __init__(self, block, thread, linear):
        self.block, self.thread, self.linear = block, thread, linear
        self.phase = 0
        self.turn = threading.Semaphore(0)
        self.done = False
        self.error = None
        self.shared_calls = 0


class _Namespace:
    def __init__(self, **members):
        self.__dict__.update(members)


def _numpy_dtype(dtype):
    try:
        return np.dtype(dtype)
    except TypeError:
        from numba.np.numpy_support import as_dtype
        return as_dtype(dtype)


def _local_array(shape, dtype):
    """A thread's cuda.local.array. On a GPU it starts with whatever the registers held: here a
    float array starts as nan, so that a kernel that reads a slot before writing it shows nan."""
    dtype = _numpy_dtype(dtype)
    return np.full(shape, np.nan, dtype) if np.issubdtype(dtype, np.floating) else np.zeros(shape, dtype)


class _FakeCuda:
    """What `cuda.` means inside a traced kernel: the running thread's view of the launch."""

    warpsize = 32

    def __init__(self, tracer):
        self._t = tracer
        self.shared = _Namespace(array=tracer._shared_array)
        self.local = _Namespace(array=_local_array)
        self.const = _Namespace(array_like=lambda a: np.asarray(a._data if isinstance(a, TracedArray) else a))
        self.atomic = _Namespace(
            add=lambda a, i, v: a._atomic(i, lambda old: old + v),
            sub=lambda a, i, v: a._atomic(i, lambda old: old - v),
            max=lambda a, i, v: a._atomic(i, lambda old: max(old, v)),
            min=lambda a, i, v: a._atomic(i, lambda old: min(old, v)),
            exch=lambda a, i, v: a._atomic(i, lambda old: v),
        )

    threadIdx = property(lambda self: Dim3(*self._t._local.thread.thread))
    blockIdx = property(lambda self: Dim3(*self._t._local.thread.block))
    blockDim = property(lambda self: Dim3(*self._t.block))
    gridDim = property(lambda self: Dim3(*self._t.grid))
    laneid = property(lambda self: self._t._local.thread.linear % 32)

    def grid(self, ndim):
        th, bd = self._t._local.thread, self._t.block
        ids = [th.block[a] * bd[a] + th.thread[a] for a in range(ndim)]
        return ids[0] if ndim == 1 else tuple(ids)

    def gridsize(self, ndim):
        sizes = [self._t.grid[a] * self._t.block[a] for a in range(ndim)]
        return sizes[0] if ndim == 1 else tuple(sizes)

    def syncthreads(self):
        self._t._barrier()

    def __getattr__(self, name):
        raise AttributeError(f"the tracer does not provide cuda.{name}")


def _kernel_function(kernel):
    """The plain Python function behind a @cuda.jit kernel (or the function itself)."""
    fn = getattr(kernel, "py_func", None) or getattr(kernel, "fn", None) or kernel
    if not isinstance(fn, types.FunctionType):
        raise TypeError(f"trace: {kernel!r} is not a kernel written in Python (a @cuda.jit function)")
    return fn


class _Tracer:
    def __init__(self, grid, block):
        self.grid = grid + (1,) * (3 - len(grid))
        self.block = block + (1,) * (3 - len(block))
        self.dims = (grid, block)
        self._local = threading.local()
        self._yielded = threading.Semaphore(0)
        self._aborting = False
        self.records = {}  # array name -> list of (index, Access)
        self.out_of_bounds = []
        self._shared = {}  # (block, k) -> the k-th shared array of that block
        self.shared_names = {}
        self.fake = _FakeCuda(self)
        self._functions = {}

    # ----- what the kernel's code calls -------------------------------------------------------
    def _record(self, name, index, kind):
        th = self._local.thread
        self.records.setdefault(name, []).append((index, Access(th.block, th.thread, th.phase, kind)))

    def _out_of_bounds(self, array, index, kind):
        th = self._local.thread
        self.out_of_bounds.append((array.name, index, array._data.shape, th.block, th.thread, kind))

    def _shared_array(self, shape, dtype):
        th = self._local.thread
        key = (th.block, th.shared_calls)
        th.shared_calls += 1
        if key not in self._shared:
            name = self._shared_name(key[1], sys._getframe(1))
            data = np.zeros(shape, _numpy_dtype(dtype))
            self._shared[key] = TracedArray(data, name, self)
        return self._shared[key]

    def _shared_name(self, k, frame):
        if k in self.shared_names:
            return self.shared_names[k]
        import linecache
        line = linecache.getline(frame.f_code.co_filename, frame.f_lineno)
        found = re.match(r"\s*(\w+)\s*=\s*\w+\.shared\.array", line)
        name = found.group(1) if found else f"shared{k}"
        if name in self.shared_names.values() or name in self.records:
            name = f"{name}#{k}"
        self.shared_names[k] = name
        return name

    def _barrier(self):
        th = self._local.thread
        if self._aborting:  # another thread failed: nobody will hand out turns any more
            raise _Abort
        th.phase += 1
        self._yielded.release()  # hand the turn back to the scheduler ...
        th.turn.acquire()  # ... and wait for the next one
        if self._aborting:
            raise _Abort

    # ----- running the grid ---------------------------------------------------------------------
    def function(self, fn):
        """`fn` with `cuda` (and the kernels and device functions it calls) swapped for tracing ones."""
        if id(fn) in self._functions:
            return self._functions[id(fn)]
        cuda_modules = {id(m) for name, m in sys.modules.items() if name == "numba.cuda"}
        glb = dict(fn.__globals__)
        new = types.FunctionType(fn.__code__, glb, fn.__name__, fn.__defaults__, fn.__closure__)
        self._functions[id(fn)] = new
        for name, value in fn.__globals__.items():
            if id(value) in cuda_modules or type(value).__name__ == "FakeCUDAModule":
                glb[name] = self.fake
            elif type(value).__module__.startswith("numba.core.types") and hasattr(value, "bitwidth"):
                glb[name] = _numpy_dtype(value).type  # float32(0) gives a NumPy float32
            elif name in fn.__code__.co_names and hasattr(value, "py_func") and value is not fn:
                glb[name] = self.function(_kernel_function(value))  # a device function it calls
        return new

    def run(self, fn, args):
        names = fn.__code__.co_varnames[:fn.__code__.co_argcount]
        wrapped = []
        for name, a in zip(names, args):
            if hasattr(a, "copy_to_host") and not isinstance(a, np.ndarray):
                raise TypeError(f"trace: pass NumPy arrays (argument {name} is a device array)")
            wrapped.append(TracedArray(a, name, self) if isinstance(a, np.ndarray) and a.ndim > 0 else a)
        fn = self.function(fn)
        for block in np.ndindex(*self.grid[::-1]):
            self._run_block(fn, wrapped, block[::-1])

    def _run_block(self, fn, args, block):
        threads = []
        for linear, idx in enumerate(np.ndindex(*self.block[::-1])):
            threads.append(_Thread(tuple(block), idx[::-1], linear))

        def body(th):
            th.turn.acquire()
            self._local.thread = th
            try:
                fn(*args)
            except _Abort:
                pass
            except BaseException as err:  # reported by the scheduler, naming the thread
                th.error = err
            th.done = True
            self._yielded.release()

        workers = [threading.Thread(target=body, args=(th,), daemon=True) for th in threads]
        for w in workers:
            w.start()
        live = threads
        try:
            while live:  # one round per phase: each thread runs to its next barrier, in turn
                for th in live:
                    th.turn.release()
                    self._yielded.acquire()
                    if th.error is not None:
                        raise RuntimeError(f"trace: {self.describe(th.block, th.thread)} raised "
                                           f"{type(th.error).__name__}: {th.error}") from th.error
                live = [th for th in live if not th.done]
        finally:
            if live:  # unwind the threads still waiting at a barrier
                self._aborting = True
                for th in live:
                    if not th.done:
                        th.turn.release()
            for w in workers:
                w.join()
            self._aborting = False

    def describe(self, block, thread):
        grid, blk = self.dims
        b, t = _where(grid, block), _where(blk, thread)
        return f"thread {t} of block {b}" if self.grid != (1, 1, 1) else f"thread {t}"


class TraceReport:
    """What `trace` saw. Arrays are named by the kernel's parameter names (shared arrays by the
    variable they were assigned to); any method taking `array` accepts that name, the position
    of the argument, or the NumPy array passed."""

    def __init__(self, tracer, args, names):
        self._t = tracer
        self.grid, self.block = tracer.dims
        self._args = args
        self._arg_names = names
        self.arrays = {}
        for name, a in zip(names, args):
            if isinstance(a, np.ndarray) and a.ndim > 0:
                self.arrays[name] = a
        for key, traced in tracer._shared.items():
            if key[0] == (0, 0, 0):
                self.arrays.setdefault(traced.name, traced._data)
        self.out_of_bounds = [OutOfBounds(*o, report=self) for o in tracer.out_of_bounds]
        self.races = self._find_races()

    def describe(self, block, thread):
        """A thread in words: "thread 3 of block 1" (indices as the launch gave them)."""
        return self._t.describe(block, thread)

    @property
    def shared_arrays(self):
        """The names of the shared-memory arrays the kernel made (one copy per block)."""
        return sorted(set(self._t.shared_names.values()))

    def _name(self, array):
        if isinstance(array, str):
            if array not in self.arrays:
                raise KeyError(f"trace: no array named {array!r}; the traced ones are {', '.join(self.arrays)}")
            return array
        if isinstance(array, (int, np.integer)):
            return self._arg_names[array]
        for name, a in self.arrays.items():
            if a is array:
                return name
        raise KeyError("trace: that array was not passed to the kernel; name it by its parameter name")

    def accesses(self, array):
        """Every recorded access to `array`: a list of (index, Access), in the order they happened."""
        return list(self._t.records.get(self._name(array), []))

    def _find_races(self):
        races = []
        shared = set(self._t.shared_names.values())
        for name, records in self._t.records.items():
            by_element = {}
            for index, acc in records:
                by_element.setdefault((acc.block if name in shared else None, index), []).append(acc)
            for (_, index), accs in by_element.items():
                found = _conflict(accs, across_blocks=name not in shared)
                if found:
                    a, b, phase = found
                    races.append(Race(name, index, phase, (a.block, a.thread, a.kind),
                                      (b.block, b.thread, b.kind), report=self))
        return races

    def touched_by(self, array, kind="write", phase=None):
        """For each element, which thread touched it (`kind` "write", "read" or "any"), as a number
        block * threads_per_block + thread; -1 where none did and -2 where several threads did."""
        name = self._name(array)
        shape = self.arrays[name].shape
        owner = np.full(shape, -1, dtype=np.int64)
        per_block = int(np.prod(self._t.block))
        gx, gy, _ = self._t.grid
        bx, by, _ = self._t.block
        for index, acc in self._t.records.get(name, []):
            if kind != "any" and (acc.kind == "read") != (kind == "read"):
                continue
            if phase is not None and acc.phase != phase:
                continue
            b = acc.block[0] + gx * (acc.block[1] + gy * acc.block[2])
            t = acc.thread[0] + bx * (acc.thread[1] + by * acc.thread[2])
            who = b * per_block + t
            owner[index] = who if owner[index] in (-1, who) else -2
        return owner

    def counts(self, array, kind="read"):
        """How many times each element was accessed (`kind` "read", "write" or "any"): an integer array."""
        name = self._name(array)
        if kind not in ("write", "read", "any"):
            raise ValueError(f"counts: kind={kind!r}; the known ones are 'write', 'read', 'any'")
        total = np.zeros(self.arrays[name].shape, dtype=np.int64)
        for index, acc in self._t.records.get(name, []):
            if kind == "any" or (acc.kind == "read") == (kind == "read"):
                total[index] += 1
        return total

    def unwritten(self, array):
        """A boolean array: True for each element that no thread wrote."""
        return self.touched_by(array, "write") == -1

    def phases(self):
        """How many phases (stretches between barriers) the threads went through."""
        return 1 + max((acc.phase for recs in self._t.records.values() for _, acc in recs), default=0)

    def draw(self, array, kind="write", phase=None, ax=None, title=None):
        """Draw `array` with each element coloured by the thread that touched it (see touched_by)."""
        from course.viz.threads import draw_thread_map
        name = self._name(array)
        if kind not in ("write", "read", "any"):
            raise ValueError(f"draw: kind={kind!r}; the known ones are 'write', 'read', 'any'")
        what = {"write": "wrote", "read": "read", "any": "touched"}[kind]
        if title is None:
            title = f"{name}: which thread {what} each element" + (f" in phase {phase}" if phase is not None else "")
        return draw_thread_map(self.touched_by(name, kind, phase), threads_per_block=int(np.prod(self._t.block)),
                               block_shape=self.block, grid_shape=self.grid, ax=ax, title=title)

    def summary(self, limit=5):
        n_threads = int(np.prod(self._t.grid)) * int(np.prod(self._t.block))
        lines = [f"traced {n_threads} threads (grid {self.grid}, block {self.block}) over {self.phases()} phase(s)"]
        for one, many, items in (("data race", "data races", self.races),
                                 ("out-of-bounds access", "out-of-bounds accesses", self.out_of_bounds)):
            if not items:
                lines.append(f"no {many}")
                continue
            lines.append(f"{len(items)} {one if len(items) == 1 else many}, for example:")
            lines += [f"  {item}" for item in items[:limit]]
        return "\n".join(lines)

    def __repr__(self):
        return f"<TraceReport: {len(self.races)} races, {len(self.out_of_bounds)} out-of-bounds accesses>"


def _conflict(accs, across_blocks):
    """Two accesses that race, and their phase (None across blocks), or None."""
    if len(accs) < 2 or all(a.kind == "read" for a in accs):
        return None
    writers = [a for a in accs if a.kind != "read"]
    for w in writers:
        for other in accs:
            if (other.block, other.thread) == (w.block, w.thread):
                continue
            if w.kind == "atomic" and other.kind == "atomic":
                continue
            if other.block != w.block:
                if across_blocks:
                    return w, other, None
            elif other.phase == w.phase:
                return w, other, w.phase
    return None


def trace(kernel, griddim, blockdim, *args):
    """Run `kernel` as `kernel[griddim, blockdim](*args)` would, in Python, and return a TraceReport.

    The arrays are changed in place as a launch would change them (out-of-bounds writes dropped).
    """
    grid, block = check_launch(griddim, blockdim, kernel_name(kernel))
    n = int(np.prod(grid)) * int(np.prod(block))
    if n > MAX_TRACED_THREADS:
        raise ValueError(f"trace: {n} threads is too many to follow in Python (at most {MAX_TRACED_THREADS}); "
                         f"trace a smaller problem")
    fn = _kernel_function(kernel)
    tracer = _Tracer(grid, block)
    tracer.run(fn, args)
    names = fn.__code__.co_varnames[:fn.__code__.co_argcount]
    return TraceReport(tracer, args, names)
