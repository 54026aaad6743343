"""Where a model's files come from and how they are read, for loading.py and every drafter kind
(specdiff.kinds): a name resolved (models.yaml entry, directory, GGUF file, hub id) to a Source,
its config.json, its tokenizer, the dtype and device asked for, and transformers' loading made
strict (weights that do not match config.json are refused, not filled with random values).
"""

from __future__ import annotations

import os
import re
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, Qwen3Config, Qwen3ForCausalLM
from transformers.utils import logging as hf_logging

from .errors import LoadError, RegistryError, UsageError
from .gguf import GGUFSource, gguf_directory
from .hub import fetch, hub_call
from .nets.checkpoint import read_json
from .nets.sdar import INDEX
from .registry import ModelEntry, Registry
from .requests import check_device_name, check_named, check_names

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "special_tokens_map.json")
BLOCK_FILES = ("config.json", "*.safetensors", INDEX, "chat_template.jinja", *TOKENIZER_FILES)


@dataclass(frozen=True)
class Source:
    """A model as named: where its files are (`location`: a local directory or a hub id), its
    models.yaml entry if any, and the registry it was resolved in."""

    location: str
    entry: ModelEntry | None
    registry: Registry

    @property
    def name(self) -> str:
        """How results name it: the models.yaml name, else where it was found."""
        return self.entry.name if self.entry else self.location

    @property
    def format(self) -> str | None:
        """The models.yaml `format:` naming a diffusion checkpoint format (None: detected)."""
        return self.entry.format if self.entry else None

    def config(self) -> dict[str, Any]:
        """config.json (fetched alone for a hub id)."""
        return read_json(fetch(self.location, ("config.json",)) / "config.json")


def check_device(device: str) -> None:
    """Refuse, before anything is loaded, a device torch cannot parse, this machine lacks, or
    that holds no data (meta)."""
    check_device_name(device)  # not a string: a TypeError (or an int overflow) inside torch
    try:
        parsed = torch.device(device)
    except RuntimeError as e:
        raise UsageError(f"unknown device '{device}' (e.g. cpu, cuda, cuda:1)") from e
    if parsed.type == "meta":
        raise UsageError("device 'meta' holds shapes, not values: a model cannot generate on it")
    try:
        torch.empty(0, device=parsed)
    except (RuntimeError, AssertionError, NotImplementedError) as e:  # torch's "not compiled with" is an assert
        raise LoadError(f"device '{device}' is not usable: {str(e).splitlines()[0].split('. ')[0]}") from e


def resolve_dtype(dtype: str, device: str) -> torch.dtype:
    check_names(dtype=dtype)  # a list was an unhashable-type TypeError
    if dtype == "auto":
        return torch.float16 if torch.device(device).type == "cuda" else torch.float32
    try:
        return DTYPES[dtype]
    except KeyError as e:
        raise UsageError(f"unknown dtype '{dtype}' (choose from auto, {', '.join(DTYPES)})") from e


def resolve(name: str | os.PathLike[str], kinds: tuple[str, ...], registry: Registry) -> tuple[str, ModelEntry | None]:
    """-> (local directory or hub id, registry entry if any)."""
    if not isinstance(name, (str, os.PathLike)):
        raise UsageError(f"`{kinds[0]}` must be a models.yaml name, a directory or a hub id (a string or a path), "
                         f"got {type(name).__name__}")
    check_named(name, kinds[0])
    name = os.fspath(name)
    entry = registry.entries.get(name)
    if entry is not None:
        if not isinstance(entry, ModelEntry) or entry.kind not in kinds:  # a PairEntry is of kind pair
            raise RegistryError(f"'{name}' is a {entry.kind} in models.yaml, not a {' or '.join(kinds)}")
        if entry.path is not None and not entry.path.is_dir():
            what = "is not a directory" if entry.path.exists() else "does not exist"
            raise LoadError(f"{registry.file.name} entry '{name}': directory {entry.path} {what}")
        return entry.source, entry
    path = Path(name).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return str(gguf_directory(GGUFSource(str(path)))), None
    if path.exists():
        if not (path / "config.json").is_file():
            raise LoadError(f"{path}: no model here (config.json not found)")
        return str(path), None
    if HUB_ID.match(name) and not name.startswith("."):
        return name, None
    known = ", ".join(registry.names(kinds[0]))
    raise RegistryError(f"unknown model '{name}': not in models.yaml ({known}) and not a directory")


def source_of(name: str | os.PathLike[str], kinds: tuple[str, ...], registry: Registry) -> Source:
    """resolve(), as a Source."""
    return Source(*resolve(name, kinds, registry), registry)


