"""The EAGLE-3 kind: an EAGLE-3 head as published (config.json architectures
LlamaForCausalLMEagle3, nets/eagle3.py), an Eagle3Drafter that drafts a chain from its target's
fused hidden states (drafters/eagle3.py). Pairing reads the target's torch model: its width, its
layer count (the layer ids) and, for a head without an embedding, its input embedding. No compiled
twin and no exported graph yet.

May import: what kinds/__init__.py allows (the drafters, nets, sources, hub, errors).
"""

from __future__ import annotations

from typing import Any

from ..drafters.eagle3 import Eagle3Drafter, is_eagle3_drafter
from ..hub import fetch
from ..nets.eagle3 import PICKLED, WEIGHTS, is_eagle3, load_eagle3
from ..sources import TOKENIZER_FILES, Source, drafter_tokenizer, resolve_dtype
from .kind import DrafterKind, target_model


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
    """Its vocabulary, its draft ids, the target's hidden width and layer count (one line each)."""
    config = _text_config(target_model(target, drafter))
    drafter.check_target(target.vocab_size, config.hidden_size, config.num_hidden_layers)


def bind_eagle3(target: Any, drafter: Any) -> None:
    drafter.bind_target(target_model(target, drafter), target.vocab_size)


KIND = DrafterKind(
    "eagle3", "an EAGLE-3 drafter", detect=is_eagle3, load=load_eagle3_drafter, holds=is_eagle3_drafter,
    check=check_eagle3, bind=bind_eagle3,
    no_graph="an EAGLE-3 head drafts a chain step by step with its own KV cache and the target's hidden "
             "states: its graph (a step over that cache, with the target's) is not written yet",
    not_a_target="an EAGLE-3 draft head (config.json architectures LlamaForCausalLMEagle3)")
