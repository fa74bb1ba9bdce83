"""GPT-2's checkpoints and tokenizer files in the course's GPT (lesson 4.5).

Without the reference packages: the course's own round trips (save_pretrained, from_pretrained)
and the errors for bad input. With them (`reference` extra): tiny random GPT-2s made and saved by
transformers, loaded by the course with equal logits and generations, the other way round too,
and byte-level BPE tokenizers trained by `tokenizers`, encoded identically by the course.
Nothing here touches the network.
"""

import json
import sys

import numpy as np
import pytest

from course.gpt import GPT, BPETokenizer, GPTConfig
from course.gpt.tokenizer import GPT2_SPLIT_PATTERN, bytes_to_unicode
from course.mamba import Mamba, MambaConfig
from course.pretrained import CheckpointError

pytestmark = pytest.mark.part4

REASON = "{} is not installed (optional `reference` extra)"


def _perturbed(model, seed=1, scale=0.05):
    """Move every parameter (LayerNorms and biases too) off its initial value."""
    rng = np.random.default_rng(seed)
    for p in model.parameters():
        p.data = (p.data + rng.normal(0, scale, p.shape)).astype(p.data.dtype)
    return model


def small_gpt(tied=False, **kw):
    config = GPTConfig(vocab_size=37, block_size=16, n_layer=2, n_head=2, n_embd=16, tie_word_embeddings=tied, **kw)
    return _perturbed(GPT(config, seed=0))


IDS = np.random.default_rng(0).integers(0, 37, (2, 11))


# ----- the course's own round trip -------------------------------------------------------------------

