"""A drafter -> a new drafter directory, optionally with a draft vocabulary (specdiff.vocab).

    diffusion  any readable format (SEDD hub, MDLM HF, the project's own) -> the project's own
               format (nets/checkpoint.py): the same tensors under the same names, the
               parameterisation, mask id, real vocabulary and context length N, the tokenizer when
               one is known, and the draft settings the source records (`defaults`; hub formats
               record none)
    dflash     a DFlash draft as published (nets/dflash.py), rewritten in `dtype`
    ar         a causal LM drafter (spec-ar), saved by transformers in `dtype`
At fp32 the conversion is lossless; fp16 halves the size (`rotary_emb.inv_freq` stays fp32).
With `draft_vocab` N and `frequencies` (training/vocab.py), or a `vocab_map` made elsewhere (EAGLE-3's
d2t / t2d, SGLang's hot-id list: specdiff.vocab.read_map), the new directory also holds the map of
its head's rows (draft_vocab.safetensors); the weights stay whole, and the drafter scores only those
rows when it drafts. The output directory appears complete or not at all.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..atomic import check_new_directory, new_directory
from ..errors import LoadError, UsageError
from ..kinds import Converting, kind_of
from ..loading import check_pair, load_diffusion_drafter, load_drafter, load_target
from ..registry import Registry, as_registry
from ..vocab import DraftVocab, read_map
from ..training.vocab import build_vocab

CONVERT_DTYPES = {"fp32": torch.float32, "fp16": torch.float16}


def convert_drafter(source: str, out: str | Path, *, dtype: str = "fp32", context: int | None = None,
                    draft_vocab: int | None = None, frequencies: str | Path | None = None,
                    vocab_map: str | Path | None = None, target: str | None = None,
                    registry: Registry | None = None) -> Path:
    """Write the drafter `source` (models.yaml name, directory or hub id) to `out` (see the module
    docstring). context: the drafting context length N of a diffusion drafter (default: the
    source's). draft_vocab, frequencies: the map of its head's N most frequent rows, counted on the
    tokenizer the drafter carries, else the `target`'s; vocab_map: a map file, fingerprinted with
    that tokenizer."""
    out = Path(out)
    check_new_directory(out)
    if dtype not in CONVERT_DTYPES:
        raise UsageError(f"unknown dtype '{dtype}' (choose from {', '.join(CONVERT_DTYPES)})")
    if context is not None and context < 1:
        raise UsageError(f"`context` must be >= 1, got {context}")
    if (draft_vocab is None) != (frequencies is None):
        raise UsageError("`draft_vocab` and `frequencies` go together: a map of the most frequent ids needs both")
    if vocab_map is not None and draft_vocab is not None:
        raise UsageError("`vocab_map` is a map already: give it, or `draft_vocab` with `frequencies`")
    registry = as_registry(registry)
    drafter, converting = _load(source, draft_vocab is not None or vocab_map is not None, registry)
    if context is not None and not converting.context:
        raise UsageError("`context` sets a diffusion drafter's context length; this drafter has none")
    vocab = None
    if draft_vocab is not None and frequencies is not None or vocab_map is not None:
        vocab = _vocab(drafter, converting, draft_vocab, frequencies, vocab_map, target, registry)
    with new_directory(out) as tmp:
        converting.save(drafter, tmp, CONVERT_DTYPES[dtype], context)
        if vocab is not None:
            vocab.save(tmp)
    return out


def _load(source: str, any_kind: bool, registry: Registry) -> tuple[Any, Converting]:
    """A diffusion drafter exactly as stored; with a draft vocabulary to add, a drafter of any kind
    that converts (its kind's `converting`). -> (drafter, how its kind converts)."""
    drafter: Any = load_diffusion_drafter(source, registry=registry) if not any_kind else \
        load_drafter(source, dtype="fp32", registry=registry)
    kind = kind_of(drafter)
    if kind is None or kind.converting is None:
        raise UsageError(f"'{source}' is a {type(drafter).__name__}: a draft vocabulary is for diffusion, DFlash "
                         "and AR drafters")
    return drafter, kind.converting


def _vocab(drafter: Any, converting: Converting, n: int | None, frequencies: str | Path | None,
           vocab_map: str | Path | None, target: str | None, registry: Registry) -> DraftVocab:
    """The map for `drafter`'s tokenizer, else the target's (a DFlash draft ships none); a target
    named must be one the drafter drafts for (loading.check_pair), and the map must not hold the
    id its kind reserves (a diffusion drafter's mask id): a map every later run would refuse is
    refused here."""
    tokenizer = drafter.tokenizer
    if target is not None:
        loaded = load_target(target, dtype="fp32", registry=registry)
        check_pair(loaded, drafter)
        tokenizer = loaded.tokenizer
    if tokenizer is None:
        raise UsageError(f"drafter '{drafter.source}' carries no tokenizer: name its `target` to count tokens with")
    reserved = converting.reserved(drafter)
    if vocab_map is None:
        assert n is not None and frequencies is not None  # convert_drafter: both, or vocab_map
        return build_vocab(Path(frequencies), n, tokenizer, banned=reserved if reserved is not None and
                           reserved < len(tokenizer) else None)
    try:
        vocab = read_map(Path(vocab_map), tokenizer, len(tokenizer))
    except LoadError as e:
        raise UsageError(str(e)) from e
    if reserved is not None and bool(vocab.inside[reserved:reserved + 1].any()):
        raise UsageError(f"{vocab_map}: the map holds id {reserved}, the drafter's mask id, which it never drafts; "
                         "leave it out of the map")
    return vocab
