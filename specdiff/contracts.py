"""The typed contracts between the parts of a decoding run. Implementations:

    Target    specdiff.targets.causal.CausalLMTarget (PyTorch, the reference),
              specdiff.runtimes.models.GraphTarget (an exported step graph on ONNX Runtime / TensorRT)
    TreeTarget  a Target that verifies draft trees (specdiff.trees): CausalLMTarget, runtimes.models.GraphTarget
    Proposer  specdiff.drafters.diffusion.DiffusionProposer, specdiff.drafters.autoregressive.ARProposer,
              specdiff.selection.SelfSelection (K candidate drafts, verified by selection.verify)
    Rule      the functions of specdiff.acceptance (greedy, standard, match, select); over K
              candidates, those of specdiff.selection (greedy, select, multi)
    Drafter   what every kind of drafter offers (specdiff.kinds): drafters.diffusion.DiffusionDrafter,
              drafters.a2d.A2DDrafter, drafters.autoregressive.ARDrafter, drafters.dflash.DFlashDrafter,
              targets.block.BlockDiffusionTarget (simsd-exact's), runtimes.models' GraphDrafter and
              GraphDFlashDrafter
    Runtime   specdiff.runtimes: onnxruntime.OrtRuntime, tensorrt.TrtRuntime
    BlockTarget  a block-diffusion LM: specdiff.targets.block.BlockDiffusionTarget
    Decoder   what a method prepares for one run (methods.Method.prepare): methods.plain,
              methods.speculative, methods.dflash, methods.blocks
    Row       one sequence being decoded, which every decoding loop and decoder reads

Exactness is a property a proposer *declares* (`exact_rules`) and `generation.plan` enforces:
a rule outside the declaration is refused when sampling (docs/lossless.md). At temperature 0
every rule reduces to the greedy check and is exact with any proposer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Protocol, runtime_checkable

import torch

from .metrics import Metrics
from .sampling import Generators, Sampling
from .vocab import DraftVocab


class Row:
    """One sequence being decoded: its tokens, stop conditions (EOS, max_new_tokens, context
    window, and `stop`: a test of the new tokens such as text.StopStrings), its own generator
    and its metrics. `index`: the prompt's place in the input."""

    def __init__(self, prompt: list[int], max_new_tokens: int, max_length: int, eos: int | None,
                 device: torch.device, generator: torch.Generator | None = None,
                 stop: Callable[[list[int]], bool] | None = None, index: int = 0):
        self.index = index  # the prompt's place in the whole input
        self.ids = list(prompt)
        self.n_prompt = len(prompt)
        self.limit = min(self.n_prompt + max_new_tokens, max_length)
        self.max_length = max_length
        self.eos = eos
        self.device = device
        self.generator = generator
        self.stop = stop
        self.stop_reason = ""
        self.metrics = Metrics(prompts=1)

    @property
    def new_tokens(self) -> list[int]:
        return self.ids[self.n_prompt:]

    def room(self) -> int:
        """Tokens that may still be appended (>= 1 while decoding goes on)."""
        return self.limit - len(self.ids)

    def tensor(self) -> torch.Tensor:
        return torch.tensor([self.ids], device=self.device)  # (1, L)

    def push(self, tokens: list[int]) -> list[int]:
        """Append tokens up to the first stop condition; -> the tokens appended."""
        for i, t in enumerate(tokens):
            self.ids.append(t)
            if t == self.eos:
                self.stop_reason = "eos"
            elif self.stop is not None and self.stop(self.new_tokens):
                self.stop_reason = "stop"
            elif len(self.ids) >= self.limit:
                self.stop_reason = "length" if self.limit < self.max_length else "context"
            if self.stop_reason:
                return tokens[:i + 1]
        return list(tokens)


@dataclass
class Draft:
    """What a proposer drafted for each row."""

    tokens: torch.Tensor  # (B, gamma) int64
    q: torch.Tensor  # (B, gamma, V) float32: the warped distribution each token was drawn from
    calls: int  # drafter forward passes it took


