"""Checks of lessons 4.3 (the model) and 4.4 (training and sampling)."""

import math

import numpy as np

from ._core import CheckFailed, call, exercise, expect, expect_close


def _as_int(got, on):
    try:
        return int(got)
    except (TypeError, ValueError):
        raise CheckFailed(f"expected a whole number, got {got!r} on {on}") from None


def _what(got):
    n = f" of length {len(got)}" if isinstance(got, (tuple, list)) else ""
    return f"{type(got).__name__}{n}"


# ---- 4.3 the model ---------------------------------------------------------------------------


def _ref_count(vocab_size, block_size, n_layer, n_embd):
    C = n_embd
    per_block = (2 * C  # ln_1
                 + 3 * C * C + 3 * C  # attn.c_attn
                 + C * C + C  # attn.c_proj
                 + 2 * C  # ln_2
                 + 4 * C * C + 4 * C  # mlp.c_fc
                 + 4 * C * C + C)  # mlp.c_proj
    return vocab_size * C + block_size * C + n_layer * per_block + 2 * C + C * vocab_size


@exercise("4.3.1", hint="count every weight matrix and bias of one block (two LayerNorms, attention's two "
                        "projections, the MLP's two), times n_layer; then the two embeddings, the final "
                        "LayerNorm and the head (it has no bias)",
          answer_hint="per block: two LayerNorms (2C each), c_attn (3C*C + 3C), attn c_proj (C*C + C), c_fc "
                      "(4C*C + 4C), mlp c_proj (4C*C + C); add wte (V*C), wpe (T*C), ln_f (2C) and lm_head (C*V)",
          forbid=["course.gpt.GPT", "course.nn.Module.num_parameters"], task="count them with a formula")
def _(candidate, rng):
    cases = [(65, 64, 4, 128), (3, 11, 2, 48), (10, 8, 1, 4), (50257, 1024, 12, 768)]
    cases += [(int(rng.integers(2, 100)), int(rng.integers(1, 64)), int(rng.integers(1, 5)),
               4 * int(rng.integers(1, 20))) for _ in range(3)]
    for V, T, L, C in cases:
        on = f"vocab_size={V}, block_size={T}, n_layer={L}, n_embd={C}"
        got = _as_int(call(candidate, V, T, L, C, on=on), on)
        expected = _ref_count(V, T, L, C)
        expect(got == expected, f"expected {expected:,} parameters, got {got:,} on {on}")


def _ref_layer_norm(x, weight, bias, eps=1e-5):
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * weight + bias


@exercise("4.3.2", hint="normalise each row on its own over the last axis, with the biased variance (divide by "
                        "C) and eps inside the square root, then scale and shift",
          answer_hint="mean and var over axis -1 with keepdims=True; (x - mean) / np.sqrt(var + eps) * weight + bias",
          forbid=["course.tensor.functional.layer_norm", "course.nn.LayerNorm"], task="write it in NumPy")
def _(candidate, rng):
    cases = [(np.array([[1.0, 2.0, 3.0, 4.0]]), np.ones(4), np.zeros(4), "x=[[1, 2, 3, 4]], weight 1, bias 0"),
             (np.array([[5.0, 5.0, 5.0]]), np.ones(3), np.zeros(3), "x=[[5, 5, 5]] (a constant row)"),
             (np.array([[1.0, -1.0]]), np.array([2.0, 3.0]), np.array([0.5, -0.5]), "x=[[1, -1]], weight [2, 3], bias [0.5, -0.5]"),
             # variance 4e-6, below eps: (x - mean) / sqrt(var + eps) is +-0.53, not +-1, so eps must sit
             # inside the square root (dividing by std + eps, or dropping eps, gives about +-1)
             (np.array([[0.0, 0.004]]), np.ones(2), np.zeros(2), "x=[[0, 0.004]] (variance 4e-6, below eps)"),
             (np.array([[1.0, 2.0, 3.0], [10.0, 20.0, 60.0]]), np.ones(3), np.zeros(3),
              "x=[[1, 2, 3], [10, 20, 60]] (each row on its own)")]
    cases += [(rng.normal(size=(2, 3, 8)) * 4 + 1, rng.normal(size=8), rng.normal(size=8),
               "random x of shape (2, 3, 8) with random weight and bias")]
    for x, w, b, on in cases:
        got = call(candidate, x.copy(), w.copy(), b.copy(), on=on)
        expect_close(got, _ref_layer_norm(x, w, b), on=on, rtol=1e-5, atol=1e-6)  # float32 work passes
    # the eps it is given: with eps=0.1 the row [0, 0.5] normalises to about +-0.62, not +-1
    x, w, b = np.array([[0.0, 0.5], [2.0, 1.0]]), np.ones(2), np.zeros(2)
    on = "x=[[0, 0.5], [2, 1]] with eps=0.1"
    got = call(candidate, x.copy(), w.copy(), b.copy(), eps=0.1, on=on)
    expect_close(got, _ref_layer_norm(x, w, b, eps=0.1), on=on, rtol=1e-5, atol=1e-6)


