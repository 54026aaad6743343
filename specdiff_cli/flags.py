"""Library errors name parameters (`truncate_prompt`), never command-line flags; the CLI shows them
as the flags that set them (--truncate-prompt). Also the value type of --gamma (an integer or auto)."""

from __future__ import annotations

import re

import click

PARAMETER = re.compile(r"`([a-z][a-z0-9_]*)`")
RENAMED = {"fmt": "format"}  # parameters whose flag is not their name (export's --format)


def to_flags(message: str) -> str:
    """'use `truncate_prompt` to keep its end' -> 'use --truncate-prompt to keep its end'."""
    return PARAMETER.sub(lambda m: "--" + RENAMED.get(m.group(1), m.group(1)).replace("_", "-"), message)


def gamma(text: str) -> int | str:
    """A --gamma value: an integer (the draft length, fixed) or `auto` (chosen each step). The
    library checks the bound (>= 1); ValueError: neither."""
    return text if text == "auto" else int(text)


class Gamma(click.ParamType):
    name = "INTEGER|auto"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> int | str:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        try:
            return gamma(str(value))
        except ValueError:
            self.fail(f"{value!r} is neither an integer nor auto", param, ctx)
