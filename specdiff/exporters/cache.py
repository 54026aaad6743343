"""Exports made on demand: `--runtime onnxruntime` without `--artifacts` exports the models once into
specdiff's user cache and reuses that export afterwards.

    $SPECDIFF_CACHE (else $XDG_CACHE_HOME/specdiff, else ~/.cache/specdiff)
        onnx/<key[:16]>/   a `specdiff export` directory (manifest.json, graphs, tokenizer)
    key: sha256 of the target's and the drafter's identities (artifacts.identity_of: their config
         and weights, draft vocabulary included), the dtype, the opset and the export format version

An entry is written as `specdiff export` writes a directory (beside its final name, renamed into
place once validated: complete or absent; two processes exporting the same models keep the one
that finished first) and opened with open_artifacts, which checks every file against the
manifest's sha256. An entry that does not open is exported again, once, saying so in one line.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

from specdiff.artifacts import FORMAT_VERSION, identity_of, open_artifacts
from specdiff.errors import LoadError, UsageError
from specdiff.gguf import cache_root
from specdiff.kinds import get_kind
from specdiff.methods import get_method
from specdiff.registry import Registry

from .export import export

EXPORT_DTYPE = "fp32"  # the dtype whose graphs keep greedy decoding exact (docs/export-onnx-tensorrt.md)
EXPORT_OPSET = 18


def export_key(target: str, drafter: str | None, registry: Registry) -> str:
    """One sha256 of what an export depends on (see the module docstring)."""
    parts = {"target": identity_of(target, ("target",), registry)[1],
             "drafter": identity_of(drafter, ("drafter", "target"), registry)[1] if drafter else None,
             "dtype": EXPORT_DTYPE, "opset": EXPORT_OPSET, "format_version": FORMAT_VERSION}
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


def cached_export(target: str, drafter: str | None, registry: Registry) -> Path:
    """The cached export of `target` (and `drafter`, named as load_target / load_drafter name them),
    made now if there is none or the one there does not open."""
    out = cache_root() / "onnx" / export_key(target, drafter, registry)[:16]
    if (out / "manifest.json").is_file():
        try:
            open_artifacts(out)
            return out
        except LoadError as e:
            _say(f"the cached export {out} does not open ({e}); exporting it again")
            shutil.rmtree(out, ignore_errors=True)
    what = f"'{target}'" + (f" and '{drafter}'" if drafter else "")
    _say(f"exporting {what} for onnxruntime into {out} (once; later runs reuse it)")
    try:
        export(out, target=target, drafter=drafter, dtype=EXPORT_DTYPE, opset=EXPORT_OPSET, registry=registry)
    except (OSError, UsageError):
        if not (out / "manifest.json").is_file():  # not another process that exported the same models first
            raise
    return out


def _say(message: str) -> None:
    print(f"specdiff: {message}", file=sys.stderr)
