"""`specdiff drafter ...`: make and convert drafter checkpoints."""

from __future__ import annotations

import click


@click.group()
def drafter():
    """Create and convert diffusion drafters."""


@drafter.command("init")
@click.option("--target", required=True, help="Target whose tokenizer the drafter shares.")
@click.option("--out", required=True, metavar="DIR", help="New drafter directory.")
@click.option("--layers", default=2, show_default=True, type=int)
@click.option("--dim", default=128, show_default=True, type=int)
@click.option("--heads", default=4, show_default=True, type=int)
@click.option("--context", default=32, show_default=True, type=int, help="Context tokens the drafter sees (N).")
@click.option("--seed", default=0, show_default=True, type=int)
def init(target, out, layers, dim, heads, context, seed):
    """A randomly initialised drafter whose vocabulary is the target's plus one mask id."""
    from specdiff.drafters.init import init_drafter

    path = init_drafter(target, out, layers=layers, dim=dim, heads=heads, context=context, seed=seed)
    click.echo(str(path))
