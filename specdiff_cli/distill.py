"""`specdiff distill`."""

from __future__ import annotations

import math
import os
import stat
import sys
from typing import Any

import click

from specdiff.requests import MAX_THREADS


class NumberList(click.ParamType[tuple[Any, ...]]):
    """Comma-separated numbers of one kind -> a tuple (ranges are checked by the library):
    NumberList(float) refuses nan and inf, NumberList(int) anything not an integer."""

    name = "LIST"

    def __init__(self, kind: type[int] | type[float]):
        self.kind = kind
        self.what = "integers" if kind is int else "numbers"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple[Any, ...]:
        if isinstance(value, tuple):
            return value
        try:
            numbers = tuple(self.kind(v) for v in str(value).split(","))
        except ValueError:
            self.fail(f"{value!r} is not a comma-separated list of {self.what}", param, ctx)
        if not all(math.isfinite(n) for n in numbers):
            self.fail(f"{value!r} is not a list of finite numbers", param, ctx)
        return numbers


class Finite(click.FloatRange):
    """A float option in a range that also refuses nan and inf (nan passes every comparison)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


MAX_TEXT_BYTES = 2**30  # --prompts and --raw-text are read whole, then tokenized


def _text_file(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Refuse a text file distill could not read whole: /dev/zero (or any device or pipe) was read
    until memory ran out, a MemoryError traceback; a regular file is judged by its size."""
    if value is None or not os.path.exists(value):
        return value  # missing: the library says so
    status = os.stat(value)
    if stat.S_ISDIR(status.st_mode):
        raise click.BadParameter(f"{value} is a directory", ctx, param)
    if not stat.S_ISREG(status.st_mode):
        raise click.BadParameter(f"{value} is not a regular file: distill reads it whole (write it to a file "
                                 "first)", ctx, param)
    if status.st_size > MAX_TEXT_BYTES:
        raise click.BadParameter(f"{value} holds {status.st_size / 2**20:,.1f} MiB; distill reads it whole (at "
                                 f"most {MAX_TEXT_BYTES >> 20:,} MiB): use a sample of it", ctx, param)
    return value


@click.command()
@click.option("--target", required=True, help="Target model: models.yaml name, directory or hub id.")
@click.option("--out", required=True, metavar="DIR", help="Output: the drafter, report.json, data/, checkpoints/.")
@click.option("--method", type=click.Choice(["specdiff", "dflash", "eagle3"]), default="specdiff", show_default=True,
              help="The drafter trained: a masked-diffusion drafter (specdiff), or one reading the target's hidden "
                   "states: a DFlash drafter (dflash: the target's width, a block of gamma + 1) or an EAGLE-3 head "
                   "(eagle3: one layer of the target's width, in the published format).")
@click.option("--target-layers", type=NumberList(int), metavar="LIST",
              help="dflash, eagle3: the target layers (0-based) whose outputs the drafter reads [default: the "
                   "DFlash rule; EAGLE-3's three: 1, N/2 - 1, N - 4].")
@click.option("--unroll", type=int, metavar="K",
              help="eagle3: training-time-test steps; steps 2..K feed the head its own output [default: 7].")
@click.option("--anchors", type=int, default=4, show_default=True,
              help="dflash: blocks drawn from each sequence of a batch.")
@click.option("--draft-vocab", type=int, metavar="N",
              help="dflash, eagle3: the drafter's head scores only the N most frequent tokens of the target's answers "
                   "(its special tokens always kept); exact, a smaller head is a faster drafter.")
@click.option("--prompts", required=True, metavar="FILE", callback=_text_file,
              help="Text file; random windows of it are the prompts.")
@click.option("--chat", is_flag=True, help="--prompts holds one question a line; each goes through the target's "
              "chat template.")
@click.option("--prefill", is_flag=True, help="With --chat: --prompts is a JSONL file of {\"prompt\": question, "
              "\"answer\": text} lines; the target reads each answer (one forward pass a batch, no decoding loop) for "
              "its soft labels and features instead of answering. Its first --num-prompts "
              "usable rows train, its last ones (a tenth, at most 64) are held out.")
@click.option("--prompt-tokens", type=int, help="With --chat: prompts are left-padded to this many tokens "
              "(longer questions are left out) [default: 96].")
@click.option("--data", metavar="DIR", help="Teacher data cache [default: OUT/data]; runs with the same data "
              "settings may share one.")
@click.option("--more-data", metavar="DIRS", callback=lambda ctx, param, value: tuple(value.split(",")) if value else (),
              help="More teacher data caches (comma-separated, complete, made by the same target with the same "
                   "prompt and answer lengths and soft labels) trained on beside --data; --data's held-out "
                   "answers stay the validation set.")
@click.option("--data-only", is_flag=True, help="Build the teacher data cache (--data), then stop.")
@click.option("--from-target", is_flag=True, help="New drafter: the target's width, reading and writing through the "
              "target's own token embedding and output head (frozen).")
@click.option("--drafter", metavar="NAME", help="Start from this drafter (models.yaml name, directory or hub id), of "
              "the kind --method trains (else a new one, see --layers); a DFlash drafter keeps its target layers, "
              "block and draft vocabulary.")
@click.option("--layers", type=int, help="New drafter: DDiT blocks [default: 2].")
@click.option("--dim", type=int, help="New drafter: hidden size [default: 128].")
@click.option("--heads", type=int, help="New drafter: attention heads [default: 4].")
@click.option("--context", type=int, help="New drafter: context tokens N it sees [default: 32].")
@click.option("--mask-token", metavar="TOKEN", help="Use this token of the tokenizer (e.g. '<|mask|>') as mask id "
              "[default: one extra id].")