def load_tokenizer(source: str) -> Any:
    """The transformers tokenizer at a directory or hub id (a LoadError line if none loads)."""
    return hub_call("tokenizer", source, AutoTokenizer.from_pretrained, trust_remote_code=False)


def load_causal_lm(source: Source, device: str, dtype: str) -> tuple[Any, Any]:
    """-> (the transformers model on `device`, its tokenizer)."""
    tokenizer = load_tokenizer(tokenizer_source(source.entry, source.registry) or source.location)
    with no_loading_bars():
        model, info = hub_call("model", source.location, AutoModelForCausalLM.from_pretrained,
                               dtype=resolve_dtype(dtype, device), trust_remote_code=False,
                               output_loading_info=True, ignore_mismatched_sizes=True)
    check_loading_info(source.location, info)
    return model.to(device), tokenizer


@contextmanager
def no_loading_bars() -> Iterator[None]:
    """Within the block, transformers draws no bars of its own ("Loading weights"); its hook is
    restored afterwards, so the user's settings stand. Download bars are huggingface_hub's and
    stay. transformers 4 has no such hook (its "Loading checkpoint shards" bar stays)."""
    set_hook = getattr(hf_logging, "set_tqdm_hook", None)
    if set_hook is None:
        yield
        return
    previous = set_hook(lambda factory, args, kwargs: hf_logging.EmptyTqdm(*args, **kwargs))
    try:
        yield
    finally:
        set_hook(previous)


def check_loading_info(source: str, info: dict[str, Any]) -> None:
    """Loading is strict: refuse weights that do not match config.json, which transformers would
    fill with random values (missing, mis-shaped) or skip (unexpected). Tied weights (lm_head to
    wte) and the architecture's known leftovers (GPT-2's attn.bias) are not reported by it."""
    problems = [f"missing {k}" for k in sorted(info.get("missing_keys", ()))]
    problems += [f"unexpected {k}" for k in sorted(info.get("unexpected_keys", ()))]
    problems += [_mismatch(m) for m in sorted(info.get("mismatched_keys", ()), key=str)]
    problems += [str(e).strip().splitlines()[0] for e in info.get("error_msgs", ()) if str(e).strip()]
    if problems:
        shown = "; ".join(problems[:3]) + (f"; ... ({len(problems)} in all)" if len(problems) > 3 else "")
        raise LoadError(f"{source}: weights do not match config.json: {shown}")


def _mismatch(entry: tuple[Any, ...]) -> str:
    """transformers reports a mis-shaped tensor as (key, checkpoint shape, model shape)."""
    key, found, expected = entry
    return f"shape of {key}: expected {tuple(expected)}, found {tuple(found)}"


def qwen3_model(source: str, directory: Path, config: Qwen3Config, device: str, dtype: str) -> Any:
    """transformers' own Qwen3ForCausalLM over a checkpoint whose model_type it does not know
    (SDAR, A2D: `config` read and checked by nets/), strictly loaded, on `device`."""
    with no_loading_bars():
        model, info = hub_call("model", str(directory), Qwen3ForCausalLM.from_pretrained, config=config,
                               dtype=resolve_dtype(dtype, device), trust_remote_code=False,
                               output_loading_info=True)
    check_loading_info(source, info)
    return model.to(device)


def quiet_tokenizer(source: str) -> Any:
    """load_tokenizer beside a config.json whose model_type transformers does not know (sdar,
    a2d-qwen3), of which AutoTokenizer would warn (and of the config's transformers-4 fields)."""
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            return load_tokenizer(source)
    finally:
        hf_logging.set_verbosity(verbosity)


def tokenizer_source(entry: ModelEntry | None, registry: Registry) -> str | None:
    """Where a models.yaml entry's `tokenizer:` points, if it has one."""
    return resolve(entry.tokenizer, ("target", "drafter"), registry)[0] if entry and entry.tokenizer else None


def drafter_tokenizer(directory: Path, source: Source) -> Any:
    """The tokenizer beside the weights, else the entry's `tokenizer:`, else None (the SEDD and
    MDLM repositories carry none; check_pair then compares vocabulary sizes only)."""
    if any((directory / name).is_file() for name in TOKENIZER_FILES):
        return quiet_tokenizer(str(directory))
    location = tokenizer_source(source.entry, source.registry)
    return load_tokenizer(location) if location else None


def check_causal_lm(source: str) -> None:
    """A directory transformers can read as a causal LM (a LoadError line, not its traceback)."""
    try:
        AutoConfig.from_pretrained(source, trust_remote_code=False)
    except Exception as e:
        raise LoadError(f"{source}: not a drafter checkpoint this version can read ({str(e).splitlines()[0]})") from e
