"""Training a GPT (lesson 4.4): batches, AdamW with warm-up and cosine decay, clipping, checkpoints.

    trainer = Trainer(model, train_ids, val_ids, TrainerConfig(max_iters=2000, learning_rate=1e-3))
    history = trainer.run()                       # {"step", "loss", "lr", "val_step", "val_loss"}
    save_checkpoint("model.npz", model, vocab=tokenizer.itos)
    model, meta = load_checkpoint("model.npz")

The data is one long array of token ids; a batch is `batch_size` windows of `block_size + 1`
tokens cut at random places: the first block_size tokens are the input, the same tokens shifted
by one are the targets, so every position learns to predict the token after it.
"""

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from .. import nn, optim
from ..tensor import functional as F
from ..tensor import no_grad
from .model import GPT, GPTConfig

# Checkpoints shipped inside the package (made by the scripts in scripts/).
CHECKPOINTS = Path(__file__).resolve().parent / "checkpoints"

__all__ = ["CHECKPOINTS", "TrainerConfig", "Trainer", "get_batch", "param_groups", "save_checkpoint", "load_checkpoint",
           "estimate_loss"]


@dataclass
class TrainerConfig:
    max_iters: int = 1000
    batch_size: int = 32
    learning_rate: float = 1e-3
    betas: tuple = (0.9, 0.95)
    weight_decay: float = 0.1
    grad_clip: float = 1.0  # clip the gradients' joint norm to this (None: no clipping)
    warmup_iters: int = 100  # linear warm-up, then a half cosine down to min_lr_ratio * learning_rate
    min_lr_ratio: float = 0.1
    eval_interval: int = 200  # evaluate every this many steps (and after the last); 0: never
    eval_iters: int = 10  # batches per evaluation
    seed: int = 0  # batches and dropout
    progress: bool = True  # a tqdm bar (also off when the environment sets TQDM_DISABLE=1)


def get_batch(data, batch_size, block_size, rng):
    """`batch_size` random windows of a 1-D token array: inputs x and targets y (x shifted by one), (B, T) each."""
    data = np.asarray(data)
    if data.ndim != 1 or len(data) < block_size + 1:
        raise ValueError(f"get_batch: needs a 1-D token array of at least block_size + 1 = {block_size + 1} "
                         f"tokens, got shape {data.shape}")
    starts = rng.integers(0, len(data) - block_size, size=batch_size)
    offsets = starts[:, None] + np.arange(block_size + 1)  # (B, T + 1) indices, one gather for all
    window = data[offsets].astype(np.int64)
    return window[:, :-1], window[:, 1:]


def param_groups(model, weight_decay):
    """AdamW parameter groups: weight decay on the weight matrices of Linear layers only.

    Decay pulls a parameter toward zero. For a matrix that mixes features this is a useful
    preference for small, spread-out weights. Biases and LayerNorm gains are offsets and scales,
    few in number; pulling a LayerNorm gain to 0 would switch its channel off, not simplify it.
    Embedding rows of rare tokens get few gradients, so decay would shrink them each step with
    little data to push back. minGPT makes the same split.
    """
    linear = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    decay = [p for p in model.parameters() if id(p) in linear]
    no_decay = [p for p in model.parameters() if id(p) not in linear]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def estimate_loss(model, data, batch_size, n_batches, seed=1234):
    """Mean loss over `n_batches` batches drawn with a fixed seed (the same batches each time), in eval mode."""
    rng = np.random.default_rng(seed)
    was_training = model.training
    model.eval()
    losses = []
    with no_grad():
        for _ in range(n_batches):
            x, y = get_batch(data, batch_size, model.config.block_size, rng)
            losses.append(float(model(x, y)[1].data))
    model.train(was_training)
    return float(np.mean(losses))


def _progress(iterable, enabled, total):
    if not enabled or os.environ.get("TQDM_DISABLE", "") not in ("", "0"):
        return None
    from tqdm.auto import tqdm

    return tqdm(iterable, total=total, dynamic_ncols=True)


