"""Side-by-side speed of decoding methods on the same target weights and prompts.

    models, defaults = load_models(target="gpt2-xl", drafter="./drafter", ar_drafter="gpt2")
    report = run(models, prompts, variants(["ar", "specdiff"], gammas=[4, 8]), Settings())
    write_report(report, "bench-out")

Methods: `ar`, `spec-ar`, `specdiff` run specdiff's own loop (generation.plan / iter_generate);
`hf-assisted` (transformers assisted generation with the AR drafter, a constant
num_assistant_tokens = gamma, confidence early exit off) and `hf-prompt-lookup`
(prompt_lookup_num_tokens = gamma) are the peers a user would pick instead. `ar` always runs first:
it is the reference for speed-ups, for c_1 and for the greedy token-by-token check.

Each method: `warmup` untimed passes over all prompts, then `repeats` timed passes (tokens/s =
new tokens / decoding seconds per pass; medians and spread over passes). Every forward call is
logged by hooks (callstats.py), which gives call counts and costs, the draft/verify/other time
split, and tau / alpha / accepted lengths for every method, HF peers included (for batched
variants, where one call serves several prompts, tau / alpha come from the loop's own per-prompt
metrics). Ideal speed-up:
S_ideal = tau * c_1 / (c_v + n_d * c_d) (docs/lossless.md), n_d = drafter calls per
verification (T for specdiff, gamma for an AR drafter).

Batch sizes (`batch_sizes`): specdiff's own methods also run with several prompts per forward pass
(a variant per batch size; the HF peers only at batch 1). A variant's tokens/s is then the
throughput of its batches (new tokens / decoding seconds), `tokens_per_s_per_row` that over the
batch size, and `memory.kv_cache_peak_mb` the largest KV cache its batches held.
"""

from __future__ import annotations

import platform
import resource
import statistics
import time
from contextlib import contextmanager
from pathlib import Path
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch
import transformers
from torch import nn
from transformers.utils import logging as hf_logging

from .callstats import CallLog, mean_seconds, verifications
from .. import selection
from ..acceptance import RULES
from ..drafters.autoregressive import ARDrafter
from ..drafters.diffusion import DiffusionDrafter, get_schedule
from ..errors import IncompatibleModelsError, UsageError
from ..generation import DEFAULT_STEPS, DEFAULTS, TextOptions, encode_prompts, iter_generate, plan, torch_threads
from ..methods import METHODS as REGISTRY, is_block_diffusion
from ..names import PEERS
from ..loading import load_drafter, load_target
from ..metrics import Metrics
from ..registry import Registry, load_registry
from ..resources import data_path
from ..targets.block import BlockDiffusionTarget
from ..targets.causal import CausalLMTarget

METHODS = (*(m for m in REGISTRY if REGISTRY[m].target == "causal"), *PEERS)  # block targets: bench_block.py
SLOTS = {"diffusion": "drafter", "block-diffusion": "drafter", "autoregressive": "ar_drafter"}  # drafter kind -> Models field
NEEDS = {**{m.name: SLOTS[m.needs] for m in REGISTRY.values() if m.needs}, "hf-assisted": "ar_drafter"}
DEFAULT_PROMPTS = data_path("prompts", "heldout.jsonl")


@dataclass
class Models:
    target: CausalLMTarget | BlockDiffusionTarget  # the HF peers call its model
    drafter: DiffusionDrafter | BlockDiffusionTarget | None = None
    ar_drafter: ARDrafter | None = None
    graphs: dict[str, dict] = field(default_factory=dict)  # runtime -> its {"target", "drafter"} (exports)

    def drafter_module(self, method: str) -> nn.Module | BlockDiffusionTarget | None:
        """The module whose forward calls are drafter calls for `method` (None: no drafter)."""
        if NEEDS.get(method) == "drafter":
            return self.drafter
        return self.ar_drafter.model if NEEDS.get(method) == "ar_drafter" and self.ar_drafter else None

    def names(self) -> dict:
        return {"target": self.target.name, "drafter": getattr(self.drafter, "source", None),
                "ar_drafter": getattr(self.ar_drafter, "source", None)}


