"""Tree verification over a RowCache (contracts.TreeTarget; specdiff.trees drives it): a row
appends a whole draft tree in one forward pass and then keeps only the path its rule accepted.

    extend_tree(ids (B, S), parent (B, S), new (B,))   node i of row b attends the row's cached
        tokens and its own ancestors (itself included), at position lengths[b] + depth(i); the
        rows are re-aligned first as for extend, so every row's cache is contiguous and ends in
        column C - 1, and the tree's nodes sit in columns C .. C + S - 1
    keep_path(paths)   row b's path nodes are gathered to columns C .. C + len(path) - 1 of every
        cache tensor (the captured features too) and its length becomes lengths[b] + len(path):
        the cache is then exactly what appending the path as a chain would have left

A subclass gives `_tree_run(ids (B, S), allowed (B, S, C + S) bool, positions (B, S),
key_positions (B, C + S), kv) -> (logits, kv)` (key_positions: each cache column's position, for
windowed layers, whose windows count positions, not columns) and `can_tree()`.
"""

from __future__ import annotations

import torch

from .rows import CapturingRows


class TreeRows(CapturingRows):
    """A CapturingRows that can verify draft trees (see the module docstring)."""

    _tree: tuple[int, torch.Tensor] | None = None  # after extend_tree: (C, lengths before it)

    def can_tree(self) -> str | None:
        """None when extend_tree works with this model, else why not (one line)."""
        return None

    def _tree_run(self, ids: torch.Tensor, allowed: torch.Tensor, positions: torch.Tensor,
                  key_positions: torch.Tensor, kv: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        raise NotImplementedError

    def extend_tree(self, ids: torch.Tensor, parent: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        """Row b appends the tree ids[b, :new[b]] with parents parent[b] (< i; -1: none) ->
        logits (B, S, V) (those after padding nodes are not defined)."""
        B, S = ids.shape
        lengths = self._align()
        C = self.width
        ancestor = ancestors(parent.cpu())  # (B, S, S)
        prefix = torch.arange(C) >= self.start[:, None]  # (B, C): the row's cached columns
        allowed = torch.cat([prefix[:, None].expand(B, S, C), ancestor], -1)  # (B, S, C + S)
        positions = (lengths[:, None] + ancestor.sum(-1) - 1).clamp_max(self.max_length - 1)  # (B, S)
        key_positions = torch.cat([torch.arange(C) - self.start[:, None], positions], -1)  # (B, C + S)
        device = ids.device
        logits, self.kv = self._tree_run(ids, allowed.to(device), positions.to(device), key_positions.to(device),
                                         self.kv)
        self._tree = (C, lengths)
        self.lengths = lengths + new.cpu()
        self._track()
        return logits

    def keep_path(self, paths: list[list[int]]) -> None:
        """After extend_tree: row b keeps of the tree only the nodes paths[b] (root first)."""
        if self._tree is None:
            raise RuntimeError("keep_path() follows extend_tree()")
        (C, lengths), self._tree = self._tree, None
        index = torch.arange(self.width - C).repeat(len(paths), 1)  # (B, S)
        for b, path in enumerate(paths):
            index[b, :len(path)] = torch.tensor(path)
        for t in self.kv:  # each (B, H, C + S, D): fresh from the forward pass, held only here
            at = index.to(t.device)[:, None, :, None].expand(-1, t.shape[1], -1, t.shape[3])
            t[:, :, C:] = t[:, :, C:].gather(2, at)
        self.lengths = lengths + torch.tensor([len(path) for path in paths])


def ancestors(parent: torch.Tensor) -> torch.Tensor:
    """parent (B, S) (parent[b, i] < i, negative: none) -> (B, S, S) bool: [b, i, j] when node j
    is node i or one of its ancestors."""
    B, S = parent.shape
    out = torch.eye(S, dtype=torch.bool).repeat(B, 1, 1)
    for i in range(1, S):
        rows = torch.nonzero(parent[:, i] >= 0)[:, 0]
        out[rows, i] |= out[rows, parent[rows, i]]
    return out
