"""Entry point. Errors become one line on stderr: exit 2 for usage errors, 1 for runtime errors
(a failed write among them: disk full, `> /dev/full`), never a traceback; the library's warnings
one line each, `specdiff: warning: ...`. A stderr that takes no line (`2> /dev/full`) changes no
exit code. A closed pipe on stdout (`specdiff generate ... | head -1`) ends the command quietly
with exit 0. SIGTERM and SIGHUP become an exception, so that every `finally` removes its temporary
files, and exit 128 + signum. Bare `specdiff` prints the help (on stderr, exit 2).
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import warnings
from contextlib import contextmanager
from types import FrameType
from typing import Any, Iterator, Mapping, NoReturn, Sequence

import click

from specdiff import __version__

from .bench import bench
from .distill import distill
from .drafter import drafter
from .export import export
from .flags import flag_names, to_flags
from .generate import generate
from .models import models
from .tune import tune
from .output import guarded_stdout

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def _quiet_libraries() -> None:
    """transformers and huggingface_hub log warnings and draw bars ("Loading weights") on stderr;
    the CLI speaks only when something is wrong. Set here, not in the library, whose users own
    their logging. Downloads keep their bars on a terminal: a first run may fetch gigabytes."""
    from huggingface_hub import utils as hub_utils
    from huggingface_hub.utils.tqdm import enable_progress_bars
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    hub_utils.logging.set_verbosity_error()
    if sys.stderr.isatty():
        enable_progress_bars()


@contextmanager
def _warnings_as_lines(flags: Mapping[str, str]) -> Iterator[None]:
    """Every SpecdiffWarning is one stderr line, each time the library warns, its parameters shown
    as `flags` (flag_names); other warnings are shown as Python shows them."""
    from specdiff.errors import SpecdiffWarning

    with warnings.catch_warnings():
        shown = warnings.showwarning

        def show(message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any) -> None:
            if not issubclass(category, SpecdiffWarning):
                return shown(message, category, *args, **kwargs)
            _say(f"specdiff: warning: {to_flags(str(message), flags)}".replace("\n", " "))

        warnings.showwarning = show
        warnings.simplefilter("always", SpecdiffWarning)
        yield


def _quiet_when_run(command: click.Command) -> click.Command:
    """Quiet the libraries when a command runs, not when it only prints its help or refuses its
    arguments: those then import neither transformers nor huggingface_hub (about a second)."""
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            _quiet_when_run(sub)
    elif command.callback is not None:
        run = command.callback

        @functools.wraps(run)
        def quiet_run(*args: Any, **kwargs: Any) -> Any:
            _quiet_libraries()
            return run(*args, **kwargs)

        command.callback = quiet_run
    return command


def _fail(message: str, code: int) -> NoReturn:
    _say(f"specdiff: error: {message}")
    sys.exit(code)


def _say(text: str) -> None:
    """text on stderr, if stderr takes it: the exit code (2 for usage) must not depend on it
    (`2>/dev/full` made a usage error exit 1); what cannot be written is dropped."""
    try:
        click.echo(text, err=True)
        sys.stderr.flush()
    except OSError:
        pass


class Terminated(BaseException):
    """A stop signal, raised wherever the program is; not an Exception, so no `except Exception`
    swallows it."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _terminate(signum: int, frame: FrameType | None) -> NoReturn:
    for s in STOP_SIGNALS:
        signal.signal(s, signal.SIG_IGN)  # a second signal must not cut the cleanup short
    raise Terminated(signum)


@contextmanager
def _stop_signals_raise() -> Iterator[None]:
    previous = {s: signal.signal(s, _terminate) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _end_quietly(ctx: click.Context) -> NoReturn:
    """stdout is a closed pipe: exit 0, and let the interpreter's final flush go to /dev/null."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    ctx.exit(0)


class SpecdiffGroup(click.Group):
    """A group whose main() turns every user-facing error into one stderr line; CliRunner calls
    this same main(), so tests see exactly what a shell user sees."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        """No command: the help, as click >= 8.2 prints it (on stderr, exit 2), not a usage error
        flattened by main() into one line."""
        if not args and not ctx.resilient_parsing:
            _say(ctx.get_help())
            ctx.exit(2)
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            with guarded_stdout(), _warnings_as_lines(flag_names(self)):
                return super().invoke(ctx)
        except BrokenPipeError:  # click's main() would exit 1 on it
            _end_quietly(ctx)

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> NoReturn:
        from specdiff.errors import SpecdiffError

        try:
            with _stop_signals_raise():
                rv = super().main(args=args, prog_name=prog_name, complete_var=complete_var, standalone_mode=False,
                                  **extra)
        except click.ClickException as e:
            _fail(e.format_message().replace("\n", " "), e.exit_code)
        except click.Abort:
            _fail("aborted", 130)
        except SpecdiffError as e:
            _fail(to_flags(str(e), flag_names(self)).replace("\n", " "), e.exit_code)
        except KeyboardInterrupt:
            _fail("interrupted", 130)
        except Terminated as e:
            _fail(f"terminated by {signal.Signals(e.signum).name}", 128 + e.signum)
        except OSError as e:  # not foreseen by the code that met it; still one line
            _fail(f"{e.filename}: {e.strerror}" if e.filename else str(e), 1)
        sys.exit(rv if isinstance(rv, int) else 0)


@click.group(cls=SpecdiffGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="specdiff")  # the code running, not whichever metadata is found first
def cli() -> None:
    """specdiff: faster LLM generation, token for token the target's own, by speculative
    decoding with discrete-diffusion drafters.

    \b
    Examples:
      specdiff models
      echo "What does zip() do?" | specdiff generate --stats       # the default pair, offline
      specdiff bench --pair demo --num-prompts 8 --repeats 1 --check
      specdiff generate --target gpt2-xl --drafter mdlm-owt --prompt "The meaning of life"   # hub: network
    """


for command in (generate, drafter, export, bench, distill, tune):
    cli.add_command(_quiet_when_run(command))
cli.add_command(models)  # reads models.yaml only: loads no model, imports no transformers


def main() -> None:
    cli.main(prog_name="specdiff")