@exercise("4.3.3", hint="pre-LayerNorm: each sublayer reads a normalised copy of the residual stream and "
                        "adds its output to the stream, which is never normalised itself",
          answer_hint="x = x + attn(ln_1(x)), then return x + mlp(ln_2(x))")
def _(candidate, rng):
    for trial in range(3):
        C = 4
        mats = [rng.normal(size=(C, C)) / 2 for _ in range(4)]
        ln_1 = lambda x, m=mats[0]: np.tanh(x @ m)  # noqa: E731 - stand-ins, all different
        attn = lambda x, m=mats[1]: x @ m  # noqa: E731
        ln_2 = lambda x, m=mats[2]: np.sin(x @ m)  # noqa: E731
        mlp = lambda x, m=mats[3]: np.maximum(x @ m, 0)  # noqa: E731
        x = rng.normal(size=(2, 3, C))
        on = f"random x of shape {x.shape} and stand-in sublayers (trial {trial + 1})"
        got = call(candidate, x.copy(), ln_1, attn, ln_2, mlp, on=on)
        h = x + attn(ln_1(x))
        expected = h + mlp(ln_2(h))
        post = ln_1(x + attn(x))
        post_ln = ln_2(post + mlp(post))  # the original transformer's order
        arr = np.asarray(got, dtype=np.float64)
        if arr.shape == expected.shape and np.allclose(arr, post_ln):
            raise CheckFailed(f"that is the post-LayerNorm block of the original transformer on {on}")
        expect_close(got, expected, on=on, rtol=1e-6, atol=1e-9)


