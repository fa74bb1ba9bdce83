"""Choosing where CUDA kernels run: a real GPU, or Numba's CUDA simulator.

Numba decides once, when `numba.cuda` is first imported, whether `@cuda.jit` compiles for a GPU
or runs each CUDA thread as a Python thread on the CPU (the simulator, switched on by the
environment variable NUMBA_ENABLE_CUDASIM=1). So the choice has to be made before that import,
and without numba's help: we ask the CUDA driver directly (through ctypes) whether it sees a
GPU, then check that numba-cuda can use it: its CUDA bindings are not newer than the driver
(a CUDA 12 driver needs `pip install "numba-cuda[cu12]"`) and the NVVM compiler is installed.
Where it cannot, kernels run on the simulator and `backend_reason()` says what to install.

    COURSE_CUDA=simulator   always use the simulator (also when there is a GPU)
    COURSE_CUDA=gpu         insist on a GPU: an error if there is none
"""

import ctypes
import importlib.util
import os
import sys

_CHOICES = ("gpu", "simulator")
_RESTART = ("Restart the kernel (Kernel > Restart) and run `import course.kernels` before anything "
            "that imports numba.cuda")


def _find_gpu():
    """(True, its name) if the CUDA driver reports a GPU that numba-cuda can compile for, else (False, why)."""
    names = {"win32": ["nvcuda.dll"], "darwin": []}.get(sys.platform, ["libcuda.so.1", "libcuda.so"])
    driver = None
    for name in names:
        try:
            driver = ctypes.CDLL(name)
            break
        except OSError:
            continue
    if driver is None:
        return False, "no CUDA driver on this machine"
    count = ctypes.c_int(0)
    if driver.cuInit(0) != 0 or driver.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value == 0:
        return False, "the CUDA driver sees no GPU"
    device, raw = ctypes.c_int(0), ctypes.create_string_buffer(256)
    driver.cuDeviceGet(ctypes.byref(device), 0)
    driver.cuDeviceGetName(raw, 256, device)
    gpu = raw.value.decode(errors="replace") or "a GPU"
    version = ctypes.c_int(0)
    driver.cuDriverGetVersion(ctypes.byref(version))
    driver_major = version.value // 1000
    try:  # numba-cuda talks to the driver through cuda-bindings, whose major version must not be newer
        from importlib.metadata import version as installed
        bindings_major = int(installed("cuda-bindings").split(".")[0])
    except Exception:
        bindings_major = None
    if bindings_major is not None and driver_major and bindings_major > driver_major:
        return False, (f"{gpu} is there, but its driver speaks CUDA {driver_major} and numba-cuda's "
                       f"cuda-bindings {bindings_major}: pip install 'numba-cuda[cu{driver_major}]'")
    try:  # numba-cuda compiles kernels with NVVM, which comes with the CUDA toolkit's pip wheels
        from cuda.bindings import nvvm
        nvvm.version()
    except Exception:
        return False, (f"{gpu} is there, but numba-cuda cannot compile for it (NVVM is missing: "
                       f"pip install 'numba-cuda[cu{driver_major or 12}]')")
    return True, gpu


def _has_nvidia_bindings():
    """Whether NVIDIA's `cuda-bindings` package is installed (it has no macOS wheel)."""
    try:
        return importlib.util.find_spec("cuda") is not None and importlib.util.find_spec("cuda.bindings") is not None
    except (ImportError, ValueError):
        return False


def _use_bindings_that_exist():
    """numba-cuda talks to CUDA through NVIDIA's cuda-bindings by default, and refuses to import
    without them, although the simulator needs no CUDA at all. Where they are missing (on macOS
    pip installs numba-cuda without them), switch numba-cuda to its own ctypes bindings, unless
    the environment already says which to use."""
    if "NUMBA_CUDA_USE_NVIDIA_BINDING" not in os.environ and not _has_nvidia_bindings():
        os.environ["NUMBA_CUDA_USE_NVIDIA_BINDING"] = "0"


