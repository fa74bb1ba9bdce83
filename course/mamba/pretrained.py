"""Released Mamba checkpoints in the course's Mamba (lesson 5.5): `Mamba.from_pretrained`, `save_pretrained`.

The course's Mamba keeps mamba-minimal's names, which are the official model's (mamba_ssm) minus
the `backbone.` prefix. Released checkpoints come in two layouts, both read here:

- mamba_ssm's original one (state-spaces/mamba-130m, ...; mamba-minimal loads these):
  `backbone.embedding.weight`, `backbone.layers.{i}.mixer.*`, `backbone.norm_f.weight`, and a
  config.json with `d_model`, `n_layer`, `vocab_size` (unpadded), `ssm_cfg`, `rms_norm`, ...;
- Hugging Face's (state-spaces/mamba-130m-hf, what `transformers`' MambaForCausalLM reads and
  writes): `backbone.embeddings.weight` (with an s), the same `layers` and `norm_f`, and a
  config.json with `hidden_size`, `num_hidden_layers`, `state_size`, `conv_kernel`,
  `time_step_rank`, `expand`, ...; its vocab_size counts the embedding's rows.

The mixer's tensors have the same names and shapes in all three. What a checkpoint may have that
the course's Mamba has no room for (biases on in_proj/out_proj, no conv bias, LayerNorm instead
of RMSNorm, an untied lm_head, Mamba-2's layers) is refused, naming what differs.
"""

from pathlib import Path

import numpy as np

from .. import nn
from ..pretrained import CheckpointError, read_config, read_safetensors, resolve, write_config, write_safetensors
from .model import PAD_VOCAB_SIZE_MULTIPLE, MambaConfig

__all__ = ["config_from_file", "config_to_hf", "load_mamba", "save_mamba", "FILES"]

FILES = ["config.json", "model.safetensors"]


def _refuse(where, key, value, why):
    raise CheckpointError(f"{where}: {key}={value!r} cannot be represented by the course's Mamba: {why}")


