"""Data sets for the lessons: generated from a seed or shipped inside the package, never downloaded.

The credits of the shipped files are in course/data/README.md. Generated sequence tasks (the
selective copying of lesson 5.4) are in `course.data.tasks`.
"""

import gzip
from pathlib import Path

import numpy as np

from .tasks import SelectiveCopying, masked_accuracy, selective_copying

HERE = Path(__file__).resolve().parent


def make_moons(n_samples=100, noise=0.1, seed=0):
    """Two interleaving half circles, labels 0 and 1 (half the points each).

    Returns X of shape (n_samples, 2) in float64 and y of shape (n_samples,) in int64.
    The same seed gives the same points on every machine.
    """
    if n_samples < 2:
        raise ValueError(f"make_moons needs at least 2 samples, got n_samples={n_samples}")
    rng = np.random.default_rng(seed)
    n_out = n_samples // 2
    n_in = n_samples - n_out
    t_out = np.linspace(0, np.pi, n_out)
    t_in = np.linspace(0, np.pi, n_in)
    outer = np.stack([np.cos(t_out), np.sin(t_out)], axis=1)
    inner = np.stack([1 - np.cos(t_in), 1 - np.sin(t_in) - 0.5], axis=1)
    X = np.concatenate([outer, inner]).astype(np.float64)
    y = np.concatenate([np.zeros(n_out, dtype=np.int64), np.ones(n_in, dtype=np.int64)])
    X += rng.normal(scale=noise, size=X.shape)
    order = rng.permutation(n_samples)
    return X[order], y[order]


def load_digits():
    """The 1,797 handwritten digits (8x8 pixels, values 0..16).

    Returns images of shape (1797, 8, 8) in float32 and labels of shape (1797,) in int64.
    """
    with gzip.open(HERE / "digits.csv.gz", "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.float32)
    images = table[:, :64].reshape(-1, 8, 8)
    labels = table[:, 64].astype(np.int64)
    return images, labels


def load_shakespeare():
    """Eight plays by Shakespeare as one ASCII string (about a million characters)."""
    return (HERE / "shakespeare.txt").read_text(encoding="ascii")


def onnx_example():
    """The model lesson 3.4 imports: minGPT's pre-LayerNorm transformer block (16 wide, 2 heads,
    8 positions), exported by PyTorch to ONNX by scripts/export_onnx_examples.py.

    Returns (path of pre_ln_block.onnx, an input x of shape (2, 8, 16), PyTorch's output y for it),
    x and y in float32.
    """
    with np.load(HERE / "pre_ln_block.npz") as arrays:
        return HERE / "pre_ln_block.onnx", arrays["x"], arrays["y"]
