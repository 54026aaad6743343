"""Diffusion drafter checkpoint formats, told apart by the directory's config.json
(docs/diffusion-checkpoints.md):

    specdiff  the project's own (nets/checkpoint.py): {"specdiff_format": ...} + model.safetensors
    sedd      SEDD hub (louaaron/sedd-small, -medium): the nested Hydra run config
              {tokens, model{hidden_size, cond_dim, n_blocks, n_heads, length, scale_by_sigma},
              graph{type: absorb}, noise{type: loglinear}, ...} + pytorch_model.bin, a pickled
              state dict read only with torch.load(weights_only=True); keys unprefixed
    mdlm      MDLM HF (kuleshov-group/mdlm-owt, mdlm-no_flashattn-fp32-owt): {model_type: mdlm,
              vocab_size, hidden_dim, cond_dim, n_blocks, n_heads, model_length,
              time_conditioning} + model.safetensors with keys under `backbone.`; the repository's
              Python files are never run

Both hub formats are the DDiT backbone over V = vocabulary + 1 rows with the mask as the last id
(GPT-2: V = 50258, mask 50257); the drafter's real vocabulary is V - 1. SEDD always conditions on
sigma; MDLM does when its config says so (mdlm-owt does not). Loading is strict: every tensor
present with its shape, nothing unexpected (`rotary_emb.inv_freq` may be absent), else one
LoadError listing every mismatch.

Hub drafters were trained on `length` = 1024 tokens. They draft from the last
N = length - DRAFT_ROOM = 960 context tokens, so that N + gamma stays within the trained length
for any gamma <= 64 (`specdiff drafter convert --context` sets another N). A model trained on a
short length keeps half of it for the draft; the drafter also knows its length, and a longer
draft gets fewer context tokens (drafters/diffusion.py context_window).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from torch import nn

from ..errors import LoadError
from .checkpoint import OPTIONAL_KEYS, is_own_format, load_own, load_state_strict, read_json, read_pickled, \
    read_safetensors
from .dit import DDiT, DiTConfig
from .parameterization import get_parameterization

DRAFT_ROOM = 64  # slots kept free for the draft when a hub model's whole length is context
MDLM_PREFIX = "backbone"

SEDD_FIELDS = {"tokens": int, "graph.type": str, "noise.type": str, "model.hidden_size": int,
               "model.cond_dim": int, "model.n_blocks": int, "model.n_heads": int, "model.length": int,
               "model.scale_by_sigma": bool}
MDLM_FIELDS = {"vocab_size": int, "hidden_dim": int, "cond_dim": int, "n_blocks": int, "n_heads": int,
               "model_length": int, "time_conditioning": bool}


@dataclass(frozen=True)
class Format:
    """A checkpoint layout: how to recognise its config and read the directory."""

    name: str
    weights: str  # the weights file inside the directory
    detect: Callable[[dict[str, Any]], bool]
    read: Callable[[Path, dict[str, Any]], tuple[DDiT, dict[str, Any]]]  # directory, config -> backbone, drafter fields


def _fields(config: dict[str, Any], spec: dict[str, type], where: Path) -> dict[str, Any]:
    """Dotted keys of `spec` looked up in `config`; one LoadError naming every missing or mistyped one."""
    found, problems = {}, []
    for dotted, kind in spec.items():
        value: Any = config
        for key in dotted.split("."):
            value = value.get(key) if isinstance(value, dict) else None
        if value is None:
            problems.append(f"missing {dotted}")
        elif not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            problems.append(f"{dotted} should be {kind.__name__}, got {value!r}")
        found[dotted] = value
    if problems:
        raise LoadError(f"{where}: malformed config: {'; '.join(problems)}")
    return found


def _backbone(where: Path, **shape: Any) -> DDiT:
    try:
        return DDiT(DiTConfig(**shape))
    except ValueError as e:
        raise LoadError(f"{where}: {e}") from e


def _hub_fields(vocab_rows: int, length: int, parameterization: str, where: Path) -> dict[str, Any]:
    if length < 2:
        raise LoadError(f"{where}: model length {length} leaves no room for a context token and a draft slot")
    return {"vocab_size": vocab_rows - 1, "mask_id": vocab_rows - 1, "length": length,
            "context_length": length - min(DRAFT_ROOM, length // 2), "parameterization": parameterization}


def _is_sedd(config: dict[str, Any]) -> bool:
    return isinstance(config.get("model"), dict) and isinstance(config.get("graph"), dict)


def _read_sedd(directory: Path, config: dict[str, Any]) -> tuple[DDiT, dict[str, Any]]:
    where = directory / "config.json"
    f = _fields(config, SEDD_FIELDS, where)
    for key, wanted in (("graph.type", "absorb"), ("noise.type", "loglinear"), ("model.scale_by_sigma", True)):
        if f[key] != wanted:
            raise LoadError(f"{where}: {key} is {f[key]!r}; only SEDD models with {key} {wanted!r} can "
                            "draft (absorbing masked diffusion, log-linear noise, log-score output)")
    rows = f["tokens"] + 1  # the absorbing graph adds the mask as the last id
    backbone = _backbone(where, vocab_size=rows, hidden_size=f["model.hidden_size"], n_heads=f["model.n_heads"],
                         n_blocks=f["model.n_blocks"], cond_dim=f["model.cond_dim"], time_conditioning=True)
    weights = directory / "pytorch_model.bin"
    load_state_strict(backbone, read_pickled(weights), str(weights))
    return backbone, _hub_fields(rows, f["model.length"], "sedd", where)


def _is_mdlm(config: dict[str, Any]) -> bool:
    return config.get("model_type") == "mdlm"


def _read_mdlm(directory: Path, config: dict[str, Any]) -> tuple[DDiT, dict[str, Any]]:
    where = directory / "config.json"
    f = _fields(config, MDLM_FIELDS, where)
    backbone = _backbone(where, vocab_size=f["vocab_size"], hidden_size=f["hidden_dim"], n_heads=f["n_heads"],
                         n_blocks=f["n_blocks"], cond_dim=f["cond_dim"], time_conditioning=f["time_conditioning"])
    weights = directory / "model.safetensors"
    holder = nn.ModuleDict({MDLM_PREFIX: backbone})  # its keys carry the checkpoint's prefix
    load_state_strict(holder, read_safetensors(weights), str(weights),
                      optional=tuple(f"{MDLM_PREFIX}.{k}" for k in OPTIONAL_KEYS))
    return backbone, _hub_fields(f["vocab_size"], f["model_length"], "subs", where)


FORMATS = {f.name: f for f in (
    Format("specdiff", "model.safetensors", is_own_format, load_own),
    Format("sedd", "pytorch_model.bin", _is_sedd, _read_sedd),
    Format("mdlm", "model.safetensors", _is_mdlm, _read_mdlm),
)}


def detect(config: dict[str, Any]) -> Format | None:
    """The diffusion format a config.json belongs to, or None (e.g. a Hugging Face causal LM)."""
    return next((f for f in FORMATS.values() if f.detect(config)), None)


def get_format(name: str) -> Format:
    try:
        return FORMATS[name]
    except KeyError as e:
        raise LoadError(f"unknown drafter format '{name}' (known: {', '.join(FORMATS)})") from e


def load_checkpoint(directory: Path, fmt: Format | None = None) -> tuple[DDiT, dict[str, Any]]:
    """A drafter directory -> (backbone with weights, DiffusionDrafter fields: vocab_size,
    mask_id, context_length, parameterization, and the trained length for hub formats). The
    format is detected unless given."""
    config = read_json(directory / "config.json")
    fmt = fmt or detect(config)
    if fmt is None:
        raise LoadError(f"{directory}: not a diffusion drafter (formats: {', '.join(FORMATS)})")
    if not fmt.detect(config):
        raise LoadError(f"{directory / 'config.json'}: not a {fmt.name} config")
    backbone, fields = fmt.read(directory, config)
    _check_fields(backbone, fields, directory)
    return backbone, fields


def _check_fields(backbone: DDiT, fields: dict[str, Any], directory: Path) -> None:
    """The real vocabulary and the mask id (past it, or a tokenizer's own mask token inside it)
    fit the model's rows; the parameterisation is known."""
    V, mask, n, rows = fields["vocab_size"], fields["mask_id"], fields["context_length"], backbone.config.vocab_size
    if not all(isinstance(x, int) for x in (V, mask, n)) or not (0 < V <= rows and 0 <= mask < rows and n >= 1):
        raise LoadError(f"{directory}: need integers 0 < vocab_size ({V!r}) <= rows of the model ({rows}), "
                        f"0 <= mask_id ({mask!r}) < rows and context_length ({n!r}) >= 1")
    try:
        get_parameterization(fields["parameterization"])
    except LoadError as e:
        raise LoadError(f"{directory}: {e}") from e
