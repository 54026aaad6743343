"""A run's plan: the models loaded, the method chosen and prepared into its Decoder, every setting
resolved once (choosing.py) and checked before the first token. May import: methods, kinds, loading,
registry, requests, settings, compiled, loaded; not streaming or the CLI.
"""

from __future__ import annotations

import os
import warnings
import weakref
from dataclasses import dataclass, field
from typing import Any, Iterable, cast

from ..compiled import compile_models, compile_seconds
from ..contracts import Decoder, Drafter, Target
from ..errors import UntrainedDrafterWarning, UsageError, WidthDependenceWarning
from ..loading import load_drafter, load_target, pair_models
from ..kinds import get_kind, kind_of
from ..methods import METHODS, TARGET_KINDS, Method, Models, default_method
from ..registry import Registry, as_registry
from ..requests import check_flags, check_names, check_request, check_text_options
from ..sampling import Sampling
from ..targets.static import StaticTarget
from .choosing import check_used, choose, family_settings, named_method, said_where, sources, values
from .loaded import check_free, placement
from .prompts import TextOptions, text_options
from .tuned import SETTINGS as TUNED_SETTINGS, Tuned


@dataclass(frozen=True)
class Plan:
    """Everything a run needs, validated: the models, the method and the decoder it prepared,
    sampling, and where each setting came from."""

    target: Target
    drafter: Drafter | None  # None when the method drafts with none
    method: Method
    sampling: Sampling
    decoder: Decoder
    max_new_tokens: int
    seed: int
    text: TextOptions = TextOptions()
    sources: dict[str, str] = field(default_factory=dict)  # setting -> where it came from (choosing.SOURCES)
    batch_size: int = 1  # rows decoded together
    compiled: bool = False  # static cache and compiled steps (specdiff.compiled)

    @property
    def draft(self) -> Any:
        """The method's family's settings as it runs them (specdiff.settings; None: it reads none)."""
        return self.decoder.settings

    @property
    def warmup_s(self) -> float:
        """Seconds spent compiling (`compiled`), kept out of every prompt's decoding time."""
        return compile_seconds(cast(StaticTarget, self.target), self.drafter) if self.compiled else 0.0

    def settings(self) -> dict[str, dict[str, Any]]:
        """What runs, each {"value", "from": option | pair | drafter | default} (`--stats`): the
        method, the draft settings it reads, the acceptance rule, sampling, max_new_tokens and the
        size of the drafter's draft vocabulary (specdiff.vocab) when it has one."""
        ran = {"method": self.method.name, **self.decoder.ran(), "temperature": self.sampling.temperature,
               "top_k": self.sampling.top_k, "top_p": self.sampling.top_p,
               "repetition_penalty": self.sampling.repetition_penalty, "max_new_tokens": self.max_new_tokens,
               "batch_size": self.batch_size}
        vocab = getattr(self.drafter, "draft_vocab", None)  # specdiff.vocab: the rows its head scores
        found = {k: {"value": v, "from": self.sources.get(k, "default")} for k, v in ran.items() if v is not None}
        return found | ({"draft_vocab": {"value": vocab.size, "from": "drafter"}} if vocab is not None else {})


def plan(*, target: Any = None, drafter: Any = None, pair: str | None = None, method: str | None = None,
         device: str | None = None, dtype: str | None = None, seed: int = 0, acceptance: str | None = None,
         chat: bool | None = None, system: str | None = None, stop: Iterable[str] | str | None = None,
         registry: Registry | None = None, compile: bool = False, tuned: Tuned | None = None, **options: Any) -> Plan:
    """Load models (names, paths or loaded objects), resolve the settings not given (choosing.choose:
    option > pair > drafter > declared default), prepare the method's decoder. With neither pair
    nor target: the default pair. compile: run through specdiff.compiled (static cache, torch.compile).
    device / dtype (None: a loaded model's, else cpu and auto): what models given by name load with;
    one that a model given loaded does not hold is refused (loaded.placement). tuned: the
    configuration `specdiff tune` measured fastest here (generation.tuned), between the options
    and the pair's defaults; each setting it gives says so in Plan.sources."""
    if not isinstance(compile, bool):
        raise UsageError(f"`compile` must be True or False, got {type(compile).__name__}")
    if "threads" in options:
        raise UsageError("`threads` is set per call (generate, stream), not in a plan")
    target, drafter = check_request(target, drafter, seed=seed, device=device, **options)
    system, stop = check_text_options(system, stop)
    check_names(pair=pair, method=method, acceptance=acceptance, dtype=dtype)
    check_flags(chat=chat)
    device, dtype = placement(target, drafter, device, dtype)
    registry = as_registry(registry)
    target, drafter, defaults = registry.resolve(pair, target, drafter)
    given = {**options, "method": method, "acceptance": acceptance, "chat": chat}
    layer = {k: tuned.config[k] for k in TUNED_SETTINGS} if tuned else None
    named = named_method(choose(given, defaults, tuned=layer))  # every option and pair default, before anything loads
    if isinstance(target, str):
        target = load_target(target, device=device, dtype=dtype, registry=registry)
    if isinstance(drafter, str) and not (named and named.needs is None):
        drafter = load_drafter(drafter, device=device, dtype=dtype, registry=registry)
    _check_loaded(target, drafter)
    check_free(target)  # plan() may touch the cache (dflash's capture): not while a stream holds it
    chosen = named or _default_method(drafter, target)
    uses = chosen.accepts(drafter)  # what a drafter it decodes without records is not this run's
    settings = choose(given, defaults, drafter if uses else None, layer)
    chosen.check_target(target)
    if chosen.needs is not None:  # before compile: a drafter may take rows of the target's weights
        _check_drafter(chosen, drafter)
        pair_models(target, drafter)
    if compile:
        target, drafter = compile_models(target, drafter)
    opts = values(settings)
    sampling = Sampling(float(opts["temperature"]), int(opts["top_k"]), float(opts["top_p"]),
                        float(opts["repetition_penalty"]))
    with said_where(settings):  # `gamma` 99 from a drafter's record is not an option given
        decoder = chosen.prepare(Models(target, drafter if uses else None), family_settings(chosen, settings),
                                 sampling, opts["acceptance"])
        check_used(settings, chosen)
        if uses:
            _warn_untrained(drafter)
            _warn_width_dependent(target, sampling)
        # one row, the fewest a run has: each stream checks the rows its prompts fill (streaming.py)
        decoder.check_sizes(1, opts["batch_size"], opts["max_new_tokens"], 0)
    return Plan(target, drafter if uses else None, chosen, sampling, decoder, opts["max_new_tokens"], seed,
                text_options(target, opts["chat"], system, stop), sources(settings, chosen, drafter, tuned),
                opts["batch_size"], compile)


