"""Self-selection over K candidate drafts (specdiff.selection): the sampled rules keep the target's
distribution (the chi-square test of test_sampling_exact, one batched step of N rows with K
candidates each), deliberately broken variants fail it, and the rules' bookkeeping (which row the
target keeps, duplicates, shared prefixes) holds on hand-made cases."""

import pytest
import torch
from torch.nn.functional import one_hot

from specdiff import acceptance, selection
from specdiff.drafters.diffusion import DiffusionProposer
from specdiff.sampling import Sampling, sample
from specdiff.selection import SelfSelection

from exactness import CONTEXT, GAMMA, N, P_BROKEN, P_EXACT, SAMPLINGS, V, chi_square_pvalue, exact_joint, first_tokens


@torch.no_grad()
def selected_samples(target, proposer: SelfSelection, rule, sampling, seed):
    """N samples of the first DEPTH tokens through one batched step over K candidates per row,
    drafted and verified as decoding._verify_selected does (K rows of p from the candidates' own prefixes;
    the target runs once per distinct sequence) -> (cell ids (N,), accepted draft tokens per row (N,))."""
    g = torch.Generator().manual_seed(seed)
    ctx = CONTEXT.repeat(N, 1)
    c = proposer.propose(ctx, GAMMA, sampling, g)  # tokens (N, K, gamma), q (N, gamma, V)
    K = c.tokens.shape[1]
    rows_ctx, rows = ctx.repeat_interleave(K, 0), c.tokens.reshape(N * K, GAMMA)
    seqs, inverse = torch.cat([rows_ctx, rows], 1).unique(dim=0, return_inverse=True)  # V**gamma at most
    logits = target(seqs).logits[inverse, CONTEXT.shape[1] - 1:]  # (N K, gamma+1, V)
    p = sampling.target_probs(logits, rows_ctx, rows).reshape(N, K, GAMMA + 1, V)
    n, y, k = rule(c.tokens, c.q, p, g)
    chosen = c.tokens[torch.arange(N), k]  # (N, gamma)
    return first_tokens(target, chosen, n, y, sampling, g), n


def _selfsel(drafters, schedule, steps, K, iid, draft_temperature=None):
    return SelfSelection(DiffusionProposer(drafters["diffusion"], schedule, steps), K, draft_temperature, iid)


SLOW = pytest.mark.power  # the high-power cases: python -m pytest -m power
CASES = [  # (schedule, steps, K, rule, sampling, draft_temperature)
    pytest.param("l2r", 2, 4, "select", "t1", None),
    pytest.param("oneshot", 1, 3, "select", "t0.7-top3", None),
    pytest.param("confidence", 3, 4, "select", "t1", 2.0, marks=SLOW),  # point-mass: exact for any draft
    pytest.param("l2r", 3, 4, "select", "top-p0.8", None, marks=SLOW),
    pytest.param("oneshot", 1, 4, "multi", "t1", None),
    pytest.param("l2r", 2, 3, "multi", "t0.7-top3", None),
    pytest.param("l2r", 3, 8, "multi", "t1", 1.5, marks=SLOW),
]


@pytest.mark.parametrize("schedule,steps,K,rule,sampling,draft_temperature", CASES,
                         ids=["-".join(map(str, c.values)) for c in CASES])
def test_selection_step_has_the_target_distribution(target, drafters, schedule, steps, K, rule, sampling,
                                                    draft_temperature):
    s = SAMPLINGS[sampling]
    proposer = _selfsel(drafters, schedule, steps, K, rule == "multi", draft_temperature)
    cells, n = selected_samples(target, proposer, selection.RULES[rule], s, seed=11)
    assert chi_square_pvalue(cells, exact_joint(target, s)) > P_EXACT
    assert 0.05 < (n > 0).float().mean() < 0.95  # sensitive: drafts neither always rejected nor accepted


def select_then_standard(draft, q, p, generator=None):
    """The bias lossless.md warns of: choose by the target's p, then min(1, p/q) with the drafter's q."""
    g = draft.shape[-1]
    k = selection._streak_score(p[..., :g, :].gather(-1, draft[..., None])[..., 0]).argmax(-1)
    n, y = acceptance.standard(selection._pick(draft, k), q, selection._pick(p, k), generator)
    return n, y, k


