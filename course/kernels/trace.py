"""Watching the threads of a kernel: which thread read and wrote which element, and when.

    report = trace(vector_add_kernel, 2, 32, a, b, out)   # <<<2 blocks, 32 threads>>>
    print(report.summary())      # races, out-of-bounds accesses, ... and the memory figures
    report.draw("out")           # each element coloured by the thread that wrote it

`trace` runs a kernel written for `numba.cuda` on the CPU, in plain Python: it calls the
kernel's Python function (`kernel.py_func`) with the name `cuda` pointing at a stand-in that
knows which thread is running (threadIdx, blockIdx, blockDim, gridDim, grid, shared.array,
local.array, syncthreads, atomic, and the warp functions shfl_*_sync, syncwarp, ballot_sync,
all_sync, any_sync, activemask). Every array argument is wrapped in a `TracedArray`, whose []
records the thread, the element, read or write, and the *phase*: how many `syncthreads()`
barriers that thread has passed. The threads of a block take turns, each running until its next
barrier or warp function, so a run is the same every time.

Memory starts as a GPU leaves it: a float `shared.array` or `local.array` holds nan (a GPU leaves
whatever was there before), an integer one a garbage pattern. Accesses are followed by *memory
address*, so the same array passed twice (`smooth(a, a)`) is seen as one.

From the records the report finds:
- data races: two threads of one block touch the same memory in the same phase (no barrier
  between them), at least one writing; or two blocks touch the same global memory, at least one
  writing (blocks never wait for each other). Atomic updates do not race with each other;
- out-of-bounds accesses: an index outside the array (a missing `if i < n:`). On a GPU that
  reads garbage or crashes; here it is recorded, the write dropped and the read returns 0;
- reads of shared memory that no thread of the block had written (before a barrier, or earlier
  in the same thread): garbage on a GPU;
- barriers that only some threads of a block reach (a `syncthreads()` inside `if t < step:`, or
  after an early `return`): undefined behaviour on a GPU, which may hang or go on silently;
- wrong use of the warp functions: a lane in the mask that never calls the function, a lane that
  reads from a lane outside the mask.
And it measures, per thread, how many global and shared reads and writes it made, and per warp
and phase, the shared-memory bank conflicts and the global-memory transactions (see `memory`).

Each CUDA thread runs as a greenlet (a Python call stack that can be paused and resumed, from
the `greenlet` package): a thread that reaches a barrier hands the turn back to the scheduler in
about a microsecond, where an operating-system thread per CUDA thread would take a hundred times
longer. It is still Python, so meant for grids of tens to a few thousand threads.
"""

import math
import re
import sys
import types
from collections import Counter, namedtuple
from dataclasses import dataclass, field

import numpy as np
from greenlet import greenlet

from ._backend import check_alignment
from .launch import check_launch, kernel_name

Dim3 = namedtuple("Dim3", "x y z")
MAX_TRACED_THREADS = 1 << 14
WARP = 32
FULL_MASK = 0xFFFFFFFF
BANKS, BANK_BYTES = 32, 4  # shared memory: 32 banks, each serving one 4-byte word per cycle
SECTOR_BYTES = 32  # global memory moves in 32-byte sectors


def _where(dims, value):
    """A thread or block index as the learner wrote the launch: 3, or (1, 2)."""
    v = tuple(value[:len(dims)])
    return v[0] if len(v) == 1 else v


# One access to memory. block, thread: (x, y, z); phase: barriers the thread had passed; kind:
# "read", "write" or "atomic"; the rest places it for the analyses: epoch (syncwarp calls the
# thread had passed), space ("global" or "shared"), addr (its byte address, to see aliasing),
# region and offset (which allocation, and the byte offset inside it), size (bytes), seq (the
# thread's count of accesses to that space since its last barrier: the k-th access of each lane
# of a warp is taken to be one instruction, as a warp runs in lockstep).
Access = namedtuple("Access", "block thread phase kind epoch space addr region offset size seq")


