"""What a `specdiff distill` run writes: checkpoints to resume from, and the published drafter.

A checkpoint (weights, optimizer, step, batch RNG state = data position, validation history) is
written to DIR/checkpoints/step-NNNNNNN, the last KEEP of them kept; `resume` continues from the
newest. At the end the drafter is written to DIR in the project's format, config.json last (DIR is
a drafter once config.json exists). Only finite weights are ever saved: a run whose loss or
weights stop being finite raises DivergedError; a new run then removes what it wrote to DIR, a
resumed one keeps the earlier checkpoints. A checkpoint or drafter is written in a hidden directory
named for the process (atomic.temp_directory); one left by a killed run is removed by the next
checkpoint or publish in the same directory.
"""

from __future__ import annotations

import shutil
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

import torch
from torch import nn

from ..atomic import new_directory, temp_directory
from ..drafters.diffusion import DiffusionDrafter
from ..errors import DivergedError
from ..loading import pair_models
from ..nets.checkpoint import load_own, read_json, save_own
from .teacher import Teacher

if TYPE_CHECKING:
    from .loop import Task

KEEP = 2  # checkpoints kept


@dataclass
class TrainState:
    step: int = 0
    tokens: int = 0
    train_s: float = 0.0
    history: list = field(default_factory=list)  # [step, val loss]
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


def latest_checkpoint(root: Path) -> Path | None:
    done = sorted(p for p in root.glob("step-*") if (p / "state.pt").is_file())
    return done[-1] if done else None


def save_checkpoint(root: Path, task: Task, opt: torch.optim.Optimizer, state: TrainState) -> None:
    path = root / f"step-{state.step:07d}"
    if path.exists():
        return
    check_weights(task.module, state.step)
    with new_directory(path) as tmp:
        task.save(tmp)
        torch.save({"optimizer": opt.state_dict(), **asdict(state)}, tmp / "state.pt")
    for old in sorted(root.glob("step-*"))[:-KEEP]:
        shutil.rmtree(old)


def load_checkpoint(path: Path, target: Teacher) -> tuple[DiffusionDrafter, dict, TrainState]:
    backbone, fields = load_own(path, read_json(path / "config.json"))
    drafter = DiffusionDrafter(backbone, tokenizer=target.tokenizer, source=str(path), **fields)
    pair_models(target, drafter)
    saved = torch.load(path / "state.pt", weights_only=True)
    return drafter, saved.pop("optimizer"), TrainState(**saved)


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
