"""The kinds of drafter are declared once (specdiff.kinds) and everything else reads them: a
kind's graph is its contract (graphs.DrafterGraph: spec, manifest record, sizes) plus one entry
keyed by its name in each of the exporters' and the runtimes' tables, which hold exactly the
graphs the kinds declare; every method needs a declared kind; bench reads its slot."""

import json

import pytest

from specdiff import artifacts, graphs
from specdiff.errors import LoadError
from specdiff.exporters.drafters import EXPORTERS
from specdiff.kinds import KINDS, drafter_graph, drafter_graphs, get_kind
from specdiff.methods import METHODS
from specdiff.runtimes.models import GRAPHS
from specdiff.tools.bench.config import NEEDS
from specdiff.tools.bench.sweep import GRAPH_METHODS


def test_exporters_and_runtimes_hold_one_entry_per_declared_graph():
    assert set(EXPORTERS) == set(drafter_graphs())
    assert set(GRAPHS) - {"target"} == set(drafter_graphs())


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
    assert GRAPH_METHODS == ("ar", "specdiff", "dflash", "eagle3")


def test_a_drafter_record_names_its_graph():
    assert graphs.graph_kind("drafter", {}) == "drafter"  # a denoiser's record names no kind
    assert graphs.graph_kind("drafter", {"kind": "dflash"}) == "dflash"
    assert graphs.graph_kind("target", {"kind": "dflash"}) == "target"
    assert drafter_graph("dflash").target_axes and not drafter_graph("drafter").target_axes
    assert drafter_graph("eagle3").target_axes and graphs.graph_kind("drafter", {"kind": "eagle3"}) == "eagle3"


def test_a_manifest_naming_an_unknown_graph_is_refused(tmp_path):
    component = {"graph": None, "engine": None, "io": {"inputs": [], "outputs": []}, "model": {"kind": "eagle9"}}
    manifest = {"format": artifacts.FORMAT, "format_version": artifacts.FORMAT_VERSION, "dtype": "fp32", "files": {},
                "tokenizer": {"dir": "tokenizer", "vocab_size": 3, "vocab_sha256": "0"},
                "components": {"drafter": component}}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(LoadError, match=r"components\.drafter\.model\.kind: unknown drafter graph 'eagle9' "
                                        r"\(known: dflash, eagle3, drafter\)"):
        artifacts.read_manifest(tmp_path)