@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_save_and_load_give_the_same_model(tmp_path, tied, dtype):
    model = small_gpt(tied, n_inner=24, layer_norm_epsilon=1e-3).astype(dtype)
    model.save_pretrained(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
    back = GPT.from_pretrained(tmp_path, dtype=dtype)
    assert back.config == model.config
    assert back.tied == tied
    assert back.lm_head.weight.dtype == dtype
    for (name, a), (name_b, b) in zip(model.state_dict().items(), back.state_dict().items()):
        assert name == name_b
        np.testing.assert_array_equal(a, b, err_msg=name)
    np.testing.assert_array_equal(model(IDS)[0].data, back(IDS)[0].data)


def test_the_file_holds_gpt2_names_with_conv1d_weights_transposed(tmp_path):
    from safetensors.numpy import load_file

    model = small_gpt(tied=True)
    model.save_pretrained(tmp_path)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    assert "lm_head.weight" not in tensors  # tied: GPT-2 keeps the embedding once
    C = model.config.n_embd
    assert tensors["transformer.h.0.attn.c_attn.weight"].shape == (C, 3 * C)  # Conv1D: (in, out)
    np.testing.assert_array_equal(tensors["transformer.h.1.mlp.c_fc.weight"],
                                  model.transformer.h[1].mlp.c_fc.weight.data.T)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "gpt2" and config["n_positions"] == 16 and config["tie_word_embeddings"]


def test_a_gpt2_model_file_without_the_transformer_prefix_loads(tmp_path):
    # The hub's "gpt2" was saved from GPT2Model: its names are `h.0.attn...`, `wte.weight`, and it
    # carries the causal mask as `h.{i}.attn.bias` buffers.
    from safetensors.numpy import load_file, save_file

    model = small_gpt(tied=True)
    model.save_pretrained(tmp_path)
    tensors = {k.removeprefix("transformer."): v for k, v in load_file(str(tmp_path / "model.safetensors")).items()}
    tensors["h.0.attn.bias"] = np.tril(np.ones((1, 1, 16, 16), np.float32))
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    np.testing.assert_array_equal(GPT.from_pretrained(tmp_path)(IDS)[0].data, model(IDS)[0].data)


def test_a_tied_model_keeps_one_parameter_and_minGPT_names():
    model = small_gpt(tied=True)
    assert model.lm_head.weight is model.transformer.wte.weight
    names = [n for n, _ in model.named_parameters()]
    assert "lm_head.weight" not in names
    state = model.state_dict()
    assert "lm_head.weight" in state  # minGPT's names, both ways
    model.load_state_dict(state)
    state["lm_head.weight"] = state["lm_head.weight"] + 1
    with pytest.raises(ValueError, match="lm_head.weight differs from transformer.wte.weight"):
        model.load_state_dict(state)
    state["lm_head.weight"] = state["lm_head.weight"][:3]  # a head of the wrong shape is named, not dropped
    with pytest.raises(ValueError, match=r"wrong shape: lm_head.weight: expected"):
        model.load_state_dict(state)
    only_head = {n: a for n, a in model.state_dict().items() if n != "transformer.wte.weight"}
    only_head["lm_head.weight"] = only_head["lm_head.weight"] + 1  # the head alone fills the embedding
    model.load_state_dict(only_head)
    np.testing.assert_array_equal(model.transformer.wte.weight.data, only_head["lm_head.weight"])


def test_kv_cache_generation_of_a_loaded_model_equals_generation_without_it(tmp_path):
    small_gpt(tied=True).save_pretrained(tmp_path)
    model = GPT.from_pretrained(tmp_path)
    prompt = IDS[:, :3]
    a = model.generate(prompt, 20, do_sample=False, use_cache=True)  # past block_size 16: the window slides
    b = model.generate(prompt, 20, do_sample=False, use_cache=False)
    np.testing.assert_array_equal(a, b)


# ----- bad input: each error names the file and the problem ------------------------------------------

def _saved(tmp_path, **kw):
    small_gpt(**kw).save_pretrained(tmp_path)
    return tmp_path


def _edit_config(folder, **changes):
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


@pytest.mark.parametrize("key, value, words", [
    ("activation_function", "gelu", "activation_function 'gelu' is not supported"),
    ("activation_function", "relu", "tanh approximation"),
    ("scale_attn_by_inverse_layer_idx", True, "scale_attn_by_inverse_layer_idx=True is not supported"),
    ("scale_attn_weights", False, "scale_attn_weights=False is not supported"),
    ("add_cross_attention", True, "add_cross_attention=True"),
    ("model_type", "llama", "model_type 'llama' is not GPT-2"),
    ("n_head", 3, "n_embd=16 must be a multiple of n_head=3"),
])
def test_settings_the_course_cannot_represent_are_refused_by_name(tmp_path, key, value, words):
    _edit_config(_saved(tmp_path), **{key: value})
    with pytest.raises(CheckpointError, match="config.json") as e:
        GPT.from_pretrained(tmp_path)
    assert words in str(e.value)


def test_a_missing_config_key_is_named(tmp_path):
    folder = _saved(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    del config["n_positions"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"config.json: missing n_positions"):
        GPT.from_pretrained(folder)


def test_a_truncated_safetensors_file_is_named(tmp_path):
    folder = _saved(tmp_path)
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"model\.safetensors: not a readable safetensors file .*truncated"):
        GPT.from_pretrained(folder)


def test_a_file_of_another_format_is_named(tmp_path):
    folder = _saved(tmp_path)
    (folder / "model.safetensors").write_text("this is not a checkpoint\n")
    with pytest.raises(CheckpointError, match=r"model\.safetensors: not a readable safetensors file"):
        GPT.from_pretrained(folder)
    (folder / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"config\.json: not a JSON file"):
        GPT.from_pretrained(folder)


def test_a_file_instead_of_a_folder_and_a_missing_folder_are_named(tmp_path):
    folder = _saved(tmp_path / "ckpt")
    with pytest.raises(CheckpointError, match=r"model\.safetensors is a file, but a checkpoint is a folder"):
        GPT.from_pretrained(folder / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"nowhere: no such folder"):
        GPT.from_pretrained(tmp_path / "nowhere")
    (folder / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"model\.safetensors: file not found"):
        GPT.from_pretrained(folder)


def test_a_checkpoint_of_another_architecture_is_refused(tmp_path):
    Mamba(MambaConfig(d_model=16, n_layer=1, vocab_size=20)).save_pretrained(tmp_path / "mamba")
    with pytest.raises(CheckpointError, match=r"config\.json: model_type 'mamba' is not GPT-2.*Mamba\.from_pretrained"):
        GPT.from_pretrained(tmp_path / "mamba")
    # The same tensors under a GPT-2 config: the names say it is something else.
    _edit_config(tmp_path / "mamba", model_type="gpt2", n_positions=8, n_embd=16, n_layer=1, n_head=2)
    with pytest.raises(CheckpointError, match=r"model\.safetensors: tensors GPT-2 does not have: backbone\."):
        GPT.from_pretrained(tmp_path / "mamba")


def test_shapes_that_do_not_match_the_config_are_named(tmp_path):
    folder = _saved(tmp_path)
    _edit_config(folder, n_inner=40)
    with pytest.raises(CheckpointError, match=r"transformer\.h\.0\.mlp\.c_fc\.weight: expected \(40, 16\), "
                                              r"got \(64, 16\) \(after the Conv1D transpose\)"):
        GPT.from_pretrained(folder)


def test_an_untied_config_without_lm_head_is_named(tmp_path):
    folder = _saved(tmp_path, tied=True)
    _edit_config(folder, tie_word_embeddings=False)
    with pytest.raises(CheckpointError, match=r"missing tensors: lm_head\.weight \(config\.json says "
                                              r"tie_word_embeddings=false"):
        GPT.from_pretrained(folder)


def test_a_hub_name_without_huggingface_hub_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import fails as if it were not installed
    with pytest.raises(CheckpointError, match=r"'gpt2' is not a folder here.*pip install \"course\[pretrained\]\""
                                              r".*or pass the path of a folder"):
        GPT.from_pretrained("gpt2")


def test_a_hub_name_offline_says_which_folder_to_pass(monkeypatch):
    hub = pytest.importorskip("huggingface_hub", reason="huggingface_hub is not installed (optional `pretrained` extra)")

    def offline(*args, **kwargs):  # what huggingface_hub raises without a network; nothing is downloaded
        raise OSError("We couldn't connect to 'https://huggingface.co' to load the files")

    monkeypatch.setattr(hub, "snapshot_download", offline)
    with pytest.raises(CheckpointError, match=r"'gpt2' is not a folder here, and could not download 'gpt2' from the Hugging Face Hub \(OSError: "
                                              r"We couldn't connect.*Offline, pass the path of a folder holding "
                                              r"config\.json and model\.safetensors"):
        GPT.from_pretrained("gpt2")
    with pytest.raises(CheckpointError, match=r"could not download 'gpt2'.*vocab\.json and merges\.txt"):
        BPETokenizer.from_pretrained("gpt2")


# ----- GPT-2's tokenizer files -----------------------------------------------------------------------

def test_the_byte_table_is_gpt2s():
    table = bytes_to_unicode()
    assert len(set(table.values())) == 256
    assert table[ord("!")] == "!" and table[ord(" ")] == "Ġ" and table[ord("\n")] == "Ċ" and table[0] == "Ā"
    # The soft hyphen is not printable: after the 33 bytes 0..32 and the 34 bytes 127..160, it is
    # the 68th such byte, U+0100 + 67.
    assert table[0xAD] == chr(0x100 + 67) == "Ń"


def _course_tokenizer_in_gpt2_files(folder, text, vocab_size=400):
    tok = BPETokenizer.train(text, vocab_size, pattern=GPT2_SPLIT_PATTERN)
    tok.save_pretrained(folder)
    vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
    vocab["<|endoftext|>"] = len(vocab)
    (folder / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    return tok


TEXT = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n"
        "You are all resolved rather to die than to famish? I'll say it's 1234 times, they've 99 ships.  \t\n") * 20


def test_a_tokenizer_written_in_gpt2s_files_reads_back_the_same(tmp_path):
    tok = _course_tokenizer_in_gpt2_files(tmp_path, TEXT)
    back = BPETokenizer.from_pretrained(tmp_path)
    assert back.vocab_size == tok.vocab_size + 1
    for text in [TEXT[:300], "ünïcödé 日本語 🙂", "  \n\n   x", "I'LL they'Ve 3.14159"]:
        assert back.encode(text) == tok.encode(text)
        assert back.decode(back.encode(text)) == text
    eot = back.special_tokens["<|endoftext|>"]
    assert back.encode("Speak<|endoftext|>speak") == tok.encode("Speak") + [eot] + tok.encode("speak")
    assert back.decode([eot]) == "<|endoftext|>"
    with pytest.raises(ValueError, match="read from GPT-2's files.*save_pretrained"):
        back.save(tmp_path / "tok.json")
    again = BPETokenizer.from_pretrained(back.save_pretrained(tmp_path / "again"))
    assert again.encode(TEXT[:500] + "<|endoftext|>") == back.encode(TEXT[:500] + "<|endoftext|>")


def test_the_course_pattern_is_unchanged_and_gpt2s_needs_regex():
    tok = BPETokenizer()
    assert tok.split("don't  stop") == ["don", "'t", " ", " stop"]
    gpt2 = BPETokenizer(pattern=GPT2_SPLIT_PATTERN)
    assert gpt2.split("x²³ 日本 ١٢") == ["x", "²³", " 日本", " ١٢"]  # \p{N} holds superscripts and Arabic digits


def test_a_missing_or_broken_tokenizer_file_is_named(tmp_path):
    _course_tokenizer_in_gpt2_files(tmp_path, TEXT, 300)
    merges = (tmp_path / "merges.txt").read_text(encoding="utf-8")
    (tmp_path / "merges.txt").unlink()
    with pytest.raises(CheckpointError, match=r"merges\.txt: file not found \(GPT-2's tokenizer is two files"):
        BPETokenizer.from_pretrained(tmp_path)
    (tmp_path / "merges.txt").write_text(merges + "zz yy\n", encoding="utf-8")
    with pytest.raises(CheckpointError, match=r"merges\.txt, line \d+: 'zz yy' is not a merge of two known tokens"):
        BPETokenizer.from_pretrained(tmp_path)
    (tmp_path / "merges.txt").write_text(merges, encoding="utf-8")
    (tmp_path / "vocab.json").write_text("[1, 2]")
    with pytest.raises(CheckpointError, match=r"vocab\.json: expected a JSON object token -> integer id"):
        BPETokenizer.from_pretrained(tmp_path)
    (tmp_path / "vocab.json").write_text(json.dumps({"a": 0}))
    with pytest.raises(CheckpointError, match=r"vocab\.json: the token 'Ā' \(byte 0x00\) has no id"):
        BPETokenizer.from_pretrained(tmp_path)


# ----- against transformers and tokenizers (the `reference` extra) -----------------------------------

CONFIGS = [
    dict(vocab_size=61, n_positions=24, n_embd=32, n_layer=2, n_head=4),
    dict(vocab_size=50, n_positions=12, n_embd=24, n_layer=1, n_head=1, n_inner=40, layer_norm_epsilon=1e-3),
    dict(vocab_size=33, n_positions=16, n_embd=16, n_layer=3, n_head=2, tie_word_embeddings=False,
         activation_function="gelu_pytorch_tanh"),
]


def _hf_gpt2(config, seed):
    torch = pytest.importorskip("torch", reason=REASON.format("PyTorch"))
    transformers = pytest.importorskip("transformers", reason=REASON.format("transformers"))
    torch.manual_seed(seed)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(bos_token_id=None, eos_token_id=None, **config))
    with torch.no_grad():  # off the initial values (LayerNorm 1 and 0, zero biases) everywhere
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return torch, model.eval()


