"""Self-selection over K candidate drafts (SpecDiff-2, arXiv 2511.00606): K drafts from one
drafter call, scored by the target in one verify call, one of them kept. docs/lossless.md,
"Several drafts", says which rules stay exact.

Drafting (SelfSelection.propose): one DiffusionProposer call commits the drafter's argmax draft
and records, for each slot, the drafter's distribution q_j warped at the draft temperature
(`draft_temperature`, the target's top-k / top-p). Candidates are drawn slot by slot from q_j:
    argmax first (greedy, select)  candidate 1 = the argmax draft, 2..K ~ prod_j q_j: K > 1 never
                                   accepts less than the argmax draft alone at temperature 0;
    iid (multi)                    all K ~ prod_j q_j, independently given q.

Verifying (decoding._verify_selected): each row's cache is repeated K times (Target.keep), the
B * K candidates are extended with (B * K, g + 1) tokens in one call, the rule picks a candidate k
per row (choose, with the row's own generator), and the target keeps the chosen copy of each row.

Rules (draft (B, K, g), q (B, g, V), p (B, K, g+1, V), generator) -> (n, y, k), each (B,):
n draft tokens of candidate k accepted, then the token y.
    greedy  the candidate with the longest argmax match (first on ties). Exact at temperature 0.
    select  the candidate with the best streak score sum_m prod_{j<=m} p_j(x_j) (first on ties),
            verified with the point-mass rule (acceptance.select) on its p. The choice reads p,
            never the coins: exact for any candidates.
    multi   recursive rejection over the i.i.d. candidates (SpecInfer / SpecTr): at each depth
            the surviving candidates (those agreeing with every accepted token) are tried in turn,
            x accepted with prob. min(1, r(x) / q_j(x)), r starting at p_j and replaced by
            norm(max(0, r - q_j)) after each rejection; when all are rejected a draw from r.
            Duplicates are tried again: each candidate is its own draw from q_j. Exact when the
            survivors' x_j are i.i.d. q_j given the accepted prefix: candidates drawn as `iid`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from . import acceptance
from .acceptance import residual
from .contracts import Draft
from .drafters.diffusion import DiffusionProposer
from .errors import UsageError
from .sampling import Generators, Sampling, sample


@dataclass
class Candidates(Draft):
    """K candidate drafts for each row: tokens (B, K, gamma) int64; q (B, gamma, V), the
    distribution of each slot the candidates are drawn from (the argmax candidate excepted)."""


class SelfSelection:
    """K candidate drafts from one call of a DiffusionProposer (see the module docstring)."""

    def __init__(self, proposer: DiffusionProposer, drafts: int, draft_temperature: float | None = None,
                 iid: bool = False):
        self.proposer = proposer
        self.drafts = drafts
        self.draft_temperature = draft_temperature
        self.iid = iid
        self.exact_rules = proposer.exact_rules & frozenset(RULES)

    def __repr__(self) -> str:
        return f"SelfSelection({self.proposer!r}, drafts={self.drafts})"

    @torch.no_grad()
    def propose(self, context: torch.Tensor, gamma: int, sampling: Sampling, generator: Generators,
                lengths: torch.Tensor | None = None) -> Candidates:
        """context (B, L), left-padded when `lengths` (B,) are given -> Candidates with tokens
        (B, K, gamma). Row b's candidates are drawn from its own generator (contracts.Proposer)."""
        warping = candidate_warping(sampling, self.draft_temperature)
        d = self.proposer.propose(context, gamma, Sampling(), generator, lengths, record=warping)
        return Candidates(draw_candidates(d.tokens, d.q, self.drafts, self.iid, generator), d.q, d.calls)


def candidate_warping(sampling: Sampling, draft_temperature: float | None) -> Sampling:
    """The candidates' warping: draft_temperature (default: the target's, 1 when greedy) with the
    target's top-k and top-p."""
    default = 1.0 if sampling.greedy else sampling.temperature
    return Sampling(default if draft_temperature is None else draft_temperature, sampling.top_k, sampling.top_p)


def draw_candidates(argmax: torch.Tensor, q: torch.Tensor, K: int, iid: bool, generator: Generators) -> torch.Tensor:
    """The drafter's argmax draft (B, g) and its slots' distributions q (B, g, V) -> K candidates
    (B, K, g): the argmax draft, then K - 1 draws from q (all K draws when `iid`; see the module
    docstring); row b draws from generator b."""
    B, g, V = q.shape
    draws = sample(q[:, None].expand(B, K - (not iid), g, V), generator)  # (B, K', g)
    return draws if iid else torch.cat([argmax[:, None], draws], dim=1)


