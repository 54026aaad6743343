"""The runs of the EAGLE-3 method tests (tests/test_eagle3_method.py) that tests/test_eagle3_onnx.py
repeats on ONNX Runtime: the prompts, and the check of every draft's q against the chain EAGLE-3
defines, computed from scratch."""

from __future__ import annotations

import torch

from specdiff.methods.eagle3 import Eagle3Drafts
from specdiff.sampling import Sampling

from tiny import TEXT

WORDS = TEXT.split()
PROMPTS = [" ".join(WORDS[i: i + 2 + i % 6]) for i in range(0, 40, 2)]  # 20 prompts, 2-7 words
MAX_NEW = 20


@torch.no_grad()
def from_scratch(target, drafter, ids: list[int], drafted: list[int], sampling: Sampling, shift: int = 0) -> torch.Tensor:
    """The q EAGLE-3 defines for each token of `drafted` after `ids`, with no cache: the target's
    hidden states of positions 0..start - 1 (start = len(ids) - 1), context row p = (features p,
    token p + 1 + shift) at position p, then each drafted token with the previous row's output,
    the whole sequence recomputed at each step -> (g, V) over the target's ids."""
    start = len(ids) - 1
    x = torch.tensor([ids])
    hidden = drafter.net.project(drafter.features(target.model(x[:, :start], output_hidden_states=True).hidden_states))
    tokens = x[:, 1 + shift:start + 1 + shift]
    qs = []
    for d in drafted:
        out = drafter.net(drafter.embed(tokens), hidden, torch.arange(tokens.shape[1])[None])
        qs.append(drafter.draft_vocab.widen_probs(sampling.probs(drafter.logits(out[:, -1]))))  # (1, V)
        tokens, hidden = torch.cat([tokens, torch.tensor([[d]])], 1), torch.cat([hidden, out[:, -1:]], 1)
    return torch.cat(qs)


def checked_against(target, drafter, sampling, gaps: list[float], shift: int):
    original = Eagle3Drafts.__call__

    def call(self, batch, g):
        drafts = original(self, batch, g)
        for row, d, g_b in zip(batch, drafts, g):
            if g_b and len(row.ids) > 1:
                want = from_scratch(target, drafter, row.ids, d.tokens[0].tolist(), sampling, shift)
                gaps.append(float((d.q[0] - want).abs().max()))
        return drafts
    return call
