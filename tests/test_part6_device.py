"""Tensors on the "cuda" device (a GPU, or Numba's simulator): every operation equals the CPU path,
views copy nothing, errors name what is wrong, and only the batch and the loss cross."""

import numpy as np
import pytest

import course.kernels as K
import course.tensor.functional as F
from course import nn
from course.gpt import GPT, GPTConfig
from course.kernels.device import CudaArray, to_device
from course.mamba import Mamba, MambaConfig
from course.mamba import ops as mamba_ops
from course.mamba import selective_scan
from course.optim import SGD, Adam, AdamW, clip_grad_norm_
from course.tensor import Tensor

pytestmark = pytest.mark.part6

RNG = np.random.default_rng(0)


def arr(*shape, dtype=np.float32, positive=False):
    a = RNG.normal(size=shape)
    return (np.abs(a) + 0.1 if positive else a).astype(dtype)


def close(a, b, tol=2e-5):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    scale = max(1.0, float(np.abs(b).max())) if b.size else 1.0
    assert np.abs(a - b).max(initial=0) <= tol * scale, np.abs(a - b).max(initial=0)


# ----- the array: views, arithmetic, reductions, against NumPy -----------------------------------------------------
def test_views_copy_nothing_and_read_right():
    host = arr(2, 3, 4)
    d = to_device(host)
    K.reset_launches()
    views = {"T": (d.T, host.T), "transpose": (d.transpose(1, 0, 2), host.transpose(1, 0, 2)),
             "slice": (d[1:, ::2, -1], host[1:, ::2, -1]), "reshape": (d.reshape(6, 4), host.reshape(6, 4)),
             "broadcast": (d[:, :1].broadcast_to((2, 5, 4)), np.broadcast_to(host[:, :1], (2, 5, 4))),
             "newaxis": (d[None, ..., 2], host[None, ..., 2]), "swap": (np.swapaxes(d, 0, 2), np.swapaxes(host, 0, 2))}
    assert K.launches() == {}  # views are layouts, not copies
    for name, (view, expected) in views.items():
        assert view.shape == expected.shape, name
        close(view.get(), expected)


@pytest.mark.parametrize("shapes", [((3, 4), (4,)), ((3, 1), (1, 4)), ((2, 3, 4), (3, 1)), ((5,), ()), ((2, 1, 3, 1), (4, 1, 1))])
def test_broadcasting_arithmetic_equals_numpy(shapes):
    a, b = arr(*shapes[0]), arr(*shapes[1], positive=True)
    da, db = to_device(a), to_device(b)
    for got, want in [(da + db, a + b), (da - db, a - b), (da * db, a * b), (da / db, a / b), (da ** 2, a ** 2),
                      (np.maximum(da, db), np.maximum(a, b)), (np.exp(da), np.exp(a)), (np.tanh(da), np.tanh(a)),
                      (np.log(db), np.log(b)), (np.sqrt(db), np.sqrt(b)), (da > db, a > b), (-da, -a),
                      (np.where(da > 0, da, db), np.where(a > 0, a, b)), (np.logaddexp(0, da), np.logaddexp(0, a)),
                      (da.T * 0.5, a.T * 0.5)]:
        assert got.dtype == want.dtype, (got.dtype, want.dtype)
        close(got.get(), want)


def test_transposed_operands_and_in_place_updates():
    a, b = arr(4, 3), arr(3, 4)
    da, db = to_device(a), to_device(b)
    close((da.T + db).get(), a.T + b)
    da_t = da.T
    da_t += 1  # writes through the view into da's buffer
    close(da.get(), a + 1)
    da[1:3, ::2] = 7.0
    a = a + 1
    a[1:3, ::2] = 7.0
    close(da.get(), a)


@pytest.mark.parametrize("axis", [None, 0, 1, -1, (0, 2), (1, 2)])
@pytest.mark.parametrize("keepdims", [False, True])
def test_reductions_equal_numpy(axis, keepdims):
    a = arr(3, 5, 70)  # a long last axis takes the one-block-per-row kernel
    d = to_device(a)
    for name in ("sum", "max", "min", "mean"):
        got, want = getattr(d, name)(axis=axis, keepdims=keepdims), getattr(a, name)(axis=axis, keepdims=keepdims)
        close(got.get(), want, 1e-5)


