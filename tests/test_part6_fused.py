"""The fused CPU operations of lesson 6.5 (course.kernels.fused): gradients against finite differences
in float64, equal to the NumPy path in float32, swapped in by use_kernels("cpu"), and GPT and Mamba
on them giving the NumPy path's losses and gradients."""

import tracemalloc

import numpy as np
import pytest

import course.kernels as K
import course.tensor.functional as F
from course import optim
from course.kernels import fused
from course.tensor import Tensor, dispatch, gradcheck

pytestmark = pytest.mark.part6


def weights(n, dtype=np.float64):
    """A fixed, uneven weighting of the output, so that sum() does not hide a wrong gradient."""
    return Tensor(np.linspace(-1.0, 2.0, n).astype(dtype))


def _first(pair):
    total, normed = pair
    return total * weights(6) + normed * weights(6)[::-1]


# ----- every operation against finite differences, in float64 -------------------------------------------------
CASES = {
    "attention, causal": (lambda q, k, v: fused.attention(q, k, v) * weights(3), [(2, 5, 4), (2, 5, 4), (2, 5, 3)]),
    "attention, queries after a cache": (lambda q, k, v: fused.attention(q, k, v) * weights(3),
                                         [(2, 2, 4), (2, 5, 4), (2, 5, 3)]),
    "attention, not causal": (lambda q, k, v: fused.attention(q, k, v, causal=False) * weights(3),
                              [(1, 2, 3, 4), (1, 2, 5, 4), (1, 2, 5, 3)]),
    # longer than a tile, so that the online softmax rescales across tiles, and not a multiple of one
    "attention, several tiles": (lambda q, k, v: fused.attention(q, k, v) * weights(2),
                                 [(1, fused.BLOCK_K + 9, 2)] * 2 + [(1, fused.BLOCK_K + 9, 2)]),
    "add_layer_norm": (lambda x, y, w, b: _first(fused.add_layer_norm(x, y, w, b)),
                       [(2, 3, 6), (2, 3, 6), (6,), (6,)]),
    "bias_gelu": (lambda h, b: fused.bias_gelu(h * 3, b) * weights(5), [(4, 5), (5,)]),
    "linear_gelu": (lambda x, w, b: fused.linear_gelu(x, w, b) * weights(5), [(2, 3, 4), (5, 4), (5,)]),
    "cross_entropy": (lambda x: fused.cross_entropy(x * 2, np.array([[0, 3, -1], [2, -1, 1]]), ignore_index=-1),
                      [(2, 3, 4)]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_gradients_against_finite_differences(rng, name):
    fn, shapes = CASES[name]
    assert gradcheck(fn, *[rng.standard_normal(s) for s in shapes])


# ----- equal to the NumPy path in float32 --------------------------------------------------------------------
def _run(fn, arrays, g=None):
    """Forward and backward of fn on fresh float32 tensors: the output and every input's gradient."""
    tensors = [Tensor(a.astype(np.float32), requires_grad=True) for a in arrays]
    out = fn(*tensors)
    out.backward(None if out.data.size == 1 else g.astype(np.float32))
    return [out.data] + [t.grad for t in tensors]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("t_q, t_k", [(100, 100), (64, 64), (3, 130), (1, 1)])
def test_attention_equals_the_numpy_path_in_float32(rng, causal, t_q, t_k):
    arrays = [rng.standard_normal((2, 3, t_q, 16)), rng.standard_normal((2, 3, t_k, 16)) * 2,
              rng.standard_normal((2, 3, t_k, 8))]
    g = rng.standard_normal((2, 3, t_q, 8))
    got = _run(lambda *t: fused.attention(*t, causal=causal), arrays, g)
    expected = _run(lambda *t: F.scaled_dot_product_attention.default(*t, causal=causal), arrays, g)
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5)


def test_short_attention_leaves_the_heads_where_the_model_reads_them(rng):
    """GPT's q, k and v are (B, H, T, D) views of (B, T, H, D) arrays. The short route's output and
    gradients come out laid out the same way, so that putting the heads side by side again,
    (B, T, H, D) -> (B, T, C), is a view (no copy), and they equal the NumPy path's."""
    x = [rng.standard_normal((2, 10, 3, 8)).astype(np.float32) for _ in range(3)]
    g = rng.standard_normal((2, 10, 3, 8)).astype(np.float32)
    tensors = [Tensor(a.transpose(0, 2, 1, 3), requires_grad=True) for a in x]
    out = fused.attention(*tensors)
    assert out.data.transpose(0, 2, 1, 3).flags.c_contiguous
    out.backward(g.transpose(0, 2, 1, 3))
    for t in tensors:
        assert t.grad.transpose(0, 2, 1, 3).flags.c_contiguous, t.grad.strides
    expected = _run(F.scaled_dot_product_attention.default, [a.transpose(0, 2, 1, 3) for a in x], g.transpose(0, 2, 1, 3))
    for a, b in zip([out.data] + [t.grad for t in tensors], expected):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5)