@dataclass(frozen=True)
class Variant:
    method: str
    gamma: int | None = None
    steps: int | None = None
    schedule: str | None = None
    drafts: int | None = None  # K candidate drafts (None: the plan's default, 1)
    acceptance: str | None = None  # None: Settings.acceptance, else the plan's default
    temperature: float | None = None  # None: Settings.temperature
    batch_size: int = 1
    runtime: str = "torch"  # or "compiled" (specdiff.compiled), or a graph runtime (RUNTIMES)

    @property
    def compiled(self) -> bool:
        return self.runtime == "compiled"

    @property
    def on_graphs(self) -> bool:
        """Whether it runs exported graphs (`Models.graphs`) rather than the torch models."""
        return self.runtime not in ("torch", "compiled")

    @property
    def logged(self) -> bool:
        """Whether its forward calls can be logged by hooks: eager torch only (a hook would make
        torch.compile recompile; exported graphs are no modules)."""
        return self.runtime == "torch"

    @property
    def label(self) -> str:
        parts = [self.method] + ([f"g={self.gamma}"] if self.gamma else [])
        parts += [f"T={self.steps}", str(self.schedule)] if self.steps else []
        parts += ([f"K={self.drafts}"] if self.drafts else []) + ([self.acceptance] if self.acceptance else [])
        parts += [f"t={self.temperature:g}"] if self.temperature is not None else []
        parts += [f"b={self.batch_size}"] if self.batch_size != 1 else []
        return " ".join(parts + ([self.runtime] if self.runtime != "torch" else []))


@dataclass
class Settings:
    max_new_tokens: int = 64
    repeats: int = 3
    warmup: int = 1
    temperature: float = 0.0  # of variants that set none
    acceptance: str | None = None  # rule for spec-ar / specdiff rows that set none; default from plan()
    top_k: int = 0
    top_p: float = 1.0
    draft_temperature: float | None = None  # of rows with drafts > 1
    seed: int = 0
    threads: int | None = None  # torch threads while timing; None: leave as is
    truncate_prompt: bool = False
    chat: bool = False  # prompts go through the target's chat template (every row alike)


def default_prompts(pair: str | None, target: Any, registry: Registry | None = None) -> Path:
    """The prompt file bench uses when given none: the pair's `prompts:`, else DEFAULT_PROMPTS."""
    entry = (registry or load_registry()).chosen_pair(pair, target)
    return entry.prompts if entry is not None and entry.prompts is not None else DEFAULT_PROMPTS


def load_models(*, pair: str | None = None, target: Any = None, drafter: Any = None, ar_drafter: Any = None,
                methods: Sequence[str] = (), device: str = "cpu", dtype: str = "auto",
                registry: Registry | None = None) -> tuple[Models, dict]:
    """Load each model once. -> (models, the pair's defaults). With neither pair nor target, the
    `demo` pair if models.yaml has one. When `methods` need an AR drafter and none is given, the
    pair's `ar_drafter:` is loaded."""
    registry = registry or load_registry()
    if ar_drafter is None and any(NEEDS.get(m) == "ar_drafter" for m in methods):
        ar_drafter = getattr(registry.chosen_pair(pair, target), "ar_drafter", None)
    target, drafter, defaults = registry.resolve(pair, target, drafter)
    models = Models(load_target(target, device=device, dtype=dtype, registry=registry))
    for name, must_be_ar in ((drafter, False), (ar_drafter, True)):
        if name is None:
            continue
        loaded = load_drafter(name, device=device, dtype=dtype, registry=registry)
        if must_be_ar and not isinstance(loaded, ARDrafter):
            raise UsageError(f"ar_drafter '{name}' is not a causal LM")
        diffusion = isinstance(loaded, DiffusionDrafter) or is_block_diffusion(loaded)
        setattr(models, "drafter" if diffusion else "ar_drafter", loaded)
    return models, defaults


