"""course.tensor, course.nn and course.optim against PyTorch: the same values, the same gradients,
the same optimizer steps."""

import math

import numpy as np
import pytest

import course.nn as nn
import course.optim as optim
import course.tensor.functional as F
from course.tensor import Tensor

torch = pytest.importorskip("torch", reason="PyTorch is not installed (optional `reference` extra)")
TF = torch.nn.functional

pytestmark = [pytest.mark.part2, pytest.mark.reference]


def compare(ours, theirs, *arrays, upstream_seed=0, rtol=1e-10, atol=1e-12):
    """Run `ours` on course Tensors and `theirs` on torch tensors (float64), backprop the same
    random upstream gradient through both, and compare outputs and input gradients."""
    ts = [Tensor(np.array(a, dtype=np.float64), requires_grad=True) for a in arrays]
    ps = [torch.tensor(np.array(a, dtype=np.float64), requires_grad=True) for a in arrays]
    out, ref = ours(*ts), theirs(*ps)
    np.testing.assert_allclose(out.data, ref.detach().numpy(), rtol=rtol, atol=atol)
    g = np.random.default_rng(upstream_seed).normal(size=out.shape)
    out.backward(g)
    ref.backward(torch.tensor(g))
    for t, p in zip(ts, ps):
        expected = p.grad.numpy() if p.grad is not None else np.zeros(p.shape)
        got = t.grad if t.grad is not None else np.zeros(t.shape)
        np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol)


rng = np.random.default_rng(0)
A = rng.normal(size=(3, 4))
B = rng.normal(size=(4,))
POS = rng.uniform(0.3, 2.0, size=(3, 4))

CASES = {
    "add": (lambda a, b: a + b, lambda a, b: a + b, A, B),
    "sub": (lambda a, b: a - b, lambda a, b: a - b, A, B),
    "mul": (lambda a, b: a * b, lambda a, b: a * b, A, B),
    "div": (lambda a, b: a / b, lambda a, b: a / b, A, POS),
    "pow_number": (lambda a: a ** 3, lambda a: a ** 3, A),
    "pow_tensor": (lambda a, b: a ** b, lambda a, b: a ** b, POS, B),
    "neg": (lambda a: -a, lambda a: -a, A),
    "matmul_2d": (lambda a, b: a @ b, lambda a, b: a @ b, A, rng.normal(size=(4, 5))),
    "matmul_batched": (lambda a, b: a @ b, lambda a, b: a @ b, rng.normal(size=(2, 1, 3, 4)), rng.normal(size=(5, 4, 2))),
    "matmul_vec_vec": (lambda a, b: a @ b, lambda a, b: a @ b, B, rng.normal(size=4)),
    "matmul_mat_vec": (lambda a, b: a @ b, lambda a, b: a @ b, A, B),
    "matmul_vec_batch": (lambda a, b: a @ b, lambda a, b: a @ b, rng.normal(size=3), rng.normal(size=(2, 3, 4))),
    "exp": (lambda a: a.exp(), torch.exp, A),
    "log": (lambda a: a.log(), torch.log, POS),
    "sqrt": (lambda a: a.sqrt(), torch.sqrt, POS),
    "tanh": (lambda a: a.tanh(), torch.tanh, A),
    "relu": (lambda a: a.relu(), torch.relu, A),
    "sigmoid": (lambda a: a.sigmoid(), torch.sigmoid, A * 5),
    "sum_all": (lambda a: a.sum(), lambda a: a.sum(), A),
    "sum_axis": (lambda a: a.sum(axis=0, keepdims=True), lambda a: a.sum(dim=0, keepdim=True), A),
    "mean_axis": (lambda a: a.mean(axis=-1), lambda a: a.mean(dim=-1), A),
    "mean_all": (lambda a: a.mean(), lambda a: a.mean(), A),
    "max_axis": (lambda a: a.max(axis=1), lambda a: a.amax(dim=1), A),
    "max_all": (lambda a: a.max(), lambda a: a.amax(), A),
    "reshape": (lambda a: a.reshape(2, 6), lambda a: a.reshape(2, 6), A),
    "transpose": (lambda a: a.transpose(2, 0, 1), lambda a: a.permute(2, 0, 1), rng.normal(size=(2, 3, 4))),
    "T": (lambda a: a.T, lambda a: a.T, A),
    "getitem_slice": (lambda a: a[1:, ::2], lambda a: a[1:, ::2], A),
    "getitem_int_array": (lambda a: a[np.array([0, 2, 2, 0])], lambda a: a[torch.tensor([0, 2, 2, 0])], A),
    "getitem_pairs": (lambda a: a[np.array([0, 0, 1]), np.array([3, 3, 1])],
                      lambda a: a[torch.tensor([0, 0, 1]), torch.tensor([3, 3, 1])], A),
    "gelu": (F.gelu, lambda a: TF.gelu(a, approximate="tanh"), A * 2),
    "silu": (F.silu, TF.silu, A * 2),
    "softplus": (F.softplus, TF.softplus, A * 2),
    "softmax": (lambda a: F.softmax(a, axis=0), lambda a: torch.softmax(a, dim=0), A),
    "softmax_last": (F.softmax, lambda a: torch.softmax(a, dim=-1), A * 3),
    "log_softmax": (F.log_softmax, lambda a: torch.log_softmax(a, dim=-1), A * 3),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, w, b), lambda x, w, b: TF.layer_norm(x, (4,), w, b, 1e-5),
                   A, rng.normal(size=4), rng.normal(size=4)),
    "linear": (F.linear, TF.linear, rng.normal(size=(2, 3, 4)), rng.normal(size=(5, 4)), rng.normal(size=5)),
    "embedding": (lambda w: F.embedding(np.array([[1, 0], [1, 2]]), w),
                  lambda w: TF.embedding(torch.tensor([[1, 0], [1, 2]]), w), A),
    "masked_fill": (lambda a: F.masked_fill(a, A > 0, -1.0), lambda a: a.masked_fill(torch.tensor(A > 0), -1.0), A),
    "where": (lambda a, b: F.where(A > 0, a, b), lambda a, b: torch.where(torch.tensor(A > 0), a, b), A, B),
    "concatenate": (lambda a, b: F.concatenate([a, b], axis=1), lambda a, b: torch.cat([a, b], dim=1), A, POS[:, :2]),
    "stack": (lambda a, b: F.stack([a, b], axis=1), lambda a, b: torch.stack([a, b], dim=1), A, POS),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_operation_matches_torch(name):
    ours, theirs, *arrays = CASES[name]
    compare(ours, theirs, *arrays)


