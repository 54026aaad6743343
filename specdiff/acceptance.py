"""Acceptance rules: given a draft, the distribution q each draft token was drawn from, and the
target's p at every draft position plus one, decide how many draft tokens to keep and which token
to emit next. All rules are batched over rows and exact under the conditions of
docs/lossless.md:

    greedy    accept while x_j == argmax p_j; emit argmax p at the first mismatch / bonus slot.
    standard  accept x_j with prob. min(1, p_j(x_j) / q_j(x_j)); at the first rejection emit a
              draw from norm(max(0, p_j - q_j)); after gamma acceptances a bonus draw from p.
              Exact only if x_j ~ q_j given x_<j (AR drafters, oneshot and l2r schedules).
    match     draw y_j ~ p_j; accept while y_j == x_j; emit y_j at the first mismatch. Exact for
              any drafter.
    select    the point-mass rule (standard with q = one-hot on the draft): accept x_j with prob.
              p_j(x_j); at the first rejection emit a draw from p_j with x_j removed; after gamma
              acceptances a bonus draw from p. Exact for any draft chosen without looking at the
              coins (SpecDiff-2; over K candidates: specdiff.selection).

Every rule: (draft (B, g) int64, q (B, g, V), p (B, g+1, V), generator) -> (n (B,), nxt (B,)):
n accepted draft tokens, then the token nxt. generator: one for the batch, or one per row
(sampling.Generators), each row then drawing exactly what it draws alone, so a batch's rows get
the outputs they get one at a time. `residual` is the update of recursive rejection over
several drafts (specdiff.selection's multi, specdiff.trees' multi).
"""

from __future__ import annotations

from typing import Callable

import torch

from .errors import UsageError
from .sampling import Generators, sample, uniform

Rule = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def residual(r: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, r - q)) per row of (B, V); r itself where that is empty (rounding only)."""
    rest = (r - q).clamp_min(0)
    total = rest.sum(-1, keepdim=True)
    return torch.where(total > 0, rest / total.clamp_min(torch.finfo(r.dtype).tiny), r)


def leading_true(ok: torch.Tensor) -> torch.Tensor:
    """ok (B, g) bool -> length of the all-True prefix of each row (B,)."""
    return ok.long().cumprod(dim=1).sum(dim=1)


def _at(x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """x (B, g, ...) indexed at position n (B,) of each row -> (B, ...)."""
    return x[torch.arange(x.shape[0], device=x.device), n]


def greedy(draft: torch.Tensor, q: torch.Tensor, p: torch.Tensor,
           generator: Generators = None) -> tuple[torch.Tensor, torch.Tensor]:
    target = p.argmax(-1)  # (B, g+1)
    n = leading_true(draft == target[:, :-1])
    return n, _at(target, n)


def standard(draft: torch.Tensor, q: torch.Tensor, p: torch.Tensor,
             generator: Generators = None) -> tuple[torch.Tensor, torch.Tensor]:
    B, g = draft.shape
    p_x = p[:, :g].gather(-1, draft[..., None])[..., 0]  # (B, g)
    q_x = q.gather(-1, draft[..., None])[..., 0]
    u = uniform((B, g), generator, p.device)
    n = leading_true(u * q_x < p_x)  # P(accept) = min(1, p_x / q_x)
    q_pad = torch.cat([q, q.new_zeros(B, 1, q.shape[-1])], dim=1)  # bonus slot: residual = p
    residual = (_at(p, n) - _at(q_pad, n)).clamp_min(0)  # (B, V)
    empty = residual.sum(-1, keepdim=True) <= 0  # only reachable through rounding
    residual = torch.where(empty, _at(p, n), residual)
    return n, sample(residual, generator)


def match(draft: torch.Tensor, q: torch.Tensor, p: torch.Tensor,
          generator: Generators = None) -> tuple[torch.Tensor, torch.Tensor]:
    y = sample(p, generator)  # (B, g+1)
    n = leading_true(draft == y[:, :-1])
    return n, _at(y, n)


def select(draft: torch.Tensor, q: torch.Tensor | None, p: torch.Tensor,
           generator: Generators = None) -> tuple[torch.Tensor, torch.Tensor]:
    B, g = draft.shape  # q is not read: the draft's point mass is its q
    p_x = p[:, :g].gather(-1, draft[..., None])[..., 0]  # (B, g)
    n = leading_true(uniform((B, g), generator, p.device) < p_x)
    p_n = _at(p, n)  # (B, V)
    x_n = _at(torch.cat([draft, draft.new_full((B, 1), -1)], dim=1), n)  # -1: the bonus slot removes nothing
    rest = p_n.masked_fill(torch.arange(p.shape[-1], device=p.device) == x_n[:, None], 0)
    empty = rest.sum(-1, keepdim=True) <= 0  # only reachable through rounding
    return n, sample(torch.where(empty, p_n, rest), generator)


RULES: dict[str, Rule] = {"greedy": greedy, "standard": standard, "match": match, "select": select}


def get_rule(name: str) -> Rule:
    try:
        return RULES[name]
    except KeyError as e:
        raise UsageError(f"unknown acceptance rule '{name}' (choose from {', '.join(RULES)})") from e
