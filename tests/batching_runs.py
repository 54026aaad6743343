"""The prompts of the batching tests (tests/test_batching.py), which tests/test_compiled.py runs
again on compiled steps: very different lengths, the longest reaching the tiny models' window."""

from tiny import TEXT

WORDS = TEXT.split()
SIZES = [1, 12, 3, 20, 2, 7, 1, 16, 5, 36, 4, 2]  # words: 1 to 116 tokens; the longest reaches the window (128)
PROMPTS = [" ".join((WORDS * 2)[i: i + n]) for i, n in zip(range(0, 200, 13), SIZES)]
MAX_NEW = 24
