"""The method registry: the torch-free names equal the registries, every method is identity-tested
or declared approximate, exactness is enforced from the proposer's own declaration, and the
decoding loops stream every token exactly once."""

from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from specdiff import acceptance, load_drafter, load_target, methods, names, selection, stream
from specdiff.drafters.autoregressive import ARProposer
from specdiff.drafters.diffusion import SCHEDULES
from specdiff.errors import UsageError
from specdiff.generation import generate, plan
from specdiff.methods import speculative
from specdiff.settings import DraftSettings
from specdiff.tools.bench import PASSES
from specdiff_cli.main import cli

PROMPTS = ["The quick brown fox", "To be, or not to be", "def main():"]


def test_torch_free_names_equal_the_registries():
    assert names.METHODS == tuple(methods.METHODS)
    assert names.RULES == tuple(dict.fromkeys([*acceptance.RULES, *selection.RULES]))
    assert names.SCHEDULES == tuple(SCHEDULES)
    assert (*names.METHODS, *names.PEERS) == tuple(PASSES)


def identity_lists(tests: Path = Path(__file__).parent) -> dict[str, tuple[str, ...]]:
    """{test module: its IDENTITY_TESTED}, the methods whose output its tests hold to a reference
    (greedy token identity, the target's distribution, block's output)."""
    lists = {}
    for path in sorted(tests.glob("test_*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["IDENTITY_TESTED"]:
                lists[path.name] = ast.literal_eval(node.value)
    return lists


def methods_run_by_tests(path: Path) -> set[str]:
    """The `method="..."` names the test functions of a module pass."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    tests = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]
    return {k.value.value for t in tests for k in ast.walk(t) if isinstance(k, ast.keyword)
            and k.arg == "method" and isinstance(k.value, ast.Constant)}


def untested(registry: dict[str, methods.Method], lists: dict[str, tuple[str, ...]]) -> set[str]:
    """Methods that claim exactness and that no identity test names."""
    named = {m for names_ in lists.values() for m in names_}
    return {name for name, m in registry.items() if m.exact and name not in named}


def test_every_method_is_identity_tested_or_declared_approximate(monkeypatch):
    lists = identity_lists()
    assert untested(methods.METHODS, lists) == set()
    listed = {m for names_ in lists.values() for m in names_}
    assert {m for m in listed if m not in methods.METHODS or not methods.METHODS[m].exact} == set()
    assert [m.name for m in methods.METHODS.values() if not m.exact] == ["simsd"]
    # negative control: a new method that claims exactness, with no test, is caught
    monkeypatch.setitem(methods.METHODS, "new", replace(methods.METHODS["spec-ar"], name="new"))
    assert untested(methods.METHODS, lists) == {"new"}


def test_identity_lists_name_methods_their_tests_run():
    """A name in IDENTITY_TESTED is passed as `method=` by a test of that module: the list is not
    a bare declaration."""
    lists = identity_lists()
    assert len(lists) >= 3
    tests = Path(__file__).parent
    assert {module: set(names_) - methods_run_by_tests(tests / module) for module, names_ in lists.items()} == \
        {module: set() for module in lists}


class StubProposer(ARProposer):
    """An AR proposer that declares the standard rule inexact: plan must believe the declaration."""

    exact_rules = frozenset({"greedy", "match"})


@pytest.fixture
def stub_method(monkeypatch):
    stub = methods.Method("stub", "test", speculative.prepare, needs="autoregressive",
                          build=lambda drafter, s: StubProposer(drafter),
                          rules=("standard", "match", "greedy"), family=DraftSettings, settings=("gamma",))
    monkeypatch.setitem(methods.METHODS, "stub", stub)


@pytest.fixture(scope="module")
def pair(tiny):
    return load_target(str(tiny.gpt2)), load_drafter(str(tiny.ar))


def test_a_rule_the_proposer_declares_inexact_is_refused(stub_method, pair):
    target, drafter = pair
    with pytest.raises(UsageError, match="standard acceptance would not be exact"):
        plan(target=target, drafter=drafter, method="stub", acceptance="standard", temperature=1.0)
    assert plan(target=target, drafter=drafter, method="stub", temperature=1.0).decoder.rule == "match"
    # the same drafter under a proposer that declares standard exact gets it
    assert plan(target=target, drafter=drafter, method="spec-ar", temperature=1.0).decoder.rule == "standard"
    # at temperature 0 every rule is the greedy check, exact with any drafts
    assert plan(target=target, drafter=drafter, method="stub", acceptance="standard").decoder.rule == "standard"


def test_a_method_refuses_rules_it_does_not_run(stub_method, pair, monkeypatch):
    target, drafter = pair
    monkeypatch.setitem(methods.METHODS, "stub", replace(methods.METHODS["stub"], rules=("match",)))
    with pytest.raises(UsageError, match="does not use standard acceptance"):
        plan(target=target, drafter=drafter, method="stub", acceptance="standard")


def test_ar_ignores_a_drafter_it_does_not_use(pair, tmp_path):
    p = plan(target=pair[0], drafter=str(tmp_path / "no-such-drafter"), method="ar")
    assert p.drafter is None and p.decoder.rule is None and p.draft is None


@pytest.mark.parametrize("method", ["ar", "spec-ar"])
def test_stream_yields_each_token_once_then_the_output(pair, method):
    target, drafter = pair
    draft = {"gamma": 3} if method == "spec-ar" else {}  # ar reads no draft setting
    events = list(stream(PROMPTS, target=target, drafter=drafter, method=method, max_new_tokens=12, **draft))
    reference = generate(PROMPTS, target=target, method="ar", max_new_tokens=12)
    assert [e.index for e in events if e.output] == [0, 1, 2]
    for i, want in enumerate(reference.outputs):
        streamed = sum((e.tokens for e in events if e.index == i), [])
        final = next(e.output for e in events if e.index == i and e.output)
        assert streamed == final.tokens == want.tokens


def test_cli_stream_prints_the_same_lines(tiny):
    args = ["generate", "--target", str(tiny.gpt2), "--drafter", str(tiny.drafter), "--max-new-tokens", "10"]
    for prompt in PROMPTS:
        args += ["--prompt", prompt]
    plain = CliRunner().invoke(cli, args)
    streamed = CliRunner().invoke(cli, args + ["--stream"])
    assert plain.exit_code == streamed.exit_code == 0, plain.output + streamed.output
    assert streamed.stdout == plain.stdout and len(plain.stdout.splitlines()) == 3


def test_cli_stream_refuses_jsonl(tiny):
    result = CliRunner().invoke(cli, ["generate", "--target", str(tiny.gpt2), "--prompt", "x", "--stream", "--jsonl"])
    assert result.exit_code == 2 and "--stream" in result.stderr
