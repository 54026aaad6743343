"""Optional backends (onnxruntime, tensorrt, onnx) are imported on first use, never at start-up."""

from __future__ import annotations

import re
from importlib import import_module, metadata
from types import ModuleType

from .errors import LoadError


def require(module: str, extra: str) -> ModuleType:
    """Import an optional backend, or raise one line saying which extra installs it."""
    try:
        return import_module(module)
    except ImportError as e:
        raise LoadError(f"{module} is not installed: {install_hint(extra)}") from e


def install_hint(extra: str) -> str:
    """How to install an extra. specdiff is not on PyPI, so `pip install 'specdiff[extra]'` would
    fail: name the extra's own packages (from the installed distribution's metadata, right for a
    wheel and a checkout alike) and the checkout form."""
    checkout = f"pip install -e '.[{extra}]' from a checkout"
    packages = extra_packages(extra)
    return f"pip install {' '.join(repr(p) for p in packages)} (or {checkout})" if packages else checkout


def extra_packages(extra: str) -> list[str]:
    """The requirements of specdiff's `extra`, e.g. ['onnx>=1.17', ...]; [] when specdiff is not
    installed (imported from a source tree) or has no such extra."""
    try:
        requirements = metadata.requires("specdiff") or []
    except metadata.PackageNotFoundError:
        return []
    marker = re.compile(rf"""extra\s*==\s*["']{re.escape(extra)}["']""")
    return [r.split(";")[0].strip() for r in requirements if ";" in r and marker.search(r.split(";", 1)[1])]
