"""The public entry point: prompts in, the target's own continuations and metrics out.

    result = specdiff.generate(["Once upon a time"], target="gpt2-xl", drafter="mdlm-owt",
                               method="specdiff", gamma=8, steps=4, schedule="l2r")
    result.texts, result.metrics.tau
    for event in specdiff.stream(["Once upon a time"]):   # tokens as each step accepts them
        print(event.index, event.tokens)

Methods are declared in `methods.py` (`ar`, the reference; `spec-ar`; `specdiff`; for
block-diffusion targets `block`, their reference, and `simsd-exact`). Prompts are decoded
`batch_size` at a time (rows leave the batch as they finish and the next prompts take their
place; block-diffusion methods decode one prompt at a time), each with its own generator seeded
from `seed` and the prompt's index, so a prompt's output depends neither on the prompts around it
nor on the batch size. A setting not
given comes from the models.yaml pair's defaults, else from the drafter (the settings it records
it was trained for), else DEFAULTS (`choose`). Every option is validated, and every prompt
tokenized and checked, before the first token is generated.
"""

from __future__ import annotations

import os
import warnings
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, cast

import torch
from tqdm import tqdm

from . import selection
from .acceptance import RULES, get_rule
from .block_decoding import REMASKING, BlockSettings
from .budget import check_step
from .compiled import compile_models, compile_seconds, warm_up
from .contracts import Proposer, Target
from .decoding import Row
from .drafters.diffusion import DiffusionProposer, block_sizes, get_schedule
from .errors import ContextWindowWarning, IncompatibleModelsError, InputError, UntrainedDrafterWarning, UsageError
from .loading import load_drafter, load_target, pair_models
from .methods import DRAFTER_KINDS, TARGET_KINDS, DraftSettings, Method, default_method, get_method, is_block_diffusion
from .metrics import Metrics
from .registry import Registry, load_registry
from .requests import check_counts, check_flags, check_names, check_prompts, check_request, check_text_options
from .sampling import Sampling
from .selection import SelfSelection
from .targets.block import BlockDiffusionTarget
from .targets.static import StaticTarget
from .text import StopStrings

DEFAULT_STEPS = 4
DEFAULTS: dict[str, Any] = {"gamma": 8, "steps": None, "schedule": "l2r", "drafts": 1, "draft_temperature": None,
                            "max_new_tokens": 64, "temperature": 0.0, "top_k": 0, "top_p": 1.0,
                            "repetition_penalty": 1.0, "batch_size": 8,
                            "remasking": "static", "threshold": 0.9,  # these two: block-diffusion targets
                            "chat": False}
# settings some methods read and others do not (Method.settings), less those _proposer refuses itself
METHOD_SETTINGS = ("gamma", "steps", "schedule", "remasking", "threshold")
SOURCES = ("option", "pair", "drafter", "default")  # where a setting comes from, first found wins


@dataclass(frozen=True)
class Setting:
    value: Any
    source: str  # one of SOURCES


def choose(options: dict, pair: dict | None = None, drafter: Any = None) -> dict[str, Setting]:
    """method, acceptance and each of DEFAULTS with where it came from, first found: an option
    given (not None) > the models.yaml pair's `defaults` > the settings the drafter records
    (what it was trained for: its `defaults`; None, a name or a drafter without them: none) >
    DEFAULTS. `steps` set nowhere: DEFAULT_STEPS; a schedule with a fixed step count (oneshot)
    sets steps unless they are an option."""
    layers = list(zip(SOURCES, (options, pair or {}, getattr(drafter, "defaults", None) or {})))
    chosen = {key: next((Setting(layer[key], source) for source, layer in layers if layer.get(key) is not None),
                        Setting(default, "default"))
              for key, default in {"method": None, "acceptance": None, **DEFAULTS}.items()}
    fixed = get_schedule(chosen["schedule"].value).fixed_steps
    if fixed and chosen["steps"].source != "option":
        chosen["steps"] = Setting(fixed, chosen["schedule"].source)
    elif chosen["steps"].value is None:
        chosen["steps"] = Setting(DEFAULT_STEPS, "default")
    return chosen


def values(chosen: dict[str, Setting]) -> dict[str, Any]:
    return {key: setting.value for key, setting in chosen.items()}


