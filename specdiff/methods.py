"""The decoding methods, one declaration each. `generation.plan`, `tools.bench` and the CLI read
this table; a new method is its own proposer module plus one entry here (and its name in
`names.METHODS`, the torch-free copy that keeps `specdiff --help` fast).

    name       what users pass as `method`
    needs      the kind of drafter it needs (DRAFTER_KINDS; None: no drafter)
    build      (drafter, DraftSettings) -> Proposer   (None: no proposer)
    rules      acceptance rules it can run, preferred first when sampling; the proposer it builds
               declares which of them are exact (contracts.Proposer.exact_rules)
    settings   the draft settings it reads (gamma, steps, schedule, drafts, ...): what `specdiff bench` sweeps
    loop       which decoding loop runs it (decoding.decode_ar / decode_speculative)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from .contracts import Proposer
from .decoding import decode_ar, decode_speculative
from .drafters.autoregressive import ARDrafter, ARProposer
from .drafters.diffusion import DiffusionProposer
from .errors import UsageError


@dataclass(frozen=True)
class DraftSettings:
    gamma: int
    steps: int
    schedule: str
    drafts: int = 1  # K candidate drafts per step (specdiff.selection)
    draft_temperature: float | None = None  # warping of candidates 2..K (None: SelfSelection's default)


def is_diffusion(drafter: Any) -> bool:
    """A DiffusionDrafter, or any object with its drafting interface (x0_logits, mask_id,
    vocab_size, context_length), such as an exported graph (runtimes.models.GraphDrafter)."""
    return hasattr(drafter, "x0_logits") and hasattr(drafter, "mask_id")


def is_autoregressive(drafter: Any) -> bool:
    return isinstance(drafter, ARDrafter)


# kind -> (how messages name it, the check)
DRAFTER_KINDS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "autoregressive": ("an autoregressive (causal LM) drafter", is_autoregressive),
    "diffusion": ("a diffusion drafter", is_diffusion),
}


@dataclass(frozen=True)
class Method:
    name: str
    summary: str
    loop: Callable
    needs: str | None = None  # a key of DRAFTER_KINDS; None: no drafter
    build: Callable[[Any, DraftSettings], Proposer] | None = None
    rules: tuple[str, ...] = ()
    settings: tuple[str, ...] = ()  # the DraftSettings fields it reads (what a bench sweeps)

    def accepts(self, drafter: Any) -> bool:
        return self.needs is not None and DRAFTER_KINDS[self.needs][1](drafter)

    def check_drafter(self, drafter: Any) -> None:
        if self.needs is not None and not self.accepts(drafter):
            raise UsageError(f"method '{self.name}' needs {DRAFTER_KINDS[self.needs][0]} (`drafter`)")


METHODS: dict[str, Method] = {m.name: m for m in (
    Method("ar", "plain decoding, one target call per token: the reference", loop=decode_ar),
    Method("spec-ar", "a small causal LM drafts (Leviathan et al. 2023)", loop=decode_speculative,
           needs="autoregressive", build=lambda drafter, s: ARProposer(drafter),
           rules=("standard", "match", "greedy"), settings=("gamma",)),
    Method("specdiff", "a masked-diffusion drafter drafts gamma tokens in T steps (SpecDiff)",
           loop=decode_speculative, needs="diffusion",
           build=lambda drafter, s: DiffusionProposer(drafter, s.schedule, s.steps, s.gamma),
           rules=("standard", "match", "greedy", "select", "multi"),
           settings=("gamma", "steps", "schedule", "drafts", "draft_temperature")),
)}


def get_method(name: str) -> Method:
    try:
        return METHODS[name]
    except KeyError as e:
        raise UsageError(f"unknown method '{name}' (choose from {', '.join(METHODS)})") from e


def default_method(drafter: Any) -> Method:
    """The first method that accepts this drafter; plain decoding without one."""
    if drafter is None:
        return METHODS["ar"]
    return next((m for m in METHODS.values() if m.accepts(drafter)), METHODS["ar"])
