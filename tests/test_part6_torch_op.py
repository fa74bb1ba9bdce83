"""The course's softmax kernel as a PyTorch operator: opcheck, gradients, a model, bad input, CUDA."""

import subprocess
import sys

import numpy as np
import pytest

import course.kernels as K  # first: it chooses the GPU or the simulator before numba.cuda loads
from course.kernels import torch_op

torch = pytest.importorskip("torch", reason="PyTorch is not installed (optional `reference` extra)")

pytestmark = [pytest.mark.part6, pytest.mark.reference]

needs_gpu = pytest.mark.skipif(not torch_op.cuda_ready(),
                               reason="no GPU that both PyTorch and numba use (CUDA tensors need one)")


def _inputs(device="cpu", dtype=None):
    g = torch.Generator().manual_seed(0)
    dtype = dtype or torch.float32
    shapes = [(3, 7), (2, 3, 5), (1, 300), (4, 1), (0, 5), (6,)]
    return [(torch.randn(shape, generator=g, dtype=dtype) * 3).to(device) for shape in shapes]


def test_operators_are_registered_under_course():
    softmax_op, backward_op = torch_op.operators()
    assert torch.ops.course.softmax.default._name == "course::softmax"
    assert torch.ops.course.softmax_backward.default._name == "course::softmax_backward"
    assert torch_op.operators() == (softmax_op, backward_op)  # registered once, however often asked


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_opcheck_cpu(dtype):
    softmax_op, backward_op = torch_op.operators()
    for x in _inputs(dtype=dtype):
        torch.library.opcheck(softmax_op, (x.requires_grad_(),))
        s = torch.softmax(x.detach(), dim=-1)
        torch.library.opcheck(backward_op, (s, torch.randn_like(s)))


def test_values_and_gradients_equal_torch_softmax():
    for x in _inputs():
        w = torch.randn_like(x)  # weights so that the gradient is not zero
        ours = x.clone().requires_grad_()
        theirs = x.clone().requires_grad_()
        y_ours, y_theirs = torch_op.softmax(ours), torch.softmax(theirs, dim=-1)
        (y_ours * w).sum().backward()
        (y_theirs * w).sum().backward()
        torch.testing.assert_close(y_ours, y_theirs, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-4, atol=1e-6)


def test_gradcheck_float64():
    x = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(torch_op.softmax, (x,))


def test_cpu_path_does_not_copy_the_input(monkeypatch):
    seen = []
    real = K.cpu.softmax

    def spy(rows):
        seen.append(rows)
        return real(rows)

    monkeypatch.setattr(K.cpu, "softmax", spy)
    x = torch.randn(4, 8)
    torch_op.softmax(x)
    assert np.shares_memory(seen[0], x.numpy()), "the kernel should read the tensor's own memory"


def test_masked_rows_and_non_contiguous_input():
    x = torch.randn(5, 5)
    x = x.masked_fill(torch.triu(torch.ones(5, 5, dtype=torch.bool), 1), float("-inf")).t()  # transposed view
    torch.testing.assert_close(torch_op.softmax(x), torch.softmax(x, dim=-1))


def test_launches_are_counted():
    K.reset_launches()
    x = torch.randn(3, 4, requires_grad=True)
    torch_op.softmax(x).sum().backward()
    assert K.launches() == {"cpu.softmax": 1, "cpu.softmax_backward": 1}


class TinyAttention(torch.nn.Module):
    """Causal self-attention, one head, whose softmax is given."""

    def __init__(self, width, softmax):
        super().__init__()
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.proj = torch.nn.Linear(width, width)
        self.softmax = softmax

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
        t = x.shape[1]
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        return self.proj(self.softmax(scores.masked_fill(causal, float("-inf"))) @ v)


def _model_outputs_and_gradients(device):
    torch.manual_seed(0)
    ours = TinyAttention(16, torch_op.softmax).to(device)
    theirs = TinyAttention(16, lambda s: torch.softmax(s, dim=-1)).to(device)
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(2, 8, 16, device=device)
    results = []
    for model in (ours, theirs):
        y = model(x)
        (y ** 2).mean().backward()
        results.append((y.detach(), {n: p.grad for n, p in model.named_parameters()}))
    return results


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_gpu)])
def test_model_with_our_softmax_equals_torch(device):
    (y_ours, g_ours), (y_theirs, g_theirs) = _model_outputs_and_gradients(device)
    torch.testing.assert_close(y_ours, y_theirs, rtol=1e-5, atol=1e-6)
    for name in g_theirs:
        torch.testing.assert_close(g_ours[name], g_theirs[name], rtol=1e-4, atol=1e-6, msg=name)


def test_bad_input_is_refused_with_a_clear_message():
    with pytest.raises(TypeError, match="float32 or float64"):
        torch_op.softmax(torch.zeros(2, 3, dtype=torch.float16))
    with pytest.raises(TypeError, match="float32 or float64"):
        torch_op.softmax(torch.zeros(2, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match="0-d"):
        torch_op.softmax(torch.tensor(1.0))
    with pytest.raises(ValueError, match="must match"):
        torch_op.softmax_backward(torch.zeros(2, 3), torch.zeros(3, 2))


def test_fake_gives_the_shape_without_running():
    x = torch.empty(4, 9, device="meta")
    K.reset_launches()
    y = torch_op.softmax(x)
    assert y.shape == (4, 9) and y.device.type == "meta" and K.launches() == {}


@needs_gpu
def test_opcheck_cuda():
    softmax_op, backward_op = torch_op.operators()
    for x in _inputs("cuda"):
        torch.library.opcheck(softmax_op, (x.requires_grad_(),))
        s = torch.softmax(x.detach(), dim=-1)
        torch.library.opcheck(backward_op, (s, torch.randn_like(s)))


@needs_gpu
def test_cuda_values_gradients_and_no_copies():
    for x in _inputs("cuda"):
        ours, theirs = x.clone().requires_grad_(), x.clone().requires_grad_()
        w = torch.randn_like(x)
        K.reset_launches()
        y = torch_op.softmax(ours)
        (y * w).sum().backward()
        (torch.softmax(theirs, dim=-1) * w).sum().backward()
        assert y.device.type == "cuda"
        torch.testing.assert_close(y, torch.softmax(x, dim=-1), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-4, atol=1e-6)
        if x.numel():
            assert K.launches() == {"softmax_kernel": 1, "softmax_backward_kernel": 1}


@needs_gpu
def test_cuda_refuses_float64():
    with pytest.raises(TypeError, match="float32"):
        torch_op.softmax(torch.zeros(2, 3, dtype=torch.float64, device="cuda"))


@needs_gpu
def test_cuda_runs_on_torch_current_stream():
    stream = torch.cuda.Stream()
    x = torch.randn(64, 1000, device="cuda")
    with torch.cuda.stream(stream):
        big = x * 2  # queued on `stream`; our kernel must run after it
        y = torch_op.softmax(big)
    stream.synchronize()
    torch.testing.assert_close(y, torch.softmax(x * 2, dim=-1))


def test_importing_the_module_does_not_import_torch():
    code = "import sys, course.kernels.torch_op as t; assert t.HAS_TORCH; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_without_torch_asking_for_the_operators_says_what_to_install(monkeypatch):
    monkeypatch.setattr(torch_op, "HAS_TORCH", False)
    with pytest.raises(ImportError, match="pip install torch"):
        torch_op.operators.__wrapped__()
