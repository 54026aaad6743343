"""The shipped demo pair (specdiff/data/models/demo, built by scripts/demo/build.sh): it loads by its models.yaml
names through the code path of hub models, is the default of `generate`, and greedy `specdiff`
on it is token-identical to greedy `ar`, on PyTorch and on ONNX Runtime."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import specdiff
from specdiff.generation import plan
from specdiff.settings import DraftSettings
from specdiff.resources import data_path
from specdiff.tools.bench import DEFAULT_PROMPTS
from specdiff_cli.main import cli

DEMO = data_path("models", "demo")
PROMPT = "To be, or not to be, that is the question:"
HELDOUT = [json.loads(line)["prompt"] for line in DEFAULT_PROMPTS.read_text().splitlines()]

pytestmark = pytest.mark.skipif(not all((DEMO / m / "model.safetensors").is_file()
                                        for m in ("target", "ar-drafter", "drafter")),
                                reason="specdiff/data/models/demo is not built (scripts/demo/build.sh)")


@pytest.fixture(scope="module")
def demo_target():
    return specdiff.load_target("demo-target")


def test_demo_target_loads_by_name_and_generates(demo_target):
    target = demo_target
    assert (target.vocab_size, target.max_length) == (4096, 256)
    assert target.tokenizer.convert_ids_to_tokens([4094, 4095]) == ["<|endoftext|>", "<|mask|>"]
    assert target.eos_token_id == 4094
    out = specdiff.generate(PROMPT, target=target, method="ar", max_new_tokens=8).outputs[0]
    assert len(out.tokens) == 8 or out.tokens[-1] == target.eos_token_id
    assert out.text == target.tokenizer.decode(out.tokens, skip_special_tokens=True)
    assert out.text.strip()


def test_the_demo_pair_is_the_default():
    p = plan()  # no target, no pair
    assert (p.method.name, p.draft.gamma, p.draft.steps, p.draft.schedule) == ("specdiff", 8, 1, "l2r")
    assert p.target.name == "demo-target"
    assert p.drafter.mask_id == 4095 and p.drafter.vocab_size == 4096


def test_the_demo_models_by_name_plan_what_the_demo_pair_plans():
    """The drafter records what it was trained for (gamma 8, T = 1, l2r): naming the models
    instead of the pair keeps those settings."""
    by_names, by_pair = plan(target="demo-target", drafter="demo-drafter"), plan(pair="demo")
    assert by_names.draft == by_pair.draft == DraftSettings(8, 1, "l2r") and by_names.method.name == "specdiff"
    assert by_names.sources["steps"] == "drafter" and by_pair.sources["steps"] == "pair"


def test_greedy_specdiff_equals_ar_on_the_demo_pair(demo_target):
    """Eight held-out prompts (every fourth of specdiff/data/prompts/heldout.jsonl), 48 new tokens each."""
    prompts = HELDOUT[::4]
    plain = specdiff.generate(prompts, target=demo_target, method="ar", max_new_tokens=48)
    fast = specdiff.generate(prompts, target=demo_target, drafter="demo-drafter", method="specdiff",
                             gamma=8, steps=1, max_new_tokens=48)
    assert [o.tokens for o in fast.outputs] == [o.tokens for o in plain.outputs]
    assert fast.metrics.tau > 2  # the drafter drafts what the target says, not noise
    assert fast.metrics.target_calls < plain.metrics.target_calls


def test_demo_ar_drafter_is_lossless_with_the_demo_target(demo_target):
    plain = specdiff.generate(PROMPT, target=demo_target, method="ar", max_new_tokens=16).outputs[0]
    fast = specdiff.generate(PROMPT, target=demo_target, pair="demo-target+demo-ar", gamma=4,  # the pair's, fixed:
                             max_new_tokens=16).outputs[0]  # gamma auto may judge 16 tokens too few to draft
    assert fast.tokens == plain.tokens
    assert fast.metrics.target_calls < plain.metrics.target_calls


def _generate(args: list[str]) -> list[str]:
    result = CliRunner().invoke(cli, ["generate", "--max-new-tokens", "24", "--jsonl", "--prompt", PROMPT,
                                      "--prompt", HELDOUT[5], *args])
    assert result.exit_code == 0, result.output
    return [json.loads(line)["text"] for line in result.stdout.splitlines()]


def test_generate_with_no_model_named_runs_the_demo_pair():
    assert _generate([]) == _generate(["--target", "demo-target", "--method", "ar"])


@pytest.mark.slow  # a Ray cluster, a subprocess or an export: 12-30 s; .ci/run runs it
def test_demo_pair_on_onnxruntime_is_token_identical_to_torch(tmp_path):
    pytest.importorskip("onnxruntime")
    export = CliRunner().invoke(cli, ["export", "--pair", "demo", "--out", str(tmp_path / "demo-onnx")])
    assert export.exit_code == 0, export.output
    ort = _generate(["--runtime", "onnxruntime", "--artifacts", str(tmp_path / "demo-onnx"),
                     "--method", "specdiff", "--gamma", "8", "--steps", "1"])
    assert ort == _generate(["--method", "ar"]) == _generate([])
    stats = CliRunner().invoke(cli, ["generate", "--runtime", "onnxruntime", "--artifacts", str(tmp_path / "demo-onnx"),
                                     "--prompt", PROMPT, "--max-new-tokens", "4", "--stats"])
    settings = json.loads(stats.stderr)["settings"]  # the manifest carries the drafter's settings
    assert {k: settings[k]["value"] for k in ("gamma", "steps", "schedule")} == {"gamma": 8, "steps": 1, "schedule": "l2r"}
    assert settings["steps"]["from"] == "drafter"