@runtime_checkable
class Target(Protocol):
    """A causal LM that owns a KV cache over B rows of different lengths (specdiff.targets.rows).
    Logits are float32 over the tokenizer's real vocabulary.

        prefill(ids (B, S)) -> logits (B, S, V)      start over with B rows
        join(ids (1, S)) -> logits (1, S, V)         prefill a new row alone; it becomes the last row
        extend(ids (B, S), new (B,) = S) -> logits   row b appends ids[b, :new[b]]
        rollback(lengths (B,) or int)                keep only the first lengths[b] tokens of row b
        keep(index (B',))                            keep (reorder, repeat) the rows at index
    Each row's cache is exactly what decoding it alone would hold.
    """

    tokenizer: Any
    vocab_size: int
    max_length: int
    eos_token_id: int | None
    name: str
    max_rows: int | None  # most rows per forward pass (None: any)
    kv_peak_bytes: int  # the largest its KV cache has been (reset it to measure: specdiff bench)

    @property
    def device(self) -> torch.device: ...

    @property
    def length(self) -> int: ...

    @property
    def rows(self) -> int: ...

    def prefill(self, ids: torch.Tensor) -> torch.Tensor: ...

    def join(self, ids: torch.Tensor) -> torch.Tensor: ...

    def extend(self, ids: torch.Tensor, new: torch.Tensor | None = None) -> torch.Tensor: ...

    def rollback(self, lengths: torch.Tensor | int) -> None: ...

    def keep(self, index: torch.Tensor | list[int]) -> None: ...

    def sync(self) -> None: ...


@runtime_checkable
class CapturingTarget(Target, Protocol):
    """A Target whose cache can also hold hidden states of its layers, for every cached token
    (targets.rows.CapturingRows: CausalLMTarget, GraphTarget; a DFlash run reads them).

        can_capture(layers) -> None, or why these HF hidden_states indices cannot be captured
        capture(layers)                          keep them from now on (() stops); an empty cache
        features(rows (B',), newest (B',) = all) -> (features (B', C, F), valid (B', C) bool)
    """

    captured: tuple[int, ...]
    lengths: torch.Tensor  # (B,) tokens cached per row

    def can_capture(self, layers: tuple[int, ...]) -> str | None: ...

    def capture(self, layers: tuple[int, ...]) -> None: ...

    def features(self, rows: list[int] | torch.Tensor,
                 newest: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]: ...


@runtime_checkable
class TreeTarget(Target, Protocol):
    """A Target that verifies draft trees (specdiff.trees; targets.trees.TreeRows: CausalLMTarget, GraphTarget).

        can_tree() -> None, or why this model cannot verify a tree (one line)
        extend_tree(ids (B, S), parent (B, S), new (B,)) -> logits (B, S, V)
            row b appends the tree ids[b, :new[b]] (parent[b, i] < i, -1: none); node i attends
            the row's cache and its own ancestors, at position (tokens cached) + (its depth)
        keep_path(paths)   after extend_tree: row b keeps of those nodes only paths[b] (node
                           indices, each the parent of the next), as if only they were appended
    """

    def can_tree(self) -> str | None: ...

    def extend_tree(self, ids: torch.Tensor, parent: torch.Tensor, new: torch.Tensor) -> torch.Tensor: ...

    def keep_path(self, paths: list[list[int]]) -> None: ...


@runtime_checkable
class Proposer(Protocol):
    """Drafts gamma tokens after a context.

    propose(context (B, L) int64, gamma, sampling, generator[, lengths (B,)]) -> Draft
        q[b, j] is warped by `sampling`, the same function that warps the target's p.
        generator: one, or one per row (row b draws only from generator[b], as it would alone).
        lengths: given when rows differ in length: row b is context[b, L - lengths[b]:], the
        columns before it are padding.
    exact_rules: the acceptance rules (names in specdiff.names.RULES) that keep the output
        exactly the target's when sampling with this proposer's drafts. `standard` belongs here
        only if x_j was drawn from q_j given x_<j (docs/lossless.md).
    """

    exact_rules: frozenset[str]

    def propose(self, context: torch.Tensor, gamma: int, sampling: Sampling,
                generator: Generators) -> Draft: ...


