"""Drafters propose gamma tokens and the distributions they were drawn from.

    Drafter.propose(context (B, L) int64, gamma, sampling, generator) -> Draft
        tokens (B, gamma): the draft; q (B, gamma, V): for each slot, the warped distribution over
        the target's real vocabulary the token was drawn from; calls: drafter forward passes.
    Drafter.exact_for_standard: whether q_j is the conditional of x_j given x_<j, i.e. whether the
        standard min(1, p/q) rule is exact with this drafter (docs/lossless.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from ..sampling import Sampling


@dataclass
class Draft:
    tokens: torch.Tensor  # (B, gamma) int64
    q: torch.Tensor  # (B, gamma, V) float32
    calls: int


class Drafter(Protocol):
    exact_for_standard: bool

    def propose(
        self, context: torch.Tensor, gamma: int, sampling: Sampling, generator: torch.Generator | None
    ) -> Draft: ...
