"""EAGLE-3 draft heads (arXiv 2503.01840) read exactly as published by SpecForge and EAGLE
(`LlamaForCausalLMEagle3`), built from transformers' Llama parts (RMSNorm, MLP, rotary embedding);
no remote code.

An EAGLE-3 head drafts autoregressively, one Llama decoder layer ("midlayer") over the target's
fused low / mid / high hidden states and its own draft vocabulary of N target ids. Row i of a
sequence carries the target's features at position i and the embedding of the token at position
i + 1, at RoPE position i; its output predicts the token at position i + 2. A draft step feeds its
own output (before the final norm) back in place of the features:

    features   cat(hidden_states[i + 1] for i in layer_ids)   (B, T, 3 * Ht): the outputs of three
               target layers (HF's hidden_states[0] is the embedding output); Ht the target's width
    hidden     fc(features)                                    (B, T, H) (a draft step: the previous
                                                                step's `out` instead, no fc)
    layer      x = cat(input_layernorm(embeds), hidden_norm(hidden))   (B, T, 2H): embedding first
               q, k, v from x; RoPE (NeoX half split) at the rows' positions; causal attention over
               every cached row and the new ones, GQA, scale head_dim^-0.5
               h = hidden + o_proj(attn)   (the residual is the hidden state before hidden_norm)
               out = h + mlp(post_attention_layernorm(h))      (B, T, H): fed back at the next step
    logits     lm_head(norm(out))                              (B, T, N) over the draft vocabulary;
               draft id d stands for target id d + d2t[d]

A checkpoint directory holds config.json (`architectures: ["LlamaForCausalLMEagle3"]`, EAGLE's own
releases ["LlamaForCausalLM"]: is_eagle3; the Llama fields of its one layer, `draft_vocab_size` N
(default vocab_size V), `target_hidden_size` Ht (default hidden_size),
`eagle_config.eagle_aux_hidden_state_layer_ids` (default: default_layer_ids)) and model.safetensors with fc.weight (H, 3 * Ht), midlayer.{hidden_norm,
input_layernorm, post_attention_layernorm}.weight (H,), midlayer.self_attn.{q,k,v}_proj.weight
(heads * D, 2H), midlayer.self_attn.o_proj.weight (H, heads * D), midlayer.mlp.{gate,up,down}_proj
.weight, norm.weight (H,), lm_head.weight (N, H), d2t (N,) int64, t2d (V,) bool, and sometimes
embed_tokens.weight (V, H) (else the drafter embeds with its target's embedding); EAGLE's own
releases keep the same tensors in pytorch_model.bin, read with torch.load(weights_only=True).
Loading is strict; refused with one LoadError naming the file and the field: more than one layer,
SpecForge's `fc_norm`, vLLM's `norm_before_residual`, biases, eagle_config fields other than
EAGLE_FIELDS, RoPE types other than ROPE_TYPES.

Layer ids are read as SpecForge writes them (and SGLang reads them): id i is the output of target
layer i, HF's hidden_states[i + 1]. vLLM's own indexing is one higher (the input of layer i);
a head whose ids were written in that indexing still decodes exactly, reading features one layer
off (its acceptance drops).

May import: torch, transformers, safetensors, errors and nets (checkpoint I/O, dflash's ContextCache).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, TypeGuard, cast

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding, rotate_half

try:  # transformers' configs validate their fields with huggingface_hub's strict dataclasses
    from huggingface_hub.errors import StrictDataclassError
except ImportError:  # an older huggingface_hub: configs raise TypeError / ValueError only
    StrictDataclassError = ValueError  # type: ignore[misc, assignment]

from ..errors import LoadError
from .checkpoint import load_state_strict, read_json, read_pickled, read_safetensors, save_tensors, sub_config
from .dflash import ContextCache

ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")  # SpecForge / EAGLE's name, vLLM's
WEIGHTS = "model.safetensors"
PICKLED = "pytorch_model.bin"  # EAGLE's own releases (yuhuili/EAGLE3-*): read with weights_only, never written
OWN_FIELDS = ("architectures", "auto_map", "model_type", "draft_vocab_size", "target_hidden_size", "eagle_config")
EAGLE_FIELDS = ("eagle_aux_hidden_state_layer_ids", "use_aux_hidden_state")
REFUSED = ("fc_norm", "norm_before_residual", "attention_bias", "mlp_bias")  # variants not read: off or absent
ROPE_TYPES = ("default", "llama3")  # both held to the reference (tests/data/eagle3)


def is_eagle3(config: dict[str, Any]) -> bool:
    """Whether a config.json is an EAGLE-3 head's: architectures names LlamaForCausalLMEagle3 (or
    vLLM's name), or, as the EAGLE authors' own releases write it, plain LlamaForCausalLM with one
    layer and a `draft_vocab_size` (a field no causal LM has)."""
    architectures = config.get("architectures")
    if not isinstance(architectures, list):
        return False
    return any(a in ARCHITECTURES for a in architectures) or (
        architectures == ["LlamaForCausalLM"] and "draft_vocab_size" in config and config.get("num_hidden_layers") == 1)


def default_layer_ids(num_target_layers: int) -> tuple[int, int, int]:
    """The target layers a head reads when its config names none (EAGLE's and SpecForge's rule): the
    outputs of layers 1, N // 2 - 1 and N - 4 (EAGLE captures the inputs of layers 2, N // 2, N - 3).
    32 -> (1, 15, 28); 4 -> (1, 1, 0)."""
    n = num_target_layers
    return 1, n // 2 - 1, n - 4


def _is_int(x: Any) -> TypeGuard[int]:
    return isinstance(x, int) and not isinstance(x, bool)


def _size(config: LlamaConfig, name: str) -> int:
    """A size field read_eagle3_config checked (transformers types them Optional)."""
    return cast(int, getattr(config, name))


@dataclass(frozen=True)
class Eagle3Spec:
    """What an EAGLE-3 config.json says beyond the shape of its layer."""

    vocab_size: int  # V: the target's vocabulary (t2d's length, embed_tokens' rows)
    draft_vocab_size: int  # N: lm_head's rows
    target_hidden_size: int  # Ht: the width of each of the three target features
    layer_ids: tuple[int, ...] | None  # 0-based target layers whose outputs are fused (None: default_layer_ids)


def read_eagle3_config(directory: Path) -> tuple[LlamaConfig, Eagle3Spec]:
    """config.json of an EAGLE-3 head -> (its layer's LlamaConfig, Eagle3Spec); one LoadError naming
    the file and the field for what is malformed or not supported."""
    where = directory / "config.json"
    config = read_json(where)

    def refuse(message: str) -> LoadError:
        return LoadError(f"{where}: {message}")

    for name in REFUSED:
        if config.get(name):
            raise refuse(f"{name} is not supported (this version reads the plain EAGLE-3 layer)")
    eagle = sub_config(config, "eagle_config", EAGLE_FIELDS, where)
    if eagle.get("use_aux_hidden_state", True) is not True:
        raise refuse("eagle_config.use_aux_hidden_state false (an EAGLE-1-style head) is not supported")
    fields = {k: v for k, v in config.items() if k not in OWN_FIELDS}
    if fields.get("rope_scaling", 0) is None:
        del fields["rope_scaling"]
    try:
        llama = LlamaConfig(**fields)
    except (TypeError, ValueError, StrictDataclassError) as e:
        raise refuse(f"not a Llama-shaped EAGLE-3 config ({' '.join(str(e).split())})") from e
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                 "head_dim"):
        if not (_is_int(getattr(llama, name, None)) and getattr(llama, name) >= 1):
            raise refuse(f"{name} must be an integer >= 1, got {getattr(llama, name, None)!r}")
    if llama.num_hidden_layers != 1:
        raise refuse(f"num_hidden_layers {llama.num_hidden_layers}: only one-layer heads (a midlayer) are supported")
    if _size(llama, "num_attention_heads") % _size(llama, "num_key_value_heads"):
        raise refuse(f"num_key_value_heads {llama.num_key_value_heads} does not divide num_attention_heads "
                     f"{llama.num_attention_heads}")
    rope = (llama.rope_parameters or {}).get("rope_type", "default")
    if rope not in ROPE_TYPES:
        raise refuse(f"rope_scaling type {rope!r} is not supported (supported: {', '.join(ROPE_TYPES)})")
    n = config.get("draft_vocab_size", llama.vocab_size)
    width = config.get("target_hidden_size", llama.hidden_size)
    ids = eagle.get("eagle_aux_hidden_state_layer_ids")
    if not (_is_int(n) and 1 <= n <= llama.vocab_size):
        raise refuse(f"draft_vocab_size must be an integer in 1..vocab_size ({llama.vocab_size}), got {n!r}")
    if not (_is_int(width) and width >= 1):
        raise refuse(f"target_hidden_size must be an integer >= 1, got {width!r}")
    if ids is not None and not (isinstance(ids, list) and len(ids) == 3 and all(_is_int(i) and i >= 0 for i in ids)):
        raise refuse(f"eagle_config.eagle_aux_hidden_state_layer_ids must be three integers >= 0, got {ids!r}")
    return llama, Eagle3Spec(llama.vocab_size, n, width, None if ids is None else tuple(ids))


def eagle3_config(llama: LlamaConfig, spec: Eagle3Spec) -> dict[str, Any]:
    """The config.json of an EAGLE-3 head (the inverse of read_eagle3_config)."""
    fields = llama.to_diff_dict()
    for name in ("transformers_version", "model_type", "architectures", "dtype", "torch_dtype"):
        fields.pop(name, None)
    eagle = {} if spec.layer_ids is None else {"eagle_config": {"eagle_aux_hidden_state_layer_ids": list(spec.layer_ids)}}
    return {"architectures": [ARCHITECTURES[0]], "model_type": "llama", **fields,
            "draft_vocab_size": spec.draft_vocab_size, "target_hidden_size": spec.target_hidden_size, **eagle}


def save_eagle3(directory: Path, net: Eagle3Net, dtype: torch.dtype = torch.float32) -> None:
    """Write an EAGLE-3 checkpoint into `directory` (config.json, model.safetensors: parameters in
    `dtype`, d2t / t2d as they are), as published ones are laid out; load_eagle3 reads it back."""
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: (v.detach().to(dtype) if v.is_floating_point() else v.detach()).contiguous()
             for k, v in net.state_dict().items()}
    save_tensors(state, directory / WEIGHTS)
    config = {**eagle3_config(net.config, net.spec), "dtype": str(dtype).removeprefix("torch.")}
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def load_eagle3(directory: Path) -> Eagle3Net:
    """An EAGLE-3 checkpoint directory -> its network in fp32 on the CPU; strict: one LoadError naming
    model.safetensors lists every missing, unexpected or mis-shaped tensor. embed_tokens may be
    absent (the drafter then embeds with its target's); so may d2t and t2d of a head over the
    whole vocabulary (draft_vocab_size = vocab_size: the identity map, as vLLM reads it)."""
    llama, spec = read_eagle3_config(directory)
    weights = directory / WEIGHTS
    if not weights.is_file() and (directory / PICKLED).is_file():
        weights = directory / PICKLED
        state = read_pickled(weights)
    elif weights.is_file():
        state = read_safetensors(weights)
    else:
        raise LoadError(f"{weights}: missing (an EAGLE-3 head keeps its weights in one {WEIGHTS} or {PICKLED})")
    try:
        net = Eagle3Net(llama, spec, embedding="embed_tokens.weight" in state)
    except KeyError as e:  # transformers' ACT2FN for an unknown hidden_act
        raise LoadError(f"{directory / 'config.json'}: hidden_act {llama.hidden_act!r} is not known") from e
    if spec.draft_vocab_size == spec.vocab_size and "d2t" not in state and "t2d" not in state:
        state = {**state, "d2t": torch.zeros(spec.vocab_size, dtype=torch.int64),
                 "t2d": torch.ones(spec.vocab_size, dtype=torch.bool)}
    for name, dtype in (("d2t", torch.int64), ("t2d", torch.bool)):
        if name in state and state[name].dtype != dtype:
            raise LoadError(f"{weights}: {name} must be {dtype}, found {state[name].dtype}")
    load_state_strict(net, {k: v if k in ("d2t", "t2d") else v.float() for k, v in state.items()}, str(weights),
                      optional=())
    return net.eval()


class Eagle3Attention(nn.Module):
    """Llama attention whose q, k, v read the 2H-wide cat(embedding, hidden)."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.heads, self.kv_heads = _size(config, "num_attention_heads"), _size(config, "num_key_value_heads")
        self.head_dim = _size(config, "head_dim")
        wide = 2 * _size(config, "hidden_size")
        self.q_proj = nn.Linear(wide, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(wide, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(wide, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: ContextCache | None,
                valid: torch.Tensor | None, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, T, 2H); cos / sin (B, T, D) of the rows' positions; valid (B, T) bool or None ->
        (B, T, H). Row t attends to every real cached row and to the real new rows 0..t (a padding
        row to itself only: finite, and no row's key); attn_mask (B, 1, T, C + T) bool, when given,
        says instead which cached and new rows each row reads (training's unrolled steps)."""
        batch, size = x.shape[:2]
        q = self.q_proj(x).view(batch, size, self.heads, self.head_dim).transpose(1, 2)  # (B, h, T, D)
        k = self.k_proj(x).view(batch, size, self.kv_heads, self.head_dim).transpose(1, 2)  # (B, kvh, T, D)
        v = self.v_proj(x).view(batch, size, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = q * cos[:, None] + rotate_half(q) * sin[:, None], k * cos[:, None] + rotate_half(k) * sin[:, None]
        cached = 0
        if cache is not None:
            cached = cache.length
            kv, valid = cache.extend([(k, v)], valid)
            k, v = kv[0]
        causal = torch.ones(size, cached + size, dtype=torch.bool, device=x.device).tril(cached)  # (T, C + T)
        mask = causal[None, None]
        if attn_mask is not None:
            mask = attn_mask
        elif valid is not None:
            itself = torch.zeros_like(causal)
            itself[:, cached:] = torch.eye(size, dtype=torch.bool, device=x.device)
            mask = (causal[None] & valid.to(x.device)[:, None, :] | itself[None])[:, None]  # (B, 1, T, C + T)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.head_dim ** -0.5,
                                             enable_gqa=self.heads != self.kv_heads)
        return cast(torch.Tensor, self.o_proj(out.transpose(1, 2).reshape(batch, size, self.heads * self.head_dim)))


class Eagle3Layer(nn.Module):
    """The midlayer: a Llama decoder layer over cat(input_layernorm(embeds), hidden_norm(hidden))
    whose residual is the hidden state before hidden_norm."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.hidden_norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.self_attn = Eagle3Attention(config)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.mlp = LlamaMLP(config)

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                cache: ContextCache | None, valid: torch.Tensor | None,
                attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)  # (B, T, 2H)
        h = hidden + self.self_attn(x, cos, sin, cache, valid, attn_mask)
        return cast(torch.Tensor, h + self.mlp(self.post_attention_layernorm(h)))


class Eagle3Net(nn.Module):
    """The head under the published parameter names (module docstring: the maths).

    project(features (B, T, 3 * Ht)) -> (B, T, H); forward(embeds (B, T, H), hidden (B, T, H),
    positions (B, T) int64, cache=None, valid=None (B, T) bool, attn_mask=None) -> out (B, T, H),
    before the final norm; logits(out) -> (B, T, N). Without a cache the T rows attend causally
    among themselves; with a ContextCache (nets/dflash.py: one layer's keys after RoPE and values,
    and which rows are real) they are appended to it and attend to every real row it holds; an
    attn_mask (B, 1, T, C + T) bool replaces both rules (training/eagle3.py's unrolled steps). d2t (N,)
    and t2d (V,) are buffers (saved with the weights). embed_tokens exists when the checkpoint has it.
    """

    d2t: torch.Tensor
    t2d: torch.Tensor

    def __init__(self, config: LlamaConfig, spec: Eagle3Spec, embedding: bool = False):
        super().__init__()
        self.config, self.spec = config, spec
        hidden = config.hidden_size
        self.embed_tokens = nn.Embedding(spec.vocab_size, hidden) if embedding else None
        self.fc = nn.Linear(3 * spec.target_hidden_size, hidden, bias=False)
        self.midlayer = Eagle3Layer(config)
        self.norm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(hidden, spec.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(spec.draft_vocab_size, dtype=torch.int64))
        self.register_buffer("t2d", torch.zeros(spec.vocab_size, dtype=torch.bool))
        self.rotary_emb = LlamaRotaryEmbedding(config)  # buffers only, not in the checkpoint

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> Eagle3Net:
        """.to(dtype) casts the parameters; RoPE's inverse frequencies stay float32 (as in
        transformers' own models) and d2t / t2d keep their integer and bool types."""
        rotary = self.rotary_emb
        kept = {name: getattr(rotary, name) for name in ("inv_freq", "original_inv_freq")}
        super()._apply(fn, recurse)  # type: ignore[no-untyped-call]  # torch leaves Module._apply unannotated
        for name, value in kept.items():
            setattr(rotary, name, value.to(getattr(rotary, name).device))
        return self

    def project(self, features: torch.Tensor) -> torch.Tensor:
        """The target's fused features (B, T, 3 * Ht) -> (B, T, H)."""
        return cast(torch.Tensor, self.fc(features.to(self.fc.weight.dtype)))

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                cache: ContextCache | None = None, valid: torch.Tensor | None = None,
                attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        cos, sin = self.rotary_emb(hidden, positions)
        return cast(torch.Tensor, self.midlayer(embeds.to(hidden.dtype), hidden, cos, sin, cache, valid, attn_mask))

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """out (B, T, H) -> lm_head(norm(out)) (B, T, N) over the draft vocabulary."""
        return cast(torch.Tensor, self.lm_head(self.norm(out)))