def test_the_other_operations_equal_the_numpy_path_in_float32(rng):
    x, y = rng.standard_normal((2, 3, 6, 16)), rng.standard_normal((2, 3, 6, 16))
    w, b = rng.standard_normal(16), rng.standard_normal(16)
    pairs = [
        (lambda *t: _sum(fused.add_layer_norm(*t)), lambda *t: _sum(F.add_layer_norm.default(*t)), [x, y, w, b]),
        (lambda h, b: fused.bias_gelu(h, b), lambda h, b: F.gelu(h + b), [x * 3, b]),
        (lambda x, w, b: fused.linear_gelu(x, w, b), lambda x, w, b: F.gelu(F.linear(x, w, b)),
         [x, rng.standard_normal((16, 16)) / 4, b]),
    ]
    for fused_fn, numpy_fn, arrays in pairs:
        g = rng.standard_normal(x.shape)
        for a, e in zip(_run(fused_fn, arrays, g), _run(numpy_fn, arrays, g)):
            np.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-5)
    logits = rng.standard_normal((4, 32, 65)) * 3
    targets = rng.integers(0, 65, (4, 32))
    targets[0, :5] = -1
    got = _run(lambda t: fused.cross_entropy(t, targets, ignore_index=-1), [logits])
    expected = _run(lambda t: F.cross_entropy.default(t, targets, ignore_index=-1), [logits])
    for a, e in zip(got, expected):
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-7)
    assert np.all(got[1][0, :5] == 0)  # ignored targets get no gradient


def _sum(pair):
    total, normed = pair
    return total * normed  # both outputs reach the loss


def test_the_vectorised_exp_is_accurate_in_each_precision():
    from course.kernels import cpu

    x64 = np.concatenate([np.linspace(-700, 700, 2001), np.linspace(-3, 3, 601)])
    np.testing.assert_allclose([cpu._exp64(x) for x in x64], np.exp(x64), rtol=1e-13)
    x32 = np.linspace(-87, 88, 4001).astype(np.float32)
    y32 = np.array([cpu._exp32(x) for x in x32])
    np.testing.assert_allclose(y32, np.exp(x32.astype(np.float64)), rtol=3.2e-7)
    assert cpu._exp64(-800.0) < 1e-300 and cpu._exp32(np.float32(-100)) < 2e-38
    assert np.isfinite(cpu._exp32(np.float32(100)))


def test_bias_gelu_far_out_in_float32(rng):
    """Far below zero GELU is 0 and its slope 0, far above it is x and its slope 1: no cancellation
    turns a 0 into float32's rounding of 1 (1e-7 times x)."""
    h = np.array([[-40, -13.2, -6, -1, 0, 1, 6, 13.2, 40]], np.float32)
    x = Tensor(h, requires_grad=True)
    y = fused.bias_gelu(x, Tensor(np.zeros(9, np.float32)))
    y.sum().backward()
    x64 = h.astype(np.float64)
    expected = 0.5 * x64 * (1 + np.tanh(np.sqrt(2 / np.pi) * (x64 + 0.044715 * x64 ** 3)))
    np.testing.assert_allclose(y.data, expected, rtol=1e-6, atol=1e-30)
    assert abs(x.grad[0, 0]) < 1e-30 and abs(x.grad[0, 1]) < 1e-30 and x.grad[0, -1] == 1


