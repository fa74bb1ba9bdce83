"""Training a GPT (lesson 4.4): the shared trainer of `course.train`, and where GPT checkpoints live.

    trainer = Trainer(model, train_ids, val_ids, TrainerConfig(max_iters=2000, learning_rate=1e-3))
    history = trainer.run()
    save_checkpoint("model.npz", model, vocab=tokenizer.itos)
    model, meta = load_checkpoint("model.npz")
"""

from pathlib import Path

from ..train import (Trainer, TrainerConfig, estimate_loss, get_batch, language_model_loss, load_checkpoint,
                     param_groups, save_checkpoint)

# Checkpoints shipped inside the package (made by the scripts in scripts/).
CHECKPOINTS = Path(__file__).resolve().parent / "checkpoints"

__all__ = ["CHECKPOINTS", "TrainerConfig", "Trainer", "get_batch", "param_groups", "language_model_loss",
           "save_checkpoint", "load_checkpoint", "estimate_loss"]