def variants(methods: Sequence[str], gammas: Sequence[int] = (DEFAULTS["gamma"],),
             steps: Sequence[int | None] = (None,), schedules: Sequence[str] = (DEFAULTS["schedule"],),
             drafts: Sequence[int | None] = (None,), rules: Sequence[str | None] = (None,),
             temperatures: Sequence[float | None] = (None,), batch_sizes: Sequence[int] = (1,),
             runtimes: Sequence[str] = ("torch",)) -> list[Variant]:
    """One row per method and setting, at each temperature; `ar` first. specdiff sweeps gamma x
    schedule x steps (T is at most gamma; a schedule with a fixed step count, e.g. oneshot, gets
    only that) x drafts; the other drafting methods sweep gamma. Drafting rows sweep the rules
    that fit them (`fits`; none: the default rule). specdiff's own methods (not the peers) run
    each batch size and on each of `runtimes` ("torch": eager; "compiled"; a graph runtime, which
    runs ar and specdiff: exports hold a target and a diffusion drafter)."""
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise UsageError(f"unknown method '{unknown[0]}' (choose from {', '.join(METHODS)})")
    for name, values in (("gamma", gammas), ("steps", steps), ("drafts", drafts), ("batch_size", batch_sizes)):
        if any(v is not None and v < 1 for v in values):
            raise UsageError(f"{name} values must be >= 1, got {', '.join(map(str, values))}")
    check_rules(rules)
    rows = []
    for temperature in temperatures:
        rows.append(Variant("ar", temperature=temperature))
        for v in _drafting(methods, gammas, steps, schedules):
            for k in drafts if "drafts" in _settings(v.method) else (None,):
                fit: list[str | None] = [r for r in rules if r is not None and fits(r, k or 1, temperature)]
                rows += [replace(v, drafts=k, acceptance=r, temperature=temperature) for r in fit or [None]]
    unused = [r for r in rules if r is not None and r not in {v.acceptance for v in rows}]
    if unused:
        raise UsageError(f"acceptance rule '{unused[0]}' fits none of the rows (single-draft rules for one draft, "
                         "greedy / select / multi for `drafts` > 1, greedy only at `temperature` 0; ar uses none)")
    swept = [replace(v, batch_size=b, runtime=r) for v in rows for b in dict.fromkeys(batch_sizes)
             for r in dict.fromkeys(runtimes)]
    return [v for v in swept if _runs(v)]


def _runs(v: Variant) -> bool:
    """The HF peers run eager torch at batch 1; graph runtimes run ar and specdiff."""
    if v.method not in REGISTRY:
        return v.batch_size == 1 and v.runtime == "torch"
    return not v.on_graphs or v.method in ("ar", "specdiff")


def _drafting(methods: Sequence[str], gammas: Sequence[int], steps: Sequence[int | None],
              schedules: Sequence[str]) -> Iterator[Variant]:
    for method in [m for m in METHODS if m in methods and m != "ar"]:
        for g in gammas:
            if "steps" not in _settings(method):
                yield Variant(method, g)
                continue
            for s in schedules:
                fixed = get_schedule(s).fixed_steps
                for t in dict.fromkeys([fixed] if fixed else [min(t or DEFAULT_STEPS, g) for t in steps]):
                    yield Variant(method, g, t, s)


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


def _settings(method: str) -> tuple[str, ...]:
    """The draft settings a method reads: the registry's declaration; peers take gamma only."""
    return REGISTRY[method].settings if method in REGISTRY else ("gamma",)


def available_methods(models: Models) -> list[str]:
    return [m for m in METHODS if NEEDS.get(m) is None or getattr(models, NEEDS[m]) is not None]


