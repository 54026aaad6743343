"""Models over exported graphs, whatever runtime executes them.

GraphTarget implements the specdiff.contracts.TreeTarget contract over a target step graph; its KV
cache is 2L explicit tensors (B, H, P, D) fed back as the next call's past, kept per row by
specdiff.targets.trees.TreeRows. The graphs take additive 4-D masks (graphs.MASKS) and position ids:
a chain's mask is causal over the row's columns, a draft tree's lets each node see its ancestors. A
re-aligned cache is a fresh contiguous tensor; a sliced one is copied by the runtime before it is
bound by pointer. A runtime's `limits` cap the rows of a batch (`max_rows`). A target graph
exported beside a DFlash drafter also outputs the hidden states that drafter reads: GraphTarget
captures them (capture / features) as CausalLMTarget does.
GraphDFlashDrafter is DFlashDrafter's drafting call over a DFlash step graph: the drafter's
context K/V (nets.dflash.ContextCache) are fed back as past_context. GraphEagle3Drafter is
Eagle3Drafter's extend / step / logits over an EAGLE-3 step graph, its own K/V (a ContextCache)
fed back as past_key_values. Both stand on StepGraph (the runtime, the record, the draft vocabulary).
GraphDrafter exposes what DiffusionProposer and plan use of a DiffusionDrafter (x0_logits,
mask_id, vocab_size, context_length, tokenizer, the recorded draft `defaults`) over a denoiser
graph; the noise level and the parameterisation are computed in Python by the PyTorch drafter's
own chain (specdiff.drafters.diffusion.x0_logits_from). The graph has no padding mask: rows with
the same padding run together, unpadded.
"""

from __future__ import annotations

from typing import Any, TypeVar

import torch

from specdiff.artifacts import Artifacts
from specdiff.contracts import Runtime
from specdiff.errors import LoadError
from specdiff.drafters.dflash import KIND, draft_block
from specdiff.drafters.diffusion import x0_logits_from
from specdiff.drafters.eagle3 import KIND as EAGLE3
from specdiff.nets.dflash import ContextCache
from specdiff.targets.trees import TreeRows
from specdiff.vocab import DraftVocab, load_draft_vocab

from specdiff.graphs import MASKS, TORCH_DTYPES, additive_mask, past_names, present_names


