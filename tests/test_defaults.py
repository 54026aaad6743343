"""Defaults travel with the models: a drafter records the draft settings it was trained for
(config.json `defaults`), and a run uses them unless an option or a models.yaml pair sets them:
option > pair > drafter > global DEFAULTS (generation.choose, read by plan and by bench). --stats
says what ran and where each setting came from."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from specdiff.errors import LoadError
from specdiff.generation import DEFAULT_STEPS, DEFAULTS, choose, plan, values
from specdiff.loading import load_drafter
from specdiff.settings import BlockSettings, DraftSettings
from specdiff.registry import load_registry
from specdiff.tools.convert import convert_drafter
from specdiff_cli.main import cli
from tiny import with_defaults

RECORDED = {"gamma": 3, "steps": 2, "schedule": "l2r"}


@pytest.fixture(scope="module")
def recorded(tiny, tmp_path_factory) -> str:
    return with_defaults(tiny.drafter, tmp_path_factory.mktemp("recorded") / "drafter", RECORDED)


def registry(tmp_path, tiny, drafter: str, defaults: str):
    """models.yaml with the tiny target, this drafter, and their pair `t+d` with these defaults."""
    path = tmp_path / "models.yaml"
    path.write_text(f"""models:
  - {{name: t, kind: target, path: {tiny.gpt2}}}
  - {{name: d, kind: drafter, path: {drafter}}}
  - {{name: t+d, kind: pair, target: t, drafter: d, defaults: {{{defaults}}}}}
""")
    return path


def test_choose_takes_option_then_pair_then_drafter_then_default():
    class Drafter:
        defaults = {"gamma": 3, "steps": 2, "schedule": "confidence"}

    chosen = choose({"gamma": 5, "steps": None}, {"steps": 1, "max_new_tokens": 9}, Drafter())
    assert {k: (s.value, s.source) for k, s in chosen.items() if k in ("gamma", "steps", "schedule", "max_new_tokens",
                                                                        "top_p")} == {
        "gamma": (5, "option"), "steps": (1, "pair"), "schedule": ("confidence", "drafter"),
        "max_new_tokens": (9, "pair"), "top_p": (DEFAULTS["top_p"], "default")}
    assert values(choose({}))["steps"] == DEFAULT_STEPS and choose({}, {}, "a-name")["gamma"].source == "default"
    auto = choose({"gamma": "auto"}, {"gamma": 6}, Drafter())  # auto: a mode, capped by the next integer gamma
    assert {k: (auto[k].value, auto[k].source) for k in ("gamma", "adaptive")} == \
        {"gamma": (6, "pair"), "adaptive": (True, "option")}
    fixed = choose({}, {"gamma": 6, "adaptive": False}, Drafter())  # a pair may fix its gamma
    assert {k: (fixed[k].value, fixed[k].source) for k in ("gamma", "adaptive")} == \
        {"gamma": (6, "pair"), "adaptive": (False, "pair")}
    assert {k: (s.value, s.source) for k, s in choose({}, {}, Drafter()).items() if k in ("gamma", "adaptive")} == \
        {"gamma": (3, "drafter"), "adaptive": (True, "default")}
    oneshot = choose({"schedule": "oneshot"}, {}, Drafter())  # a fixed step count beats recorded steps
    assert (oneshot["steps"].value, oneshot["steps"].source) == (1, "option")


def test_recorded_settings_run_when_none_are_given(tiny, recorded):
    p = plan(target=str(tiny.gpt2), drafter=recorded)
    assert p.draft == DraftSettings(**RECORDED) and p.method.name == "specdiff"
    assert {k: p.sources[k] for k in ("method", *RECORDED)} == dict.fromkeys(("method", *RECORDED), "drafter")


def test_an_option_and_a_pair_default_win_over_recorded_settings(tiny, recorded, tmp_path):
    p = plan(target=str(tiny.gpt2), drafter=recorded, gamma=5)  # an integer option: a fixed length
    assert p.draft == DraftSettings(5, 2, "l2r", adaptive=False) and \
        (p.sources["gamma"], p.sources["steps"], p.sources["adaptive"]) == ("option", "drafter", "option")
    reg = load_registry(registry(tmp_path, tiny, recorded, "gamma: 4, steps: 1"))
    p = plan(pair="t+d", registry=reg)  # a pair's gamma: the cap of gamma auto, the default
    assert p.draft == DraftSettings(4, 1, "l2r", adaptive=True) and p.sources["schedule"] == "drafter"
    assert plan(pair="t+d", registry=reg, steps=3).draft == DraftSettings(4, 3, "l2r")


def test_a_drafter_without_recorded_settings_gets_the_global_defaults(tiny):
    """An older drafter (and an untrained one from `drafter init`) has no `defaults` in config.json."""
    assert "defaults" not in json.loads((tiny.drafter / "config.json").read_text())
    assert load_drafter(str(tiny.drafter)).defaults == {}
    p = plan(target=str(tiny.gpt2), drafter=str(tiny.drafter))
    assert p.draft == DraftSettings(DEFAULTS["gamma"], DEFAULT_STEPS, DEFAULTS["schedule"])
    assert p.sources["gamma"] == p.sources["steps"] == "default"


@pytest.mark.parametrize("defaults, message", [
    ({"gamma": 0}, "defaults: gamma must be an integer >= 1, got 0"),
    ({"schedule": "r2l"}, "defaults: unknown schedule 'r2l'"),
    ({"temperature": 1.0}, "defaults: unknown setting 'temperature'"),
    ([8, 1], "defaults must be an object, got list"),
])
def test_bad_recorded_settings_are_refused_naming_the_config(tiny, tmp_path, defaults, message):
    drafter = with_defaults(tiny.drafter, tmp_path / "d", defaults)
    with pytest.raises(LoadError, match="config.json: malformed drafter config") as e:
        load_drafter(drafter)
    assert message in str(e.value)


def test_convert_keeps_recorded_settings(tiny, recorded, tmp_path):
    converted = convert_drafter(recorded, tmp_path / "converted", dtype="fp16")
    assert load_drafter(str(converted)).defaults == RECORDED
    plain = convert_drafter(str(tiny.drafter), tmp_path / "plain")
    assert "defaults" not in json.loads((plain / "config.json").read_text())


def test_stats_say_which_settings_ran_and_where_each_came_from(tiny, recorded, tmp_path):
    path = registry(tmp_path, tiny, recorded, "steps: 1")
    result = CliRunner().invoke(cli, ["generate", "--pair", "t+d", "--prompt", "The sea", "--max-new-tokens", "5",
                                      "--temperature", "0.5", "--stats"], env={"SPECDIFF_MODELS": str(path)})
    assert result.exit_code == 0, result.stderr
    stats = json.loads(result.stderr)
    assert stats["method"] == "specdiff" and stats["exact"] is True and stats["new_tokens"] == 5
    assert stats["settings"] == {
        "method": {"value": "specdiff", "from": "drafter"}, "gamma": {"value": 3, "from": "drafter"},
        "adaptive": {"value": True, "from": "default"}, "steps": {"value": 1, "from": "pair"}, "schedule": {"value": "l2r", "from": "drafter"},
        "drafts": {"value": 1, "from": "default"}, "tree": {"value": 0, "from": "default"},
        "acceptance": {"value": "standard", "from": "default"}, "temperature": {"value": 0.5, "from": "option"},
        "top_k": {"value": 0, "from": "default"}, "top_p": {"value": 1.0, "from": "default"},
        "repetition_penalty": {"value": 1.0, "from": "default"}, "max_new_tokens": {"value": 5, "from": "option"},
        "batch_size": {"value": 8, "from": "default"}, "runtime": {"value": "torch", "from": "default"}}


def test_bench_sweeps_the_recorded_settings_by_default(tiny, recorded, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The sea\nTo be\n")
    result = CliRunner().invoke(cli, [
        "bench", "--target", str(tiny.gpt2), "--drafter", recorded, "--methods", "specdiff", "--prompt-file",
        str(prompts), "--max-new-tokens", "4", "--repeats", "1", "--warmup", "0", "--threads", "1", "--no-plots",
        "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "out" / "bench.json").read_text())
    # gamma auto (the default) capped by the recorded gamma, beside that gamma fixed
    assert [r["label"] for r in report["rows"]] == ["ar", "specdiff g=auto T=2 l2r", "specdiff g=3 T=2 l2r"]
    auto, fixed = report["rows"][1:]
    assert len(auto["draft_costs"]["verify_s"][0]) == 3 + 1 and fixed["draft_costs"] is None


def test_a_drafter_the_method_does_not_use_lends_it_no_settings(recorded, tiny):
    """A block target given a (causal-LM) diffusion drafter ran block decoding without the drafter
    but with the drafter's recorded steps; now its settings apply only where it drafts."""
    drafter = load_drafter(recorded)  # records gamma 3, steps 2
    p = plan(target="demo-block-target", drafter=drafter, method="block")
    assert p.drafter is None and isinstance(p.draft, BlockSettings)
    assert p.draft.steps == p.target.block_size and p.sources["steps"] == "default"
    assert plan(target=tiny.gpt2, drafter=drafter, method="specdiff").draft.steps == 2  # where it drafts: its own


