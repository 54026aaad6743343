"""The kinds of drafter are declared once (specdiff.kinds) and everything else reads them: the
tables that remain, each keyed by graph name (the exporters', the runtimes', the manifest format's,
the contract's, export validation's), hold exactly the graphs the kinds declare, and every method
needs a declared kind."""

from specdiff import artifacts, graphs
from specdiff.exporters.onnx import EXPORTERS
from specdiff.exporters.validate import SWEEPS
from specdiff.kinds import KINDS, get_kind
from specdiff.methods import METHODS
from specdiff.runtimes.models import GRAPHS
from specdiff.tools.bench.config import NEEDS
from specdiff.tools.bench.sweep import GRAPH_METHODS


def declared_graphs() -> set[str]:
    return {k.graph for k in KINDS if k.graph is not None}


def test_exporters_and_runtimes_hold_one_entry_per_declared_graph():
    assert set(EXPORTERS) == declared_graphs()
    assert set(GRAPHS) - {"target"} == declared_graphs()


def test_the_manifest_format_and_validation_know_every_declared_graph():
    assert set(artifacts.MODEL) - {"target"} == declared_graphs()
    assert set(artifacts.SIZES) - {"target"} == declared_graphs()
    assert set(SWEEPS) - {"target"} == declared_graphs()


def test_a_kind_without_a_graph_says_why():
    assert [k.name for k in KINDS if k.graph is None and not k.no_graph] == []


def test_kind_names_are_unique_and_the_catch_all_comes_last():
    names = [k.name for k in KINDS]
    assert len(set(names)) == len(names)
    assert [k.name for k in KINDS if k.detect({})] == [KINDS[-1].name]  # any causal LM: detected last


def test_every_method_needs_a_declared_kind_and_bench_reads_its_slot():
    for method in METHODS.values():
        if method.needs is not None:
            assert NEEDS[method.name] == get_kind(method.needs).slot


def test_the_graph_methods_are_those_whose_kind_has_a_graph():
    assert GRAPH_METHODS == ("ar", "specdiff", "dflash")


def test_a_drafter_record_names_its_graph():
    assert graphs.graph_kind("drafter", {}) == "drafter"  # a denoiser's record names no kind
    assert graphs.graph_kind("drafter", {"kind": "dflash"}) == "dflash"
    assert graphs.graph_kind("target", {"kind": "dflash"}) == "target"
