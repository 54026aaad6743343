"""A KV cache over B rows of different lengths, shared by every target (targets.causal over
Hugging Face models, runtimes.models over exported graphs): the batched side of contracts.Target.

Layout: the cache is 2L tensors (B, H, C, D) (a subclass may add more of that shape, kept the same
way: targets.causal's captured hidden states, (B, 1, C, F)). Row b holds its `lengths[b]` tokens in the columns
start[b] .. start[b] + lengths[b] - 1; the columns before start[b] are padding, masked out of
attention. Before every forward pass the rows are re-aligned so that all of them end in the last
column C - 1 and no column is padding in every row (one gather with per-row offsets: EQSPEC,
arXiv 2510.22876). A row's tokens are therefore always contiguous and its keys sit at the same
distance from its queries as when it is decoded alone, so local / sliding attention windows,
which count cache columns, stay exact; rejected tokens never stay behind as masked holes.

    rollback(lengths (B,))   O(1): only the lengths change; the gather happens at the next call
    extend(ids (B, S), new)  row b appends ids[b, :new[b]] (right padding after), one forward
    join(ids (1, S))         a new row, prefilled alone, becomes the last row (continuous refill);
                             rows joined one after another are stacked onto the cache together
                             when it is next read (one copy of the cache for all, not one each)
    keep(index (B',))        rows reordered / dropped / repeated (finished rows leave; K drafts)

Subclasses give `_run(ids (B, S), mask (B, C + S), positions (B, S), kv) -> (logits (B, S, V),
kv (B, H, C + S, D) each)`; an empty kv list means an empty cache.

CapturingRows adds what a DFlash run reads (methods.dflash): the target's hidden states of some
layers for every cached token, held as one more cache tensor (B, 1, C, F) after the KV tensors.
"""

from __future__ import annotations

import torch


