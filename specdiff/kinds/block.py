"""The block-diffusion kind: an SDAR checkpoint (config.json model_type "sdar", nets/sdar.py), the
draft model of simsd-exact; loaded as a BlockDiffusionTarget, as a target of that kind is."""

from __future__ import annotations

from ..hub import fetch
from ..nets.sdar import is_sdar, read_sdar_config
from ..sources import BLOCK_FILES, Source, qwen3_model, quiet_tokenizer, tokenizer_source
from ..targets.block import BlockDiffusionTarget
from .kind import DrafterKind


def load_block(source: Source, device: str, dtype: str) -> BlockDiffusionTarget:
    """An SDAR checkpoint in transformers' own Qwen3 class (nets/sdar.py), strictly loaded."""
    directory = fetch(source.location, BLOCK_FILES)
    config, block_size, mask_id = read_sdar_config(directory)
    model = qwen3_model(source.location, directory, config, device, dtype)
    tokenizer = quiet_tokenizer(tokenizer_source(source.entry, source.registry) or str(directory))
    return BlockDiffusionTarget(model, tokenizer, source.name, block_size=block_size, mask_id=mask_id)


def is_block_diffusion(model: object) -> bool:
    """A block-diffusion LM (targets.block.BlockDiffusionTarget): SDAR and the demo block pair."""
    return getattr(model, "kind", None) == "block-diffusion"


KIND = DrafterKind(
    "block-diffusion", "a block-diffusion drafter", detect=is_sdar, load=load_block, holds=is_block_diffusion,
    no_graph="a block-diffusion (SDAR) model: `specdiff export` writes causal LM and masked-diffusion graphs only")
