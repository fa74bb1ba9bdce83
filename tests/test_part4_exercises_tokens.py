"""The checks of lessons 4.1 and 4.2: a stub is not attempted, a wrong answer fails naming the input,
a right answer passes."""

import numpy as np
import pytest

from course.exercises import check

import known_wrong  # tests/known_wrong.py

pytestmark = pytest.mark.part4


def stub(*args, **kwargs):
    raise NotImplementedError


# ---- right answers ---------------------------------------------------------------------------


def build_char_vocab(text):
    chars = sorted(set(text))
    return {c: i for i, c in enumerate(chars)}, dict(enumerate(chars))


def count_pairs(ids):
    counts = {}
    for pair in zip(ids, ids[1:]):
        counts[pair] = counts.get(pair, 0) + 1
    return counts


def merge(ids, pair, new_id):
    out, i = [], 0
    while i < len(ids):
        if i + 1 < len(ids) and (ids[i], ids[i + 1]) == pair:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def bpe_encode(text, merges):
    ids = list(text.encode("utf-8"))
    while len(ids) >= 2:
        pair = min(zip(ids, ids[1:]), key=lambda p: merges.get(p, float("inf")))
        if pair not in merges:
            break
        ids = merge(ids, pair, merges[pair])
    return ids


def causal_mask(T):
    return np.triu(np.ones((T, T), dtype=bool), k=1)


def masked_softmax(scores, mask):
    scores = np.where(mask, -np.inf, scores)
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def attention_head(x, w_q, w_k, w_v):
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    scores = q @ k.T / np.sqrt(q.shape[-1])
    return masked_softmax(scores, causal_mask(len(x))) @ v


