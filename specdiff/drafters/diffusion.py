"""The masked-diffusion drafter: gamma mask slots after the last N context tokens, filled in T
denoising steps. A schedule decides which slots a step commits:

    l2r         step s commits the s-th contiguous block of slots (blocks as even as possible);
                each slot drawn from the x0 distribution computed at that step. Exact under the
                standard rule: given x_<j, x_j was drawn from the q_j recorded for it.
    oneshot     l2r with T = 1: every slot from its marginal in one forward pass. Exact.
    confidence  step s commits the still-masked slots whose x0 distribution is most peaked
                (largest max of the untempered softmax, whatever the sampling warps: the
                "low_confidence" order of the MDLM / LLaDA / dllm samplers). q_j is then not the
                conditional of x_j given x_<j, so only greedy, match or select (point-mass)
                acceptance is exact with it.

The x0 distribution at a masked slot is a softmax of the raw logits over the target's real
vocabulary (the mask id and any padding rows are never proposed): both the MDLM (SUBS) and SEDD
(log-score) parameterisations reduce to that at masked positions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, cast

import torch
from torch import nn

from ..contracts import Draft
from ..errors import IncompatibleModelsError, UsageError
from ..nets.dit import DDiT, DiTConfig
from ..nets.parameterization import x0_logits
from ..sampling import Generators, Sampling
from ..vocab import DraftVocab, GatheredHead, target_ids, target_probs

NOISE_EPS = 1e-3  # log-linear schedule of SEDD and MDLM


def loglinear_sigma(t: torch.Tensor, eps: float = NOISE_EPS) -> torch.Tensor:
    """Total noise sigma(t) = -log(1 - (1 - eps) t); the mask probability is (1 - eps) t."""
    return -torch.log1p(-(1 - eps) * t)


class DiffusionDrafter(nn.Module):
    """A DDiT denoiser plus what drafting needs to know about its vocabulary.

    forward(input_ids (B, L), sigma (B,), last=None, pad=None) -> raw backbone logits
    (B, L, V_drafter), or of the last `last` positions (B, last, V_drafter); pad (B,): padding
    positions before each row, masked out of attention.

    target_embeddings: rows 0..V-1 of its token embedding and output head are its target's (it
    was trained so); loaded from disk they are zero until `share_target_embeddings` fills them,
    which pairing it with a target does, and it refuses to draft before.

    draft_vocab (specdiff.vocab): its head scores only the rows of the map's N ids (gathered from
    the output projection on first use, again after a move or a cast), forward returns (..., N)
    and x0_logits widens them: q is zero outside the map.
    """

    def __init__(self, backbone: DDiT, *, vocab_size: int, mask_id: int, context_length: int,
                 parameterization: str = "subs", tokenizer: Any = None, source: str = "",
                 length: int | None = None, defaults: dict[str, Any] | None = None, untrained: bool = False,
                 target_embeddings: bool = False, draft_vocab: DraftVocab | None = None):
        super().__init__()
        if draft_vocab is not None and bool(draft_vocab.inside[mask_id:mask_id + 1].any()):
            raise IncompatibleModelsError(f"drafter '{source}': its draft vocabulary holds its mask id {mask_id}")
        self.backbone = backbone
        self.vocab_size = vocab_size  # real vocabulary shared with the target (no mask id)
        self.mask_id = mask_id
        self.context_length = context_length
        self.length = length  # the sequence length it was trained on, when known (hub formats)
        self.parameterization = parameterization
        self.tokenizer = tokenizer
        self.source = source
        self.defaults = dict(defaults or {})  # draft settings it was trained for (gamma, steps, schedule)
        self.untrained = untrained  # random weights (`drafter init`): its drafts are rarely accepted
        self.target_embeddings = target_embeddings
        self.awaits_target = target_embeddings  # its shared rows are not filled in yet
        self.draft_vocab = draft_vocab
        self._rows = None if draft_vocab is None else GatheredHead(draft_vocab)

    @property
    def config(self) -> DiTConfig:
        return self.backbone.config

    def forward(self, input_ids: torch.Tensor, sigma: torch.Tensor, last: int | None = None,
                pad: torch.Tensor | None = None) -> torch.Tensor:
        if self.awaits_target:
            raise UsageError(f"drafter '{self.source}' reads its token embedding and output head from its "
                             "target: load it together with one")
        head = self.head()
        return cast(torch.Tensor, self.backbone(input_ids, sigma, last, pad, *(() if head is None else (head,))))

    def head(self) -> nn.Module | None:
        """The rows of its output projection at its draft vocabulary's ids, gathered now if they
        are not yet (an export gathers them before it traces); None without a draft vocabulary."""
        return None if self._rows is None else self._rows(self.backbone.output_layer.linear)

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> DiffusionDrafter:
        """.to() moves or casts the backbone; the draft vocabulary's rows are gathered again from it."""
        if self._rows is not None:
            self._rows.reset()
        return cast(DiffusionDrafter, super()._apply(fn, recurse))  # type: ignore[no-untyped-call]  # torch leaves Module._apply unannotated

    def share_target_embeddings(self, embedding: torch.Tensor, head: torch.Tensor) -> None:
        """Rows 0..V-1 of the token embedding and of the output head from the target's input
        embedding (V_t, h) and output head (V_t, h), V_t >= V, cast to the drafter's dtype."""
        dit, V = self.backbone, self.vocab_size
        if embedding.shape[1] != dit.config.hidden_size or min(len(embedding), len(head)) < V:
            raise IncompatibleModelsError(
                f"drafter '{self.source}' shares the token embedding of a target of width {dit.config.hidden_size} "
                f"and at least {V} tokens; this target's is {tuple(embedding.shape)}")
        with torch.no_grad():
            table, out = dit.vocab_embed.embedding, dit.output_layer.linear.weight
            table[:V] = embedding[:V].to(table)
            out[:V] = head[:V].to(out)
        self.target_embeddings, self.awaits_target = True, False
        if self._rows is not None:
            self._rows.reset()

    def x0_logits(self, input_ids: torch.Tensor, last: int | None = None,
                  pad: torch.Tensor | None = None, widen: bool = True) -> torch.Tensor:
        """(B, L) ids with mask slots (after pad[b] padding positions in row b) -> logits of x0
        over the real vocabulary at the last `last` positions (B, last, V) (default: all L), fp32,
        differentiable: x0_logits_from over this network. At masked slots their softmax is
        exactly softmax(raw[..., :V]) (with a draft vocabulary: over its N rows, zero elsewhere;
        widen=False: the N rows themselves, (B, last, N))."""
        return x0_logits_from(lambda ids, sigma: self(ids, sigma, last, pad), input_ids, self.parameterization,
                              self.mask_id, self.vocab_size, last, pad, self.draft_vocab, widen)


