"""Generation at GPT-2 124M's size with the KV cache: the course against PyTorch (transformers).

The model has GPT-2 small's shape (12 layers, 12 heads, 768 channels, 1024 positions, a
vocabulary of 50257, lm_head tied to the token embedding) with random weights, so nothing is
downloaded: the speed of a forward pass does not depend on what the weights are. Each engine
generates 32 tokens greedily from a 16-token prompt with its own KV cache. The reference gets the
same weights through `GPT.save_pretrained` into transformers' GPT2LMHeadModel. Tokens per second
is 32 divided by the time printed.

    python -m benchmarks gpt2
"""

import tempfile

import numpy as np

from .harness import Row, Skip, torch_threads

PROMPT, NEW_TOKENS = 16, 32


def _config():
    from course.gpt import GPTConfig

    return GPTConfig(vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768, tie_word_embeddings=True)


def _model_and_prompt():
    from course.gpt import GPT

    config = _config()
    model = GPT(config, seed=0).eval()
    prompt = np.random.default_rng(0).integers(0, config.vocab_size, (1, PROMPT))
    return model, prompt


def _checksum(tokens):
    """One number for the generated tokens, in order: both engines must generate the same text."""
    return float((tokens * np.arange(1, tokens.shape[1] + 1)).sum())


def course_generate(threads):
    model, prompt = _model_and_prompt()

    def step():
        return _checksum(model.generate(prompt, NEW_TOKENS, do_sample=False, use_cache=True))

    return step


def torch_generate(threads):
    try:
        import torch
        import transformers
    except ImportError:
        raise Skip("PyTorch and transformers are not installed (optional `reference` extra)") from None
    torch_threads(torch, threads)
    model, prompt = _model_and_prompt()
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        del model  # one model in memory at a time
        ref = transformers.GPT2LMHeadModel.from_pretrained(folder).eval()
    tprompt = torch.from_numpy(prompt)
    mask = torch.ones_like(tprompt)

    def step():
        with torch.no_grad():
            out = ref.generate(tprompt, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                               use_cache=True, attention_mask=mask, pad_token_id=_config().vocab_size - 1)
        return _checksum(out.numpy())

    return step


ROWS = [
    Row("gpt2", f"GPT-2 124M (random weights), generate {NEW_TOKENS} tokens with the KV cache", "course_generate",
        "torch_generate", reference_label="PyTorch (transformers)", steps=3, warmup=1, same=1e-9,
        note=f"tokens/s = {NEW_TOKENS} / time; random weights make near-ties, so the texts may part"),
]
