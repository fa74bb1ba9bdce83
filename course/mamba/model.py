"""The Mamba language model of lesson 5.3, on the course's own Tensor: mamba-minimal's architecture and names.

    config = MambaConfig(d_model=64, n_layer=2, vocab_size=65)
    model = Mamba(config, seed=0)
    logits = model(input_ids)                          # (B, L) ids -> (B, L, config.padded_vocab_size)
    state = model.init_state(batch_size=B)
    logits, state = model.step(token_ids, state)       # one token per sequence, constant memory
    out = model.generate(prompt, 50, temperature=0.8, top_k=10, seed=0)

Each token becomes a vector (its embedding); `n_layer` residual blocks `x + mixer(norm(x))` each
mix information along time with a selective state-space model (the Mamba block below); a final
RMSNorm and a linear layer tied to the embedding read the next-token scores off each position.
Unlike attention, a block carries a fixed-size state from one token to the next, so generating a
token costs the same at position 10 as at position 10,000: `step` is that recurrent view, and it
gives the same logits as `forward` (tests/test_part5_model.py checks it).

Parameter names are mamba-minimal's (`layers.0.mixer.in_proj.weight`, ...), so its state dicts,
saved as NumPy arrays, load here by name, and the other way round.

`MambaConfig(..., selective=False)` switches the selection off (lesson 5.4's ablation): delta, B and
C become learned parameters, the same at every position, and the SSM is time-invariant.
"""

import math
from dataclasses import asdict, dataclass

import numpy as np

from .. import nn
from ..sampling import check_generation, sample_next
from ..tensor import Tensor, no_grad
from ..tensor import functional as F
from .ops import causal_conv1d, rms_norm
from .scan import METHODS, selective_scan

__all__ = ["MambaConfig", "Mamba", "MambaBlock", "ResidualBlock", "RMSNorm", "CausalConv1d", "MambaState"]

PAD_VOCAB_SIZE_MULTIPLE = 8  # mamba-minimal pads the vocabulary to a multiple of 8 (faster matrix products)


@dataclass
class MambaConfig:
    d_model: int  # the width of the residual stream
    n_layer: int
    vocab_size: int  # the real vocabulary; the model's tables have padded_vocab_size rows
    d_state: int = 16  # n: numbers of state per channel
    expand: int = 2  # d_inner = expand * d_model channels inside a block
    dt_rank: object = "auto"  # the rank of delta's projection; "auto": ceil(d_model / 16)
    d_conv: int = 4  # taps of the causal convolution
    # True: delta, B and C are computed from each token (Mamba's selection, the paper's S6). False:
    # they are parameters, the same at every position for every input (a time-invariant SSM, the
    # paper's S4 row of its Table 1): the block has no x_proj and no dt_proj weight, but learned
    # dt_bias (d_inner,), B and C (d_state,). Lesson 5.4 trains both on the same task.
    selective: bool = True

    def __post_init__(self):
        for name in ("d_model", "n_layer", "vocab_size", "d_state", "expand", "d_conv"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"MambaConfig: {name} must be a positive integer, got {value!r}")
            setattr(self, name, int(value))
        if self.dt_rank == "auto":
            self.dt_rank = math.ceil(self.d_model / 16)
        elif isinstance(self.dt_rank, bool) or not isinstance(self.dt_rank, (int, np.integer)) or self.dt_rank < 1:
            raise ValueError(f"MambaConfig: dt_rank must be a positive integer or 'auto', got {self.dt_rank!r}")
        self.dt_rank = int(self.dt_rank)
        if not isinstance(self.selective, (bool, np.bool_)):
            raise ValueError(f"MambaConfig: selective must be True or False, got {self.selective!r}")
        self.selective = bool(self.selective)

    @property
    def d_inner(self):
        return self.expand * self.d_model

    @property
    def padded_vocab_size(self):
        """vocab_size rounded up to a multiple of 8; the ids past vocab_size are never sampled."""
        m = PAD_VOCAB_SIZE_MULTIPLE
        return -(-self.vocab_size // m) * m

    def to_dict(self):
        return asdict(self)


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(np.ones(d, dtype=np.float32))

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)

    def extra_repr(self):
        return f"{self.weight.shape[0]}, eps={self.eps}"