def split_heads(x, n_head):
    B, T, C = x.shape
    return x.reshape(B, T, n_head, C // n_head).transpose(0, 2, 1, 3)


# ---- wrong answers, each with the input its failure message should name ------------------------


def vocab_unsorted(text):
    chars = list(dict.fromkeys(text))  # order of first appearance, not sorted
    return {c: i for i, c in enumerate(chars)}, dict(enumerate(chars))


def pairs_overlapping_once(ids):
    return {p: 1 for p in zip(ids, ids[1:])}


def merge_overlapping(ids, pair, new_id):  # merges "5 5 5" into two tokens
    out = [new_id if (a, b) == pair else a for a, b in zip(ids, ids[1:])]
    return out if ids else []


def bpe_encode_any_order(text, merges):  # applies the merge with the largest id first
    ids = list(text.encode("utf-8"))
    while True:
        present = [p for p in zip(ids, ids[1:]) if p in merges]
        if not present:
            return ids
        pair = max(present, key=lambda p: merges[p])
        ids = merge(ids, pair, merges[pair])


def mask_allowed(T):  # the opposite convention: True where attention is allowed
    return np.tril(np.ones((T, T), dtype=bool))


def softmax_unstable(scores, mask):  # no max subtracted: exp(1000) overflows
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.exp(np.where(mask, -np.inf, scores))
        return e / e.sum(axis=-1, keepdims=True)


def head_unscaled(x, w_q, w_k, w_v):
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    return masked_softmax(q @ k.T, causal_mask(len(x))) @ v


def head_row_by_row(x, w_q, w_k, w_v):  # right: each position weighs only the keys up to itself
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    out = np.empty((len(x), v.shape[1]))
    for t in range(len(x)):
        scores = k[:t + 1] @ (q[t] / np.sqrt(q.shape[1]))
        weights = np.exp(scores - scores.max())
        out[t] = (weights / weights.sum()) @ v[:t + 1]
    return out


def head_unmasked(x, w_q, w_k, w_v):
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    return masked_softmax(q @ k.T / np.sqrt(q.shape[-1]), np.zeros((len(x), len(x)), dtype=bool)) @ v


def head_softmax_down_columns(x, w_q, w_k, w_v):
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    scores = np.where(causal_mask(len(x)), -np.inf, q @ k.T / np.sqrt(q.shape[-1]))
    e = np.exp(scores - scores.max(axis=0))
    return (e / e.sum(axis=0)) @ v


def split_heads_reshape_only(x, n_head):
    B, T, C = x.shape
    return x.reshape(B, n_head, T, C // n_head)


CASES = [
    ("4.1.1", build_char_vocab, vocab_unsorted, "text="),
    ("4.1.2", count_pairs, pairs_overlapping_once, "ids="),
    ("4.1.3", merge, merge_overlapping, "ids="),
    ("4.1.4", bpe_encode, bpe_encode_any_order, "text="),
    ("4.2.1", causal_mask, mask_allowed, "T="),
    ("4.2.2", masked_softmax, softmax_unstable, "large scores"),
    ("4.2.3", attention_head, head_unscaled, "not divided by sqrt(d)"),
    ("4.2.4", split_heads, split_heads_reshape_only, "n_head="),
]


# ---- more known-wrong answers, each with the words its failure message must contain ---------------


def vocab_by_the_library(text):
    from course.gpt import CharTokenizer

    tok = CharTokenizer(text)
    return tok.stoi, tok.itos


def vocab_by_from_text(text):
    from course.gpt import CharTokenizer

    tok = CharTokenizer.from_text(text)
    return tok.stoi, tok.itos


def merge_in_place(ids, pair, new_id):  # changes the caller's list, and returns it
    i = 0
    while i < len(ids) - 1:
        if (ids[i], ids[i + 1]) == pair:
            ids[i:i + 2] = [new_id]
        i += 1
    return ids


def merge_returning_the_same_list(ids, pair, new_id):
    ids[:] = merge(list(ids), pair, new_id)
    return ids


def merge_by_the_library(ids, pair, new_id):
    from course.gpt.tokenizer import _merge

    return _merge(ids, pair, new_id)


def bpe_most_frequent_first(text, merges):  # merges the most frequent pair, not the earliest learned
    ids = list(text.encode("utf-8"))
    while True:
        counts = {p: c for p, c in count_pairs(ids).items() if p in merges}
        if not counts:
            return ids
        pair = max(counts, key=counts.get)
        ids = merge(ids, pair, merges[pair])


def bpe_by_the_library(text, merges):
    from course.gpt import BPETokenizer

    return BPETokenizer(sorted(merges, key=merges.get), pattern=None).encode(text)


def mask_by_the_library(T):
    import course.tensor.functional as F

    return F.causal_mask(T, T)


def softmax_by_the_library(scores, mask):
    import course.tensor.functional as F
    from course.tensor import Tensor

    return F.softmax(Tensor(np.where(mask, -np.inf, scores))).data


def head_by_the_library(x, w_q, w_k, w_v):
    import course.tensor.functional as F
    from course.tensor import Tensor

    q, k, v = (Tensor((x @ w)[None, None]) for w in (w_q, w_k, w_v))
    return F.scaled_dot_product_attention(q, k, v).data[0, 0]


def masked_softmax_global_max(scores, mask):
    scores = np.where(mask, -np.inf, scores)
    e = np.exp(scores - scores.max())  # one max for every row
    with np.errstate(invalid="ignore"):  # a row far below the max is 0/0: the nan the check must catch
        return e / e.sum(axis=-1, keepdims=True)


def masked_softmax_max_before_masking(scores, mask):  # the row's max taken with the hidden scores in it
    e = np.exp(np.where(mask, -np.inf, scores) - scores.max(axis=-1, keepdims=True))
    with np.errstate(invalid="ignore"):
        return e / e.sum(axis=-1, keepdims=True)


def masked_softmax_zero_not_minus_inf(scores, mask):  # a hidden score set to 0 still gets weight
    scores = np.where(mask, 0.0, scores)
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def masked_softmax_after(scores, mask):  # the softmax taken first, the hidden weights zeroed after
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return np.where(mask, 0.0, e / e.sum(axis=-1, keepdims=True))


def masked_softmax_inverted_mask(scores, mask):  # True read as "may look"
    with np.errstate(invalid="ignore"):  # a row with nothing visible is all -inf: nan, as it would be
        return masked_softmax(scores, ~mask)


def masked_softmax_over_the_wrong_axis(scores, mask):
    scores = np.where(mask, -np.inf, scores)
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return e / e.sum(axis=0, keepdims=True)


def masked_softmax_by_the_visible_max(scores, mask):  # right: the max of what each row may see
    m = np.max(np.where(mask, -np.inf, scores), axis=-1, keepdims=True)
    e = np.where(mask, 0.0, np.exp(np.minimum(scores - m, 0.0)))
    return e / e.sum(axis=-1, keepdims=True)


KNOWN_WRONG = {exercise_id: [(wrong, [names])] for exercise_id, _, wrong, names in CASES}
for exercise_id, wrong, words in [
    ("4.2.3", head_unmasked, ["mixes in the values of later positions", "hide the future"]),
    ("4.2.3", head_softmax_down_columns, ["down each column", "over the keys"]),
    ("4.2.2", masked_softmax_global_max, ["different scales", "each row's own max"]),
    ("4.2.2", masked_softmax_max_before_masking, ["large score masked", "should not set the max"]),
    ("4.2.2", masked_softmax_zero_not_minus_inf, ["zeros (3, 3), causal mask", "expected result"]),
    ("4.2.2", masked_softmax_after, ["zeros (3, 3), causal mask", "expected result"]),
    ("4.2.2", masked_softmax_inverted_mask, ["causal mask"]),
    ("4.2.2", masked_softmax_over_the_wrong_axis, ["zeros (3, 3), causal mask"]),
    ("4.1.1", vocab_by_the_library, ["write this yourself", "course.gpt.CharTokenizer"]),
    ("4.1.1", vocab_by_from_text, ["write this yourself", "course.gpt.CharTokenizer"]),
    ("4.1.3", merge_in_place, ["changed the list it was given", "return a new list"]),
    ("4.1.3", merge_returning_the_same_list, ["return a new list"]),
    ("4.1.3", merge_by_the_library, ["write this yourself", "course.gpt.tokenizer._merge"]),
    ("4.1.4", bpe_most_frequent_first, ["text='abcbc'", "ab learned first"]),
    ("4.1.4", bpe_by_the_library, ["write this yourself", "course.gpt.BPETokenizer.encode"]),
    ("4.2.1", mask_by_the_library, ["write this yourself", "course.tensor.functional.causal_mask"]),
    ("4.2.2", softmax_by_the_library, ["write this yourself", "course.tensor.functional.softmax"]),
    ("4.2.3", head_by_the_library, ["write this yourself", "scaled_dot_product_attention"]),
    ("4.2.4", lambda x, n_head: x.reshape(x.shape[0], x.shape[1], n_head, -1), ["has shape"]),
]:
    KNOWN_WRONG[exercise_id].append((wrong, words))


@pytest.mark.parametrize("exercise_id,wrong,words", known_wrong.cases(KNOWN_WRONG))
def test_known_wrong_answer_fails_saying_why(exercise_id, wrong, words):
    known_wrong.assert_fails_saying(exercise_id, wrong, words)


@pytest.mark.parametrize("exercise_id", [c[0] for c in CASES])
def test_stub_is_not_attempted(exercise_id, capsys):
    result = check(exercise_id, stub)
    assert result.status == "not attempted"
    assert "not attempted" in capsys.readouterr().out


@pytest.mark.parametrize("exercise_id,right", [(c[0], c[1]) for c in CASES])
def test_right_answer_passes(exercise_id, right, capsys):
    result = check(exercise_id, right)
    assert result.status == "passed", result.message
    assert capsys.readouterr().out.strip() == f"[{exercise_id}] passed."


@pytest.mark.parametrize("exercise_id,wrong,names", [(c[0], c[2], c[3]) for c in CASES])
def test_wrong_answer_fails_naming_the_input(exercise_id, wrong, names):
    result = check(exercise_id, wrong)
    assert result.status == "failed"
    assert names in result.message, result.message
    assert "Hint:" in result.message


def test_an_exception_in_the_learners_code_is_a_failure():
    def broken(*args):
        raise IndexError("list index out of range")

    result = check("4.1.3", broken)
    assert result.status == "failed"
    assert "IndexError" in result.message and "ids=" in result.message


# ---- right answers in another form are right too ---------------------------------------------

ALTERNATIVES = [
    ("4.1.1", lambda text: list(build_char_vocab(text))),             # [stoi, itos] instead of a tuple
    ("4.1.1", lambda text: (build_char_vocab(text)[0], sorted(set(text)))),  # itos as a list
    ("4.1.3", lambda ids, pair, new_id: tuple(merge(ids, pair, new_id))),
    ("4.1.3", lambda ids, pair, new_id: np.array(merge(ids, pair, new_id), dtype=np.int64)),
    ("4.1.4", lambda text, merges: tuple(bpe_encode(text, merges))),
    ("4.2.3", head_row_by_row),
    ("4.2.1", lambda T: causal_mask(T).tolist()),
    ("4.2.2", lambda scores, mask: masked_softmax(scores, mask).astype(np.float32)),
    ("4.2.2", lambda scores, mask: (lambda s: np.exp(s - np.logaddexp.reduce(s, axis=-1, keepdims=True)))(
        np.where(mask, -np.inf, scores))),
    ("4.2.2", masked_softmax_by_the_visible_max),
    ("4.2.4", lambda x, n_head: np.stack(np.split(x, n_head, axis=-1), axis=1)),
]


@pytest.mark.parametrize("exercise_id,alternative", ALTERNATIVES)
def test_right_answers_in_another_form_pass(exercise_id, alternative):
    result = check(exercise_id, alternative)
    assert result.status == "passed", result.message


def test_returning_output_and_weights_is_named():
    # The lesson's attention_head returns (output, weights); the exercise wants the output only.
    result = check("4.2.3", lambda x, w_q, w_k, w_v: (attention_head(x, w_q, w_k, w_v), None))
    assert result.status == "failed" and "(output, weights)" in result.message, result.message
