"""Broad training prompts: which samples of the target's own user turns to keep, and how diverse
they are (scripts/smol/broad.py makes them; the held-out sets must not be among them).

Kept: a turn that ended (the target closed it), of MIN_WORDS..MAX_WORDS words, in English (mostly
ASCII letters and a common English word), not a refusal, no chat markup; then no exact duplicate
(the same words, case and punctuation aside) and no near-duplicate: word 3-gram sets with Jaccard
similarity >= NEAR, found by MinHash with banded locality-sensitive hashing (HASHES = BANDS x ROWS
hash functions; a pair at Jaccard 0.7 becomes a candidate with probability 1 - (1 - 0.7^4)^16 =
0.99) and every candidate checked exactly. Deterministic: the hashes are CRC-32 and fixed affine
maps, so the same samples give the same set on any machine.

May import: torch-free; the standard library and numpy only.
"""

from __future__ import annotations

import re
import zlib
from collections import Counter
from typing import Iterable, Sequence

import numpy as np

MIN_WORDS, MAX_WORDS = 4, 80
NEAR = 0.7
BANDS, ROWS = 16, 4
HASHES = BANDS * ROWS
_PRIME = (1 << 61) - 1
_RNG = np.random.default_rng(20261207)
_A = _RNG.integers(1, 1 << 31, HASHES, dtype=np.uint64)
_B = _RNG.integers(0, 1 << 31, HASHES, dtype=np.uint64)
WORD = re.compile(r"[^\W_]+(?:'[^\W_]+)*")
REFUSAL = re.compile(r"\b(i'?m sorry|i cannot|i can't|as an ai|language model)\b", re.I)
ENGLISH = frozenset("""the a an to of and or is are was were be it this that what how why who when where which i
you me my your we they can could should would will in for from at by on with if not do does calculate solve write
list give explain tell name describe""".split())
CATEGORY_WORDS: dict[str, str] = {  # first match wins: a keyword classifier, for measuring spread
    "code": r"\b(code|function|program|script|sql|query|javascript|java|python|c\+\+|html|css|bash|algorithm|api|array)\b",
    "reasoning": r"\b(calculate|solve|sum|how many|how much|equation|percent|average|\d+\s*[-+*/x]\s*\d+)\b",
    "creative": r"\b(story|poem|haiku|letter|imagine|compose|song|lyrics|creative|dialogue)\b",
    "summarise": r"\b(summari[sz]e|summary|rewrite|paraphrase|shorten)\b",
    "compare": r"\b(compare|difference|versus|vs|better|pros and cons|advantages)\b",
    "lists": r"^(list|name|give me|suggest|what are some)\b",
    "advice": r"^(i|i'm|my|should i)\b|\b(advice|tips?)\b",
    "how-to": r"^(how do|how can|how to|steps)\b|\bhow (do|can) i\b",
    "explain": r"^(explain|describe|why|what is|what are|what does)\b",
    "facts": r"^(who|when|where|which|what)\b",
}
_CATEGORY_RES = {c: re.compile(p, re.I) for c, p in CATEGORY_WORDS.items()}


def words(text: str) -> list[str]:
    return WORD.findall(text.lower())


def shingles(text: str, n: int = 3) -> frozenset[str]:
    """The word n-grams of text (the whole text when it has fewer than n words)."""
    w = words(text)
    return frozenset(" ".join(w[i:i + n]) for i in range(max(1, len(w) - n + 1)))


def usable(text: str) -> str | None:
    """Why a sampled turn is not kept (None: it is)."""
    w = words(text)
    letters = [c for c in text if c.isalpha()]
    if not MIN_WORDS <= len(w) <= MAX_WORDS:
        return "length"
    if "<|" in text or "|>" in text:
        return "markup"
    if sum(c.isascii() for c in letters) < 0.95 * len(letters) or not ENGLISH.intersection(w):
        return "language"
    if REFUSAL.search(text):
        return "refusal"
    return None


def minhash(s: frozenset[str]) -> np.ndarray:
    """The HASHES minimum hash values of a shingle set -> (HASHES,) uint64."""
    x = np.array([zlib.crc32(t.encode()) for t in s], dtype=np.uint64)[:, None]  # (n, 1)
    h: np.ndarray = ((x * _A + _B) % np.uint64(_PRIME)).min(axis=0)
    return h


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    return len(a & b) / len(a | b)


class NearDuplicates:
    """An index of kept texts: add(text) keeps it unless it is (near-)equal to one already kept."""

    def __init__(self) -> None:
        self.exact: set[str] = set()
        self.sets: list[frozenset[str]] = []
        self.buckets: dict[tuple[int, bytes], list[int]] = {}

    def seen(self, text: str) -> bool:
        """Whether text is equal (case and punctuation aside) or near to a kept text."""
        return " ".join(words(text)) in self.exact or self._near(shingles(text)) is not None

    def add(self, text: str) -> bool:
        """Keep text unless it duplicates a kept one -> whether it was kept."""
        if self.seen(text):
            return False
        s = shingles(text)
        self.exact.add(" ".join(words(text)))
        self.sets.append(s)
        for key in _bands(s):
            self.buckets.setdefault(key, []).append(len(self.sets) - 1)
        return True

    def _near(self, s: frozenset[str]) -> int | None:
        """The index of a kept set within NEAR of s among those sharing a band with it, else None."""
        for key in _bands(s):
            for i in self.buckets.get(key, ()):
                if jaccard(s, self.sets[i]) >= NEAR:
                    return i
        return None


def _bands(s: frozenset[str]) -> list[tuple[int, bytes]]:
    """The LSH keys of a shingle set: its MinHash signature cut into BANDS bands of ROWS values."""
    sig = minhash(s)
    return [(band, sig[band * ROWS:(band + 1) * ROWS].tobytes()) for band in range(BANDS)]


def category(text: str) -> str:
    """The first CATEGORY_WORDS class whose keywords text holds, else 'other'."""
    return next((c for c, r in _CATEGORY_RES.items() if r.search(text)), "other")


def diversity(texts: Sequence[str]) -> dict[str, object]:
    """How spread a prompt set is: its size, categories by keyword, and distinct n-grams (distinct
    over all n-grams, n = 1, 2, 3: distinct-n of the dialogue literature)."""
    out: dict[str, object] = {"prompts": len(texts),
                              "categories": dict(Counter(category(t) for t in texts).most_common())}
    for n in (1, 2, 3):
        grams = [g for t in texts for g in _ngrams(words(t), n)]
        out[f"distinct_{n}"] = round(len(set(grams)) / max(1, len(grams)), 4)
    return out


def _ngrams(w: list[str], n: int) -> Iterable[str]:
    return (" ".join(w[i:i + n]) for i in range(len(w) - n + 1))
