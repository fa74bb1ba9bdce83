"""The GPT of lesson 4.3, on the course's own Tensor: minGPT's architecture, names and initialisation.

    config = GPTConfig(vocab_size=65, block_size=64, n_layer=4, n_head=4, n_embd=128)
    model = GPT(config, seed=0)
    logits, loss = model(idx, targets)               # idx, targets: integer arrays (B, T)
    out = model.generate(idx, 100, temperature=0.8, top_k=10, seed=0)

A GPT turns T token ids into T predictions of the next token. Each token becomes a vector (its
embedding plus the embedding of its position); `n_layer` blocks then let every position gather
information from the positions before it (attention) and think about it alone (an MLP); a final
linear layer reads a score for every token of the vocabulary off each position.

Parameter names are minGPT's (`transformer.h.0.attn.c_attn.weight`, ...), so a minGPT state_dict
saved as NumPy arrays loads here by name, and the other way round.
"""

import math
from dataclasses import asdict, dataclass, field, fields

import numpy as np

from .. import nn
from ..sampling import check_generation, sample_next, top_k_filter  # noqa: F401  (shared with Mamba; public here as before)
from ..tensor import Tensor, no_grad
from ..tensor import functional as F
from ..tensor import device as _device

__all__ = ["GPTConfig", "GPT", "Block", "CausalSelfAttention", "MLP", "KVCache"]


@dataclass
class GPTConfig:
    vocab_size: int
    block_size: int  # the longest sequence the model reads (the number of position embeddings)
    n_layer: int
    n_head: int
    n_embd: int
    dropout: float = 0.0
    # What GPT-2's checkpoints need as well (the defaults are minGPT's model, unchanged; the repr
    # shows them only when they differ from these):
    layer_norm_epsilon: float = field(default=1e-5, repr=False)  # the eps of every LayerNorm
    n_inner: object = field(default=None, repr=False)  # the MLP's hidden width; None: 4 * n_embd
    tie_word_embeddings: bool = field(default=False, repr=False)  # lm_head.weight is transformer.wte.weight

    def __repr__(self):
        shown = [f"{f.name}={getattr(self, f.name)!r}" for f in fields(self)
                 if f.repr or getattr(self, f.name) != f.default]
        return f"GPTConfig({', '.join(shown)})"

    @property
    def n_positions(self):
        """GPT-2's name for block_size."""
        return self.block_size

    @property
    def mlp_width(self):
        return 4 * self.n_embd if self.n_inner is None else int(self.n_inner)

    def __post_init__(self):
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"GPTConfig: {name} must be a positive integer, got {getattr(self, name)}")
        if self.n_embd % self.n_head:
            raise ValueError(f"GPTConfig: n_embd={self.n_embd} must be a multiple of n_head={self.n_head} "
                             f"(each head gets n_embd // n_head channels)")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"GPTConfig: dropout must be in [0, 1), got {self.dropout}")
        if self.n_inner is not None and int(self.n_inner) < 1:
            raise ValueError(f"GPTConfig: n_inner must be a positive integer or None, got {self.n_inner}")
        if not self.layer_norm_epsilon > 0:
            raise ValueError(f"GPTConfig: layer_norm_epsilon must be positive, got {self.layer_norm_epsilon}")

    def to_dict(self):
        return asdict(self)