# ----- bad input: the engine's errors, not a kernel's ---------------------------------------------------------
def test_bad_input_gets_the_engines_error(rng):
    q = Tensor(rng.standard_normal((2, 5, 4)))
    with pytest.raises(ValueError, match=r"q \(2, 5, 4\), k \(2, 5, 3\)"):
        fused.attention(q, Tensor(rng.standard_normal((2, 5, 3))), q)
    logits = Tensor(rng.standard_normal((3, 4)))
    with pytest.raises(ValueError, match="target 7 is out of range for 4 classes"):
        fused.cross_entropy(logits, np.array([0, 7, 1]))
    with pytest.raises(ValueError, match="every target equals ignore_index=-1"):
        fused.cross_entropy(logits, np.array([-1, -1, -1]), ignore_index=-1)
    with pytest.raises(ValueError, match=r"targets of shape \(3,\), got targets of shape \(2,\)"):
        fused.cross_entropy(logits, np.array([0, 1]))


def test_dropout_and_float16_fall_back_to_the_engine(rng):
    q = Tensor(rng.standard_normal((2, 5, 4)).astype(np.float16))
    K.reset_launches()
    out = fused.attention(q, q, q)
    assert out.dtype == np.float16 and "cpu.attention_forward" not in K.launches()
    q32 = Tensor(rng.standard_normal((2, 5, 4)).astype(np.float32))
    F.manual_seed(0)
    out = fused.attention(q32, q32, q32, dropout_p=0.5, training=True)
    F.manual_seed(0)
    np.testing.assert_array_equal(out.data, F.scaled_dot_product_attention.default(q32, q32, q32, True, 0.5).data)


# ----- no (T, T) array: memory grows with T ------------------------------------------------------------------------
def test_attention_memory_grows_linearly_in_t(rng):
    def peak(fn, t):
        q, k, v = (Tensor(rng.standard_normal((1, 2, t, 8)).astype(np.float32), requires_grad=True)
                   for _ in range(3))
        fn(q, k, v).backward(np.ones((1, 2, t, 8), np.float32))  # compiles outside the measurement
        tracemalloc.start()
        fn(q, k, v).backward(np.ones((1, 2, t, 8), np.float32))
        used = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return used

    small, large = peak(fused.attention, 256), peak(fused.attention, 1024)
    assert large < 6 * small, (small, large)  # 4x the tokens: about 4x the memory, not 16x
    assert large < 2 * 4 * 1024 * 2 * 8 * 10  # a few arrays of T x d, far below one T x T matrix
    numpy_large = peak(F.scaled_dot_product_attention.default, 1024)
    assert numpy_large > 2 * 4 * 1024 * 1024  # the NumPy path holds (T, T) matrices for each head


