"""The diffusion kind: a DDiT denoiser in the project's own, the SEDD hub or the MDLM HF format
(nets/formats.py; a models.yaml `format:` names one), a DiffusionDrafter. It compiles under
`--compile` (StaticDenoiser) and is exported as the "drafter" denoiser graph. Any drafter with its
drafting interface (x0_logits, mask_id: A2D, an exported denoiser graph) is of this kind to the
methods."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from ..artifacts import Maybe
from ..drafters.diffusion import DiffusionDrafter, context_window
from ..graphs import DrafterGraph, drafter_spec
from ..hub import fetch
from ..nets.checkpoint import save_own
from ..nets.dit import DDiT
from ..nets.formats import Format, detect, get_format, load_checkpoint
from ..sources import TOKENIZER_FILES, Source, drafter_tokenizer, resolve_dtype
from ..targets.static import CompiledStep
from ..vocab import VOCAB_FILE, load_draft_vocab
from .kind import Compiling, Converting, DrafterKind, target_model


def drafter_format(source: Source) -> Format | None:
    """The models.yaml `format:`, else the one detected from config.json (None: not diffusion)."""
    return get_format(source.format) if source.format else detect(source.config())


def read_diffusion(source: Source, fmt: Format) -> DiffusionDrafter:
    """A diffusion drafter in format `fmt`, on the CPU in fp32, exactly as stored."""
    directory = fetch(source.location, ("config.json", fmt.weights, VOCAB_FILE, *TOKENIZER_FILES))
    backbone, fields = load_checkpoint(directory, fmt)
    return DiffusionDrafter(backbone, tokenizer=drafter_tokenizer(directory, source), source=source.name,
                            draft_vocab=load_draft_vocab(directory), **fields)


def load_diffusion(source: Source, device: str, dtype: str) -> DiffusionDrafter:
    drafter = read_diffusion(source, cast(Format, drafter_format(source)))
    return drafter.to(device=device, dtype=resolve_dtype(dtype, device)).eval()


def is_diffusion(drafter: object) -> bool:
    """A DiffusionDrafter, or any object with its drafting interface (x0_logits, mask_id,
    vocab_size, context_length), such as an exported graph (runtimes.models.GraphDrafter)."""
    return hasattr(drafter, "x0_logits") and hasattr(drafter, "mask_id")


def bind_embeddings(target: Any, drafter: Any) -> None:
    """A drafter made to share its target's token embedding and head (`target_embeddings`) gets them."""
    if isinstance(drafter, DiffusionDrafter) and drafter.target_embeddings:
        model = target_model(target, drafter)
        drafter.share_target_embeddings(model.get_input_embeddings().weight, model.get_output_embeddings().weight)


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


def static_twin(drafter: Any, compile: bool) -> Any:
    """Its denoiser as a StaticDenoiser, every call padded to one shape (rows to the batch,
    positions on the left to the context window plus gamma); an A2D or graph drafter unchanged."""
    if not isinstance(drafter, DiffusionDrafter):
        return drafter
    denoiser = cast(DDiT, StaticDenoiser(drafter.backbone, compile))  # a DDiT's forward and config
    return DiffusionDrafter(denoiser, vocab_size=drafter.vocab_size, mask_id=drafter.mask_id,
                            context_length=drafter.context_length, parameterization=drafter.parameterization,
                            tokenizer=drafter.tokenizer, source=drafter.source, length=drafter.length,
                            defaults=drafter.defaults)


@torch.no_grad()
def warm_denoiser(drafter: Any, rows: int, gamma: int, device: Any) -> None:
    """Compile the denoiser for `rows` rows of gamma draft slots after its context window."""
    if isinstance(drafter, DiffusionDrafter):
        ids = torch.full((rows, context_window(drafter, gamma) + gamma), drafter.mask_id, device=device)
        drafter.x0_logits(ids, gamma)


def denoiser_seconds(drafter: Any) -> float:
    denoiser = getattr(drafter, "backbone", None)
    return denoiser.step.warmup_s if isinstance(denoiser, StaticDenoiser) else 0.0


def save_diffusion(drafter: Any, out: Path, dtype: torch.dtype, context: int | None) -> None:
    """In the project's own format (nets/checkpoint.py): the same tensors in `dtype`, the
    parameterisation, mask id, real vocabulary, context length (`context`, else its own), tokenizer
    and the draft settings it records."""
    save_own(out, drafter.backbone.to(dtype), vocab_size=drafter.vocab_size, mask_id=drafter.mask_id,
             context_length=context or drafter.context_length, parameterization=drafter.parameterization,
             tokenizer=drafter.tokenizer, defaults=drafter.defaults, untrained=drafter.untrained,
             target_embeddings=drafter.target_embeddings)


def mask_id(drafter: Any) -> int | None:
    """Its mask id, which it never drafts: no draft vocabulary holds it."""
    return int(drafter.mask_id)


# a denoiser: input_ids [, sigma] -> logits (graphs.drafter_spec)
GRAPH = DrafterGraph(
    "drafter", lambda model: drafter_spec(model["head_rows"], model["time_conditioning"]),
    record={"name": str, "vocab_size": int, "mask_id": int, "context_length": int, "parameterization": str,
            "time_conditioning": bool, "head_rows": Maybe(int), "untrained": Maybe(bool),
            "defaults": Maybe(dict),  # the draft settings it was trained for (check_recorded)
            "draft_vocab": Maybe(str), "vocab_rows": Maybe(int)},  # with a head of N rows (specdiff.vocab)
    sizes=("vocab_size", "context_length"))
KIND = DrafterKind(
    "diffusion", "a diffusion drafter", detect=lambda config: detect(config) is not None, load=load_diffusion,
    holds=is_diffusion, bind=bind_embeddings, compiling=Compiling(static_twin, warm_denoiser, denoiser_seconds),
    graph=GRAPH, converting=Converting(save_diffusion, context=True, reserved=mask_id))