class KVCache:
    """The keys and values every layer has computed so far, for generation one token at a time.

    Without it, each new token reruns the model over the whole sequence, although the keys and
    values of the earlier positions never change (attention is causal: a position never looks
    forward). With it, each step computes q, k, v for the new token only, stores its k and v,
    and attends over everything stored. Buffers hold `max_len` positions so an update is a copy
    into place rather than a growing concatenation.
    """

    def __init__(self, n_layer, batch, n_head, max_len, head_dim, dtype=np.float32):
        shape = (batch, n_head, max_len, head_dim)
        self.keys = [np.zeros(shape, dtype=dtype) for _ in range(n_layer)]
        self.values = [np.zeros(shape, dtype=dtype) for _ in range(n_layer)]
        self.max_len = max_len
        self.length = 0  # positions stored (in every layer) before the current step

    def update(self, layer, k, v):
        """Store the new k, v (B, H, T_new, D) of `layer` after the earlier ones; return all of them."""
        start, end = self.length, self.length + k.shape[2]
        if end > self.max_len:
            raise ValueError(f"KVCache: {end} positions do not fit in a cache of {self.max_len}")
        self.keys[layer][:, :, start:end] = k
        self.values[layer][:, :, start:end] = v
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention: each position mixes the values of the positions up to it.

    One linear layer `c_attn` computes queries, keys and values for all heads at once (one big
    matrix product instead of 3 * n_head small ones); `c_proj` mixes the heads' outputs back.
    """

    def __init__(self, config):
        super().__init__()
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.dropout = config.dropout
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x, cache=None, layer=0):
        B, T, C = x.shape
        H = self.n_head
        # c_attn's weight stacks the query, key and value matrices (C rows each). Applying the three
        # row blocks one by one equals applying c_attn and cutting its output in three, and its
        # backward needs no zero-padded gradient for the (B, T, 3C) output.
        W, b = self.c_attn.weight, self.c_attn.bias
        q, k, v = (F.linear(x, W[i * C:(i + 1) * C], b[i * C:(i + 1) * C])
                   .reshape(B, T, H, C // H).transpose(0, 2, 1, 3)  # (B, H, T, D): H heads of D = C / H
                   for i in range(3))
        if cache is not None:  # generation: attend over the stored keys and values too
            k, v = (Tensor(a) for a in cache.update(layer, k.data, v.data))
        y = F.scaled_dot_product_attention(q, k, v, causal=True, dropout_p=self.dropout, training=self.training)
        y = y.transpose(0, 2, 1, 3).reshape(B, T, C)  # put the heads side by side again
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    """Position by position: widen to 4C, GELU, back to C."""

    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, config.mlp_width)
        self.c_proj = nn.Linear(config.mlp_width, config.n_embd)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        if type(self.c_fc) is nn.Linear:  # gelu(c_fc(x)) as one call: part 6 fuses the bias and the GELU
            h = F.linear_gelu(x, self.c_fc.weight, self.c_fc.bias)
        else:  # a c_fc replaced by another module keeps its own forward
            h = F.gelu(self.c_fc(x))
        return self.dropout(self.c_proj(h))


class Block(nn.Module):
    """A transformer block, pre-LayerNorm: x + attn(ln_1(x)), then x + mlp(ln_2(x)).

    The residual stream x passes through untouched; each sublayer only adds to it. Normalising
    the sublayer's input (not the sum, as the original transformer did) keeps a clean identity
    path from the loss to the embeddings, so deep stacks train without careful warm-up.
    """

    def __init__(self, config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.mlp = MLP(config)

    def forward(self, x, cache=None, layer=0):
        a = self.attn(self.ln_1(x), cache, layer)
        if type(self.ln_2) is nn.LayerNorm:  # x + a and ln_2 of it as one call: part 6 fuses them into one pass
            x, h = F.add_layer_norm(x, a, self.ln_2.weight, self.ln_2.bias, self.ln_2.eps)
        else:  # an ln_2 replaced by another module keeps its own forward
            x = x + a
            h = self.ln_2(x)
        return x + self.mlp(h)


class Transformer(nn.Module):
    """The body of the GPT (minGPT's `transformer` dict): embeddings, blocks, final LayerNorm."""

    def __init__(self, config):
        super().__init__()
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.drop = nn.Dropout(config.dropout)
        self.h = nn.ModuleList([Block(config) for _ in range(config.n_layer)])
        self.ln_f = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)


