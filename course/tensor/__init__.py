"""Part 2: a tensor autograd engine on NumPy.

    from course.tensor import Tensor, no_grad
    import course.tensor.functional as F
"""

from . import functional
from .functional import manual_seed
from .gradcheck import gradcheck, numerical_gradient
from .tensor import Tensor, is_grad_enabled, no_grad, unbroadcast

__all__ = ["Tensor", "no_grad", "is_grad_enabled", "unbroadcast", "functional", "manual_seed",
           "gradcheck", "numerical_gradient"]
