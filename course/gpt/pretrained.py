"""GPT-2's checkpoints in the course's GPT (lesson 4.5): `GPT.from_pretrained` and `GPT.save_pretrained`.

GPT-2 is minGPT's architecture (minGPT was written to load it), so loading it is mostly renaming,
with two differences worth knowing:

- OpenAI wrote GPT-2's linear layers as `Conv1D` modules, whose weight is stored (in, out): it
  computes x @ W + b. The course's Linear stores (out, in), as PyTorch's nn.Linear does, and
  computes x @ W.T + b. So the four such weights of every block (attn.c_attn, attn.c_proj,
  mlp.c_fc, mlp.c_proj) are transposed on the way in and on the way out, as minGPT does.
- GPT-2 has no lm_head of its own: the output layer is the token embedding (tied weights), so
  the file holds `wte.weight` once; the course's model ties `lm_head.weight` to it.

The folder layout is Hugging Face's: `config.json` (GPT-2's names: n_positions, n_embd,
layer_norm_epsilon, ...) and `model.safetensors` (names `transformer.h.0.attn.c_attn.weight`, ...,
or without the `transformer.` prefix, as in the hub's "gpt2"). Settings the course's GPT cannot
represent are refused, naming the config key.
"""

from pathlib import Path

import numpy as np

from .. import nn
from ..pretrained import CheckpointError, read_config, read_safetensors, resolve, write_config, write_safetensors
from .model import GPTConfig

__all__ = ["config_from_hf", "config_to_hf", "load_gpt2", "save_gpt2", "CONV1D", "FILES"]

FILES = ["config.json", "model.safetensors"]
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
BUFFERS = (".attn.bias", ".attn.masked_bias")  # the causal mask, saved by old versions: not weights
GPT2_EOS = 50256  # <|endoftext|> in GPT-2's vocabulary of 50257
TANH_GELU = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")  # GELU's tanh approximation, the course's F.gelu

# GPT-2 settings the course's GPT has no counterpart for: (key, the value it needs, why).
_FIXED = [
    ("scale_attn_weights", True, "the course always divides attention scores by sqrt(head size)"),
    ("scale_attn_by_inverse_layer_idx", False, "the course does not scale attention by 1 / layer index"),
    ("add_cross_attention", False, "the course's GPT is decoder-only, without cross-attention"),
    ("is_encoder_decoder", False, "the course's GPT is decoder-only"),
]


def config_from_hf(config, where="config.json"):
    """A GPTConfig from GPT-2's config.json (a dict); what the course cannot represent is an error."""
    model_type = config.get("model_type")
    if model_type is not None and model_type != "gpt2":
        raise CheckpointError(f"{where}: model_type {model_type!r} is not GPT-2: GPT.from_pretrained reads GPT-2 "
                              f"checkpoints (model_type 'gpt2')" +
                              ("; load this one with Mamba.from_pretrained" if model_type == "mamba" else ""))
    need = ["vocab_size", "n_positions", "n_embd", "n_layer", "n_head"]
    missing = [k for k in need if k not in config]
    if missing:
        raise CheckpointError(f"{where}: missing {', '.join(missing)}: not a GPT-2 config "
                              f"(it needs {', '.join(need)})")
    act = config.get("activation_function", "gelu_new")
    if act not in TANH_GELU:
        raise CheckpointError(f"{where}: activation_function {act!r} is not supported: the course's GPT uses "
                              f"GELU's tanh approximation ({' / '.join(TANH_GELU)})")
    for key, value, why in _FIXED:
        if key in config and bool(config[key]) != value:
            raise CheckpointError(f"{where}: {key}={config[key]!r} is not supported: {why}")
    dropouts = {k: float(config.get(k, 0.0) or 0.0) for k in ("resid_pdrop", "embd_pdrop", "attn_pdrop")}
    try:
        return GPTConfig(vocab_size=int(config["vocab_size"]), block_size=int(config["n_positions"]),
                         n_layer=int(config["n_layer"]), n_head=int(config["n_head"]), n_embd=int(config["n_embd"]),
                         dropout=max(dropouts.values()),  # one rate in the course; only training uses it
                         layer_norm_epsilon=float(config.get("layer_norm_epsilon", 1e-5)),
                         n_inner=None if config.get("n_inner") is None else int(config["n_inner"]),
                         tie_word_embeddings=bool(config.get("tie_word_embeddings", True)))
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{where}: {e}") from None


