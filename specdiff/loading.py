"""Name or path -> loaded target / drafter.

A model is named by a models.yaml entry, a local directory, or a hub id ("owner/name"); only the
last touches the network, and only because the user named it. Drafter formats are detected from
the files: the project's own DDiT format, or any Hugging Face causal LM (an AR drafter for
`spec-ar`).
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from .drafters.autoregressive import ARDrafter
from .drafters.diffusion import DiffusionDrafter
from .errors import IncompatibleModelsError, LoadError, RegistryError, UsageError
from .nets.checkpoint import is_own_format, load_own, read_json
from .registry import ModelEntry, Registry, load_registry
from .target import Target

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def resolve_dtype(dtype: str, device: str) -> torch.dtype:
    if dtype == "auto":
        return torch.float16 if torch.device(device).type == "cuda" else torch.float32
    try:
        return DTYPES[dtype]
    except KeyError:
        raise UsageError(f"unknown dtype '{dtype}' (choose from auto, {', '.join(DTYPES)})") from None


def resolve(name: str, kinds: tuple[str, ...], registry: Registry) -> tuple[str, ModelEntry | None]:
    """-> (local directory or hub id, registry entry if any)."""
    entry = registry.entries.get(name)
    if entry is not None:
        if entry.kind not in kinds:
            raise RegistryError(f"'{name}' is a {entry.kind} in models.yaml, not a {' or '.join(kinds)}")
        return entry.source, entry
    path = Path(name).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise LoadError(f"{path}: no model here (config.json not found)")
        return str(path), None
    if HUB_ID.match(name) and not name.startswith("."):
        return name, None
    known = ", ".join(registry.names(kinds[0]))
    raise RegistryError(f"unknown model '{name}': not in models.yaml ({known}) and not a directory")


def _hub_call(what: str, source: str, fn, *args, **kwargs):
    """Run a from_pretrained call, turning its many failure types into one LoadError line."""
    try:
        return fn(source, *args, **kwargs)
    except Exception as e:  # transformers raises OSError, ValueError, SafetensorError, ...
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        hint = "" if Path(source).exists() else " (not a local directory; the hub needs network access)"
        raise LoadError(f"cannot load {what} from '{source}'{hint}: {first}") from None


def load_tokenizer(source: str):
    return _hub_call("tokenizer", source, AutoTokenizer.from_pretrained)


def _load_causal_lm(name: str, kinds, device: str, dtype: str, registry: Registry | None):
    registry = registry or load_registry()
    source, entry = resolve(name, kinds, registry)
    tok_name = entry.tokenizer if entry and entry.tokenizer else None
    tok_source = resolve(tok_name, ("target", "drafter"), registry)[0] if tok_name else source
    tokenizer = load_tokenizer(tok_source)
    model = _hub_call("model", source, AutoModelForCausalLM.from_pretrained,
                      dtype=resolve_dtype(dtype, device))
    return model.to(device), tokenizer, (entry.name if entry else source)


def load_target(name_or_path: str, *, device: str = "cpu", dtype: str = "auto",
                registry: Registry | None = None) -> Target:
    """A Hugging Face causal LM (models.yaml name, local directory or hub id) as a Target."""
    model, tokenizer, name = _load_causal_lm(name_or_path, ("target",), device, dtype, registry)
    return Target(model, tokenizer, name)


def load_drafter(name_or_path: str, *, device: str = "cpu", dtype: str = "auto",
                 registry: Registry | None = None) -> nn.Module:
    """A drafter: a DiffusionDrafter (forward(input_ids (B, L), sigma (B,)) -> raw logits
    (B, L, V_drafter)) for diffusion checkpoints, or an ARDrafter for a causal LM."""
    registry = registry or load_registry()
    source, entry = resolve(name_or_path, ("drafter", "target"), registry)
    config_file = Path(source) / "config.json"
    if not config_file.is_file() or not is_own_format(read_json(config_file)):
        if config_file.is_file():
            _check_causal_lm(source)
        model, tokenizer, name = _load_causal_lm(name_or_path, ("drafter", "target"), device, dtype, registry)
        return ARDrafter(model, tokenizer, name)
    backbone, fields = load_own(Path(source), read_json(config_file))
    tokenizer = load_tokenizer(source)
    drafter = DiffusionDrafter(backbone, tokenizer=tokenizer, source=entry.name if entry else source, **fields)
    return drafter.to(device=device, dtype=resolve_dtype(dtype, device)).eval()


def _check_causal_lm(source: str) -> None:
    try:
        AutoConfig.from_pretrained(source)
    except Exception as e:
        raise LoadError(f"{source}: not a drafter checkpoint this version can read ({str(e).splitlines()[0]})") from None


def check_pair(target: Target, drafter: nn.Module) -> None:
    """Refuse a drafter whose tokenizer maps tokens to ids differently from the target's."""
    if drafter.vocab_size != target.vocab_size:
        raise IncompatibleModelsError(
            f"drafter vocabulary has {drafter.vocab_size} tokens, target's tokenizer {target.vocab_size}")
    if drafter.tokenizer is None:
        return
    ours, theirs = target.tokenizer.get_vocab(), drafter.tokenizer.get_vocab()
    if ours != theirs:
        diff = sorted(set(ours.items()) ^ set(theirs.items()), key=lambda kv: kv[1])[:3]
        shown = ", ".join(f"{tok!r}->{i}" for tok, i in diff)
        raise IncompatibleModelsError(
            f"drafter and target tokenizers disagree ({len(set(ours.items()) ^ set(theirs.items()))} "
            f"token-to-id differences, e.g. {shown})")
