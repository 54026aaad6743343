"""Step 9 of the demo build: train a small block-diffusion LM (SDAR layout: Qwen3 weights, block
size B, a mask token) on the encoded demo corpus, for `--method block / simsd / simsd-exact`.

    python scripts/demo/train_block.py --data build/demo/data --tokenizer specdiff/data/models/demo/target \
        --work build/demo/block-target --out specdiff/data/models/demo/block-target \
        --layers 4 --dim 256 --heads 4 --kv-heads 2 --block-size 4 --budget-min 14 --threads 1

The objective is SDAR's / BD3-LM's: a window x_0 of L tokens is fed as [x_t | x_0] (2L tokens,
both halves with position ids 0..L-1), x_t masking each token of block b with probability t_b ~
U(0, 1). A token of x_t sees x_t's tokens of its own block (bidirectionally) and x_0's tokens of
earlier blocks; a token of x_0 sees x_0's tokens of its own and earlier blocks (what the K/V cache
holds at decoding time). Loss: cross-entropy of x_0 at the masked slots of x_t, logits not shifted.
With --teacher (a trained block-diffusion target) the loss is instead the cross-entropy against
the teacher's distribution at the same slots of the same [x_t | x_0] (distillation: a draft for
simsd-exact must make the target's own denoising choices); --init starts from a saved model.
Schedule, batching, logging and checkpoints are train_lm.py's (warmup + cosine over a wall-clock
budget; --work/ckpt.pt resumes). Saved in fp16 as an SDAR checkpoint beside the tokenizer.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

from specdiff.loading import load_target
from specdiff.nets.sdar import save_sdar
from train_lm import batch_at, log, lr_at, optimizer_for, optimizer_step, resume, save_checkpoint, windows


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, required=True, help="directory with train.bin / val.bin (uint16)")
    ap.add_argument("--tokenizer", type=Path, required=True, help="its mask token: --mask-token")
    ap.add_argument("--mask-token", default="<|mask|>")
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--block-size", type=int, default=4)
    ap.add_argument("--context", type=int, default=128, help="L: tokens per window")
    ap.add_argument("--max-positions", type=int, default=512, help="the model's context window")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-ratio", type=float, default=0.1)
    ap.add_argument("--warmup-steps", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--budget-min", type=float, default=14.0)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--eval-s", type=float, default=120.0)
    ap.add_argument("--eval-windows", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--teacher", type=Path, help="distil from this SDAR checkpoint (module docstring)")
    ap.add_argument("--init", type=Path, help="start from this SDAR checkpoint")
    return ap.parse_args(argv)


def training_mask(L: int, B: int, dtype: torch.dtype) -> torch.Tensor:
    """The additive attention mask of [x_t | x_0] (module docstring): (1, 1, 2L, 2L)."""
    b = torch.arange(L) // B
    same, before = b[:, None] == b[None, :], b[:, None] > b[None, :]
    allowed = torch.cat([torch.cat([same, before], 1),
                         torch.cat([torch.zeros(L, L, dtype=torch.bool), same | before], 1)], 0)
    mask = torch.zeros(2 * L, 2 * L, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    return mask[None, None]


def diffusion_loss(model: Qwen3ForCausalLM, x0: torch.Tensor, B: int, mask_id: int, attn: torch.Tensor,
                   generator: torch.Generator | None = None, teacher=None) -> torch.Tensor:
    """Mean cross-entropy of x0 (N, L), or of the teacher's distribution, at the masked slots of
    x_t (module docstring)."""
    N, L = x0.shape
    t = torch.rand(N, L // B, generator=generator).repeat_interleave(B, 1)  # (N, L)
    masked = torch.rand(N, L, generator=generator) < t
    masked[:, 0] |= ~masked.any(1)  # at least one slot scored per window
    xt = torch.where(masked, torch.full_like(x0, mask_id), x0)
    positions = torch.arange(L).repeat(2)[None].expand(N, -1)
    inputs = dict(input_ids=torch.cat([xt, x0], 1), attention_mask=attn.expand(N, -1, -1, -1), position_ids=positions)
    logits = model.lm_head(model.model(**inputs).last_hidden_state[:, :L][masked])  # (M, V)
    if teacher is None:
        return F.cross_entropy(logits.float(), x0[masked])
    with torch.no_grad():
        soft = teacher.lm_head(teacher.model(**inputs).last_hidden_state[:, :L][masked]).float()
        soft[:, mask_id] = float("-inf")  # never a committed token
    return F.cross_entropy(logits.float(), soft.softmax(-1))


@torch.no_grad()
def evaluate(model, val: torch.Tensor, args, mask_id: int, attn: torch.Tensor) -> float:
    model.eval()
    g = torch.Generator().manual_seed(1234)
    losses = [diffusion_loss(model, val[i:i + args.batch_size], args.block_size, mask_id, attn, g).item()
              for i in range(0, len(val), args.batch_size)]
    model.train()
    return float(np.mean(losses))


def build(args: argparse.Namespace, tokenizer) -> Qwen3ForCausalLM:
    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=args.dim, intermediate_size=3 * args.dim,
                         num_hidden_layers=args.layers, num_attention_heads=args.heads,
                         num_key_value_heads=args.kv_heads, head_dim=args.dim // args.heads,
                         max_position_embeddings=args.max_positions, tie_word_embeddings=False,
                         bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
                         rope_theta=10000.0)
    torch.manual_seed(args.seed)
    return Qwen3ForCausalLM(config)


def train(args, model, opt, train_windows, val, mask_id: int, state: dict) -> dict:
    attn = training_mask(args.context, args.block_size, torch.float32)
    budget_s, g = args.budget_min * 60, torch.Generator().manual_seed(args.seed + state["step"])
    next_eval, t_last = state["train_s"] + args.eval_s, time.time()
    while (state["step"] < args.steps) if args.steps else (state["train_s"] < budget_s):
        progress = state["step"] / args.steps if args.steps else state["train_s"] / budget_s
        for group in opt.param_groups:
            group["lr"] = lr_at(args, state["step"], progress)
        x0 = batch_at(train_windows, state["step"], args.batch_size, args.seed)[:, :args.context]
        loss = diffusion_loss(model, x0, args.block_size, mask_id, attn, g, args.teacher_model)
        optimizer_step(model, opt, loss)
        now = time.time()
        state["train_s"] += now - t_last
        state["step"] += 1
        state["train_loss"] = loss.item() if state["train_loss"] is None else 0.98 * state["train_loss"] + 0.02 * loss.item()
        if state["train_s"] >= next_eval:
            v = evaluate(model, val, args, mask_id, attn)
            state["val_curve"].append([state["step"], round(v, 4)])
            log(args, f"step {state['step']} train {state['train_loss']:.3f} val {v:.3f} "
                      f"lr {opt.param_groups[0]['lr']:.2e}")
            save_checkpoint(args.work / "ckpt.pt", model, opt, state)
            next_eval = state["train_s"] + args.eval_s
        t_last = time.time()
    return state


def main(argv=None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    args.work.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    mask_id = tokenizer.convert_tokens_to_ids(args.mask_token)
    if not isinstance(mask_id, int) or mask_id == tokenizer.unk_token_id:
        sys.exit(f"train_block.py: the tokenizer has no {args.mask_token!r}")
    model = load_target(args.init, dtype="fp32").model.train() if args.init else build(args, tokenizer)
    args.teacher_model = load_target(args.teacher, dtype="fp32").model if args.teacher else None
    opt = optimizer_for(model, args)
    ckpt = args.work / "ckpt.pt"
    state = resume(args, ckpt, model, opt)
    train_windows, val_windows = (windows(args.data / f"{s}.bin", args.context) for s in ("train", "val"))
    val = val_windows[np.linspace(0, len(val_windows) - 1, args.eval_windows).round().astype(int), :args.context]
    log(args, f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, block {args.block_size}, "
              f"{len(train_windows)} train windows, {args.threads} threads")
    model.train()
    state = train(args, model, opt, train_windows, val, mask_id, state)
    save_checkpoint(ckpt, model, opt, state)
    v = evaluate(model, val, args, mask_id, training_mask(args.context, args.block_size, torch.float32))
    log(args, f"done: step {state['step']}, val loss {v:.3f}")
    save_sdar(args.out, model, args.block_size, mask_id, torch.float16)
    tokenizer.save_pretrained(str(args.out))
    compute = {"parameters": sum(p.numel() for p in model.parameters()), "threads": args.threads,
               "steps": state["step"], "tokens_seen": state["step"] * args.batch_size * args.context,
               "train_wall_s": round(state["train_s"], 1), "this_run_wall_s": round(time.time() - t0, 1),
               "val_loss": round(v, 4), "val_curve": state["val_curve"],
               "args": {k: str(v) for k, v in vars(args).items() if k != "teacher_model"}}
    (args.work / "compute.json").write_text(json.dumps(compute, indent=1) + "\n")


if __name__ == "__main__":
    main()