@pytest.mark.reference
@pytest.mark.parametrize("k", range(len(CONFIGS)))
def test_transformers_gpt2_loads_with_equal_logits_and_generations(tmp_path, k):
    torch, hf = _hf_gpt2(CONFIGS[k], seed=k)
    hf.save_pretrained(tmp_path)
    V, T = CONFIGS[k]["vocab_size"], CONFIGS[k]["n_positions"]
    ids = np.random.default_rng(k).integers(0, V, (3, T))
    ours = GPT.from_pretrained(tmp_path)
    assert ours.tied == CONFIGS[k].get("tie_word_embeddings", True)
    with torch.no_grad():
        ref = hf(torch.from_numpy(ids)).logits.numpy()
    np.testing.assert_allclose(ours(ids)[0].data, ref, rtol=1e-5, atol=1e-5)

    ours64 = GPT.from_pretrained(tmp_path, dtype=np.float64)
    with torch.no_grad():
        ref64 = hf.double()(torch.from_numpy(ids)).logits.numpy()
    assert ref64.dtype == np.float64
    np.testing.assert_allclose(ours64(ids)[0].data, ref64, rtol=1e-9, atol=1e-9)

    prompt = ids[:, :3]
    new = T - 3  # as far as the context goes: transformers' GPT-2 does not slide its window
    with torch.no_grad():
        hf_out = hf.generate(torch.from_numpy(prompt), max_new_tokens=new, do_sample=False, use_cache=True,
                             attention_mask=torch.ones_like(torch.from_numpy(prompt)), pad_token_id=0).numpy()
    np.testing.assert_array_equal(ours64.generate(prompt, new, do_sample=False), hf_out)


