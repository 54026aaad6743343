"""The kinds of drafter, one declaration each (kind.DrafterKind), and KINDS, in detection order:

    block.py           an SDAR block-diffusion model (simsd-exact's draft model)
    dflash.py          a DFlash draft: a block from the target's hidden states (graph "dflash")
    eagle3.py          an EAGLE-3 head: a chain from the target's fused hidden states (graph "eagle3")
    a2d.py             dllm's masked-diffusion Qwen3, drafting as a diffusion drafter
    diffusion.py       a DDiT denoiser in any of its formats (graph "drafter"; compiles)
    autoregressive.py  any causal LM (spec-ar): what no other kind detects

Loading (detect, load), pairing (check, tokens, bind), the method registry (Method.needs names a
kind), `--compile`, `drafter convert` (converting), the manifest and `specdiff export` and the
runtimes (the graph: its contract here, and one entry keyed by its name in
exporters.drafters.EXPORTERS and runtimes.models.GRAPHS) and bench (the slot) read these
declarations. A new kind is its net, its module here and one line of KINDS; a drafter given as an
object is of the first kind that holds it.

May import: sources, the drafters, nets and targets, vocab, hub, graphs, artifacts, errors; not
loading, the methods, generation or compiled (which read this).
"""

from __future__ import annotations

from ..errors import UsageError
from ..graphs import DrafterGraph
from ..sources import Source
from . import a2d, autoregressive, block, dflash, diffusion, eagle3
from .kind import Compiling, Converting, DrafterKind

KINDS: tuple[DrafterKind, ...] = (block.KIND, dflash.KIND, eagle3.KIND, a2d.KIND, diffusion.KIND,
                                  autoregressive.KIND)
__all__ = ["KINDS", "Compiling", "Converting", "DrafterKind", "detected", "drafter_graph", "drafter_graphs", "get_kind",
           "kind_of"]


def get_kind(name: str) -> DrafterKind:
    try:
        return next(k for k in KINDS if k.name == name)
    except StopIteration as e:
        raise UsageError(f"unknown drafter kind '{name}' (choose from {', '.join(k.name for k in KINDS)})") from e


def kind_of(drafter: object) -> DrafterKind | None:
    """The first kind that holds a loaded drafter (None: no drafter specdiff knows)."""
    return next((k for k in KINDS if k.holds(drafter)), None)


def detected(source: Source) -> DrafterKind:
    """The kind of the checkpoint at `source`: a models.yaml `format:` names a diffusion format,
    else the first kind whose detect() accepts its config.json."""
    if source.format:
        return diffusion.KIND
    config = source.config()
    return next(k for k in KINDS if k.detect(config))


def drafter_graphs() -> dict[str, DrafterGraph]:
    """{graph name: its declaration} of every kind that is exported (the manifest's drafter graphs)."""
    return {k.graph.name: k.graph for k in KINDS if k.graph is not None}


def drafter_graph(name: str) -> DrafterGraph:
    """The drafter graph of that name (a ValueError naming the known ones: a manifest's record)."""
    graphs = drafter_graphs()
    if name not in graphs:
        raise ValueError(f"unknown drafter graph {name!r} (known: {', '.join(graphs)})")
    return graphs[name]
