"""Distribution exactness of speculative sampling, by a statistical test on a tiny vocabulary.

A tiny target (V = 8) and deliberately different ("adversarial") drafters. From one context, N
rows each run one speculative step batched exactly as the decoding loop runs it (the same
proposer, warping and acceptance functions), giving e = accepted draft tokens + the emitted token.
The first three generated tokens are e[:3], completed by plain target sampling where the step
emitted fewer (that is what the next steps would do, and plain sampling is the reference). Their
empirical joint distribution over 8^3 cells is compared with the exact one, enumerated from the
target, by a chi-square test. A deliberately broken rule must fail the same test.

gamma auto (specdiff.adaptive): each row's draft length comes from a Controller that has seen only
that row's past steps; rows of each length draft and verify together, as the loop groups them. A
controller that peeks at the current step's draft or p must fail the same test.
"""

import pytest
import torch

from specdiff.acceptance import leading_true, match, standard
from specdiff.adaptive import Controller, Costs
from specdiff.decoding import Row
from specdiff.sampling import penalize, sample, seen_tokens

from exactness import (CONTEXT, GAMMA, N, P_BROKEN, P_EXACT, SAMPLINGS, V, chi_square_pvalue, exact_joint,
                       first_tokens, make_proposer, speculative_samples)


def broken_residual(draft, q, p, generator=None):
    """A classic bug: on rejection, resample from p instead of norm(max(0, p - q))."""
    B, g = draft.shape
    p_x = p[:, :g].gather(-1, draft[..., None])[..., 0]
    q_x = q.gather(-1, draft[..., None])[..., 0]
    n = leading_true(torch.rand(B, g, generator=generator) * q_x < p_x)
    return n, sample(p[torch.arange(B), n], generator)


def always_accept(draft, q, p, generator=None):
    n = torch.full((draft.shape[0],), draft.shape[1])
    return n, sample(p[:, -1], generator)


SLOW = pytest.mark.slow  # 4-8 s each: the default suite keeps one case per drafter, schedule, rule and warping, CI's slow step the rest
CASES = [  # (drafter, schedule, steps, rule, sampling)
    ("diffusion", "oneshot", 1, standard, "t1"),
    pytest.param("diffusion", "l2r", 2, standard, "t1", marks=SLOW),
    ("diffusion", "l2r", 3, standard, "t0.7-top3"),
    pytest.param("diffusion", "l2r", 2, standard, "top-p0.8", marks=SLOW),
    ("diffusion", "confidence", 3, match, "t1"),
    pytest.param("diffusion", "confidence", 2, match, "top-p0.8", marks=SLOW),
    ("ar", None, None, standard, "t1"),
    pytest.param("ar", None, None, standard, "t0.7-top3", marks=SLOW),
    ("ar", None, None, match, "top-p0.8"),
    pytest.param("diffusion", "l2r", 2, standard, "t1-rep3", marks=SLOW),
    ("ar", None, None, standard, "t1-rep3"),
    ("a2d", "l2r", 2, standard, "t1"),
    pytest.param("a2d", "confidence", 2, match, "t0.7-top3", marks=SLOW),
]


def _case_id(case) -> str:
    values = case.values if hasattr(case, "values") else case
    return f"{values[0]}-{values[1]}-{values[2]}-{values[3].__name__}-{values[4]}"


@pytest.mark.parametrize("kind,schedule,steps,rule,sampling", CASES, ids=[_case_id(c) for c in CASES])
def test_speculative_step_has_the_target_distribution(target, drafters, kind, schedule, steps, rule, sampling):
    s = SAMPLINGS[sampling]
    cells, n = speculative_samples(target, make_proposer(drafters, kind, schedule, steps), rule, s, seed=11)
    pvalue = chi_square_pvalue(cells, exact_joint(target, s))
    print(f"accepted {n.float().mean():.3f} draft tokens per step")
    assert pvalue > P_EXACT
    # the test is only sensitive when drafts are neither always rejected nor always accepted
    assert 0.05 < (n > 0).float().mean() < 0.95


@pytest.mark.parametrize("broken,kind,schedule", [
    (broken_residual, "diffusion", "l2r"), pytest.param(always_accept, "diffusion", "l2r", marks=SLOW),
    pytest.param(broken_residual, "ar", None, marks=SLOW), (always_accept, "ar", None),
    pytest.param(broken_residual, "a2d", "l2r", marks=SLOW), (always_accept, "a2d", "l2r")])
def test_a_broken_rule_fails_the_same_test(target, drafters, broken, kind, schedule):
    s = SAMPLINGS["t1"]
    cells, _ = speculative_samples(target, make_proposer(drafters, kind, schedule, 2), broken, s, seed=11)
    assert chi_square_pvalue(cells, exact_joint(target, s)) < P_BROKEN


def penalty_without_the_draft(logits, context, draft):
    """A plausible bug: the penalty of every verified position from the context alone, as if the
    draft tokens before it had not been generated."""
    s = SAMPLINGS["t1-rep3"]
    seen = seen_tokens(context, draft[:, :0], logits.shape[-1])  # (B, 1, V)
    return s.probs(penalize(logits, seen.expand(-1, logits.shape[1], -1), s.repetition_penalty))


@pytest.mark.parametrize("kind,schedule", [pytest.param("diffusion", "l2r", marks=SLOW), ("ar", None)])
def test_a_penalty_that_ignores_the_draft_fails_the_same_test(target, drafters, kind, schedule):
    s = SAMPLINGS["t1-rep3"]
    cells, _ = speculative_samples(target, make_proposer(drafters, kind, schedule, 2), standard, s, seed=11,
                                   verify_p=penalty_without_the_draft)
    assert chi_square_pvalue(cells, exact_joint(target, s)) < P_BROKEN


