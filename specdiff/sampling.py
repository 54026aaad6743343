"""Logits -> the probabilities tokens are drawn from. One function serves the target (p) and the
drafter (q), so both are warped identically, as exactness requires (docs/lossless.md).

Temperature 0 means greedy: the "distribution" is one-hot on the argmax (first index on ties).
Otherwise: divide by temperature, keep the top_k largest logits (0 = all), keep the smallest set of
tokens whose probability reaches top_p (always at least the most likely one), renormalise.

A repetition penalty (Keskar et al. 2019, as Hugging Face's RepetitionPenaltyLogitsProcessor:
a logit of a token already in the sequence is divided by the penalty if positive, multiplied by
it if negative) is applied to the target's logits only, at every verified position with that
position's own prefix (context + the draft tokens before it), so p is exactly what plain
decoding computes. The drafter's q needs no penalty: any q keeps the rules exact.

Every temperature that passes validation gives a distribution, never a NaN: logits are shifted so
that the largest is 0 before they are divided, and the temperature is held within float32's
positive normal range. A tiny temperature so tends to the argmax (ties shared), a huge one to
uniform over the tokens kept. A row whose largest logit is NaN or infinite comes from a broken
model and raises ModelOutputError.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable, Sequence, Union

import torch
import torch.nn.functional as F

from .errors import ModelOutputError
from .requests import check_settings

F32 = torch.finfo(torch.float32)
# one generator, or one per row of a batch (row b draws from generators[b] only)
Generators = Union[torch.Generator, Sequence[Union[torch.Generator, None]], None]


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0

    def __post_init__(self) -> None:
        check_settings(asdict(self))

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

    def target_probs(self, logits: torch.Tensor, context: torch.Tensor, draft: torch.Tensor) -> torch.Tensor:
        """The target's p at S positions: logits (B, S, V), where position j follows
        context (B, L) and draft[:, :j] (draft (B, S - 1)) -> (B, S, V), the repetition
        penalty applied with each position's own prefix, then warped as `probs`."""
        if self.repetition_penalty != 1:
            logits = penalize(logits.float(), seen_tokens(context, draft, logits.shape[-1]), self.repetition_penalty)
        return self.probs(logits)

    def batch_probs(self, logits: torch.Tensor, new: torch.Tensor,
                    own: Callable[[int], torch.Tensor]) -> torch.Tensor:
        """The target's p over a batch's verified positions in one pass: logits (B, S, V) of which
        row b's first new[b] are real (the rest padding, which no rule reads) -> (B, S, V).
        With a repetition penalty each position needs its own prefix: then row by row, own(b) ->
        (1, new[b], V) (target_probs with the row's context), padded."""
        B, S, V = logits.shape
        real = torch.arange(S, device=logits.device) < new.to(logits.device)[:, None]  # (B, S)
        if self.repetition_penalty == 1:
            return self.probs(logits.masked_fill(~real[..., None], 0))
        p = logits.new_zeros(B, S, V, dtype=torch.float32)
        for b in range(B):
            p[b, :int(new[b])] = own(b)[0]
        return p

    def sample(self, probs: torch.Tensor, generator: Generators) -> torch.Tensor:
        """probs (..., V), possibly unnormalised -> token ids (...). Greedy takes the argmax."""
        if self.greedy:
            return probs.argmax(-1)
        return sample(probs, generator)


def seen_tokens(context: torch.Tensor, draft: torch.Tensor, V: int) -> torch.Tensor:
    """context (B, L), draft (B, S - 1) -> seen (B, S, V) bool: the tokens of context and
    draft[:, :j] at position j."""
    base = torch.zeros(context.shape[0], V, dtype=torch.bool, device=context.device)
    base.scatter_(1, context, True)  # (B, V)
    drafted = F.one_hot(draft, V).cumsum(1) > 0  # (B, S - 1, V): draft[:, :j + 1] seen
    return torch.cat([base[:, None], base[:, None] | drafted], dim=1)


def penalize(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """logits (..., V), seen (..., V) bool -> logits with seen tokens penalised (HF's rule)."""
    penalised = torch.where(logits < 0, logits * penalty, logits / penalty)
    return torch.where(seen, penalised, logits)


def sample(probs: torch.Tensor, generator: Generators) -> torch.Tensor:
    """Draw one id per row of probs (..., V) (rows need not be normalised). One generator per
    row of a batch: probs[b] (..., V) is drawn from generator[b], exactly as for that row alone."""
    if isinstance(generator, Sequence):
        if not len(generator):
            return torch.zeros(probs.shape[:-1], dtype=torch.long, device=probs.device)
        return torch.stack([sample(probs[b], g) for b, g in enumerate(generator)])
    flat = probs.reshape(-1, probs.shape[-1])
    ids = torch.multinomial(flat, 1, generator=generator)
    return ids.reshape(probs.shape[:-1])


def uniform(shape: tuple[int, ...], generator: Generators, device: torch.device) -> torch.Tensor:
    """U(0, 1) draws of shape (B, ...); one generator per row: row b from generator[b], the
    draws it would make alone."""
    if isinstance(generator, Sequence):
        if not len(generator):
            return torch.zeros(shape, device=device)
        return torch.stack([torch.rand(shape[1:], generator=g, device=device) for g in generator])
    return torch.rand(shape, generator=generator, device=device)


def rows_of(generator: Generators, index: torch.Tensor) -> Generators:
    """The generators of the batch rows `index` (B',): a sub-list where there is one per row."""
    if isinstance(generator, Sequence):
        return [generator[i] for i in index.tolist()]
    return generator


def _check_finite(top: torch.Tensor) -> None:
    """top (...): the largest logit of each row; refuse NaN and +-inf (one host sync)."""
    if not bool(torch.isfinite(top).all()):
        raise ModelOutputError("a model produced non-finite logits (NaN or infinite): its weights "
                               "are broken or its dtype overflows (float32 may help)")


NUCLEUS_K = (256, 4096)  # top-k sizes tried before a full sort (a 49k-row sort costs 3.5 ms on a CPU core)


def _nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """probs (..., V) -> the smallest set of most likely tokens reaching top_p, renormalised; a
    token tied with the least likely one kept is kept too (so the set depends on the values only,
    not on how a sort orders ties). Each row is read from its NUCLEUS_K largest values, or from all
    of them where those do not hold its set: the same result, row by row, whatever the batch."""
    shape = probs.shape
    flat = probs.reshape(-1, shape[-1])
    threshold = torch.empty(flat.shape[0], 1, dtype=flat.dtype, device=flat.device)
    todo = torch.arange(flat.shape[0], device=flat.device)
    for k in (*(k for k in NUCLEUS_K if k < shape[-1]), shape[-1]):
        if not len(todo):
            break
        values = flat[todo].topk(k, dim=-1).values  # (R, k) descending
        before = values.cumsum(-1) - values  # mass of the values above each one (equal values add alike)
        m = (before < top_p).sum(-1, keepdim=True).clamp_min(1)  # kept: a prefix (in float32 a top_p
        t = values.gather(-1, m - 1)  # below 1e-45 is 0 and keeps nothing, but the top token stays)
        held = (m < k) & (values[:, -1:] < t) if k < shape[-1] else torch.ones_like(m, dtype=torch.bool)
        threshold[todo[held[:, 0]]] = t[held[:, 0]]
        todo = todo[~held[:, 0]]
    kept = flat * (flat >= threshold)
    return (kept / kept.sum(-1, keepdim=True)).reshape(shape)
