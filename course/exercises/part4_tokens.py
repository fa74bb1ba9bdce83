"""Checks of lessons 4.1 (tokenization) and 4.2 (attention)."""

import numpy as np

from ._core import CheckFailed, call, exercise, expect, expect_close


def _short(value, limit=100):
    text = " ".join(repr(value).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _as_ids(got):
    # A list is asked for, but a tuple or a 1-D array of the right ids is right too.
    if isinstance(got, (list, tuple)) or (isinstance(got, np.ndarray) and got.ndim == 1):
        try:
            return [int(i) for i in got]
        except (TypeError, ValueError):
            return None
    return None


_ODD = object()  # what _plain makes of a value that is none of the types an answer is made of


def _plain(value):
    """`value` rebuilt from Python's own dict, list, tuple, str and int, so that comparing it with
    the expected answer compares types and values: an object whose `__eq__` always says True, or a
    str whose `__eq__` lies, compares as what it really holds (or not at all)."""
    if isinstance(value, bool):
        return _ODD
    if isinstance(value, (int, np.integer)):
        return int(np.int64(value)) if isinstance(value, np.integer) else int.__index__(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in dict.items(value)}
    if isinstance(value, (list, tuple)):
        items = [_plain(v) for v in (list.__iter__(value) if isinstance(value, list) else tuple.__iter__(value))]
        return items if isinstance(value, list) else tuple(items)
    return _ODD


def _random_text(rng, alphabet, n):
    return "".join(rng.choice(list(alphabet), size=n))


# ---- 4.1 tokenization ------------------------------------------------------------------------


def _ref_merge(ids, pair, new_id):
    out, i = [], 0
    while i < len(ids):
        if i + 1 < len(ids) and ids[i] == pair[0] and ids[i + 1] == pair[1]:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def _ref_bpe_encode(text, merges):
    ids = list(text.encode("utf-8"))
    while len(ids) >= 2:
        pairs = [p for p in zip(ids, ids[1:]) if p in merges]
        if not pairs:
            break
        best = min(pairs, key=lambda p: merges[p])
        ids = _ref_merge(ids, best, merges[best])
    return ids


@exercise("4.1.1", hint="the ids follow the characters in sorted order, each character once; itos is the "
                        "mapping read backwards",
          answer_hint="chars = sorted(set(text)); stoi = {c: i for i, c in enumerate(chars)}; itos = dict(enumerate(chars))",
          forbid=["course.gpt.CharTokenizer", "course.gpt.CharTokenizer.from_text"],
          task="build the vocabulary")
def _(candidate, rng):
    texts = ["hello world", "", "To be, or not to be", "ba\nab",
             _random_text(rng, "abcdefgh .,!\n", 40), _random_text(rng, "xyzXYZ 019éü", 25)]
    for text in texts:
        on = f"text={text!r}"
        got = call(candidate, text, on=on)
        if not (isinstance(got, (tuple, list)) and len(got) == 2):
            raise CheckFailed(f"expected a pair (stoi, itos), got {_short(got)} on {on}")
        stoi, itos = got
        chars = sorted(set(text))
        expected = {c: i for i, c in enumerate(chars)}
        expect(isinstance(stoi, dict) and _plain(stoi) == expected,
               f"expected stoi {_short(expected)}, got {_short(stoi)} on {on}")
        for i, c in enumerate(chars):
            try:
                back = itos[i]
            except (KeyError, IndexError, TypeError):
                raise CheckFailed(f"itos[{i}] does not exist on {on} (expected {c!r})") from None
            expect(_plain(back) == c, f"expected itos[{i}] == {c!r}, got {_short(back)} on {on}")
        expect(len(itos) == len(chars), f"itos has {len(itos)} entries, expected {len(chars)} on {on}")


@exercise("4.1.2", hint="walk over every pair of neighbours (overlapping ones too) and count each in a dict",
          answer_hint="for pair in zip(ids, ids[1:]): counts[pair] = counts.get(pair, 0) + 1")
def _(candidate, rng):
    cases = [[1, 2, 3, 1, 2], [5, 5, 5, 5], [7], [], [0, 1, 0, 1, 0]]
    cases += [list(rng.integers(0, 4, size=n).tolist()) for n in (10, 30)]
    for ids in cases:
        on = f"ids={ids}"
        got = call(candidate, list(ids), on=on)
        expected = {}
        for p in zip(ids, ids[1:]):
            expected[p] = expected.get(p, 0) + 1
        expect(isinstance(got, dict), f"expected a dict of pair -> count, got {_short(got)} on {on}")
        expect(_plain(got) == expected, f"expected {_short(expected, 160)}, got {_short(dict(got), 160)} on {on}")


@exercise("4.1.3", hint="build a new list while walking left to right; after a match skip both ids of the "
                        "pair, so that matches cannot overlap",
          answer_hint="out, i = [], 0; while i < len(ids): on a match at i append new_id and i += 2, "
                      "otherwise append ids[i] and i += 1",
          forbid=["course.gpt.tokenizer._merge", "course.gpt.BPETokenizer.encode",
                  "course.gpt.BPETokenizer._encode_chunk"], task="write the merge")
def _(candidate, rng):
    cases = [([1, 2, 3, 1, 2], (1, 2), 9), ([5, 5, 5], (5, 5), 7), ([5, 5, 5, 5], (5, 5), 7),
             ([1, 2], (2, 1), 3), ([], (1, 2), 3), ([3, 1, 2, 1, 2, 1], (2, 1), 8)]
    for _ in range(4):
        ids = rng.integers(0, 3, size=20).tolist()
        cases.append((ids, (int(ids[0]), int(ids[1])), 99))
    for ids, pair, new_id in cases:
        on = f"ids={ids}, pair={pair}, new_id={new_id}"
        given = list(ids)
        got = call(candidate, given, pair, new_id, on=on)
        expected = _ref_merge(ids, pair, new_id)
        expect(given == ids, f"your function changed the list it was given (to {_short(given)}) on {on}: "
                             f"return a new list and leave ids as it is")
        expect(_as_ids(got) == expected, f"expected {expected}, got {_short(got)} on {on}")
        expect(got is not given, f"your function returned the list it was given on {on}: return a new list")


@exercise("4.1.4", hint="apply the merge learned earliest (the smallest new id) among the adjacent pairs, which "
                        "need not be the most frequent pair; repeat until no adjacent pair has a merge",
          answer_hint="ids = list(text.encode('utf-8')); while some adjacent pair is in merges: take the present "
                      "pair p with the smallest merges[p] and ids = merge(ids, p, merges[p])",
          forbid=["course.gpt.BPETokenizer.encode", "course.gpt.BPETokenizer._encode_plain",
                  "course.gpt.BPETokenizer._encode_chunk",
                  "course.gpt.tokenizer._merge"], task="apply the merges")
def _(candidate, rng):
    from course.gpt import BPETokenizer

    training = "the cat sat on the mat; the hat, the bat. aaaaa " * 3
    tok = BPETokenizer.train(training, 300, pattern=None)
    merges = dict(tok.ranks)
    texts = ["the cat", "", "aaaaa", "that", "hé 🙂", "the mat sat on the hat",
             _random_text(rng, "theca s", 30)]
    cases = [(text, merges, f"text={text!r} with the {len(merges)} merges that BPETokenizer.train learns from "
                            f"{training[:24]!r} x 3 (vocabulary 300)") for text in texts]
    # The pair learned first is not the most frequent one here: bc occurs twice, ab once.
    small = {(97, 98): 256, (98, 99): 257}
    cases += [(text, small, f"text={text!r} with merges {{(97, 98): 256, (98, 99): 257}} (ab learned first)")
              for text in ("abcbc", "abcbcbcab")]
    for text, table, on in cases:
        got = call(candidate, text, dict(table), on=on)
        expected = _ref_bpe_encode(text, table)
        expect(_as_ids(got) == expected,
               f"expected {_short(expected)}, got {_short(got)} on {on}")


# ---- 4.2 attention ---------------------------------------------------------------------------


def _ref_softmax(scores, mask):
    # mask: True where a score is hidden (the future), as in F.masked_fill and F.causal_mask
    scores = np.where(mask, -np.inf, scores)
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _ref_head(x, w_q, w_k, w_v):
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    T, d = q.shape
    scores = q @ k.T / np.sqrt(d)
    return _ref_softmax(scores, _ref_mask(T)) @ v


def _ref_mask(T):
    return np.triu(np.ones((T, T), dtype=bool), k=1)


@exercise("4.2.1", hint="True marks what query i (row i) must not see: the keys that come after it",
          answer_hint="np.triu(np.ones((T, T), dtype=bool), k=1)",
          forbid=["course.tensor.functional.causal_mask"], task="build the mask in NumPy")
def _(candidate, rng):
    for T in (1, 2, 3, 5, 8):
        on = f"T={T}"
        got = call(candidate, T, on=on)
        expected = _ref_mask(T)
        arr = np.asarray(got)
        expect(arr.shape == (T, T), f"expected shape {(T, T)}, got shape {arr.shape} on {on}")
        expect(arr.dtype == bool, f"expected a boolean array (dtype bool: True = hidden), got dtype {arr.dtype} "
                                  f"on {on}; a comparison or np.ones(..., dtype=bool) gives one")
        expect(np.array_equal(arr, expected),
               f"expected {expected.astype(int).tolist()}, got {arr.astype(int).tolist()} on {on}")


@exercise("4.2.2", hint="a hidden score must get weight 0 after the softmax, and a large score must not "
                        "overflow exp",
          answer_hint="set the masked scores (mask True) to -inf with np.where, subtract the row max, "
                      "exponentiate, divide by the row sum",
          forbid=["course.tensor.functional.softmax"], task="write the masked softmax in NumPy")
def _(candidate, rng):
    cases = [(np.zeros((3, 3)), _ref_mask(3), "zeros (3, 3), causal mask"),
             (np.array([[1.0, 2.0, 3.0]]), np.array([[False, False, True]]),
              "[[1, 2, 3]] with mask [[False, False, True]]"),
             (np.array([[1000.0, 1001.0, -1000.0, 5.0]]), np.zeros((1, 4), dtype=bool),
              "[[1000, 1001, -1000, 5]] (large scores), nothing masked"),
             (rng.normal(size=(4, 4)) * 3, _ref_mask(4), "random (4, 4), causal mask"),
             (rng.normal(size=(2, 3, 5, 5)), _ref_mask(5), "random (2, 3, 5, 5), causal mask (5, 5) broadcast"),
             (np.array([[1000.0, 999.0, 0.0], [-1000.0, -1001.0, -2000.0]]),
              np.array([[False, False, False], [False, False, True]]),
              "rows of very different scales [[1000, 999, 0], [-1000, -1001, -2000]], -2000 masked"),
             (np.array([[-1000.0, -1001.0, 1000.0]]), np.array([[False, False, True]]),
              "[[-1000, -1001, 1000]] with the large score masked")]
    for scores, mask, on in cases:
        got = call(candidate, scores.copy(), mask.copy(), on=on)
        expected = _ref_softmax(scores, mask)
        arr = np.asarray(got, dtype=np.float64)
        if arr.shape == expected.shape and not np.all(np.isfinite(arr)) and "different scales" in on:
            raise CheckFailed(f"the result holds nan or inf on {on}: one max for the whole array leaves a row far "
                              f"below it as 0/0; subtract each row's own max")
        if arr.shape == expected.shape and not np.all(np.isfinite(arr)) and "large score masked" in on:
            raise CheckFailed(f"the result holds nan or inf on {on}: a hidden score should not set the max that "
                              f"the row's visible scores are measured from")
        if arr.shape == expected.shape and not np.all(np.isfinite(arr)):
            raise CheckFailed(f"the result holds nan or inf on {on}: subtract the row max before np.exp")
        expect_close(got, expected, on=on, rtol=1e-6, atol=1e-9)


@exercise("4.2.3", hint="queries, keys and values are projections of x; compare every query with every key, "
                        "scaled by the key size, hide the future, and average the values with those weights",
          answer_hint="scores = q @ k.T / sqrt(d); mask the future with -inf; softmax over the last axis; "
                      "multiply by v",
          forbid=["course.tensor.functional.scaled_dot_product_attention", "course.gpt.CausalSelfAttention"],
          task="write the head in NumPy")
def _(candidate, rng):
    for T, C, d in [(1, 3, 2), (4, 4, 4), (5, 6, 3), (8, 8, 2)]:
        x = rng.normal(size=(T, C))
        w_q, w_k, w_v = (rng.normal(size=(C, d)) for _ in range(3))
        on = f"random x {x.shape} and weights {(C, d)}"
        got = call(candidate, x, w_q, w_k, w_v, on=on)
        expect(not isinstance(got, tuple), f"you returned a tuple of {len(got) if isinstance(got, tuple) else 0} "
                                           f"items on {on}: return only the output (T, d), not (output, weights)")
        _diagnose_head(got, x, w_q, w_k, w_v, on)
        expect_close(got, _ref_head(x, w_q, w_k, w_v), on=on, rtol=1e-6, atol=1e-9, what="output")


def _diagnose_head(got, x, w_q, w_k, w_v, on):
    """The classic mistakes of a causal head, named (each gives an output of the right shape)."""
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    T, d = q.shape
    if T == 1 or not isinstance(got, np.ndarray) or got.shape != (T, d):
        return
    scores, mask = q @ k.T / np.sqrt(d), _ref_mask(T)
    mistakes = [(_ref_softmax(scores, np.zeros_like(mask)) @ v,
                 "position 0 of your output mixes in the values of later positions: hide the future (the scores "
                 "above the diagonal) before the softmax"),
                (_ref_softmax(q @ k.T, mask) @ v, f"your scores are not divided by sqrt(d) = sqrt({d})"),
                (_column_softmax(np.where(mask, -np.inf, scores)) @ v,
                 "your weights sum to 1 down each column: the softmax goes over the keys, along each row")]
    for wrong, said in mistakes:
        if np.allclose(got, wrong, rtol=1e-6, atol=1e-9) \
                and not np.allclose(wrong, _ref_head(x, w_q, w_k, w_v), rtol=1e-6, atol=1e-9):
            raise CheckFailed(f"{said}, on {on}")


def _column_softmax(scores):
    e = np.exp(scores - scores.max(axis=0, keepdims=True))
    return e / e.sum(axis=0, keepdims=True)


@exercise("4.2.4", hint="first split the last axis into n_head pieces, then move the head axis in front of "
                        "the time axis (a reshape alone mixes positions)",
          answer_hint="x.reshape(B, T, n_head, C // n_head).transpose(0, 2, 1, 3)")
def _(candidate, rng):
    cases = [(np.arange(24.0).reshape(1, 3, 8), 2), (np.arange(24.0).reshape(1, 3, 8), 4),
             (rng.normal(size=(2, 5, 6)), 3), (rng.normal(size=(3, 4, 8)), 1),
             (rng.normal(size=(1, 2, 8)), 8)]
    for x, n_head in cases:
        B, T, C = x.shape
        on = f"x of shape {x.shape} with n_head={n_head}"
        got = call(candidate, x.copy(), n_head, on=on)
        expected = x.reshape(B, T, n_head, C // n_head).transpose(0, 2, 1, 3)
        expect_close(got, expected, on=on, rtol=0, atol=0)
