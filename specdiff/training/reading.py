"""The run shared by the drafters that read their target's hidden states (`specdiff distill --method
dflash`, `--method eagle3`): a Reader declares what differs (dflash.py's blocks, eagle3.py's
unrolled head), this module does the rest once:

    data     the teacher sequences (teacher.py: prompt, then the target's answer) and the target's
             features of them at the layers the drafter reads (features.py), computed once and
             cached: two drafters reading the same layers share one cache
    corpus   per row, the columns a loss may label: the answer's, up to its first eos (chat), so
             that `span` tokens after an anchor fit (Corpus.limits)
    vocab    with `draft_vocab` N, the N most frequent ids of the training answers (training/vocab.py);
             q can only be the target's p restricted to them, so the loss is taken against that
             restriction (`restricted`: no ce where the teacher's token is outside, the soft labels
             outside dropped and the rest renormalised, their tail beyond the top k counted inside)
    run      a new drafter, `drafter`, or the newest readable checkpoint (`resume`: its recorded
             shape settles the options); loop.train; the drafter published in its public format
    report   tau and alpha of `--method <reader>` against the target on held-out questions, greedy
             and at eval_temperature, in DIR/report.json
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from ..atomic import new_file
from ..errors import UsageError
from ..targets.causal import CausalLMTarget
from ..vocab import DraftVocab
from .batches import split_limits
from .checkpoints import Task, TrainState, publish, resumable, undone_if_diverged
from .config import CHAT_PROMPT_TOKENS, DistillConfig, data_directory, settled
from .data import data_spec
from .evaluation import evaluate_drafter
from .features import MappedFeatures, cached_features, features_directory, padding
from .loop import train
from .sequences import Sequences
from .teacher import build_sequences, more_sequences
from .vocab import build_vocab


@dataclass
class Corpus:
    """Sequences (M, W) = prompt (P) + answer (L), left-padded by pad (M,); the target's features
    (M, W, F) fp16 (read by rows: mapped from their files for training); limits (M,): the first
    anchor column past the last usable one (0: none)."""

    seqs: Sequences
    features: torch.Tensor | MappedFeatures
    pad: torch.Tensor
    limits: torch.Tensor

    def rows(self) -> torch.Tensor:
        """The rows with at least one anchor."""
        return torch.nonzero(self.limits > 0)[:, 0]

    def soft(self, rows: torch.Tensor, columns: torch.Tensor, P: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The soft labels (ids, p) (..., k) of the tokens at `columns` (answer columns, >= P) of
        `rows`, both (...) or broadcast to it; None without soft labels."""
        ids, p = self.seqs.soft_ids, self.seqs.soft_p
        if ids is None or p is None:
            return None
        return ids[rows, columns - P], p[rows, columns - P]

    @staticmethod
    def cat(parts: list[Corpus]) -> Corpus:
        """One Corpus of parts whose features are mapped (training sets), rows in order."""
        features = parts[0].features
        for part in parts[1:]:
            features = features + part.features  # type: ignore[operator]
        return Corpus(Sequences.cat([p.seqs for p in parts]), features, torch.cat([p.pad for p in parts]),
                      torch.cat([p.limits for p in parts]))


def corpus(seqs: Sequences, features: torch.Tensor | MappedFeatures, pad_id: int | None, P: int, span: int,
           eos: int | None) -> Corpus:
    """A Corpus: anchors a with a + span inside the row, drafting at or before its first eos."""
    limits = split_limits(seqs, P, span, eos) - 1  # split_limits bounds the first drafted column a + 1
    return Corpus(seqs, features, padding(seqs.ids, pad_id), torch.where(limits > P, limits, 0))


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


