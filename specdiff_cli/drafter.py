"""`specdiff drafter ...`: make and convert drafter checkpoints."""

from __future__ import annotations

import click


@click.group()
def drafter() -> None:
    """Create and convert diffusion drafters."""


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
@click.option("--out", required=True, metavar="DIR", help="New drafter directory (project format).")
@click.option("--dtype", type=click.Choice(["fp32", "fp16"]), default="fp32", show_default=True,
              help="fp32 is lossless; fp16 halves the size.")
@click.option("--context", type=int, default=None, metavar="N",
              help="Context tokens the drafter sees (default: the source's; 960 for SEDD/MDLM hub models).")
def convert(src: str, out: str, dtype: str, context: int | None) -> None:
    """Convert a diffusion drafter (SEDD hub, MDLM HF or project format) to the project's format.

    \b
    SRC is a models.yaml name, a directory or a hub id, e.g.
      specdiff drafter convert mdlm-owt --out drafters/mdlm-owt
      specdiff drafter convert ./sedd-small-download --out drafters/sedd-small --dtype fp16
    """
    from specdiff.tools.convert import convert_drafter

    click.echo(str(convert_drafter(src, out, dtype=dtype, context=context)))
