"""Keeping freed memory for the next arrays: the one setting the engine makes to the C allocator.

Every operation of the engine returns a new array, and a training step frees about as many as it
makes, most of them a megabyte or more. NumPy takes their memory from the C library's `malloc`,
and on Linux (glibc) `malloc` gives a large block back to the operating system as soon as it is
freed: blocks of 128 KB and up are mapped on their own and unmapped when freed (the limit grows
with the blocks freed, up to 32 MB), and the top of the heap is handed back once enough of it is
free. The next array of that size then gets fresh pages, and the first write to each 4 KB page
is a page fault: a trip into the operating system, which finds a page and fills it with zeros.
The bench's GPT training step (4 layers, 128 wide, 32 x 64 tokens, 2 threads) made 7,300 page
faults a step on the NumPy path and 18,000 to 21,000 on the CPU kernels; with freed memory kept,
none, and the step on the kernels took 175-180 ms instead of 230-245 (medians of 9 steps, a 2-core
AMD EPYC).

`keep_freed_memory()` asks `malloc` to keep what is freed for the next arrays (glibc's `mallopt`:
blocks up to 32 MB come from the heap, and the heap is handed back only past 1 GB free). Importing
`course.tensor` calls it, unless the environment sets COURSE_KEEP_FREED_MEMORY=0. A process then
keeps the memory of its largest step until it ends, as PyTorch's and TensorFlow's allocators do.
Where `mallopt` does not exist (macOS, Windows, a C library other than glibc) it does nothing and
returns False.
"""

import ctypes
import ctypes.util
import os
import sys

# mallopt's parameters (glibc's malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_LIMIT = 32 << 20  # glibc's largest allowed value: blocks larger than this are still mapped on their own
TRIM_LIMIT = 1 << 30

_kept = None


def keep_freed_memory():
    """Ask glibc's malloc to keep freed memory for reuse; True where it did, False where it cannot."""
    global _kept
    if _kept is None:
        _kept = False
        if sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
                mallopt = libc.mallopt
            except (OSError, AttributeError):  # no glibc (musl, for one, has no mallopt)
                return False
            mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
            _kept = bool(mallopt(M_MMAP_THRESHOLD, MMAP_LIMIT)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_LIMIT))
    return _kept


if os.environ.get("COURSE_KEEP_FREED_MEMORY", "1") != "0":
    keep_freed_memory()