@pytest.mark.reference
@pytest.mark.parametrize("tied", [False, True])
def test_the_course_gpt_saved_loads_into_transformers_with_equal_logits(tmp_path, tied):
    torch = pytest.importorskip("torch", reason=REASON.format("PyTorch"))
    transformers = pytest.importorskip("transformers", reason=REASON.format("transformers"))
    model = small_gpt(tied, n_inner=20)
    model.save_pretrained(tmp_path)
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        ref = hf(torch.from_numpy(IDS)).logits.numpy()
    np.testing.assert_allclose(model(IDS)[0].data, ref, rtol=1e-5, atol=1e-5)
    for name, p in hf.named_parameters():  # every weight arrived, transposed where GPT-2 wants it
        assert np.abs(p.detach().numpy()).sum() > 0, name


@pytest.fixture(scope="module")
def trained_bpe(tmp_path_factory):
    """A byte-level BPE trained by `tokenizers` on the course's Shakespeare, in GPT-2's two files."""
    tokenizers = pytest.importorskip("tokenizers", reason=REASON.format("tokenizers"))
    from course.data import load_shakespeare

    folder = tmp_path_factory.mktemp("bpe")
    trainer = tokenizers.ByteLevelBPETokenizer()
    trainer.train_from_iterator([load_shakespeare()], vocab_size=1200, min_frequency=2,
                                special_tokens=["<|endoftext|>"], show_progress=False)
    trainer.save_model(str(folder))
    reference = tokenizers.ByteLevelBPETokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"))
    reference.add_special_tokens(["<|endoftext|>"])
    return BPETokenizer.from_pretrained(folder), reference


