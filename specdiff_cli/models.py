"""`specdiff models`."""

from __future__ import annotations

import json

import click


@click.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON object per entry.")
def models(as_json: bool) -> None:
    """List the models and pairs of models.yaml."""
    from specdiff.registry import PairEntry, load_registry

    registry = load_registry()
    for e in registry.entries.values():
        if isinstance(e, PairEntry):  # kind pair
            where = f"{e.target} + {e.drafter}" + (f"  {json.dumps(e.defaults)}" if e.defaults else "")
        else:
            where = e.where
        if as_json:
            click.echo(json.dumps({"name": e.name, "kind": e.kind, "source": str(where)}))
        else:
            click.echo(f"{e.name:32} {e.kind:8} {where}")
