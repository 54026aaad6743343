"""Entry point. Errors become one line on stderr: exit 2 for usage errors, 1 for runtime errors,
never a traceback. A closed stdout (`specdiff generate ... | head -1`) ends the command quietly
with exit 0.
"""

from __future__ import annotations

import os
import sys

import click

from specdiff import __version__

from .bench import bench
from .distill import distill
from .drafter import drafter
from .export import export
from .generate import generate
from .models import models


def _quiet_libraries() -> None:
    """transformers and huggingface_hub log warnings and draw bars ("Loading weights") on stderr;
    the CLI speaks only when something is wrong. Set here, not in the library, whose users own
    their logging. Downloads keep their bars on a terminal: a first run may fetch gigabytes."""
    from huggingface_hub import utils as hub_utils
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    hub_utils.logging.set_verbosity_error()
    if sys.stderr.isatty():
        hub_utils.enable_progress_bars()


def _fail(message: str, code: int):
    click.echo(f"specdiff: error: {message}", err=True)
    sys.exit(code)


class SpecdiffGroup(click.Group):
    """A group whose main() turns every user-facing error into one stderr line; CliRunner calls
    this same main(), so tests see exactly what a shell user sees."""

    def invoke(self, ctx):
        _quiet_libraries()
        try:
            return super().invoke(ctx)
        except BrokenPipeError:  # click's main() would exit 1 on it
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())  # the interpreter's final flush must not fail
            ctx.exit(0)

    def main(self, args=None, prog_name=None, standalone_mode=True, **extra):
        from specdiff.errors import SpecdiffError

        try:
            rv = super().main(args=args, prog_name=prog_name, standalone_mode=False, **extra)
        except click.ClickException as e:
            _fail(e.format_message().replace("\n", " "), e.exit_code)
        except click.Abort:
            _fail("aborted", 130)
        except SpecdiffError as e:
            _fail(str(e).replace("\n", " "), e.exit_code)
        except KeyboardInterrupt:
            _fail("interrupted", 130)
        sys.exit(rv if isinstance(rv, int) else 0)


@click.group(cls=SpecdiffGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="specdiff")  # the code running, not whichever metadata is found first
def cli():
    """specdiff: faster LLM generation, token for token the target's own, by speculative
    decoding with discrete-diffusion drafters.

    \b
    Examples:
      specdiff models
      specdiff drafter init --target gpt2 --out my-drafter
      specdiff generate --target gpt2-xl --drafter mdlm-owt --prompt "The meaning of life"
      cat prompts.txt | specdiff generate --pair gpt2-xl+gpt2 --jsonl | jq .text
    """


cli.add_command(generate)
cli.add_command(models)
cli.add_command(drafter)
cli.add_command(export)
cli.add_command(bench)
cli.add_command(distill)


def main() -> None:
    cli.main(prog_name="specdiff")
