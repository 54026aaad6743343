"""Per-prompt and total decoding metrics, named as in the literature (docs/lossless.md):

    tau    mean tokens emitted per verification call, bonus token included (plain decoding: 1)
    alpha  accepted draft tokens / drafted tokens
    per-position acceptance[j]  of the iterations that drafted slot j+1, the fraction whose draft
                                was accepted up to it
    histogram[k]  iterations that accepted exactly k draft tokens
    lengths[g]    iterations that drafted exactly g tokens (gamma auto: the lengths chosen)
    tree_sizes[N] with draft trees: iterations that verified a tree of exactly N nodes (a width of
                  N + 1 tokens; N = 0: a step that drafted nothing, tree auto's plain steps included)
    A draft tree (specdiff.trees) counts as a draft of its depth bound g: accepted is the depth of
    the path kept, per-position acceptance[j] the acceptance by depth, alpha per depth drafted.
    costs         the cost table `gamma` auto chose by (Costs, measured by specdiff.adaptive; None: fixed gamma)
    costs_s       seconds this run spent timing that table (0: kept from an earlier run), charged to
                  the first step's rows: in their wall_s, reported as time_s.costs
    outside_vocab new tokens the drafter's draft vocabulary cannot propose (specdiff.vocab; None:
                  its head has every row); draft_vocab_coverage = 1 - outside_vocab / new_tokens
The prefill call counts as a target call but not as an iteration.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator


@dataclass(frozen=True)
class Costs:
    """Seconds of one verify call and one draft call, measured at `rows` = (1, R_t) rows, linear
    in the rows (extrapolated past R_t): verify[i][w - 1] for w = 1..gamma_max + 1 tokens per row
    (or more: a draft tree of N nodes verifies N + 1, specdiff.tree_sizes), draft[i][g - 1] for
    g = 1..gamma_max draft tokens per row."""

    rows: tuple[int, ...]
    verify: tuple[tuple[float, ...], ...]
    draft: tuple[tuple[float, ...], ...]
    measured_s: float = 0.0  # what measuring them took

    @property
    def gamma_max(self) -> int:
        return len(self.draft[0])

    def step(self, rows: int, G: int) -> float:
        """c_v(rows, G + 1) + c_d(rows, G): a step of `rows` rows drafting G tokens each."""
        return self.verified(rows, G + 1) + (self.drafted(rows, G) if G else 0.0)

    def verified(self, rows: int, w: int) -> float:
        """c_v(rows, w): one target call of w tokens for each of `rows` rows."""
        return self._at(self.verify, rows, w - 1)

    def drafted(self, rows: int, g: int) -> float:
        """c_d(rows, g): drafting g >= 1 tokens for each of `rows` rows."""
        return self._at(self.draft, rows, g - 1)

    def _at(self, table: tuple[tuple[float, ...], ...], rows: int, i: int) -> float:
        if len(self.rows) == 1 or rows <= self.rows[0]:
            return table[0][i]
        f = (rows - self.rows[0]) / (self.rows[-1] - self.rows[0])
        return table[0][i] + f * (table[-1][i] - table[0][i])

    def to_dict(self) -> dict[str, Any]:
        """As metrics report it: seconds per call by rows, widths w = 1..gamma_max + 1 or more (verify)
        and draft lengths g = 1..gamma_max (draft)."""
        return {"rows": list(self.rows), "verify_s": [[round(c, 6) for c in r] for r in self.verify],
                "draft_s": [[round(c, 6) for c in r] for r in self.draft], "measured_s": round(self.measured_s, 3)}


def _grow(xs: list[int], n: int) -> None:
    xs.extend([0] * (n - len(xs)))


@dataclass
class Metrics:
    new_tokens: int = 0
    wall_s: float = 0.0
    target_calls: int = 0
    drafter_calls: int = 0
    iterations: int = 0
    drafted: int = 0
    accepted: int = 0
    accepted_at: list[int] = field(default_factory=list)  # iterations accepting >= j+1 tokens
    drafted_at: list[int] = field(default_factory=list)  # iterations drafting >= j+1 tokens
    histogram: list[int] = field(default_factory=list)  # iterations accepting exactly k tokens
    lengths: list[int] = field(default_factory=list)  # iterations drafting exactly g tokens
    tree_sizes: list[int] = field(default_factory=list)  # tree iterations verifying exactly N nodes
    draft_s: float = 0.0
    verify_s: float = 0.0
    control_s: float = 0.0  # choosing draft lengths (gamma auto)
    costs_s: float = 0.0  # timing the cost table gamma auto chooses by (before the first step)
    costs: Costs | None = None
    prompts: int = 0
    stop_reason: str = ""
    outside_vocab: int | None = None

    def record(self, accepted: int, drafted: int) -> None:
        """One verification iteration that accepted `accepted` of `drafted` draft tokens."""
        self.iterations += 1
        self.drafted += drafted
        self.accepted += accepted
        _grow(self.accepted_at, drafted)
        _grow(self.drafted_at, drafted)
        _grow(self.histogram, accepted + 1)
        _grow(self.lengths, drafted + 1)
        self.lengths[drafted] += 1
        for j in range(drafted):
            self.drafted_at[j] += 1
            self.accepted_at[j] += j < accepted
        self.histogram[accepted] += 1

    def record_tree(self, nodes: int) -> None:
        """The iteration just recorded verified a draft tree of `nodes` nodes."""
        _grow(self.tree_sizes, nodes + 1)
        self.tree_sizes[nodes] += 1

    @contextmanager
    def timed(self, part: str, sync: Callable[[], None] | None = None) -> Iterator[None]:
        """Add the time spent in the block to `draft_s`, `verify_s`, `control_s` or `costs_s`."""
        start = time.perf_counter()
        yield
        if sync:
            sync()
        setattr(self, f"{part}_s", getattr(self, f"{part}_s") + time.perf_counter() - start)

    @property
    def tau(self) -> float:
        return (self.accepted + self.iterations) / self.iterations if self.iterations else 1.0

    @property
    def alpha(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_s if self.wall_s > 0 else 0.0

    def merge(self, other: "Metrics") -> "Metrics":
        """Sum of two runs (counts, times and histograms add; the first cost table is kept)."""
        out = Metrics(prompts=self.prompts + other.prompts, costs=self.costs or other.costs)
        if self.outside_vocab is not None or other.outside_vocab is not None:
            out.outside_vocab = (self.outside_vocab or 0) + (other.outside_vocab or 0)
        for name in ("new_tokens", "wall_s", "target_calls", "drafter_calls", "iterations",
                     "drafted", "accepted", "draft_s", "verify_s", "control_s", "costs_s"):
            setattr(out, name, getattr(self, name) + getattr(other, name))
        for name in ("accepted_at", "drafted_at", "histogram", "lengths", "tree_sizes"):
            a, b = list(getattr(self, name)), list(getattr(other, name))
            _grow(a, len(b))
            _grow(b, len(a))
            setattr(out, name, [x + y for x, y in zip(a, b)])
        return out

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "new_tokens": self.new_tokens,
            "wall_s": round(self.wall_s, 6),
            "tokens_per_s": round(self.tokens_per_s, 3),
            "target_calls": self.target_calls,
            "drafter_calls": self.drafter_calls,
            "iterations": self.iterations,
            "tau": round(self.tau, 4),
            "alpha": None if self.alpha is None else round(self.alpha, 4),
            "per_position_acceptance": [round(a / n, 4) for a, n in zip(self.accepted_at, self.drafted_at)],
            "accepted_length_histogram": list(self.histogram),
            "draft_length_histogram": list(self.lengths),
            **({"tree_size_histogram": list(self.tree_sizes)} if self.tree_sizes else {}),
            "time_s": {"draft": round(self.draft_s, 6), "verify": round(self.verify_s, 6),
                       "control": round(self.control_s, 6), "costs": round(self.costs_s, 6),
                       "other": round(max(self.wall_s - self.draft_s - self.verify_s - self.control_s
                                          - self.costs_s, 0.0), 6)},
        }
        if self.costs is not None:
            d["draft_costs"] = self.costs.to_dict()
        if self.outside_vocab is not None:
            d["outside_vocab"] = self.outside_vocab
            d["draft_vocab_coverage"] = round(1 - self.outside_vocab / self.new_tokens, 4) if self.new_tokens else None
        if self.stop_reason:
            d["stop_reason"] = self.stop_reason
        if self.prompts:
            d["prompts"] = self.prompts
        return d


class Clock:
    """Decoding seconds of one row decoded alone (the block-diffusion loops): time spent inside
    its loop, not in the loop's consumer. `pause(row)` also records the row's tokens and stop."""

    def __init__(self, m: Metrics):
        self.m = m
        self.resume()

    def resume(self) -> None:
        self.t = time.perf_counter()

    def pause(self, row: Any) -> None:
        self.m.wall_s += time.perf_counter() - self.t
        self.m.new_tokens = len(row.new_tokens)
        self.m.stop_reason = row.stop_reason
