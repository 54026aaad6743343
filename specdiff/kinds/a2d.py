"""The A2D kind: dllm's masked-diffusion Qwen3 (config.json model_type a2d-qwen3, nets/a2d.py), an
A2DDrafter that drafts through DiffusionDrafter's interface (so `specdiff` accepts it)."""

from __future__ import annotations

from typing import Any

from ..drafters.a2d import A2DDrafter
from ..hub import fetch
from ..nets.a2d import is_a2d, mask_token_id, read_a2d_config
from ..sources import BLOCK_FILES, Source, drafter_tokenizer, qwen3_model
from .kind import DrafterKind, token_ids


def load_a2d(source: Source, device: str, dtype: str) -> A2DDrafter:
    """dllm's masked-diffusion Qwen3 in transformers' own Qwen3 class (nets/a2d.py), strictly
    loaded; the mask id is its tokenizer's, and the real vocabulary the tokenizer's tokens less that
    mask when it was added last (as dllm adds `<|mask|>`)."""
    directory = fetch(source.location, BLOCK_FILES)
    tokenizer = drafter_tokenizer(directory, source)
    mask = mask_token_id(tokenizer, directory)
    model = qwen3_model(source.location, directory, read_a2d_config(directory, mask), device, dtype)
    vocab = len(tokenizer) - (mask == len(tokenizer) - 1)
    return A2DDrafter(model.eval(), mask_id=mask, vocab_size=vocab, tokenizer=tokenizer, source=source.name)


def a2d_tokens(drafter: Any) -> dict[str, int]:
    """Its tokenizer's ids less dllm's added `<|mask|>` (past the vocabulary its target shares)."""
    theirs = token_ids(drafter)
    if drafter.mask_id < drafter.vocab_size:
        return theirs
    return {token: i for token, i in theirs.items() if i != drafter.mask_id}


KIND = DrafterKind(
    "a2d", "a diffusion drafter", detect=is_a2d, load=load_a2d, holds=lambda drafter: isinstance(drafter, A2DDrafter),
    tokens=a2d_tokens, not_a_target="a masked-diffusion drafter (config.json model_type a2d-qwen3)",
    no_graph="a masked-diffusion Qwen3 of dllm: `specdiff export` writes DDiT and DFlash drafter graphs only; "
             "run it with the torch runtime")
