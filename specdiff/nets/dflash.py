"""DFlash draft networks (z-lab/dflash, arXiv 2602.06036) read exactly as published, built from
transformers' Qwen3 parts (RMSNorm, rotary embedding, MLP); no remote code.

A DFlash drafter fills a block of S slots (slot 0 the last verified token, the "anchor"; slots
1..S-1 the mask token) in one forward pass, conditioned on the target's hidden states of the
earlier positions. It has no embedding and no head of its own: the caller embeds the block with the
target's embedding and scores the output with the target's head (drafters/dflash.py).

    features   cat(hidden_states[i + 1] for i in target_layer_ids)  (B, C, n_ids * H): HF's
               hidden_states[0] is the embedding output, [i + 1] the output of target layer i
    ctx        hidden_norm(fc(features))                            (B, C, H), the same in every layer
    layer      h = input_layernorm(x); q from h; k, v from cat(ctx, h) (ctx NOT through
               input_layernorm); q_norm / k_norm per head, RoPE at absolute positions (context rows
               at theirs, block rows at start..start+S-1); attention over every context row and
               every block row, no mask (bidirectional in the block), GQA, scale head_dim^-0.5;
               x += o_proj(attn); x += mlp(post_attention_layernorm(x))
    output     norm(x)  (B, S, H); row k >= 1 predicts the token at position start + k (no shift)

A checkpoint directory holds config.json (`architectures: ["DFlashDraftModel"]`, `model_type:
"qwen3"`, the Qwen3 fields of the draft layers, `block_size`, `num_target_layers`,
`dflash_config: {mask_token_id, target_layer_ids}`; third-party drafts may put those two at top
level) and model.safetensors with keys under no prefix: fc.weight (H, n_ids * H), hidden_norm.weight,
norm.weight, layers.{i}.{input_layernorm, post_attention_layernorm}.weight,
layers.{i}.self_attn.{q,k,v,o}_proj.weight, layers.{i}.self_attn.{q,k}_norm.weight (head_dim,),
layers.{i}.mlp.{gate,up,down}_proj.weight. Refused with one LoadError naming the file and the field:
sliding-window layers (`layer_types`), RoPE types other than ROPE_TYPES, dflash_config fields
other than DFLASH_FIELDS (attention_sink_bias, swa_window_size, ...), a mask_embedding.pt override.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence, TypeGuard, cast

import torch
import torch.nn.functional as F
from torch import nn
from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP, Qwen3RMSNorm, Qwen3RotaryEmbedding, rotate_half

from ..errors import IncompatibleModelsError, LoadError
from .checkpoint import load_state_strict, read_json, read_safetensors, save_tensors, sub_config
from .sdar import check_ranges, qwen3_config

ARCHITECTURE = "DFlashDraftModel"
WEIGHTS = "model.safetensors"
MASK_OVERRIDE = "mask_embedding.pt"  # vLLM's optional mask row of some third-party drafts: not read
DFLASH_FIELDS = ("mask_token_id", "target_layer_ids")
OWN_FIELDS = ("model_type", "architectures", "auto_map", "block_size", "num_target_layers", "dflash_config",
              *DFLASH_FIELDS)
ROPE_TYPES = ("default", "linear", "yarn")  # inverse frequencies fixed at load (tested against the reference)


def is_dflash(config: dict[str, Any]) -> bool:
    """Whether a config.json is a DFlash draft's (architectures names DFlashDraftModel)."""
    architectures = config.get("architectures")
    return isinstance(architectures, list) and ARCHITECTURE in architectures


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """The target layers a draft reads when its config names none (the reference's rule): the
    middle layer for one draft layer, else num_draft_layers ids spread evenly from layer 1 to layer
    num_target_layers - 3, rounded half to even. 36/5 -> [1, 9, 17, 25, 33]; 64/5 -> [1, 16, 31, 46, 61]."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    span = num_target_layers - 4
    return [int(round(1 + k * span / (num_draft_layers - 1))) for k in range(num_draft_layers)]


def context_features(hidden_states: Sequence[torch.Tensor], layer_ids: Sequence[int]) -> torch.Tensor:
    """HF hidden_states (N + 1 tensors (B, L, H): embeddings, then each layer's output) ->
    (B, L, len(layer_ids) * H): the outputs of the target layers `layer_ids`, in that order."""
    if max(layer_ids) + 1 >= len(hidden_states):
        raise IncompatibleModelsError(f"target layer {max(layer_ids)} needs hidden_states[{max(layer_ids) + 1}]; "
                                      f"the target gave {len(hidden_states)} entries")
    return torch.cat([hidden_states[i + 1] for i in layer_ids], dim=-1)


@dataclass(frozen=True)
class DFlashSpec:
    """What a DFlash config.json says beyond the shape of its layers."""

    block_size: int  # S: the anchor slot and S - 1 mask slots, as trained
    mask_token_id: int  # a row of the target's embedding
    target_layer_ids: tuple[int, ...]  # 0-based target layers whose outputs form the features
    num_target_layers: int | None  # N of the target it was made for (None: not said)


def _is_int(x: Any) -> TypeGuard[int]:
    return isinstance(x, int) and not isinstance(x, bool)


def read_dflash_config(directory: Path) -> tuple[Qwen3Config, DFlashSpec]:
    """config.json of a DFlash checkpoint -> (the draft layers' Qwen3Config, DFlashSpec); one
    LoadError naming the file and the field for what is malformed or not supported."""
    where = directory / "config.json"
    config = read_json(where)

    def refuse(message: str) -> LoadError:
        return LoadError(f"{where}: {message}")

    if config.get("model_type") != "qwen3":
        raise refuse(f"model_type {config.get('model_type')!r}: only Qwen3-layer DFlash drafters (\"qwen3\") are supported")
    extra = sub_config(config, "dflash_config", DFLASH_FIELDS, where)
    mask = extra.get("mask_token_id", config.get("mask_token_id"))
    ids = extra.get("target_layer_ids", config.get("target_layer_ids"))
    block, n_target = config.get("block_size"), config.get("num_target_layers")
    if not (_is_int(mask) and mask >= 0):
        raise refuse(f"dflash_config.mask_token_id must be an integer >= 0, got {mask!r}")
    if not (_is_int(block) and block >= 2):
        raise refuse(f"block_size must be an integer >= 2 (the anchor and at least one draft slot), got {block!r}")
    if not (n_target is None or _is_int(n_target) and n_target >= 1):
        raise refuse(f"num_target_layers must be an integer >= 1, got {n_target!r}")
    qwen = qwen3_config(config, where, "DFlash", OWN_FIELDS)
    check_ranges(qwen, block, mask, str(where))
    kinds = qwen.layer_types or []
    sliding = [i for i, kind in enumerate(kinds) if kind != "full_attention"]
    if sliding:
        raise refuse(f"layer_types: layer {sliding[0]} is {kinds[sliding[0]]!r}; only full-attention "
                     "draft layers are supported")
    rope = (qwen.rope_parameters or {}).get("rope_type", "default")
    if rope not in ROPE_TYPES:
        raise refuse(f"rope_scaling type {rope!r} is not supported (supported: {', '.join(ROPE_TYPES)})")
    if ids is None:
        if n_target is None:
            raise refuse("dflash_config.target_layer_ids or num_target_layers is needed to know which target "
                         "layers the draft reads")
        ids = build_target_layer_ids(n_target, qwen.num_hidden_layers)
    if not (isinstance(ids, list) and ids and all(_is_int(i) and i >= 0 for i in ids)):
        raise refuse(f"dflash_config.target_layer_ids must be a non-empty list of integers >= 0, got {ids!r}")
    if n_target is not None and max(ids) >= n_target:
        raise refuse(f"dflash_config.target_layer_ids {ids} name a layer past num_target_layers {n_target}")
    return qwen, DFlashSpec(block, mask, tuple(ids), n_target)


def dflash_config(qwen: Qwen3Config, spec: DFlashSpec) -> dict[str, Any]:
    """The config.json of a DFlash checkpoint (the inverse of read_dflash_config; no auto_map: no
    code ships)."""
    fields = qwen.to_diff_dict()
    for name in ("transformers_version", "model_type", "architectures", "dtype", "torch_dtype"):
        fields.pop(name, None)
    return {"architectures": [ARCHITECTURE], "model_type": "qwen3", **fields, "block_size": spec.block_size,
            "num_target_layers": spec.num_target_layers,
            "dflash_config": {"mask_token_id": spec.mask_token_id, "target_layer_ids": list(spec.target_layer_ids)}}


def save_dflash(directory: Path, net: DFlashNet, spec: DFlashSpec, dtype: torch.dtype = torch.float32) -> None:
    """Write a DFlash checkpoint into `directory` (config.json, model.safetensors in `dtype`), as
    published checkpoints are laid out; load_dflash reads it back."""
    state = {k: v.detach().to(dtype).contiguous() for k, v in net.state_dict().items()}  # RoPE: no persistent buffer
    save_tensors(state, directory / WEIGHTS)
    config = {**dflash_config(net.config, spec), "dtype": str(dtype).removeprefix("torch.")}
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def load_dflash(directory: Path) -> tuple[DFlashNet, DFlashSpec]:
    """A DFlash checkpoint directory -> (its network in fp32 on the CPU, its spec); loading is
    strict: one LoadError naming model.safetensors lists every missing, unexpected or mis-shaped
    tensor."""
    qwen, spec = read_dflash_config(directory)
    if (directory / MASK_OVERRIDE).exists():
        raise LoadError(f"{directory / MASK_OVERRIDE}: a mask embedding override is not supported (the mask row "
                        "is the target's embedding of mask_token_id)")
    try:
        net = DFlashNet(qwen, len(spec.target_layer_ids))
    except KeyError as e:  # transformers' ACT2FN for an unknown hidden_act
        raise LoadError(f"{directory / 'config.json'}: hidden_act {qwen.hidden_act!r} is not known") from e
    weights = directory / WEIGHTS
    if not weights.is_file():
        raise LoadError(f"{weights}: missing (a DFlash checkpoint keeps its weights in one {WEIGHTS})")
    load_state_strict(net, read_safetensors(weights), str(weights), optional=())
    return net.eval(), spec


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, heads, n, D) rotated at the positions of cos / sin (B, n, D) (NeoX half split)."""
    return cast(torch.Tensor, x * cos[:, None] + rotate_half(x) * sin[:, None])


class ContextCache:
    """The keys (after k_norm and RoPE) and values of the context rows seen so far, per draft layer
    (B, KV heads, C, head_dim) each, and which rows are real (B, C) bool (None: all). Context rows
    are final (verified tokens' features), so the cache only grows; the block's K/V are never
    stored. keep(index) selects (reorders, repeats) rows of the batch."""

    def __init__(self) -> None:
        self.kv: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.valid: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return self.kv[0][0].shape[2] if self.kv else 0

    def extend(self, new: list[tuple[torch.Tensor, torch.Tensor]],
               valid: torch.Tensor | None) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor | None]:
        """Append the new rows' K/V (and their validity (B, C_new) or None) -> everything held."""
        cached, n_new = self.length, new[0][0].shape[2]
        if valid is not None or self.valid is not None:
            batch, device = new[0][0].shape[0], new[0][0].device
            old = self.valid if self.valid is not None else torch.ones(batch, cached, dtype=torch.bool, device=device)
            add = valid if valid is not None else torch.ones(batch, n_new, dtype=torch.bool, device=device)
            self.valid = torch.cat([old, add], dim=1)
        self.kv = [(torch.cat([k0, k], 2), torch.cat([v0, v], 2)) for (k0, v0), (k, v) in zip(self.kv, new)] \
            if self.kv else list(new)
        return self.kv, self.valid

    def keep(self, index: torch.Tensor | list[int]) -> None:
        self.kv = [(k[index], v[index]) for k, v in self.kv]
        if self.valid is not None:
            self.valid = self.valid[index]


class DFlashAttention(nn.Module):
    """Queries from the block; keys and values from the context rows and the block, unmasked."""

    def __init__(self, config: Qwen3Config):
        super().__init__()
        self.heads, self.head_dim = config.num_attention_heads, config.head_dim
        self.kv_heads = config.num_key_value_heads or config.num_attention_heads
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, self.heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, config.hidden_size, bias=bias)
        self.q_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)

    def key_values(self, rows: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """rows (B, n, H) -> keys (k_norm, then RoPE) and values (B, KV heads, n, head_dim)."""
        shape = (*rows.shape[:2], self.kv_heads, self.head_dim)
        k = self.k_norm(self.k_proj(rows).view(shape)).transpose(1, 2)
        return _rope(k, cos, sin), self.v_proj(rows).view(shape).transpose(1, 2)

    def forward(self, h: torch.Tensor, context_kv: tuple[torch.Tensor, torch.Tensor], cos: torch.Tensor,
                sin: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """h (B, S, H) normed block rows; context_kv from key_values; cos / sin (B, S, D) of the
        block; mask (B, 1, 1, C + S) bool (None: every key) -> (B, S, H)."""
        batch, size = h.shape[:2]
        q = self.q_norm(self.q_proj(h).view(batch, size, self.heads, self.head_dim)).transpose(1, 2)
        k, v = self.key_values(h, cos, sin)
        k, v = torch.cat([context_kv[0], k], dim=2), torch.cat([context_kv[1], v], dim=2)
        out = F.scaled_dot_product_attention(_rope(q, cos, sin), k, v, attn_mask=mask,
                                             scale=self.head_dim ** -0.5, enable_gqa=self.heads != self.kv_heads)
        return cast(torch.Tensor, self.o_proj(out.transpose(1, 2).reshape(batch, size, self.heads * self.head_dim)))


class DFlashLayer(nn.Module):
    """A pre-norm Qwen3 layer whose attention also reads the context rows (not normed here)."""

    def __init__(self, config: Qwen3Config):
        super().__init__()
        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.self_attn = DFlashAttention(config)
        self.post_attention_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.mlp = Qwen3MLP(config)

    def forward(self, x: torch.Tensor, context_kv: tuple[torch.Tensor, torch.Tensor], cos: torch.Tensor,
                sin: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), context_kv, cos, sin, mask)
        return cast(torch.Tensor, x + self.mlp(self.post_attention_layernorm(x)))


class DFlashNet(nn.Module):
    """The draft network under the published parameter names.

    forward(x (B, S, H) the block's input embeddings, context (B, C, n_ids * H) target features of
    the C new context rows, positions (B, C + S) int64 of those rows then of the block,
    cache=None, context_valid=None (B, C) bool) -> (B, S, H) after the final norm.

    Without a cache the context is all of it. With a ContextCache the C rows are appended to it
    and the block attends to every row it holds. context_valid marks padding rows (False) of a
    ragged batch (left-padded context): they are no key of any query. attn_mask (B, 1, S, C + S)
    bool, instead: which keys each row of x attends, so that training runs many blocks of one
    sequence in one pass (x then holds them one after another; training/dflash.py).
    """

    def __init__(self, config: Qwen3Config, n_features: int):
        super().__init__()
        self.config = config
        hidden = config.hidden_size
        self.fc = nn.Linear(n_features * hidden, hidden, bias=False)
        self.hidden_norm = Qwen3RMSNorm(hidden, eps=config.rms_norm_eps)
        self.layers = nn.ModuleList(DFlashLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = Qwen3RMSNorm(hidden, eps=config.rms_norm_eps)
        self.rotary_emb = Qwen3RotaryEmbedding(config)  # buffers only, not in the checkpoint

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> DFlashNet:
        """.to(dtype) casts the parameters; RoPE's inverse frequencies stay float32 (as in
        transformers' own models, which never cast these buffers): in bf16 they would turn
        positions past a few hundred into the wrong angles."""
        rotary = self.rotary_emb
        kept = {name: getattr(rotary, name) for name in ("inv_freq", "original_inv_freq")}
        super()._apply(fn, recurse)  # type: ignore[no-untyped-call]  # torch leaves Module._apply unannotated
        for name, value in kept.items():
            setattr(rotary, name, value.to(getattr(rotary, name).device))
        return self

    def forward(self, x: torch.Tensor, context: torch.Tensor, positions: torch.Tensor,
                cache: ContextCache | None = None, context_valid: torch.Tensor | None = None,
                attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        n = context.shape[1]
        cos, sin = self.rotary_emb(x, positions)
        ctx = self.hidden_norm(self.fc(context.to(x.dtype)))
        layers = [cast(DFlashLayer, layer) for layer in self.layers]
        kv = [layer.self_attn.key_values(ctx, cos[:, :n], sin[:, :n]) for layer in layers]
        valid = context_valid
        if cache is not None:
            kv, valid = cache.extend(kv, context_valid)
        mask = attn_mask
        if mask is None and valid is not None:
            block = torch.ones(x.shape[0], x.shape[1], dtype=torch.bool, device=x.device)
            mask = torch.cat([valid.to(x.device), block], dim=1)[:, None, None, :]
        for layer, layer_kv in zip(layers, kv):
            x = layer(x, layer_kv, cos[:, n:], sin[:, n:], mask)
        return cast(torch.Tensor, self.norm(x))
