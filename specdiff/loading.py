"""Name or path -> loaded target / drafter.

A model is named by a models.yaml entry, a local directory, a GGUF file (converted once into the
user cache, specdiff.gguf), or a hub id ("owner/name"); only the last touches the network, and only
because the user named it (sources.py resolves names and reads files strictly). A drafter's kind is
detected from its config.json by the declarations of specdiff.kinds, in KINDS order (a models.yaml
`format:` names a diffusion format instead): an SDAR block-diffusion model, a DFlash draft as
published, a masked-diffusion Qwen3 of dllm, a diffusion checkpoint in the project's own, the SEDD
hub or the MDLM HF format, else any Hugging Face causal LM (an AR drafter for `spec-ar`). Of a hub
drafter only config.json, the weights file of its kind and any tokenizer files are downloaded.
"""

from __future__ import annotations

from typing import cast

import os

from .contracts import Drafter, Target
from .drafters.diffusion import DiffusionDrafter
from .errors import IncompatibleModelsError, LoadError, UsageError
from .kinds import KINDS, detected, kind_of
from .kinds.a2d import KIND as A2D
from .kinds.block import load_block
from .kinds.diffusion import drafter_format, read_diffusion
from .kinds.kind import same_vocabulary, token_ids
from .nets.formats import FORMATS
from .nets.sdar import is_sdar
from .registry import Registry, as_registry
from .sources import DTYPES, HUB_ID, check_device, load_causal_lm, load_tokenizer, resolve, resolve_dtype, \
    source_of
from .targets.block import BlockDiffusionTarget
from .targets.causal import CausalLMTarget

__all__ = ["DTYPES", "HUB_ID", "check_device", "check_pair", "is_block_checkpoint", "load_diffusion_drafter",
           "load_drafter", "load_target", "load_tokenizer", "pair_models", "resolve", "resolve_dtype"]


def load_target(name_or_path: str | os.PathLike[str], *, device: str = "cpu", dtype: str = "auto",
                registry: Registry | None = None) -> CausalLMTarget | BlockDiffusionTarget:
    """A Hugging Face causal LM (models.yaml name, local directory or hub id) as a Target; an SDAR
    checkpoint (config.json model_type "sdar") as a BlockDiffusionTarget."""
    check_device(device)
    resolve_dtype(dtype, device)  # an unknown dtype is refused before anything loads
    source = source_of(name_or_path, ("target",), as_registry(registry))
    config = source.config()
    if is_sdar(config):
        return load_block(source, device, dtype)
    for kind in KINDS:
        if kind.not_a_target and kind.detect(config):
            raise LoadError(f"{source.location}: {kind.not_a_target}, not a target: load it with load_drafter, "
                            "beside the causal LM it drafts for")
    model, tokenizer = load_causal_lm(source, device, dtype)
    return CausalLMTarget(model, tokenizer, source.name)


def is_block_checkpoint(name_or_path: str | os.PathLike[str], kinds: tuple[str, ...], registry: Registry | None = None) -> bool:
    """Whether a model (as load_target / load_drafter name it) is a block-diffusion (SDAR) checkpoint,
    from its config.json alone: for refusals made before the weights load."""
    return is_sdar(source_of(name_or_path, kinds, as_registry(registry)).config())


def load_drafter(name_or_path: str | os.PathLike[str], *, device: str = "cpu", dtype: str = "auto",
                 registry: Registry | None = None) -> Drafter:
    """A drafter of the kind its files declare (specdiff.kinds): a DiffusionDrafter
    (forward(input_ids (B, L), sigma (B,)) -> raw logits (B, L, V_drafter)) for diffusion
    checkpoints, an ARDrafter for a causal LM, a BlockDiffusionTarget for an SDAR checkpoint (the
    draft model of simsd-exact), a DFlashDrafter for a DFlash draft (config.json architectures
    DFlashDraftModel), or an A2DDrafter (the DiffusionDrafter interface) for dllm's
    masked-diffusion Qwen3 (model_type a2d-qwen3)."""
    check_device(device)
    resolve_dtype(dtype, device)
    source = source_of(name_or_path, ("drafter", "target"), as_registry(registry))
    return cast(Drafter, detected(source).load(source, device, dtype))


def load_diffusion_drafter(name_or_path: str, *, registry: Registry | None = None) -> DiffusionDrafter:
    """A diffusion drafter in any format, on the CPU in fp32, exactly as stored (for conversion);
    a UsageError for anything else, before any weights are read."""
    source = source_of(name_or_path, ("drafter", "target"), as_registry(registry))
    fmt = drafter_format(source)
    if fmt is None and A2D.detect(source.config()):
        raise UsageError(f"'{name_or_path}' is a masked-diffusion Qwen3 of dllm (model_type a2d-qwen3): it drafts "
                         "as published; `drafter convert` rewrites DDiT drafters only")
    if fmt is None:
        raise UsageError(f"'{name_or_path}' is not a diffusion drafter (formats: {', '.join(FORMATS)})")
    return read_diffusion(source, fmt).eval()


def pair_models(target: Target | BlockDiffusionTarget, drafter: Drafter) -> None:
    """check_pair, then a drafter that reads its token embedding and output head from its target
    (a diffusion drafter with `target_embeddings`, a DFlash drafter) gets them from this one (a
    torch model): its kind's bind()."""
    check_pair(target, drafter)
    kind = kind_of(drafter)
    if kind is not None:
        kind.bind(target, drafter)


def check_pair(target: Target | BlockDiffusionTarget, drafter: Drafter) -> None:
    """Refuse a drafter whose tokenizer maps tokens to ids differently from the target's, or whose
    vocabulary does not fit the target's (its kind's check: a DFlash drafter scores with its
    target's head, of the rows it was made for). A draft vocabulary must have been built for this
    target's (specdiff.vocab)."""
    vocab = getattr(drafter, "draft_vocab", None)
    if vocab is not None:
        vocab.check(target.tokenizer, target.vocab_size, f"drafter '{getattr(drafter, 'source', '')}'")
    kind = kind_of(drafter)
    (kind.check if kind else same_vocabulary)(target, drafter)
    if drafter.tokenizer is None:
        return
    ours, theirs = target.tokenizer.get_vocab(), (kind.tokens if kind else token_ids)(drafter)
    if ours != theirs:
        differ = sorted((t for t in ours.keys() | theirs.keys() if ours.get(t) != theirs.get(t)),
                        key=lambda t: ours.get(t, len(ours)))
        shown = ", ".join(f"{t!r} {ours.get(t, '-')}/{theirs.get(t, '-')}" for t in differ[:3])
        raise IncompatibleModelsError(
            f"drafter and target tokenizers disagree on {len(differ)} token(s) (id in target/drafter: {shown})")
