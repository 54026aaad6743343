"""The exported graphs' contract: one declarative spec per graph, used alike by the exporter
(names, dynamic axes, sample inputs), the validation (dummy inputs, tolerance per dtype) and every
runtime (names, dtypes, TensorRT profile shapes).

Target step graph (L layers, H key/value heads of size D, V_head rows of the output head):
    input_ids                      (batch, seq_len)            int64
    attention_mask                 (batch, 1, seq_len, total_len)  dtype  additive: 0 where query i may
                                   attend key column j, the dtype's lowest value elsewhere (causal for a
                                   chain, ancestors for a draft tree); total_len = past_len + seq_len
 [  sliding_attention_mask         (batch, 1, seq_len, total_len)  dtype  the same for the model's
                                   sliding_attention layers (Qwen3, Gemma: `layer_types`), windows included]
    position_ids                   (batch, seq_len)            int64
    past_key_values.{i}.key|value  (batch, H, past_len, D)     dtype   i < L; past_len may be 0
 -> logits                         (batch, seq_len, V_head)    dtype
    present.{i}.key|value          (batch, H, total_len, D)    dtype
 [-> features                      (batch, seq_len, F)         dtype   exported beside a DFlash drafter:
                                   the hidden states of the layers it reads, concatenated]
Drafter denoiser graph (V_drafter rows, mask id included):
    input_ids (batch, seq_len) int64 [, sigma (batch,) float32] -> logits (batch, seq_len, V_drafter)
`sigma` exists only for time-conditioned drafters.
DFlash drafter step graph (L' draft layers, H' KV heads of size D'; S the block; the target's
embedding and head inside; the axes read as the target's, over context rows instead of tokens):
    block_ids                      (batch, S)                  int64   the anchor, then S - 1 mask ids
    start                          (batch,)                    int64   the anchor's position
    context                        (batch, seq_len, F)         dtype   features of the new context rows,
                                                                       positions start - seq_len .. start - 1
    context_mask                   (batch, total_len)          int64   0: a padding row (held or new)
    past_context.{i}.key|value     (batch, H', past_len, D')   dtype   the rows' K/V held so far
 -> logits                         (batch, S - 1, V_head)      dtype   positions start + 1 .. start + S - 1
    present_context.{i}.key|value  (batch, H', total_len, D')  dtype
EAGLE-3 drafter step graph (one layer of H' KV heads of size D', width Hd; F = 3 * the target's
width; N draft rows; its embedding (or its target's) inside; the axes read as the target's):
    input_ids                      (batch, seq_len)            int64   the token after each row
    features                       (batch, seq_len, F)         dtype   the target's fused features
    hidden                         (batch, seq_len, Hd)        dtype   the head's own previous output
    from_features                  (batch, seq_len)            int64   1: the row reads fc(features),
                                                                       0: hidden (a draft step)
    position_ids                   (batch, seq_len)            int64
    context_mask                   (batch, total_len)          int64   0: a padding row (held or new)
    past_key_values.0.key|value    (batch, H', past_len, D')   dtype   the head's K/V held so far
 -> logits                         (batch, 1, N)               dtype   of the last row, over the draft
                                                                       vocabulary (d2t maps them outside)
    last_hidden                    (batch, 1, Hd)              dtype   the last row's output (before the
                                                                       final norm): the next step's hidden
    present.0.key|value            (batch, H', total_len, D')  dtype
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from specdiff.errors import UsageError

TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16,
                "int64": torch.int64, "float32": torch.float32}
# |exported - torch| <= atol * max(1, max |torch|) + rtol * |torch|, elementwise, for graphs exported
# in each dtype: atol scales with the tensor's largest value, since rounding in a sum grows with its
# terms (SmolLM2's hidden states reach hundreds: fp32 graphs then differ by 1e-3 on logits near 0).
# fp32's atol 5e-4: on one random 7-token prefill of SmolLM2 (the tree case's), torch fp32 and ONNX
# Runtime fp32 each lie up to 4.6e-3 / 5.9e-3 from the fp64 logits (max |logit| 34), in opposite
# directions: 0.0105 = 3.1e-4 x 34 apart, both correct to fp32's own accuracy there.
TOLERANCE = {"fp32": (5e-4, 1e-4), "fp16": (3e-2, 1e-2), "bf16": (2e-1, 5e-2)}


@dataclass(frozen=True)
class TensorSpec:
    """One named graph input or output. dims: axis names (dynamic) or sizes (fixed).
    dtype: "int64", "float32" or "model" (the dtype the graph was exported in).
    fill: how a dummy value is made: ids, mask, causal (an additive 4-D causal mask), positions,
    normal or sigma."""

    name: str
    dims: tuple[Any, ...]
    dtype: str = "model"
    fill: str = "normal"

    def shape(self, sizes: dict[str, int]) -> tuple[int, ...]:
        return tuple(sizes[d] if isinstance(d, str) else d for d in self.dims)

    def to_json(self, dtype: str) -> dict[str, Any]:
        return {"name": self.name, "dims": list(self.dims), "dtype": dtype if self.dtype == "model" else self.dtype}


@dataclass(frozen=True)
class GraphSpec:
    kind: str  # target | drafter
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    id_range: int  # dummy token ids are drawn below this

    @property
    def input_names(self) -> list[str]:
        return [t.name for t in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [t.name for t in self.outputs]

    def dynamic_axes(self) -> dict[str, dict[int, str]]:
        """{input name: {axis index: axis name}} for the dynamic axes of every input."""
        return {t.name: {i: d for i, d in enumerate(t.dims) if isinstance(d, str)} for t in self.inputs}

    def shapes(self, sizes: dict[str, int]) -> dict[str, tuple[int, ...]]:
        """Input shapes for concrete axis sizes (see `axis_sizes`)."""
        return {t.name: t.shape(sizes) for t in self.inputs}

    def dummy_inputs(self, sizes: dict[str, int], dtype: str, generator: torch.Generator,
                     device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
        """Inputs of the given axis sizes: random ids below id_range, an all-ones 2-D mask, a causal
        additive 4-D one, positions past_len .. past_len + seq_len - 1, normal floats, sigma in [0, 3)."""
        return {t.name: _dummy(t, sizes, dtype, self.id_range, generator).to(device) for t in self.inputs}

    def to_json(self, dtype: str) -> dict[str, Any]:
        return {"inputs": [t.to_json(dtype) for t in self.inputs],
                "outputs": [t.to_json(dtype) for t in self.outputs]}


def _dummy(t: TensorSpec, sizes: dict[str, int], dtype: str, id_range: int,
           generator: torch.Generator) -> torch.Tensor:
    shape = t.shape(sizes)
    if t.fill == "ids":
        return torch.randint(0, id_range, shape, generator=generator)
    if t.fill == "mask":
        return torch.ones(shape, dtype=torch.int64)
    if t.fill == "causal":
        return additive_mask(causal(sizes["batch"], sizes["seq_len"], sizes["past_len"]), TORCH_DTYPES[dtype])
    if t.fill == "positions":
        start = sizes["past_len"]
        return torch.arange(start, start + shape[1]).expand(shape).contiguous()
    if t.fill == "start":  # the anchor follows every context row
        return torch.full(shape, sizes["total_len"])
    if t.fill == "sigma":
        return torch.rand(shape, generator=generator) * 3
    return torch.randn(shape, generator=generator).to(TORCH_DTYPES[dtype])


def axis_sizes(batch: int, seq_len: int, past_len: int = 0) -> dict[str, int]:
    """Concrete sizes of every named axis; total_len is derived so the mask always fits."""
    return {"batch": batch, "seq_len": seq_len, "past_len": past_len, "total_len": past_len + seq_len}


def causal(batch: int, seq_len: int, past_len: int) -> torch.Tensor:
    """(batch, seq_len, past_len + seq_len) bool: query i sees every column up to its own, past_len + i."""
    cols = torch.arange(past_len + seq_len)
    return (cols[None, :] <= past_len + torch.arange(seq_len)[:, None]).expand(batch, -1, -1)


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """allowed (B, S, T) bool -> the step graph's additive mask (B, 1, S, T): 0 where allowed, the
    dtype's lowest value elsewhere. Give every row something allowed: in fp16 the lowest value plus
    a negative score rounds to -inf, and a softmax over a row of -inf is NaN."""
    zeros = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return zeros.masked_fill(~allowed, torch.finfo(dtype).min)[:, None]


def check_step_inputs(inputs: dict[str, Any]) -> None:
    """A target step's attention_mask must span exactly past_len + seq_len positions."""
    mask, past = inputs.get("attention_mask"), inputs.get("past_key_values.0.key")
    if mask is not None and past is not None and mask.shape[-1] != past.shape[2] + inputs["input_ids"].shape[1]:
        raise UsageError(f"attention_mask covers {mask.shape[-1]} positions; past ({past.shape[2]}) + "
                         f"new ({inputs['input_ids'].shape[1]}) tokens make {past.shape[2] + inputs['input_ids'].shape[1]}")


