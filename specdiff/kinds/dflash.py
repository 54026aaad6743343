"""The DFlash kind: a DFlash draft as published (config.json architectures DFlashDraftModel,
nets/dflash.py), a DFlashDrafter that drafts a block from the target's hidden states with the
target's embedding and head; exported as the "dflash" graph, together with its target."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..artifacts import Maybe
from ..drafters.dflash import DFlashDrafter, is_dflash_drafter
from ..errors import IncompatibleModelsError
from ..graphs import DrafterGraph, dflash_spec
from ..hub import fetch
from ..nets.dflash import MASK_OVERRIDE, WEIGHTS, is_dflash
from ..nets.dflash import load_dflash as read_dflash
from ..nets.dflash import save_dflash
from ..sources import TOKENIZER_FILES, Source, drafter_tokenizer, resolve_dtype
from ..vocab import VOCAB_FILE, load_draft_vocab
from .kind import Converting, DrafterKind, save_tokenizer, target_model


def load_dflash(source: Source, device: str, dtype: str) -> DFlashDrafter:
    """A DFlash draft exactly as published (nets/dflash.py), strictly loaded; its embedding and
    head are its target's (bind_dflash binds them)."""
    directory = fetch(source.location, ("config.json", WEIGHTS, MASK_OVERRIDE, VOCAB_FILE, *TOKENIZER_FILES))
    net, spec = read_dflash(directory)
    drafter = DFlashDrafter(net, spec, tokenizer=drafter_tokenizer(directory, source), source=source.name,
                            draft_vocab=load_draft_vocab(directory))
    return drafter.to(device=device, dtype=resolve_dtype(dtype, device)).eval()


def check_head_rows(target: Any, drafter: Any) -> None:
    """It scores with its target's head: the target's vocabulary fits the rows it was made for
    (with a draft vocabulary, check_pair has checked its map instead)."""
    if drafter.draft_vocab is None and target.vocab_size > drafter.vocab_rows:
        raise IncompatibleModelsError(f"DFlash drafter '{drafter.source}' was made for a target head of "
                                      f"{drafter.vocab_rows} rows; the target's tokenizer has {target.vocab_size} tokens")


def bind_dflash(target: Any, drafter: Any) -> None:
    """The torch drafter reads its target's embedding and head (an exported one's graph holds them)."""
    if isinstance(drafter, DFlashDrafter):
        drafter.bind_target(target_model(target, drafter))


def check_block(model: dict[str, Any], where: str) -> None:
    """A block holds the anchor and at least one draft slot."""
    if model["block_size"] < 2:
        raise ValueError(f"{where}.block_size must be >= 2, got {model['block_size']}")


def save_rewritten(drafter: Any, out: Path, dtype: torch.dtype, context: int | None) -> None:
    """As published (nets/dflash.py), in `dtype`, with its tokenizer if it carries one."""
    save_dflash(out, drafter.net, drafter.spec, dtype)
    save_tokenizer(drafter, out)


# a step over the context K/V, with the target's embedding and head inside (graphs.dflash_spec)
GRAPH = DrafterGraph(
    "dflash", lambda model: dflash_spec(model["layers"], model["kv_heads"], model["head_dim"], model["block_size"],
                                        model["features"], model["head_rows"]),
    record={"kind": str, "name": str, "vocab_size": int, "mask_id": int, "block_size": int,
            "target_layer_ids": [int], "head_rows": int, "layers": int, "kv_heads": int, "head_dim": int,
            "features": int, "defaults": Maybe(dict),
            # with a head of N rows (specdiff.vocab): its map's file, the rows of the embedding fed
            "draft_vocab": Maybe(str), "vocab_rows": Maybe(int)},
    sizes=("vocab_size", "block_size", "layers", "kv_heads", "head_dim", "features"), check=check_block,
    target_axes=True, features="a DFlash drafter")
KIND = DrafterKind(
    "dflash", "a DFlash drafter", detect=is_dflash, load=load_dflash, holds=is_dflash_drafter,
    check=check_head_rows, bind=bind_dflash, graph=GRAPH, converting=Converting(save_rewritten),
    not_a_target="a DFlash draft (config.json architectures DFlashDraftModel)")
