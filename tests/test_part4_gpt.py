"""The GPT of part 4: gradients, names, the KV cache, checkpoints, errors and the trainer."""

import math

from dataclasses import dataclass

import numpy as np
import pytest

import course.tensor.functional as F
from course.gpt import (GPT, GPTConfig, Trainer, TrainerConfig, get_batch, load_checkpoint, param_groups,
                        save_checkpoint, top_k_filter)
from course.tensor import Tensor, gradcheck

pytestmark = pytest.mark.part4

TINY = GPTConfig(vocab_size=7, block_size=6, n_layer=2, n_head=2, n_embd=8)


def tiny_batch(rng, B=2, T=5, V=7):
    return rng.integers(0, V, (B, T)), rng.integers(0, V, (B, T))


def test_parameter_names_are_mingpts():
    model = GPT(GPTConfig(vocab_size=11, block_size=4, n_layer=2, n_head=2, n_embd=8))
    expected = ["transformer.wte.weight", "transformer.wpe.weight"]
    for i in range(2):
        for part in ["ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
                     "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
                     "mlp.c_proj.weight", "mlp.c_proj.bias"]:
            expected.append(f"transformer.h.{i}.{part}")
    expected += ["transformer.ln_f.weight", "transformer.ln_f.bias", "lm_head.weight"]
    names = [n for n, _ in model.named_parameters()]
    assert names == expected
    shapes = dict((n, p.shape) for n, p in model.named_parameters())
    assert shapes["transformer.h.0.attn.c_attn.weight"] == (24, 8)
    assert shapes["transformer.h.1.mlp.c_fc.weight"] == (32, 8)
    assert shapes["lm_head.weight"] == (11, 8)
    assert all(p.dtype == np.float32 for p in model.parameters())


def test_parameter_count_formula():
    c = GPTConfig(vocab_size=65, block_size=64, n_layer=4, n_head=4, n_embd=128)
    C = c.n_embd
    expected = c.vocab_size * C * 2 + c.block_size * C + c.n_layer * (12 * C * C + 13 * C) + 2 * C
    assert GPT(c).num_parameters() == expected


def test_init_follows_mingpt_and_is_seeded():
    c = GPTConfig(vocab_size=50, block_size=32, n_layer=8, n_head=4, n_embd=64)
    a, b, other = GPT(c, seed=1), GPT(c, seed=1), GPT(c, seed=2)
    for (n, p), (_, q), (_, r) in zip(a.named_parameters(), b.named_parameters(), other.named_parameters()):
        assert np.array_equal(p.data, q.data), n
    p = dict(a.named_parameters())
    assert not np.array_equal(p["lm_head.weight"], dict(other.named_parameters())["lm_head.weight"].data)
    assert abs(p["transformer.h.0.mlp.c_fc.weight"].data.std() - 0.02) < 0.002
    assert abs(p["transformer.h.0.mlp.c_proj.weight"].data.std() - 0.02 / math.sqrt(16)) < 0.001
    assert abs(p["transformer.wte.weight"].data.std() - 0.02) < 0.002
    assert np.all(p["transformer.h.3.ln_2.weight"].data == 1) and np.all(p["transformer.ln_f.bias"].data == 0)
    assert np.all(p["transformer.h.3.attn.c_attn.bias"].data == 0)


def test_initial_loss_is_about_log_vocab(rng):
    c = GPTConfig(vocab_size=65, block_size=16, n_layer=2, n_head=2, n_embd=32)
    _, loss = GPT(c)(*tiny_batch(rng, 4, 16, 65))
    assert abs(float(loss.data) - math.log(65)) < 0.05


def _loss_fn(model, x, y):
    def f():
        return float(model(x, y)[1].data)
    return f


def test_gradients_match_finite_differences_float64(rng):
    model = GPT(TINY, seed=3).astype(np.float64)
    for p in model.parameters():  # biases and LayerNorms away from their special init values
        p.data = p.data + rng.normal(0, 0.1, p.shape)
    x, y = tiny_batch(rng)
    y[0, 1] = -1  # an ignored target
    model.zero_grad()
    _, loss = model(x, y)
    assert loss.dtype == np.float64
    loss.backward()
    f, eps = _loss_fn(model, x, y), 1e-6
    for name, p in model.named_parameters():
        picks = [tuple(int(rng.integers(0, s)) for s in p.shape) for _ in range(4)]
        for i in picks:
            old = p.data[i]
            p.data[i] = old + eps
            plus = f()
            p.data[i] = old - eps
            minus = f()
            p.data[i] = old
            numeric = (plus - minus) / (2 * eps)
            assert abs(p.grad[i] - numeric) <= 1e-6 + 1e-5 * abs(numeric), (name, i, p.grad[i], numeric)


