"""The decoding methods, one declaration each. `generation.plan`, `tools.bench` and the CLI read
this table; a new method is its own proposer module plus one entry here (and its name in
`names.METHODS`, the torch-free copy that keeps `specdiff --help` fast).

    name       what users pass as `method`
    needs      the kind of drafter it needs (DRAFTER_KINDS; None: no drafter)
    target     the kind of target it decodes (TARGET_KINDS): a causal LM, or a block-diffusion LM
               (whose loops take the drafter and block_decoding.BlockSettings instead of a proposer)
    build      (drafter, DraftSettings) -> Proposer   (None: no proposer)
    rules      acceptance rules it can run, preferred first when sampling; the proposer it builds
               declares which of them are exact (contracts.Proposer.exact_rules)
    settings   the draft settings it reads (gamma, steps, schedule, drafts, ...): what `specdiff bench` sweeps
    loop       which decoding loop runs it (decoding.decode_ar / decode_speculative;
               block_decoding.decode_block / decode_simsd_exact; simsd.decode_simsd)
    exact      whether its output is its reference's (the target's greedy tokens, the target's
               distribution; block's output for block targets): tests/test_methods.py requires an
               identity test for each exact method; False declares it approximate (simsd)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from .block_decoding import decode_block, decode_simsd_exact
from .contracts import Proposer
from .decoding import decode_ar, decode_speculative
from .drafters.autoregressive import ARDrafter, ARProposer
from .drafters.diffusion import DiffusionProposer
from .errors import UsageError
from .simsd import decode_simsd


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


def is_block_diffusion(model: Any) -> bool:
    """A block-diffusion LM (targets.block.BlockDiffusionTarget): SDAR and the demo block pair."""
    return getattr(model, "kind", None) == "block-diffusion"


# kind -> (how messages name it, the check)
DRAFTER_KINDS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "autoregressive": ("an autoregressive (causal LM) drafter", is_autoregressive),
    "diffusion": ("a diffusion drafter", is_diffusion),
    "block-diffusion": ("a block-diffusion drafter", is_block_diffusion),
}
TARGET_KINDS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "causal": ("a causal LM target", lambda target: not is_block_diffusion(target)),
    "block-diffusion": ("a block-diffusion target (SDAR layout)", is_block_diffusion),
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
    target: str = "causal"  # a key of TARGET_KINDS
    exact: bool = True  # False: approximate, its output is not its reference's

    def accepts(self, drafter: Any) -> bool:
        return self.needs is not None and DRAFTER_KINDS[self.needs][1](drafter)

    def check_drafter(self, drafter: Any) -> None:
        if self.needs is not None and not self.accepts(drafter):
            raise UsageError(f"method '{self.name}' needs {DRAFTER_KINDS[self.needs][0]} (`drafter`)")

    def check_target(self, target: Any) -> None:
        what, check = TARGET_KINDS[self.target]
        if not check(target):
            raise UsageError(f"method '{self.name}' needs {what}; '{target.name}' is not one (`target`)")


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
    Method("block", "block-diffusion decoding, one block at a time in `steps` steps (SDAR): the reference",
           loop=decode_block, target="block-diffusion", settings=("steps", "remasking", "threshold")),
    Method("simsd-exact", "a smaller block-diffusion model drafts a block's denoising; verified by "
           "state copies: block's output", loop=decode_simsd_exact, needs="block-diffusion",
           target="block-diffusion", settings=("gamma", "steps", "remasking", "threshold")),
    Method("simsd", "SimSD's single verify pass (temporal mask, RoPE copies): APPROXIMATE, not block's output",
           loop=decode_simsd, needs="block-diffusion", target="block-diffusion", exact=False),
)}


def get_method(name: str) -> Method:
    try:
        return METHODS[name]
    except KeyError as e:
        raise UsageError(f"unknown method '{name}' (choose from {', '.join(METHODS)})") from e


def default_method(drafter: Any, target: Any = None) -> Method:
    """The first method for this target's kind that accepts this drafter; its kind's reference
    (ar, block) without one."""
    kind = "block-diffusion" if is_block_diffusion(target) else "causal"
    reference = next(m for m in METHODS.values() if m.target == kind and m.needs is None)
    if drafter is None:
        return reference
    return next((m for m in METHODS.values() if m.target == kind and m.accepts(drafter)), reference)
