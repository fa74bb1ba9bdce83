"""Released Mamba checkpoints in the course's Mamba (lesson 5.5): both layouts, both config forms.

Without the reference packages: round trips and refusals. With them (`reference` extra): tiny
random MambaForCausalLM models of transformers (its slow path on the CPU, which is the reference
PyTorch code of the selective scan) loaded by the course with equal logits and generations, and
the course's model loaded into transformers. Nothing here touches the network.
"""

import json

import numpy as np
import pytest

from course.mamba import Mamba, MambaConfig
from course.pretrained import CheckpointError

pytestmark = pytest.mark.part5

REASON = "{} is not installed (optional `reference` extra)"


def small_mamba(vocab_size=21, **kw):
    model = Mamba(MambaConfig(d_model=16, n_layer=2, vocab_size=vocab_size, d_state=4, **kw), seed=0)
    rng = np.random.default_rng(1)
    for p in model.parameters():  # off the initial values (norms of ones, D of ones) everywhere
        p.data = (p.data + rng.normal(0, 0.05, p.shape)).astype(p.data.dtype)
    return model


IDS = np.random.default_rng(0).integers(0, 21, (2, 9))


def _to_original_layout(folder):
    """Rewrite a folder saved by save_pretrained (Hugging Face's layout) in mamba_ssm's original one."""
    from safetensors.numpy import load_file, save_file

    hf = json.loads((folder / "config.json").read_text())
    tensors = load_file(str(folder / "model.safetensors"))
    emb = tensors.pop("backbone.embeddings.weight")
    rows = -(-emb.shape[0] // 8) * 8  # mamba_ssm keeps the padding rows in the file
    tensors["backbone.embedding.weight"] = np.concatenate([emb, np.zeros((rows - len(emb), emb.shape[1]), emb.dtype)])
    tensors["lm_head.weight"] = tensors["backbone.embedding.weight"]
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    original = {"d_model": hf["hidden_size"], "n_layer": hf["num_hidden_layers"], "vocab_size": hf["vocab_size"],
                "ssm_cfg": {"d_state": hf["state_size"], "d_conv": hf["conv_kernel"], "expand": hf["expand"],
                            "dt_rank": hf["time_step_rank"]},
                "rms_norm": True, "residual_in_fp32": True, "fused_add_norm": True, "pad_vocab_size_multiple": 8}
    (folder / "config.json").write_text(json.dumps(original))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("layout", ["hf", "original"])
def test_save_and_load_in_both_layouts_give_the_same_logits(tmp_path, dtype, layout):
    model = small_mamba(dt_rank=3, d_conv=3).astype(dtype)
    model.save_pretrained(tmp_path)
    if layout == "original":
        _to_original_layout(tmp_path)
    back = Mamba.from_pretrained(tmp_path, dtype=dtype)
    assert back.config == model.config and back.source_form == layout and back.dtype == dtype
    V = model.config.vocab_size
    # The padding rows (ids 21..23, never sampled) are not part of either file format's tokens.
    np.testing.assert_array_equal(back(IDS).data[..., :V], model(IDS).data[..., :V])
    np.testing.assert_array_equal(back.generate(IDS[:, :2], 8, do_sample=False),
                                  model.generate(IDS[:, :2], 8, do_sample=False))


def test_the_file_holds_hugging_faces_names_without_the_padding_rows(tmp_path):
    from safetensors.numpy import load_file

    small_mamba().save_pretrained(tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    assert tensors["backbone.embeddings.weight"].shape == (21, 16)
    assert "lm_head.weight" not in tensors and "backbone.layers.1.mixer.A_log" in tensors
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "mamba" and config["hidden_size"] == 16 and config["time_step_rank"] == 1


def _saved(tmp_path):
    small_mamba().save_pretrained(tmp_path)
    return tmp_path


def _edit_config(folder, **changes):
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("changes, words", [
    ({"use_bias": True}, "use_bias=True cannot be represented by the course's Mamba: its in_proj and out_proj have no bias"),
    ({"use_conv_bias": False}, "use_conv_bias=False cannot be represented"),
    ({"hidden_act": "gelu"}, "hidden_act='gelu' cannot be represented"),
    ({"tie_word_embeddings": False}, "tie_word_embeddings=False cannot be represented"),
    ({"layer_norm_epsilon": 1e-6}, "layer_norm_epsilon=1e-06 cannot be represented"),
    ({"model_type": "mamba2"}, "model_type 'mamba2' is not Mamba"),
    ({"model_type": "gpt2"}, "model_type 'gpt2' is not Mamba: Mamba.from_pretrained reads Mamba (1) checkpoints; "
                             "load GPT-2 checkpoints with GPT.from_pretrained"),
])
def test_hugging_face_settings_the_course_cannot_represent_are_refused(tmp_path, changes, words):
    _edit_config(_saved(tmp_path), **changes)
    with pytest.raises(CheckpointError, match="config.json") as e:
        Mamba.from_pretrained(tmp_path)
    assert words in str(e.value)


@pytest.mark.parametrize("changes, words", [
    ({"rms_norm": False}, "rms_norm=False cannot be represented by the course's Mamba: its norms are RMSNorm, not LayerNorm"),
    ({"ssm_cfg": {"layer": "Mamba2"}}, "ssm_cfg.layer='Mamba2' cannot be represented"),
    ({"d_intermediate": 64}, "d_intermediate=64 cannot be represented"),
    ({"attn_layer_idx": [1]}, "attn_layer_idx=[1] cannot be represented"),
    ({"pad_vocab_size_multiple": 16}, "pad_vocab_size_multiple=16 cannot be represented"),
])
def test_original_settings_the_course_cannot_represent_are_refused(tmp_path, changes, words):
    folder = _saved(tmp_path)
    _to_original_layout(folder)
    _edit_config(folder, **changes)
    with pytest.raises(CheckpointError, match="config.json") as e:
        Mamba.from_pretrained(folder)
    assert words in str(e.value)


def test_a_config_of_neither_form_is_named(tmp_path):
    folder = _saved(tmp_path)
    (folder / "config.json").write_text(json.dumps({"n_embd": 16}))
    with pytest.raises(CheckpointError, match=r"config\.json: not a Mamba config: it has neither d_model"):
        Mamba.from_pretrained(folder)


def test_biases_the_course_lacks_are_refused_by_name(tmp_path):
    from safetensors.numpy import load_file, save_file

    folder = _saved(tmp_path)
    tensors = load_file(str(folder / "model.safetensors"))
    tensors["backbone.layers.0.mixer.out_proj.bias"] = np.zeros(16, np.float32)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"model\.safetensors: tensors the course's Mamba does not have: "
                                              r"layers\.0\.mixer\.out_proj\.bias \(biases on in_proj/out_proj"):
        Mamba.from_pretrained(folder)


def test_a_gpt2_checkpoint_and_a_truncated_file_are_refused(tmp_path):
    from course.gpt import GPT, GPTConfig

    GPT(GPTConfig(vocab_size=20, block_size=8, n_layer=1, n_head=2, n_embd=16)).save_pretrained(tmp_path / "gpt")
    with pytest.raises(CheckpointError, match=r"config\.json: model_type 'gpt2' is not Mamba"):
        Mamba.from_pretrained(tmp_path / "gpt")
    _edit_config(tmp_path / "gpt", model_type="mamba", hidden_size=16, num_hidden_layers=1, tie_word_embeddings=True)
    with pytest.raises(CheckpointError, match=r"model\.safetensors: tensors the course's Mamba does not have: "
                                              r"transformer\..*another architecture"):
        Mamba.from_pretrained(tmp_path / "gpt")
    folder = _saved(tmp_path / "mamba")
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[:100])
    with pytest.raises(CheckpointError, match=r"model\.safetensors: not a readable safetensors file \(100 bytes"):
        Mamba.from_pretrained(folder)


