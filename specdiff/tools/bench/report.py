"""The report: each row's speeds, acceptance, call costs and ideal speed-up, its speed-up over ar
in the same round, the greedy check against ar, and which speed-ups the rounds' spread voids.
May import: bench.config, bench.measure, tools.callstats and the library.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict

from ...metrics import Metrics
from ..callstats import mean_seconds, verifications
from .config import Settings, Variant
from .measure import Repeat

def spread(xs: list[float]) -> dict:
    q = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else [xs[0]] * 3
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "q1": q[0], "q3": q[2],
            "runs": xs}


def _acceptance(r: Repeat, encoded: list[list[int]], batched: bool) -> Metrics:
    """Acceptance from the target's calls (every method alike), or, when a call served several
    prompts, from the loop's own per-prompt metrics."""
    m = Metrics()
    if batched:
        for own in r.metrics:
            m = m.merge(own or Metrics())
        return m
    for ids, tokens, calls in zip(encoded, r.tokens, r.calls):
        for drafted, accepted in verifications(calls["target"], len(ids), len(tokens)):
            m.record(accepted, drafted)
    return m


def _median_of(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def row_of(v: Variant, repeats: list[Repeat], encoded: list[list[int]]) -> dict:
    """Speeds over all passes; acceptance, counts and time split from the median pass; call costs
    as the median over passes of each pass's mean (robust to a pass hit by a noisy neighbour)."""
    mid = sorted(repeats, key=lambda r: r.tokens_per_s)[(len(repeats) - 1) // 2]
    target, drafter = mid.role_calls("target"), mid.role_calls("drafter")
    m = _acceptance(mid, encoded, v.batch_size > 1 or not v.logged).to_dict()
    histogram = m["accepted_length_histogram"]
    histogram += [0] * (len(m["per_position_acceptance"]) + 1 - len(histogram))  # k = 0..gamma
    wall, verify, draft = sum(mid.seconds), sum(c.seconds for c in target), sum(c.seconds for c in drafter)
    if not v.logged:  # no call log: the loop's own split
        verify, draft = m["time_s"]["verify"], m["time_s"]["draft"]
    cost = {key: _median_of([mean_seconds(r.role_calls(role), prefill) for r in repeats])
            for key, role, prefill in (("prefill", "target", True), ("verify", "target", False),
                                       ("drafter", "drafter", False))}
    return {
        "label": v.label, **asdict(v),
        "tokens_per_s": spread([r.tokens_per_s for r in repeats]), "new_tokens": sum(map(len, mid.tokens)),
        "tokens_per_s_per_row": statistics.median([r.tokens_per_s for r in repeats]) / v.batch_size,
        "wall_s": wall, "iterations": m["iterations"], "tau": m["tau"], "alpha": m["alpha"],
        "per_position_acceptance": m["per_position_acceptance"],
        "accepted_length_histogram": histogram,
        "time_s": {"draft": draft, "verify": verify, "other": max(wall - draft - verify, 0.0)},
        "calls": {"target": len(target), "target_prefill": sum(c.prefill for c in target), "drafter": len(drafter),
                  "drafter_per_iteration": len(drafter) / m["iterations"] if m["iterations"] else 0.0},
        "call_cost_s": cost,
    }


def _ideal(row: dict, c_1: float | None) -> dict:
    """S_ideal = tau * c_1 / (c_v + n_d * c_d) and measured / ideal."""
    cost, n_d = row["call_cost_s"], row["calls"]["drafter_per_iteration"]
    c_v, c_d = cost["verify"], cost["drafter"] or 0.0
    ideal = row["tau"] * c_1 / (c_v + n_d * c_d) if c_1 and c_v else None
    return {"speedup": ideal, "c_1": c_1, "c_v": c_v, "c_d": c_d, "n_d": n_d,
            "measured_over_ideal": row["speedup"] / ideal if ideal else None}


def _mismatches(reference: list[list[int]], got: list[list[int]]) -> list[dict]:
    """Each prompt whose tokens differ: where they first differ and the two tokens there."""
    out = []
    for i, (a, b) in enumerate(zip(reference, got)):
        if a != b:
            j = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            out.append({"prompt": i, "position": j, "ar": a[j] if j < len(a) else None,
                        "got": b[j] if j < len(b) else None})
    return out


def _first_mismatches(reference: list[list[int]], passes: list[list[list[int]]]) -> list[dict]:
    """The mismatches of the first pass that differs from the reference (every pass is checked)."""
    for tokens in passes:
        found = _mismatches(reference, tokens)
        if found:
            return found
    return []


SPREAD_LIMIT = 0.5  # (max - min) / median of tokens/s over rounds; README, Benchmark, says why
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


def make_report(out: list[tuple[dict, list[Repeat]]], s: Settings, env: dict, context: dict) -> dict:
    """Speed-up: per round of passes, a variant's tokens/s over ar's (at the same temperature) in
    the same round; the median over rounds, and its range."""
    temperature = {id(row): s.temperature if row["temperature"] is None else row["temperature"] for row, _ in out}
    refs = {temperature[id(row)]: (row, passes) for row, passes in reversed(out) if row["method"] == "ar"}
    failed = []
    for row, passes in out:
        (ar, ar_passes), greedy = refs[temperature[id(row)]], temperature[id(row)] == 0
        c_1 = ar["call_cost_s"]["verify"]
        ratios = [p.tokens_per_s / a.tokens_per_s for p, a in zip(passes, ar_passes)]
        row["speedup"] = statistics.median(ratios)
        row["speedup_range"] = [min(ratios), max(ratios)]
        row["ideal"] = _ideal(row, c_1)
        row["unreliable"] = [] if row is ar else unreliable(
            row["tokens_per_s"]["runs"], ar["tokens_per_s"]["runs"], row["speedup_range"])
        row["mismatches"] = _first_mismatches(ar_passes[0].tokens, [p.tokens for p in passes]) if greedy else []
        row["matches_ar"] = not row["mismatches"] if greedy else None
        if row["mismatches"]:
            failed.append(row["label"])
    greedy = 0 in temperature.values()
    check = {"greedy": greedy, "passed": not failed if greedy else None, "mismatched": failed}
    config = {**asdict(s), **context}
    noisy = [row["label"] for row, _ in out if row["unreliable"]]
    reliability = {"spread_limit": SPREAD_LIMIT, "unreliable": noisy, "advice": ADVICE if noisy else None}
    return {"config": config, "environment": env, "check": check, "reliability": reliability,
            "rows": [row for row, _ in out]}
