"""minGPT's GPT written in PyTorch, independently of the course's: the reference that the
benchmark times and that tests/test_part4_reference.py compares with. Same parameter names as
course.gpt, so a state dict loads by name both ways. PyTorch is imported by the caller."""

import math


def torch_gpt(torch, c):
    """A PyTorch GPT for the config `c` (a course.gpt.GPTConfig); forward(idx, targets) -> (logits, loss)."""
    nn, TF = torch.nn, torch.nn.functional

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn = nn.Linear(c.n_embd, 3 * c.n_embd)
            self.c_proj = nn.Linear(c.n_embd, c.n_embd)

        def forward(self, x):
            B, T, C = x.shape
            q, k, v = (t.reshape(B, T, c.n_head, C // c.n_head).transpose(1, 2) for t in self.c_attn(x).split(C, 2))
            scores = q @ k.transpose(-2, -1) / math.sqrt(C // c.n_head)
            future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
            att = scores.masked_fill(future, float("-inf")).softmax(dim=-1)
            return self.c_proj((att @ v).transpose(1, 2).reshape(B, T, C))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(c.n_embd), Attention(), nn.LayerNorm(c.n_embd)
            self.mlp = nn.ModuleDict(dict(c_fc=nn.Linear(c.n_embd, 4 * c.n_embd),
                                          c_proj=nn.Linear(4 * c.n_embd, c.n_embd)))

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp.c_proj(TF.gelu(self.mlp.c_fc(self.ln_2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.transformer = nn.ModuleDict(dict(
                wte=nn.Embedding(c.vocab_size, c.n_embd), wpe=nn.Embedding(c.block_size, c.n_embd),
                h=nn.ModuleList([Block() for _ in range(c.n_layer)]), ln_f=nn.LayerNorm(c.n_embd)))
            self.lm_head = nn.Linear(c.n_embd, c.vocab_size, bias=False)

        def forward(self, idx, targets):
            t = self.transformer
            x = t.wte(idx) + t.wpe(torch.arange(idx.shape[1], device=idx.device))
            for block in t.h:
                x = block(x)
            logits = self.lm_head(t.ln_f(x))
            loss = TF.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-1)
            return logits, loss

    return GPT()
