"""The Mamba model: config, names, initialisation, gradients, the recurrent step, generation, checkpoints, errors."""

import numpy as np
import pytest

import course.tensor.functional as F
from course.mamba import METHODS, Mamba, MambaConfig, MambaState, selective_scan
from course.tensor import Tensor, dispatch
from course.tensor.gradcheck import numerical_gradient
from course.train import load_checkpoint, save_checkpoint

pytestmark = pytest.mark.part5

TINY = MambaConfig(d_model=8, n_layer=2, vocab_size=11, d_state=3, d_conv=3)


def perturbed(config=TINY, dtype=np.float64, seed=0):
    """A model whose every parameter is moved off its initial value (so norms, D, biases all matter)."""
    model = Mamba(config, seed=seed)
    rng = np.random.default_rng(seed + 100)
    for p in model.parameters():
        p.data = p.data + rng.normal(0, 0.1, p.shape).astype(p.dtype)
    return model.astype(dtype)


# ----- config and parameters --------------------------------------------------------------------------
def test_config_derives_sizes_like_mamba_minimal():
    c = MambaConfig(d_model=40, n_layer=2, vocab_size=65)
    assert (c.d_inner, c.dt_rank, c.padded_vocab_size, c.d_state, c.d_conv) == (80, 3, 72, 16, 4)
    assert MambaConfig(d_model=16, n_layer=1, vocab_size=16).padded_vocab_size == 16
    assert MambaConfig(d_model=16, n_layer=1, vocab_size=5, dt_rank=7).dt_rank == 7
    assert MambaConfig(**c.to_dict()) == c  # a checkpoint's config builds the same model


@pytest.mark.parametrize("field,value", [("d_model", 0), ("n_layer", -1), ("vocab_size", 2.5), ("d_state", "16"),
                                         ("expand", None), ("d_conv", 0), ("dt_rank", "big"), ("dt_rank", 0)])
def test_config_rejects_bad_fields_by_name(field, value):
    kwargs = dict(d_model=8, n_layer=1, vocab_size=10)
    kwargs[field] = value
    with pytest.raises(ValueError, match=f"MambaConfig: {field} must be"):
        MambaConfig(**kwargs)


def test_parameter_names_and_shapes_follow_mamba_minimal():
    c = MambaConfig(d_model=16, n_layer=2, vocab_size=10, d_state=4)
    model = Mamba(c)
    shapes = {n: p.shape for n, p in model.named_parameters()}
    d_in, r = 32, 1
    expected = {"embedding.weight": (16, 16), "norm_f.weight": (16,)}
    for i in range(2):
        m = f"layers.{i}.mixer."
        expected.update({f"layers.{i}.norm.weight": (16,), m + "in_proj.weight": (2 * d_in, 16),
                         m + "conv1d.weight": (d_in, 1, 4), m + "conv1d.bias": (d_in,),
                         m + "x_proj.weight": (r + 8, d_in), m + "dt_proj.weight": (d_in, r),
                         m + "dt_proj.bias": (d_in,), m + "A_log": (d_in, 4), m + "D": (d_in,),
                         m + "out_proj.weight": (16, d_in)})
    assert shapes == expected
    state = model.state_dict()
    assert set(state) == set(expected) | {"lm_head.weight"}
    assert model.lm_head.weight is model.embedding.weight  # tied: one parameter
    assert model.num_parameters() == sum(int(np.prod(s)) for s in expected.values())


def test_initialisation_is_mamba_minimals():
    model = Mamba(MambaConfig(d_model=32, n_layer=1, vocab_size=10, d_state=5), seed=3)
    mixer = model.layers[0].mixer
    np.testing.assert_allclose(np.exp(mixer.A_log.data), np.tile(np.arange(1, 6), (64, 1)), rtol=1e-6)
    np.testing.assert_array_equal(mixer.D.data, 1)
    dt = F.softplus(mixer.dt_proj.bias).data  # delta at a zero input lies in [1e-3, 1e-1]
    assert dt.min() >= 1e-3 * 0.999 and dt.max() <= 1e-1 * 1.001 and dt.max() / dt.min() > 10
    assert np.abs(mixer.dt_proj.weight.data).max() <= 2 ** -0.5  # dt_rank = 2
    assert all(p.dtype == np.float32 for p in model.parameters())
    same = Mamba(MambaConfig(d_model=32, n_layer=1, vocab_size=10, d_state=5), seed=3)
    other = Mamba(MambaConfig(d_model=32, n_layer=1, vocab_size=10, d_state=5), seed=4)
    for (n, p), q, o in zip(model.named_parameters(), same.parameters(), other.parameters()):
        np.testing.assert_array_equal(p.data, q.data, err_msg=n)
    assert not np.array_equal(model.embedding.weight.data, other.embedding.weight.data)


