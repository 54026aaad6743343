"""`specdiff distill`: train a diffusion drafter to draft what one given target says.

distill(cfg) -> report, the whole run:
    data         the target's own continuations of prompts (teacher.py: greedy or sampled
                 teacher settings, several samples per prompt, top-k soft labels), optionally
                 mixed with raw text windows; every example is shaped like a drafting call
                 (batches.py): N clean context tokens, then gamma slots masked as the l2r schedule
                 with T steps masks them at one of its steps.
    drafter      new, through the target's embeddings, or given (drafter.py)
    training     a loss of losses.py over the drafter's x0 logits, the loop of loop.py, with
                 checkpoints and resume (checkpoints.py)
    publishing   the drafter in the project's format into DIR, config.json last; it records gamma,
                 T and the l2r schedule as the drafter's defaults, which generate and bench use
    report       tau and alpha of specdiff against the target on held-out prompts, greedy and at
                 eval_temperature (evaluate_drafter), in DIR/report.json with the validation
                 history, the compute spent and the share of p's mass the soft labels keep.
A run that diverges raises DivergedError and writes no drafter (checkpoints.py). `method` dflash
and eagle3 train drafters that read the target's hidden states instead (reading.py, READERS).
"""

from __future__ import annotations

import json
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch

from ..atomic import new_file
from ..drafters.diffusion import DiffusionDrafter
from ..loading import load_target, pair_models
from .checkpoints import TrainState, load_checkpoint, publish, recorded, resumable, save_drafter, undone_if_diverged
from .config import DistillConfig, check, data_directory, settled, trained_for
from .data import Data, prepare
from .dflash import READER as DFLASH
from .drafter import frozen, initial_drafter
from .eagle3 import READER as EAGLE3
from .evaluation import evaluate_drafter
from .loop import DiffusionTask, train
from .reading import distill_reading
from .teacher import Teacher

READERS = {reader.method: reader for reader in (DFLASH, EAGLE3)}  # drafters reading the target's features


def distill(cfg: DistillConfig, progress: bool = False) -> dict[str, Any]:
    """Train a drafter for cfg.target into cfg.out (see the module docstring) -> the report."""
    wall = time.perf_counter()
    check(cfg)
    target = load_target(cfg.target, device=cfg.device, dtype="fp32")
    if cfg.method in READERS:
        return distill_reading(cfg, target, READERS[cfg.method], progress)
    if cfg.data_only:
        return build_data(cfg, target, progress)
    out = Path(cfg.out)
    found = resumable(out / "checkpoints", partial(load_checkpoint, target=target)) if cfg.resume else None
    if found:
        cfg = settled(cfg, recorded(found[1][0]), f"the checkpoint being resumed ({found[0]})")
        pair_models(target, found[1][0])
    drafter, opt_state, state = found[1] if found else (initial_drafter(cfg, target), None, TrainState())
    frozen(drafter).to(cfg.device)
    drafter.defaults = trained_for(cfg)
    with undone_if_diverged(out):
        data = prepare(cfg, target, drafter, progress)
        opt = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=cfg.lr)
        if opt_state is not None:
            opt.load_state_dict(opt_state)
        task = DiffusionTask(drafter, data, cfg)
        if not state.history:
            state.history.append([0, task.validation()])
        train(task, opt, state, cfg, progress)
    publish(out, partial(save_drafter, drafter=drafter, tokenizer=target.tokenizer))
    report = _report(cfg, target, drafter, state, data, wall)
    with new_file(out / "report.json") as tmp:
        tmp.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return report


def build_data(cfg: DistillConfig, target: Teacher, progress: bool) -> dict[str, Any]:
    """data_only: the teacher data cache alone -> a short report."""
    data = prepare(cfg, target, initial_drafter(cfg, target), progress)
    return {"target": target.name, "data": str(data_directory(cfg)), "generated_tokens": data.generated_tokens,
            "generate_s": round(data.generate_s, 3), "sequences": len(data.train) + len(data.val)}


def _report(cfg: DistillConfig, target: Teacher, drafter: DiffusionDrafter, state: TrainState, data: Data,
            wall: float) -> dict[str, Any]:
    """report.json of a finished run that started at perf_counter() `wall` (evaluate_drafter runs here)."""
    return {
        "target": target.name, "drafter": str(Path(cfg.out)), "loss": cfg.loss, "draft_temperature": cfg.draft_temperature,
        "teacher": {"temperature": list(cfg.teacher_temperature), "top_p": list(cfg.teacher_top_p),
                    "samples_per_prompt": cfg.samples_per_prompt},
        "soft_labels": _soft_label_report(cfg, data), "gamma": cfg.draft_gamma,
        "steps_per_draft": cfg.steps_per_draft, "context_length": drafter.context_length,
        "mask_id": drafter.mask_id, "vocab_size": drafter.vocab_size,
        "parameters": sum(p.numel() for p in drafter.parameters()),
        "val_loss": {"initial": state.history[0][1], "final": state.history[-1][1], "history": state.history},
        "eval": evaluate_drafter(cfg, target, drafter, data.val, data.prompt_tokens),
        "compute": {"steps": state.step, "train_tokens": state.tokens, "train_s": round(state.train_s, 3),
                    "train_sequences": len(data.train), "generated_tokens": data.generated_tokens,
                    "generate_s": round(data.generate_s, 3),
                    "wall_s": round(time.perf_counter() - wall, 3), "device": cfg.device, "threads": torch.get_num_threads()},
    }


def _soft_label_report(cfg: DistillConfig, data: Data) -> dict[str, Any] | None:
    """How much of p the soft labels keep: the mean over positions of their summed probability."""
    if data.train.soft_p is None:
        return None
    mass = data.train.soft_p.float().sum(-1)  # (M, L)
    return {"k": cfg.soft_labels, "mass_kept": {"mean": round(mass.mean().item(), 4),
                                                "p10": round(mass.quantile(0.1).item(), 4)}}
