"""Tokenizers of lesson 4.1: text in, integer ids out, and back.

    CharTokenizer(text)                 one id per distinct character of `text`
    BPETokenizer.train(text, 512)       byte-level byte-pair encoding with learned merges
    tok.encode(str) -> list[int]        tok.decode(ids) -> str
    tok.save(path), Class.load(path)    JSON files

The character tokenizer is the simplest thing that works, but it only knows the characters it
was built from. The byte-level BPE tokenizer starts from the 256 possible bytes, so it can encode
any string at all, and then learns merges (pairs of tokens that often stand side by side become
one new token) so common pieces of words cost one id instead of several.
"""

import heapq
import json
import re
from collections import Counter
from pathlib import Path

__all__ = ["CharTokenizer", "BPETokenizer", "SPLIT_PATTERN"]


def _describe(ch):
    return f"{ch!r} (U+{ord(ch):04X})"


def _look_up(table, ids):
    """What each id stands for in `table` (id -> piece), naming the first id it does not hold."""
    pieces = []
    for i in ids:
        piece = table.get(int(i))
        if piece is None:
            raise ValueError(f"token id {int(i)} is not in the vocabulary (ids run from 0 to {len(table) - 1})")
        pieces.append(piece)
    return pieces


class CharTokenizer:
    """One token per character; the vocabulary is the sorted set of characters of a text.

    `stoi` maps a character to its id, `itos` an id to its character.
    """

    def __init__(self, text="", chars=None):
        chars = sorted(set(text)) if chars is None else list(chars)
        if len(set(chars)) != len(chars):
            raise ValueError("the characters of a CharTokenizer must be distinct")
        self.itos = {i: ch for i, ch in enumerate(chars)}
        self.stoi = {ch: i for i, ch in enumerate(chars)}

    @classmethod
    def from_text(cls, text):
        return cls(text)

    @property
    def vocab_size(self):
        return len(self.itos)

    def encode(self, text):
        try:
            return [self.stoi[ch] for ch in text]
        except KeyError:
            # Find where, so the message can say which character and where it stands.
            for pos, ch in enumerate(text):
                if ch not in self.stoi:
                    raise ValueError(
                        f"character {_describe(ch)} at position {pos} is not in the vocabulary: "
                        f"this tokenizer knows only the {self.vocab_size} characters of the text "
                        f"it was built from") from None
            raise

    def decode(self, ids):
        return "".join(_look_up(self.itos, ids))

    def save(self, path):
        data = {"type": "char", "chars": [self.itos[i] for i in range(self.vocab_size)]}
        Path(path).write_text(json.dumps(data, ensure_ascii=True), encoding="utf-8")

    @classmethod
    def load(cls, path):
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        if data.get("type") != "char":
            raise ValueError(f"{path} does not hold a CharTokenizer (type {data.get('type')!r})")
        return cls(chars=data["chars"])

    def __eq__(self, other):
        return isinstance(other, CharTokenizer) and self.itos == other.itos

    def __repr__(self):
        return f"CharTokenizer(vocab_size={self.vocab_size})"


# Pre-splitting, in the spirit of GPT-2: a text is cut into word-like chunks and merges are learned
# (and applied) inside each chunk only, so a token never spans "the end of one word + the start of
# the next". Python's `re` has no \p{L}, so letters are written [^\W\d_] (a word character that is
# neither a digit nor an underscore). The alternatives cover every character, so the chunks always
# join back into the text:
#   's 't 're 've 'm 'll 'd    English contractions (and Shakespeare's "call'd")
#   ' ?letters'                a word, with the space before it
#   ' ?digits'                 a number
#   ' ?other'                  punctuation, symbols, underscores
#   '\s+(?!\S)' then '\s+'     runs of whitespace, leaving the last space to the next word
SPLIT_PATTERN = r"""'(?:[stdm]|re|ve|ll)| ?[^\W\d_]+| ?\d+| ?(?:[^\s\w]|_)+|\s+(?!\S)|\s+"""


