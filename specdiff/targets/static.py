"""A Hugging Face causal LM over a static (preallocated) KV cache with per-row write positions:
the `--compile` target (contracts.Target), whose decode and verify steps have fixed shapes so that
torch.compile builds them once (and, on CUDA, captures them as CUDA graphs, gpt-fast's recipe).

Layout: per layer, keys and values are (R, H, C, D) buffers, R row slots and C = the longest
row the run needs (`warm_up`: prompt + new tokens; else the context window) plus the widest step.
Row b holds its `lengths[b]` tokens in columns 0 .. lengths[b] - 1 of slot b, so column =
position. A step of width W writes row b's keys at columns lengths[b] .. lengths[b] + W - 1 and
query j attends to columns <= lengths[b] + j (a 4-D mask, built in the step). Rollback only
lowers `lengths` (columns beyond are overwritten before they are read); nothing is copied except
when rows are reordered (`keep`).

    prefill / join   eager (prompt lengths vary): the row alone, its cache copied into its slot
    extend           the compiled step: ids padded to (R, W), W from `widths` (1 for plain
                     decoding, gamma + 1 for verification), rows beyond the live ones idle

Only models whose every layer is full attention and which take a 4-D mask as given qualify
(STATIC_MODEL_TYPES): GPT-Neo's local layers window by cache column inside the model, and
sliding-window models would need a mask per layer type.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any, Callable, cast

import torch

from ..errors import IncompatibleModelsError
from ..hf_cache import cache_argument, returned_cache
from .causal import CausalLMTarget, HFModel

STATIC_MODEL_TYPES = ("gpt2", "llama", "qwen2", "qwen3", "mistral")


def check_static(config: Any) -> None:
    """Refuse a model the static cache cannot run exactly (see the module docstring)."""
    if config.model_type not in STATIC_MODEL_TYPES:
        raise IncompatibleModelsError(f"`compile` runs {', '.join(STATIC_MODEL_TYPES)} targets; "
                                      f"'{config.model_type}' runs eager only (drop `compile`)")
    layer_types = set(getattr(config, "layer_types", None) or ["full_attention"])
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True) \
            or layer_types != {"full_attention"}:
        raise IncompatibleModelsError("`compile` needs full attention in every layer; this model has "
                                      "sliding-window layers (drop `compile`)")


class CompiledStep:
    """`fn` at fixed shapes, through torch.compile (or eager, `compile=False`): on CUDA with CUDA
    graphs (mode reduce-overhead: a step replays without launch overhead), on CPU with inductor's
    C++ wrapper (no Python between kernels: 4.1 -> 3.5 ms per demo-target step here).
    step(shape, *args): the first call of a shape compiles it, and its time goes to `warmup_s`.
    On CUDA the output is copied: a CUDA graph's output is overwritten by its next replay."""

    def __init__(self, fn: Callable[..., torch.Tensor], device: torch.device, compile: bool = True):
        self.device = device
        self.shapes: set[tuple[int, ...]] = set()  # the shapes it has run
        self.warmup_s = 0.0
        if not compile:
            self.fn = fn
        elif device.type == "cuda":
            self.fn = torch.compile(fn, dynamic=False, mode="reduce-overhead")
        else:
            self.fn = torch.compile(fn, dynamic=False, options={"cpp_wrapper": True})

    def __call__(self, shape: tuple[int, ...], *args: object) -> torch.Tensor:
        if shape in self.shapes:
            out = self.fn(*args)
        else:
            start = time.perf_counter()
            out = self.fn(*args)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            self.warmup_s += time.perf_counter() - start
            self.shapes.add(shape)
        return out.clone() if self.device.type == "cuda" else out