def _check_models(models: Models, rows: list[Variant]) -> None:
    what = {"ar_drafter": "an autoregressive drafter (`ar_drafter`)", "drafter": "a diffusion drafter (`drafter`)"}
    for v in rows:
        if v.on_graphs:
            graphs = models.graphs.get(v.runtime, {})
            if "target" not in graphs or (v.method == "specdiff" and "drafter" not in graphs):
                held = "a target and a diffusion drafter" if v.method == "specdiff" else "a target"
                raise UsageError(f"{v.runtime} rows of '{v.method}' need exported graphs of {held}")
            if graphs["target"].tokenizer.get_vocab() != models.target.tokenizer.get_vocab():
                raise IncompatibleModelsError(f"the exported target's tokenizer differs from {models.target.name}'s: "
                                              "its rows would not be the same model's")
        if v.method in NEEDS and getattr(models, NEEDS[v.method]) is None:
            raise UsageError(f"method '{v.method}' needs {what[NEEDS[v.method]]}")


# --- one pass over the prompts, per method: yields (new tokens, decoding seconds) per prompt, and the
# loop's own metrics for specdiff's methods ---

Pass = Callable[[list[str], list[list[int]]],
                Iterator[tuple[list[int], float] | tuple[list[int], float, Metrics]]]


def _loop_pass(models: Models, v: Variant, s: Settings) -> Pass:
    target, drafter = models.target, getattr(models, NEEDS[v.method]) if v.method in NEEDS else None
    if v.on_graphs:
        target, drafter = models.graphs[v.runtime]["target"], models.graphs[v.runtime].get("drafter")
    k, temperature = v.drafts or 1, _temperature(v, s)
    default = s.acceptance if s.acceptance and fits(s.acceptance, k, temperature) else None  # e.g. a pair's
    p = plan(target=target, drafter=drafter, method=v.method, gamma=v.gamma, steps=v.steps,
             schedule=v.schedule, drafts=v.drafts, draft_temperature=s.draft_temperature if k > 1 else None,
             acceptance=v.acceptance or default, temperature=temperature, top_k=s.top_k,
             top_p=s.top_p, max_new_tokens=s.max_new_tokens, seed=s.seed, batch_size=v.batch_size,
             compile=v.compiled, chat=s.chat)

    def one_pass(prompts: list[str], encoded: list[list[int]]) -> Iterator[tuple[list[int], float, Metrics]]:
        for out in iter_generate(prompts, p, s.truncate_prompt):
            yield out.tokens, out.metrics.wall_s, out.metrics
    one_pass.plan = p  # type: ignore[attr-defined]  # its target holds the KV peak (and warm-up)
    return one_pass


def _temperature(v: Variant, s: Settings) -> float:
    return s.temperature if v.temperature is None else v.temperature


def _hf_kwargs(models: Models, v: Variant, s: Settings) -> dict:
    t, temperature = models.target, _temperature(v, s)
    kw: dict[str, Any] = {"do_sample": temperature > 0, "pad_token_id": t.eos_token_id,
                          "eos_token_id": t.eos_token_id}
    if temperature > 0:
        kw.update(temperature=temperature, top_k=s.top_k, top_p=s.top_p)
    head_rows = t.model.get_output_embeddings().weight.shape[0]
    if head_rows > t.vocab_size:  # padded head rows: never emitted, as in Target
        kw["suppress_tokens"] = list(range(t.vocab_size, head_rows))
    if v.method == "hf-assisted" and models.ar_drafter is not None:
        kw["assistant_model"] = models.ar_drafter.model
    else:
        kw["prompt_lookup_num_tokens"] = v.gamma
    return kw


