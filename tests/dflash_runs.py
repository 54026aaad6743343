"""The runs of the DFlash method tests (tests/test_dflash_method.py) that tests/test_dflash_onnx.py
repeats on ONNX Runtime: the prompts, and the checks of what a draft reads (a context cache that
records, or drops, positions; every draft's q against the torch drafter called alone)."""

from __future__ import annotations

from specdiff.methods.dflash import DFlashDrafts, RowContexts
from specdiff.sampling import Sampling

from tiny import TEXT

WORDS = TEXT.split()
PROMPTS = [" ".join(WORDS[i: i + 2 + i % 6]) for i in range(0, 60, 2)]  # 30 prompts, 2-7 words
MAX_NEW = 24


class Recording(RowContexts):
    """RowContexts that records the most positions a row had cached when it drafted."""

    most = 0

    def read(self, rows, batch):
        cache, counts = super().read(rows, batch)
        Recording.most = max(Recording.most, int(counts.max()))
        return cache, counts


class SkipsOne(Recording):
    """A context cache that reports one position more than it holds: that verified position's
    features never reach the drafter."""

    def read(self, rows, batch):
        cache, counts = super().read(rows, batch)
        return cache, counts + (counts > 0).long()


def checked_against(target, drafter, gaps: list[float]):
    """DFlashDrafts.__call__ that also appends to `gaps`, for each draft, max |q - the torch
    `drafter` called alone on the torch `target`'s hidden states of positions 0 .. start - 1
    computed from scratch| (q warped at temperature 1)."""
    original, sampling = DFlashDrafts.__call__, Sampling(1.0)

    def checked(self, batch, g):
        drafts = original(self, batch, g)
        for row, d, g_b in zip(batch, drafts, g):
            if g_b:
                ids = row.tensor()
                hidden = target.model(ids[:, :-1], output_hidden_states=True).hidden_states
                alone = drafter(ids[:, -1], drafter.features(hidden), ids.shape[1] - 1)[..., :target.vocab_size]
                gaps.append(float((d.q - sampling.probs(alone)[:, :g_b]).abs().max()))
        return drafts

    return checked