@dataclass
class Output:
    prompt: str
    text: str  # the continuation only
    tokens: list[int]
    metrics: Metrics


@dataclass
class Event:
    """One decoding step of prompt `index`: the tokens it appended. The last event of a prompt
    carries its finished `output` (and no tokens). Prompts decoded in one batch interleave."""

    index: int
    tokens: list[int]
    output: Output | None = None


@dataclass
class GenerationResult:
    outputs: list[Output] = field(default_factory=list)

    @property
    def texts(self) -> list[str]:
        return [o.text for o in self.outputs]

    @property
    def metrics(self) -> Metrics:
        total = Metrics()
        for o in self.outputs:
            total = total.merge(o.metrics)
        return total


@dataclass(frozen=True)
class TextOptions:
    """How prompts become ids and ids become text: the tokenizer's chat template (with an optional
    system message) and stop strings (text.StopStrings)."""

    chat: bool = False
    system: str | None = None
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class Plan:
    """Everything a run needs, validated: models, method, sampling and draft settings."""

    target: Target
    drafter: Any
    method: Method
    sampling: Sampling
    rule_name: str | None
    draft: DraftSettings
    max_new_tokens: int
    seed: int
    proposer: Proposer | None = None  # the drafting algorithm around `drafter`
    text: TextOptions = TextOptions()
    sources: dict[str, str] = field(default_factory=dict)  # setting -> where it came from (SOURCES)
    batch_size: int = 1  # rows decoded together
    block: BlockSettings | None = None  # a block-diffusion target's decoding settings
    compiled: bool = False  # static cache and compiled steps (specdiff.compiled)

    @property
    def warmup_s(self) -> float:
        """Seconds spent compiling (`compiled`), kept out of every prompt's decoding time."""
        return compile_seconds(cast(StaticTarget, self.target), self.drafter) if self.compiled else 0.0

    def settings(self) -> dict[str, dict[str, Any]]:
        """What runs, each {"value", "from": option | pair | drafter | default} (`--stats`): the
        method, the draft settings it reads, the acceptance rule, sampling and max_new_tokens."""
        draft = {k: getattr(self.block or self.draft, k) for k in self.method.settings}
        if "steps" in draft and self.block is None:  # what runs: at most one step per draft slot
            draft["steps"] = len(block_sizes(self.draft.gamma, self.draft.steps))
        ran = {"method": self.method.name, **draft, "acceptance": self.rule_name, "temperature": self.sampling.temperature,
               "top_k": self.sampling.top_k, "top_p": self.sampling.top_p,
               "repetition_penalty": self.sampling.repetition_penalty, "max_new_tokens": self.max_new_tokens,
               "batch_size": self.batch_size}
        return {k: {"value": v, "from": self.sources.get(k, "default")} for k, v in ran.items() if v is not None}


