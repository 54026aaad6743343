"""The objectives of `specdiff distill`: a loss registered by name in LOSSES (Slots -> scalar),
over the masked draft slots whose clean token is not the mask id (the scored slots):

    ce         mean cross-entropy -log q(x0) over those slots (the default)
    mdlm       the MDLM ELBO: each slot's CE weighted by sigma'(t) / expm1(sigma(t)) (= 1/t for
               the log-linear schedule), summed per row over its n + gamma positions and divided
               by them; with t the fraction masked that is the row's mean CE.
    kl         forward KL(p || q) at each slot, averaged over slots, p = the target's
               distribution at that slot as the soft labels keep it: its top k ids, and the rest
               of the vocabulary as one more bin (one-hot on x0 for raw text rows). DistillSpec:
               acceptance min(1, p/q) when sampling rewards q close to p, which greedy-only hard
               labels do not teach; the rest bin keeps q from piling p's tail on the top k.
    a+b        the sum of two of these (e.g. ce+kl).
    streak     SpecDiff-2: -(mean over rows of sum_m c_m), c_m = prod_{i <= m} q_i, q_i the
               drafter's probability of the teacher token at slot i at the deployment
               temperature (draft_temperature): minus the expected accepted length when each
               token is accepted with its probability.
    ce-streak  SpecDiff-2: -(mean over rows of sum_j w_j log q_j), w_1 = 1, w_j = stop-gradient
               c_{j-1}: each slot's CE weighted by the chance of reaching it.
The drafters reading the target's features (dflash, eagle3) take READING_LOSSES (ce, kl and lk,
-log sum min(p, q)) per slot through per_slot_loss, weighted by how likely each slot is reached.
In the streak losses the product runs over a row's masked slots (clean l2r slots before them
count as reached; a slot whose token is the mask id, raw text only, as accepted).

q is the drafter's x0 distribution: the softmax of DiffusionDrafter.x0_logits, the very function
DiffusionProposer drafts from (specdiff.drafters.diffusion.x0_logits_from), fp32 and
differentiable, with sigma = loglinear_sigma(fraction of the row masked) as at inference. At a
masked slot that is the softmax of the raw logits over the real vocabulary, the mask id excluded;
at a clean slot SUBS carries the token over (a one-hot: -inf off it), so a loss reads only the
scored slots, never multiplies the others by 0 (0 * inf is nan).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable, Protocol

import torch
import torch.nn.functional as F

from ..drafters.diffusion import NOISE_EPS, DiffusionDrafter, loglinear_sigma, masked_fraction
from ..errors import UsageError
from .batches import Batch


class LossSettings(Protocol):
    """What loss_function reads of a run's settings (config.DistillConfig, which checks the names
    against LOSSES: the settings are the config's room, the losses this one)."""

    @property
    def loss(self) -> str: ...

    @property
    def draft_temperature(self) -> float: ...


@dataclass(frozen=True)
class Slots:
    """One batch's draft slots as every loss reads them: the drafter runs once per batch, also
    for a sum of losses."""

    logits: torch.Tensor  # (B, gamma, V) x0 logits, fp32, differentiable (DiffusionDrafter.x0_logits)
    x0: torch.Tensor  # (B, gamma) the teacher's tokens
    scored: torch.Tensor  # (B, gamma) bool: masked slots whose clean token is not the mask id
    t: torch.Tensor  # (B,) the fraction of each row masked
    width: int  # n + gamma positions per row
    soft_ids: torch.Tensor | None = None  # (B, gamma, k)
    soft_p: torch.Tensor | None = None  # (B, gamma, k)


def slots(drafter: DiffusionDrafter, batch: Batch) -> Slots:
    """Run the drafter on the batch (xt (B, n + gamma)) -> its Slots."""
    x0, xt = batch.x0[:, batch.n:], batch.xt
    scored = (xt[:, batch.n:] == drafter.mask_id) & (x0 != drafter.mask_id)
    return Slots(drafter.x0_logits(xt, last=x0.shape[1]), x0, scored, masked_fraction(xt, drafter.mask_id),
                 xt.shape[1], batch.soft_ids, batch.soft_p)


def _slot_ce(s: Slots) -> torch.Tensor:
    """CE at each draft slot (B, gamma), zero where not scored."""
    return F.cross_entropy(s.logits.transpose(1, 2), s.x0.masked_fill(~s.scored, -100), reduction="none")


def masked_ce(s: Slots) -> torch.Tensor:
    return _slot_ce(s).sum() / s.scored.sum().clamp(min=1)


def mdlm_elbo(s: Slots) -> torch.Tensor:
    weight = (1 - NOISE_EPS) / (1 - (1 - NOISE_EPS) * s.t) / torch.expm1(loglinear_sigma(s.t))  # (B,)
    return (weight[:, None] * _slot_ce(s)).sum(dim=1).mean() / s.width


def soft_kl(s: Slots) -> torch.Tensor:
    """KL(p || q) per scored slot (kl_per_slot), averaged."""
    if s.soft_ids is None or s.soft_p is None:
        raise UsageError("the kl loss needs soft labels (`soft_labels` > 0)")
    kl = kl_per_slot(s.logits[s.scored].log_softmax(-1), s.soft_ids[s.scored], s.soft_p[s.scored])
    return kl.sum() / s.scored.sum().clamp(min=1)


