"""A GPT training step on the course's Tensor against the same model in PyTorch, and the KV cache.

The model is minGPT's architecture with 4 layers, 4 heads, 128 channels and a vocabulary of 65,
on 32 sequences of 64 tokens: a step is forward, cross-entropy, backward and an AdamW update
(weight decay on the Linear weights only, as the trainer does). PyTorch gets the same weights by
name and runs eagerly on the CPU; both get the same number of threads (NumPy's BLAS through the
environment, PyTorch through torch.set_num_threads), each in a process of its own. Both start
from the same weights and data, so their first losses agree (checked).

The last row times generating block_size - 1 tokens (greedy, 4 sequences) with the KV cache
against the same generation without it, where each step reruns the model over the whole
sequence; both give the same tokens (checked through a checksum).

    python -m benchmarks gpt
"""


import numpy as np

from .harness import Row, Skip, torch_threads

BATCH = 32


def _config(width=128):
    from course.gpt import GPTConfig

    return GPTConfig(vocab_size=65, block_size=64, n_layer=4, n_head=4, n_embd=width)


CONFIG = _config()


def _data(config):
    rng = np.random.default_rng(0)
    x = rng.integers(0, config.vocab_size, (BATCH, config.block_size))
    y = rng.integers(0, config.vocab_size, (BATCH, config.block_size))
    return x, y


def course_step(threads, width=128):
    from course import optim
    from course.gpt import GPT, param_groups

    config = _config(width)
    x, y = _data(config)
    model = GPT(config, seed=0)
    opt = optim.AdamW(param_groups(model, 0.1), lr=1e-3)

    def step():
        _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()

    return step


def train_torch(ref, opt, tx, ty):
    """One PyTorch training step (forward, backward, AdamW); returns the loss as a number."""
    _, loss = ref(tx, ty)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.item()


def torch_training(torch, config, device="cpu"):
    """PyTorch's GPT with the course's initial weights (seed 0) on `device`, and its AdamW with
    weight decay on the Linear weights only, as the course's trainer does."""
    from course.gpt import GPT

    from .reference_gpt import torch_gpt

    ref = torch_gpt(torch, config)
    ref.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in GPT(config, seed=0).state_dict().items()})
    ref.to(device)
    linear = {n for n, m in ref.named_modules() if isinstance(m, torch.nn.Linear)}
    decayed = lambda n: n.rsplit(".", 1)[0] in linear and n.endswith("weight")  # noqa: E731
    opt = torch.optim.AdamW([{"params": [p for n, p in ref.named_parameters() if decayed(n)], "weight_decay": 0.1},
                             {"params": [p for n, p in ref.named_parameters() if not decayed(n)],
                              "weight_decay": 0.0}], lr=1e-3)
    return ref, opt


def torch_step(threads, width=128):
    try:
        import torch
    except ImportError:
        raise Skip("PyTorch is not installed") from None
    torch_threads(torch, threads)
    config = _config(width)
    x, y = _data(config)
    ref, opt = torch_training(torch, config)
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)

    def step():
        return train_torch(ref, opt, tx, ty)

    step.label = f"PyTorch {torch.__version__.split('+')[0]} eager"
    return step


def _generation(threads, use_cache, batch=4):
    from course.gpt import GPT

    model = GPT(CONFIG, seed=0)
    prompt = np.zeros((batch, 1), dtype=np.int64)
    new_tokens = CONFIG.block_size - 1  # fill the context: past it, the window slides and the cache is refilled

    def step():
        out = model.generate(prompt, new_tokens, do_sample=False, use_cache=use_cache)
        return float((out * np.arange(1, out.shape[1] + 1)).sum())  # a checksum of the tokens, in order

    return step


def with_cache(threads):
    return _generation(threads, True)


def without_cache(threads):
    return _generation(threads, False)


_NAME = f"GPT training step ({CONFIG.n_layer} layers, {CONFIG.n_head} heads, {{w}} wide; " \
        f"{BATCH} x {CONFIG.block_size} tokens; AdamW)"
ROWS = [
    Row("gpt", _NAME.format(w=128), "course_step", "torch_step", reference_label="PyTorch", same=1e-4,
        note="target <= 0.8"),
    Row("gpt-1thread", _NAME.format(w=128), "course_step", "torch_step", reference_label="PyTorch", threads=1,
        same=1e-4),
    Row("gpt-256", _NAME.format(w=256), "course_step", "torch_step", reference_label="PyTorch", same=1e-4,
        steps=9, extra={"width": 256}),
    Row("gpt-kv", f"GPT generation, {CONFIG.block_size - 1} tokens x 4, with the KV cache", "with_cache",
        "without_cache", reference_label="without the cache", steps=7, warmup=1, same=0.0),
]
