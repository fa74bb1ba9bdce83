"""Part 2: a tensor autograd engine on NumPy.

    from course.tensor import Tensor, no_grad, operation
    import course.tensor.functional as F

`operation(name, data, inputs, backward)` adds an operation with its own forward and backward
(see `course.tensor.tensor`); `course.tensor.dispatch` is where part 6 swaps kernels in.
"""

from . import dispatch, functional, memory
from .functional import manual_seed
from .gradcheck import gradcheck, numerical_gradient
from .tensor import Tensor, is_grad_enabled, matmul, no_grad, operation, unbroadcast

__all__ = ["Tensor", "no_grad", "is_grad_enabled", "operation", "matmul", "unbroadcast", "dispatch",
           "functional", "manual_seed", "gradcheck", "numerical_gradient"]