def test_a_drafter_no_method_can_use_is_refused_not_dropped(recorded):
    result = CliRunner().invoke(cli, ["generate", "--target", "demo-block-target", "--drafter", recorded,
                                      "--prompt", "To be", "--max-new-tokens", "4"])
    assert result.exit_code == 2 and result.stdout == "" and result.stderr.count("\n") == 1, result.stderr
    assert ("no method for a block-diffusion target (SDAR layout) drafts with a diffusion drafter" in result.stderr
            and "drop --drafter, or name a --method (block decodes without one)" in result.stderr)


def test_an_untrained_drafter_is_said_once(tiny, tmp_path):
    """`drafter init` then `generate` ran at tau 1.0 with nothing on stderr: the config now marks the
    drafter untrained and a run says so in one line, once per drafter (bench plans many rows)."""
    import warnings

    from specdiff.errors import UntrainedDrafterWarning
    from specdiff.tools.drafter_init import init_drafter

    out = init_drafter(str(tiny.gpt2), tmp_path / "random", layers=1, dim=32, heads=2, context=16)
    assert json.loads((out / "config.json").read_text())["untrained"] is True
    args = ["generate", "--target", str(tiny.gpt2), "--drafter", str(out), "--prompt", "The sea", "--max-new-tokens", "4"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0 and result.stdout.count("\n") == 1
    assert result.stderr.startswith(f"specdiff: warning: drafter '{out}' is untrained (random weights from")
    assert result.stderr.count("\n") == 1 and "train it with `specdiff distill`" in result.stderr
    drafter = load_drafter(str(out))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            plan(target=tiny.gpt2, drafter=drafter)
        plan(target=tiny.gpt2, drafter=drafter, method="ar")  # a method without it: nothing to say
    assert [w.category for w in caught] == [UntrainedDrafterWarning]
    assert CliRunner().invoke(cli, [*args[:4], str(tiny.drafter), *args[5:]]).stderr == ""  # trained: quiet
