"""`--method dflash` (issue 23 items 1 and 6): the target's cached hidden states are the features
of each row's cached tokens through join / ragged extend / rollback / keep; a draft reads exactly
the features of positions < start (a draft one position off, or with the anchor's own features,
fails that check); greedy output is token-identical to ar on GPT-2, Llama and Qwen3 targets (a
verifier that takes drafts unchecked fails it); the output does not depend on the batch size,
greedy or sampled; one speculative step has the target's distribution at temperature 1 and with
top-k (a draft sampled at another temperature than its q, and acceptance that ignores q, fail the
same chi-square test); with K candidate blocks (--drafts) greedy output is still ar's and select /
multi keep the target's distribution (multi over the argmax block fails it); refusals; the CLI."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from click.testing import CliRunner

from specdiff import generate, load_drafter, selection
from specdiff.acceptance import match, standard
from specdiff.contracts import Draft
from specdiff.decoding import Row
from specdiff.errors import UsageError
from specdiff.generation import iter_generate, plan
from specdiff.loading import pair_models
from specdiff.methods import dflash as dflash_method
from specdiff.methods.dflash import DFlashDrafts, RowContexts
from specdiff.sampling import Sampling, sample
from specdiff_cli.main import cli

import exactness as exact
from dflash_runs import MAX_NEW, PROMPTS, Recording, SkipsOne, checked_against
from tiny import dflash_pairs, target_paths

# the methods whose output the tests here hold to ar's (tests/test_methods.py)
IDENTITY_TESTED = ("dflash",)
TARGETS = ("gpt2", "llama", "qwen3")


@pytest.fixture(scope="module")
def models(tiny):
    paths = target_paths(tiny, "dfm")
    found = dflash_pairs(tiny, "dfm", paths)
    found.update({f"{name}-dir": path for name, path in paths.items()})
    return found


@pytest.fixture(scope="module")
def reference(models):
    return {name: generate(PROMPTS, target=models[name], method="ar", max_new_tokens=MAX_NEW) for name in TARGETS}


def _identical(result, ref) -> list[int]:
    """The prompts whose output differs from the reference's."""
    return [i for i, (got, want) in enumerate(zip(result.outputs, ref.outputs)) if got.tokens != want.tokens]


# --- the features the target caches ----------------------------------------------------------

@pytest.mark.parametrize("name", TARGETS)
@torch.no_grad()
def test_cached_features_are_each_rows_hidden_states(models, name):
    """join / ragged extend / per-row rollback / keep (reorder, repeat): features(rows) are the
    hidden states of each row's cached tokens computed from scratch, left-padded."""
    target, layers = models[name], (1, 2)
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, 300, (1, 60), generator=g) for _ in range(3)]

    def check(order):
        feats, valid = target.features(list(range(target.rows)))
        W = int(target.lengths.max())
        assert feats.shape[:2] == valid.shape == (target.rows, W)
        for b, s in enumerate(order):
            n = int(target.lengths[b])
            hidden = target.model(seqs[s][:, :n], output_hidden_states=True).hidden_states
            want = torch.cat([hidden[i][0] for i in layers], -1)
            assert valid[b].tolist() == [False] * (W - n) + [True] * n
            torch.testing.assert_close(feats[b, W - n:], want, atol=1e-4, rtol=1e-4)
            assert not feats[b, :W - n].any()

    target.capture(layers)
    try:
        for s, n in zip(seqs, (13, 3, 20)):
            target.join(s[:, :n])
        check([0, 1, 2])
        for S, new, kept in [(8, [2, 8, 1], [1, 5, 0]), (6, [6, 6, 6], [6, 2, 3])]:
            starts = target.lengths.tolist()
            ids = torch.cat([torch.nn.functional.pad(s[:, a:a + S], (0, S - s[:, a:a + S].shape[1]))
                             for s, a in zip(seqs, starts)])
            target.extend(ids, torch.tensor(new))
            target.rollback(torch.tensor(starts) + torch.tensor(kept))
            check([0, 1, 2])
        target.keep([2, 0, 0])
        check([2, 0, 0])
    finally:
        target.capture(())
    assert target.rows == 0 and target.captured == ()


