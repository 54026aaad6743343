"""An EAGLE-3 drafter (nets/eagle3.py): a draft head that proposes a chain token by token from the
target's fused hidden states, with its own KV cache, its own head over its draft vocabulary and
its own embedding (or, when the checkpoint has none, its target's). A head over the whole
vocabulary with the identity map (d2t all 0) scores every row of it, padded rows included, and a
method keeps the first V, as with the target's own logits (vocab.head_logits).

Row i of its sequence pairs the target's features at position i with the token at position i + 1
(so the features of the last verified position wait for the token after it) and predicts the
token at position i + 2; a draft step feeds the previous row's output back instead of features:

    drafter.bind_target(hf_model, vocab_size)  once: the target's layer count (the layer ids when
                                               the config names none), its embedding if needed,
                                               the draft vocabulary over the target's V ids
    cache = drafter.new_cache()                a nets.dflash.ContextCache (rows of a batch:
                                               cache.keep(index))
    feats = drafter.features(out.hidden_states)        (B, L, 3 * Ht) from a target call with
                                                       output_hidden_states
    out = drafter.extend(tokens, feats, positions, cache, valid)   (B, C, H): C context rows
    out = drafter.step(token, out[:, -1:], position, cache)        (B, 1, H): one draft step
    logits = drafter.logits(out)               (B, T, N) float32 over the draft vocabulary;
                                               vocab.head_logits / on_target: q over the target's ids

May import: nets, vocab, errors (drafters/__init__.py).
"""

from __future__ import annotations

from typing import Any, Sequence, cast

import torch
from torch import nn

from ..errors import IncompatibleModelsError
from ..nets.dflash import ContextCache, context_features
from ..nets.eagle3 import Eagle3Net, default_layer_ids
from ..vocab import DraftVocab, ids_from_d2t

KIND = "eagle3"


def is_eagle3_drafter(drafter: Any) -> bool:
    """An EAGLE-3 drafter: this module's, or one with its drafting calls over an exported graph
    (runtimes.models.GraphEagle3Drafter)."""
    return getattr(drafter, "kind", None) == KIND


