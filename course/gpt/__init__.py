"""Part 4: minGPT on the course's own tensor engine."""

from .tokenizer import BPETokenizer, CharTokenizer

__all__ = ["CharTokenizer", "BPETokenizer"]