# ----- forward and gradients ------------------------------------------------------------------------------
def test_forward_shape_and_methods_agree():
    model = perturbed()
    ids = np.random.default_rng(0).integers(0, TINY.vocab_size, (3, 7))
    logits = model(ids)
    assert logits.shape == (3, 7, 16) and logits.dtype == np.float64
    for m in METHODS:
        model.scan_method = m
        np.testing.assert_allclose(model(ids).data, logits.data, rtol=1e-10, atol=1e-12, err_msg=m)
    model.scan_method = "chunked"
    with pytest.raises(ValueError, match="unknown scan_method 'chunked'.*'sequential'"):
        model(ids)


def test_model_gradients_match_finite_differences():
    """d loss / d (every parameter), a few entries of each, against central differences in float64."""
    model = perturbed()
    rng = np.random.default_rng(1)
    ids, targets = rng.integers(0, TINY.vocab_size, (2, 5)), rng.integers(0, TINY.vocab_size, (2, 5))

    def loss():
        return F.cross_entropy(model(ids), targets)

    model.zero_grad()
    loss().backward()
    for name, p in model.named_parameters():
        flat = p.data.reshape(-1)
        picks = rng.choice(flat.size, size=min(3, flat.size), replace=False)
        for i in picks:
            def f(v, i=i):
                old = flat[i]
                flat[i] = v[0]
                try:
                    return float(loss().data)
                finally:
                    flat[i] = old
            expected = numerical_gradient(f, [np.array([flat[i]])], 0, eps=1e-6)[0]
            assert p.grad.reshape(-1)[i] == pytest.approx(expected, rel=1e-5, abs=1e-8), f"{name}[{i}]"


def test_the_model_calls_the_scan_through_the_dispatch_point():
    model = perturbed()
    ids = np.zeros((1, 4), dtype=np.int64)
    calls = []

    def counting(*args, **kwargs):
        calls.append(kwargs.get("method"))
        return selective_scan.default(*args, **kwargs)

    with dispatch.override({"selective_scan": counting}):
        model(ids)
    assert calls == ["fast"] * TINY.n_layer


@pytest.mark.parametrize("bad,error,match", [
    (np.array([[1, 11]]), ValueError, r"token id 11 at position \(0, 1\) is out of range for vocab_size 11"),
    (np.array([[-1, 2]]), ValueError, "token id -1"),
    (np.array([[1.0, 2.0]]), TypeError, "token ids must be integers"),
    (np.array([1, 2]), ValueError, r"input_ids must be a 2-D array.*\(2,\)"),
])
def test_bad_input_ids_are_named(bad, error, match):
    with pytest.raises(error, match=match):
        perturbed()(bad)


# ----- the recurrent view -------------------------------------------------------------------------------------
def test_step_equals_forward_position_by_position():
    model = perturbed()
    ids = np.random.default_rng(2).integers(0, TINY.vocab_size, (3, 9))
    full = model(ids).data
    state = model.init_state(3)
    sizes = set()
    for t in range(9):
        logits, new_state = model.step(ids[:, t], state)
        assert logits.shape == (3, TINY.padded_vocab_size)
        np.testing.assert_allclose(logits, full[:, t], rtol=1e-10, atol=1e-12, err_msg=f"position {t}")
        assert new_state is not state
        state = new_state
        sizes.add(state.nbytes())
    assert len(sizes) == 1  # constant memory per token
    c = TINY
    assert sizes.pop() == 8 * 3 * c.n_layer * c.d_inner * (c.d_conv - 1 + c.d_state)


def test_step_errors():
    model = perturbed()
    state = model.init_state(2)
    with pytest.raises(ValueError, match=r"holds 2 sequences.*but 3 token ids.*init_state\(3\)"):
        model.step(np.array([1, 2, 3]), state)
    with pytest.raises(TypeError, match="state must be a MambaState"):
        model.step(np.array([1, 2]), None)
    with pytest.raises(ValueError, match="token id 99"):
        model.step(np.array([1, 99]), state)
    with pytest.raises(ValueError, match=r"token_ids must be a 1-D array"):
        model.step(np.array([[1, 2]]), state)
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        model.init_state(0)
    assert isinstance(state, MambaState) and state.batch_size == 2


def test_greedy_generation_equals_argmax_of_forward():
    model = perturbed()
    prompt = np.array([[1, 2, 3], [4, 5, 6]])
    out = model.generate(prompt, 6, do_sample=False)
    assert out.shape == (2, 9)
    np.testing.assert_array_equal(out[:, :3], prompt)
    seq = prompt
    for _ in range(6):  # recompute each token with the full forward pass
        logits = model(seq).data[:, -1, :TINY.vocab_size]
        seq = np.concatenate([seq, logits.argmax(-1)[:, None]], axis=1)
    np.testing.assert_array_equal(out, seq)
    # a tiny temperature samples the likeliest token too
    np.testing.assert_array_equal(model.generate(prompt, 6, temperature=1e-8, seed=5), seq)


