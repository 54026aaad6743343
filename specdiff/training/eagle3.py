"""`specdiff distill --method eagle3`: an EAGLE-3 head (nets/eagle3.py, saved in the published
format) trained on its target's own answers and hidden states by EAGLE-3's training-time test.

    head     new (seeded by `seed`): one Llama layer of the target's width, `heads` heads (default
             the target's; its KV heads where they divide them), the target's MLP width, RoPE and
             norm epsilon; linear weights normal(0, 0.02); lm_head the target's output rows and
             the final norm 1 / (their mean norm), so that the first logits are near uniform (as
             dflash.py); no embedding of its own (it embeds with its target's: frozen, not saved);
             reading the three target layers `target_layers` (default nets.eagle3.default_layer_ids,
             clamped into a small target's layers). Or `drafter`: an EAGLE-3 head to continue
    rows     a batch is `batch_size` whole teacher sequences (those with an answer); row i pairs the
             target's features at position i with the token at i + 1
    unroll   `unroll` steps U (default config.UNROLL): step 1 reads fc(features), step k > 1 the
             head's own output of step k - 1 at the same row, with the token at i + k at position
             i + k - 1; row i of step k attends to the step-1 rows <= i and to its own rows of steps
             2..k (unrolled_mask): exactly the chain drafting runs after the context rows 0..i, with
             the teacher's tokens drafted (tests/test_distill_eagle3.py holds them equal)
    loss     step k, row i scores the token at i + k + 1 where it lies in the answer, up to its
             first eos: ce to it, kl from the target's soft labels there and / or lk
             (losses.per_slot_loss), weighted 0.8^(k - 1) (EAGLE-3's: a later step is reached only
             when the earlier ones are accepted), averaged over the slots scored
    vocab    with `draft_vocab` N: the head cut to the N most frequent ids of the training answers
             (its lm_head rows at them kept; d2t / t2d record them); the loss is taken against the
             target's p restricted to them (reading.restricted). Else the identity over the target's
             rows (head_logits: its first V scored)

The data, the run, resume and the report are reading.py's (READER declares this head to it).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import LlamaConfig

from ..budget import check_fits
from ..drafters.eagle3 import Eagle3Drafter
from ..errors import UsageError
from ..nets.dflash import ContextCache
from ..nets.eagle3 import Eagle3Net, Eagle3Spec, default_layer_ids, load_eagle3, save_eagle3
from ..targets.causal import CausalLMTarget
from ..vocab import head_logits
from .checkpoints import TrainState, read_state
from .config import DistillConfig
from .drafter import given_drafter
from .losses import per_slot_loss
from .reading import Corpus, Reader, new_draft_vocab, restricted, validation_loss

STEP_DECAY = 0.8  # step k's weight: STEP_DECAY ** (k - 1), as EAGLE-3 weighs its steps
INIT_STD = 0.02
DEFAULT_ROPE = {"rope_type": "default", "rope_theta": 10000.0}  # for a target without RoPE (GPT-2)


def unrolled_mask(valid: torch.Tensor, step: int) -> torch.Tensor:
    """valid (B, W) bool (real rows) -> the attention mask (B, 1, W, (step + 1) W) of unrolled step
    `step` (0-based) over the cached keys of steps 0..step: the rows of step 0 causally (real ones;
    a padding row itself), then each later step's own row only."""
    W = valid.shape[1]
    eye = torch.eye(W, dtype=torch.bool, device=valid.device)
    first = torch.ones(W, W, dtype=torch.bool, device=valid.device).tril()[None] & valid[:, None, :] | eye
    return torch.cat([first, *[eye.expand_as(first)] * step], dim=2)[:, None]


def unrolled(drafter: Eagle3Drafter, ids: torch.Tensor, features: torch.Tensor, pad: torch.Tensor,
             steps: int) -> list[torch.Tensor]:
    """ids (B, W), features (B, W, 3 * Ht), pad (B,) -> the head's output (B, W, H) at each of
    `steps` unrolled steps (module docstring; columns past W feed the last token, never scored)."""
    B, W = ids.shape
    columns = torch.arange(W, device=ids.device)
    positions = (columns - pad[:, None]).clamp(min=0)  # (B, W)
    valid = columns >= pad[:, None]
    cache, hidden, outs = ContextCache(), drafter.net.project(features), []
    for k in range(steps):
        tokens = ids[:, (columns + 1 + k).clamp(max=W - 1)]  # (B, W) the token at i + k + 1
        hidden = drafter.net(drafter.embed(tokens), hidden, positions + k, cache, attn_mask=unrolled_mask(valid, k))
        outs.append(hidden)
    return outs