def _streak_score(p_x: torch.Tensor) -> torch.Tensor:
    """p_x (..., g) -> sum_m prod_{j<=m} p_x[j] (...): expected accepted length under p."""
    return p_x.cumprod(-1).sum(-1)


def _pick(x: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """x (B, K, ...) at candidate k (B,) -> (B, ...)."""
    return x[torch.arange(x.shape[0], device=x.device), k]


def greedy(draft: torch.Tensor, q: torch.Tensor, p: torch.Tensor,
           generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    B, K, g = draft.shape
    target = p.argmax(-1)  # (B, K, g+1)
    n_k = acceptance.leading_true((draft == target[..., :g]).reshape(B * K, g)).reshape(B, K)
    k = n_k.argmax(-1)  # first candidate among the longest
    n = _pick(n_k, k)
    return n, _pick(target, k)[torch.arange(B, device=p.device), n], k


def select(draft: torch.Tensor, q: torch.Tensor, p: torch.Tensor,
           generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = draft.shape[-1]
    p_x = p[..., :g, :].gather(-1, draft[..., None])[..., 0]  # (B, K, g)
    k = _streak_score(p_x).argmax(-1)  # (B,)
    n, y = acceptance.select(_pick(draft, k), None, _pick(p, k), generator)
    return n, y, k


def multi(draft: torch.Tensor, q: torch.Tensor, p: torch.Tensor,
          generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    B, K, g = draft.shape
    rows = torch.arange(B, device=p.device)
    alive = torch.ones(B, K, dtype=torch.bool, device=p.device)  # agree with every accepted token
    done = torch.zeros(B, dtype=torch.bool, device=p.device)
    n, y, k = draft.new_full((B,), g), draft.new_zeros(B), draft.new_zeros(B)
    for j in range(g):
        lead = alive.long().argmax(-1)  # the first survivor: its p is the survivors' p
        r, accepted, token = p[rows, lead, j], torch.zeros_like(done), draft.new_zeros(B)
        for i in range(K):
            x = draft[:, i, j]
            trying = alive[:, i] & ~accepted & ~done
            u = torch.rand(B, generator=generator, device=p.device)
            ok = trying & (u * q[rows, j, x] < r[rows, x])  # P = min(1, r(x) / q(x))
            accepted, token = accepted | ok, torch.where(ok, x, token)
            r = torch.where((trying & ~ok)[:, None], residual(r, q[:, j]), r)
        stop = ~done & ~accepted
        if stop.any():
            n[stop], k[stop], y[stop] = j, lead[stop], sample(r[stop], generator)
        done |= stop
        alive &= draft[:, :, j] == token[:, None]
    if not done.all():  # every slot accepted: the bonus token from a survivor's p
        lead = alive.long().argmax(-1)
        k[~done], y[~done] = lead[~done], sample(p[rows, lead, g][~done], generator)
    return n, y, k


SelectRule = Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
RULES: dict[str, SelectRule] = {"greedy": greedy, "select": select, "multi": multi}


def get_rule(name: str) -> SelectRule:
    try:
        return RULES[name]
    except KeyError as e:
        raise UsageError(f"{name} acceptance checks a single draft; with `drafts` > 1 use "
                         f"{', '.join(RULES)}") from e


def candidates(draft: Draft, K: int) -> torch.Tensor:
    """One row's K candidates (K, g): Candidates (1, K, g), or a Draft (1, 0) (nothing drafted)
    repeated K times."""
    return draft.tokens[0] if draft.tokens.dim() == 3 else draft.tokens.expand(K, -1)


def choose(rule: SelectRule, tokens: torch.Tensor, q: torch.Tensor, logits: torch.Tensor, context: torch.Tensor,
           sampling: Sampling, generator: torch.Generator | None) -> tuple[list[int], int, int]:
    """One row's choice among its K candidates tokens (K, g), drawn from q (1, g, V), given the
    target's logits (K, g + 1, V) after [x, candidate k] and the row's context (1, L).
    -> (the accepted draft tokens, the next token, the chosen candidate k)."""
    K = tokens.shape[0]
    p = sampling.target_probs(logits, context.expand(K, -1), tokens)  # (K, g + 1, V)
    n_t, y, k_t = rule(tokens[None], q, p[None], generator)
    n, k = int(n_t[0]), int(k_t[0])
    return tokens[k, :n].tolist(), int(y[0]), k
