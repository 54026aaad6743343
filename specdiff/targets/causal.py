"""A Hugging Face causal LM as a target (contracts.Target; the PyTorch reference every runtime
must match): it owns a KV cache over B rows of different lengths (targets.rows.RowCache), each
rolled back on its own. Every forward pass gets per-row position ids and a 2-D attention mask
(a direct model call would derive positions from the cache width, ignoring padding).

Logits are float32 over the tokenizer's real vocabulary: rows of a padded head (e.g. 50304 for a
50257-token tokenizer) are dropped here, so p never puts mass on ids the tokenizer lacks.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from ..errors import IncompatibleModelsError
from ..hf_cache import returned_cache, with_cache
from .trees import TreeRows


def context_window(config: Any) -> int:
    for name in ("n_positions", "max_position_embeddings", "n_ctx", "seq_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    raise IncompatibleModelsError(f"cannot tell the context window of model type '{config.model_type}'")


def eos_token_id(tokenizer: Any, config: Any) -> int | None:
    """The tokenizer's EOS id, else the config's; None unless a single id."""
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else config.eos_token_id
    return eos if isinstance(eos, int) else None


def real_vocab_size(tokenizer: Any, model: Any, name: str) -> int:
    """len(tokenizer), checked against the rows of the model's output head."""
    vocab = len(tokenizer)
    head_rows = model.get_output_embeddings().weight.shape[0]
    if vocab > head_rows:
        raise IncompatibleModelsError(
            f"{name}: tokenizer has {vocab} tokens but the model's head has only {head_rows} rows"
        )
    return vocab


class HFModel:
    """What a target over a Hugging Face causal LM knows of it: the model, its tokenizer, the real
    vocabulary, the context window and EOS (CausalLMTarget, targets.static.StaticTarget)."""

    def __init__(self, model: Any, tokenizer: Any, name: str = ""):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name or getattr(model.config, "_name_or_path", "target")
        self.vocab_size = real_vocab_size(tokenizer, model, self.name)
        self.max_length = context_window(model.config)
        self.eos_token_id = eos_token_id(tokenizer, model.config)

    @property
    def device(self) -> torch.device:
        return cast(torch.device, self.model.device)

    def sync(self) -> None:
        """Wait for queued device work (for honest timings on CUDA)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


class CausalLMTarget(HFModel, TreeRows):
    """A Hugging Face causal LM and its tokenizer, over a per-row KV cache (see RowCache) that can
    also hold the hidden states of any of its layers (CapturingRows.capture: a DFlash run) and
    verify draft trees (TreeRows: a 4-D mask, per layer kind where some layers are windowed)."""

    def __init__(self, model: Any, tokenizer: Any, name: str = ""):
        TreeRows.__init__(self)
        HFModel.__init__(self, model, tokenizer, name)

    def _run(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor,
             kv: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        return self._forward(ids, mask, positions, kv)

    def can_tree(self) -> str | None:
        """Trees need a model that takes a 4-D mask as given (eager or sdpa attention) and whose
        windowed layers, if any, are `layer_types` sliding_attention (windows over positions)."""
        config = self.model.config
        if getattr(config, "_attn_implementation", "eager") not in ("eager", "sdpa"):
            return f"{self.name}: tree attention needs eager or sdpa attention, not {config._attn_implementation}"
        kinds = set(getattr(config, "layer_types", None) or ["full_attention"])
        if "local" in str(getattr(config, "attention_layers", "")) or kinds - {"full_attention", "sliding_attention"}:
            return (f"{self.name}: its windowed attention counts cache columns, which a tree's branches "
                    "do not keep contiguous; draft a chain (drop `tree`)")
        return None

    def _tree_run(self, ids: torch.Tensor, allowed: torch.Tensor, positions: torch.Tensor,
                  key_positions: torch.Tensor, kv: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """allowed (B, S, C + S) as the model's additive 4-D mask; with sliding_attention layers a
        mask per layer kind, the window over positions (HF: a key is seen when q - k < window)."""
        dtype = self.model.dtype

        def additive(ok: torch.Tensor) -> torch.Tensor:
            zeros = torch.zeros(ok.shape, dtype=dtype, device=ok.device)
            return zeros.masked_fill(~ok, torch.finfo(dtype).min)[:, None]  # (B, 1, S, C + S)

        config = self.model.config
        if "sliding_attention" not in (getattr(config, "layer_types", None) or ()):
            return self._forward(ids, additive(allowed), positions, kv)
        near = positions[:, :, None] - key_positions[:, None, :] < config.sliding_window  # (B, S, C + S)
        return self._forward(ids, {"full_attention": additive(allowed), "sliding_attention": additive(allowed & near)},
                             positions, kv)

    @torch.no_grad()
    def _forward(self, ids: torch.Tensor, mask: Any, positions: torch.Tensor,
                 kv: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """One forward pass over the cache kv (2L tensors (B, H, C, D), then the captured features
        (B, 1, C, F) when capturing; [] for none); mask: 2-D (B, C + S) 0/1, or the 4-D masks of
        _tree_run. Every layer keeps all its columns (no sliding-window layers: the mask applies
        windows)."""
        kv, features = self.split_features(kv)
        cache = DynamicCache()
        for k, v in zip(kv[::2], kv[1::2]):
            layer = DynamicLayer()
            layer.lazy_initialization(k, v)
            layer.keys, layer.values = k, v
            cache.layers.append(layer)
        capturing = bool(self.captured)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                         **with_cache(self.model, cache), **({"output_hidden_states": True} if capturing else {}))
        kv = [t for layer in returned_cache(out).layers for t in (layer.keys, layer.values)]
        if capturing:
            kv = self.with_features(kv, features, torch.cat([out.hidden_states[i] for i in self.captured], dim=-1))
        return out.logits[..., : self.vocab_size].float(), kv
