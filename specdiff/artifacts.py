"""An export directory and its manifest: written by `specdiff export`, checked by every runtime
before anything in it is loaded.

    DIR/manifest.json            format, tools, dtype, opset, limits, per component its source
                                 model, IO signature and validation, and the sha256 of every file
    DIR/tokenizer/               the tokenizer the exported models share
    DIR/target.onnx (+ .data)    DIR/drafter.onnx (+ .data)    DIR/target.engine ... (TensorRT)

A TensorRT engine file is a specdiff header and the serialized plan:
    b"specdiff-tensorrt-engine\\n" + one JSON line {tensorrt, gpu, dtype, limits, profile} + plan

Refused, each with one line: a missing or foreign manifest, a listed file that is missing or whose
sha256 differs (corrupt or modified), a tokenizer whose vocabulary is not the exported one.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from .errors import LoadError

FORMAT = "specdiff-export"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
TOKENIZER_DIR = "tokenizer"
CHUNK = 1 << 20
ENGINE_MAGIC = b"specdiff-tensorrt-engine\n"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def file_hashes(root: Path) -> dict[str, str]:
    """{relative posix path: sha256} of every file under root but the manifest itself."""
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.name != MANIFEST)
    return {p.relative_to(root).as_posix(): sha256_file(p) for p in files}


def vocab_sha256(tokenizer) -> str:
    """A hash of the token -> id map (what decides whether two tokenizers are interchangeable)."""
    items = sorted(tokenizer.get_vocab().items(), key=lambda kv: (kv[1], kv[0]))
    return hashlib.sha256(json.dumps(items, ensure_ascii=False).encode("utf-8")).hexdigest()


def write_manifest(root: Path, manifest: dict) -> None:
    """Write manifest.json last, with the hash of every file already in root."""
    manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, **manifest, "files": file_hashes(root)}
    (root / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")


@dataclass
class Artifacts:
    root: Path
    manifest: dict
    tokenizer: object

    def component(self, kind: str) -> dict | None:
        """The manifest record of "target" or "drafter", None when the export has none."""
        return self.manifest["components"].get(kind)

    def path(self, relative: str) -> Path:
        return self.root / relative


def open_artifacts(directory) -> Artifacts:
    """Read and check an export directory: manifest, tokenizer, then every file's sha256."""
    root = Path(directory)
    manifest = read_manifest(root)
    tokenizer = _check_tokenizer(root, manifest)
    _check_files(root, manifest["files"])
    return Artifacts(root, manifest, tokenizer)


def read_manifest(root: Path) -> dict:
    path = root / MANIFEST
    if not path.is_file():
        what = "does not exist" if not root.exists() else f"has no {MANIFEST}"
        raise LoadError(f"{root} {what}: not a `specdiff export` directory")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise LoadError(f"{path}: unreadable manifest ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise LoadError(f"{path}: not a specdiff export manifest (no \"format\": \"{FORMAT}\")")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise LoadError(f"{path}: export format version {manifest.get('format_version')!r}; this "
                        f"specdiff reads version {FORMAT_VERSION} (re-export with this version)")
    missing = [k for k in ("components", "files", "tokenizer", "dtype") if k not in manifest]
    if missing:
        raise LoadError(f"{path}: malformed manifest (missing {', '.join(missing)})")
    return manifest


def _check_tokenizer(root: Path, manifest: dict):
    from specdiff.loading import load_tokenizer

    record = manifest["tokenizer"]
    tokenizer = load_tokenizer(str(root / record["dir"]))
    if vocab_sha256(tokenizer) != record["vocab_sha256"]:
        raise LoadError(f"{root / record['dir']}: this tokenizer is not the one the models were exported "
                        f"with (vocabulary differs; {len(tokenizer)} tokens, exported {record['vocab_size']})")
    return tokenizer


def _check_files(root: Path, expected: dict[str, str]) -> None:
    missing = [rel for rel in expected if not (root / rel).is_file()]
    if missing:
        raise LoadError(f"{root}: {len(missing)} file(s) listed in {MANIFEST} are missing: {', '.join(missing[:3])}")
    corrupt = [rel for rel, digest in expected.items() if sha256_file(root / rel) != digest]
    if corrupt:
        raise LoadError(f"{root}: sha256 of {', '.join(corrupt[:3])} does not match {MANIFEST} "
                        "(corrupt or modified file; export again)")


def write_engine(path: Path, plan: bytes, meta: dict) -> None:
    with open(path, "wb") as f:
        f.write(ENGINE_MAGIC + json.dumps(meta, sort_keys=True).encode("utf-8") + b"\n")
        f.write(plan)


def read_engine(path: Path) -> tuple[dict, bytes]:
    """-> (header, plan bytes)."""
    with open(path, "rb") as f:
        if f.readline() != ENGINE_MAGIC:
            raise LoadError(f"{path}: not a specdiff TensorRT engine (no specdiff header)")
        try:
            meta = json.loads(f.readline())
        except json.JSONDecodeError:
            raise LoadError(f"{path}: unreadable engine header") from None
        return meta, f.read()