def plan(*, target: Any = None, drafter: Any = None, pair: str | None = None, method: str | None = None,
         device: str = "cpu", dtype: str = "auto", seed: int = 0, acceptance: str | None = None,
         chat: bool | None = None, system: str | None = None, stop: Iterable[str] | str | None = None,
         registry: Registry | None = None, compile: bool = False, **options: Any) -> Plan:
    """Load models (names, paths or loaded objects), fill the settings not given (see `choose`:
    option > pair > drafter > DEFAULTS), validate. With neither pair nor target: the `demo` pair,
    if models.yaml has one. compile: run through specdiff.compiled (static cache, torch.compile)."""
    if not isinstance(compile, bool):
        raise UsageError(f"`compile` must be True or False, got {type(compile).__name__}")
    target, drafter = check_request(target, drafter, seed=seed, device=device, **options)
    system, stop = check_text_options(system, stop)
    check_names(pair=pair, method=method, acceptance=acceptance, dtype=dtype)
    check_flags(chat=chat)
    registry = _registry(registry)
    target, drafter, defaults = registry.resolve(pair, target, drafter)
    given = {**options, "method": method, "acceptance": acceptance, "chat": chat}
    named = _check_settings(choose(given, defaults))  # every option, before anything loads
    if isinstance(target, str):
        target = load_target(target, device=device, dtype=dtype, registry=registry)
    if isinstance(drafter, str) and not (named and named.needs is None):
        drafter = load_drafter(drafter, device=device, dtype=dtype, registry=registry)
    _check_loaded(target, drafter)
    settings = choose(given, defaults, drafter)
    chosen = _check_settings(settings) or _default_method(drafter, target)
    if not chosen.accepts(drafter):  # it decodes without this drafter: what the drafter records is not this run's
        settings = choose(given, defaults)
    chosen.check_target(target)
    _check_used(settings, chosen)
    if chosen.needs is not None:  # before compile: a drafter may take rows of the target's weights
        chosen.check_drafter(drafter)
        pair_models(target, drafter)
    if compile:
        target, drafter = compile_models(target, drafter)
    opts = values(settings)
    sampling = Sampling(float(opts["temperature"]), int(opts["top_k"]), float(opts["top_p"]),
                        float(opts["repetition_penalty"]))
    draft = DraftSettings(opts["gamma"], opts["steps"], opts["schedule"], opts["drafts"], opts["draft_temperature"])
    proposer = _proposer(chosen, drafter, draft)
    rule_name = _rule_name(opts["acceptance"], sampling, chosen, proposer, draft) if proposer else None
    if proposer and draft.drafts > 1:
        proposer = SelfSelection(cast(DiffusionProposer, proposer),  # only specdiff reads `drafts`
                                 draft.drafts, draft.draft_temperature, iid=rule_name == "multi")
    if chosen.accepts(drafter):
        _warn_untrained(drafter)
    block = _block_settings(settings, sampling, target, drafter if chosen.needs else None)
    if block is None:
        _check_sizes(target, proposer, draft, batch_size=opts["batch_size"], max_new_tokens=opts["max_new_tokens"],
                     rows=opts["batch_size"], context=0)
    return Plan(target, drafter if chosen.needs else None, chosen, sampling, rule_name, draft,
                opts["max_new_tokens"], seed, proposer, text_options(target, opts["chat"], system, stop),
                _sources(settings, chosen, drafter), opts["batch_size"], block, compile)


_WARNED: "weakref.WeakSet[Any]" = weakref.WeakSet()  # untrained drafters already warned about


def _warn_untrained(drafter: Any) -> None:
    """Say once per drafter (a bench makes many plans) that its config marks it untrained: a run
    with `drafter init`'s random weights is slower than ar, and nothing else says why."""
    if not getattr(drafter, "untrained", False) or drafter in _WARNED:
        return
    _WARNED.add(drafter)
    warnings.warn(UntrainedDrafterWarning(
        f"drafter '{_name(drafter)}' is untrained (random weights from `drafter init`): almost no draft will be "
        "accepted, so this runs slower than plain decoding; train it with `specdiff distill`"), stacklevel=3)


def _default_method(drafter: Any, target: Any) -> Method:
    """The method no option or pair names: the first for this target that uses the drafter (its
    kind's reference without one). A drafter given that no such method can use is refused, not
    dropped silently."""
    method = default_method(drafter, target)
    if drafter is not None and not method.accepts(drafter):
        kind = next((what for what, check in DRAFTER_KINDS.values() if check(drafter)), "this drafter")
        target_kind = next(what for what, check in TARGET_KINDS.values() if check(target))
        raise UsageError(f"no method for {target_kind} drafts with {kind} ('{_name(drafter)}'): drop `drafter`, "
                         f"or name a `method` ({method.name} decodes without one)")
    return method


def _name(model: Any) -> str:
    return str(getattr(model, "name", None) or getattr(model, "source", None) or type(model).__name__)


def _registry(registry: Any) -> Registry:
    """The models.yaml to read: the shipped one (None), a loaded Registry, or a path to a file."""
    if registry is None or isinstance(registry, (str, os.PathLike)):
        return load_registry(registry)
    if not isinstance(registry, Registry):
        raise UsageError(f"`registry` must be a path to a models.yaml or a loaded Registry, got {type(registry).__name__}")
    return registry


def _check_loaded(target: Any, drafter: Any) -> None:
    """Objects given as models are models: a raw Hugging Face model, say, is refused with what to
    call instead, not met later as an AttributeError."""
    if not (hasattr(target, "tokenizer") and hasattr(target, "max_length") and hasattr(target, "vocab_size")):
        raise UsageError(f"`target` must be a models.yaml name, a directory, a hub id or a loaded target "
                         f"(specdiff.load_target), got {type(target).__name__}")
    unloaded = drafter is None or isinstance(drafter, str)  # a name is left unloaded for a method without one
    if not unloaded and not any(check(drafter) for _, check in DRAFTER_KINDS.values()):
        raise UsageError(f"`drafter` must be a models.yaml name, a directory, a hub id or a loaded drafter "
                         f"(specdiff.load_drafter), got {type(drafter).__name__}")