@dataclass(frozen=True)
class Race:
    array: str
    index: tuple
    phase: object  # the phase of both accesses, or None for two different blocks
    first: tuple  # (block, thread, kind)
    second: tuple
    report: object = field(default=None, repr=False, compare=False)
    alias: object = None  # (array, index) of the second access when it used another name for the memory

    def __str__(self):
        (b1, t1, k1), (b2, t2, k2) = self.first, self.second
        d = self.report
        who1 = d.describe(b1, t1) if d else f"thread {t1} of block {b1}"
        who2 = d.describe(b2, t2) if d else f"thread {t2} of block {b2}"
        where = (f"in phase {self.phase} (after {self.phase} syncthreads)" if self.phase is not None
                 else "with no barrier between blocks")
        also = ""
        if self.alias is not None:
            also = f" (the same memory as {self.alias[0]}{list(self.alias[1])}: one array passed twice?)"
        return (f"race on {self.array}{list(self.index)}{also} {where}: {who1} {_verb(k1)} it and "
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


@dataclass(frozen=True)
class UninitialisedRead:
    """A read of a shared element that no thread of the block had written before it."""
    array: str
    index: tuple
    block: tuple
    thread: tuple
    phase: int
    report: object = field(default=None, repr=False, compare=False)

    def __str__(self):
        who = self.report.describe(self.block, self.thread) if self.report else f"thread {self.thread}"
        return (f"uninitialised read: {who} read {self.array}{list(self.index)} in phase {self.phase}, "
                f"which no thread of its block had written: shared memory starts with garbage on a GPU")


@dataclass(frozen=True)
class BarrierIssue:
    """A syncthreads() that only some threads of a block reached: undefined behaviour on a GPU."""
    block: tuple
    waiting: tuple  # the threads that reached it
    skipped: tuple  # the threads that had exited instead
    lines: tuple  # where the waiting threads wait: one line, or several different syncthreads()
    phase: int  # the phase the waiting threads were ending
    report: object = field(default=None, repr=False, compare=False)

    def __str__(self):
        d = self.report
        names = (lambda ths: d.threads_in_words(None, ths)) if d else (lambda ths: f"threads {list(ths)}")
        where = f" of block {_where(d.grid, self.block)}" if d and len(d._blocks) > 1 else ""
        at = f"line {self.lines[0]}" if len(self.lines) == 1 else "lines " + ", ".join(map(str, self.lines))
        if self.skipped:
            return (f"undefined behaviour: the syncthreads() at {at} was reached by {names(self.waiting)}{where} "
                    f"but not by {names(self.skipped)}, which had exited (every thread of a block must reach "
                    f"every barrier: move it out of the `if`, and never `return` before one)")
        return (f"undefined behaviour: the threads{where} wait at different syncthreads() ({at}): "
                f"a barrier inside an `if` that not every thread takes")


@dataclass(frozen=True)
class WarpIssue:
    """A warp function used as a GPU does not allow: its result is undefined there."""
    block: tuple
    function: str
    line: int
    message: str

    def __str__(self):
        return f"warp function {self.function} (line {self.line}): {self.message}"


# The memory figures of one phase: requests are warp-wide instructions (the k-th access of each
# lane of a warp); a global request needs one transaction per 32-byte sector it touches, a shared
# request one pass per distinct 4-byte word the busiest bank must deliver (conflicts: passes - 1).
PhaseMemory = namedtuple("PhaseMemory", "phase global_requests transactions shared_requests bank_conflicts max_ways")


def _verb(kind):
    return {"read": "reads", "write": "writes", "atomic": "atomically updates"}[kind]


def _garbage(shape, dtype):
    """Memory as a GPU leaves it: nan for floats (so a forgotten write shows), a pattern for ints."""
    dtype = _numpy_dtype(dtype)
    if np.issubdtype(dtype, np.floating) or np.issubdtype(dtype, np.complexfloating):
        return np.full(shape, np.nan, dtype)
    data = np.empty(shape, dtype)
    data.view(np.uint8)[...] = 0xA5
    return data


class TracedArray:
    """A NumPy array as a kernel sees it: every element read or written is recorded."""

    def __init__(self, data, name, tracer, prefix=(), space="global", block=None, offset=0):
        self._data, self.name, self._tracer, self._prefix = data, name, tracer, prefix
        self._shape, self._strides = data.shape, data.strides  # read on every access: kept at hand
        self._space, self._block = space, block
        self._ptr = data.__array_interface__["data"][0]
        if space == "global":
            root = data
            while isinstance(root.base, np.ndarray):
                root = root.base
            self._region = ("global", root.__array_interface__["data"][0])
            self._offset = self._ptr - self._region[1]
        else:  # laid out one after the other in the block's shared memory
            self._region, self._offset = ("shared", block), offset
        self._written = {} if space == "shared" else None  # index -> [(phase, epoch, thread)]

    shape = property(lambda self: self._data.shape[len(self._prefix):])
    ndim = property(lambda self: self._data.ndim - len(self._prefix))
    size = property(lambda self: math.prod(self.shape))
    dtype = property(lambda self: self._data.dtype)

    def __len__(self):
        return self.shape[0]

    def __repr__(self):
        return f"TracedArray({self.name}, shape={self.shape}, dtype={self.dtype})"

    def _row(self, index):
        row = TracedArray.__new__(TracedArray)
        row.__dict__.update(self.__dict__)
        row._prefix = index
        return row

    def _index(self, key):
        if type(key) is int:  # the common cases first: x[i], and x[i, j] of Python ints
            return self._prefix + (key,)
        if type(key) is tuple and len(key) <= len(self._shape) - len(self._prefix):
            for k in key:
                if type(k) is not int:
                    break
            else:
                return self._prefix + key
        key = key if isinstance(key, tuple) else (key,)
        for k in key:
            if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)):
                raise TypeError(f"the tracer follows single elements, x[i] or x[i, j]; {self.name} was "
                                f"indexed with {key!r}")
        if len(key) > self.ndim:
            raise IndexError(f"{self.name} has {self.ndim} axes but was indexed with {len(key)} indices")
        return self._prefix + tuple(int(k) for k in key)

    def _inside(self, index):
        for i, n in zip(index, self._shape):
            if not 0 <= i < n:
                return False
        return True

    def __getitem__(self, key):
        index = self._index(key)
        if len(index) < self._data.ndim:  # a row: x[i] of a matrix, indexed again later
            if not self._inside(index):
                self._tracer._out_of_bounds(self, index, "read")
            return self._row(index)
        if not self._inside(index):
            self._tracer._out_of_bounds(self, index, "read")
            return self._data.dtype.type(0)
        self._tracer._record(self, index, "read")
        return self._data[index]

    def __setitem__(self, key, value):
        index = self._index(key)
        if len(index) < self._data.ndim:
            raise TypeError(f"the tracer follows single elements: {self.name}[{key!r}] = ... sets a whole row")
        if not self._inside(index):
            self._tracer._out_of_bounds(self, index, "write")
            return
        self._tracer._record(self, index, "write")
        self._data[index] = value

    def _atomic(self, key, update):
        index = self._index(key)
        if not self._inside(index):
            self._tracer._out_of_bounds(self, index, "atomic")
            return self._data.dtype.type(0)
        self._tracer._record(self, index, "atomic")
        old = self._data[index]
        self._data[index] = update(old)
        return old


class _Abort(BaseException):
    """Unwinds the other threads of a block when one of them fails."""