def test_long_rows_use_one_block_per_row():
    a = arr(2, 5000)
    close(to_device(a).sum(axis=1).get(), a.sum(axis=1), 1e-5)
    close(to_device(a).max(axis=1).get(), a.max(axis=1))


@pytest.mark.parametrize("sa,sb", [((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((2, 3, 4), (2, 4, 5)), ((1, 3, 4), (2, 4, 5)),
                                   ((4,), (4, 5)), ((3, 4), (4,)), ((2, 3, 0), (0, 2))])
def test_matmul_equals_numpy(sa, sb):
    a, b = arr(*sa), arr(*sb)
    close((to_device(a) @ to_device(b)).get(), a @ b, 1e-5)
    if len(sa) == len(sb) == 2:  # operands given as transposed views
        close((to_device(a.T.copy()).T @ to_device(b.T.copy()).T).get(), a @ b, 1e-5)


def test_on_a_gpu_the_device_matmul_runs_lesson_6_3s_register_kernel(monkeypatch):
    """On a GPU, float32 products go to `matmul_into`'s register-blocked kernel, not the simple
    grid-stride one (which the simulator runs, and which took 9 in 10 of a GPU step's time).
    Here the choice is made as on a GPU, and the kernel runs on the tracer."""
    from course.kernels import primitives

    monkeypatch.setattr(primitives, "backend", lambda: "gpu")
    a, b = arr(2, 20, 13), arr(2, 13, 18)
    K.reset_launches()
    close((to_device(a) @ to_device(b)).get(), a @ b, 1e-5)
    assert K.launches() == {"matmul_register_kernel": 1}
    K.reset_launches()
    to_device(a.astype(np.float64)) @ to_device(b.astype(np.float64))  # other dtypes: the simple kernel
    assert K.launches() == {"batched_matmul_kernel": 1}


def test_gather_and_scatter_add_with_repeated_rows():
    table, idx = arr(6, 3), np.array([[1, 4, 1], [0, 1, 5]])
    d = to_device(table)
    close(d[to_device(idx)].get(), table[idx])
    close(d[idx].get(), table[idx])  # indices from the host are copied in
    grad, want = np.zeros_like(d), np.zeros_like(table)
    values = arr(6, 3)
    np.add.at(grad, to_device(idx.reshape(-1)), to_device(values))
    np.add.at(want, idx.reshape(-1), values)
    close(grad.get(), want)  # row 1 gets three additions: atomics


def test_joining_and_splitting():
    a, b = arr(2, 3), arr(2, 4)
    close(np.concatenate([to_device(a), to_device(b)], axis=1).get(), np.concatenate([a, b], axis=1))
    close(np.stack([to_device(a), to_device(a * 2)], axis=1).get(), np.stack([a, a * 2], axis=1))
    parts = np.split(to_device(b), [1, 3], axis=1)
    for got, want in zip(parts, np.split(b, [1, 3], axis=1)):
        close(got.get(), want)
    close(np.einsum("...i,...i->...", to_device(a), to_device(a)).get(), np.einsum("...i,...i->...", a, a))


def test_types_follow_numpy():
    d = to_device(arr(3))
    assert (d * 0.5).dtype == np.float32 and (d * 2).dtype == np.float32
    ids = to_device(np.array([1, 2, 3]))
    assert (ids == 2).dtype == np.bool_ and ids.sum().dtype == np.int64
    assert (ids * 1.5).dtype == np.float64
    assert d.astype(np.float64).dtype == np.float64


# ----- what must not happen silently ---------------------------------------------------------------------------------
def test_nothing_reads_device_numbers_without_asking():
    d = to_device(arr(3))
    with pytest.raises(TypeError, match="lives on the GPU"):
        np.asarray(d)
    with pytest.raises(TypeError, match=r"\.item\(\)"):
        bool(d.sum() > 0)
    with pytest.raises(TypeError, match=r"\.item\(\)"):
        float(d.sum())
    with pytest.raises(TypeError, match="np.fft.fft is not implemented for arrays on the GPU|np.fft"):
        np.fft.fft(d)


def test_two_devices_in_one_operation_is_an_error_naming_both():
    x, w = Tensor(arr(2, 3)), Tensor(arr(4, 3)).to("cuda")
    for call, op in [(lambda: x.to("cuda") + Tensor(arr(2, 3)), r"\+"), (lambda: F.linear(x, w), "linear"),
                     (lambda: x.to("cuda") @ Tensor(arr(3, 2)), "@"), (lambda: F.softmax(x) * w[:2], r"\*")]:
        with pytest.raises(RuntimeError, match=rf"{op}.*cpu and cuda"):
            call()
    # A 0-d tensor on the CPU is a number, as in PyTorch.
    close((x.to("cuda") * Tensor(np.float32(2))).numpy(), x.data * 2)


def test_unknown_device_is_named():
    with pytest.raises(ValueError, match="unknown device 'gpu'.*'cpu', 'cuda'"):
        Tensor([1.0]).to("gpu")
    with pytest.raises(ValueError, match="unknown device"):
        nn.Linear(2, 2).to("tpu")


# ----- tensors: moving, and gradients that flow back ------------------------------------------------------------------------
def test_to_and_back_counts_every_copy():
    K.reset_transfers()
    x = Tensor(arr(4, 5), requires_grad=True)
    y = x.to("cuda")
    assert y.device == "cuda" and x.device == "cpu" and isinstance(y.data, CudaArray)
    assert y.to("cuda") is y
    loss = (y * y).sum()
    assert K.transfers() == {"to_device": {"count": 1, "bytes": 80}, "to_host": {"count": 0, "bytes": 0}}
    assert loss.item() == pytest.approx(float((x.data.astype(np.float64) ** 2).sum()), rel=1e-5)
    assert K.transfers()["to_host"] == {"count": 1, "bytes": 4}
    loss.backward()  # the gradient of the copy goes back to the host tensor
    close(x.grad, 2 * x.data)
    assert isinstance(x.grad, np.ndarray)


def test_module_to_moves_parameters_and_gradients_in_place():
    m = nn.Sequential(nn.Linear(3, 4, rng=0), nn.GELU(), nn.Linear(4, 2, rng=1))
    before = m.state_dict()
    m.to("cuda")
    assert m.device == "cuda" and all(p.device == "cuda" for p in m.parameters())
    state = m.state_dict()  # copied back for saving
    assert all(isinstance(v, np.ndarray) for v in state.values())
    for k in before:
        close(state[k], before[k], 0)
    m.load_state_dict({k: v * 2 for k, v in before.items()})
    assert m.device == "cuda"
    close(m.state_dict()["0.weight"], before["0.weight"] * 2, 0)
    m.to("cpu")
    assert all(isinstance(p.data, np.ndarray) for p in m.parameters())


# ----- every operation of GPT and Mamba: values and gradients equal the CPU path ----------------------------------------------
def compare(f, *arrays, tol=2e-5, seed=1):
    g_rng = np.random.default_rng(seed)
    cpu_in = [Tensor(a, requires_grad=True) for a in arrays]
    out = f(*cpu_in)
    g = g_rng.normal(size=out.shape).astype(out.dtype)
    out.backward(g)
    dev_in = [Tensor(a, requires_grad=True) for a in arrays]
    out_d = f(*[t.to("cuda") for t in dev_in])
    assert out_d.device == "cuda"
    out_d.backward(Tensor(g).to("cuda"))
    close(out_d.numpy(), out.data, tol)
    for a, b in zip(cpu_in, dev_in):
        close(b.grad, a.grad, tol)


OPS = {
    "broadcast arithmetic": (lambda a, b: (a * b + a / (b * b + 1) - b) ** 2, (arr(2, 3, 4), arr(3, 1))),
    "unary": (lambda a: a.exp().tanh() + a.relu() + a.sigmoid() + (a * a + 1).log() + (a * a + 1).sqrt(), (arr(3, 4),)),
    "reductions": (lambda a: a.sum(axis=0) + a.mean(axis=0) + a.max(axis=0) * 0.5, (arr(5, 4),)),
    "all-reduce": (lambda a: a.sum() * a.mean() + a.max(), (arr(3, 4),)),
    "reshape, transpose, index": (lambda a: a.reshape(4, 6).T[1:5, ::2] * a.transpose(2, 0, 1).reshape(4, 6)[0, :3].sum(),
                                  (arr(2, 3, 4),)),
    "integer index": (lambda a: a[np.array([0, 2, 2, 1])] * 2, (arr(3, 5),)),
    "matmul": (lambda a, b: a @ b, (arr(2, 3, 4), arr(4, 5))),
    "batched matmul": (lambda a, b: a @ b, (arr(2, 3, 4), arr(2, 4, 5))),
    "linear": (lambda x, w, b: F.linear(x, w, b), (arr(2, 3, 4), arr(5, 4), arr(5))),
    "linear_gelu": (lambda x, w, b: F.linear_gelu(x, w, b), (arr(2, 3, 4), arr(5, 4), arr(5))),
    "softmax": (lambda a: F.softmax(a) * 3, (arr(2, 3, 7),)),
    "softmax axis 0": (lambda a: F.softmax(a, axis=0), (arr(4, 3),)),
    "log_softmax": (lambda a: F.log_softmax(a), (arr(3, 6),)),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, w, b), (arr(2, 3, 8), arr(8), arr(8))),
    "add_layer_norm": (lambda x, y, w, b: F.add_layer_norm(x, y, w, b)[1] * 2 + F.add_layer_norm(x, y, w, b)[0],
                       (arr(2, 3, 8), arr(2, 3, 8), arr(8), arr(8))),
    "activations": (lambda a: F.gelu(a) + F.silu(a) + F.softplus(a), (arr(3, 5),)),
    "attention causal": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, causal=True),
                         (arr(2, 2, 5, 4), arr(2, 2, 5, 4), arr(2, 2, 5, 4))),
    "attention, fewer queries": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, causal=True),
                                 (arr(2, 3, 4), arr(2, 6, 4), arr(2, 6, 3))),
    "attention": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, causal=False),
                  (arr(3, 4), arr(5, 4), arr(5, 2))),
    "cross_entropy": (lambda a: F.cross_entropy(a, np.array([[1, 0, -1], [3, 3, 2]]), ignore_index=-1), (arr(2, 3, 4),)),
    "cross_entropy float64": (lambda a: F.cross_entropy(a, np.array([2, 0, 1])), (arr(3, 4, dtype=np.float64),)),
    "embedding": (lambda w: F.embedding(np.array([[1, 3, 1], [0, 1, 4]]), w), (arr(5, 3),)),
    "where, concatenate, stack": (lambda a, b: F.concatenate([a, b], axis=1).sum(axis=1) + F.stack([a, b]).sum(axis=0).sum(axis=1)
                                  + F.where(a.data > 0, a, b).sum(axis=1) + F.masked_fill(b, a.data > 0, 0.5).sum(axis=1),
                                  (arr(3, 2), arr(3, 2))),
    "rms_norm": (lambda x, w: mamba_ops.rms_norm(x, w), (arr(2, 3, 6), arr(6))),
    "causal_conv1d": (lambda x, w, b: mamba_ops.causal_conv1d(x, w, b), (arr(2, 5, 3), arr(3, 1, 4), arr(3))),
    "selective_scan": (lambda u, dt, A, B, C, D: selective_scan(u, dt, A, B, C, D),
                       (arr(2, 5, 3), arr(2, 5, 3, positive=True), -arr(3, 4, positive=True), arr(2, 5, 4),
                        arr(2, 5, 4), arr(3))),
}