def test_features_count_in_the_kv_peak_and_the_budget(models):
    """The captured features are cache memory: the budget's bytes per token grow by them, and
    nothing changes when nothing is captured."""
    from specdiff.budget import kv_bytes_per_token

    target = models["llama"]
    plain = kv_bytes_per_token(target)
    assert plain == 2 * 2 * 16 * 4  # 2 layers, K and V, 2 of 4 heads of 8 dims, float32
    target.capture((1, 2))
    try:
        assert kv_bytes_per_token(target) == plain + 2 * 32 * 4
        target.kv_peak_bytes = 0
        target.join(torch.tensor([[5, 6, 7]]))
        assert target.kv_peak_bytes == 3 * (plain + 2 * 32 * 4)
    finally:
        target.capture(())
    target.kv_peak_bytes = 0
    target.join(torch.tensor([[5, 6, 7]]))
    assert target.kv_peak_bytes == 3 * plain and len(target.kv) == 4


class OneOff(DFlashDrafts):
    """A classic bug (reference doc A6): the context read one position off (the anchor's own
    features included, the first position's dropped)."""

    @torch.no_grad()
    def __call__(self, batch, g):
        features = self.target.features

        def shifted(rows, newest=None):
            feats, valid = features(rows, newest)
            hidden = torch.cat([feats[:, 1:], feats[:, -1:]], 1)  # position j reads j + 1's features
            return hidden, valid

        self.target.features = shifted  # type: ignore[method-assign]
        try:
            return super().__call__(batch, g)
        finally:
            del self.target.features


@pytest.mark.parametrize("name", TARGETS)
@torch.no_grad()
def test_a_draft_reads_the_features_of_every_position_before_the_anchor(models, name):
    """The draft step's q for ragged rows == the drafter called alone on hidden states computed
    from scratch for positions 0 .. start - 1 (start: the anchor's); a draft one position off
    misses it by far."""
    target, drafter = models[name], models[f"{name}-dflash"]
    pair_models(target, drafter)
    sampling = Sampling(1.0)
    rows = [Row(ids, 16, target.max_length, None, target.device, torch.Generator().manual_seed(b))
            for b, ids in enumerate([[5, 9, 17, 3, 44, 8, 2], [7, 1, 30], [11, 12, 13, 14, 15]])]
    gaps = []
    for drafts_of in (DFlashDrafts, OneOff):
        step = drafts_of(target, drafter, sampling)
        target.capture(step.layers)
        try:
            for row in rows:
                target.join(row.tensor()[:, :-1])  # the loop's invariant: all but the last token
            drafts = step(rows, [3, 5, 2])
        finally:
            target.capture(())
        gap = 0.0
        for row, d, g in zip(rows, drafts, [3, 5, 2]):
            ids = row.tensor()
            hidden = target.model(ids[:, :-1], output_hidden_states=True).hidden_states
            alone = drafter(ids[:, -1], drafter.features(hidden), ids.shape[1] - 1)[..., :target.vocab_size]
            assert d.tokens.shape == (1, g) and d.q.shape == (1, g, target.vocab_size) and d.calls == 1
            gap = max(gap, float((d.q - sampling.probs(alone)[:, :g]).abs().max()))
        gaps.append(gap)
    assert gaps[0] <= 1e-5 and gaps[1] > 1e-2, gaps


@pytest.mark.parametrize("name", TARGETS)
@torch.no_grad()
def test_the_drafters_context_cache_equals_reading_every_position_each_step(models, name, monkeypatch):
    """Through whole ragged batched generations (rows refilled as others finish), every draft's q
    == the drafter called alone on hidden states of positions 0 .. start - 1 computed from scratch,
    while each step feeds the drafter only the positions verified since the row's last draft; a
    cache that skips one position misses it by far."""
    target, drafter = models[name], models[f"{name}-dflash"]
    gaps: list[float] = []
    monkeypatch.setattr(DFlashDrafts, "__call__", checked_against(target, drafter, gaps))
    found = []
    for contexts in (Recording, SkipsOne):
        monkeypatch.setattr(dflash_method, "RowContexts", contexts)
        gaps.clear()
        Recording.most = 0
        generate(PROMPTS[:7], target=target, drafter=drafter, method="dflash", max_new_tokens=MAX_NEW,
                 batch_size=3, temperature=1.0, seed=3, gamma=7)  # fixed: no cost timing on repeated rows
        found.append((max(gaps), len(gaps), Recording.most))
    (gap, drafts, most), (broken, _, _) = found
    assert gap <= 1e-5 and broken > 1e-2, found
    assert drafts > 20 and most > 10, found  # drafts read positions cached at earlier steps


