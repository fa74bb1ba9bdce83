"""Answers that look copied: across a class, and against the course's own solutions.

Each submission's exercise cells are compared, not its whole notebook: the lesson's text and code
are the same for everyone. Before comparing, an answer is reduced to its shape:
- comments, blank lines and spacing go (Python's own tokenizer reads the cell);
- every name becomes its order of first appearance (`grads` and `g` both become `n3` when they
  are the third name used), so renaming variables changes nothing;
- string literals become one token.
The shape is cut into overlapping runs of K tokens (shingles); the runs that are already in the
handed-out cell (the `def` line, the `check` call) are dropped, so what remains is what the learner
wrote. Two submissions of a lesson are as similar as the share of runs they have in common
(Jaccard: common / all). A pair at or above the threshold is flagged for a person to look at,
never marked down by this code: short exercises have few ways to be written, which is why a
submission with fewer than SMALLEST runs of its own (a few short answers: one exercise of
lesson 1.1 gives 30 to 60, all four of it 150 to 190) is never flagged.
"""

import io
import keyword
import re
import tokenize

K = 6              # tokens in a shingle
SMALLEST = 80      # shingles a submission must have of its own before it can be flagged
THRESHOLD = 0.8

_FALLBACK = re.compile(r"#[^\n]*|\"\"\"[\s\S]*?\"\"\"|'''[\s\S]*?'''|\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*'"
                       r"|[A-Za-z_]\w*|\d[\w.]*|[^\s\w]")


def shape(source):
    """The cell's tokens with names numbered by first use, strings as "S", no comments or spacing."""
    names, out = {}, []

    def name(word):
        if keyword.iskeyword(word):
            return word
        return names.setdefault(word, f"n{len(names)}")

    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.NAME:
                out.append(name(tok.string))
            elif tok.type == tokenize.STRING or tok.type == getattr(tokenize, "FSTRING_START", -1):
                out.append("S")
            elif tok.type in (tokenize.OP, tokenize.NUMBER):
                out.append(tok.string)
            elif tok.type in (tokenize.INDENT, tokenize.DEDENT):
                out.append("{" if tok.type == tokenize.INDENT else "}")
    except (tokenize.TokenError, IndentationError, SyntaxError):  # a cell that is not Python (a magic, a typo)
        out = []
        for word in _FALLBACK.findall(source):
            if word.startswith("#"):
                continue
            out.append("S" if word[0] in "\"'" else name(word) if word[0].isalpha() or word[0] == "_" else word)
    return out


def shingles(source):
    tokens = shape(source)
    return {" ".join(tokens[i:i + K]) for i in range(max(1, len(tokens) - K + 1))} if tokens else set()


def fingerprint(answers, handout):
    """The runs a learner wrote: {(exercise id, shingle)} of their answer cells, less the handout's."""
    return {(i, s) for i, source in answers.items() for s in shingles(source) - shingles(handout.get(i, ""))}


def similarity(a, b):
    return len(a & b) / len(a | b) if a and b else 0.0


def flag_pairs(prints, threshold=THRESHOLD):
    """[(key a, key b, similarity)] for every pair of fingerprints at or above the threshold, both
    large enough to be judged; keys in sorted order, so the report is the same however it is run."""
    keys = sorted(k for k, p in prints.items() if len(p) >= SMALLEST)
    pairs = []
    for n, a in enumerate(keys):
        for b in keys[n + 1:]:
            s = similarity(prints[a], prints[b])
            if s >= threshold:
                pairs.append((a, b, round(s, 3)))
    return pairs
