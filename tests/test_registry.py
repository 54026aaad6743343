"""models.yaml: the shipped file, strict schema validation (errors name file, line and entry), and
the registry as the CLI sees it through $SPECDIFF_MODELS."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from specdiff.errors import RegistryError
from specdiff.registry import DEFAULT_FILE, ModelEntry, PairEntry, load_registry
from specdiff_cli.main import cli
from specdiff_cli.prompts import escape_line

SHIPPED_TARGETS = ["gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "gpt-neo-125M", "gpt-neo-1.3B", "gpt-neo-2.7B"]


def write(tmp_path, text: str, name: str = "models.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


def test_shipped_registry_has_the_seven_targets(monkeypatch):
    monkeypatch.delenv("SPECDIFF_MODELS", raising=False)
    registry = load_registry()
    assert registry.file == DEFAULT_FILE
    for name in SHIPPED_TARGETS:
        entry = registry.get(name, "target")
        assert isinstance(entry, ModelEntry) and entry.hub and entry.path is None, name
    assert set(SHIPPED_TARGETS) <= set(registry.names("target"))


def test_the_top_level_models_yaml_is_the_packaged_one(tmp_path):
    """The design card's top-level models.yaml is a link to the package data; `path:` entries
    resolve beside the real file, whichever name it is read by, also through another link."""
    top = Path(__file__).resolve().parents[1] / "models.yaml"
    assert DEFAULT_FILE.parts[-3:] == ("specdiff", "data", "models.yaml") and top.resolve() == DEFAULT_FILE.resolve()
    elsewhere = tmp_path / "linked.yaml"
    elsewhere.symlink_to(top)
    demo = {name: load_registry(file).get("demo-target").path for name, file in
            [("default", DEFAULT_FILE), ("top", top), ("link", elsewhere)]}
    assert len(set(demo.values())) == 1 and (demo["default"] / "model.safetensors").is_file(), demo


def test_valid_file_paths_pairs_and_defaults(tmp_path):
    path = write(tmp_path, """
        models:
          - name: t
            kind: target
            path: models/t
            description: a local target
          - name: d
            kind: drafter
            hub: someone/drafter
            tokenizer: t
          - name: t+d
            kind: pair
            target: t
            drafter: d
            defaults: {method: specdiff, gamma: 5, temperature: 1, top_p: 0.9}
    """)
    registry = load_registry(path)
    assert list(registry.entries) == ["t", "d", "t+d"]
    assert registry.get("t").path == (tmp_path / "models" / "t").resolve()  # relative to the file
    assert registry.get("t").source == str((tmp_path / "models" / "t").resolve())
    assert registry.get("d").source == "someone/drafter" and registry.get("d").tokenizer == "t"
    pair = registry.get("t+d", "pair")
    assert isinstance(pair, PairEntry)
    assert pair.defaults == {"method": "specdiff", "gamma": 5, "temperature": 1, "top_p": 0.9}
    assert registry.names("pair") == ["t+d"] and registry.get("nothing") is None
    with pytest.raises(RegistryError, match="'t' is a target in models.yaml, not a pair"):
        registry.get("t", "pair")


def test_pair_names_its_ar_baseline(tmp_path, monkeypatch):
    path = write(tmp_path, """
        models:
          - name: t
            kind: target
            hub: x/t
          - name: small
            kind: target
            hub: x/small
          - name: t+t
            kind: pair
            target: t
            drafter: t
            ar_drafter: small
    """)
    assert load_registry(path).pair("t+t").ar_drafter == "small"
    monkeypatch.delenv("SPECDIFF_MODELS", raising=False)
    assert load_registry().pair("demo").ar_drafter == "demo-ar"  # the shipped demo's spec-ar baseline


ENTRY_ERRORS = {
    "unknown key": ("""
        models:
          - name: a
            kind: target
            hub: x/a
          - name: b
            kind: target
            hub: x/b
            revison: main
     """, 5, "entry 'b': unknown key(s) revison"),
    "missing name": ("""
        models:
          - kind: target
            hub: x/a
     """, 2, "entry without a 'name'"),
    "bad kind": ("""
        models:
          - name: a
            kind: model
            hub: x/a
     """, 2, "entry 'a': 'kind' must be one of target, drafter, pair, got 'model'"),
    "both hub and path": ("""
        models:
          - name: a
            kind: target
            hub: x/a
            path: here
     """, 2, "entry 'a': give exactly one of 'hub', 'path' or 'gguf'"),
    "neither hub nor path": ("""
        models:
          - name: a
            kind: drafter
     """, 2, "entry 'a': give exactly one of 'hub', 'path' or 'gguf'"),
    "value not text": ("""
        models:
          - name: a
            kind: target
            hub: 3
     """, 2, "entry 'a': hub must be text"),
    "duplicate name": ("""
        models:
          - name: a
            kind: target
            hub: x/a
          - name: a
            kind: drafter
            hub: x/b
     """, 5, "duplicate model name 'a'"),
    "pair names unknown model": ("""
        models:
          - name: a
            kind: target
            hub: x/a
          - name: a+b
            kind: pair
            target: a
            drafter: b
     """, 5, "pair 'a+b' names unknown drafter 'b'"),
    "pair names unknown ar_drafter": ("""
        models:
          - name: a
            kind: target
            hub: x/a
          - name: a+a
            kind: pair
            target: a
            drafter: a
            ar_drafter: small
     """, 5, "pair 'a+a' names unknown ar_drafter 'small'"),
    "pair target is a drafter": ("""
        models:
          - name: d
            kind: drafter
            hub: x/d
          - name: d+d
            kind: pair
            target: d
            drafter: d
     """, 5, "pair 'd+d': 'd' is a drafter, not a target"),
    "pair without drafter": ("""
        models:
          - name: a+b
            kind: pair
            target: a
     """, 2, "entry 'a+b': a pair needs 'drafter'"),
    "default of wrong type": ("""
        models:
          - name: a
            kind: target
            hub: x/a
          - name: a+a
            kind: pair
            target: a
            drafter: a
            defaults: {steps: "5"}
     """, 5, "entry 'a+a': default 'steps' has the wrong type: '5'"),
    "default out of bounds": ("""
        models:
          - name: a
            kind: target
            hub: x/a
          - name: a+a
            kind: pair
            target: a
            drafter: a
            defaults: {gamma: "5"}
     """, 5, "entry 'a+a': default `gamma` must be an integer >= 1 or auto, got '5'"),
    "boolean default": ("""
        models:
          - name: a
            kind: target
            hub: x/a
          - name: a+a
            kind: pair
            target: a
            drafter: a
            defaults:
              max_new_tokens: true
     """, 5, "default 'max_new_tokens' has the wrong type: True"),
    "unknown default": ("""
        models:
          - name: a+a
            kind: pair
            target: a
            drafter: a
            defaults: {gama: 5}
     """, 2, "entry 'a+a': unknown default 'gama'"),
    "sha256 all digits, unquoted": ("""
        models:
          - name: a
            kind: target
            gguf: a.gguf
            sha256: 1234567890123456789012345678901234567890123456789012345678901234
     """, 2, 'entry \'a\': sha256 must be text, but YAML reads this unquoted value as a number: put it in quotes '
            '(sha256: "...")'),
    "name a year, unquoted": ("""
        models:
          - name: 2024
            kind: target
            hub: x/a
     """, 2, 'name must be text, but YAML reads this unquoted value as a number: put it in quotes (name: "...")'),
    "description a date, unquoted": ("""
        models:
          - name: a
            kind: target
            hub: x/a
            description: 2024-01-01
     """, 2, "entry 'a': description must be text, but YAML reads this unquoted value as a date"),
    "hub empty": ("""
        models:
          - name: a
            kind: target
            hub:
     """, 2, "entry 'a': hub is empty: give it a value, or leave the key out"),
    "defaults not a mapping": ("""
        models:
          - name: a+a
            kind: pair
            target: a
            drafter: a
            defaults: [5]
     """, 2, "entry 'a+a': 'defaults' must be a mapping"),
}


@pytest.mark.parametrize("case", ENTRY_ERRORS, ids=list(ENTRY_ERRORS))
def test_entry_errors_name_file_line_and_entry(tmp_path, case):
    text, line, message = ENTRY_ERRORS[case]
    path = write(tmp_path, text)
    with pytest.raises(RegistryError) as info:
        load_registry(path)
    error = str(info.value)
    assert error.startswith(f"{path}:{line}: "), error
    assert message in error and "\n" not in error


@pytest.mark.parametrize("text, message", [
    ("models:\n  - name: a\n    kind: [target\n", "not valid YAML"),
    ("", "expected a top-level 'models:' list"),
    ("models: {name: a}\n", "expected a top-level 'models:' list"),
    ("model:\n  - name: a\n", "expected a top-level 'models:' list"),
    ("models: []\npairs: []\n", "unknown top-level key(s) pairs"),
    ("models:\n  - gpt2\n", "every item of 'models' must be a mapping, got 'gpt2'"),
])
def test_file_errors_name_the_file(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(RegistryError) as info:
        load_registry(path)
    assert str(info.value).startswith(f"{path}: ") and message in str(info.value)


def test_missing_file(tmp_path):
    with pytest.raises(RegistryError, match=r"cannot read model registry .*nowhere\.yaml"):
        load_registry(tmp_path / "nowhere.yaml")


def write_tiny_registry(tmp_path, tiny, defaults: str):
    """models.yaml naming the tiny target, drafter and a pair of them with these defaults."""
    return write(tmp_path, f"""
        models:
          - name: tiny
            kind: target
            path: {tiny.gpt2}
          - name: tiny-drafter
            kind: drafter
            path: {tiny.drafter}
          - name: tiny+drafter
            kind: pair
            target: tiny
            drafter: tiny-drafter
            defaults: {{{defaults}}}
    """)


def test_cli_models_reads_specdiff_models(tmp_path, tiny):
    path = write_tiny_registry(tmp_path, tiny, "gamma: 3")
    result = CliRunner().invoke(cli, ["models"], env={"SPECDIFF_MODELS": str(path)})
    assert result.exit_code == 0 and result.stderr == ""
    rows = [line.split() for line in result.stdout.splitlines()]
    assert [r[:2] for r in rows] == [["tiny", "target"], ["tiny-drafter", "drafter"], ["tiny+drafter", "pair"]]
    assert rows[0][2] == str(tiny.gpt2) and rows[2][2:5] == ["tiny", "+", "tiny-drafter"]
    result = CliRunner().invoke(cli, ["models", "--json"], env={"SPECDIFF_MODELS": str(path)})
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert records[1] == {"name": "tiny-drafter", "kind": "drafter", "source": str(tiny.drafter)}


def test_cli_models_bad_file_is_one_line(tmp_path):
    path = write(tmp_path, "models:\n  - name: a\n    kind: target\n    hub: x/a\n    colour: red\n")
    result = CliRunner().invoke(cli, ["models"], env={"SPECDIFF_MODELS": str(path)})
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr == f"specdiff: error: {path}:2: entry 'a': unknown key(s) colour (allowed: " \
        "description, format, gguf, hub, install, kind, name, package, path, sha256, tokenizer)\n"


def test_cli_generate_uses_registry_names_and_pair_defaults(tmp_path, tiny):
    path = write_tiny_registry(tmp_path, tiny, "gamma: 3, max_new_tokens: 7")
    env = {"SPECDIFF_MODELS": str(path)}
    by_name = CliRunner().invoke(cli, ["generate", "--target", "tiny", "--prompt", "The sea", "--max-new-tokens", "7"],
                                 env=env)
    by_pair = CliRunner().invoke(cli, ["generate", "--pair", "tiny+drafter", "--prompt", "The sea", "--jsonl",
                                       "--stats"], env=env)
    assert by_name.exit_code == 0 and by_pair.exit_code == 0, (by_name.stderr, by_pair.stderr)
    record = json.loads(by_pair.stdout)
    assert escape_line(record["text"]) == by_name.stdout.rstrip("\n")  # greedy: the drafter changes nothing
    assert record["metrics"]["new_tokens"] == 7  # the pair's max_new_tokens
    settings = json.loads(by_pair.stderr)["settings"]
    assert settings["gamma"] == {"value": 3, "from": "pair"}  # the pair's gamma: auto's cap
    assert len(record["metrics"]["draft_costs"]["draft_s"][0]) == 3  # auto timed draft lengths 1..3
    assert settings["method"] == {"value": "specdiff", "from": "drafter"}  # the drafter's method
    overridden = CliRunner().invoke(cli, ["generate", "--pair", "tiny+drafter", "--prompt", "The sea", "--jsonl",
                                          "--max-new-tokens", "2"], env=env)
    assert json.loads(overridden.stdout)["metrics"]["new_tokens"] == 2  # options beat pair defaults