def test_dropout_trains_and_eval_is_deterministic(rng):
    model = GPT(GPTConfig(vocab_size=7, block_size=6, n_layer=1, n_head=2, n_embd=8, dropout=0.3))
    x, y = tiny_batch(rng)
    F.manual_seed(0)
    a = model(x, y)[1].data
    b = model(x, y)[1].data
    assert a != b  # different dropout masks
    model.eval()
    assert model(x, y)[1].data == model(x, y)[1].data
    model.train()
    model(x, y)[1].backward()
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("tq,tk", [(4, 4), (2, 5), (1, 3)])
def test_scaled_dot_product_attention_gradcheck(rng, causal, tq, tk):
    q = rng.normal(size=(2, 3, tq, 4))
    k = rng.normal(size=(2, 3, tk, 4))
    v = rng.normal(size=(2, 3, tk, 5))
    w = rng.normal(size=(2, 3, tq, 5))  # a weighted sum, so every output matters differently
    assert gradcheck(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, causal=causal) * Tensor(w), q, k, v)


def test_scaled_dot_product_attention_values(rng):
    q, k, v = (rng.normal(size=(2, 5, 4)) for _ in range(3))
    got = F.scaled_dot_product_attention(Tensor(q), Tensor(k), Tensor(v)).data
    s = q @ k.transpose(0, 2, 1) / 2.0
    s = np.where(np.triu(np.ones((5, 5), bool), 1), -np.inf, s)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    assert np.allclose(got, p @ v)
    # the last query of a causal attention sees every key: a cache step of one query needs no mask
    last = F.scaled_dot_product_attention(Tensor(q[:, -1:]), Tensor(k), Tensor(v)).data
    assert np.allclose(last, got[:, -1:])


def test_causal_model_ignores_the_future(rng):
    model = GPT(TINY, seed=0)
    x = rng.integers(0, 7, (1, 6))
    y = x.copy()
    y[0, 4:] = (y[0, 4:] + 1) % 7
    a, b = model(x)[0].data, model(y)[0].data
    assert np.allclose(a[:, :4], b[:, :4], atol=1e-6) and not np.allclose(a[:, 4:], b[:, 4:])


@pytest.mark.parametrize("kwargs", [dict(do_sample=False), dict(temperature=0.9, top_k=4, seed=5),
                                    dict(temperature=1.3, seed=1)])
def test_cache_gives_the_same_tokens(kwargs):
    model = GPT(GPTConfig(vocab_size=9, block_size=8, n_layer=2, n_head=2, n_embd=16), seed=1)
    for p in model.parameters():  # a less uniform model than at initialisation
        p.data = p.data * 10
    idx = np.array([[1, 2, 3], [4, 0, 8]])
    # 20 new tokens: the sequences run past block_size, where the window slides
    with_cache = model.generate(idx, 20, use_cache=True, **kwargs)
    without = model.generate(idx, 20, use_cache=False, **kwargs)
    assert with_cache.shape == (2, 23)
    assert np.array_equal(with_cache, without)
    assert np.array_equal(with_cache[:, :3], idx)


def test_cache_logits_equal_full_forward(rng):
    model = GPT(TINY, seed=2)
    x = rng.integers(0, 7, (2, 6))
    full = model(x)[0].data
    cache = model.new_cache(2)
    h = model.hidden(x[:, :3], cache)
    steps = [model.lm_head(h).data]
    for t in range(3, 6):
        steps.append(model.lm_head(model.hidden(x[:, t:t + 1], cache)).data)
    assert np.allclose(np.concatenate(steps, axis=1), full, atol=1e-5)


def test_generate_is_seeded_and_restores_training_mode():
    model = GPT(TINY, seed=0)
    a = model.generate([[1, 2]], 5, seed=7)
    b = model.generate([[1, 2]], 5, seed=7)
    assert np.array_equal(a, b) and model.training


def test_top_k_filter():
    logits = np.array([[1.0, 5.0, 3.0, 2.0]])
    assert np.array_equal(top_k_filter(logits, 2), [[-np.inf, 5.0, 3.0, -np.inf]])
    assert np.array_equal(top_k_filter(logits, None), logits)


