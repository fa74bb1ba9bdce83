"""The course's Mamba against an independent PyTorch Mamba written as mamba-minimal writes it,
weights loaded by name."""

import numpy as np
import pytest

import course.tensor.functional as F
from course.mamba import METHODS, Mamba, MambaConfig, causal_conv1d, rms_norm, selective_scan
from course.tensor import Tensor

torch = pytest.importorskip("torch", reason="PyTorch is not installed (optional `reference` extra)")
TF = torch.nn.functional

pytestmark = [pytest.mark.part5, pytest.mark.reference]

from benchmarks.reference_mamba import torch_mamba  # noqa: E402  (the same reference the benchmark times)

CONFIG = MambaConfig(d_model=16, n_layer=2, vocab_size=13, d_state=4, d_conv=3)


def paired_models():
    ours = Mamba(CONFIG, seed=0)
    rng = np.random.default_rng(1)
    for p in ours.parameters():  # move norms, D and biases off their initial values too
        p.data = (p.data + rng.normal(0, 0.05, p.shape)).astype(np.float32)
    ref = torch_mamba(torch, CONFIG)
    state = ours.state_dict()
    assert sorted(state) == sorted(ref.state_dict())  # the same names, both ways (lm_head.weight included)
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in ref.named_parameters()]
    ref.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
    ours.astype(np.float64)
    ref.double()
    return ours, ref


@pytest.mark.parametrize("method", METHODS)
def test_logits_and_every_gradient_equal_pytorch(method):
    ours, ref = paired_models()
    ours.scan_method = method
    rng = np.random.default_rng(2)
    idx = rng.integers(0, CONFIG.vocab_size, (3, 10))
    targets = rng.integers(0, CONFIG.vocab_size, (3, 10))
    targets[1, :4] = -1
    logits = ours(idx)
    F.cross_entropy(logits, targets, ignore_index=-1).backward()
    t_logits = ref(torch.from_numpy(idx))
    TF.cross_entropy(t_logits.reshape(-1, t_logits.shape[-1]), torch.from_numpy(targets).reshape(-1),
                     ignore_index=-1).backward()
    expected = t_logits.detach().numpy()
    assert logits.shape == expected.shape == (3, 10, CONFIG.padded_vocab_size)
    np.testing.assert_allclose(logits.data, expected, rtol=1e-9, atol=1e-12)
    t_params = dict(ref.named_parameters())
    assert sorted(t_params) == sorted(n for n, _ in ours.named_parameters())
    for name, p in ours.named_parameters():
        theirs = t_params[name].grad.numpy()
        scale = np.abs(theirs).max()
        assert scale > 0, name
        np.testing.assert_allclose(p.grad, theirs, rtol=1e-9, atol=1e-9 * scale, err_msg=name)


def test_float32_model_close_to_pytorch():
    ours, ref = paired_models()
    ours.astype(np.float32)
    ref.float()
    idx = np.random.default_rng(3).integers(0, CONFIG.vocab_size, (2, 12))
    np.testing.assert_allclose(ours(idx).data, ref(torch.from_numpy(idx)).detach().numpy(), rtol=1e-4, atol=1e-5)


def test_operations_equal_pytorch():
    rng = np.random.default_rng(4)
    b, l, d, k = 2, 7, 5, 4
    x, w, bias = rng.normal(size=(b, l, d)), rng.normal(size=(d, 1, k)), rng.normal(size=d)
    g = rng.normal(size=(b, l, d))
    tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (x, w, bias))
    expected = TF.conv1d(tx.transpose(1, 2), tw, tb, padding=k - 1, groups=d)[:, :, :l].transpose(1, 2)
    (expected * torch.from_numpy(g)).sum().backward()
    ours = [Tensor(a, requires_grad=True) for a in (x, w, bias)]
    out = causal_conv1d(*ours)
    out.backward(g)
    np.testing.assert_allclose(out.data, expected.detach().numpy(), atol=1e-12)
    for mine, theirs in zip(ours, (tx, tw, tb)):
        np.testing.assert_allclose(mine.grad, theirs.grad.numpy(), atol=1e-12)

    weight = rng.normal(size=d)
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(weight, requires_grad=True)
    expected = TF.rms_norm(tx, (d,), tw, eps=1e-5)
    (expected * torch.from_numpy(g)).sum().backward()
    ours = [Tensor(x, requires_grad=True), Tensor(weight, requires_grad=True)]
    out = rms_norm(*ours)
    out.backward(g)
    np.testing.assert_allclose(out.data, expected.detach().numpy(), atol=1e-12)
    for mine, theirs in zip(ours, (tx, tw)):
        np.testing.assert_allclose(mine.grad, theirs.grad.numpy(), atol=1e-12)


def test_scan_equals_mamba_minimal_loop_in_pytorch():
    ref = torch_mamba(torch, CONFIG)
    block = ref.layers[0].mixer
    rng = np.random.default_rng(5)
    b, l, d, n = 2, 9, CONFIG.d_inner, CONFIG.d_state
    arrays = [rng.normal(size=(b, l, d)), rng.uniform(0.01, 0.5, (b, l, d)), -rng.uniform(0.5, 3, (d, n)),
              rng.normal(size=(b, l, n)), rng.normal(size=(b, l, n)), rng.normal(size=d)]
    g = rng.normal(size=(b, l, d))
    t = [torch.tensor(a, requires_grad=True) for a in arrays]
    expected = block.selective_scan(t[0].transpose(1, 2), t[1], t[2], t[3], t[4], t[5]).transpose(1, 2)
    (expected * torch.from_numpy(g)).sum().backward()
    for method in METHODS:
        ours = [Tensor(a, requires_grad=True) for a in arrays]
        out = selective_scan(*ours, method=method)
        out.backward(g)
        np.testing.assert_allclose(out.data, expected.detach().numpy(), rtol=1e-10, atol=1e-12, err_msg=method)
        for name, mine, theirs in zip("u delta A B C D".split(), ours, t):
            np.testing.assert_allclose(mine.grad, theirs.grad.numpy(), rtol=1e-9, atol=1e-11,
                                       err_msg=f"{method}: {name}")
