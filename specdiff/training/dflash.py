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
    data     the teacher sequences (teacher.py: prompt, then the target's answer) and the target's
             features of them (features.py), computed once
    blocks   per sequence, `anchors` anchors a drawn in its answer (up to its first eos): slot 0 the
             token at a, slots 1..gamma the mask; each block attends to the features of the
             sequence's positions < a and to itself, as drafting does (methods/dflash.py); all of
             a sequence's blocks run in one pass (DFlashNet's attn_mask)
    loss     at slot k (the token at a + k): cross-entropy to the teacher's token (ce), the KL from
             the target's soft labels there (kl) and / or -log of the acceptance probability
             sum min(p, q) over them (lk, losses.lk_per_slot), weighted exp(-(k - 1) / (gamma / 2)):
             DFlash's decaying slot weights (a slot counts only when the ones before it are accepted)
    vocab    with `draft_vocab` N: the head is the target's rows at the N most frequent ids of the
             training answers (training/vocab.py), saved with every checkpoint; q can only be the
             target's p restricted to them, so the loss is taken against that restriction: no ce
             where the teacher's token is outside, the soft labels outside dropped and the rest
             renormalised (their tail beyond the top k counted as inside)
    loop     loop.train (warmup, cosine decay, clipping, checkpoints and resume)
    report   tau and alpha of `--method dflash` against the target on held-out questions, greedy
             and at eval_temperature, in DIR/report.json

The target's embedding and head are the drafter's own input and output (bound, frozen, not saved).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import Qwen3Config

from ..atomic import new_file
from ..budget import check_fits
from ..drafters.dflash import DFlashDrafter
from ..vocab import DraftVocab, load_draft_vocab
from ..errors import UsageError
from ..nets.dflash import DFlashNet, DFlashSpec, build_target_layer_ids, load_dflash, save_dflash
from ..targets.causal import CausalLMTarget
from .batches import split_limits
from .checkpoints import TrainState, publish, read_state, recorded, resumable, undone_if_diverged
from .config import CHAT_PROMPT_TOKENS, DistillConfig, data_directory, settled
from .data import data_spec
from .evaluation import evaluate_drafter
from .features import MappedFeatures, cached_features, features_directory, padding
from .losses import kl_per_slot, lk_per_slot
from .loop import train
from .teacher import Sequences, build_sequences, more_sequences
from .vocab import build_vocab

VAL_SEED_OFFSET = 2  # the fixed validation blocks' generator: seed + this
INIT_STD = 0.02  # new linear layers: normal(0, INIT_STD), as Qwen3's initializer_range
DEFAULT_ROPE = {"rope_type": "default", "rope_theta": 10000.0}  # for a target without RoPE (GPT-2)


@dataclass
class Corpus:
    """Sequences (M, W) = prompt (P) + answer (L), left-padded by pad (M,); the target's features
    (M, W, F) fp16 (read by rows: mapped from their files for training); limits (M,): the first
    anchor column past the last usable one."""

    seqs: Sequences
    features: torch.Tensor | MappedFeatures
    pad: torch.Tensor
    limits: torch.Tensor

    def rows(self) -> torch.Tensor:
        """The rows with at least one anchor."""
        return torch.nonzero(self.limits > 0)[:, 0]

    @staticmethod
    def cat(parts: list[Corpus]) -> Corpus:
        """One Corpus of parts whose features are mapped (training sets), rows in order."""
        features = parts[0].features
        for part in parts[1:]:
            features = features + part.features  # type: ignore[operator]
        return Corpus(Sequences.cat([p.seqs for p in parts]), features, torch.cat([p.pad for p in parts]),
                      torch.cat([p.limits for p in parts]))


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
    log_q = logits.reshape(-1, V).log_softmax(-1)  # (B A g, V), shared by the parts
    per_slot = log_q.new_zeros(weights.shape)
    if "ce" in parts:
        flat = labels.reshape(-1, 1)
        per_slot = per_slot - log_q.gather(-1, flat.clamp(min=0))[:, 0] * (flat[:, 0] >= 0)
    for name, part in (("kl", kl_per_slot), ("lk", lk_per_slot)):
        if name not in parts:
            continue
        if soft is None:
            raise UsageError(f"the {name} loss needs soft labels (`soft_labels` > 0)")
        ids, p = soft
        k = ids.shape[-1]
        per_slot = per_slot + part(log_q, ids.reshape(-1, k).long(), p.reshape(-1, k).float())
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
        soft = None
        if corpus.seqs.soft_ids is not None and corpus.seqs.soft_p is not None:
            j = (columns - self.P).flatten(1)[..., None].expand(-1, -1, corpus.seqs.soft_ids.shape[-1])
            soft = tuple(t[rows].gather(1, j).view(*columns.shape, -1).to(device)
                         for t in (corpus.seqs.soft_ids, corpus.seqs.soft_p))
        if self.module.draft_vocab is not None:
            labels, soft = restricted(self.module.draft_vocab, labels, soft)  # type: ignore[arg-type]
        return block_loss(logits, labels, soft, self.parts)  # type: ignore[arg-type]

    def scored(self, batch: tuple[Corpus, Blocks]) -> int:
        return batch[1].anchors.numel() * (self.module.block_size - 1)

    @torch.no_grad()
    def validation(self) -> float:
        self.module.eval()
        values = [self.loss(batch).item() for batch in self.val]
        return round(sum(values) / len(values), 5)

    def save(self, directory: Path) -> None:
        save_dflash(directory, self.module.net, self.module.spec)
        if self.module.draft_vocab is not None:
            self.module.draft_vocab.save(directory)