def _check_sizes(target: Any, proposer: Proposer | None, draft: DraftSettings, *, batch_size: int,
                 max_new_tokens: int, rows: int, context: int) -> None:
    """Refuse sizes that cannot serve: a draft longer than the target's context window, or a
    decoding step (`rows` rows decoded together, each verifying K candidate drafts of up to
    gamma + 1 tokens, caches of `context` tokens) larger than the free memory (budget.py)."""
    if proposer is not None and draft.gamma >= target.max_length:
        raise UsageError(f"`gamma` {draft.gamma} does not fit the target's context window ({target.max_length} "
                         "tokens) after a prompt")
    copies = draft.drafts if proposer is not None else 1
    if target.max_rows:  # the loop decodes no more rows together than the target takes
        rows = min(rows, max(1, target.max_rows // copies))
    sizes = {"batch_size": batch_size, **({"drafts": copies} if copies > 1 else {}),
             **({"gamma": draft.gamma} if proposer is not None else {})}
    tokens = min(draft.gamma + 1, max_new_tokens) if proposer is not None else 1
    check_step(target, rows=rows * copies, tokens=tokens, context=context, sizes=sizes)


def _check_used(settings: dict[str, Setting], method: Method) -> None:
    """A draft setting given as an option that the method does not read would do nothing (a
    `threshold` for ar, a `schedule` for spec-ar): refuse it. Pair and drafter defaults are not
    options: they apply where they are read."""
    for key in METHOD_SETTINGS:
        if settings[key].source == "option" and key not in method.settings:
            reads = ", ".join(f"`{k}`" for k in method.settings) or "none of the draft settings"
            raise UsageError(f"method '{method.name}' does not use `{key}`; it reads {reads}")
    if settings["threshold"].source == "option" and settings["remasking"].value != "dynamic":
        raise UsageError(f"`threshold` is read by `remasking` dynamic only, not {settings['remasking'].value}")


def _block_settings(settings: dict[str, Setting], sampling: Sampling, target: Any, drafter: Any) -> BlockSettings | None:
    """A block-diffusion target's settings, checked against it (and its drafter); None for a
    causal target. `steps` set nowhere: the block size (one slot per step)."""
    if not is_block_diffusion(target):
        return None
    opts = values(settings)
    if settings["steps"].source == "default":
        opts["steps"] = target.block_size
    if opts["remasking"] not in REMASKING:
        raise UsageError(f"unknown remasking rule '{opts['remasking']}' (choose from {', '.join(REMASKING)})")
    threshold = opts["threshold"]
    if not (isinstance(threshold, (int, float)) and not isinstance(threshold, bool) and 0 <= threshold <= 1):
        raise UsageError(f"`threshold` must lie in [0, 1], got {opts['threshold']}")
    if opts["steps"] > target.block_size:
        raise UsageError(f"`steps` {opts['steps']} is more than the block size {target.block_size} "
                         "(each step commits at least one slot)")
    if sampling.repetition_penalty != 1:
        raise UsageError("`repetition_penalty` is not supported on block-diffusion targets")
    if drafter is not None and (drafter.block_size, drafter.mask_id) != (target.block_size, target.mask_id):
        raise IncompatibleModelsError(
            f"drafter's block size / mask id {drafter.block_size} / {drafter.mask_id} differ from the "
            f"target's {target.block_size} / {target.mask_id}")
    return BlockSettings(opts["remasking"], opts["steps"], float(opts["threshold"]), opts["gamma"])


def _sources(settings: dict[str, Setting], method: Method, drafter: Any) -> dict[str, str]:
    """Where each setting came from; a method set nowhere is the drafter's kind's (or ar)."""
    sources = {key: s.source for key, s in settings.items()}
    if settings["method"].value is None:
        sources["method"] = "drafter" if method.accepts(drafter) else "default"
    return sources


def text_options(target: Target, chat: bool, system: str | None, stop: Iterable[str] | str | None) -> TextOptions:
    """Check and collect the chat / system / stop parameters for this target."""
    system, stop = check_text_options(system, stop)
    if system is not None and not chat:
        raise UsageError("a `system` message needs `chat` (the chat template places it)")
    if chat and not getattr(target.tokenizer, "chat_template", None):
        raise UsageError(f"{target.name}: its tokenizer has no chat template; drop `chat`")
    return TextOptions(bool(chat), system, tuple(stop))


def _proposer(method: Method, drafter: Any, settings: DraftSettings) -> Proposer | None:
    """The method's proposer around the drafter (None for methods without one: block-diffusion
    methods drive their drafter themselves)."""
    if settings.drafts > 1 and "drafts" not in method.settings:
        raise UsageError(f"method '{method.name}' drafts one candidate; `drafts` > 1 needs specdiff")
    if settings.draft_temperature is not None and settings.drafts == 1:
        raise UsageError("`draft_temperature` warps candidate drafts 2..K: it needs `drafts` > 1")
    if method.needs is None:
        return None
    return method.build(drafter, settings) if method.build else None


def _check_settings(settings: dict[str, Setting]) -> Method | None:
    """Check the counts, the schedule and the method's name; -> the method set (None: none)."""
    opts = values(settings)
    check_counts(opts)  # a pair's defaults are typed by the registry, not bounded
    get_schedule(opts["schedule"])
    return get_method(opts["method"]) if opts["method"] else None


def _rule_name(acceptance: str | None, sampling: Sampling, method: Method, proposer: Proposer,
               draft: DraftSettings) -> str:
    """The acceptance rule: by default greedy at temperature 0, else select over K > 1 drafts, else
    the method's first rule that the proposer declares exact (contracts.Proposer.exact_rules); a
    rule asked for must be one of the method's, fit the number of drafts and, when sampling, be
    one the proposer declares exact."""
    exact = proposer.exact_rules
    if acceptance is None:
        if sampling.greedy or draft.drafts > 1:
            return "greedy" if sampling.greedy else "select"
        return next(r for r in method.rules if r in exact and r != "greedy" and r in RULES)
    known = [*RULES, *(r for r in selection.RULES if r not in RULES)]
    if acceptance not in known:
        raise UsageError(f"unknown acceptance rule '{acceptance}' (choose from {', '.join(known)})")
    if draft.drafts > 1:
        selection.get_rule(acceptance)
    elif acceptance not in RULES:
        raise UsageError(f"{acceptance} acceptance chooses among candidate drafts: it needs `drafts` > 1")
    if acceptance not in method.rules:
        raise UsageError(f"method '{method.name}' does not use {acceptance} acceptance "
                         f"(choose from {', '.join(method.rules)})")
    if sampling.greedy:
        return acceptance  # with one-hot p and q every rule is the greedy check
    if acceptance == "greedy":
        raise UsageError("greedy acceptance needs `temperature` 0; use standard or match when sampling")
    if acceptance not in exact:
        raise UsageError(
            f"{acceptance} acceptance would not be exact with these drafts: {proposer!r} declares "
            f"only {', '.join(sorted(exact))} exact "
            f"(docs/lossless.md); use `acceptance` {'select' if draft.drafts > 1 else 'match'}, or `temperature` 0")
    return acceptance


def encode_prompts(target: Target | BlockDiffusionTarget, prompts: list[str], max_new_tokens: int,
                   truncate: bool = False, text: TextOptions = TextOptions(),
                   indices: list[int] | None = None) -> list[list[int]]:
    """Tokenize (through the chat template if `text.chat`) and check every prompt (empty, longer
    than the context window); warn once when `max_new_tokens` does not fit after some of them.
    Errors number prompts from 1, or by `indices` (0-based places in a larger input) + 1."""
    encoded = []
    for i, prompt in zip(indices or range(len(prompts)), prompts):
        i += 1
        ids = _encode(target.tokenizer, prompt, text) if prompt.strip() else []
        if not ids:
            raise InputError(f"prompt {i} is empty")
        if len(ids) >= target.max_length:
            if not truncate:
                raise InputError(
                    f"prompt {i} is {len(ids)} tokens; the target's context window is "
                    f"{target.max_length} (use `truncate_prompt` to keep only its end)")
            ids = ids[-max(1, target.max_length - max_new_tokens):]
        encoded.append(ids)
    _warn_past_context(encoded, max_new_tokens, target.max_length)
    return encoded


def _encode(tokenizer: Any, prompt: str, text: TextOptions) -> list[int]:
    if not text.chat:
        return tokenizer.encode(prompt)
    messages = ([{"role": "system", "content": text.system}] if text.system is not None else [])
    messages.append({"role": "user", "content": prompt})
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                              return_dict=True)["input_ids"])