def new_draft_vocab(cfg: DistillConfig, target: CausalLMTarget, held: DraftVocab | None,
                    resumed: bool) -> DraftVocab | None:
    """The map a drafter's head takes now, None: none new. A resumed checkpoint, or a `drafter`
    with one, keeps its own (`draft_vocab` omitted or equal; a resumed whole head admits no
    `draft_vocab`); otherwise `draft_vocab` N gives the N most frequent answer tokens of the
    teacher data (training/vocab.py; N past the vocabulary: all of it, as a held map records it)."""
    size = held.size if held else None
    wanted = None if cfg.draft_vocab is None else min(cfg.draft_vocab, target.vocab_size)
    if wanted not in (None, size) and (resumed or held is not None):
        raise UsageError(f"`draft_vocab` {cfg.draft_vocab}: {'the checkpoint being resumed' if resumed else cfg.drafter} "
                         f"was trained with {f'a head of {size} rows' if held else 'the whole head'}")
    if held is None and cfg.draft_vocab is not None:
        return build_vocab(data_directory(cfg), cfg.draft_vocab, target.tokenizer, target.eos_token_id)
    return None


@torch.no_grad()
def validation_loss(module: torch.nn.Module, loss: Callable[[Any], torch.Tensor], batches: list[Any]) -> float:
    """The mean loss of fixed held-out batches, in eval mode (the loop sets train mode back)."""
    module.eval()
    values = [loss(batch).item() for batch in batches]
    return round(sum(values) / len(values), 5)


@dataclass(frozen=True)
class Reader:
    """What one kind of drafter reading its target's features needs of the shared run."""

    method: str  # the generation method that drafts with it (the report's tau / alpha)
    what: str  # how messages name it ("a DFlash drafter")
    first: Callable[[DistillConfig, CausalLMTarget], Any]  # the drafter a run starts from (new or `drafter`)
    resumed: Callable[[Path], tuple[Any, dict[str, Any], TrainState]]  # a checkpoint (a LoadError if unreadable)
    recorded: Callable[[Any], dict[str, Any]]  # the options a drafter fixes (config.settled)
    bind: Callable[[Any, CausalLMTarget], None]  # hand it the target's embedding (and head)
    layers: Callable[[Any], tuple[int, ...]]  # the target layers it reads (0-based)
    span: Callable[[DistillConfig], int]  # the tokens after an anchor a row must hold
    with_vocab: Callable[[DistillConfig, CausalLMTarget, Any, bool], None]  # (..., resumed): its draft vocabulary
    task: Callable[[Any, Corpus, Corpus, int, DistillConfig], Task]  # (drafter, train, val, P, cfg)
    details: Callable[[Any, DistillConfig], dict[str, Any]]  # the report's fields of its own


def distill_reading(cfg: DistillConfig, target: Any, reader: Reader, progress: bool) -> dict[str, Any]:
    """Train `reader`'s drafter for `target` into cfg.out (see the module docstring) -> the report
    (data_only: the teacher data and features, then a short report)."""
    wall = time.perf_counter()
    if not isinstance(target, CausalLMTarget):
        raise UsageError(f"`method` {cfg.method} reads a causal target's hidden states; '{target.name}' is a "
                         f"{type(target).__name__}")
    target.model.requires_grad_(False)
    out = Path(cfg.out)
    found = resumable(out / "checkpoints", reader.resumed) if cfg.resume and not cfg.data_only else None
    drafter, opt_state, state = found[1] if found else (reader.first(cfg, target), None, TrainState())
    if found or cfg.drafter:  # what it continues fixes its settings
        cfg = settled(cfg, reader.recorded(drafter), f"the checkpoint being resumed ({found[0]})" if found
                      else f"`drafter` {cfg.drafter}")
    reader.bind(drafter, target)
    drafter.to(cfg.device)
    with undone_if_diverged(out):
        train_set, val_set, P, generate_s = _corpora(cfg, target, reader, drafter, progress)
        if cfg.data_only:
            return {"target": target.name, "data": str(data_directory(cfg)), "generate_s": round(generate_s, 3),
                    "sequences": len(train_set.seqs) + len(val_set.seqs),
                    "generated_tokens": (len(train_set.seqs) + len(val_set.seqs)) * cfg.continuation_tokens}
        reader.with_vocab(cfg, target, drafter, found is not None)
        drafter.to(cfg.device)
        task = reader.task(drafter, train_set, val_set, P, cfg)
        opt = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=cfg.lr)
        if opt_state is not None:
            opt.load_state_dict(opt_state)
        if not state.history:
            state.history.append([0, task.validation()])
        train(task, opt, state, cfg, progress)
    publish(out, task.save)
    report = _report(cfg, target, reader, task, state, (train_set, val_set), P, time.perf_counter() - wall)
    with new_file(out / "report.json") as tmp:
        tmp.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return report


