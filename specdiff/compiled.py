"""`--compile`: the torch runtime's fast path (gpt-fast's recipe: static cache, fixed shapes,
compiled steps; CUDA graphs on CUDA).

    target, drafter = compile_models(target, drafter)     # twins sharing the loaded weights
    seconds = warm_up(target, drafter, rows, gamma)        # compile every shape the run will use

The target becomes a targets.static.StaticTarget. A drafter becomes the twin its kind declares
(specdiff.kinds, `compiling`): a diffusion drafter's denoiser a kinds.diffusion.StaticDenoiser,
every call padded to one shape (rows to the batch, positions on the left to the context window plus
gamma, whose padding the denoiser already masks and skips in its rotary positions), so it compiles
once. Drafts only steer speed: the output stays the target's, and greedy output is token-identical
to the eager path (tests/test_compiled.py). Kinds that declare no twin (the AR drafter of
`spec-ar`, DFlash) stay eager.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from .contracts import Drafter
from .errors import UsageError
from .kinds import Compiling, kind_of
from .targets.causal import CausalLMTarget
from .targets.static import StaticTarget


def compile_models(target: Any, drafter: Drafter | None, compile: bool = True) -> tuple[StaticTarget, Drafter | None]:
    """The static-cache twins of a CausalLMTarget and of a drafter whose kind compiles (others unchanged);
    `compile=False`: the same fixed shapes run eagerly (what the tests check cheaply)."""
    if not isinstance(target, CausalLMTarget):
        raise UsageError("`compile` runs Hugging Face causal LM targets on the torch runtime; "
                         f"this target is a {type(target).__name__} (drop `compile`)")
    if getattr(drafter, "draft_vocab", None) is not None:
        raise UsageError(f"`compile` does not run a drafter with a draft vocabulary ('{getattr(drafter, 'source', '')}'): "
                         "drop `compile`")
    compiling = _compiling(drafter)
    return StaticTarget.of(target, compile), (compiling.twin(drafter, compile) if compiling else drafter)


def _compiling(drafter: Drafter | None) -> Compiling | None:
    """How the drafter's kind compiles (None: no drafter, or one that drafts eagerly)."""
    kind = kind_of(drafter)
    return kind.compiling if kind else None


def compile_seconds(target: StaticTarget, drafter: Drafter | None) -> float:
    """Seconds the twins of compile_models spent compiling (their `step`s' warm-up)."""
    compiling = _compiling(drafter)
    return target.step.warmup_s + (compiling.seconds(drafter) if compiling else 0.0)


@torch.no_grad()
def warm_up(target: StaticTarget, drafter: Drafter | None, rows: int, gamma: int | None, copies: int = 1,
            length: int | None = None) -> float:
    """Compile, before decoding, the target's step for `rows` rows of `copies` cached copies each
    (K drafts), of up to `length` tokens (the cache holds no more columns), and width gamma + 1
    (1 without gamma: plain decoding), and the drafter's twin for `rows` rows of gamma slots;
    -> the seconds it took."""
    start = time.perf_counter()
    target.warm_up(rows * copies, gamma + 1 if gamma else 1, length)
    compiling = _compiling(drafter)
    if compiling and gamma:
        compiling.warm_up(drafter, rows, gamma, target.device)
    target.sync()
    return time.perf_counter() - start
