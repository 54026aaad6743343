"""`spec-ar` and `specdiff`: a proposer drafts gamma tokens, the target verifies them in one call
(decoding.decode_speculative). Preparing one builds the method's proposer around the drafter,
wraps it in self-selection for K > 1 candidate drafts (specdiff.selection), and chooses the
acceptance rule: exactness is the proposer's own declaration (contracts.Proposer.exact_rules),
which a rule asked for when sampling must be in (docs/lossless.md). With `adaptive` (gamma auto)
the decoder times the target and the draft step once per batch size, before its first run at it
(decoding.measure_costs, kept for every later run of the same loaded models and settings:
base.kept_costs), and the loop chooses each step's length from
that table and the acceptance so far (specdiff.adaptive), settings.gamma its cap.

With `tree` N > 0 (or auto) each row drafts a trees.Tree instead (the method's declared tree
step, methods.Method.trees: a ProposerTrees), the target
verifies every row's tree in one call and keeps the accepted path (decoding.decode_drafted,
specdiff.trees), by the rule tree_rule chooses (greedy, match over the tree, or multi over
sampled children; docs/lossless.md, "Trees"):
    specdiff   one drafter call at T = 1 gives every masked slot's marginal, which does not depend
               on the other draft tokens: the tree is best-first over them (MarginalTrees:
               trees.marginal_tree, as dflash's); `steps` > 1 is refused with a tree
    spec-ar    best-first by joint probability under the drafter's conditionals, grown depth by
               depth (GrownTrees: trees.grown over drafters.autoregressive.ARPaths; EAGLE-2): a
               node's children are its top tokens under q(. | its path); children chosen
               deterministically, so greedy and match only (multi needs children drawn from q)

May import: methods.base, decoding, acceptance, selection, trees, vocab, drafters, compiled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Protocol, cast

import torch

from .. import acceptance as single, selection, trees
from ..compiled import warm_up
from ..contracts import Draft, Proposer, Row, Rule, Target, TreeTarget
from ..decoding import decode_drafted, decode_speculative, grouped, measure_costs, proposer_step
from ..metrics import Costs
from ..drafters.diffusion import DiffusionProposer, block_sizes
from ..errors import UsageError
from ..sampling import Sampling
from ..settings import AUTO, DraftSettings, tree_nodes
from ..targets.static import StaticTarget
from ..vocab import target_ids, target_probs
from .base import Method, Models, check_sizes, cost_table, kept_costs


class ProposerTrees:
    """The draft step of a `tree` run of spec-ar or specdiff (see the module docstring): a
    trees.Tree of up to `nodes` nodes and depth <= g_b per drafting row, ranked by
    trees.ranking(sampling), q over the target's ids, one call of `_trees` per draft length
    (decoding.grouped). samples_children: whether its trees can have their children drawn from q
    (rule multi: `sampled`)."""

    samples_children = False

    def __init__(self, proposer: Any, sampling: Sampling, target: Target, nodes: int):
        self.proposer, self.sampling, self.target, self.nodes, self.sampled = proposer, sampling, target, nodes, False
        vocab = getattr(proposer.drafter, "draft_vocab", None)
        self.ids: Callable[[torch.Tensor], torch.Tensor] = lambda rows: target_ids(rows, vocab)
        self.widen: Callable[[torch.Tensor], torch.Tensor] = lambda probs: target_probs(probs, vocab)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.proposer!r}, tree={self.nodes})"

    @torch.no_grad()
    def __call__(self, batch: list[Row], g: list[int]) -> list[Draft]:
        """batch row b is the target's cache row b -> a trees.Tree of depth <= g_b per row."""
        return grouped(batch, g, self.target, self._trees, trees.empty_tree(self.target.device, self.target.vocab_size))

    def _trees(self, rows: list[Row], g_b: int, context: torch.Tensor, ragged: dict[str, torch.Tensor]) -> list[Draft]:
        raise NotImplementedError


class MarginalTrees(ProposerTrees):
    """specdiff's: one call of its DiffusionProposer at T = 1 gives every masked slot's marginal
    for the rows of a length (DiffusionProposer.marginals), and each row's tree is best-first over
    them (trees.marginal_tree, as dflash's), or its shape with children drawn from q (`sampled`)."""

    samples_children = True

    def __init__(self, proposer: DiffusionProposer, sampling: Sampling, target: Target, nodes: int):
        if proposer.steps > 1:
            raise UsageError(f"`tree` ranks the diffusion drafter's one-call marginals (steps 1); `steps` "
                             f"{proposer.steps} would draw later slots given earlier ones: give `steps` 1 with it")
        super().__init__(proposer, sampling, target, nodes)

    def _trees(self, rows: list[Row], g_b: int, context: torch.Tensor, ragged: dict[str, torch.Tensor]) -> list[Draft]:
        logits = self.proposer.marginals(context, g_b, ragged.get("lengths"))  # (B_g, g_b, V_d)
        probs = trees.ranking(self.sampling).probs(logits)
        return [trees.marginal_tree(probs[i], self.nodes, self.ids, self.widen, row.generator, self.sampled)
                for i, row in enumerate(rows)]


