"""A GPT training step on the course's Tensor against the same model in PyTorch, and the KV cache.

The model is minGPT's architecture with 4 layers, 4 heads, 128 channels and a vocabulary of 65,
on 32 sequences of 64 tokens: a step is forward, cross-entropy, backward and an AdamW update
(weight decay on the Linear weights only, as the trainer does). PyTorch gets the same weights by
name and runs on the CPU with as many threads as NumPy's BLAS uses (both use every core they
are given: 2 on the course's reference machine). The two are timed in alternation so that a
busy machine slows both alike; each time is the best of several steps.

The second row times generating block_size - 1 tokens (greedy, 4 sequences) with the KV cache
against the same generation without it, where each step reruns the model over the whole
sequence; both give the same tokens (checked).

    python -m benchmarks.bench_gpt
"""

import os
import time

import numpy as np

from course import optim
from course.gpt import GPT, GPTConfig, param_groups

from .reference_gpt import torch_gpt

CONFIG = GPTConfig(vocab_size=65, block_size=64, n_layer=4, n_head=4, n_embd=128)
BATCH = 32
REPEAT = 10


def numpy_threads():
    """How many threads NumPy's BLAS runs: the usual environment variables, else every core we may use."""
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _course_step(model, opt, x, y):
    _, loss = model(x, y)
    opt.zero_grad()
    loss.backward()
    opt.step()


def _timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench_training_step():
    rng = np.random.default_rng(0)
    x = rng.integers(0, CONFIG.vocab_size, (BATCH, CONFIG.block_size))
    y = rng.integers(0, CONFIG.vocab_size, (BATCH, CONFIG.block_size))
    model = GPT(CONFIG, seed=0)
    opt = optim.AdamW(param_groups(model, 0.1), lr=1e-3)
    course_step = lambda: _course_step(model, opt, x, y)  # noqa: E731
    name = f"GPT train step {CONFIG.n_layer}x{CONFIG.n_embd}, B={BATCH} T={CONFIG.block_size}"
    try:
        import torch
    except ImportError:
        for _ in range(2):
            course_step()
        best = min(_timed(course_step) for _ in range(REPEAT))
        return {"name": name, "course_s": best, "note": "PyTorch is not installed: no reference"}

    threads = numpy_threads()
    torch.set_num_threads(threads)
    ref = torch_gpt(torch, CONFIG)
    ref.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in model.state_dict().items()})
    linear = {n for n, m in ref.named_modules() if isinstance(m, torch.nn.Linear)}
    decay = [p for n, p in ref.named_parameters() if n.rsplit(".", 1)[0] in linear and n.endswith("weight")]
    no_decay = [p for n, p in ref.named_parameters() if not (n.rsplit(".", 1)[0] in linear and n.endswith("weight"))]
    topt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                             lr=1e-3)
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)

    def torch_step():
        _, loss = ref(tx, ty)
        topt.zero_grad()
        loss.backward()
        topt.step()

    for _ in range(2):
        course_step()
        torch_step()
    course, reference = [], []
    for _ in range(REPEAT):  # alternate, so that other load on the machine slows both alike
        course.append(_timed(course_step))
        reference.append(_timed(torch_step))
    c, r = min(course), min(reference)
    return {"name": name, "course_s": c, "reference": f"PyTorch {torch.__version__.split('+')[0]} CPU",
            "reference_s": r, "ratio": c / r, "note": f"{threads} threads each (NumPy's BLAS, torch.set_num_threads)"}


def bench_kv_cache(batch=4):
    model = GPT(CONFIG, seed=0)
    prompt = np.zeros((batch, 1), dtype=np.int64)
    new_tokens = CONFIG.block_size - 1  # fill the context: past it, the window slides and the cache is refilled
    with_cache = lambda: model.generate(prompt, new_tokens, do_sample=False, use_cache=True)  # noqa: E731
    without = lambda: model.generate(prompt, new_tokens, do_sample=False, use_cache=False)  # noqa: E731
    assert np.array_equal(with_cache(), without()), "the KV cache changed the generated tokens"
    c = min(_timed(with_cache) for _ in range(3))
    r = min(_timed(without) for _ in range(3))
    return {"name": f"GPT generate {new_tokens} tokens x {batch}, KV cache",
            "course_s": c, "reference": "no cache", "reference_s": r, "ratio": c / r,
            "note": f"cache {r / c:.1f}x faster; same tokens"}


def run():
    return [bench_training_step(), bench_kv_cache()]


if __name__ == "__main__":
    for row in run():
        ref = f"{row['reference']} {row['reference_s'] * 1e3:.1f} ms" if row.get("reference") else "-"
        ratio = f"{row['ratio']:.2f}" if row.get("ratio") is not None else "-"
        print(f"{row['name']:<50} {row['course_s'] * 1e3:8.1f} ms   {ref:<30} ratio {ratio}  {row.get('note', '')}")
