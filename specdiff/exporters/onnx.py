"""Graphs to ONNX: a target as a step function with explicit KV state (and, beside a DFlash or
EAGLE-3 drafter, the hidden states that drafter reads), a diffusion drafter as a denoiser, a DFlash
drafter as a step function over its context K/V, an EAGLE-3 head as a step over its own K/V (the IO contract is specdiff/graphs.py).

Recipe (docs/export-onnx-tensorrt.md): only plain tensors cross the graph boundary;
inside, the 2L past tensors become a DynamicCache again (transformers 5 has no tuple caches) and
the presents are read back from it. A target step takes its attention as additive 4-D masks, which
the model uses as given: one graph verifies chains and draft trees (runtimes.models builds them).
torch.onnx.export with dynamo=True, traced with every dynamic axis >= 2 (a size-1 sample
specialises sdpa's causal flag), weights as external data. Prefill uses the same graph with
past_len = 0, so the graph has no If / Loop nodes.
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from pathlib import Path
from typing import Any, Iterator, Union

import torch
from torch import nn
from transformers import DynamicCache

from specdiff.drafters.dflash import KIND, DFlashDrafter, block_positions
from specdiff.drafters.diffusion import DiffusionDrafter
from specdiff.drafters.eagle3 import KIND as EAGLE3, Eagle3Drafter
from specdiff.errors import UsageError
from specdiff.graphs import (MASKS, GraphSpec, TensorSpec, axis_sizes, dflash_spec, drafter_spec, eagle3_spec,
                             target_spec)
from specdiff.hf_cache import returned_cache, with_cache
from specdiff.nets.dflash import ContextCache
from specdiff.targets.block import BlockDiffusionTarget
from specdiff.targets.causal import CausalLMTarget
from specdiff.vocab import VOCAB_FILE

ONNX_TYPES = {"fp32": 1, "float32": 1, "fp16": 10, "bf16": 16, "int64": 7}  # TensorProto element types
TRACE_SIZES = axis_sizes(batch=2, seq_len=3, past_len=4)


class TargetStep(nn.Module):
    """forward(input_ids (B, S), masks [(B, 1, S, P+S) additive, 1 or 2], position_ids (B, S),
    past [2L x (B, H, P, D)]) -> (logits (B, S, V_head), present k0, v0, k1, ... each (B, H, P+S, D)
    [, features (B, S, F)]). masks: attention_mask, then for a model with sliding_attention layers
    sliding_attention_mask (HF takes 4-D masks as given, a dict of them per layer kind).
    layers: the HF hidden_states indices whose concatenation is `features` (none: no such output)."""

    def __init__(self, model: Any, layers: tuple[int, ...] = ()):
        super().__init__()
        self.model = model
        self.layers = layers

    @staticmethod
    def pack(spec: GraphSpec, values: dict[str, Any]) -> tuple[Any, ...]:
        """{input name: value} -> the positional arguments of forward."""
        names = spec.input_names
        masks = [values[n] for n in MASKS if n in names]
        past = names[2 + len(masks):]
        return (values[names[0]], masks, values[names[1 + len(masks)]], [values[n] for n in past])

    def forward(self, input_ids: torch.Tensor, masks: list[torch.Tensor], position_ids: torch.Tensor,
                past: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        cache = DynamicCache()  # full layers: the masks, not the cache, enforce any attention window
        for i in range(0, len(past), 2):
            cache.update(past[i], past[i + 1], i // 2)
        hidden = {"output_hidden_states": True} if self.layers else {}
        mask: Any = masks[0] if len(masks) == 1 else {"full_attention": masks[0], "sliding_attention": masks[1]}
        out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids,
                         use_cache=True, **with_cache(self.model, cache), **hidden)
        present = [t for layer in returned_cache(out).layers for t in (layer.keys, layer.values)]
        features = [torch.cat([out.hidden_states[i] for i in self.layers], dim=-1)] if self.layers else []
        return (out.logits, *present, *features)


class Denoiser(nn.Module):
    """forward(input_ids (B, L) [, sigma (B,)]) -> (raw logits (B, L, V_drafter),); sigma is an
    input only for a time-conditioned drafter (the others ignore it)."""

    def __init__(self, drafter: DiffusionDrafter):
        super().__init__()
        self.drafter = drafter
        drafter.head()  # a draft vocabulary's rows gathered here, not inside the traced graph

    @staticmethod
    def pack(spec: GraphSpec, values: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(values[n] for n in spec.input_names)

    def forward(self, input_ids: torch.Tensor, sigma: torch.Tensor | None = None) -> tuple[torch.Tensor]:
        if sigma is None:
            sigma = torch.zeros(input_ids.shape[0], device=input_ids.device)
        return (self.drafter(input_ids, sigma),)


class DFlashStep(nn.Module):
    """forward(block_ids (B, S), start (B,), context (B, C, F), context_mask (B, P+C), past
    [2L' x (B, H', P, D')]) -> (logits (B, S - 1, V_head), present k0, v0, ... each (B, H', P+C, D')):
    DFlashDrafter.forward over a ContextCache holding `past`, the target's embedding and head
    inside."""

    def __init__(self, drafter: DFlashDrafter):
        super().__init__()
        self.drafter = drafter
        self.embed, self.head = drafter.bound()  # registered here, so that the graph holds them

    @staticmethod
    def pack(spec: GraphSpec, values: dict[str, Any]) -> tuple[Any, ...]:
        names = spec.input_names
        return (*(values[n] for n in names[:4]), [values[n] for n in names[4:]])

    def forward(self, block_ids: torch.Tensor, start: torch.Tensor, context: torch.Tensor,
                context_mask: torch.Tensor, past: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        cache, held = ContextCache(), past[0].shape[2]
        cache.kv = [(past[i], past[i + 1]) for i in range(0, len(past), 2)]
        cache.valid = context_mask[:, :held].bool()
        positions = block_positions(start, context.shape[1], block_ids.shape[1])
        hidden = self.drafter.hidden(block_ids, context, positions, cache, context_mask[:, held:].bool())
        logits = self.drafter.score(hidden[:, 1:]).to(context.dtype)  # the graph's dtype, as the target's
        return (logits, *[t for kv in cache.kv for t in kv])


class Eagle3Step(nn.Module):
    """forward(input_ids (B, S), features (B, S, F), hidden (B, S, Hd), from_features (B, S),
    position_ids (B, S), context_mask (B, P+S), past [k, v (B, H', P, D')]) -> (logits (B, 1, N),
    last_hidden (B, 1, Hd), present k, v (B, H', P+S, D')): Eagle3Net over a ContextCache holding
    `past`, each row reading fc(features) or hidden (a select, no If node); logits and output of
    the last row only (a context call's earlier rows feed the cache, not the head)."""

    def __init__(self, drafter: Eagle3Drafter):
        super().__init__()
        self.net = drafter.net
        self.embed = drafter.embedding()  # registered here, so that the graph holds it (its target's too)

    @staticmethod
    def pack(spec: GraphSpec, values: dict[str, Any]) -> tuple[Any, ...]:
        names = spec.input_names
        return (*(values[n] for n in names[:6]), [values[n] for n in names[6:]])

    def forward(self, input_ids: torch.Tensor, features: torch.Tensor, hidden: torch.Tensor,
                from_features: torch.Tensor, position_ids: torch.Tensor, context_mask: torch.Tensor,
                past: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        cache, held = ContextCache(), past[0].shape[2]
        cache.kv, cache.valid = [(past[0], past[1])], context_mask[:, :held].bool()
        rows = torch.where(from_features.bool()[..., None], self.net.project(features), hidden)  # (B, S, Hd)
        out = self.net(self.embed(input_ids), rows, position_ids, cache, context_mask[:, held:].bool())[:, -1:]
        return (self.net.logits(out), out, *cache.kv[0])


Graph = Union[TargetStep, Denoiser, DFlashStep, Eagle3Step]  # a module to export: forward(*pack(spec, {input name: value}))


@torch.no_grad()
def probe_kv(model: Any) -> tuple[int, int, int]:
    """(layers, KV heads, head dim) read from one real forward pass, whatever the architecture."""
    ids = torch.zeros(1, 2, dtype=torch.long, device=model.device)
    layers = returned_cache(model(input_ids=ids, use_cache=True, **with_cache(model, DynamicCache()))).layers
    return len(layers), layers[0].keys.shape[1], layers[0].keys.shape[3]


def target_graph(target: CausalLMTarget | BlockDiffusionTarget,
                 feature_layers: tuple[int, ...] = ()) -> tuple[TargetStep, GraphSpec, dict[str, Any]]:
    """A specdiff.contracts.Target -> (module to export, its spec, the manifest `model` record);
    feature_layers: HF hidden_states indices the graph also outputs (a DFlash drafter's)."""
    model = target.model.eval()
    layers, heads, head_dim = probe_kv(model)
    head_rows = model.get_output_embeddings().weight.shape[0]
    record = {"name": target.name, "model_type": model.config.model_type,
              "attn_implementation": model.config._attn_implementation, "vocab_size": target.vocab_size,
              "head_rows": head_rows, "max_length": target.max_length, "eos_token_id": target.eos_token_id,
              "layers": layers, "kv_heads": heads, "head_dim": head_dim}
    features = len(feature_layers) * model.get_input_embeddings().weight.shape[1]
    if feature_layers:
        record.update(feature_layers=list(feature_layers), features=features)
    kinds = set(getattr(model.config, "layer_types", None) or ["full_attention"])
    if kinds - {"full_attention", "sliding_attention"}:
        raise UsageError(f"{target.name}: its {sorted(kinds - {'full_attention', 'sliding_attention'})} layers take "
                         "masks the target graph does not carry; run it with the torch runtime")
    why = target.can_tree() if isinstance(target, CausalLMTarget) else "a block-diffusion target verifies chains"
    if why is not None:
        record["no_trees"] = why  # GraphTarget.can_tree
    sliding = "sliding_attention" in kinds
    if sliding:
        record["sliding_window"] = model.config.sliding_window  # the graph's second mask input
    spec = target_spec(layers, heads, head_dim, head_rows, features, sliding)
    return TargetStep(model, feature_layers), spec, record


def dflash_graph(drafter: DFlashDrafter, vocab_size: int) -> tuple[DFlashStep, GraphSpec, dict[str, Any]]:
    """A DFlash drafter bound to its target (whose real vocabulary is `vocab_size` tokens) ->
    (module to export, its spec, the manifest `model` record). With a draft vocabulary the graph's
    logits are its N rows and the record names the map's file (written beside the graph)."""
    cfg = drafter.net.config
    layers, heads, head_dim = cfg.num_hidden_layers, cfg.num_key_value_heads or cfg.num_attention_heads, cfg.head_dim
    features = len(drafter.target_layer_ids) * drafter.hidden_size
    record = {"kind": KIND, "name": drafter.source, "vocab_size": vocab_size, "mask_id": drafter.mask_id,
              "block_size": drafter.block_size, "target_layer_ids": drafter.target_layer_ids,
              "num_target_layers": drafter.num_target_layers, "head_rows": drafter.head_rows, "layers": layers,
              "kv_heads": heads, "head_dim": head_dim, "features": features, "defaults": drafter.defaults}
    if drafter.draft_vocab is not None:  # the graph's head is its N rows; the map goes beside the graph
        record.update(draft_vocab=VOCAB_FILE, vocab_rows=drafter.vocab_rows)  # the embedding's rows stay all
    spec = dflash_spec(layers, heads, head_dim, drafter.block_size, features, drafter.head_rows)
    return DFlashStep(drafter.eval()), spec, record


def eagle3_graph(drafter: Eagle3Drafter) -> tuple[Eagle3Step, GraphSpec, dict[str, Any]]:
    """An EAGLE-3 drafter bound to its target -> (module to export, its spec, the manifest `model`
    record). With a draft vocabulary (d2t) the record names the map's file, written beside the graph."""
    attention, layers = drafter.net.midlayer.self_attn, drafter.layer_ids
    assert layers is not None, "pairing fixes the layers an EAGLE-3 drafter reads"
    features, rows = 3 * drafter.target_hidden_size, drafter.net.spec.draft_vocab_size
    embedding = drafter.embedding().weight  # (V', Hd): the ids it takes
    assert isinstance(embedding, torch.Tensor)
    record = {"kind": EAGLE3, "name": drafter.source, "vocab_size": drafter.target_vocab_size, "head_rows": rows,
              "target_layer_ids": list(layers), "hidden_size": drafter.hidden_size, "layers": 1,
              "vocab_rows": embedding.shape[0],
              "kv_heads": attention.kv_heads, "head_dim": attention.head_dim, "features": features}
    if drafter.draft_vocab is not None:
        record["draft_vocab"] = VOCAB_FILE
    spec = eagle3_spec(attention.kv_heads, attention.head_dim, drafter.hidden_size, features, rows,
                       drafter.target_vocab_size)
    return Eagle3Step(drafter.eval()), spec, record


def drafter_graph(drafter: DiffusionDrafter) -> tuple[Denoiser, GraphSpec, dict[str, Any]]:
    """A DiffusionDrafter -> (module to export, its spec, the manifest `model` record)."""
    cfg = drafter.config
    record = {"name": drafter.source, "vocab_size": drafter.vocab_size, "mask_id": drafter.mask_id,
              "context_length": drafter.context_length, "parameterization": drafter.parameterization,
              "time_conditioning": cfg.time_conditioning, "defaults": drafter.defaults, "head_rows": cfg.vocab_size,
              "untrained": drafter.untrained,
              "backbone": cfg.to_dict()}
    rows = cfg.vocab_size
    if drafter.draft_vocab is not None:  # the graph's head is the map's N rows; the map goes beside the graph
        rows = record["head_rows"] = drafter.draft_vocab.size
        record.update(draft_vocab=VOCAB_FILE, vocab_rows=cfg.vocab_size)
    return Denoiser(drafter.eval()), drafter_spec(rows, cfg.time_conditioning), record


@contextlib.contextmanager
def quiet_exporter() -> Iterator[None]:
    """The exporter prints progress on stdout and warns about optional packages it does not need:
    stdout carries results only, so both are dropped (a failure still raises with its detail)."""
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


@torch.no_grad()
def export_graph(module: Graph, spec: GraphSpec, dtype: str, path: Path, opset: int) -> None:
    """Trace `module` on sample inputs of TRACE_SIZES and write path (+ path.data)."""
    device = next(module.parameters()).device
    sample = spec.dummy_inputs(TRACE_SIZES, dtype, torch.Generator().manual_seed(0), device)
    axes = spec.dynamic_axes()
    with quiet_exporter():
        torch.onnx.export(module, module.pack(spec, sample), str(path), input_names=spec.input_names,
                          output_names=spec.output_names, dynamic_shapes=module.pack(spec, axes),
                          dynamo=True, opset_version=opset, external_data=True, verbose=False)


def check_graph(path: Path, spec: GraphSpec, dtype: str) -> list[str]:
    """Every way the written graph's inputs and outputs differ from the spec: names, order,
    element types, fixed sizes, dynamic axes (input axes by name; output axes symbolic)."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    problems = []
    for where, found, wanted in (("input", graph.input, spec.inputs), ("output", graph.output, spec.outputs)):
        if [v.name for v in found] != [t.name for t in wanted]:
            problems.append(f"{where} names {[v.name for v in found]} != {[t.name for t in wanted]}")
            continue
        for v, t in zip(found, wanted):
            problems += _check_value(v, t, dtype, exact_axes=where == "input")
    return problems


def _check_value(v: Any, t: TensorSpec, dtype: str, exact_axes: bool) -> list[str]:
    """The problems of one onnx ValueInfoProto `v` against its spec `t`."""
    elem = ONNX_TYPES[dtype if t.dtype == "model" else t.dtype]
    dims = [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
    problems = [] if v.type.tensor_type.elem_type == elem else [f"{t.name}: element type {v.type.tensor_type.elem_type} != {elem}"]
    if len(dims) != len(t.dims):
        return problems + [f"{t.name}: rank {len(dims)} != {len(t.dims)}"]
    for got, want in zip(dims, t.dims):
        ok = got == want if (exact_axes or isinstance(want, int)) else isinstance(got, str) and got != ""
        if not ok:
            problems.append(f"{t.name}: dims {dims} != {list(t.dims)}")
            break
    return problems