class BPETokenizer:
    """Byte-level byte-pair encoding.

    Ids 0..255 are the bytes; id 256 + k is the k-th learned merge. `merges` is the ordered list
    of merged pairs, and `vocab[id]` is the bytes a token stands for.

    Build one with the classmethod `BPETokenizer.train(text, vocab_size)`, or `BPETokenizer()`
    for the bare byte tokenizer (vocabulary of 256, no merges).
    """

    def __init__(self, merges=(), pattern=SPLIT_PATTERN):
        self.pattern = pattern
        self._split = re.compile(pattern) if pattern else None
        self.merges = [tuple(int(t) for t in pair) for pair in merges]
        self.ranks = {}  # pair -> new id; a lower id was learned earlier and is applied first
        self.vocab = {i: bytes([i]) for i in range(256)}
        for k, (a, b) in enumerate(self.merges):
            new_id = 256 + k
            if a not in self.vocab or b not in self.vocab:
                raise ValueError(f"merge {k} ({a}, {b}) uses an id that does not exist yet")
            self.ranks[(a, b)] = new_id
            self.vocab[new_id] = self.vocab[a] + self.vocab[b]
        self._cache = {}

    @property
    def vocab_size(self):
        return 256 + len(self.merges)

    def split(self, text):
        """The chunks merges stay inside of (the whole text when there is no pattern)."""
        if self._split is None:
            return [text] if text else []
        return self._split.findall(text)

    @staticmethod
    def _bytes(text):
        # "surrogatepass" lets even a lone surrogate (a str Python allows) round-trip.
        return text.encode("utf-8", errors="surrogatepass")

    # ---- training ----------------------------------------------------------------------------

    @classmethod
    def train(cls, text, vocab_size, pattern=SPLIT_PATTERN, verbose=False):
        """Learn `vocab_size - 256` merges from `text` and return the tokenizer.

        Training stops early (a smaller vocabulary) when no pair occurs twice any more.

        The text is reduced to its distinct chunks with their counts ("the" may appear 20,000
        times but is one entry). Pair counts are computed once, then after each merge only the
        chunks holding the merged pair are rewritten and their pair counts updated. A heap finds
        the most frequent pair; entries whose count went stale are skipped when popped.
        """
        if vocab_size < 256:
            raise ValueError(f"a byte-level vocabulary has at least 256 tokens, got vocab_size={vocab_size}")
        tok = cls(pattern=pattern)
        freqs = Counter(tok.split(text))
        words = [list(cls._bytes(w)) for w in freqs]
        counts = list(freqs.values())

        pair_count = Counter()
        where = {}  # pair -> indices of the words that hold it (may hold stale entries)
        for w, (ids, n) in enumerate(zip(words, counts)):
            for pair in zip(ids, ids[1:]):
                pair_count[pair] += n
                where.setdefault(pair, set()).add(w)
        # Ties go to the smallest pair, so training is the same on every run and machine.
        heap = [(-c, pair) for pair, c in pair_count.items()]
        heapq.heapify(heap)

        merges = []
        while len(merges) < vocab_size - 256 and heap:
            neg, pair = heapq.heappop(heap)
            if pair_count.get(pair, 0) != -neg:
                continue  # stale: this pair's count changed after this entry was pushed
            if -neg < 2:
                break  # merging a pair seen once would not compress anything
            new_id = 256 + len(merges)
            merges.append(pair)
            if verbose:
                print(f"merge {len(merges)}: {pair} -> {new_id} ({-neg} times)")
            changed = set()
            for w in where.pop(pair, ()):
                ids, n = words[w], counts[w]
                merged = _merge(ids, pair, new_id)
                if len(merged) == len(ids):
                    continue  # a stale entry of `where`: the pair is gone from this word
                for old in zip(ids, ids[1:]):
                    pair_count[old] -= n
                    changed.add(old)
                for new in zip(merged, merged[1:]):
                    pair_count[new] += n
                    changed.add(new)
                    where.setdefault(new, set()).add(w)
                words[w] = merged
            for p in changed:
                c = pair_count[p]
                if c <= 0:
                    del pair_count[p]
                elif p != pair:
                    heapq.heappush(heap, (-c, p))
            pair_count.pop(pair, None)
        return cls(merges, pattern=pattern)

    # ---- encoding and decoding ---------------------------------------------------------------

    def _encode_chunk(self, chunk):
        ids = self._cache.get(chunk)
        if ids is None:
            ids = list(self._bytes(chunk))
            while len(ids) >= 2:
                # The pair learned first among those present is merged first, as in training.
                best = min(zip(ids, ids[1:]), key=lambda p: self.ranks.get(p, float("inf")))
                if best not in self.ranks:
                    break
                ids = _merge(ids, best, self.ranks[best])
            if len(self._cache) < 200_000:
                self._cache[chunk] = ids
        return ids

    def encode(self, text):
        out = []
        for chunk in self.split(text):
            out.extend(self._encode_chunk(chunk))
        return out

    def decode_bytes(self, ids):
        return b"".join(_look_up(self.vocab, ids))

    def decode(self, ids):
        """The text of a list of ids. Ids that do not form valid UTF-8 (for example a sequence
        cut in the middle of a multi-byte character) decode to U+FFFD there."""
        data = self.decode_bytes(ids)
        try:
            return data.decode("utf-8", errors="surrogatepass")
        except UnicodeDecodeError:
            return data.decode("utf-8", errors="replace")

    def token_str(self, i):
        """A readable form of one token (invalid UTF-8 shows as escaped bytes)."""
        data = self.decode_bytes([i])
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            return str(data)[2:-1]

    # ---- files -------------------------------------------------------------------------------

    def save(self, path):
        data = {"type": "bpe", "version": 1, "pattern": self.pattern,
                "merges": [list(p) for p in self.merges]}
        Path(path).write_text(json.dumps(data), encoding="utf-8")

    @classmethod
    def load(cls, path):
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        if data.get("type") != "bpe":
            raise ValueError(f"{path} does not hold a BPETokenizer (type {data.get('type')!r})")
        return cls(data["merges"], pattern=data.get("pattern"))

    def __eq__(self, other):
        return (isinstance(other, BPETokenizer) and self.merges == other.merges
                and self.pattern == other.pattern)

    def __repr__(self):
        return f"BPETokenizer(vocab_size={self.vocab_size})"


def _merge(ids, pair, new_id):
    """Replace every occurrence of `pair` in `ids`, left to right, by `new_id`."""
    a, b = pair
    out = []
    i, n = 0, len(ids)
    while i < n:
        if i + 1 < n and ids[i] == a and ids[i + 1] == b:
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out
