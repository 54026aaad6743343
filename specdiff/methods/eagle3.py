"""`eagle3`: an EAGLE-3 head (drafters/eagle3.py) drafts a chain of g_b tokens autoregressively from
the target's own hidden states, the target verifies it (decoding.decode_drafted). As for dflash,
the target keeps the hidden states of the layers the head reads in its per-row cache
(CausalLMTarget.capture), so they follow every join, extend, rollback and keep of the loop.

Each step, for the rows that draft (g_b >= 1), start = len(ids) - 1 (the target caches positions
0 .. start - 1): the head's context row p pairs the target's features at position p with the token
at p + 1, so every cached position is a context row (the last, p = start - 1, with the row's last
token). One head call feeds the rows verified since the row's last draft (RowContexts keeps the
head's keys and values of the earlier ones; rows of different lengths left-padded and masked); its
last row's logits give q_1, from which x_1 is drawn with the row's generator (greedy: argmax). Draft
step j = 2 .. g_b feeds x_{j-1} at position start + j - 2 with the previous step's output (before
the final norm) in place of features, and gives q_j. q = the target's warping over the head's draft
vocabulary, zero elsewhere (specdiff.vocab). The draft rows never enter RowContexts: the next step
replaces them with the target's features of what was accepted.

Exactness: each x_j is drawn from q_j given x_<j, the chain the standard rule (and match, and greedy
at temperature 0) is exact for (docs/lossless.md, as spec-ar's drafts). A row draws only its own
g_b tokens with its own generator, so its output does not depend on the batch. A row with nothing
cached has no features to draft from (the loop's rows always have one, the prefill emitting the
first token; gamma auto's timing rows on a short window may not): it proposes its last token
again, q a point mass there, which every rule verifies exactly, and draws nothing.

May import: methods.base, methods.dflash (RowContexts, capturing, cached_rows), methods.speculative (the rule choice),
decoding, acceptance, targets, drafters, vocab.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Iterator

import torch
import torch.nn.functional as F

from .. import acceptance as single
from ..contracts import CapturingTarget, Draft, Row, Rule
from ..metrics import Costs
from ..decoding import decode_drafted, empty_draft, measure_costs
from ..drafters.eagle3 import is_eagle3_drafter
from ..errors import UsageError
from ..nets.dflash import ContextCache
from ..sampling import Sampling
from ..settings import DraftSettings
from ..vocab import head_logits, on_target
from .base import Method, Models, check_capturing_sizes, cost_table, kept_costs
from .dflash import RowContexts, cached_rows, capturing
from .speculative import check_drafts, rule_name


class Eagle3Drafts:
    """The draft step: a chain per drafting row of the batch (see the module docstring)."""

    exact_rules = frozenset({"greedy", "standard", "match"})  # x_j drawn from q_j given x_<j

    def __init__(self, target: CapturingTarget, drafter: Any, sampling: Sampling):
        self.target, self.drafter, self.sampling = target, drafter, sampling
        self.layers = tuple(i + 1 for i in drafter.layer_ids)  # HF hidden_states indices
        self.contexts = RowContexts()

    def __repr__(self) -> str:
        return f"Eagle3Drafts({self.drafter.source!r})"

    @torch.no_grad()
    def __call__(self, batch: list[Row], g: list[int]) -> list[Draft]:
        """batch row b is the target's cache row b -> one Draft (1, g_b) per row."""
        drafts = [empty_draft(self.target)] * len(batch)
        members = [b for b, g_b in enumerate(g) if g_b]
        if not members:
            return drafts
        rows = [batch[b] for b in members]
        cached = cached_rows(self.target, members, rows)
        if not bool((cached > 0).any()):
            return [self._repeat(batch[b], g[b]) if g[b] else d for b, d in enumerate(drafts)]
        hidden, cache = self._context(rows, members, batch, cached)  # (B', 1, H)
        chains = self._chains(rows, [g[b] for b in members], hidden, cached, cache)
        for i, (b, row) in enumerate(zip(members, rows)):
            drafts[b] = chains[i] if int(cached[i]) else self._repeat(row, g[b])
        return drafts

    def _context(self, rows: list[Row], members: list[int], batch: list[Row],
                 cached: torch.Tensor) -> tuple[torch.Tensor, ContextCache]:
        """One head call over each row's context rows verified since its last draft -> (the output
        of its last context row (B', 1, H), the head's cache of every context row, which
        RowContexts keeps)."""
        cache, read = self.contexts.read(rows, batch)
        features, valid = self.target.features(members, newest=cached - read)  # (B', C, F), (B', C)
        C = features.shape[1]
        tokens = torch.zeros(len(rows), C, dtype=torch.long)
        positions = torch.zeros(len(rows), C, dtype=torch.long)
        for i, row in enumerate(rows):
            first, n = int(read[i]), int(cached[i] - read[i])  # context rows first .. first + n - 1
            if n:
                tokens[i, C - n:] = torch.tensor(row.ids[first + 1:first + 1 + n])  # the token after each
                positions[i, C - n:] = torch.arange(first, first + n)
        device = self.target.device
        out = self.drafter.extend(tokens.to(device), features, positions.to(device), cache,
                                  None if bool(valid.all()) else valid)
        self.contexts.write(rows, cache)
        return out[:, -1:], cache

    def _chains(self, rows: list[Row], g: list[int], hidden: torch.Tensor, cached: torch.Tensor,
                cache: ContextCache) -> list[Draft]:
        """Draft steps from the last context rows' outputs hidden (B', 1, H) over `cache` (extended
        by the draft rows: RowContexts holds its context rows already) -> a Draft (1, g_b) per row.
        At step j the rows with j <= g_b draw with their own generators; the others, and rows with
        nothing cached (their draft is _repeat's), feed their argmax: a row's generator serves its
        own g_b tokens only, whatever else is in the batch."""
        vocab, V = self.drafter.draft_vocab, self.target.vocab_size
        starts = cached.to(hidden.device)[:, None]  # (B', 1)
        wanted = torch.tensor(g) * (cached.cpu() > 0)  # tokens each row draws
        tokens, qs = [], []  # per step j: (B', 1) target ids, (B', 1, V) q (rows past g_b: unused)
        for j in range(1, max(g) + 1):
            logits = head_logits(self.drafter.logits(hidden), vocab, V)  # (B', 1, N or V)
            probs = self.sampling.probs(logits)
            rows_j = (wanted >= j).nonzero()[:, 0].tolist()
            drawn = logits.argmax(-1)  # (B', 1) head rows
            drawn[rows_j] = self.sampling.sample(probs[rows_j], [rows[i].generator for i in rows_j])
            q, x = on_target(probs, drawn, vocab)
            tokens.append(x)
            qs.append(q)
            if j < max(g):
                hidden = self.drafter.step(x, hidden, starts + j - 1, cache)
        every_x, every_q = torch.cat(tokens, dim=1), torch.cat(qs, dim=1)  # (B', G), (B', G, V)
        return [Draft(every_x[i:i + 1, :g_i], every_q[i:i + 1, :g_i], calls=g_i) for i, g_i in enumerate(g)]

    def _repeat(self, row: Row, g: int) -> Draft:
        """A row with nothing cached: its last token g times, q a point mass there."""
        tokens = torch.full((1, g), row.ids[-1], dtype=torch.long, device=self.target.device)
        return Draft(tokens, F.one_hot(tokens, self.target.vocab_size).float(), calls=0)