@contextmanager
def _hf_settings(models: Models, v: Variant) -> Iterator[None]:
    """Assistant: constant num_assistant_tokens = gamma, no confidence early exit (its generation
    config is where transformers reads these); transformers' warnings off. Restored afterwards."""
    assistant = models.ar_drafter if v.method == "hf-assisted" else None
    config = assistant.model.generation_config if assistant is not None else None
    wanted = {"num_assistant_tokens": v.gamma, "num_assistant_tokens_schedule": "constant",
              "assistant_confidence_threshold": 0.0} if config is not None else {}
    saved, verbosity = {k: getattr(config, k, None) for k in wanted}, hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    for k, value in wanted.items():
        setattr(config, k, value)
    try:
        yield
    finally:
        for k, value in saved.items():
            setattr(config, k, value)
        hf_logging.set_verbosity(verbosity)


def _hf_pass(models: Models, v: Variant, s: Settings) -> Pass:
    t, kwargs = models.target, _hf_kwargs(models, v, s)

    def one_pass(prompts: list[str], encoded: list[list[int]]) -> Iterator[tuple[list[int], float]]:
        with _hf_settings(models, v), torch.no_grad():
            for ids in encoded:
                x = torch.tensor([ids], device=t.device)
                n = min(s.max_new_tokens, t.max_length - len(ids))
                start = time.perf_counter()
                out = t.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, **kwargs)
                t.sync()
                yield out[0, len(ids):].tolist(), time.perf_counter() - start
    return one_pass


PASSES = {**dict.fromkeys(REGISTRY, _loop_pass), **dict.fromkeys(PEERS, _hf_pass)}


# --- measuring and summarising ---

@dataclass
class Repeat:
    """One timed pass over the prompts."""

    tokens: list[list[int]]  # per prompt
    seconds: list[float]
    calls: list[dict]  # per prompt: role -> [Call] (batched: the calls made until it was done)
    metrics: list[Metrics | None] = field(default_factory=list)  # per prompt, the loop's own (peers: None)
    cuda_peak_mb: float | None = None  # peak CUDA memory allocated during this pass
    kv_peak_mb: float | None = None  # largest KV cache the target held during this pass

    @property
    def tokens_per_s(self) -> float:
        return sum(map(len, self.tokens)) / sum(self.seconds)

    def role_calls(self, role: str) -> list:
        return [c for prompt in self.calls for c in prompt.get(role, [])]


def _timed_pass(models: Models, v: Variant, one_pass: Pass, prompts: list[str],
                encoded: list[list[int]]) -> Repeat:
    """One pass with every forward call logged where calls can be (Variant.logged; elsewhere the
    loop's own metrics count them)."""
    roles = {"target": models.target.model} if v.logged else {}
    if models.drafter_module(v.method) is not None and v.logged:
        roles["drafter"] = models.drafter_module(v.method)
    device, r = models.target.device, Repeat([], [], [])
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    p = getattr(one_pass, "plan", None)
    target = p.target if p else models.target
    assert not isinstance(target, BlockDiffusionTarget)  # timed by bench_block
    target.kv_peak_bytes = 0
    with CallLog(roles, device) as log:
        for tokens, seconds, *metrics in one_pass(prompts, encoded):
            r.tokens.append(tokens)
            r.seconds.append(seconds)
            r.metrics.append(metrics[0] if metrics else None)
            r.calls.append(log.take())  # this prompt's calls
    if device.type == "cuda":
        r.cuda_peak_mb = torch.cuda.max_memory_allocated(device) / 2**20
    r.kv_peak_mb = target.kv_peak_bytes / 2**20
    return r


