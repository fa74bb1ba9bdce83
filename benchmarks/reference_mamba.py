"""A Mamba language model in PyTorch, written the way mamba-minimal writes it, independently of the
course's: the reference that benchmarks/bench_mamba.py times and tests/test_part5_reference.py
compares with. Same parameter names as course.mamba (lm_head.weight tied to embedding.weight),
so a state dict loads by name both ways. The selective scan is mamba-minimal's loop over time in
Python. PyTorch is imported by the caller."""


def torch_mamba(torch, c):
    """A PyTorch Mamba for the config `c` (a course.mamba.MambaConfig); forward(input_ids) -> logits."""
    nn, TF = torch.nn, torch.nn.functional
    d_in, n, r = c.d_inner, c.d_state, c.dt_rank

    class RMSNorm(nn.Module):
        def __init__(self, d, eps=1e-5):
            super().__init__()
            self.eps = eps
            self.weight = nn.Parameter(torch.ones(d))

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight

    class MambaBlock(nn.Module):
        def __init__(self):
            super().__init__()
            self.in_proj = nn.Linear(c.d_model, 2 * d_in, bias=False)
            self.conv1d = nn.Conv1d(d_in, d_in, kernel_size=c.d_conv, groups=d_in, padding=c.d_conv - 1, bias=True)
            self.x_proj = nn.Linear(d_in, r + 2 * n, bias=False)
            self.dt_proj = nn.Linear(r, d_in, bias=True)
            self.A_log = nn.Parameter(torch.log(torch.arange(1, n + 1, dtype=torch.float32).repeat(d_in, 1)))
            self.D = nn.Parameter(torch.ones(d_in))
            self.out_proj = nn.Linear(d_in, c.d_model, bias=False)

        def forward(self, x):
            L = x.shape[1]
            x, res = self.in_proj(x).transpose(1, 2).split([d_in, d_in], dim=1)  # (b, d_in, l) each
            x = TF.silu(self.conv1d(x)[:, :, :L])
            y = self.ssm(x) * TF.silu(res)
            return self.out_proj(y.transpose(1, 2))

        def ssm(self, x):  # x (b, d_in, l)
            A = -torch.exp(self.A_log)
            delta, B, C = self.x_proj(x.transpose(1, 2)).split([r, n, n], dim=-1)
            delta = TF.softplus(self.dt_proj(delta))  # (b, l, d_in)
            return self.selective_scan(x, delta, A, B, C, self.D)

        @staticmethod
        def selective_scan(u, delta, A, B, C, D):  # u (b, d_in, l), as in mamba-minimal
            b, _, L = u.shape
            deltaA = torch.exp(torch.einsum("bld,dn->bdln", delta, A))
            deltaB_u = torch.einsum("bld,bln,bdl->bdln", delta, B, u)
            h = torch.zeros((b, d_in, n), dtype=u.dtype)
            ys = []
            for i in range(L):
                h = deltaA[:, :, i] * h + deltaB_u[:, :, i]
                ys.append(torch.einsum("bdn,bn->bd", h, C[:, i, :]))
            return torch.stack(ys, dim=2) + u * D[:, None]

    class ResidualBlock(nn.Module):
        def __init__(self):
            super().__init__()
            self.mixer = MambaBlock()
            self.norm = RMSNorm(c.d_model)

        def forward(self, x):
            return self.mixer(self.norm(x)) + x

    class Mamba(nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = nn.Embedding(c.padded_vocab_size, c.d_model)
            self.layers = nn.ModuleList([ResidualBlock() for _ in range(c.n_layer)])
            self.norm_f = RMSNorm(c.d_model)
            self.lm_head = nn.Linear(c.d_model, c.padded_vocab_size, bias=False)
            self.lm_head.weight = self.embedding.weight  # tied

        def forward(self, input_ids):
            x = self.embedding(input_ids)
            for layer in self.layers:
                x = layer(x)
            return self.lm_head(self.norm_f(x))

    return Mamba()