@click.option("--raw-text", metavar="FILE", callback=_text_file, help="Mix in raw text windows from this file.")
@click.option("--raw-fraction", type=Finite(0, 1), help="Share of raw text rows [default with --raw-text: 0.25].")
@click.option("--gamma", type=int, help="Draft length trained for [default: with --resume the checkpoint's, with "
              "--method dflash --drafter the drafter's, else 8].")
@click.option("--steps-per-draft", type=int, default=4, show_default=True, help="l2r denoising steps T trained for.")
@click.option("--num-prompts", type=int, default=512, show_default=True,
              help="Target continuations to generate (with --prefill: at most this many rows read).")
@click.option("--continuation-tokens", type=int, default=64, show_default=True, help="Tokens per continuation (L).")
@click.option("--teacher-temperature", type=NumberList(float), default="0", show_default=True,
              help="Target sampling for the continuations, 0 = greedy; a list (1,0.8) alternates settings by chunk.")
@click.option("--teacher-top-p", type=NumberList(float), default="1", show_default=True,
              help="Target top-p: one value, or one per --teacher-temperature.")
@click.option("--samples-per-prompt", type=int, default=1, show_default=True, help="Continuations of each prompt.")
@click.option("--soft-labels", type=int, default=0, show_default=True, metavar="K",
              help="Keep the target's K most likely tokens and probabilities at each position (--loss kl needs it).")
@click.option("--batch-size", type=int, default=32, show_default=True)
@click.option("--lr", type=Finite(min=0, min_open=True), default=5e-4, show_default=True, help="Peak learning rate.")
@click.option("--max-steps", type=int, default=1000, show_default=True)
@click.option("--time-budget", type=Finite(min=0, min_open=True), metavar="SECONDS", help="Stop training after this long.")
@click.option("--val-every", type=int, default=100, show_default=True, help="Validation loss every K steps.")
@click.option("--checkpoint-every", type=int, default=200, show_default=True)
@click.option("--eval-prompts", type=int, default=8, show_default=True, help="Held-out prompts for tau / alpha.")
@click.option("--loss", default="ce", show_default=True,
              help="Training loss: ce, mdlm, kl, streak or ce-streak (specdiff.training.losses.LOSSES); dflash, "
                   "eagle3: ce, kl or lk (-log acceptance, arXiv 2602.23881), or sums such as ce+kl+lk, per slot.")
@click.option("--draft-temperature", type=Finite(min=0, min_open=True), default=1.0, show_default=True,
              help="The drafter's softmax temperature in the streak losses (its deployment temperature).")
@click.option("--eval-temperature", type=Finite(min=0), default=1.0, show_default=True,
              help="tau / alpha are measured greedy and at this temperature.")
@click.option("--resume", is_flag=True, help="Continue from the newest checkpoint in DIR (and its cached data).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--threads", type=click.IntRange(min=1, max=MAX_THREADS), help="torch CPU threads.")
@click.option("--device", default="cpu", show_default=True, help="cpu, cuda, cuda:1, ...")
def distill(threads: int | None, **options: Any) -> None:
    """Train a drafter (diffusion, DFlash or EAGLE-3) on a target's own continuations of prompts.

    \b
    Examples:
      specdiff distill --target demo-target --prompts prompts/python-faq.txt --out d \\
          --mask-token '<|mask|>' --context 64 --time-budget 600
      specdiff distill --target smollm2-135m-instruct --chat --prompts prompts/smol-train.txt \\
          --from-target --dim 576 --heads 9 --out smol-drafter      # hours on a CPU: scripts/smol/build.sh
      specdiff distill --target gpt2 --prompts corpus.txt --out drafters/gpt2   # hub: network
      specdiff distill --method dflash --target smollm2-135m-instruct --chat --prompts prompts/smol-train.txt \\
          --layers 2 --heads 9 --gamma 7 --loss ce+kl --soft-labels 32 --out smol-dflash   # scripts/smol/build.sh
      specdiff distill --method eagle3 --target smollm2-135m-instruct --chat --prompts prompts/smol-train.txt \\
          --target-layers 1,14,27 --draft-vocab 8192 --loss ce+kl --soft-labels 32 --out smol-eagle3
      specdiff distill --method dflash --target smollm2-135m-instruct --chat --prefill --prompts pairs.jsonl \\
          --target-layers 1,14,27 --soft-labels 32 --data part --out run --data-only   # scripts/smol/prefill.sh
    """
    import torch

    from specdiff.requests import check_seed
    from specdiff.training.config import DistillConfig
    from specdiff.training.distill import distill as run

    check_seed(options["seed"])
    if threads is not None:
        torch.set_num_threads(threads)
    report = run(DistillConfig(**options), progress=sys.stderr.isatty())
    if options["data_only"]:
        click.echo(f"distill: {report['sequences']} sequences, {report['generated_tokens']} tokens generated "
                   f"in {report['generate_s']:.0f} s", err=True)
        click.echo(report["data"])
        return
    v, e, c = report["val_loss"], report["eval"], report["compute"]
    g, t = e["greedy"], e["sampled"]
    click.echo(f"distill: {c['steps']} steps, {c['train_tokens']} tokens, {c['wall_s']:.0f} s; "
               f"val loss {v['initial']:.3f} -> {v['final']:.3f}; tau {g['tau']:.3f} / {t['tau']:.3f}, "
               f"alpha {g['alpha']} / {t['alpha']} at temperature 0 / {t['temperature']:g} "
               f"on {e['prompts']} held-out prompts", err=True)
    click.echo(report["drafter"])