class _Thread:
    def __init__(self, block, thread, linear):
        self.block, self.thread, self.linear = block, thread, linear
        self.lane, self.warp = linear % WARP, linear // WARP
        self.phase = 0
        self.epoch = 0  # syncwarp() calls passed
        self.greenlet = None  # its call stack, paused at a barrier or warp function
        self.done = False
        self.error = None
        self.shared_calls = 0
        self.wait = None  # what it waits for: ("barrier", line, predicate) or ("warp", name, line, mask, args)
        self.result = None
        self.seq = {}


class _Namespace:
    def __init__(self, **members):
        self.__dict__.update(members)


def _numpy_dtype(dtype):
    try:
        return np.dtype(dtype)
    except TypeError:
        from numba.np.numpy_support import as_dtype
        return as_dtype(dtype)


def _local_array(shape, dtype, alignment=None):
    """A thread's cuda.local.array. On a GPU it starts with whatever that memory held: here a
    float array starts as nan, so that a kernel that reads a slot before writing it shows nan."""
    check_alignment(alignment)
    return _garbage(shape, dtype)


def _caller_line():
    frame = sys._getframe(2)
    return frame.f_lineno


def _atomic(a, i, update):
    """An atomic read-modify-write: recorded on a traced array; on a plain one (`execute`) it is
    atomic because only one thread runs at a time."""
    if isinstance(a, TracedArray):
        return a._atomic(i, update)
    old = a[i]
    a[i] = update(old)
    return old


def _inc(old, v):
    return type(old)(0) if old >= v else old + 1


def _dec(old, v):
    return v if (old == 0 or old > v) else old - 1


class _FakeCuda:
    """What `cuda.` means inside a traced kernel: the running thread's view of the launch."""

    warpsize = WARP

    def __init__(self, tracer):
        self._t = tracer
        self.shared = _Namespace(array=tracer._shared_array)
        self.local = _Namespace(array=_local_array)
        self.const = _Namespace(array_like=lambda a: np.asarray(a._data if isinstance(a, TracedArray) else a))

        def cas(a, i, old, v):
            return _atomic(a, i, lambda cur: v if cur == old else cur)

        self.atomic = _Namespace(
            add=lambda a, i, v: _atomic(a, i, lambda old: old + v),
            sub=lambda a, i, v: _atomic(a, i, lambda old: old - v),
            max=lambda a, i, v: _atomic(a, i, lambda old: max(old, v)),
            min=lambda a, i, v: _atomic(a, i, lambda old: min(old, v)),
            nanmax=lambda a, i, v: _atomic(a, i, lambda old: np.fmax(old, v)),
            nanmin=lambda a, i, v: _atomic(a, i, lambda old: np.fmin(old, v)),
            exch=lambda a, i, v: _atomic(a, i, lambda old: v),
            and_=lambda a, i, v: _atomic(a, i, lambda old: old & v),
            or_=lambda a, i, v: _atomic(a, i, lambda old: old | v),
            xor=lambda a, i, v: _atomic(a, i, lambda old: old ^ v),
            inc=lambda a, i, v: _atomic(a, i, lambda old: _inc(old, v)),
            dec=lambda a, i, v: _atomic(a, i, lambda old: _dec(old, v)),
            cas=cas,
            compare_and_swap=lambda a, old, v: cas(a, 0, old, v),
        )

    threadIdx = property(lambda self: Dim3(*self._t._current.thread))
    blockIdx = property(lambda self: Dim3(*self._t._current.block))
    blockDim = property(lambda self: Dim3(*self._t.block))
    gridDim = property(lambda self: Dim3(*self._t.grid))
    laneid = property(lambda self: self._t._current.lane)

    def grid(self, ndim):
        th, bd = self._t._current, self._t.block
        ids = [th.block[a] * bd[a] + th.thread[a] for a in range(ndim)]
        return ids[0] if ndim == 1 else tuple(ids)

    def gridsize(self, ndim):
        sizes = [self._t.grid[a] * self._t.block[a] for a in range(ndim)]
        return sizes[0] if ndim == 1 else tuple(sizes)

    # block-wide barriers
    def syncthreads(self):
        self._t._barrier(_caller_line())

    def syncthreads_count(self, predicate):
        return self._t._barrier(_caller_line(), ("count", predicate))

    def syncthreads_and(self, predicate):
        return self._t._barrier(_caller_line(), ("and", predicate))

    def syncthreads_or(self, predicate):
        return self._t._barrier(_caller_line(), ("or", predicate))

    def threadfence(self):
        pass

    threadfence_block = threadfence_system = threadfence

    # warp-level functions: the lanes named in `mask` meet, as on a GPU
    def syncwarp(self, mask=FULL_MASK):
        self._t._warp("syncwarp", _caller_line(), mask)

    def activemask(self):
        return self._t._warp("activemask", _caller_line(), None)

    def lanemask_lt(self):
        return (1 << self._t._current.lane) - 1

    def shfl_sync(self, mask, value, src_lane):
        return self._t._warp("shfl_sync", _caller_line(), mask, value, int(src_lane))

    def shfl_up_sync(self, mask, value, delta):
        return self._t._warp("shfl_up_sync", _caller_line(), mask, value, int(delta))

    def shfl_down_sync(self, mask, value, delta):
        return self._t._warp("shfl_down_sync", _caller_line(), mask, value, int(delta))

    def shfl_xor_sync(self, mask, value, lane_mask):
        return self._t._warp("shfl_xor_sync", _caller_line(), mask, value, int(lane_mask))

    def ballot_sync(self, mask, predicate):
        return self._t._warp("ballot_sync", _caller_line(), mask, bool(predicate))

    def all_sync(self, mask, predicate):
        return self._t._warp("all_sync", _caller_line(), mask, bool(predicate))

    def any_sync(self, mask, predicate):
        return self._t._warp("any_sync", _caller_line(), mask, bool(predicate))

    def eq_sync(self, mask, value):
        return self._t._warp("eq_sync", _caller_line(), mask, value)

    def __getattr__(self, name):
        raise AttributeError(f"the tracer does not provide cuda.{name}")