def config_to_hf(config):
    """GPT-2's config.json (a dict) for a GPTConfig: what transformers' GPT2LMHeadModel reads."""
    c = config
    return {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
            "vocab_size": c.vocab_size, "n_positions": c.block_size, "n_ctx": c.block_size,
            "n_embd": c.n_embd, "n_layer": c.n_layer, "n_head": c.n_head, "n_inner": c.n_inner,
            "activation_function": "gelu_new", "layer_norm_epsilon": c.layer_norm_epsilon,
            "resid_pdrop": c.dropout, "embd_pdrop": c.dropout, "attn_pdrop": c.dropout,
            "scale_attn_weights": True, "tie_word_embeddings": c.tie_word_embeddings,
            # <|endoftext|> (the last id) where the vocabulary is GPT-2's; none in the course's own
            "bos_token_id": GPT2_EOS if c.vocab_size == GPT2_EOS + 1 else None,
            "eos_token_id": GPT2_EOS if c.vocab_size == GPT2_EOS + 1 else None}


def _course_name(name):
    """The course's name for a tensor of GPT-2's file (GPT2Model's files drop `transformer.`)."""
    if name.startswith("lm_head.") or name.startswith("transformer."):
        return name
    return "transformer." + name


def load_gpt2(cls, source, dtype=np.float32):
    folder = resolve(source, FILES)
    config = config_from_hf(read_config(folder / "config.json"), where=str(folder / "config.json"))
    file = folder / "model.safetensors"
    tensors = read_safetensors(file)
    with nn.skip_init():  # every weight comes from the file: no random draws to throw away
        model = cls(config, seed=0)
    params = dict(model.named_parameters())
    state = {}
    unexpected = []
    for name, array in tensors.items():
        course = _course_name(name)
        if course.endswith(BUFFERS):
            continue
        if course not in params and not (course == "lm_head.weight" and model.tied):
            unexpected.append(name)
            continue
        if course.endswith(CONV1D):
            array = array.T  # Conv1D (in, out) -> Linear (out, in)
        state[course] = array
    if unexpected:
        shown = ", ".join(unexpected[:5]) + (f" and {len(unexpected) - 5} more" if len(unexpected) > 5 else "")
        raise CheckpointError(f"{file}: tensors GPT-2 does not have: {shown} (a checkpoint of another "
                              f"architecture, or a GPT-2 variant the course cannot represent)")
    missing = [n for n in params if n not in state]
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        hint = (" (config.json says tie_word_embeddings=false, but the file has no lm_head.weight)"
                if missing == ["lm_head.weight"] else "")
        raise CheckpointError(f"{file}: missing tensors: {shown}{hint}")
    wrong = [f"{n}: expected {params[n].shape}, got {tuple(a.shape)}" + (" (after the Conv1D transpose)"
             if n.endswith(CONV1D) else "") for n, a in state.items() if n in params and tuple(a.shape) != params[n].shape]
    if wrong:
        raise CheckpointError(f"{file}: shapes that do not match config.json: " + "; ".join(wrong[:5]))
    for name, p in params.items():
        p.data = np.ascontiguousarray(state[name], dtype=dtype)
    if model.tied and "lm_head.weight" in state and not np.array_equal(state["lm_head.weight"],
                                                                     state["transformer.wte.weight"]):
        raise CheckpointError(f"{file}: lm_head.weight differs from wte.weight, but config.json ties them "
                              f"(tie_word_embeddings is true)")
    return model.eval()


def save_gpt2(model, folder):
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, p in model.named_parameters():  # a tied lm_head is listed once, as transformer.wte.weight
        tensors[name] = p.data.T if name.endswith(CONV1D) else p.data
    config = config_to_hf(model.config)
    write_safetensors(folder / "model.safetensors", tensors)
    write_config(folder / "config.json", config)
    return folder
