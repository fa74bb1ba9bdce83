"""Generated sequence tasks: every example is drawn from a seed, nothing is stored.

Selective copying (lesson 5.4) is the task the Mamba paper uses to show why selection matters:
a few data tokens lie scattered among blanks, and after the sequence the model must say them
again, in order. Where they lie changes from example to example, so a model whose dynamics are
the same at every position (a convolution with fixed weights, an S4 layer) cannot know which
positions to keep; a model that decides from the token itself what to remember (Mamba, via
its input-dependent delta, B and C; a transformer, via attention) can.

    task = SelectiveCopying(length=32, n_data=4, n_symbols=8)
    x, y = task(batch_size=16, rng=np.random.default_rng(0))     # a batch_fn for course.train.Trainer
    print(task.render(x[0]))                                      # . . 5 . . . 2 ... | ? ? ? ?
"""

import numpy as np

__all__ = ["SelectiveCopying", "selective_copying", "masked_accuracy"]

BLANK, MARKER = 0, 1  # token ids; the data symbols are 2, 3, ...


def selective_copying(batch_size, rng, length=32, n_data=4, n_symbols=8):
    """A batch of the selective-copying task: inputs x and targets y, both (batch_size, length + n_data).

    x: `length` tokens, all BLANK (0) except `n_data` data tokens (ids 2 .. n_symbols + 1, drawn
       at random) at random distinct positions, then `n_data` MARKER tokens (1).
    y: -1 (ignored by the loss) everywhere except at the markers: at the i-th marker, the i-th
       data token in order of position.
    """
    if not 1 <= n_data <= length:
        raise ValueError(f"selective_copying: n_data must be between 1 and length={length}, got {n_data}")
    if n_symbols < 1:
        raise ValueError(f"selective_copying: n_symbols must be at least 1, got {n_symbols}")
    # n_data distinct positions per row, in increasing order: the smallest of a random ranking.
    positions = np.sort(np.argsort(rng.random((batch_size, length)), axis=1)[:, :n_data], axis=1)
    data = rng.integers(2, 2 + n_symbols, (batch_size, n_data))
    x = np.full((batch_size, length + n_data), BLANK, dtype=np.int64)
    np.put_along_axis(x, positions, data, axis=1)
    x[:, length:] = MARKER
    y = np.full_like(x, -1)
    y[:, length:] = data
    return x, y


class SelectiveCopying:
    """The selective-copying task with fixed sizes; calling it makes a batch (a Trainer batch_fn)."""

    def __init__(self, length=32, n_data=4, n_symbols=8):
        self.length, self.n_data, self.n_symbols = length, n_data, n_symbols
        selective_copying(1, np.random.default_rng(0), length, n_data, n_symbols)  # checks the sizes

    @property
    def vocab_size(self):
        return self.n_symbols + 2  # the symbols, BLANK and MARKER

    @property
    def seq_len(self):
        return self.length + self.n_data

    def __call__(self, batch_size, rng):
        return selective_copying(batch_size, rng, self.length, self.n_data, self.n_symbols)

    def render(self, row, answer=None):
        """One input row as text: '.' for a blank, the data symbols as numbers (0-based), '?' for a marker;
        with `answer` (the predictions at the markers), those instead of the '?'."""
        out = []
        for t, tok in enumerate(np.asarray(row)):
            if tok == BLANK:
                out.append(".")
            elif tok == MARKER:
                out.append("?" if answer is None else str(int(answer[t - self.length]) - 2))
            else:
                out.append(str(int(tok) - 2))
        return " ".join(out[:self.length]) + " | " + " ".join(out[self.length:])

    def __repr__(self):
        return f"SelectiveCopying(length={self.length}, n_data={self.n_data}, n_symbols={self.n_symbols})"


def masked_accuracy(logits, targets, vocab_size=None):
    """The fraction of positions whose target is not -1 where the likeliest token (among the first
    `vocab_size`, so padding ids never count) is the target. logits (..., V), targets (...)."""
    logits = np.asarray(getattr(logits, "data", logits))
    targets = np.asarray(targets)
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"masked_accuracy: logits of shape {logits.shape} need targets of shape "
                         f"{logits.shape[:-1]}, got {targets.shape}")
    if vocab_size is not None and not 1 <= vocab_size <= logits.shape[-1]:
        raise ValueError(f"masked_accuracy: vocab_size must be between 1 and the {logits.shape[-1]} logits of "
                         f"the last axis, got {vocab_size}")
    keep = targets != -1
    if not keep.any():
        raise ValueError("masked_accuracy: every target is -1: nothing to score")
    predicted = logits[..., :vocab_size].argmax(axis=-1)
    return float((predicted[keep] == targets[keep]).mean())
