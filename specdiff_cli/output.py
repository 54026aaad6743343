"""Where results go: `-o PATH` and stdout.

A regular file (or a new path) is written atomically: to a temporary file beside it, renamed over
it only on success, so it is complete or untouched. Through a symlink, the link's target is the
file written; the link stays a link. Anything else (/dev/stdout, /dev/null, a FIFO, a terminal) is
written in place, never replaced. A read-only file, a directory, a missing parent directory or ''
is refused before any work. A failed write (disk full, `> /dev/full`, a closed stdout) is a
WriteError naming the output; a closed pipe stays a BrokenPipeError, which the CLI ends quietly.
"""

from __future__ import annotations

import os
import stat
import sys
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Callable, Iterator, TextIO, TypeVar

import click

from specdiff.atomic import create_beside, write_error
from specdiff.errors import UsageError, WriteError

T = TypeVar("T")


def check_output(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """Click callback: refuse an output path that cannot be written, before models load."""
    if value is None:
        return None
    if not value:
        raise click.BadParameter("the path is empty", ctx, param)
    try:
        _check_writable(value)
    except UsageError as e:
        raise click.BadParameter(str(e), ctx, param) from e
    return value


def _check_writable(path: str) -> None:
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:  # a new file, or a link to one: its directory must take it
        _check_directory(path, Path(os.path.realpath(path)).parent)
        return
    except OSError as e:
        raise UsageError(f"cannot write {path}: {e.strerror}") from e
    if stat.S_ISDIR(mode):
        raise UsageError(f"cannot write {path}: it is a directory")
    if stat.S_ISREG(mode) and not (mode & 0o222 and os.access(path, os.W_OK)):  # root passes os.access
        raise UsageError(f"cannot write {path}: it is read-only")


def _check_directory(path: str, parent: Path) -> None:
    if not parent.is_dir():
        raise UsageError(f"cannot write {path}: No such file or directory")
    if not os.access(parent, os.W_OK):
        raise UsageError(f"cannot write {path}: Permission denied")


def open_output(path: str) -> AtomicWriter | StreamWriter:
    """The writer for `path`, checked by check_output."""
    if _is_stdout(path):  # `-o /dev/stdout`, whatever stdout is (`>> file` keeps appending)
        return StreamWriter(path, sys.stdout, close=False)
    if not os.path.exists(path) or os.path.isfile(path):
        return AtomicWriter(path)
    try:
        return StreamWriter(path, open(path, "w", encoding="utf-8"))
    except OSError as e:
        raise UsageError(f"cannot write {path}: {e.strerror}") from e


def _is_stdout(path: str) -> bool:
    with suppress(OSError):
        return os.path.samestat(os.stat(path), os.fstat(1))
    return False


class AtomicWriter:
    """Text goes to a temporary file beside `path` (beside the target of a symlink), renamed over
    it only on commit; an existing file keeps its permissions."""

    def __init__(self, path: str):
        self.name = path
        self.path = Path(os.path.realpath(path))
        try:
            fd, self.tmp = create_beside(self.path)
            if self.path.exists():
                os.chmod(fd, stat.S_IMODE(self.path.stat().st_mode))
        except OSError as e:
            raise UsageError(f"cannot write {path}: {e.strerror}") from e
        self.file = os.fdopen(fd, "w", encoding="utf-8")

    def write(self, text: str) -> None:
        try:
            self.file.write(text)
        except OSError as e:
            raise write_error(self.name, e) from e

    def commit(self) -> None:
        try:
            self.file.close()
            os.replace(self.tmp, self.path)
        except OSError as e:
            raise write_error(self.name, e) from e

    def discard(self) -> None:
        """Drop the temporary file (a no-op once committed)."""
        with suppress(OSError):
            self.file.close()
        self.tmp.unlink(missing_ok=True)


class StreamWriter:
    """Text written in place, each piece flushed (a reader sees it at once); nothing to undo."""

    def __init__(self, name: str, file: TextIO, close: bool = True):
        self.name, self.file, self.close = name, file, close

    def write(self, text: str) -> None:
        try:
            self.file.write(text)
            self.file.flush()
        except BrokenPipeError:
            raise
        except OSError as e:
            raise write_error(self.name, e) from e

    def commit(self) -> None:
        self.discard()

    def discard(self) -> None:
        if self.close:
            with suppress(OSError):
                self.file.close()


class _Stdout:
    """sys.stdout, whose failed writes are WriteErrors naming stdout (a BrokenPipeError stays one);
    `stream` None stands for a closed stdout."""

    def __init__(self, stream: TextIO | None):
        self.stream = stream

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)

    @property
    def closed(self) -> bool:
        return self.stream is None or self.stream.closed

    def isatty(self) -> bool:
        """A closed stdout is no terminal (asked before anything is written: --stream's default)."""
        return self.stream is not None and not self.stream.closed and self.stream.isatty()

    def write(self, s: str) -> int:
        return self._guard(lambda stream: stream.write(s))

    def flush(self) -> None:
        if self.stream is not None:  # a closed stdout holds nothing to flush (was an AttributeError)
            self._guard(lambda stream: stream.flush())

    def _guard(self, call: Callable[[TextIO], T]) -> T:
        if self.stream is None:
            raise WriteError("cannot write stdout: it is closed")
        try:
            return call(self.stream)
        except BrokenPipeError:
            raise
        except OSError as e:
            raise write_error("stdout", e) from e


def check_stdout(output: str | None) -> None:
    """Results go to stdout unless `output` (-o) is given: a closed stdout is refused before any
    work, not after minutes of decoding whose results have nowhere to go."""
    if output is None and (sys.stdout is None or sys.stdout.closed):
        raise WriteError("cannot write stdout: it is closed (write the results with -o PATH)")


@contextmanager
def guarded_stdout() -> Iterator[None]:
    """Within the block, a write to stdout that fails raises a WriteError; everything written is
    flushed before the block ends, so no error is left for the interpreter's exit."""
    real = sys.stdout
    if real is None:
        _hold_fd(1)
    sys.stdout = _Stdout(real)
    try:
        yield
        sys.stdout.flush()
    finally:
        sys.stdout = real


def _hold_fd(fd: int) -> None:
    """Put /dev/null on a closed `fd`, so that no file opened later takes its number."""
    null = os.open(os.devnull, os.O_WRONLY)
    if null != fd:
        os.dup2(null, fd)
        os.close(null)
