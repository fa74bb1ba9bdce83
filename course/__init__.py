"""The shared package of the course: each part of the course adds one layer.

    course.micrograd   part 1: a scalar autograd engine
    course.tensor      part 2: a tensor autograd engine on NumPy (with course.nn, course.optim)
    course.minitf      part 3: a define-then-run graph library with a small compiler
    course.gpt         part 4: minGPT on course.tensor
    course.mamba       part 5: a minimal Mamba on course.tensor
    course.kernels     part 6: GPU kernels with Numba-CUDA

Shared helpers: course.data (data sets), course.viz (drawings), course.exercises (check).
Each layer imports only the layers above it in this list, never a later one.
"""

__version__ = "0.1.0"