def config_from_file(config, where="config.json"):
    """(MambaConfig, form) from config.json in either form; form is "hf" or "original"."""
    model_type = config.get("model_type")
    if model_type is not None and model_type != "mamba":
        extra = "; load GPT-2 checkpoints with GPT.from_pretrained" if model_type == "gpt2" else ""
        raise CheckpointError(f"{where}: model_type {model_type!r} is not Mamba: Mamba.from_pretrained reads "
                              f"Mamba (1) checkpoints{extra}")
    if "hidden_size" in config:  # Hugging Face's form
        form = "hf"
        need = ["hidden_size", "num_hidden_layers", "vocab_size"]
        if config.get("use_bias", False):
            _refuse(where, "use_bias", config["use_bias"], "its in_proj and out_proj have no bias")
        if not config.get("use_conv_bias", True):
            _refuse(where, "use_conv_bias", config["use_conv_bias"], "its causal convolution always has a bias")
        if config.get("hidden_act", "silu") != "silu":
            _refuse(where, "hidden_act", config["hidden_act"], "its block gates with SiLU")
        if not config.get("tie_word_embeddings", True):
            _refuse(where, "tie_word_embeddings", False, "its lm_head is the embedding (tied)")
        eps = config.get("layer_norm_epsilon", 1e-5)
        if eps != 1e-5:
            _refuse(where, "layer_norm_epsilon", eps, "its RMSNorm uses eps 1e-5")
        args = dict(d_model=config.get("hidden_size"), n_layer=config.get("num_hidden_layers"),
                    vocab_size=config.get("vocab_size"), d_state=config.get("state_size", 16),
                    expand=config.get("expand", 2), d_conv=config.get("conv_kernel", 4),
                    dt_rank=config.get("time_step_rank", "auto"))
    elif "d_model" in config:  # mamba_ssm's original form
        form = "original"
        need = ["d_model", "n_layer", "vocab_size"]
        ssm = dict(config.get("ssm_cfg") or {})
        if ssm.get("layer", "Mamba1") != "Mamba1":
            _refuse(where, "ssm_cfg.layer", ssm["layer"], "it is a Mamba (1) model")
        if not config.get("rms_norm", True):
            _refuse(where, "rms_norm", config["rms_norm"], "its norms are RMSNorm, not LayerNorm")
        if config.get("d_intermediate", 0):
            _refuse(where, "d_intermediate", config["d_intermediate"], "its blocks have no MLP")
        if config.get("attn_layer_idx"):
            _refuse(where, "attn_layer_idx", config["attn_layer_idx"], "it has no attention layers")
        if not config.get("tie_embeddings", True):
            _refuse(where, "tie_embeddings", False, "its lm_head is the embedding (tied)")
        for key in ("bias", "conv_bias"):
            wanted = key == "conv_bias"
            if key in ssm and bool(ssm[key]) != wanted:
                _refuse(where, f"ssm_cfg.{key}", ssm[key], "in_proj/out_proj have no bias; the conv has one")
        multiple = config.get("pad_vocab_size_multiple", PAD_VOCAB_SIZE_MULTIPLE)
        vocab = config.get("vocab_size")
        if isinstance(vocab, int) and isinstance(multiple, int) and multiple > 0 and \
                -(-vocab // multiple) * multiple != -(-vocab // PAD_VOCAB_SIZE_MULTIPLE) * PAD_VOCAB_SIZE_MULTIPLE:
            _refuse(where, "pad_vocab_size_multiple", multiple,
                    f"it pads the vocabulary to a multiple of {PAD_VOCAB_SIZE_MULTIPLE}")
        args = dict(d_model=config.get("d_model"), n_layer=config.get("n_layer"), vocab_size=vocab,
                    d_state=ssm.get("d_state", 16), expand=ssm.get("expand", 2), d_conv=ssm.get("d_conv", 4),
                    dt_rank=ssm.get("dt_rank", "auto"))
    else:
        raise CheckpointError(f"{where}: not a Mamba config: it has neither d_model (mamba_ssm's form) nor "
                              f"hidden_size (Hugging Face's form)")
    missing = [k for k in need if config.get(k) is None]
    if missing:
        raise CheckpointError(f"{where}: missing {', '.join(missing)}")
    try:
        return MambaConfig(**args), form
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{where}: {e}") from None


def config_to_hf(config):
    """Hugging Face's config.json (a dict) for a MambaConfig: what MambaForCausalLM reads."""
    c = config
    return {"model_type": "mamba", "architectures": ["MambaForCausalLM"],
            "hidden_size": c.d_model, "num_hidden_layers": c.n_layer, "vocab_size": c.vocab_size,
            "state_size": c.d_state, "expand": c.expand, "intermediate_size": c.d_inner,
            "conv_kernel": c.d_conv, "time_step_rank": c.dt_rank, "use_bias": False, "use_conv_bias": True,
            "hidden_act": "silu", "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True,
            "pad_vocab_size_multiple": PAD_VOCAB_SIZE_MULTIPLE, "residual_in_fp32": False}


def _course_names(tensors):
    """The course's names for the file's tensors: strip `backbone.`, rename `embeddings` (HF's)."""
    out = {}
    unexpected = []
    for name, array in tensors.items():
        if name == "lm_head.weight":
            out[name] = array
            continue
        if not name.startswith("backbone."):
            unexpected.append(name)
            continue
        course = name[len("backbone."):]
        if course == "embeddings.weight":
            course = "embedding.weight"
        out[course] = array
    return out, unexpected


def load_mamba(cls, source, dtype=np.float32):
    folder = resolve(source, FILES)
    config, form = config_from_file(read_config(folder / "config.json"), where=str(folder / "config.json"))
    file = folder / "model.safetensors"
    state, unexpected = _course_names(read_safetensors(file))
    with nn.skip_init():  # every weight comes from the file: no random draws to throw away
        model = cls(config, seed=0)
    params = dict(model.named_parameters())
    unexpected += [n for n in state if n not in params and n != "lm_head.weight"]
    if unexpected:
        biases = [n for n in unexpected if n.endswith(("in_proj.bias", "out_proj.bias"))]
        why = (" (biases on in_proj/out_proj, which the course's Mamba does not have)" if biases else
               " (a checkpoint of another architecture?)")
        shown = ", ".join(unexpected[:5]) + (f" and {len(unexpected) - 5} more" if len(unexpected) > 5 else "")
        raise CheckpointError(f"{file}: tensors the course's Mamba does not have: {shown}{why}")
    missing = [n for n in params if n not in state]
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise CheckpointError(f"{file}: missing tensors: {shown}")
    # Hugging Face's embedding has vocab_size rows; the course's has them padded to a multiple of 8
    # (the padded ids are never sampled): pad with zero rows.
    rows = config.padded_vocab_size
    for name in ("embedding.weight", "lm_head.weight"):
        a = state.get(name)
        if a is not None and a.ndim == 2 and a.shape[0] == config.vocab_size < rows:
            state[name] = np.concatenate([a, np.zeros((rows - a.shape[0], a.shape[1]), a.dtype)])
    wrong = [f"{n}: expected {params[n].shape}, got {tuple(state[n].shape)}" for n in params
             if tuple(state[n].shape) != params[n].shape]
    if wrong:
        raise CheckpointError(f"{file}: shapes that do not match config.json: " + "; ".join(wrong[:5]))
    head = state.pop("lm_head.weight", None)
    if head is not None and (head.shape != state["embedding.weight"].shape
                             or not np.array_equal(head, state["embedding.weight"])):
        raise CheckpointError(f"{file}: lm_head.weight differs from the embedding: the course's Mamba ties them")
    model.astype(dtype)
    model.load_state_dict(state)
    model.source_form = form
    return model.eval()


def save_mamba(model, folder):
    """Hugging Face's layout (MambaForCausalLM loads it); the embedding without its padding rows."""
    if not getattr(model.config, "selective", True):
        raise ValueError("save_pretrained: this Mamba has selectivity switched off (MambaConfig(selective=False)), "
                         "which Hugging Face's Mamba cannot represent: save it with save_checkpoint instead")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    V = model.config.vocab_size
    tensors = {}
    for name, p in model.named_parameters():  # lm_head is tied: listed once, as embedding.weight
        if name == "embedding.weight":
            tensors["backbone.embeddings.weight"] = p.data[:V]
        else:
            tensors["backbone." + name] = p.data
    write_safetensors(folder / "model.safetensors", tensors)
    write_config(folder / "config.json", config_to_hf(model.config))
    return folder
