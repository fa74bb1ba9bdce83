"""pytest configuration for the whole repository: part markers and repeatable runs."""

import gc
import os
import re

import pytest

# Notebooks and tests of part N are marked `partN`, so `pytest -m part2` runs one part.
PART_FOLDER = re.compile(r"(?:^|[/\\])(\d)-[a-z]+[/\\]")

os.environ.setdefault("PYTHONHASHSEED", "0")
os.environ.setdefault("COURSE_QUIET", "1")
os.environ.setdefault("TQDM_DISABLE", "1")

try:
    from hypothesis import settings

    settings.register_profile("course", derandomize=True, deadline=None, max_examples=40)
    settings.load_profile("course")
except ImportError:  # hypothesis is part of the dev extra
    pass


# The files that take longest on a 2-core machine, longest first. `make test` hands whole files to its
# two workers (--dist loadfile), each to whichever is free, in this order; so the short files come
# last, and neither worker ends the run waiting alone on a long one. (xdist's own order, the files
# with the most tests first, puts a file of two long tests at the very end.) The three that compile
# the most CPU kernels (cpu, fused, device) are kept apart, so that the two workers do not compile
# the same kernel at the same time.
LONGEST_FIRST = [
    "tests/test_foundation_grading.py",
    "tests/test_part6_exercises.py",
    "tests/test_part6_compile.py",
    "tests/test_part6_cpu.py",
    "tests/test_foundation_browser.py",  # JupyterLab in Chromium, where CI installs them
    "notebooks/4-gpt/4.4-training-and-sampling.ipynb",
    "notebooks/5-mamba/5.4-mamba-vs-gpt.ipynb",
    "tests/test_part6_fused.py",
    "notebooks/6-kernels/6.3-matrix-multiplication.ipynb",
    "tests/test_foundation_grading_attacks.py",
    "tests/test_foundation_lab.py",
    "notebooks/6-kernels/6.5-fusion-and-flash-attention.ipynb",
    "notebooks/1-micrograd/1.3-neural-net.ipynb",
    "notebooks/6-kernels/6.2-shared-memory.ipynb",
    "solutions/6-kernels/6.3-matrix-multiplication.ipynb",
    "tests/test_part2_tensor.py",
    "notebooks/2-tensors/2.1-from-scalars-to-arrays.ipynb",
    "tests/test_foundation_grading_timeouts.py",
    "tests/test_part6_exercises_device.py",
    "tests/test_foundation_cli.py",
    "notebooks/1-micrograd/1.2-backprop.ipynb",
    "tests/test_foundation_bench.py",
    "notebooks/5-mamba/5.3-the-mamba-model.ipynb",
    "notebooks/4-gpt/4.1-tokenization.ipynb",
    "notebooks/2-tensors/2.2-modules-and-optimizers.ipynb",
    "solutions/6-kernels/6.4-kernels-in-the-engine.ipynb",
    "notebooks/2-tensors/2.3-digits-classifier.ipynb",
    "tests/test_part6_device.py",
    "tests/test_foundation_learner_setup.py",
    "notebooks/4-gpt/4.2-attention.ipynb",
    "notebooks/3-minitf/3.3-graph-compiler.ipynb",
    "notebooks/5-mamba/5.2-selective-scan.ipynb",
    "solutions/6-kernels/6.6-tensors-on-the-gpu.ipynb",
    "solutions/6-kernels/6.1-execution-model.ipynb",
    "solutions/6-kernels/6.2-shared-memory.ipynb",
    "notebooks/6-kernels/6.1-execution-model.ipynb",
    "notebooks/6-kernels/6.4-kernels-in-the-engine.ipynb",
    "tests/test_part1_exercises.py",
    "notebooks/6-kernels/6.6-tensors-on-the-gpu.ipynb",
]  # then the rest, each under 4 s, in the order pytest collects them
_RANK = {path: i for i, path in enumerate(LONGEST_FIRST)}


def pytest_configure(config):
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist's reordering, which would undo ours
        config.option.loadscopereorder = False


def pytest_collection_finish(session):
    # What collection built (thousands of test items, the modules) lives until the end: frozen, it is
    # no longer walked by every later garbage collection, which tests that make many objects trigger.
    gc.freeze()


def pytest_ignore_collect(collection_path, config):
    """JupyterLab keeps a copy of every notebook it opens in `.ipynb_checkpoints/`: never a test."""
    if ".ipynb_checkpoints" in collection_path.parts:
        return True
    return None


def pytest_collection_modifyitems(config, items):
    root = config.rootpath

    def rank(item):
        try:
            return _RANK.get(item.path.relative_to(root).as_posix(), len(_RANK))
        except ValueError:
            return len(_RANK)

    items.sort(key=rank)  # stable: the tests of a file, and the cells of a notebook, keep their order
    for item in items:
        path = str(item.fspath)
        found = PART_FOLDER.search(path)
        if found and path.endswith(".ipynb"):
            item.add_marker(getattr(pytest.mark, f"part{found.group(1)}"))
