"""What a drafter kind declares (DrafterKind), and what a kind that reads its target needs of it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from ..errors import IncompatibleModelsError, UsageError
from ..graphs import DrafterGraph
from ..sources import Source


@dataclass(frozen=True)
class Compiling:
    """How `--compile` runs a kind's drafter (specdiff.compiled): a static twin sharing the loaded
    weights, compiled for every shape a run uses before it decodes."""

    twin: Callable[[Any, bool], Any]  # (drafter, compile) -> its twin; compile=False: fixed shapes, eager
    warm_up: Callable[[Any, int, int, Any], None]  # (twin, rows, gamma, device): compile those shapes
    seconds: Callable[[Any], float]  # (twin) -> seconds its compiling took


def no_reserved_id(drafter: Any) -> int | None:
    """A drafter whose head scores every id it may draft."""
    return None


@dataclass(frozen=True)
class Converting:
    """How `specdiff drafter convert` rewrites a kind's drafter (tools/convert.py): its files in
    another dtype, and a draft vocabulary for its head."""

    save: Callable[[Any, Path, torch.dtype, int | None], None]  # (drafter, directory, dtype, context)
    context: bool = False  # whether it drafts from a context window of its own (`context` sets its length)
    reserved: Callable[[Any], int | None] = no_reserved_id  # drafter -> an id no draft vocabulary may hold


def save_tokenizer(drafter: Any, directory: Path) -> None:
    """A converted drafter's tokenizer beside it, when it carries one."""
    if drafter.tokenizer is not None:
        drafter.tokenizer.save_pretrained(str(directory))


def same_vocabulary(target: Any, drafter: Any) -> None:
    """A drafter scoring its own head over the target's ids: of the same size."""
    if drafter.vocab_size != target.vocab_size:
        raise IncompatibleModelsError(
            f"drafter vocabulary has {drafter.vocab_size} tokens, target's tokenizer {target.vocab_size}")


def token_ids(drafter: Any) -> dict[str, int]:
    """A drafter's tokenizer's {token: id} (compared with its target's)."""
    return dict(drafter.tokenizer.get_vocab())


def nothing_to_bind(target: Any, drafter: Any) -> None:
    """A drafter that reads nothing from its target."""


def target_model(target: Any, drafter: Any) -> Any:
    """The torch model of a target whose embedding and head `drafter` reads (refused on graphs)."""
    model = getattr(target, "model", None)
    if model is None:
        raise UsageError(f"drafter '{drafter.source}' reads its token embedding and output head from its "
                         "target: run the target on the torch runtime")
    return model


@dataclass(frozen=True)
class DrafterKind:
    """One kind of drafter: everything loading, the methods, `--compile`, `specdiff export`, the
    runtimes and bench need to know of it. KINDS (kinds/__init__.py) lists them in detection order."""

    name: str  # what Method.needs names
    what: str  # how messages name it ("a DFlash drafter")
    detect: Callable[[dict[str, Any]], bool]  # config.json -> whether a checkpoint is of this kind
    load: Callable[[Source, str, str], Any]  # (source, device, dtype) -> the loaded drafter
    holds: Callable[[object], bool]  # whether a loaded drafter (torch, or over an exported graph) is of it
    check: Callable[[Any, Any], None] = same_vocabulary  # (target, drafter): its vocabulary fits the target's
    tokens: Callable[[Any], dict[str, int]] = token_ids  # drafter -> the {token: id} its target must share
    bind: Callable[[Any, Any], None] = nothing_to_bind  # (target, drafter): hand it what it reads of the target
    compiling: Compiling | None = None  # None: it drafts eagerly under `--compile`
    graph: DrafterGraph | None = None  # what `specdiff export` writes of it (exporters', runtimes' tables: its name)
    no_graph: str = ""  # why it has none, when it has none
    not_a_target: str = ""  # what its config.json is, when named as a target (refused); "": loads as one
    slot: str = "drafter"  # the field of bench's Models it loads into
    converting: Converting | None = None  # None: `specdiff drafter convert` does not rewrite it
    calls: tuple[str, ...] = ("forward",)  # its methods whose calls are drafter calls (bench's call log)

