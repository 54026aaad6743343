"""`specdiff tune` (issue 52): the fastest configuration identical to plain decoding is recorded
for this machine, generate runs it where nothing is chosen and says so, and a stale record or a
setting given leaves it unused."""

from __future__ import annotations

import json

import pytest

from cli_checks import assert_one_line_error, invoke
from specdiff.generation.tuned import record_path
from specdiff_cli.tune import fastest

TUNE = ["tune", "--pair", "demo", "--runtime", "torch", "--num-prompts", "1", "--max-new-tokens", "8",
        "--repeats", "1", "--threads", "1"]


@pytest.fixture()
def tuned(tmp_path, monkeypatch):
    """The demo pair tuned on torch into a fresh folder of records, the default pair demo -> the record."""
    monkeypatch.setenv("SPECDIFF_TUNED", str(tmp_path / "tuned"))
    monkeypatch.setenv("SPECDIFF_PAIR", "demo")
    result = invoke(TUNE)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip().splitlines()[-1].startswith("tuned demo: ")
    return json.loads(record_path("demo").read_text(encoding="utf-8"))


def _stats(result) -> dict:
    return json.loads([line for line in result.stderr.splitlines() if line.startswith("{")][-1])


def test_generate_runs_the_tuned_configuration_and_says_where_it_came_from(tuned):
    assert set(tuned["runtimes"]) == {"torch"}  # --runtime torch: no graph rows
    config = tuned["runtimes"]["torch"]["config"]
    assert config["pair"] == "demo" and config["runtime"] == "torch" and config["threads"] == 1
    result = invoke(["generate", "--prompt", "To be, or not to be", "--max-new-tokens", "8", "--stats"])
    assert result.exit_code == 0, result.output
    stats = _stats(result)
    where = f"tuned on this machine, {tuned['date']}"
    assert stats["method"] == config["method"]
    assert stats["settings"]["method"]["from"] == where and stats["settings"]["runtime"] == {"value": "torch",
                                                                                              "from": where}
    if config["method"] != "ar":  # the drafting row as bench measured it: its gamma and T, not the pair's
        assert stats["settings"]["gamma"] == {"value": config["gamma"], "from": where}
        assert stats["settings"]["steps"] == {"value": config["steps"], "from": where}


def test_a_block_diffusion_pair_is_refused_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDIFF_TUNED", str(tmp_path))
    assert_one_line_error(invoke(["tune", "--pair", "demo-block"]), 2, "'demo-block' is a block-diffusion pair")
    assert list(tmp_path.iterdir()) == []


def test_the_python_api_runs_the_fastest_torch_configuration_and_says_so(tuned):
    import specdiff

    config = tuned["runtimes"]["torch"]["config"]
    result = specdiff.generate(["To be, or not to be"], max_new_tokens=6)
    assert result.settings["method"] == {"value": config["method"], "from": f"tuned on this machine, {tuned['date']}"}
    given = specdiff.generate(["To be, or not to be"], max_new_tokens=6, method="ar")
    assert given.settings["method"] == {"value": "ar", "from": "option"}


def test_a_setting_given_is_the_users_choice(tuned):
    result = invoke(["generate", "--prompt", "To be", "--max-new-tokens", "4", "--method", "ar", "--stats"])
    assert result.exit_code == 0, result.output
    settings = _stats(result)["settings"]
    assert settings["method"]["from"] == "option" and settings["runtime"]["from"] == "default"
    assert not any(str(s["from"]).startswith("tuned") for s in settings.values())


@pytest.mark.parametrize("damage", ["versions", "files", "unreadable"])
def test_a_stale_or_damaged_record_is_ignored_in_one_line(tuned, damage):
    path = record_path("demo")
    if damage == "unreadable":
        path.write_text("{", encoding="utf-8")
    else:
        record = dict(tuned)
        record["key"] = {**tuned["key"], damage: {"torch": "0.0"} if damage == "versions" else {}}
        path.write_text(json.dumps(record), encoding="utf-8")
    result = invoke(["generate", "--prompt", "To be", "--max-new-tokens", "4", "--stats"])
    assert result.exit_code == 0, result.output
    notes = [line for line in result.stderr.splitlines() if "specdiff tune" in line]
    assert len(notes) == 1 and notes[0].startswith("specdiff: warning: ")
    assert not any(str(s["from"]).startswith("tuned") for s in _stats(result)["settings"].values())


def test_fastest_takes_only_rows_identical_to_plain_decoding():
    rows = [{"label": "ar", "matches_ar": None, "tokens_per_s": {"median": 10.0}},
            {"label": "wrong", "matches_ar": False, "tokens_per_s": {"median": 99.0}},
            {"label": "dflash", "matches_ar": True, "tokens_per_s": {"median": 12.0}}]
    assert fastest(rows)["label"] == "dflash"
    assert fastest(rows[:2])["label"] == "ar"
