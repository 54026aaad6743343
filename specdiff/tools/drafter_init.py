"""A randomly initialised diffusion drafter for a target: its vocabulary is the target
tokenizer's plus one mask id. Training comes from `specdiff distill`; tests and users need
drafters before that. It records no draft settings (`defaults`): it was trained for none; it
records `untrained`, so that a run with it warns that it will be no faster (distill drops the mark).
A shape whose fp32 weights exceed the free memory is refused before they are made (budget.check_fits).
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..atomic import check_new_directory, new_directory
from ..budget import check_fits
from ..errors import UsageError
from ..loading import load_tokenizer, resolve
from ..nets.checkpoint import save_own
from ..nets.dit import DDiT, DiTConfig
from ..registry import Registry, load_registry
from ..requests import check_seed


def init_drafter(target: str, out: str | Path, *, layers: int = 2, dim: int = 128, heads: int = 4,
                 context: int = 32, cond_dim: int = 64, seed: int = 0,
                 registry: Registry | None = None) -> Path:
    """Write a random DDiT drafter for `target` (name, directory or hub id) to `out`.

    Only the target's tokenizer is read. The directory appears complete or not at all.
    """
    out = Path(out)
    check_seed(seed)
    check_new_directory(out)
    for name, value in (("layers", layers), ("dim", dim), ("heads", heads), ("context", context)):
        if value < 1:
            raise UsageError(f"`{name}` must be >= 1, got {value}")
    source, _ = resolve(target, ("target",), registry or load_registry())
    tokenizer = load_tokenizer(source)
    vocab = len(tokenizer)
    weights = layers * (12 * dim * dim + 6 * cond_dim * dim) + 2 * (vocab + 1) * dim  # blocks, embedding, head
    check_fits(4 * weights, torch.device("cpu"), {"layers": layers, "dim": dim}, "the drafter's fp32 weights")
    try:
        cfg = DiTConfig(vocab_size=vocab + 1, hidden_size=dim, n_heads=heads, n_blocks=layers,
                        cond_dim=cond_dim, time_conditioning=False)
    except ValueError as e:
        raise UsageError(str(e)) from e
    backbone = DDiT(cfg).init_random(torch.Generator().manual_seed(seed))
    with new_directory(out) as tmp:
        save_own(tmp, backbone, vocab_size=vocab, mask_id=vocab, context_length=context,
                 parameterization="subs", tokenizer=tokenizer, untrained=True)
    return out
