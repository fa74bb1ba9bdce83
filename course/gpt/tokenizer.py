"""Tokenizers of lesson 4.1: text in, integer ids out, and back.

    CharTokenizer(text)                 one id per distinct character of `text`
    BPETokenizer.train(text, 512)       byte-level byte-pair encoding with learned merges
    tok.encode(str) -> list[int]        tok.decode(ids) -> str
    tok.save(path), Class.load(path)    JSON files
    BPETokenizer.from_pretrained(src)   GPT-2's tokenizer, from vocab.json + merges.txt (lesson 4.5)

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

__all__ = ["CharTokenizer", "BPETokenizer", "SPLIT_PATTERN", "GPT2_SPLIT_PATTERN", "bytes_to_unicode"]


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

# GPT-2's own pattern, character for character: the same idea, written with Unicode properties
# (\p{L} a letter, \p{N} a number: in any script), which need the `regex` package.
GPT2_SPLIT_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def _compile(pattern):
    """`re` for the course's pattern; `regex` (a well-kept superset of `re`) when it uses \\p{...}."""
    if not pattern:
        return None
    if "\\p{" in pattern:
        import regex

        return regex.compile(pattern)
    return re.compile(pattern)


def bytes_to_unicode():
    """GPT-2's table byte -> a printable character, so that its files can list tokens as text.

    The 188 bytes that are printable characters by themselves ('!'..'~', '¡'..'¬', '®'..'ÿ') stand
    for themselves; the 68 others (control bytes, the space, ...) get the characters from U+0100 on,
    in byte order. So the space (byte 32) is written 'Ġ' (U+0120) and a newline 'Ċ' (U+010A).
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


class BPETokenizer:
    """Byte-level byte-pair encoding.

    Ids 0..255 are the bytes; id 256 + k is the k-th learned merge. `merges` is the ordered list
    of merged pairs, and `vocab[id]` is the bytes a token stands for.

    Build one with the classmethod `BPETokenizer.train(text, vocab_size)`, or `BPETokenizer()`
    for the bare byte tokenizer (vocabulary of 256, no merges).
    """

    def __init__(self, merges=(), pattern=SPLIT_PATTERN):
        self.pattern = pattern
        self._split = _compile(pattern)
        # A tokenizer read from GPT-2's files (from_pretrained) numbers its tokens as the files do,
        # and knows special tokens; the course's own numbering and none, otherwise.
        self._to_file = self._from_file = self._special_re = None
        self.special_tokens, self._special_ids = {}, {}
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
        if self._from_file is not None:
            return max([*self._from_file, *self.special_tokens.values()]) + 1
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
        if self.special_tokens:  # a special token in the text is that token, never split into pieces
            out = []
            for k, piece in enumerate(self._special_re.split(text)):
                if k % 2:
                    out.append(self.special_tokens[piece])
                else:
                    out.extend(self._encode_plain(piece))
            return out
        return self._encode_plain(text)

    def _encode_plain(self, text):
        out = []
        for chunk in self.split(text):
            out.extend(self._encode_chunk(chunk))
        if self._to_file is not None:
            return [self._to_file[i] for i in out]
        return out

    def decode_bytes(self, ids):
        if self._from_file is not None:
            pieces = []
            for i in ids:
                i = int(i)
                if i in self._special_ids:
                    pieces.append(self._special_ids[i].encode("utf-8"))
                elif i in self._from_file:
                    pieces.append(self.vocab[self._from_file[i]])
                else:
                    raise ValueError(f"token id {i} is not in the vocabulary of {self.vocab_size} tokens")
            return b"".join(pieces)
        return b"".join(_look_up(self.vocab, ids))

    def decode(self, ids):
        """The text of a list of ids. Ids that do not form valid UTF-8 (for example a sequence
        cut in the middle of a multi-byte character) decode to U+FFFD there."""
        data = self.decode_bytes(ids)
        if self._from_file is not None:  # as GPT-2's tokenizer does
            return data.decode("utf-8", errors="replace")
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
        if self._to_file is not None:
            raise ValueError("save: this tokenizer was read from GPT-2's files, whose ids and special tokens the "
                             "course's JSON format cannot hold: write it with save_pretrained(folder)")
        data = {"type": "bpe", "version": 1, "pattern": self.pattern,
                "merges": [list(p) for p in self.merges]}
        Path(path).write_text(json.dumps(data), encoding="utf-8")

    @classmethod
    def load(cls, path):
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        if data.get("type") != "bpe":
            raise ValueError(f"{path} does not hold a BPETokenizer (type {data.get('type')!r})")
        return cls(data["merges"], pattern=data.get("pattern"))

    @classmethod
    def from_pretrained(cls, source):
        """GPT-2's tokenizer (or one in its format) from a folder holding vocab.json and merges.txt,
        or a hub name such as "gpt2" (downloaded with huggingface_hub).

        It is this class with GPT-2's split pattern and its merges, and only two differences: the
        files number the tokens their own way (the byte '!' is id 0 in GPT-2, not 33), so ids are
        translated on the way out and in; and `<|endoftext|>` is a special token: written in the
        text, it becomes its one id.
        """
        from ..pretrained import CheckpointError, resolve

        folder = resolve(source, ["vocab.json", "merges.txt"])
        vocab_file, merges_file = folder / "vocab.json", folder / "merges.txt"
        for f in (vocab_file, merges_file):
            if not f.is_file():
                raise CheckpointError(f"{f}: file not found (GPT-2's tokenizer is two files, vocab.json "
                                      f"and merges.txt, in one folder)")
        try:
            file_vocab = json.loads(vocab_file.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CheckpointError(f"{vocab_file}: not a JSON file ({e})") from None
        if not isinstance(file_vocab, dict) or not all(isinstance(v, int) for v in file_vocab.values()):
            raise CheckpointError(f"{vocab_file}: expected a JSON object token -> integer id")
        try:
            lines = merges_file.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError as e:
            raise CheckpointError(f"{merges_file}: not a text file ({e})") from None

        to_byte = {ch: b for b, ch in bytes_to_unicode().items()}
        ids_of = {ch: [b] for ch, b in to_byte.items()}  # a token's text in the files -> its course ids
        pairs, texts = [], [ch for ch in bytes_to_unicode().values()]  # texts[c]: course id c's text
        for n, line in enumerate(lines, start=1):
            if not line.strip() or (n == 1 and line.startswith("#version")):
                continue
            parts = line.split(" ")
            if len(parts) != 2 or parts[0] not in ids_of or parts[1] not in ids_of:
                raise CheckpointError(f"{merges_file}, line {n}: {line[:60]!r} is not a merge of two known tokens "
                                      f"('a b', each made by the bytes or the merges above it)")
            pairs.append(parts)
            ids_of.setdefault(parts[0] + parts[1], []).append(len(texts))
            texts.append(parts[0] + parts[1])
        tok = cls([(ids_of[a][0], ids_of[b][0]) for a, b in pairs], pattern=GPT2_SPLIT_PATTERN)
        # Two merges may make the same text ("ab c" and "a bc"): the files know one token, so every
        # course id of that text must take part in the merges that use it.
        for k, (a, b) in enumerate(pairs):
            for x in ids_of[a]:
                for y in ids_of[b]:
                    tok.ranks.setdefault((x, y), 256 + k)
        to_file, from_file, special = [], {}, {}
        for c, text in enumerate(texts):
            if text not in file_vocab:
                made = f"byte 0x{c:02X}" if c < 256 else f"merges.txt, merge {c - 255}"
                raise CheckpointError(f"{vocab_file}: the token {text!r} ({made}) has no id")
            to_file.append(file_vocab[text])
        for text, i in file_vocab.items():
            if text in ids_of:
                from_file[i] = ids_of[text][0]
            else:  # no byte or merge makes it: a special token, such as <|endoftext|>, matched whole in the text
                special[text] = i
        tok._to_file = to_file
        tok._from_file = from_file
        tok.special_tokens = special
        tok._special_ids = {i: t for t, i in special.items()}
        tok._special_re = re.compile("(" + "|".join(re.escape(t) for t in sorted(special, key=len, reverse=True))
                                     + ")") if special else None
        return tok

    def save_pretrained(self, folder):
        """Write GPT-2's two files for this tokenizer (vocab.json, merges.txt); returns the folder.

        Tokens are written as text through GPT-2's byte table; the ids are the ones `encode` gives.
        from_pretrained reads them back with GPT-2's split pattern, so a tokenizer trained with
        another pattern encodes the same text differently there.
        """
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        table = bytes_to_unicode()
        text = {c: "".join(table[b] for b in self.vocab[c]) for c in range(256 + len(self.merges))}
        ids = self._to_file if self._to_file is not None else list(range(256 + len(self.merges)))
        vocab = {}
        for c, t in text.items():
            if t in vocab and vocab[t] != ids[c]:
                raise ValueError(f"save_pretrained: two tokens ({vocab[t]} and {ids[c]}) stand for the same bytes "
                                 f"{self.vocab[c]!r}; vocab.json can hold only one of them")
            vocab[t] = ids[c]
        vocab.update(self.special_tokens)
        merges = ["#version: 0.2"] + [f"{text[a]} {text[b]}" for a, b in self.merges]
        (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
        (folder / "merges.txt").write_text("\n".join(merges) + "\n", encoding="utf-8")
        return folder

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
