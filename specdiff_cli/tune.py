"""`specdiff tune`: measure the exact configurations that can serve a pair's target on this machine
and record the fastest for generate (specdiff.generation.tuned)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import click

from .bench import _list, bench
from .flags import gamma
from .threads import default_threads, threads_option


@click.command()
@click.option("--pair", help="The pair whose target is tuned: every installed pair with the same target is a "
                             "candidate [default: the default pair].")
@click.option("--num-prompts", type=click.IntRange(min=1), default=3, show_default=True,
              help="Held-out prompts each configuration decodes (the pair's set).")
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=48, show_default=True)
@click.option("--repeats", type=click.IntRange(min=1), default=2, show_default=True,
              help="Timed rounds, the configurations interleaved in each.")
@click.option("--tree", "trees", callback=_list(gamma, "integers or auto", setting="tree"), metavar="LIST",
              help="Draft tree sizes each drafter is timed with: 0 = a chain, auto = sized each step "
                   "[default: 0,auto].")
@click.option("--runtime", type=click.Choice(["torch", "onnxruntime"]),
              help="torch: time the torch models only; onnxruntime: their exported graphs too [default: onnxruntime "
                   "when installed, else torch].")
@click.option("--out", metavar="DIR", help="Keep bench's report (bench.json, table) here.")
@threads_option
@click.pass_context
def tune(ctx: click.Context, pair: str | None, num_prompts: int, max_new_tokens: int, repeats: int,
         trees: tuple[int | str, ...] | None, runtime: str | None, out: str | None, threads: int | None) -> None:
    """Find the fastest exact configuration for a pair's target on this machine and keep it.

    Times, in interleaved rounds after one untimed round, plain decoding and every drafter that a
    models.yaml pair gives the same target (each with its pair's method and gamma, as a chain and
    as a tree sized each step), on torch and, when installed, on ONNX Runtime (the models exported
    once into the user cache); checks every greedy answer against plain decoding's token by token;
    records the fastest identical configuration in the user cache. `specdiff generate` given no
    model, method, draft setting or runtime then runs it, and --stats says "tuned on this
    machine, DATE". A record made with other versions, hardware or weights is ignored.

    \b
    Examples:
      specdiff tune                      # the default pair's target: minutes (exports: once)
      specdiff tune --pair demo --repeats 1
    """
    from specdiff.generation import tuned
    from specdiff.registry import as_registry

    registry = as_registry(None)
    pair = pair or registry.default_pair()
    _check_causal(pair, registry)
    candidates = _candidates(pair, registry)
    keep = Path(out) if out else Path(tempfile.mkdtemp(prefix="specdiff-tune."))
    threads = threads or default_threads()
    try:
        ctx.invoke(bench, pair=pair, others=tuple(d for _, d, _ in candidates[1:]),
                   methods=("ar", *(m for _, _, m in candidates)), gammas=(_gamma(pair, registry),),
                   trees=trees or (0, "auto"), runtime=_graph_runtime(runtime),
                   num_prompts=num_prompts, max_new_tokens=max_new_tokens, repeats=repeats, warmup=1,
                   threads=threads, check=True, no_plots=True, out=str(keep))
        report = json.loads((keep / "bench.json").read_text(encoding="utf-8"))
    finally:
        if out is None:
            shutil.rmtree(keep, ignore_errors=True)
    best = {rt: _entry(fastest([r for r in report["rows"] if r["runtime"] == rt]), candidates, pair, threads)
            for rt in dict.fromkeys(r["runtime"] for r in report["rows"])}
    path = tuned.write(pair, best, registry)
    _, measured = max(best.values(), key=lambda e: float(e[1]["tokens_per_s"]))
    click.echo(f"tuned {pair}: {measured['label']}, {measured['speedup_over_torch_ar']:.2f}x plain decoding with "
               f"torch ({measured['tokens_per_s']:.1f} tokens/s, {threads} thread{'s' * (threads > 1)}); "
               f"recorded in {path}")


def _check_causal(pair: str, registry: Any) -> None:
    """tune times causal LM targets (their drafters, trees and runtimes): a block-diffusion pair
    is refused in one line before anything loads."""
    from specdiff.errors import UsageError
    from specdiff.loading import is_block_checkpoint

    if is_block_checkpoint(registry.pair(pair).target, ("target",), registry):
        raise UsageError(f"specdiff tune times causal LM targets; '{pair}' is a block-diffusion pair: compare its "
                         "methods with specdiff bench")


def _entry(row: dict[str, Any], candidates: list[tuple[str, str, str]], pair: str,
           threads: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """A bench row -> (the configuration generate runs, what was measured)."""
    owner = next((p for p, _, m in candidates if m == row["method"]), pair)  # ar: the tuned pair
    config = {"pair": owner, "method": row["method"], "gamma": row["gamma"], "tree": row["tree"] or 0,
              "steps": row["steps"], "schedule": row["schedule"], "runtime": row["runtime"], "threads": threads}
    return config, {"tokens_per_s": row["tokens_per_s"]["median"], "speedup_over_torch_ar": row["speedup"],
                    "label": row["label"]}


def fastest(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The row with the most tokens/s (median over rounds) among those identical to plain decoding
    (ar itself counts: it may be the fastest)."""
    exact = [r for r in rows if r.get("matches_ar") is not False]
    return max(exact, key=lambda r: r["tokens_per_s"]["median"])


def _candidates(pair: str, registry: Any) -> list[tuple[str, str, str]]:
    """(pair, drafter, method) of each candidate: the tuned pair, then the first pair of each other
    drafter kind with its target whose kind exports (bench runs --also-drafter on both runtimes)."""
    from specdiff.generation.tuned import candidate_pairs
    from specdiff.kinds import get_kind
    from specdiff.methods import get_method

    chosen: list[tuple[str, str, str]] = []
    kinds: set[str] = set()
    for p in candidate_pairs(pair, registry):
        entry = registry.pair(p)
        method = entry.defaults.get("method")
        needs = get_method(method).needs if method else None
        if needs is not None and needs not in kinds and (p == pair or get_kind(needs).graph is not None):
            chosen.append((p, entry.drafter, method))
            kinds.add(needs)
    return chosen


def _gamma(pair: str, registry: Any) -> int:
    from specdiff.settings import DEFAULTS

    gamma = registry.pair(pair).defaults.get("gamma")
    return gamma if isinstance(gamma, int) else int(DEFAULTS["gamma"])


def _graph_runtime(runtime: str | None) -> str | None:
    """The runtime bench times graphs on beside torch (None: torch only)."""
    if runtime is None:
        installed = all(importlib.util.find_spec(m) is not None for m in ("onnx", "onnxruntime"))
        return "onnxruntime" if installed else None
    return None if runtime == "torch" else runtime
