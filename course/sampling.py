"""Choosing the next token from a model's scores: greedy, with temperature, with top-k.

Shared by every language model of the course (GPT in part 4, Mamba in part 5); `course.gpt`
re-exports both functions.
"""

import numpy as np

__all__ = ["sample_next", "top_k_filter"]


def top_k_filter(logits, k):
    """Set every logit below the k-th largest of its row to -inf (ties with it are kept)."""
    if k is None or k >= logits.shape[-1]:
        return logits
    kth = np.partition(logits, -k, axis=-1)[..., -k, None]
    return np.where(logits < kth, -np.inf, logits)


def sample_next(logits, temperature=1.0, top_k=None, do_sample=True, rng=None):
    """One token id per row of `logits` (B, vocab): the likeliest, or drawn from softmax(logits / T)."""
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
