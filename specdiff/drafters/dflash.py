"""A DFlash drafter (nets/dflash.py): a block of S slots drafted in one forward pass from the
target's hidden states, embedded with the target's embedding and scored with the target's head.

Per verify round a method gives it the target features of the positions verified since its last
call (on the first call: the whole prompt) and the anchor, the token at position `start` just
taken from the target (its own hidden state does not exist yet):

    drafter.bind_target(hf_model)              once: the target's embedding, head and layer count
    cache = drafter.new_cache()                per run (rows of a batch: cache.keep(index))
    feats = drafter.features(out.hidden_states)[:, rows]   (B, C, n_ids * H) from a target call
                                               with output_hidden_states, rows = the new positions
    logits = drafter(anchor (B,), feats, start (B,), cache)   (B, S - 1, head_rows) float32

Slot k of the result (k = 1..S-1, row k - 1) predicts the token at position start + k: no shift.
Without a draft vocabulary the logits cover every row of the target's head and a method keeps the
first V (the tokenizer's real vocabulary), as the target's own logits do. With one (specdiff.vocab,
draft_vocab.safetensors beside the weights) the head is the target's rows at its N ids, gathered
once when bound, and the logits are (..., N): methods.dflash draws over them and widens q
(vocab.head_logits, vocab.on_target).
"""

from __future__ import annotations

from typing import Any, Sequence, cast

import torch
from torch import nn

from ..errors import IncompatibleModelsError
from ..nets.dflash import ContextCache, DFlashNet, DFlashSpec, context_features
from ..vocab import DraftVocab


KIND = "dflash"


def is_dflash_drafter(drafter: Any) -> bool:
    """A DFlash drafter: this module's, or one with its drafting call over an exported graph
    (runtimes.models.GraphDFlashDrafter)."""
    return getattr(drafter, "kind", None) == KIND


def hidden_state_indices(drafter: Any) -> tuple[int, ...]:
    """The HF hidden_states indices a DFlash drafter (torch or graph) reads: its target_layer_ids
    + 1 (hidden_states[0] is the embedding output)."""
    return tuple(i + 1 for i in drafter.target_layer_ids)


def draft_block(anchor: torch.Tensor, mask_id: int, size: int) -> torch.Tensor:
    """anchor (B,) -> the block a DFlash drafter fills (B, size): the anchor, then mask ids."""
    block = torch.full((anchor.shape[0], size), mask_id, dtype=torch.long, device=anchor.device)
    block[:, 0] = anchor
    return block


def block_positions(start: torch.Tensor, n: int, size: int) -> torch.Tensor:
    """start (B,) the anchor's position -> positions (B, n + size) of the n context rows before it,
    then of the block; clamped at 0 (padding rows of a ragged context: masked, any position)."""
    return (start[:, None] + torch.arange(-n, size, device=start.device)).clamp(min=0)


