"""The decoder of block-diffusion targets' methods (block, simsd-exact, simsd): the method's loop
(block_decoding, simsd) over one row at a time, with its BlockSettings checked against the target
(and the drafter).

May import: methods.base, contracts, decoding (Row).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Iterator

from ..contracts import BlockTarget, Decoder
from ..contracts import Row
from ..errors import IncompatibleModelsError, UsageError
from ..sampling import Sampling
from ..settings import BlockSettings
from .base import Method, Models, Prepare

# (target, drafter or None, row, sampling, settings) -> each finished block's new tokens
Loop = Callable[[BlockTarget, Any, Row, Sampling, BlockSettings], Iterator[list[int]]]


@dataclass(frozen=True)
class BlockDecoder:
    loop: Loop
    target: BlockTarget
    drafter: BlockTarget | None
    sampling: Sampling
    settings: BlockSettings
    reads: tuple[str, ...]  # the settings its method reads (methods.Method.settings)
    rule: None = None

    def __call__(self, rows: Iterable[Row], batch_size: int) -> Iterator[tuple[Row, list[int]]]:
        """One row at a time, whatever the batch size."""
        return ((row, tokens) for row in rows
                for tokens in self.loop(self.target, self.drafter, row, self.sampling, self.settings))

    def warm_up(self, rows: int, length: int) -> None:
        """Nothing: block-diffusion targets are not compiled (compiled.compile_models refuses them)."""

    def check_sizes(self, rows: int, batch_size: int, max_new_tokens: int, context: int) -> None:
        """Nothing: one row and one block per call, within the window the target was checked for."""

    def ran(self) -> dict[str, Any]:
        return {k: getattr(self.settings, k) for k in self.reads}


def preparer(loop: Loop) -> Prepare:
    """The Method.prepare_with of a block method that decodes each row with `loop`."""

    def prepare(method: Method, models: Models, settings: BlockSettings, sampling: Sampling,
                acceptance: str | None) -> Decoder:
        return BlockDecoder(loop, models.target, models.drafter, sampling, _checked(settings, models, sampling),
                            method.settings)

    return prepare


def _checked(settings: BlockSettings, models: Models, sampling: Sampling) -> BlockSettings:
    """The settings against the models; `steps` set nowhere (None): the block size, one slot per step."""
    target, drafter = models.target, models.drafter
    settings = replace(settings, steps=settings.steps or target.block_size)
    if settings.steps > target.block_size:
        raise UsageError(f"`steps` {settings.steps} is more than the block size {target.block_size} "
                         "(each step commits at least one slot)")
    if sampling.repetition_penalty != 1:
        raise UsageError("`repetition_penalty` is not supported on block-diffusion targets")
    if drafter is not None and (drafter.block_size, drafter.mask_id) != (target.block_size, target.mask_id):
        raise IncompatibleModelsError(
            f"drafter's block size / mask id {drafter.block_size} / {drafter.mask_id} differ from the "
            f"target's {target.block_size} / {target.mask_id}")
    return settings
