"""Shared fixtures for the unit tests."""

import numpy as np
import pytest


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture(autouse=True)
def _skip_needs_ptx_without_nvvm(request):
    """A test marked `needs_ptx` is skipped, with the reason, where NVVM cannot be had. Asked when
    such a test runs, not when its file is collected: asking starts the process that compiles
    kernels, which a worker that runs none of them does not need."""
    if request.node.get_closest_marker("needs_ptx") is not None:
        from course.kernels import compile as gpu

        ok, why = gpu.available()
        if not ok:
            pytest.skip(f"no NVVM to compile for a GPU: {why}")