class Rule(Protocol):
    """(draft (B, g) int64, q (B, g, V), p (B, g+1, V), generator) -> (n (B,), nxt (B,)):
    n accepted draft tokens per row, then the token nxt; generator: one, or one per row (each row
    then draws what it draws alone)."""

    def __call__(self, draft: torch.Tensor, q: torch.Tensor, p: torch.Tensor,
                 generator: Generators = None) -> tuple[torch.Tensor, torch.Tensor]: ...


class Drafter(Protocol):
    """A loaded drafter, whatever its kind (specdiff.kinds tells the kinds apart and declares the
    rest): the tokenizer it ships (None: none; its target's serves) and its draft vocabulary (the
    target ids its head proposes; None: every id)."""

    @property
    def tokenizer(self) -> Any: ...

    @property
    def draft_vocab(self) -> DraftVocab | None: ...


class Runtime(Protocol):
    """Executes one exported graph (specdiff.graphs): named tensors in, named tensors out.
    `limits`: the shapes it can serve (None: any)."""

    limits: Any

    def run(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]: ...


@runtime_checkable
class BlockTarget(Protocol):
    """A block-diffusion LM over a K/V cache of whole finished blocks (block grid anchored at
    position 0), as the block methods drive it (block_decoding, simsd). Logits are float32 over the
    tokenizer's real vocabulary, not shifted (row i predicts token i), the mask token at -inf.

        run(ids (1, N), positions (1, N), allowed (N, N) bool) -> logits (1, N, V)
            N new rows against the whole cache and, among themselves, as `allowed` says; their
            K/V are appended until trim()
        trim(n_cached, rows)      keep the cache's first n_cached tokens and `rows` of the last run
        store(ids (1, n))         cache finished blocks (n a multiple of block_size)
        denoise(block (1, B)[, finished (1, B)]) -> logits (1, B, V)   nothing stored but
                                  `finished`, the block before it
        positions(start, n) -> (1, n); reset(); sync()
    """

    kind: str
    tokenizer: Any
    vocab_size: int
    max_length: int
    eos_token_id: int | None
    name: str
    block_size: int
    mask_id: int

    @property
    def device(self) -> torch.device: ...

    @property
    def length(self) -> int: ...

    def reset(self) -> None: ...

    def run(self, ids: torch.Tensor, positions: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor: ...

    def trim(self, n_cached: int, rows: slice | torch.Tensor | None) -> None: ...

    def positions(self, start: int, n: int) -> torch.Tensor: ...

    def store(self, ids: torch.Tensor) -> None: ...

    def denoise(self, block: torch.Tensor, finished: torch.Tensor | None = None) -> torch.Tensor: ...

    def sync(self) -> None: ...


class Decoder(Protocol):
    """A method prepared for one run (methods.Method.prepare) around its models and settings.

        decoder(rows, batch_size) -> (row, tokens appended), per step of each row: the rows are
            decoded up to batch_size together; a row's metrics are complete once it has a
            stop_reason
        warm_up(rows, length)     compile its steps for `rows` rows of up to `length` tokens
                                  (specdiff.compiled)
        check_sizes(rows, batch_size, max_new_tokens, context)  refuse a step no memory holds
        ran() -> {setting: value}  the draft settings it runs, as --stats reports them
    settings: its family's settings (specdiff.settings; None: it reads none).
    rule: the acceptance rule it runs (None: it verifies no draft).
    """

    @property
    def settings(self) -> Any: ...

    @property
    def rule(self) -> str | None: ...

    def __call__(self, rows: Iterable[Row], batch_size: int) -> Iterator[tuple[Row, list[int]]]: ...

    def warm_up(self, rows: int, length: int) -> None: ...

    def check_sizes(self, rows: int, batch_size: int, max_new_tokens: int, context: int) -> None: ...

    def ran(self) -> dict[str, Any]: ...
