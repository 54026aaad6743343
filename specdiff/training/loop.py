"""The training loop of `specdiff distill`: AdamW, linear warmup then cosine decay to MIN_LR of
the peak learning rate, gradient norm clipped at MAX_GRAD_NORM; validation loss every
`val_every` steps on fixed batches, a checkpoint every `checkpoint_every` steps; it stops at
`max_steps` or when the `time_budget` is spent. What is trained is a Task: DiffusionTask here
(a diffusion drafter on drafting-shaped batches), DFlashTask in training/dflash.py, Eagle3Task in
training/eagle3.py."""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from ..drafters.diffusion import DiffusionDrafter
from ..errors import DivergedError
from .batches import Batch
from .checkpoints import Task, TrainState, save_checkpoint, save_drafter
from .config import DistillConfig
from .data import Data
from .losses import loss_function

MIN_LR = 0.1  # cosine decays to this share of the peak learning rate
MAX_WARMUP = 200
MAX_GRAD_NORM = 1.0


def learning_rate(step: int, peak: float, max_steps: int) -> float:
    """Linear warmup over min(MAX_WARMUP, max_steps / 10) steps, then cosine down to MIN_LR * peak."""
    warmup = max(1, min(MAX_WARMUP, max_steps // 10))
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, max_steps - warmup))
    return peak * (MIN_LR + (1 - MIN_LR) * 0.5 * (1 + math.cos(math.pi * progress)))


class DiffusionTask:
    """A diffusion drafter trained on drafting-shaped batches of the teacher data (data.py)."""

    def __init__(self, drafter: DiffusionDrafter, data: Data, cfg: DistillConfig):
        self.module, self.data, self.cfg = drafter, data, cfg
        self._loss = loss_function(cfg)

    def batch(self, size: int, generator: torch.Generator) -> Batch:
        return self.data.batch(size, generator).to(self.cfg.device)

    def loss(self, batch: Batch) -> torch.Tensor:
        return self._loss(self.module, batch)

    def scored(self, batch: Batch) -> int:
        return batch.x0.numel()

    @torch.no_grad()
    def validation(self) -> float:
        return validation_loss(self.module, self.data.val_batches, self.cfg)

    def save(self, directory: Path) -> None:
        save_drafter(directory, self.module, tokenizer=None)


@torch.no_grad()
def validation_loss(drafter: DiffusionDrafter, batches: list[Batch], cfg: DistillConfig) -> float:
    drafter.eval()
    loss = loss_function(cfg)
    values = [loss(drafter, b.to(cfg.device)).item() for b in batches]
    drafter.train()
    return round(sum(values) / len(values), 5)


def train(task: Task, opt: torch.optim.Optimizer, state: TrainState, cfg: DistillConfig, progress: bool) -> None:
    """Steps until max_steps or the time budget; validation and checkpoints on the way."""
    generator = torch.Generator().manual_seed(cfg.seed)
    if state.rng is not None:
        generator.set_state(state.rng)
    root, last = Path(cfg.out) / "checkpoints", time.perf_counter()
    deadline = last + (cfg.time_budget if cfg.time_budget is not None else math.inf)
    bar = tqdm(total=cfg.max_steps, initial=state.step, disable=not progress, unit="step", desc="distill")
    task.module.train()
    while state.step < cfg.max_steps and time.perf_counter() < deadline:
        batch = task.batch(cfg.batch_size, generator)
        loss = _step(task, opt, batch, learning_rate(state.step, cfg.lr, cfg.max_steps))
        _check_loss(loss, state.step + 1)
        state.step, state.tokens, state.rng = state.step + 1, state.tokens + task.scored(batch), generator.get_state()
        if state.step % cfg.val_every == 0 or state.step == cfg.max_steps:
            _validate(task, state, cfg, loss, progress)
        if state.step % cfg.checkpoint_every == 0:
            state.train_s, last = state.train_s + time.perf_counter() - last, time.perf_counter()
            save_checkpoint(root, task, opt, state)
        bar.set_postfix(loss=f"{loss:.3f}", refresh=False)
        bar.update()
    bar.close()
    state.train_s += time.perf_counter() - last
    if state.history[-1][0] != state.step:
        state.history.append([state.step, task.validation()])
    save_checkpoint(root, task, opt, state)


def _step(task: Task, opt: torch.optim.Optimizer, batch: Any, lr: float) -> float:
    """One optimizer step -> the batch's loss."""
    for group in opt.param_groups:
        group["lr"] = lr
    loss = task.loss(batch)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(task.module.parameters(), MAX_GRAD_NORM)
    opt.step()
    return loss.item()


def _validate(task: Task, state: TrainState, cfg: DistillConfig, loss: float, progress: bool) -> None:
    """Record the validation loss; with no progress bar, one line per validation on stderr, so a
    log shows the run is alive."""
    state.history.append([state.step, task.validation()])
    task.module.train()
    if not progress:
        print(f"distill: step {state.step}/{cfg.max_steps}, loss {loss:.4f}, "
              f"val {state.history[-1][1]:.4f}", file=sys.stderr, flush=True)


def _check_loss(loss: float, step: int) -> None:
    if not math.isfinite(loss):
        raise DivergedError(f"training diverged at step {step} (loss {loss}); no drafter written (try a lower lr)")