def _corpora(cfg: DistillConfig, target: CausalLMTarget, reader: Reader, drafter: Any,
             progress: bool) -> tuple[Corpus, Corpus, int, float]:
    """(train, val, P, seconds spent generating): the teacher data (cached or generated; with
    `more_data`, those caches' training sequences too) and the target's features of it (cached or
    computed)."""
    P = cfg.prompt_tokens or CHAT_PROMPT_TOKENS
    data, layers, span = data_directory(cfg), reader.layers(drafter), reader.span(cfg)
    spec = data_spec(cfg, target, P, None)
    more = more_sequences(cfg.more_data, spec)  # refused before any generating
    train_seqs, val_seqs, generate_s = build_sequences(data, target, spec, progress,
                                                       (features_directory(data, layers), layers))
    pad_id = target.tokenizer.pad_token_id if cfg.chat else None
    eos = target.eos_token_id if cfg.chat else None
    parts, val_set = [], None
    for directory, train_seqs_i, val_seqs_i in [(data, train_seqs, val_seqs), *more]:
        train_f, val_f = cached_features(directory, target.model, train_seqs_i, val_seqs_i, pad_id, layers, progress)
        parts.append(corpus(train_seqs_i, train_f, pad_id, P, span, eos))
        if val_set is None:  # held out: `data`'s own, the first
            val_set = corpus(val_seqs_i, val_f, pad_id, P, span, eos)
    assert val_set is not None
    sets = [Corpus.cat(parts), val_set]
    for name, s in zip(("training", "held-out"), sets):
        if not len(s.rows()):
            raise UsageError(f"no {name} answer is long enough to train {reader.what} on ({span + 1} tokens "
                             "after the prompt)")
    return sets[0], sets[1], P, generate_s


def _report(cfg: DistillConfig, target: CausalLMTarget, reader: Reader, task: Task, state: TrainState,
            sets: tuple[Corpus, Corpus], P: int, wall_s: float) -> dict[str, Any]:
    drafter: Any = task.module
    evaluation = evaluate_drafter(cfg, target, drafter, sets[1].seqs, P, method=reader.method)
    vocab = drafter.draft_vocab
    return {
        "target": target.name, "drafter": str(Path(cfg.out)), "method": cfg.method, "loss": cfg.loss,
        "teacher": {"temperature": list(cfg.teacher_temperature), "top_p": list(cfg.teacher_top_p),
                    "samples_per_prompt": cfg.samples_per_prompt},
        "gamma": cfg.draft_gamma, **reader.details(drafter, cfg), "target_layer_ids": list(reader.layers(drafter)),
        "draft_vocab": None if vocab is None else vocab.to_dict(),
        "parameters": sum(p.numel() for p in drafter.parameters()),
        "val_loss": {"initial": state.history[0][1], "final": state.history[-1][1], "history": state.history},
        "eval": evaluation,
        "compute": {"steps": state.step, "train_tokens": state.tokens, "train_s": round(state.train_s, 3),
                    "train_sequences": len(sets[0].seqs), "wall_s": round(wall_s, 3),
                    "device": cfg.device, "threads": torch.get_num_threads()},
    }