# --- greedy identity ---------------------------------------------------------------------------

@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("gamma", [None, 3, 1])
def test_dflash_greedy_equals_ar(models, reference, target, gamma):
    """gamma None: the drafter's recorded default, its whole block (7 slots)."""
    options = {} if gamma is None else {"gamma": gamma}
    result = generate(PROMPTS, target=models[target], drafter=models[f"{target}-dflash"], method="dflash",
                      max_new_tokens=MAX_NEW, **options)
    assert _identical(result, reference[target]) == []
    assert result.metrics.new_tokens == reference[target].metrics.new_tokens
    assert result.metrics.drafter_calls > 0
    assert models[target].captured == ()  # capturing stops with the run


def always_accept(draft, q, p, generator=None):
    """A broken verifier: every draft token taken unchecked, then the bonus token."""
    n = torch.full((draft.shape[0],), draft.shape[1])
    return n, p[torch.arange(draft.shape[0]), n].argmax(-1)


@pytest.mark.parametrize("target", TARGETS)
def test_a_verifier_that_takes_drafts_unchecked_is_not_ar(models, reference, target):
    """The negative control of the identity test: the same run with the draft taken unchecked
    diverges (a draft read from wrong features would still be identical: verification catches it)."""
    p = plan(target=models[target], drafter=models[f"{target}-dflash"], method="dflash", max_new_tokens=MAX_NEW)
    broken = replace(p, decoder=replace(p.decoder, verify=always_accept))
    outputs = list(iter_generate(PROMPTS, broken))
    assert len([o for o, want in zip(outputs, reference[target].outputs) if o.tokens != want.tokens]) > len(PROMPTS) // 2


# --- batches -----------------------------------------------------------------------------------

@pytest.mark.parametrize("target", ["gpt2", "llama"])
@pytest.mark.parametrize("options", [{}, {"temperature": 1.0, "top_k": 20, "seed": 7},
                                     {"temperature": 1.0, "seed": 3, "acceptance": "match"}])
def test_output_does_not_depend_on_the_batch_size(models, target, options):
    """Rows of different lengths drafted in one call (ragged context), refilled as others finish.
    Greedy with gamma auto; sampled with a fixed gamma (auto's lengths, and so what a seed draws,
    depend on the batch and the measured costs; the distribution does not)."""
    fixed = {"gamma": 7} if options else {}
    one, three = (generate(PROMPTS, target=models[target], drafter=models[f"{target}-dflash"], method="dflash",
                           max_new_tokens=MAX_NEW, batch_size=b, **options, **fixed) for b in (1, 3))
    assert [o.tokens for o in three.outputs] == [o.tokens for o in one.outputs]
    if options:
        assert len({tuple(o.tokens[:4]) for o in one.outputs}) > 10  # really sampled


# --- the target's distribution -----------------------------------------------------------------

@torch.no_grad()
def dflash_samples(target, drafts_of, rule, sampling, seed):
    """N samples of the first DEPTH tokens after exact.CONTEXT through one batched dflash step:
    the draft step under test, then the verify call and the rule over all rows at once
    -> (cell ids (N,), accepted draft tokens per row (N,))."""
    g = torch.Generator().manual_seed(seed)
    ctx, tokens, q = exact.drafted_once(target, drafts_of(target, sampling), g)
    logits = target.model(torch.cat([ctx, tokens], 1)).logits[:, exact.CONTEXT.shape[1] - 1:]
    p = sampling.target_probs(logits, ctx, tokens)
    n, y = rule(tokens, q, p, g)
    return exact.first_tokens(target.model, tokens, n, y, sampling, g), n


