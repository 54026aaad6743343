"""Steps 4, 5 and 7 of the demo build: train a GPT-2 (GPT2LMHeadModel) on the encoded corpus.

    python scripts/demo/train_lm.py --data build/demo/data --tokenizer build/demo/tokenizer \
        --work build/demo/target --out specdiff/data/models/demo/target --layers 6 --dim 384 --heads 6 --budget-min 40

Trains the demo target and, with a smaller config, the AR baseline drafter for `spec-ar`. CPU, fp32,
--threads torch threads (bf16 is emulated, hence slow, on the CPUs this was made for). AdamW with
weight decay on matrices only, linear warmup then cosine decay to --min-lr-ratio of the peak; the
schedule's progress is the fraction of the wall-clock budget spent training (or of --steps if given),
so the decay ends when the budget does, whatever the machine's load. Batches are non-overlapping
windows of context + 1 tokens in a seeded random order (one permutation per epoch). Every --eval-s
seconds: the loss on a fixed evenly spaced subset of val.bin, a log line and a checkpoint
(--work/ckpt.pt: weights, optimizer, step, time; a rerun resumes from it). At the end: the loss on
the whole of val.bin, the model saved with save_pretrained (safetensors, --save-dtype) beside the
tokenizer, and --work/compute.json (wall time, steps, tokens seen, threads, losses).

With --sequences DIR (the data/ directory of a `specdiff distill` run: the target's own greedy or
sampled continuations of P-token prompts) and --init MODEL, it instead fine-tunes MODEL on those sequences,
scoring only the continuation tokens: sequence-level distillation of an AR drafter, the same
data the diffusion drafter is distilled on (the spec-ar baseline gets the same advantage).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

from specdiff.training.teacher import read_sequences

SAVE_DTYPES = {"fp16": torch.float16, "fp32": torch.float32}


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, help="directory with train.bin / val.bin (uint16); or --sequences")
    ap.add_argument("--tokenizer", type=Path, required=True)
    ap.add_argument("--work", type=Path, required=True, help="checkpoint, log and compute.json")
    ap.add_argument("--out", type=Path, required=True, help="final model directory (save_pretrained)")
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=8, help="sequences of --context tokens per step")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--min-lr-ratio", type=float, default=0.1)
    ap.add_argument("--warmup-steps", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--budget-min", type=float, default=40.0, help="wall-clock minutes of training (eval excluded)")
    ap.add_argument("--steps", type=int, default=None, help="schedule length in steps instead of the budget")
    ap.add_argument("--eval-s", type=float, default=240.0, help="seconds of training between evaluations")
    ap.add_argument("--eval-windows", type=int, default=48, help="val windows in the periodic evaluation")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--save-dtype", choices=SAVE_DTYPES, default="fp16")
    ap.add_argument("--init", type=Path, help="start from this saved GPT-2 instead of random weights")
    ap.add_argument("--sequences", type=Path, help="train on a `specdiff distill` data/ directory instead")
    return ap.parse_args(argv)


def windows(path: Path, context: int) -> torch.Tensor:
    """Non-overlapping windows of context + 1 tokens: (N, context + 1) int64."""
    ids = np.fromfile(path, dtype=np.uint16).astype(np.int64)
    n = (len(ids) - 1) // context
    starts = np.arange(n) * context
    return torch.from_numpy(np.stack([ids[s:s + context + 1] for s in starts]))


def batch_at(train: torch.Tensor, step: int, batch_size: int, seed: int) -> torch.Tensor:
    """The step-th batch of a seeded per-epoch permutation of the windows: (B, context + 1)."""
    per_epoch = len(train) // batch_size
    epoch, k = divmod(step, per_epoch)
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(seed * 1000 + epoch))
    return train[order[k * batch_size:(k + 1) * batch_size]]


def lm_loss(model: GPT2LMHeadModel, chunk: torch.Tensor, skip: int = 0) -> torch.Tensor:
    """Mean next-token cross-entropy (nats) of chunk (B, L + 1): inputs chunk[:, :-1]; the first
    `skip` targets (a prompt's tokens) are not scored."""
    logits = model(input_ids=chunk[:, :-1]).logits[:, skip:]
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), chunk[:, 1 + skip:].reshape(-1))


@torch.no_grad()
def evaluate(model: GPT2LMHeadModel, val: torch.Tensor, batch_size: int, skip: int = 0) -> float:
    model.eval()
    total = sum(lm_loss(model, val[i:i + batch_size], skip).item() * len(val[i:i + batch_size])
                for i in range(0, len(val), batch_size))
    model.train()
    return total / len(val)


def lr_at(args: argparse.Namespace, step: int, progress: float) -> float:
    """Linear warmup over warmup_steps, then cosine from lr to lr * min_lr_ratio as progress -> 1."""
    if step < args.warmup_steps:
        return args.lr * (step + 1) / args.warmup_steps
    cosine = 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
    return args.lr * (args.min_lr_ratio + (1 - args.min_lr_ratio) * cosine)


def build(args: argparse.Namespace, tokenizer) -> GPT2LMHeadModel:
    if args.init:
        return GPT2LMHeadModel.from_pretrained(args.init, dtype=torch.float32)
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=args.context, n_embd=args.dim, n_layer=args.layers,
                        n_head=args.heads, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(args.seed)
    return GPT2LMHeadModel(config)


