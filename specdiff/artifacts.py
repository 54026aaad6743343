"""An export directory and its manifest: written by `specdiff export`, checked by every runtime
before anything in it is loaded.

    DIR/manifest.json            format, tools, dtype, opset, limits, per component its source
                                 model (the sha256 of each of its files, and its identity: one
                                 sha256 of its config and weights), IO signature and validation
                                 (a drafter's also the draft settings it records, `defaults`),
                                 and the sha256 of every file
    DIR/tokenizer/               the tokenizer the exported models share
    DIR/target.onnx (+ .data)    DIR/drafter.onnx (+ .data)    DIR/target.engine ... (TensorRT)

A TensorRT engine file is a specdiff header and the serialized plan:
    b"specdiff-tensorrt-engine\\n" + one JSON line {tensorrt, gpu, dtype, limits, profile} + plan

Refused, each with one line: a missing or foreign manifest, a listed file that is missing or whose
sha256 differs (corrupt or modified), a tokenizer whose vocabulary is not the exported one, and
manifest values the graphs contradict (the manifest itself is not hashed): an unknown dtype or graph,
a graph or engine outside the hashed files, ids outside the vocabulary, and an IO signature not the
one graphs.py derives from the component's model record (names, dims, dtypes), which each runtime
checks against the graph it opens; graphs not exported from the model they stand in for (bench).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, cast

from .errors import IncompatibleModelsError, LoadError, UsageError
from .reading import read_small_text, sha256_file
from .requests import check_recorded

FORMAT = "specdiff-export"
FORMAT_VERSION = 2  # 2: target steps take additive 4-D masks (draft trees), not a 2-D 0/1 mask
MANIFEST = "manifest.json"
TOKENIZER_DIR = "tokenizer"
ENGINE_MAGIC = b"specdiff-tensorrt-engine\n"
NULL = type(None)
JSON_NAMES = {dict: "an object", list: "an array", str: "a string", int: "an integer",
              float: "a number", bool: "a boolean", NULL: "null"}


@dataclass(frozen=True)
class Maybe:
    """A key a manifest may lack (one written before the key existed)."""

    schema: object


# What the runtimes read from a manifest, with its JSON types: a dict is an object with these keys
# (others are allowed; a Maybe key may be absent), a list [schema] an array of such items, a type
# or tuple of types a value.
SCHEMA = {
    "dtype": str,
    "tokenizer": {"dir": str, "vocab_size": int, "vocab_sha256": str},
    "files": dict,  # {relative path: sha256}, checked by _check_files_record
    "components": dict,  # {"target" | "drafter": COMPONENT}
}
COMPONENT = {"graph": (str, NULL), "engine": (dict, NULL),
             "io": {"inputs": [{"name": str}], "outputs": [{"name": str}]}}
TARGET = {"name": str, "vocab_size": int, "max_length": int, "eos_token_id": (int, NULL), "layers": int,
          "kv_heads": int, "head_dim": int, "head_rows": Maybe(int),
          "feature_layers": Maybe([int]), "features": Maybe(int),  # beside a drafter that reads them
          "sliding_window": Maybe(int),  # a model with sliding_attention layers: the graph's second mask
          "no_trees": Maybe(str)}  # why the graph cannot verify draft trees (absent: it can)
# a drafter's `model` record: the schema its kind's graph declares (specdiff.kinds, graphs.DrafterGraph)
DTYPES = ("fp32", "fp16", "bf16")  # what a graph is exported in (graphs.TORCH_DTYPES, exporters)
TARGET_SIZES = ("vocab_size", "max_length", "layers", "kv_heads", "head_dim")  # integers >= 1


def file_hashes(root: Path) -> dict[str, str]:
    """{relative posix path: sha256} of every file under root but the manifest itself."""
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.name != MANIFEST)
    return {p.relative_to(root).as_posix(): sha256_file(p) for p in files}


# A model's identity: the files that decide its outputs, config.json and its weights (top-level
# *.safetensors, else the other weight formats), not its tokenizer (checked by vocabulary), card or
# README. Recorded per component by `specdiff export`, compared by check_exported_from.
CONFIG = "config.json"
WEIGHTS = (".safetensors",)
OTHER_WEIGHTS = (".bin", ".pt", ".pth", ".ckpt", ".gguf")


def identity_files(names: list[str]) -> list[str]:
    """Of a model directory's files (relative posix paths), those its identity is made of."""
    top = [n for n in names if "/" not in n]
    weights = [n for n in top if n.endswith(WEIGHTS)] or [n for n in top if n.endswith(OTHER_WEIGHTS)]
    return sorted([n for n in top if n == CONFIG] + weights)


