"""`--method eagle3` (issue 33 item 3): a draft's q is exactly what EAGLE-3 defines (the target's
features at p with the token at p + 1, then its own outputs fed back at the next positions;
checked against a from-scratch computation, which a draft one position off fails); greedy output
is token-identical to ar on GPT-2, Llama and Qwen3 targets at batch 1 and 3, with a head over
the whole padded vocabulary, and on a target that accepts drafts of every length (a verifier
that takes drafts unchecked fails it); sampled output does not depend on the batch size; a
one-token prompt; one step has the target's distribution at temperature 1 and with top-k, with
a draft vocabulary (a chain drawn at another temperature than its q fails the same chi-square
test); a row with nothing cached; refusals; the CLI."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from click.testing import CliRunner

from specdiff import generate, load_drafter, load_target
from specdiff.acceptance import match, standard
from specdiff.contracts import Draft
from specdiff.decoding import Row
from specdiff.errors import UsageError
from specdiff.generation import iter_generate, plan
from specdiff.loading import pair_models
from specdiff.methods.eagle3 import Eagle3Drafts
from specdiff.sampling import Sampling
from specdiff_cli.main import cli

import exactness as exact
from eagle3_runs import MAX_NEW, PROMPTS, checked_against
from tiny import make_eagle3, target_paths

# the methods whose output the tests here hold to ar's (tests/test_methods.py)
IDENTITY_TESTED = ("eagle3",)
TARGETS = ("gpt2", "llama", "qwen3")


@pytest.fixture(scope="module")
def models(tiny):
    paths = target_paths(tiny, "e3m")
    found = {}
    for name, path in paths.items():
        found[name] = load_target(str(path))
        found[f"{name}-dir"] = path
        found[f"{name}-head"] = make_eagle3(tiny.root / f"e3m-{name}-eagle3", path, seed=6, scale=10,
                                            embedding=name != "qwen3")  # qwen3's reads its target's embedding
        found[f"{name}-eagle3"] = load_drafter(str(found[f"{name}-head"]))
    return found


@pytest.fixture(scope="module")
def reference(models):
    return {name: generate(PROMPTS, target=models[name], method="ar", max_new_tokens=MAX_NEW) for name in TARGETS}


def _differing(result, ref) -> list[int]:
    return [i for i, (got, want) in enumerate(zip(result.outputs, ref.outputs)) if got.tokens != want.tokens]


# --- what a draft reads ------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["gpt2", "qwen3"])
def test_a_draft_is_the_chain_computed_from_scratch(models, name, monkeypatch):
    """Sampled (drafts partly accepted: contexts of several new rows) at batch 3 with ragged rows,
    contexts carried across steps: every q equals the from-scratch one; the same check with each
    feature row paired with its own token (one position off) fails."""
    target, drafter = models[name], models[f"{name}-eagle3"]
    sampling = Sampling(temperature=1.0)
    results = []
    for shift in (0, -1):
        gaps: list[float] = []
        monkeypatch.setattr(Eagle3Drafts, "__call__", checked_against(target, drafter, sampling, gaps, shift))
        result = generate(PROMPTS[:6], target=target, drafter=drafter, method="eagle3", max_new_tokens=16,
                          batch_size=3, gamma=3, temperature=1.0, seed=2)
        results.append((max(gaps), len(gaps), result.metrics.accepted))
    (gap, drafted, accepted), (off, _, _) = results
    assert gap < 1e-5 and off > 1e-2, results
    assert drafted > 15 and accepted > 5, results  # later drafts read rows verified several at a time


# --- greedy identity ---------------------------------------------------------------------------

@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("batch_size", [1, 3])
def test_eagle3_greedy_equals_ar(models, reference, target, batch_size):
    result = generate(PROMPTS, target=models[target], drafter=models[f"{target}-eagle3"], method="eagle3",
                      max_new_tokens=MAX_NEW, gamma=4, batch_size=batch_size)
    assert _differing(result, reference[target]) == []
    assert result.metrics.new_tokens == reference[target].metrics.new_tokens
    assert result.metrics.drafter_calls > 0
    assert models[target].captured == ()  # capturing stops with the run


def test_a_head_over_the_whole_padded_head_equals_ar(tiny, models, reference):
    drafter = load_drafter(str(make_eagle3(tiny.root / "e3m-gpt2-whole", tiny.gpt2, draft_size=None, seed=8)))
    result = generate(PROMPTS, target=models["gpt2"], drafter=drafter, method="eagle3", max_new_tokens=MAX_NEW,
                      gamma=3, batch_size=3)
    assert drafter.draft_vocab is None and _differing(result, reference["gpt2"]) == []


@pytest.fixture(scope="module")
def agreeing(tiny):
    """A GPT-2 target leaning towards one token t (ln_f's bias along t's embedding, the tied head's
    row: t is its argmax about 3 times in 4) and a head that always drafts t (its final norm's
    weight 0: all-zero logits, argmax its first draft id, t): greedy steps accept every length."""
    from transformers import GPT2LMHeadModel

    head = make_eagle3(tiny.root / "e3m-agree-head", tiny.gpt2, seed=6)
    drafter = load_drafter(str(head))
    t = int(drafter.target_ids()[0])
    model = GPT2LMHeadModel.from_pretrained(str(tiny.gpt2))
    with torch.no_grad():
        drafter.net.norm.weight.zero_()
        w = model.transformer.wte.weight[t]
        model.transformer.ln_f.bias += 4.0 * w / w.norm()
    model.save_pretrained(str(tiny.root / "e3m-agree-gpt2"))
    tiny.tokenizer.save_pretrained(str(tiny.root / "e3m-agree-gpt2"))
    return load_target(str(tiny.root / "e3m-agree-gpt2")), drafter


@pytest.mark.parametrize("batch_size", [1, 3])
def test_eagle3_greedy_equals_ar_when_drafts_are_accepted(agreeing, batch_size):
    target, drafter = agreeing
    want = generate(PROMPTS, target=target, method="ar", max_new_tokens=MAX_NEW)
    got = generate(PROMPTS, target=target, drafter=drafter, method="eagle3", max_new_tokens=MAX_NEW, gamma=4,
                   batch_size=batch_size)
    assert _differing(got, want) == []
    histogram = got.metrics.to_dict()["accepted_length_histogram"]
    assert len(histogram) == 5 and min(histogram) > 0, histogram  # 0..4 draft tokens accepted, each seen


def always_accept(draft, q, p, generator=None):
    """A broken verifier: every draft token taken unchecked, then the bonus token."""
    n = torch.full((draft.shape[0],), draft.shape[1])
    return n, p[torch.arange(draft.shape[0]), n].argmax(-1)


def test_a_verifier_that_takes_drafts_unchecked_is_not_ar(models, reference):
    p = plan(target=models["llama"], drafter=models["llama-eagle3"], method="eagle3", max_new_tokens=MAX_NEW, gamma=4)
    outputs = list(iter_generate(PROMPTS, replace(p, decoder=replace(p.decoder, verify=always_accept))))
    assert len([o for o, want in zip(outputs, reference["llama"].outputs) if o.tokens != want.tokens]) > len(PROMPTS) // 2


def test_a_one_token_prompt(models):
    """Its first draft has one context row (the prefill emitted the token after it)."""
    target, drafter = models["gpt2"], models["gpt2-eagle3"]
    assert len(target.tokenizer("The")["input_ids"]) == 1
    want = generate(["The"], target=target, method="ar", max_new_tokens=10)
    for options in ({}, {"temperature": 1.0, "seed": 5}):
        got = generate(["The"], target=target, drafter=drafter, method="eagle3", max_new_tokens=10, gamma=3, **options)
        if not options:
            assert got.outputs[0].tokens == want.outputs[0].tokens
        assert len(got.outputs[0].tokens) == 10


# --- batches -----------------------------------------------------------------------------------

@pytest.mark.parametrize("target", ["gpt2", "qwen3"])
@pytest.mark.parametrize("options", [{"temperature": 1.0, "top_k": 20, "seed": 7},
                                     {"temperature": 1.0, "seed": 3, "acceptance": "match"}])
def test_sampled_output_does_not_depend_on_the_batch_size(models, target, options):
    one, three = (generate(PROMPTS, target=models[target], drafter=models[f"{target}-eagle3"], method="eagle3",
                           max_new_tokens=MAX_NEW, batch_size=b, gamma=4, **options) for b in (1, 3))
    assert [o.tokens for o in three.outputs] == [o.tokens for o in one.outputs]
    assert len({tuple(o.tokens[:4]) for o in one.outputs}) > 10  # really sampled


@torch.no_grad()
def test_a_row_with_nothing_cached_repeats_its_token_and_draws_nothing(models):
    """The loop's rows always have a cached position (the prefill emits the first token), but a
    draft step may be handed one with none (cost timing on a short window): it proposes its last
    token, q a point mass, without touching its generator, beside a row that drafts."""
    target, drafter = models["gpt2"], models["gpt2-eagle3"]
    step = Eagle3Drafts(target, drafter, Sampling(temperature=1.0))
    generators = [torch.Generator().manual_seed(b) for b in range(2)]
    rows = [Row([5, 6, 7], 8, target.max_length, None, target.device, generators[0]),
            Row([9], 8, target.max_length, None, target.device, generators[1])]
    before = generators[1].get_state()
    target.capture(step.layers)
    try:
        target.prefill(torch.tensor([[5, 6], [9, 9]]))
        target.rollback(torch.tensor([2, 0]))
        drafted, alone = step(rows, [3, 3])
    finally:
        target.capture(())
    assert drafted.tokens.shape == (1, 3) and drafted.calls == 3
    assert alone.tokens.tolist() == [[9, 9, 9]] and torch.equal(alone.q[0, :, 9], torch.ones(3))
    assert torch.equal(generators[1].get_state(), before)


# --- planning, refusals, the CLI ---------------------------------------------------------------

def test_an_eagle3_drafter_picks_eagle3(models):
    p = plan(target=models["gpt2"], drafter=models["gpt2-eagle3"], gamma=5)
    assert p.method.name == "eagle3" and p.decoder.ran() == {"gamma": 5, "adaptive": False, "acceptance": "greedy"}
    assert plan(target=models["gpt2"], drafter=models["gpt2-eagle3"], temperature=1.0, gamma=5).decoder.rule == "standard"
    with pytest.raises(UsageError, match="needs an EAGLE-3 drafter"):
        plan(target=models["gpt2"], drafter=load_drafter(str(models["gpt2-dir"])), method="eagle3")
    with pytest.raises(UsageError, match="`drafts` > 1 needs"):
        plan(target=models["gpt2"], drafter=models["gpt2-eagle3"], drafts=2, gamma=5)
    with pytest.raises(UsageError, match="drop `compile`"):
        plan(target=models["gpt2"], drafter=models["gpt2-eagle3"], compile=True, gamma=5)


def test_cli_generates_with_eagle3(models):
    result = CliRunner().invoke(cli, ["generate", "--target", str(models["gpt2-dir"]), "--drafter",
                                      str(models["gpt2-head"]), "--method", "eagle3", "--gamma", "3", "--stats",
                                      "--max-new-tokens", "12", "--prompt", "The quick brown fox"])
    assert result.exit_code == 0, result.output
    stats = json.loads(result.stderr.strip().splitlines()[-1])
    assert (stats["method"], stats["exact"]) == ("eagle3", True)


# --- the target's distribution -----------------------------------------------------------------

@pytest.fixture(scope="module")
def small():
    """The V = 8 target of test_sampling_exact and a random EAGLE-3 head over 6 of its 8 ids (a
    draft vocabulary: q is zero at 3 and 6), reading its one layer thrice, with its embedding."""
    from transformers import LlamaConfig

    from specdiff.drafters.eagle3 import Eagle3Drafter
    from specdiff.nets.eagle3 import Eagle3Net, Eagle3Spec
    from specdiff.targets.causal import CausalLMTarget

    target = CausalLMTarget(exact.v8_gpt2(0, 60.0), exact.v8_tokenizer(), "v8")
    layer = LlamaConfig(vocab_size=exact.V, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=16)
    ids = torch.tensor([0, 1, 2, 4, 5, 7])
    net = Eagle3Net(layer, Eagle3Spec(exact.V, len(ids), 16, (0, 0, 0)))
    generator = torch.Generator().manual_seed(12)
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn(p.shape, generator=generator) * (0.3 if p.dim() == 2 else 0.1) + (p.dim() == 1))
        net.d2t.copy_(ids - torch.arange(len(ids)))
        net.t2d[ids] = True
    drafter = Eagle3Drafter(net.eval(), source="v8-eagle3")
    pair_models(target, drafter)
    return target, drafter


@torch.no_grad()
def eagle3_samples(target, step, rule, sampling, seed):
    """exact.N samples of the first exact.DEPTH tokens after exact.CONTEXT through one batched
    eagle3 step (`step`: an Eagle3Drafts), its verify call and the rule -> (cell ids, accepted)."""
    g = torch.Generator().manual_seed(seed)
    ctx = exact.CONTEXT.repeat(exact.N, 1)
    rows = [Row(exact.CONTEXT[0].tolist(), 8, target.max_length, None, target.device, g) for _ in range(exact.N)]
    target.capture(step.layers)
    try:
        target.prefill(ctx[:, :-1])
        drafts = step(rows, [exact.GAMMA] * exact.N)
    finally:
        target.capture(())
    tokens, q = torch.cat([d.tokens for d in drafts]), torch.cat([d.q for d in drafts])
    logits = target.model(torch.cat([ctx, tokens], 1)).logits[:, exact.CONTEXT.shape[1] - 1:]
    n, y = rule(tokens, q, sampling.target_probs(logits, ctx, tokens), g)
    return exact.first_tokens(target.model, tokens, n, y, sampling, g), n


class HalfTemperature(Eagle3Drafts):
    """Draws at half the temperature of the q handed to the rule (DFlash's issue #74, here)."""

    def __call__(self, batch, g):
        hot = Eagle3Drafts(self.target, self.drafter, replace(self.sampling, temperature=self.sampling.temperature / 2))
        drawn, told = hot(batch, g), super().__call__(batch, g)  # each from its own (empty) contexts
        return [Draft(h.tokens, t.q, 1) for h, t in zip(drawn, told)]


@pytest.mark.parametrize("case", ["t1-standard", "broken-t1",  # 9.5 s each: the others in CI's slow step
                                  *(pytest.param(c, marks=pytest.mark.slow) for c in ("t0.7-top3-standard", "t1-match"))])
def test_an_eagle3_step_has_the_target_distribution(small, case):
    """A chain drawn token by token from q (the draft vocabulary's 6 ids), verified by the rule:
    the joint of the first three tokens is the target's (chi-square, 60,000 steps); drawing at
    another temperature than the q handed over fails the same test."""
    target, drafter = small
    sampling = exact.SAMPLINGS["t0.7-top3" if case.startswith("t0.7") else "t1"]
    rule = match if case.endswith("match") else standard
    step = (HalfTemperature if case.startswith("broken") else Eagle3Drafts)(target, drafter, sampling)
    cells, n = eagle3_samples(target, step, rule, sampling, seed=11)
    pvalue = exact.chi_square_pvalue(cells, exact.exact_joint(target.model, sampling))
    if case.startswith("broken"):
        assert pvalue < exact.P_BROKEN
        return
    assert pvalue > exact.P_EXACT
    assert 0.05 < (n > 0).float().mean() < 0.95  # sensitive: drafts neither always rejected nor always taken
