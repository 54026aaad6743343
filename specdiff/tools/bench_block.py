"""`specdiff bench` on a block-diffusion target: `block` (the reference), `simsd-exact` and `simsd`
side by side, timed through the same plan / generate path as `specdiff generate`.

    report = run_block(models, prompts, ["block", "simsd-exact", "simsd"], Settings(), steps=(4,),
                       gammas=(1, 4), remasking="static", threshold=0.9)

Rows: each method at each step count; simsd-exact also at each gamma (draft transitions per
verification). Passes are round-robin (pass i of every row, then pass i + 1), as in bench.run. Per row: tokens/s
(spread over passes), speed-up over block (median over passes of the per-pass ratio), tokens per
target call, drafter calls, alpha (accepted / drafted transitions or tokens), and agreement with
block: the prompts whose tokens equal block's and the mean fraction of block's tokens matched
before the first difference. `exact` says whether a method claims block's output
(simsd-exact does; simsd, the published approximate method, does not). The report has a causal
target's shape (bench.make_report): config, environment, check (greedy: every exact row's tokens are
block's), reliability (speed-ups the rounds' spread voids) and rows, each with its label.
"""

from __future__ import annotations

import statistics
from typing import Any, Callable, Sequence

from ..settings import BlockSettings
from ..generation import Output, Plan, iter_generate, plan, torch_threads
from ..methods import METHODS
from ..metrics import Metrics
from .bench import CpuLoad, Models, Settings, environment, spread, unreliable
from .bench.report import ADVICE, SPREAD_LIMIT

BLOCK_METHODS = tuple(name for name, m in METHODS.items() if m.target == "block-diffusion")


def _prefix_fraction(reference: list[int], got: list[int]) -> float:
    """Fraction of reference's tokens that got matches before their first difference."""
    n = next((i for i, (a, b) in enumerate(zip(reference, got)) if a != b), min(len(reference), len(got)))
    return n / len(reference) if reference else 1.0


def _plan(models: Models, method: str, s: Settings, **draft: Any) -> Plan:
    """The row's plan, given only the draft settings its method reads (plan() refuses the others:
    simsd reads none) and `threshold` only for dynamic remasking."""
    given = {k: v for k, v in draft.items() if k in METHODS[method].settings and v is not None}
    if given.get("remasking") != "dynamic":
        given.pop("threshold", None)
    return plan(target=models.target, drafter=models.drafter if method != "block" else None, method=method,
                temperature=s.temperature, max_new_tokens=s.max_new_tokens, seed=s.seed, **given)


def run_block(models: Models, prompts: list[str], methods: Sequence[str], s: Settings, *,
              steps: Sequence[int | None] = (None,), gammas: Sequence[int | None] = (None,),
              remasking: str | None = None, threshold: float | None = None,
              log: Callable[[str], None] = lambda msg: None) -> dict[str, Any]:
    """Time each method at each step count (module docstring); -> the report."""
    rows = [(m, t, g) for t in steps for m in BLOCK_METHODS if m in methods or m == "block"
            for g in (gammas if m == "simsd-exact" else (None,))]
    plans = [_plan(models, m, s, steps=t, gamma=g, remasking=remasking, threshold=threshold) for m, t, g in rows]
    with torch_threads(s.threads):
        with CpuLoad() as load:
            for (m, t, g), p in zip(rows, plans):
                if s.warmup:
                    log(f"bench: warm-up {m} steps={_steps(p)}{f' gamma={g}' if g else ''}")
                for _ in range(s.warmup):
                    list(iter_generate(prompts, p, s.truncate_prompt))
            passes: list[list[list[Output]]] = [[] for _ in rows]  # per row, per pass, per prompt
            for i in range(s.repeats):
                log(f"bench: timed pass {i + 1}/{s.repeats} of {len(rows)} rows")
                for p, out in zip(plans, passes):
                    out.append(list(iter_generate(prompts, p, s.truncate_prompt)))
        env = environment(models, load)  # the threads it ran with
    table = _rows(rows, plans, passes)
    return {"config": {**vars(s), "prompts": len(prompts), "remasking": remasking, "threshold": threshold},
            "environment": env, **checks(table, s.temperature == 0), "rows": table}


