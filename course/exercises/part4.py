"""Checks of part 4: tokenizers and attention (lessons 4.1, 4.2), the model and its training (4.3, 4.4), GPT-2 (4.5)."""

from . import part4_model, part4_pretrained, part4_tokens  # noqa: F401  (importing them registers their checks)