@pytest.mark.reference
def test_the_course_encodes_shakespeare_as_tokenizers_does(trained_bpe):
    from course.data import load_shakespeare

    ours, reference = trained_bpe
    text = load_shakespeare()[:50_000]
    ids = ours.encode(text)
    assert ids == reference.encode(text).ids
    assert ours.decode(ids) == text == reference.decode(ids)


def _texts():
    from hypothesis import strategies as st

    pieces = st.sampled_from(["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "n't", "I'm", "o'er",
                              " ", "  ", "   ", "\n", "\n\n", "\t", " \t ", "\r\n", "\u00a0", "\u3000",
                              "123", " 4567", "3.14", "١٢٣", "²", "Ⅻ", "the", " King", "HENRY", "é", "e\u0301",
                              "日本語", "🙂", "👍🏽", "ß", "<|endoftext|>", "<|", "|>", "--", "?!", "_x_"])
    return st.lists(st.one_of(pieces, st.text(max_size=6)), max_size=25).map("".join)


@pytest.mark.reference
def test_the_course_encodes_any_text_as_tokenizers_does(trained_bpe):
    hypothesis = pytest.importorskip("hypothesis", reason="hypothesis is not installed")
    ours, reference = trained_bpe

    @hypothesis.settings(max_examples=300, deadline=None, derandomize=True)
    @hypothesis.given(_texts())
    def same(text):
        ids = ours.encode(text)
        assert ids == reference.encode(text).ids, repr(text)
        assert ours.decode(ids) == reference.decode(ids, skip_special_tokens=False)

    same()


def test_skip_init_builds_zeros_without_random_draws_and_is_undone_after():
    from course import nn

    with pytest.raises(RuntimeError):
        with nn.skip_init():
            linear, table = nn.Linear(3, 2), nn.Embedding(4, 3)
            model = GPT(GPTConfig(vocab_size=5, block_size=4, n_layer=1, n_head=1, n_embd=4))
            raise RuntimeError("leaving the block by an error")
    assert not linear.weight.data.any() and not linear.bias.data.any() and not table.weight.data.any()
    assert not model.transformer.h[0].mlp.c_fc.weight.data.any()
    assert nn.Linear(3, 2).weight.data.any()  # outside the block, random again
    assert GPT(GPTConfig(vocab_size=5, block_size=4, n_layer=1, n_head=1, n_embd=4)).lm_head.weight.data.any()
