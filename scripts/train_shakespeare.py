"""Train the character-level Shakespeare GPT that lesson 4.4 loads, and save it into the package.

    python scripts/train_shakespeare.py                 # about 8 minutes on one CPU core
    python scripts/train_shakespeare.py --iters 200     # a quick try (does not overwrite unless --out)

It writes course/gpt/checkpoints/shakespeare_char.npz: the parameters by name, the model config,
the vocabulary (the characters, in id order), the training settings and the final losses.
Everything is seeded: the same machine gives the same checkpoint.
"""

import argparse
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from course.data import load_shakespeare
from course.gpt import GPT, CharTokenizer, GPTConfig, Trainer, TrainerConfig, estimate_loss, save_checkpoint

ITERS = 2000
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "course" / "gpt" / "checkpoints" / "shakespeare_char.npz"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iters", type=int, default=ITERS)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or (DEFAULT_OUT if args.iters == ITERS else Path("shakespeare_char_try.npz"))

    text = load_shakespeare()
    tok = CharTokenizer(text)
    ids = np.array(tok.encode(text), dtype=np.int64)
    split = int(0.9 * len(ids))  # the last 10% of the text is held out for validation
    train_ids, val_ids = ids[:split], ids[split:]

    # 4 layers, 4 heads, 128 channels: about 0.8M parameters, a 3 MB checkpoint.
    config = GPTConfig(vocab_size=tok.vocab_size, block_size=128, n_layer=4, n_head=4, n_embd=128, dropout=0.0)
    model = GPT(config, seed=0)
    tconf = TrainerConfig(max_iters=args.iters, batch_size=16, learning_rate=2e-3, betas=(0.9, 0.95),
                          weight_decay=0.1, grad_clip=1.0, warmup_iters=100, min_lr_ratio=0.1,
                          eval_interval=250, eval_iters=20, seed=0)
    print(f"{model.num_parameters():,} parameters; {len(train_ids):,} training and {len(val_ids):,} "
          f"validation characters; vocabulary of {tok.vocab_size}")
    trainer = Trainer(model, train_ids, val_ids, tconf)
    start = time.perf_counter()
    while trainer.step < args.iters:  # in chunks, to report as it goes
        history = trainer.run(min(tconf.eval_interval, args.iters - trainer.step))
        print(f"  step {trainer.step:5d}: train loss {history['loss'][-1]:.3f}, validation loss "
              f"{history['val_loss'][-1]:.3f} ({time.perf_counter() - start:.0f} s)", flush=True)
    seconds = time.perf_counter() - start
    val = estimate_loss(model, val_ids, 32, 50)
    train = estimate_loss(model, train_ids, 32, 50)
    print(f"trained {args.iters} steps in {seconds:.0f} s: train loss {train:.3f}, validation loss {val:.3f}")

    out.parent.mkdir(parents=True, exist_ok=True)
    save_checkpoint(out, model, vocab="".join(tok.itos[i] for i in range(tok.vocab_size)),
                    trainer=asdict(tconf), train_loss=round(train, 4), val_loss=round(val, 4),
                    train_seconds=round(seconds), steps=args.iters)
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB)")
    sample = model.generate(np.array([tok.encode("\n")]), 300, temperature=0.8, top_k=20, seed=0)
    print(tok.decode(sample[0].tolist()))


if __name__ == "__main__":
    main()
