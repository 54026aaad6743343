"""`spec-ar` and `specdiff`: a proposer drafts gamma tokens, the target verifies them in one call
(decoding.decode_speculative). Preparing one builds the method's proposer around the drafter,
wraps it in self-selection for K > 1 candidate drafts (specdiff.selection), and chooses the
acceptance rule: exactness is the proposer's own declaration (contracts.Proposer.exact_rules),
which a rule asked for when sampling must be in (docs/lossless.md). With `adaptive` (gamma auto)
the decoder times the target and the draft step once per batch size, before its first run at it
(decoding.measure_costs, kept for every later run of the same loaded models and settings:
base.kept_costs), and the loop chooses each step's length from
that table and the acceptance so far (specdiff.adaptive), settings.gamma its cap.

May import: methods.base, decoding, acceptance, selection, drafters, compiled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Protocol, cast

from .. import acceptance as single, selection
from ..compiled import warm_up
from ..contracts import Proposer, Row, Rule, Target
from ..metrics import Costs
from ..decoding import decode_speculative, measure_costs, proposer_step
from ..drafters.diffusion import DiffusionProposer, block_sizes
from ..errors import UsageError
from ..sampling import Sampling
from ..settings import DraftSettings
from ..targets.static import StaticTarget
from .base import Method, Models, check_sizes, cost_table, kept_costs


@dataclass(frozen=True)
class SpeculativeDecoder:
    target: Target
    drafter: Any
    proposer: Proposer
    verify: Rule | selection.SelectRule  # over one draft, or choosing among `settings.drafts`
    rule: str
    settings: DraftSettings
    sampling: Sampling
    reads: tuple[str, ...]  # the settings its method reads (methods.Method.settings)
    measured: dict[int, Costs]  # batch size -> its cost table (gamma auto; base.kept_costs)

    def __call__(self, rows: Iterable[Row], batch_size: int) -> Iterator[tuple[Row, list[int]]]:
        return decode_speculative(self.target, self.proposer, rows, self.sampling, self.verify, self.settings.gamma,
                                  batch_size, self.settings.drafts, *self.costs(batch_size))

    def costs(self, batch_size: int) -> tuple[Costs | None, float]:
        """The cost table of gamma auto at this batch size (None: fixed gamma), and the seconds
        spent timing it now (0: kept from an earlier run; base.cost_table)."""
        return cost_table(self.measured, self.settings.adaptive, batch_size, lambda: measure_costs(
            self.target, proposer_step(self.proposer, self.sampling, self.target), self.settings.gamma, batch_size,
            self.settings.drafts))

    def warm_up(self, rows: int, length: int) -> None:
        warm_up(cast(StaticTarget, self.target), self.drafter, rows, self.settings.gamma, self.settings.drafts,
                length)

    def check_sizes(self, rows: int, batch_size: int, max_new_tokens: int, context: int) -> None:
        check_sizes(self.target, gamma=self.settings.gamma, copies=self.settings.drafts, batch_size=batch_size,
                    max_new_tokens=max_new_tokens, rows=rows, context=context)

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
    rule = rule_name(acceptance, sampling, method, proposer, settings)
    verify: Rule | selection.SelectRule = single.get_rule(rule) if settings.drafts == 1 else selection.get_rule(rule)
    if settings.drafts > 1:  # only specdiff reads `drafts` (checked above)
        proposer = selection.SelfSelection(cast(DiffusionProposer, proposer), settings.drafts,
                                           settings.draft_temperature, iid=rule == "multi")
    return SpeculativeDecoder(models.target, models.drafter, proposer, verify, rule, settings, sampling,
                              method.settings, kept_costs(models.target, models.drafter, (settings, sampling)))


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