@pytest.mark.parametrize("ignore_index", [None, 2])
def test_cross_entropy_matches_torch(ignore_index):
    logits = rng.normal(size=(2, 5, 4)) * 3
    targets = np.array([[0, 1, 2, 3, 2], [2, 2, 1, 0, 3]])
    torch_ignore = -100 if ignore_index is None else ignore_index
    compare(lambda x: F.cross_entropy(x, targets, ignore_index=ignore_index),
            lambda x: TF.cross_entropy(x.reshape(-1, 4), torch.tensor(targets.reshape(-1)), ignore_index=torch_ignore),
            logits)


def test_stable_functions_match_torch_on_huge_logits():
    x = np.array([[1e4, -1e4, 0.0, 3.0], [-1e4, -1e4, -1e4, -1e4]])
    compare(F.log_softmax, lambda a: torch.log_softmax(a, -1), x)
    compare(F.softmax, lambda a: torch.softmax(a, -1), x)
    compare(lambda a: F.cross_entropy(a, np.array([1, 2])),
            lambda a: TF.cross_entropy(a, torch.tensor([1, 2])), x)


def test_dropout_statistics_match_torch_semantics():
    # The random masks differ, but both zero a fraction p and scale the rest by 1/(1-p).
    F.manual_seed(0)
    ours = F.dropout(Tensor(np.ones(100_000)), 0.3).data
    torch.manual_seed(0)
    theirs = TF.dropout(torch.ones(100_000, dtype=torch.float64), 0.3).numpy()
    for y in (ours, theirs):
        assert set(np.unique(y).round(6)) == {0.0, round(1 / 0.7, 6)}
        assert abs((y == 0).mean() - 0.3) < 0.01


# ----- modules ---------------------------------------------------------------------------------


def test_linear_module_matches_torch():
    F.manual_seed(0)
    ours = nn.Linear(4, 3)
    ref = torch.nn.Linear(4, 3).double()
    with torch.no_grad():
        ref.weight.copy_(torch.tensor(ours.weight.data))
        ref.bias.copy_(torch.tensor(ours.bias.data))
    x = rng.normal(size=(5, 4)).astype(np.float32)
    y = ours(Tensor(x))
    y_ref = ref(torch.tensor(x, dtype=torch.float64))
    np.testing.assert_allclose(y.data, y_ref.detach().numpy(), rtol=1e-5, atol=1e-6)
    g = rng.normal(size=y.shape)
    y.backward(g)
    y_ref.backward(torch.tensor(g))
    np.testing.assert_allclose(ours.weight.grad, ref.weight.grad.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ours.bias.grad, ref.bias.grad.numpy(), rtol=1e-5, atol=1e-5)
    assert ours.weight.shape == tuple(ref.weight.shape)


def test_layernorm_and_embedding_modules_match_torch():
    ln, ln_ref = nn.LayerNorm(6), torch.nn.LayerNorm(6).double()
    with torch.no_grad():
        ln_ref.weight.copy_(torch.linspace(0.5, 2, 6))
        ln_ref.bias.copy_(torch.linspace(-1, 1, 6))
    ln.load_state_dict({k: v.detach().numpy() for k, v in ln_ref.state_dict().items()})
    x = rng.normal(size=(2, 3, 6))
    y, y_ref = ln(Tensor(x, requires_grad=True)), ln_ref(torch.tensor(x))
    np.testing.assert_allclose(y.data, y_ref.detach().numpy(), rtol=1e-5, atol=1e-6)
    y.sum().backward()
    y_ref.sum().backward()
    np.testing.assert_allclose(ln.weight.grad, ln_ref.weight.grad.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ln.bias.grad, ln_ref.bias.grad.numpy(), rtol=1e-5, atol=1e-5)

    emb, emb_ref = nn.Embedding(7, 3), torch.nn.Embedding(7, 3).double()
    emb.load_state_dict({"weight": emb_ref.weight.detach().numpy()})
    idx = np.array([[0, 6, 6], [2, 0, 1]])
    e, e_ref = emb(idx), emb_ref(torch.tensor(idx))
    np.testing.assert_allclose(e.data, e_ref.detach().numpy(), rtol=1e-6)
    e.sum().backward()
    e_ref.sum().backward()
    np.testing.assert_allclose(emb.weight.grad, emb_ref.weight.grad.numpy())


