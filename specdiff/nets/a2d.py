"""A2D-Qwen3 masked-diffusion checkpoints (ZHZisZZ/dllm's "AR to diffusion" models:
dllm-hub/Qwen3-0.6B-diffusion-mdlm-v0.1) in transformers' own Qwen3 classes: no remote code.

A directory holds a config.json with `model_type: "a2d-qwen3"` beside the Qwen3 fields, weights
under the stock Qwen3 names (`lm_head.weight` may be stored although the head is tied to the
embedding), and the tokenizer, whose `mask_token` (`<|mask|>`, Qwen3's id 151669, added past its
151669 tokens) is the only place the mask id is written. The network is Qwen3ForCausalLM with a
bidirectional attention mask that hides padding keys only: the caller gives it as an explicit 4-D
mask (drafters/a2d.py). No time conditioning; logits are not shifted: position i predicts token i.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from ..errors import LoadError
from .checkpoint import read_json
from .sdar import check_ranges, qwen3_config, save_qwen3

MODEL_TYPE = "a2d-qwen3"
OWN_FIELDS = ("model_type", "architectures", "auto_map")
TRAINED_LENGTH = 1024  # Tiny-A2D's SFT sequence length (dllm examples/a2d); not in the config


def is_a2d(config: dict[str, Any]) -> bool:
    return config.get("model_type") == MODEL_TYPE


def read_a2d_config(directory: Path, mask_id: int) -> Qwen3Config:
    """config.json of an A2D checkpoint -> its Qwen3 fields as a Qwen3Config, checked (sizes,
    heads, the mask an id of the embedding); one LoadError for a malformed one."""
    where = directory / "config.json"
    qwen = qwen3_config(read_json(where), where, "A2D masked-diffusion", OWN_FIELDS)
    check_ranges(qwen, 1, mask_id, str(where))
    return qwen


def save_a2d(directory: Path, model: Qwen3ForCausalLM, dtype: torch.dtype | None = None) -> None:
    """Write `model` as an A2D checkpoint (config.json + model.safetensors, `lm_head.weight`
    stored as the published files store it); the tokenizer, with its mask token, is the caller's."""
    save_qwen3(directory, model, {"model_type": MODEL_TYPE, "architectures": ["A2DQwen3LMHeadModel"]}, dtype)


def mask_token_id(tokenizer: object, directory: Path) -> int:
    """The tokenizer's mask id: an A2D config names none."""
    mask = getattr(tokenizer, "mask_token_id", None)
    if not isinstance(mask, int):
        raise LoadError(f"{directory}: an A2D masked-diffusion drafter needs its tokenizer, with a mask token "
                        "(dllm adds `<|mask|>`); none found beside the weights or in the models.yaml `tokenizer:`")
    return mask
