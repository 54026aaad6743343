"""Name or path -> loaded target / drafter.

A model is named by a models.yaml entry, a local directory, a GGUF file (converted once into the
user cache, specdiff.gguf), or a hub id ("owner/name"); only the last touches the network, and only because the user named it. Drafter formats are detected from
the files (a models.yaml `format:` names one instead): a diffusion checkpoint in the project's own,
the SEDD hub or the MDLM HF format (nets/formats.py), a DFlash draft as published (nets/dflash.py),
a masked-diffusion Qwen3 of dllm (model_type a2d-qwen3, nets/a2d.py), else any Hugging Face causal LM (an AR drafter for `spec-ar`). Of a hub drafter only config.json,
the weights file of its format and any tokenizer files are downloaded.
"""

from __future__ import annotations

import os
import re
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, Qwen3Config, Qwen3ForCausalLM
from transformers.utils import logging as hf_logging

from .contracts import Target
from .drafters.a2d import A2DDrafter
from .drafters.autoregressive import ARDrafter
from .drafters.dflash import DFlashDrafter, is_dflash_drafter
from .drafters.diffusion import DiffusionDrafter
from .gguf import GGUFSource, gguf_directory
from .hub import fetch, hub_call
from .errors import IncompatibleModelsError, LoadError, RegistryError, UsageError
from .nets.a2d import is_a2d, mask_token_id, read_a2d_config
from .nets.checkpoint import read_json
from .nets.dflash import MASK_OVERRIDE, WEIGHTS as DFLASH_WEIGHTS, is_dflash, load_dflash
from .nets.formats import FORMATS, Format, detect, get_format, load_checkpoint
from .nets.sdar import INDEX, is_sdar, read_sdar_config
from .registry import ModelEntry, Registry, as_registry
from .requests import check_device_name, check_names
from .targets.block import BlockDiffusionTarget
from .targets.causal import CausalLMTarget
from .vocab import VOCAB_FILE, load_draft_vocab

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "special_tokens_map.json")
BLOCK_FILES = ("config.json", "*.safetensors", INDEX, "chat_template.jinja", *TOKENIZER_FILES)


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


def resolve(name: str | os.PathLike, kinds: tuple[str, ...], registry: Registry) -> tuple[str, ModelEntry | None]:
    """-> (local directory or hub id, registry entry if any)."""
    if not isinstance(name, (str, os.PathLike)):
        raise UsageError(f"`{kinds[0]}` must be a models.yaml name, a directory or a hub id (a string or a path), "
                         f"got {type(name).__name__}")
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


def load_tokenizer(source: str) -> Any:
    """The transformers tokenizer at a directory or hub id (a LoadError line if none loads)."""
    return hub_call("tokenizer", source, AutoTokenizer.from_pretrained, trust_remote_code=False)


def _load_causal_lm(name: str | os.PathLike, kinds: tuple[str, ...], device: str, dtype: str,
                    registry: Registry | None) -> tuple[Any, Any, str]:
    """-> (the transformers model on `device`, its tokenizer, its name)."""
    registry = as_registry(registry)
    source, entry = resolve(name, kinds, registry)
    tokenizer = load_tokenizer(_tokenizer_source(entry, registry) or source)
    with _no_loading_bars():
        model, info = hub_call("model", source, AutoModelForCausalLM.from_pretrained,
                                dtype=resolve_dtype(dtype, device), trust_remote_code=False,
                                output_loading_info=True, ignore_mismatched_sizes=True)
    _check_loading_info(source, info)
    return model.to(device), tokenizer, (entry.name if entry else source)


@contextmanager
def _no_loading_bars() -> Iterator[None]:
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


def _check_loading_info(source: str, info: dict) -> None:
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


def _mismatch(entry: tuple) -> str:
    """transformers reports a mis-shaped tensor as (key, checkpoint shape, model shape)."""
    key, found, expected = entry
    return f"shape of {key}: expected {tuple(expected)}, found {tuple(found)}"


