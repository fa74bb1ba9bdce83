"""Compiling kernels for real GPUs, on a machine that has none.

The simulator runs a kernel as Python, so it accepts code that no GPU would: a shared array
whose size is only known at run time, a Python list inside a kernel. numba's `compile_ptx`
compiles a kernel to PTX, the GPU's assembly, for a chosen architecture without needing the GPU;
it needs NVIDIA's NVVM compiler, which pip installs (`nvidia-cuda-nvcc-cu12` has NVVM,
`nvidia-cuda-nvrtc` the list of architectures numba asks for; both are in the `dev` extra).

    from course.kernels import compile as C
    C.available()                     # (True, "...") or (False, why and what to install)
    ptx = C.compile_ptx(kernel, (x, alpha, out))          # {(7, 5): "...", (9, 0): "..."}
    ptx = C.compile_ptx(kernel, "void(float32[:], float32, float32[:])", archs=((8, 0),))
    C.signature((x, alpha, out))      # the argument types numba infers from example arguments

A kernel that cannot compile raises `CompileError`, whose message is one line: numba's reason
and the line of the kernel where numba stopped.

numba's CUDA compiler cannot run in a process where the simulator is on (the simulator replaces
it), so compiling happens in a second Python process, started on first use and kept for the
next kernels (`_ptx_worker.py`). The kernel travels there as its code with the globals it names.
"""

import atexit
import linecache
import marshal
import os
import pickle
import re
import struct
import subprocess
import sys
import threading
import types

# The architectures every kernel is compiled for: Turing (the T4 of Colab's free GPU runtime)
# and Hopper (the H100, a current data-centre GPU).
ARCHS = ((7, 5), (9, 0))
INSTALL = 'pip install nvidia-cuda-nvcc-cu12 "nvidia-cuda-nvrtc==13.*"  (or "numba-cuda[cu12]")'
_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_ptx_worker.py")


class CompileError(Exception):
    """A kernel numba cannot compile for a GPU: the reason and where, in one line."""

    def __init__(self, kernel, arch, reason, line=None, source=None, detail=""):
        self.kernel, self.arch, self.reason = kernel, arch, reason
        self.line, self.source, self.detail = line, source, detail
        where = ""
        if line is not None:
            where = f", at line {line} of {kernel}" + (f": `{source}`" if source else "")
        super().__init__(f"numba cannot compile {kernel} for a GPU (sm_{arch[0]}{arch[1]}): {reason}{where}")


# ----- the worker process --------------------------------------------------------------------------