_WARNED: "weakref.WeakSet[Any]" = weakref.WeakSet()  # untrained drafters, half-precision targets warned about


def _warn_untrained(drafter: Drafter) -> None:
    """Say once per drafter (a bench makes many plans) that its config marks it untrained: a run
    with `drafter init`'s random weights is slower than ar, and nothing else says why."""
    if not getattr(drafter, "untrained", False) or drafter in _WARNED:
        return
    _WARNED.add(drafter)
    warnings.warn(UntrainedDrafterWarning(
        f"drafter '{_name(drafter)}' is untrained (random weights from `drafter init`): almost no draft will be "
        "accepted, so this runs slower than plain decoding; train it with `specdiff distill`"), stacklevel=3)


HALF = ("float16", "bfloat16")


def _warn_width_dependent(target: Any, sampling: Sampling) -> None:
    """Say once per target that greedy speculative decoding in half precision may not be plain
    decoding's tokens: measured here (tools/invariance.py, SmolLM2, 200 tokens), bf16 logits of
    5- and 9-token calls differ from one-token calls' by up to 0.83 and tie at the top (margin
    0); fp32's by 4.7e-5 (docs/lossless.md, "Where exactness ends")."""
    dtype = getattr(target, "dtype", None) or getattr(getattr(target, "model", None), "dtype", None)
    if sampling.temperature != 0 or str(dtype).removeprefix("torch.") not in HALF or target in _WARNED:
        return
    _WARNED.add(target)
    warnings.warn(WidthDependenceWarning(
        f"greedy tokens may differ from plain decoding's in {str(dtype).removeprefix('torch.')}: its logits depend "
        "on how many tokens a call carries (`specdiff bench` measures the gap); `dtype` fp32 keeps them identical"),
        stacklevel=3)


def _check_drafter(method: Method, drafter: Drafter | None) -> None:
    """The method's kind of drafter; a drafter given of another kind is named, with the methods
    that draft with it (a DFlash drafter given to specdiff: dflash)."""
    if drafter is None or method.accepts(drafter):
        method.check_drafter(drafter)  # none given: it says which kind to give
        return
    takers = [m.name for m in METHODS.values() if m.target == method.target and m.accepts(drafter)]
    instead = f": use `method` {' or '.join(takers)}, which drafts with it" if takers else ""
    raise UsageError(f"method '{method.name}' needs {get_kind(cast(str, method.needs)).what}; the `drafter` "
                     f"given, '{_name(drafter)}', is {_kind(drafter)}{instead}")


def _kind(drafter: Drafter) -> str:
    kind = kind_of(drafter)
    return kind.what if kind else "this drafter"


def _default_method(drafter: Drafter | None, target: Any) -> Method:
    """The method no option or pair names: the first for this target that uses the drafter (its
    kind's reference without one). A drafter given that no such method can use is refused, not
    dropped silently."""
    method = default_method(drafter, target)
    if drafter is not None and not method.accepts(drafter):
        kind = _kind(drafter)
        target_kind = next(what for what, check in TARGET_KINDS.values() if check(target))
        raise UsageError(f"no method for {target_kind} drafts with {kind} ('{_name(drafter)}'): drop `drafter`, "
                         f"or name a `method` ({method.name} decodes without one)")
    return method


def _name(model: Any) -> str:
    return str(getattr(model, "name", None) or getattr(model, "source", None) or type(model).__name__)


def _check_loaded(target: Any, drafter: Any) -> None:
    """Objects given as models are models: a raw Hugging Face model, say, is refused with what to
    call instead, not met later as an AttributeError."""
    if not (hasattr(target, "tokenizer") and hasattr(target, "max_length") and hasattr(target, "vocab_size")):
        raise UsageError(f"`target` must be a models.yaml name, a directory, a hub id or a loaded target "
                         f"(specdiff.load_target), got {type(target).__name__}")
    unloaded = drafter is None or isinstance(drafter, str)  # a name is left unloaded for a method without one
    if not unloaded and kind_of(drafter) is None:
        raise UsageError(f"`drafter` must be a models.yaml name, a directory, a hub id or a loaded drafter "
                         f"(specdiff.load_drafter), got {type(drafter).__name__}")


