"""A block-diffusion LM (SDAR layout, nets/sdar.py) as a target or a draft model: transformers'
Qwen3 driven with explicit attention patterns and position ids, over a K/V cache that holds whole
finished blocks only (the block grid is anchored at position 0).

    run(ids (1, N), positions (1, N), allowed (N, N) bool) -> logits (1, N, V)
        N new rows against the whole cache (every row sees every cached token) and, among
        themselves, as `allowed` says; their K/V are appended to the cache ...
    trim(n_cached, rows)
        ... until trim() cuts the cache to its first n_cached tokens plus the given rows of the
        last run (None: none of them).
    store(ids) / denoise(block): the two calls of vanilla block decoding (denoise can store the
        block before in the same call).

Logits are float32 over the tokenizer's real vocabulary, not shifted (row i predicts token i),
with the mask token at -inf: neither the mask id nor a padded head row is ever committed.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from transformers import DynamicCache

from ..hf_cache import with_cache
from .causal import context_window, eos_token_id, real_vocab_size


def block_causal(n: int, block_size: int, device: torch.device | None = None) -> torch.Tensor:
    """(n, n) bool: row i sees column j iff j's block is i's or an earlier one (positions from a
    block boundary)."""
    b = torch.arange(n, device=device) // block_size
    return b[:, None] >= b[None, :]


def copies(k: int, n: int, device: torch.device | None = None, before: int = 0) -> torch.Tensor:
    """(before + k n, before + k n) bool: `before` rows that see each other only (a finished
    block stored by the same call), then k independent copies of n rows, bidirectional inside
    each copy, each seeing the `before` rows."""
    c = torch.cat([torch.full((before,), -1, device=device), torch.arange(k * n, device=device) // n])
    return (c[:, None] == c[None, :]) | ((c[None, :] == -1) & (c[:, None] >= 0))


class BlockDiffusionTarget:
    """A block-diffusion LM and its tokenizer (attributes as contracts.Target, plus block_size
    and mask_id)."""

    kind = "block-diffusion"
    draft_vocab = None  # as a drafter (simsd-exact's): every id (contracts.Drafter)

    def __init__(self, model: Any, tokenizer: Any, name: str = "", *, block_size: int, mask_id: int):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name or getattr(model.config, "_name_or_path", "block-diffusion model")
        self.block_size = block_size
        self.mask_id = mask_id
        self.vocab_size = real_vocab_size(tokenizer, model, self.name)
        self.max_length = context_window(model.config)
        self.eos_token_id = eos_token_id(tokenizer, model.config)
        self.cache = DynamicCache(config=model.config)

    @property
    def device(self) -> torch.device:
        return cast(torch.device, self.model.device)

    @property
    def length(self) -> int:
        return self.cache.get_seq_length()

    def reset(self) -> None:
        self.cache = DynamicCache(config=self.model.config)

    @torch.no_grad()
    def run(self, ids: torch.Tensor, positions: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        """See the module docstring: ids, positions (1, N), allowed (N, N) -> logits (1, N, V)."""
        dtype = self.model.dtype
        seen = torch.cat([torch.ones(len(allowed), self.length, dtype=torch.bool, device=self.device),
                          allowed.to(self.device)], 1)  # (N, cached + N)
        mask = torch.zeros(seen.shape, dtype=dtype, device=self.device).masked_fill(~seen, torch.finfo(dtype).min)
        out = self.model(input_ids=ids, position_ids=positions, attention_mask=mask[None, None],
                         use_cache=True, **with_cache(self.model, self.cache))
        logits = out.logits[..., : self.vocab_size].float()
        if self.mask_id < self.vocab_size:
            logits[..., self.mask_id] = float("-inf")
        return cast(torch.Tensor, logits)

    def trim(self, n_cached: int, rows: slice | torch.Tensor | None) -> None:
        """Trim the cache to its first n_cached tokens plus rows `rows` of the last run."""
        layer: Any
        for layer in self.cache.layers:
            if not getattr(layer, "is_initialized", False):
                continue
            new_k, new_v = layer.keys[..., n_cached:, :], layer.values[..., n_cached:, :]
            layer.keys, layer.values = layer.keys[..., :n_cached, :], layer.values[..., :n_cached, :]
            if rows is not None:
                layer.keys = torch.cat([layer.keys, new_k[..., rows, :]], -2)
                layer.values = torch.cat([layer.values, new_v[..., rows, :]], -2)

    def positions(self, start: int, n: int) -> torch.Tensor:
        return torch.arange(start, start + n, device=self.device)[None]  # (1, n)

    def store(self, ids: torch.Tensor) -> None:
        """Cache whole finished blocks ids (1, n), n a multiple of block_size, after the cache."""
        n = ids.shape[1]
        self.run(ids, self.positions(self.length, n), block_causal(n, self.block_size))

    def denoise(self, block: torch.Tensor, finished: torch.Tensor | None = None) -> torch.Tensor:
        """The next block's state (1, B) against the cache, nothing stored -> logits (1, B, V).
        `finished` (1, B): the block before it, not yet cached, stored by the same call."""
        n_cached, B = self.length, block.shape[1]
        ids = block if finished is None else torch.cat([finished, block], 1)
        n = ids.shape[1]
        logits = self.run(ids, self.positions(n_cached, n), block_causal(n, B, self.device))
        self.trim(n_cached, None if finished is None else slice(0, B))
        return logits[:, -B:]

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
