"""Outputs that appear complete or not at all."""

from __future__ import annotations

import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from .errors import UsageError


def check_new_directory(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"{out} exists and is not an empty directory")


@contextmanager
def new_directory(out: Path) -> Iterator[Path]:
    """Yield a temporary directory beside `out` that becomes `out` if the block succeeds."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        yield tmp
        tmp.chmod(0o755)  # mkdtemp made it private; the result is an ordinary directory
        if out.exists():
            out.rmdir()  # empty, checked by check_new_directory
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