def _has_contents(cell):
    try:
        cell.cell_contents
    except ValueError:  # a cell not filled yet
        return False
    return True


def _is_device_function(value):
    """A @cuda.jit function (on a GPU or the simulator), not a plain Python function."""
    return not isinstance(value, types.FunctionType) and isinstance(getattr(value, "py_func", None),
                                                                     types.FunctionType)


def _kernel_function(kernel):
    """The plain Python function behind a @cuda.jit kernel (or the function itself)."""
    fn = getattr(kernel, "py_func", None) or getattr(kernel, "fn", None) or kernel
    if not isinstance(fn, types.FunctionType):
        raise TypeError(f"trace: {kernel!r} is not a kernel written in Python (a @cuda.jit function)")
    return fn


def _mask_words(mask):
    """A warp mask in words: "lanes 0-31" (printed in hex it would look like a memory address)."""
    lanes = _bits(mask)
    return f"lane{'s' if len(lanes) != 1 else ''} {_ranges(lanes)}" if lanes else "no lane"


def _bits(mask):
    return [lane for lane in range(WARP) if (mask >> lane) & 1]


class _Tracer:
    def __init__(self, grid, block, record=True):
        self.record = record  # False: only run the kernel (`execute`), on plain arrays
        self.grid = grid + (1,) * (3 - len(grid))
        self.block = block + (1,) * (3 - len(block))
        self.dims = (grid, block)
        self._current = None  # the _Thread whose turn it is
        self._aborting = False
        self.records = {}  # array name -> list of (index, Access)
        self.log = []  # every access in order: (name, index, Access)
        self.out_of_bounds = []
        self.uninitialised = []  # (name, index, block, thread, phase)
        self.barrier_issues = []  # (block, waiting, skipped, lines, phase)
        self.warp_issues = []
        self.warp_calls = Counter()  # warp function name -> calls, over every thread
        self._shared = {}  # (block, k) -> the k-th shared array of that block
        self._shared_used = {}  # block -> bytes of shared memory laid out so far
        self.shared_names = {}
        self.fake = _FakeCuda(self)
        self._functions = {}

    # ----- what the kernel's code calls -------------------------------------------------------
    def _record(self, array, index, kind):
        th = self._current
        offset = 0
        for i, s in zip(index, array._strides):
            offset += i * s
        space = array._space
        key = (space, th.phase, th.epoch)
        seq = th.seq.get(key, 0)
        th.seq[key] = seq + 1
        acc = Access(th.block, th.thread, th.phase, kind, th.epoch, space, array._ptr + offset, array._region,
                     array._offset + offset, array._data.itemsize, seq)
        if array._written is not None:
            self._check_initialised(array, index, th, kind)
        self.records.setdefault(array.name, []).append((index, acc))
        self.log.append((array.name, index, acc))

    def _check_initialised(self, array, index, th, kind):
        writes = array._written.setdefault(index, [])
        if kind != "write":  # a read, or an atomic update, which reads first
            # It reads what was written before it: in an earlier phase, by this thread itself, or by
            # its warp before a syncwarp().
            phase, warp, epoch = th.phase, th.warp, th.epoch
            for p, e, t, w in writes:
                if p < phase or t is th or (p == phase and w == warp and e < epoch):
                    break
            else:
                self.uninitialised.append((array.name, index, th.block, th.thread, th.phase))
        if kind != "read":
            writes.append((th.phase, th.epoch, th, th.warp))

    def _out_of_bounds(self, array, index, kind):
        th = self._current
        self.out_of_bounds.append((array.name, index, array._data.shape, th.block, th.thread, kind))

    def _shared_array(self, shape, dtype, alignment=None):
        check_alignment(alignment)
        th = self._current
        key = (th.block, th.shared_calls)
        th.shared_calls += 1
        if key not in self._shared and not self.record:  # `execute`: a plain array, nothing to name
            self._shared[key] = _garbage(shape, dtype)
        elif key not in self._shared:
            name = self._shared_name(key[1], sys._getframe(1))
            data = _garbage(shape, dtype)
            used = self._shared_used.get(th.block, 0)
            used += -used % max(16, alignment or 0)  # at least 16 bytes, as the compiler lays them out
            self._shared_used[th.block] = used + data.nbytes
            self._shared[key] = TracedArray(data, name, self, space="shared", block=th.block, offset=used)
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

    def _pause(self, wait):
        """Hand the turn back to the scheduler until what the thread waits for has happened."""
        th = self._current
        if self._aborting:  # another thread failed: nobody will hand out turns any more
            raise _Abort
        th.wait, th.result = wait, None
        # A tracing function (sys.settrace: the exercise checks' line budget) belongs to this thread
        # alone, as it would to an operating-system thread: set it aside while the others run.
        tracing = sys.gettrace()
        sys.settrace(None)
        th.greenlet.parent.switch()
        sys.settrace(tracing)
        if self._aborting:
            raise _Abort
        th.wait = None
        return th.result

    def _barrier(self, line, predicate=None):
        if predicate is not None:
            predicate = (predicate[0], bool(predicate[1]))
        return self._pause(("barrier", line, predicate))

    def _warp(self, name, line, mask, *args):
        self.warp_calls[name] += 1
        mask = None if mask is None else int(mask) & FULL_MASK
        return self._pause(("warp", name, line, mask, args))

    # ----- running the grid ---------------------------------------------------------------------
    def function(self, fn):
        """`fn` with `cuda` (and the kernels and device functions it calls) swapped for tracing ones."""
        if id(fn) in self._functions:
            return self._functions[id(fn)]
        cuda_modules = {id(m) for name, m in sys.modules.items() if name == "numba.cuda"}
        glb = dict(fn.__globals__)
        closure = fn.__closure__
        if closure:  # a kernel made by a factory may hold its device functions in a closure
            closure = tuple(types.CellType(self.function(_kernel_function(c.cell_contents)))
                            if _has_contents(c) and _is_device_function(c.cell_contents) else c for c in closure)
        new = types.FunctionType(fn.__code__, glb, fn.__name__, fn.__defaults__, closure)
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
                if self.record:
                    raise TypeError(f"trace: pass NumPy arrays (argument {name} is a device array)")
                a = _host_view(a)
            if self.record and isinstance(a, np.ndarray) and a.ndim > 0:
                a = TracedArray(a, name, self)
            wrapped.append(a)
        fn = self.function(fn)
        for block in np.ndindex(*self.grid[::-1]):
            self._run_block(fn, wrapped, block[::-1])

    def _run_block(self, fn, args, block):
        threads = []
        for linear, idx in enumerate(np.ndindex(*self.block[::-1])):
            threads.append(_Thread(tuple(block), idx[::-1], linear))

        def body(th):
            try:
                fn(*args)
            except _Abort:
                pass
            except BaseException as err:  # reported by the scheduler, naming the thread
                th.error = err
            th.done = True  # returning hands the turn back to the scheduler (the greenlet's parent)

        for th in threads:
            th.greenlet = greenlet(lambda th=th: body(th))
        live = threads
        try:
            runnable = threads
            while True:  # each runnable thread runs, in turn, to its next barrier or warp function
                for th in runnable:
                    self._current = th
                    th.greenlet.switch()
                    if th.error is not None:
                        raise RuntimeError(f"{'trace: ' if self.record else ''}{self.describe(th.block, th.thread)} raised "
                                           f"{type(th.error).__name__}: {th.error}") from th.error
                live = [th for th in threads if not th.done]
                if not live:
                    break
                runnable = self._resolve(threads, live)
        finally:
            if live:  # unwind the threads still waiting
                self._aborting = True
                for th in live:
                    if not th.done and th.greenlet:
                        self._current = th
                        th.greenlet.switch()
            self._current = None
            self._aborting = False

    def _resolve(self, threads, live):
        """Every live thread waits: let the warp functions happen first, then the barrier."""
        at_warp = [th for th in live if th.wait[0] == "warp"]
        if at_warp:
            released = []
            for warp in sorted({th.warp for th in at_warp}):
                released += self._resolve_warp(threads, [th for th in at_warp if th.warp == warp])
            return sorted(released, key=lambda th: th.linear)
        lines = tuple(sorted({th.wait[1] for th in live}))
        skipped = tuple(th.thread for th in threads if th.done)
        if skipped or len(lines) > 1:
            self.barrier_issues.append((live[0].block, tuple(th.thread for th in live), skipped, lines,
                                        live[0].phase))
        predicates = [th.wait[2] for th in live if th.wait[2] is not None]
        if predicates:
            values = [p for _, p in predicates]
            op = predicates[0][0]
            result = sum(values) if op == "count" else int(all(values)) if op == "and" else int(any(values))
        for th in live:
            th.phase += 1
            th.seq = {}
            if predicates:
                th.result = result
        return live

    def _warp_issue(self, th, name, line, message):
        self.warp_issues.append(WarpIssue(th.block, name, line, message))

    def _resolve_warp(self, threads, waiting):
        lanes = {th.lane: th for th in threads if th.warp == waiting[0].warp}
        released = []
        pending = list(waiting)
        while pending:
            first = pending[0]
            _, name, line, mask, _ = first.wait
            if name == "activemask":  # the lanes that reached this very call together
                group = [th for th in pending if th.wait[1] == "activemask" and th.wait[2] == line]
                active = sum(1 << th.lane for th in group)
                for th in group:
                    th.result = active
            else:
                group = [lanes[lane] for lane in _bits(mask) if lane in lanes and lanes[lane] in pending]
                if first not in group:
                    self._warp_issue(first, name, line, f"lane {first.lane} called it with a mask of "
                                                        f"{_mask_words(mask)}, which leaves itself out")
                    group = [first] + group
                missing = {}  # why -> lanes
                for lane in _bits(mask):
                    th = lanes.get(lane)
                    if th is None:
                        why = f"do not exist (the block has {len(threads)} threads)"
                    elif th.done:
                        why = "had exited"
                    elif th not in pending:
                        why = "wait at a syncthreads()"
                    else:
                        continue
                    missing.setdefault(why, []).append(lane)
                if missing:
                    said = "; ".join(f"{_mask_words(sum(1 << k for k in ks))} {why}" for why, ks in missing.items())
                    self._warp_issue(first, name, line, f"lanes in its mask ({_mask_words(mask)}) never called it "
                                                        f"({said}): on a GPU every lane in the mask must call it")
                functions = sorted({th.wait[1] for th in group})
                if len(functions) > 1:
                    self._warp_issue(first, name, line, f"the lanes of one mask called different warp "
                                                        f"functions ({', '.join(functions)}): they diverged")
                elif len({th.wait[3] for th in group}) > 1:
                    self._warp_issue(first, name, line, "the lanes that meet here called it with different masks")
                for fname in sorted({th.wait[1] for th in group}):  # each lane gets what its own call gives
                    self._warp_results([th for th in group if th.wait[1] == fname], fname, line, mask)
            for th in group:
                pending.remove(th)
            released += group
        return released

    def _warp_results(self, group, name, line, mask):
        values = {th.lane: th.wait[4] for th in group}
        if name == "syncwarp":
            for th in group:
                th.epoch += 1
                th.seq = {}
            return
        if name in ("ballot_sync", "all_sync", "any_sync", "eq_sync"):
            preds = {lane: v[0] for lane, v in values.items() if (mask >> lane) & 1}
            if name == "ballot_sync":
                result = sum(1 << lane for lane, p in preds.items() if p)
            elif name == "all_sync":
                result = int(all(preds.values()))
            elif name == "any_sync":
                result = int(any(preds.values()))
            else:
                result = int(len({np.asarray(v).item() for v in preds.values()}) <= 1)
            for th in group:
                th.result = result
            return
        undefined = []
        for th in group:
            value, arg = values[th.lane]
            if name == "shfl_sync":
                src = arg % WARP
            elif name == "shfl_up_sync":
                src = th.lane - arg if th.lane - arg >= 0 else th.lane
            elif name == "shfl_down_sync":
                src = th.lane + arg if th.lane + arg < WARP else th.lane
            else:
                src = th.lane ^ arg
            if src not in values or not (mask >> src) & 1:
                undefined.append((th.lane, src))
                th.result = value
            else:
                th.result = values[src][0]
        if undefined:
            readers, sources = _ranges([r for r, _ in undefined]), _ranges(sorted({s for _, s in undefined}))
            self._warp_issue(group[0], name, line, f"lanes {readers} read the values of lanes {sources}, which "
                                                   f"are not in the mask ({_mask_words(mask)}) or did not call it: those "
                                                   f"values are undefined on a GPU")

    def describe(self, block, thread):
        grid, blk = self.dims
        b, t = _where(grid, block), _where(blk, thread)
        return f"thread {t} of block {b}" if self.grid != (1, 1, 1) else f"thread {t}"


