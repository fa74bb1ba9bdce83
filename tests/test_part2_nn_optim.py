"""Modules (course.nn) and optimizers (course.optim): names, state dicts, modes, and each update
rule against numbers worked out by hand from its formula."""

import math

import numpy as np
import pytest

import course.nn as nn
import course.optim as optim
import course.tensor.functional as F
from course.tensor import Tensor

pytestmark = pytest.mark.part2


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(4)
        self.mlp = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 4, bias=False))

    def forward(self, x):
        return x + self.mlp(self.ln(x))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.drop = nn.Dropout(0.5)
        self.head = nn.Linear(4, 3)

    def forward(self, idx):
        x = self.emb(idx)
        for b in self.blocks:
            x = b(x)
        return self.head(self.drop(x))


def make_net(seed=0):
    F.manual_seed(seed)
    return Net()


def test_named_parameters_have_dotted_names_in_assignment_order():
    names = [n for n, _ in make_net().named_parameters()]
    block = ["ln.weight", "ln.bias", "mlp.0.weight", "mlp.0.bias", "mlp.2.weight"]
    assert names == (["emb.weight"] + [f"blocks.0.{n}" for n in block] + [f"blocks.1.{n}" for n in block]
                     + ["head.weight", "head.bias"])
    net = make_net()
    assert len(net.parameters()) == len(names)
    assert all(p.requires_grad for p in net.parameters())


def test_a_shared_parameter_is_listed_once():
    a = nn.Linear(3, 3)
    seq = nn.Sequential(a, a)
    assert [n for n, _ in seq.named_parameters()] == ["0.weight", "0.bias"]


def test_linear_shapes_and_values():
    lin = nn.Linear(5, 3)
    assert lin.weight.shape == (3, 5) and lin.bias.shape == (3,)
    assert lin.weight.dtype == np.float32
    assert np.all(np.abs(lin.weight.data) <= 1 / math.sqrt(5))
    x = np.random.default_rng(0).normal(size=(2, 5)).astype(np.float32)
    np.testing.assert_allclose(lin(Tensor(x)).data, x @ lin.weight.data.T + lin.bias.data, rtol=1e-6)
    assert nn.Linear(5, 3, bias=False).bias is None
    assert [n for n, _ in nn.Linear(5, 3, bias=False).named_parameters()] == ["weight"]


def test_state_dict_round_trip():
    a, b = make_net(0), make_net(1)
    idx = np.array([[1, 2, 3], [4, 5, 6]])
    a.eval(), b.eval()
    assert not np.allclose(a(idx).data, b(idx).data)
    state = a.state_dict()
    assert list(state) == [n for n, _ in a.named_parameters()]
    b.load_state_dict(state)
    np.testing.assert_array_equal(a(idx).data, b(idx).data)
    state["head.bias"][:] = 123.0  # the state dict holds copies: changing it leaves the model alone
    assert not np.any(a.head.bias.data == 123.0)


def test_load_state_dict_strict_errors_name_the_keys():
    net = make_net()
    state = net.state_dict()
    del state["head.bias"]
    state["head.extra"] = np.zeros(3)
    state["emb.weight"] = np.zeros((11, 4))
    with pytest.raises(ValueError) as err:
        net.load_state_dict(state)
    message = str(err.value)
    assert "missing: head.bias" in message
    assert "unexpected: head.extra" in message
    assert "emb.weight" in message and "(10, 4)" in message and "(11, 4)" in message
    # strict=False accepts missing and unexpected names, but never a wrong shape
    with pytest.raises(ValueError, match="emb.weight"):
        net.load_state_dict(state, strict=False)
    state["emb.weight"] = np.ones((10, 4))
    net.load_state_dict(state, strict=False)
    np.testing.assert_array_equal(net.emb.weight.data, 1)
    assert net.emb.weight.dtype == np.float32


def test_train_and_eval_switch_dropout():
    net = make_net()
    idx = np.arange(6).reshape(2, 3)
    net.eval()
    assert all(not m.training for m in net.modules())
    first, second = net(idx).data, net(idx).data
    np.testing.assert_array_equal(first, second)  # no dropout: deterministic
    net.train()
    assert net.drop.training and net.blocks[1].mlp.training
    F.manual_seed(0)
    noisy = net(idx).data
    assert not np.allclose(noisy, first)
    drop = nn.Dropout(0.5).eval()
    x = Tensor(np.ones(10))
    assert drop(x) is x


