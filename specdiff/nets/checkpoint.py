"""The project's own drafter format, and what every format shares: config reading (read_json,
sub_config: a kind's own object in config.json), weights reading (read_safetensors, read_pickled:
tensors only, no code run) and strict state-dict loading.

A drafter directory holds:
    config.json        {"specdiff_format": "ddit-drafter", "format_version": 1,
                        "backbone": DiTConfig fields, "vocab_size": V (real, shared with the target),
                        "mask_id": id, "context_length": N, "parameterization": "subs" | "sedd",
                        "defaults": {"gamma": 8, "steps": 1, "schedule": "l2r"}}
                       defaults (optional): the draft settings it was trained for, which generate
                       and bench use when neither an option nor a models.yaml pair sets them
                       (written by `specdiff distill`; absent from older and untrained drafters)
                       "target_embeddings": true (optional): rows 0..V-1 of the token embedding
                       and of the output head are the target's input embedding and output head
                       (the drafter was trained with them frozen, `distill --from-target`); they
                       are not stored, and the drafter reads them from its target when paired
    model.safetensors  the DDiT state dict under the SEDD parameter names; with target_embeddings
                       the two shared matrices keep only their rows V.. (the mask row), under
                       NAME + "_rest"
    tokenizer files    the tokenizer shared with the target (tokenizer.json, ...)
"""

from __future__ import annotations

import json
import os
import re
import warnings
from pathlib import Path
from typing import Any, Sequence

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from ..atomic import umask
from ..errors import LoadError
from ..reading import read_small_text
from ..requests import check_recorded
from .dit import DDiT, DiTConfig

FORMAT = "ddit-drafter"
FORMAT_VERSION = 1
OPTIONAL_KEYS = ("rotary_emb.inv_freq",)  # a buffer the module rebuilds identically
SHARED = ("vocab_embed.embedding", "output_layer.linear.weight")  # (V + extra, h): rows 0..V-1 the target's


def load_state_strict(module: torch.nn.Module, state: dict[str, torch.Tensor], source: str,
                      optional: tuple[str, ...] = OPTIONAL_KEYS) -> None:
    """Load `state` into `module`, or raise one LoadError listing every missing, unexpected or
    mis-shaped tensor."""
    expected = module.state_dict()
    problems = [f"missing {k} {tuple(v.shape)}" for k, v in expected.items()
                if k not in state and k not in optional]
    problems += [f"unexpected {k}" for k in state if k not in expected]
    problems += [f"shape of {k}: expected {tuple(expected[k].shape)}, found {tuple(v.shape)}"
                 for k, v in state.items() if k in expected and tuple(v.shape) != tuple(expected[k].shape)]
    if problems:
        raise LoadError(f"{source}: checkpoint does not match the model: {'; '.join(problems)}")
    module.load_state_dict(state, strict=False)


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(read_small_text(path))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise LoadError(f"{path}: unreadable config: {e}") from e
    if not isinstance(data, dict):
        raise LoadError(f"{path}: config is not a JSON object")
    return data


def sub_config(config: dict[str, Any], key: str, known: Sequence[str], where: Path) -> dict[str, Any]:
    """config[key] (a kind's own object inside config.json: dflash_config, eagle_config; absent: {}),
    refused in one LoadError naming `where` when it is not an object or holds a field not `known`."""
    sub = config.get(key) or {}
    if not isinstance(sub, dict):
        raise LoadError(f"{where}: {key} must be an object, got {sub!r}")
    unknown = sorted(set(sub) - set(known))
    if unknown:
        raise LoadError(f"{where}: {key}.{unknown[0]} is not supported (this version reads only {', '.join(known)})")
    return sub


def read_safetensors(path: Path) -> dict[str, Any]:
    try:
        return load_file(str(path))
    except Exception as e:  # safetensors raises its own error types for corrupt files
        raise LoadError(f"{path}: cannot read weights ({str(e).strip().splitlines()[0]})") from e


