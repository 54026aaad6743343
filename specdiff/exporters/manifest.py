"""What a manifest records beyond the graphs: the source models (with the sha256 of each of their
files) and the versions of the tools that made the export."""

from __future__ import annotations

from importlib import metadata
from typing import Any

from specdiff.artifacts import file_hashes, model_directory, model_identity
from specdiff.errors import LoadError
from specdiff.loading import resolve
from specdiff.registry import Registry

# tool -> distributions that provide it (the first installed one is recorded)
TOOLS = {"specdiff": ("specdiff",), "torch": ("torch",), "transformers": ("transformers",),
         "onnx": ("onnx",), "onnxscript": ("onnxscript",), "onnxruntime": ("onnxruntime", "onnxruntime-gpu"),
         "tensorrt": ("tensorrt", "tensorrt-cu13", "tensorrt-cu12")}


def _version(distributions: tuple[str, ...]) -> str | None:
    for name in distributions:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def tool_versions() -> dict[str, str | None]:
    return {tool: _version(dists) for tool, dists in TOOLS.items()}


def source_record(name: str, kinds: tuple[str, ...], registry: Registry) -> dict[str, Any]:
    """{"name", "source" (directory or hub id), "files": {path: sha256}, "identity" (one sha256
    of its config and weights: artifacts.model_identity)} of a model as loaded."""
    source, entry = resolve(name, kinds, registry)
    directory = model_directory(source)
    if directory is None:
        raise LoadError(f"cannot find the local files of '{source}' to record their hashes")
    files = file_hashes(directory)
    return {"name": entry.name if entry else name, "source": source, "files": files,
            "identity": model_identity(files)}
