"""Greedy speculative decoding must be token-identical to plain greedy decoding, prompt by prompt,
for every drafter, schedule and (gamma, T) setting."""

import pytest
import torch

from specdiff import generate, load_drafter, load_target
from specdiff.contracts import Draft
from specdiff.decoding import Row, decode_ar, decode_speculative
from specdiff.acceptance import greedy
from specdiff.sampling import Sampling

from tiny import TEXT

WORDS = TEXT.split()
PROMPTS = [" ".join(WORDS[i: i + 2 + i % 6]) for i in range(0, 100, 2)]  # 50 prompts, 2-7 words
MAX_NEW = 24
# the methods whose greedy output the tests here hold token-identical to ar (tests/test_methods.py
# requires every exact method of the registry to be named in such a list)
IDENTITY_TESTED = ("specdiff", "spec-ar")


@pytest.fixture(scope="module")
def models(tiny):
    return {"gpt2": load_target(str(tiny.gpt2)), "neo": load_target(str(tiny.neo)),
            "drafter": load_drafter(str(tiny.drafter)), "ar": load_drafter(str(tiny.ar))}


@pytest.fixture(scope="module")
def reference(models):
    return {name: generate(PROMPTS, target=models[name], method="ar", max_new_tokens=MAX_NEW)
            for name in ("gpt2", "neo")}


def test_prompt_set_is_large_enough():
    assert len(PROMPTS) >= 50 and len(set(PROMPTS)) == len(PROMPTS)


def _assert_identical(result, ref):
    for i, (got, want) in enumerate(zip(result.outputs, ref.outputs)):
        assert got.tokens == want.tokens, f"prompt {i} ({PROMPTS[i]!r}) diverged"
    assert result.metrics.new_tokens == ref.metrics.new_tokens


@pytest.mark.parametrize("target", ["gpt2", "neo"])
@pytest.mark.parametrize("gamma,steps,schedule", [
    (1, 1, "oneshot"), (4, 1, "oneshot"), (4, 2, "l2r"), (7, 3, "l2r"), (8, 8, "l2r"), (5, 3, "confidence"),
])
def test_specdiff_greedy_equals_ar(models, reference, target, gamma, steps, schedule):
    result = generate(PROMPTS, target=models[target], drafter=models["drafter"], method="specdiff",
                      gamma=gamma, steps=steps, schedule=schedule, max_new_tokens=MAX_NEW)
    _assert_identical(result, reference[target])
    assert result.metrics.drafter_calls > 0


@pytest.mark.parametrize("target", ["gpt2", "neo"])
@pytest.mark.parametrize("drafts,schedule,steps,acceptance", [
    (2, "l2r", 2, None), (8, "oneshot", 1, None), (8, "confidence", 3, "select"), (2, "l2r", 3, "multi"),
])
def test_self_selection_greedy_equals_ar(models, reference, target, drafts, schedule, steps, acceptance):
    """K candidate rows forked from the target's cache, one kept: still plain greedy decoding
    (on 20 of the prompts: K rows cost K times the verify work on a CPU)."""
    result = generate(PROMPTS[:20], target=models[target], drafter=models["drafter"], method="specdiff", gamma=5,
                      steps=steps, schedule=schedule, drafts=drafts, acceptance=acceptance, max_new_tokens=MAX_NEW)
    for i, (got, want) in enumerate(zip(result.outputs, reference[target].outputs[:20])):
        assert got.tokens == want.tokens, f"prompt {i} ({PROMPTS[i]!r}) diverged"


@pytest.mark.parametrize("target", ["gpt2", "neo"])
@pytest.mark.parametrize("gamma", [1, 4])
def test_spec_ar_greedy_equals_ar(models, reference, target, gamma):
    result = generate(PROMPTS, target=models[target], drafter=models["ar"], method="spec-ar",
                      gamma=gamma, max_new_tokens=MAX_NEW)
    _assert_identical(result, reference[target])