def model_identity(files: dict[str, str]) -> str:
    """{relative path: sha256} of a model directory's files -> one sha256 of its config and weights."""
    kept = [(name, files[name]) for name in identity_files(list(files))]
    return hashlib.sha256(json.dumps(kept).encode("utf-8")).hexdigest()


def model_directory(source: str) -> Path | None:
    """The local files of a model as loading.resolve names it (a directory; a hub id already in the
    local Hugging Face cache: no network), None when there are none."""
    if Path(source).is_dir():
        return Path(source)
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(source, local_files_only=True))
    except Exception:  # huggingface_hub raises several types for "not in the cache"
        return None


def identity_of(name: str, kinds: tuple[str, ...], registry: Any = None) -> tuple[str, str]:
    """(source, identity) of a model named as load_target / load_drafter name it (a models.yaml
    name, a directory, a hub id), hashing its config and weights only."""
    from .sources import resolve
    from .registry import as_registry

    source, _ = resolve(name, kinds, as_registry(registry))
    directory = model_directory(source)
    if directory is None:
        raise LoadError(f"cannot find the local files of '{source}' to compare them with an export")
    names = [p.relative_to(directory).as_posix() for p in directory.iterdir() if p.is_file()]
    return source, model_identity({n: sha256_file(directory / n) for n in identity_files(names)})


def check_exported_from(art: Artifacts, kind: str, name: str, registry: Any = None) -> None:
    """Refuse an export whose `kind` ("target" | "drafter") was not exported from the model `name`
    (same config and weights): its graphs would be timed or run as if they were that model. A
    tokenizer alone proves nothing: two models can share one."""
    component = art.component(kind)
    if component is None:
        return
    recorded = component.get("source")
    if not (isinstance(recorded, dict) and isinstance(recorded.get("files"), dict)):
        raise LoadError(f"{art.root / MANIFEST}: components.{kind}.source does not record the model it was "
                        "exported from (export it again)")
    expected = recorded.get("identity") or model_identity(recorded["files"])  # exports before `identity`
    source, got = identity_of(name, (kind,) if kind == "target" else ("drafter", "target"), registry)
    if got != expected:
        where = f" ({source})" if source != name else ""
        raise IncompatibleModelsError(
            f"{art.root}: its {kind} was exported from '{recorded.get('name')}', not from '{name}'{where}: their "
            f"config or weights differ (export '{name}', or use the model the export was made from)")


def vocab_sha256(tokenizer: Any) -> str:
    """A hash of the token -> id map (what decides whether two tokenizers are interchangeable)."""
    items = sorted(tokenizer.get_vocab().items(), key=lambda kv: (kv[1], kv[0]))
    return hashlib.sha256(json.dumps(items, ensure_ascii=False).encode("utf-8")).hexdigest()


