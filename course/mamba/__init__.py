"""Part 5: a minimal Mamba on the course's own tensor engine.

    from course.mamba import Mamba, MambaConfig, selective_scan

- `scan`:  `selective_scan(u, delta, A, B, C, D, method=...)`, one autograd operation with three
           methods ("sequential", "parallel", "fast"), and the associative `combine` behind "parallel".
- `ops`:   `rms_norm` and `causal_conv1d`, the block's other operations.
- `model`: `MambaConfig`, `Mamba` (forward, step, generate), its block and residual block.
- `pretrained`: released checkpoints, `Mamba.from_pretrained(folder or hub name)` and
           `save_pretrained(folder)`, in Hugging Face's layout or mamba_ssm's original one (lesson 5.5).

Checkpoints made by scripts/train_selective_copy.py live in `CHECKPOINTS`.
"""

from pathlib import Path

from .model import CausalConv1d, Mamba, MambaBlock, MambaConfig, MambaState, ResidualBlock, RMSNorm
from .ops import causal_conv1d, rms_norm
from .scan import METHODS, combine, linear_recurrence, selective_scan

# Checkpoints shipped inside the package (made by the scripts in scripts/).
CHECKPOINTS = Path(__file__).resolve().parent / "checkpoints"

__all__ = ["MambaConfig", "Mamba", "MambaBlock", "ResidualBlock", "RMSNorm", "CausalConv1d", "MambaState",
           "selective_scan", "METHODS", "combine", "linear_recurrence", "rms_norm", "causal_conv1d", "CHECKPOINTS"]
