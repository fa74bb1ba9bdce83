"""The tokenizers of lesson 4.1: round-trips, errors, files, and BPE training against a slow reference."""

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from course.data import load_shakespeare
from course.gpt import BPETokenizer, CharTokenizer
from course.gpt.tokenizer import SPLIT_PATTERN

pytestmark = pytest.mark.part4

SAMPLE = load_shakespeare()[:20_000]


@pytest.fixture(scope="module")
def bpe():
    return BPETokenizer.train(SAMPLE, 400)


# ---- CharTokenizer -------------------------------------------------------------------------


ALPHABET = "abcxyz ,.\n'éü🙂"


@given(st.text(alphabet=ALPHABET))
def test_char_round_trip_on_its_alphabet(s):
    tok = CharTokenizer(ALPHABET)
    ids = tok.encode(s)
    assert len(ids) == len(s)
    assert all(0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == s


def test_char_vocabulary_is_sorted_and_complete():
    tok = CharTokenizer.from_text("hello world")
    assert tok.vocab_size == len(set("hello world"))
    assert [tok.itos[i] for i in range(tok.vocab_size)] == sorted(set("hello world"))
    assert all(tok.stoi[c] == i for i, c in tok.itos.items())


def test_char_unknown_character_is_named_with_its_position():
    tok = CharTokenizer("abc")
    with pytest.raises(ValueError, match=r"'z'.*position 2"):
        tok.encode("abz")


def test_char_unknown_id_is_named():
    tok = CharTokenizer("abc")
    with pytest.raises(ValueError, match="token id 7"):
        tok.decode([0, 7])


def test_char_save_load(tmp_path):
    tok = CharTokenizer(SAMPLE + "é🙂")
    tok.save(tmp_path / "char.json")
    back = CharTokenizer.load(tmp_path / "char.json")
    assert back == tok
    assert back.encode("To be é🙂") == tok.encode("To be é🙂")


# ---- BPETokenizer --------------------------------------------------------------------------


@given(st.text())
def test_bpe_round_trip_on_any_text(s):
    tok = _trained()
    assert tok.decode(tok.encode(s)) == s


@given(st.text())
def test_bpe_split_covers_the_text(s):
    assert "".join(BPETokenizer().split(s)) == s


@pytest.mark.parametrize("s", ["", " ", "\n\n", "🙂", "naïve café", "x\ud800y", "a_b__c 12³ ½ \t end  "])
def test_bpe_round_trip_on_hard_strings(bpe, s):
    assert bpe.decode(bpe.encode(s)) == s
    assert BPETokenizer(pattern=None).decode(BPETokenizer(pattern=None).encode(s)) == s


def test_bpe_bare_tokenizer_is_bytes():
    tok = BPETokenizer()
    assert tok.vocab_size == 256
    assert tok.encode("hé") == list("hé".encode("utf-8"))


def test_bpe_vocab_size_is_respected(bpe):
    assert bpe.vocab_size == 400
    assert len(bpe.merges) == 144
    assert set(bpe.vocab) == set(range(400))
    assert max(bpe.encode(SAMPLE)) < 400
    with pytest.raises(ValueError, match="at least 256"):
        BPETokenizer.train("abc", 100)


def test_bpe_stops_early_when_no_pair_repeats():
    tok = BPETokenizer.train("abab", 1000, pattern=None)
    assert tok.vocab_size == 257  # only "ab" occurs twice
    assert tok.encode("abab") == [256, 256]


def test_bpe_merges_reduce_length(bpe):
    small = BPETokenizer.train(SAMPLE, 300)
    n_bytes = len(SAMPLE.encode("utf-8"))
    n_small, n_big = len(small.encode(SAMPLE)), len(bpe.encode(SAMPLE))
    assert n_big < n_small < n_bytes
    assert n_bytes / n_big > 1.6


def test_bpe_tokens_stay_inside_chunks(bpe):
    # with the pre-split pattern no token holds a letter followed by a space
    for i in range(256, bpe.vocab_size):
        piece = bpe.vocab[i]
        assert b" " not in piece.lstrip(b" ") or piece.strip() == b""


def test_bpe_is_deterministic(bpe):
    again = BPETokenizer.train(SAMPLE, 400)
    assert again.merges == bpe.merges
    assert again.encode(SAMPLE[:500]) == bpe.encode(SAMPLE[:500])


def test_bpe_unknown_id_is_named(bpe):
    with pytest.raises(ValueError, match="token id 400"):
        bpe.decode([1, 400])


def test_bpe_decode_of_a_cut_character_does_not_raise():
    tok = BPETokenizer()
    ids = tok.encode("é")
    assert tok.decode(ids[:1]) == "\ufffd"


def test_bpe_save_load(tmp_path, bpe):
    bpe.save(tmp_path / "bpe.json")
    back = BPETokenizer.load(tmp_path / "bpe.json")
    assert back == bpe
    assert back.encode(SAMPLE[:2000]) == bpe.encode(SAMPLE[:2000])
    CharTokenizer("ab").save(tmp_path / "char.json")
    with pytest.raises(ValueError, match="does not hold a BPETokenizer"):
        BPETokenizer.load(tmp_path / "char.json")


def _slow_train(text, vocab_size, pattern):
    """The textbook algorithm: recount every pair before every merge."""
    tok = BPETokenizer(pattern=pattern)
    freqs = Counter(tok.split(text))
    words = {w: list(w.encode("utf-8")) for w in freqs}
    merges = []
    while 256 + len(merges) < vocab_size:
        counts = Counter()
        for w, ids in words.items():
            for pair in zip(ids, ids[1:]):
                counts[pair] += freqs[w]
        if not counts:
            break
        pair = min(counts, key=lambda p: (-counts[p], p))
        if counts[pair] < 2:
            break
        new_id = 256 + len(merges)
        merges.append(pair)
        for w, ids in words.items():
            out, i = [], 0
            while i < len(ids):
                if i + 1 < len(ids) and (ids[i], ids[i + 1]) == pair:
                    out.append(new_id)
                    i += 2
                else:
                    out.append(ids[i])
                    i += 1
            words[w] = out
    return merges


@pytest.mark.parametrize("pattern", [SPLIT_PATTERN, None])
def test_bpe_training_matches_the_slow_algorithm(pattern):
    text = SAMPLE[:3000] + " aaaaaaa aaa ééé 🙂🙂🙂"
    fast = BPETokenizer.train(text, 330, pattern=pattern)
    assert fast.merges == _slow_train(text, 330, pattern)


_TRAINED = []


def _trained():
    if not _TRAINED:
        _TRAINED.append(BPETokenizer.train(SAMPLE + " café 🙂 naïve", 350))
    return _TRAINED[0]