@dataclass(frozen=True)
class Eagle3Decoder:
    target: CapturingTarget
    drafts: Eagle3Drafts
    verify: Rule
    rule: str
    settings: DraftSettings
    sampling: Sampling
    reads: tuple[str, ...]  # the settings its method reads (methods.Method.settings)
    measured: dict[int, Costs]  # batch size -> its cost table (gamma auto; base.kept_costs)

    def __call__(self, rows: Iterable[Row], batch_size: int) -> Iterator[tuple[Row, list[int]]]:
        """Capture the head's layers for this run (a fresh cache), stop capturing after it."""
        with capturing(self.target, self.drafts, ()):
            costs, costs_s = self.costs(batch_size)
            yield from decode_drafted(self.target, self.drafts, rows, self.sampling, self.verify,
                                      self.settings.gamma, batch_size, 1, costs, costs_s)

    def costs(self, batch_size: int) -> tuple[Costs | None, float]:
        """gamma auto's cost table at this batch size (None: a fixed gamma), as methods.dflash times it."""
        def measure() -> Costs:
            with capturing(self.target, self.drafts, self.target.captured):
                return measure_costs(self.target, self.drafts, self.settings.gamma, batch_size, 1)
        return cost_table(self.measured, self.settings.adaptive, batch_size, measure)

    def warm_up(self, rows: int, length: int) -> None:
        raise UsageError("method 'eagle3' runs the eager torch target; it does not `compile`")

    def check_sizes(self, rows: int, batch_size: int, max_new_tokens: int, context: int) -> None:
        """As speculative methods, the captured hidden states counted in the cache (budget.py)."""
        check_capturing_sizes(self.target, self.drafts.layers, gamma=self.settings.gamma, copies=1,
                              batch_size=batch_size, max_new_tokens=max_new_tokens, rows=rows, context=context)

    def ran(self) -> dict[str, Any]:
        return {**{k: getattr(self.settings, k) for k in self.reads}, "acceptance": self.rule}


def prepare(method: Method, models: Models, settings: DraftSettings, sampling: Sampling,
            acceptance: str | None) -> Eagle3Decoder:
    target, drafter = models.target, models.drafter
    if not is_eagle3_drafter(drafter):
        raise UsageError("method 'eagle3' needs an EAGLE-3 drafter (`drafter`)")
    if not isinstance(target, CapturingTarget):  # a static-cache twin (`compile`)
        raise UsageError("method 'eagle3' reads the target's hidden states, which a compiled target does not keep: "
                         "drop `compile`")
    if not drafter.bound:
        raise UsageError(f"EAGLE-3 drafter '{drafter.source}' is not paired with this target (loading.pair_models)")
    drafts = Eagle3Drafts(target, drafter, sampling)
    why = target.can_capture(drafts.layers)
    if why is not None:
        raise UsageError(f"method 'eagle3': {why}")
    check_drafts(method, settings)
    if settings.tree:
        raise UsageError("method 'eagle3' drafts a chain: `tree` is not supported with it yet")
    rule = rule_name(acceptance, sampling, method, drafts, settings)
    return Eagle3Decoder(target, drafts, single.get_rule(rule), rule, settings, sampling, method.settings,
                         kept_costs(target, drafter, (settings, sampling)))