def multi_without_residual(draft, q, p, generator=None):
    """Recursive rejection that keeps trying the survivors against p itself after a rejection."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(selection, "residual", lambda r, q: r)
        return selection.multi(draft, q, p, generator)


BROKEN = [("select", select_then_standard), ("multi", multi_without_residual)]


@pytest.mark.parametrize("rule,broken", BROKEN, ids=[b.__name__ for _, b in BROKEN])
def test_a_broken_selection_rule_fails_the_same_test(target, drafters, rule, broken):
    s = SAMPLINGS["t1"]
    cells, _ = selected_samples(target, _selfsel(drafters, "oneshot", 1, 4, rule == "multi"), broken, s, seed=11)
    assert chi_square_pvalue(cells, exact_joint(target, s)) < P_BROKEN


def test_argmax_candidate_first_unless_iid(drafters):
    ctx, s = CONTEXT.repeat(5, 1), SAMPLINGS["t1"]
    inner = DiffusionProposer(drafters["diffusion"], "l2r", 2)
    argmax = inner.propose(ctx, GAMMA, Sampling(), torch.Generator().manual_seed(0)).tokens
    c = SelfSelection(inner, 4).propose(ctx, GAMMA, s, torch.Generator().manual_seed(1))
    assert c.tokens.shape == (5, 4, GAMMA) and c.calls == 2
    assert torch.equal(c.tokens[:, 0], argmax)
    iid = SelfSelection(inner, 64, iid=True).propose(ctx, GAMMA, s, torch.Generator().manual_seed(1))
    assert not (iid.tokens == argmax[:, None]).all(-1).all(-1).any()  # no candidate 1 forced on them


def _p(*rows):
    """Per-candidate one-hot p (1, K, g + 1, V=5) from token lists."""
    return one_hot(torch.tensor([rows]), 5).float()


def test_greedy_keeps_the_longest_argmax_match_first_on_ties():
    draft = torch.tensor([[[1, 2, 0], [1, 2, 3], [1, 2, 3]]])
    p = _p([1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4])
    n, y, k = selection.greedy(draft, None, p)
    assert (n.item(), y.item(), k.item()) == (3, 4, 1)


def test_select_keeps_the_best_streak_score():
    p = torch.full((1, 2, 3, 5), 0.2)
    p[0, 1, 0] = one_hot(torch.tensor(4), 5).float()  # candidate 2's first token is certain
    draft = torch.tensor([[[0, 0], [4, 0]]])
    n, _, k = selection.select(draft, None, p, torch.Generator().manual_seed(0))
    assert k.item() == 1 and n.item() >= 1


def test_multi_follows_the_survivors():
    """Depth 1: p is sure of token 2, so candidates 1 and 2 (token 1) are rejected and candidate 3
    (token 2) accepted; depth 2 then reads p from candidate 3's row, which is sure of its token 3:
    all accepted, and the bonus token from row 3."""
    draft = torch.tensor([[[1, 0], [1, 0], [2, 3]]])
    q = torch.tensor([[[0.0, 0.5, 0.5, 0, 0], [0, 0, 0, 1.0, 0]]])  # (1, g, V)
    p = _p([2, 0, 0], [2, 0, 0], [2, 3, 4])
    n, y, k = selection.multi(draft, q, p, torch.Generator().manual_seed(0))
    assert (n.item(), y.item(), k.item()) == (2, 4, 2)


def test_multi_tries_a_duplicate_again():
    """Two candidates, both token 0; p = [.2, .4, .4], q = [.6, .3, .1]. Candidate 1 is accepted
    with prob. 1/3; its rejection leaves r = norm(max(0, p - q)) = [0, .25, .75]; the duplicate is
    then rejected for sure and its rejection subtracts q once more: r = [0, 0, 1]. So token 1 is
    never emitted, which it would be if the duplicate were skipped."""
    B = 4000
    draft = torch.zeros(B, 2, 1, dtype=torch.long)
    q = torch.tensor([0.6, 0.3, 0.1]).expand(B, 1, 3)
    p = torch.tensor([0.2, 0.4, 0.4]).expand(B, 2, 2, 3)
    n, y, _ = selection.multi(draft, q, p, torch.Generator().manual_seed(0))
    assert (y[n == 0] == 2).all() and ((n == 1).float().mean() - 1 / 3).abs() < 0.03


def test_multi_stops_on_the_residual_when_every_survivor_is_rejected():
    draft = torch.tensor([[[1, 1], [1, 2]]])
    q = torch.tensor([[[0.0, 1, 0, 0, 0], [0, 0.5, 0.5, 0, 0]]])
    p = _p([1, 3, 0], [1, 3, 0])  # depth 1 certain, depth 2: token 3, which no candidate holds
    n, y, k = selection.multi(draft, q, p, torch.Generator().manual_seed(0))
    assert (n.item(), y.item(), k.item()) == (1, 3, 0)


def test_the_argmax_candidate_alone_is_the_single_draft_point_mass_rule():
    gen_a, gen_b = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    p = torch.rand(64, 1, 4, 5, generator=torch.Generator().manual_seed(0)).softmax(-1)
    draft = sample(p[:, :, :3], torch.Generator().manual_seed(1))  # (64, 1, 3)
    n, y, k = selection.select(draft, None, p, gen_a)
    n1, y1 = acceptance.select(draft[:, 0], None, p[:, 0], gen_b)
    assert torch.equal(n, n1) and torch.equal(y, y1) and (k == 0).all()
