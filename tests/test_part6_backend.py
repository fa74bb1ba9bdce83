"""Choosing the backend when `course.kernels` is imported (each case in a fresh Python)."""

import os
import subprocess
import sys

import numpy as np
import pytest

import course.kernels as K
from course.kernels import cuda

pytestmark = pytest.mark.part6


def run(code, **env):
    environ = {k: v for k, v in os.environ.items() if k not in ("NUMBA_ENABLE_CUDASIM", "COURSE_CUDA")}
    environ.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environ, timeout=300)


def test_course_cuda_simulator_forces_the_simulator():
    out = run("import course.kernels as K; print(K.backend()); print(K.backend_reason())", COURSE_CUDA="simulator")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["simulator", "COURSE_CUDA=simulator"]


def test_an_unknown_course_cuda_value_lists_the_known_ones():
    out = run("import course.kernels", COURSE_CUDA="tpu")
    assert out.returncode != 0 and "COURSE_CUDA='tpu' is not a backend; the known ones are gpu, simulator" in out.stderr


def test_numba_imported_first_is_fine_while_numba_cuda_is_not():
    out = run("import numba; import course.kernels as K; print(K.backend()); "
              "import numpy as np; print(K.vector_add(np.ones(3, np.float32), np.ones(3, np.float32)).sum())")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [K.backend(), "6.0"]

    early = run("from numba import cuda; import course.kernels as K; print(K.backend())")
    if K.backend() == "gpu":  # numba.cuda found the GPU by itself: nothing to complain about
        assert early.returncode == 0 and early.stdout.strip() == "gpu", early.stderr
    else:
        assert early.returncode != 0
        if "Restart the kernel" not in early.stderr:
            # Some numba-cuda cannot load its GPU target at all (0.20, which pip picks on macOS, with a
            # newer numba): `from numba import cuda` fails by itself, before course.kernels runs.
            alone = run("from numba import cuda", NUMBA_CUDA_USE_NVIDIA_BINDING="0")
            assert alone.returncode != 0 and "ImportError" in alone.stderr, early.stderr
            assert "course" not in early.stderr.split("ImportError")[0].split("<string>")[-1], early.stderr
        else:
            assert "import course.kernels" in early.stderr


class FakeDriver:
    """Stands in for libcuda: the calls `_find_gpu` makes, answering as a driver with `count` GPUs."""

    def __init__(self, count, version=12040, name=b"Fake GPU"):
        self.count, self.version, self.name = count, version, name

    def cuInit(self, flags):
        return 0

    def cuDeviceGetCount(self, ref):
        ref._obj.value = self.count
        return 0

    def cuDeviceGet(self, ref, i):
        return 0

    def cuDeviceGetName(self, buf, size, device):
        buf.value = self.name
        return 0

    def cuDriverGetVersion(self, ref):
        ref._obj.value = self.version
        return 0


def test_the_gpu_probe_asks_the_driver_and_names_what_is_missing(monkeypatch):
    from importlib import metadata

    from course.kernels import _backend

    def no_driver(name):
        raise OSError(name)

    monkeypatch.setattr(_backend.ctypes, "CDLL", no_driver)
    assert _backend._find_gpu() == (False, "no CUDA driver on this machine")

    monkeypatch.setattr(_backend.ctypes, "CDLL", lambda name: FakeDriver(0))
    assert _backend._find_gpu() == (False, "the CUDA driver sees no GPU")

    monkeypatch.setattr(_backend.ctypes, "CDLL", lambda name: FakeDriver(1, version=12040))
    monkeypatch.setattr(metadata, "version", lambda package: "13.1.0")
    found, why = _backend._find_gpu()
    assert not found and "Fake GPU" in why and "numba-cuda[cu12]" in why

    monkeypatch.setattr(metadata, "version", lambda package: "12.9.0")
    found, why = _backend._find_gpu()
    nvvm_here = True
    try:
        from cuda.bindings import nvvm
        nvvm.version()
    except Exception:
        nvvm_here = False
    assert (found, why) == ((True, "Fake GPU") if nvvm_here else (False, why))
    if not nvvm_here:
        assert "NVVM is missing" in why


def test_without_nvidia_s_bindings_numba_cuda_is_switched_to_its_own(monkeypatch):
    """On macOS pip installs numba-cuda without cuda-bindings, and numba-cuda then refuses to
    import unless told to use its ctypes bindings; the simulator needs neither."""
    from course.kernels import _backend

    monkeypatch.delenv("NUMBA_CUDA_USE_NVIDIA_BINDING", raising=False)
    monkeypatch.setattr(_backend, "_has_nvidia_bindings", lambda: False)
    _backend._use_bindings_that_exist()
    assert os.environ["NUMBA_CUDA_USE_NVIDIA_BINDING"] == "0"
    assert "ctypes bindings" in _backend.bindings() and "cuda-bindings is not installed" in _backend.bindings()

    monkeypatch.setenv("NUMBA_CUDA_USE_NVIDIA_BINDING", "1")  # what the environment says is kept
    _backend._use_bindings_that_exist()
    assert os.environ["NUMBA_CUDA_USE_NVIDIA_BINDING"] == "1"

    monkeypatch.delenv("NUMBA_CUDA_USE_NVIDIA_BINDING")
    monkeypatch.setattr(_backend, "_has_nvidia_bindings", lambda: True)
    _backend._use_bindings_that_exist()
    assert "NUMBA_CUDA_USE_NVIDIA_BINDING" not in os.environ


def _add_one(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] += 1


@pytest.mark.skipif(K.backend() != "simulator", reason="a GPU refuses such launches itself")
def test_a_launch_written_directly_is_held_to_a_gpus_limits_on_the_simulator():
    add_one = K.cuda.jit(_add_one)
    x = np.zeros(8, np.float32)
    add_one[1, 8](x)
    assert x.sum() == 8
    with pytest.raises(ValueError) as direct:
        add_one[2, 2048](x)
    with pytest.raises(ValueError) as through_launch:
        K.launch(add_one, 2, 2048, x)
    assert str(direct.value) == str(through_launch.value) and "1024 threads per block" in str(direct.value)
    with pytest.raises(ValueError, match="the block's z dimension 65 is over the limit of 64"):
        add_one[1, (1, 1, 65)](x)
    with pytest.raises(ValueError, match="100000 bytes of dynamic shared memory"):
        add_one[1, 8, 0, 100_000](x)
