"""A Hugging Face causal LM as a target (contracts.Target; the PyTorch reference every runtime
must match): it owns its KV cache, which can be rolled back.

Logits are float32 over the tokenizer's real vocabulary: rows of a padded head (e.g. 50304 for a
50257-token tokenizer) are dropped here, so p never puts mass on ids the tokenizer lacks.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from ..errors import IncompatibleModelsError


def context_window(config) -> int:
    for name in ("n_positions", "max_position_embeddings", "n_ctx", "seq_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    raise IncompatibleModelsError(f"cannot tell the context window of model type '{config.model_type}'")


def real_vocab_size(tokenizer, model, name: str) -> int:
    """len(tokenizer), checked against the rows of the model's output head."""
    vocab = len(tokenizer)
    head_rows = model.get_output_embeddings().weight.shape[0]
    if vocab > head_rows:
        raise IncompatibleModelsError(
            f"{name}: tokenizer has {vocab} tokens but the model's head has only {head_rows} rows"
        )
    return vocab


class CausalLMTarget:
    """A Hugging Face causal LM and its tokenizer, with a DynamicCache that can be rolled back."""

    def __init__(self, model, tokenizer, name: str = ""):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name or getattr(model.config, "_name_or_path", "target")
        self.vocab_size = real_vocab_size(tokenizer, model, self.name)
        self.max_length = context_window(model.config)
        eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else model.config.eos_token_id
        self.eos_token_id = eos if isinstance(eos, int) else None
        self.cache: DynamicCache | None = None

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def length(self) -> int:
        return self.cache.get_seq_length() if self.cache is not None else 0

    @torch.no_grad()
    def prefill(self, ids: torch.Tensor) -> torch.Tensor:
        self.cache = DynamicCache(config=self.model.config)
        return self.extend(ids)

    @torch.no_grad()
    def extend(self, ids: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=ids, past_key_values=self.cache, use_cache=True)
        return out.logits[..., : self.vocab_size].float()

    @torch.no_grad()
    def extend_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """ids (K, S) -> logits (K, S, V): the one cached row repeated K times, each extended by
        its row of ids (K candidate drafts, specdiff.selection); keep_row(k) goes back to one."""
        assert self.cache is not None, "prefill first"
        self.cache.batch_repeat_interleave(ids.shape[0])
        return self.extend(ids)

    def keep_row(self, k: int) -> None:
        assert self.cache is not None, "prefill first"
        self.cache.batch_select_indices(torch.tensor([k], device=self.device))

    def rollback(self, length: int) -> None:
        drop = self.length - length
        if drop > 0 and self.cache is not None:
            self.cache.crop(-drop)

    def sync(self) -> None:
        """Wait for queued device work (for honest timings on CUDA)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