class RowCache:
    """Per-row lengths and re-alignment over the KV tensors `kv` of a subclass's `_run`."""

    max_length: int
    max_rows: int | None = None  # most rows a forward pass can take (None: any)
    kv_peak_bytes = 0  # the largest the cache (every tensor of `kv`) has been (reset it to measure)

    def __init__(self) -> None:
        self._kv: list[torch.Tensor] = []  # each (B, H, C, D)
        self._lengths = torch.zeros(0, dtype=torch.long)  # (B,) tokens cached per row
        self._start = torch.zeros(0, dtype=torch.long)  # (B,) first column of each row
        self._joining: list[tuple[list[torch.Tensor], int]] = []  # rows joined, not yet stacked: (kv, length)

    # kv, lengths and start: read, they first stack the rows that joined since (join)
    @property
    def kv(self) -> list[torch.Tensor]:
        return self._joined()._kv

    @kv.setter
    def kv(self, kv: list[torch.Tensor]) -> None:
        self._kv = kv

    @property
    def lengths(self) -> torch.Tensor:
        return self._joined()._lengths

    @lengths.setter
    def lengths(self, lengths: torch.Tensor) -> None:
        self._lengths = lengths

    @property
    def start(self) -> torch.Tensor:
        return self._joined()._start

    @start.setter
    def start(self, start: torch.Tensor) -> None:
        self._start = start

    def _run(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor,
             kv: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        raise NotImplementedError

    @property
    def rows(self) -> int:
        return len(self.lengths)

    @property
    def length(self) -> int:
        """Tokens cached in the longest row (batch 1: the row's length)."""
        return int(self.lengths.max()) if self.rows else 0

    @property
    def width(self) -> int:
        return self.kv[0].shape[2] if self.kv else 0

    def prefill(self, ids: torch.Tensor) -> torch.Tensor:
        """Start over with the rows of ids (B, S) (no padding) -> logits (B, S, V)."""
        B, S = ids.shape
        logits, self.kv = self._unpadded(ids, [])
        self.lengths, self.start = torch.full((B,), S), torch.zeros(B, dtype=torch.long)
        self._track()
        return logits

    def join(self, ids: torch.Tensor) -> torch.Tensor:
        """Prefill one new row ids (1, S) alone and add it as the last row -> logits (1, S, V)."""
        if not len(self._lengths) and not self._joining:
            return self.prefill(ids)
        logits, kv = self._unpadded(ids, [])
        self._joining.append((kv, ids.shape[1]))
        return logits

    def _joined(self) -> RowCache:
        """The cache with the rows that joined since it was last read stacked after the others."""
        if self._joining:
            joining, self._joining = self._joining, []
            lengths = self._align()
            self._stack([(self.kv, lengths), *((kv, torch.tensor([n])) for kv, n in joining)])
        return self

    def extend(self, ids: torch.Tensor, new: torch.Tensor | None = None) -> torch.Tensor:
        """Row b appends ids[b, :new[b]] (default: all S) -> logits (B, S, V); the logits after
        a row's new tokens are not defined."""
        B, S = ids.shape
        new = torch.full((B,), S) if new is None else new.cpu()
        lengths = self._align()
        C = self.width
        if C + S > self.max_length:  # a long row and a long draft: each row alone fits
            return self._extend_each(ids, new)
        cols = torch.arange(C + S)
        mask = (cols >= self.start[:, None]) & (cols < C + new[:, None])  # (B, C + S)
        positions = (lengths[:, None] + torch.arange(S)).clamp_max(self.max_length - 1)  # (B, S)
        logits, self.kv = self._run(ids, mask.long().to(ids.device), positions.to(ids.device), self.kv)
        self.lengths = lengths + new
        self._track()
        return logits

    def rollback(self, lengths: torch.Tensor | int) -> None:
        """Keep only the first lengths[b] cached tokens of each row (an int: of every row)."""
        lengths = torch.as_tensor(lengths, dtype=torch.long).cpu().expand(self.rows)
        self.lengths = torch.minimum(self.lengths, lengths)

    def keep(self, index: torch.Tensor | list[int]) -> None:
        """Keep the rows at `index` (B',), in that order (repeats allowed)."""
        index = torch.as_tensor(index, dtype=torch.long)
        self.kv = [t[index.to(t.device)] for t in self.kv]
        self.lengths, self.start = self.lengths[index], self.start[index]
        if not self.rows:
            self.kv = []

    def _align(self) -> torch.Tensor:
        """Gather every row to end in the last column, with no all-padding column; -> lengths. Rows
        that all end in one column (one row always does: after a rollback) are sliced, not copied."""
        W = self.length
        if self.kv and not (bool((self.start + self.lengths == self.width).all()) and self.width == W):
            shift = self.start + self.lengths - W  # (B,) the column each row's last W start at
            if bool((shift == shift[0]).all()) and int(shift[0]) >= 0:
                self.kv = [t[:, :, int(shift[0]):int(shift[0]) + W] for t in self.kv]
            else:
                index = (shift[:, None] + torch.arange(W)).clamp_min(0)[:, None, :, None]  # padding: any real column
                self.kv = [t.gather(2, index.to(t.device).expand(-1, t.shape[1], -1, t.shape[3])) for t in self.kv]
        self.start = W - self.lengths
        return self.lengths

    def _stack(self, parts: list[tuple[list[torch.Tensor], torch.Tensor]]) -> None:
        """Rows of several aligned caches (kv, lengths) as one cache, left-padded to one width."""
        W = max(int(lengths.max()) for _, lengths in parts)
        self.kv = [torch.cat([_left_pad(kv[i], W) for kv, _ in parts]) for i in range(len(parts[0][0]))]
        self.lengths = torch.cat([lengths for _, lengths in parts])
        self.start = W - self.lengths
        self._track()

    def _track(self) -> None:
        self.kv_peak_bytes = max(self.kv_peak_bytes, sum(t.numel() * t.element_size() for t in self.kv))

    def _unpadded(self, ids: torch.Tensor, kv: list[torch.Tensor],
                  past: int = 0) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Forward ids (B, S) over kv holding `past` columns of every row, none of them padding."""
        B, S = ids.shape
        mask = torch.ones(B, past + S, dtype=torch.long, device=ids.device)
        return self._run(ids, mask, torch.arange(past, past + S, device=ids.device).expand(B, S), kv)

    def _extend_each(self, ids: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        """extend, one row per forward pass (when the padded batch would pass the window)."""
        parts, logits = [], []
        for b in range(self.rows):
            n, s = int(self.lengths[b]), int(self.start[b])
            out, kv = self._unpadded(ids[b:b + 1, :int(new[b])], [t[b:b + 1, :, s:] for t in self.kv], n)
            logits.append(_pad_to(out, ids.shape[1]))
            parts.append((kv, torch.tensor([n + int(new[b])])))
        self._stack(parts)
        return torch.cat(logits)


def _left_pad(t: torch.Tensor, width: int) -> torch.Tensor:
    """(B, H, C, D) -> (B, H, width, D), zeros before (finite: masked padding); t itself if C = width."""
    if t.shape[2] == width:
        return t
    pad = t.new_zeros(t.shape[0], t.shape[1], width - t.shape[2], t.shape[3])
    return torch.cat([pad, t], dim=2)


def _pad_to(logits: torch.Tensor, S: int) -> torch.Tensor:
    """(1, s, V) -> (1, S, V), zeros after."""
    return torch.cat([logits, logits.new_zeros(1, S - logits.shape[1], logits.shape[2])], dim=1)


class CapturingRows(RowCache):
    """A RowCache whose forward pass can also return hidden states of some layers (HF
    hidden_states indices: a DFlash drafter's target_layer_ids + 1). capture(layers) makes the
    cache also hold, for every cached token of every row, their concatenation: one more tensor
    (B, 1, C, F) at the end of `kv`, shaped like a KV layer of one head, so that join / extend /
    rollback / keep / re-alignment keep it with the keys and values. features(rows) reads it back
    per row. A subclass's `_run` splits it off (split_features) and appends the new tokens'
    (with_features)."""

    captured: tuple[int, ...] = ()  # hidden_states indices kept in the cache (none: not captured)

    def can_capture(self, layers: tuple[int, ...]) -> str | None:
        """None when capture(layers) is possible, else why not (one line)."""
        return None

    @property
    def device(self) -> torch.device:
        raise NotImplementedError

    def capture(self, layers: tuple[int, ...]) -> None:
        """Keep the hidden states of `layers` of every cached token from now on (() stops);
        starts a fresh, empty cache."""
        self.captured = tuple(layers)
        self.keep([])

    def features(self, rows: list[int] | torch.Tensor,
                 newest: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The captured features of each cached token of the cache rows `rows` (of row b only its
        last newest[b] (B',), if given), left-padded -> (features (B', C, F), valid (B', C) bool: False on
        padding, whose features are 0). Read where the rows are: re-aligning the cache is the next
        extend's (here it cost a drafter call a copy, or a slice, of every KV tensor)."""
        if not self.captured:
            raise RuntimeError("features() needs capture(layers) first")
        index = torch.as_tensor(rows, dtype=torch.long)
        if not self.kv:
            return torch.zeros(len(index), 0, 0, device=self.device), torch.zeros(len(index), 0, dtype=torch.bool)
        lengths, end = self.lengths[index], (self.start + self.lengths)[index]  # end: the column after the row's last
        if newest is not None:
            lengths = torch.minimum(lengths, newest.to(lengths.device))
        C = int(lengths.max()) if len(index) else 0
        held = self.kv[-1]  # (B, 1, W, F)
        cols = (end[:, None] - C + torch.arange(C)).clamp_min(0)  # (B', C): a column before a row's first is padding
        stored = held[index.to(held.device)[:, None], 0, cols.to(held.device)]  # (B', C, F), masked below
        valid = (torch.arange(C) >= C - lengths[:, None]).to(stored.device)
        return stored.masked_fill(~valid[..., None], 0), valid

    def split_features(self, kv: list[torch.Tensor]) -> tuple[list[torch.Tensor], torch.Tensor | None]:
        """The cache a `_run` gets -> (its KV tensors, the captured features (B, 1, C, F) or None)."""
        if self.captured and kv:
            return kv[:-1], kv[-1]
        return kv, None

    def with_features(self, kv: list[torch.Tensor], held: torch.Tensor | None, new: torch.Tensor) -> list[torch.Tensor]:
        """The new KV tensors, then the held features with the new tokens' (B, S, F) appended."""
        new = new[:, None]  # (B, 1, S, F)
        return [*kv, new if held is None else torch.cat([held, new], dim=2)]
