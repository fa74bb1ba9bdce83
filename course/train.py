"""Training a language model (lessons 4.4 and 5.4): batches, AdamW with warm-up and cosine decay,
clipping, checkpoints. The same code trains the GPT of part 4 and the Mamba of part 5.

    trainer = Trainer(model, train_ids, val_ids, TrainerConfig(max_iters=2000, learning_rate=1e-3))
    history = trainer.run()                       # {"step", "loss", "lr", "val_step", "val_loss"}
    save_checkpoint("model.npz", model, vocab=tokenizer.itos)
    model, meta = load_checkpoint("model.npz")

A model is anything with `model(idx)` returning logits (B, T, vocab) (or a tuple whose first item
is the logits, as GPT's `(logits, loss)`), a `config` dataclass, and the Module methods. The loss is
the cross-entropy of the logits against the targets; targets equal to -1 are ignored.

The data is one long array of token ids; a batch is `batch_size` windows of `block_size + 1`
tokens cut at random places: the first block_size tokens are the input, the same tokens shifted
by one are the targets, so every position learns to predict the token after it.

A task whose examples are not windows of one stream (a generated task, such as the selective
copying of lesson 5.4) gives a function instead: `Trainer(model, config=..., batch_fn=f)` with
`f(batch_size, rng) -> (x, y)`; evaluation then uses the same function with a fixed seed.
"""

import importlib
import json
import os
import zipfile
from dataclasses import asdict, dataclass

import numpy as np

from . import nn, optim
from .tensor import functional as F
from .tensor import no_grad

__all__ = ["TrainerConfig", "Trainer", "get_batch", "param_groups", "language_model_loss", "save_checkpoint",
           "load_checkpoint", "estimate_loss"]


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
    block_size: int = None  # tokens per training sequence (None: the model's config.block_size)


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


def language_model_loss(model, x, y):
    """Mean cross-entropy of the model's next-token predictions for inputs x against targets y (B, T)."""
    out = model(x)
    logits = out[0] if isinstance(out, tuple) else out
    return F.cross_entropy(logits, y, ignore_index=-1)


def _block_size(model, block_size=None):
    if block_size is not None:
        return int(block_size)
    size = getattr(getattr(model, "config", None), "block_size", None)
    if size is None:
        raise ValueError(f"{type(model).__name__} has no config.block_size: set TrainerConfig(block_size=...) "
                         f"to the length of the training sequences")
    return size


def estimate_loss(model, data, batch_size, n_batches, seed=1234, block_size=None, batch_fn=None):
    """Mean loss over `n_batches` batches drawn with a fixed seed (the same batches each time), in eval mode.

    The batches are windows of `data`, or, with `batch_fn`, `batch_fn(batch_size, rng)` (data unused).
    """
    rng = np.random.default_rng(seed)
    if batch_fn is None:
        block_size = _block_size(model, block_size)
    was_training = model.training
    model.eval()
    losses = []
    with no_grad():
        for _ in range(n_batches):
            x, y = get_batch(data, batch_size, block_size, rng) if batch_fn is None else batch_fn(batch_size, rng)
            losses.append(float(language_model_loss(model, x, y).data))
    model.train(was_training)
    return float(np.mean(losses))


def _progress(iterable, enabled, total):
    if not enabled or os.environ.get("TQDM_DISABLE", "") not in ("", "0"):
        return None
    from tqdm.auto import tqdm

    return tqdm(iterable, total=total, dynamic_ncols=True)


