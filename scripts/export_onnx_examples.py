"""Export the small PyTorch model that lesson 3.4 imports into minitf.

    pip install torch onnx onnxscript          # onnxruntime too, to check the file
    python scripts/export_onnx_examples.py     # a few seconds; writes into course/data/

The model is minGPT's pre-LayerNorm transformer block (causal self-attention with 2 heads, then
an MLP with GELU, each behind a LayerNorm and a residual connection), 16 wide, on sequences of 8
positions, with the weights PyTorch initialises after torch.manual_seed(0). It is exported by
`torch.onnx.export(..., dynamo=True)`, the torch.export-based exporter that is PyTorch's default
(it needs the onnxscript package), with fixed shapes: a batch of 2 sequences of 8 vectors.

Written:
- course/data/pre_ln_block.onnx: the model (about 15 kB);
- course/data/pre_ln_block.npz: an input `x` (2, 8, 16), seeded, and `y`, PyTorch's output for it,
  so that the course can check its runtime against PyTorch where PyTorch is not installed.
"""

import argparse
import math
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

OUT = Path(__file__).resolve().parent.parent / "course" / "data"
N_EMBD, N_HEAD, BLOCK_SIZE, BATCH = 16, 2, 8, 2


class CausalSelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_attn = nn.Linear(N_EMBD, 3 * N_EMBD)
        self.c_proj = nn.Linear(N_EMBD, N_EMBD)
        mask = torch.tril(torch.ones(BLOCK_SIZE, BLOCK_SIZE)).view(1, 1, BLOCK_SIZE, BLOCK_SIZE)
        self.register_buffer("bias", mask)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, N_HEAD, C // N_HEAD).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(N_EMBD)
        self.attn = CausalSelfAttention()
        self.ln_2 = nn.LayerNorm(N_EMBD)
        self.mlp = nn.Sequential(nn.Linear(N_EMBD, 4 * N_EMBD), nn.GELU(), nn.Linear(4 * N_EMBD, N_EMBD))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT, help="folder to write into (default: course/data)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    torch.manual_seed(0)
    block = Block().eval()
    with torch.no_grad():  # LayerNorm starts at weight 1, bias 0: give it weights worth importing
        for ln in (block.ln_1, block.ln_2):
            ln.weight.add_(0.1 * torch.randn_like(ln.weight))
            ln.bias.add_(0.1 * torch.randn_like(ln.bias))
    x = torch.randn(BATCH, BLOCK_SIZE, N_EMBD, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        y = block(x)

    model_path = args.out / "pre_ln_block.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(block, (x,), dynamo=True, input_names=["x"], output_names=["y"], verbose=False)
    program.save(str(model_path))
    np.savez(args.out / "pre_ln_block.npz", x=x.numpy(), y=y.numpy())

    import onnx

    model = onnx.load(str(model_path))
    ops = sorted({n.op_type for n in model.graph.node})
    print(f"wrote {model_path} ({model_path.stat().st_size:,} bytes, torch {torch.__version__}, "
          f"opset {model.opset_import[0].version}): {len(model.graph.node)} nodes, operators {', '.join(ops)}")
    try:
        import onnxruntime
    except ImportError:
        print("onnxruntime is not installed: the file was not checked against it")
        return
    got = onnxruntime.InferenceSession(str(model_path)).run(None, {"x": x.numpy()})[0]
    err = float(np.abs(got - y.numpy()).max())
    print(f"onnxruntime {onnxruntime.__version__} gives PyTorch's output within {err:.1e}")
    assert err < 1e-5


if __name__ == "__main__":
    main()
