"""Draft vocabularies from token counts (specdiff.vocab): which N target ids a drafter's head keeps.

    frequencies   a teacher-data directory of `specdiff distill` (its data/: the target's own
                  answers, each counted up to and including its first EOS; the held-out
                  validation answers are not counted), or a counts file: .safetensors holding
                  `counts` (V,) int64, with the `fingerprint` (specdiff.vocab.fingerprint over every
                  id) of the tokenizer it was counted with in its metadata
    always kept   the tokenizer's special tokens (EOS, the chat template's end...): the drafter must be
                  able to propose the end of an answer. Only heads are cut: the embedding keeps every
                  row (the mask row a diffusion or DFlash block is fed included); a mask id is never
                  a row of a draft head (DiffusionDrafter refuses it)

Used by `specdiff drafter convert --draft-vocab N --frequencies FILE` and `specdiff distill
--draft-vocab N`; save_counts writes a counts file (scripts/smol/build.sh ships the smol pair's).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from ..errors import LoadError, UsageError
from .teacher import read_sequences
from ..nets.checkpoint import save_tensors
from ..vocab import DraftVocab, fingerprint, from_counts


def answer_counts(data: Path, vocab_size: int, eos: int | None) -> tuple[torch.Tensor, int]:
    """A teacher-data directory -> (counts (V,) of the answer tokens of its training sequences, how
    many were counted); an answer ends at its first `eos` (what follows is padding)."""
    try:
        train, _, spec = read_sequences(data)
    except (OSError, KeyError, TypeError, ValueError, LoadError) as e:
        raise UsageError(f"{data}: not a complete `specdiff distill` teacher-data directory ({e})") from e
    answers = train.ids[:, spec.prompt_tokens:]  # (M, L)
    keep = torch.ones_like(answers, dtype=torch.bool)
    if eos is not None:
        ended = (answers == eos).long().cumsum(1)
        keep = (ended == 0) | ((ended == 1) & (answers == eos))  # up to and including the first eos
    tokens = answers[keep]
    if len(tokens) and int(tokens.max()) >= vocab_size:
        raise UsageError(f"{data}: holds token ids up to {int(tokens.max())}; this tokenizer has {vocab_size}")
    return torch.bincount(tokens, minlength=vocab_size), len(tokens)


def read_counts(path: Path, tokenizer: Any, eos: int | None) -> tuple[torch.Tensor, str]:
    """`frequencies` (see the module docstring) -> (counts (V,), how they were made)."""
    V = len(tokenizer)
    if path.is_dir():
        counts, n = answer_counts(path, V, eos)
        return counts, f"the {n:,} answer tokens of the target's teacher data {path.name}/"
    try:
        with safe_open(str(path), framework="pt") as f:
            counts, meta = f.get_tensor("counts"), f.metadata() or {}
    except Exception as e:  # safetensors' own errors, a missing file or tensor
        raise UsageError(f"{path}: not a teacher-data directory nor a counts file ({str(e).splitlines()[0]})") from e
    if counts.dim() != 1 or len(counts) != V or counts.is_floating_point():
        raise UsageError(f"{path}: counts must be {V} integers (one per token of this tokenizer), got "
                         f"{counts.dtype} {tuple(counts.shape)}")
    if meta.get("fingerprint") != fingerprint(tokenizer, torch.arange(V), V):
        raise UsageError(f"{path}: counted with another tokenizer (its fingerprint is not this tokenizer's)")
    return counts.long(), meta.get("built_from") or f"counts from {path.name}"


def save_counts(path: Path, counts: torch.Tensor, tokenizer: Any, built_from: str) -> None:
    """Write a counts file that read_counts reads back (for maps of other sizes without the data)."""
    V = len(tokenizer)
    save_tensors({"counts": counts.long()}, path,
                 {"fingerprint": fingerprint(tokenizer, torch.arange(V), V), "built_from": built_from})


def always_kept(tokenizer: Any, eos: int | None = None, banned: int | None = None) -> list[int]:
    """The ids every draft vocabulary keeps: special tokens and EOS (the target's, when it differs
    from the tokenizer's), less `banned` (a mask id inside the vocabulary)."""
    ids = set(tokenizer.all_special_ids) | {tokenizer.eos_token_id, eos}
    return sorted(i for i in ids if i is not None and i != banned and 0 <= i < len(tokenizer))


def build_vocab(frequencies: Path, n: int, tokenizer: Any, eos: int | None = None,
                banned: int | None = None) -> DraftVocab:
    """The n most frequent ids of `frequencies` plus always_kept, for `tokenizer`'s vocabulary;
    never `banned` (a diffusion drafter's mask id when it is a real token)."""
    if n < 1:
        raise UsageError(f"`draft_vocab` must be >= 1, got {n}")
    eos = eos if eos is not None else tokenizer.eos_token_id
    counts, built_from = read_counts(frequencies, tokenizer, eos)
    try:
        return from_counts(counts, n, always_kept(tokenizer, eos, banned), tokenizer,
                           f"the {n:,} most frequent of {built_from}", banned)
    except LoadError as e:
        raise UsageError(str(e)) from e
