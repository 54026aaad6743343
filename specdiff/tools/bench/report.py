"""The report: each row's speeds, acceptance, call costs and ideal speed-up, its speed-up over ar
in the same round, its calls beside the hardware's floor, the greedy check against ar, and which
speed-ups the rounds' spread voids.
May import: bench.config, bench.measure, tools.callstats, tools.roofline and the library.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, fields
from typing import Any

from ...metrics import Metrics
from ...vocab import DraftVocab
from ..callstats import mean_seconds, verifications
from ..roofline import Peaks, WeightCost
from .config import Settings, Variant
from .measure import Repeat


Floor = tuple[Peaks, WeightCost]  # the measured peaks and the target's step cost


@dataclass(frozen=True)
class Measured:
    """What one variant's timed passes measured (row_of): speeds over all passes; acceptance,
    counts and time split from the median pass; call costs (seconds) per role."""

    variant: Variant
    tokens_per_s: dict[str, Any]  # spread()
    new_tokens: int
    tokens_per_s_per_row: float
    wall_s: float
    iterations: int
    tau: float
    alpha: float | None
    per_position_acceptance: list[float]
    accepted_length_histogram: list[int]  # k = 0..gamma accepted draft tokens
    draft_length_histogram: list[int]  # g = 0..gamma drafted tokens per verification (gamma auto: chosen)
    tree_size_histogram: list[int] | None  # N = 0.. nodes per verified tree (tree auto: chosen); None: chains
    draft_costs: dict[str, Any] | None  # the cost table gamma auto chose by (adaptive.Costs; None: fixed)
    time_s: dict[str, float]  # draft, verify, control, other
    calls: dict[str, Any]  # target, target_prefill, drafter, drafter_per_iteration
    call_cost_s: dict[str, float | None]  # prefill, verify, drafter
    memory: dict[str, float | None]
    compile_s: float | None
    draft_vocab: dict[str, Any] | None  # its size and the share of the emitted tokens inside it (specdiff.vocab)


@dataclass(frozen=True)
class ReportRow:
    """One row of bench.json: what was measured, then what comparing it with ar says."""

    measured: Measured
    speedup: float  # median over rounds of its tokens/s over ar's in the same round
    speedup_range: list[float]
    speedup_runs: list[float]  # per round, its tokens/s over ar's in that round
    ideal: dict[str, float | None]
    roofline: dict[str, float | None]  # its verify (ar: decode) call's width and cost over the floor
    width_invariance: dict[str, Any] | None  # its runtime's (tools/invariance.py; None: not probed)
    unreliable: list[str]
    mismatches: list[dict[str, Any]]
    matches_ar: bool | None  # None: not greedy, nothing to compare token by token

    def to_dict(self) -> dict[str, Any]:
        """The row as bench.json holds it, serialised here only."""
        m = self.measured
        measured = {f.name: getattr(m, f.name) for f in fields(m) if f.name != "variant"}
        rest = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "measured"}
        return {"label": m.variant.label, **asdict(m.variant), **measured, **rest}


def spread(xs: list[float]) -> dict[str, Any]:
    q = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else [xs[0]] * 3
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "q1": q[0], "q3": q[2],
            "runs": xs}


def _acceptance(r: Repeat, encoded: list[list[int]], batched: bool) -> Metrics:
    """Acceptance from the target's calls (every method alike), or, when a call served several
    prompts or verified a tree (whose width is its size, not its depth), from the loop's own
    per-prompt metrics."""
    m = Metrics()
    if batched:
        for own in r.metrics:
            m = m.merge(own or Metrics())
        return m
    for ids, tokens, calls in zip(encoded, r.tokens, r.calls):
        for drafted, accepted in verifications(calls["target"], len(ids), len(tokens)):
            m.record(accepted, drafted)
    return m


def _median_of(xs: list[float | None]) -> float | None:
    seen = [x for x in xs if x is not None]
    return statistics.median(seen) if seen else None


def row_of(v: Variant, repeats: list[Repeat], encoded: list[list[int]], memory: dict[str, float | None],
           compile_s: float | None, vocab: DraftVocab | None = None) -> Measured:
    """Speeds over all passes; acceptance, counts and time split from the median pass; call costs
    as the median over passes of each pass's mean (robust to a pass hit by a noisy neighbour)."""
    mid = sorted(repeats, key=lambda r: r.tokens_per_s)[(len(repeats) - 1) // 2]
    target, drafter = mid.role_calls("target"), mid.role_calls("drafter")
    m = _acceptance(mid, encoded, v.batch_size > 1 or not v.logged or bool(v.tree)).to_dict()
    histogram = m["accepted_length_histogram"]
    histogram += [0] * (len(m["per_position_acceptance"]) + 1 - len(histogram))  # k = 0..gamma
    wall, verify, draft = sum(mid.seconds), sum(c.seconds for c in target), sum(c.seconds for c in drafter)
    if not v.logged:  # no call log: the loop's own split
        verify, draft = m["time_s"]["verify"], m["time_s"]["draft"]
    control = sum(own.control_s for own in mid.metrics if own is not None)  # the loop's own, every runtime
    costs = next((own.costs.to_dict() for own in mid.metrics if own is not None and own.costs is not None), None)
    cost = {key: _median_of([mean_seconds(r.role_calls(role), prefill) for r in repeats])
            for key, role, prefill in (("prefill", "target", True), ("verify", "target", False),
                                       ("drafter", "drafter", False))}
    calls = {"target": len(target), "target_prefill": sum(c.prefill for c in target), "drafter": len(drafter),
             "drafter_per_iteration": len(drafter) / m["iterations"] if m["iterations"] else 0.0}
    return Measured(v, spread([r.tokens_per_s for r in repeats]), sum(map(len, mid.tokens)),
                    statistics.median([r.tokens_per_s for r in repeats]) / v.batch_size, wall, m["iterations"],
                    m["tau"], m["alpha"], m["per_position_acceptance"], histogram, m["draft_length_histogram"],
                    m.get("tree_size_histogram") if v.tree else None, costs,
                    {"draft": draft, "verify": verify, "control": control,
                     "other": max(wall - draft - verify - control, 0.0)}, calls, cost,
                    memory, compile_s, _coverage(vocab, mid.tokens))


def _coverage(vocab: DraftVocab | None, tokens: list[list[int]]) -> dict[str, Any] | None:
    """The draft vocabulary's size and the share of the emitted tokens it could have proposed."""
    if vocab is None:
        return None
    emitted = [t for row in tokens for t in row]
    return {"size": vocab.size, "coverage": 1 - vocab.outside(emitted) / len(emitted) if emitted else None}


def _ideal(m: Measured, speedup: float, c_1: float | None) -> dict[str, float | None]:
    """S_ideal = tau * c_1 / (c_v + n_d * c_d) and measured / ideal."""
    n_d = m.calls["drafter_per_iteration"]
    c_v, c_d = m.call_cost_s["verify"], m.call_cost_s["drafter"] or 0.0
    ideal = m.tau * c_1 / (c_v + n_d * c_d) if c_1 and c_v else None
    return {"speedup": ideal, "c_1": c_1, "c_v": c_v, "c_d": c_d, "n_d": n_d,
            "measured_over_ideal": speedup / ideal if ideal else None}


def _mismatches(reference: list[list[int]], got: list[list[int]]) -> list[dict[str, Any]]:
    """Each prompt whose tokens differ: where they first differ and the two tokens there."""
    out = []
    for i, (a, b) in enumerate(zip(reference, got)):
        if a != b:
            j = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            out.append({"prompt": i, "position": j, "ar": a[j] if j < len(a) else None,
                        "got": b[j] if j < len(b) else None})
    return out


def _first_mismatches(reference: list[list[int]], passes: list[list[list[int]]]) -> list[dict[str, Any]]:
    """The mismatches of the first pass that differs from the reference (every pass is checked)."""
    for tokens in passes:
        found = _mismatches(reference, tokens)
        if found:
            return found
    return []


SPREAD_LIMIT = 0.5  # (max - min) / median of tokens/s over rounds; docs/bench.md says why
ADVICE = "for a reliable speed-up: more `repeats`, fewer `threads`, or a quiet machine"


def _relative_spread(xs: list[float]) -> float:
    return (max(xs) - min(xs)) / statistics.median(xs)


def unreliable(runs: list[float], ar_runs: list[float], speedup_range: list[float]) -> list[str]:
    """Why a row's speed-up cannot be trusted ([]: no reason; fewer than 2 rounds: none can be
    seen): its own or ar's tokens/s moved by more than SPREAD_LIMIT of the median across rounds
    (the machine's speed changed by as much as the speed-ups measured), or the per-round ratios
    fall on both sides of 1.0 (faster in one round, slower in another)."""
    if len(runs) < 2:
        return []
    why = [f"{who} tokens/s varied by {_relative_spread(xs):.0%} of the median across rounds (limit {SPREAD_LIMIT:.0%})"
           for who, xs in (("its", runs), ("ar's", ar_runs)) if _relative_spread(xs) > SPREAD_LIMIT]
    low, high = speedup_range
    if low < 1.0 < high:
        why.append(f"its per-round speed-ups [{low:.2f}, {high:.2f}] lie on both sides of 1.0")
    return why


def x_floor(m: Measured, floor: Floor | None) -> dict[str, float | None]:
    """A row's verify calls (ar: its decode calls) beside the hardware's floor (tools/roofline.py):
    their mean width (tokens a row per call: 1 + the mean draft length, or tree size) and cost / floor, the floor
    of a call of batch x width tokens."""
    lengths = m.tree_size_histogram or m.draft_length_histogram  # a tree of N nodes is N + 1 wide
    width = 1 + sum(g * n for g, n in enumerate(lengths)) / sum(lengths) if sum(lengths) else 1.0
    c_v = m.call_cost_s["verify"]
    if floor is None or not c_v:
        return {"width": round(width, 2), "x_floor": None}
    peaks, weights = floor
    return {"width": round(width, 2), "x_floor": round(c_v / peaks.floor_s(weights, round(width * m.variant.batch_size)), 2)}


def roofline_summary(floor: Floor | None) -> dict[str, Any] | None:
    """bench.json's `roofline`: the peaks measured, the weights a step reads, floors at common widths."""
    if floor is None:
        return None
    peaks, weights = floor
    # floors to 3 significant digits: a small model's are microseconds, 2 decimals of a ms were 0.0
    return {**peaks.to_dict(), "params": weights.params, "weight_bytes": weights.bytes,
            "floor_ms": {w: float(f"{peaks.floor_s(weights, w) * 1e3:.3g}") for w in (1, 5, 9, 17)}}


def make_report(out: list[tuple[Measured, list[Repeat]]], s: Settings, env: dict[str, Any],
                context: dict[str, Any], floor: Floor | None = None,
                invariance: dict[str, Any] | None = None) -> dict[str, Any]:
    """Speed-up: per round of passes, a variant's tokens/s over ar's (at the same temperature) in
    the same round; the median over rounds, and its range. -> the report, bench.json's content."""
    def temperature(m: Measured) -> float:
        return s.temperature if m.variant.temperature is None else m.variant.temperature

    refs = {temperature(m): (m, passes) for m, passes in reversed(out) if m.variant.method == "ar"}
    rows = [_compared(m, passes, *refs[temperature(m)], temperature(m) == 0, floor,
                      (invariance or {}).get(m.variant.runtime)) for m, passes in out]
    greedy = any(temperature(m) == 0 for m, _ in out)
    failed = [row.measured.variant.label for row in rows if row.mismatches]
    check = {"greedy": greedy, "passed": not failed if greedy else None, "mismatched": failed}
    noisy = [row.measured.variant.label for row in rows if row.unreliable]
    reliability = {"spread_limit": SPREAD_LIMIT, "unreliable": noisy, "advice": ADVICE if noisy else None}
    return {"config": {**asdict(s), **context}, "environment": env, "roofline": roofline_summary(floor),
            "width_invariance": invariance or {},
            "check": check, "reliability": reliability, "rows": [row.to_dict() for row in rows]}


def _compared(m: Measured, passes: list[Repeat], ar: Measured, ar_passes: list[Repeat], greedy: bool,
              floor: Floor | None, invariance: dict[str, Any] | None) -> ReportRow:
    """The row of `m` beside ar's at its temperature (`ar`: it may be `m` itself)."""
    ratios = [p.tokens_per_s / a.tokens_per_s for p, a in zip(passes, ar_passes)]
    speedup, speedup_range = statistics.median(ratios), [min(ratios), max(ratios)]
    why = [] if m is ar else unreliable(m.tokens_per_s["runs"], ar.tokens_per_s["runs"], speedup_range)
    mismatches = _first_mismatches(ar_passes[0].tokens, [p.tokens for p in passes]) if greedy else []
    return ReportRow(m, speedup, speedup_range, ratios, _ideal(m, speedup, ar.call_cost_s["verify"]),
                     x_floor(m, floor), invariance, why, mismatches, not mismatches if greedy else None)
