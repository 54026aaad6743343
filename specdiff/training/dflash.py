"""`specdiff distill --method dflash`: a DFlash drafter (nets/dflash.py) trained on its target's own
answers and hidden states.

    drafter  new (seeded by `seed`): `layers` Qwen3 layers of the target's width, `heads` heads,
             the target's MLP width, RoPE and norm epsilon; linear weights normal(0, 0.02), the
             final norm 1 / (the mean norm of the head's rows), so that the first logits are near
             uniform (a unit norm made them so peaked that smol's first loss was 50, not 14);
             reading the target layers `target_layers` (default: the reference rule,
             nets.dflash.build_target_layer_ids); block S = gamma + 1; mask = `mask_token`, else
             the first embedding row past the tokenizer, else its last special token that is not
             bos / eos / pad (a DFlash mask is a row of the target's embedding, frozen as it is)
    blocks   per sequence, `anchors` anchors a drawn in its answer (up to its first eos): slot 0 the
             token at a, slots 1..gamma the mask; each block attends to the features of the
             sequence's positions < a and to itself, as drafting does (methods/dflash.py); all of
             a sequence's blocks run in one pass (DFlashNet's attn_mask)
    loss     at slot k (the token at a + k): cross-entropy to the teacher's token (ce), the KL from
             the target's soft labels there (kl) and / or -log of the acceptance probability
             sum min(p, q) over them (lk, losses.lk_per_slot), weighted exp(-(k - 1) / (gamma / 2)):
             DFlash's decaying slot weights (a slot counts only when the ones before it are accepted)
    vocab    with `draft_vocab` N: the head is the target's rows at the N most frequent ids of the
             training answers, saved with every checkpoint (the loss: reading.restricted)

The data, the run, resume and the report are reading.py's (READER declares this drafter to it).
The target's embedding and head are the drafter's own input and output (bound, frozen, not saved).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from transformers import Qwen3Config

from ..budget import check_fits
from ..drafters.dflash import DFlashDrafter
from ..errors import UsageError
from ..nets.dflash import DFlashNet, DFlashSpec, build_target_layer_ids, load_dflash, save_dflash
from ..targets.causal import CausalLMTarget
from ..vocab import load_draft_vocab
from .checkpoints import TrainState, read_state
from .config import DistillConfig
from .drafter import given_drafter
from .losses import per_slot_loss
from .reading import Corpus, Reader, new_draft_vocab, restricted, validation_loss

VAL_SEED_OFFSET = 2  # the fixed validation blocks' generator: seed + this
INIT_STD = 0.02  # new linear layers: normal(0, INIT_STD), as Qwen3's initializer_range
DEFAULT_ROPE = {"rope_type": "default", "rope_theta": 10000.0}  # for a target without RoPE (GPT-2)


@dataclass
class Blocks:
    """A batch: rows (B,) of a Corpus and anchors (B, A) (columns of the token in slot 0)."""

    rows: torch.Tensor
    anchors: torch.Tensor


def draw_blocks(corpus: Corpus, P: int, size: int, anchors: int, generator: torch.Generator) -> Blocks:
    """`size` rows (uniform over those with anchors), `anchors` anchors each, uniform in
    [P, limit) (with replacement)."""
    usable = corpus.rows()
    rows = usable[torch.randint(0, len(usable), (size,), generator=generator)]
    span = (corpus.limits[rows] - P).clamp(min=1)  # (B,)
    u = torch.rand(size, anchors, generator=generator)
    return Blocks(rows, P + (u * span[:, None]).long())


def block_logits(drafter: DFlashDrafter, ids: torch.Tensor, features: torch.Tensor, pad: torch.Tensor,
                 anchors: torch.Tensor) -> torch.Tensor:
    """ids (B, W), features (B, W, F), pad (B,), anchors (B, A) -> the drafter's logits of slots
    1..S-1 of every block (B, A, S - 1, V), all blocks of a row in one pass."""
    B, W = ids.shape
    A, S = anchors.shape[1], drafter.block_size
    slot = torch.arange(S, device=ids.device)
    block = torch.full((B, A, S), drafter.mask_id, dtype=torch.long, device=ids.device)
    block[..., 0] = ids.gather(1, anchors)
    columns = torch.arange(W, device=ids.device)
    positions = torch.cat([(columns - pad[:, None]).clamp(min=0),
                           ((anchors - pad[:, None])[..., None] + slot).reshape(B, A * S)], dim=1)
    sees_context = (columns >= pad[:, None, None]) & (columns < anchors[..., None])  # (B, A, W)
    same_block = torch.eye(A, dtype=torch.bool, device=ids.device).repeat_interleave(S, 0).repeat_interleave(S, 1)
    mask = torch.cat([sees_context.repeat_interleave(S, 1), same_block.expand(B, -1, -1)], dim=2)  # (B, AS, W + AS)
    hidden = drafter.hidden(block.reshape(B, A * S), features, positions, attn_mask=mask[:, None])
    return drafter.score(hidden.view(B, A, S, -1)[:, :, 1:])


def slot_weights(gamma: int, device: torch.device) -> torch.Tensor:
    """(gamma,) exp(-(k - 1) / (gamma / 2)) for slots k = 1..gamma."""
    return torch.exp(-torch.arange(gamma, device=device, dtype=torch.float32) / (gamma / 2))


def block_loss(logits: torch.Tensor, labels: torch.Tensor, soft: tuple[torch.Tensor, torch.Tensor] | None,
               parts: tuple[str, ...]) -> torch.Tensor:
    """logits (B, A, g, V), labels (B, A, g) (-1: none, no ce there), soft (ids, p) (B, A, g, k) ->
    the weighted loss."""
    g, V = logits.shape[2:]
    weights = slot_weights(g, logits.device).expand(labels.shape).reshape(-1)
    flat = None if soft is None else (soft[0].reshape(len(weights), -1), soft[1].reshape(len(weights), -1))
    per_slot = per_slot_loss(logits.reshape(-1, V), labels.reshape(-1), flat, parts)
    return (per_slot * weights).sum() / weights.sum()


class DFlashTask:
    """loop.Task for a DFlash drafter on Blocks of a Corpus."""

    def __init__(self, drafter: DFlashDrafter, train_set: Corpus, val_set: Corpus, P: int, cfg: DistillConfig):
        self.module, self.train_set, self.P, self.cfg = drafter, train_set, P, cfg
        self.parts = tuple(cfg.loss.split("+"))
        g = torch.Generator().manual_seed(cfg.seed + VAL_SEED_OFFSET)
        self.val = [(val_set, draw_blocks(val_set, P, cfg.batch_size, cfg.anchors, g))
                    for _ in range(max(1, len(val_set.rows()) * 4 // (cfg.batch_size * cfg.anchors)))]

    def batch(self, size: int, generator: torch.Generator) -> tuple[Corpus, Blocks]:
        return self.train_set, draw_blocks(self.train_set, self.P, size, self.cfg.anchors, generator)

    def loss(self, batch: tuple[Corpus, Blocks]) -> torch.Tensor:
        corpus, blocks = batch
        device = self.cfg.device
        rows, anchors = blocks.rows, blocks.anchors
        ids = corpus.seqs.ids[rows].to(device)
        logits = block_logits(self.module, ids, corpus.features[rows].to(device).float(),
                              corpus.pad[rows].to(device), anchors.to(device))
        columns = anchors[..., None] + torch.arange(1, self.module.block_size)  # (B, A, g) labelled columns
        labels = ids.gather(1, columns.to(device).flatten(1)).view(columns.shape)
        soft = corpus.soft(rows[:, None, None], columns, self.P)
        soft = None if soft is None else (soft[0].to(device), soft[1].to(device))
        if self.module.draft_vocab is not None:
            labels, soft = restricted(self.module.draft_vocab, labels, soft)
        return block_loss(logits, labels, soft, self.parts)

    def scored(self, batch: tuple[Corpus, Blocks]) -> int:
        return batch[1].anchors.numel() * (self.module.block_size - 1)

    def validation(self) -> float:
        return validation_loss(self.module, self.loss, self.val)

    def save(self, directory: Path) -> None:
        save_dflash(directory, self.module.net, self.module.spec)
        if self.module.draft_vocab is not None:
            self.module.draft_vocab.save(directory)


def new_drafter(cfg: DistillConfig, target: CausalLMTarget) -> DFlashDrafter:
    """A new DFlash drafter for `target` (see the module docstring), initialised as Qwen3 is."""
    text = target.model.config.get_text_config()
    hidden, heads, layers = text.hidden_size, cfg.heads or text.num_attention_heads, cfg.layers or 2
    if cfg.dim not in (None, hidden) or hidden % heads:
        raise UsageError(f"a DFlash drafter has the target's width {hidden} (`dim`), split into `heads` that divide it")
    ids = cfg.target_layers or tuple(build_target_layer_ids(text.num_hidden_layers, layers))
    if max(ids) >= text.num_hidden_layers:
        raise UsageError(f"`target_layers` {list(ids)}: the target has {text.num_hidden_layers} layers")
    rows = target.model.get_input_embeddings().weight.shape[0]
    mlp = getattr(text, "intermediate_size", None) or 4 * hidden
    check_fits(16 * layers * hidden * (4 * hidden + 3 * mlp), torch.device(cfg.device), {"layers": layers},
               "a new DFlash drafter's weights, gradients and Adam moments")
    qwen = Qwen3Config(vocab_size=rows, hidden_size=hidden, intermediate_size=mlp,
                       num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
                       head_dim=hidden // heads, max_position_embeddings=text.max_position_embeddings,
                       rms_norm_eps=getattr(text, "rms_norm_eps", 1e-6), attention_bias=False,
                       rope_parameters=getattr(text, "rope_parameters", None) or DEFAULT_ROPE,
                       tie_word_embeddings=False)
    net = DFlashNet(qwen, len(ids))
    g = torch.Generator().manual_seed(cfg.seed)
    for module in net.modules():
        if isinstance(module, torch.nn.Linear):
            torch.nn.init.normal_(module.weight, std=INIT_STD, generator=g)
    with torch.no_grad():  # logits of std about 1 at the start (near uniform), not the peaked ones of a unit norm
        net.norm.weight.fill_(1 / target.model.get_output_embeddings().weight.norm(dim=1).mean().item())
    spec = DFlashSpec(cfg.draft_gamma + 1, mask_id(cfg, target), tuple(ids), text.num_hidden_layers)
    return DFlashDrafter(net, spec, source=str(cfg.out))


def mask_id(cfg: DistillConfig, target: CausalLMTarget) -> int:
    """`mask_token`'s id; else the first row of the target's embedding past its tokenizer (DFlash's
    choice for Qwen3: 151669); else the tokenizer's last special token that is not bos / eos / pad."""
    tokenizer = target.tokenizer
    if cfg.mask_token is not None:
        ids = tokenizer.convert_tokens_to_ids([cfg.mask_token])
        if not ids or ids[0] is None or ids[0] == tokenizer.unk_token_id and cfg.mask_token != tokenizer.unk_token:
            raise UsageError(f"`mask_token` {cfg.mask_token!r} is not a token of the target's tokenizer")
        return int(ids[0])
    if target.model.get_input_embeddings().weight.shape[0] > len(tokenizer):
        return len(tokenizer)
    taken = {tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id}
    free = [i for i in tokenizer.all_special_ids if i not in taken]
    if not free:
        raise UsageError("the target's tokenizer has no spare special token for the mask: give `mask_token`")
    return cast(int, max(free))