def load_target(name_or_path: str | os.PathLike, *, device: str = "cpu", dtype: str = "auto",
                registry: Registry | None = None) -> CausalLMTarget | BlockDiffusionTarget:
    """A Hugging Face causal LM (models.yaml name, local directory or hub id) as a Target; an SDAR
    checkpoint (config.json model_type "sdar") as a BlockDiffusionTarget."""
    check_device(device)
    resolve_dtype(dtype, device)  # an unknown dtype is refused before anything loads
    registry = as_registry(registry)
    source, entry = resolve(name_or_path, ("target",), registry)
    if _is_block(source):
        return _load_block(source, entry, device, dtype, registry)
    config = _config(source)
    for kind, found in (("a DFlash draft (config.json architectures DFlashDraftModel)", is_dflash(config)),
                        ("a masked-diffusion drafter (config.json model_type a2d-qwen3)", is_a2d(config))):
        if found:
            raise LoadError(f"{source}: {kind}, not a target: load it with load_drafter, beside the causal LM "
                            "it drafts for")
    model, tokenizer, name = _load_causal_lm(name_or_path, ("target",), device, dtype, registry)
    return CausalLMTarget(model, tokenizer, name)


def is_block_checkpoint(name_or_path: str | os.PathLike, kinds: tuple[str, ...], registry: Registry | None = None) -> bool:
    """Whether a model (as load_target / load_drafter name it) is a block-diffusion (SDAR) checkpoint,
    from its config.json alone: for refusals made before the weights load."""
    source, _ = resolve(name_or_path, kinds, as_registry(registry))
    return _is_block(source)


def _is_block(source: str) -> bool:
    """Whether config.json (fetched alone for a hub id) is an SDAR block-diffusion model's."""
    return is_sdar(_config(source))


def _config(source: str) -> dict:
    """config.json of a directory or hub id (fetched alone)."""
    return read_json(fetch(source, ("config.json",)) / "config.json")


def _load_block(source: str, entry: ModelEntry | None, device: str, dtype: str,
                registry: Registry) -> BlockDiffusionTarget:
    """An SDAR checkpoint in transformers' own Qwen3 class (nets/sdar.py), strictly loaded."""
    directory = fetch(source, BLOCK_FILES)
    config, block_size, mask_id = read_sdar_config(directory)
    model = _qwen3_model(source, directory, config, device, dtype)
    tokenizer = _quiet_tokenizer(_tokenizer_source(entry, registry) or str(directory))
    return BlockDiffusionTarget(model, tokenizer, entry.name if entry else source,
                                block_size=block_size, mask_id=mask_id)


def _qwen3_model(source: str, directory: Path, config: Qwen3Config, device: str, dtype: str) -> Any:
    """transformers' own Qwen3ForCausalLM over a checkpoint whose model_type it does not know
    (SDAR, A2D: `config` read and checked by nets/), strictly loaded, on `device`."""
    with _no_loading_bars():
        model, info = hub_call("model", str(directory), Qwen3ForCausalLM.from_pretrained, config=config,
                                dtype=resolve_dtype(dtype, device), trust_remote_code=False,
                                output_loading_info=True)
    _check_loading_info(source, info)
    return model.to(device)


def _quiet_tokenizer(source: str) -> Any:
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


def _tokenizer_source(entry: ModelEntry | None, registry: Registry) -> str | None:
    """Where a models.yaml entry's `tokenizer:` points, if it has one."""
    return resolve(entry.tokenizer, ("target", "drafter"), registry)[0] if entry and entry.tokenizer else None


