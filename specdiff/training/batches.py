"""Examples shaped like a drafting call, drawn from the teacher's sequences (specdiff.training.teacher).

A training example is a row of N context tokens then gamma draft tokens, all taken from one
sequence at a split inside the continuation (so the draft is what the target itself says next),
masked as an l2r schedule with T steps masks it at a random step s: the first
sum(block_sizes[:s]) draft tokens clean, the rest masked (s = 0: all gamma masked, the oneshot /
first-step case). Optionally a fraction of rows are raw text windows instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..drafters.diffusion import block_sizes
from .sequences import Sequences
from .teacher import windows

SHORT_CONTEXT = 0.125  # share of batches with a shorter context (early in a generation)


@dataclass(frozen=True)
class Pattern:
    """How drafting looks: N context tokens, gamma slots filled in T l2r steps."""

    context: int  # N
    gamma: int
    steps: int  # T
    mask_id: int

    def committed(self) -> torch.Tensor:
        """Draft tokens already committed before each l2r step: (T,) = 0, b_1, b_1 + b_2, ..."""
        sizes = torch.tensor([0, *block_sizes(self.gamma, self.steps)[:-1]])
        return sizes.cumsum(0)


@dataclass
class Batch:
    x0: torch.Tensor  # (B, n + gamma) clean tokens
    xt: torch.Tensor  # (B, n + gamma) the drafter's input: some draft slots masked
    n: int  # context tokens in this batch
    soft_ids: torch.Tensor | None = None  # (B, gamma, k) the target's k most likely ids at each draft slot
    soft_p: torch.Tensor | None = None  # (B, gamma, k) their probabilities (one-hot on x0 for raw text rows)

    def to(self, device: torch.device | str) -> Batch:
        soft = (None, None) if self.soft_ids is None or self.soft_p is None else \
            (self.soft_ids.to(device), self.soft_p.to(device))
        return Batch(self.x0.to(device), self.xt.to(device), self.n, *soft)


def split_limits(seqs: Sequences, prompt_tokens: int, gamma: int, eos_id: int | None) -> torch.Tensor:
    """(M,) the first column past the last split make_batch may draw in each row: gamma slots fit,
    and (with eos_id) the draft starts at or before the row's first eos (what follows is eos)."""
    width = seqs.ids.shape[1]
    limit = torch.full((len(seqs),), width - gamma + 1)
    if eos_id is not None:
        is_eos = seqs.ids[:, prompt_tokens:] == eos_id  # (M, L)
        first = torch.where(is_eos.any(1), is_eos.float().argmax(1), is_eos.shape[1])
        limit = torch.minimum(limit, prompt_tokens + first + 1)
    return limit


def make_batch(seqs: Sequences, pattern: Pattern, size: int, generator: torch.Generator,
               prompt_tokens: int, raw: torch.Tensor | None = None, raw_fraction: float = 0.0,
               context: int | None = None, limits: torch.Tensor | None = None) -> Batch:
    """`size` examples from sequences (M, P + L): a split s in the continuation, x0 =
    seq[s - n : s + gamma], draft slots masked as at a random l2r step, and the soft labels of
    the draft slots where the sequences have them; rows drawn from raw text windows with
    probability raw_fraction. n = `context`, else N (or, in a SHORT_CONTEXT share of batches,
    fewer: drafting early in a generation sees less than N tokens). limits (M,): see split_limits."""
    n = context or pattern.context
    if context is None and torch.rand((), generator=generator) < SHORT_CONTEXT:
        n = int(torch.randint(1, pattern.context + 1, (), generator=generator))
    width, ids = n + pattern.gamma, seqs.ids
    rows = torch.randint(0, len(ids), (size,), generator=generator)
    if limits is None:
        splits = torch.randint(prompt_tokens, ids.shape[1] - pattern.gamma + 1, (size,), generator=generator)
    else:
        span = limits[rows] - prompt_tokens  # (B,) >= 1
        splits = prompt_tokens + (torch.rand(size, generator=generator) * span).long()
    x0 = ids[rows[:, None], splits[:, None] - n + torch.arange(width)]  # (B, n + gamma)
    soft_ids = soft_p = None
    if seqs.soft_ids is not None and seqs.soft_p is not None:
        at = rows[:, None], splits[:, None] - prompt_tokens + torch.arange(pattern.gamma)  # (B, gamma) positions in L
        soft_ids, soft_p = seqs.soft_ids[at].long(), seqs.soft_p[at].float()  # (B, gamma, k)
    if raw is not None and raw_fraction > 0:
        use_raw = torch.rand(size, generator=generator) < raw_fraction
        x0 = torch.where(use_raw[:, None], windows(raw, size, width, generator), x0)
        if soft_ids is not None and soft_p is not None:
            one_hot = torch.zeros_like(soft_p)
            one_hot[..., 0] = 1
            soft_ids = torch.where(use_raw[:, None, None], x0[:, n:, None].expand_as(soft_ids), soft_ids)
            soft_p = torch.where(use_raw[:, None, None], one_hot, soft_p)
    starts = pattern.committed()
    committed = starts[torch.randint(0, len(starts), (size,), generator=generator)]  # (B,)
    masked = torch.arange(pattern.gamma) >= committed[:, None]  # (B, gamma)
    xt = x0.clone()
    xt[:, n:] = x0[:, n:].masked_fill(masked, pattern.mask_id)
    return Batch(x0, xt, n, soft_ids, soft_p)