def unrolled_loss(drafter: Eagle3Drafter, corpus: Corpus, rows: torch.Tensor, P: int, steps: int,
                  parts: tuple[str, ...], device: str) -> torch.Tensor:
    """The weighted loss of `rows` (B,) of `corpus` over `steps` unrolled steps (module docstring):
    logits only at the scored slots."""
    ids = corpus.seqs.ids[rows].to(device)
    pad, limits = corpus.pad[rows].to(device), corpus.limits[rows].to(device)
    outs = unrolled(drafter, ids, corpus.features[rows].to(device).float(), pad, steps)
    columns = torch.arange(ids.shape[1], device=device)
    logits, at, weights = [], [], []
    for k, out in enumerate(outs):
        scored = (columns + 2 + k > P) & (columns + 2 + k <= limits[:, None]) & (columns >= pad[:, None])  # (B, W)
        b, i = scored.nonzero(as_tuple=True)
        logits.append(head_logits(drafter.logits(out[b, i]), drafter.draft_vocab, drafter.target_vocab_size))
        at.append((b, i + 2 + k))
        weights.append(torch.full((len(b),), STEP_DECAY ** k, device=device))
    b, c = (torch.cat(t) for t in zip(*at))
    labels = ids[b, c]
    soft = corpus.soft(rows[b.cpu()], c.cpu(), P)
    soft = None if soft is None else (soft[0].to(device), soft[1].to(device))
    if drafter.draft_vocab is not None:
        labels, soft = restricted(drafter.draft_vocab, labels, soft)
    weight = torch.cat(weights)
    per_slot = per_slot_loss(torch.cat(logits), labels, soft, parts)
    return (per_slot * weight).sum() / weight.sum().clamp(min=1e-6)


class Eagle3Task:
    """loop.Task for an EAGLE-3 head on whole rows of a Corpus."""

    def __init__(self, drafter: Eagle3Drafter, train_set: Corpus, val_set: Corpus, P: int, cfg: DistillConfig):
        self.module, self.train_set, self.P, self.cfg = drafter, train_set, P, cfg
        self.parts, self.steps = tuple(cfg.loss.split("+")), cfg.draft_unroll
        usable = val_set.rows()
        self.val = [(val_set, usable[i:i + cfg.batch_size]) for i in range(0, len(usable), cfg.batch_size)]

    def batch(self, size: int, generator: torch.Generator) -> tuple[Corpus, torch.Tensor]:
        usable = self.train_set.rows()
        return self.train_set, usable[torch.randint(0, len(usable), (size,), generator=generator)]

    def loss(self, batch: tuple[Corpus, torch.Tensor]) -> torch.Tensor:
        return unrolled_loss(self.module, *batch, self.P, self.steps, self.parts, self.cfg.device)

    def scored(self, batch: tuple[Corpus, torch.Tensor]) -> int:
        """The answer tokens of the rows (each scored at up to `unroll` steps)."""
        corpus, rows = batch
        return int((corpus.limits[rows] - self.P).clamp(min=0).sum())

    def validation(self) -> float:
        return validation_loss(self.module, self.loss, self.val)

    def save(self, directory: Path) -> None:
        save_eagle3(directory, self.module.net)


