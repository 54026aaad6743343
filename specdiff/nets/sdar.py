"""SDAR block-diffusion checkpoints (JetAstra/SDAR; arXiv 2510.06303) in transformers' own Qwen3
classes: no `trust_remote_code`, no flash-attn.

An SDAR directory holds a config.json with `model_type: "sdar"`, `block_size` (B) and
`mask_token_id` beside the Qwen3 fields (its `auto_map` names modeling code we never import),
weights under the Qwen3 parameter names (an untied `lm_head`), one `model.safetensors` or shards
listed in `model.safetensors.index.json`, and the tokenizer. The attention pattern (block-causal,
bidirectional inside a block) is not in the weights: the caller gives it as an explicit 4-D mask
with explicit position ids (targets/block.py). Logits are not shifted: position i predicts token i.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeGuard

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

try:  # transformers' configs validate their fields with huggingface_hub's strict dataclasses
    from huggingface_hub.errors import StrictDataclassError
except ImportError:  # an older huggingface_hub: configs raise TypeError / ValueError only
    StrictDataclassError = ValueError  # type: ignore[misc, assignment]

from ..errors import LoadError
from .checkpoint import read_json, save_tensors

MODEL_TYPE = "sdar"
OWN_FIELDS = ("model_type", "architectures", "auto_map", "block_size", "mask_token_id")
INDEX = "model.safetensors.index.json"  # sharded weights (SDAR-4B / 8B)
SHAPE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "max_position_embeddings")


def is_sdar(config: dict[str, Any]) -> bool:
    return config.get("model_type") == MODEL_TYPE


def block_fields(config: dict[str, Any], source: str) -> tuple[int, int]:
    """-> (block_size, mask_token_id) of an SDAR config, checked as integers (not booleans)."""
    block, mask = config.get("block_size"), config.get("mask_token_id")
    if not (_is_int(block) and block >= 1 and _is_int(mask) and mask >= 0):
        raise LoadError(f"{source}: an SDAR config needs block_size >= 1 and mask_token_id, "
                        f"got {block!r} and {mask!r}")
    return block, mask


def check_ranges(qwen: Qwen3Config, block: int, mask: int, source: str) -> None:
    """The sizes of an SDAR config (given or Qwen3's defaults) each an integer >= 1, the heads
    grouped evenly, one layer type per layer, the mask an id of the embedding and a block within
    the position range: else an IndexError, a division by zero or a terabyte allocation later."""
    for name in SHAPE_FIELDS:
        value = getattr(qwen, name, None)
        if not (_is_int(value) and value >= 1):
            raise LoadError(f"{source}: {name} must be an integer >= 1, got {value!r}")
    heads, kv_heads = qwen.num_attention_heads, qwen.num_key_value_heads
    if kv_heads and heads % kv_heads:  # checked >= 1 above
        raise LoadError(f"{source}: num_key_value_heads {kv_heads} does not divide num_attention_heads {heads}")
    layer_types = getattr(qwen, "layer_types", None)
    if layer_types is not None and len(layer_types) != qwen.num_hidden_layers:
        raise LoadError(f"{source}: layer_types must list one type per layer ({qwen.num_hidden_layers})")
    if mask >= qwen.vocab_size:
        raise LoadError(f"{source}: mask_token_id {mask} is not an id of the embedding (vocab_size {qwen.vocab_size})")
    if block > qwen.max_position_embeddings:
        raise LoadError(f"{source}: block_size {block} is longer than max_position_embeddings "
                        f"{qwen.max_position_embeddings}")


def _is_int(x: Any) -> TypeGuard[int]:
    return isinstance(x, int) and not isinstance(x, bool)


def qwen3_config(config: dict[str, Any], where: Path, what: str, own: tuple[str, ...] = OWN_FIELDS) -> Qwen3Config:
    """The Qwen3 fields of a config.json (all but the format's `own` fields) as transformers' own
    Qwen3Config; one LoadError naming the file for a malformed one (SDAR, nets/dflash.py)."""
    fields = {k: v for k, v in config.items() if k not in own}
    if fields.get("rope_scaling", 0) is None:  # written by transformers 4 as null; 5 deprecates the key
        del fields["rope_scaling"]
    try:
        return Qwen3Config(**fields)
    except (TypeError, ValueError, StrictDataclassError) as e:
        reason = " ".join(str(e).split())  # transformers' validation errors span several lines
        raise LoadError(f"{where}: not a Qwen3-shaped {what} config ({reason})") from e


def read_sdar_config(directory: Path) -> tuple[Qwen3Config, int, int]:
    """config.json of an SDAR checkpoint -> (its Qwen3 fields as a Qwen3Config, block_size,
    mask_token_id); one LoadError for a malformed one."""
    config = read_json(directory / "config.json")
    block, mask = block_fields(config, str(directory / "config.json"))
    qwen = qwen3_config(config, directory / "config.json", "SDAR")
    check_ranges(qwen, block, mask, str(directory / "config.json"))
    qwen.tie_word_embeddings = bool(config.get("tie_word_embeddings", False))
    return qwen, block, mask


def save_sdar(directory: Path, model: Qwen3ForCausalLM, block_size: int, mask_token_id: int,
              dtype: torch.dtype | None = None) -> None:
    """Write model as an SDAR checkpoint: config.json + model.safetensors (tokenizer: the caller's)."""
    save_qwen3(directory, model, {"model_type": MODEL_TYPE, "architectures": ["SDARForCausalLM"],
                                  "block_size": block_size, "mask_token_id": mask_token_id}, dtype)


def save_qwen3(directory: Path, model: Qwen3ForCausalLM, own: dict[str, Any], dtype: torch.dtype | None = None) -> None:
    """Write a Qwen3ForCausalLM in a format transformers does not know (SDAR, nets/a2d.py):
    model.safetensors (every tensor, a tied head's as its own copy) and config.json (its Qwen3
    fields, then the format's `own` ones and the dtype; no auto_map: no code ships). The tokenizer
    is the caller's."""
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(dtype or v.dtype).clone() for k, v in model.state_dict().items()}
    save_tensors(state, directory / "model.safetensors")
    fields = model.config.to_diff_dict()
    fields.pop("transformers_version", None)
    config = {**fields, **own, "dtype": str(dtype or model.dtype).removeprefix("torch.")}
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
