"""smol-dflash's GPU recipe: one prepared run of minutes on one CUDA GPU (scripts/smol/gpu.sh sends
it), then training continues on the CPU.

    python scripts/smol/gpu.py --drafter DIR --prompts FILE --out DIR [--generate-s S] [--train-s S]
    python scripts/smol/gpu.py --digest            # the dequantized target's weights digest (sha256)
    python scripts/smol/gpu.py --merge SHARDS DRAFTER OUT  # returned shards -> OUT, a DFlash checkpoint

1. target   SmolLM2-135M-Instruct as every specdiff run loads it (models.yaml `smollm2-135m-instruct`,
            the GGUF through transformers), in fp32: the target the drafter serves (dtype "auto" is
            fp16 on CUDA, another teacher); refused when its weights' digest is not
            `--expect-digest` (another transformers could dequantize otherwise)
2. answers  the target's answers to the training questions of --prompts (questions-large.txt; its last
            10% held out, as answers.sh does), --batch rows a call, 128 tokens through the chat
            template, calls alternating greedy / 0.7 / 1.0 at top-p 0.95, the top-32 soft labels and
            the outputs of the layers the drafter reads, kept in memory (teacher.continue_batch, the
            CPU build's own loop, drawing with a generator on the GPU), until --generate-s; first
            the greedy answers to VAL_QUESTIONS held-out questions (the validation set)
3. training the drafter (fp32 weights, bf16 autocast) on them with distill's own loss, batches and
            loop (training/dflash.py, loop.py: ce+kl, per-slot weights, warmup and cosine), for the
            steps that fit in --train-s (timed on the first ones) and at most --passes anchors per
            answer position; validated 20 times; each best validation writes the weights as shards
            of at most 15 MB (huggingface_hub's split) under --out, so the drafter that returns is
            the best validated one (the starting one included), also from a run cut short
4. report   --out/report.json: rates, steps, validation loss history, the GPU, versions;
            --out/answers.safetensors: the answers' ids (uint16: SmolLM2 has 49,152), for a CPU prefill

The first run (H200, 2026-11-27, build/smol/gpu-run-1, before those rules) sampled on the host and
loaded the target as "auto" (fp16): 704 answer tokens/s (greedy calls of 512 rows 0.19 s a step,
sampled ones 1.1 s; not profiled there, but the draw was on the host: a 512 x 49,152 CPU
multinomial costs 0.44 s on one core here), so 1,536 answers in
326 s; 4,321 steps of 256 x 16 anchors at lr 1e-3 drew each answer position about 100 times and
overfitted (validation 4.82 -> 9.59); tau greedy 2.10 -> 1.45 (`specdiff bench --pair smol-dflash
--drafter DIR`, 3 prompts, 64 tokens). Not adopted.

Imports specdiff's library only; no CLI state. Run by gpu.sh on the device (PYTHONPATH=.)."""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy
import torch
from safetensors.numpy import save_file as save_numpy
from safetensors.torch import load_file, save_file

from specdiff.drafters.dflash import DFlashDrafter
from specdiff.loading import load_target
from specdiff.nets.dflash import load_dflash, save_dflash
from specdiff.sampling import Sampling
from specdiff.training.checkpoints import TrainState
from specdiff.training.config import DistillConfig
from specdiff.training.dflash import DFlashTask
from specdiff.training.loop import train
from specdiff.training.reading import Corpus, corpus
from specdiff.training.teacher import HELD_OUT, Sequences, chat_prompts, continue_batch
from specdiff.vocab import load_draft_vocab

TARGET = "smollm2-135m-instruct"
P, L, K = 96, 128, 32  # prompt tokens, answer tokens, soft labels: answers.sh's
TEACHERS = (Sampling(0.0), Sampling(0.7, top_p=0.95), Sampling(1.0, top_p=0.95))
SHARD = "15MB"  # the device tool returns files of at most 16 MiB
VAL_QUESTIONS = 256


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def digest(model: torch.nn.Module) -> str:
    """sha256 over the target's parameters (name, then fp32 bytes), in name order."""
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def answers(target: Any, drafter: DFlashDrafter, ids: torch.Tensor, pad: torch.Tensor, batch: int,
            deadline: float, seed: int) -> tuple[Sequences, torch.Tensor]:
    """The target's answers to the questions (Q, P) left-padded by pad (Q,), `batch` at a time in a
    seeded order, teacher settings alternating per call, until `deadline` (at least one call) ->
    (Sequences (M, P + L) with soft labels, features (M, P + L, F) fp16 on the host)."""
    order = torch.randperm(len(ids), generator=torch.Generator().manual_seed(seed))
    seqs, feats, done = [], [], 0
    for call, start in enumerate(range(0, len(ids), batch)):
        if call and time.perf_counter() > deadline:
            break
        rows = order[start:start + batch]
        g = torch.Generator(target.device).manual_seed(seed * 1_000_003 + call)  # draws stay on the GPU
        s, f = continue_batch(target.model, ids[rows].to(target.device), L, target.vocab_size,
                              TEACHERS[call % len(TEACHERS)], g, None, K, pad[rows], target.eos_token_id,
                              drafter.target_layer_ids)
        assert f is not None
        seqs.append(s.cpu())
        feats.append(f)
        done += len(rows)
        log(f"answers: {done} of {len(ids)} questions")
    return Sequences.cat(seqs), torch.cat(feats)