# ----- the optimizer step ----------------------------------------------------------------------------------------
OPTIMIZERS = {
    "AdamW": lambda groups: optim.AdamW(groups, lr=1e-2),
    "Adam with L2": lambda groups: optim.Adam(groups, lr=1e-2),
    "SGD": lambda groups: optim.SGD(groups, lr=1e-2),
    "SGD with momentum": lambda groups: optim.SGD(groups, lr=1e-2, momentum=0.9),
}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_fused_optimizer_step_equals_the_unfused_one(rng, name):
    shapes = [(5, 3), (7,), (3 * fused.CHUNK + 5,), (2, 2)]
    params = [Tensor(rng.standard_normal(s).astype(np.float32), requires_grad=True) for s in shapes]
    twins = [Tensor(p.data.copy(), requires_grad=True) for p in params]

    def make(ps):
        return OPTIMIZERS[name]([{"params": ps[:2], "weight_decay": 0.1}, {"params": ps[2:], "weight_decay": 0.0}])

    fast, slow = make(params), make(twins)
    K.reset_launches()
    for step in range(6):
        for p, q in zip(params, twins):
            p.grad = rng.standard_normal(p.shape).astype(np.float32)
            q.grad = p.grad.copy()
        if step == 2:  # a parameter without a gradient neither moves nor changes its state
            params[1].grad = twins[1].grad = None
        with K.use_kernels("cpu"):
            norm = optim.clip_grad_norm_(params, 5.0)
            fast.step()
        assert norm == pytest.approx(optim.clip_grad_norm_(twins, 5.0), rel=1e-5)
        slow.step()
        for p, q in zip(params, twins):
            np.testing.assert_allclose(p.data, q.data, rtol=1e-5, atol=1e-6)
        if step == 3:  # the unfused step may take over and hand back: the state is shared
            fast.step()
            slow.step()
    used = K.launches()
    assert used.get("cpu.adam_step", 0) + used.get("cpu.sgd_step", 0) == 6  # one kernel call per step
    assert used.get("cpu.clip_grad_norm", 0) == 5  # the first clip comes before the optimizer packed them


def test_fused_step_follows_a_replaced_parameter_array(rng):
    p = Tensor(rng.standard_normal(4).astype(np.float32), requires_grad=True)
    opt = optim.SGD([p], lr=0.5)
    with K.use_kernels("cpu"):
        p.grad = np.ones(4, np.float32)
        opt.step()
        p.data = np.zeros(4, np.float32)  # as load_state_dict does
        p.grad = np.ones(4, np.float32)
        opt.step()
    np.testing.assert_allclose(p.data, -0.5)


def test_other_optimizers_take_the_unfused_step(rng):
    class Halve(optim.SGD):
        def update(self, p, grad, group, state):
            p.data *= 0.5

    p = Tensor(np.ones(3, np.float32), requires_grad=True)
    p.grad = np.ones(3, np.float32)
    with K.use_kernels("cpu"):
        Halve([p], lr=1.0).step()
    np.testing.assert_allclose(p.data, 0.5)


# ----- use_kernels("cpu") swaps them in; GPT and Mamba give the NumPy path's numbers ---------------------------
def test_use_kernels_cpu_swaps_in_the_fused_operations():
    names = ("scaled_dot_product_attention", "add_layer_norm", "linear_gelu", "cross_entropy",
             "optimizer_step", "clip_grad_norm_")
    with K.use_kernels("cpu"):
        assert all(dispatch.current(n) is K.ops.FUSED[n] for n in names)
    assert all(dispatch.current(n) is dispatch._registry[n].default for n in names)


def _train_steps(model, batches, dtype, kernels, steps=3):
    opt = optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    losses, grads = [], []
    for idx, targets in batches[:steps]:
        with K.use_kernels("cpu") if kernels else _nothing():
            model.zero_grad()
            out = model(idx, targets) if targets is not None else model(idx)
            if isinstance(out, tuple):
                loss = out[1]
            else:
                loss = F.cross_entropy(out, np.roll(idx, -1, axis=1))
            loss.backward()
            grads.append({n: p.grad.copy() for n, p in model.named_parameters()})
            optim.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
        losses.append(float(loss.data))
    return losses, grads


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize("dtype, rtol", [(np.float64, 1e-9), (np.float32, 2e-4)])
def test_gpt_training_on_fused_kernels_equals_the_numpy_path(rng, dtype, rtol):
    from course.gpt import GPT, GPTConfig
    config = GPTConfig(vocab_size=11, block_size=70, n_layer=2, n_head=2, n_embd=8)
    batches = [(rng.integers(0, 11, (2, 70)), rng.integers(-1, 11, (2, 70))) for _ in range(3)]
    K.reset_launches()
    losses_k, grads_k = _train_steps(GPT(config, seed=0).astype(dtype), batches, dtype, kernels=True)
    used = set(K.launches())
    assert {"cpu.attention_forward", "cpu.attention_backward", "cpu.add_layer_norm", "cpu.bias_gelu",
            "cpu.bias_gelu_backward", "cpu.cross_entropy", "cpu.adam_step", "cpu.clip_grad_norm"} <= used
    losses, grads = _train_steps(GPT(config, seed=0).astype(dtype), batches, dtype, kernels=False)
    np.testing.assert_allclose(losses_k, losses, rtol=rtol)
    for g_k, g in zip(grads_k, grads):
        for name in g:
            np.testing.assert_allclose(g_k[name], g[name], rtol=rtol * 10, atol=rtol / 10, err_msg=name)