def test_errors_name_the_problem():
    model = GPT(TINY)
    with pytest.raises(ValueError, match=r"length 7 is longer than block_size 6"):
        model(np.zeros((1, 7), dtype=int))
    with pytest.raises(ValueError, match=r"token id 9 .* vocab_size 7"):
        model(np.array([[1, 9]]))
    with pytest.raises(ValueError, match=r"targets of shape \(1, 3\)"):
        model(np.array([[1, 2]]), np.array([[1, 2, 3]]))
    with pytest.raises(ValueError, match="2-D"):
        model(np.array([1, 2]))
    with pytest.raises(ValueError, match="multiple of n_head"):
        GPTConfig(vocab_size=5, block_size=4, n_layer=1, n_head=3, n_embd=8)
    with pytest.raises(ValueError, match="temperature"):
        model.generate([[1]], 2, temperature=0)


def test_checkpoint_roundtrip(tmp_path, rng):
    model = GPT(TINY, seed=4)
    path = tmp_path / "m.npz"
    save_checkpoint(path, model, vocab="abcdefg", note=3)
    loaded, meta = load_checkpoint(path)
    assert meta == {"vocab": "abcdefg", "note": 3}
    assert loaded.config == TINY
    for (n, p), (m, q) in zip(model.named_parameters(), loaded.named_parameters()):
        assert n == m and np.array_equal(p.data, q.data) and q.dtype == np.float32
    x = rng.integers(0, 7, (2, 5))
    assert np.array_equal(model(x)[0].data, loaded(x)[0].data)
    into = GPT(TINY, seed=9)
    load_checkpoint(path, into)
    assert np.array_equal(into(x)[0].data, model(x)[0].data)


def test_checkpoint_mismatch_is_named(tmp_path):
    path = tmp_path / "m.npz"
    save_checkpoint(path, GPT(TINY))
    wider = GPT(GPTConfig(vocab_size=7, block_size=6, n_layer=2, n_head=2, n_embd=12))
    with pytest.raises(ValueError, match=r"transformer\.wte\.weight: expected \(7, 12\), got \(7, 8\)"):
        load_checkpoint(path, wider)
    deeper = GPT(GPTConfig(vocab_size=7, block_size=6, n_layer=3, n_head=2, n_embd=8))
    with pytest.raises(ValueError, match=r"missing: transformer\.h\.2\.ln_1\.weight"):
        load_checkpoint(path, deeper)


def test_param_groups_decay_linear_weights_only():
    model = GPT(TINY)
    decay, no_decay = param_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = sorted(names[id(p)] for p in decay["params"])
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(n.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")) or n == "lm_head.weight"
               for n in decayed)
    assert len(decayed) == 4 * TINY.n_layer + 1
    assert len(decay["params"]) + len(no_decay["params"]) == len(model.parameters())


def test_get_batch_shifts_targets():
    data = np.arange(50)
    x, y = get_batch(data, 4, 8, np.random.default_rng(0))
    assert x.shape == y.shape == (4, 8) and x.dtype == np.int64
    assert np.array_equal(y, x + 1)
    with pytest.raises(ValueError, match="at least block_size"):
        get_batch(np.arange(5), 2, 8, np.random.default_rng(0))


def test_trainer_lowers_the_loss_and_is_deterministic():
    data = np.tile(np.array([0, 1, 2, 3, 4, 5, 6, 5, 4, 3, 2, 1]), 40)

    def train():
        model = GPT(TINY, seed=0)
        conf = TrainerConfig(max_iters=60, batch_size=8, learning_rate=1e-2, warmup_iters=5, eval_interval=30,
                             eval_iters=2, progress=False)
        return Trainer(model, data[:400], data[400:], conf).run()

    a, b = train(), train()
    assert a["loss"] == b["loss"] and a["val_loss"] == b["val_loss"]
    assert a["val_step"] == [30, 60]
    assert np.mean(a["loss"][-5:]) < 0.5 * np.mean(a["loss"][:5])
    assert a["lr"][0] < a["lr"][5] and a["lr"][-1] < a["lr"][10]


def test_progress_bar_is_silent_under_tqdm_disable(monkeypatch, capsys):
    data = np.tile(np.arange(7), 20)
    conf = TrainerConfig(max_iters=3, batch_size=2, warmup_iters=1, eval_interval=0, progress=True)
    monkeypatch.setenv("TQDM_DISABLE", "1")
    Trainer(GPT(TINY, seed=0), data, config=conf).run()
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""


def test_checkpoint_unexpected_names_are_named(tmp_path):
    path = tmp_path / "m.npz"
    save_checkpoint(path, GPT(TINY, seed=0))
    arrays = dict(np.load(path))
    arrays["transformer.extra.weight"] = np.zeros(3)
    del arrays["lm_head.weight"]
    np.savez(path, **arrays)
    with pytest.raises(ValueError, match=r"missing: lm_head\.weight.*unexpected: transformer\.extra\.weight"):
        load_checkpoint(path)