class WrongTemperature(DFlashDrafts):
    """DFlash's own issue #74: draft tokens drawn at another temperature (here half) than the q
    handed to the rule."""

    def __call__(self, batch, g):
        s = self.sampling
        hot = DFlashDrafts(self.target, self.drafter, replace(s, temperature=s.temperature / 2))(batch, g)
        told = super().__call__(batch, g)
        return [Draft(h.tokens, t.q, 1) for h, t in zip(hot, told)]


def ignores_q(draft, q, p, generator=None):
    """A broken rule: accept x_j with probability p_j(x_j) as if q were uniform... then resample
    from p at the first rejection (the residual ignores q too)."""
    B, g = draft.shape
    p_x = p[:, :g].gather(-1, draft[..., None])[..., 0]
    n = (torch.rand(B, g, generator=generator) < p_x).long().cumprod(1).sum(1)
    return n, sample(p[torch.arange(B), n], generator)


CASES = [("t1", standard), ("t0.7-top3", standard), ("t1", match)]


@pytest.mark.parametrize("sampling,rule", CASES, ids=[f"{s}-{r.__name__}" for s, r in CASES])
def test_a_dflash_step_has_the_target_distribution(v8_dflash, sampling, rule):
    target, drafter = v8_dflash
    s = exact.SAMPLINGS[sampling]
    cells, n = dflash_samples(target, lambda t, s_: DFlashDrafts(t, drafter, s_), rule, s, seed=11)
    pvalue = exact.chi_square_pvalue(cells, exact.exact_joint(target.model, s))
    print(f"accepted {n.float().mean():.3f} draft tokens per step")
    assert pvalue > exact.P_EXACT
    assert 0.05 < (n > 0).float().mean() < 0.95  # sensitive: drafts neither always rejected nor always taken


@pytest.mark.parametrize("broken,sampling", [  # 5-13 s each: the default suite keeps one, CI's slow step the rest
    pytest.param("wrong-temperature", "t1", marks=pytest.mark.slow), ("ignores-q", "t1"),
    pytest.param("wrong-temperature", "t0.7-top3", marks=pytest.mark.slow),
    pytest.param("ignores-q", "t0.7-top3", marks=pytest.mark.slow)])
def test_a_broken_draft_or_rule_fails_the_same_test(v8_dflash, broken, sampling):
    target, drafter = v8_dflash
    s = exact.SAMPLINGS[sampling]
    drafts_of = WrongTemperature if broken == "wrong-temperature" else DFlashDrafts
    cells, _ = dflash_samples(target, lambda t, s_: drafts_of(t, drafter, s_),
                              ignores_q if broken == "ignores-q" else standard, s, seed=11)
    assert exact.chi_square_pvalue(cells, exact.exact_joint(target.model, s)) < exact.P_BROKEN


# --- planning, refusals, the CLI ---------------------------------------------------------------

def test_a_dflash_drafter_picks_dflash_and_its_block(models):
    p = plan(target=models["gpt2"], drafter=models["gpt2-dflash"])
    assert p.method.name == "dflash" and p.decoder.ran() == {"gamma": 7, "adaptive": True, "drafts": 1,
                                                             "draft_temperature": None, "tree": 0, "acceptance": "greedy"}
    assert plan(target=models["gpt2"], drafter=models["gpt2-dflash"], temperature=1.0, drafts=2).decoder.rule == "select"
    assert plan(target=models["gpt2"], drafter=models["gpt2-dflash"], temperature=1.0).decoder.rule == "standard"
    with pytest.raises(UsageError, match="more than the DFlash drafter's block"):
        plan(target=models["gpt2"], drafter=models["gpt2-dflash"], gamma=8)
    with pytest.raises(UsageError, match="does not use `steps`"):
        plan(target=models["gpt2"], drafter=models["gpt2-dflash"], steps=2)
    with pytest.raises(UsageError, match="needs a DFlash drafter"):
        plan(target=models["gpt2"], drafter=load_drafter(str(models["gpt2-dir"])), method="dflash")