class CausalConv1d(nn.Module):
    """A depthwise causal convolution; weight (channels, 1, k) as PyTorch's Conv1d(groups=channels) stores it."""

    def __init__(self, channels, k, rng):
        super().__init__()
        bound = 1 / math.sqrt(k)  # PyTorch's default: fan-in of a depthwise filter is k
        self.weight = nn.Parameter(rng.uniform(-bound, bound, (channels, 1, k)).astype(np.float32))
        self.bias = nn.Parameter(rng.uniform(-bound, bound, channels).astype(np.float32))

    def forward(self, x):
        return causal_conv1d(x, self.weight, self.bias)

    def extra_repr(self):
        return f"{self.weight.shape[0]}, k={self.weight.shape[2]}"


class MambaBlock(nn.Module):
    """The Mamba block (the "mixer"): in-projection, causal conv, SiLU, selective SSM, gate, out-projection.

    in_proj widens x to two branches of d_inner channels: x goes through a short causal
    convolution (mixing the last d_conv tokens) and the selective scan (mixing the whole past);
    res, through SiLU, gates the result channel by channel. delta, B and C are computed from x
    itself: x_proj gives a low-rank delta (dt_rank numbers, widened by dt_proj) and B and C.
    """

    def __init__(self, config, rng):
        super().__init__()
        c = config
        d_in, n, r = c.d_inner, c.d_state, c.dt_rank
        self.config = c
        self.in_proj = nn.Linear(c.d_model, 2 * d_in, bias=False, rng=rng)
        self.conv1d = CausalConv1d(d_in, c.d_conv, rng)
        if c.selective:
            self.x_proj = nn.Linear(d_in, r + 2 * n, bias=False, rng=rng)
            self.dt_proj = nn.Linear(r, d_in, bias=True, rng=rng)
        # delta = softplus(dt_proj(...)) should start between 0.001 and 0.1 (log-uniformly): small
        # steps remember long, large steps forget fast, and the channels begin with a spread of both.
        # The bias is softplus's inverse of such a delta (so a zero input gives exactly it); the
        # weight is uniform in +-dt_rank^-0.5. This is the official Mamba's initialisation.
        std = r ** -0.5
        if nn.initialising():  # not inside nn.skip_init(), where a checkpoint is about to fill every weight
            dt_weight = rng.uniform(-std, std, (d_in, r)).astype(np.float32)
            dt = np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), d_in)).clip(min=1e-4)
            dt_bias = (dt + np.log(-np.expm1(-dt))).astype(np.float32)  # softplus^-1(dt)
        else:
            dt_weight, dt_bias = np.zeros((d_in, r), np.float32), np.zeros(d_in, np.float32)
        if c.selective:
            self.dt_proj.weight.data, self.dt_proj.bias.data = dt_weight, dt_bias
        else:  # the same starting steps; B = 1 and C ~ N(0, 1/n), as S4D initialises them
            self.dt_bias = nn.Parameter(dt_bias)
            self.B = nn.Parameter(np.ones(n, dtype=np.float32))
            self.C = nn.Parameter(rng.normal(0.0, n ** -0.5, n).astype(np.float32))
        # A = -exp(A_log) = -(1, 2, ..., n) in every channel: state i decays at rate i, a range of
        # memories from long to short (S4D-Real). Stored as a log so that A stays negative: h stays bounded.
        self.A_log = nn.Parameter(np.log(np.tile(np.arange(1, n + 1, dtype=np.float32), (d_in, 1))))
        self.D = nn.Parameter(np.ones(d_in, dtype=np.float32))  # the skip connection y += D u
        self.out_proj = nn.Linear(d_in, c.d_model, bias=False, rng=rng)

    def forward(self, x, method="fast"):
        d_in = self.config.d_inner
        # in_proj's weight stacks the two branches' matrices: applying each half equals applying
        # in_proj and splitting its output, without a gradient padded with zeros for the split.
        W = self.in_proj.weight
        u, res = F.linear(x, W[:d_in]), F.linear(x, W[d_in:])  # (b, l, d_in) each
        u = F.silu(self.conv1d(u))
        y = self.ssm(u, method)
        return self.out_proj(y * F.silu(res))

    def ssm_parameters(self, u):
        """delta (b, l, d_in), A (d_in, n), B and C (b, l, n) for the input u: all but A depend on u
        (unless config.selective is False: then none does)."""
        c = self.config
        r, n = c.dt_rank, c.d_state
        A = -self.A_log.exp()
        if not c.selective:  # the same delta, B and C at every position, whatever the input
            ones = Tensor(np.ones_like(u.data, shape=u.shape[:2] + (1,)))  # (b, l, 1), on u's device: broadcast over time
            return ones * F.softplus(self.dt_bias), A, ones * self.B, ones * self.C
        x_dbl = self.x_proj(u)  # (b, l, dt_rank + 2n): one matrix product, then cut in three
        delta = F.softplus(self.dt_proj(x_dbl[..., :r]))
        B, C = x_dbl[..., r:r + n], x_dbl[..., r + n:]
        return delta, A, B, C

    def ssm(self, u, method="fast"):
        delta, A, B, C = self.ssm_parameters(u)
        return selective_scan(u, delta, A, B, C, self.D, method=method)


