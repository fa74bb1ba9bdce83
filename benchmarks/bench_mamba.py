"""A Mamba training step on the course's Tensor against mamba-minimal's Mamba in PyTorch, and the scan.

The model has d_model 128, 4 layers, d_state 16 and a vocabulary of 65 (padded to 72), on 8
sequences of 128 tokens: a step is forward, cross-entropy, backward and an AdamW update. PyTorch
runs the same model written as mamba-minimal writes it (benchmarks/reference_mamba.py: its
selective scan is a Python loop over time), with the same weights, on the CPU. Both get the same
number of threads (NumPy's BLAS and torch.set_num_threads; the course's scan runs on one) and are timed
in alternation, so that a busy machine slows both alike; each time is the best of several steps.

The second row times the fastest selective_scan method against the step-by-step loop in NumPy
(the "sequential" method: one vectorised step per time step), forward and backward, for one
sequence of 1024 steps with 128 channels of 16 states in float32; both give the same result (checked).

    python -m benchmarks mamba
"""

import time

import numpy as np

from course import optim
from course.mamba import Mamba, MambaConfig, selective_scan
from course.tensor import Tensor
from course.tensor import functional as F
from course.train import param_groups

from .bench_gpt import numpy_threads
from .reference_mamba import torch_mamba

CONFIG = MambaConfig(d_model=128, n_layer=4, vocab_size=65)
BATCH, LENGTH = 8, 128
REPEAT = 5


def _timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench_training_step():
    threads = numpy_threads()
    rng = np.random.default_rng(0)
    x = rng.integers(0, CONFIG.vocab_size, (BATCH, LENGTH))
    y = rng.integers(0, CONFIG.vocab_size, (BATCH, LENGTH))
    model = Mamba(CONFIG, seed=0)
    opt = optim.AdamW(param_groups(model, 0.1), lr=1e-3)

    def course_step():
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    name = f"Mamba train step {CONFIG.n_layer}x{CONFIG.d_model}, B={BATCH} L={LENGTH}"
    try:
        import torch
    except ImportError:
        for _ in range(2):
            course_step()
        best = min(_timed(course_step) for _ in range(REPEAT))
        return {"name": name, "course_s": best, "note": "PyTorch is not installed: no reference"}

    torch.set_num_threads(threads)
    ref = torch_mamba(torch, CONFIG)
    ref.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in model.state_dict().items()})
    # The same AdamW groups as the course's (weight decay on the weights of Linear layers), by name.
    decayed = {id(p) for p in param_groups(model, 0.1)[0]["params"]}
    decayed = {n for n, p in model.named_parameters() if id(p) in decayed}
    groups = [{"params": [p for n, p in ref.named_parameters() if n in decayed], "weight_decay": 0.1},
              {"params": [p for n, p in ref.named_parameters() if n not in decayed], "weight_decay": 0.0}]
    topt = torch.optim.AdamW(groups, lr=1e-3)
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)

    def torch_step():
        logits = ref(tx)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ty.reshape(-1))
        topt.zero_grad()
        loss.backward()
        topt.step()

    course_step()
    torch_step()
    course, reference = [], []
    for _ in range(REPEAT):  # alternate, so that other load on the machine slows both alike
        course.append(_timed(course_step))
        reference.append(_timed(torch_step))
    c, r = min(course), min(reference)
    return {"name": name, "course_s": c, "reference": f"PyTorch {torch.__version__.split('+')[0]} (mamba-minimal)",
            "reference_s": r, "ratio": c / r,
            "note": f"{threads} threads each (BLAS, torch); target <= 0.1"}


def bench_scan(b=1, l=1024, d=128, n=16):
    rng = np.random.default_rng(0)
    arrays = [rng.normal(size=(b, l, d)), rng.uniform(1e-3, 0.1, (b, l, d)), -np.tile(np.arange(1, n + 1), (d, 1)),
              rng.normal(size=(b, l, n)), rng.normal(size=(b, l, n)), np.ones(d)]
    arrays = [a.astype(np.float32) for a in arrays]
    g = rng.normal(size=(b, l, d)).astype(np.float32)

    def forward_backward(method):
        ts = [Tensor(a, requires_grad=True) for a in arrays]
        y = selective_scan(*ts, method=method)
        y.backward(g)
        return [y.data] + [t.grad for t in ts]

    fast, loop = forward_backward("fast"), forward_backward("sequential")
    for got, expected in zip(fast, loop):
        np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-4 * np.abs(expected).max())
    course, reference = [], []
    for _ in range(REPEAT):
        course.append(_timed(lambda: forward_backward("fast")))
        reference.append(_timed(lambda: forward_backward("sequential")))
    c, r = min(course), min(reference)
    return {"name": f"selective_scan fwd+bwd b={b} l={l} d={d} n={n} f32", "course_s": c,
            "reference": "NumPy step loop", "reference_s": r, "ratio": c / r,
            "note": f"'fast' (Numba) {r / c:.0f}x faster; same result; target <= 0.5"}


def run():
    return [bench_training_step(), bench_scan()]


if __name__ == "__main__":
    for row in run():
        ref = f"{row['reference']} {row['reference_s'] * 1e3:.1f} ms" if row.get("reference") else "-"
        ratio = f"{row['ratio']:.3g}" if row.get("ratio") is not None else "-"
        print(f"{row['name']:<50} {row['course_s'] * 1e3:8.1f} ms   {ref:<36} ratio {ratio}  {row.get('note', '')}")
