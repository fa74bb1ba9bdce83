"""Part 2: optimizers, gradient clipping and a learning-rate schedule.

Each optimizer steps exactly as PyTorch's does for the same settings (the tests check it),
updating the parameter arrays in place. Parameters can be a list, or a list of groups
`{"params": [...], "weight_decay": 0.0, ...}` whose settings override the defaults.
"""

import math

import numpy as np

from .tensor.dispatch import dispatchable


class Optimizer:
    def __init__(self, params, defaults):
        params = list(params)
        if not params:
            raise ValueError(f"{type(self).__name__} got no parameters to optimise")
        groups = params if isinstance(params[0], dict) else [{"params": params}]
        self.param_groups = []
        for group in groups:
            unknown = set(group) - set(defaults) - {"params"}
            if unknown:
                raise ValueError(f"{type(self).__name__}: unknown setting(s) {sorted(unknown)} in a parameter group")
            self.param_groups.append({**defaults, **group, "params": list(group["params"])})
        self.state = {}  # id(parameter) -> its running averages
        self.steps = 0

    def zero_grad(self):
        for group in self.param_groups:
            for p in group["params"]:
                p.grad = None

    def step(self):
        optimizer_step(self)

    def update(self, p, grad, group, state):
        raise NotImplementedError


@dispatchable
def optimizer_step(optimizer):
    """One step of `optimizer`, parameter by parameter. A dispatch point: under
    `course.kernels.use_kernels("cpu")` one kernel call updates every parameter instead."""
    optimizer.steps += 1
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.grad is not None:
                optimizer.update(p, p.grad, group, optimizer.state.setdefault(id(p), {}))


class SGD(Optimizer):
    """p -= lr * v, where v = momentum * v + (grad + weight_decay * p) (v starts as the first gradient)."""

    def __init__(self, params, lr, momentum=0.0, weight_decay=0.0):
        super().__init__(params, {"lr": lr, "momentum": momentum, "weight_decay": weight_decay})

    def update(self, p, grad, group, state):
        if group["weight_decay"]:
            grad = grad + group["weight_decay"] * p.data
        if group["momentum"]:
            if "velocity" not in state:
                state["velocity"] = grad.astype(p.data.dtype)  # a copy, on the parameter's device
            else:
                state["velocity"] *= group["momentum"]
                state["velocity"] += grad
            grad = state["velocity"]
        p.data -= group["lr"] * grad


class Adam(Optimizer):
    """Adam: steps by a running mean of gradients divided by the root of a running mean of their squares.

    Both averages start at zero, so early on they are too small: dividing by (1 - beta**t) corrects it.
    `weight_decay` here adds weight_decay * p to the gradient (L2), as PyTorch's Adam does.
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})

    def decay(self, p, grad, group):
        if group["weight_decay"]:
            grad = grad + group["weight_decay"] * p.data
        return grad

    def update(self, p, grad, group, state):
        grad = self.decay(p, grad, group)
        beta1, beta2 = group["betas"]
        if "m" not in state:
            state["t"] = 0
            state["m"] = np.zeros_like(p.data)
            state["v"] = np.zeros_like(p.data)
        state["t"] += 1
        t, m, v = state["t"], state["m"], state["v"]
        m *= beta1
        m += (1 - beta1) * grad
        v *= beta2
        v += (1 - beta2) * (grad * grad)
        step_size = group["lr"] / (1 - beta1 ** t)
        denom = np.sqrt(v) / math.sqrt(1 - beta2 ** t) + group["eps"]
        p.data -= (step_size * m / denom).astype(p.data.dtype, copy=False)


class AdamW(Adam):
    """Adam with decoupled weight decay: p shrinks by lr * weight_decay * p, apart from the gradient."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)

    def decay(self, p, grad, group):
        if group["weight_decay"]:
            p.data *= 1 - group["lr"] * group["weight_decay"]
        return grad


@dispatchable
def clip_grad_norm_(params, max_norm):
    """Scale all gradients together so their joint L2 norm is at most `max_norm`; return the norm before."""
    grads = [p.grad for p in params if p.grad is not None]
    total = math.sqrt(sum(float(np.vdot(g, g)) for g in grads))
    scale = max_norm / (total + 1e-6)
    if scale < 1:
        for p in params:
            if p.grad is not None:
                p.grad = p.grad * np.asarray(scale, dtype=p.grad.dtype)
    return total


def warmup_cosine(step, warmup_steps, total_steps, min_ratio=0.0):
    """The learning-rate multiplier at `step` (from 0): (step + 1) / warmup_steps during warmup, then
    half a cosine from 1 at warmup_steps down to min_ratio at total_steps (and min_ratio after)."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if step >= total_steps:
        return min_ratio
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


class WarmupCosine:
    """Sets each group's lr to base_lr * warmup_cosine(step, ...); call `step()` after each optimizer step."""

    def __init__(self, optimizer, warmup_steps, total_steps, min_ratio=0.0):
        self.optimizer = optimizer
        self.warmup_steps, self.total_steps, self.min_ratio = warmup_steps, total_steps, min_ratio
        self.base_lrs = [g["lr"] for g in optimizer.param_groups]
        self.last_step = 0
        self._apply()

    def _apply(self):
        factor = warmup_cosine(self.last_step, self.warmup_steps, self.total_steps, self.min_ratio)
        for group, base in zip(self.optimizer.param_groups, self.base_lrs):
            group["lr"] = base * factor

    def step(self):
        self.last_step += 1
        self._apply()

    def get_lr(self):
        return [g["lr"] for g in self.optimizer.param_groups]


__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "clip_grad_norm_", "warmup_cosine", "WarmupCosine"]