Network = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (ids (B, L), sigma (B,)) -> raw (B, last, V_d)


def x0_logits_from(network: Network, input_ids: torch.Tensor, parameterization: str, mask_id: int,
                   vocab_size: int, last: int | None = None, pad: torch.Tensor | None = None,
                   vocab: DraftVocab | None = None, widen: bool = True) -> torch.Tensor:
    """The one chain from a drafter's input to its x0 logits, whoever runs the network: drafting
    and training (DiffusionDrafter.x0_logits, which specdiff.training's losses read) and exported
    graphs (runtimes.models.GraphDrafter).

    input_ids (B, L) with mask slots after pad (B,) padding positions -> sigma =
    loglinear_sigma(masked_fraction) (B,) -> network(input_ids, sigma), the raw logits of the last
    `last` positions (B, last, V_drafter) (default: all L) -> the parameterisation's x0 logits over
    the real vocabulary (B, last, vocab_size), fp32 (nets.parameterization.x0_logits). Out of place
    throughout, so gradients flow; the caller decides on no_grad (DiffusionProposer drafts under it).
    With a draft vocabulary the network's raw logits are its N rows (B, last, N), widened with -inf
    outside the map (widen=False: not widened, (B, last, N)): at masked slots that is the
    parameterisation's x0 distribution restricted to the map, and drafting reads no other slot."""
    sigma = loglinear_sigma(masked_fraction(input_ids, mask_id, pad))  # (B,)
    raw = network(input_ids, sigma)  # (B, last, V_drafter or N)
    if vocab is not None:
        return vocab.widen(raw.float()) if widen else raw.float()
    return x0_logits(parameterization, raw, input_ids[:, -(last or 0):], sigma, mask_id, vocab_size)


def masked_fraction(input_ids: torch.Tensor, mask_id: int, pad: torch.Tensor | None = None) -> torch.Tensor:
    """(B, L) ids -> the fraction t of each row's real positions (after pad (B,)) that are masked (B,)."""
    real = input_ids.shape[1] - (0 if pad is None else pad.to(input_ids.device))
    return (input_ids == mask_id).sum(dim=1) / real


def context_window(drafter: DiffusionDrafter, gamma: int) -> int:
    """Context tokens n before gamma draft slots: the drafter's context_length, cut so that
    n + gamma stays within the length it was trained on (when it knows it)."""
    length = getattr(drafter, "length", None)  # exported graphs (runtimes) carry none
    if length is None:
        return drafter.context_length
    if gamma >= length:
        raise UsageError(f"gamma {gamma} does not fit the drafter's trained length {length} "
                         f"with any context (at most {length - 1})")
    return cast(int, min(drafter.context_length, length - gamma))


