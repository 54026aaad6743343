"""The drafter a `specdiff distill` run starts from: a new DDiT (DEFAULT_SHAPE unless given), a
new one reading and writing through its target's own embedding and output head (`from_target`,
those rows frozen), or an existing drafter (`drafter`). A new one drafts over the target's
tokenizer with one extra mask row (id = len(tokenizer)), or the tokenizer's own `mask_token`."""

from __future__ import annotations

from typing import Any, TypeVar, cast

import torch

from ..drafters.diffusion import DiffusionDrafter
from ..errors import UsageError
from ..loading import load_diffusion_drafter, load_drafter, pair_models
from ..nets.dit import DDiT, DiTConfig
from .config import DEFAULT_SHAPE, DistillConfig
from .teacher import Teacher

COND_DIM = 64
D = TypeVar("D")


def initial_drafter(cfg: DistillConfig, target: Teacher) -> DiffusionDrafter:
    if cfg.drafter is None and cfg.from_target:
        return _share_target_embeddings(_new_drafter(cfg, target.tokenizer), target)
    if cfg.drafter is None:
        return _new_drafter(cfg, target.tokenizer)
    drafter = load_diffusion_drafter(cfg.drafter)
    if drafter.draft_vocab is not None:  # its loss would be infinite at every answer token outside the map
        raise UsageError(f"`drafter` {cfg.drafter} has a draft vocabulary (draft_vocab.safetensors): distill trains "
                         "a diffusion drafter's whole head; start from it without the map and cut the head after")
    pair_models(target, drafter)
    if cfg.mask_token is not None and _mask_id(target.tokenizer, cfg.mask_token) != drafter.mask_id:
        raise UsageError(f"`mask_token` {cfg.mask_token!r} is not the mask id of {cfg.drafter} ({drafter.mask_id})")
    drafter.tokenizer = target.tokenizer
    return drafter


def given_drafter(cfg: DistillConfig, kind: type[D], what: str) -> D:
    """`drafter`, named as generate names one (a models.yaml name, a directory or a hub id), loaded
    on the CPU in fp32 under its own name (messages name it, not `out`); a UsageError unless it is
    `what`, the kind `method` trains (dflash, eagle3)."""
    drafter = load_drafter(cast(str, cfg.drafter), dtype="fp32")
    if not isinstance(drafter, kind):
        raise UsageError(f"`drafter` {cfg.drafter} is not {what}, the drafter `method` {cfg.method} trains")
    return drafter


def frozen(drafter: DiffusionDrafter) -> DiffusionDrafter:
    """The rows a drafter shares with its target stay frozen (also after a resume: its checkpoints
    record `target_embeddings`): it learns only what lies between them."""
    if drafter.target_embeddings:
        drafter.backbone.vocab_embed.embedding.requires_grad_(False)
        drafter.backbone.output_layer.linear.weight.requires_grad_(False)
    return drafter


def _mask_id(tokenizer: Any, mask_token: str | None) -> int:
    if mask_token is None:
        return len(tokenizer)
    vocab = tokenizer.get_vocab()
    if mask_token not in vocab:
        raise UsageError(f"`mask_token` {mask_token!r} is not a token of the target's tokenizer")
    return cast(int, vocab[mask_token])


def _new_drafter(cfg: DistillConfig, tokenizer: Any) -> DiffusionDrafter:
    shape = {k: getattr(cfg, k) or v for k, v in DEFAULT_SHAPE.items()}
    if min(shape.values()) < 1:
        raise UsageError(f"`layers`, `dim`, `heads` and `context` must be >= 1, got {shape}")
    vocab, mask_id = len(tokenizer), _mask_id(tokenizer, cfg.mask_token)
    try:
        dit = DiTConfig(vocab_size=max(vocab, mask_id + 1), hidden_size=shape["dim"], n_heads=shape["heads"],
                        n_blocks=shape["layers"], cond_dim=COND_DIM, time_conditioning=False)
    except ValueError as e:
        raise UsageError(str(e)) from e
    backbone = DDiT(dit).init_random(torch.Generator().manual_seed(cfg.seed))
    return DiffusionDrafter(backbone, vocab_size=vocab, mask_id=mask_id, context_length=shape["context"],
                            parameterization="subs", tokenizer=tokenizer, source=cfg.out)


def _share_target_embeddings(drafter: DiffusionDrafter, target: Teacher) -> DiffusionDrafter:
    """A new drafter reads and writes through the target's input embedding and output head
    (rows 0..V-1; the mask row keeps its random vector, scaled like the target's rows)."""
    embed = target.model.get_input_embeddings().weight.detach()  # (V_t, h)
    if embed.shape[1] != drafter.config.hidden_size:
        raise UsageError(f"`from_target` needs `dim` = the target's hidden size {embed.shape[1]}")
    with torch.no_grad():
        rest = drafter.backbone.vocab_embed.embedding[drafter.vocab_size:]
        rest.mul_(embed.norm(dim=1).mean() / rest.norm(dim=1, keepdim=True).clamp_min(1e-6))
    drafter.target_embeddings = True
    pair_models(target, drafter)
    return drafter
