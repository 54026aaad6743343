"""`ar`: plain decoding, one target call per token (decoding.decode_ar), the reference every
causal method must match. May import: methods.base, decoding, compiled."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Iterator, cast

from ..compiled import warm_up
from ..contracts import Row, Target
from ..decoding import decode_ar
from ..sampling import Sampling
from ..targets.static import StaticTarget
from .base import Method, Models, check_sizes


@dataclass(frozen=True)
class PlainDecoder:
    target: Target
    sampling: Sampling
    settings: None = None
    rule: None = None

    def __call__(self, rows: Iterable[Row], batch_size: int) -> Iterator[tuple[Row, list[int]]]:
        return decode_ar(self.target, rows, self.sampling, batch_size)

    def warm_up(self, rows: int, length: int) -> None:
        warm_up(cast(StaticTarget, self.target), None, rows, None, 1, length)

    def check_sizes(self, rows: int, batch_size: int, max_new_tokens: int, context: int) -> None:
        check_sizes(self.target, gamma=None, copies=1, batch_size=batch_size, max_new_tokens=max_new_tokens,
                    rows=rows, context=context)

    def ran(self) -> dict[str, Any]:
        return {}


def prepare(method: Method, models: Models, settings: None, sampling: Sampling, acceptance: str | None) -> PlainDecoder:
    return PlainDecoder(models.target, sampling)
