"""A Mamba training step on the course's Tensor against mamba-minimal's Mamba in PyTorch, and the scan.

The model has d_model 128, 4 layers, d_state 16 and a vocabulary of 65 (padded to 72), on 8
sequences of 128 tokens: a step is forward, cross-entropy, backward and an AdamW update. PyTorch
runs the same model written as mamba-minimal writes it (benchmarks/reference_mamba.py: its
selective scan is a Python loop over time), with the same weights, on the CPU, with as many
threads as the course's BLAS; each in a process of its own. Their first losses agree (checked).

The second row times the fastest selective_scan method against the step-by-step loop in NumPy
(the "sequential" method: one vectorised step per time step), forward and backward, for one
sequence of 1024 steps with 128 channels of 16 states in float32; the bench checks once that
both give the same result.

    python -m benchmarks mamba
"""

import numpy as np

from .harness import Row, Skip, torch_threads

BATCH, LENGTH = 8, 128


def _config():
    from course.mamba import MambaConfig

    return MambaConfig(d_model=128, n_layer=4, vocab_size=65)


def _data(config):
    rng = np.random.default_rng(0)
    x = rng.integers(0, config.vocab_size, (BATCH, LENGTH))
    y = rng.integers(0, config.vocab_size, (BATCH, LENGTH))
    return x, y


def course_step(threads):
    from course import optim
    from course.mamba import Mamba
    from course.tensor import functional as F
    from course.train import param_groups

    config = _config()
    x, y = _data(config)
    model = Mamba(config, seed=0)
    opt = optim.AdamW(param_groups(model, 0.1), lr=1e-3)

    def step():
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()

    return step


def torch_step(threads):
    try:
        import torch
    except ImportError:
        raise Skip("PyTorch is not installed") from None
    from course.mamba import Mamba
    from course.train import param_groups

    from .reference_mamba import torch_mamba

    torch_threads(torch, threads)
    config = _config()
    x, y = _data(config)
    model = Mamba(config, seed=0)
    ref = torch_mamba(torch, config)
    ref.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in model.state_dict().items()})
    # The same AdamW groups as the course's (weight decay on the weights of Linear layers), by name.
    decayed = {id(p) for p in param_groups(model, 0.1)[0]["params"]}
    decayed = {n for n, p in model.named_parameters() if id(p) in decayed}
    groups = [{"params": [p for n, p in ref.named_parameters() if n in decayed], "weight_decay": 0.1},
              {"params": [p for n, p in ref.named_parameters() if n not in decayed], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=1e-3)
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)

    def step():
        logits = ref(tx)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ty.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()

    step.label = f"PyTorch {torch.__version__.split('+')[0]} (mamba-minimal)"
    return step


SCAN = dict(b=1, l=1024, d=128, n=16)


def _scan_arrays(b, l, d, n):  # noqa: E741
    rng = np.random.default_rng(0)
    arrays = [rng.normal(size=(b, l, d)), rng.uniform(1e-3, 0.1, (b, l, d)), -np.tile(np.arange(1, n + 1), (d, 1)),
              rng.normal(size=(b, l, n)), rng.normal(size=(b, l, n)), np.ones(d)]
    return [a.astype(np.float32) for a in arrays], rng.normal(size=(b, l, d)).astype(np.float32)


def _forward_backward(method, arrays, g):
    from course.mamba import selective_scan
    from course.tensor import Tensor

    ts = [Tensor(a, requires_grad=True) for a in arrays]
    y = selective_scan(*ts, method=method)
    y.backward(g)
    return [y.data] + [t.grad for t in ts]


def _scan_step(method):
    arrays, g = _scan_arrays(**SCAN)
    if method == "fast":  # once: the fast method gives the step loop's result
        for got, expected in zip(_forward_backward("fast", arrays, g), _forward_backward("sequential", arrays, g)):
            np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-4 * np.abs(expected).max())
    return lambda: _forward_backward(method, arrays, g)[0][0, -1].sum().item()  # a number, for `same`


def scan_fast(threads):
    return _scan_step("fast")


def scan_loop(threads):
    return _scan_step("sequential")


ROWS = [
    Row("mamba", f"Mamba training step (d_model 128, 4 layers, vocabulary 65 padded to 72; {BATCH} x {LENGTH} "
                 f"tokens; AdamW)", "course_step", "torch_step", reference_label="PyTorch", steps=9,
        reference_steps=3, warmup=2, same=1e-4, note="target <= 0.1"),
    Row("scan", "selective scan forward + backward (1 x 1024 steps, 128 channels, 16 states; float32), fastest "
                "method", "scan_fast", "scan_loop", reference_label="NumPy step loop", steps=15,
        reference_steps=5, same=1e-3, note="target <= 0.5"),
]