def test_a_compiled_target_is_refused(models):
    with pytest.raises(UsageError, match="eager torch target"):
        plan(target=models["gpt2"], drafter=models["gpt2-dflash"], compile=True)


def test_cli_generates_with_dflash(tiny, models):
    result = CliRunner().invoke(cli, ["generate", "--target", str(models["gpt2-dir"]), "--drafter",
                                      str(tiny.root / "dfm-gpt2-dflash"), "--method", "dflash", "--stats",
                                      "--max-new-tokens", "12", "--prompt", "The quick brown fox"])
    assert result.exit_code == 0, result.output
    stats = json.loads(result.stderr.strip().splitlines()[-1])
    assert (stats["method"], stats["exact"], stats["settings"]["gamma"]) == ("dflash", True, {"value": 7, "from": "drafter"})


# --- K candidate blocks (--drafts) -------------------------------------------------------------

@pytest.mark.parametrize("batch_size", [1, 3])
def test_dflash_with_candidate_blocks_greedy_equals_ar(models, reference, batch_size):
    result = generate(PROMPTS, target=models["llama"], drafter=models["llama-dflash"], method="dflash",
                      max_new_tokens=MAX_NEW, drafts=3, gamma=4, batch_size=batch_size)
    assert _identical(result, reference["llama"]) == []
    assert result.metrics.drafter_calls > 0 and models["llama"].rows == 0  # the K copies of each row left


@torch.no_grad()
def dflash_selected_samples(target, drafter, K, iid, rule, sampling, seed):
    """As dflash_samples, over K candidate blocks per row, verified as decoding._verify_selected
    does (K rows of p, each from its candidate's own prefix) -> (cell ids (N,), accepted (N,))."""
    g = torch.Generator().manual_seed(seed)
    ctx, tokens, q = exact.drafted_once(target, DFlashDrafts(target, drafter, sampling, K, iid=iid), g)  # (N, K, g)
    rows_ctx, flat = ctx.repeat_interleave(K, 0), tokens.reshape(exact.N * K, exact.GAMMA)
    seqs, inverse = torch.cat([rows_ctx, flat], 1).unique(dim=0, return_inverse=True)
    logits = target.model(seqs).logits[inverse, exact.CONTEXT.shape[1] - 1:]
    p = sampling.target_probs(logits, rows_ctx, flat).reshape(exact.N, K, exact.GAMMA + 1, exact.V)
    n, y, k = rule(tokens, q, p, g)
    return exact.first_tokens(target.model, tokens[torch.arange(exact.N), k], n, y, sampling, g), n


SELECTED = [pytest.param("select", False, "t1", id="select-t1"),
            pytest.param("select", False, "t0.7-top3", id="select-t0.7-top3", marks=pytest.mark.slow),  # CI's slow step
            pytest.param("multi", True, "t1", id="multi-t1")]


@pytest.mark.parametrize("rule,iid,sampling", SELECTED)
def test_a_dflash_step_over_candidate_blocks_has_the_target_distribution(v8_dflash, rule, iid, sampling):
    target, drafter = v8_dflash
    s = exact.SAMPLINGS[sampling]
    cells, n = dflash_selected_samples(target, drafter, 3, iid, selection.RULES[rule], s, seed=11)
    assert exact.chi_square_pvalue(cells, exact.exact_joint(target.model, s)) > exact.P_EXACT
    assert 0.05 < (n > 0).float().mean() < 0.95


@pytest.mark.slow  # CI's slow step
def test_multi_over_the_argmax_block_fails_the_same_test(v8_dflash):
    """Recursive rejection assumes every candidate is a draw from q: with the argmax block as
    candidate 1 (what select uses) it is biased, and the same test says so."""
    target, drafter = v8_dflash
    s = exact.SAMPLINGS["t1"]
    cells, _ = dflash_selected_samples(target, drafter, 3, False, selection.multi, s, seed=11)
    assert exact.chi_square_pvalue(cells, exact.exact_joint(target.model, s)) < exact.P_BROKEN