@pytest.mark.parametrize("name", list(OPS))
def test_operation_on_the_device_equals_the_cpu(name):
    f, arrays = OPS[name]
    compare(f, *arrays)


def test_float64_on_the_device_equals_the_cpu_closely():
    """The primitive kernels take any dtype; kernels written for float32 hand float64 to the
    array operations, so a float64 model still runs on the device."""
    compare(lambda x, w, b: F.layer_norm(F.linear(x, w), b, None) * F.softmax(x @ w.T), arr(2, 3, 4, dtype=np.float64),
            arr(4, 4, dtype=np.float64), arr(4, dtype=np.float64), tol=1e-12)


def test_dropout_on_the_device_masks_forward_and_backward_alike():
    F.manual_seed(0)
    x = Tensor(np.ones((50, 40), np.float32), requires_grad=True)
    y = F.dropout(x.to("cuda"), 0.25)
    y.sum().backward()
    kept = y.numpy()
    assert set(np.unique(kept)) <= {0.0, np.float32(1 / 0.75)}
    assert 0.7 < (kept > 0).mean() < 0.8
    close(x.grad, kept)  # the gradient passes exactly where the forward kept


def test_token_ids_out_of_range_are_caught_without_reading_the_device():
    w = Tensor(arr(5, 3), requires_grad=True).to("cuda")
    with pytest.raises(IndexError, match="index 7 is out of bounds.*5"):
        F.embedding(np.array([1, 7]), w)
    ids = Tensor(np.array([[1, 9]])).to("cuda")  # the range is noted as the ids cross
    with pytest.raises(IndexError, match="9"):
        F.embedding(ids, w)
    with pytest.raises(ValueError, match="target 4 is out of range for 4 classes"):
        F.cross_entropy(Tensor(arr(2, 4)).to("cuda"), np.array([1, 4]))