def _ref_ce(logits, targets, ignore_index=-1):
    shifted = logits - logits.max(axis=-1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    keep = targets != ignore_index
    picked = np.take_along_axis(logp, np.where(keep, targets, 0)[..., None], axis=-1)[..., 0]
    return -(picked * keep).sum() / keep.sum()


@exercise("4.3.4", hint="a stable log-softmax, one log-probability per target, and the mean over the targets "
                        "that count (ignore_index ones do not)",
          answer_hint="log-softmax with the row max subtracted; pick each target's log-probability "
                      "(np.take_along_axis); minus their sum over the kept targets, divided by the number kept",
          forbid=["course.tensor.functional.cross_entropy", "course.tensor.functional.log_softmax"],
          task="write it in NumPy")
def _(candidate, rng):
    cases = [(np.zeros((1, 2, 4)), np.array([[0, 3]]), "uniform logits (1, 2, 4), targets [[0, 3]]"),
             (np.array([[[2.0, 0.0, -1.0], [0.5, 0.5, 3.0]]]), np.array([[0, -1]]),
              "logits (1, 2, 3), targets [[0, -1]] (the second ignored)"),
             (np.array([[[1000.0, 0.0], [0.0, 1000.0]]]), np.array([[1, 1]]),
              "large logits [[[1000, 0], [0, 1000]]], targets [[1, 1]]"),
             (rng.normal(size=(2, 5, 7)) * 3, np.array([[1, -1, 2, -1, 6], [0, 0, -1, 3, 4]]),
              "random logits (2, 5, 7) with some targets -1"),
             (np.array([[[1000.0, 999.0, 0.0], [-1000.0, -1001.0, -1002.0]]]), np.array([[1, 0]]),
              "rows of very different scales [[[1000, 999, 0], [-1000, -1001, -1002]]], targets [[1, 0]]")]
    for logits, targets, on in cases:
        got = call(candidate, logits.copy(), targets.copy(), on=on)
        arr = np.asarray(got, dtype=np.float64) if np.ndim(got) == 0 else None
        if arr is not None and not np.isfinite(arr) and "different scales" in on:
            raise CheckFailed(f"the loss is {float(arr)} on {on}: one max for the whole array leaves a row far below "
                              f"it as log(0); subtract each row's own max")
        if arr is not None and not np.isfinite(arr):
            raise CheckFailed(f"the loss is {float(arr)} on {on}: subtract the row max before np.exp")
        # float32 work is right too: with logits near 1000 its rounding alone is a few 1e-5 of the loss
        rounding = 4 * float(np.finfo(np.float32).eps) * float(np.abs(logits).max())
        expect_close(got, _ref_ce(logits, targets), on=on, rtol=1e-6, atol=1e-9 + rounding, what="loss")
    # the ignore_index it is given, not always -1
    logits, targets = rng.normal(size=(1, 4, 6)), np.array([[2, 5, 0, 5]])
    on = "random logits (1, 4, 6), targets [[2, 5, 0, 5]] with ignore_index=5"
    got = call(candidate, logits.copy(), targets.copy(), ignore_index=5, on=on)
    expect_close(got, _ref_ce(logits, targets, ignore_index=5), on=on, rtol=1e-6, atol=1e-9, what="loss")


# ---- 4.4 training and sampling ------------------------------------------------------------------


@exercise("4.4.1", hint="y is x shifted by one token; a 2-D array of indices cuts every window at once",
          answer_hint="idx = starts[:, None] + np.arange(block_size); return data[idx], data[idx + 1]")
def _(candidate, rng):
    data = np.arange(100, 120)
    cases = [(data, np.array([0]), 4), (data, np.array([3, 0, 10]), 5), (data, np.array([15]), 4)]
    rand = rng.integers(0, 50, size=60)
    cases += [(rand, rng.integers(0, 50, size=4), 8)]
    for d, starts, T in cases:
        on = f"data of length {len(d)}, starts={starts.tolist()}, block_size={T}"
        got = call(candidate, d.copy(), starts.copy(), T, on=on)
        if not (isinstance(got, (tuple, list)) and len(got) == 2):
            raise CheckFailed(f"expected a pair (x, y), got {_what(got)} on {on}")
        idx = starts[:, None] + np.arange(T)
        expect_close(got[0], d[idx], on=on, rtol=0, atol=0, what="x")
        expect_close(got[1], d[idx + 1], on=on, rtol=0, atol=0, what="y (x shifted by one)")


def _ref_top_k(logits, k):
    kth = np.sort(logits, axis=-1)[..., -k, None]
    return np.where(logits < kth, -np.inf, logits)


@exercise("4.4.2", hint="find each row's k-th largest value; only what is strictly smaller becomes -inf, so "
                        "logits equal to it stay; keep the shape",
          answer_hint="kth = np.sort(logits, axis=-1)[..., -k, None]; return np.where(logits < kth, -np.inf, logits)",
          forbid=["course.gpt.top_k_filter"], task="write the filter in NumPy")
def _(candidate, rng):
    cases = [(np.array([[1.0, 5.0, 3.0, 2.0]]), 2), (np.array([[1.0, 5.0, 3.0, 2.0]]), 1),
             (np.array([[1.0, 5.0, 3.0, 2.0]]), 4), (np.array([[0.0, 2.0, 1.0], [3.0, -1.0, 0.5]]), 2),
             (rng.normal(size=(3, 10)), 3),
             # ties with the k-th largest are kept: more than k logits survive
             (np.array([[1.0, 3.0, 3.0, 2.0]]), 1), (np.array([[2.0, 2.0, 2.0, 1.0], [0.5, 4.0, 0.5, 0.5]]), 2)]
    for logits, k in cases:
        on = f"logits={np.round(logits, 3).tolist()}, k={k}"
        got = call(candidate, logits.copy(), k, on=on)
        expected = _ref_top_k(logits, k)
        arr = np.asarray(got, dtype=np.float64)
        if arr.shape == expected.shape and (np.isfinite(arr).sum() < np.isfinite(expected).sum()):
            raise CheckFailed(f"your result keeps {int(np.isfinite(arr).sum())} logits, expected "
                              f"{int(np.isfinite(expected).sum())} on {on}: a logit equal to the k-th largest "
                              f"is kept too")
        expect_close(got, expected, on=on, rtol=0, atol=0)


def _ref_temp(logits, temperature):
    z = logits / temperature
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@exercise("4.4.3", hint="the temperature divides the logits before the softmax; keep the softmax stable",
          answer_hint="z = logits / temperature; e = np.exp(z - z.max(-1, keepdims=True)); return e / e.sum(-1, "
                      "keepdims=True)",
          forbid=["course.tensor.functional.softmax", "course.gpt.sample_next"], task="write it in NumPy")
def _(candidate, rng):
    logits = np.array([[2.0, 1.0, 0.0, -1.0]])
    cases = [(logits, 1.0), (logits, 0.5), (logits, 2.0), (logits, 0.01), (np.array([[1000.0, 999.0]]), 1.0),
             (rng.normal(size=(3, 6)) * 2, 0.7)]
    for lg, t in cases:
        on = f"logits={np.round(lg, 3).tolist()}, temperature={t}"
        got = call(candidate, lg.copy(), t, on=on)
        expect_close(got, _ref_temp(lg, t), on=on, rtol=1e-5, atol=1e-9, what="probabilities")


@exercise("4.4.4", hint="write the new keys and values into the caches themselves, just after the `length` "
                        "stored positions, and return the filled part of each",
          answer_hint="cache_k[:, :, length:length + T_new] = k_new (and v likewise); return cache_k[:, :, "
                      ":length + T_new], cache_v[:, :, :length + T_new]",
          forbid=["course.gpt.KVCache"], task="write the update in NumPy")
def _(candidate, rng):
    B, H, max_len, D = 2, 3, 8, 4
    for length, t_new in [(0, 1), (0, 3), (3, 1), (5, 3), (int(rng.integers(0, 7)), 1)]:
        cache_k = rng.normal(size=(B, H, max_len, D))
        cache_v = rng.normal(size=(B, H, max_len, D))
        k_new = rng.normal(size=(B, H, t_new, D))
        v_new = rng.normal(size=(B, H, t_new, D))
        want_k, want_v = cache_k.copy(), cache_v.copy()
        want_k[:, :, length:length + t_new] = k_new
        want_v[:, :, length:length + t_new] = v_new
        on = f"caches of shape {cache_k.shape} holding {length} positions, {t_new} new"
        got = call(candidate, cache_k, cache_v, length, k_new, v_new, on=on)
        if not (isinstance(got, (tuple, list)) and len(got) == 2):
            raise CheckFailed(f"expected a pair (keys, values), got {_what(got)} on {on}")
        for name, buf, want in (("cache_k", cache_k, want_k), ("cache_v", cache_v, want_v)):
            expect(np.array_equal(buf, want),
                   f"after the call, {name} does not hold the new entries at positions {length} to "
                   f"{length + t_new - 1} (and the old ones elsewhere) on {on}: write into it in place")
        expect_close(got[0], want_k[:, :, :length + t_new], on=on, rtol=0, atol=0, what="keys returned")
        expect_close(got[1], want_v[:, :, :length + t_new], on=on, rtol=0, atol=0, what="values returned")


def _ref_lr(step, warmup, total, max_lr, min_lr):
    if step < warmup:
        return max_lr * (step + 1) / warmup
    if step >= total:
        return min_lr
    progress = (step - warmup) / (total - warmup)
    return min_lr + (max_lr - min_lr) * 0.5 * (1 + math.cos(math.pi * progress))


@exercise("4.4.5", hint="a straight line up that reaches max_lr at the last warm-up step, half a cosine from "
                        "max_lr down to min_lr, then min_lr from total on",
          answer_hint="warm-up: max_lr * (step + 1) / warmup; then min_lr + (max_lr - min_lr) * 0.5 * (1 + "
                      "cos(pi * progress)) with progress = (step - warmup) / (total - warmup)",
          forbid=["course.optim.warmup_cosine", "course.optim.WarmupCosine"], task="write the schedule")
def _(candidate, rng):
    settings = [(10, 100, 1e-3, 1e-4), (0, 50, 0.5, 0.0), (5, 20, 2.0, 1.0)]
    for warmup, total, max_lr, min_lr in settings:
        steps = sorted({0, 1, max(warmup - 1, 0), warmup, warmup + 1, (warmup + total) // 2, total - 1,
                        total, total + 10, int(rng.integers(0, total))})
        for step in steps:
            on = f"step={step}, warmup={warmup}, total={total}, max_lr={max_lr}, min_lr={min_lr}"
            got = call(candidate, step, warmup, total, max_lr, min_lr, on=on)
            expect_close(got, _ref_lr(step, warmup, total, max_lr, min_lr), on=on, rtol=1e-6, atol=1e-12,
                         what="learning rate")