def _warn_past_context(encoded: list[list[int]], max_new_tokens: int, max_length: int) -> None:
    over = sum(len(ids) + max_new_tokens > max_length for ids in encoded)
    if over:
        warnings.warn(ContextWindowWarning(
            f"`max_new_tokens` {max_new_tokens} does not fit in the target's context window "
            f"({max_length} tokens) after {over} of {len(encoded)} prompt(s): they stop at the "
            "window (stop reason 'context')"), stacklevel=2)


def stream(prompts: str | list[str], p: Plan | None = None, *, truncate_prompt: bool = False,
           progress: bool = False, indices: list[int] | None = None, **options: Any) -> Iterator[Event]:
    """Decode the prompts, `p.batch_size` at a time, yielding an Event per decoding step of each
    prompt (the tokens it appended; prompts of one batch interleave) and a final Event per prompt
    holding its Output, as soon as it is finished. `p`: a Plan; else `options` (as for
    `generate`) make one. `indices`: each prompt's place in a larger input (default 0, 1, ...),
    which seeds its generator and numbers it in errors, so that a shard decodes as the whole
    would; events are indexed by the position in `prompts` all the same."""
    prompts = check_prompts(prompts)
    check_flags(truncate_prompt=truncate_prompt, progress=progress)
    if p is not None and not isinstance(p, Plan):
        raise UsageError(f"`p` must be a Plan (specdiff.generation.plan), got {type(p).__name__}")
    if p is not None and options:
        raise UsageError(f"`{next(iter(options))}` is a setting of a plan: pass the settings or the plan `p`, not both")
    p = p or plan(**options)
    indices = list(range(len(prompts))) if indices is None else _check_indices(indices, len(prompts))
    encoded = encode_prompts(p.target, prompts, p.max_new_tokens, truncate_prompt, p.text, indices)
    if p.block is None and prompts:
        longest = max(map(len, encoded)) + p.max_new_tokens
        _check_sizes(p.target, p.proposer, p.draft, batch_size=p.batch_size, max_new_tokens=p.max_new_tokens,
                     rows=min(p.batch_size, len(prompts)), context=longest)
    if p.compiled and prompts:
        copies = p.proposer.drafts if isinstance(p.proposer, SelfSelection) else 1
        gamma = p.draft.gamma if p.proposer else None
        longest = max(map(len, encoded)) + p.max_new_tokens  # the cache holds no more per row
        warm_up(cast(StaticTarget, p.target), p.drafter, min(p.batch_size, len(prompts)), gamma, copies, longest)
    stop = StopStrings(p.target.tokenizer, p.text.stop) if p.text.stop else None
    rows = (Row(ids, p.max_new_tokens, p.target.max_length, p.target.eos_token_id, p.target.device,
                torch.Generator(p.target.device).manual_seed(p.seed + indices[i]), stop, index=i)
            for i, ids in enumerate(encoded))
    with tqdm(total=len(prompts), disable=not progress, unit="prompt", leave=False) as bar:
        for row, tokens in _loop(p, rows):
            yield Event(row.index, tokens)
            if row.stop_reason:
                text = p.target.tokenizer.decode(row.new_tokens, skip_special_tokens=True)
                text = stop.cut(text) if stop else text
                bar.update()
                yield Event(row.index, [], Output(prompts[row.index], text, row.new_tokens, row.metrics))


