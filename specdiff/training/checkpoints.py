"""What a `specdiff distill` run writes: checkpoints to resume from, and the published drafter;
and what it trains and checkpoints, a Task (the loop runs one; loop.DiffusionTask, dflash.DFlashTask,
eagle3.Eagle3Task).

A checkpoint (weights, optimizer, step, batch RNG state = data position, validation history) is
written to DIR/checkpoints/step-NNNNNNN, the last KEEP of them kept; `resume` continues from the
newest that can be read (`resumable`): one that cannot (empty, truncated, a broken config.json:
what a killed run or a full disk leaves) is set aside as unreadable-step-NNNNNNN, said in one
stderr line; if none can be read, one LoadError. The shape and settings a checkpoint records are
the run's (`recorded`, config.settled). At the end the drafter is written to DIR in the
project's format, config.json last (DIR is a drafter once config.json exists). Only finite weights are ever saved: a run whose loss or
weights stop being finite raises DivergedError; a new run then removes what it wrote to DIR, a
resumed one keeps the earlier checkpoints. A checkpoint or drafter is written in a hidden directory
named for the process (atomic.temp_directory); one left by a killed run is removed by the next
checkpoint or publish in the same directory.
"""

from __future__ import annotations

import shutil
import sys
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol, TypeVar

import torch
from torch import nn

from ..atomic import new_directory, remove, temp_directory
from ..drafters.diffusion import DiffusionDrafter
from ..errors import DivergedError, LoadError
from ..nets.checkpoint import load_own, read_json, save_own
from .teacher import Teacher

KEEP = 2  # checkpoints kept
T = TypeVar("T")


class Task(Protocol):
    """What one kind of drafter needs trained: its module, batches, loss, validation and files."""

    @property
    def module(self) -> nn.Module: ...  # the weights trained and checkpointed

    def batch(self, size: int, generator: torch.Generator) -> Any: ...  # generator's state: the data position

    def loss(self, batch: Any) -> torch.Tensor: ...

    def scored(self, batch: Any) -> int: ...  # the tokens a step trained on (the report's train_tokens)

    def validation(self) -> float: ...  # the loss on fixed held-out batches

    def save(self, directory: Path) -> None: ...  # the drafter's files (a checkpoint's, no tokenizer)


@dataclass
class TrainState:
    step: int = 0
    tokens: int = 0
    train_s: float = 0.0
    history: list[Any] = field(default_factory=list)  # [step, val loss]
    rng: torch.Tensor | None = None  # state of the batch generator: the data position


def check_weights(module: nn.Module, step: int) -> None:
    """Before anything is saved: an update can leave non-finite weights after a finite loss."""
    if not all(torch.isfinite(p).all() for p in module.parameters()):
        raise DivergedError(f"training diverged at step {step} (non-finite weights); no drafter written "
                            "(try a lower lr)")


@contextmanager
def undone_if_diverged(out: Path) -> Iterator[None]:
    """A run into an absent or empty DIR that diverges leaves DIR as it found it; a resumed run
    keeps its earlier checkpoints (only finite weights are ever saved)."""
    existed = out.exists()
    fresh = not existed or not any(out.iterdir())
    try:
        yield
    except DivergedError:
        if fresh:
            shutil.rmtree(out, ignore_errors=True)
            if existed:
                out.mkdir()
        raise


def resumable(root: Path, read: Callable[[Path], T]) -> tuple[Path, T] | None:
    """The newest checkpoint under `root` that `read` loads (a LoadError for one it cannot), and
    what it read; None where `root` holds none. Those newer that cannot be read are renamed
    unreadable-step-NNNNNNN (kept, out of the run's way), in one stderr line naming each and why;
    if none can be read, a LoadError naming each, and nothing is renamed."""
    skipped: list[tuple[Path, str]] = []
    for path in sorted(root.glob("step-*"), reverse=True):
        try:
            found = read(path)
        except LoadError as e:
            skipped.append((path, str(e).replace(f"{path}/", "")))
            continue
        if skipped:
            print(f"specdiff: resuming from {path.name}; skipped " + "; ".join(
                f"{old.name} ({why}), now {_set_aside(old).name}" for old, why in skipped), file=sys.stderr, flush=True)
        return path, found
    if skipped:
        raise LoadError(f"no checkpoint in {root} can be read: " + "; ".join(f"{p.name}: {why}" for p, why in skipped)
                        + f"; remove {root} to start afresh")
    return None