def test_state_dict_names_match_torch():
    ours = nn.Sequential(nn.Linear(2, 4), nn.ReLU(), nn.LayerNorm(4), nn.Linear(4, 1))
    ref = torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.ReLU(), torch.nn.LayerNorm(4), torch.nn.Linear(4, 1))
    assert list(ours.state_dict()) == list(ref.state_dict())
    ours.load_state_dict({k: v.numpy() for k, v in ref.state_dict().items()})
    x = rng.normal(size=(3, 2)).astype(np.float32)
    np.testing.assert_allclose(ours(Tensor(x)).data, ref(torch.tensor(x)).detach().numpy(), rtol=1e-5, atol=1e-6)


# ----- optimizers: several steps, exactly as torch --------------------------------------------


def step_both(make_ours, make_theirs, steps=6, clip=None, schedule=None):
    """Train the same two parameters with both libraries on the same changing loss; compare after each step."""
    w0 = rng.normal(size=(3, 2))
    b0 = rng.normal(size=2)
    ours = [nn.Parameter(w0.copy()), nn.Parameter(b0.copy())]
    theirs = [torch.tensor(w0.copy(), requires_grad=True), torch.tensor(b0.copy(), requires_grad=True)]
    opt, opt_ref = make_ours(ours), make_theirs(theirs)
    sched = sched_ref = None
    if schedule is not None:
        sched, sched_ref = schedule[0](opt), schedule[1](opt_ref)
    data = np.random.default_rng(1).normal(size=(steps, 4, 3))
    for x in data:
        loss = ((Tensor(x) @ ours[0] + ours[1]).tanh() ** 2).sum()
        opt.zero_grad()
        loss.backward()
        loss_ref = ((torch.tensor(x) @ theirs[0] + theirs[1]).tanh() ** 2).sum()
        opt_ref.zero_grad()
        loss_ref.backward()
        if clip is not None:
            n = optim.clip_grad_norm_(ours, clip)
            n_ref = torch.nn.utils.clip_grad_norm_(theirs, clip)
            assert n == pytest.approx(float(n_ref), rel=1e-10)
        opt.step()
        opt_ref.step()
        if sched is not None:
            sched.step()
            sched_ref.step()
            assert opt.param_groups[0]["lr"] == pytest.approx(opt_ref.param_groups[0]["lr"], rel=1e-12, abs=1e-15)
        for p, q in zip(ours, theirs):
            np.testing.assert_allclose(p.data, q.detach().numpy(), rtol=1e-10, atol=1e-12)


def test_sgd_matches_torch():
    step_both(lambda ps: optim.SGD(ps, lr=0.1), lambda ps: torch.optim.SGD(ps, lr=0.1))


def test_sgd_momentum_weight_decay_matches_torch():
    step_both(lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01),
              lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01))


def test_adam_matches_torch():
    step_both(lambda ps: optim.Adam(ps, lr=0.05, betas=(0.8, 0.95)),
              lambda ps: torch.optim.Adam(ps, lr=0.05, betas=(0.8, 0.95)))


def test_adam_l2_matches_torch():
    step_both(lambda ps: optim.Adam(ps, lr=0.05, weight_decay=0.1),
              lambda ps: torch.optim.Adam(ps, lr=0.05, weight_decay=0.1))


def test_adamw_matches_torch():
    step_both(lambda ps: optim.AdamW(ps, lr=0.05, weight_decay=0.1),
              lambda ps: torch.optim.AdamW(ps, lr=0.05, weight_decay=0.1))


def test_clip_grad_norm_matches_torch():
    step_both(lambda ps: optim.SGD(ps, lr=0.1, momentum=0.5), lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.5),
              clip=0.5)


def test_warmup_cosine_matches_a_torch_lambda_lr():
    def hand(step, warmup=3, total=8):  # the formula written out again, independently
        if step < warmup:
            return (step + 1) / warmup
        if step >= total:
            return 0.0
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / (total - warmup)))

    step_both(lambda ps: optim.AdamW(ps, lr=0.05), lambda ps: torch.optim.AdamW(ps, lr=0.05), steps=10,
              schedule=(lambda o: optim.WarmupCosine(o, warmup_steps=3, total_steps=8),
                        lambda o: torch.optim.lr_scheduler.LambdaLR(o, hand)))