def test_spec_ar_with_the_target_as_drafter_accepts_everything(tiny, models, reference):
    """Drafter == target: every draft is accepted, each step emits gamma + 1 tokens (bonus)."""
    result = generate(PROMPTS[:10], target=models["gpt2"], drafter=load_drafter(str(tiny.gpt2)),
                      method="spec-ar", gamma=5, max_new_tokens=MAX_NEW)
    for got, want in zip(result.outputs, reference["gpt2"].outputs):
        assert got.tokens == want.tokens
    m = result.metrics
    assert m.alpha == 1.0
    # every iteration but possibly the last (clipped by max_new_tokens) accepts all 5 draft tokens
    assert m.histogram[5] >= m.iterations - m.prompts


class NoisyOracle:
    """A test drafter that proposes the target's own greedy continuation, with every k-th token
    replaced, so acceptance lengths vary from 0 to gamma (exercises accept + rollback paths)."""

    exact_rules = frozenset({"greedy"})

    def __init__(self, target, every):
        self.model, self.V, self.every, self.calls = target.model, target.vocab_size, every, 0

    def propose(self, context, gamma, sampling, generator):
        ids = context
        for _ in range(gamma):
            nxt = self.model(ids).logits[:, -1, : self.V].argmax(-1, keepdim=True)
            ids = torch.cat([ids, nxt], dim=1)
        self.calls += 1
        tokens = ids[:, context.shape[1]:].clone()
        pos = self.calls % (gamma + 1)  # corrupt a different slot each call, sometimes none
        if pos < gamma:
            tokens[:, pos] = (tokens[:, pos] + 1) % self.V
        return Draft(tokens, torch.nn.functional.one_hot(tokens, self.V).float(), calls=1)


def test_partial_acceptance_and_rollback_keep_greedy_exact(models):
    target = models["gpt2"]
    tok = target.tokenizer
    hist = None
    for prompt in PROMPTS[:15]:
        ids = tok.encode(prompt)
        ref = Row(ids, 40, target.max_length, None, target.device)
        list(decode_ar(target, [ref], Sampling()))
        row = Row(ids, 40, target.max_length, None, target.device)
        steps = [t for _, t in decode_speculative(target, NoisyOracle(target, 3), [row], Sampling(), greedy, gamma=6)]
        assert row.new_tokens == ref.new_tokens == sum(steps, [])  # the steps stream every token once
        m = row.metrics
        hist = m.histogram if hist is None else [a + b for a, b in zip(hist, m.histogram)]
    assert sum(1 for count in hist if count) >= 5  # acceptance lengths really varied


def test_stops_at_eos_and_context_window(models):
    target = models["gpt2"]
    ids = list(range(10, 20))
    row = Row(ids, 1000, target.max_length, None, target.device)
    list(decode_ar(target, [row], Sampling()))
    assert row.stop_reason == "context" and len(row.ids) == target.max_length
    eos = row.new_tokens[3]  # pretend the 4th generated token is EOS
    row2 = Row(ids, 50, target.max_length, eos, target.device)
    streamed = [t for _, t in decode_speculative(target, NoisyOracle(target, 2), [row2], Sampling(), greedy, gamma=4)]
    assert row2.stop_reason == "eos" and row2.new_tokens[-1] == eos
    assert row2.new_tokens == row.new_tokens[: len(row2.new_tokens)] == sum(streamed, [])


def test_ar_drafter_with_a_shorter_window_than_the_target(tiny, models, reference):
    """A drafter with a 16-token window drafting for a 128-token target sees only the context's end."""
    from tiny import make_gpt2

    short = load_drafter(str(make_gpt2(tiny.root / "ar-short", tiny.tokenizer, seed=2, layers=1,
                                       n_positions=16, scale=10)))
    result = generate(PROMPTS[:10], target=models["gpt2"], drafter=short, method="spec-ar",
                      gamma=4, max_new_tokens=MAX_NEW)
    for got, want in zip(result.outputs, reference["gpt2"].outputs):
        assert got.tokens == want.tokens