def _check_indices(indices: list[int], n: int) -> list[int]:
    if len(indices) != n or not all(isinstance(i, int) and i >= 0 for i in indices):
        raise UsageError(f"`indices` must be {n} integers >= 0, one per prompt")
    return list(indices)


def _loop(p: Plan, rows: Iterator[Row]) -> Iterator[tuple[Row, list[int]]]:
    """The method's decoding loop over the rows (block-diffusion methods: one row at a time)."""
    if p.block is not None:
        return ((row, tokens) for row in rows
                for tokens in p.method.loop(p.target, p.drafter, row, p.sampling, p.block))
    if p.proposer is None or p.rule_name is None:
        return p.method.loop(p.target, rows, p.sampling, p.batch_size)
    rules = selection.get_rule if isinstance(p.proposer, SelfSelection) else get_rule
    return p.method.loop(p.target, p.proposer, rows, p.sampling, rules(p.rule_name), p.draft.gamma,
                         p.batch_size)


def in_order(events: Iterable[Event]) -> Iterator[Output]:
    """The Outputs of a stream's events in prompt order: a finished output waits for those before it."""
    done: dict[int, Output] = {}
    following = 0
    for event in events:
        if event.output is not None:
            done[event.index] = event.output
            while following in done:
                yield done.pop(following)
                following += 1


