"""The decoding methods, one declaration each, and what preparing one makes: a Decoder
(contracts.Decoder) that `generation` runs without knowing which method it is. A new method is
its own module (a `prepare` and the loop it runs) plus one entry here (and its name in
`names.METHODS`, the torch-free copy that keeps `specdiff --help` fast).

    name        what users pass as `method`
    prepare_with (method, Models, settings, sampling, acceptance) -> Decoder: its module's
    needs       the kind of drafter it needs (the name of a specdiff.kinds declaration; None: no drafter)
    target      the kind of target it decodes (TARGET_KINDS): a causal LM or a block-diffusion LM
    build       (drafter, DraftSettings) -> Proposer, for speculative methods
    trees       (proposer, sampling, target, nodes) -> the draft step of its `tree` runs, for
                speculative methods that read `tree` (methods.speculative: GrownTrees, MarginalTrees)
    rules       acceptance rules it can run, preferred first when sampling; the proposer it builds
                declares which of them are exact (contracts.Proposer.exact_rules)
    family      the settings dataclass it reads from (specdiff.settings; None: none)
    settings    the fields of it the method reads: what `specdiff bench` sweeps
    exact       whether its output is its reference's (the target's greedy tokens, the target's
                distribution; block's output for block targets): tests/test_methods.py requires an
                identity test for each exact method; False declares it approximate (simsd)

Rooms: base (Method, Models, kinds), plain (ar), speculative (spec-ar, specdiff), dflash (drafts
from the target's hidden states), eagle3 (a chain from them, token by token), blocks (the block-diffusion methods). May import: the decoding loops, proposers, acceptance rules and settings;
not generation, bench or the CLI.
"""

from __future__ import annotations

from typing import Any

from ..block_decoding import decode_block, decode_simsd_exact
from ..drafters.autoregressive import ARProposer
from ..drafters.diffusion import DiffusionProposer
from ..contracts import Drafter
from ..errors import UsageError
from ..kinds.block import is_block_diffusion
from ..settings import BlockSettings, DraftSettings
from ..simsd import decode_simsd
from . import blocks, dflash, eagle3, plain, speculative
from .base import TARGET_KINDS, Method, Models

__all__ = ["METHODS", "TARGET_KINDS", "Method", "Models", "default_method", "get_method", "is_block_diffusion"]

METHODS: dict[str, Method] = {m.name: m for m in (
    Method("ar", "plain decoding, one target call per token: the reference", plain.prepare),
    Method("spec-ar", "a small causal LM drafts (Leviathan et al. 2023)", speculative.prepare,
           needs="autoregressive", build=lambda drafter, s: ARProposer(drafter), trees=speculative.GrownTrees,
           rules=("standard", "match", "greedy"), family=DraftSettings, settings=("gamma", "adaptive", "tree")),
    Method("specdiff", "a masked-diffusion drafter drafts gamma tokens in T steps (SpecDiff)", speculative.prepare,
           needs="diffusion", build=lambda drafter, s: DiffusionProposer(drafter, s.schedule, s.steps, s.gamma),
           trees=speculative.MarginalTrees,
           rules=("standard", "match", "greedy", "select", "multi"), family=DraftSettings,
           settings=("gamma", "adaptive", "steps", "schedule", "drafts", "draft_temperature", "tree")),
    Method("dflash", "a DFlash drafter drafts a block in one call from the target's hidden states (DFlash)",
           dflash.prepare, needs="dflash", rules=("standard", "match", "greedy", "select", "multi"),
           family=DraftSettings, settings=("gamma", "adaptive", "drafts", "draft_temperature", "tree")),
    Method("eagle3", "an EAGLE-3 head drafts a chain token by token from the target's fused hidden states "
           "(EAGLE-3)", eagle3.prepare, needs="eagle3", rules=("standard", "match", "greedy"), family=DraftSettings,
           settings=("gamma", "adaptive")),
    Method("block", "block-diffusion decoding, one block at a time in `steps` steps (SDAR): the reference",
           blocks.preparer(decode_block), target="block-diffusion", family=BlockSettings,
           settings=("steps", "remasking", "threshold")),
    Method("simsd-exact", "a smaller block-diffusion model drafts a block's denoising; verified by "
           "state copies: block's output", blocks.preparer(decode_simsd_exact), needs="block-diffusion",
           target="block-diffusion", family=BlockSettings, settings=("gamma", "steps", "remasking", "threshold")),
    Method("simsd", "SimSD's single verify pass (temporal mask, RoPE copies): APPROXIMATE, not block's output",
           blocks.preparer(decode_simsd), needs="block-diffusion", target="block-diffusion", family=BlockSettings,
           exact=False),
)}


def get_method(name: str) -> Method:
    try:
        return METHODS[name]
    except KeyError as e:
        raise UsageError(f"unknown method '{name}' (choose from {', '.join(METHODS)})") from e


def default_method(drafter: Drafter | None, target: Any = None) -> Method:
    """The first method for this target's kind that accepts this drafter; its kind's reference
    (ar, block) without one."""
    kind = "block-diffusion" if is_block_diffusion(target) else "causal"
    reference = next(m for m in METHODS.values() if m.target == kind and m.needs is None)
    if drafter is None:
        return reference
    return next((m for m in METHODS.values() if m.target == kind and m.accepts(drafter)), reference)
