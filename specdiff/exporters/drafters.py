"""How `specdiff export` writes each drafter graph a kind declares (specdiff.kinds, `graph`): one
entry per graph name in EXPORTERS, which tests/test_kinds.py holds equal to the kinds' graphs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from specdiff.drafters.dflash import hidden_state_indices
from specdiff.graphs import GraphSpec

from .onnx import Graph, dflash_graph, drafter_graph, eagle3_graph
from .validate import DFLASH_SWEEP, DRAFTER_SWEEP, EAGLE3_SWEEP, Sweep, run_dflash_case, run_drafter_case, run_eagle3_case


@dataclass(frozen=True)
class GraphExporter:
    """A drafter graph's module, spec and manifest record, the target hidden states it reads (the
    target's graph outputs them), whether it needs its target to be exported, and its validation."""

    build: Callable[[Any, Any], tuple[Graph, GraphSpec, dict[str, Any]]]  # (drafter, target or None) -> module, spec, record
    sweep: Sweep  # what validation runs it on (exporters.validate)
    features: Callable[[Any], tuple[int, ...]] = lambda drafter: ()  # HF hidden_states indices it reads
    alone: str = ""  # why it cannot be exported without its target, of '{name}' ("": it can)


EXPORTERS = {
    "drafter": GraphExporter(lambda drafter, target: drafter_graph(drafter), Sweep(DRAFTER_SWEEP, run_drafter_case)),
    "dflash": GraphExporter(lambda drafter, target: dflash_graph(drafter, target.vocab_size),
                            Sweep(DFLASH_SWEEP, run_dflash_case), hidden_state_indices,
                            alone="DFlash drafter '{name}' drafts from its target's hidden states"),
    "eagle3": GraphExporter(lambda drafter, target: eagle3_graph(drafter), Sweep(EAGLE3_SWEEP, run_eagle3_case),
                            lambda drafter: tuple(i + 1 for i in drafter.layer_ids),
                            alone="EAGLE-3 drafter '{name}' drafts from its target's hidden states"),
}