def block_sizes(gamma: int, steps: int) -> list[int]:
    """Split gamma slots into `steps` contiguous blocks, sizes differing by at most one."""
    steps = min(steps, gamma)
    return [gamma // steps + (i < gamma % steps) for i in range(steps)]


def _pick_l2r(logits: torch.Tensor, masked: torch.Tensor, k: int) -> torch.Tensor:
    """The first k still-masked slots of each row -> (B, k) slot indices."""
    first = (~masked).sum(dim=1, keepdim=True)  # committed slots form a prefix
    return first + torch.arange(k, device=masked.device)


def _pick_confidence(logits: torch.Tensor, masked: torch.Tensor, k: int) -> torch.Tensor:
    """The k still-masked slots with the highest untempered max-probability -> (B, k). (The warped
    probabilities are one-hot at temperature 0: every slot would tie.)"""
    score = logits.softmax(dim=-1).max(dim=-1).values.masked_fill(~masked, -math.inf)  # (B, gamma)
    return score.topk(k, dim=1).indices


ALL_RULES = frozenset({"greedy", "standard", "match", "select", "multi"})
ORDER_FREE = ALL_RULES - {"standard", "multi"}  # exact whatever order the slots are committed in


@dataclass(frozen=True)
class Schedule:
    """pick(x0 logits (B, gamma, V), masked (B, gamma) bool, k) -> (B, k) slots to commit.
    exact_rules: the acceptance rules exact with its drafts (see the module docstring)."""

    name: str
    pick: Any
    exact_rules: frozenset[str]
    fixed_steps: int | None = None


SCHEDULES = {
    "l2r": Schedule("l2r", _pick_l2r, ALL_RULES),
    "oneshot": Schedule("oneshot", _pick_l2r, ALL_RULES, fixed_steps=1),
    "confidence": Schedule("confidence", _pick_confidence, ORDER_FREE),
}


def get_schedule(name: str) -> Schedule:
    try:
        return SCHEDULES[name]
    except KeyError as e:
        raise UsageError(f"unknown schedule '{name}' (choose from {', '.join(SCHEDULES)})") from e


class DiffusionProposer:
    """Drafts with a DiffusionDrafter in T denoising steps under a schedule."""

    def __init__(self, drafter: DiffusionDrafter, schedule: str = "l2r", steps: int = 1,
                 gamma: int | None = None):
        """gamma, if given: the longest draft it will be asked for, refused now if the drafter's
        trained length cannot hold it."""
        if gamma is not None:
            context_window(drafter, gamma)
        self.drafter = drafter
        self.schedule = get_schedule(schedule)
        if steps < 1:
            raise UsageError(f"steps must be >= 1, got {steps}")
        if self.schedule.fixed_steps and steps != self.schedule.fixed_steps:
            raise UsageError(f"the {schedule} schedule uses exactly {self.schedule.fixed_steps} step; got steps={steps}")
        self.steps = steps
        self.exact_rules = self.schedule.exact_rules

    def __repr__(self) -> str:
        return f"DiffusionProposer(schedule={self.schedule.name}, steps={self.steps})"

    @torch.no_grad()
    def propose(self, context: torch.Tensor, gamma: int, sampling: Sampling, generator: Generators,
                lengths: torch.Tensor | None = None, record: Sampling | None = None) -> Draft:
        """context (B, L), left-padded when `lengths` (B,) are given -> Draft (B, gamma).
        record: the warping of the q recorded for each slot when it differs from the one the
        tokens are drawn with (`sampling`); specdiff.selection draws further candidates from it."""
        d = self.drafter
        vocab = getattr(d, "draft_vocab", None)  # warped and drawn over its N rows (specdiff.vocab)
        x, pad = self._masked(context, gamma, lengths)  # (B, n + gamma)
        B, n = x.shape[0], x.shape[1] - gamma
        q = torch.zeros(B, gamma, d.vocab_size, device=x.device)
        rows = torch.arange(B, device=x.device)[:, None]
        sizes = block_sizes(gamma, self.steps)
        for k in sizes:
            logits = d.x0_logits(x, gamma, pad, widen=False)  # (B, gamma, V or N)
            probs = sampling.probs(logits)
            slots = self.schedule.pick(logits, x[:, n:] == d.mask_id, k)  # (B, k)
            chosen = probs[rows, slots]  # (B, k, V or N)
            x[rows, n + slots] = target_ids(sampling.sample(chosen, generator), vocab)
            q[rows, slots] = target_probs(record.probs(logits[rows, slots]) if record else chosen, vocab)
        return Draft(tokens=x[:, n:], q=q, calls=len(sizes))

    @torch.no_grad()
    def marginals(self, context: torch.Tensor, gamma: int, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """context (B, L), left-padded when `lengths` (B,) are given -> the x0 logits of the gamma
        masked slots after it (B, gamma, V, or N over a draft vocabulary's rows) from one drafter
        call: each slot's marginal, which does not depend on the other draft tokens (a draft
        tree's ranking, methods.speculative; the first step of any schedule)."""
        x, pad = self._masked(context, gamma, lengths)
        return self.drafter.x0_logits(x, gamma, pad, widen=False)

    def _masked(self, context: torch.Tensor, gamma: int,
                lengths: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The drafter's input: the context's window then gamma mask slots (B, n + gamma), and
        the padding positions in the window (B,) (None without lengths)."""
        d = self.drafter
        ctx = context[:, -context_window(d, gamma):]  # (B, n)
        B, n = ctx.shape
        pad = None if lengths is None else (n - lengths).clamp_min(0)  # (B,) padding in the window
        return torch.cat([ctx, ctx.new_full((B, gamma), d.mask_id)], dim=1), pad