def write_manifest(root: Path, manifest: dict[str, Any]) -> None:
    """Write manifest.json last, with the hash of every file already in root."""
    manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, **manifest, "files": file_hashes(root)}
    (root / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")


@dataclass
class Artifacts:
    root: Path
    manifest: dict[str, Any]
    tokenizer: object

    def component(self, kind: str) -> dict[str, Any] | None:
        """The manifest record of "target" or "drafter", None when the export has none."""
        return cast(dict[str, Any] | None, self.manifest["components"].get(kind))

    def record(self, kind: str) -> dict[str, Any]:
        """The manifest record of a component the export holds (KeyError if none: see `component`)."""
        return cast(dict[str, Any], self.manifest["components"][kind])

    def path(self, relative: str) -> Path:
        return self.root / relative


def open_artifacts(directory: str | os.PathLike[str]) -> Artifacts:
    """Read and check an export directory: manifest, each listed file there, tokenizer, sha256s."""
    if not isinstance(directory, (str, os.PathLike)) or not os.fspath(directory):
        raise UsageError(f"`artifacts` must be the path of a `specdiff export` directory, got {directory!r:.40}")
    root = Path(directory)
    manifest = read_manifest(root)
    _check_present(root, manifest["files"])
    tokenizer = _check_tokenizer(root, manifest)
    _check_hashes(root, manifest["files"])
    return Artifacts(root, manifest, tokenizer)


def read_manifest(root: Path) -> dict[str, Any]:
    path = root / MANIFEST
    if not path.is_file():
        what = "does not exist" if not root.exists() else f"has no {MANIFEST}"
        raise LoadError(f"{root} {what}: not a `specdiff export` directory")
    try:
        manifest = json.loads(read_small_text(path))
    except OSError as e:
        raise LoadError(f"{path}: cannot read the manifest: {e.strerror}") from e
    except UnicodeDecodeError as e:
        raise LoadError(f"{path}: unreadable manifest (not UTF-8: byte {e.start})") from e
    except json.JSONDecodeError as e:
        raise LoadError(f"{path}: unreadable manifest ({e})") from e
    except (ValueError, RecursionError) as e:  # a number too long for int(), nesting too deep
        raise LoadError(f"{path}: unreadable manifest ({str(e).split(':')[0]})") from e
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise LoadError(f"{path}: not a specdiff export manifest (no \"format\": \"{FORMAT}\")")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise LoadError(f"{path}: export format version {manifest.get('format_version')!r}; this "
                        f"specdiff reads version {FORMAT_VERSION} (re-export with this version)")
    try:
        _check_manifest(manifest)
    except ValueError as e:
        raise LoadError(f"{path}: malformed manifest: {e}") from e
    return manifest


def _check_manifest(manifest: dict[str, Any]) -> None:
    """ValueError naming the first field the runtimes would trip over (missing, mistyped)."""
    _check(manifest, SCHEMA, "")
    for rel, digest in manifest["files"].items():
        if not isinstance(digest, str):
            raise ValueError(f"files: the sha256 of {rel!r} must be a string")
        if PurePosixPath(rel).is_absolute() or ".." in PurePosixPath(rel).parts:
            raise ValueError(f"files: {rel!r} is not a path inside the export directory")
    if manifest["dtype"] not in DTYPES:
        raise ValueError(f"dtype: unknown dtype {manifest['dtype']!r} (known: {', '.join(DTYPES)})")
    for kind, component in manifest["components"].items():
        if kind not in ("target", "drafter"):
            raise ValueError(f"components: unknown component {kind!r} (known: target, drafter)")
        _check(component, dict, f"components.{kind}")
        record, sizes = _record(kind, component.get("model") if isinstance(component.get("model"), dict) else {})
        _check(component, {**COMPONENT, "model": record}, f"components.{kind}")
        if "defaults" in component["model"]:
            _recorded(component["model"]["defaults"], f"components.{kind}.model")
        if component["engine"] is not None:
            _check(component["engine"], {"file": str}, f"components.{kind}.engine")
        _check_hashed(component, manifest["files"], f"components.{kind}")
        _check_ids(kind, sizes, component["model"], f"components.{kind}.model")
        _check_io(kind, component, manifest["dtype"], f"components.{kind}.io")
    _check_features(manifest["components"])


def _record(kind: str, model: dict[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """(the schema of a component's `model` record, its fields that are sizes): a target's, or what
    the graph its drafter's record names declares (a ValueError naming the known graphs)."""
    from .graphs import graph_kind
    from .kinds import drafter_graph

    if kind == "target":
        return TARGET, TARGET_SIZES
    try:
        graph = drafter_graph(graph_kind(kind, model))
    except ValueError as e:
        raise ValueError(f"components.{kind}.model.kind: {e}") from e
    return graph.record, graph.sizes


def _check_features(components: dict[str, Any]) -> None:
    """The drafter graph's own check of its record; one that reads the features the target's graph
    outputs (DFlash's): both are in the export, of the same layers and size."""
    from .graphs import graph_kind
    from .kinds import drafter_graph

    drafter, target = components.get("drafter"), components.get("target")
    if drafter is None:
        return
    model, graph = drafter["model"], drafter_graph(graph_kind("drafter", drafter["model"]))
    graph.check(model, "components.drafter.model")
    if not graph.features:
        return
    layers = [i + 1 for i in model["target_layer_ids"]]
    if target is None or target["model"].get("feature_layers") != layers or \
            target["model"].get("features") != model["features"]:
        raise ValueError(f"components.target.model: {graph.features} reads the target's hidden states {layers} "
                         f"({model['features']} features): the export's target graph does not output them")


def _check_hashed(component: dict[str, Any], files: dict[str, Any], where: str) -> None:
    """A graph or engine runs only if its file is among the hashed ones (else it runs unchecked)."""
    for key, rel in (("graph", component["graph"]), ("engine.file", (component["engine"] or {}).get("file"))):
        if rel is not None and rel not in files:
            raise ValueError(f"{where}.{key}: {rel!r} is not among the hashed files")


def _check_ids(kind: str, sizes: tuple[str, ...], model: dict[str, Any], where: str) -> None:
    """Sizes >= 1; every id the runtime feeds or reads (eos, mask, the vocabulary) inside the rows
    of the exported head: else an index error inside the runtime, or a stop that never comes."""
    for name in sizes:
        if model[name] < 1:
            raise ValueError(f"{where}.{name} must be >= 1, got {model[name]}")
    rows = model.get("vocab_rows") or model.get("head_rows", model["vocab_size"] + (kind == "drafter"))
    if model["vocab_size"] > rows:
        raise ValueError(f"{where}.vocab_size {model['vocab_size']} is more than the graph's {rows} rows")
    ids = {"eos_token_id": (model.get("eos_token_id"), model["vocab_size"]),
           "mask_id": (model.get("mask_id"), rows)}
    for name, (value, below) in ids.items():
        if value is not None and not 0 <= value < below:
            raise ValueError(f"{where}.{name} {value} is outside the vocabulary (0 .. {below - 1})")


def _check_io(kind: str, component: dict[str, Any], dtype: str, where: str) -> None:
    """The recorded IO signature is the one graphs.py derives from the model record: the names a
    runtime feeds and reads (KV caches of `layers` layers), their dims and dtypes."""
    from .graphs import spec_from_model

    model = component["model"]
    if "head_rows" not in model:  # written before head_rows was recorded: the names alone
        model = {**model, "head_rows": model["vocab_size"] + (kind == "drafter")}
        names = {side: [t["name"] for t in io] for side, io in spec_from_model(kind, model).to_json(dtype).items()}
        got = {side: [t["name"] for t in component["io"][side]] for side in names}
        expected_io: dict[str, Any] = names
    else:
        expected_io, got = spec_from_model(kind, model).to_json(dtype), component["io"]
    for side in ("inputs", "outputs"):
        if got[side] != expected_io[side]:
            first = next((i for i, (a, b) in enumerate(zip(got[side], expected_io[side])) if a != b),
                         min(len(got[side]), len(expected_io[side])))
            want = describe(expected_io[side][first]) if first < len(expected_io[side]) else "nothing"
            have = describe(got[side][first]) if first < len(got[side]) else "nothing"
            raise ValueError(f"{where}.{side}[{first}] is {have}; the model record and dtype make it {want}")


def describe(tensor: object) -> str:
    """An IO record {name, dims, dtype} (or a bare name) as one would write it: 'logits (batch, seq_len, 320) fp32'."""
    if not isinstance(tensor, dict):
        return repr(tensor)
    dims = f" ({', '.join(map(str, tensor['dims']))})" if isinstance(tensor.get("dims"), list) else ""
    return f"{tensor.get('name')}{dims}{' ' + str(tensor['dtype']) if 'dtype' in tensor else ''}"


def _check(value: Any, schema: object, where: str) -> None:
    """value against schema (see SCHEMA); ValueError naming the dotted path of the first problem."""
    if isinstance(schema, dict):
        _check(value, dict, where)
        for key, sub in schema.items():
            if isinstance(sub, Maybe) and key not in value:
                continue
            if key not in value:
                raise ValueError(f"{where + '.' if where else ''}{key} is missing")
            sub = sub.schema if isinstance(sub, Maybe) else sub
            _check(value[key], sub, f"{where + '.' if where else ''}{key}")
    elif isinstance(schema, list):
        _check(value, list, where)
        for i, item in enumerate(value):
            _check(item, schema[0], f"{where}[{i}]")
    elif not isinstance(value, _types(schema)) or (isinstance(value, bool) and bool not in _types(schema)):
        names = " or ".join(JSON_NAMES[t] for t in _types(schema))
        raise ValueError(f"{where} must be {names}, got {JSON_NAMES.get(type(value), type(value).__name__)}")


def _recorded(settings: object, where: str) -> None:
    try:
        check_recorded(settings)
    except ValueError as e:
        raise ValueError(f"{where}.{e}") from e


def _types(schema: object) -> tuple[type, ...]:
    return schema if isinstance(schema, tuple) else (schema,)


def _check_tokenizer(root: Path, manifest: dict[str, Any]) -> Any:
    from specdiff.loading import load_tokenizer

    record = manifest["tokenizer"]
    tokenizer = load_tokenizer(str(root / record["dir"]))
    if vocab_sha256(tokenizer) != record["vocab_sha256"]:
        raise LoadError(f"{root / record['dir']}: this tokenizer is not the one the models were exported "
                        f"with (vocabulary differs; {len(tokenizer)} tokens, exported {record['vocab_size']})")
    return tokenizer


def _check_present(root: Path, expected: dict[str, str]) -> None:
    if missing := [rel for rel in expected if not (root / rel).is_file()]:
        raise LoadError(f"{root}: {len(missing)} file(s) listed in {MANIFEST} are missing: {', '.join(missing[:3])}")


def _check_hashes(root: Path, expected: dict[str, str]) -> None:
    corrupt = [rel for rel, digest in expected.items() if sha256_file(root / rel) != digest]
    if corrupt:
        raise LoadError(f"{root}: sha256 of {', '.join(corrupt[:3])} does not match {MANIFEST} "
                        "(corrupt or modified file; export again)")


def write_engine(path: Path, plan: bytes, meta: dict[str, Any]) -> None:
    with open(path, "wb") as f:
        f.write(ENGINE_MAGIC + json.dumps(meta, sort_keys=True).encode("utf-8") + b"\n")
        f.write(plan)


def read_engine(path: Path) -> tuple[dict[str, Any], bytes]:
    """-> (header, plan bytes)."""
    with open(path, "rb") as f:
        if f.readline() != ENGINE_MAGIC:
            raise LoadError(f"{path}: not a specdiff TensorRT engine (no specdiff header)")
        try:
            meta = json.loads(f.readline())
        except json.JSONDecodeError as e:
            raise LoadError(f"{path}: unreadable engine header") from e
        return meta, f.read()
