"""The shipped demo models (models/demo, built by scripts/demo/build.sh) load by their models.yaml
names through the code path of hub models and generate; skipped where they are not shipped."""

from __future__ import annotations

from pathlib import Path

import pytest

import specdiff

DEMO = Path(__file__).resolve().parents[1] / "models" / "demo"
PROMPT = "To be, or not to be, that is the question:"

pytestmark = pytest.mark.skipif(not (DEMO / "target" / "model.safetensors").is_file(),
                                reason="models/demo/target is not built (scripts/demo/build.sh)")


def test_demo_target_loads_by_name_and_generates():
    target = specdiff.load_target("demo-target")
    assert (target.vocab_size, target.max_length) == (4096, 256)
    assert target.tokenizer.convert_ids_to_tokens([4094, 4095]) == ["<|endoftext|>", "<|mask|>"]
    assert target.eos_token_id == 4094
    out = specdiff.generate(PROMPT, target=target, method="ar", max_new_tokens=8).outputs[0]
    assert len(out.tokens) == 8 or out.tokens[-1] == target.eos_token_id
    assert out.text == target.tokenizer.decode(out.tokens, skip_special_tokens=True)
    assert out.text.strip()


@pytest.mark.skipif(not (DEMO / "ar-drafter" / "model.safetensors").is_file(), reason="no demo AR drafter")
def test_demo_ar_drafter_is_lossless_with_the_demo_target():
    target = specdiff.load_target("demo-target")
    plain = specdiff.generate(PROMPT, target=target, method="ar", max_new_tokens=16).outputs[0]
    fast = specdiff.generate(PROMPT, target=target, drafter="demo-ar", method="spec-ar", gamma=4,
                             max_new_tokens=16).outputs[0]
    assert fast.tokens == plain.tokens
    assert fast.metrics.target_calls < plain.metrics.target_calls