def bindings():
    """Which bindings numba-cuda talks to CUDA through, in words (for `python -m course doctor`)."""
    if os.environ.get("NUMBA_CUDA_USE_NVIDIA_BINDING", "").strip().lower() in ("0", "false", "no", "off"):
        why = "" if _has_nvidia_bindings() else ": cuda-bindings is not installed"
        return f"numba-cuda's ctypes bindings (NUMBA_CUDA_USE_NVIDIA_BINDING=0{why})"
    from importlib.metadata import PackageNotFoundError, version
    try:
        return f"NVIDIA's cuda-bindings {version('cuda-bindings')}"
    except PackageNotFoundError:
        return "NVIDIA's cuda-bindings (version unknown)"


def _running_simulator(cuda):
    return cuda.jit.__module__.startswith("numba.cuda.simulator")


def choose():
    """Pick the backend, import numba.cuda accordingly, and return (backend, cuda module, why)."""
    forced = os.environ.get("COURSE_CUDA", "").strip().lower()
    if forced and forced not in _CHOICES:
        raise ValueError(f"COURSE_CUDA={forced!r} is not a backend; the known ones are {', '.join(_CHOICES)}")

    if "numba.cuda" in sys.modules:  # too late to choose: take what is there, if it can work
        from numba import cuda
        if _running_simulator(cuda):
            if forced == "gpu":
                raise RuntimeError(f"COURSE_CUDA=gpu, but numba.cuda was imported with the simulator on. {_RESTART}.")
            return "simulator", cuda, "numba.cuda was already imported with the simulator"
        if forced == "simulator":
            raise RuntimeError(f"COURSE_CUDA=simulator, but numba.cuda was imported without the simulator. "
                               f"{_RESTART}, or set NUMBA_ENABLE_CUDASIM=1 before starting Python.")
        if not cuda.is_available():
            raise RuntimeError(f"numba.cuda was imported before course.kernels, without the CUDA simulator, "
                               f"and there is no usable GPU, so no kernel could run. {_RESTART}: it then "
                               f"switches the simulator on by itself.")
        return "gpu", cuda, "numba.cuda was already imported and finds a GPU"

    if forced == "simulator":
        use_gpu, why = False, "COURSE_CUDA=simulator"
    elif os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" and forced != "gpu":
        use_gpu, why = False, "NUMBA_ENABLE_CUDASIM=1 is set"
    else:
        use_gpu, why = _find_gpu()
        if forced == "gpu" and not use_gpu:
            raise RuntimeError(f"COURSE_CUDA=gpu, but {why}")
        if not use_gpu:
            why = f"{why}: CUDA kernels run on Numba's CUDA simulator"

    os.environ["NUMBA_ENABLE_CUDASIM"] = "0" if use_gpu else "1"
    _use_bindings_that_exist()
    if "numba" in sys.modules:  # numba itself (not numba.cuda) is loaded: make it reread the setting
        from numba.core import config
        config.reload_config()
    from numba import cuda
    if _running_simulator(cuda) == use_gpu:
        mode = "gpu" if use_gpu else "simulator"
        raise RuntimeError(f"numba.cuda did not start in the mode chosen ({mode}). {_RESTART}.")
    if use_gpu and not cuda.is_available():
        raise RuntimeError(f"numba finds no usable GPU although the driver reports {why}; "
                           f"set COURSE_CUDA=simulator to use the simulator")
    return ("gpu" if use_gpu else "simulator"), cuda, why


def check_alignment(alignment):
    """The rule numba's GPU compiler applies to `cuda.shared.array(..., alignment=)` and
    `cuda.local.array(..., alignment=)`: None, or a power of two that is a multiple of 8 bytes."""
    if alignment is None:
        return
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1) or alignment % 8:
        raise ValueError(f"alignment={alignment!r}: an array's alignment must be a power of two number of "
                         f"bytes that is a multiple of 8 (8, 16, 32, ...)")