def test_zero_grad_and_backward_through_a_model():
    net = make_net()
    loss = F.cross_entropy(net(np.array([[1, 2], [3, 4]])), np.array([[0, 1], [2, 0]]))
    loss.backward()
    assert all(p.grad is not None and p.grad.shape == p.shape for p in net.parameters())
    net.zero_grad()
    assert all(p.grad is None for p in net.parameters())


def test_layernorm_and_embedding_modules():
    ln = nn.LayerNorm(3)
    x = np.array([[1.0, 2.0, 4.0]], dtype=np.float32)
    y = ln(Tensor(x)).data
    np.testing.assert_allclose(y.mean(-1), 0, atol=1e-6)
    np.testing.assert_allclose(y.var(-1), 3 / (3 + 3 * 1e-5 / x.var()), rtol=1e-4)
    emb = nn.Embedding(4, 2)
    np.testing.assert_array_equal(emb(np.array([3, 0])).data, emb.weight.data[[3, 0]])


# ----- optimizers against hand-computed steps ---------------------------------------------------
# One parameter p, and a fixed gradient sequence fed in by hand, so every number below comes
# straight from the update formula.


def run(opt_cls, grads, p0=1.0, **kw):
    p = nn.Parameter(np.array([p0], dtype=np.float64))
    opt = opt_cls([p], **kw)
    values = []
    for g in grads:
        p.grad = np.array([g], dtype=np.float64)
        opt.step()
        values.append(float(p.data[0]))
    return values


def test_sgd_plain():
    # p <- p - lr g: 1 - 0.1*0.5 = 0.95; 0.95 - 0.1*(-1) = 1.05; 1.05 - 0.1*2 = 0.85
    np.testing.assert_allclose(run(optim.SGD, [0.5, -1.0, 2.0], lr=0.1), [0.95, 1.05, 0.85])


def test_sgd_momentum():
    # v1 = g1 = 0.5                 p1 = 1 - 0.1*0.5 = 0.95
    # v2 = 0.9*0.5 + (-1) = -0.55   p2 = 0.95 + 0.055 = 1.005
    # v3 = 0.9*(-0.55) + 2 = 1.505  p3 = 1.005 - 0.1505 = 0.8545
    np.testing.assert_allclose(run(optim.SGD, [0.5, -1.0, 2.0], lr=0.1, momentum=0.9), [0.95, 1.005, 0.8545])


def test_sgd_momentum_and_weight_decay():
    # g' = g + 0.1 p
    # step 1: g' = 0.5 + 0.1*1 = 0.6;            v = 0.6;                p = 1 - 0.06 = 0.94
    # step 2: g' = -1 + 0.094 = -0.906;          v = 0.54 - 0.906 = -0.366;  p = 0.94 + 0.0366 = 0.9766
    # step 3: g' = 2 + 0.09766 = 2.09766;        v = -0.3294 + 2.09766 = 1.76826;  p = 0.9766 - 0.176826 = 0.799774
    np.testing.assert_allclose(run(optim.SGD, [0.5, -1.0, 2.0], lr=0.1, momentum=0.9, weight_decay=0.1),
                               [0.94, 0.9766, 0.799774], rtol=1e-12)


def test_adam():
    # lr 0.1, betas (0.5, 0.75) so the numbers are short, eps 0.
    # t=1: g=1:  m = 0.5,  v = 0.25;  m^ = 0.5/0.5 = 1,  v^ = 0.25/0.25 = 1;  p = 1 - 0.1 = 0.9
    # t=2: g=-1: m = 0.25 - 0.5 = -0.25,  v = 0.1875 + 0.25 = 0.4375
    #           m^ = -0.25/0.75 = -1/3,  v^ = 0.4375/0.4375 = 1;  p = 0.9 + 0.1/3 = 0.9333...
    # t=3: g=2:  m = -0.125 + 1 = 0.875,  v = 0.328125 + 1 = 1.328125
    #           m^ = 0.875/0.875 = 1,  v^ = 1.328125/(1 - 0.421875) = 2.2972972...
    #           p = 0.93333 - 0.1/sqrt(2.2972972) = 0.93333 - 0.0659761 = 0.867357
    expected = [0.9, 0.9 + 0.1 / 3, 0.9 + 0.1 / 3 - 0.1 / math.sqrt(1.328125 / 0.578125)]
    got = run(optim.Adam, [1.0, -1.0, 2.0], lr=0.1, betas=(0.5, 0.75), eps=0.0)
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    np.testing.assert_allclose(got[2], 0.867357, atol=1e-6)


