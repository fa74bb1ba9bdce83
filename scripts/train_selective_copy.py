"""Train a small Mamba, the same Mamba without selection, and a GPT of about the same size on
selective copying, for lesson 5.4.

    python scripts/train_selective_copy.py                # a few minutes on a 2-core CPU, one BLAS thread
    python scripts/train_selective_copy.py --iters 100    # a quick try (writes into the current folder)

The task (course.data.SelectiveCopying(length=32, n_data=4, n_symbols=8)): 32 positions of blanks
with 4 data tokens (8 possible symbols) at random positions, then 4 marker tokens; at the i-th
marker the model must give the i-th data token. Vocabulary: 0 blank, 1 marker, 2..9 the symbols
(Mamba pads its tables to 16 rows). Only the 4 answers count in the loss (the other targets are -1).

The models, both trained by course.train.Trainer on the same batches (32 examples per step, AdamW,
learning rate LEARNING_RATE with warm-up and cosine decay, no weight decay, clipping at 1):
- Mamba: MambaConfig(d_model=48, n_layer=2, vocab_size=10), d_state 16, expand 2, d_conv 4.
- GPT:   GPTConfig(vocab_size=10, block_size=36, n_layer=2, n_head=4, n_embd=40): about as many
         parameters (each checkpoint's meta says how many).
- Mamba without selection (the Mamba paper's ablation, its Table 1): the same config with
  selective=False, so delta, B and C are learned parameters, the same at every position
  (time-invariant) instead of computed from each token. It has no x_proj and no dt_proj weight,
  so fewer parameters.

What is stored, for each model, in course/mamba/checkpoints/selective_copy_{mamba,gpt,mamba_lti}.npz
(written by course.train.save_checkpoint, read with load_checkpoint(path) -> (model, meta)):
the parameters and config, and in meta:
- "task": the task's sizes, SelectiveCopying(**meta["task"]) rebuilds it;
- "eval_seed": the seed of the 256 evaluation examples, task(256, np.random.default_rng(eval_seed));
- "curve": {"step", "loss", "accuracy"}: every EVAL_EVERY steps (and at step 0), the mean training
  loss of the steps since the last point (at step 0: the loss on the evaluation set) and the
  fraction of answers right on the evaluation examples;
- "loss": the training loss of every step; "trainer": the TrainerConfig; "parameters": the
  parameter count; "seconds": the training time on the machine that made it (machine-dependent).
Everything is seeded: the same machine gives the same checkpoints.
"""

import argparse
import os
import time
from dataclasses import asdict
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one BLAS thread: the runs do not depend on the core count
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

import course.tensor.functional as F  # noqa: E402
from course.data import SelectiveCopying, masked_accuracy  # noqa: E402
from course.gpt import GPT, GPTConfig  # noqa: E402
from course.mamba import Mamba, MambaConfig  # noqa: E402
from course.tensor import no_grad  # noqa: E402
from course.train import Trainer, TrainerConfig, save_checkpoint  # noqa: E402

ITERS = 1500
EVAL_EVERY = 100
EVAL_SEED = 1234
LEARNING_RATE = 3e-3
TASK = dict(length=32, n_data=4, n_symbols=8)
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "course" / "mamba" / "checkpoints"


def build(name, task):
    if name in ("mamba", "mamba_lti"):
        config = MambaConfig(d_model=48, n_layer=2, vocab_size=task.vocab_size, selective=name == "mamba")
        return Mamba(config, seed=0)
    return GPT(GPTConfig(vocab_size=task.vocab_size, block_size=task.seq_len, n_layer=2, n_head=4, n_embd=40), seed=0)


def evaluate(model, x, y, vocab_size):
    """(loss, accuracy) on the evaluation examples."""
    was_training = model.training
    model.eval()
    with no_grad():
        out = model(x)
    model.train(was_training)
    logits = out[0] if isinstance(out, tuple) else out
    loss = float(F.cross_entropy(logits, y, ignore_index=-1).data)
    return loss, masked_accuracy(logits.data, y, vocab_size)


def train(name, task, iters, out_dir):
    model = build(name, task)
    config = TrainerConfig(max_iters=iters, batch_size=32, learning_rate=LEARNING_RATE, weight_decay=0.0,
                           warmup_iters=50, eval_interval=0, seed=0, progress=False)
    trainer = Trainer(model, config=config, batch_fn=task)
    x_eval, y_eval = task(256, np.random.default_rng(EVAL_SEED))
    loss, accuracy = evaluate(model, x_eval, y_eval, task.vocab_size)
    curve = {"step": [0], "loss": [round(loss, 4)], "accuracy": [accuracy]}
    print(f"{name}: {model.num_parameters():,} parameters; step 0: accuracy {accuracy:.3f}")
    start = time.perf_counter()
    while trainer.step < iters:
        history = trainer.run(min(EVAL_EVERY, iters - trainer.step))
        loss = float(np.mean(history["loss"][curve["step"][-1]:]))
        _, accuracy = evaluate(model, x_eval, y_eval, task.vocab_size)
        for key, value in zip(("step", "loss", "accuracy"), (trainer.step, round(loss, 4), accuracy)):
            curve[key].append(value)
        print(f"  step {trainer.step:5d}: train loss {loss:.3f}, accuracy {accuracy:.3f} "
              f"({time.perf_counter() - start:.0f} s)", flush=True)
    seconds = time.perf_counter() - start
    path = out_dir / f"selective_copy_{name}.npz"
    path.parent.mkdir(parents=True, exist_ok=True)
    save_checkpoint(path, model, task=TASK, eval_seed=EVAL_SEED, curve=curve,
                    loss=[round(v, 4) for v in trainer.history["loss"]], trainer=asdict(config),
                    parameters=model.num_parameters(), seconds=round(seconds))
    print(f"wrote {path} ({path.stat().st_size / 1e3:.0f} kB) after {seconds:.0f} s")
    row = x_eval[0]
    with no_grad():
        out = model(row[None])
    logits = (out[0] if isinstance(out, tuple) else out).data[0, task.length:, :task.vocab_size]
    print(f"  {task.render(row)}  ->  {task.render(row, logits.argmax(-1))}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iters", type=int, default=ITERS)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--models", nargs="+", default=["mamba", "gpt", "mamba_lti"],
                        choices=["mamba", "gpt", "mamba_lti"])
    args = parser.parse_args()
    out_dir = args.out or (DEFAULT_OUT if args.iters == ITERS else Path("."))
    task = SelectiveCopying(**TASK)
    for name in args.models:
        train(name, task, args.iters, out_dir)


if __name__ == "__main__":
    main()
