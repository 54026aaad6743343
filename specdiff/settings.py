"""The settings of a run, each declared once: a field of the frozen dataclass of the family that
reads it, with its default, its type, its bound and its help. Torch-free: the CLI reads it for its
help text and `requests` for its checks before anything loads.

    SamplingSettings  how p (and q) are warped: every method (specdiff.sampling.Sampling)
    RunSettings       every method: max_new_tokens, batch_size, chat
    DraftSettings     causal targets' speculative methods (spec-ar, specdiff, dflash)
    BlockSettings     block-diffusion targets' methods (block, simsd-exact)

What reads the declarations: `generation.choosing.choose` (where each setting comes from: option >
models.yaml pair > the drafter's recorded settings > the default here), `requests` (types and
bounds of options), `registry` (types of a pair's `defaults`), `specdiff generate --help` (the
defaults it states), `generate()`'s forwarding (OPTIONS) and `specdiff bench` (the fields a method
reads, methods.Method.settings, are what it sweeps). A field two families declare (steps, gamma)
has one type and bound; each family keeps its own default.

May import: the standard library and specdiff.names only.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any, Callable

from .names import REMASKING, SCHEDULES

PENALTY_RANGE = (1e-30, 1e30)  # a penalty p scales logits by up to max(p, 1 / p): float32 overflows past this


def _int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _real(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _count(x: object) -> bool:
    return _int(x) and x >= 1  # type: ignore[operator]


def setting(default: Any, types: type | tuple[type, ...], ok: Callable[[Any], bool], expects: str,
            help: str) -> Any:
    """A declared field: `ok(value)` says whether a value given is valid; `expects` says what is
    (`gamma` must `expects`, got ...: "be an integer >= 1"); `help`: what it does, for --help."""
    return field(default=default, metadata={"types": types, "ok": ok, "expects": expects, "help": help})


COUNT = (int, _count, "be an integer >= 1")


@dataclass(frozen=True)
class SamplingSettings:
    temperature: float = setting(0.0, (int, float), lambda x: _real(x) and 0 <= x < math.inf,
                                 "be a finite number >= 0 (0 = greedy)", "0 = greedy")
    top_k: int = setting(0, int, lambda x: _int(x) and x >= 0, "be an integer >= 0 (0 disables it)",
                         "Keep the k most likely tokens (0 = all)")
    top_p: float = setting(1.0, (int, float), lambda x: _real(x) and 0 < x <= 1, "be a number in (0, 1]",
                           "Nucleus mass in (0, 1]")
    repetition_penalty: float = setting(
        1.0, (int, float), lambda x: _real(x) and PENALTY_RANGE[0] <= x <= PENALTY_RANGE[1],
        f"be a finite number from {PENALTY_RANGE[0]:g} to {PENALTY_RANGE[1]:g} (1 = none; past them penalised "
        "logits overflow float32)", "Hugging Face's repetition penalty on the target (1 = none)")


@dataclass(frozen=True)
class RunSettings:
    max_new_tokens: int = setting(64, *COUNT, "Tokens to generate per prompt")
    batch_size: int = setting(8, *COUNT, "Prompts decoded together (rows refill as others finish); the output "
                                         "does not depend on it")
    chat: bool = setting(False, bool, lambda x: isinstance(x, bool), "be True or False",
                         "Put each prompt through the target's chat template")


AUTO = "auto"  # `gamma` auto: the draft length is chosen each step (specdiff.adaptive), capped by an integer gamma


TREE_MAX = 16  # `tree` auto: sizes 0..TREE_MAX (specdiff.tree_sizes)


def tree_nodes(tree: int | str) -> int:
    """The most nodes a `tree` setting drafts (auto: TREE_MAX)."""
    return TREE_MAX if tree == AUTO else int(tree)


def _gamma(x: object) -> bool:
    return _count(x) or x == AUTO


@dataclass(frozen=True)
class DraftSettings:
    """gamma: the draft length when `adaptive` is False; the most a step drafts when it is True.
    An integer `gamma` option fixes the length; `gamma` auto (or no option: the default) chooses it
    each step, capped by the pair's, else the drafter's, else the default integer gamma
    (generation.choosing.choose). The value "auto" never reaches this class: gamma is an int."""

    gamma: int = setting(8, (int, str), _gamma, f"be an integer >= 1 or {AUTO}",
                         f"Draft length; {AUTO}: chosen each step up to the pair's or drafter's gamma")
    steps: int = setting(4, *COUNT, "Denoising steps T per draft (block-diffusion targets: per block)")
    schedule: str = setting("l2r", str, lambda x: x in SCHEDULES, f"be one of {', '.join(SCHEDULES)}",
                            "Order in which draft slots are committed")
    drafts: int = setting(1, *COUNT, "K candidate drafts per step from one drafter call, the target keeping one")
    draft_temperature: float | None = setting(
        None, (int, float), lambda x: _real(x) and 0 < x < math.inf, "be a finite number > 0",
        "Temperature candidates 2..K are sampled at")
    tree: int | str = setting(0, (int, str), lambda x: (_int(x) and x >= 0) or x == AUTO,
                              f"be an integer >= 0 (0: a chain) or {AUTO}",
                              "Draft a tree of up to N tokens, best-first by the drafter's joint probability, "
                              "depth at most gamma, verified in one target call (0: a chain; "
                              f"{AUTO}: the size chosen each step, up to {TREE_MAX})")
    adaptive: bool = setting(True, bool, lambda x: isinstance(x, bool), "be True or False",
                             "Choose each step's draft length in 0..gamma from the acceptance so far and "
                             "measured costs (what `gamma` auto sets; an integer `gamma` option clears it)")


@dataclass(frozen=True)
class BlockSettings:
    remasking: str = setting("static", str, lambda x: x in REMASKING, f"be one of {', '.join(REMASKING)}",
                             "Block-diffusion targets: which masked slots a denoising step commits")
    steps: int | None = setting(None, *COUNT, "Denoising steps per block (default: the block size)")
    threshold: float = setting(0.9, (int, float), lambda x: _real(x) and 0 <= x <= 1, "lie in [0, 1]",
                               "Block-diffusion targets, remasking dynamic: confidence to commit a slot")
    gamma: int = setting(8, *COUNT, "Draft transitions per verification (simsd-exact)")


FAMILIES: tuple[type, ...] = (SamplingSettings, RunSettings, DraftSettings, BlockSettings)


def _declared() -> dict[str, Field[Any]]:
    """Every setting's field, the first family's where two declare it (their defaults may differ)."""
    table: dict[str, Field[Any]] = {}
    for family in FAMILIES:
        for f in fields(family):
            table.setdefault(f.name, f)
    return table


DECLARED = _declared()
DEFAULTS: dict[str, Any] = {name: f.default for name, f in DECLARED.items()}
OPTIONS = tuple(name for name in DECLARED if name != "chat")  # what plan() takes as **options
METHOD_SETTINGS = tuple(dict.fromkeys(f.name for family in (DraftSettings, BlockSettings) for f in fields(family)))
TYPES: dict[str, type | tuple[type, ...]] = {name: f.metadata["types"] for name, f in DECLARED.items()}


def problem(name: str, value: Any) -> str | None:
    """What is wrong with `value` for the declared setting `name` (None: nothing, or not given)."""
    f = DECLARED[name]
    if value is None or f.metadata["ok"](value):
        return None
    return f"`{name}` must {f.metadata['expects']}"


def family_default(family: type, name: str) -> Any:
    """The default `family` declares for `name`."""
    f = next(f for f in fields(family) if f.name == name)
    return None if f.default is MISSING else f.default


def help_text(name: str, where: str = "") -> str:
    """`name`'s help and its declared default, after `where` (the places looked first), for --help."""
    return f"{DECLARED[name].metadata['help']} [default: {where}{DEFAULTS[name]}]."
