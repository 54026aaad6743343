"""Exports made on demand: `--runtime onnxruntime` without `--artifacts` exports the models once into
specdiff's user cache and reuses that export afterwards.

    $SPECDIFF_CACHE (else $XDG_CACHE_HOME/specdiff, else ~/.cache/specdiff)
        onnx/<key[:16]>/   a `specdiff export` directory (manifest.json, graphs, tokenizer)
    key: sha256 of the target's and the drafter's identities (artifacts.identity_of: their config
         and weights, draft vocabulary included), the dtype, the opset and the export format version
         (and, only for an export whose GGUF target reads its stored blocks, that layout's version)

An entry is written as `specdiff export` writes a directory (beside its final name, renamed into
place once validated: complete or absent; a killed export leaves a hidden directory that the next
run removes, atomic.remove_stale) and opened with open_artifacts, which checks every file against
the manifest's sha256. An entry that does not open (no manifest.json, a missing or changed file,
a file where the directory should be) is removed and exported again, once, saying so in one line;
where it cannot be removed or written (a read-only or full cache), one LoadError names the cache
and the fix. Processes that export or repair entries take turns, as the GGUF cache's do
(gguf.take_turns), so two exporting the same models keep the one that finished first.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

from specdiff.artifacts import FORMAT_VERSION, identity_of, open_artifacts
from specdiff.atomic import remove_stale
from specdiff.errors import LoadError, UsageError, WriteError
from specdiff.gguf import ABSENT, cache_root, discard_entry, take_turns
from specdiff.kinds import get_kind
from specdiff.methods import get_method
from specdiff.registry import Registry

from .export import export

EXPORT_DTYPE = "fp32"  # the dtype whose graphs keep greedy decoding exact (docs/export-onnx-tensorrt.md)
EXPORT_OPSET = 18
STORED_BLOCKS_VERSION = 1  # specdiff.exporters.stored's graph layout, in the key of such exports


def export_key(target: str, drafter: str | None, registry: Registry, stored_blocks: bool = False) -> str:
    """One sha256 of what an export depends on (see the module docstring); an export whose target
    reads its GGUF blocks (export's stored_blocks) has a key of its own, the others keep theirs."""
    parts = {"target": identity_of(target, ("target",), registry)[1],
             "drafter": identity_of(drafter, ("drafter", "target"), registry)[1] if drafter else None,
             "dtype": EXPORT_DTYPE, "opset": EXPORT_OPSET, "format_version": FORMAT_VERSION}
    if stored_blocks:
        parts["stored_blocks"] = STORED_BLOCKS_VERSION
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode("utf-8")).hexdigest()


def export_for(pair: str | None, target: str | None, drafter: str | None, method: str | None,
               registry: Registry) -> Path:
    """The cached export of what a run with these options decodes with: the pair's (or the named)
    target, and its drafter unless the method reads none (ar: the target alone). A method whose
    drafter kind has no graph (spec-ar) is refused before anything is exported."""
    target, drafter, defaults = registry.resolve(pair, target, drafter)
    method = method or defaults.get("method")
    needs = get_method(method).needs if method else None
    if method and needs is None:
        drafter = None
    elif needs is not None and get_kind(needs).graph is None:
        raise UsageError(f"method '{method}' drafts with {get_kind(needs).what}, which runs in torch only "
                         "(`runtime` torch)")
    if not isinstance(target, str):
        raise UsageError("`runtime` onnxruntime without `artifacts` exports a named `target` (or a `pair`)")
    return cached_export(target, drafter if isinstance(drafter, str) else None, registry)


def cached_export(target: str, drafter: str | None, registry: Registry, stored_blocks: bool = False) -> Path:
    """The cached export of `target` (and `drafter`, named as load_target / load_drafter name them),
    made now if there is none, or made again if the one there does not open (see the module
    docstring); stored_blocks: its GGUF target's blocks as such (export's option)."""
    out = cache_root() / "onnx" / export_key(target, drafter, registry, stored_blocks)[:16]
    remove_stale(out.parent)
    if entry_damage(out) is None:  # the common case takes no lock
        return out
    with take_turns(out.parent):
        damage = entry_damage(out)
        if damage is None:  # exported meanwhile by another process
            return out
        if damage != ABSENT:
            discard_entry(out, damage)
            _say(f"the cached export {out} does not open ({damage}); exporting it again")
        _export(out, target, drafter, registry, stored_blocks)
    return out


def entry_damage(out: Path) -> str | None:
    """None if the cache entry `out` opens (open_artifacts: its manifest, tokenizer and every file's
    sha256), else why not: ABSENT where there is none."""
    if not os.path.lexists(out):
        return ABSENT
    try:
        open_artifacts(out)
    except LoadError as e:
        return str(e)
    return None


def _export(out: Path, target: str, drafter: str | None, registry: Registry, stored_blocks: bool) -> None:
    """Export into the cache entry `out`; a LoadError naming the cache and the fix where it cannot
    be written."""
    what = f"'{target}'" + (f" and '{drafter}'" if drafter else "")
    _say(f"exporting {what} for onnxruntime into {out} (once; later runs reuse it)")
    try:
        export(out, target=target, drafter=drafter, dtype=EXPORT_DTYPE, opset=EXPORT_OPSET, registry=registry,
               stored_blocks=stored_blocks)
    except (OSError, WriteError, UsageError) as e:
        if entry_damage(out) is None:
            return  # exported meanwhile by a process that could not take turns (no lock)
        if isinstance(e, UsageError):
            raise
        why = getattr(e.__cause__ if isinstance(e, WriteError) else e, "strerror", None) or e
        raise LoadError(f"cannot write the export of {what} to specdiff's cache ({out}: {why}): make room "
                        "there, or set SPECDIFF_CACHE to another directory") from e


def _say(message: str) -> None:
    print(f"specdiff: {message}", file=sys.stderr)
