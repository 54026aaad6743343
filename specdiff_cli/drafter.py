"""`specdiff drafter ...`: make and convert drafter checkpoints."""

from __future__ import annotations

import click


@click.group()
def drafter() -> None:
    """Create and convert drafters."""


@drafter.command("init")
@click.option("--target", required=True, help="Target whose tokenizer the drafter shares.")
@click.option("--out", required=True, metavar="DIR", help="New drafter directory.")
@click.option("--layers", default=2, show_default=True, type=int)
@click.option("--dim", default=128, show_default=True, type=int)
@click.option("--heads", default=4, show_default=True, type=int)
@click.option("--context", default=32, show_default=True, type=int, help="Context tokens the drafter sees (N).")
@click.option("--seed", default=0, show_default=True, type=int)
def init(target: str, out: str, layers: int, dim: int, heads: int, context: int, seed: int) -> None:
    """A randomly initialised drafter whose vocabulary is the target's plus one mask id."""
    from specdiff.tools.drafter_init import init_drafter

    path = init_drafter(target, out, layers=layers, dim=dim, heads=heads, context=context, seed=seed)
    click.echo(str(path))


@drafter.command("convert")
@click.argument("src")
@click.option("--out", required=True, metavar="DIR",
              help="New drafter directory (the project's format for a diffusion drafter; a DFlash or AR "
                   "drafter keeps its own).")
@click.option("--dtype", type=click.Choice(["fp32", "fp16"]), default="fp32", show_default=True,
              help="fp32 is lossless; fp16 halves the size.")
@click.option("--context", type=int, default=None, metavar="N",
              help="Context tokens the drafter sees (default: the source's; 960 for SEDD/MDLM hub models).")
@click.option("--draft-vocab", type=int, default=None, metavar="N",
              help="Keep only the N most frequent target tokens of --frequencies as the head's rows "
                   "(any drafter kind; exact: the target still verifies over its whole vocabulary).")
@click.option("--frequencies", default=None, metavar="FILE",
              help="What --draft-vocab counts: a `specdiff distill` teacher-data directory (the target's "
                   "answers) or a counts .safetensors.")
@click.option("--vocab-map", default=None, metavar="FILE",
              help="A draft vocabulary made elsewhere, instead of --draft-vocab: EAGLE-3's d2t/t2d (.safetensors) "
                   "or SGLang's --speculative-token-map (.pt, hot ids).")
@click.option("--target", default=None, help="Target whose tokenizer the tokens are counted with (needed for a "
                                             "drafter that carries none, as DFlash drafts).")
def convert(src: str, out: str, dtype: str, context: int | None, draft_vocab: int | None, frequencies: str | None,
            vocab_map: str | None, target: str | None) -> None:
    """Convert a drafter to a new directory: a diffusion drafter (SEDD hub, MDLM HF or project
    format) to the project's format; with --draft-vocab, any drafter (diffusion, DFlash, AR) with a
    map of its head's N rows.

    \b
    SRC is a models.yaml name, a directory or a hub id, e.g.
      specdiff drafter convert mdlm-owt --out drafters/mdlm-owt
      specdiff drafter convert ./sedd-small-download --out drafters/sedd-small --dtype fp16
      specdiff drafter convert smol-dflash-drafter --target smollm2-135m-instruct --dtype fp16 \\
          --draft-vocab 8192 --frequencies build/smol/data --out dflash-8k
    """
    from specdiff.tools.convert import convert_drafter

    click.echo(str(convert_drafter(src, out, dtype=dtype, context=context, draft_vocab=draft_vocab,
                                   frequencies=frequencies, vocab_map=vocab_map, target=target)))
