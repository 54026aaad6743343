"""A `specdiff distill` run's data, assembled once: the teacher's sequences (specdiff.training.teacher),
raw text, the drafting pattern, and the fixed validation batches (specdiff.training.batches)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ..drafters.diffusion import DiffusionDrafter
from ..errors import UsageError
from .batches import Batch, Pattern, make_batch, split_limits
from .config import CHAT_PROMPT_TOKENS, RAW_FRACTION, DistillConfig, data_directory
from .prefill import prefill_rows, prefill_split
from .sequences import Sequences
from .teacher import DataSpec, Teacher, build_sequences, more_sequences, read_tokens

VAL_EXAMPLES = 256


@dataclass
class Data:
    train: Sequences  # (M, P + L) prompts and the target's continuations, soft labels
    val: Sequences  # (M_val, P + L) held-out
    val_batches: list[Batch]  # fixed validation examples
    pattern: Pattern
    raw: torch.Tensor | None  # raw text tokens (n,)
    raw_fraction: float
    generate_s: float
    generated_tokens: int
    prompt_tokens: int  # P: the continuation starts at this column
    limits: torch.Tensor | None  # (M,) per-row split limits (chat: nothing past the answer's end)

    def batch(self, size: int, generator: torch.Generator) -> Batch:
        """A training batch of `size` examples, drawn with `generator` (its state: the data position)."""
        return make_batch(self.train, self.pattern, size, generator, self.prompt_tokens, self.raw,
                          self.raw_fraction, limits=self.limits)


def data_spec(cfg: DistillConfig, target: Teacher, P: int, banned: int | None) -> DataSpec:
    """What the teacher data of a run with prompts of P tokens is (never generating `banned`); a
    prefill's row counts are its file's (prefill_split)."""
    if P + cfg.continuation_tokens > target.max_length:
        raise UsageError(f"prompts of {P} tokens plus `continuation_tokens` {cfg.continuation_tokens} "
                         f"exceed the target's context window ({target.max_length})")
    num, val = cfg.num_prompts, max(2, min(64, cfg.num_prompts // 8))
    if cfg.prefill:
        rows = prefill_rows(cfg.prompts, target.tokenizer, P, cfg.continuation_tokens, target.eos_token_id)[0]
        num, val = prefill_split(len(rows), cfg.num_prompts)
    return DataSpec(target.name, str(Path(cfg.prompts).resolve()), P, cfg.continuation_tokens, num, val,
                    list(cfg.teacher_temperature), list(cfg.teacher_top_p), cfg.samples_per_prompt, cfg.soft_labels,
                    cfg.seed, banned, cfg.chat, cfg.prefill)


def prepare(cfg: DistillConfig, target: Teacher, drafter: DiffusionDrafter, progress: bool) -> Data:
    """Sequences (from the cache, else generated), raw text, the drafting pattern and the fixed
    validation batches."""
    N, L = drafter.context_length, cfg.continuation_tokens
    P = (cfg.prompt_tokens or CHAT_PROMPT_TOKENS) if cfg.chat else N
    spec = data_spec(cfg, target, P, drafter.mask_id if drafter.mask_id < target.vocab_size else None)
    raw = read_tokens(cfg.raw_text, target.tokenizer, "raw text") if cfg.raw_text else None
    if raw is not None and len(raw) < P + cfg.draft_gamma:
        raise UsageError(f"{cfg.raw_text} has {len(raw)} tokens; it needs at least {P + cfg.draft_gamma}")
    more = [seqs for _, seqs, _ in more_sequences(cfg.more_data, spec)]  # refused before any generating
    train, val, generate_s = build_sequences(data_directory(cfg), target, spec, progress)
    train = Sequences.cat([train, *more])
    pattern = Pattern(N, cfg.draft_gamma, cfg.steps_per_draft, drafter.mask_id)
    eos = target.eos_token_id if cfg.chat else None
    g = torch.Generator().manual_seed(cfg.seed + 1)
    val_limits = split_limits(val, P, cfg.draft_gamma, eos)
    val_batches = [make_batch(val, pattern, cfg.batch_size, g, P, context=N, limits=val_limits)
                   for _ in range(-(-VAL_EXAMPLES // cfg.batch_size))]
    fraction = 0.0 if raw is None else RAW_FRACTION if cfg.raw_fraction is None else cfg.raw_fraction
    return Data(train, val, val_batches, pattern, raw, fraction, generate_s, (len(train) + len(val)) * L,
                P, split_limits(train, P, cfg.draft_gamma, eos))