def _set_aside(path: Path) -> Path:
    """step-N -> unreadable-step-N (one set aside before under that name is replaced)."""
    aside = path.with_name(f"unreadable-{path.name}")
    if aside.is_dir():
        shutil.rmtree(aside)
    return path.replace(aside)


def read_state(path: Path) -> tuple[dict[str, Any], TrainState]:
    """A checkpoint's state.pt -> (optimizer state, TrainState); a LoadError if it cannot be read."""
    try:
        saved = torch.load(path / "state.pt", weights_only=True)
        return saved.pop("optimizer"), TrainState(**saved)
    except Exception as e:  # a damaged file: torch raises RuntimeError, EOFError, UnpicklingError, ...
        why = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise LoadError(f"{path / 'state.pt'}: cannot be read ({why})") from e


def save_checkpoint(root: Path, task: Task, opt: torch.optim.Optimizer, state: TrainState) -> None:
    path = root / f"step-{state.step:07d}"
    if path.exists():
        return
    check_weights(task.module, state.step)
    with new_directory(path) as tmp:
        task.save(tmp)
        save_state({"optimizer": opt.state_dict(), **asdict(state)}, tmp / "state.pt")
    for old in sorted(root.glob("step-*"))[:-KEEP]:
        remove(old)  # renamed first: a run killed halfway leaves no half checkpoint under its name


def save_state(state: dict[str, Any], path: Path) -> None:
    """torch.save, whose failed writes (disk full, file too large) are OSErrors, as Python's own
    writes': torch raises RuntimeError for them, writing to a path or closing its archive after a
    write to a file failed."""
    with open(path, "wb") as f:
        try:
            torch.save(state, f)
        except RuntimeError as e:
            if isinstance(e.__context__, OSError):
                raise e.__context__  # the write that failed; torch's error only follows from it
            raise


def load_checkpoint(path: Path, target: Teacher) -> tuple[DiffusionDrafter, dict[str, Any], TrainState]:
    """A diffusion drafter's checkpoint (not yet paired with `target`); a LoadError if it cannot be read."""
    backbone, fields = load_own(path, read_json(path / "config.json"))
    drafter = DiffusionDrafter(backbone, tokenizer=target.tokenizer, source=str(path), **fields)
    return (drafter, *read_state(path))


def recorded(drafter: DiffusionDrafter) -> dict[str, Any]:
    """The options a diffusion drafter's checkpoint fixes (config.settled; a reader's: its Reader)."""
    c = drafter.backbone.config
    return {"layers": c.n_blocks, "dim": c.hidden_size, "heads": c.n_heads, "context": drafter.context_length,
            "gamma": drafter.defaults.get("gamma")}


def publish(out: Path, save: Callable[[Path], None]) -> None:
    """Write a drafter's files (`save(directory)`) into `out`, config.json last (a drafter once it
    exists)."""
    (out / "config.json").unlink(missing_ok=True)
    tmp = temp_directory(out / "drafter")  # named for this process: a later run removes it if killed
    try:
        save(tmp)
        for f in sorted(tmp.iterdir(), key=lambda f: f.name == "config.json"):
            f.replace(out / f.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def save_drafter(directory: Path, drafter: DiffusionDrafter, tokenizer: Any) -> None:
    save_own(directory, drafter.backbone, vocab_size=drafter.vocab_size, mask_id=drafter.mask_id,
             context_length=drafter.context_length, parameterization=drafter.parameterization,
             tokenizer=tokenizer, defaults=drafter.defaults, target_embeddings=drafter.target_embeddings)