def load_drafter(name_or_path: str | os.PathLike, *, device: str = "cpu", dtype: str = "auto",
                 registry: Registry | None = None) -> nn.Module | BlockDiffusionTarget:
    """A drafter: a DiffusionDrafter (forward(input_ids (B, L), sigma (B,)) -> raw logits
    (B, L, V_drafter)) for diffusion checkpoints, an ARDrafter for a causal LM, a
    BlockDiffusionTarget for an SDAR checkpoint (the draft model of simsd-exact), a DFlashDrafter
    for a DFlash draft (config.json architectures DFlashDraftModel), or an A2DDrafter (the
    DiffusionDrafter interface) for dllm's masked-diffusion Qwen3 (model_type a2d-qwen3)."""
    check_device(device)
    resolve_dtype(dtype, device)
    registry = as_registry(registry)
    source, entry = resolve(name_or_path, ("drafter", "target"), registry)
    if not (entry and entry.format) and _is_block(source):
        return _load_block(source, entry, device, dtype, registry)
    if not (entry and entry.format) and is_dflash(_config(source)):
        return _load_dflash(source, entry, device, dtype, registry)
    if not (entry and entry.format) and is_a2d(_config(source)):
        return _load_a2d(source, entry, device, dtype, registry)
    fmt = _drafter_format(source, entry)
    if fmt is None:
        if Path(source).is_dir():
            _check_causal_lm(source)
        model, tokenizer, name = _load_causal_lm(name_or_path, ("drafter", "target"), device, dtype, registry)
        return ARDrafter(model, tokenizer, name, load_draft_vocab(Path(source)) if Path(source).is_dir() else None)
    drafter = _load_diffusion(source, entry, fmt, registry)
    return drafter.to(device=device, dtype=resolve_dtype(dtype, device)).eval()


def load_diffusion_drafter(name_or_path: str, *, registry: Registry | None = None) -> DiffusionDrafter:
    """A diffusion drafter in any format, on the CPU in fp32, exactly as stored (for conversion);
    a UsageError for anything else, before any weights are read."""
    registry = as_registry(registry)
    source, entry = resolve(name_or_path, ("drafter", "target"), registry)
    fmt = _drafter_format(source, entry)
    if fmt is None and is_a2d(_config(source)):
        raise UsageError(f"'{name_or_path}' is a masked-diffusion Qwen3 of dllm (model_type a2d-qwen3): it drafts "
                         "as published; `drafter convert` rewrites DDiT drafters only")
    if fmt is None:
        raise UsageError(f"'{name_or_path}' is not a diffusion drafter (formats: {', '.join(FORMATS)})")
    return _load_diffusion(source, entry, fmt, registry).eval()


def _drafter_format(source: str, entry: ModelEntry | None) -> Format | None:
    """The models.yaml `format:`, else the one detected from config.json (None: not diffusion)."""
    if entry and entry.format:
        return get_format(entry.format)
    return detect(_config(source))


def _load_dflash(source: str, entry: ModelEntry | None, device: str, dtype: str, registry: Registry) -> DFlashDrafter:
    """A DFlash draft exactly as published (nets/dflash.py), strictly loaded; its embedding and
    head are its target's (pair_models binds them)."""
    directory = fetch(source, ("config.json", DFLASH_WEIGHTS, MASK_OVERRIDE, VOCAB_FILE, *TOKENIZER_FILES))
    net, spec = load_dflash(directory)
    drafter = DFlashDrafter(net, spec, tokenizer=_drafter_tokenizer(directory, entry, registry),
                            source=entry.name if entry else source, draft_vocab=load_draft_vocab(directory))
    return drafter.to(device=device, dtype=resolve_dtype(dtype, device)).eval()


def _load_a2d(source: str, entry: ModelEntry | None, device: str, dtype: str, registry: Registry) -> A2DDrafter:
    """dllm's masked-diffusion Qwen3 in transformers' own Qwen3 class (nets/a2d.py), strictly
    loaded; the mask id is its tokenizer's, and the real vocabulary the tokenizer's tokens less that
    mask when it was added last (as dllm adds `<|mask|>`)."""
    directory = fetch(source, BLOCK_FILES)
    tokenizer = _drafter_tokenizer(directory, entry, registry)
    mask = mask_token_id(tokenizer, directory)
    model = _qwen3_model(source, directory, read_a2d_config(directory, mask), device, dtype)
    vocab = len(tokenizer) - (mask == len(tokenizer) - 1)
    return A2DDrafter(model.eval(), mask_id=mask, vocab_size=vocab, tokenizer=tokenizer,
                      source=entry.name if entry else source)