# --- gamma auto: lengths chosen from the past, and controllers that peek at the present ---------

COSTS = Costs((1,), ((1.0, 1.25, 1.5, 1.75),), ((0.1, 0.1, 0.1),))  # w = 1..4, g = 1..3: lengths 0..3 all pay


def lengths_from_the_past(seed: int, pasts: int = 64) -> torch.Tensor:
    """Each of N rows' draft length (N,): a Controller's choice after one of `pasts` random histories
    (a few earlier steps of a drafter accepting each slot with its own probability), drawn from a
    generator of their own: nothing of the step to come."""
    g, lengths = torch.Generator().manual_seed(seed), []
    for _ in range(pasts):
        controller, row = Controller(COSTS), Row(CONTEXT[0].tolist(), GAMMA + 1, 16, None, torch.device("cpu"))
        skill = float(torch.rand(1, generator=g))
        for _ in range(int(torch.randint(0, 8, (1,), generator=g))):
            controller.record(row, GAMMA, int(leading_true(torch.rand(1, GAMMA, generator=g) < skill)[0]))
        lengths.append(controller.width([row]))
    return torch.tensor(lengths).repeat(N // pasts + 1)[:N]


@torch.no_grad()
def adaptive_samples(target, proposer, rule, sampling, seed, lengths, peek=None):
    """N samples of the first DEPTH tokens through one step in which row i drafts lengths[i] tokens:
    the rows of each length draft in one proposer call (none for length 0: a plain step) and are
    verified together. peek(tokens (N, GAMMA), q, p, lengths) -> lengths: a broken controller that
    shortens drafts after seeing them and the target's p. -> (cell ids (N,), accepted (N,))."""
    g = torch.Generator().manual_seed(seed)
    ctx = CONTEXT.repeat(N, 1)
    tokens, q = torch.zeros(N, GAMMA, dtype=torch.long), torch.full((N, GAMMA, V), 1.0 / V)
    for length in lengths.unique().tolist():
        rows = (lengths == length).nonzero()[:, 0]
        if length:
            draft = proposer.propose(ctx[rows], length, sampling, g)  # (n, length), (n, length, V)
            tokens[rows, :length], q[rows, :length] = draft.tokens, draft.q
    logits = target(torch.cat([ctx, tokens], 1)).logits[:, CONTEXT.shape[1] - 1:]  # (N, GAMMA + 1, V)
    p = sampling.target_probs(logits, ctx, tokens)
    if peek is not None:
        lengths = peek(tokens, q, p, lengths)
    n, y = torch.zeros(N, dtype=torch.long), torch.zeros(N, dtype=torch.long)
    for length in lengths.unique().tolist():
        rows = (lengths == length).nonzero()[:, 0]
        n[rows], y[rows] = rule(tokens[rows, :length], q[rows, :length], p[rows, :length + 1], g)
    return first_tokens(target, tokens, n, y, sampling, g), n


def truncate_at_rejection(tokens, q, p, lengths):
    """Broken: the draft cut before its first rejected slot (the rule's own coins, drawn once to
    look), as if the controller had known how much would pass."""
    cut = lengths.clone()
    for length in lengths.unique().tolist():
        rows = (lengths == length).nonzero()[:, 0]
        cut[rows], _ = standard(tokens[rows, :length], q[rows, :length], p[rows, :length + 1], torch.Generator())
    return cut


def plain_unless_agreeing(tokens, q, p, lengths):
    """Broken: a plain step for the rows whose first draft token is not the target's argmax."""
    return torch.where(tokens[:, 0] == p[:, 0].argmax(-1), lengths, torch.zeros_like(lengths))


AUTO_CASES = [("diffusion", "l2r", 2, standard, "t1"), ("ar", None, None, standard, "t0.7-top3"),
              ("diffusion", "confidence", 3, match, "t1")]


@pytest.mark.parametrize("kind,schedule,steps,rule,sampling", AUTO_CASES,
                         ids=[f"{c[0]}-{c[1]}-{c[3].__name__}-{c[4]}" for c in AUTO_CASES])
def test_draft_lengths_chosen_from_the_past_keep_the_target_distribution(target, drafters, kind, schedule, steps,
                                                                         rule, sampling):
    s = SAMPLINGS[sampling]
    lengths = lengths_from_the_past(seed=5)
    assert set(lengths.tolist()) == set(range(GAMMA + 1))  # plain steps and every length in one step
    cells, n = adaptive_samples(target, make_proposer(drafters, kind, schedule, steps), rule, s, 11, lengths)
    assert chi_square_pvalue(cells, exact_joint(target, s)) > P_EXACT
    assert 0.05 < (n > 0).float().mean() < 0.95


@pytest.mark.parametrize("peek,kind,schedule", [
    (truncate_at_rejection, "diffusion", "l2r"), pytest.param(plain_unless_agreeing, "diffusion", "l2r", marks=SLOW),
    pytest.param(truncate_at_rejection, "ar", None, marks=SLOW), (plain_unless_agreeing, "ar", None)])
def test_a_controller_that_peeks_at_the_step_fails_the_same_test(target, drafters, peek, kind, schedule):
    s = SAMPLINGS["t1"]
    cells, _ = adaptive_samples(target, make_proposer(drafters, kind, schedule, 2), standard, s, 11,
                                lengths_from_the_past(seed=5), peek)
    assert chi_square_pvalue(cells, exact_joint(target, s)) < P_BROKEN
