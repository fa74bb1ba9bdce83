"""The process behind `course.kernels.compile`: numba compiles kernels to PTX here, for real GPUs.

It is a process of its own because the CUDA simulator, once on, replaces numba's CUDA compiler
for the whole process (`numba.cuda.compiler` is the simulator's there). This file is run by its
path, not imported as part of `course.kernels`, so that nothing here switches the simulator on.

Messages both ways are pickled dicts, each preceded by its length (8 bytes, little-endian).
A kernel arrives as its code object (marshal) with the globals it names, each encoded by
`course.kernels.compile._encode`; the reply carries the PTX per architecture, or numba's error
with the file and line of the kernel where numba stopped.
"""

import sys

del sys.path[0]  # this folder (course/kernels): its trace.py would hide the standard library's

import builtins  # noqa: E402
import contextlib  # noqa: E402
import importlib  # noqa: E402
import marshal  # noqa: E402
import os  # noqa: E402
import pickle  # noqa: E402
import struct  # noqa: E402
import traceback  # noqa: E402
import types  # noqa: E402

PROBE_ARCH = (7, 5)


def _send(stream, message):
    data = pickle.dumps(message)
    stream.write(struct.pack("<Q", len(data)) + data)
    stream.flush()


def _receive(stream):
    head = stream.read(8)
    if len(head) < 8:
        return None
    (size,) = struct.unpack("<Q", head)
    return pickle.loads(stream.read(size))


class _Unavailable:
    """Stands for a global the kernel names that could not be brought here (numba cannot type it,
    and would not on a GPU either)."""

    def __init__(self, what):
        self.what = what

    def __repr__(self):
        return f"<{self.what}>"


class _Builder:
    """Rebuilds the learner's functions from their encoded form, with the real numba.cuda."""

    def __init__(self, cuda):
        self.cuda = cuda
        self.files = set()

    def value(self, encoded):
        kind = encoded[0]
        if kind == "value":
            return pickle.loads(encoded[1])
        if kind == "module":
            try:
                return importlib.import_module(encoded[1])
            except Exception:
                return _Unavailable(f"module {encoded[1]}, which could not be imported to compile")
        if kind == "namespace":  # a module of the course: only the attributes the kernel names
            module = types.ModuleType(encoded[1])
            for name, value in encoded[2].items():
                setattr(module, name, self.value(value))
            return module
        if kind == "function":
            return self.function(encoded)
        if kind == "jit":
            if encoded[1][0] != "function":
                return self.value(encoded[1])
            fn = self.function(encoded[1])
            return self.cuda.jit(device=True)(fn) if encoded[2] else self.cuda.jit(fn)
        return _Unavailable(encoded[1])

    def function(self, encoded):
        _, code, name, globs, closure, defaults = encoded
        code = marshal.loads(code)
        self.files.add(code.co_filename)
        namespace = {"__builtins__": builtins, "__name__": "__kernel__"}
        for key, value in globs.items():
            namespace[key] = self.value(value)
        cells = tuple(types.CellType(self.value(v)) if v is not None else types.CellType() for v in closure)
        defaults = tuple(self.value(v) for v in defaults) if defaults is not None else None
        return types.FunctionType(code, namespace, name, defaults, cells or None)


def _attribute(obj, name):
    try:
        return getattr(obj, name, None)
    except Exception:  # some of numba's objects raise more than AttributeError
        return None


def _location(err, files):
    """(file, line) where numba stopped inside the kernel: the innermost IR location in the
    traceback that lies in one of the kernel's files (numba does not always attach it)."""
    found = None
    loc = getattr(err, "loc", None)
    if getattr(loc, "filename", None) in files:
        found = (loc.filename, loc.line)
    tb = err.__traceback__
    while tb is not None:
        local = tb.tb_frame.f_locals
        for candidate in (local.get("loc"), _attribute(local.get("self"), "loc"),
                          _attribute(local.get("inst"), "loc"), _attribute(local.get("stmt"), "loc")):
            if _attribute(candidate, "filename") in files and isinstance(_attribute(candidate, "line"), int):
                found = (candidate.filename, candidate.line)
        tb = tb.tb_next
    return found


class _Device:
    def __init__(self, arch):
        self.compute_capability = arch


@contextlib.contextmanager
def _device_of(arch):
    """numba compiles a device function (@cuda.jit(device=True)) that a kernel calls for the GPU it
    finds, asking the driver; there is none here, so it is told of one with the architecture asked."""
    try:
        dispatcher = importlib.import_module("numba.cuda.dispatcher")
    except ImportError:
        dispatcher = None
    original = getattr(dispatcher, "get_current_device", None)
    if original is not None:
        dispatcher.get_current_device = lambda: _Device(arch)
    try:
        yield
    finally:
        if original is not None:
            dispatcher.get_current_device = original


@contextlib.contextmanager
def _library_seen():
    """The code library numba turns into PTX, kept while compile_ptx runs: numba types and lowers a
    kernel in a pipeline that takes ten times as long as NVVM, so the other architectures reuse it."""
    seen = []
    try:
        codegen = importlib.import_module("numba.cuda.codegen")
        cls = codegen.CUDACodeLibrary
        original = cls.get_asm_strs
    except (ImportError, AttributeError):
        yield seen
        return

    def get_asm_strs(self, *args, **kwargs):
        seen.append(self)
        return original(self, *args, **kwargs)

    cls.get_asm_strs = get_asm_strs
    try:
        yield seen
    finally:
        cls.get_asm_strs = original


def _compile(cuda, request):
    builder = _Builder(cuda)
    arch = None
    try:
        ptx, library = {}, None
        for arch in request["archs"]:
            arch = tuple(arch)
            if library is not None:  # typed and lowered once: NVVM alone makes the PTX of the others
                try:
                    ptx[arch] = library.get_asm_str(cc=arch)
                    continue
                except Exception:
                    library = None
            fn = builder.function(request["kernel"])  # anew for each compile: its device functions too
            with _device_of(arch), _library_seen() as seen:
                ptx[arch], _ = cuda.compile_ptx(fn, request["signature"], cc=arch)
            library = seen[-1] if len(seen) == 1 else None
        return {"ok": True, "ptx": ptx}
    except Exception as err:
        where = _location(err, builder.files)
        return {"ok": False, "type": type(err).__name__, "message": str(err), "arch": arch,
                "file": where[0] if where else None, "line": where[1] if where else None}


def _start():
    """Import numba's real CUDA target and compile a one-line kernel: is NVVM there?"""
    os.environ["NUMBA_ENABLE_CUDASIM"] = "0"
    try:
        from numba import cuda

        def probe(x):
            x[0] = 1

        cuda.compile_ptx(probe, "void(float32[:])", cc=PROBE_ARCH)
    except BaseException as err:  # an ImportError, numba's error for a missing NVVM, a failed load
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        return None, {"available": False, "type": type(err).__name__, "message": lines[0] if lines else "",
                      "trace": traceback.format_exc(limit=3)}
    return cuda, {"available": True}


def main():
    replies = os.fdopen(os.dup(1), "wb")  # replies go out on the original stdout;
    os.dup2(2, 1)  # anything numba or a kernel's module prints goes to stderr instead
    requests = sys.stdin.buffer
    cuda, status = _start()
    _send(replies, status)
    while True:
        request = _receive(requests)
        if request is None:
            return
        if cuda is None:
            _send(replies, {"ok": False, "type": status["type"], "message": status["message"],
                            "file": None, "line": None})
        else:
            _send(replies, _compile(cuda, request))


if __name__ == "__main__":
    main()