def _load_diffusion(source: str, entry: ModelEntry | None, fmt: Format, registry: Registry) -> DiffusionDrafter:
    directory = fetch(source, ("config.json", fmt.weights, VOCAB_FILE, *TOKENIZER_FILES))
    backbone, fields = load_checkpoint(directory, fmt)
    tokenizer = _drafter_tokenizer(directory, entry, registry)
    return DiffusionDrafter(backbone, tokenizer=tokenizer, source=entry.name if entry else source,
                            draft_vocab=load_draft_vocab(directory), **fields)


def _drafter_tokenizer(directory: Path, entry: ModelEntry | None, registry: Registry) -> Any:
    """The tokenizer beside the weights, else the entry's `tokenizer:`, else None (the SEDD and
    MDLM repositories carry none; check_pair then compares vocabulary sizes only)."""
    if any((directory / name).is_file() for name in TOKENIZER_FILES):
        return _quiet_tokenizer(str(directory))
    source = _tokenizer_source(entry, registry)
    return load_tokenizer(source) if source else None


def _check_causal_lm(source: str) -> None:
    try:
        AutoConfig.from_pretrained(source, trust_remote_code=False)
    except Exception as e:
        raise LoadError(f"{source}: not a drafter checkpoint this version can read ({str(e).splitlines()[0]})") from e


def pair_models(target: Target | BlockDiffusionTarget, drafter: Any) -> None:
    """check_pair, then a drafter that reads its token embedding and output head from its target
    (a diffusion drafter with `target_embeddings`, a DFlash drafter) gets them from this one (a
    torch model)."""
    check_pair(target, drafter)
    dflash = isinstance(drafter, DFlashDrafter)  # not an exported one: its graph holds the target's tables
    if not (dflash or isinstance(drafter, DiffusionDrafter) and drafter.target_embeddings):
        return
    model = getattr(target, "model", None)
    if model is None:
        raise UsageError(f"drafter '{drafter.source}' reads its token embedding and output head from its "
                         "target: run the target on the torch runtime")
    if dflash:
        drafter.bind_target(model)
        return
    drafter.share_target_embeddings(model.get_input_embeddings().weight, model.get_output_embeddings().weight)


def check_pair(target: Target | BlockDiffusionTarget, drafter: Any) -> None:
    """Refuse a drafter whose tokenizer maps tokens to ids differently from the target's. A DFlash
    drafter scores with its target's head: the target's vocabulary must fit the rows it was made for.
    A draft vocabulary must have been built for this target's (specdiff.vocab)."""
    vocab = getattr(drafter, "draft_vocab", None)
    if vocab is not None:
        vocab.check(target.tokenizer, target.vocab_size, f"drafter '{drafter.source}'")
    if is_dflash_drafter(drafter):
        if vocab is None and target.vocab_size > drafter.vocab_rows:  # with one: the map was checked
            raise IncompatibleModelsError(f"DFlash drafter '{drafter.source}' was made for a target head of "
                                          f"{drafter.vocab_rows} rows; the target's tokenizer has {target.vocab_size} tokens")
    elif drafter.vocab_size != target.vocab_size:
        raise IncompatibleModelsError(
            f"drafter vocabulary has {drafter.vocab_size} tokens, target's tokenizer {target.vocab_size}")
    if drafter.tokenizer is None:
        return
    ours, theirs = target.tokenizer.get_vocab(), drafter.tokenizer.get_vocab()
    if isinstance(drafter, A2DDrafter) and drafter.mask_id >= drafter.vocab_size:  # dllm's added <|mask|>
        theirs = {token: i for token, i in theirs.items() if i != drafter.mask_id}
    if ours != theirs:
        differ = sorted((t for t in ours.keys() | theirs.keys() if ours.get(t) != theirs.get(t)),
                        key=lambda t: ours.get(t, len(ours)))
        shown = ", ".join(f"{t!r} {ours.get(t, '-')}/{theirs.get(t, '-')}" for t in differ[:3])
        raise IncompatibleModelsError(
            f"drafter and target tokenizers disagree on {len(differ)} token(s) (id in target/drafter: {shown})")