class GPT(nn.Module):
    """A decoder-only transformer language model (minGPT's GPT), trained on the course's Tensor."""

    def __init__(self, config, seed=0):
        super().__init__()
        self.config = config
        self.transformer = Transformer(config)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            # GPT-2 reads its output scores with the token embedding itself: one Parameter under two
            # names (named_parameters() lists it once, as transformer.wte.weight).
            self.lm_head.weight = self.transformer.wte.weight
        if nn.initialising():  # not inside nn.skip_init(), where a checkpoint is about to fill every weight
            self.init_weights(seed)

    @property
    def tied(self):
        return self.lm_head.weight is self.transformer.wte.weight

    # ----- real checkpoints (lesson 4.5): GPT-2's files, in course/gpt/pretrained.py ---------------
    @classmethod
    def from_pretrained(cls, source, dtype=np.float32):
        """A GPT with GPT-2's weights: `source` is a folder in the Hugging Face layout (config.json +
        model.safetensors) or a hub name such as "gpt2" (downloaded with huggingface_hub)."""
        from .pretrained import load_gpt2

        return load_gpt2(cls, source, dtype)

    def save_pretrained(self, folder):
        """Write config.json + model.safetensors in GPT-2's layout (transformers loads it); returns the folder."""
        from .pretrained import save_gpt2

        return save_gpt2(self, folder)

    def state_dict(self):
        state = super().state_dict()
        if self.tied:  # minGPT's names: lm_head.weight is listed too (a copy of the tied array)
            state["lm_head.weight"] = state["transformer.wte.weight"].copy()
        return state

    def load_state_dict(self, state, strict=True):
        if self.tied:
            state = nn.merge_tied(state, "lm_head.weight", "transformer.wte.weight",
                                  self.transformer.wte.weight.shape, "GPT",
                                  why="this model ties them (tie_word_embeddings=True)")
        return super().load_state_dict(state, strict)

    def init_weights(self, seed=0):
        """minGPT's initialisation, from its own generator: the same seed gives the same model.

        Weights are normal with std 0.02; biases zero; LayerNorms the identity (weight 1, bias 0).
        The projections that write into the residual stream (`c_proj`) get std 0.02 / sqrt(2 n_layer):
        2 n_layer of them add up on the stream, and this keeps the sum's variance near one layer's.
        """
        rng = np.random.default_rng(seed)
        proj_std = 0.02 / math.sqrt(2 * self.config.n_layer)
        for name, p in self.named_parameters():
            if ".ln_" in name or name.startswith("transformer.ln_f"):
                p.data = (np.ones if name.endswith("weight") else np.zeros)(p.shape, dtype=np.float32)
            elif name.endswith("bias"):
                p.data = np.zeros(p.shape, dtype=np.float32)
            else:
                std = proj_std if name.endswith("c_proj.weight") else 0.02
                p.data = rng.normal(0.0, std, p.shape).astype(np.float32)
        return self

    def astype(self, dtype):
        """Cast every parameter to `dtype` (float64 for gradient checks); returns the model."""
        for p in self.parameters():
            p.data = p.data.astype(dtype)
        return self

    # ----- the forward pass --------------------------------------------------------------------
    def _check_idx(self, idx, start=0, check_length=True):
        idx = idx.data if isinstance(idx, Tensor) else idx
        if not _device.is_array(idx):
            idx = np.asarray(idx)
        if idx.ndim != 2:
            raise ValueError(f"GPT: idx must be a 2-D array of token ids (batch, time), got shape {idx.shape}")
        if idx.size and not np.issubdtype(idx.dtype, np.integer):
            raise TypeError(f"GPT: token ids must be integers, got dtype {idx.dtype}")
        T = idx.shape[1]
        if check_length and start + T > self.config.block_size:
            what = f"a sequence of length {T}" if not start else f"{start} cached + {T} new positions"
            raise ValueError(f"GPT: {what} is longer than block_size {self.config.block_size}: "
                             f"crop it to the last {self.config.block_size} tokens")
        V = self.config.vocab_size
        if not isinstance(idx, np.ndarray):  # ids already on a device: checked by the range they came with
            low, high = getattr(idx, "known_range", None) or (0, 0)
            if low < 0 or high >= V:
                raise ValueError(f"GPT: token id {low if low < 0 else high} is out of range for vocab_size {V} "
                                 f"(ids go from 0 to {V - 1})")
            return idx.astype(np.int64, copy=False)
        bad = (idx < 0) | (idx >= V)
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            raise ValueError(f"GPT: token id {idx[where]} at position {where} is out of range for "
                             f"vocab_size {V} (ids go from 0 to {V - 1})")
        return idx.astype(np.int64, copy=False)

    def hidden(self, idx, cache=None):
        """The final hidden states (B, T, C): everything but the lm_head."""
        start = cache.length if cache is not None else 0
        idx = self._check_idx(idx, start)
        t = self.transformer
        if t.wpe.weight.device == "cpu":
            positions = t.wpe(np.arange(start, start + idx.shape[1]))
        else:  # on a device, the positions' rows as a slice of the table: a lookup would copy the numbers there first
            positions = t.wpe.weight[start:start + idx.shape[1]]
        x = t.drop(t.wte(idx) + positions)  # (B, T, C) + (T, C): each position adds its own vector
        for i, block in enumerate(t.h):
            x = block(x, cache, i)
        if cache is not None:
            cache.length += idx.shape[1]
        return t.ln_f(x)

    def forward(self, idx, targets=None):
        """Logits (B, T, vocab_size) for the next token at every position, and the mean cross-entropy
        against `targets` (B, T) when given (targets equal to -1 are ignored, as in minGPT)."""
        logits = self.lm_head(self.hidden(idx))
        loss = None
        if targets is not None:
            t = targets.data if isinstance(targets, Tensor) else targets
            t = t if _device.is_array(t) else np.asarray(t)
            if t.shape != logits.shape[:2]:
                raise ValueError(f"GPT: targets of shape {t.shape} must match idx of shape {logits.shape[:2]}")
            loss = F.cross_entropy(logits, t, ignore_index=-1)
        return logits, loss

    # ----- generation ---------------------------------------------------------------------------
    def new_cache(self, batch):
        c = self.config
        dtype = self.lm_head.weight.dtype
        return KVCache(c.n_layer, batch, c.n_head, c.block_size, c.n_embd // c.n_head, dtype)

    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, do_sample=True,
                 use_cache=True, seed=None, rng=None):
        """Extend `idx` (B, T) by `max_new_tokens` tokens, each drawn from the model's prediction.

        temperature divides the logits (below 1: bolder, above 1: more random); top_k keeps only
        the k likeliest tokens; do_sample=False picks the likeliest token (greedy). Random draws
        come from `rng`, or a generator seeded with `seed`. With use_cache, keys and values are
        kept (see KVCache) and only the new token runs through the model; the tokens are the same
        as without the cache. Once the sequence is longer than block_size, the model reads only
        the last block_size tokens, with positions 0..block_size-1 again: the stored keys carry
        the old positions, so from then on the cache is refilled from the cropped window each step.
        """
        check_generation(max_new_tokens, temperature, top_k, do_sample, self.config.vocab_size)
        idx = self._check_idx(np.atleast_2d(np.asarray(idx)), check_length=False)
        if idx.shape[1] == 0:
            raise ValueError("generate: the prompt is empty: give at least one token id to start from "
                             "(for example the id of a newline), as an array of shape (batch, time)")
        rng = rng if rng is not None else np.random.default_rng(seed)
        block = self.config.block_size
        was_training = self.training
        self.eval()
        cache = None
        try:
            with no_grad():
                for _ in range(max_new_tokens):
                    if not use_cache:
                        h = self.hidden(idx[:, -block:])
                    elif cache is None or cache.length >= block:
                        cache = self.new_cache(len(idx))  # (re)fill from the last block_size tokens
                        h = self.hidden(idx[:, -block:], cache)
                    else:
                        h = self.hidden(idx[:, -1:], cache)  # only the newest token
                    logits = self.lm_head(h[:, -1, :]).data  # (B, vocab): the last position only
                    nxt = sample_next(logits, temperature, top_k, do_sample, rng)
                    idx = np.concatenate([idx, nxt[:, None]], axis=1)
        finally:
            self.train(was_training)
        return idx