def test_sampling_never_picks_a_token_of_probability_zero():
    from course.gpt.model import sample_next

    class Draw:  # a generator that returns the extreme draws
        def __init__(self, value):
            self.value = value

        def random(self, shape):
            return np.full(shape, self.value)

    logits = np.array([[-np.inf, 0.0, -np.inf, 1.0, -np.inf]])
    assert sample_next(logits, rng=Draw(0.0))[0] == 1
    assert sample_next(logits, rng=Draw(1 - 2 ** -53))[0] == 3
    counts = np.bincount(sample_next(np.log(np.tile([[0.1, 0.2, 0.7]], (20000, 1))),
                                     rng=np.random.default_rng(0)), minlength=3) / 20000
    assert np.allclose(counts, [0.1, 0.2, 0.7], atol=0.015)


def test_a_checkpoint_of_another_architecture_with_the_same_shapes_is_refused(tmp_path):
    path = tmp_path / "m.npz"
    save_checkpoint(path, GPT(TINY))
    other_heads = GPT(GPTConfig(vocab_size=TINY.vocab_size, block_size=TINY.block_size, n_layer=TINY.n_layer,
                                n_head=1, n_embd=TINY.n_embd))
    with pytest.raises(ValueError, match=r"m\.npz does not fit the model: the config differs: n_head: checkpoint 2, model 1"):
        load_checkpoint(path, other_heads)


def test_a_truncated_checkpoint_is_named(tmp_path):
    path = tmp_path / "m.npz"
    save_checkpoint(path, GPT(TINY))
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(ValueError, match=r"m\.npz is not a readable checkpoint \(truncated or corrupt\?\)"):
        load_checkpoint(path)


def test_the_trainer_trains_any_model_with_logits(tmp_path):
    """The trainer needs only model(idx) -> logits: a bigram table trains through the same code."""
    from course import nn

    class Bigram(nn.Module):
        def __init__(self, vocab):
            super().__init__()
            self.config = BigramConfig(vocab)
            self.table = nn.Embedding(vocab, vocab, rng=0)

        def forward(self, idx):
            return self.table(idx)

    data = np.tile(np.arange(5), 40)  # 0 1 2 3 4 0 1 ...: each token predicts the next exactly
    model = Bigram(5)
    trainer = Trainer(model, data, data, TrainerConfig(max_iters=60, batch_size=8, learning_rate=0.3,
                                                       warmup_iters=0, eval_interval=60, block_size=4, weight_decay=0))
    history = trainer.run()
    assert history["val_loss"][-1] < 0.2 * history["loss"][0]
    save_checkpoint(tmp_path / "b.npz", model)
    into, _ = load_checkpoint(tmp_path / "b.npz", Bigram(5))
    assert np.array_equal(into.table.weight.data, model.table.weight.data)
    with pytest.raises(ValueError, match="names the class 'test_part4_gpt:.*Bigram', which is not one of the course's"):
        load_checkpoint(tmp_path / "b.npz")  # a checkpoint never makes load_checkpoint import foreign code


@dataclass
class BigramConfig:
    vocab_size: int


# ----- generate's arguments ----------------------------------------------------------------------
@pytest.mark.parametrize("kwargs,says", [
    ({"idx": np.zeros((1, 0), dtype=np.int64)}, "the prompt is empty: give at least one token id"),
    ({"idx": []}, "the prompt is empty"),
    ({"max_new_tokens": -1}, "max_new_tokens must be a whole number of tokens, 0 or more, got -1"),
    ({"max_new_tokens": 2.5}, "max_new_tokens must be a whole number of tokens, 0 or more, got 2.5"),
    ({"top_k": -3}, "top_k must be a whole number of tokens, 1 or more .*got -3"),
    ({"top_k": 0}, "top_k must be a whole number of tokens, 1 or more .*got 0"),
    ({"top_k": 2.5}, "top_k must be a whole number of tokens, 1 or more .*got 2.5"),
])
def test_generate_names_a_bad_argument(kwargs, says):
    model = GPT(TINY)
    args = {"idx": np.array([[1, 2]]), "max_new_tokens": 3, **kwargs}
    with pytest.raises(ValueError, match=says):
        model.generate(args.pop("idx"), args.pop("max_new_tokens"), **args)


def test_generate_accepts_numpy_integers_and_zero_new_tokens():
    model = GPT(TINY)
    assert model.generate(np.array([[1, 2]]), 0).tolist() == [[1, 2]]
    out = model.generate(np.array([[1, 2]]), np.int64(2), top_k=np.int64(3), seed=0)
    assert out.shape == (1, 4)