class _Slots:
    """The cache object the model writes through: `update` writes the step's keys and values
    (B, H, W, D) of row b to columns cols[b] and returns the whole buffers (B, H, C, D)."""

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor], cols: torch.Tensor):
        self.keys, self.values, self.cols = keys, values, cols  # cols (B, W)

    def update(self, k: torch.Tensor, v: torch.Tensor, layer_idx: int, *args: object,
               **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
        rows = torch.arange(k.shape[0], device=k.device)[:, None]  # (B, 1) beside cols (B, W)
        for buffer, new in ((self.keys[layer_idx], k), (self.values[layer_idx], v)):
            # index_put_, not scatter_: torch.compile writes it in place (a scatter_ on a graph
            # input is compiled as copy, scatter, copy back: the whole buffer, every step)
            buffer[rows, :, self.cols] = new.transpose(1, 2).to(buffer.dtype)  # (B, W, H, D)
        return self.keys[layer_idx], self.values[layer_idx]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0  # positions are always given


def _step(model: Any, vocab: int, max_position: int, argument: str, ids: torch.Tensor, lengths: torch.Tensor,
          keys: list[torch.Tensor], values: list[torch.Tensor]) -> torch.Tensor:
    """ids (B, W) after each row's lengths (B,) cached tokens -> logits (B, W, V) float32; the
    step's keys and values are written into the buffers (B, H, C, D); `argument`: the forward's
    cache argument (hf_cache.cache_argument)."""
    W, C = ids.shape[1], keys[0].shape[2]
    cols = lengths[:, None] + torch.arange(W, device=ids.device)  # (B, W)
    visible = torch.arange(C, device=ids.device) <= cols[:, :, None]  # (B, W, C)
    dtype = keys[0].dtype
    mask = torch.zeros(visible.shape, dtype=dtype, device=ids.device).masked_fill(~visible, torch.finfo(dtype).min)
    out = model(input_ids=ids, attention_mask=mask[:, None], position_ids=cols.clamp_max(max_position - 1),
                use_cache=True, **{argument: _Slots(keys, values, cols)})
    return cast(torch.Tensor, out.logits[..., :vocab].float())


class StaticTarget(HFModel):
    """A Hugging Face causal LM and its tokenizer over a static per-row KV cache (module
    docstring); `compile`: run extend through torch.compile (else eager, the same step).
    `step.warmup_s`: seconds spent in calls that compiled a new shape (kept out of generation
    time by `warm_up`)."""

    max_rows: int | None = None

    def __init__(self, model: Any, tokenizer: Any, name: str = "", compile: bool = True):
        check_static(model.config)
        super().__init__(model, tokenizer, name)
        self.lengths = torch.zeros(0, dtype=torch.long)  # (B,) live rows, in slots 0 .. B-1
        self.keys: list[torch.Tensor] = []  # each (R, H, C, D)
        self.values: list[torch.Tensor] = []
        self.widths: list[int] = []  # step widths compiled so far
        self.length_limit = self.max_length  # tokens a row may hold (warm_up: what the run needs)
        self.step = CompiledStep(partial(_step, self.model, self.vocab_size, self.max_length, cache_argument(self.model)), self.device,
                                 compile)  # shapes (R, W, C)

    @classmethod
    def of(cls, target: CausalLMTarget, compile: bool = True) -> "StaticTarget":
        """The static-cache twin of a CausalLMTarget (same model and tokenizer)."""
        return cls(target.model, target.tokenizer, target.name, compile)

    @property
    def rows(self) -> int:
        return len(self.lengths)

    @property
    def kv_peak_bytes(self) -> int:
        """The cache's size: it is allocated whole (the setter, a reset, has nothing to reset)."""
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)

    @kv_peak_bytes.setter
    def kv_peak_bytes(self, value: int) -> None:
        pass

    @property
    def slots(self) -> int:
        return self.keys[0].shape[0] if self.keys else 0

    @property
    def length(self) -> int:
        return int(self.lengths.max()) if self.rows else 0

    @torch.no_grad()
    def prefill(self, ids: torch.Tensor) -> torch.Tensor:
        """Start over with the rows of ids (B, S) -> logits (B, S, V)."""
        self.lengths = torch.zeros(0, dtype=torch.long)
        return torch.cat([self.join(ids[b:b + 1]) for b in range(ids.shape[0])])

    @torch.no_grad()
    def join(self, ids: torch.Tensor) -> torch.Tensor:
        """Prefill one new row ids (1, S) alone, eager and exactly as CausalLMTarget does, and
        copy its cache into the next slot -> logits (1, S, V)."""
        b, S = self.rows, ids.shape[1]
        self._within_limit(S)
        self._reserve(b + 1, 0)
        out = self.model(input_ids=ids, use_cache=True)
        for layer, k, v in zip(returned_cache(out).layers, self.keys, self.values):
            k[b, :, :S] = layer.keys[0]
            v[b, :, :S] = layer.values[0]
        self.lengths = torch.cat([self.lengths, torch.tensor([S])])
        return cast(torch.Tensor, out.logits[..., :self.vocab_size].float())

    @torch.no_grad()
    def extend(self, ids: torch.Tensor, new: torch.Tensor | None = None) -> torch.Tensor:
        """Row b appends ids[b, :new[b]] (default: all S) -> logits (B, S, V), one compiled step
        of width W >= S over all R slots."""
        B, S = ids.shape
        new = torch.full((B,), S) if new is None else new.cpu()
        logits = self._forward(ids)
        self.lengths = self.lengths + new
        return logits

    @torch.no_grad()
    def warm_up(self, rows: int, width: int, length: int | None = None) -> None:
        """Size the buffers for `rows` rows of up to `length` tokens (default: the context window)
        and compile the step of `width` now (its time goes to `step.warmup_s`); cached rows are
        untouched."""
        if length is not None and not self.rows:
            self.length_limit = min(max(length, 1), self.max_length)
        self._forward(torch.zeros(rows, width, dtype=torch.long, device=self.device))

    def _forward(self, ids: torch.Tensor) -> torch.Tensor:
        """The compiled step over ids (B, S), row b after lengths[b] tokens (0 past the live
        rows), writing nothing below those lengths -> logits (B, S, V)."""
        B, S = ids.shape
        W = min((w for w in self.widths if w >= S), default=S)
        if W not in self.widths:
            self.widths.append(W)
        self._within_limit(self.length + S)
        self._reserve(B, W)
        R = self.slots
        padded = ids.new_zeros(R, W)
        padded[:B, :S] = ids
        lengths = torch.zeros(R, dtype=torch.long)
        lengths[:self.rows] = self.lengths
        logits = self.step((R, W, self.keys[0].shape[2]), padded, lengths.to(ids.device), self.keys, self.values)
        return logits[:B, :S]

    def rollback(self, lengths: torch.Tensor | int) -> None:
        lengths = torch.as_tensor(lengths, dtype=torch.long).cpu().expand(self.rows)
        self.lengths = torch.minimum(self.lengths, lengths)

    def keep(self, index: torch.Tensor | list[int]) -> None:
        """Keep the rows at `index` (B',), in that order (repeats allowed): slots 0 .. B'-1."""
        index = torch.as_tensor(index, dtype=torch.long)
        if not torch.equal(index, torch.arange(len(index))):  # a prefix stays where it is
            self._reserve(len(index), 0)
            for t in self.keys + self.values:
                t[:len(index)] = t[index.to(t.device)]
        self.lengths = self.lengths[index]

    def _within_limit(self, length: int) -> None:
        """A row is to hold `length` tokens: past the limit warm_up set, the limit becomes the
        context window (the buffers grow at the next _reserve; a new shape compiles again)."""
        if length > self.length_limit:
            self.length_limit = self.max_length

    def _reserve(self, rows: int, width: int) -> None:
        """Grow the buffers to at least `rows` slots and length_limit + width columns (copying
        the cache; a new shape compiles again, so `warm_up` sizes them first)."""
        C = self.length_limit + max([width, *self.widths])
        if self.keys and rows <= self.slots and C <= self.keys[0].shape[2]:
            return
        if not self.keys:
            self._allocate()
        R, C = max(rows, self.slots), max(C, self.keys[0].shape[2])
        grown = []
        for t in self.keys + self.values:
            g = t.new_zeros(R, t.shape[1], C, t.shape[3])
            g[:t.shape[0], :, :t.shape[2]] = t
            if self.device.type == "cuda":
                torch._dynamo.mark_static_address(g)  # CUDA graphs read the buffers in place
            grown.append(g)
        n = len(self.keys)
        self.keys, self.values = grown[:n], grown[n:]

    def _allocate(self) -> None:
        """Empty buffers (0, H, 0, D) per layer, shaped by one probe through the model."""
        probe = torch.zeros(1, 1, dtype=torch.long, device=self.device)
        out = self.model(input_ids=probe, use_cache=True)
        cache = returned_cache(out)
        self.keys = [layer.keys.new_zeros(0, layer.keys.shape[1], 0, layer.keys.shape[3]) for layer in cache.layers]
        self.values = [layer.values.new_zeros(0, layer.values.shape[1], 0, layer.values.shape[3])
                       for layer in cache.layers]
