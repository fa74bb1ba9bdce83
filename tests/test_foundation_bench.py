"""The machinery of `make bench` runs: rows are found, each engine runs in a child process with the
thread count it was given, results come back with a median and a spread, the checks of `same`
catch engines that disagree, and the table prints with the machine in its header. No timing is
asserted: speed is what the bench reports, not what a test can judge on a shared machine."""

import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import __main__ as bench
from benchmarks.harness import Row, describe, machine, summary, vector_isa

pytestmark = pytest.mark.foundation
ROOT = Path(__file__).resolve().parent.parent


def test_summary_gives_the_median_and_the_spread():
    s = summary([0.5, 0.1, 0.3, 0.2, 0.4])
    assert (s["median"], s["min"], s["max"], s["n"]) == (0.3, 0.1, 0.5, 5)
    assert s["q1"] == pytest.approx(0.2) and s["q3"] == pytest.approx(0.4)


def test_vector_instructions_are_read_from_the_cpu_flags():
    assert vector_isa({"avx2", "avx512f", "fma"}).startswith("AVX-512")
    assert vector_isa({"avx", "avx2", "fma"}).startswith("AVX2")


def test_the_header_names_the_cpu_its_vectors_and_the_threads():
    info = machine(2)
    line1, line2 = describe(info)
    assert info["cpu"] and info["cpu"] in line1 and info["vector"] in line1
    assert "2 threads per engine" in line2 and f"NumPy {info['numpy']}" in line2


def test_every_registered_row_can_be_listed():
    out = subprocess.run([sys.executable, "-m", "benchmarks", "--list"], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    keys = [line.split()[0] for line in out.stdout.splitlines()]
    for key in ("gpt", "mlp", "matmul-512", "matmul-1024"):
        assert key in keys
    assert len(set(keys)) == len(keys), "two rows share a key"


def test_a_row_runs_each_engine_in_its_own_process():
    rows = {r.key: r for r in bench.importlib.import_module("benchmarks.bench_mlp").ROWS}
    result = bench.run_row("bench_mlp", rows["mlp"], threads=1, quick=True)
    for engine in ("course", "reference"):
        t = result[engine]
        assert "error" not in t, t
        assert t["n"] == 2 and 0 < t["min"] <= t["median"] <= t["max"]
    assert result["ratio"] == pytest.approx(result["course"]["median"] / result["reference"]["median"])
    assert result["same"] is True  # the tensor engine and micrograd computed the same first loss


def test_engines_that_disagree_are_flagged(monkeypatch):
    # Two engines whose first results (their `check` numbers) differ: the row says so.
    row = Row("x", "mismatched", "matmul_numpy", "matmul_numpy", threads=1, same=1e-6)

    def fake_child(args, timeout=600):
        return {"times": [0.1, 0.2], "check": 8.0 if args[2] == "course" else 16.0, "label": None}

    monkeypatch.setattr(bench, "_child", fake_child)
    result = bench.run_row("bench_kernels", row, threads=1)
    assert result["same"] is False and "RESULTS DIFFER" in result["note"]


def test_the_child_reports_threads_and_a_skip_as_json():
    out = subprocess.run([sys.executable, "-m", "benchmarks.run_one", "bench_kernels", "matmul-512", "reference",
                          "--threads", "2", "--warmup", "1", "--steps", "2"], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    import json

    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["threads"] == 1  # the row fixes one thread, whatever the run asks for
    assert result["blas_threads"] in ([1], [])  # and NumPy's BLAS runs one ([]: no BLAS pool found)
    assert len(result["times"]) == 2 and result["check"] > 0


def test_the_markdown_table_names_the_machine(capsys):
    info = machine(2)
    result = {"key": "k", "name": "a row", "threads": 2, "course_label": "course", "reference_label": "ref",
              "note": "", "course": summary([0.010, 0.012, 0.011]), "reference": summary([0.020, 0.022, 0.021]),
              "ratio": 0.5}
    bench.print_markdown([result], info)
    out = capsys.readouterr().out
    assert info["cpu"] in out and info["vector"] in out
    assert "| a row | 2 | 11 ms (10 ms-12 ms) | ref 21 ms (20 ms-22 ms) | 0.5 |" in out


def test_an_unknown_row_is_reported():
    out = subprocess.run([sys.executable, "-m", "benchmarks", "no-such-row"], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert out.returncode != 0 and "no row matches no-such-row" in out.stderr


@pytest.mark.parametrize("module", ["benchmarks.profile_gpu", "benchmarks.matmul_steps"])
def test_the_gpu_tools_say_when_there_is_no_gpu(module):
    import course.kernels as K

    if K.backend() == "gpu":
        pytest.skip(f"a GPU is here: it runs for real (python -m {module})")
    out = subprocess.run([sys.executable, "-m", module], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 0 and out.stdout.startswith("skipped: no GPU here"), out.stdout + out.stderr


def test_side_by_side_alternates_the_engines_and_gives_the_median_ratio():
    from benchmarks import side_by_side

    calls = []
    course = lambda: calls.append("course")  # noqa: E731
    reference = lambda: calls.append("reference")  # noqa: E731
    course_times, reference_times = side_by_side.alternate(course, reference, pairs=3, warmup=1)
    assert calls == ["course", "reference"] * 4 and len(course_times) == len(reference_times) == 3
    r = side_by_side.report([2.0, 4.0, 30.0], [1.0, 1.0, 10.0])  # ratios 2, 4, 3: a slow moment hits both
    assert r["median_ratio"] == 3.0 and r["course_median"] == 4.0 and r["reference_median"] == 1.0


def test_numba_s_threads_stay_off_pytorch_s_openmp():
    # The bench's processes start numba's pool (the course's kernels ask its thread count); on
    # OpenMP it would share PyTorch's runtime and slow PyTorch's steps down.
    code = ("from benchmarks.harness import set_threads; set_threads(2); import numba; "
            "numba.get_num_threads(); print(numba.threading_layer())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["workqueue"]
