"""Where each setting of a run comes from, resolved once: an option given (not None) > what
`specdiff tune` measured fastest on this machine (generation.tuned: generate passes it where no
model is named) > the models.yaml pair's `defaults` > the settings the drafter records (what it
was trained for, read only when the method drafts with it) > the default its declaration gives
(specdiff.settings).

May import: specdiff.settings, methods (their families), drafters.diffusion (schedules), errors.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Any, Iterator

from ..drafters.diffusion import get_schedule
from ..errors import UsageError
from ..methods import METHODS, Method, get_method
from ..requests import check_settings
from ..settings import AUTO, DEFAULTS, METHOD_SETTINGS, family_default

DEFAULT_STEPS = DEFAULTS["steps"]
SOURCES = ("option", "tuned", "pair", "drafter", "default")  # where a setting comes from, first found wins
WHERE = {"tuned": "tuned on this machine by `specdiff tune`", "pair": "the pair's default in models.yaml",
         "drafter": "recorded by the drafter"}  # values no option gave


@dataclass(frozen=True)
class Setting:
    value: Any
    source: str  # one of SOURCES


def choose(options: dict[str, Any], pair: dict[str, Any] | None = None, drafter: Any = None,
           tuned: dict[str, Any] | None = None) -> dict[str, Setting]:
    """method, acceptance and every declared setting with where it came from, first found: an
    option given (not None) > the tuned configuration > the models.yaml pair's `defaults` > the
    settings the drafter records
    (its `defaults`; None, a name or a drafter without them: none) > the declared default. A
    schedule with a fixed step count (oneshot) sets steps unless they are an option."""
    layers = list(zip(SOURCES, (options, tuned or {}, pair or {}, getattr(drafter, "defaults", None) or {})))
    chosen = {key: next((Setting(layer[key], source) for source, layer in layers if layer.get(key) is not None),
                        Setting(default, "default"))
              for key, default in {"method": None, "acceptance": None, **DEFAULTS}.items()}
    chosen["gamma"], chosen["adaptive"] = _gamma(layers)
    fixed = get_schedule(chosen["schedule"].value).fixed_steps
    if fixed and chosen["steps"].source != "option":
        chosen["steps"] = Setting(fixed, chosen["schedule"].source)
    return chosen


def _gamma(layers: list[tuple[str, dict[str, Any]]]) -> tuple[Setting, Setting]:
    """(gamma, adaptive). gamma: the first integer gamma (`auto` is skipped: it sets no number);
    adaptive: the first `adaptive` given, else False where an option (or the tuned configuration,
    which is measured with it) sets an integer gamma (a fixed length, as before `auto` existed),
    else True where a layer says `auto`, else the default (True). So a pair's or drafter's gamma is
    the cap of `auto` unless an option fixes it."""
    gamma = next((Setting(layer["gamma"], source) for source, layer in layers
                  if layer.get("gamma") is not None and layer["gamma"] != AUTO), Setting(DEFAULTS["gamma"], "default"))
    adaptive = next((Setting(layer["adaptive"], source) for source, layer in layers
                     if layer.get("adaptive") is not None), None)
    if adaptive is None:
        fixed = next(((source, layer["gamma"]) for source, layer in layers[:2] if layer.get("gamma") is not None),
                     None)
        auto = next((source for source, layer in layers if layer.get("gamma") == AUTO), None)
        adaptive = (Setting(False, fixed[0]) if fixed is not None and fixed[1] != AUTO
                    else Setting(True, auto) if auto else Setting(DEFAULTS["adaptive"], "default"))
    return gamma, adaptive


def values(chosen: dict[str, Setting]) -> dict[str, Any]:
    return {key: setting.value for key, setting in chosen.items()}


def named_method(chosen: dict[str, Setting]) -> Method | None:
    """Check every chosen value against its declaration (a pair's defaults are typed by the
    registry, not bounded) and the method's name; -> the method set (None: none)."""
    opts = values(chosen)
    check_settings(opts)  # the schedule's name too (settings.DraftSettings)
    return get_method(opts["method"]) if opts["method"] is not None else None  # '' is no method


def family_settings(method: Method, chosen: dict[str, Setting]) -> Any:
    """The method's family's settings (None: it reads none): each chosen value, or where none was
    set the default the family itself declares (block steps: None, the block size)."""
    if method.family is None:
        return None
    return method.family(**{f.name: family_default(method.family, f.name) if chosen[f.name].source == "default"
                            else chosen[f.name].value for f in fields(method.family)})


def check_used(chosen: dict[str, Setting], method: Method) -> None:
    """A draft setting given as an option that the method does not read would do nothing (a
    `threshold` for ar, a `schedule` for spec-ar): refuse it. Pair and drafter defaults are not
    options: they apply where they are read."""
    adaptive = chosen["adaptive"].value and chosen["adaptive"].source == "option"
    if adaptive and "gamma" in method.settings and "adaptive" not in method.settings:
        choosers = [m.name for m in METHODS.values() if "adaptive" in m.settings]
        raise UsageError(f"method '{method.name}' does not choose its draft length: `gamma` {AUTO} needs "
                         f"{', '.join(choosers[:-1])} or {choosers[-1]}; give an integer `gamma`")
    for key in METHOD_SETTINGS:
        if chosen[key].source == "option" and key not in method.settings:
            if key == "adaptive" and (not adaptive or chosen["gamma"].source == "option"):
                continue  # adaptive False sets nothing; a gamma given is named as itself
            unused = "gamma" if key == "adaptive" else key  # `adaptive` is what `gamma` auto sets
            raise UsageError(f"method '{method.name}' does not use `{unused}`; {_reads(method)}")
    if chosen["threshold"].source == "option" and chosen["remasking"].value != "dynamic":
        raise UsageError(f"`threshold` is read by `remasking` dynamic only, not {chosen['remasking'].value}")


def _reads(method: Method) -> str:
    """What the method reads, as a user sets it: `adaptive` is what `gamma` auto sets."""
    reads = [f"`{k}`" + (f" (an integer or {AUTO})" if k == "gamma" and "adaptive" in method.settings else "")
             for k in method.settings if k != "adaptive"]
    return f"it reads {', '.join(reads)}" if reads else "it reads none of the draft settings"


@contextmanager
def said_where(chosen: dict[str, Setting]) -> Iterator[None]:
    """A UsageError raised inside that names a setting's value (`gamma` 99) taken from the pair or
    the drafter says so, and that the option changes it: the user gave no `gamma` (a declared
    default is as the help says, and named as a setting)."""
    try:
        yield
    except UsageError as e:
        message = str(e)
        for key, s in chosen.items():
            if s.source in WHERE and s.value is not None:
                message = re.sub(rf"`{key}` {re.escape(str(s.value))}(?![\w.])",
                                 f"{key} {s.value} ({WHERE[s.source]}; give `{key}` to change it)", message)
        if message == str(e):
            raise
        raise type(e)(message) from e


def sources(chosen: dict[str, Setting], method: Method, drafter: Any, tuned: Any = None) -> dict[str, str]:
    """Where each setting came from; a method set nowhere is the drafter's kind's (or ar); one the
    tuned record set names its date (generation.tuned.Tuned.where)."""
    where = {key: tuned.where if s.source == "tuned" and tuned else s.source for key, s in chosen.items()}
    if chosen["method"].value is None:
        where["method"] = "drafter" if method.accepts(drafter) else "default"
    return where
