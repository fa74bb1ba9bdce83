"""The course's GPT against an independent PyTorch GPT of minGPT's architecture, weights loaded by name."""

import numpy as np
import pytest

import course.tensor.functional as F
from course.gpt import GPT, GPTConfig
from course.tensor import Tensor

torch = pytest.importorskip("torch", reason="PyTorch is not installed (optional `reference` extra)")
TF = torch.nn.functional

pytestmark = [pytest.mark.part4, pytest.mark.reference]

from benchmarks.reference_gpt import torch_gpt  # noqa: E402  (the same reference the benchmark times)


CONFIG = GPTConfig(vocab_size=13, block_size=8, n_layer=2, n_head=4, n_embd=16)


def paired_models(dtype):
    ours = GPT(CONFIG, seed=0)
    rng = np.random.default_rng(1)
    for p in ours.parameters():  # move biases and LayerNorms off their initial values too
        p.data = (p.data + rng.normal(0, 0.05, p.shape)).astype(np.float32)
    ref = torch_gpt(torch, CONFIG)
    state = ours.state_dict()
    assert sorted(state) == sorted(ref.state_dict())  # the same names, both ways
    ref.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
    if dtype == np.float64:
        ours.astype(np.float64)
        ref.double()
    return ours, ref


@pytest.mark.parametrize("dtype,tol", [(np.float32, 2e-4), (np.float64, 1e-10)])
def test_logits_loss_and_gradients_equal_pytorch(dtype, tol):
    ours, ref = paired_models(dtype)
    rng = np.random.default_rng(2)
    idx = rng.integers(0, CONFIG.vocab_size, (3, 8))
    targets = rng.integers(0, CONFIG.vocab_size, (3, 8))
    targets[1, :3] = -1
    logits, loss = ours(idx, targets)
    loss.backward()
    t_logits, t_loss = ref(torch.from_numpy(idx), torch.from_numpy(targets))
    t_loss.backward()
    np.testing.assert_allclose(logits.data, t_logits.detach().numpy(), rtol=tol, atol=tol)
    np.testing.assert_allclose(float(loss.data), t_loss.item(), rtol=tol, atol=tol)
    t_params = dict(ref.named_parameters())
    for name, p in ours.named_parameters():
        np.testing.assert_allclose(p.grad, t_params[name].grad.numpy(), rtol=10 * tol, atol=10 * tol,
                                   err_msg=name)


def test_attention_op_equals_pytorch():
    rng = np.random.default_rng(3)
    q, k, v = (rng.normal(size=(2, 3, 6, 4)) for _ in range(3))
    g = rng.normal(size=(2, 3, 6, 4))
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    expected = TF.scaled_dot_product_attention(tq, tk, tv, is_causal=True)
    (expected * torch.from_numpy(g)).sum().backward()
    ours = [Tensor(a, requires_grad=True) for a in (q, k, v)]
    out = F.scaled_dot_product_attention(*ours, causal=True)
    out.backward(g)
    np.testing.assert_allclose(out.data, expected.detach().numpy(), atol=1e-12)
    for mine, theirs in zip(ours, (tq, tk, tv)):
        np.testing.assert_allclose(mine.grad, theirs.grad.numpy(), atol=1e-12)