# ----- optimizers on the device ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("make", [lambda ps: SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01),
                                  lambda ps: Adam(ps, lr=0.01, weight_decay=0.1),
                                  lambda ps: AdamW(ps, lr=0.01, weight_decay=0.1)])
def test_optimizers_update_on_the_device_as_on_the_cpu(make):
    def run(device):
        m = nn.Linear(4, 3, rng=0).to(device)
        opt = make(m.parameters())
        for step in range(3):
            x = Tensor(np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4) * (step + 1)).to(device)
            opt.zero_grad()
            (m(x) ** 2).sum().backward()
            norm = clip_grad_norm_(m.parameters(), 0.5)
            opt.step()
        return m.state_dict(), norm

    (cpu_state, cpu_norm), (dev_state, dev_norm) = run("cpu"), run("cuda")
    for k in cpu_state:
        close(dev_state[k], cpu_state[k], 1e-5)
    assert dev_norm.device == "cuda" and dev_norm.item() == pytest.approx(cpu_norm, rel=1e-5)


# ----- whole models: a training step copies the batch in and the loss out, nothing else ---------------------------------------
def gpt_step(model, opt, x, y):
    opt.zero_grad()
    _, loss = model(x, y)
    loss.backward()
    clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss.item()


def test_gpt_trains_on_the_device_with_only_the_batch_and_the_loss_crossing():
    config = GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8, dropout=0.0)
    rng = np.random.default_rng(0)
    batches = [(rng.integers(0, 11, (2, 5)), rng.integers(0, 11, (2, 5))) for _ in range(2)]
    cpu, dev = GPT(config, seed=1), GPT(config, seed=1).to("cuda")
    cpu_opt, dev_opt = AdamW(cpu.parameters(), lr=1e-2), AdamW(dev.parameters(), lr=1e-2)
    for x, y in batches:
        want = gpt_step(cpu, cpu_opt, x, y)
        K.reset_transfers()
        got = gpt_step(dev, dev_opt, x, y)
        assert K.transfers() == {"to_device": {"count": 2, "bytes": x.nbytes + y.nbytes},
                                 "to_host": {"count": 1, "bytes": 4}}
        assert got == pytest.approx(want, rel=1e-5)
    for (name, p), (_, q) in zip(cpu.named_parameters(), dev.named_parameters()):
        close(q.numpy(), p.data, 1e-5)