def optimizer_for(model: GPT2LMHeadModel, args: argparse.Namespace) -> torch.optim.AdamW:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": args.weight_decay}, {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8)


def save_checkpoint(path: Path, model, opt, state: dict) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "state": state}, tmp)
    os.replace(tmp, path)


def optimizer_step(model, opt, loss: torch.Tensor) -> None:
    """Backward, clip the gradient norm to 1, step."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()


def resume(args: argparse.Namespace, ckpt: Path, model, opt) -> dict:
    """The training state, restored with model and optimizer from `ckpt` if it exists."""
    state = {"step": 0, "train_s": 0.0, "train_loss": None, "val_curve": [], "runs": 0}
    if ckpt.exists():
        saved = torch.load(ckpt, weights_only=True)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
        state = saved["state"]
        log(args, f"resumed from {ckpt} at step {state['step']} ({state['train_s']:.0f} s trained)")
    state["runs"] += 1
    return state


def log(args: argparse.Namespace, message: str) -> None:
    line = f"{time.strftime('%H:%M:%S')} {message}"
    print(line, file=sys.stderr, flush=True)
    with open(args.work / "train.log", "a") as f:
        f.write(line + "\n")


def train(args: argparse.Namespace, model, opt, train_windows, val_subset, state: dict, skip: int) -> dict:
    """Train until the budget (or --steps) is spent; state (step, train_s, losses) is updated and returned."""
    budget_s = args.budget_min * 60
    tokens_per_step = args.batch_size * args.context
    next_eval, ema, t_last = state["train_s"] + args.eval_s, None, time.time()
    while (state["step"] < args.steps) if args.steps else (state["train_s"] < budget_s):
        progress = state["step"] / args.steps if args.steps else state["train_s"] / budget_s
        for group in opt.param_groups:
            group["lr"] = lr_at(args, state["step"], progress)
        loss = lm_loss(model, batch_at(train_windows, state["step"], args.batch_size, args.seed), skip)
        optimizer_step(model, opt, loss)
        now = time.time()
        state["train_s"] += now - t_last
        state["step"] += 1
        ema = loss.item() if ema is None else 0.98 * ema + 0.02 * loss.item()
        state["train_loss"] = ema
        if state["train_s"] >= next_eval:
            val = evaluate(model, val_subset, args.batch_size, skip)
            state["val_curve"].append([state["step"], state["step"] * tokens_per_step, round(val, 4)])
            log(args, f"step {state['step']} tokens {state['step'] * tokens_per_step} train {ema:.3f} "
                      f"val {val:.3f} lr {opt.param_groups[0]['lr']:.2e} "
                      f"{state['step'] * tokens_per_step / state['train_s']:.0f} tok/s")
            save_checkpoint(args.work / "ckpt.pt", model, opt, state)
            next_eval = state["train_s"] + args.eval_s
        t_last = time.time()  # evaluation and checkpointing are not training time
    return state


def main(argv=None) -> None:
    args = parse_args(argv)
    if (args.data is None) == (args.sequences is None):
        sys.exit("train_lm.py: give one of --data and --sequences")
    torch.set_num_threads(args.threads)
    args.work.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    model = build(args, tokenizer)
    opt = optimizer_for(model, args)
    ckpt = args.work / "ckpt.pt"
    state = resume(args, ckpt, model, opt)
    if args.sequences:
        train_seqs, val_seqs, spec = read_sequences(args.sequences)
        train_windows, val_windows = train_seqs.ids, val_seqs.ids  # (M, P + L) prompts + continuations
        skip, args.context = spec.prompt_tokens - 1, train_windows.shape[1] - 1
    else:
        train_windows, val_windows = (windows(args.data / f"{s}.bin", args.context) for s in ("train", "val"))
        skip = 0
    val_subset = val_windows[np.linspace(0, len(val_windows) - 1, args.eval_windows).round().astype(int)]
    log(args, f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, {len(train_windows)} train "
              f"windows, {len(val_windows)} val windows, {args.threads} threads")
    model.train()
    state = train(args, model, opt, train_windows, val_subset, state, skip)
    save_checkpoint(ckpt, model, opt, state)
    val = evaluate(model, val_windows, args.batch_size, skip)
    log(args, f"done: step {state['step']}, train loss {state['train_loss']:.3f}, val loss (all) {val:.3f}")
    model.to(SAVE_DTYPES[args.save_dtype]).save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    compute = {"parameters": sum(p.numel() for p in model.parameters()), "config": model.config.to_diff_dict(),
               "threads": args.threads, "batch_size": args.batch_size, "context": args.context,
               "steps": state["step"], "tokens_seen": state["step"] * args.batch_size * args.context,
               "epochs": round(state["step"] * args.batch_size / len(train_windows), 3),
               "train_wall_s": round(state["train_s"], 1), "this_run_wall_s": round(time.time() - t0, 1),
               "runs": state["runs"], "train_loss_ema": round(state["train_loss"], 4), "val_loss": round(val, 4),
               "val_curve": state["val_curve"], "args": {k: str(v) for k, v in vars(args).items()}}
    (args.work / "compute.json").write_text(json.dumps(compute, indent=1) + "\n")


if __name__ == "__main__":
    main()