def read_pickled(path: Path) -> dict[str, torch.Tensor]:
    """A pickled state dict of tensors (SEDD's, EAGLE's own releases), read with
    torch.load(weights_only=True): no code runs. One LoadError if unreadable or not tensors only,
    in one line: torch's warning on the pickle protocol is not shown, nor its terminal escapes."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "Detected pickle protocol 4 in the checkpoint ..."
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # UnpicklingError, RuntimeError, EOFError, OSError, ...
        first = re.sub(r"\x1b\[[0-9;]*m", "", str(e).strip().splitlines()[0])
        raise LoadError(f"{path}: cannot read weights ({first})") from e
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise LoadError(f"{path}: not a state dict of tensors")
    return state


def is_own_format(config: dict[str, Any]) -> bool:
    return config.get("specdiff_format") == FORMAT


def save_tensors(state: dict[str, torch.Tensor], path: Path, metadata: dict[str, str] | None = None) -> None:
    """save_file (with `metadata`, strings, beside its "format"), whose I/O errors (disk full, file
    too large) are OSErrors, as Python's own writes', and whose file gets an ordinary file's mode
    (0o666 less the umask): safetensors writes 0o600, which left weights beside 0o644 configs
    unreadable to other users."""
    try:
        save_file(state, str(path), metadata={**(metadata or {}), "format": "pt"})
    except SafetensorError as e:
        code = re.search(r"\(os error (\d+)\)", str(e))
        if code is None:
            raise
        raise OSError(int(code[1]), os.strerror(int(code[1])), str(path)) from e
    os.chmod(path, 0o666 & ~umask())


def save_own(directory: Path, backbone: DDiT, *, vocab_size: int, mask_id: int, context_length: int,
             parameterization: str, tokenizer: Any = None, dtype: torch.dtype | None = None,
             defaults: dict[str, Any] | None = None, untrained: bool = False, target_embeddings: bool = False) -> None:
    """Write a drafter in the project's format (tokenizer files and recorded `defaults` too, when
    given; `untrained`: random weights, recorded so that a run can say so; `target_embeddings`:
    the rows it shares with its target are left out)."""
    directory.mkdir(parents=True, exist_ok=True)
    config = {"specdiff_format": FORMAT, "format_version": FORMAT_VERSION,
              "backbone": backbone.config.to_dict(), "vocab_size": vocab_size, "mask_id": mask_id,
              "context_length": context_length, "parameterization": parameterization,
              **({"defaults": check_recorded(defaults)} if defaults else {}),
              **({"untrained": True} if untrained else {}),
              **({"target_embeddings": True} if target_embeddings else {})}
    state = {k: v.detach().to(dtype or v.dtype).contiguous() for k, v in backbone.state_dict().items()}
    if target_embeddings:
        state.update({f"{k}_rest": state.pop(k)[vocab_size:].contiguous() for k in SHARED})
    save_tensors(state, directory / "model.safetensors")
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    if tokenizer is not None:
        tokenizer.save_pretrained(str(directory))


def load_own(directory: Path, config: dict[str, Any]) -> tuple[DDiT, dict[str, Any]]:
    """-> (backbone with weights, drafting fields of the config, its recorded `defaults` included:
    {} when it has none, `untrained`: False unless `drafter init` wrote it, and `target_embeddings`:
    whether rows 0..V-1 of its embedding and head, zero here, are to be read from its target)."""
    try:
        dit = DiTConfig(**config["backbone"])
        fields = {k: config[k] for k in ("vocab_size", "mask_id", "context_length", "parameterization")}
        fields["defaults"] = check_recorded(config.get("defaults", {}))
        for flag in ("untrained", "target_embeddings"):
            fields[flag] = config.get(flag, False)
            if not isinstance(fields[flag], bool):
                raise ValueError(f"{flag} must be true or false, got {fields[flag]!r}")
    except (KeyError, TypeError, ValueError) as e:
        raise LoadError(f"{directory / 'config.json'}: malformed drafter config ({e})") from e
    weights = directory / "model.safetensors"
    backbone = DDiT(dit)
    state = read_safetensors(weights)
    if fields["target_embeddings"]:
        state = _with_shared_rows(backbone, state, fields["vocab_size"])
    load_state_strict(backbone, state, str(weights))
    return backbone, fields


def _with_shared_rows(backbone: DDiT, state: dict[str, Any], vocab_size: int) -> dict[str, Any]:
    """The stored rows V.. of each shared matrix under its own name, rows 0..V-1 zero (the
    target's, filled in when the drafter is paired); a missing or misshapen `_rest` is left for
    load_state_strict to report."""
    state = dict(state)
    own = backbone.state_dict()
    for k in SHARED:
        rest = state.get(f"{k}_rest")
        if rest is not None and rest.shape == own[k][vocab_size:].shape:
            full = torch.zeros(own[k].shape, dtype=rest.dtype)
            full[vocab_size:] = state.pop(f"{k}_rest")
            state[k] = full
    return state
