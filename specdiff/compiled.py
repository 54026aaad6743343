"""`--compile`: the torch runtime's fast path (gpt-fast's recipe: static cache, fixed shapes,
compiled steps; CUDA graphs on CUDA).

    target, drafter = compile_models(target, drafter)     # twins sharing the loaded weights
    seconds = warm_up(target, drafter, rows, gamma)        # compile every shape the run will use

The target becomes a targets.static.StaticTarget. A diffusion drafter's denoiser becomes a
StaticDenoiser: every call padded to one shape (rows to the batch, positions on the left to the
context window plus gamma, whose padding the denoiser already masks and skips in its rotary
positions), so it compiles once. Drafts only steer speed: the output stays the target's, and
greedy output is token-identical to the eager path (tests/test_compiled.py). The AR drafter of
`spec-ar` stays eager.
"""

from __future__ import annotations

import time
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from .drafters.diffusion import DiffusionDrafter, context_window
from .errors import UsageError
from .nets.dit import DDiT
from .targets.causal import CausalLMTarget
from .targets.static import CompiledStep, StaticTarget


class StaticDenoiser(nn.Module):
    """A denoiser (forward(input_ids (B, L), sigma (B,), last, pad (B,)) -> (B, last, V)) run at
    one shape (rows, length, last), grown when a call needs more (a new compile)."""

    def __init__(self, backbone: nn.Module, compile: bool = True):
        super().__init__()
        self.backbone = backbone
        self.config = backbone.config
        self.shape = (0, 0, 0)  # (rows, length, last) it runs at
        self.step = CompiledStep(backbone, next(backbone.parameters()).device, compile)

    def forward(self, input_ids: torch.Tensor, sigma: torch.Tensor, last: int | None = None,
                pad: torch.Tensor | None = None) -> torch.Tensor:
        B, L = input_ids.shape
        last = last or L
        R, N, M = (max(a, b) for a, b in zip(self.shape, (B, L, last)))
        self.shape = (R, N, M)
        pad = input_ids.new_zeros(B) if pad is None else pad.to(input_ids.device)
        ids = F.pad(input_ids, (N - L, 0, 0, R - B))  # token 0 at padding: masked, never read
        pad = F.pad(pad + (N - L), (0, R - B), value=N - 1)  # an idle row holds one real position
        sigma = F.pad(sigma, (0, R - B))
        return self.step(self.shape, ids, sigma, M, pad)[:B, M - last:]


def compile_models(target: Any, drafter: Any, compile: bool = True) -> tuple[StaticTarget, Any]:
    """The static-cache twins of a CausalLMTarget and of a diffusion drafter (others unchanged);
    `compile=False`: the same fixed shapes run eagerly (what the tests check cheaply)."""
    if not isinstance(target, CausalLMTarget):
        raise UsageError("`compile` runs Hugging Face causal LM targets on the torch runtime; "
                         f"this target is a {type(target).__name__} (drop `compile`)")
    if getattr(drafter, "draft_vocab", None) is not None:
        raise UsageError(f"`compile` does not run a drafter with a draft vocabulary ('{drafter.source}'): "
                         "drop `compile`")
    if isinstance(drafter, DiffusionDrafter):
        denoiser = cast(DDiT, StaticDenoiser(drafter.backbone, compile))  # a DDiT's forward and config
        drafter = DiffusionDrafter(denoiser, vocab_size=drafter.vocab_size,
                                   mask_id=drafter.mask_id, context_length=drafter.context_length,
                                   parameterization=drafter.parameterization, tokenizer=drafter.tokenizer,
                                   source=drafter.source, length=drafter.length, defaults=drafter.defaults)
    return StaticTarget.of(target, compile), drafter


def compile_seconds(target: StaticTarget, drafter: Any) -> float:
    """Seconds the twins of compile_models spent compiling (their `step`s' warm-up)."""
    denoiser = drafter.backbone if isinstance(drafter, DiffusionDrafter) else None
    return target.step.warmup_s + (denoiser.step.warmup_s if isinstance(denoiser, StaticDenoiser) else 0.0)


@torch.no_grad()
def warm_up(target: StaticTarget, drafter: Any, rows: int, gamma: int | None, copies: int = 1,
            length: int | None = None) -> float:
    """Compile, before decoding, the target's step for `rows` rows of `copies` cached copies each
    (K drafts), of up to `length` tokens (the cache holds no more columns), and width gamma + 1
    (1 without gamma: plain decoding), and the drafter's denoiser for `rows` rows of gamma slots;
    -> the seconds it took."""
    start = time.perf_counter()
    target.warm_up(rows * copies, gamma + 1 if gamma else 1, length)
    if isinstance(drafter, DiffusionDrafter) and gamma:
        n = context_window(drafter, gamma) + gamma
        ids = torch.full((rows, n), drafter.mask_id, device=target.device)
        drafter.x0_logits(ids, gamma)
    target.sync()
    return time.perf_counter() - start