class _Worker:
    def __init__(self):
        env = dict(os.environ)
        env.pop("NUMBA_ENABLE_CUDASIM", None)
        # the modules a kernel names are imported there by name: from where they are found here
        here = os.path.dirname(_WORKER)
        paths = [os.path.abspath(p or os.getcwd()) for p in sys.path]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(p for p in paths if p != here and os.path.isdir(p)))
        if "NUMBA_CUDA_USE_NVIDIA_BINDING" not in env:
            from ._backend import _has_nvidia_bindings
            if not _has_nvidia_bindings():  # old numba-cuda refuses to import without them otherwise
                env["NUMBA_CUDA_USE_NVIDIA_BINDING"] = "0"
        self.process = subprocess.Popen([sys.executable, _WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.DEVNULL, env=env)
        self.lock = threading.Lock()
        self.status = self._receive() or {"available": False, "type": "RuntimeError",
                                          "message": "the compiling process ended before it answered"}

    def _receive(self):
        head = self.process.stdout.read(8)
        if len(head) < 8:
            return None
        (size,) = struct.unpack("<Q", head)
        return pickle.loads(self.process.stdout.read(size))

    def ask(self, request):
        with self.lock:
            data = pickle.dumps(request)
            try:
                self.process.stdin.write(struct.pack("<Q", len(data)) + data)
                self.process.stdin.flush()
            except OSError:
                return None
            return self._receive()

    def close(self):
        try:
            self.process.stdin.close()
            self.process.wait(timeout=10)
        except Exception:
            self.process.kill()


_worker = None
_worker_lock = threading.Lock()
_cache = {}


def _get_worker():
    global _worker
    with _worker_lock:
        if _worker is None or _worker.process.poll() is not None:
            _worker = _Worker()
            atexit.register(_worker.close)
        return _worker


def available():
    """(True, "") where numba can compile kernels for a GPU here, else (False, why, with what to install)."""
    try:
        status = _get_worker().status
    except Exception as err:  # the second Python process could not be started
        return False, f"the process that compiles kernels could not start ({type(err).__name__}: {err})"
    if status["available"]:
        return True, ""
    message = status.get("message", "")
    hint = INSTALL
    if status.get("type") == "ImportError":
        why, hint = f"numba-cuda's GPU compiler does not import here ({message})", ""
    elif re.search(r"nvvm|libdevice|nvrtc|cuda_paths|not found|No such file", message, re.I):
        why = f"NVVM, NVIDIA's compiler, is not installed ({message})"
    else:
        why = f"{status.get('type')}: {message}"
    if sys.platform == "darwin":
        hint = "NVIDIA publishes no NVVM for macOS"
    return False, f"{why}: {hint}" if hint else why


# ----- what travels to the worker ------------------------------------------------------------------


def _names(code):
    """Every name a code object (and the functions and comprehensions inside it) looks up."""
    names = set(code.co_names) | set(code.co_freevars)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


def _jitted(value):
    """(py_func, is_device) for a @cuda.jit function, on the simulator or a GPU; else None."""
    fn = getattr(value, "py_func", None)
    if not isinstance(fn, types.FunctionType) or isinstance(value, types.FunctionType):
        return None
    if ".cuda" not in type(value).__module__ and not hasattr(value, "_device"):
        return None  # numba.njit for the CPU, or another wrapper
    device = getattr(value, "_device", None)  # the simulator's FakeCUDAKernel
    if device is None:
        device = bool(getattr(value, "targetoptions", {}).get("device", False))
    return fn, bool(device)


def _encode(value, names, seen):
    if isinstance(value, types.ModuleType):
        if value.__name__ == "course" or value.__name__.startswith("course."):
            # importing the course there would choose a CUDA backend: send what the kernel names
            if id(value) in seen:
                return ("unavailable", f"module {value.__name__}")
            inner = seen | {id(value)}
            attrs = {n: _encode(getattr(value, n), names, inner) for n in sorted(names) if hasattr(value, n)}
            return ("namespace", value.__name__, attrs)
        return ("module", value.__name__)
    jitted = _jitted(value)
    if jitted is not None:
        return ("jit", _encode_function(jitted[0], seen), jitted[1])
    if isinstance(value, types.FunctionType):
        return _encode_function(value, seen)
    if hasattr(value, "py_func") or type(value).__module__.split(".")[0] == "course":
        # numba.njit functions and the course's objects: they would import the course there
        return ("unavailable", f"{type(value).__name__} object")
    try:
        return ("value", pickle.dumps(value))
    except Exception:
        return ("unavailable", f"{type(value).__name__} object")


def _encode_function(fn, seen=None):
    seen = set() if seen is None else seen
    if id(fn) in seen:  # a device function that calls itself
        return ("unavailable", f"recursive call of {fn.__name__}")
    seen = seen | {id(fn)}
    code = fn.__code__
    names = _names(code)
    globs = {name: _encode(fn.__globals__[name], names, seen) for name in sorted(names) if name in fn.__globals__}
    closure = []
    for cell in fn.__closure__ or ():
        try:
            closure.append(_encode(cell.cell_contents, names, seen))
        except ValueError:  # an empty cell
            closure.append(None)
    defaults = [_encode(v, names, seen) for v in fn.__defaults__] if fn.__defaults__ is not None else None
    return ("function", marshal.dumps(code), fn.__name__, globs, closure, defaults)


def _argtype(value):
    import numba
    try:
        return numba.typeof(value)
    except Exception:
        if hasattr(value, "copy_to_host"):  # a device array of the simulator, which numba cannot type
            return numba.typeof(value.copy_to_host())
        raise TypeError(f"numba cannot type an argument of type {type(value).__name__}") from None


def signature(args):
    """The argument types numba infers for these example arguments (numba.typeof of each)."""
    return tuple(_argtype(a) for a in args)


def _is_signature(spec):
    if isinstance(spec, str):
        return True
    from numba.core import types as nbtypes
    from numba.core.typing.templates import Signature
    return isinstance(spec, Signature) or (isinstance(spec, (tuple, list)) and len(spec) > 0
                                           and all(isinstance(t, nbtypes.Type) for t in spec))


def kernel_function(kernel):
    """The Python function behind a kernel (@cuda.jit on a GPU or the simulator, or a plain function)."""
    jitted = _jitted(kernel)
    fn = jitted[0] if jitted else kernel
    if not isinstance(fn, types.FunctionType):
        raise TypeError(f"expected a kernel (a function decorated with @cuda.jit), got {type(kernel).__name__}")
    return fn


# ----- the error, in one line ----------------------------------------------------------------------


_NOISE = re.compile(r"^(Failed in .* pipeline|During:|File \"|Enable logging|For more information|\^|\s*$)")
_ALLOCATES = ("a kernel cannot allocate memory as it runs (a Python list, a new NumPy array, a string): use "
              "cuda.local.array or cuda.shared.array of a constant size")
_EXPLAIN = [
    (re.compile(r"(shared|local)\.array found for signature"),
     "the size of a shared or local array must be a constant known when the kernel is compiled (a number or "
     "a global constant), not a value the kernel reads or computes"),
    (re.compile(r"NRT required|function (zeros|empty|ones|full|array|zeros_like|empty_like) found"), _ALLOCATES),
]


def _reason(message):
    text = re.sub(r"\x1b\[[0-9;]*m", "", message)
    text = re.sub(r"Function\(<(?:built-in )?function ([\w.]+)(?: at 0x[0-9a-f]+)?>\)", r"\1", text)
    text = re.sub(r"<function ([\w.]+) at 0x[0-9a-f]+>", r"\1", text)
    lines = [line.strip() for line in text.splitlines()]
    useful = [line for line in lines if line and not _NOISE.match(line)]
    if not useful:
        return "numba gave no reason"
    reason = useful[0].rstrip(":")
    following = [line for line in useful[1:3] if line.startswith(">>>")]
    if following:
        reason += " " + following[0].lstrip("> ").strip()
    for pattern, explanation in _EXPLAIN:
        if pattern.search(reason):
            reason += f" ({explanation})"
            break
    return reason


def _where(fn, file, line):
    """The line numbered from the kernel's `def`, and its text, where that can be found."""
    if file is None or line is None:
        return None, None
    code = fn.__code__
    source = linecache.getline(file, line).strip() or None
    if file != code.co_filename or line < code.co_firstlineno:
        return line, source
    first = code.co_firstlineno
    for offset in range(0, 50):  # decorators come before the def, which is line 1 of the kernel
        text = linecache.getline(file, first + offset).lstrip()
        if text.startswith(("def ", "async def ")) or not text:
            first += offset
            break
    return line - first + 1, source


# ----- compiling -----------------------------------------------------------------------------------


def compile_ptx(kernel, args, archs=ARCHS):
    """Compile `kernel` to PTX for each architecture in `archs`; returns {arch: ptx text}.

    `args` are example arguments (their types become the signature, by numba's typeof), or a
    signature (a string such as "void(float32[:], float32)", or a tuple of numba types).
    Raises CompileError when numba cannot compile it, RuntimeError where NVVM is missing."""
    fn = kernel_function(kernel)
    sig = args if _is_signature(args) else signature(args)
    archs = tuple(tuple(int(v) for v in a) for a in archs)
    request = {"kernel": _encode_function(fn), "signature": sig, "archs": archs}
    key = (pickle.dumps(request["kernel"]), repr(sig), archs)  # numba's types do not pickle to the same bytes twice
    reply = _cache.get(key)
    if reply is None:
        ok, why = available()
        if not ok:
            raise RuntimeError(f"cannot compile kernels for a GPU here: {why}")
        reply = _get_worker().ask(request)
        if reply is None:
            raise RuntimeError("the process compiling kernels ended; the next call starts a new one")
        if len(_cache) > 512:
            _cache.clear()
        _cache[key] = reply
    if reply["ok"]:
        return dict(reply["ptx"])
    line, source = _where(fn, reply["file"], reply["line"])
    raise CompileError(fn.__name__, tuple(reply.get("arch") or archs[0]), _reason(reply["message"]), line, source,
                       detail=f"{reply['type']}: {reply['message']}")