def test_sampling_is_shared_with_gpt():
    import course.gpt.model as gpt_model
    import course.sampling as sampling

    assert gpt_model.sample_next is sampling.sample_next and gpt_model.top_k_filter is sampling.top_k_filter


def test_sampling_is_deterministic_and_never_draws_padding():
    model = perturbed()
    step = model.step

    def step_favouring_padding(ids, state):  # the padding ids (11..15) become by far the likeliest
        logits, state = step(ids, state)
        logits = logits.copy()
        logits[:, TINY.vocab_size:] += 100
        return logits, state

    model.step = step_favouring_padding
    prompt = np.array([[3]])
    a = model.generate(prompt, 30, temperature=2.0, seed=7)
    b = model.generate(prompt, 30, temperature=2.0, seed=7)
    np.testing.assert_array_equal(a, b)
    assert a.max() < TINY.vocab_size
    assert not np.array_equal(a, model.generate(prompt, 30, temperature=2.0, seed=8))
    assert model.generate(prompt, 30, top_k=1, seed=1).max() < TINY.vocab_size
    with pytest.raises(ValueError, match="temperature must be positive"):
        model.generate(prompt, 2, temperature=0)
    with pytest.raises(ValueError, match="prompt is empty"):
        model.generate(np.zeros((1, 0), dtype=np.int64), 2)


# ----- checkpoints and state dicts --------------------------------------------------------------------------------
def test_checkpoint_round_trip(tmp_path):
    model = perturbed(dtype=np.float32)
    path = tmp_path / "mamba.npz"
    save_checkpoint(path, model, note="hello")
    loaded, meta = load_checkpoint(path)
    assert isinstance(loaded, Mamba) and loaded.config == model.config and meta == {"note": "hello"}
    ids = np.array([[1, 2, 3, 4]])
    np.testing.assert_array_equal(loaded(ids).data, model(ids).data)
    assert loaded.lm_head.weight is loaded.embedding.weight
    with pytest.raises(ValueError, match="d_model: checkpoint 8, model 16"):
        load_checkpoint(path, Mamba(MambaConfig(d_model=16, n_layer=2, vocab_size=11, d_state=3, d_conv=3)))


def test_load_state_dict_names_what_does_not_fit():
    model = perturbed(dtype=np.float32)
    state = model.state_dict()
    fresh = Mamba(TINY, seed=9)
    fresh.load_state_dict(state)
    np.testing.assert_array_equal(fresh.layers[1].mixer.A_log.data, state["layers.1.mixer.A_log"])
    without_head = {k: v for k, v in state.items() if k != "lm_head.weight"}
    Mamba(TINY).load_state_dict(without_head)  # the tied name may be left out

    missing = dict(state)
    del missing["layers.0.mixer.D"]
    with pytest.raises(ValueError, match=r"missing: layers\.0\.mixer\.D"):
        Mamba(TINY).load_state_dict(missing)
    extra = dict(state, **{"layers.0.mixer.E": np.ones(3)})
    with pytest.raises(ValueError, match=r"unexpected: layers\.0\.mixer\.E"):
        Mamba(TINY).load_state_dict(extra)
    flat_conv = dict(state)
    flat_conv["layers.1.mixer.conv1d.weight"] = state["layers.1.mixer.conv1d.weight"][:, 0, :]
    with pytest.raises(ValueError, match=r"layers\.1\.mixer\.conv1d\.weight: expected \(16, 1, 3\), got \(16, 3\)"):
        Mamba(TINY).load_state_dict(flat_conv)
    bad_head = dict(state, **{"lm_head.weight": state["lm_head.weight"][:, :4]})
    with pytest.raises(ValueError, match=r"lm_head\.weight: expected \(16, 8\)"):
        Mamba(TINY).load_state_dict(bad_head)
    untied = dict(state, **{"lm_head.weight": state["lm_head.weight"] + 1})
    with pytest.raises(ValueError, match="lm_head.weight differs from embedding.weight"):
        Mamba(TINY).load_state_dict(untied)
    with pytest.raises(TypeError, match="config must be a MambaConfig"):
        Mamba({"d_model": 8})


# ----- selectivity switched off (lesson 5.4's ablation) -------------------------------------------------
LTI = MambaConfig(d_model=8, n_layer=2, vocab_size=11, d_state=3, d_conv=3, selective=False)