class Trainer:
    """Trains `model` on token array `train_data`, evaluating on `val_data` now and then.

    `run()` returns the history and can be called again to continue (the schedule goes on from
    where it stopped). Same seed, same data, same model: the same losses, step by step.
    """

    def __init__(self, model, train_data, val_data=None, config=None):
        self.model = model
        self.config = config or TrainerConfig()
        c = self.config
        self.train_data = np.asarray(train_data)
        self.val_data = None if val_data is None else np.asarray(val_data)
        self.optimizer = optim.AdamW(param_groups(model, c.weight_decay), lr=c.learning_rate, betas=c.betas)
        self.schedule = optim.WarmupCosine(self.optimizer, c.warmup_iters, c.max_iters, c.min_lr_ratio)
        self.rng = np.random.default_rng(c.seed)
        self.step = 0
        self.history = {"step": [], "loss": [], "lr": [], "val_step": [], "val_loss": []}

    def train_step(self, x, y):
        """One step: forward, backward, clip, AdamW update, schedule; returns the loss."""
        _, loss = self.model(x, y)
        self.optimizer.zero_grad()
        loss.backward()
        if self.config.grad_clip:
            optim.clip_grad_norm_(self.model.parameters(), self.config.grad_clip)
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.schedule.step()
        return float(loss.data), lr

    def evaluate(self):
        if self.val_data is None:
            return None
        return estimate_loss(self.model, self.val_data, self.config.batch_size, self.config.eval_iters)

    def run(self, iters=None):
        c = self.config
        iters = c.max_iters - self.step if iters is None else iters
        if self.step == 0:
            F.manual_seed(c.seed)  # dropout masks
        self.model.train()
        end = self.step + iters
        steps = range(self.step, end)
        bar = _progress(steps, c.progress, iters)
        for step in bar if bar is not None else steps:
            x, y = get_batch(self.train_data, c.batch_size, self.model.config.block_size, self.rng)
            loss, lr = self.train_step(x, y)
            self.step = step + 1
            h = self.history
            h["step"].append(step)
            h["loss"].append(loss)
            h["lr"].append(lr)
            due = self.step % c.eval_interval == 0 or self.step == end if c.eval_interval else False
            if due and self.val_data is not None:
                h["val_step"].append(self.step)
                h["val_loss"].append(self.evaluate())
                self.model.train()
            if bar is not None:
                post = {"loss": f"{loss:.3f}"}
                if h["val_loss"]:
                    post["val"] = f"{h['val_loss'][-1]:.3f}"
                bar.set_postfix(post, refresh=False)
        if bar is not None:
            bar.close()
        return self.history

    def save(self, path, **meta):
        save_checkpoint(path, self.model, step=self.step, **meta)


# ----- checkpoints: parameters by name in a .npz, with the config and anything JSON can hold -------
def save_checkpoint(path, model, **meta):
    """Write the model's parameters (by name), its config and `meta` (e.g. vocab=...) to a .npz file."""
    arrays = dict(model.state_dict())
    arrays["__config__"] = np.array(json.dumps(asdict(model.config)))
    arrays["__meta__"] = np.array(json.dumps(meta))
    np.savez_compressed(path, **arrays)


def load_checkpoint(path, model=None):
    """Load a .npz from `save_checkpoint`: into `model`, or into a new GPT built from the stored config.

    Returns (model, meta). Names and shapes must match the model's exactly; the error names the
    parameters that are missing, unexpected or of the wrong shape.
    """
    with np.load(path, allow_pickle=False) as f:
        arrays = {k: f[k] for k in f.files}
    config = json.loads(str(arrays.pop("__config__"))) if "__config__" in arrays else None
    meta = json.loads(str(arrays.pop("__meta__"))) if "__meta__" in arrays else {}
    if model is None:
        if config is None:
            raise ValueError(f"load_checkpoint: {os.path.basename(str(path))} stores no config: pass a model to load into")
        model = GPT(GPTConfig(**config))
    try:
        model.load_state_dict(arrays, strict=True)
    except ValueError as err:
        raise ValueError(f"load_checkpoint: the checkpoint does not fit the model: {err}") from None
    return model, meta
