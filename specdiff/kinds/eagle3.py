"""The EAGLE-3 kind: an EAGLE-3 head as published (config.json architectures
LlamaForCausalLMEagle3, nets/eagle3.py), an Eagle3Drafter that drafts a chain from its target's
fused hidden states (drafters/eagle3.py). Pairing reads the target's torch model: its width, its
layer count (the layer ids) and, for a head without an embedding, its input embedding. No compiled
twin. Exported as the "eagle3" graph (graphs.eagle3_spec: a step over the head's own K/V), together
with its target, whose graph then outputs the features the head reads.

May import: what kinds/__init__.py allows (the drafters, nets, sources, hub, graphs, artifacts, errors).
"""

from __future__ import annotations

from typing import Any

from ..artifacts import Maybe
from ..drafters.eagle3 import KIND as NAME, Eagle3Drafter, is_eagle3_drafter
from ..graphs import DrafterGraph, eagle3_spec
from ..hub import fetch
from ..nets.eagle3 import PICKLED, WEIGHTS, is_eagle3, load_eagle3
from ..sources import TOKENIZER_FILES, Source, drafter_tokenizer, resolve_dtype
from .kind import DrafterKind, same_vocabulary, target_model


def load_eagle3_drafter(source: Source, device: str, dtype: str) -> Eagle3Drafter:
    """An EAGLE-3 head exactly as published (nets/eagle3.py), strictly loaded; bound to its target
    when paired (bind_eagle3)."""
    directory = fetch(source.location, ("config.json", WEIGHTS, PICKLED, *TOKENIZER_FILES))
    drafter = Eagle3Drafter(load_eagle3(directory), tokenizer=drafter_tokenizer(directory, source),
                            source=source.name)
    return drafter.to(device=device, dtype=resolve_dtype(dtype, device)).eval()


def _text_config(model: Any) -> Any:
    config = model.config
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def check_eagle3(target: Any, drafter: Any) -> None:
    """Its vocabulary, its draft ids, the target's hidden width and layer count (one line each); an
    exported head (its graph's, checked at export): the vocabulary it was exported for."""
    if not isinstance(drafter, Eagle3Drafter):
        return same_vocabulary(target, drafter)
    config = _text_config(target_model(target, drafter))
    drafter.check_target(target.vocab_size, config.hidden_size, config.num_hidden_layers)


def bind_eagle3(target: Any, drafter: Any) -> None:
    """The torch head reads its target's layer count and embedding (an exported one's graph holds them)."""
    if isinstance(drafter, Eagle3Drafter):
        drafter.bind_target(target_model(target, drafter), target.vocab_size)


# a step over the head's own K/V, its embedding inside (graphs.eagle3_spec)
GRAPH = DrafterGraph(
    NAME, lambda model: eagle3_spec(model["kv_heads"], model["head_dim"], model["hidden_size"], model["features"],
                                    model["head_rows"], model["vocab_size"]),
    record={"kind": str, "name": str, "vocab_size": int, "head_rows": int, "target_layer_ids": [int],
            "hidden_size": int, "layers": int, "kv_heads": int, "head_dim": int, "features": int,
            "vocab_rows": int,  # the rows of the embedding it feeds (its own or its target's)
            "draft_vocab": Maybe(str)},  # with a draft vocabulary (d2t): its map's file
    sizes=("vocab_size", "head_rows", "hidden_size", "layers", "kv_heads", "head_dim", "features", "vocab_rows"),
    target_axes=True, features="an EAGLE-3 drafter")


KIND = DrafterKind(
    "eagle3", "an EAGLE-3 drafter", detect=is_eagle3, load=load_eagle3_drafter, holds=is_eagle3_drafter,
    check=check_eagle3, bind=bind_eagle3, graph=GRAPH, calls=("extend", "step", "logits"),  # never forward
    not_a_target="an EAGLE-3 draft head (config.json architectures LlamaForCausalLMEagle3)")
