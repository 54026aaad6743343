"""The autoregressive kind: any Hugging Face causal LM (an ARDrafter, for spec-ar); what no other
kind's config.json matches, so last in KINDS."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..drafters.autoregressive import ARDrafter
from ..sources import Source, check_causal_lm, load_causal_lm
from ..vocab import load_draft_vocab
from .kind import Converting, DrafterKind, save_tokenizer


def load_autoregressive(source: Source, device: str, dtype: str) -> ARDrafter:
    """A causal LM as transformers loads it, strictly; its draft vocabulary if one lies beside it."""
    local = Path(source.location).is_dir()
    if local:
        check_causal_lm(source.location)
    model, tokenizer = load_causal_lm(source, device, dtype)
    return ARDrafter(model, tokenizer, source.name, load_draft_vocab(Path(source.location)) if local else None)


def is_autoregressive(drafter: object) -> bool:
    return isinstance(drafter, ARDrafter)


def save_causal_lm(drafter: Any, out: Path, dtype: torch.dtype, context: int | None) -> None:
    """Saved by transformers in `dtype`, with its tokenizer."""
    drafter.model.to(dtype).save_pretrained(str(out))
    save_tokenizer(drafter, out)


KIND = DrafterKind(
    "autoregressive", "an autoregressive (causal LM) drafter", detect=lambda config: True,
    load=load_autoregressive, holds=is_autoregressive,
    no_graph="an autoregressive drafter (spec-ar), which runs in torch only (`runtime` torch); a causal LM is exported "
             "as a `target`", slot="ar_drafter", converting=Converting(save_causal_lm))
