"""The engine keeps freed memory for the next arrays (course.tensor.memory): arrays of a few
megabytes, made and freed round after round as a training step makes them, come without page
faults once the first round has run; with the setting off, every round pays for fresh pages."""

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.part2

ROUNDS = """
import resource, numpy as np, course.tensor
faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(3):
    before = faults()
    arrays = [np.ones(1 << 19) for _ in range(3)]  # three 4 MB arrays, written, then freed
    del arrays
print(faults() - before, course.tensor.memory._kept)
"""


def _last_round(setting):
    env = dict(os.environ, COURSE_KEEP_FREED_MEMORY=setting)
    out = subprocess.run([sys.executable, "-c", ROUNDS], env=env, capture_output=True, text=True, check=True).stdout
    faults, kept = out.split()
    return int(faults), kept


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the setting is glibc's (Linux); elsewhere it does nothing")
def test_freed_memory_is_kept_for_the_next_arrays():
    faults, kept = _last_round("1")
    if kept != "True":
        pytest.skip("this C library has no mallopt (not glibc)")
    pages = 3 * (4 << 20) // 4096
    assert faults < pages // 10, f"{faults} page faults for arrays that reuse freed memory"
    faults_off, kept_off = _last_round("0")
    assert kept_off == "None", "COURSE_KEEP_FREED_MEMORY=0 must leave malloc as it is"
    assert faults_off > pages // 4, f"only {faults_off} page faults with the setting off: the test no longer shows it"


def test_where_there_is_no_glibc_it_does_nothing_and_says_so(monkeypatch):
    from course.tensor import memory

    monkeypatch.setattr(memory, "_kept", None)
    monkeypatch.setattr(sys, "platform", "darwin")
    assert memory.keep_freed_memory() is False