def test_mamba_training_on_fused_kernels_equals_the_numpy_path(rng):
    from course.mamba import Mamba, MambaConfig
    config = MambaConfig(d_model=8, n_layer=2, vocab_size=11, d_state=4)
    batches = [(rng.integers(0, 11, (2, 6)), None) for _ in range(3)]
    K.reset_launches()
    losses_k, grads_k = _train_steps(Mamba(config, seed=0).astype(np.float64), batches, np.float64, kernels=True)
    assert {"cpu.selective_scan", "cpu.cross_entropy", "cpu.adam_step"} <= set(K.launches())
    losses, grads = _train_steps(Mamba(config, seed=0).astype(np.float64), batches, np.float64, kernels=False)
    np.testing.assert_allclose(losses_k, losses, rtol=1e-9)
    for g_k, g in zip(grads_k, grads):
        for name in g:
            np.testing.assert_allclose(g_k[name], g[name], rtol=1e-8, atol=1e-11, err_msg=name)


def test_a_block_with_replaced_modules_keeps_their_forward(rng):
    from course import nn
    from course.gpt import GPT, GPTConfig

    class Scaled(nn.LayerNorm):  # not the plain LayerNorm: its own forward must run
        def forward(self, x):
            return super().forward(x) * 2

    class Shifted(nn.Linear):
        def forward(self, x):
            return super().forward(x) + 1

    config = GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8)
    model = GPT(config, seed=0).astype(np.float64)
    block = model.transformer.h[0]
    block.ln_2, block.mlp.c_fc = Scaled(8), Shifted(8, 32)
    block.ln_2.weight.data = block.ln_2.weight.data.astype(np.float64)
    block.ln_2.bias.data = block.ln_2.bias.data.astype(np.float64)
    block.mlp.c_fc.weight.data = rng.standard_normal((32, 8)) * 0.1
    block.mlp.c_fc.bias.data = np.zeros(32)
    x = Tensor(rng.standard_normal((2, 5, 8)))
    x1 = x + block.attn(block.ln_1(x))
    h = F.gelu(block.mlp.c_fc(block.ln_2(x1)))
    expected = x1 + block.mlp.c_proj(h)
    np.testing.assert_allclose(block(x).data, expected.data, rtol=1e-12)
    with K.use_kernels("cpu"):
        np.testing.assert_allclose(block(x).data, expected.data, rtol=1e-10)


def test_fused_step_after_the_state_is_cleared_starts_from_zeros(rng):
    p = Tensor(rng.standard_normal(6).astype(np.float32), requires_grad=True)
    q = Tensor(p.data.copy(), requires_grad=True)
    fast, slow = optim.AdamW([p], lr=1e-2), optim.AdamW([q], lr=1e-2)
    for step in range(5):
        if step == 3:  # a fresh start of the optimizer's state, as after loading a model
            fast.state.clear()
            slow.state.clear()
        p.grad = rng.standard_normal(6).astype(np.float32)
        q.grad = p.grad.copy()
        with K.use_kernels("cpu"):
            fast.step()
        slow.step()
        np.testing.assert_allclose(p.data, q.data, rtol=1e-5, atol=1e-6)
