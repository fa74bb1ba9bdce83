"""Tensors that live on the GPU: a GPT training step on "cuda" against PyTorch's on the same GPU,
and against the NumPy path on the CPU; the selective scan with its arrays on the device.

The course's step is the CPU benchmark's (benchmarks/bench_gpt.py: forward, cross-entropy,
backward, AdamW) with `model.to("cuda")`: the batch goes in as NumPy arrays and the loss comes out
with `.item()`, which also waits for the GPU. PyTorch runs the same weights eagerly on the same
GPU, in float32 with TF32 off (TF32 would round the matrix products' inputs to 10 bits).
Every row is skipped where there is no GPU: the simulator is no measure of speed.

    python -m benchmarks gpu
"""

import numpy as np

from .bench_gpt import BATCH, torch_training, train_torch
from .bench_kernels import _gpu, scan_inputs
from .harness import Row, Skip


def _shape(layers, width, heads, batch, length):
    from course.gpt import GPTConfig

    return GPTConfig(vocab_size=65, block_size=length, n_layer=layers, n_head=heads, n_embd=width), batch


SHAPES = {"bench": (4, 128, 4, BATCH, 64), "large": (8, 512, 8, 8, 256)}


def _data(config, batch):
    rng = np.random.default_rng(0)
    x = rng.integers(0, config.vocab_size, (batch, config.block_size))
    y = rng.integers(0, config.vocab_size, (batch, config.block_size))
    return x, y


def _course_step(shape, device):
    _gpu()  # rows about the GPU: all skipped together where there is none
    from course import optim
    from course.gpt import GPT, param_groups

    config, batch = _shape(*SHAPES[shape])
    x, y = _data(config, batch)
    model = GPT(config, seed=0).to(device)
    opt = optim.AdamW(param_groups(model, 0.1), lr=1e-3)

    def step():
        _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()  # on the GPU: the one copy out, which also waits for the GPU

    return step


def course_device_step(threads, shape="bench"):
    return _course_step(shape, "cuda")


def course_cpu_step(threads, shape="bench"):
    step = _course_step(shape, "cpu")
    step.label = "NumPy path, CPU"
    return step


def torch_cuda_step(threads, shape="bench"):
    _gpu()
    try:
        import torch
    except ImportError:
        raise Skip("PyTorch is not installed") from None
    if not torch.cuda.is_available():
        raise Skip("PyTorch was built without CUDA")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    config, batch = _shape(*SHAPES[shape])
    x, y = _data(config, batch)
    ref, opt = torch_training(torch, config, "cuda")

    def step():
        return train_torch(ref, opt, torch.from_numpy(x).cuda(), torch.from_numpy(y).cuda())

    step.label = f"PyTorch {torch.__version__.split('+')[0]} CUDA eager, {torch.cuda.get_device_name()}"
    return step


def scan_on_device(threads):
    _gpu()
    from course.mamba import selective_scan
    from course.tensor import Tensor

    inputs = [Tensor(a).to("cuda") for a in scan_inputs()]

    def step():
        return selective_scan(*inputs).sum().item()

    return step


def scan_on_cpu(threads):
    _gpu()
    import course.kernels as K

    inputs = scan_inputs()
    return lambda: float(K.cpu.selective_scan(*inputs).sum())


_BENCH = "GPT training step (4 layers, 4 heads, 128 wide; 32 x 64 tokens; AdamW)"
_LARGE = "GPT training step (8 layers, 8 heads, 512 wide; 8 x 256 tokens; AdamW)"
ROWS = [
    Row("gpu-gpt", f"{_BENCH} on the GPU, `model.to(\"cuda\")`", "course_device_step", "torch_cuda_step",
        reference_label="PyTorch CUDA", steps=10, warmup=2, same=1e-3, note="target <= 3"),
    Row("gpu-gpt-large", f"{_LARGE} on the GPU", "course_device_step", "torch_cuda_step",
        reference_label="PyTorch CUDA", steps=5, warmup=2, same=1e-3, extra={"shape": "large"}, note="target <= 3"),
    Row("gpu-gpt-vs-cpu", f"{_BENCH}: on the GPU against the NumPy path on the CPU", "course_device_step",
        "course_cpu_step", reference_label="NumPy, CPU", steps=5, warmup=2, same=1e-3),
    Row("gpu-scan-device", "Selective scan (b=8, l=1024, d=256, n=16), forward, arrays on the device, against the "
        "CPU kernel", "scan_on_device", "scan_on_cpu", reference_label="CPU kernel", steps=5, warmup=1, same=1e-3),
]