class GPUTask(DFlashTask):
    """DFlashTask with the loss under bf16 autocast (on the CPU too, where gpu.py is rehearsed);
    each validation that is the best so far writes the weights as shards under `shards`, so what
    returns is the best validated drafter (the starting one, validated at step 0, included)."""

    shards: Path
    state: TrainState  # the loop's, whose step a validation is at
    best: tuple[int, float] = (-1, math.inf)  # (the step of the best validation, its loss)

    def loss(self, batch: Any) -> torch.Tensor:
        with torch.autocast(torch.device(self.cfg.device).type, dtype=torch.bfloat16):
            return super().loss(batch)

    def validation(self) -> float:
        value = super().validation()
        if value < self.best[1]:
            write_shards(self.module, self.shards)
            self.best = (self.state.step, value)
        return value


def write_shards(drafter: DFlashDrafter, out: Path) -> None:
    """The drafter's weights (fp32) as safetensors shards of at most SHARD plus their index, each
    file written beside its name and renamed."""
    from huggingface_hub import split_torch_state_dict_into_shards

    state = {k: v.detach().float().cpu().contiguous() for k, v in drafter.net.state_dict().items()}
    split = split_torch_state_dict_into_shards(state, max_shard_size=SHARD)
    out.mkdir(parents=True, exist_ok=True)
    for name, keys in split.filename_to_tensors.items():
        save_file({k: state[k] for k in keys}, str(out / f".{name}"), metadata={"format": "pt"})
        (out / f".{name}").rename(out / name)
    index = {"metadata": {}, "weight_map": split.tensor_to_filename}
    (out / ".index.json").write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    (out / ".index.json").rename(out / "model.safetensors.index.json")


def merge(shards: Path, drafter: Path, out: Path) -> None:
    """Returned shards + the drafter they were trained from (config, map) -> out, a DFlash checkpoint
    in fp32 that load_dflash reads and `specdiff distill --drafter` continues."""
    index = json.loads((shards / "model.safetensors.index.json").read_text(encoding="utf-8"))
    state: dict[str, torch.Tensor] = {}
    for name in sorted(set(index["weight_map"].values())):
        state.update(load_file(str(shards / name)))
    net, spec = load_dflash(drafter)
    net.load_state_dict(state, strict=True)
    out.mkdir(parents=True, exist_ok=True)
    save_dflash(out, net, spec)
    vocab = load_draft_vocab(drafter)
    if vocab is not None:
        vocab.save(out)


