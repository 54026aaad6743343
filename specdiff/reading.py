"""Small files the library reads whole (models.yaml, an export's manifest.json, a model's
config.json), bounded: one that never ends (/dev/zero, named by SPECDIFF_MODELS or linked in
place of a config) or that is far larger than any such file is an OSError (EFBIG) that the
reader reports in its one line, not a MemoryError after every byte of memory was taken.
Torch-free: models.yaml is read by `specdiff models`, which imports no torch. And files of any size
hashed in blocks (sha256_file), as an export's manifest and the GGUF cache record them.
"""

from __future__ import annotations

import errno
import hashlib
from pathlib import Path

MAX_SMALL_FILE = 64 * 2**20  # models.yaml, manifest.json and config.json are kilobytes
CHUNK = 1 << 20  # bytes hashed at a time


def read_small_text(path: Path, limit: int = MAX_SMALL_FILE) -> str:
    """The file's text (UTF-8), read whole; OSError(EFBIG) past `limit` bytes, UnicodeDecodeError
    if it is not UTF-8."""
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"larger than {limit >> 20} MiB, not a file of this kind", str(path))
    return data.decode("utf-8")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()
