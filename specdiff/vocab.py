"""Draft vocabularies (FR-Spec, VocabTrim; EAGLE-3's d2t / t2d): a drafter's head scores N rows,
row d standing for the target id ids[d]; its q is zero at every other target id.

Invariant: the target verifies over its full vocabulary, and every rule reads q only at the drafted
tokens and through the residual max(0, p - q) (or not at all), so a q that is zero outside the N ids
keeps each exact rule exact; only acceptance drops, by the target's mass outside them
(docs/lossless.md, "Draft vocabularies"). Draft rows become target ids in one place each: `widen`
(logits, -inf outside the N ids, so a warping, the argmax and every rule run unchanged on
(..., V)), `widen_probs` / `target_probs` (q, zero outside) and `target_ids` (drawn rows); the
drafters warp and draw over their N rows and widen after (the same distribution, N rows' work).

A map only means something for the tokenizer it was counted on: a map of another target of the same
size would silently repoint every draft id (SpecForge PR #764). Each map records the target's
vocabulary size V and a fingerprint of the token strings its ids stand for; pairing checks both.

    draft_vocab.safetensors   beside a drafter's weights: d2t (N,) int64 (target id = draft id +
                              d2t[draft id], EAGLE-3's convention) and t2d (V,) bool; metadata:
                              fingerprint, built_from (how the ids were chosen), coverage (the
                              share of the counted tokens inside the map)
Also read (`read_map`): an EAGLE-3 checkpoint's d2t / t2d tensors, and an SGLang
`--speculative-token-map` file (a saved list or tensor of hot target ids).

May import: errors, nets.checkpoint (safetensors I/O).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch
from safetensors import safe_open
from torch import nn

from .errors import IncompatibleModelsError, LoadError
from .nets.checkpoint import save_tensors

VOCAB_FILE = "draft_vocab.safetensors"


def fingerprint(tokenizer: Any, ids: torch.Tensor, vocab_size: int) -> str:
    """sha256 of V and the token strings of `ids` (N,) under `tokenizer`: what a map was built for."""
    tokens = tokenizer.convert_ids_to_tokens(ids.tolist())
    return hashlib.sha256(json.dumps([vocab_size, tokens]).encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class DraftVocab:
    """ids (N,) int64, strictly increasing target ids in [0, V); vocab_size: V of the target it was
    built for; fingerprint: fingerprint(its tokenizer, ids, V), "" for a map that records none (an
    EAGLE-3 head's own d2t / t2d: check() then compares V only); built_from: how the ids were
    chosen; coverage: the share of the counted target tokens that fall inside (None: not counted)."""

    ids: torch.Tensor
    vocab_size: int
    fingerprint: str
    built_from: str = ""
    coverage: float | None = None
    inside: torch.Tensor = field(init=False, repr=False, compare=False)  # t2d (V,) bool

    def __post_init__(self) -> None:
        ids = self.ids
        if ids.dim() != 1 or len(ids) == 0 or ids.dtype != torch.int64:
            raise LoadError(f"a draft vocabulary is a non-empty 1-D int64 list of ids, got {ids.dtype} {tuple(ids.shape)}")
        if int(ids[0]) < 0 or int(ids[-1]) >= self.vocab_size:
            raise LoadError(f"draft vocabulary ids must lie in [0, {self.vocab_size}); found "
                            f"{int(ids.min())}..{int(ids.max())}")
        if len(ids) > 1 and not bool((ids[1:] > ids[:-1]).all()):
            raise LoadError("draft vocabulary ids must be strictly increasing (each target id once)")
        inside = torch.zeros(self.vocab_size, dtype=torch.bool)
        inside[ids] = True
        object.__setattr__(self, "inside", inside)

    @property
    def size(self) -> int:
        """N, the rows of the draft head."""
        return len(self.ids)

    @property
    def d2t(self) -> torch.Tensor:
        """(N,) int64 offsets, EAGLE-3's: target id = draft id + d2t[draft id]."""
        return self.ids - torch.arange(self.size)

    def head(self, linear: nn.Module) -> nn.Linear:
        """A linear head (weight (V_head, H), bias or none; V_head >= V) -> a new one of its rows
        at ids: (..., H) -> (..., N), where it lives and in its dtype; no gradient."""
        weight = cast(torch.Tensor, linear.weight).detach()
        bias = getattr(linear, "bias", None)
        rows = nn.Linear(weight.shape[1], self.size, bias=bias is not None, device="meta")  # no random init
        index = self.ids.to(weight.device)
        rows.weight = nn.Parameter(weight[index].clone(), requires_grad=False)
        if bias is not None:
            rows.bias = nn.Parameter(bias.detach()[index].clone(), requires_grad=False)
        return rows

    def widen(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft logits (..., N) -> target logits (..., V): each at its target id, -inf elsewhere."""
        out = logits.new_full((*logits.shape[:-1], self.vocab_size), float("-inf"))
        return out.index_copy_(-1, self.ids.to(logits.device), logits)

    def widen_probs(self, probs: torch.Tensor) -> torch.Tensor:
        """Probabilities over the head's rows (..., N) -> over the target's ids (..., V), 0 elsewhere:
        the same as warping the widened logits, for a warping that keeps -inf at probability 0
        (temperature, top-k, top-p), at the cost of N rows instead of V."""
        return probs.new_zeros((*probs.shape[:-1], self.vocab_size)).index_copy_(-1, self.ids.to(probs.device), probs)

    def outside(self, tokens: list[int]) -> int:
        """How many of `tokens` (target ids) the draft head cannot propose."""
        return sum(not bool(self.inside[t]) for t in tokens)

    def check(self, tokenizer: Any, vocab_size: int, who: str) -> None:
        """Refuse, in one line naming `who`, a target whose vocabulary is not the one it was built for."""
        if vocab_size != self.vocab_size:
            raise IncompatibleModelsError(f"{who}: its draft vocabulary was built for a target of {self.vocab_size} "
                                          f"tokens; this target has {vocab_size}")
        if self.fingerprint and fingerprint(tokenizer, self.ids, vocab_size) != self.fingerprint:
            raise IncompatibleModelsError(f"{who}: its draft vocabulary was built for another tokenizer (the "
                                          f"{self.size} token strings it names differ from this target's)")

    def save(self, directory: Path) -> None:
        """Write VOCAB_FILE into `directory`."""
        meta = {"fingerprint": self.fingerprint, "built_from": self.built_from,
                "coverage": "" if self.coverage is None else repr(self.coverage)}
        save_tensors({"d2t": self.d2t, "t2d": self.inside}, directory / VOCAB_FILE, meta)

    def to_dict(self) -> dict[str, Any]:
        """What --stats and bench.json say of it."""
        return {"size": self.size, "vocab_size": self.vocab_size, "built_from": self.built_from,
                "coverage": self.coverage}


class GatheredHead:
    """The rows of a drafter's head at a draft vocabulary's ids, gathered on first use (a drafter
    whose head is its target's has its rows only once paired) and again after reset() (a move or a
    cast of the drafter). Not a module: it is neither saved nor moved with the drafter."""

    def __init__(self, vocab: DraftVocab):
        self.vocab = vocab
        self.rows: nn.Linear | None = None

    def __call__(self, linear: nn.Module) -> nn.Linear:
        if self.rows is None:
            self.rows = self.vocab.head(linear)
        return self.rows

    def reset(self) -> None:
        self.rows = None


def ids_from_d2t(d2t: torch.Tensor, t2d: torch.Tensor | None, where: str) -> torch.Tensor:
    """EAGLE-3's buffers -> the target ids (N,); refuses a t2d (V,) that names other ids."""
    if d2t.dim() != 1 or d2t.dtype not in (torch.int64, torch.int32):
        raise LoadError(f"{where}: d2t must be a 1-D integer tensor, got {d2t.dtype} {tuple(d2t.shape)}")
    ids = d2t.long() + torch.arange(len(d2t))
    if t2d is not None:
        if t2d.dim() != 1 or t2d.dtype != torch.bool:
            raise LoadError(f"{where}: t2d must be a 1-D bool tensor, got {t2d.dtype} {tuple(t2d.shape)}")
        named = t2d.nonzero()[:, 0]
        if len(named) != len(ids) or not bool((named == ids.sort().values).all()):
            raise LoadError(f"{where}: t2d marks {len(named)} target ids, not the {len(ids)} that d2t maps to")
    return ids


def _buffers(path: Path) -> tuple[torch.Tensor, torch.Tensor | None, dict[str, str]]:
    """A .safetensors map -> (d2t, t2d or None, its metadata); one LoadError if unreadable."""
    try:
        with safe_open(str(path), framework="pt") as f:
            t2d = f.get_tensor("t2d") if "t2d" in set(f.keys()) else None
            return f.get_tensor("d2t"), t2d, f.metadata() or {}
    except Exception as e:  # safetensors' own error types for corrupt files, a missing tensor
        raise LoadError(f"{path}: cannot read a draft vocabulary ({str(e).strip().splitlines()[0]})") from e


def load_draft_vocab(directory: Path) -> DraftVocab | None:
    """The VOCAB_FILE of a drafter directory (None: it has none, the full head)."""
    path = directory / VOCAB_FILE
    if not path.exists():
        return None
    d2t, t2d, meta = _buffers(path)
    if t2d is None:
        raise LoadError(f"{path}: no t2d: it does not say the size of the target vocabulary it was built for")
    if not meta.get("fingerprint"):
        raise LoadError(f"{path}: no fingerprint: it does not say which target vocabulary it was built for")
    try:
        coverage = float(meta["coverage"]) if meta.get("coverage") else None
        return DraftVocab(ids_from_d2t(d2t, t2d, str(path)), len(t2d), meta["fingerprint"],
                          meta.get("built_from", ""), coverage)
    except (LoadError, ValueError) as e:
        raise LoadError(f"{path}: {e}") from e


def read_map(path: Path, tokenizer: Any, vocab_size: int, built_from: str = "") -> DraftVocab:
    """A map made elsewhere, for the target whose tokenizer and V are given: a .safetensors file with
    EAGLE-3's d2t (and t2d), or SGLang's hot-id file (.pt: a list or 1-D tensor of target ids,
    loaded with weights_only). The ids are sorted; a t2d of another size than V is refused."""
    if path.suffix == ".safetensors":
        d2t, t2d, _ = _buffers(path)
        if t2d is not None and len(t2d) != vocab_size:
            raise LoadError(f"{path}: t2d covers {len(t2d)} target ids; this target has {vocab_size}")
        ids = ids_from_d2t(d2t, t2d, str(path))
    else:
        try:
            ids = torch.as_tensor(torch.load(path, weights_only=True))
        except Exception as e:  # torch's errors for unreadable files
            raise LoadError(f"{path}: cannot read a draft vocabulary ({str(e).strip().splitlines()[0]})") from e
        if ids.dim() != 1 or ids.is_floating_point() or ids.dtype == torch.bool:
            raise LoadError(f"{path}: a hot-id map is a 1-D list of integer target ids")
    ids = ids.long().sort().values
    if len(ids) > 1 and not bool((ids[1:] > ids[:-1]).all()):
        raise LoadError(f"{path}: a target id appears twice in the map")
    if len(ids) and (int(ids[0]) < 0 or int(ids[-1]) >= vocab_size):
        raise LoadError(f"{path}: ids {int(ids[0])}..{int(ids[-1])} do not fit this target's {vocab_size} tokens")
    return DraftVocab(ids, vocab_size, fingerprint(tokenizer, ids, vocab_size), built_from or f"read from {path.name}")


def from_counts(counts: torch.Tensor, n: int, keep: list[int], tokenizer: Any, built_from: str,
                banned: int | None = None) -> DraftVocab:
    """The n most frequent target ids of counts (V,) (ties: the lower id; n = V or more: all), plus
    every id of `keep` (EOS, the chat template's end...), which take the places of the least
    frequent; never `banned`. coverage: the share of the counted tokens inside."""
    V = len(counts)
    n = min(n, V - (banned is not None))
    must = sorted({t for t in keep if 0 <= t < V} - {banned})
    if n < max(1, len(must)):
        raise LoadError(f"a draft vocabulary of {n} ids cannot hold the {len(must)} ids always kept")
    order = torch.argsort(-counts.double(), stable=True)  # most frequent first, ties by id
    order = order[~torch.isin(order, torch.tensor([*must, *([] if banned is None else [banned])], dtype=torch.long))]
    ids = torch.cat([torch.tensor(must, dtype=torch.long), order[:n - len(must)]]).sort().values
    total = float(counts.sum())
    coverage = float(counts[ids].sum()) / total if total else None
    return DraftVocab(ids, V, fingerprint(tokenizer, ids, V), built_from, coverage)


def head_logits(logits: torch.Tensor, vocab: DraftVocab | None, vocab_size: int) -> torch.Tensor:
    """A drafter head's logits -> those of the ids it may propose: all N rows of a draft vocabulary,
    else the first V rows (a padded head's extra rows are no token)."""
    return logits if vocab is not None else logits[..., :vocab_size]


def on_target(probs: torch.Tensor, ids: torch.Tensor, vocab: DraftVocab | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(probabilities over head_logits' rows (..., N or V), ids drawn among those rows (...)) ->
    (q over the target's V ids, the target ids): one draw in N rows instead of V."""
    return target_probs(probs, vocab), target_ids(ids, vocab)


def target_probs(probs: torch.Tensor, vocab: DraftVocab | None) -> torch.Tensor:
    """Probabilities over head_logits' rows (..., N or V) -> over the target's V ids."""
    return probs if vocab is None else vocab.widen_probs(probs)


def target_ids(ids: torch.Tensor, vocab: DraftVocab | None) -> torch.Tensor:
    """Rows of head_logits (...) -> the target ids they stand for."""
    return ids if vocab is None else vocab.ids.to(ids.device)[ids]
