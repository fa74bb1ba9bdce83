"""Training on a generated task (lesson 5.4): the selective-copying batches, the Trainer's batch_fn,
and the checkpoints that scripts/train_selective_copy.py ships."""

import numpy as np
import pytest

from course.data import SelectiveCopying, masked_accuracy, selective_copying
from course.mamba import CHECKPOINTS, Mamba, MambaConfig
from course.tensor import no_grad
from course.train import Trainer, TrainerConfig, estimate_loss, load_checkpoint

pytestmark = pytest.mark.part5


def test_selective_copying_batches():
    x, y = selective_copying(50, np.random.default_rng(0), length=20, n_data=5, n_symbols=6)
    assert x.shape == y.shape == (50, 25) and x.dtype == y.dtype == np.int64
    np.testing.assert_array_equal(x[:, 20:], 1)  # the markers
    np.testing.assert_array_equal(y[:, :20], -1)  # nothing to predict before them
    for row, target in zip(x, y):
        data = row[:20][row[:20] != 0]
        assert len(data) == 5 and data.min() >= 2 and data.max() <= 7
        np.testing.assert_array_equal(target[20:], data)  # the data tokens, in order of position
    again, _ = selective_copying(50, np.random.default_rng(0), length=20, n_data=5, n_symbols=6)
    np.testing.assert_array_equal(x, again)
    positions = np.argwhere(x[:, :20] != 0)[:, 1]
    assert len(np.unique(positions)) == 20  # the data tokens are spread over every position
    with pytest.raises(ValueError, match="n_data must be between 1 and length=4"):
        selective_copying(2, np.random.default_rng(0), length=4, n_data=5)


def test_selective_copying_task_object_and_accuracy():
    task = SelectiveCopying(length=6, n_data=2, n_symbols=3)
    assert (task.vocab_size, task.seq_len) == (5, 8)
    x = np.array([0, 3, 0, 0, 4, 0, 1, 1])
    assert task.render(x) == ". 1 . . 2 . | ? ?"
    assert task.render(x, answer=[3, 2]) == ". 1 . . 2 . | 1 0"
    xs, ys = task(4, np.random.default_rng(1))
    perfect = np.eye(8)[np.where(ys >= 0, ys, 0)]  # one-hot logits of the targets
    assert masked_accuracy(perfect, ys) == 1.0
    wrong = perfect.copy()
    wrong[:, -1] = np.roll(wrong[:, -1], 1, axis=-1)  # the last answer of every row off by one
    assert masked_accuracy(wrong, ys) == 0.5
    padded = perfect.copy()
    padded[..., 7] = 10.0  # a padding id would win, but only the first vocab_size ids count
    assert masked_accuracy(padded, ys, vocab_size=task.vocab_size) == 1.0
    with pytest.raises(ValueError, match="need targets of shape"):
        masked_accuracy(perfect, ys[:, :3])
    for vocab_size in (0, 9):  # no logit to choose from; more ids than logits
        with pytest.raises(ValueError, match=f"vocab_size must be between 1 and the 8 logits.*got {vocab_size}"):
            masked_accuracy(perfect, ys, vocab_size=vocab_size)


def test_trainer_with_a_batch_function_is_deterministic_and_learns():
    task = SelectiveCopying(length=8, n_data=2, n_symbols=3)
    config = TrainerConfig(max_iters=30, batch_size=16, learning_rate=1e-2, warmup_iters=5, eval_interval=15,
                           eval_iters=2, progress=False)
    histories = []
    for _ in range(2):
        model = Mamba(MambaConfig(d_model=16, n_layer=1, vocab_size=task.vocab_size, d_state=4))
        trainer = Trainer(model, config=config, batch_fn=task)
        histories.append(trainer.run())
    a, b = histories
    assert a["loss"] == b["loss"] and a["val_loss"] == b["val_loss"]
    assert a["val_step"] == [15, 30]
    assert np.mean(a["loss"][-5:]) < np.mean(a["loss"][:5]) - 0.2
    assert estimate_loss(model, None, 16, 2, batch_fn=task) == pytest.approx(b["val_loss"][-1])
    with pytest.raises(ValueError, match="give train_data .* or batch_fn"):
        Trainer(model, config=config)


CHECKPOINT_FILES = sorted(CHECKPOINTS.glob("*.npz"))


def test_the_shipped_checkpoints_exist():
    assert {p.name for p in CHECKPOINT_FILES} >= {"selective_copy_mamba.npz", "selective_copy_gpt.npz",
                                                  "selective_copy_mamba_lti.npz"}


@pytest.mark.parametrize("path", CHECKPOINT_FILES, ids=lambda p: p.name)
def test_shipped_checkpoints_load_small_and_solve_the_task(path):
    assert path.stat().st_size < 1_000_000
    model, meta = load_checkpoint(path)
    task = SelectiveCopying(**meta["task"])
    curve = meta["curve"]
    assert len(curve["step"]) == len(curve["loss"]) == len(curve["accuracy"]) >= 5
    assert meta["parameters"] == model.num_parameters()
    x, y = task(256, np.random.default_rng(meta["eval_seed"]))
    with no_grad():
        out = model(x)
    logits = out[0] if isinstance(out, tuple) else out
    accuracy = masked_accuracy(logits.data, y, task.vocab_size)
    assert accuracy == pytest.approx(curve["accuracy"][-1], abs=1e-6)  # the stored curve is this model's
    if getattr(model.config, "selective", True):
        assert accuracy > 0.9
    else:  # lesson 5.4's ablation: without selection the same Mamba stays far from solving it
        assert 0.125 < accuracy < 0.8
