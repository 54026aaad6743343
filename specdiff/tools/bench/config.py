"""What a bench runs: the models loaded once (Models), one row's method and settings (Variant),
the settings every row shares (Settings), and which models each method needs (NEEDS).
May import: the library (loading, registry, methods); not the other bench modules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence, cast

from torch import nn

from ...drafters.autoregressive import ARDrafter
from ...kinds import DrafterKind, get_kind, kind_of
from ...drafters.dflash import DFlashDrafter
from ...drafters.diffusion import DiffusionDrafter
from ...contracts import Drafter
from ...errors import UsageError
from ...loading import load_drafter, load_target
from ...methods import METHODS as REGISTRY
from ...names import PEERS
from ...registry import Registry, load_registry
from ...requests import check_named
from ...resources import data_path
from ...targets.block import BlockDiffusionTarget
from ...targets.causal import CausalLMTarget
from ...vocab import DraftVocab

METHODS = (*(m for m in REGISTRY if REGISTRY[m].target == "causal"), *PEERS)  # block targets: bench_block.py
NEEDS = {**{m.name: get_kind(m.needs).slot for m in REGISTRY.values() if m.needs}, "hf-assisted": "ar_drafter"}
DEFAULT_PROMPTS = data_path("prompts", "heldout.jsonl")


@dataclass
class Models:
    target: CausalLMTarget | BlockDiffusionTarget  # the HF peers call its model
    drafter: DiffusionDrafter | DFlashDrafter | BlockDiffusionTarget | None = None
    ar_drafter: ARDrafter | None = None
    others: list[Drafter] = field(default_factory=list)  # drafters of other kinds (--also-drafter): their methods' rows
    graphs: dict[str, dict[str, Any]] = field(default_factory=dict)  # runtime -> its {"target", "drafter", "others"}

    def drafter_for(self, method: str, runtime: str = "torch") -> Any:
        """The drafter `method` drafts with on `runtime` (None: it drafts with none): the
        ar_drafter, or the first of the drafter and the others whose kind it drafts with (the
        drafter when none is: the method then refuses it in its own words). A graph runtime's
        come from its exports (`graphs`), torch's and compiled's are these models."""
        slot = NEEDS.get(method)
        if slot is None:
            return None
        held: dict[str, Any] = self.graphs.get(runtime, {}) if runtime not in ("torch", "compiled") else \
            {"drafter": self.drafter, "ar_drafter": self.ar_drafter, "others": self.others}
        candidates = [held.get(slot), *(held.get("others", []) if slot == "drafter" else [])]
        fit = (d for d in candidates if d is not None and (method not in REGISTRY or REGISTRY[method].accepts(d)))
        return next(fit, candidates[0])

    def drafter_module(self, method: str) -> nn.Module | BlockDiffusionTarget | None:
        """The module whose forward calls are drafter calls for `method` (None: no drafter)."""
        drafter = self.drafter_for(method)
        module = drafter.model if NEEDS.get(method) == "ar_drafter" and drafter is not None else drafter
        return cast(nn.Module | BlockDiffusionTarget | None, module)

    def draft_vocab(self, v: Variant) -> DraftVocab | None:
        """The draft vocabulary of the drafter `v` drafts with (specdiff.vocab; None: a full head)."""
        return getattr(self.drafter_for(v.method, v.runtime), "draft_vocab", None)

    def names(self) -> dict[str, Any]:
        names = {"target": self.target.name, "drafter": getattr(self.drafter, "source", None),
                 "ar_drafter": getattr(self.ar_drafter, "source", None)}
        return names | ({"others": [getattr(d, "source", None) for d in self.others]} if self.others else {})


@dataclass(frozen=True)
class Variant:
    method: str
    gamma: int | str | None = None  # an integer: fixed; "auto": chosen each step, up to Settings.gamma_cap
    steps: int | None = None
    schedule: str | None = None
    drafts: int | None = None  # K candidate drafts (None: the plan's default, 1)
    tree: int | str | None = None  # draft tree nodes (None or 0: a chain; auto: chosen each step)
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
        parts += ([f"K={self.drafts}"] if self.drafts else []) + ([f"tree={self.tree}"] if self.tree else [])
        parts += [self.acceptance] if self.acceptance else []
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
    gamma_cap: int | None = None  # the most a `gamma` auto row drafts (None: the drafter's, else 8)


def prompt_sets() -> dict[str, Path]:
    """The held-out prompt sets shipped in the package, by name (each file's stem under
    data/prompts: smol-general, what people ask a chat model; smol-heldout, questions about Python's
    standard library; heldout, the demo pair's)."""
    return {p.stem: p for p in sorted(data_path("prompts").glob("*.jsonl"))}


def default_prompts(pair: str | None, target: Any, registry: Registry | None = None, prompt_set: str | None = None
                    ) -> Path:
    """The prompt file bench uses when given none: the named shipped set, else the pair's
    `prompts:`, else DEFAULT_PROMPTS."""
    if prompt_set is not None:
        sets = prompt_sets()
        if prompt_set not in sets:
            raise UsageError(f"`prompt_set` {prompt_set!r}: no such shipped set (one of {', '.join(sets)})")
        return sets[prompt_set]
    entry = (registry or load_registry()).chosen_pair(pair, target)
    return entry.prompts if entry is not None and entry.prompts is not None else DEFAULT_PROMPTS


def load_models(*, pair: str | None = None, target: Any = None, drafter: Any = None, ar_drafter: Any = None,
                others: Sequence[str] = (), methods: Sequence[str] = (), device: str = "cpu", dtype: str = "auto",
                registry: Registry | None = None) -> tuple[Models, dict[str, Any]]:
    """Load each model once. -> (models, the pair's defaults). With neither pair nor target, the
    `demo` pair if models.yaml has one. When `methods` need an AR drafter and none is given, the
    pair's `ar_drafter:` is loaded. `others`: drafters of other kinds than the drafter's (an
    EAGLE-3 head beside a DFlash drafter), each drafting its own methods' rows."""
    for name in others:  # before the target loads (a minute for a large one)
        check_named(name, "others")
    registry = registry or load_registry()
    if ar_drafter is None and any(NEEDS.get(m) == "ar_drafter" for m in methods):
        ar_drafter = getattr(registry.chosen_pair(pair, target), "ar_drafter", None)
    target, drafter, defaults = registry.resolve(pair, target, drafter)
    models = Models(load_target(target, device=device, dtype=dtype, registry=registry))
    for name, must_be_ar in ((drafter, False), (ar_drafter, True)):
        if name is None:
            continue
        loaded = load_drafter(name, device=device, dtype=dtype, registry=registry)
        slot = cast(DrafterKind, kind_of(loaded)).slot  # the field its kind loads into
        if must_be_ar and slot != "ar_drafter":
            raise UsageError(f"ar_drafter '{name}' is not a causal LM")
        setattr(models, slot, loaded)
    for name in others:
        models.others.append(_other(name, models, device, dtype, registry))
    return models, defaults


def _other(name: str, models: Models, device: str, dtype: str, registry: Registry) -> Drafter:
    """Another drafter, of a kind no loaded drafter has (rows are told apart by method, so two of
    one kind would draft the same rows)."""
    loaded = load_drafter(name, device=device, dtype=dtype, registry=registry)
    kind = cast(DrafterKind, kind_of(loaded))
    held = [kind_of(d) for d in (models.drafter, models.ar_drafter, *models.others) if d is not None]
    if kind.slot != "drafter":
        raise UsageError(f"also-drafter '{name}' is {kind.what}: that one is the `ar_drafter`")
    if kind in held:
        raise UsageError(f"also-drafter '{name}' is {kind.what}, a kind already loaded: each drafter beside the "
                         "first must be of its own kind")
    return loaded