class DFlashDrafter(nn.Module):
    """A DFlashNet plus what it reads from its config: block_size (S), mask_id, the target layers
    it reads (target_layer_ids, 0-based), the target's layer count if given (num_target_layers) and
    vocab_rows (the rows of the target's embedding and head it was made for). tokenizer: the one
    shipped beside it, if any (published DFlash repositories ship none). draft_vocab: the N target
    ids its head scores (None: every row of the target's head)."""

    kind = KIND

    def __init__(self, net: DFlashNet, spec: DFlashSpec, *, tokenizer: Any = None, source: str = "",
                 draft_vocab: DraftVocab | None = None):
        super().__init__()
        self.net = net
        self.block_size = spec.block_size
        self.mask_id = spec.mask_token_id
        self.target_layer_ids = list(spec.target_layer_ids)
        self.num_target_layers = spec.num_target_layers
        self.vocab_rows = net.config.vocab_size
        self.hidden_size = net.config.hidden_size
        self.tokenizer = tokenizer
        self.source = source
        self.draft_vocab = draft_vocab
        self._target: tuple[nn.Module, nn.Module] | None = None  # a tuple: not registered as submodules

    def bind(self, embed: nn.Module, head: nn.Module) -> None:
        """Embed blocks with `embed` (weight (vocab_rows, H)) and score them with `head` (the
        target's input embedding and output head), or with its rows at the draft vocabulary's ids;
        refuses tables of another shape."""
        for what, module in (("embedding", embed), ("output head", head)):
            shape = tuple(getattr(module, "weight", torch.empty(0)).shape)
            if shape != (self.vocab_rows, self.hidden_size):
                raise IncompatibleModelsError(
                    f"DFlash drafter '{self.source}' reads a target {what} of shape {(self.vocab_rows, self.hidden_size)} "
                    f"(config.json vocab_size, hidden_size); this target's is {shape}")
        self._target = (embed, head if self.draft_vocab is None else self.draft_vocab.head(head))

    def bind_target(self, model: Any) -> None:
        """bind() to a Hugging Face causal LM's input embedding and output head, after checking that
        it has the layers the drafter reads."""
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        layers = config.num_hidden_layers
        if self.num_target_layers is not None and layers != self.num_target_layers:
            raise IncompatibleModelsError(f"DFlash drafter '{self.source}' was made for a target of "
                                          f"{self.num_target_layers} layers; this one has {layers}")
        if max(self.target_layer_ids) >= layers:
            raise IncompatibleModelsError(f"DFlash drafter '{self.source}' reads target layers {self.target_layer_ids}; "
                                          f"this target has {layers}")
        self.bind(model.get_input_embeddings(), model.get_output_embeddings())

    @property
    def defaults(self) -> dict[str, int]:
        """The draft settings it records (generation.choosing): its whole trained block."""
        return {"gamma": self.block_size - 1}

    def features(self, hidden_states: Sequence[torch.Tensor]) -> torch.Tensor:
        """A target call's hidden_states (N + 1 tensors (B, L, H)) -> (B, L, n_ids * H)."""
        return context_features(hidden_states, self.target_layer_ids)

    def new_cache(self) -> ContextCache:
        return ContextCache()

    def forward(self, anchor: torch.Tensor, context: torch.Tensor, start: torch.Tensor | int,
                cache: ContextCache | None = None, context_valid: torch.Tensor | None = None,
                block_size: int | None = None, slots: int | None = None) -> torch.Tensor:
        """anchor (B,) int64 the token at position start; context (B, C, n_ids * H) the features of
        positions start - C .. start - 1 (all of them without a cache; those not yet in `cache`
        with one; left-padded, padding rows False in context_valid (B, C), when rows differ);
        start (B,) int64 or an int; block_size: S (default: the trained one); slots: score only
        the first `slots` draft slots (the whole block still runs: its slots attend to each other)
        -> logits (B, slots or S - 1, head_rows) float32 of positions start + 1 .. ."""
        size = block_size or self.block_size
        starts = torch.as_tensor(start, device=anchor.device).expand(anchor.shape[0])
        positions = block_positions(starts, context.shape[1], size)
        hidden = self.hidden(draft_block(anchor, self.mask_id, size), context, positions, cache, context_valid)
        return self.score(hidden[:, 1:1 + (slots or size - 1)])

    def hidden(self, block: torch.Tensor, context: torch.Tensor, positions: torch.Tensor,
               cache: ContextCache | None = None, context_valid: torch.Tensor | None = None,
               attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """block (B, Q) ids embedded with the target's embedding, through the net (DFlashNet.forward
        reads the other arguments) -> (B, Q, H)."""
        embed, _ = self.bound()
        return cast(torch.Tensor, self.net(embed(block).to(self.net.fc.weight.dtype), context, positions, cache, context_valid, attn_mask))

    @property
    def spec(self) -> DFlashSpec:
        """What its config.json records beyond the layers' shape (nets.dflash.save_dflash writes it)."""
        return DFlashSpec(self.block_size, self.mask_id, tuple(self.target_layer_ids), self.num_target_layers)

    @property
    def head_rows(self) -> int:
        """The rows its head scores: N with a draft vocabulary, else vocab_rows."""
        return self.vocab_rows if self.draft_vocab is None else self.draft_vocab.size

    def score(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., H) -> the bound head's logits (..., head_rows) float32."""
        _, head = self.bound()
        return cast(torch.Tensor, head(hidden.to(cast(torch.Tensor, head.weight).dtype)).float())

    def bound(self) -> tuple[nn.Module, nn.Module]:
        """(the target's input embedding, its output head) as bind() got them."""
        if self._target is None:
            raise IncompatibleModelsError(f"DFlash drafter '{self.source}' has no target to read its embedding "
                                          "and head from: bind it first (pairing does)")
        return self._target

