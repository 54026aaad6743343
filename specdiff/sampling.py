"""Logits -> the probabilities tokens are drawn from. One function serves the target (p) and the
drafter (q), so both are warped identically, as exactness requires (docs/lossless.md).

Temperature 0 means greedy: the "distribution" is one-hot on the argmax (first index on ties).
Otherwise: divide by temperature, keep the top_k largest logits (0 = all), keep the smallest set of
tokens whose probability reaches top_p (always at least the most likely one), renormalise.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .errors import UsageError


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self):
        if not self.temperature >= 0:  # also rejects NaN
            raise UsageError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise UsageError(f"top-p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise UsageError(f"top-k must be >= 0 (0 disables it), got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """logits (..., V) -> probabilities (..., V), float32."""
        logits = logits.float()
        if self.greedy:
            return F.one_hot(logits.argmax(-1), logits.shape[-1]).float()
        logits = logits / self.temperature
        if 0 < self.top_k < logits.shape[-1]:
            kth = logits.topk(self.top_k, dim=-1).values[..., -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = logits.softmax(-1)
        if self.top_p < 1:
            probs = _nucleus(probs, self.top_p)
        return probs

    def sample(self, probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        """probs (..., V), possibly unnormalised -> token ids (...). Greedy takes the argmax."""
        if self.greedy:
            return probs.argmax(-1)
        return sample(probs, generator)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Draw one id per row of probs (..., V) (rows need not be normalised)."""
    flat = probs.reshape(-1, probs.shape[-1])
    ids = torch.multinomial(flat, 1, generator=generator)
    return ids.reshape(probs.shape[:-1])


def _nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    sorted_p, order = probs.sort(-1, descending=True)
    before = sorted_p.cumsum(-1) - sorted_p  # mass strictly above each token
    keep_sorted = before < top_p  # the first token is always kept
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    kept = probs * keep
    return kept / kept.sum(-1, keepdim=True)