def _simulator_takes_alignment():
    """Numba's simulator refuses `alignment=` ("not supported in cudasim"), so a kernel that asks
    for 16-byte aligned tiles (to let the compiler load 4 floats at once) would run on a GPU and
    fail here. The simulator has no addresses to align: check the value as the GPU's compiler
    would, then ignore it. A shared array is one per line of the kernel, whichever thread asks (the
    simulator keys it by the caller's file and line), so the replacement finds the caller itself:
    a wrapper around the original would make every shared array the wrapper's one."""
    import numpy as np
    from numba.core import types
    from numba.cuda.simulator import kernelapi
    from numba.np import numpy_support

    shared, local = kernelapi.FakeCUDAShared.array, kernelapi.FakeCUDALocal.array
    if getattr(shared, "takes_alignment", False):
        return

    def shared_array(self, shape, dtype, alignment=None):
        check_alignment(alignment)
        if shape == 0:  # dynamic shared memory: one buffer for the whole block
            return shared(self, shape, dtype)
        caller = sys._getframe(1)
        where = (caller.f_code.co_filename, caller.f_lineno)
        found = self._allocations.get(where)
        if found is None:
            # The block's threads are Python threads that may all arrive here first: setdefault
            # (one step under the GIL) gives every one of them the array the first one made. A test
            # and a set would let two threads each make one, and the block would not share it.
            numpy_dtype = numpy_support.as_dtype(dtype) if isinstance(dtype, types.Type) else dtype
            found = self._allocations.setdefault(where, np.empty(shape, numpy_dtype))
        return found

    def local_array(self, shape, dtype, alignment=None):
        check_alignment(alignment)
        return local(self, shape, dtype)

    shared_array.takes_alignment = True
    kernelapi.FakeCUDAShared.array = shared_array
    kernelapi.FakeCUDALocal.array = local_array


def _simulator_keeps_gpu_limits():
    """Numba's simulator runs `kernel[2, 2048](...)`, which every GPU refuses (at most 1024 threads
    per block): a launch written directly, not through `launch`, is held to the same limits, with
    the same message. Dynamic shared memory is held to the 48 KiB a block gets without asking."""
    from numba.cuda.simulator import kernel as simulated

    configure = simulated.FakeCUDAKernel.__getitem__

    def __getitem__(self, configuration):
        from .launch import MAX_DYNAMIC_SHARED, check_launch, kernel_name

        if not isinstance(configuration, tuple) or len(configuration) < 2:
            raise TypeError(f"{kernel_name(self)}: launch it as kernel[blocks, threads_per_block](...)")
        name = kernel_name(self)
        check_launch(configuration[0], configuration[1], name)
        if len(configuration) == 4 and configuration[3] > MAX_DYNAMIC_SHARED:
            raise ValueError(f"{name}: {configuration[3]} bytes of dynamic shared memory is more than the "
                             f"{MAX_DYNAMIC_SHARED} bytes a block gets on a GPU")
        return configure(self, configuration)

    simulated.FakeCUDAKernel.__getitem__ = __getitem__


BACKEND, cuda, REASON = choose()
if BACKEND == "simulator":
    _simulator_takes_alignment()
    _simulator_keeps_gpu_limits()

if BACKEND == "gpu":
    # The lessons launch deliberately small grids and pass NumPy arrays: on a real GPU numba would
    # warn about low occupancy and implicit copies on every launch, in red, in every notebook.
    import importlib

    for _name in ("numba.cuda.core.config", "numba.core.config"):  # numba-cuda reads its own copy
        try:
            _config = importlib.import_module(_name)
        except ImportError:
            continue
        _config.CUDA_LOW_OCCUPANCY_WARNINGS = 0
        _config.CUDA_WARN_ON_IMPLICIT_COPY = 0


def backend():
    """Where CUDA kernels run: "gpu" (a real one) or "simulator" (Numba's, on the CPU)."""
    return BACKEND


def backend_reason():
    """Why that backend was chosen, in words (for `python -m course doctor`)."""
    return REASON