def new_head(cfg: DistillConfig, target: CausalLMTarget) -> Eagle3Drafter:
    """A new EAGLE-3 head for `target` (see the module docstring), over the identity map."""
    text = target.model.config.get_text_config()
    hidden, heads, n = text.hidden_size, cfg.heads or text.num_attention_heads, text.num_hidden_layers
    if cfg.dim not in (None, hidden) or cfg.layers not in (None, 1) or hidden % heads:
        raise UsageError(f"an EAGLE-3 head is one layer (`layers` 1) of the target's width {hidden} (`dim`), "
                         "split into `heads` that divide it")
    ids = cfg.target_layers or tuple(min(max(i, 0), n - 1) for i in default_layer_ids(n))
    if len(ids) != 3 or max(ids) >= n:
        raise UsageError(f"`target_layers` {list(ids)}: an EAGLE-3 head reads three of the target's {n} layers")
    kv = getattr(text, "num_key_value_heads", None) or heads
    mlp = getattr(text, "intermediate_size", None) or 4 * hidden
    head = target.model.get_output_embeddings().weight.detach()  # (rows, H)
    check_fits(16 * (hidden * (3 * hidden + 4 * hidden + 3 * mlp) + head.numel()), torch.device(cfg.device),
               {"heads": heads}, "a new EAGLE-3 head's weights, gradients and Adam moments")
    llama = LlamaConfig(vocab_size=head.shape[0], hidden_size=hidden, intermediate_size=mlp, num_hidden_layers=1,
                        num_attention_heads=heads, num_key_value_heads=kv if heads % kv == 0 else heads,
                        head_dim=hidden // heads, max_position_embeddings=text.max_position_embeddings,
                        rms_norm_eps=getattr(text, "rms_norm_eps", 1e-6),
                        rope_parameters=getattr(text, "rope_parameters", None) or DEFAULT_ROPE)
    net = Eagle3Net(llama, Eagle3Spec(head.shape[0], head.shape[0], hidden, tuple(ids)))
    g = torch.Generator().manual_seed(cfg.seed)
    with torch.no_grad():
        for module in net.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=INIT_STD, generator=g)
        net.lm_head.weight.copy_(head)
        net.norm.weight.fill_(1 / head.norm(dim=1).mean().item())
        net.t2d.fill_(True)  # d2t 0: the identity
    return Eagle3Drafter(net, source=str(cfg.out))


def cut_head(net: Eagle3Net, ids: torch.Tensor) -> None:
    """Keep the head's rows at target ids (N,) (increasing): lm_head (N, H), d2t, t2d, the spec's N."""
    old = net.lm_head.weight
    with torch.no_grad():
        net.lm_head = nn.Linear(old.shape[1], len(ids), bias=False, device=old.device, dtype=old.dtype)
        net.lm_head.weight.copy_(old[ids.to(old.device)])
    net.d2t = (ids - torch.arange(len(ids))).to(net.d2t.device)
    t2d = torch.zeros_like(net.t2d)
    t2d[ids.to(t2d.device)] = True
    net.t2d = t2d
    net.spec = replace(net.spec, draft_vocab_size=len(ids))


def _trainable(net: Eagle3Net, source: str) -> Eagle3Drafter:
    """A head in fp32 to train; an embedding of its own stays frozen (EAGLE-3 trains none)."""
    if net.embed_tokens is not None:
        net.embed_tokens.requires_grad_(False)
    return Eagle3Drafter(net.float().train(), source=source)


def _first(cfg: DistillConfig, target: CausalLMTarget) -> Eagle3Drafter:
    """The head training starts from: `drafter` (its map kept), else a new one."""
    if cfg.drafter is None:
        return new_head(cfg, target)
    given = given_drafter(cfg, Eagle3Drafter, "an EAGLE-3 head")
    return _trainable(given.net, given.source)


def _resumed(path: Path) -> tuple[Eagle3Drafter, dict[str, Any], TrainState]:
    """An EAGLE-3 checkpoint (checkpoints.resumable's `read`): a LoadError if it cannot be read."""
    return (_trainable(load_eagle3(path), str(path)), *read_state(path))


def _with_draft_vocab(cfg: DistillConfig, target: CausalLMTarget, drafter: Eagle3Drafter, resumed: bool) -> None:
    """The head's map (reading.new_draft_vocab): a new one cuts the head."""
    vocab = new_draft_vocab(cfg, target, drafter.draft_vocab, resumed)
    if vocab is not None:
        cut_head(drafter.net, vocab.ids)
        drafter.bind_target(target.model, target.vocab_size)


def recorded(drafter: Eagle3Drafter) -> dict[str, Any]:
    """The options an EAGLE-3 checkpoint fixes (config.settled): its shape and target layers."""
    c = drafter.net.config
    return {"layers": 1, "dim": c.hidden_size, "heads": c.num_attention_heads, "target_layers": drafter.net.spec.layer_ids}


READER = Reader(
    "eagle3", "an EAGLE-3 head", first=_first, resumed=_resumed, recorded=recorded,
    bind=lambda drafter, target: drafter.bind_target(target.model, target.vocab_size),
    layers=lambda d: tuple(d.layer_ids), span=lambda cfg: 1, with_vocab=_with_draft_vocab, task=Eagle3Task,
    details=lambda d, cfg: {"unroll": cfg.draft_unroll, "draft_vocab_size": d.net.spec.draft_vocab_size})
