import subprocess
import sys

import pytest

pytestmark = pytest.mark.foundation


def _run(*args):
    return subprocess.run([sys.executable, "-m", "course", *args], capture_output=True, text=True, timeout=300)


def test_doctor_reports_versions_graphviz_and_the_gpu():
    out = _run("doctor")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert any(line.startswith("numpy") for line in lines)
    assert any(line.startswith("dot") for line in lines)
    gpu = [line for line in lines if line.startswith("GPU kernels")]
    assert gpu and ("simulator" in gpu[0] or "real GPU" in gpu[0])
    # numba-cuda's version and the bindings it talks to CUDA through; whether NVVM compiles kernels
    cuda = [line for line in lines if line.startswith("numba-cuda")]
    assert cuda and "through" in cuda[0] and "bindings" in cuda[0], lines
    nvvm = [line for line in lines if line.startswith("NVVM")]
    assert nvvm and nvvm[0].split()[1] in ("yes:", "no:"), lines
    # the CPU kernels' register block, which follows the CPU's vector registers
    block = [line for line in lines if line.startswith("CPU kernels")]
    assert block and ("12 x 32 float32, 512-bit" in block[0] or "6 x 16 float32, 256-bit" in block[0]), lines


def test_help_lists_the_commands():
    out = _run("--help")
    assert out.returncode == 0
    for command in ("assign", "grade", "doctor", "notebooks", "colab", "syllabus"):
        assert command in out.stdout


def test_a_missing_argument_is_reported():
    out = _run("assign")
    assert out.returncode != 0 and "parts" in out.stderr
