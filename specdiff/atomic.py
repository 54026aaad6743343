"""Outputs that appear complete or not at all.

A failed write (disk full, file too large, read-only file system) becomes a WriteError that names
the output; whatever the block left half-written is removed, also when the block is interrupted
by an exception such as KeyboardInterrupt.
"""

from __future__ import annotations

import errno
import os
import secrets
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from .errors import UsageError, WriteError

FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO}  # the storage failed, not the request


def write_error(path: Path | str, e: OSError) -> WriteError:
    return WriteError(f"cannot write {path}: {e.strerror or e}")


def umask() -> int:
    """The process's umask (read by setting it: there is no other portable way)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def check_new_directory(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"{out} exists and is not an empty directory")


def create_beside(path: Path) -> tuple[int, Path]:
    """A new, hidden file beside `path`, mode 0o666 less the umask as open() makes it: (fd, its path)."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp


@contextmanager
def new_file(path: Path) -> Iterator[Path]:
    """Yield a temporary path beside `path` (an empty file) that replaces `path` if the block succeeds."""
    try:
        fd, tmp = create_beside(path)
        os.close(fd)
    except OSError as e:
        raise write_error(path, e) from e
    try:
        yield tmp
        tmp.replace(path)
    except OSError as e:
        raise write_error(path, e) from e
    finally:
        tmp.unlink(missing_ok=True)


@contextmanager
def new_directory(out: Path) -> Iterator[Path]:
    """Yield a temporary directory beside `out` that becomes `out` if the block succeeds."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    except OSError as e:
        raise write_error(out, e) from e
    try:
        yield tmp
        tmp.chmod(0o777 & ~umask())  # mkdtemp made it private; the result is an ordinary directory
        if out.exists():
            out.rmdir()  # empty, checked by check_new_directory
        tmp.rename(out)
    except OSError as e:
        if e.errno in FULL:
            raise write_error(out, e) from e
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