def restricted(vocab: DraftVocab, labels: torch.Tensor, soft: tuple[torch.Tensor, torch.Tensor] | None
               ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
    """Target ids -> draft ids of the head's N rows (see the module docstring): labels (...) -> (-1
    outside the map); soft labels (ids, p) (..., k) -> (draft ids, p renormalised over the ids
    inside and the tail, 0 outside)."""
    index = torch.full((vocab.vocab_size,), -1, dtype=torch.long, device=labels.device)
    index[vocab.ids.to(labels.device)] = torch.arange(vocab.size, device=labels.device)
    if soft is None:
        return index[labels], None
    ids, p = index[soft[0].long()], soft[1].float()
    inside = ids >= 0
    p_out = (p * ~inside).sum(-1, keepdim=True)
    return index[labels], (ids.clamp(min=0), torch.where(inside, p, 0) / (1 - p_out).clamp(min=1e-6))


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
    return max(free)


def corpus(seqs: Sequences, features: torch.Tensor | MappedFeatures, pad_id: int | None, P: int, gamma: int, eos: int | None) -> Corpus:
    """A Corpus: anchors a with a + gamma inside the row, drafting at or before its first eos."""
    limits = split_limits(seqs, P, gamma, eos) - 1  # split_limits bounds the first drafted column a + 1
    return Corpus(seqs, features, padding(seqs.ids, pad_id), torch.where(limits > P, limits, 0))


def distill_dflash(cfg: DistillConfig, target: Any, progress: bool) -> dict[str, Any]:
    """Train a DFlash drafter for `target` into cfg.out (see the module docstring) -> the report
    (data_only: the teacher data and features, then a short report)."""
    wall = time.perf_counter()
    if not isinstance(target, CausalLMTarget):
        raise UsageError(f"`method` dflash reads a causal target's hidden states; '{target.name}' is a "
                         f"{type(target).__name__}")
    target.model.requires_grad_(False)
    out = Path(cfg.out)
    found = resumable(out / "checkpoints", _resumed) if cfg.resume and not cfg.data_only else None
    drafter, opt_state, state = found[1] if found else (_first(cfg, target), None, TrainState())
    if found or cfg.drafter:  # what it continues fixes its settings
        cfg = settled(cfg, recorded(drafter), f"the checkpoint being resumed ({found[0]})" if found
                      else f"`drafter` {cfg.drafter}")
    drafter.bind_target(target.model)
    drafter.to(cfg.device)
    with undone_if_diverged(out):
        train_set, val_set, P, generate_s = _corpora(cfg, target, drafter, progress)
        if cfg.data_only:
            return {"target": target.name, "data": str(data_directory(cfg)), "generate_s": round(generate_s, 3),
                    "sequences": len(train_set.seqs) + len(val_set.seqs),
                    "generated_tokens": (len(train_set.seqs) + len(val_set.seqs)) * cfg.continuation_tokens}
        _with_draft_vocab(cfg, target, drafter, resumed=found is not None)
        task = DFlashTask(drafter, train_set, val_set, P, cfg)
        opt = torch.optim.AdamW(drafter.parameters(), lr=cfg.lr)
        if opt_state is not None:
            opt.load_state_dict(opt_state)
        if not state.history:
            state.history.append([0, task.validation()])
        train(task, opt, state, cfg, progress)
    publish(out, task.save)
    report = _report(cfg, target, task, state, val_set, P, time.perf_counter() - wall)
    with new_file(out / "report.json") as tmp:
        tmp.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return report


def _first(cfg: DistillConfig, target: CausalLMTarget) -> DFlashDrafter:
    """The drafter training starts from: `drafter` (in fp32, its map kept), else a new one."""
    if cfg.drafter is None:
        return new_drafter(cfg, target)
    if not (Path(cfg.drafter) / "config.json").is_file():
        raise UsageError(f"`drafter` {cfg.drafter}: no DFlash drafter there (config.json missing)")
    net, spec = load_dflash(Path(cfg.drafter))
    if cfg.gamma is not None and spec.block_size != cfg.gamma + 1:
        raise UsageError(f"`gamma` {cfg.gamma}: {cfg.drafter} drafts blocks of {spec.block_size} "
                         f"(`gamma` {spec.block_size - 1})")
    return DFlashDrafter(net.float().train(), spec, source=str(cfg.out), draft_vocab=load_draft_vocab(Path(cfg.drafter)))


def _resumed(path: Path) -> tuple[DFlashDrafter, dict[str, Any], TrainState]:
    """A DFlash checkpoint (checkpoints.resumable's `read`): a LoadError if it cannot be read."""
    net, spec = load_dflash(path)
    drafter = DFlashDrafter(net.train(), spec, source=str(path), draft_vocab=load_draft_vocab(path))
    return (drafter, *read_state(path))


def _with_draft_vocab(cfg: DistillConfig, target: CausalLMTarget, drafter: DFlashDrafter, resumed: bool) -> None:
    """The head's map: a resumed checkpoint, or a `drafter` with one, keeps its own (`draft_vocab`
    omitted or equal; a resumed whole head admits no `draft_vocab`); otherwise `draft_vocab` N gives
    the N most frequent answer tokens of the teacher data (training/vocab.py) and their head rows."""
    held = drafter.draft_vocab
    size = held.size if held else None
    if cfg.draft_vocab not in (None, size) and (resumed or held is not None):
        raise UsageError(f"`draft_vocab` {cfg.draft_vocab}: {'the checkpoint being resumed' if resumed else cfg.drafter} "
                         f"was trained with {f'a head of {size} rows' if held else 'the whole head'}")
    if held is None and cfg.draft_vocab is not None:
        drafter.draft_vocab = build_vocab(data_directory(cfg), cfg.draft_vocab, target.tokenizer, target.eos_token_id)
        drafter.bind_target(target.model)


def _corpora(cfg: DistillConfig, target: CausalLMTarget, drafter: DFlashDrafter,
             progress: bool) -> tuple[Corpus, Corpus, int, float]:
    """(train, val, P, seconds spent generating): the teacher data (cached or generated; with
    `more_data`, those caches' training sequences too) and the target's features of it (cached or
    computed)."""
    P = cfg.prompt_tokens or CHAT_PROMPT_TOKENS
    data, layers = data_directory(cfg), drafter.target_layer_ids
    spec = data_spec(cfg, target, P, None)
    more = more_sequences(cfg.more_data, spec)  # refused before any generating
    train_seqs, val_seqs, generate_s = build_sequences(data, target, spec, progress,
                                                       (features_directory(data, layers), layers))
    pad_id = target.tokenizer.pad_token_id if cfg.chat else None
    eos = target.eos_token_id if cfg.chat else None
    parts, val_set = [], None
    for directory, train, val in [(data, train_seqs, val_seqs), *more]:
        train_f, val_f = cached_features(directory, target.model, train, val, pad_id, layers, progress)
        parts.append(corpus(train, train_f, pad_id, P, cfg.draft_gamma, eos))
        if val_set is None:  # held out: `data`'s own, the first
            val_set = corpus(val, val_f, pad_id, P, cfg.draft_gamma, eos)
    assert val_set is not None
    sets = [Corpus.cat(parts), val_set]
    for name, s in zip(("training", "held-out"), sets):
        if not len(s.rows()):
            raise UsageError(f"no {name} answer is long enough for a block of {cfg.draft_gamma + 1} tokens")
    return sets[0], sets[1], P, generate_s


def _report(cfg: DistillConfig, target: CausalLMTarget, task: DFlashTask, state: TrainState, val_set: Corpus,
            P: int, wall_s: float) -> dict[str, Any]:
    drafter = task.module
    evaluation = evaluate_drafter(cfg, target, drafter, val_set.seqs, P, method="dflash")
    return {
        "target": target.name, "drafter": str(Path(cfg.out)), "method": "dflash", "loss": cfg.loss,
        "teacher": {"temperature": list(cfg.teacher_temperature), "top_p": list(cfg.teacher_top_p),
                    "samples_per_prompt": cfg.samples_per_prompt},
        "gamma": cfg.draft_gamma, "block_size": drafter.block_size, "anchors": cfg.anchors, "mask_id": drafter.mask_id,
        "target_layer_ids": drafter.target_layer_ids,
        "draft_vocab": None if drafter.draft_vocab is None else drafter.draft_vocab.to_dict(),
        "parameters": sum(p.numel() for p in drafter.parameters()),
        "val_loss": {"initial": state.history[0][1], "final": state.history[-1][1], "history": state.history},
        "eval": evaluation,
        "compute": {"steps": state.step, "train_tokens": state.tokens, "train_s": round(state.train_s, 3),
                    "train_sequences": len(task.train_set.seqs), "wall_s": round(wall_s, 3), "device": cfg.device,
                    "threads": torch.get_num_threads()},
    }