def kl_per_slot(log_q_all: torch.Tensor, ids: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """KL(p || q) (S,) of S slots: log q (S, V), soft labels ids (S, k) and their p (S, k), over
    k + 1 bins: the soft labels' ids and the rest of the vocabulary as one bin (p's rest = 1 - the
    mass kept; q's = its mass elsewhere), so that q keeps p's tail mass instead of piling it on the
    top k."""
    kept = p > 0  # ids with mass (a raw text row's one-hot has repeated ids at p = 0)
    log_q = log_q_all.gather(-1, ids)  # (S, k)
    elsewhere = log_q_all.scatter(-1, ids.where(kept, ids[..., :1]), float("-inf"))
    p_rest = (1 - p.sum(-1)).clamp(min=0)  # (S,)
    return (torch.xlogy(p, p) - p * log_q).sum(-1) \
        + torch.xlogy(p_rest, p_rest) - p_rest * elsewhere.logsumexp(-1).clamp(min=-1e4)


def lk_per_slot(log_q_all: torch.Tensor, ids: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """-log alpha (S,) of S slots, the LK loss (arXiv 2602.23881): alpha = sum_x min(p(x), q(x)),
    the probability that speculative sampling accepts q's draft, here over the soft labels' ids
    (a lower bound: the tail beyond the top k counts nothing). log q (S, V); ids, p (S, k).
    Its gradient is TV's scaled by 1 / alpha, so it pushes hardest where acceptance is lowest."""
    kept = p > 0
    q = log_q_all.gather(-1, ids).exp()  # (S, k)
    alpha = (torch.minimum(p, q) * kept).sum(-1)
    return -alpha.clamp(min=1e-6).log()


def expected_streak(log_q: torch.Tensor, scored: torch.Tensor) -> torch.Tensor:
    """log q_i (B, gamma), 0 where not scored; scored (B, gamma) -> sum over scored m of
    c_m = prod_{i <= m} q_i (B,): the expected accepted length if slot i is accepted with q_i."""
    return (log_q.cumsum(1).exp() * scored).sum(1)


def reach_weighted_log_q(log_q: torch.Tensor) -> torch.Tensor:
    """log q_i (B, gamma) -> sum_j w_j log q_j (B,), w_1 = 1, w_j = c_{j-1} held constant."""
    log_reach = F.pad(log_q.cumsum(1)[:, :-1], (1, 0))  # log c_{j-1}, 0 for the first slot
    return (log_reach.detach().exp() * log_q).sum(1)


def _streak_log_q(s: Slots, temperature: float) -> torch.Tensor:
    """log q_i of the teacher token at each draft slot at the drafter's temperature (B, gamma),
    0 where not scored."""
    log_q = (s.logits / temperature).log_softmax(-1).gather(-1, s.x0[..., None])[..., 0]
    return log_q.masked_fill(~s.scored, 0)


def streak(s: Slots, temperature: float = 1.0) -> torch.Tensor:
    return -expected_streak(_streak_log_q(s, temperature), s.scored).mean()


def ce_streak(s: Slots, temperature: float = 1.0) -> torch.Tensor:
    return -reach_weighted_log_q(_streak_log_q(s, temperature)).mean()


def per_slot_loss(logits: torch.Tensor, labels: torch.Tensor, soft: tuple[torch.Tensor, torch.Tensor] | None,
                  parts: tuple[str, ...]) -> torch.Tensor:
    """The READING_LOSSES summed at each of S slots (S,): logits (S, V), labels (S,) (-1: none, no
    ce there), soft labels (ids, p) (S, k) or None (kl and lk need them)."""
    log_q = logits.log_softmax(-1)  # (S, V), shared by the parts
    per_slot = log_q.new_zeros(labels.shape)
    if "ce" in parts:
        per_slot = per_slot - log_q.gather(-1, labels.clamp(min=0)[:, None])[:, 0] * (labels >= 0)
    for name, part in (("kl", kl_per_slot), ("lk", lk_per_slot)):
        if name not in parts:
            continue
        if soft is None:
            raise UsageError(f"the {name} loss needs soft labels (`soft_labels` > 0)")
        per_slot = per_slot + part(log_q, soft[0].long(), soft[1].float())
    return per_slot


LOSSES: dict[str, Callable[..., torch.Tensor]] = {"ce": masked_ce, "mdlm": mdlm_elbo, "kl": soft_kl, "streak": streak,
                                                  "ce-streak": ce_streak}
AT_DRAFT_TEMPERATURE = ("streak", "ce-streak")
READING_LOSSES = ("ce", "kl", "lk")  # dflash and eagle3 (training/reading.py): per slot, weighted by its reach


def loss_function(cfg: LossSettings) -> Callable[[DiffusionDrafter, Batch], torch.Tensor]:
    """The configured loss, with the deployment temperature where it takes one; "a+b" is the
    sum of losses a and b (e.g. ce+kl: the hard labels' argmax and the soft labels' spread),
    over one drafter pass."""
    parts = [partial(LOSSES[name], temperature=cfg.draft_temperature) if name in AT_DRAFT_TEMPERATURE
             else LOSSES[name] for name in cfg.loss.split("+")]

    def loss(drafter: DiffusionDrafter, batch: Batch) -> torch.Tensor:
        s = slots(drafter, batch)
        return torch.stack([part(s) for part in parts]).sum()
    return loss
