"""Generation at GPT-2 124M's size with the KV cache: tokens per second, the course against PyTorch.

The model has GPT-2 small's shape (12 layers, 12 heads, 768 channels, 1024 positions, a
vocabulary of 50257, lm_head tied to the token embedding) with random weights, so nothing is
downloaded; the speed of a forward pass does not depend on what the weights are. The course's
GPT generates greedily from a 16-token prompt with its KV cache. Where PyTorch and transformers
are installed, the same weights go through GPT.save_pretrained into transformers'
GPT2LMHeadModel, which generates the same number of tokens greedily with its own cache on the
CPU, with as many threads as NumPy's BLAS uses. Each engine is timed in its own block (the other
one idle), best of a few runs.

    python -m benchmarks gpt2
"""

import tempfile
import time

import numpy as np

from course.gpt import GPT, GPTConfig

CONFIG = GPTConfig(vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768, tie_word_embeddings=True)
PROMPT, NEW_TOKENS, REPEAT = 16, 32, 3


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def bench_generation(config=CONFIG, prompt_len=PROMPT, new_tokens=NEW_TOKENS, repeat=REPEAT):
    from .bench_gpt import numpy_threads

    model = GPT(config, seed=0).eval()
    prompt = np.random.default_rng(0).integers(0, config.vocab_size, (1, prompt_len))
    run = lambda: model.generate(prompt, new_tokens, do_sample=False, use_cache=True)  # noqa: E731
    run()  # warm up (first touches of the weights, BLAS's threads)
    course_s, ours = min((_timed(run) for _ in range(repeat)), key=lambda t: t[0])
    name = f"GPT-2 124M generate {new_tokens} tokens (KV cache)"
    row = {"name": name, "course_s": course_s, "note": f"course {new_tokens / course_s:.1f} tokens/s"}
    try:
        import torch
        import transformers
    except ImportError:
        row["note"] += "; PyTorch/transformers not installed: no reference"
        return row

    threads = numpy_threads()
    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        del model  # one model in memory at a time
        ref = transformers.GPT2LMHeadModel.from_pretrained(folder).eval()
    tprompt = torch.from_numpy(prompt)

    def torch_run():
        with torch.no_grad():
            return ref.generate(tprompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                                use_cache=True, attention_mask=torch.ones_like(tprompt),
                                pad_token_id=config.vocab_size - 1).numpy()

    torch_run()
    ref_s, theirs = min((_timed(torch_run) for _ in range(repeat)), key=lambda t: t[0])
    differ = np.flatnonzero(ours[0] != theirs[0])
    same = (int(differ[0]) if len(differ) else ours.shape[1]) - prompt_len  # tokens equal before the first difference
    row.update(reference=f"transformers {transformers.__version__} CPU", reference_s=ref_s, ratio=course_s / ref_s,
               note=f"tokens/s: course {new_tokens / course_s:.1f}, PyTorch {new_tokens / ref_s:.1f}; "
                    f"{threads} threads each; first {same}/{new_tokens} tokens equal (random weights: near-ties)")
    return row


def run():
    return [bench_generation()]


if __name__ == "__main__":
    for row in run():
        print(row)
