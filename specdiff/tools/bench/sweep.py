"""The rows of a bench: each method at each setting it reads (the registry's Method.settings),
rule, temperature, batch size and runtime (variants), and the checks that they can run.
May import: bench.config and the library.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterable, Iterator, Sequence

from ... import selection
from ...acceptance import RULES
from ...drafters.diffusion import get_schedule
from ...contracts import Drafter
from ...errors import IncompatibleModelsError, UsageError
from ...generation import DEFAULT_STEPS, DEFAULTS
from ...kinds import get_kind
from ...settings import AUTO
from ...methods import METHODS as REGISTRY
from .config import METHODS, NEEDS, Models, Variant

def variants(methods: Sequence[str], gammas: Sequence[int | str] = (DEFAULTS["gamma"],),
             steps: Sequence[int | None] = (None,), schedules: Sequence[str] = (DEFAULTS["schedule"],),
             drafts: Sequence[int | None] = (None,), rules: Sequence[str | None] = (None,),
             temperatures: Sequence[float | None] = (None,), batch_sizes: Sequence[int] = (1,),
             runtimes: Sequence[str] = ("torch",), trees: Sequence[int | str | None] = (None,)) -> list[Variant]:
    """One row per method and setting, at each temperature; `ar` first. specdiff sweeps gamma x
    schedule x steps (T is at most gamma; a schedule with a fixed step count, e.g. oneshot, gets
    only that) x drafts; the other drafting methods sweep gamma. A gamma "auto" (specdiff.adaptive)
    runs for the methods that choose their draft length (spec-ar, specdiff). `trees`: tree sizes
    (0: a chain; auto: chosen each step) for the methods that read `tree` (spec-ar, specdiff at
    steps 1, dflash), on fixed gammas.
    Drafting rows sweep the rules that fit them (`fits`; none: the default rule). specdiff's own methods (not the peers) run
    each batch size and on each of `runtimes` ("torch": eager; "compiled"; a graph runtime, which
    runs ar and specdiff: exports hold a target and a diffusion drafter)."""
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise UsageError(f"unknown method '{unknown[0]}' (choose from {', '.join(METHODS)})")
    if any(g != AUTO and not isinstance(g, int) for g in gammas):
        raise UsageError(f"gamma values must be integers or {AUTO}, got {', '.join(map(str, gammas))}")
    fixed: list[int] = [g for g in gammas if isinstance(g, int)]
    for name, values in (("gamma", fixed), ("steps", steps), ("drafts", drafts), ("batch_size", batch_sizes)):
        if any(v is not None and v < 1 for v in values):
            raise UsageError(f"{name} values must be >= 1, got {', '.join(map(str, values))}")
    if any(t is not None and t != AUTO and not (isinstance(t, int) and t >= 0) for t in trees):
        raise UsageError(f"tree values must be integers >= 0 or {AUTO}, got {', '.join(map(str, trees))}")
    check_unique(methods=methods, gammas=gammas, steps=steps, schedules=schedules, drafts=drafts, rules=rules,
                 temperatures=temperatures, batch_sizes=batch_sizes, trees=trees)
    check_rules(rules)
    rows = []
    for temperature in temperatures:
        rows.append(Variant("ar", temperature=temperature))
        for v in _treed(_drafting(methods, gammas, steps, schedules), trees):
            for k in drafts if "drafts" in _settings(v.method) and not v.tree else (None,):
                fit: list[str | None] = [r for r in rules if r is not None and (
                    fits_tree(r, temperature, v.method) if v.tree else fits(r, k or 1, temperature))]
                rows += [replace(v, drafts=k, acceptance=r, temperature=temperature) for r in fit or [None]]
    unused = [r for r in rules if r is not None and r not in {v.acceptance for v in rows}]
    if unused:
        raise UsageError(f"acceptance rule '{unused[0]}' fits none of the rows (single-draft rules for one draft, "
                         "greedy / select / multi for `drafts` > 1, greedy only at `temperature` 0; ar uses none)")
    swept = [replace(v, batch_size=b, runtime=r) for v in rows for b in batch_sizes for r in dict.fromkeys(runtimes)]
    labels = [v.label for v in swept if _runs(v)]
    twice = next((label for i, label in enumerate(labels) if label in labels[:i]), None)
    if twice is not None:  # bench.json and the summary key rows by label: one would hide the other
        raise UsageError(f"two rows would both be '{twice}': give values that differ in what the label shows")
    return [v for v in swept if _runs(v)]


def check_unique(**lists: Sequence[object]) -> None:
    """Each swept list names each value once: `gammas` 4, 4 made two rows of one label, and the
    summary kept one. The CLI refuses its flags' duplicates first (bench's `_list`)."""
    for name, values in lists.items():
        twice = next((v for i, v in enumerate(values) if v in values[:i]), None)
        if twice is not None:
            raise UsageError(f"`{name}` lists {twice} twice: each value is one row; give it once")


# what runs on exported graphs: causal methods with no drafter, or one whose kind has a graph (ar, specdiff, dflash)
GRAPH_METHODS = tuple(m.name for m in REGISTRY.values()
                      if m.target == "causal" and (m.needs is None or get_kind(m.needs).graph is not None))


def _runs(v: Variant) -> bool:
    """The HF peers run eager torch at batch 1; graph runtimes run ar, specdiff and dflash (trees
    too: an exported target takes a tree's mask)."""
    if v.method not in REGISTRY:
        return v.batch_size == 1 and v.runtime == "torch"
    return not v.on_graphs or v.method in GRAPH_METHODS


def _drafting(methods: Sequence[str], gammas: Sequence[int | str], steps: Sequence[int | None],
              schedules: Sequence[str]) -> Iterator[Variant]:
    for method in [m for m in METHODS if m in methods and m != "ar"]:
        for g in [g for g in gammas if g != AUTO or "adaptive" in _settings(method)]:
            if "steps" not in _settings(method):
                yield Variant(method, g)
                continue
            for s in schedules:
                fixed = get_schedule(s).fixed_steps
                for t in dict.fromkeys([fixed] if fixed else [_at_most(t or DEFAULT_STEPS, g) for t in steps]):
                    yield Variant(method, g, t, s)


def _treed(rows: Iterable[Variant], trees: Sequence[int | str | None]) -> Iterator[Variant]:
    """Each row at each tree size where its method reads `tree`, its gamma is fixed (a tree's
    depth bound) and it denoises in one step (specdiff: a tree ranks the one-call marginals); a
    chain (tree None or 0) everywhere else."""
    for v in rows:
        treed = "tree" in _settings(v.method) and v.gamma != AUTO and v.steps in (None, 1)
        sizes = [t or None for t in trees] if treed else [None]
        yield from (replace(v, tree=t) for t in dict.fromkeys(sizes))


def _at_most(steps: int, gamma: int | str) -> int:
    """T is at most gamma (auto: at most its cap, which the plan knows; T as given)."""
    return steps if gamma == AUTO else min(steps, int(gamma))


def check_rules(rules: Iterable[str | None]) -> None:
    """Every rule named is a known acceptance rule: an unknown one used to fit no row and be dropped."""
    known = list(dict.fromkeys([*RULES, *selection.RULES]))
    for rule in rules:
        if rule is not None and rule not in known:
            raise UsageError(f"unknown acceptance rule '{rule}' (choose from {', '.join(known)})")


def fits(rule: str, drafts: int, temperature: float | None) -> bool:
    """Whether a row with this many drafts, at this temperature (None: unknown), can run the rule:
    single-draft rules for one draft, selection rules for several, greedy only at temperature 0."""
    single = rule in RULES and rule != "multi"
    return (single if drafts == 1 else rule in selection.RULES) and not (rule == "greedy" and temperature)


def fits_tree(rule: str, temperature: float | None, method: str = "dflash") -> bool:
    """Whether a tree row of this method at this temperature runs the rule
    (methods.speculative.tree_rule): greedy at temperature 0, match when sampling, or multi
    (sampled children) for the methods that run multi (specdiff, dflash; not spec-ar)."""
    if temperature == 0:
        return rule == "greedy"
    multi = rule == "multi" and (method not in REGISTRY or "multi" in REGISTRY[method].rules)
    return rule == "match" or multi or (temperature is None and rule == "greedy")


def _settings(method: str) -> tuple[str, ...]:
    """The draft settings a method reads: the registry's declaration; peers take gamma only."""
    return REGISTRY[method].settings if method in REGISTRY else ("gamma",)


def available_methods(models: Models) -> list[str]:
    """The methods these models can run: each needing no drafter, or one of the kind it drafts with."""
    return [m for m in METHODS if NEEDS.get(m) is None or _drafts_with(m, models.drafter_for(m))]


def _drafts_with(method: str, drafter: Drafter | None) -> bool:
    """Whether `method` can draft with `drafter` (the registry's kind; the peers: any AR drafter)."""
    return drafter is not None and (method not in REGISTRY or REGISTRY[method].accepts(drafter))


def check_models(models: Models, rows: list[Variant]) -> None:
    what = {"ar_drafter": "an autoregressive drafter (`ar_drafter`)", "drafter": "a diffusion drafter (`drafter`)"}
    for v in rows:
        if v.on_graphs:
            graphs = models.graphs.get(v.runtime, {})
            drafter = models.drafter_for(v.method, v.runtime)
            needs = REGISTRY[v.method].needs
            if "target" not in graphs or (needs is not None and not REGISTRY[v.method].accepts(drafter)):
                held = "a target" if needs is None else f"a target and {get_kind(needs).what}"
                raise UsageError(f"{v.runtime} rows of '{v.method}' need exported graphs of {held}")
            if graphs["target"].tokenizer.get_vocab() != models.target.tokenizer.get_vocab():
                raise IncompatibleModelsError(f"the exported target's tokenizer differs from {models.target.name}'s: "
                                              "its rows would not be the same model's")
        if v.method not in NEEDS:
            continue
        drafter = models.drafter_for(v.method)
        if drafter is None:
            raise UsageError(f"method '{v.method}' needs {what[NEEDS[v.method]]}")
        if v.method in REGISTRY:  # a drafter of the kind it drafts with
            REGISTRY[v.method].check_drafter(drafter)