def past_names(layers: int, prefix: str = "past_key_values") -> list[str]:
    return [f"{prefix}.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]


def present_names(layers: int, prefix: str = "present") -> list[str]:
    return [f"{prefix}.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]


def _kv(names: list[str], heads: int, length: str, head_dim: int) -> tuple[TensorSpec, ...]:
    return tuple(TensorSpec(n, ("batch", heads, length, head_dim)) for n in names)


MASKS = ("attention_mask", "sliding_attention_mask")  # a target step's masks: all layers', sliding layers'


def target_spec(layers: int, heads: int, head_dim: int, head_rows: int, features: int = 0,
                sliding: bool = False) -> GraphSpec:
    """features: F, the size of the `features` output (0: none); sliding: the model has
    sliding_attention layers (a second mask input)."""
    masks = tuple(TensorSpec(name, ("batch", 1, "seq_len", "total_len"), "model", "causal")
                  for name in MASKS[:1 + sliding])
    inputs = (TensorSpec("input_ids", ("batch", "seq_len"), "int64", "ids"), *masks,
              TensorSpec("position_ids", ("batch", "seq_len"), "int64", "positions"))
    outputs = (TensorSpec("logits", ("batch", "seq_len", head_rows)),
               *_kv(present_names(layers), heads, "total_len", head_dim))
    if features:
        outputs += (TensorSpec("features", ("batch", "seq_len", features)),)
    return GraphSpec("target", inputs + _kv(past_names(layers), heads, "past_len", head_dim), outputs,
                     id_range=head_rows)


def dflash_spec(layers: int, heads: int, head_dim: int, block_size: int, features: int, head_rows: int) -> GraphSpec:
    inputs = (TensorSpec("block_ids", ("batch", block_size), "int64", "ids"),
              TensorSpec("start", ("batch",), "int64", "start"),
              TensorSpec("context", ("batch", "seq_len", features)),
              TensorSpec("context_mask", ("batch", "total_len"), "int64", "mask"),
              *_kv(past_names(layers, "past_context"), heads, "past_len", head_dim))
    outputs = (TensorSpec("logits", ("batch", block_size - 1, head_rows)),
               *_kv(present_names(layers, "present_context"), heads, "total_len", head_dim))
    return GraphSpec("dflash", inputs, outputs, id_range=head_rows)


def eagle3_spec(heads: int, head_dim: int, hidden: int, features: int, head_rows: int, vocab_size: int) -> GraphSpec:
    """vocab_size: the target ids its input_ids take (dummy ids are drawn below it)."""
    rows = ("batch", "seq_len")
    inputs = (TensorSpec("input_ids", rows, "int64", "ids"), TensorSpec("features", (*rows, features)),
              TensorSpec("hidden", (*rows, hidden)), TensorSpec("from_features", rows, "int64", "mask"),
              TensorSpec("position_ids", rows, "int64", "positions"),
              TensorSpec("context_mask", ("batch", "total_len"), "int64", "mask"),
              *_kv(past_names(1), heads, "past_len", head_dim))
    outputs = (TensorSpec("logits", ("batch", 1, head_rows)), TensorSpec("last_hidden", ("batch", 1, hidden)),
               *_kv(present_names(1), heads, "total_len", head_dim))
    return GraphSpec("eagle3", inputs, outputs, id_range=vocab_size)


def drafter_spec(head_rows: int, time_conditioning: bool) -> GraphSpec:
    inputs: tuple[TensorSpec, ...] = (TensorSpec("input_ids", ("batch", "seq_len"), "int64", "ids"),)
    if time_conditioning:
        inputs += (TensorSpec("sigma", ("batch",), "float32", "sigma"),)
    return GraphSpec("drafter", inputs, (TensorSpec("logits", ("batch", "seq_len", head_rows)),), id_range=head_rows)


@dataclass(frozen=True)
class DrafterGraph:
    """The graph a drafter kind is exported as (specdiff.kinds, `graph`), as `specdiff export`, the
    manifest check and every runtime agree on it; how it is written is exporters.drafters'."""

    name: str  # what a drafter's manifest record names as its `kind` (none: "drafter")
    spec: Callable[[dict[str, Any]], GraphSpec]  # its IO, from its manifest `model` record
    record: dict[str, Any]  # that record's schema (artifacts' notation)
    sizes: tuple[str, ...]  # the record's fields that are sizes (integers >= 1)
    check: Callable[[dict[str, Any], str], None] = lambda record, where: None  # ValueError: a record it cannot serve
    target_axes: bool = False  # its axes are the target graph's (its context rows are the target's tokens)
    features: str = ""  # what reads the target graph's `features` output, as messages name it ("": none)


def graph_kind(kind: str, model: dict[str, Any]) -> str:
    """The graph a manifest component holds: "target", or the graph a drafter's kind declares
    (specdiff.kinds), which its record names as `kind` ("drafter", a denoiser, when it names none)."""
    return str(model.get("kind", "drafter")) if kind == "drafter" else kind


def spec_from_model(kind: str, model: dict[str, Any]) -> GraphSpec:
    """The spec of a component from its manifest `model` record (see exporters.onnx)."""
    from .kinds import drafter_graph  # the kinds declare their graphs with this module's specs

    graph = graph_kind(kind, model)
    if graph == "target":
        return target_spec(model["layers"], model["kv_heads"], model["head_dim"], model["head_rows"],
                           model.get("features", 0), "sliding_window" in model)
    return drafter_graph(graph).spec(model)


@dataclass(frozen=True)
class Limits:
    """Shapes an engine must serve. max_seq: tokens a sequence may reach (past + new);
    max_step: tokens fed in one call (a prefill chunk; gamma + 1 when verifying)."""

    max_batch: int
    max_seq: int
    max_step: int

    @classmethod
    def for_context(cls, context: int, max_batch: int = 1, max_seq: int | None = None,
                    max_step: int = 64) -> "Limits":
        """Limits whose largest profile shape (max_step new tokens on max_seq - 1 cached ones)
        stays inside the context window; max_seq defaults to the most that allows."""
        max_step = min(max_step, max(context // 2, 1))
        max_seq = max_seq if max_seq is not None else context - max_step + 1
        for name, value in (("max_batch", max_batch), ("max_seq", max_seq)):
            if value < 1:
                raise UsageError(f"`{name}` must be >= 1, got {value}")
        max_step = min(max_step, max_seq)
        if max_seq - 1 + max_step > context:
            raise UsageError(f"`max_seq` {max_seq} leaves no room for a {max_step}-token step in the "
                             f"{context}-token context window (at most {context - max_step + 1})")
        return cls(max_batch, max_seq, max_step)

    def target_triples(self) -> dict[str, dict[str, int]]:
        """min / opt / max axis sizes of the target graph, each from a (batch, seq, past) triple,
        so attention_mask's total_len is past_len + seq_len in every one of them."""
        return {"min": axis_sizes(1, 1, 0),
                "opt": axis_sizes(1, min(9, self.max_step), (self.max_seq - 1) // 2),
                "max": axis_sizes(self.max_batch, self.max_step, self.max_seq - 1)}

    def drafter_triples(self, context_length: int) -> dict[str, dict[str, int]]:
        """The drafter sees at most context_length tokens plus a draft of < max_step slots."""
        return {"min": axis_sizes(1, 1), "opt": axis_sizes(1, context_length + min(8, self.max_step)),
                "max": axis_sizes(self.max_batch, context_length + self.max_step)}

    def to_json(self) -> dict[str, Any]:
        return {"max_batch": self.max_batch, "max_seq": self.max_seq, "max_step": self.max_step}
