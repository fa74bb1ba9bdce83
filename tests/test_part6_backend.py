"""Choosing the backend when `course.kernels` is imported (each case in a fresh Python)."""

import os
import subprocess
import sys

import pytest

import course.kernels as K

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
        assert "Restart the kernel" in early.stderr and "import course.kernels" in early.stderr