class ResidualBlock(nn.Module):
    """x + mixer(norm(x)): pre-normalisation, as in GPT's blocks, with RMSNorm."""

    def __init__(self, config, rng):
        super().__init__()
        self.mixer = MambaBlock(config, rng)
        self.norm = RMSNorm(config.d_model)

    def forward(self, x, method="fast"):
        return x + self.mixer(self.norm(x), method)


class MambaState:
    """What `step` carries from one token to the next, per layer: the last d_conv - 1 inputs of the
    convolution (conv, (B, d_conv - 1, d_inner)) and the SSM state (ssm, (B, d_inner, d_state)).
    Its size does not grow with the sequence: constant memory per token."""

    def __init__(self, conv, ssm):
        self.conv, self.ssm = list(conv), list(ssm)

    @property
    def batch_size(self):
        return self.ssm[0].shape[0]

    def nbytes(self):
        return sum(a.nbytes for a in self.conv + self.ssm)

    def __repr__(self):
        return f"MambaState(batch_size={self.batch_size}, layers={len(self.ssm)}, {self.nbytes()} bytes)"


class Mamba(nn.Module):
    """A Mamba language model (mamba-minimal's `Mamba`), trained on the course's Tensor.

    `scan_method` chooses the selective scan's method ("fast" by default; "sequential" and
    "parallel" give the same results, more slowly).
    """

    def __init__(self, config, seed=0):
        super().__init__()
        if not isinstance(config, MambaConfig):
            raise TypeError(f"Mamba: config must be a MambaConfig, got {type(config).__name__}")
        self.config = config
        self.scan_method = "fast"
        rng = np.random.default_rng(seed)
        c = config
        self.embedding = nn.Embedding(c.padded_vocab_size, c.d_model, rng=rng)
        # Small embeddings (std 0.02, as the official Mamba initialises them): the table is also the
        # output layer, and unit-variance rows would start the model with very confident guesses.
        if nn.initialising():
            self.embedding.weight.data = rng.normal(0.0, 0.02, self.embedding.weight.shape).astype(np.float32)
        self.layers = nn.ModuleList([ResidualBlock(c, rng) for _ in range(c.n_layer)])
        self.norm_f = RMSNorm(c.d_model)
        self.lm_head = nn.Linear(c.d_model, c.padded_vocab_size, bias=False, rng=rng)
        # Tied: the output layer scores token v by its embedding's dot product with the hidden state.
        # One Parameter under two names: named_parameters() lists it once, as embedding.weight.
        self.lm_head.weight = self.embedding.weight

    def astype(self, dtype):
        """Cast every parameter to `dtype` (float64 for gradient checks); returns the model."""
        for p in self.parameters():
            p.data = p.data.astype(dtype)
        return self

    @property
    def dtype(self):
        return self.embedding.weight.dtype

    # ----- released checkpoints (lesson 5.5), in course/mamba/pretrained.py ------------------------
    @classmethod
    def from_pretrained(cls, source, dtype=np.float32):
        """A Mamba with released weights: `source` is a folder holding config.json + model.safetensors
        (Hugging Face's layout or mamba_ssm's original one), or a hub name such as
        "state-spaces/mamba-130m-hf" (downloaded with huggingface_hub)."""
        from .pretrained import load_mamba

        return load_mamba(cls, source, dtype)

    def save_pretrained(self, folder):
        """Write config.json + model.safetensors in Hugging Face's layout; returns the folder."""
        from .pretrained import save_mamba

        return save_mamba(self, folder)

    # ----- names: lm_head.weight is a second name of embedding.weight -----------------------------
    def state_dict(self):
        state = super().state_dict()
        state["lm_head.weight"] = state["embedding.weight"].copy()
        return state

    def load_state_dict(self, state, strict=True):
        """Load by name. `lm_head.weight` may be given (it must then equal `embedding.weight`) or left out."""
        state = nn.merge_tied(state, "lm_head.weight", "embedding.weight", self.embedding.weight.shape, "Mamba")
        return super().load_state_dict(state, strict)

    # ----- the forward pass ---------------------------------------------------------------------
    def _check_ids(self, ids, ndim, what):
        ids = np.asarray(ids.data if isinstance(ids, Tensor) else ids)
        if ids.ndim != ndim:
            shape = "(batch, length)" if ndim == 2 else "(batch,)"
            raise ValueError(f"Mamba: {what} must be a {ndim}-D array of token ids {shape}, got shape {ids.shape}")
        if ids.size and not np.issubdtype(ids.dtype, np.integer):
            raise TypeError(f"Mamba: token ids must be integers, got dtype {ids.dtype}")
        V = self.config.vocab_size
        bad = (ids < 0) | (ids >= V)
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            raise ValueError(f"Mamba: token id {ids[where]} at position {where} is out of range for "
                             f"vocab_size {V} (ids go from 0 to {V - 1})")
        return ids.astype(np.int64, copy=False)

    def forward(self, input_ids):
        """Logits (B, L, padded_vocab_size) for the next token at every position of input_ids (B, L)."""
        if self.scan_method not in METHODS:
            raise ValueError(f"Mamba: unknown scan_method {self.scan_method!r}; the known ones are "
                             f"{', '.join(map(repr, METHODS))}")
        ids = self._check_ids(input_ids, 2, "input_ids")
        x = self.embedding(ids)
        for layer in self.layers:
            x = layer(x, self.scan_method)
        return self.lm_head(self.norm_f(x))

    # ----- the recurrent view: one token at a time ---------------------------------------------------
    def init_state(self, batch_size):
        """The state before the first token: zeros (the convolution sees zeros before t = 0, as in forward)."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ValueError(f"Mamba.init_state: batch_size must be a positive integer, got {batch_size!r}")
        c = self.config
        conv = [np.zeros((batch_size, c.d_conv - 1, c.d_inner), dtype=self.dtype) for _ in range(c.n_layer)]
        ssm = [np.zeros((batch_size, c.d_inner, c.d_state), dtype=self.dtype) for _ in range(c.n_layer)]
        return MambaState(conv, ssm)

    def step(self, token_ids, state):
        """Feed one token per sequence: token_ids (B,) and the state -> logits (B, padded_vocab_size)
        and the new state (the given one is left unchanged).

        The same computation as forward at one position: the convolution reads its last d_conv - 1
        inputs from the state, and the scan does one step of h = exp(delta A) h + delta B u.
        """
        ids = self._check_ids(token_ids, 1, "token_ids")
        if not isinstance(state, MambaState):
            raise TypeError(f"Mamba.step: state must be a MambaState (from init_state), got {type(state).__name__}")
        if state.batch_size != len(ids) or len(state.ssm) != self.config.n_layer:
            raise ValueError(f"Mamba.step: the state holds {state.batch_size} sequences of {len(state.ssm)} layers, "
                             f"but {len(ids)} token ids were given to a model of {self.config.n_layer} layers "
                             f"(make one with init_state({len(ids)}))")
        c, B = self.config, len(ids)
        for i, (conv_i, ssm_i) in enumerate(zip(state.conv, state.ssm)):
            want_conv, want_ssm = (B, c.d_conv - 1, c.d_inner), (B, c.d_inner, c.d_state)
            if np.shape(conv_i) != want_conv or np.shape(ssm_i) != want_ssm:
                raise ValueError(f"Mamba.step: the state does not fit this model: layer {i} holds a convolution state "
                                 f"{np.shape(conv_i)} and an SSM state {np.shape(ssm_i)}, this model needs {want_conv} "
                                 f"and {want_ssm} (d_conv={c.d_conv}, d_inner={c.d_inner}, d_state={c.d_state}): "
                                 f"was it made by another model's init_state?")
        conv, ssm = [], []
        with no_grad():
            x = self.embedding(ids[:, None])  # (B, 1, d_model): a sequence of one token
            for i, layer in enumerate(self.layers):
                out, c_i, h_i = self._mixer_step(layer.mixer, layer.norm(x), state.conv[i], state.ssm[i])
                x = x + out
                conv.append(c_i)
                ssm.append(h_i)
            logits = self.lm_head(self.norm_f(x))
        return logits.data[:, 0], MambaState(conv, ssm)

    @staticmethod
    def _mixer_step(mixer, x, conv_state, h):
        d_in = mixer.config.d_inner
        W = mixer.in_proj.weight
        u, res = F.linear(x, W[:d_in]).data, F.linear(x, W[d_in:])  # (B, 1, d_in)
        window = np.concatenate([conv_state, u], axis=1)  # (B, d_conv, d_in): the last d_conv inputs
        w = mixer.conv1d.weight.data[:, 0, :]  # (d_in, d_conv)
        conv_out = (window * w.T).sum(axis=1, keepdims=True) + mixer.conv1d.bias.data
        u = F.silu(Tensor(conv_out))
        delta, A, B, C = (t.data for t in mixer.ssm_parameters(u))
        delta, B, C, u_ = delta[:, 0], B[:, 0], C[:, 0], u.data[:, 0]
        h = np.exp(delta[:, :, None] * A) * h + (delta * u_)[:, :, None] * B[:, None, :]
        y = np.einsum("bdn,bn->bd", h, C) + mixer.D.data * u_
        out = mixer.out_proj(Tensor(y[:, None]) * F.silu(res))
        return out, window[:, 1:], h

    def generate(self, input_ids, max_new_tokens, temperature=1.0, top_k=None, do_sample=True, seed=None, rng=None):
        """Extend input_ids (B, L), L >= 1, by max_new_tokens tokens, each drawn from the model's
        prediction; returns the prompt followed by the new tokens, (B, L + max_new_tokens).

        Runs on `step`: the prompt is read one token at a time into the state, then each new token
        costs one step, whatever the length so far. temperature, top_k, do_sample and seed/rng as in
        GPT.generate; the padding ids (past vocab_size) are never drawn.
        """
        check_generation(max_new_tokens, temperature, top_k, do_sample, self.config.vocab_size)
        ids = self._check_ids(np.atleast_2d(np.asarray(input_ids)), 2, "input_ids")
        if ids.shape[1] == 0:
            raise ValueError("generate: the prompt is empty: give at least one token per sequence")
        rng = rng if rng is not None else np.random.default_rng(seed)
        state = self.init_state(len(ids))
        for t in range(ids.shape[1]):
            logits, state = self.step(ids[:, t], state)
        out = [ids]
        for i in range(max_new_tokens):
            logits = logits.astype(np.float64)
            logits[:, self.config.vocab_size:] = -np.inf  # padding ids are not tokens
            nxt = sample_next(logits, temperature, top_k, do_sample, rng)
            out.append(nxt[:, None])
            if i + 1 < max_new_tokens:
                logits, state = self.step(nxt, state)
        return np.concatenate(out, axis=1)