def test_adam_with_l2_weight_decay_adds_to_the_gradient():
    # weight_decay 1: g' = g + p.
    # t=1: g' = 1 + 1 = 2: m = 1, v = 1; m^ = 2, v^ = 4; p = 1 - 0.1*2/2 = 0.9 (Adam's first step is lr*sign)
    # t=2: g' = -3 + 0.9 = -2.1: m = 0.5 - 1.05 = -0.55, v = 0.75 + 0.25*4.41 = 1.8525
    #      m^ = -0.55/0.75 = -0.7333..., v^ = 1.8525/0.4375 = 4.2342857; p = 0.9 + 0.1*0.733333/2.057738 = 0.935638
    got = run(optim.Adam, [1.0, -3.0], lr=0.1, betas=(0.5, 0.75), eps=0.0, weight_decay=1.0)
    m_hat, v_hat = -0.55 / 0.75, 1.8525 / 0.4375
    np.testing.assert_allclose(got, [0.9, 0.9 - 0.1 * m_hat / math.sqrt(v_hat)], rtol=1e-12)
    np.testing.assert_allclose(got[1], 0.935638, atol=1e-6)


def test_adamw_decays_apart_from_the_gradient():
    # lr 0.1, wd 0.5: first p <- p (1 - 0.05), then the Adam step (lr * m^/sqrt(v^)).
    # t=1: p = 0.95, g=1: m^ = 1, v^ = 1: p = 0.95 - 0.1 = 0.85
    # t=2: p = 0.85*0.95 = 0.8075, g=-1: m^ = -1/3, v^ = 1: p = 0.8075 + 0.0333... = 0.840833...
    got = run(optim.AdamW, [1.0, -1.0], lr=0.1, betas=(0.5, 0.75), eps=0.0, weight_decay=0.5)
    np.testing.assert_allclose(got, [0.85, 0.8075 + 0.1 / 3], rtol=1e-12)


def test_adam_eps_and_float32_parameters():
    p = nn.Parameter(np.array([1.0, -2.0], dtype=np.float32))
    opt = optim.Adam([p], lr=0.01)
    p.grad = np.array([0.0, 3.0], dtype=np.float32)
    opt.step()
    assert p.dtype == np.float32
    np.testing.assert_allclose(p.data, [1.0, -2.01], rtol=1e-6)  # a zero gradient does not move p


def test_optimizer_zero_grad_skips_and_groups():
    a, b = nn.Parameter(np.ones(2)), nn.Parameter(np.ones(2))
    opt = optim.SGD([{"params": [a], "lr": 1.0}, {"params": [b]}], lr=0.5)
    a.grad, b.grad = np.ones(2), np.ones(2)
    opt.step()
    np.testing.assert_allclose(a.data, 0.0)
    np.testing.assert_allclose(b.data, 0.5)
    opt.zero_grad()
    assert a.grad is None and b.grad is None
    opt.step()  # a parameter without a gradient is left alone
    np.testing.assert_allclose(a.data, 0.0)
    with pytest.raises(ValueError, match="no parameters"):
        optim.SGD([], lr=0.1)


def test_clip_grad_norm():
    a, b = nn.Parameter(np.zeros(2)), nn.Parameter(np.zeros(1))
    a.grad, b.grad = np.array([3.0, 0.0]), np.array([4.0])  # the joint norm is 5
    norm = optim.clip_grad_norm_([a, b], max_norm=1.0)
    assert norm == pytest.approx(5.0)
    np.testing.assert_allclose(a.grad, [0.6, 0.0], rtol=1e-6)
    np.testing.assert_allclose(b.grad, [0.8], rtol=1e-6)
    a.grad, b.grad = np.array([0.3, 0.0]), np.array([0.4])  # norm 0.5 <= 1: untouched
    assert optim.clip_grad_norm_([a, b], max_norm=1.0) == pytest.approx(0.5)
    np.testing.assert_array_equal(a.grad, [0.3, 0.0])


