"""Adaptive draft length (`gamma` auto): each step of the speculative loop drafts G tokens per row,
G in 0..gamma_max chosen from the PAST only (the rows' acceptance so far, the costs measured before
decoding), so every acceptance rule stays exact (docs/lossless.md: the rules are exact for any
draft length fixed before the draft is drawn). G = 0 is a plain step.

    alpha_bk = (passed_bk + s * pool_k) / (reached_bk + s)    row b's acceptance of slot k, given
               slots < k were accepted; pool_k = (P_k + 3) / (R_k + 4), the run's own (all rows so
               far), optimistic (3/4) before it has seen a step: a drafter is tried before it is judged
    E_b(g)   = 1 + sum_{k<=g} prod_{i<=k} alpha_bi            expected tokens of a step drafting g
    G*       = argmax_G  sum_b E_b(min(G, room_b - 1)) / (c_v(R, G + 1) + c_d(R, G))

c_v(R, w): one target call verifying w tokens for each of R rows; c_d(R, g): drafting g tokens for R
rows (c_d(R, 0) = 0): `Costs`, timed once before decoding (`measure`: the fastest of REPEATS calls
per cell, then made non-decreasing in w and g by pooling adjacent violators, since a wider call
measured faster is noise) at 1 row and at R_t = min(R, ROWS) rows, never more: a call's cost is
c(1) plus a per-row cost (each row's tokens, its own cache), so c(R) = c(1) + (R - 1) (c(R_t) -
c(1)) / (R_t - 1), interpolated up to R_t and extrapolated beyond it (the per-row part made
non-negative and non-decreasing in w and g too). Timing is then bounded whatever the batch:
(2 gamma_max + 1) REPEATS calls at 1 row and as many at R_t (tree auto's widths: N_max - gamma_max
more); the loop counts its seconds in the run (Metrics.costs_s: time_s.costs, in the first step's
rows' wall_s). Past R_t the table is only a model (on a CPU, a few rows fit in its caches and 512 do not: a 512-row drafter call took 3x
the extrapolation), so there the run's own steps correct it (`Controller.observe`): plain steps
and drafting steps are scaled apart by what they took against what the table said, summed over
the run (ratio of the sums, 1 until seen; drafting takes the plain ratio until it has been seen).
At R <= R_t the timed table stands alone, so a run there chooses the same lengths again given
the same table. One G for the batch, not
one per row: the verify call's width is max_b g_b + 1 whatever the others draft, so a row drafting
less saves no verify time, and rows of different lengths cost one drafter call each. Rows still
differ where their room clips them (the loop's min(G, room_b - 1)).

Probing: a run that chose G = 0 learns nothing new about its drafter, so after `probe` plain steps
in a row it drafts (the best length above 0); each probe that does not bring drafting back
doubles the wait, so a useless drafter costs at most a few steps.

May import: torch, contracts and decoding's Row for types only (decoding imports this module).
"""

from __future__ import annotations

import time
from functools import partial
from operator import add
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch

from .metrics import Costs

if TYPE_CHECKING:
    from .contracts import Row, Target

STRENGTH = 16.0  # pseudo-observations of the run's pooled acceptance in each row's estimate: a row's
# first rejections do not turn it plain (it would then learn nothing more of its own until a probe)
PROBE = 16  # plain steps in a row before a probe of one draft token (doubled after each failed probe)
REPEATS = 3  # timed calls per cost cell, in rounds; the fastest counts (the least disturbed by other processes)
PRIOR = (3.0, 4.0)  # pool_k = (passed + 3) / (reached + 4)
ROWS = 8  # the most rows a cost is timed at; more are extrapolated (batch 512: 1/64 of the timing)


