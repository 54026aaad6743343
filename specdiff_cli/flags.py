"""Library errors name parameters (`truncate_prompt`), never command-line flags; the CLI shows them
as the flags that set them (--truncate-prompt). Also the value type of --gamma and --tree (an integer or auto),
--pair's check against models.yaml and the bounds of generate's settings (check_setting), made
while the arguments are parsed: a bad value is refused before a command imports torch and
transformers (seconds)."""

from __future__ import annotations

import re
from typing import Mapping

import click

PARAMETER = re.compile(r"`([a-z][a-z0-9_]*)`")


def flag_names(command: click.Command) -> dict[str, str]:
    """What to_flags renames, read from the options themselves: each option's parameter name and
    its flag's own (export's `fmt` and `format`, bench's `others` and `also_drafter`) -> its flag
    (--format, --also-drafter), over `command` and, for a group, every command in it."""
    names: dict[str, str] = {}
    for sub in command.commands.values() if isinstance(command, click.Group) else ():
        names.update(flag_names(sub))
    for param in command.params:
        flag = next((opt for opt in param.opts if opt.startswith("--")), None)
        if isinstance(param, click.Option) and flag is not None and param.name:
            names[param.name] = names[flag[2:].replace("-", "_")] = flag
    return names


def to_flags(message: str, flags: Mapping[str, str]) -> str:
    """'use `truncate_prompt` to keep its end' -> 'use --truncate-prompt to keep its end', for
    the parameters that `flags` (flag_names) knows; any other name is left as written: torch's
    `weights_only` is torch's parameter, and no --weights-only flag exists to pass."""
    return PARAMETER.sub(lambda m: flags.get(m.group(1), m.group(0)), message)


def gamma(text: str) -> int | str:
    """A --gamma or --tree value: an integer (the draft length or tree size, fixed) or `auto`
    (chosen each step). The library checks the bound; ValueError: neither."""
    return text if text == "auto" else int(text)


class Gamma(click.ParamType[int | str]):
    name = "INTEGER|auto"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> int | str:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        try:
            return gamma(str(value))
        except ValueError:
            self.fail(f"{value!r} is neither an integer nor auto", param, ctx)


DEFAULT_PAIR = "the default pair (smol when installed, else demo)"  # registry.default_pair(), in --help


def check_pair(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A --pair callback: a name that is not a pair of models.yaml is a usage error now."""
    from specdiff.errors import UsageError
    from specdiff.registry import load_registry

    if value is not None:
        registry = load_registry()  # a broken models.yaml: its own error, not --pair's
        try:
            registry.pair(value)
        except UsageError as e:
            raise click.BadParameter(str(e), ctx, param) from None
    return value


def check_setting(ctx: click.Context, param: click.Parameter, value: object) -> object:
    """A callback for an option that sets a declared setting (settings.py) or the seed: its type
    and bound, checked now, in the library's words (a UsageError, as plan() would raise)."""
    from specdiff.requests import check_seed, check_settings

    if value is not None:
        check_seed(value) if param.name == "seed" else check_settings({str(param.name): value})
    return value
