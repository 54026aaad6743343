"""An autoregressive drafter (Leviathan et al. 2023): a small causal LM that samples gamma tokens
one by one from its warped distribution q. x_j ~ q_j given x_<j by construction, so the standard
rule is exact. For a single row the drafter keeps its KV cache between calls and re-feeds only
the tokens that changed since the last call; rows of a batch (left-padded, with their lengths)
are drafted together from an empty cache, with per-row positions and an attention mask. A drafter
whose context window is shorter than the target's sees only the last (window - gamma) tokens.
A draft tree (methods.speculative) runs it over many paths of one row at once (ARPaths).
"""

from __future__ import annotations

import copy
from typing import Any, Callable, cast

import torch
from torch import nn
from transformers import DynamicCache

from ..contracts import Draft
from ..hf_cache import with_cache
from ..sampling import Generators, Sampling
from ..targets.causal import context_window, real_vocab_size
from ..vocab import DraftVocab, GatheredHead, on_target


class ARDrafter(nn.Module):
    """A causal LM used as a drafter. forward(input_ids (B, L)) -> logits (B, L, V_head).
    draft_vocab (specdiff.vocab): next_logits scores only its N rows of the LM head."""

    def __init__(self, model: Any, tokenizer: Any, name: str = "", draft_vocab: DraftVocab | None = None):
        super().__init__()
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.source = name
        self.vocab_size = real_vocab_size(tokenizer, model, name or "drafter")
        self.max_length = context_window(model.config)
        self.draft_vocab = draft_vocab
        self._rows = None if draft_vocab is None else GatheredHead(draft_vocab)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return cast(torch.Tensor, self.model(input_ids=input_ids).logits)

    def next_logits(self, feed: torch.Tensor, **inputs: Any) -> torch.Tensor:
        """The logits after feeding `feed` (B, S) with `inputs` (cache, mask, positions) of the ids
        it may propose (vocab.head_logits): the head's first V rows (B, V), or its draft
        vocabulary's N rows (B, N)."""
        if self._rows is None:
            return cast(torch.Tensor, self.model(input_ids=feed, use_cache=True, **inputs).logits[:, -1, :self.vocab_size])
        hidden = self.model.base_model(input_ids=feed, use_cache=True, **inputs).last_hidden_state[:, -1]  # (B, H)
        head = self._rows(self.model.get_output_embeddings())
        return cast(torch.Tensor, head(hidden.to(head.weight.dtype)).float())

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> ARDrafter:
        """.to() moves or casts the model; the draft vocabulary's rows are gathered again from it."""
        if self._rows is not None:
            self._rows.reset()
        return cast(ARDrafter, super()._apply(fn, recurse))  # type: ignore[no-untyped-call]  # torch leaves Module._apply unannotated