class Eagle3Drafter(nn.Module):
    """An Eagle3Net plus what pairing gives it: the target layers it reads (layer_ids, 0-based;
    the config's, else default_layer_ids of the bound target), the embedding (its own, else the
    target's) and draft_vocab (its d2t / t2d over the bound target's V ids; None until bound, and
    for the identity map over the whole vocabulary). bound: whether bind_target has run.
    tokenizer: one beside it or named by its models.yaml entry, if any (published heads ship none)."""

    kind = KIND

    def __init__(self, net: Eagle3Net, *, tokenizer: Any = None, source: str = ""):
        super().__init__()
        self.net = net
        self.tokenizer = tokenizer
        self.source = source
        self.vocab_rows = net.spec.vocab_size  # V of the model it was made for (t2d's length)
        self.hidden_size = net.config.hidden_size
        self.target_hidden_size = net.spec.target_hidden_size
        self.layer_ids: tuple[int, ...] | None = net.spec.layer_ids
        self.draft_vocab: DraftVocab | None = None
        self.target_vocab_size = self.vocab_rows  # V of the bound target's tokenizer (head_logits keeps those rows)
        self.bound = False
        self._embed: tuple[nn.Module] | None = None  # a tuple: the target's, not registered as a submodule

    @property
    def vocab_size(self) -> int:
        """The target vocabulary its ids index (kinds.kind.same_vocabulary is not used: check_eagle3)."""
        return self.vocab_rows

    @property
    def identity(self) -> bool:
        """A head over the whole vocabulary, draft id d standing for target id d."""
        return self.net.spec.draft_vocab_size == self.vocab_rows and not bool(self.net.d2t.any())

    def target_ids(self) -> torch.Tensor:
        """(N,) the target ids of its draft rows, from d2t (checked against t2d)."""
        return ids_from_d2t(self.net.d2t.cpu(), self.net.t2d.cpu(), f"EAGLE-3 drafter '{self.source}'")

    def check_target(self, vocab_size: int, hidden_size: int, layers: int) -> tuple[int, ...]:
        """Refuse, in one line, a target it cannot read: a vocabulary larger than the one it was
        made for or missing its draft ids, another hidden width, too few layers -> its layer ids."""
        who = f"EAGLE-3 drafter '{self.source}'"
        if vocab_size > self.vocab_rows:
            raise IncompatibleModelsError(f"{who} was made for a target vocabulary of {self.vocab_rows} ids "
                                          f"(config.json vocab_size); this target's tokenizer has {vocab_size}")
        top = int(self.target_ids().max())
        if top >= vocab_size and not self.identity:  # the identity's extra rows: a padded head's
            raise IncompatibleModelsError(f"{who} drafts target id {top} (d2t); this target's tokenizer has "
                                          f"{vocab_size} tokens")
        if hidden_size != self.target_hidden_size:
            raise IncompatibleModelsError(f"{who} reads target hidden states of width {self.target_hidden_size} "
                                          f"(config.json target_hidden_size); this target's are {hidden_size}")
        ids = self.layer_ids if self.layer_ids is not None else default_layer_ids(layers)
        if min(ids) < 0 or max(ids) >= layers:
            raise IncompatibleModelsError(f"{who} reads target layers {list(ids)}; this target has {layers} "
                                          "(eagle_config.eagle_aux_hidden_state_layer_ids names others)")
        return tuple(ids)

    def bind_target(self, model: Any, vocab_size: int) -> None:
        """Read a Hugging Face causal LM (its tokenizer's `vocab_size` real ids): check it, fix the
        layer ids, take its input embedding when the head has none, and map the draft vocabulary."""
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        ids = self.check_target(vocab_size, config.hidden_size, config.num_hidden_layers)
        if self.net.embed_tokens is None:
            embed = model.get_input_embeddings()
            rows, width = tuple(getattr(embed, "weight", torch.empty(0, 0)).shape)
            if width != self.hidden_size or rows < vocab_size:
                raise IncompatibleModelsError(
                    f"EAGLE-3 drafter '{self.source}' has no embedding of its own and reads its target's, of "
                    f"width {self.hidden_size}; this target's is ({rows}, {width})")
            self._embed = (embed,)
        self.layer_ids, self.target_vocab_size = ids, vocab_size
        self.draft_vocab = None if self.identity else DraftVocab(self.target_ids(), vocab_size, fingerprint="",
                                                                 built_from="the EAGLE-3 head's d2t / t2d")
        self.bound = True

    def embedding(self) -> nn.Module:
        """The input embedding it reads: its own, else its bound target's (exporters.onnx puts it in the graph)."""
        if self.net.embed_tokens is not None:
            return self.net.embed_tokens
        if self._embed is None:
            raise IncompatibleModelsError(f"EAGLE-3 drafter '{self.source}' has no embedding of its own: bind it "
                                          "to its target first (pairing does)")
        return self._embed[0]

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (B, T) target ids -> (B, T, H)."""
        return cast(torch.Tensor, self.embedding()(tokens))

    def features(self, hidden_states: Sequence[torch.Tensor]) -> torch.Tensor:
        """A target call's hidden_states (N + 1 tensors (B, L, Ht)) -> (B, L, 3 * Ht)."""
        if self.layer_ids is None:
            raise IncompatibleModelsError(f"EAGLE-3 drafter '{self.source}': bind it to its target first")
        return context_features(hidden_states, self.layer_ids)

    def new_cache(self) -> ContextCache:
        return ContextCache()

    def extend(self, tokens: torch.Tensor, features: torch.Tensor, positions: torch.Tensor,
               cache: ContextCache | None = None, valid: torch.Tensor | None = None) -> torch.Tensor:
        """Context rows: tokens (B, C) at positions + 1, features (B, C, 3 * Ht) and positions
        (B, C) of the positions before them, valid (B, C) bool or None -> out (B, C, H)."""
        hidden = self.net.project(features)
        return cast(torch.Tensor, self.net(self.embed(tokens), hidden, positions, cache, valid))

    def step(self, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
             cache: ContextCache | None = None) -> torch.Tensor:
        """Draft rows: tokens (B, T) just drafted, hidden (B, T, H) the outputs of the rows before,
        positions (B, T) -> out (B, T, H)."""
        return cast(torch.Tensor, self.net(self.embed(tokens), hidden.to(self.net.fc.weight.dtype), positions, cache))

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """out (B, T, H) -> (B, T, N) float32 over the draft vocabulary."""
        return self.net.logits(out).float()
