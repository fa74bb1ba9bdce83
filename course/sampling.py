"""Choosing the next token from a model's scores: greedy, with temperature, with top-k.

Shared by every language model of the course (GPT in part 4, Mamba in part 5); `course.gpt`
re-exports both functions.
"""

import numbers

import numpy as np

__all__ = ["sample_next", "top_k_filter", "check_top_k", "check_generation"]


def check_generation(max_new_tokens, temperature, top_k, do_sample, vocab_size=None):
    """The arguments every model's `generate` takes, refused with a clear message when they make no sense."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, numbers.Integral) or max_new_tokens < 0:
        raise ValueError(f"generate: max_new_tokens must be a whole number of tokens, 0 or more, "
                         f"got {max_new_tokens!r}")
    if do_sample and not temperature > 0:
        raise ValueError(f"generate: temperature must be positive, got {temperature} "
                         f"(use do_sample=False for the likeliest token)")
    check_top_k(top_k, vocab_size)


def check_top_k(top_k, vocab_size=None):
    """Refuse a top_k that is not a whole number of tokens, 1 or more (None keeps every token)."""
    if top_k is None:
        return
    if isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral) or top_k < 1:
        raise ValueError(f"top_k must be a whole number of tokens, 1 or more (or None for all "
                         f"{vocab_size or 'the'} tokens), got {top_k!r}")


def top_k_filter(logits, k):
    """Set every logit below the k-th largest of its row to -inf (ties with it are kept)."""
    if k is None or k >= logits.shape[-1]:
        return logits
    kth = np.partition(logits, -k, axis=-1)[..., -k, None]
    return np.where(logits < kth, -np.inf, logits)


def sample_next(logits, temperature=1.0, top_k=None, do_sample=True, rng=None):
    """One token id per row of `logits` (B, vocab): the likeliest, or drawn from softmax(logits / T)."""
    check_top_k(top_k)
    logits = np.asarray(logits, dtype=np.float64)  # float64: the draw does not depend on rounding
    if not do_sample:
        return logits.argmax(axis=-1)
    logits = top_k_filter(logits / temperature, top_k)
    probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    # Inverse-CDF sampling: the first token whose cumulative probability passes a uniform draw.
    # The draw is scaled to the last cumulative value (1 up to rounding), and a token's cumulative
    # value must strictly pass it, so a token of probability 0 (cut by top-k) is never picked.
    cdf = np.cumsum(probs, axis=-1)
    u = rng.random((len(probs), 1)) * cdf[:, -1:]
    picked = (cdf <= u).sum(axis=-1)
    return np.minimum(picked, probs.shape[-1] - 1)