class ARProposer:
    """Drafts gamma tokens one by one with an ARDrafter; x_j ~ q_j given x_<j, so every rule
    is exact."""

    exact_rules = frozenset({"greedy", "standard", "match"})

    def __init__(self, drafter: ARDrafter):
        self.drafter = drafter
        self._cache: DynamicCache | None = None
        self._cached = torch.empty(0, dtype=torch.long)  # ids held by the cache (one row)

    def _reuse(self, context: torch.Tensor) -> int:
        """Crop the cache to the longest prefix it shares with context (1, L); -> its length."""
        if context.shape[0] != 1 or self._cache is None:
            self._cache = DynamicCache(config=self.drafter.model.config)
            return 0
        row, cached = context[0], self._cached.to(context.device)
        n = min(len(cached), len(row) - 1)
        same = int((cached[:n] == row[:n]).long().cumprod(0).sum())
        if self._cache.get_seq_length() > same:
            self._cache.crop(same - self._cache.get_seq_length())
        return same

    @torch.no_grad()
    def propose(self, context: torch.Tensor, gamma: int, sampling: Sampling, generator: Generators,
                lengths: torch.Tensor | None = None) -> Draft:
        """context (B, L), left-padded when `lengths` (B,) are given -> Draft (B, gamma)."""
        context = context[:, -(self.drafter.max_length - gamma):]  # a drafter with a shorter window
        keep = self._reuse(context)
        model = self.drafter.model
        feed, ragged = context[:, keep:], _Ragged(context, lengths)
        tokens, qs = [], []
        for _ in range(gamma):
            logits = self.drafter.next_logits(feed, **with_cache(model, self._cache), **ragged.step(feed))
            p = sampling.probs(logits)  # (B, V or N): warped and drawn over the rows it may propose
            q, drawn = on_target(p, sampling.sample(p, generator), self.drafter.draft_vocab)  # (B, V), (B,)
            feed = drawn[:, None]  # (B, 1)
            tokens.append(feed)
            qs.append(q)
        self._cached = torch.cat([context, *tokens[:-1]], dim=1)[0].cpu()
        if context.shape[0] != 1:  # only a single row's cache is worth keeping
            self._cache = None
        return Draft(tokens=torch.cat(tokens, dim=1), q=torch.stack(qs, dim=1), calls=gamma)

    @torch.no_grad()
    def paths(self, context: torch.Tensor, gamma: int, sampling: Sampling) -> ARPaths:
        """One row's context (1, L) -> the drafter over its tree's paths (ARPaths), q warped by
        `sampling`; a drafter with a shorter window sees the last (window - gamma) tokens. The
        row's cache is kept and reused as propose's: only the tokens since the longest prefix it
        shares with the last context are fed."""
        context = context[:, -(self.drafter.max_length - gamma):]
        keep = self._reuse(context)
        assert self._cache is not None  # _reuse made or kept it
        self._cached = context[0].cpu()
        return ARPaths(self.drafter, context[:, keep:], sampling, self._cache)


class ARPaths:
    """One row's drafter over the paths of a draft tree (trees.grown, methods.speculative): `first`
    (V or N,) the drafter's warped probabilities after the context (over the rows it may propose),
    `feed` (1, S >= 1) the context's tokens that `cache` (the row's, ARProposer's) does not hold
    yet, fed to it; calling it with (rows (n,), tokens (n,)) -> (n, V or N) those after each of
    the previous call's rows `rows` followed by its token: a copy of the cache keeps one row per
    path, selected and extended by one token each call (one drafter call per depth)."""

    def __init__(self, drafter: ARDrafter, feed: torch.Tensor, sampling: Sampling, cache: DynamicCache):
        self.drafter, self.sampling, self.cache = drafter, sampling, cache
        self.first = self._probs(feed)[0]
        self.cache = copy.deepcopy(cache)  # the row's cache stays the context's for the next step

    def __call__(self, rows: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        self.cache.batch_select_indices(rows)
        return self._probs(tokens[:, None])

    def _probs(self, feed: torch.Tensor) -> torch.Tensor:
        return self.sampling.probs(self.drafter.next_logits(feed, **with_cache(self.drafter.model, self.cache)))


class _Ragged:
    """The attention mask and positions of left-padded rows fed step by step (none without lengths)."""

    def __init__(self, context: torch.Tensor, lengths: torch.Tensor | None):
        self.mask, self.fed = None, False
        if lengths is not None:
            L = context.shape[1]
            self.mask = (torch.arange(L, device=context.device) >= L - lengths.clamp_max(L)[:, None]).long()  # (B, L)

    def step(self, feed: torch.Tensor) -> dict[str, torch.Tensor]:
        """Inputs for the next `feed` (B, S) tokens: {} or attention_mask (B, seen + S), position_ids (B, S)."""
        if self.mask is None:
            return {}
        S = feed.shape[1]
        if self.fed:  # after the context, every fed token is real
            self.mask = torch.cat([self.mask, self.mask.new_ones(feed.shape[0], S)], dim=1)
        self.fed = True
        positions = (self.mask.cumsum(1) - 1).clamp_min(0)[:, -S:]
        return {"attention_mask": self.mask, "position_ids": positions}
