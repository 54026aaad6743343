"""Outputs that appear complete or not at all.

A failed write (disk full, file too large, read-only file system) becomes a WriteError that names
the output; whatever the block left half-written is removed, also when the block is interrupted
by an exception such as KeyboardInterrupt.

A temporary file or directory (new_file, create_beside, new_directory, temp_directory) is hidden
beside its target and named for the process that writes it, `.<target>.<host>-<pid>-<random>.tmp`,
where <host> hashes the host name and pid namespace (a pid names a process only there). A process
killed outright (kill -9, power loss) cannot remove its own; the next one made in the same folder,
or remove_stale, removes each one of this host whose process no longer runs. Nothing else is ever
removed: not other names, not a running process's file or directory, not another host's.
Imports: errors.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import secrets
import shutil
import socket
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Iterator

from .errors import UsageError, WriteError

FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO}  # the storage failed, not the request
TEMP = re.compile(r"\..+\.([0-9a-f]{8})-([1-9][0-9]*)-[0-9a-f]{8}\.tmp")  # temp_path's names: host, pid


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
    """A new, hidden file beside `path`, named for this process (temp_path), made after removing
    those of processes that are gone; mode 0o666 less the umask as open() makes it: (fd, its path)."""
    remove_stale(path.parent)
    tmp = temp_path(path)
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


def host() -> str:
    """This host and pid namespace, hashed: where the pids in temp_path's names mean something."""
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:  # not Linux
        namespace = ""
    return hashlib.sha256(f"{socket.gethostname()} {namespace}".encode()).hexdigest()[:8]


def temp_path(path: Path) -> Path:
    """A new hidden name beside `path` that names this process (nothing is created)."""
    return path.with_name(f".{path.name}.{host()}-{os.getpid()}-{secrets.token_hex(4)}.tmp")


def running(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # no signal: only asks whether the process exists
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: another user's process
        return True
    return True


def remove_stale(folder: Path) -> None:
    """Remove what temp_path named in `folder` for processes of this host that no longer run."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    here = host()
    for entry in entries:
        match = TEMP.fullmatch(entry.name)
        if match and match[1] == here and not running(int(match[2])):
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                with suppress(OSError):
                    os.unlink(entry.path)


def temp_directory(path: Path) -> Path:
    """A new hidden directory beside `path`, named for this process (temp_path), made after
    removing those of processes that are gone. OSError if it cannot be made."""
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(path.parent)
    tmp = temp_path(path)
    tmp.mkdir()
    return tmp


def remove(path: Path) -> None:
    """Remove a file, link or directory tree, renamed to a temp_path first: removal interrupted
    halfway leaves a name that remove_stale clears, never a half entry under the old name."""
    trash = temp_path(path)
    path.rename(trash)
    if trash.is_dir() and not trash.is_symlink():
        shutil.rmtree(trash)
    else:
        trash.unlink()


@contextmanager
def new_directory(out: Path) -> Iterator[Path]:
    """Yield a temporary directory beside `out` (temp_directory) that becomes `out` if the block
    succeeds."""
    try:
        tmp = temp_directory(out)
    except OSError as e:
        raise write_error(out, e) from e
    try:
        yield tmp
        if out.exists():
            out.rmdir()  # empty, checked by check_new_directory
        tmp.rename(out)
    except OSError as e:
        if e.errno in FULL:
            raise write_error(out, e) from e
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