class Trainer:
    """Trains `model` on token array `train_data`, evaluating on `val_data` now and then.

    Or, with `batch_fn(batch_size, rng) -> (x, y)`, on the batches it makes (train_data and
    val_data are then not needed; evaluation draws from batch_fn with a fixed seed).

    `run()` returns the history and can be called again to continue (the schedule goes on from
    where it stopped). Same seed, same data, same model: the same losses, step by step.
    """

    def __init__(self, model, train_data=None, val_data=None, config=None, batch_fn=None):
        self.model = model
        self.config = config or TrainerConfig()
        c = self.config
        if train_data is None and batch_fn is None:
            raise ValueError("Trainer: give train_data (a token array) or batch_fn(batch_size, rng) -> (x, y)")
        self.batch_fn = batch_fn
        self.train_data = None if train_data is None else np.asarray(train_data)
        self.val_data = None if val_data is None else np.asarray(val_data)
        self.optimizer = optim.AdamW(param_groups(model, c.weight_decay), lr=c.learning_rate, betas=c.betas)
        self.schedule = optim.WarmupCosine(self.optimizer, c.warmup_iters, c.max_iters, c.min_lr_ratio)
        self.rng = np.random.default_rng(c.seed)
        self.block_size = _block_size(model, c.block_size) if batch_fn is None else c.block_size
        self.step = 0
        self.history = {"step": [], "loss": [], "lr": [], "val_step": [], "val_loss": []}

    def train_step(self, x, y):
        """One step: forward, backward, clip, AdamW update, schedule; returns the loss."""
        loss = language_model_loss(self.model, x, y)
        self.optimizer.zero_grad()
        loss.backward()
        if self.config.grad_clip:
            optim.clip_grad_norm_(self.model.parameters(), self.config.grad_clip)
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.schedule.step()
        return float(loss.data), lr

    def evaluate(self):
        if self.batch_fn is not None:
            return estimate_loss(self.model, None, self.config.batch_size, self.config.eval_iters,
                                 batch_fn=self.batch_fn)
        if self.val_data is None:
            return None
        return estimate_loss(self.model, self.val_data, self.config.batch_size, self.config.eval_iters,
                             block_size=self.block_size)

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
            if self.batch_fn is None:
                x, y = get_batch(self.train_data, c.batch_size, self.block_size, self.rng)
            else:
                x, y = self.batch_fn(c.batch_size, self.rng)
            loss, lr = self.train_step(x, y)
            self.step = step + 1
            h = self.history
            h["step"].append(step)
            h["loss"].append(loss)
            h["lr"].append(lr)
            due = self.step % c.eval_interval == 0 or self.step == end if c.eval_interval else False
            if due and (self.val_data is not None or self.batch_fn is not None):
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
    """Write the model's parameters (by name), its class, its config and `meta` (e.g. vocab=...) to a .npz."""
    arrays = dict(model.state_dict())
    cls, config = type(model), type(model.config)
    arrays["__model__"] = np.array(f"{cls.__module__}:{cls.__qualname__}")
    arrays["__config_class__"] = np.array(f"{config.__module__}:{config.__qualname__}")
    arrays["__config__"] = np.array(json.dumps(asdict(model.config)))
    arrays["__meta__"] = np.array(json.dumps(meta))
    np.savez_compressed(path, **arrays)


def _course_class(name, path):
    """The class named "module:Class" in a checkpoint; only the course's own classes are built."""
    module, _, qualname = name.partition(":")
    if not module.startswith("course.") or not qualname.isidentifier():
        raise ValueError(f"load_checkpoint: {path} names the class {name!r}, which is not one of the course's")
    return getattr(importlib.import_module(module), qualname)


def load_checkpoint(path, model=None):
    """Load a .npz from `save_checkpoint`: into `model`, or into a new model built from the stored config.

    Returns (model, meta). Names and shapes must match the model's exactly, and so must the config
    it was saved with; the error names the parameters that are missing, unexpected or of the wrong
    shape, and the config fields that differ.
    """
    name = os.path.basename(str(path))
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {k: f[k] for k in f.files}
        config = json.loads(str(arrays.pop("__config__"))) if "__config__" in arrays else None
        meta = json.loads(str(arrays.pop("__meta__"))) if "__meta__" in arrays else {}
    except FileNotFoundError:
        raise FileNotFoundError(f"load_checkpoint: there is no file {path}") from None
    except (zipfile.BadZipFile, EOFError, OSError, ValueError, KeyError) as err:
        raise ValueError(f"load_checkpoint: {name} is not a readable checkpoint (truncated or corrupt?): "
                         f"{type(err).__name__}: {err}") from None
    # Checkpoints written before models other than GPT could be saved name no class: a GPT.
    model_class = str(arrays.pop("__model__", "course.gpt.model:GPT"))
    config_class = str(arrays.pop("__config_class__", "course.gpt.model:GPTConfig"))
    if model is None:
        if config is None:
            raise ValueError(f"load_checkpoint: {name} stores no config: pass a model to load into")
        model = _course_class(model_class, name)(_course_class(config_class, name)(**config))
    problems = []
    try:
        model.load_state_dict(arrays, strict=True)
    except ValueError as err:
        problems.append(str(err))
    if config is not None and hasattr(model, "config"):
        # Same names and shapes can still hide another architecture (n_head 2 or 4 splits the
        # same matrices differently): the stored config must match too.
        mine = asdict(model.config)
        differ = [f"{k}: checkpoint {config[k]!r}, model {mine[k]!r}" for k in config
                  if k in mine and config[k] != mine[k]]
        if differ:
            problems.append("the config differs: " + "; ".join(differ))
    if problems:
        raise ValueError(f"load_checkpoint: {name} does not fit the model: " + " | ".join(problems))
    return model, meta