def test_mamba_trains_on_the_device_with_only_the_batch_and_the_loss_crossing():
    config = MambaConfig(d_model=8, n_layer=1, vocab_size=11, d_state=4, expand=2, d_conv=3)
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 11, (2, 5)), rng.integers(0, 11, (2, 5))
    cpu, dev = Mamba(config, seed=1), Mamba(config, seed=1).to("cuda")
    loss = F.cross_entropy(cpu(x), y)
    loss.backward()
    K.reset_transfers()
    loss_d = F.cross_entropy(dev(x), y)
    loss_d.backward()
    AdamW(dev.parameters(), lr=1e-2).step()
    assert loss_d.item() == pytest.approx(loss.item(), rel=1e-5)
    assert K.transfers() == {"to_device": {"count": 2, "bytes": x.nbytes + y.nbytes},
                             "to_host": {"count": 1, "bytes": 4}}
    for (name, p), (_, q) in zip(cpu.named_parameters(), dev.named_parameters()):
        close(q.grad.get(), p.grad, 1e-5)


def test_use_kernels_still_serves_tensors_on_the_cpu_and_leaves_device_ones_to_their_device():
    x, w = arr(2, 3, 4), arr(5, 4)
    with K.use_kernels("cpu"):
        out = F.linear(Tensor(x), Tensor(w))
        out_d = F.linear(Tensor(x).to("cuda"), Tensor(w).to("cuda"))
    assert isinstance(out.data, np.ndarray) and out_d.device == "cuda"
    close(out_d.numpy(), out.data, 1e-5)