class GrownTrees(ProposerTrees):
    """spec-ar's: per row, trees.grown over its ARProposer's ARPaths: depth by depth the drafter
    runs on the paths of the nodes that may still be among the N best, a node's children its top
    tokens under q(. | its path); deterministic children only (no multi)."""

    def _trees(self, rows: list[Row], g_b: int, context: torch.Tensor, ragged: dict[str, torch.Tensor]) -> list[Draft]:
        L, ranking = context.shape[1], trees.ranking(self.sampling)  # each row's ids end the left-padded context
        return [trees.grown(self.proposer.paths(context[i:i + 1, L - len(row.ids):], g_b, ranking), self.nodes, g_b,
                            self.ids, self.widen) for i, row in enumerate(rows)]


@dataclass(frozen=True)
class SpeculativeDecoder:
    target: Target
    drafter: Any
    proposer: Proposer
    verify: Rule | selection.SelectRule | trees.TreeRule  # over one draft, choosing among `settings.drafts`, a tree
    rule: str
    settings: DraftSettings
    sampling: Sampling
    reads: tuple[str, ...]  # the settings its method reads (methods.Method.settings)
    measured: dict[int, Costs]  # batch size -> its cost table (gamma auto, tree auto; base.kept_costs)
    trees: ProposerTrees | None = None  # `tree`: the draft step

    def __call__(self, rows: Iterable[Row], batch_size: int) -> Iterator[tuple[Row, list[int]]]:
        costs, costs_s = self.costs(batch_size)
        if self.trees is None:
            return decode_speculative(self.target, self.proposer, rows, self.sampling, self.verify,
                                      self.settings.gamma, batch_size, self.settings.drafts, costs, costs_s)
        return decode_drafted(self.target, self.trees, rows, self.sampling, self.verify, self.settings.gamma,
                              batch_size, 1, costs, costs_s, tree=True, tree_max=self.trees.nodes * self.sized)

    @property
    def sized(self) -> bool:
        """`tree` auto: each step's tree size chosen by a tree_sizes.SizeController."""
        return self.settings.tree == AUTO

    def costs(self, batch_size: int) -> tuple[Costs | None, float]:
        """The cost table of gamma auto or tree auto at this batch size (None: fixed sizes; a
        tree's verify widths up to its most nodes + 1), and the seconds spent timing it now (0:
        kept from an earlier run; base.cost_table)."""
        step = self.trees or proposer_step(self.proposer, self.sampling, self.target)
        width = (self.trees.nodes + 1) * self.sized if self.trees else 0
        return cost_table(self.measured, self.settings.adaptive or self.sized, batch_size, lambda: measure_costs(
            self.target, step, self.settings.gamma, batch_size, self.settings.drafts, width=width))

    def warm_up(self, rows: int, length: int) -> None:
        warm_up(cast(StaticTarget, self.target), self.drafter, rows, self.settings.gamma, self.settings.drafts,
                length)

    def check_sizes(self, rows: int, batch_size: int, max_new_tokens: int, context: int) -> None:
        check_sizes(self.target, gamma=self.settings.gamma, tree=self.trees.nodes if self.trees else 0,
                    copies=self.settings.drafts, batch_size=batch_size, max_new_tokens=max_new_tokens, rows=rows,
                    context=context)

    def ran(self) -> dict[str, Any]:
        """The settings its method reads, steps as run (at most one step per draft slot), the rule."""
        ran = {k: getattr(self.settings, k) for k in self.reads}
        if "steps" in ran:
            ran["steps"] = len(block_sizes(self.settings.gamma, self.settings.steps))
        return {**ran, "acceptance": self.rule}


def prepare(method: Method, models: Models, settings: DraftSettings, sampling: Sampling,
            acceptance: str | None) -> SpeculativeDecoder:
    check_drafts(method, settings)
    assert method.build is not None, f"{method.name} declares no proposer"  # the registry's to give
    proposer = method.build(models.drafter, settings)
    kept = kept_costs(models.target, models.drafter, (settings, sampling))
    if settings.tree:
        assert method.trees is not None, f"{method.name} reads `tree` and declares no tree step"  # the registry's
        step: ProposerTrees = method.trees(proposer, sampling, models.target, tree_nodes(settings.tree))
        rule = tree_rule(models.target, settings, sampling, acceptance, sampled_children=step.samples_children)
        step.sampled = rule == "multi"  # recursive rejection needs every child drawn from q
        return SpeculativeDecoder(models.target, models.drafter, proposer, trees.RULES[rule], rule, settings, sampling,
                                  method.settings, kept, step)
    rule = rule_name(acceptance, sampling, method, proposer, settings)
    verify: Rule | selection.SelectRule = single.get_rule(rule) if settings.drafts == 1 else selection.get_rule(rule)
    if settings.drafts > 1:  # only specdiff reads `drafts` (checked above)
        proposer = selection.SelfSelection(cast(DiffusionProposer, proposer), settings.drafts,
                                           settings.draft_temperature, iid=rule == "multi")
    return SpeculativeDecoder(models.target, models.drafter, proposer, verify, rule, settings, sampling,
                              method.settings, kept)


