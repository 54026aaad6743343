"""`simsd`: SimSD's single verify pass (airevo2/SimSD-release; arXiv 2606.02544), as published:
APPROXIMATE. Its output is neither token-identical nor identically distributed to the target's
own block decoding (`block`); `simsd-exact` (block_decoding.py) is the exact method.

A block is committed left to right: `leftover` = its committed prefix (not yet cached). The draft
model (same block size) fills the rest of the block one slot per step, the most confident first
(static rule), recording for each drafted position i its token, its reveal step t_i (1-based) and
the distribution q_i it was drawn from. One target call, nothing stored, over
[leftover | n draft tokens | n mask copies], each mask copy at its draft token's position, all
rows seeing the cache and:

    query \\ key | leftover | draft j      | mask copy j
    leftover    | yes      | no           | no
    draft i     | yes      | t_j <= t_i   | t_j > t_i
    mask copy i | yes      | t_j < t_i    | t_j >= t_i

The target's p_i is read at mask copy i. Draft tokens are accepted in position order (greedy
match, or Leviathan's rule with q_i: acceptance.greedy / standard); the first rejection commits
the target's token. A full block is stored in both caches by one forward each.
Not exact: past the first layer a draft token's K/V come from another denoising state than in
vanilla decoding, and the reveal order is the draft's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import torch

from .acceptance import get_rule
from .block_decoding import BlockRun, decode_blocks
from .contracts import BlockTarget, Rule
from .contracts import Row
from .sampling import Sampling
from .settings import BlockSettings


def temporal_mask(n_left: int, t: torch.Tensor) -> torch.Tensor:
    """The attention pattern above: n_left leftover rows, reveal steps t (n,) of the draft
    positions (in position order) -> (n_left + 2n, n_left + 2n) bool."""
    n = len(t)
    before, upto = t[None, :] < t[:, None], t[None, :] <= t[:, None]  # (n, n): [i, j] is t_j < t_i, t_j <= t_i
    left = torch.ones(2 * n, n_left, dtype=torch.bool, device=t.device)
    rows = torch.cat([torch.cat([left[:n], upto, ~upto], 1), torch.cat([left[n:], before, ~before], 1)], 0)
    top = torch.cat([torch.ones(n_left, n_left, dtype=torch.bool, device=t.device),
                     torch.zeros(n_left, 2 * n, dtype=torch.bool, device=t.device)], 1)
    return torch.cat([top, rows], 0)


def _draft(drafter: BlockTarget, run: BlockRun, sampling: Sampling,
           generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fill the block's masked slots one per step, most confident first. -> (positions (n,) in
    the block, in position order; their tokens (n,), reveal steps (n,), q (n, V))."""
    state, B = run.block.clone(), run.B
    steps = torch.zeros(B, dtype=torch.long, device=state.device)
    q: dict[int, torch.Tensor] = {}
    for t in range(1, int((state == run.mask_id).sum()) + 1):
        probs = sampling.probs(drafter.denoise(state[None])[0])  # (B, V)
        x0 = sampling.sample(probs, generator)  # (B,)
        conf = probs.gather(-1, x0[:, None])[:, 0].masked_fill(state != run.mask_id, -1.0)
        i = int(conf.argmax())
        state[i], steps[i], q[i] = x0[i], t, probs[i]
    slots = (run.block == run.mask_id).nonzero()[:, 0]
    return slots, state[slots], steps[slots], torch.stack([q[int(i)] for i in slots])


@dataclass
class SingleVerify:
    """Each round: the draft fills the block, one target call verifies it (module docstring); a
    finished block is stored in both caches by one forward each."""

    target: BlockTarget
    drafter: BlockTarget
    sampling: Sampling
    rule: Rule

    def denoise(self, run: BlockRun) -> None:
        m, target = run.row.metrics, self.target
        with m.timed("draft", target.sync):
            slots, tokens, t, q = _draft(self.drafter, run, self.sampling, run.row.generator)
        m.drafter_calls += len(slots)
        with m.timed("verify", target.sync):
            n_left, n = int(slots[0]), len(slots)  # the committed prefix, the drafted rest
            ids = torch.cat([run.block[:n_left], tokens, torch.full_like(tokens, run.mask_id)])[None]
            pos = target.positions(run.start, run.B)[0]
            positions = torch.cat([pos[:n_left], pos[slots], pos[slots]])[None]
            n_cached = target.length
            logits = target.run(ids, positions, temporal_mask(n_left, t))[0, n_left + n:]  # (n, V)
            target.trim(n_cached, None)
            p = self.sampling.probs(logits)
            k, y = self.rule(tokens[None], q[None], torch.cat([p, p[-1:]])[None], run.row.generator)
            k_, y_ = int(k[0]), int(y[0])
            run.block[slots[:k_]] = tokens[:k_]
            if k_ < n:
                run.block[slots[k_]] = y_
        m.target_calls += 1
        m.record(k_, n)

    def finished(self, run: BlockRun, block: torch.Tensor) -> None:
        m = run.row.metrics
        for model in dict.fromkeys((self.target, self.drafter)):
            with m.timed("verify" if model is self.target else "draft", self.target.sync):
                model.store(block[None])
        m.target_calls += 1
        m.drafter_calls += self.drafter is not self.target


def decode_simsd(target: BlockTarget, drafter: BlockTarget, row: Row, sampling: Sampling,
                 settings: BlockSettings) -> Iterator[list[int]]:
    """SimSD as published (module docstring): approximate. Yields each finished block's tokens."""
    rule = get_rule("greedy" if sampling.greedy else "standard")
    return decode_blocks((target, drafter), row, SingleVerify(target, drafter, sampling, rule))