def test_warmup_cosine_by_hand():
    # warmup 4, total 12: steps 0..3 ramp 1/4, 2/4, 3/4, 1; then a half cosine over 8 steps.
    f = [optim.warmup_cosine(s, 4, 12) for s in range(14)]
    np.testing.assert_allclose(f[:4], [0.25, 0.5, 0.75, 1.0])
    np.testing.assert_allclose(f[4], 1.0)
    np.testing.assert_allclose(f[6], 0.5 * (1 + math.cos(math.pi * 2 / 8)))  # 0.853553...
    np.testing.assert_allclose(f[6], 0.8535533905932737)
    np.testing.assert_allclose(f[8], 0.5, atol=1e-12)  # half way down
    np.testing.assert_allclose(f[12:], [0.0, 0.0], atol=1e-12)
    np.testing.assert_allclose(optim.warmup_cosine(8, 4, 12, min_ratio=0.1), 0.55)
    assert optim.warmup_cosine(100, 4, 12, min_ratio=0.1) == 0.1


def test_warmup_cosine_scheduler_sets_the_learning_rate():
    p = nn.Parameter(np.zeros(1))
    opt = optim.SGD([p], lr=0.4)
    sched = optim.WarmupCosine(opt, warmup_steps=2, total_steps=6)
    lrs = []
    for _ in range(7):
        lrs.append(sched.get_lr()[0])
        p.grad = np.ones(1)
        opt.step()
        sched.step()
    # 0.4 * [1/2, 1, cos ramp over 4 steps: 1, (1+cos(pi/4))/2, 1/2, (1+cos(3pi/4))/2, 0]
    c = math.cos(math.pi / 4)
    np.testing.assert_allclose(lrs, [0.2, 0.4, 0.4, 0.2 * (1 + c), 0.2, 0.2 * (1 - c), 0.0], atol=1e-12)
    np.testing.assert_allclose(p.data, -sum(lrs), rtol=1e-12)


def test_linear_and_embedding_draw_from_the_generator_they_are_given():
    a, b = nn.Linear(3, 2, rng=5), nn.Linear(3, 2, rng=np.random.default_rng(5))
    assert np.array_equal(a.weight.data, b.weight.data) and np.array_equal(a.bias.data, b.bias.data)
    assert not np.array_equal(a.weight.data, nn.Linear(3, 2, rng=6).weight.data)
    e1, e2 = nn.Embedding(4, 3, rng=1), nn.Embedding(4, 3, rng=1)
    assert np.array_equal(e1.weight.data, e2.weight.data) and e1.weight.dtype == np.float32


# ----- misuse gets a clear error ----------------------------------------------------------------
def test_a_numpy_array_into_linear_or_cross_entropy_is_named():
    x = np.ones((4, 3), dtype=np.float32)
    with pytest.raises(TypeError, match="linear: `x` must be a Tensor, got a NumPy array: wrap it first"):
        nn.Linear(3, 2, rng=0)(x)
    with pytest.raises(TypeError, match="cross_entropy: `logits` must be a Tensor, got a NumPy array"):
        F.cross_entropy(x, np.zeros(4, dtype=np.int64))
    with pytest.raises(TypeError, match="layer_norm: `x` must be a Tensor"):
        nn.LayerNorm(3)(x)


def test_sequential_refuses_what_is_not_a_module():
    # A forgotten pair of brackets would otherwise drop the ReLU from the model without a word.
    with pytest.raises(TypeError, match=r"Sequential: item 1 is the class ReLU, not a module: write ReLU\(\)"):
        nn.Sequential(nn.Linear(2, 3, rng=0), nn.ReLU, nn.Linear(3, 1, rng=0))
    with pytest.raises(TypeError, match=r"Sequential: item 1 is a function, not a Module: use a module such as nn.ReLU\(\)"):
        nn.Sequential(nn.Linear(2, 3, rng=0), F.gelu)
    with pytest.raises(TypeError, match="ModuleList: item 0 is a int, not a Module"):
        nn.ModuleList([3])
    model = nn.Sequential(nn.Linear(2, 3, rng=0), nn.ReLU(), nn.Linear(3, 1, rng=0))
    assert len(model) == 3


def test_integer_features_give_the_weights_dtype():
    layer = nn.Linear(3, 2)
    for features in (np.array([[1, 2, 3]]), np.array([[True, False, True]])):
        out = layer(Tensor(features))
        assert out.dtype == np.float32
        np.testing.assert_allclose(out.data, layer(Tensor(features.astype(np.float32))).data)
    double = nn.Linear(3, 2)
    double.weight.data, double.bias.data = double.weight.data.astype(np.float64), double.bias.data.astype(np.float64)
    assert double(Tensor(np.array([[1, 2, 3]]))).dtype == np.float64
