"""Logits -> the probabilities tokens are drawn from. One function serves the target (p) and the
drafter (q), so both are warped identically, as exactness requires (docs/lossless.md).

Temperature 0 means greedy: the "distribution" is one-hot on the argmax (first index on ties).
Otherwise: divide by temperature, keep the top_k largest logits (0 = all), keep the smallest set of
tokens whose probability reaches top_p (always at least the most likely one), renormalise.

Every temperature that passes validation gives a distribution, never a NaN: logits are shifted so
that the largest is 0 before they are divided, and the temperature is held within float32's
positive normal range. A tiny temperature so tends to the argmax (ties shared), a huge one to
uniform over the tokens kept. A row whose largest logit is NaN or infinite comes from a broken
model and raises ModelOutputError.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .errors import ModelOutputError
from .requests import check_sampling

F32 = torch.finfo(torch.float32)


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self):
        check_sampling(self.temperature, self.top_k, self.top_p)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """logits (..., V) -> probabilities (..., V), float32. ModelOutputError when a row's
        largest logit is NaN or infinite."""
        logits = logits.float()
        top = logits.amax(-1, keepdim=True)  # (..., 1); NaN if the row holds a NaN
        _check_finite(top)
        if self.greedy:
            return F.one_hot(logits.argmax(-1), logits.shape[-1]).float()
        temperature = min(max(self.temperature, F32.tiny), F32.max)  # neither 0 nor inf in float32
        scaled = (logits - top) / temperature  # <= 0, and 0 at the top: no overflow, no inf - inf
        if 0 < self.top_k < logits.shape[-1]:
            kth = logits.topk(self.top_k, dim=-1).values[..., -1:]
            scaled = scaled.masked_fill(logits < kth, float("-inf"))
        probs = scaled.softmax(-1)
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


def _check_finite(top: torch.Tensor) -> None:
    """top (...): the largest logit of each row; refuse NaN and +-inf (one host sync)."""
    if not bool(torch.isfinite(top).all()):
        raise ModelOutputError("a model produced non-finite logits (NaN or infinite): its weights "
                               "are broken or its dtype overflows (float32 may help)")


def _nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """probs (..., V) -> the smallest set of most likely tokens reaching top_p, renormalised."""
    sorted_p, order = probs.sort(-1, descending=True)
    before = sorted_p.cumsum(-1) - sorted_p  # mass strictly above each token
    keep_sorted = before < top_p  # in float32: a top_p below 1e-45 is 0 and keeps nothing ...
    keep_sorted[..., 0] = True  # ... but the most likely token is always kept
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    kept = probs * keep
    return kept / kept.sum(-1, keepdim=True)
