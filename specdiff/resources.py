"""The data that ships inside the package, under specdiff/data: models.yaml, the demo models it
names by `path:` (data/models/demo/{target,drafter,ar-drafter}) and the held-out prompts
(data/prompts/heldout.jsonl). Found through importlib.resources, so that a wheel or a
`pip install .` works from any directory, not only from a checkout.

Paths, not Traversables: models.yaml names the demo models by directories relative to itself, and
the loaders (transformers, safetensors) open files by name. importlib.resources.as_file cannot
extract a directory before Python 3.12, so an install whose files are not on the file system (a
zipped package) is refused here with a clear error. pip installs a wheel's files as real files,
editable installs point at the checkout: in both, `files("specdiff")` is a pathlib.Path already.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from .errors import SpecdiffError


def data_path(*parts: str) -> Path:
    """The real path of a shipped file or directory, e.g. data_path("prompts", "heldout.jsonl")."""
    resource = files(__package__).joinpath("data", *parts)
    if not isinstance(resource, Path):
        raise SpecdiffError(f"specdiff's data ({resource}) is not on the file system: "
                            "install specdiff from a wheel or a directory, not from a zip")
    return resource