class Probes:
    """When a run that stopped drafting tries again: after `wait` plain steps in a row, a probe;
    the wait doubles after each probe and starts over at `probe` once drafting pays (`paid`).
    Shared by gamma auto (Controller) and tree auto (tree_sizes.SizeController)."""

    def __init__(self, probe: int = PROBE):
        self.probe, self.plain, self.wait = probe, 0, probe  # plain steps in a row; before the next probe

    def paid(self) -> None:
        self.plain, self.wait = 0, self.probe

    def due(self) -> bool:
        """One more plain step: True when it is to be a probe instead (the wait then doubled)."""
        self.plain += 1
        if self.plain < self.wait:
            return False
        self.plain, self.wait = 0, self.wait * 2
        return True


class Controller:
    """Chooses each step's draft length G (`width`) from what earlier steps recorded (`record`).
    Rows are keyed by the Row object, held while it decodes (its id cannot be reused); rows
    that have left the batch are dropped at the next `width`."""

    def __init__(self, costs: Costs, probe: int = PROBE):
        self.costs, self.gamma_max, self.probes = costs, costs.gamma_max, Probes(probe)
        self.rows: dict[int, tuple[Row, list[int], list[int]]] = {}  # id -> (row, reached_k, passed_k)
        self.reached, self.passed = [0] * self.gamma_max, [0] * self.gamma_max  # pooled over the run
        self.steps: dict[int, list[float]] = {}  # rows -> costs.step(rows, G) for G = 0..gamma_max
        self.seen = [0.0] * 4  # past R_t: seconds taken, then predicted, of plain steps; of drafting steps

    def width(self, batch: Sequence[Row]) -> int:
        """G for this step of `batch`: the best expected tokens per second, or a probe."""
        present = {id(row) for row in batch}
        self.rows = {key: kept for key, kept in self.rows.items() if key in present}
        pool = [(p + PRIOR[0]) / (r + PRIOR[1]) for p, r in zip(self.passed, self.reached)]
        tokens = [0.0] * (self.gamma_max + 1)  # tokens[G] = sum_b E_b(min(G, room_b - 1))
        for row in batch:
            tokens = list(map(add, tokens, self._expected(row, pool, min(self.gamma_max, row.room() - 1))))
        rates = [t / c for t, c in zip(tokens, self._steps(len(batch)))]
        best = rates.index(max(rates))  # the shortest of equally good lengths
        if best:
            self.probes.paid()  # drafting pays: probes start over
            return best
        return rates.index(max(rates[1:]), 1) if self.probes.due() else 0  # a probe drafts its best length

    def _steps(self, R: int) -> list[float]:
        """costs.step(R, G) for G = 0..gamma_max; past the rows timed, corrected by `observe`."""
        if R not in self.steps:
            self.steps[R] = [self.costs.step(R, G) for G in range(self.gamma_max + 1)]
        if R <= self.costs.rows[-1]:
            return self.steps[R]
        plain = self.seen[0] / self.seen[1] if self.seen[1] else 1.0
        drafting = self.seen[2] / self.seen[3] if self.seen[3] else plain
        return [c * (drafting if G else plain) for G, c in enumerate(self.steps[R])]

    def observe(self, rows: int, G: int, seconds: float) -> None:
        """A step of `rows` rows drafting G (0: plain) took `seconds` (drafting, verifying and
        accepting); counted where the table is extrapolated (rows past R_t)."""
        if rows > self.costs.rows[-1]:
            self.seen[2 * bool(G)] += seconds
            self.seen[2 * bool(G) + 1] += self.costs.step(rows, G)

    def _expected(self, row: Row, pool: list[float], top: int) -> list[float]:
        """[E_b(min(G, top)) for G = 0..gamma_max] from the row's counts, smoothed towards the pool."""
        _, reached, passed = self.rows.get(id(row)) or (row, (0,) * self.gamma_max, (0,) * self.gamma_max)
        e, prefix = [1.0], 1.0
        for k in range(top):
            prefix *= (passed[k] + STRENGTH * pool[k]) / (reached[k] + STRENGTH)
            e.append(e[-1] + prefix)
        return e + [e[-1]] * (self.gamma_max - top)

    def record(self, row: Row, drafted: int, accepted: int) -> None:
        """A step of `row` drafted `drafted` tokens, the first `accepted` of them accepted: slot k
        (0-based) was reached if accepted >= k, and passed if accepted > k."""
        if id(row) not in self.rows:
            self.rows[id(row)] = (row, [0] * self.gamma_max, [0] * self.gamma_max)
        _, reached, passed = self.rows[id(row)]
        for k in range(min(drafted, accepted + 1)):
            reached[k] += 1
            self.reached[k] += 1
            passed[k] += k < accepted
            self.passed[k] += k < accepted


