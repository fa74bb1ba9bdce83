"""The checks of lessons 4.3 and 4.4: a stub is not attempted, a wrong answer fails naming the input,
a right answer passes."""

import math

import numpy as np
import pytest

from course.exercises import check

import known_wrong  # tests/known_wrong.py

pytestmark = pytest.mark.part4


def stub(*args, **kwargs):
    raise NotImplementedError


# ---- right answers ---------------------------------------------------------------------------


def count_parameters(vocab_size, block_size, n_layer, n_embd):
    C = n_embd
    return vocab_size * C + block_size * C + n_layer * (12 * C * C + 13 * C) + 2 * C + C * vocab_size


def layer_norm(x, weight, bias, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(x.var(-1, keepdims=True) + eps) * weight + bias


def block(x, ln_1, attn, ln_2, mlp):
    x = x + attn(ln_1(x))
    return x + mlp(ln_2(x))


def cross_entropy(logits, targets, ignore_index=-1):
    z = logits - logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    keep = targets != ignore_index
    picked = np.take_along_axis(logp, np.where(keep, targets, 0)[..., None], -1)[..., 0]
    return -(picked[keep]).mean()


def windows(data, starts, block_size):
    idx = starts[:, None] + np.arange(block_size)
    return data[idx], data[idx + 1]


def top_k(logits, k):
    kth = np.sort(logits, -1)[..., -k, None]
    return np.where(logits < kth, -np.inf, logits)


def temperature_probs(logits, temperature):
    z = logits / temperature
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def cache_update(cache_k, cache_v, length, k_new, v_new):
    end = length + k_new.shape[2]
    cache_k[:, :, length:end] = k_new
    cache_v[:, :, length:end] = v_new
    return cache_k[:, :, :end], cache_v[:, :, :end]


def lr_at(step, warmup, total, max_lr, min_lr):
    if step < warmup:
        return max_lr * (step + 1) / warmup
    if step >= total:
        return min_lr
    progress = (step - warmup) / (total - warmup)
    return min_lr + (max_lr - min_lr) * 0.5 * (1 + math.cos(math.pi * progress))


# ---- wrong answers, each a mistake a learner could make ------------------------------------------


def count_forgets_biases(vocab_size, block_size, n_layer, n_embd):
    C = n_embd
    return vocab_size * C + block_size * C + n_layer * 12 * C * C + C * vocab_size


def layer_norm_unbiased(x, weight, bias, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(x.var(-1, ddof=1, keepdims=True) + eps) * weight + bias


def block_post_ln(x, ln_1, attn, ln_2, mlp):
    x = ln_1(x + attn(x))
    return ln_2(x + mlp(x))


def cross_entropy_mean_over_all(logits, targets, ignore_index=-1):
    z = logits - logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    keep = targets != ignore_index
    picked = np.take_along_axis(logp, np.where(keep, targets, 0)[..., None], -1)[..., 0]
    return -(picked * keep).mean()


def windows_unshifted(data, starts, block_size):
    idx = starts[:, None] + np.arange(block_size)
    return data[idx], data[idx]


def top_k_off_by_one(logits, k):
    kth = np.sort(logits, -1)[..., -k, None]
    return np.where(logits <= kth, -np.inf, logits)


def temperature_multiplies(logits, temperature):
    return temperature_probs(logits * temperature, 1.0)


def cache_update_copies(cache_k, cache_v, length, k_new, v_new):
    k = np.concatenate([cache_k[:, :, :length], k_new], axis=2)
    v = np.concatenate([cache_v[:, :, :length], v_new], axis=2)
    return k, v


def lr_no_warmup(step, warmup, total, max_lr, min_lr):
    return lr_at(max(step, warmup), warmup, total, max_lr, min_lr)


CASES = [
    ("4.3.1", count_parameters, count_forgets_biases, "vocab_size=65"),
    ("4.3.2", layer_norm, layer_norm_unbiased, "x=[[1, 2, 3, 4]]"),
    ("4.3.3", block, block_post_ln, "post-LayerNorm"),
    ("4.3.4", cross_entropy, cross_entropy_mean_over_all, "targets [[0, -1]]"),
    ("4.4.1", windows, windows_unshifted, "starts=[0]"),
    ("4.4.2", top_k, top_k_off_by_one, "k=2"),
    ("4.4.3", temperature_probs, temperature_multiplies, "temperature=0.5"),
    ("4.4.4", cache_update, cache_update_copies, "write into it in place"),
    ("4.4.5", lr_at, lr_no_warmup, "step=0, warmup=10"),
]


@pytest.mark.parametrize("exercise_id,right,wrong,named", CASES, ids=[c[0] for c in CASES])
def test_stub_wrong_right(exercise_id, right, wrong, named, capsys):
    assert check(exercise_id, stub).status == "not attempted"
    failed = check(exercise_id, wrong)
    assert failed.status == "failed"
    assert named in failed.message
    assert check(exercise_id, right).status == "passed"
    assert capsys.readouterr().out.strip().splitlines()[-1] == f"[{exercise_id}] passed."


# ---- more known-wrong answers, each with the words its failure message must contain ---------------


def count_by_building_the_model(vocab_size, block_size, n_layer, n_embd):
    from course.gpt import GPT, GPTConfig

    return GPT(GPTConfig(vocab_size, block_size, n_layer, 1, n_embd)).num_parameters()


def layer_norm_by_the_library(x, weight, bias, eps=1e-5):
    import course.tensor.functional as F
    from course.tensor import Tensor

    return F.layer_norm(Tensor(x), Tensor(weight), Tensor(bias), eps).data


def cross_entropy_by_the_library(logits, targets, ignore_index=-1):
    import course.tensor.functional as F
    from course.tensor import Tensor

    V = logits.shape[-1]
    return float(F.cross_entropy(Tensor(logits.reshape(-1, V)), targets.reshape(-1), ignore_index=ignore_index).data)


def top_k_dropping_ties(logits, k):  # keeps exactly k per row, so one of two equal logits is lost
    out = np.full_like(logits, -np.inf)
    idx = np.argsort(logits, axis=-1)[..., -k:]
    np.put_along_axis(out, idx, np.take_along_axis(logits, idx, axis=-1), axis=-1)
    return out


def top_k_by_the_library(logits, k):
    from course.gpt import top_k_filter

    return top_k_filter(logits, k)


def temperature_by_the_library(logits, temperature):
    import course.tensor.functional as F
    from course.tensor import Tensor

    return F.softmax(Tensor(logits / temperature)).data


def cache_by_the_library(cache_k, cache_v, length, k_new, v_new):
    from course.gpt import KVCache

    KVCache(1, cache_k.shape[0], cache_k.shape[1], cache_k.shape[2], cache_k.shape[3])
    return cache_update(cache_k, cache_v, length, k_new, v_new)


def lr_by_the_library(step, warmup, total, max_lr, min_lr):
    import course.optim as optim

    return max_lr * optim.warmup_cosine(step, warmup, total, min_lr / max_lr)


KNOWN_WRONG = {exercise_id: [(wrong, [named])] for exercise_id, _, wrong, named in CASES}
def cross_entropy_global_max(logits, targets, ignore_index=-1):
    z = logits - logits.max()  # one max for every row
    with np.errstate(divide="ignore"):  # a row far below the max is log(0): the inf the check must catch
        logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    keep = targets != ignore_index
    picked = np.take_along_axis(logp, np.where(keep, targets, 0)[..., None], -1)[..., 0]
    return -(picked[keep]).mean()


def cross_entropy_float32(logits, targets, ignore_index=-1):  # right: float32 rounds near 1000
    return np.float32(cross_entropy(logits.astype(np.float32), targets, ignore_index))


def cross_entropy_logaddexp(logits, targets, ignore_index=-1):  # right: log-sum-exp by np.logaddexp
    keep = targets != ignore_index
    lse = np.logaddexp.reduce(logits, axis=-1)
    picked = np.take_along_axis(logits, np.where(keep, targets, 0)[..., None], -1)[..., 0]
    return float((lse - picked)[keep].sum() / keep.sum())


def cross_entropy_sum_not_mean(logits, targets, ignore_index=-1):
    n = (targets != ignore_index).sum()
    return cross_entropy(logits, targets, ignore_index) * n


def cross_entropy_of_probabilities(logits, targets, ignore_index=-1):  # -log p without the log-softmax
    z = np.exp(logits - logits.max(-1, keepdims=True))
    p = z / z.sum(-1, keepdims=True)
    keep = targets != ignore_index
    picked = np.take_along_axis(p, np.where(keep, targets, 0)[..., None], -1)[..., 0]
    return -(picked[keep]).mean()


def cross_entropy_first_target(logits, targets, ignore_index=-1):  # every row scored on target 0
    return cross_entropy(logits, np.where(targets == ignore_index, targets, 0), ignore_index)


for exercise_id, wrong, words in [
    ("4.3.4", cross_entropy_global_max, ["different scales", "each row's own max"]),
    ("4.3.1", count_by_building_the_model, ["write this yourself", "course.gpt.GPT"]),
    ("4.3.2", layer_norm_by_the_library, ["write this yourself", "course.tensor.functional.layer_norm"]),
    ("4.3.4", cross_entropy_by_the_library, ["write this yourself", "course.tensor.functional.cross_entropy"]),
    ("4.4.2", top_k_dropping_ties, ["equal to the k-th largest is kept too"]),
    ("4.4.2", top_k_by_the_library, ["write this yourself", "course.gpt.top_k_filter"]),
    ("4.4.3", temperature_by_the_library, ["write this yourself", "course.tensor.functional.softmax"]),
    ("4.4.4", cache_by_the_library, ["write this yourself", "course.gpt.KVCache"]),
    ("4.4.5", lr_by_the_library, ["write this yourself", "course.optim.warmup_cosine"]),
    ("4.3.3", lambda x, ln_1, attn, ln_2, mlp: x + attn(ln_1(x)), ["expected result"]),
    ("4.3.2", lambda x, weight, bias, eps=1e-5: layer_norm(x, weight, bias), ["with eps=0.1"]),
    ("4.3.4", lambda logits, targets, ignore_index=-1: cross_entropy(logits, targets), ["with ignore_index=5"]),
    ("4.3.4", cross_entropy_sum_not_mean, ["expected loss"]),
    ("4.3.4", cross_entropy_of_probabilities, ["expected loss"]),
    ("4.3.4", cross_entropy_first_target, ["expected loss"]),
    ("4.4.1", lambda data, starts, block_size: data[starts[:, None] + np.arange(block_size)], ["expected a pair"]),
]:
    KNOWN_WRONG[exercise_id].append((wrong, words))


@pytest.mark.parametrize("exercise_id,wrong,words", known_wrong.cases(KNOWN_WRONG))
def test_known_wrong_answer_fails_saying_why(exercise_id, wrong, words):
    known_wrong.assert_fails_saying(exercise_id, wrong, words)


def test_the_library_is_back_after_the_check():
    from course.gpt import top_k_filter

    check("4.4.2", top_k_by_the_library)
    assert np.isneginf(top_k_filter(np.array([[1.0, 2.0]]), 1)[0, 0])


def test_a_crash_names_the_input():
    def broken(logits, k):
        raise IndexError("boom")
    result = check("4.4.2", broken)
    assert result.status == "failed" and "IndexError: boom" in result.message and "logits=" in result.message


# ---- other right answers must pass, near misses must not ------------------------------------------


def layer_norm_float32(x, weight, bias, eps=1e-5):
    return layer_norm(x.astype(np.float32), weight.astype(np.float32), bias.astype(np.float32), eps)


def windows_as_list(data, starts, block_size):
    return [[data[s:s + block_size].tolist() for s in starts], [data[s + 1:s + 1 + block_size].tolist() for s in starts]]


def cache_update_as_list(cache_k, cache_v, length, k_new, v_new):
    return list(cache_update(cache_k, cache_v, length, k_new, v_new))


def temperature_probs_float32(logits, temperature):
    return temperature_probs(logits.astype(np.float32), np.float32(temperature))


def lr_at_float32(step, warmup, total, max_lr, min_lr):
    return np.float32(lr_at(step, warmup, total, max_lr, min_lr))


def top_k_partition(logits, k):
    kth = np.partition(logits, -k, axis=-1)[..., -k, None]
    return np.where(logits < kth, -np.inf, logits)


@pytest.mark.parametrize("exercise_id,candidate", [
    ("4.3.1", lambda *a: float(count_parameters(*a))),
    ("4.3.2", layer_norm_float32),
    ("4.4.1", windows_as_list),
    ("4.4.2", top_k_partition),
    ("4.4.3", temperature_probs_float32),
    ("4.4.4", cache_update_as_list),
    ("4.4.5", lr_at_float32),
    ("4.3.4", cross_entropy_float32),
    ("4.3.4", cross_entropy_logaddexp),
], ids=["4.3.1-float", "4.3.2-float32", "4.4.1-lists", "4.4.2-partition", "4.4.3-float32", "4.4.4-list",
        "4.4.5-float32", "4.3.4-float32", "4.3.4-logaddexp"])
def test_other_right_answers_pass(exercise_id, candidate):
    assert check(exercise_id, candidate).status == "passed"


def layer_norm_eps_outside(x, weight, bias, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / (x.std(-1, keepdims=True) + eps) * weight + bias


def layer_norm_whole_array(x, weight, bias, eps=1e-5):
    return (x - x.mean()) / np.sqrt(x.var() + eps) * weight + bias


def cache_update_swapped(cache_k, cache_v, length, k_new, v_new):
    return cache_update(cache_k, cache_v, length, v_new, k_new)


@pytest.mark.parametrize("exercise_id,candidate,named", [
    ("4.3.2", layer_norm_eps_outside, "below eps"),
    ("4.3.2", layer_norm_whole_array, "each row on its own"),
    ("4.4.4", cache_update_swapped, "cache_k"),
], ids=["4.3.2-eps-outside", "4.3.2-whole-array", "4.4.4-swapped"])
def test_near_misses_fail(exercise_id, candidate, named):
    result = check(exercise_id, candidate)
    assert result.status == "failed" and named in result.message