def test_a_model_without_selection_has_the_same_delta_b_c_for_every_input():
    model = perturbed(LTI)
    mixer = model.layers[0].mixer
    assert not hasattr(mixer, "x_proj") and not hasattr(mixer, "dt_proj")
    names = {n for n, _ in model.named_parameters()}
    assert {"layers.0.mixer.dt_bias", "layers.0.mixer.B", "layers.0.mixer.C"} <= names
    rng = np.random.default_rng(0)
    first = [t.data for t in mixer.ssm_parameters(Tensor(rng.normal(size=(2, 5, LTI.d_inner))))]
    second = [t.data for t in mixer.ssm_parameters(Tensor(rng.normal(size=(2, 5, LTI.d_inner))))]
    for a, b in zip(first, second):
        assert np.array_equal(a, b)
    delta = first[0]
    assert np.array_equal(delta, np.broadcast_to(delta[0, 0], delta.shape))  # the same at every position
    # the selective model's are computed from the input
    selective = perturbed().layers[0].mixer
    x = rng.normal(size=(2, 5, TINY.d_inner))
    assert not np.allclose(selective.ssm_parameters(Tensor(x))[0].data, selective.ssm_parameters(Tensor(x + 1))[0].data)


def test_a_model_without_selection_steps_as_it_runs_and_its_gradients_are_right():
    model = perturbed(LTI)
    rng = np.random.default_rng(2)
    ids, targets = rng.integers(0, LTI.vocab_size, (2, 5)), rng.integers(0, LTI.vocab_size, (2, 5))
    full = model(ids).data
    state = model.init_state(2)
    for t in range(5):
        logits, state = model.step(ids[:, t], state)
        assert np.allclose(logits, full[:, t], atol=1e-10)
    model.zero_grad()
    F.cross_entropy(model(ids), targets).backward()
    for name in ("layers.0.mixer.dt_bias", "layers.1.mixer.B", "layers.0.mixer.C"):
        p = dict(model.named_parameters())[name]
        flat = p.data.reshape(-1)

        def f(v):
            old = flat[0]
            flat[0] = v[0]
            try:
                return float(F.cross_entropy(model(ids), targets).data)
            finally:
                flat[0] = old
        expected = numerical_gradient(f, [np.array([flat[0]])], 0, eps=1e-6)[0]
        assert p.grad.reshape(-1)[0] == pytest.approx(expected, rel=1e-5, abs=1e-8), name


def test_selective_is_a_documented_switch_whose_default_keeps_mamba():
    assert MambaConfig(d_model=8, n_layer=1, vocab_size=10).selective is True
    assert "selective" in MambaConfig(d_model=8, n_layer=1, vocab_size=10).to_dict()
    with pytest.raises(ValueError, match="MambaConfig: selective must be True or False"):
        MambaConfig(d_model=8, n_layer=1, vocab_size=10, selective="no")
    # without selection there is no x_proj and no dt_proj weight, but dt_bias (d_inner), B and C (d_state)
    c = LTI
    removed = c.d_inner * (c.dt_rank + 2 * c.d_state) + c.dt_rank * c.d_inner
    added = c.d_inner + 2 * c.d_state - c.d_inner  # dt_bias replaces dt_proj.bias
    assert Mamba(TINY, seed=3).num_parameters() - Mamba(LTI, seed=3).num_parameters() == c.n_layer * (removed - added)


def test_checkpoint_of_the_model_without_selection_loads():
    from course.mamba import CHECKPOINTS
    model, meta = load_checkpoint(CHECKPOINTS / "selective_copy_mamba_lti.npz")
    assert model.config.selective is False and meta["parameters"] == model.num_parameters()


# ----- misuse -------------------------------------------------------------------------------------------
def test_step_with_another_models_state_names_the_mismatch():
    other = Mamba(MambaConfig(d_model=16, n_layer=2, vocab_size=11, d_state=3, d_conv=3))
    with pytest.raises(ValueError, match=r"the state does not fit this model: layer 0 .*another model's init_state"):
        Mamba(TINY).step(np.zeros(1, dtype=int), other.init_state(1))
    wider = Mamba(MambaConfig(d_model=8, n_layer=2, vocab_size=11, d_state=5, d_conv=3))
    with pytest.raises(ValueError, match=r"d_state=3"):
        Mamba(TINY).step(np.zeros(1, dtype=int), wider.init_state(1))


def test_float16_model_with_the_fast_scan_says_what_to_do():
    model = Mamba(TINY).astype(np.float16)
    ids = np.zeros((1, 3), dtype=int)
    with pytest.raises(TypeError, match=r"method 'fast' .* not float16.*scan_method = 'sequential'"):
        model(ids)
    model.scan_method = "sequential"
    assert model(ids).dtype == np.float16