def measure(target: Target, draft: Callable[[list[Row], list[int]], Any], rows: list[Row], gamma_max: int,
            copies: int = 1, width: int = 0) -> Costs:
    """Time c_v and c_d at 1 and len(rows) rows (each call REPEATS times, the fastest kept), on
    `rows` (dummy rows of a short context, all of one length, at most ROWS) joined to an emptied
    target cache, which is emptied again after. copies: cached rows per row in a verify call (K
    drafts); width: the widest verify timed, if more than gamma_max + 1 (a tree of width - 1 nodes,
    one call of width tokens per row). Each table is made non-decreasing in w (g), and so is its
    per-row part c(R_t) - c(1), never negative: otherwise noise, which extrapolated to many rows
    would make a wider call cheaper."""
    start, verify, drafts = time.perf_counter(), [], []
    sizes = tuple(dict.fromkeys((1, len(rows))))
    target.keep([])
    for row in rows:
        for _ in range(copies):
            target.join(row.tensor()[:, :-1])  # the loop's invariant: all but the last token cached
    for R in sizes[::-1]:  # the most rows first, then keep fewer
        target.keep(list(range(R * copies)))
        batch = rows[:R]
        cells: list[Callable[[], Any]] = [partial(draft, batch, [g] * R) for g in range(1, gamma_max + 1)]
        widths = range(1, max(gamma_max + 1, width) + 1)
        timed = _fastest(cells + [partial(_extend, target, batch, w, copies) for w in widths], target)
        drafts.append(monotone(timed[:gamma_max]))
        verify.append(monotone(timed[gamma_max:]))
    target.keep([])
    return Costs(sizes, _linear(verify[::-1]), _linear(drafts[::-1]), time.perf_counter() - start)


def _linear(table: list[tuple[float, ...]]) -> tuple[tuple[float, ...], ...]:
    """(1-row costs, R_t-row costs) with the per-row part made non-negative and non-decreasing."""
    one, *many = table
    return (one, *(tuple(map(add, one, monotone([max(m - o, 0.0) for m, o in zip(row, one)]))) for row in many))


def _extend(target: Target, batch: list[Row], w: int, copies: int) -> None:
    """One verify-shaped call: w tokens for each row, then the cache rolled back."""
    ids = torch.tensor([row.ids[-w:] for row in batch for _ in range(copies)], device=target.device)  # (R * K, w)
    target.extend(ids)
    target.rollback(len(batch[0].ids) - 1)


def monotone(xs: list[float]) -> tuple[float, ...]:
    """The non-decreasing sequence closest to xs in squared error (pool adjacent violators)."""
    blocks: list[tuple[float, int]] = []  # (mean, size)
    for x in xs:
        mean, size = x, 1
        while blocks and blocks[-1][0] > mean:
            m, n = blocks.pop()
            mean, size = (m * n + mean * size) / (n + size), n + size
        blocks.append((mean, size))
    return tuple(mean for mean, size in blocks for _ in range(size))


def _fastest(calls: list[Callable[[], Any]], target: Target) -> list[float]:
    """The fastest of REPEATS timings of each call, in rounds over all of them: a change in the
    machine's load while timing falls on every call alike, not on some lengths only."""
    best = [float("inf")] * len(calls)
    for _ in range(REPEATS):
        for i, call in enumerate(calls):
            t = time.perf_counter()
            call()
            target.sync()
            best[i] = min(best[i], time.perf_counter() - t)
    return best
