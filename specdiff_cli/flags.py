"""Library errors name parameters (`truncate_prompt`), never command-line flags; the CLI shows them
as the flags that set them (--truncate-prompt)."""

from __future__ import annotations

import re

PARAMETER = re.compile(r"`([a-z][a-z0-9_]*)`")
RENAMED = {"fmt": "format"}  # parameters whose flag is not their name (export's --format)


def to_flags(message: str) -> str:
    """'use `truncate_prompt` to keep its end' -> 'use --truncate-prompt to keep its end'."""
    return PARAMETER.sub(lambda m: "--" + RENAMED.get(m.group(1), m.group(1)).replace("_", "-"), message)
