"""`dflash`: a DFlash drafter (drafters/dflash.py) drafts a block from the target's own hidden
states in one call, the target verifies it (decoding.decode_drafted). The target keeps the hidden
states of the layers the drafter reads as part of its per-row cache (CausalLMTarget.capture), so
they follow every join, extend, rollback and keep of the loop.

Each step, for the rows that draft (g_b >= 1): the anchor is the row's last token (position
start = len(ids) - 1, the one token the target has not cached), the context is the target's
features of every cached token (positions 0 .. start - 1; rows of different lengths left-padded
and masked), one drafter call for the batch; q = the same warping as the target's p over the
real vocabulary (zero outside the drafter's draft vocabulary if it has one: specdiff.vocab);
row b draws x_1..x_g_b from its own q with its own generator (greedy: argmax).
The slots are drawn independently, q_j not depending on x_<j, so the standard rule is exact, as
are match and greedy (docs/lossless.md, "Diffusion drafters", case 1). With `drafts` K > 1 the
row's K candidate blocks come from the same call (DFlashDrafts), the target verifies them as K
copies of the row (decoding._verify_selected) and a selection rule keeps one: greedy, select
(point mass), multi (recursive rejection over i.i.d. candidates; docs/lossless.md, "Several
drafts"). gamma <= block_size - 1: the drafter always fills its whole trained block (so a
row's q never depends on its neighbours' gamma), its head scores only the first max_b g_b slots,
and each row keeps its first g_b. The drafter keeps each row's context K/V across steps
(RowContexts): a step feeds it only the features of the positions verified since the row's last
draft.

With `tree` N > 0 the row drafts a tree instead (DFlashDrafts: N nodes best-first over the
slots' marginals, depth <= g_b), the target verifies every row's tree in one call and keeps the
accepted path (specdiff.trees; a contracts.TreeTarget: the torch CausalLMTarget), the rule is
greedy or match over the tree, or multi over children drawn from q (tree_rule; docs/lossless.md,
"Trees").

The target is any contracts.CapturingTarget (the torch CausalLMTarget, or an exported graph's
GraphTarget whose graph outputs the drafter's layers); the drafter is a DFlashDrafter or its
exported graph (runtimes.models.GraphDFlashDrafter): both draft through the same call.

May import: methods.base, methods.speculative (the rule choice), decoding, acceptance, trees,
targets, drafters.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Protocol, cast

import torch

from .. import acceptance as single, selection, trees
from ..contracts import CapturingTarget, Draft, Row, Rule, TreeTarget
from ..metrics import Costs
from ..decoding import decode_drafted, empty_draft, measure_costs
from ..drafters.dflash import hidden_state_indices, is_dflash_drafter as is_dflash
from ..nets.dflash import ContextCache
from ..errors import UsageError
from ..sampling import Sampling
from ..settings import AUTO, DraftSettings, tree_nodes
from ..vocab import head_logits, on_target, target_ids, target_probs
from .base import Method, Models, check_capturing_sizes, cost_table, kept_costs
from .speculative import check_drafts, rule_name, tree_rule


SINGLE_RULES = frozenset({"greedy", "standard", "match"})  # slots drawn independently from q: case 1


class RowContexts:
    """The drafter's keys and values of the context each decoding row has had read (per draft
    layer (KV heads, n_b, head_dim)), kept across steps, so that a step feeds the drafter only the
    features of the positions verified since the row's last draft. Keyed by the Row object, which
    is held (its id cannot be reused while it is); rows that have left the batch are dropped."""

    def __init__(self) -> None:
        self.rows: dict[int, tuple[Row, list[tuple[torch.Tensor, torch.Tensor]]]] = {}

    def read(self, rows: list[Row], batch: list[Row]) -> tuple[ContextCache, torch.Tensor]:
        """-> the rows' K/V as one ContextCache (left-padded, padding not valid) and how many
        context positions each holds (B',); forgets rows that are not in `batch`."""
        present = {id(row) for row in batch}
        self.rows = {key: kept for key, kept in self.rows.items() if key in present}
        held = [self.rows[id(row)][1] if id(row) in self.rows else None for row in rows]
        counts = torch.tensor([0 if kv is None else kv[0][0].shape[1] for kv in held])
        cache = ContextCache()
        N = int(counts.max()) if len(counts) else 0
        if N == 0:
            return cache, counts
        layers = len(next(kv for kv in held if kv is not None))
        for layer in range(layers):
            cache.kv.append(tuple(_left_padded([None if kv is None else kv[layer][i] for kv in held], N)
                                  for i in (0, 1)))  # type: ignore[arg-type]
        if bool((counts != N).any()):
            cache.valid = torch.arange(N)[None] >= N - counts[:, None]
        return cache, counts

    def write(self, rows: list[Row], cache: ContextCache) -> None:
        """Keep each row's valid K/V of the extended cache."""
        for i, row in enumerate(rows):
            valid = slice(None) if cache.valid is None else cache.valid[i].to(cache.kv[0][0].device)
            self.rows[id(row)] = (row, [(k[i][:, valid], v[i][:, valid]) for k, v in cache.kv])


class ContextDrafts(Protocol):
    """A draft step reading the target's captured features through RowContexts (DFlashDrafts,
    eagle3.Eagle3Drafts): the HF hidden_states indices it reads, and its rows' contexts."""

    layers: tuple[int, ...]
    contexts: RowContexts


@contextmanager
def capturing(target: CapturingTarget, drafts: ContextDrafts, after: tuple[int, ...]) -> Iterator[None]:
    """Inside: the target keeps the hidden states of drafts.layers (a fresh cache) and drafts starts
    from empty contexts; after it (a run, a cost timing): the capture `after`, the contexts emptied."""
    target.capture(drafts.layers)
    drafts.contexts = RowContexts()
    try:
        yield
    finally:
        target.capture(after)
        drafts.contexts = RowContexts()


def cached_rows(target: CapturingTarget, members: list[int], rows: list[Row]) -> torch.Tensor:
    """(B',) the tokens the target caches of its rows `members` (the drafting `rows`), checked
    against the loop's invariant: each row's tokens but its last."""
    cached = target.lengths[members]
    if cached.tolist() != [len(row.ids) - 1 for row in rows]:
        raise RuntimeError(f"target caches {cached.tolist()} tokens of rows of {[len(r.ids) for r in rows]}")
    return cached


def _left_padded(parts: list[torch.Tensor | None], N: int) -> torch.Tensor:
    """Per row (heads, n_b, D) or None (nothing) -> (B', heads, N, D), each row's at the end (one
    full row: that row's tensor itself, a view)."""
    if len(parts) == 1 and parts[0] is not None and parts[0].shape[1] == N:
        return parts[0][None]
    first = next(p for p in parts if p is not None)
    out = first.new_zeros(len(parts), first.shape[0], N, first.shape[2])
    for b, part in enumerate(parts):
        if part is not None and part.shape[1]:
            out[b, :, N - part.shape[1]:] = part
    return out


class DFlashDrafts:
    """The draft step: the drafter's block for every drafting row of the batch from the target's
    cached features (see the module docstring). exact_rules: as a proposer declares them.

    drafts K > 1: K candidate blocks per row from the same call, as selection.SelfSelection draws
    them from a diffusion drafter: the argmax block, then K - 1 draws from q warped at
    draft_temperature (all K draws when `iid`, which `multi` needs); the slots being independent
    given the features, the survivors' next tokens are i.i.d. q_j whatever prefix was accepted.

    tree N > 0: a trees.Tree per row instead, its N nodes best-first over the per-slot marginals
    (trees.best_first; slot j's marginal does not depend on x_<j), depth <= g_b; ranked by q (at
    temperature 0, where q is one-hot, by the drafter's softmax at temperature 1)."""

    def __init__(self, target: CapturingTarget, drafter: Any, sampling: Sampling, drafts: int = 1,
                 draft_temperature: float | None = None, iid: bool = False, tree: int = 0):
        self.target, self.drafter, self.sampling = target, drafter, sampling
        self.K, self.iid, self.tree = drafts, iid, tree
        self.warping = sampling if drafts == 1 else selection.candidate_warping(sampling, draft_temperature)
        self.exact_rules = SINGLE_RULES if drafts == 1 else frozenset(selection.RULES)
        self.layers = hidden_state_indices(drafter)
        self.contexts = RowContexts()

    def __repr__(self) -> str:
        return (f"DFlashDrafts({self.drafter.source!r}{f', drafts={self.K}' if self.K > 1 else ''}"
                f"{f', tree={self.tree}' if self.tree else ''})")

    @torch.no_grad()
    def __call__(self, batch: list[Row], g: list[int]) -> list[Draft]:
        """batch row b is the target's cache row b -> one Draft (1, g_b) per row (K > 1:
        selection.Candidates, tokens (1, K, g_b); tree: a trees.Tree of depth <= g_b)."""
        none = trees.empty_tree(self.target.device, self.target.vocab_size) if self.tree else empty_draft(self.target)
        drafts: list[Draft] = [none] * len(batch)
        members = [b for b, g_b in enumerate(g) if g_b]
        if not members:
            return drafts
        rows = [batch[b] for b in members]
        vocab = self.drafter.draft_vocab
        logits = head_logits(self._logits(rows, members, batch, max(g[b] for b in members)), vocab,
                             self.target.vocab_size)  # (B', max g_b, N or V): what the head may propose
        if self.tree:
            return self._trees(logits, batch, members, g, drafts)
        probs = self.warping.probs(logits)  # (B', max g_b, N or V)
        for i, (b, row) in enumerate(zip(members, rows)):
            p_b = probs[i:i + 1, :g[b]]  # (1, g_b, N or V)
            if self.K == 1:
                q_b, tokens = on_target(p_b, self.sampling.sample(p_b, row.generator), vocab)
                drafts[b] = Draft(tokens, q_b, calls=1)
            else:
                argmax = logits[i:i + 1, :g[b]].argmax(-1)
                q_b, tokens = on_target(p_b, selection.draw_candidates(argmax, p_b, self.K, self.iid, row.generator),
                                        vocab)
                drafts[b] = selection.Candidates(tokens, q_b, calls=1)
        return drafts

    def _trees(self, logits: torch.Tensor, batch: list[Row], members: list[int], g: list[int],
               drafts: list[Draft]) -> list[Draft]:
        """logits (B', max g_b, N or V) of the drafting rows (batch rows `members`) -> `drafts`
        with a trees.Tree of up to self.tree nodes and depth <= g_b at each of them; `iid` (rule
        multi): its shape, every node's token then drawn from q with the row's generator."""
        probs = trees.ranking(self.sampling).probs(logits)
        vocab = self.drafter.draft_vocab
        for i, b in enumerate(members):
            drafts[b] = trees.marginal_tree(probs[i, :g[b]], self.tree, lambda ids: target_ids(ids, vocab),
                                            lambda p: target_probs(p, vocab), batch[b].generator, self.iid)
        return drafts

    def _logits(self, rows: list[Row], members: list[int], batch: list[Row], slots: int) -> torch.Tensor:
        """One drafter call for the drafting rows (target cache rows `members`) over the features
        verified since each row's last draft -> logits (B', slots, vocab_rows) float32."""
        cached = cached_rows(self.target, members, rows)
        cache, read = self.contexts.read(rows, batch)
        context, valid = self.target.features(members, newest=cached - read)  # (B', C_new, F), (B', C_new)
        device = self.target.device
        anchor = torch.tensor([row.ids[-1] for row in rows], device=device)
        logits = self.drafter(anchor, context, cached.to(device), cache,
                              context_valid=None if bool(valid.all()) else valid,
                              slots=slots)  # the head scores only the slots kept
        self.contexts.write(rows, cache)
        return cast(torch.Tensor, logits)


@dataclass(frozen=True)
class DFlashDecoder:
    target: CapturingTarget
    drafts: DFlashDrafts
    verify: Rule | selection.SelectRule | trees.TreeRule  # one draft, `settings.drafts`, or a tree
    rule: str
    settings: DraftSettings
    sampling: Sampling
    reads: tuple[str, ...]  # the settings its method reads (methods.Method.settings)
    measured: dict[int, Costs]  # batch size -> its cost table (gamma auto; base.kept_costs)

    def __call__(self, rows: Iterable[Row], batch_size: int) -> Iterator[tuple[Row, list[int]]]:
        """Capture the drafter's layers for this run (a fresh cache), stop capturing after it;
        with `adaptive`, time the target and the draft step first (decoding.measure_costs, once
        per batch size, kept for later runs of these models: base.kept_costs)."""
        with capturing(self.target, self.drafts, ()):
            costs, costs_s = self.costs(batch_size)
            yield from decode_drafted(self.target, self.drafts, rows, self.sampling, self.verify,
                                      self.settings.gamma, batch_size, self.settings.drafts, costs, costs_s,
                                      tree=bool(self.settings.tree), tree_max=self.drafts.tree * self.sized)

    @property
    def sized(self) -> bool:
        """`tree` auto: each step's tree size chosen by a tree_sizes.SizeController."""
        return self.settings.tree == AUTO

    def costs(self, batch_size: int) -> tuple[Costs | None, float]:
        """gamma auto's or tree auto's cost table at this batch size (None: fixed sizes; a tree's
        verify widths up to its most nodes + 1) and the seconds spent
        timing it now (base.cost_table), measured on dummy rows with the capture on (as a run has
        it; bench times the table before its passes), then the cache and the drafter's contexts
        emptied and the capture as it was."""
        def measure() -> Costs:
            with capturing(self.target, self.drafts, self.target.captured):
                return measure_costs(self.target, self.drafts, self.settings.gamma, batch_size, self.settings.drafts,
                                     width=(self.drafts.tree + 1) * self.sized)
        return cost_table(self.measured, self.settings.adaptive or self.sized, batch_size, measure)

    def warm_up(self, rows: int, length: int) -> None:
        raise UsageError("method 'dflash' runs the eager torch target; it does not `compile`")

    def check_sizes(self, rows: int, batch_size: int, max_new_tokens: int, context: int) -> None:
        """As speculative methods, the captured hidden states counted in the cache (budget.py)."""
        check_capturing_sizes(self.target, self.drafts.layers, gamma=self.settings.gamma, tree=self.drafts.tree,
                              copies=self.settings.drafts, batch_size=batch_size, max_new_tokens=max_new_tokens,
                              rows=rows, context=context)

    def ran(self) -> dict[str, Any]:
        return {**{k: getattr(self.settings, k) for k in self.reads}, "acceptance": self.rule}


def prepare(method: Method, models: Models, settings: DraftSettings, sampling: Sampling,
            acceptance: str | None) -> DFlashDecoder:
    target, drafter = models.target, models.drafter
    if not is_dflash(drafter):
        raise UsageError("method 'dflash' needs a DFlash drafter (`drafter`)")
    if not isinstance(target, CapturingTarget):  # a static-cache twin (`compile`): nothing else is made here
        raise UsageError("method 'dflash' reads the target's hidden states, which a compiled target does not keep: "
                         "drop `compile` (dflash runs the eager torch target or an exported one)")
    why = target.can_capture(hidden_state_indices(drafter))
    if why is not None:
        raise UsageError(f"method 'dflash': {why}")
    check_drafts(method, settings)
    if settings.gamma > drafter.block_size - 1:
        raise UsageError(f"`gamma` {settings.gamma} is more than the DFlash drafter's block holds "
                         f"({drafter.block_size - 1} draft slots after the anchor)")
    drafts = DFlashDrafts(target, drafter, sampling, settings.drafts, settings.draft_temperature,
                          tree=tree_nodes(settings.tree))
    verify: Rule | selection.SelectRule | trees.TreeRule
    if settings.tree:
        rule = tree_rule(target, settings, sampling, acceptance)
        verify = trees.RULES[rule]
    else:
        rule = rule_name(acceptance, sampling, method, drafts, settings)
        verify = single.get_rule(rule) if settings.drafts == 1 else selection.get_rule(rule)
    drafts.iid = rule == "multi"  # recursive rejection needs every candidate (a tree: every child) drawn from q
    return DFlashDecoder(target, drafts, verify, rule, settings, sampling, method.settings,
                         kept_costs(target, drafter, (settings, sampling)))
