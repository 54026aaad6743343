"""What a method is: its declaration (Method), the models it decodes with (Models), the kinds of
target it may decode (the kinds of drafter are specdiff.kinds'), and the step-size check every
causal decoder shares.

May import: specdiff's contracts, settings, budget, adaptive, errors and the drafters' and targets' kinds;
not generation (which imports this).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Callable, Hashable

from ..metrics import Costs
from ..budget import check_step
from ..contracts import CapturingTarget, Decoder, Drafter, Proposer, Target
from ..errors import UsageError
from ..kinds import get_kind
from ..kinds.block import is_block_diffusion
from ..sampling import Sampling


@dataclass(frozen=True)
class Models:
    """The loaded models a method decodes with; `drafter` is None for a method without one."""

    target: Any
    drafter: Any = None  # of the kind the method needs (its own module reads what that kind offers)


TARGET_KINDS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "causal": ("a causal LM target", lambda target: not is_block_diffusion(target)),
    "block-diffusion": ("a block-diffusion target (SDAR layout)", is_block_diffusion),
}

# (method, models, its family's settings or None, sampling, acceptance asked for or None) -> Decoder
Prepare = Callable[["Method", Models, Any, Sampling, "str | None"], Decoder]


@dataclass(frozen=True)
class Method:
    """One decoding method: see the table's docstring (methods/__init__.py)."""

    name: str
    summary: str
    prepare_with: Prepare
    needs: str | None = None  # the name of a drafter kind (specdiff.kinds); None: no drafter
    build: Callable[[Any, Any], Proposer] | None = None  # (drafter, DraftSettings) -> its proposer
    trees: Callable[..., Any] | None = None  # (proposer, sampling, target, nodes) -> its `tree` draft step
    rules: tuple[str, ...] = ()
    family: type | None = None  # the settings dataclass whose fields it reads (specdiff.settings)
    settings: tuple[str, ...] = ()  # the fields of `family` it reads (what a bench sweeps)
    target: str = "causal"  # a key of TARGET_KINDS
    exact: bool = True  # False: approximate, its output is not its reference's

    def prepare(self, models: Models, settings: Any, sampling: Sampling, acceptance: str | None = None) -> Decoder:
        """The decoder of one run: the method's pieces built around the models, checked."""
        return self.prepare_with(self, models, settings, sampling, acceptance)

    def accepts(self, drafter: Drafter | None) -> bool:
        return self.needs is not None and get_kind(self.needs).holds(drafter)

    def check_drafter(self, drafter: Drafter | None) -> None:
        if self.needs is not None and not self.accepts(drafter):
            raise UsageError(f"method '{self.name}' needs {get_kind(self.needs).what} (`drafter`)")

    def check_target(self, target: Any) -> None:
        what, check = TARGET_KINDS[self.target]
        if not check(target):
            raise UsageError(f"method '{self.name}' needs {what}; '{target.name}' is not one (`target`)")


def check_sizes(target: Target, *, gamma: int | None, copies: int, batch_size: int, max_new_tokens: int,
                rows: int, context: int, tree: int = 0) -> None:
    """Refuse sizes that cannot serve: a draft (gamma tokens, or a tree of `tree` nodes; gamma
    None: no draft) longer than the target's context window, or a decoding step (`rows` rows
    decoded together, each verifying `copies` candidate drafts of up to gamma + 1 tokens, or the
    tree's nodes + 1, caches of `context` tokens) larger than the free memory (budget.py)."""
    drafted = {"gamma": gamma, "tree": tree} if gamma is not None else {}
    for name, size in drafted.items():
        if size >= target.max_length:
            raise UsageError(f"`{name}` {size} does not fit the target's context window ({target.max_length} "
                             "tokens) after a prompt")
    if target.max_rows:  # the loop decodes no more rows together than the target takes
        rows = min(rows, max(1, target.max_rows // copies))
    sizes = {"batch_size": batch_size, **({"drafts": copies} if copies > 1 else {}),
             **{name: size for name, size in drafted.items() if size}}
    tokens = min(max(gamma, tree) + 1, max_new_tokens) if gamma is not None else 1
    check_step(target, rows=rows * copies, tokens=tokens, context=context, sizes=sizes)


def check_capturing_sizes(target: CapturingTarget, layers: tuple[int, ...], **sizes: Any) -> None:
    """check_sizes(target, **sizes) with the hidden states of `layers` captured, so that they count
    in the cache (a drafter reading them: dflash, eagle3); the target captures nothing after."""
    target.capture(layers)
    try:
        check_sizes(target, **sizes)
    finally:
        target.capture(())


# target -> drafter -> (draft settings, sampling) -> {batch size: Costs}; gone with either model
_KEPT: "weakref.WeakKeyDictionary[Any, weakref.WeakKeyDictionary[Any, dict[Hashable, dict[int, Costs]]]]" = \
    weakref.WeakKeyDictionary()


def kept_costs(target: Any, drafter: Drafter, key: Hashable) -> dict[int, Costs]:
    """The cost tables (batch size -> Costs) that every decoder of these two loaded models under
    `key` (its draft settings and sampling) shares in this process: a library user calling
    generate() per request times them once, not on every call (seconds each)."""
    by_drafter = _KEPT.setdefault(target, weakref.WeakKeyDictionary())
    return by_drafter.setdefault(drafter, {}).setdefault(key, {})


def cost_table(measured: dict[int, Costs], adaptive: bool, batch_size: int,
               measure: Callable[[], Costs]) -> tuple[Costs | None, float]:
    """gamma auto's cost table at this batch size and the seconds this call spent timing it:
    `measure()` at its first use (its measured_s), then kept in `measured` (kept_costs' tables, by
    batch size; 0 s); (None, 0.0) for a fixed gamma (not adaptive)."""
    if not adaptive:
        return None, 0.0
    if batch_size not in measured:
        measured[batch_size] = measure()
        return measured[batch_size], measured[batch_size].measured_s
    return measured[batch_size], 0.0