def run(args: argparse.Namespace) -> dict[str, Any]:
    t0 = time.perf_counter()
    dev = args.device
    target = load_target(TARGET, device=dev, dtype="fp32")  # "auto" is fp16 on CUDA: another teacher
    target.model.requires_grad_(False)
    found = digest(target.model)
    if args.expect_digest and found != args.expect_digest:
        raise SystemExit(f"gpu.py: the target's weights differ from the CPU's (digest {found}); not training")
    log(f"target loaded in {time.perf_counter() - t0:.1f} s, digest {found[:16]}")
    net, spec = load_dflash(Path(args.drafter))
    drafter = DFlashDrafter(net.float().train(), spec, source=args.drafter, draft_vocab=load_draft_vocab(Path(args.drafter)))
    drafter.bind_target(target.model)
    drafter.to(dev)

    ids, pad = chat_prompts(args.prompts, target.tokenizer, P)
    cut = int(len(ids) * (1 - HELD_OUT))
    t1 = time.perf_counter()
    val_seqs, val_f = answers(target, drafter, ids[cut:][:VAL_QUESTIONS], pad[cut:][:VAL_QUESTIONS],
                              args.batch, 0.0, args.seed + 1)
    train_seqs, train_f = answers(target, drafter, ids[:cut], pad[:cut], args.batch, t1 + args.generate_s, args.seed)
    gen_s = time.perf_counter() - t1
    tokens = (len(train_seqs) + len(val_seqs)) * L
    log(f"answers: {len(train_seqs)} + {len(val_seqs)} held out, {tokens / gen_s:.0f} tokens/s")
    save_numpy({"ids": train_seqs.ids.numpy().astype(numpy.uint16)}, str(args.out / "answers.safetensors"))

    pad_id, eos = target.tokenizer.pad_token_id, target.eos_token_id
    gamma = drafter.block_size - 1
    sets = [corpus(s, f.to(dev), pad_id, P, gamma, eos) for s, f in ((train_seqs, train_f), (val_seqs, val_f))]
    cfg = DistillConfig(target=TARGET, out=str(args.work), prompts=args.prompts, method="dflash", chat=True,
                        anchors=args.anchors, batch_size=args.batch_size, lr=args.lr, loss="ce+kl", gamma=gamma,
                        soft_labels=K, val_every=10**9, checkpoint_every=10**9, device=dev, seed=args.seed)
    task = GPUTask(drafter, sets[0], sets[1], P, cfg)
    task.shards = args.out / "shards"
    step_s = time_step(task, cfg)
    positions = int((sets[0].limits - P).clamp(min=0).sum())  # anchors the answers offer
    steps = max(1, min(int(args.train_s / step_s), int(args.passes * positions / (args.batch_size * args.anchors))))
    cfg = replace(cfg, max_steps=steps, time_budget=args.train_s, val_every=max(1, steps // 20), checkpoint_every=steps)
    task.cfg = cfg
    task.state = state = TrainState()
    state.history.append([0, task.validation()])
    log(f"training: {step_s * 1000:.0f} ms a step, {steps} steps, val {state.history[0][1]}")
    opt = torch.optim.AdamW(drafter.parameters(), lr=cfg.lr)
    train(task, opt, state, cfg, progress=False)  # the best validation's weights are in the shards
    return {"device": torch.cuda.get_device_name() if dev.startswith("cuda") else dev, "torch": torch.__version__,
            "transformers": __import__("transformers").__version__, "target_digest": found,
            "answers": {"train": len(train_seqs), "held_out": len(val_seqs), "seconds": round(gen_s, 1),
                        "tokens_per_s": round(tokens / gen_s), "batch": args.batch},
            "training": {"steps": state.step, "planned_steps": steps, "anchor_positions": positions,
                         "best_val": {"step": task.best[0], "loss": task.best[1]}, "step_ms": round(step_s * 1000, 1),
                         "batch_size": cfg.batch_size, "anchors": cfg.anchors, "lr": cfg.lr,
                         "scored_slots": state.tokens, "seconds": round(state.train_s, 1),
                         "val_loss": state.history},
            "wall_s": round(time.perf_counter() - t0, 1)}


def time_step(task: DFlashTask, cfg: DistillConfig, n: int = 5) -> float:
    """Seconds per training step (forward, backward; no update), after one warm-up step."""
    g = torch.Generator().manual_seed(cfg.seed + 1)
    for i in range(n + 1):
        if i == 1:
            sync(cfg.device)
            start = time.perf_counter()
        task.loss(task.batch(cfg.batch_size, g)).backward()
    sync(cfg.device)
    task.module.zero_grad(set_to_none=True)
    return (time.perf_counter() - start) / n * 1.15  # the optimizer's update on top


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--digest", action="store_true", help="print the target's weights digest and stop")
    ap.add_argument("--merge", nargs=3, metavar=("SHARDS", "DRAFTER", "OUT"), help="returned shards -> checkpoint")
    ap.add_argument("--drafter", help="the DFlash drafter trained on (its map kept)")
    ap.add_argument("--prompts", help="questions, one a line (build/smol/questions-large.txt)")
    ap.add_argument("--out", type=Path, help="what comes back: report, log, shards, answers' ids")
    ap.add_argument("--work", type=Path, default=Path("/tmp/specdiff-gpu"), help="checkpoints with optimizer state")
    ap.add_argument("--expect-digest", default=None)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--generate-s", type=float, default=180.0)
    ap.add_argument("--train-s", type=float, default=180.0)
    ap.add_argument("--passes", type=float, default=2.0, help="at most this many anchors drawn per answer position")
    ap.add_argument("--batch", type=int, default=512, help="questions a generation call")
    ap.add_argument("--batch-size", type=int, default=256, help="answers a training step")
    ap.add_argument("--anchors", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--seed", type=int, default=100)
    ap.add_argument("--threads", type=int, default=8, help="torch CPU threads (sampling on the host)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.digest:
        print(digest(load_target(TARGET).model))
        return
    if args.merge:
        merge(*map(Path, args.merge))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    report = run(args)
    (args.out / "report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({k: report[k] for k in ("device", "answers", "wall_s")}))
    print(json.dumps({k: v for k, v in report["training"].items() if k != "val_loss"}), report["training"]["val_loss"][-3:])


if __name__ == "__main__":
    main()