class GraphTarget(TreeRows):
    """A causal LM step graph as a Target. model: the manifest's `model` record of the target."""

    def __init__(self, runtime: Runtime, model: dict[str, Any], tokenizer: Any, device: torch.device | str, *,
                 dtype: str, max_length: int | None = None, max_step: int | None = None, max_rows: int | None = None):
        super().__init__()
        self.runtime = runtime
        self.tokenizer = tokenizer
        self.name = model["name"]
        self.vocab_size = model["vocab_size"]
        self.max_length = max_length or model["max_length"]
        self.max_step = max_step  # most tokens per graph call (None: any)
        self.max_rows = max_rows  # most rows per graph call (None: any)
        self.eos_token_id = model["eos_token_id"]
        self._device = torch.device(device)
        self._heads, self._head_dim = model["kv_heads"], model["head_dim"]
        self._kv_dtype = self.dtype = TORCH_DTYPES[dtype]  # the graph's arithmetic (its logits are float32)
        self._past_names, self._present_names = past_names(model["layers"]), present_names(model["layers"])
        self.feature_layers = tuple(model.get("feature_layers", ()))  # HF hidden_states indices it outputs
        self._window: int | None = model.get("sliding_window")  # its sliding_attention layers' (None: none)
        self._no_trees: str | None = model.get("no_trees")

    @classmethod
    def from_artifacts(cls, art: Artifacts, runtime: Runtime, device: torch.device | str) -> "GraphTarget":
        model, limits = art.record("target")["model"], runtime.limits
        max_length = min(model["max_length"], limits.max_seq) if limits else None
        return cls(runtime, model, art.tokenizer, device, dtype=art.manifest["dtype"], max_length=max_length,
                   max_step=limits.max_step if limits else None, max_rows=limits.max_batch if limits else None)

    @property
    def device(self) -> torch.device:
        return self._device

    def can_capture(self, layers: tuple[int, ...]) -> str | None:
        if tuple(layers) == self.feature_layers:
            return None
        have = f"outputs the hidden states {list(self.feature_layers)}" if self.feature_layers else \
            "outputs no hidden states"
        return (f"the exported target '{self.name}' {have}; the drafter reads {list(layers)}: export the target "
                "together with this drafter")

    def can_tree(self) -> str | None:
        """None unless the export recorded why the model cannot verify trees (its windows count
        columns: GPT-Neo's local layers)."""
        return self._no_trees

    def _run(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor,
             kv: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """A chain: mask (B, C + S) 0/1 -> query i (column C + i) sees the row's columns up to its
        own, and itself (a padding query too: no row of the mask is empty); windows over columns,
        which are positions in a row's contiguous cache."""
        B, S = ids.shape
        C = mask.shape[1] - S
        cols, at = torch.arange(C + S, device=self.device), C + torch.arange(S, device=self.device)
        allowed = (cols <= at[:, None]) & mask.to(self.device, torch.bool)[:, None] | (cols == at[:, None])
        return self._step(ids, allowed, positions, at.expand(B, S), cols.expand(B, C + S), kv)

    def _tree_run(self, ids: torch.Tensor, allowed: torch.Tensor, positions: torch.Tensor,
                  key_positions: torch.Tensor, kv: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        return self._step(ids, allowed, positions, positions, key_positions, kv)

    def _step(self, ids: torch.Tensor, allowed: torch.Tensor, positions: torch.Tensor, query_at: torch.Tensor,
              key_at: torch.Tensor, kv: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """ids (B, S), allowed (B, S, C + S) bool, query_at (B, S) and key_at (B, C + S) what the
        sliding_attention layers' windows count (q - k < window: HF's) -> logits (B, S, V), float32,
        and the new past (with the captured features, when capturing); fed in chunks of at most
        max_step tokens, chunk j..k with the mask's rows j..k and columns ..C + k (no query sees a
        later column: a tree's parents precede their children)."""
        B, S = ids.shape
        kv, held = self.split_features(kv)
        if not kv:
            kv = [torch.zeros(B, self._heads, 0, self._head_dim, dtype=self._kv_dtype,
                              device=self.device)] * len(self._past_names)  # (B, H, 0, D)
        masks = [allowed]
        if self._window is not None:
            masks.append(allowed & (query_at[:, :, None] - key_at[:, None, :] < self._window))
        C, step = kv[0].shape[2], self.max_step or S
        logits: list[torch.Tensor] = []
        features: list[torch.Tensor] = []  # (B, k - j, F) per chunk, when capturing
        for j in range(0, S, step):
            k = min(j + step, S)
            feeds = {"input_ids": ids[:, j:k], "position_ids": positions[:, j:k], **dict(zip(self._past_names, kv)),
                     **{name: additive_mask(m[:, j:k, :C + k], self.dtype) for name, m in zip(MASKS, masks)}}
            out = self.runtime.run(feeds)
            kv = [out[name] for name in self._present_names]  # each (B, H, C + k, D)
            logits.append(out["logits"][..., : self.vocab_size].float())
            if self.captured:
                features.append(out["features"])
        if self.captured:
            kv = self.with_features(kv, held, torch.cat(features, dim=1))
        return torch.cat(logits, dim=1), kv

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def exported_vocab(art: Artifacts, model: dict[str, Any]) -> DraftVocab | None:
    """The draft vocabulary a drafter's record names (its file beside the graphs), None when none."""
    if not model.get("draft_vocab"):
        return None
    vocab = load_draft_vocab(art.root)  # VOCAB_FILE, as `specdiff export` writes it
    if vocab is None or vocab.size != model["head_rows"]:
        raise LoadError(f"{art.root}: the drafter's draft vocabulary {model['draft_vocab']} is missing or not "
                        f"of the graph's {model['head_rows']} rows")
    return vocab


class GraphDrafter:
    """A diffusion denoiser graph with the drafting interface of DiffusionDrafter.
    model: the manifest's `model` record of the drafter."""

    def __init__(self, runtime: Runtime, model: dict[str, Any], tokenizer: Any, device: torch.device | str,
                 draft_vocab: DraftVocab | None = None):
        self.runtime = runtime
        self.draft_vocab = draft_vocab  # the graph's logits are its N rows (specdiff.vocab)
        self.tokenizer = tokenizer
        self.source = model["name"]
        self.vocab_size = model["vocab_size"]
        self.mask_id = model["mask_id"]
        self.context_length = model["context_length"]
        self.parameterization = model["parameterization"]
        self.time_conditioning = model["time_conditioning"]
        self.defaults = model.get("defaults", {})  # recorded draft settings (absent before they were exported)
        self.untrained = model.get("untrained", False)  # `drafter init`'s random weights (absent: trained)
        self.device = torch.device(device)

    @classmethod
    def from_artifacts(cls, art: Artifacts, runtime: Runtime, device: torch.device | str) -> "GraphDrafter":
        model = art.record("drafter")["model"]
        return cls(runtime, model, art.tokenizer, device, draft_vocab=exported_vocab(art, model))

    def x0_logits(self, input_ids: torch.Tensor, last: int | None = None,
                  pad: torch.Tensor | None = None, widen: bool = True) -> torch.Tensor:
        """(B, L) ids with mask slots (after pad[b] padding positions in row b) -> logits of x0
        over the real vocabulary at the last `last` positions (B, last, V) (default: all L),
        fp32 (the graph computes all L); widen=False: a draft vocabulary's N rows, as
        DiffusionDrafter.x0_logits."""
        if pad is not None and bool(pad.any()):  # no mask in the graph: rows of each padding unpadded
            groups = {n: (pad == n).nonzero()[:, 0] for n in pad.unique().tolist()}
            parts = {n: self.x0_logits(input_ids[rows, n:], last, widen=widen) for n, rows in groups.items()}
            first = next(iter(parts.values()))
            out = first.new_empty(len(pad), *first.shape[1:])  # (B, last, V)
            for n, rows in groups.items():
                out[rows.to(out.device)] = parts[n]
            return out

        def network(ids: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:  # the graph computes all L
            feeds = {"input_ids": ids, **({"sigma": sigma} if self.time_conditioning else {})}
            return self.runtime.run(feeds)["logits"][:, -(last or 0):]  # (B, last, V_drafter)
        return x0_logits_from(network, input_ids, self.parameterization, self.mask_id, self.vocab_size, last,
                              vocab=self.draft_vocab, widen=widen)


StepGraphT = TypeVar("StepGraphT", bound="StepGraph")


class StepGraph:
    """What a drafter step graph over its own K/V stands on (DFlash's, EAGLE-3's): its runtime, the
    manifest's `model` record's names and sizes, its draft vocabulary (the graph's logits are its
    N rows: specdiff.vocab), the most context rows a call may feed (the runtime's limits)."""

    def __init__(self, runtime: Runtime, model: dict[str, Any], tokenizer: Any, device: torch.device | str, *,
                 dtype: str, draft_vocab: DraftVocab | None = None):
        self.runtime = runtime
        self.draft_vocab = draft_vocab
        self.tokenizer = tokenizer
        self.source = model["name"]
        self.vocab_size, self.vocab_rows = model["vocab_size"], model["head_rows"]
        self.device = torch.device(device)
        self.max_step = runtime.limits.max_step if runtime.limits else None  # most context rows per call
        self._kv_shape = (model["kv_heads"], 0, model["head_dim"])
        self._dtype = TORCH_DTYPES[dtype]

    @classmethod
    def from_artifacts(cls: type[StepGraphT], art: Artifacts, runtime: Runtime,
                       device: torch.device | str) -> StepGraphT:
        model = art.record("drafter")["model"]
        return cls(runtime, model, art.tokenizer, device, dtype=art.manifest["dtype"],
                   draft_vocab=exported_vocab(art, model))


class GraphDFlashDrafter(StepGraph):
    """A DFlash step graph with the drafting call of DFlashDrafter (methods.dflash uses it).
    model: the manifest's `model` record of the drafter."""

    kind = KIND

    def __init__(self, runtime: Runtime, model: dict[str, Any], tokenizer: Any, device: torch.device | str, *,
                 dtype: str, draft_vocab: DraftVocab | None = None):
        super().__init__(runtime, model, tokenizer, device, dtype=dtype, draft_vocab=draft_vocab)
        self.mask_id, self.block_size = model["mask_id"], model["block_size"]
        self.target_layer_ids = list(model["target_layer_ids"])
        self.num_target_layers = model.get("num_target_layers")
        self.defaults = model.get("defaults", {})
        layers = model["layers"]
        self._past_names = past_names(layers, "past_context")
        self._present_names = present_names(layers, "present_context")

    @torch.no_grad()
    def __call__(self, anchor: torch.Tensor, context: torch.Tensor, start: torch.Tensor, cache: ContextCache,
                 context_valid: torch.Tensor | None = None, slots: int | None = None) -> torch.Tensor:
        """As DFlashDrafter.forward with a cache: anchor (B,), context (B, C, F) the features of the
        rows not yet in `cache` (left-padded; context_valid (B, C), None: all real), start (B,) ->
        logits (B, slots or S - 1, head_rows) float32. The context goes in chunks of at most
        max_step rows, each call over the K/V the last one returned (only the last one's logits
        are kept); `cache` then holds every row's K/V."""
        B, n = anchor.shape[0], context.shape[1]
        block = draft_block(anchor.to(self.device), self.mask_id, self.block_size)
        held = torch.ones(B, cache.length, dtype=torch.bool) if cache.valid is None else cache.valid
        new = torch.ones(B, n, dtype=torch.bool) if context_valid is None else context_valid
        held, new = held.to(self.device), new.to(self.device)
        past = [t for kv in cache.kv for t in kv] or \
            [torch.zeros(B, *self._kv_shape, dtype=self._dtype, device=self.device)] * len(self._past_names)
        step = self.max_step or max(n, 1)
        for j in range(0, max(n, 1), step):
            k = min(j + step, n)
            mask = torch.cat([held, new[:, :k]], dim=1)  # (B, held + k)
            feeds = {"block_ids": block, "start": start.to(self.device) - n + k, "context_mask": mask.long(),
                     "context": context[:, j:k].to(self.device, self._dtype), **dict(zip(self._past_names, past))}
            out = self.runtime.run(feeds)
            past = [out[name] for name in self._present_names]  # each (B, H', held + k, D')
        cache.kv = list(zip(past[::2], past[1::2]))
        cache.valid = None if bool(mask.all()) else mask
        return out["logits"][:, :slots or self.block_size - 1].float()


class GraphEagle3Drafter(StepGraph):
    """An EAGLE-3 step graph with the drafting calls of Eagle3Drafter (extend, step, logits: what
    methods.eagle3 uses). model: the manifest's `model` record of the drafter. The graph computes
    the last row's logits with its output: logits(out) hands back those of the call that returned
    `out` (or a slice of it), and refuses any other tensor."""

    kind = EAGLE3
    bound = True  # paired at export: its layers, its embedding and its draft vocabulary are the graph's

    def __init__(self, runtime: Runtime, model: dict[str, Any], tokenizer: Any, device: torch.device | str, *,
                 dtype: str, draft_vocab: DraftVocab | None = None):
        super().__init__(runtime, model, tokenizer, device, dtype=dtype, draft_vocab=draft_vocab)
        self.layer_ids = tuple(model["target_layer_ids"])
        self._widths = (model["features"], model["hidden_size"])
        self._last: tuple[torch.Tensor, torch.Tensor] | None = None  # (last_hidden, logits) of the last call

    def new_cache(self) -> ContextCache:
        return ContextCache()

    @torch.no_grad()
    def extend(self, tokens: torch.Tensor, features: torch.Tensor, positions: torch.Tensor,
               cache: ContextCache, valid: torch.Tensor | None = None) -> torch.Tensor:
        """As Eagle3Drafter.extend: context rows tokens (B, C), features (B, C, F), positions
        (B, C), valid (B, C) or None -> the last row's output (B, 1, Hd); in chunks of at most
        max_step rows, each over the K/V the last one returned."""
        B, n = tokens.shape
        hidden = torch.zeros(B, n, self._widths[1], dtype=self._dtype, device=self.device)
        out = self._nothing(B)
        step = self.max_step or max(n, 1)
        for j in range(0, n, step):
            k = min(j + step, n)
            out = self._run(tokens[:, j:k], features[:, j:k], hidden[:, j:k], True, positions[:, j:k], cache,
                            None if valid is None else valid[:, j:k])
        return out

    @torch.no_grad()
    def step(self, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
             cache: ContextCache) -> torch.Tensor:
        """As Eagle3Drafter.step: draft rows tokens (B, T), hidden (B, T, Hd), positions -> (B, 1, Hd)."""
        B, n = tokens.shape
        features = torch.zeros(B, n, self._widths[0], dtype=self._dtype, device=self.device)
        return self._run(tokens, features, hidden, False, positions, cache, None) if n else self._nothing(B)

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """The last call's logits (B, 1, N) float32, when `out` is (a slice of) its output."""
        if self._last is None or out.data_ptr() != self._last[0].data_ptr() or out.shape != self._last[0].shape:
            raise RuntimeError("GraphEagle3Drafter.logits: its graph scores the output of the last call only")
        return self._last[1].float()

    def _nothing(self, B: int) -> torch.Tensor:
        """No rows fed (gamma auto times drafts of rows already read): no call, an empty output
        (B, 0, Hd) with empty logits, as the torch head returns."""
        self._last = (torch.zeros(B, 0, self._widths[1], dtype=self._dtype, device=self.device),
                      torch.zeros(B, 0, self.vocab_rows, device=self.device))
        return self._last[0]

    def _run(self, tokens: torch.Tensor, features: torch.Tensor, hidden: torch.Tensor, from_features: bool,
             positions: torch.Tensor, cache: ContextCache, valid: torch.Tensor | None) -> torch.Tensor:
        """One graph call over `cache` (extended in place) -> last_hidden (B, 1, Hd)."""
        B, n = tokens.shape
        held = torch.ones(B, cache.length, dtype=torch.bool) if cache.valid is None else cache.valid
        new = torch.ones(B, n, dtype=torch.bool) if valid is None else valid
        mask = torch.cat([held.to(self.device), new.to(self.device)], dim=1)  # (B, held + n)
        past = [t for kv in cache.kv for t in kv] or [torch.zeros(B, *self._kv_shape, dtype=self._dtype,
                                                                  device=self.device)] * 2
        out = self.runtime.run({
            "input_ids": tokens.to(self.device), "features": features.to(self.device, self._dtype),
            "hidden": hidden.to(self.device, self._dtype),
            "from_features": torch.full((B, n), int(from_features), dtype=torch.long, device=self.device),
            "position_ids": positions.to(self.device), "context_mask": mask.long(), **dict(zip(past_names(1), past))})
        cache.kv = [(out["present.0.key"], out["present.0.value"])]  # each (B, H', held + n, D')
        cache.valid = None if bool(mask.all()) else mask
        self._last = (out["last_hidden"], out["logits"])
        return out["last_hidden"]


# graph name -> the model over it; tests/test_kinds.py holds the drafter graphs equal to the kinds' graphs
GRAPHS: dict[str, type[GraphTarget] | type[GraphDrafter] | type[GraphDFlashDrafter] | type[GraphEagle3Drafter]] = {
    "target": GraphTarget, "drafter": GraphDrafter, "dflash": GraphDFlashDrafter, "eagle3": GraphEagle3Drafter}
