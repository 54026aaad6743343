"""Runtimes: execute the graphs `specdiff export` writes, behind one small protocol.

    specdiff.contracts.Runtime:
        limits: Limits | None                      # shapes it can serve (None: any)
        def run(self, inputs: dict[str, Tensor]) -> dict[str, Tensor]: ...

`specdiff.runtimes.models.GraphTarget` turns a target step graph into the specdiff.contracts.Target contract
(prefill / extend / rollback over explicit KV tensors), `GraphDrafter` a denoiser graph into
what DiffusionProposer uses and `GraphDFlashDrafter` a DFlash step graph into what methods.dflash
uses and `GraphEagle3Drafter` an EAGLE-3 step graph into what methods.eagle3 uses, so every
runtime decodes with the same Python sampling code.
PyTorch (`torch`) is the reference and needs no artefacts. Backends are imported lazily: a
missing one is one error line naming the extra that installs it.

May import: the rest of specdiff (its contracts, graphs and artifacts formats), which never imports
this package; not specdiff.exporters, the tools or specdiff_cli (tests/test_layout.py).
"""

from __future__ import annotations

import os
from importlib import import_module
from typing import TYPE_CHECKING, Any

from specdiff.contracts import Runtime
from specdiff.errors import UsageError

if TYPE_CHECKING:
    from specdiff.artifacts import Artifacts

    from .models import GraphDFlashDrafter, GraphDrafter, GraphEagle3Drafter, GraphTarget

    Loaded = GraphTarget | GraphDrafter | GraphDFlashDrafter | GraphEagle3Drafter

RUNTIMES = {"onnxruntime": "specdiff.runtimes.onnxruntime", "tensorrt": "specdiff.runtimes.tensorrt"}
CHOICES = ("torch", *RUNTIMES)
__all__ = ["CHOICES", "RUNTIMES", "Runtime", "load_models", "runtime_models"]


def load_models(runtime: str, artifacts: str | os.PathLike[str] | Artifacts, device: str = "cpu",
                sources: dict[str, str | None] | None = None,
                kinds: tuple[str, ...] = ("target", "drafter")) -> dict[str, Loaded]:
    """{"target": ..., "drafter": ...} for the components of `kinds` an export directory (a path
    or an opened Artifacts) holds, run by `runtime` ("onnxruntime" | "tensorrt") on `device`.
    sources: {"target" | "drafter": model name} the graphs stand in for (bench times them beside
    those models): a component exported from another model (config or weights differ) is refused."""
    from specdiff.artifacts import Artifacts, check_exported_from, open_artifacts

    from specdiff.graphs import graph_kind

    from .models import GRAPHS

    if not isinstance(runtime, str) or runtime not in RUNTIMES:
        raise UsageError(f"unknown runtime {runtime!r:.40} (choose from {', '.join(CHOICES)})")
    _check_device(device)
    backend = import_module(RUNTIMES[runtime])
    art = artifacts if isinstance(artifacts, Artifacts) else open_artifacts(artifacts)
    for kind, name in (sources or {}).items():
        if name is not None:
            check_exported_from(art, kind, name)
    return {kind: GRAPHS[graph_kind(kind, art.record(kind)["model"])].from_artifacts(
                art, backend.open_graph(art, kind, device), device)
            for kind in kinds if art.component(kind) is not None}


def _check_device(device: object) -> None:
    """A device torch can parse (whether this machine has it is the backend's to say)."""
    import torch

    from specdiff.requests import check_device_name

    check_device_name(device)
    try:
        torch.device(device)  # type: ignore[call-overload]  # a str or a torch.device, checked above
    except RuntimeError as e:
        raise UsageError(f"unknown device {device!r} (e.g. cpu, cuda, cuda:1)") from e


def runtime_models(runtime: str, artifacts: str | None,
                   options: dict[str, Any]) -> dict[str, Loaded]:
    """The `generate --runtime/--artifacts` options -> loaded target / drafter to pass to plan()
    in place of names (torch: nothing to load here)."""
    from specdiff.artifacts import open_artifacts

    if runtime == "torch":
        if artifacts:
            raise UsageError("`artifacts` needs `runtime` onnxruntime or tensorrt (torch loads `target`/`drafter`)")
        return {}
    if not artifacts:
        raise UsageError(f"`runtime` {runtime} needs `artifacts` DIR (written by `specdiff export`)")
    art = open_artifacts(artifacts)
    for kind in ("target", "drafter"):
        if art.component(kind) is not None and options.get(kind):
            raise UsageError(f"`{kind}` comes from `artifacts` with `runtime` {runtime}; drop `{kind}`")
    return load_models(runtime, art, options.get("device") or "cpu")