def test_missing_tensors_and_wrong_shapes_are_named(tmp_path):
    folder = _saved(tmp_path)
    _edit_config(folder, num_hidden_layers=3)
    with pytest.raises(CheckpointError, match=r"missing tensors: layers\.2\.mixer\.A_log, .* and 5 more"):
        Mamba.from_pretrained(folder)
    _edit_config(folder, num_hidden_layers=2, state_size=8)
    with pytest.raises(CheckpointError, match=r"layers\.0\.mixer\.x_proj\.weight: expected \(17, 32\), got \(9, 32\)"):
        Mamba.from_pretrained(folder)


def test_a_mamba_without_selection_is_not_saved_in_hugging_faces_layout(tmp_path):
    model = Mamba(MambaConfig(d_model=16, n_layer=1, vocab_size=10, selective=False))
    with pytest.raises(ValueError, match=r"selectivity switched off .* save_checkpoint"):
        model.save_pretrained(tmp_path / "lti")
    assert not (tmp_path / "lti").exists()


def test_a_pickle_checkpoint_is_not_read(tmp_path):
    folder = _saved(tmp_path)
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match=r"model\.safetensors: file not found.*pytorch_model\.bin, are not read"):
        Mamba.from_pretrained(folder)


# ----- against transformers' MambaForCausalLM (the `reference` extra) --------------------------------