def check_drafts(method: Method, settings: DraftSettings) -> None:
    """K > 1 candidate drafts only for a method that reads `drafts`; draft_temperature only with them."""
    if settings.drafts > 1 and "drafts" not in method.settings:
        raise UsageError(f"method '{method.name}' drafts one candidate; `drafts` > 1 needs specdiff or dflash")
    if settings.draft_temperature is not None and settings.drafts == 1:
        raise UsageError("`draft_temperature` warps candidate drafts 2..K: it needs `drafts` > 1")


class Declares(Protocol):
    """What the rule choice reads of a proposer (or of methods.dflash's draft step)."""

    @property
    def exact_rules(self) -> frozenset[str]: ...


def rule_name(acceptance: str | None, sampling: Sampling, method: Method, proposer: Declares,
              draft: DraftSettings) -> str:
    """The acceptance rule: by default greedy at temperature 0, else select over K > 1 drafts, else
    the method's first rule that the proposer declares exact (contracts.Proposer.exact_rules); a
    rule asked for must be one of the method's, fit the number of drafts and, when sampling, be
    one the proposer declares exact."""
    exact = proposer.exact_rules
    if acceptance is None:
        if sampling.greedy or draft.drafts > 1:
            return "greedy" if sampling.greedy else "select"
        return next(r for r in method.rules if r in exact and r != "greedy" and r in single.RULES)
    known = [*single.RULES, *(r for r in selection.RULES if r not in single.RULES)]
    if acceptance not in known:
        raise UsageError(f"unknown acceptance rule '{acceptance}' (choose from {', '.join(known)})")
    if draft.drafts > 1:
        selection.get_rule(acceptance)
    elif acceptance not in single.RULES:
        raise UsageError(f"{acceptance} acceptance chooses among candidate drafts: it needs `drafts` > 1")
    if acceptance not in method.rules:
        raise UsageError(f"method '{method.name}' does not use {acceptance} acceptance "
                         f"(choose from {', '.join(method.rules)})")
    if sampling.greedy:
        return acceptance  # with one-hot p and q every rule is the greedy check
    if acceptance == "greedy":
        raise UsageError("greedy acceptance needs `temperature` 0; use standard or match when sampling")
    if acceptance not in exact:
        raise UsageError(
            f"{acceptance} acceptance would not be exact with these drafts: {proposer!r} declares "
            f"only {', '.join(sorted(exact))} exact "
            f"(docs/lossless.md); use `acceptance` {'select' if draft.drafts > 1 else 'match'}, or `temperature` 0")
    return acceptance


def tree_rule(target: Any, settings: DraftSettings, sampling: Sampling, acceptance: str | None,
              sampled_children: bool = True) -> str:
    """The rule of a `tree` run (trees.RULES: greedy at temperature 0, else match over the tree, or
    multi asked for: children sampled from q, recursive rejection over siblings),
    or UsageError for what a tree cannot run with: another rule, K > 1 drafts, gamma auto with a
    fixed size (`tree` auto takes gamma's cap as its depth bound), a target that does not verify
    trees (a model whose windows count columns, torch or exported; a Target without extend_tree),
    multi from a drafter that cannot sample children (sampled_children False: spec-ar, whose q
    depends on the path, so the tree's shape cannot be chosen before its tokens are drawn)."""
    why = target.can_tree() if isinstance(target, TreeTarget) else (
        "this target verifies chains only (it has no extend_tree): drop `tree`")
    if why is not None:
        raise UsageError(f"`tree`: {why}")
    if settings.drafts > 1:
        raise UsageError("`tree` already verifies several continuations: give `drafts` 1 with it")
    if settings.adaptive and settings.tree != AUTO:
        raise UsageError(f"`tree` {settings.tree} drafts to a fixed depth: give an integer `gamma` (the tree's depth "
                         f"bound), or `tree` {AUTO}")
    rule = "greedy" if sampling.greedy else "match"
    if acceptance == "multi" and not sampling.greedy:
        if not sampled_children:
            raise UsageError("`tree` with an autoregressive drafter ranks each node's children by q given its path, "
                             "deterministically: multi needs children drawn from q (specdiff, dflash); use match")
        return acceptance  # sampled children, recursive rejection over siblings
    if acceptance not in (None, rule):
        raise UsageError(f"`tree` verifies by walking the tree with draws from p ({rule} over a tree) or by "
                         f"recursive rejection over sampled children (multi): acceptance {acceptance} does not apply")
    return rule
