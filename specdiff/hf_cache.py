"""How a Hugging Face model takes and returns its KV cache, across transformers versions.

transformers 5.24 renamed the forward argument and output field `past_key_values` to `cache`
(the old name still works, with a FutureWarning on every run); earlier versions know only
`past_key_values`. The project passes and reads the cache through these two functions.
Imports: torch, transformers only.
"""

from __future__ import annotations

import inspect
from functools import lru_cache
from typing import Any


@lru_cache(maxsize=None)
def _argument(forward: Any) -> str:
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


def cache_argument(model: Any) -> str:
    """The name of the forward argument that takes this model's cache. A step traced by
    torch.compile takes it ready-made: Dynamo warns on every lru_cache it traces into."""
    return _argument(type(model).forward)


def with_cache(model: Any, cache: Any) -> dict[str, Any]:
    """The keyword argument that passes `cache` to this model's forward."""
    return {cache_argument(model): cache}


def returned_cache(output: Any) -> Any:
    """The cache a forward returned (its `cache`, else `past_key_values` field)."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else output.past_key_values


def passed_cache(kwargs: dict[str, Any]) -> Any:
    """The cache among a forward call's keyword arguments, by either name (None: none)."""
    cache = kwargs.get("cache")
    return cache if cache is not None else kwargs.get("past_key_values")
