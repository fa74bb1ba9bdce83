"""Part 4: minGPT on the course's own tensor engine.

GPT-2's released files (lesson 4.5): `GPT.from_pretrained(folder or "gpt2")`, `gpt.save_pretrained(folder)`
and `BPETokenizer.from_pretrained(...)`, in `pretrained` and `tokenizer`.
"""

from .model import GPT, MLP, Block, CausalSelfAttention, GPTConfig, KVCache, sample_next, top_k_filter
from .tokenizer import BPETokenizer, CharTokenizer
from .trainer import CHECKPOINTS, Trainer, TrainerConfig, estimate_loss, get_batch, load_checkpoint, param_groups, save_checkpoint

__all__ = ["CharTokenizer", "BPETokenizer",
           "GPTConfig", "GPT", "CausalSelfAttention", "Block", "MLP", "KVCache", "sample_next", "top_k_filter",
           "Trainer", "TrainerConfig", "CHECKPOINTS", "get_batch", "param_groups", "estimate_loss", "save_checkpoint",
           "load_checkpoint"]