def _measure(models: Models, rows: list[Variant], s: Settings, prompts: list[str], encoded: list[list[int]],
             log: Callable[[str], None]) -> tuple[list[list[Repeat]], list[float | None]]:
    """Warm-up passes of every variant, then the timed passes round-robin (pass i of every variant,
    then pass i + 1), so that a slow spell of a shared machine hits all methods alike instead of
    all the passes of one. -> per variant, its timed passes and its compile seconds (compiled
    rows: spent before their first pass decoded, in no pass's time)."""
    passes = [PASSES[v.method](models, v, s) for v in rows]
    for v, one_pass in zip(rows, passes):
        log(f"bench: warm-up {v.label}")
        for _ in range(s.warmup):
            for _ in one_pass(prompts, encoded):
                pass
    repeats: list[list[Repeat]] = [[] for _ in rows]
    for i in range(s.repeats):
        log(f"bench: timed pass {i + 1}/{s.repeats} of {len(rows)} variants")
        for v, one_pass, out in zip(rows, passes, repeats):
            out.append(_timed_pass(models, v, one_pass, prompts, encoded))
    plans = [getattr(one_pass, "plan", None) for one_pass in passes]
    return repeats, [p.warmup_s if p and p.compiled else None for p in plans]


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


def _row(v: Variant, repeats: list[Repeat], encoded: list[list[int]]) -> dict:
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


def _memory(repeats: list[Repeat]) -> dict:
    """The process's RSS high-water mark (all variants so far), this variant's CUDA peak and the
    largest KV cache its passes held (HF peers keep their own cache: None)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    cuda = [r.cuda_peak_mb for r in repeats if r.cuda_peak_mb is not None]
    kv = max(r.kv_peak_mb or 0.0 for r in repeats)
    return {"peak_rss_mb": rss, "cuda_peak_mb": max(cuda) if cuda else None, "kv_cache_peak_mb": kv or None}


def environment(models: Models) -> dict:
    device = models.target.device
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else _cpu_name()
    return {"device": str(device), "device_name": name, "dtype": str(models.target.model.dtype).removeprefix("torch."),
            "threads": torch.get_num_threads(), "torch": torch.__version__,
            "transformers": transformers.__version__, "python": platform.python_version(),
            "platform": platform.platform()}


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        return platform.processor()


def run(models: Models, prompts: list[str], rows: list[Variant], settings: Settings,
        log: Callable[[str], None] = lambda msg: None) -> dict:
    """Time every variant on the prompts; -> the report (what bench.json holds)."""
    if settings.repeats < 1 or settings.warmup < 0:
        raise UsageError("repeats must be >= 1 and warmup >= 0")
    refs = [Variant("ar", temperature=t) for t in dict.fromkeys([v.temperature for v in rows] or [None])]
    rows = refs + [v for v in rows if v not in refs]  # the batch-1 reference at every temperature first
    _check_models(models, rows)
    encoded = encode_prompts(models.target, prompts, settings.max_new_tokens, settings.truncate_prompt,
                             TextOptions(chat=settings.chat))
    _check_room(models.target, rows, encoded, settings.max_new_tokens)
    with torch_threads(settings.threads):
        repeats, warmups = _measure(models, rows, settings, prompts, encoded, log)
        out = [({**_row(v, r, encoded), "memory": _memory(r), "compile_s": w}, r)
               for v, r, w in zip(rows, repeats, warmups)]
        env = environment(models)
    return _report(out, settings, env, {"prompts": len(prompts), "models": models.names()})


def _check_room(target: CausalLMTarget | BlockDiffusionTarget, rows: list[Variant], encoded: list[list[int]], max_new_tokens: int) -> None:
    """transformers' prompt lookup does not cap its draft at the context window, so near the end a
    verify call would run past the position embeddings: refuse such settings up front."""
    gamma = max((v.gamma or 0 for v in rows if v.method == "hf-prompt-lookup"), default=0)
    longest = max(map(len, encoded))
    if gamma and longest + max_new_tokens + gamma > target.max_length:
        raise UsageError(
            f"hf-prompt-lookup g={gamma}: a {longest}-token prompt + {max_new_tokens} new tokens + gamma passes "
            f"the target's context window of {target.max_length} (transformers does not cap prompt-lookup "
            "drafts there); use shorter prompts, a lower `max_new_tokens`, or leave hf-prompt-lookup out")


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


def _report(out: list[tuple[dict, list[Repeat]]], s: Settings, env: dict, context: dict) -> dict:
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