def _first(cfg: DistillConfig, target: CausalLMTarget) -> DFlashDrafter:
    """The drafter training starts from: `drafter` (in fp32, its map kept), else a new one."""
    if cfg.drafter is None:
        return new_drafter(cfg, target)
    given = given_drafter(cfg, DFlashDrafter, "a DFlash drafter")
    if cfg.gamma is not None and given.block_size != cfg.gamma + 1:
        raise UsageError(f"`gamma` {cfg.gamma}: {cfg.drafter} drafts blocks of {given.block_size} "
                         f"(`gamma` {given.block_size - 1})")
    return given.train()  # its map kept


def _resumed(path: Path) -> tuple[DFlashDrafter, dict[str, Any], TrainState]:
    """A DFlash checkpoint (checkpoints.resumable's `read`): a LoadError if it cannot be read."""
    net, spec = load_dflash(path)
    drafter = DFlashDrafter(net.train(), spec, source=str(path), draft_vocab=load_draft_vocab(path))
    return (drafter, *read_state(path))


def _with_draft_vocab(cfg: DistillConfig, target: CausalLMTarget, drafter: DFlashDrafter, resumed: bool) -> None:
    """The head's map (reading.new_draft_vocab); the head is the target's rows at its ids."""
    vocab = new_draft_vocab(cfg, target, drafter.draft_vocab, resumed)
    if vocab is not None:
        drafter.draft_vocab = vocab
        drafter.bind_target(target.model)


def recorded(drafter: DFlashDrafter) -> dict[str, Any]:
    """The options a DFlash checkpoint fixes (config.settled): its shape, target layers, gamma."""
    q = drafter.net.config
    return {"layers": q.num_hidden_layers, "dim": q.hidden_size, "heads": q.num_attention_heads,
            "target_layers": tuple(drafter.target_layer_ids), "gamma": drafter.block_size - 1}


READER = Reader(
    "dflash", "a DFlash drafter", first=_first, resumed=_resumed, recorded=recorded,
    bind=lambda drafter, target: drafter.bind_target(target.model), layers=lambda d: tuple(d.target_layer_ids),
    span=lambda cfg: cfg.draft_gamma, with_vocab=_with_draft_vocab, task=DFlashTask,
    details=lambda d, cfg: {"block_size": d.block_size, "anchors": cfg.anchors, "mask_id": d.mask_id})
