"""Optional backends (onnxruntime, tensorrt, onnx) are imported on first use, never at start-up."""

from __future__ import annotations

from importlib import import_module
from types import ModuleType

from .errors import LoadError


def require(module: str, extra: str) -> ModuleType:
    """Import an optional backend, or raise one line saying which extra installs it."""
    try:
        return import_module(module)
    except ImportError as e:
        raise LoadError(f"{module} is not installed: pip install 'specdiff[{extra}]'") from e
