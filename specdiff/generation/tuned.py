"""The configuration `specdiff tune` measured fastest on this machine, kept in the user cache and
read by generate (the CLI and the API) where no configuration is chosen: option > tuned > pair >
drafter > default.

    $SPECDIFF_CACHE/tuned/<pair>.json   {"pair", "date", "key", "runtimes": {runtime: {"config", "measured"}}}
    ($SPECDIFF_TUNED/<pair>.json where that is set: the test suite keeps a user's records out)

Per runtime, the fastest configuration identical to plain decoding measured on it: `pair` (the
models.yaml pair with the same target whose drafter won; the tuned pair itself for plain
decoding), `method`, `gamma`, `tree`, `steps` and `schedule` (a diffusion drafter's), `runtime`
and `threads`, and its tokens/s. A caller takes the
fastest among the runtimes it can run (the CLI: any; the API, which runs torch models: torch).
key: what the measurement depends on, all of it: the machine (its CPU model and the CPUs this
process may use), the versions of specdiff, torch, transformers and ONNX Runtime, and the files of
the target and of every drafter the candidate pairs name (path, size and modification time:
replaced weights make another key). A record whose key is not this machine's key now is stale: it
is ignored, never trusted, and said in one warning line.

May import: registry, sources, artifacts (model_directory), gguf (cache_root), atomic, errors.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass
from datetime import date
from importlib import metadata
from pathlib import Path
from typing import Any, Mapping

from ..atomic import new_file
from ..errors import SpecdiffWarning
from ..gguf import cache_root
from ..registry import Registry
from ..sources import resolve

CONFIG_KEYS = ("pair", "method", "gamma", "tree", "steps", "schedule", "runtime", "threads")
SETTINGS = ("method", "gamma", "tree", "steps", "schedule")  # what the plan takes from it (None: not set)
CHOICES = ("pair", "target", "drafter", "artifacts", "method", "gamma", "adaptive", "tree", "steps", "schedule",
           "drafts", "draft_temperature", "acceptance", "runtime")  # any of these given: the caller chose
VERSIONS = ("specdiff", "torch", "transformers", "onnxruntime")


@dataclass(frozen=True)
class Tuned:
    """A record that holds for this machine now."""

    pair: str  # the pair tuned (the default pair generate runs)
    date: str  # ISO date of the measurement
    config: dict[str, Any]  # CONFIG_KEYS -> the fastest exact configuration measured

    @property
    def where(self) -> str:
        return f"tuned on this machine, {self.date}"


def record_path(pair: str) -> Path:
    folder = os.environ.get("SPECDIFF_TUNED")
    return (Path(folder) if folder else cache_root() / "tuned") / f"{pair}.json"


def candidate_pairs(pair: str, registry: Registry) -> list[str]:
    """The pair and every other installed pair with its target, in models.yaml order: the drafters
    tune measures (their `defaults.method` each)."""
    target = registry.pair(pair).target
    return [pair] + [p for p in registry.names("pair")
                     if p != pair and registry.pair(p).target == target and not registry.missing(p)]


def machine_key(pair: str, registry: Registry) -> dict[str, Any]:
    """What a measurement of the pair's candidates depends on (see the module docstring)."""
    models = {registry.pair(pair).target}
    for p in candidate_pairs(pair, registry):
        models.update(m for m in (registry.pair(p).drafter, registry.pair(p).ar_drafter) if m)
    return {"cpu": _cpu_model(), "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
            else os.cpu_count(), "versions": {name: _version(name) for name in VERSIONS},
            "files": {name: _files(name, registry) for name in sorted(models)}}


def write(pair: str, runtimes: dict[str, tuple[dict[str, Any], dict[str, Any]]], registry: Registry) -> Path:
    """Record, per runtime, the fastest (config, measured) of the pair on this machine (written
    whole or not at all) -> its path."""
    path = record_path(pair)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"pair": pair, "date": date.today().isoformat(), "key": machine_key(pair, registry),
              "runtimes": {rt: {"config": {k: config.get(k) for k in CONFIG_KEYS}, "measured": measured}
                           for rt, (config, measured) in runtimes.items()}}
    with new_file(path) as tmp:
        tmp.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return path


def read(pair: str, registry: Registry, runtimes: tuple[str, ...] | None = None) -> tuple[Tuned | None, str | None]:
    """-> (the fastest configuration of the pair's record among `runtimes` (None: any) if the record
    holds here now, else None; why a record there was not used)."""
    path = record_path(pair)
    if not path.is_file():
        return None, None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        entries, when, key = record["runtimes"], record["date"], record["key"]
        best = max((e for rt, e in entries.items() if runtimes is None or rt in runtimes),
                   key=lambda e: float(e["measured"]["tokens_per_s"]), default=None)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        return None, f"{path} is unreadable ({e}): run `specdiff tune` again"
    if key != machine_key(pair, registry):
        return None, f"{path} was measured on other hardware, versions or weights: run `specdiff tune` again"
    if best is None:
        return None, None
    return Tuned(pair, str(when), {k: best["config"].get(k) for k in CONFIG_KEYS}), None


def lookup(options: Mapping[str, Any], registry: Registry, runtimes: tuple[str, ...] | None = None) -> Tuned | None:
    """The default pair's record where `options` choose no configuration (none of CHOICES given,
    nor `compile`), its fastest among `runtimes`; a stale or damaged one is one warning and None."""
    if options.get("compile") or any(options.get(k) is not None for k in CHOICES):
        return None
    record, why = read(registry.default_pair(), registry, runtimes)
    if why:
        warnings.warn(SpecdiffWarning(why), stacklevel=3)
    return record


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or platform.machine()


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _files(name: str, registry: Registry) -> dict[str, list[int]]:
    """Each file of a model's local directory -> [size, mtime_ns] (a hub id not cached: none)."""
    from ..artifacts import model_directory
    directory = model_directory(resolve(name, ("target", "drafter"), registry)[0])
    if directory is None:
        return {}
    return {p.name: [p.stat().st_size, p.stat().st_mtime_ns] for p in sorted(directory.iterdir()) if p.is_file()}