def iter_generate(prompts: list[str], p: Plan, truncate_prompt: bool = False,
                  progress: bool = False, indices: list[int] | None = None) -> Iterator[Output]:
    """Yield one Output per prompt, in order, as each is finished (and all before it);
    `indices`: see `stream`."""
    return in_order(stream(prompts, p, truncate_prompt=truncate_prompt, progress=progress, indices=indices))


@contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """torch's CPU thread count set to `threads` inside (None: left alone), restored after."""
    if threads is None:
        yield
        return
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise UsageError(f"`threads` must be an integer >= 1, got {threads!r}")
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def generate(prompts: str | list[str], *, target: Any = None, drafter: Any = None, pair: str | None = None,
             method: str | None = None, gamma: int | None = None, steps: int | None = None,
             schedule: str | None = None, drafts: int | None = None, draft_temperature: float | None = None,
             acceptance: str | None = None, temperature: float | None = None,
             top_k: int | None = None, top_p: float | None = None, repetition_penalty: float | None = None,
             max_new_tokens: int | None = None, seed: int = 0, device: str = "cpu", dtype: str = "auto",
             truncate_prompt: bool = False, progress: bool = False, chat: bool | None = None,
             system: str | None = None, stop: Iterable[str] | str | None = None,
             batch_size: int | None = None, remasking: str | None = None,
             threshold: float | None = None, compile: bool = False, threads: int | None = None) -> GenerationResult:
    """Generate a continuation of each prompt with the target, accelerated by the drafter.

    target / drafter: models.yaml names, local directories, hub ids, or loaded objects
    (`load_target`, `load_drafter`). pair: a models.yaml pair (its target, drafter and defaults).
    chat / system: prompts go through the target tokenizer's chat template. stop: strings that
    end a continuation (the text ends before the first one; as vLLM / OpenAI).
    repetition_penalty: Hugging Face's, applied to the target's p exactly as plain decoding does.
    batch_size: prompts decoded together (default 8); the output does not depend on it.
    remasking / threshold / steps: for block-diffusion targets (block_decoding.py), the rule that
    picks the slots each denoising step commits, dynamic's confidence threshold, steps per block.
    drafts: K > 1 candidate drafts per step, one kept by the target (specdiff.selection;
    acceptance greedy, select or multi); draft_temperature: how candidates 2..K are sampled.
    compile: the static KV cache and torch.compile'd steps (specdiff.compiled): the same tokens,
    compiled once per run before decoding.
    threads: torch's CPU threads for this call (set, then restored; None: as the process has
    them). torch takes one per core; where other processes share the cores (a 2-core machine)
    one thread is several times faster, which is what the CLI's --threads defaults to.
    Returns the continuations (`.texts`), per-prompt outputs and total `.metrics`.
    """
    prompts = check_prompts(prompts)
    with torch_threads(threads):
        p = plan(target=target, drafter=drafter, pair=pair, method=method, device=device, dtype=dtype,
                 seed=seed, acceptance=acceptance, gamma=gamma, steps=steps, schedule=schedule, drafts=drafts,
                 draft_temperature=draft_temperature,
                 temperature=temperature, top_k=top_k, top_p=top_p, repetition_penalty=repetition_penalty,
                 max_new_tokens=max_new_tokens, chat=chat, system=system, stop=stop, batch_size=batch_size,
                 remasking=remasking, threshold=threshold, compile=compile)
        return GenerationResult(list(iter_generate(prompts, p, truncate_prompt, progress)))