CONFIGS = [
    dict(vocab_size=40, hidden_size=16, num_hidden_layers=2, state_size=4, expand=2, conv_kernel=4),
    dict(vocab_size=37, hidden_size=24, num_hidden_layers=1, state_size=8, expand=3, conv_kernel=3, time_step_rank=5),
    dict(vocab_size=16, hidden_size=32, num_hidden_layers=3, state_size=2, expand=1, conv_kernel=2),
]


def _hf_mamba(config, seed):
    torch = pytest.importorskip("torch", reason=REASON.format("PyTorch"))
    transformers = pytest.importorskip("transformers", reason=REASON.format("transformers"))
    torch.manual_seed(seed)
    # residual_in_fp32=False: with it, transformers adds the residual in float32 even in a float64 model.
    model = transformers.MambaForCausalLM(transformers.MambaConfig(residual_in_fp32=False, **config))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return torch, model.eval()


@pytest.mark.reference
@pytest.mark.parametrize("k", range(len(CONFIGS)))
def test_transformers_mamba_loads_with_equal_logits_and_generations(tmp_path, k):
    torch, hf = _hf_mamba(CONFIGS[k], seed=k)
    hf.save_pretrained(tmp_path)
    V = CONFIGS[k]["vocab_size"]
    ids = np.random.default_rng(k).integers(0, V, (2, 12))
    ours = Mamba.from_pretrained(tmp_path)
    assert ours.config.vocab_size == V
    with torch.no_grad():
        ref = hf(torch.from_numpy(ids)).logits.numpy()
    np.testing.assert_allclose(ours(ids).data[..., :V], ref, rtol=1e-5, atol=1e-5)
    # float64: transformers' Mamba computes A = -exp(A_log) and its RMSNorm in float32 whatever the
    # model's dtype, so the two agree to float32's precision there, not to 1e-9.
    ours64 = Mamba.from_pretrained(tmp_path, dtype=np.float64)
    with torch.no_grad():
        ref64 = hf.double()(torch.from_numpy(ids)).logits.numpy()
    np.testing.assert_allclose(ours64(ids).data[..., :V], ref64, rtol=1e-5, atol=1e-6)

    prompt = ids[:, :3]
    with torch.no_grad():
        hf_out = hf.float().generate(torch.from_numpy(prompt), max_new_tokens=12, do_sample=False, use_cache=True,
                                     pad_token_id=0).numpy()
    np.testing.assert_array_equal(ours.generate(prompt, 12, do_sample=False), hf_out)


@pytest.mark.reference
def test_the_course_mamba_saved_loads_into_transformers_with_equal_logits(tmp_path):
    torch = pytest.importorskip("torch", reason=REASON.format("PyTorch"))
    transformers = pytest.importorskip("transformers", reason=REASON.format("transformers"))
    model = small_mamba(dt_rank=2)
    model.save_pretrained(tmp_path)
    hf = transformers.MambaForCausalLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        ref = hf(torch.from_numpy(IDS)).logits.numpy()
    np.testing.assert_allclose(model(IDS).data[..., :21], ref, rtol=1e-5, atol=1e-5)