def _ranges(numbers):
    """[0, 1, 2, 5, 7, 8] -> "0-2, 5, 7-8"."""
    parts, start = [], None
    for k, n in enumerate(numbers):
        if start is None:
            start = n
        if k + 1 == len(numbers) or numbers[k + 1] != n + 1:
            parts.append(str(start) if start == n else f"{start}-{n}")
            start = None
    return ", ".join(parts)


class TraceReport:
    """What `trace` saw. Arrays are named by the kernel's parameter names (shared arrays by the
    variable they were assigned to); any method taking `array` accepts that name, the position
    of the argument, or the NumPy array passed. Each block has its own copy of a shared array:
    where a method returns one value per element, a shared array of a grid of several blocks
    gets one more leading axis, the block (numbered with x fastest), unless `block=` picks one."""

    def __init__(self, tracer, args, names):
        self._t = tracer
        self.grid, self.block = tracer.dims
        self._args = args
        self._arg_names = names
        self.arrays = {}
        for name, a in zip(names, args):
            if isinstance(a, np.ndarray) and a.ndim > 0:
                self.arrays.setdefault(name, a)
        self._blocks = [b[::-1] for b in np.ndindex(*tracer.grid[::-1])]
        self._shared_copies = {}  # name -> {block: data}
        for (blk, _), traced in tracer._shared.items():
            self._shared_copies.setdefault(traced.name, {})[blk] = traced._data
            if blk == (0, 0, 0):
                self.arrays.setdefault(traced.name, traced._data)
        for name, copies in self._shared_copies.items():
            self.arrays.setdefault(name, next(iter(copies.values())))
        self.out_of_bounds = [OutOfBounds(*o, report=self) for o in tracer.out_of_bounds]
        self.uninitialised = [UninitialisedRead(*u, report=self) for u in tracer.uninitialised]
        self.barrier_issues = [BarrierIssue(*b, report=self) for b in tracer.barrier_issues]
        self.warp_issues = list(tracer.warp_issues)
        self.warp_calls = dict(tracer.warp_calls)  # how often the threads called each warp function
        self.races = self._find_races()
        # bytes of shared memory one block holds (its arrays, each aligned to 16 bytes): with the
        # threads per block, what limits how many blocks a multiprocessor runs at once (occupancy)
        self.shared_bytes = max(tracer._shared_used.values(), default=0)

    def describe(self, block, thread):
        """A thread in words: "thread 3 of block 1" (indices as the launch gave them)."""
        return self._t.describe(block, thread)

    def threads_in_words(self, block, threads):
        """Several threads of one block in words: "threads 4-31 of block 0"."""
        grid, blk = self._t.dims
        of = f" of block {_where(grid, block)}" if block is not None and self._t.grid != (1, 1, 1) else ""
        if len(blk) == 1:
            numbers = sorted(t[0] for t in threads)
            word = "thread" if len(numbers) == 1 else "threads"
            return f"{word} {_ranges(numbers)}{of}"
        shown = ", ".join(str(_where(blk, t)) for t in threads[:6])
        more = f" and {len(threads) - 6} more" if len(threads) > 6 else ""
        return f"threads {shown}{more}{of}"

    def shared_copies(self, name):
        """Each block's copy of the shared array `name`, as it was when the block ended: {block: array}."""
        if name not in self._shared_copies:
            raise KeyError(f"trace: no shared array named {name!r}; the kernel made {', '.join(self.shared_arrays) or 'none'}")
        return dict(self._shared_copies[name])

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
        by_address = {}
        for name, index, acc in self._t.log:
            by_address.setdefault(acc.addr, []).append((name, index, acc))
        races = []
        for entries in by_address.values():
            found = _conflict(entries, self._t.block)
            if found:
                (n1, i1, a), (n2, i2, b), phase = found
                alias = (n2, i2) if (n2, i2) != (n1, i1) else None
                races.append(Race(n1, i1, phase, (a.block, a.thread, a.kind), (b.block, b.thread, b.kind),
                                  report=self, alias=alias))
        return races

    def _number(self, block, thread):
        gx, gy, _ = self._t.grid
        bx, by, bz = self._t.block
        b = block[0] + gx * (block[1] + gy * block[2])
        return b * (bx * by * bz) + thread[0] + bx * (thread[1] + by * thread[2])

    def _per_element(self, array, block, fill, add):
        """One value per element of `array` (per block for a shared array), from `add(out, index, acc)`."""
        name = self._name(array)
        shape = self.arrays[name].shape
        shared = name in self._shared_copies
        if block is not None:
            block = tuple(np.atleast_1d(block)) + (0,) * (3 - len(np.atleast_1d(block)))
        stacked = shared and block is None and len(self._blocks) > 1
        out = np.full(((len(self._blocks),) if stacked else ()) + shape, fill, dtype=np.int64)
        for index, acc in self._t.records.get(name, []):
            if block is not None and acc.block != block:
                continue
            where = (self._blocks.index(acc.block),) + index if stacked else index
            add(out, where, acc)
        return out

    def touched_by(self, array, kind="write", phase=None, block=None):
        """For each element, which thread touched it (`kind` "write", "read" or "any"), as a number
        block * threads_per_block + thread; -1 where none did and -2 where several threads did.
        A shared array gets one row per block (or only `block`'s)."""
        def add(owner, where, acc):
            if kind != "any" and (acc.kind == "read") != (kind == "read"):
                return
            if phase is not None and acc.phase != phase:
                return
            who = self._number(acc.block, acc.thread)
            owner[where] = who if owner[where] in (-1, who) else -2
        return self._per_element(array, block, -1, add)

    def counts(self, array, kind="read", block=None):
        """How many times each element was accessed (`kind` "read", "write" or "any"): an integer array."""
        if kind not in ("write", "read", "any"):
            raise ValueError(f"counts: kind={kind!r}; the known ones are 'write', 'read', 'any'")

        def add(total, where, acc):
            if kind == "any" or (acc.kind == "read") == (kind == "read"):
                total[where] += 1
        return self._per_element(array, block, 0, add)

    def unwritten(self, array, block=None):
        """A boolean array: True for each element that no thread wrote."""
        return self.touched_by(array, "write", block=block) == -1

    def phases(self):
        """How many phases (stretches between barriers) the threads went through."""
        return 1 + max((acc.phase for _, _, acc in self._t.log), default=0)

    # ----- counts and memory figures -------------------------------------------------------------
    def per_thread(self, space="global", kind="read"):
        """How many accesses each thread made: space "global" or "shared", kind "read", "write",
        "atomic" or "any". An integer array, one entry per thread (numbered as in touched_by)."""
        if space not in ("global", "shared") or kind not in ("read", "write", "atomic", "any"):
            raise ValueError(f"per_thread: space={space!r}, kind={kind!r}; the known ones are 'global', "
                             f"'shared' and 'read', 'write', 'atomic', 'any'")
        total = np.zeros(len(self._blocks) * int(np.prod(self._t.block)), dtype=np.int64)
        for _, _, acc in self._t.log:
            if acc.space == space and (kind == "any" or acc.kind == kind):
                total[self._number(acc.block, acc.thread)] += 1
        return total

    def _requests(self):
        """The warp-wide requests: the k-th access to a space of each lane of a warp, per phase."""
        per_block = self._t.block
        groups = {}
        for _, _, acc in self._t.log:
            t = acc.thread
            warp = (t[0] + per_block[0] * (t[1] + per_block[1] * t[2])) // WARP
            groups.setdefault((acc.phase, acc.block, warp, acc.epoch, acc.space, acc.seq), []).append(acc)
        return groups

    def memory(self):
        """Per phase, what the warps asked of memory: a list of PhaseMemory(phase, global_requests,
        transactions, shared_requests, bank_conflicts, max_ways).

        A request is one access instruction of a warp (the k-th access of each of its lanes). A
        global request costs one transaction per 32-byte sector it touches: 4 for 32 lanes reading
        32 neighbouring floats, 32 for 32 floats a row apart. Shared memory has 32 banks of 4-byte
        words (word w in bank w % 32); a request takes as many passes as the most distinct words
        any one bank must deliver (lanes reading the same word share it): its bank conflicts are
        passes - 1, and max_ways the largest number of passes of one request."""
        stats = {}
        for (phase, *_rest, space, _seq), accs in self._requests().items():
            s = stats.setdefault(phase, [0, 0, 0, 0, 1])
            if space == "global":
                sectors = {(a.region, (a.offset + k) // SECTOR_BYTES) for a in accs for k in (0, a.size - 1)}
                s[0] += 1
                s[1] += len(sectors)
            else:
                words = {(a.offset // BANK_BYTES) + k for a in accs for k in range(max(a.size // BANK_BYTES, 1))}
                per_bank = {}
                for w in words:
                    per_bank[w % BANKS] = per_bank.get(w % BANKS, 0) + 1
                ways = max(per_bank.values())
                s[2] += 1
                s[3] += ways - 1
                s[4] = max(s[4], ways)
        return [PhaseMemory(p, *stats[p][:4], stats[p][4] if stats[p][2] else 0) for p in sorted(stats)]

    def bank_conflicts(self):
        """Shared-memory bank conflicts of the whole kernel (extra passes, summed over requests)."""
        return sum(p.bank_conflicts for p in self.memory())

    def transactions(self):
        """Global-memory transactions (32-byte sectors) of the whole kernel, summed over requests."""
        return sum(p.transactions for p in self.memory())

    def draw(self, array, kind="write", phase=None, ax=None, title=None, block=None):
        """Draw `array` with each element coloured by the thread that touched it (see touched_by).
        A shared array of several blocks is drawn one block per row (1-D) or per panel (2-D)."""
        from course.viz.threads import draw_thread_map
        name = self._name(array)
        if kind not in ("write", "read", "any"):
            raise ValueError(f"draw: kind={kind!r}; the known ones are 'write', 'read', 'any'")
        what = {"write": "wrote", "read": "read", "any": "touched"}[kind]
        if title is None:
            title = f"{name}: which thread {what} each element" + (f" in phase {phase}" if phase is not None else "")
        owner = self.touched_by(name, kind, phase, block=block)
        common = dict(threads_per_block=int(np.prod(self._t.block)), block_shape=self.block, grid_shape=self.grid)
        stacked = name in self._shared_copies and block is None and len(self._blocks) > 1
        if stacked and owner.ndim == 2:  # one row per block
            ax = draw_thread_map(owner, ax=ax, title=title + " (one row per block)", **common)
            ax.set_ylabel("block")
            return ax
        if stacked:
            import matplotlib.pyplot as plt
            n = min(len(self._blocks), 8)
            _, axes = plt.subplots(1, n, figsize=(min(2.2 * n + 1, 16), 2.6))
            axes = np.atleast_1d(axes)
            for k in range(n):
                draw_thread_map(owner[k], ax=axes[k], title=f"block {_where(self.grid, self._blocks[k])}", **common)
            axes[0].figure.suptitle(title)
            return axes
        return draw_thread_map(owner, ax=ax, title=title, **common)

    def summary(self, limit=5):
        n_threads = int(np.prod(self._t.grid)) * int(np.prod(self._t.block))
        lines = [f"traced {n_threads} threads (grid {self.grid}, block {self.block}) over {self.phases()} phase(s)"]
        for one, many, items in (("data race", "data races", self.races),
                                 ("out-of-bounds access", "out-of-bounds accesses", self.out_of_bounds),
                                 ("read of uninitialised shared memory", "reads of uninitialised shared memory",
                                  self.uninitialised),
                                 ("barrier not reached by every thread", "barriers not reached by every thread",
                                  self.barrier_issues),
                                 ("wrong use of a warp function", "wrong uses of warp functions", self.warp_issues)):
            if not items:
                lines.append(f"no {many}")
                continue
            lines.append(f"{len(items)} {one if len(items) == 1 else many}, for example:")
            lines += [f"  {item}" for item in items[:limit]]
        counts = [(self.per_thread(space, kind).max(initial=0), f"{space} {kind}")
                  for space in ("global", "shared") for kind in ("read", "write", "atomic")]
        shown = [f"{n} {what}{'' if n == 1 else 's'}" for n, what in counts if n]
        lines.append("per thread, at most: " + (", ".join(shown) if shown else "no memory accesses"))
        mem = self.memory()
        g, t = sum(p.global_requests for p in mem), sum(p.transactions for p in mem)
        s, c = sum(p.shared_requests for p in mem), sum(p.bank_conflicts for p in mem)
        lines.append(f"per warp: {g} global request(s) needing {t} transaction(s) of {SECTOR_BYTES} bytes; "
                     f"{s} shared request(s) with {c} bank conflict(s)")
        return "\n".join(lines)

    def __repr__(self):
        return (f"<TraceReport: {len(self.races)} races, {len(self.out_of_bounds)} out-of-bounds accesses, "
                f"{len(self.uninitialised)} uninitialised reads, {len(self.barrier_issues)} barrier issues, "
                f"{len(self.warp_issues)} warp issues>")


def _conflict(entries, block_dims):
    """Two accesses to one address that race, and their phase (None across blocks), or None."""
    if len(entries) < 2 or all(e[2].kind == "read" for e in entries):
        return None
    bx, by, _ = block_dims

    def warp(acc):
        t = acc.thread
        return (t[0] + bx * (t[1] + by * t[2])) // WARP

    for w in entries:
        wa = w[2]
        if wa.kind == "read":
            continue
        for other in entries:
            oa = other[2]
            if (oa.block, oa.thread) == (wa.block, wa.thread):
                continue
            if wa.kind == "atomic" and oa.kind == "atomic":
                continue
            if oa.block != wa.block:
                if wa.space == "global":
                    return w, other, None
            elif oa.phase == wa.phase and not (warp(oa) == warp(wa) and oa.epoch != wa.epoch):
                return w, other, wa.phase
    return None


def _host_view(array):
    """The NumPy array behind a device array of numba's simulator (its memory: writes show through)."""
    data = getattr(array, "_ary", None)
    if not isinstance(data, np.ndarray):
        raise TypeError(f"execute: cannot run a kernel on a {type(array).__name__} here: pass NumPy arrays or "
                        f"device arrays of numba's CUDA simulator")
    return data


def execute(kernel, griddim, blockdim, *args):
    """Run `kernel[griddim, blockdim](*args)` in Python, as the tracer does but recording nothing.

    This is how kernels run on the CPU when there is no GPU (`launch` uses it on the simulator
    backend): numba's simulator starts an operating-system thread per CUDA thread and sets up its
    `cuda` module again at every call of a device function; here a thread is a greenlet and the
    functions are prepared once per launch, 6-22x faster on the device tensor's operations.
    Arguments may be NumPy arrays or the simulator's device arrays (used in place)."""
    grid, block = check_launch(griddim, blockdim, kernel_name(kernel))
    _Tracer(grid, block, record=False).run(_kernel_function(kernel), args)


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