def checks(rows: list[dict[str, Any]], greedy: bool) -> dict[str, Any]:
    """The report's `check` and `reliability`, shaped as a causal target's (bench.make_report):
    greedy, every exact method's tokens are block's; which speed-ups the rounds' spread voids."""
    failed = [r["label"] for r in rows if greedy and r["exact"] and r["identical_prompts"] < r["prompts"]]
    noisy = [r["label"] for r in rows if r["unreliable"]]
    return {"check": {"greedy": greedy, "passed": not failed if greedy else None, "mismatched": failed},
            "reliability": {"spread_limit": SPREAD_LIMIT, "unreliable": noisy, "advice": ADVICE if noisy else None}}


def _rows(rows: list[tuple[str, int | None, int | None]], plans: list[Plan],
          passes: list[list[list[Output]]]) -> list[dict[str, Any]]:
    reference: dict[int, list[list[Output]]] = {_steps(p): ps for p, ps in zip(plans, passes)
                                                if p.method.name == "block"}
    out = []
    for (m, _, g), p, ps in zip(rows, plans, passes):
        block = _block(p)
        ref = reference[_steps(p)]
        speeds = [_total(o).tokens_per_s for o in ps]
        ratios = [a / _total(r).tokens_per_s for a, r in zip(speeds, ref)]  # per round, over block's
        total = _total(ps[0])
        agree = [_prefix_fraction(r.tokens, o.tokens) for r, o in zip(ref[0], ps[0])]
        ref_speeds = [_total(r).tokens_per_s for r in ref]
        label = f"{m} T={block.steps}" + (f" g={block.gamma}" if g else "")
        why = [] if m == "block" else unreliable(speeds, ref_speeds, [min(ratios), max(ratios)])
        out.append({"label": label, "method": m, "steps": block.steps, "gamma": g and block.gamma,
                    "remasking": block.remasking, "exact": METHODS[m].exact,
                    "tokens_per_s": spread(speeds), "speedup": statistics.median(ratios),
                    "speedup_range": [min(ratios), max(ratios)], "speedup_runs": ratios,
                    "new_tokens": total.new_tokens,
                    "target_calls": total.target_calls, "drafter_calls": total.drafter_calls,
                    "tokens_per_target_call": total.new_tokens / max(total.target_calls, 1), "alpha": total.alpha,
                    "identical_prompts": sum(a == 1.0 and len(r.tokens) == len(o.tokens)
                                             for a, r, o in zip(agree, ref[0], ps[0])),
                    "prompts": len(agree), "agreement": sum(agree) / len(agree), "unreliable": why})
    return out


def _block(p: Plan) -> BlockSettings:
    """The block settings of a block-diffusion target's plan (which always has them)."""
    assert isinstance(p.draft, BlockSettings)
    return p.draft


def _steps(p: Plan) -> int:
    """Its denoising steps per block, as prepared (methods.blocks: never None)."""
    steps = _block(p).steps
    assert steps is not None
    return steps


def _total(outputs: list[Output]) -> Metrics:
    total = Metrics()
    for o in outputs:
        total = total.merge(o.metrics)
    return total


def format_block_table(report: dict[str, Any]) -> str:
    head = f"{'method':<12} {'T':>3} {'g':>3} {'tok/s':>8} {'speedup':>8} {'tok/call':>9} {'alpha':>6} {'agree':>6}  exact"
    lines = [head]
    for r in report["rows"]:
        alpha = "-" if r["alpha"] is None else f"{r['alpha']:.2f}"
        lines.append(f"{r['method']:<12} {r['steps']:>3} {r['gamma'] or '-':>3} {r['tokens_per_s']['median']:>8.1f} {r['speedup']:>7.2f}x "
                     f"{r['tokens_per_target_call']:>9.2f} {alpha:>6} {r['agreement']:>6.2f}  "
                     f"{'yes' if r['exact'] else 'no (approximate)'}")
    return "\n".join(lines)
